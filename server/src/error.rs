//! Errors of the server library, and the OpenAI-shaped error answers.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Host(#[from] waste_host::Error),
    #[error("binding {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the engine thread: {0}")]
    Worker(String),
    #[error("the prompt cache directory {}: {source}", dir.display())]
    PromptCache { dir: std::path::PathBuf, source: std::io::Error },
}

/// One error answer: `{"error": {"message", "type", "param", "code"}}`,
/// the shape OpenAI's clients parse into their exception types.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code: None,
        }
    }

    pub fn unauthorized() -> Self {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "invalid or missing API key (send it as `Authorization: Bearer KEY`)".into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    pub fn not_found(message: impl Into<String>, code: &'static str) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: Some(code),
        }
    }

    pub fn rate_limited(rate: u32) -> Self {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!("more than {rate} requests a second on this connection"),
            kind: "rate_limit_error",
            param: None,
            code: Some("rate_limit_exceeded"),
        }
    }

    pub fn unsupported_media_type() -> Self {
        ApiError {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            message: "the request body must be JSON, sent with `Content-Type: application/json`".into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("unsupported_media_type"),
        }
    }

    pub fn body_timeout(limit: std::time::Duration) -> Self {
        ApiError {
            status: StatusCode::REQUEST_TIMEOUT,
            message: format!("the request body did not arrive within {} s", limit.as_secs_f64()),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_timeout"),
        }
    }

    /// A request this server does not take from where it came from.
    pub fn forbidden(message: String, code: &'static str) -> Self {
        ApiError {
            status: StatusCode::FORBIDDEN,
            message,
            kind: "invalid_request_error",
            param: None,
            code: Some(code),
        }
    }

    pub fn too_large(limit: usize) -> Self {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("the request body is larger than the limit of {limit} bytes"),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_too_large"),
        }
    }

    pub fn overloaded(limit: usize) -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: format!("the server is busy: {limit} requests are already queued or running; retry later"),
            kind: "server_error",
            param: None,
            code: Some("server_overloaded"),
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if matches!(self.status, StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS) {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}
