//! Routes, authentication, and the JSON / SSE answers.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request as HttpRequest, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use waste_host::StopReason;

use crate::error::ApiError;
use crate::request::{self, Request};
use crate::tools;
use crate::worker::{Event, Job, TokenTexts, Worker};

pub struct AppState {
    pub worker: Worker,
    pub model_id: String,
    pub api_key: Option<String>,
    pub body_limit: usize,
    pub context: usize,
    pub created: u64,
}

type Shared = Arc<AppState>;

pub fn router(state: Shared) -> Router {
    let v1 = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/stats", get(stats))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&state), auth));
    Router::new()
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .merge(v1)
        .fallback(|| async { ApiError::not_found("no such endpoint", "unknown_url") })
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

async fn auth(State(state): State<Shared>, request: HttpRequest, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !given.is_some_and(|g| constant_time_eq(g.trim().as_bytes(), key.as_bytes())) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(request).await
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
        "tokens_generated": n(&c.tokens_generated),
        "max_tokens_after_disconnect": n(&c.max_tokens_after_disconnect),
        "last_cancelled": last,
    }))
}

fn unknown_model(id: &str) -> ApiError {
    ApiError::not_found(format!("the model {id:?} does not exist"), "model_not_found")
}

async fn read_body(state: &AppState, headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|s| s.parse::<u64>().ok());
    if declared.is_some_and(|n| n > state.body_limit as u64) {
        return Err(ApiError::too_large(state.body_limit));
    }
    axum::body::to_bytes(body, state.body_limit).await.map_err(|_| ApiError::too_large(state.body_limit))
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn next_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}-{}-{}", now(), COUNTER.fetch_add(1, Ordering::Relaxed))
}

async fn chat(State(state): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    handle(state, headers, body, true).await.unwrap_or_else(IntoResponse::into_response)
}

async fn completions(State(state): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    handle(state, headers, body, false).await.unwrap_or_else(IntoResponse::into_response)
}

/// What the answers of one request share.
struct Reply {
    chat: bool,
    id: String,
    created: u64,
    model: String,
    logprobs: bool,
    tools: bool,
    include_usage: bool,
}

async fn handle(state: Shared, headers: HeaderMap, body: Body, chat: bool) -> Result<Response, ApiError> {
    let bytes = read_body(&state, &headers, body).await?;
    let req: Request = request::parse(&bytes, chat, state.context)?;
    if let Some(m) = &req.model {
        if *m != state.model_id {
            return Err(unknown_model(m));
        }
    }
    let (tx, mut rx) = unbounded_channel();
    let reply = Reply {
        chat,
        id: next_id(if chat { "chatcmpl" } else { "cmpl" }),
        created: now(),
        model: state.model_id.clone(),
        logprobs: req.logprobs,
        tools: req.tools_enabled,
        include_usage: req.include_usage,
    };
    state.worker.submit(Job { prompt: req.prompt, params: req.params, want_texts: req.logprobs, events: tx })?;
    // Waiting for the prompt lets its errors be HTTP errors, streaming or not.
    match rx.recv().await {
        Some(Event::Started) => {}
        Some(Event::Failed(e)) => return Err(e),
        _ => return Err(ApiError::internal("the engine thread dropped the request")),
    }
    if req.stream {
        let stream = futures_util::stream::unfold(
            SseState { rx, reply, streamed: String::new(), role_sent: false, done: false },
            sse_next,
        );
        let mut response = Response::new(Body::from_stream(stream));
        let h = response.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        return Ok(response);
    }
    loop {
        match rx.recv().await {
            Some(Event::Started) | Some(Event::Token(..)) => {}
            Some(Event::Done { completion, prompt_tokens, texts }) => {
                return Ok(Json(full_answer(&reply, completion, prompt_tokens, &texts)).into_response())
            }
            Some(Event::Failed(e)) => return Err(e),
            None => return Err(ApiError::internal("the engine thread dropped the request")),
        }
    }
}

fn finish_reason(reason: StopReason) -> &'static str {
    match reason {
        StopReason::Length | StopReason::ContextFull => "length",
        _ => "stop",
    }
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

fn chat_logprob(t: &TokenTexts, logprob: f32) -> Value {
    let top: Vec<Value> =
        t.top.iter().map(|(s, lp)| json!({"token": s, "logprob": lp, "bytes": s.as_bytes()})).collect();
    json!({"token": t.token, "logprob": logprob, "bytes": t.token.as_bytes(), "top_logprobs": top})
}

fn text_logprobs(texts: &[&TokenTexts], logprobs: &[f32], start_offset: usize) -> Value {
    let mut offset = start_offset;
    let mut offsets = Vec::with_capacity(texts.len());
    for t in texts {
        offsets.push(offset);
        offset += t.token.len();
    }
    let top: Vec<Value> =
        texts.iter().map(|t| Value::Object(t.top.iter().map(|(s, lp)| (s.clone(), json!(lp))).collect())).collect();
    json!({
        "tokens": texts.iter().map(|t| t.token.clone()).collect::<Vec<_>>(),
        "token_logprobs": logprobs,
        "top_logprobs": top,
        "text_offset": offsets,
    })
}

fn full_answer(r: &Reply, c: waste_host::Completion, prompt_tokens: usize, texts: &[TokenTexts]) -> Value {
    let mut finish = finish_reason(c.stop_reason);
    let logprobs = if !r.logprobs {
        Value::Null
    } else if r.chat {
        json!({"content": texts.iter().zip(&c.logprobs).map(|(t, &lp)| chat_logprob(t, lp)).collect::<Vec<_>>()})
    } else {
        text_logprobs(&texts.iter().collect::<Vec<_>>(), &c.logprobs, 0)
    };
    let choice = if r.chat {
        let mut message = json!({"role": "assistant", "content": c.text});
        if r.tools {
            if let Some((content, calls)) = tools::parse(&c.text, &r.id) {
                message = json!({"role": "assistant", "content": content, "tool_calls": calls});
                finish = "tool_calls";
            }
        }
        json!({"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish})
    } else {
        json!({"index": 0, "text": c.text, "logprobs": logprobs, "finish_reason": finish})
    };
    json!({
        "id": r.id,
        "object": if r.chat { "chat.completion" } else { "text_completion" },
        "created": r.created,
        "model": r.model,
        "choices": [choice],
        "usage": usage(prompt_tokens, c.tokens.len()),
    })
}

struct SseState {
    rx: UnboundedReceiver<Event>,
    reply: Reply,
    /// Text sent so far (or held back, when tool calls may follow).
    streamed: String,
    role_sent: bool,
    done: bool,
}

fn data(v: &Value) -> String {
    format!("data: {v}\n\n")
}

impl Reply {
    /// One chunk; `delta` is the chat delta or the completion text.
    fn chunk(&self, delta: Value, logprobs: Value, finish: Option<&str>) -> Value {
        let choice = if self.chat {
            json!({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
        } else {
            json!({"index": 0, "text": delta, "logprobs": logprobs, "finish_reason": finish})
        };
        let mut v = json!({
            "id": self.id,
            "object": if self.chat { "chat.completion.chunk" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        });
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    fn content(&self, text: &str) -> Value {
        if self.chat {
            json!({"content": text})
        } else {
            json!(text)
        }
    }
}

async fn sse_next(mut st: SseState) -> Option<(Result<String, Infallible>, SseState)> {
    if st.done {
        return None;
    }
    let mut out = String::new();
    if st.reply.chat && !st.role_sent {
        // The role comes first, as in OpenAI's streams.
        out.push_str(&data(&st.reply.chunk(json!({"role": "assistant", "content": ""}), Value::Null, None)));
        st.role_sent = true;
    }
    loop {
        match st.rx.recv().await {
            Some(Event::Started) => {}
            Some(Event::Token(ev, texts)) => {
                st.streamed.push_str(&ev.text);
                if st.reply.tools {
                    continue;
                }
                let logprobs = match (&texts, st.reply.logprobs, st.reply.chat) {
                    (Some(t), true, true) => json!({"content": [chat_logprob(t, ev.logprob)]}),
                    (Some(t), true, false) => text_logprobs(&[t], &[ev.logprob], st.streamed.len() - ev.text.len()),
                    _ => Value::Null,
                };
                if ev.text.is_empty() && logprobs.is_null() {
                    continue;
                }
                out.push_str(&data(&st.reply.chunk(st.reply.content(&ev.text), logprobs, None)));
                return Some((Ok(out), st));
            }
            Some(Event::Done { completion, prompt_tokens, .. }) => {
                let mut finish = finish_reason(completion.stop_reason);
                let calls = if st.reply.tools { tools::parse(&completion.text, &st.reply.id) } else { None };
                if let Some((content, calls)) = calls {
                    if let Some(text) = content {
                        out.push_str(&data(&st.reply.chunk(json!({"content": text}), Value::Null, None)));
                    }
                    let calls: Vec<Value> = calls
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .enumerate()
                                .map(|(i, c)| {
                                    let mut c = c.clone();
                                    c["index"] = json!(i);
                                    c
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    out.push_str(&data(&st.reply.chunk(json!({"tool_calls": calls}), Value::Null, None)));
                    finish = "tool_calls";
                } else {
                    // Text the engine held back (a possible stop string that
                    // was not one) or, with tools, everything.
                    let sent = if st.reply.tools { "" } else { st.streamed.as_str() };
                    let rest = completion.text.strip_prefix(sent).unwrap_or("");
                    if !rest.is_empty() {
                        out.push_str(&data(&st.reply.chunk(st.reply.content(rest), Value::Null, None)));
                    }
                }
                let empty = if st.reply.chat { json!({}) } else { json!("") };
                out.push_str(&data(&st.reply.chunk(empty, Value::Null, Some(finish))));
                if st.reply.include_usage {
                    let mut u = st.reply.chunk(Value::Null, Value::Null, None);
                    u["choices"] = json!([]);
                    u["usage"] = usage(prompt_tokens, completion.tokens.len());
                    out.push_str(&data(&u));
                }
                out.push_str("data: [DONE]\n\n");
                st.done = true;
                return Some((Ok(out), st));
            }
            Some(Event::Failed(e)) => {
                out.push_str(&data(&e.body()));
                out.push_str("data: [DONE]\n\n");
                st.done = true;
                return Some((Ok(out), st));
            }
            None => {
                out.push_str(&data(&ApiError::internal("the engine thread dropped the request").body()));
                out.push_str("data: [DONE]\n\n");
                st.done = true;
                return Some((Ok(out), st));
            }
        }
    }
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
