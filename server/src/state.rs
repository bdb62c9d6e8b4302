//! What every handler shares: the server's state, its counters, the log
//! line of a request, the request body read within its limit, ids.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap};
use waste_host::Model;

use crate::error::ApiError;
use crate::worker::Worker;

pub struct AppState {
    pub worker: Worker,
    pub model: Arc<Model>,
    pub model_id: String,
    pub api_key: Option<String>,
    pub body_limit: usize,
    pub context: usize,
    pub created: u64,
    /// `system_fingerprint` of every answer: the engine's version and the
    /// model's identity, so a client sees when either changed.
    pub system_fingerprint: String,
    /// Refuse a request naming another model instead of answering it.
    pub strict_model_name: bool,
    /// Origins browsers may call from (`*`: any); empty: no CORS headers.
    pub cors_origins: Vec<String>,
    /// No log line per request.
    pub quiet: bool,
    /// A request body must arrive within this.
    pub body_timeout: std::time::Duration,
    pub metrics: Metrics,
    /// `--chat-template`: the template conversations are rendered with
    /// instead of the model's own.
    pub chat_template: Option<String>,
    /// The model file as the server was started with it (llama-server's
    /// `/props` reports it).
    pub model_path: Option<String>,
}

impl AppState {
    /// The chat template conversations are rendered with (with or without
    /// tools: a container may hold a template for each), as every route
    /// that reports it states it.
    pub fn chat_template(&self, with_tools: bool) -> Option<&str> {
        match &self.chat_template {
            Some(t) => Some(t),
            None => self.model.chat_template(with_tools).ok().flatten(),
        }
    }

    /// Whether that template renders declared tools (Ollama's `tools`
    /// capability, llama-server's `supports_tools`).
    pub fn template_takes_tools(&self) -> bool {
        self.chat_template(true).is_some_and(|t| t.contains("tools"))
    }
}

pub type Shared = Arc<AppState>;

/// Prompt and completion tokens of an answer, for its log line.
#[derive(Clone, Copy)]
pub struct Tokens {
    pub prompt: usize,
    pub completion: usize,
}

/// On a streamed answer: its log line is written when the stream ends.
#[derive(Clone, Copy)]
pub struct LoggedByStream;

/// The log line of a request whose answer outlives its handler (a stream).
pub struct RequestLog {
    state: Option<Shared>,
    method: &'static str,
    path: &'static str,
    started: Instant,
}

impl RequestLog {
    pub fn streamed(state: &Shared, _headers: &HeaderMap, path: &'static str) -> RequestLog {
        RequestLog { state: Some(Arc::clone(state)), method: "POST", path, started: Instant::now() }
    }

    /// A log that writes nothing (tests).
    #[cfg(test)]
    pub fn none() -> RequestLog {
        RequestLog { state: None, method: "POST", path: "", started: Instant::now() }
    }

    /// Writes the line once (a later call does nothing).
    pub fn finish(&mut self, status: u16, tokens: Option<(usize, usize)>) {
        let Some(state) = self.state.take() else { return };
        let tokens = tokens.map(|(prompt, completion)| Tokens { prompt, completion });
        record(&state, self.method, self.path, status, tokens, self.started, true);
    }
}

/// Counts an answer and writes its log line (unless quiet).
pub fn record(
    state: &AppState,
    method: &str,
    path: &str,
    status: u16,
    tokens: Option<Tokens>,
    started: Instant,
    stream: bool,
) {
    state.metrics.count(status, tokens);
    if state.quiet {
        return;
    }
    let tokens = tokens.map_or(String::new(), |t| format!(" {}+{} tokens", t.prompt, t.completion));
    let stream = if stream { " stream" } else { "" };
    eprintln!("{method} {path} {status}{stream}{tokens} {} ms", started.elapsed().as_millis());
}

/// What `/metrics` counts besides the engine thread's own counters.
#[derive(Default)]
pub struct Metrics {
    /// Answers by status class: 2xx, 3xx, 4xx, 5xx.
    pub answers: [AtomicU64; 4],
    pub prompt_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
}

impl Metrics {
    pub fn count(&self, status: u16, tokens: Option<Tokens>) {
        if let Some(i) = (status / 100).checked_sub(2).filter(|&i| i < 4) {
            self.answers[i as usize].fetch_add(1, Ordering::Relaxed);
        }
        if let Some(t) = tokens {
            self.prompt_tokens.fetch_add(t.prompt as u64, Ordering::Relaxed);
            self.completion_tokens.fetch_add(t.completion as u64, Ordering::Relaxed);
        }
    }
}

/// A request naming a model this server does not serve is answered anyway
/// (llama-server's behaviour; Ollama- and Anthropic-style clients send
/// their own names), with this warning for the `x-waste-warning` header,
/// unless the server was started with `--strict-model-name`.
pub fn model_warning(state: &AppState, requested: Option<&str>) -> Result<Option<String>, ApiError> {
    match requested {
        Some(m) if m != state.model_id => {
            if state.strict_model_name {
                return Err(unknown_model(m));
            }
            Ok(Some(format!("the model {m:?} is not served here; {:?} answered", state.model_id)))
        }
        _ => Ok(None),
    }
}

/// A streamed answer (SSE or NDJSON): its log line is written when the
/// stream ends.
pub fn streamed_response(body: Body, content_type: &'static str) -> axum::response::Response {
    let mut response = axum::response::Response::new(body);
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, axum::http::HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, axum::http::HeaderValue::from_static("no-cache"));
    response.extensions_mut().insert(LoggedByStream);
    response
}

/// The header of an answer to a request that named a model this server
/// does not serve (see [`model_warning`]).
pub const MODEL_WARNING: &str = "x-waste-warning";

/// The `x-waste-warning` header of [`model_warning`].
pub fn add_warning(response: &mut axum::response::Response, warning: Option<String>) {
    if let Some(w) = warning.and_then(|w| axum::http::HeaderValue::from_str(&w).ok()) {
        response.headers_mut().insert(MODEL_WARNING, w);
    }
}

pub fn unknown_model(id: &str) -> ApiError {
    ApiError::not_found(format!("the model {id:?} does not exist"), "model_not_found")
}

pub async fn read_body(state: &AppState, headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|s| s.parse::<u64>().ok());
    if declared.is_some_and(|n| n > state.body_limit as u64) {
        return Err(ApiError::too_large(state.body_limit));
    }
    // A body a web page can send without a preflight (text/plain, a form)
    // is not an API call: JSON only.
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return Err(ApiError::unsupported_media_type());
    }
    match tokio::time::timeout(state.body_timeout, axum::body::to_bytes(body, state.body_limit)).await {
        Ok(bytes) => bytes.map_err(|_| ApiError::too_large(state.body_limit)),
        Err(_) => Err(ApiError::body_timeout(state.body_timeout)),
    }
}

pub fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

pub fn next_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}-{}-{}", now(), COUNTER.fetch_add(1, Ordering::Relaxed))
}
