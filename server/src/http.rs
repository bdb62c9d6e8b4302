//! Routes and what every request goes through: authentication, CORS, the
//! one log line per request, `/metrics`. Each API is its own folder
//! (`openai`, `anthropic`, `ollama`) over the one request driver
//! (`driver`); what they share is `neutral` and `state`. A new API is its
//! folder and its lines in [`router`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Path, Request as HttpRequest, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::state::{record, unknown_model, AppState, LoggedByStream, Shared, Tokens};
use crate::{anthropic, llama_server, ollama, openai, responses};

pub fn router(state: Shared) -> Router {
    // The OpenAI routes answer with and without `/v1`: clients set up for
    // llama-server often call `/chat/completions`, `/completions` and
    // `/models`, which it serves too.
    let mut v1 = Router::new();
    for prefix in ["/v1", ""] {
        v1 = v1
            .route(&format!("{prefix}/chat/completions"), post(openai::chat))
            .route(&format!("{prefix}/completions"), post(openai::completions))
            .route(&format!("{prefix}/models"), get(models))
            .route(&format!("{prefix}/models/{{id}}"), get(model));
    }
    let v1 = v1
        .route("/v1/responses", post(responses::responses))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .route("/api/tags", get(ollama::tags))
        .route("/api/show", post(ollama::show))
        .route("/api/ps", get(ollama::ps))
        .route("/api/version", get(ollama::version))
        .route("/tokenize", post(llama_server::tokenize))
        .route("/detokenize", post(llama_server::detokenize))
        .route("/apply-template", post(llama_server::apply_template))
        .route("/props", get(llama_server::props))
        .route("/stats", get(stats))
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&state), auth));
    Router::new()
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        // Ollama's clients probe the root before anything else.
        .route("/", get(ollama::root))
        .merge(v1)
        .fallback(|| async { ApiError::not_found("no such endpoint", "unknown_url") })
        // Outermost: a preflight is answered before authentication (browsers
        // send no credentials with it), and every answer is logged.
        .layer(middleware::from_fn_with_state(Arc::clone(&state), cors))
        .layer(middleware::from_fn_with_state(Arc::clone(&state), log_and_count))
        .with_state(state)
}

/// Equality whose time depends only on the key's length, so the key cannot
/// be guessed a byte at a time from response times.
fn constant_time_eq(given: &[u8], key: &[u8]) -> bool {
    let mut diff = (given.len() != key.len()) as u8;
    for (i, &k) in key.iter().enumerate() {
        diff |= std::hint::black_box(given.get(i).copied().unwrap_or(!k) ^ k);
    }
    diff == 0
}

/// The key as `Authorization: Bearer KEY` or, as Anthropic's clients send
/// it, `x-api-key: KEY`; a 401 in the shape of the route's API (Ollama has
/// no keys; its clients send the bearer header they are given).
async fn auth(State(state): State<Shared>, request: HttpRequest, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        let h = request.headers();
        let bearer = h
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            // RFC 9110 11.1: the scheme is case-insensitive (`bearer` too).
            .and_then(|v| v.split_once(' ').filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer")))
            .map(|(_, key)| key);
        let x_api_key = h.get("x-api-key").and_then(|v| v.to_str().ok());
        let ok = |g: Option<&str>| g.is_some_and(|g| constant_time_eq(g.trim().as_bytes(), key.as_bytes()));
        if !ok(bearer) && !ok(x_api_key) {
            if request.uri().path().starts_with("/api/") {
                return ollama::error_response(ApiError::unauthorized());
            }
            if request.uri().path().starts_with("/v1/messages") {
                return anthropic::error_response(ApiError {
                    message: "invalid or missing API key (send it as `x-api-key: KEY` or `Authorization: Bearer KEY`)"
                        .into(),
                    ..ApiError::unauthorized()
                });
            }
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(request).await
}

/// `localhost`, `127.x.y.z` or `[::1]`, with or without a port.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        },
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// An `Origin` (`http://localhost:3000`) naming a loopback host.
fn is_loopback_origin(origin: &str) -> bool {
    origin.split_once("://").is_some_and(|(_, host)| is_loopback_host(host))
}

/// The allowed value of `Access-Control-Allow-Origin` for `origin`, if any.
fn allowed_origin(state: &AppState, origin: &str) -> Option<HeaderValue> {
    if state.cors_origins.iter().any(|o| o == "*") {
        return Some(HeaderValue::from_static("*"));
    }
    state.cors_origins.iter().any(|o| o == origin).then(|| HeaderValue::from_str(origin).ok()).flatten()
}

/// CORS for the origins given with `--cors-origin`: a preflight (`OPTIONS`
/// with `Access-Control-Request-Method`) is answered here, and the answers
/// to an allowed origin carry `Access-Control-Allow-Origin`.
async fn cors(State(state): State<Shared>, request: HttpRequest, next: Next) -> Response {
    let origin = request.headers().get(header::ORIGIN).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let allowed = origin.as_deref().and_then(|o| allowed_origin(&state, o));
    let preflight =
        request.method() == Method::OPTIONS && request.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    if preflight {
        let Some(allow) = allowed else {
            return ApiError {
                status: StatusCode::FORBIDDEN,
                message: format!(
                    "origin {:?} may not call this server (start it with --cors-origin ORIGIN)",
                    origin.unwrap_or_default()
                ),
                kind: "invalid_request_error",
                param: None,
                code: Some("origin_not_allowed"),
            }
            .into_response();
        };
        let asked = request.headers().get(header::ACCESS_CONTROL_REQUEST_HEADERS).cloned();
        let mut response = StatusCode::NO_CONTENT.into_response();
        let h = response.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
        h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, POST, OPTIONS"));
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            asked.unwrap_or_else(|| HeaderValue::from_static("authorization, content-type, x-api-key")),
        );
        h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
        h.insert(header::VARY, HeaderValue::from_static("Origin"));
        return response;
    }
    // Without a key anything that can reach the port could use it: only
    // this machine may, by name (a DNS-rebinding page names its own host)
    // and by origin (a page elsewhere), unless --cors-origin allows it.
    if state.api_key.is_none() {
        let host = request.headers().get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
        if !is_loopback_host(host) {
            return ApiError::forbidden(
                format!("host {host:?}: without --api-key this server answers requests to this machine only"),
                "host_not_allowed",
            )
            .into_response();
        }
        if let Some(o) = origin.as_deref().filter(|o| allowed.is_none() && !is_loopback_origin(o)) {
            return ApiError::forbidden(
                format!("origin {o:?} may not call this server (start it with --cors-origin ORIGIN or --api-key)"),
                "origin_not_allowed",
            )
            .into_response();
        }
    }
    let mut response = next.run(request).await;
    if let Some(allow) = allowed {
        let h = response.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
        h.insert(header::VARY, HeaderValue::from_static("Origin"));
    }
    response
}

async fn log_and_count(State(state): State<Shared>, request: HttpRequest, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().to_string();
    let path = request.uri().path().to_string();
    let response = next.run(request).await;
    if response.extensions().get::<LoggedByStream>().is_none() {
        let tokens = response.extensions().get::<Tokens>().copied();
        record(&state, &method, &path, response.status().as_u16(), tokens, started, false);
    }
    response
}

/// Prometheus text exposition format (version 0.0.4).
async fn metrics(State(state): State<Shared>) -> Response {
    let m = &state.metrics;
    let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let c = state.worker.counters();
    let s = state.model.store_stats();
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, rows: &[(String, f64)]| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for (labels, v) in rows {
            out.push_str(&format!("{name}{labels} {v}\n"));
        }
    };
    let classes = ["2xx", "3xx", "4xx", "5xx"];
    let answers: Vec<(String, f64)> =
        classes.iter().zip(&m.answers).map(|(c, a)| (format!("{{code=\"{c}\"}}"), n(a) as f64)).collect();
    family("waste_http_requests_total", "counter", "HTTP answers by status class.", &answers);
    family(
        "waste_prompt_tokens_total",
        "counter",
        "Prompt tokens of answered generations.",
        &[(String::new(), n(&m.prompt_tokens) as f64)],
    );
    family(
        "waste_completion_tokens_total",
        "counter",
        "Tokens generated and answered.",
        &[(String::new(), n(&m.completion_tokens) as f64)],
    );
    family(
        "waste_tokens_generated_total",
        "counter",
        "Tokens the engine computed, those of cancelled generations included.",
        &[(String::new(), n(&c.tokens_generated) as f64)],
    );
    let outcomes = [
        ("completed", &c.completed),
        ("cancelled", &c.cancelled),
        ("dropped_queued", &c.dropped_queued),
        ("failed", &c.failed),
        ("rejected", &c.rejected),
    ];
    let outcomes: Vec<(String, f64)> =
        outcomes.iter().map(|(o, a)| (format!("{{outcome=\"{o}\"}}"), n(a) as f64)).collect();
    family("waste_generations_total", "counter", "Generation requests by outcome.", &outcomes);
    family(
        "waste_queue_requests",
        "gauge",
        "Requests queued or running.",
        &[(String::new(), state.worker.pending() as f64)],
    );
    family(
        "waste_queue_limit",
        "gauge",
        "Requests queued or running at most.",
        &[(String::new(), state.worker.limit() as f64)],
    );
    let picks: Vec<(String, f64)> =
        [("reused", s.picks.reused), ("prefetched", s.picks.prefetched), ("missed", s.picks.missed)]
            .iter()
            .map(|(how, n)| (format!("{{served=\"{how}\"}}"), *n as f64))
            .collect();
    family(
        "waste_expert_picks_total",
        "counter",
        "Routed-expert picks by where the record came from: reused (in RAM before the step asked), prefetched (a router lookahead read it), missed (read on demand).",
        &picks,
    );
    family(
        "waste_expert_cache_reuse_ratio",
        "gauge",
        "Picks served from what the cache already held, over all picks, since start.",
        &[(String::new(), s.picks.reuse_rate())],
    );
    family(
        "waste_expert_prefetch_wasted_total",
        "counter",
        "Speculative reads no pick has used.",
        &[(String::new(), s.prefetch_wasted() as f64)],
    );
    family(
        "waste_expert_bytes_read_total",
        "counter",
        "Bytes read from expert banks.",
        &[(String::new(), s.bytes_read as f64)],
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], out).into_response()
}

fn model_object(state: &AppState) -> Value {
    json!({"id": state.model_id, "object": "model", "created": state.created, "owned_by": "waste"})
}

async fn models(State(state): State<Shared>) -> Json<Value> {
    Json(json!({"object": "list", "data": [model_object(&state)]}))
}

async fn model(State(state): State<Shared>, Path(id): Path<String>) -> Response {
    if id != state.model_id {
        return unknown_model(&id).into_response();
    }
    Json(model_object(&state)).into_response()
}

/// Not an OpenAI endpoint: the queue and what became of the requests, so
/// an operator (and the tests) can see that a client that went away stopped
/// its generation.
async fn stats(State(state): State<Shared>) -> Json<Value> {
    let c = state.worker.counters();
    let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let last = c
        .last_cancelled
        .lock()
        .ok()
        .and_then(|l| *l)
        .map(|l| json!({"generated": l.generated, "delivered": l.delivered, "max_tokens": l.max_tokens}));
    Json(json!({
        "object": "stats",
        "model": state.model_id,
        "queue": {"pending": state.worker.pending(), "limit": state.worker.limit()},
        "requests": {
            "completed": n(&c.completed),
            "cancelled": n(&c.cancelled),
            "dropped_queued": n(&c.dropped_queued),
            "failed": n(&c.failed),
            "rejected": n(&c.rejected),
        },
        "prefix_cache": {
            "sessions": c.prefix_capacity.load(Ordering::Relaxed),
            "held": c.prefix_held.load(Ordering::Relaxed),
            "hits": n(&c.prefix_hits),
            "misses": n(&c.prefix_misses),
            "tokens_reused": n(&c.prefix_tokens_reused),
            "prompt_tokens_evaluated": n(&c.prompt_tokens_evaluated),
            "disk": c.disk.lock().ok().and_then(|d| *d).map(|d| json!({
                "files": d.files,
                "bytes": d.bytes,
                "max_bytes": d.max_bytes,
                "hits": d.tally.hits,
                "written": d.tally.written,
                "ignored": d.tally.ignored,
                "evicted": d.tally.evicted,
            })),
        },
        "experts": state.model.store_stats().report_json(),
        "tokens_generated": n(&c.tokens_generated),
        "max_tokens_after_disconnect": n(&c.max_tokens_after_disconnect),
        "last_cancelled": last,
    }))
}

#[cfg(test)]
mod tests {
    use super::{is_loopback_host, is_loopback_origin};

    #[test]
    fn loopback_hosts_and_origins_are_told_from_others() {
        for h in ["localhost", "localhost:8080", "127.0.0.1", "127.0.0.1:80", "127.1.2.3:9", "[::1]:8080", "[::1]"] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in ["", "evil.example", "evil.example:8080", "10.0.0.1:8080", "localhost.evil.example", "[::2]:80"] {
            assert!(!is_loopback_host(h), "{h}");
        }
        assert!(is_loopback_origin("http://localhost:3000") && is_loopback_origin("https://127.0.0.1"));
        assert!(!is_loopback_origin("http://evil.example") && !is_loopback_origin("null"));
    }
}
