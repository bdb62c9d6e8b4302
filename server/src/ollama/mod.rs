//! Ollama's API (docs/api.md at v0.33.0): /api/chat and /api/generate,
//! NDJSON streams by default with the final object's statistics under
//! Ollama's names, and the metadata routes /api/tags, /api/show, /api/ps,
//! /api/version; errors as `{"error": "..."}` (server/API_NOTES.md, part B).
//! The same engine thread, templates and tool-call parsers as the OpenAI
//! routes, so the same conversation gives the same text and counts.

mod request;

use std::convert::Infallible;
use std::time::{Duration, Instant, SystemTime};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use waste_host::{Completion, StopReason};

use crate::error::ApiError;
use crate::neutral::answer::{speaks_harmony, unsent, Reading};
use crate::neutral::engine_dropped;
use crate::state::{add_warning, json_answer, read_body, streamed_response, RequestLog, Shared, Tokens};
use crate::tools;
use crate::worker::{Event, Job};

/// The Ollama API version these routes follow (clients compare it against
/// the minimum they need; WASTE's own version would read as too old).
const API_VERSION: &str = "0.33.0";

pub(crate) fn error_response(e: ApiError) -> Response {
    let status = e.status;
    let mut response = (status, axum::Json(json!({"error": e.message}))).into_response();
    if matches!(status, StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS) {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

/// RFC 3339 in UTC with nanoseconds, as Go's time.Time marshals.
fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let (secs, nanos) = (d.as_secs() as i64, d.subsec_nanos());
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + (month <= 2) as i64;
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{nanos:09}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// `MODEL` and `MODEL:latest` are this model.
fn is_ours(state: &Shared, name: &str) -> bool {
    name == state.model_id || name.strip_suffix(":latest") == Some(state.model_id.as_str())
}

fn tag(state: &Shared) -> String {
    format!("{}:latest", state.model_id)
}

fn details(state: &Shared) -> Value {
    let info = state.model.info();
    let params = info.total_params as f64;
    let size = if params >= 1e9 { format!("{:.1}B", params / 1e9) } else { format!("{:.1}M", params / 1e6) };
    json!({"parent_model": "", "format": "waste", "family": info.family, "families": [info.family],
           "parameter_size": size, "quantization_level": info.expert_format})
}

fn container_bytes(state: &Shared) -> u64 {
    let info = state.model.info();
    info.trunk_bytes + (info.moe_layers * info.num_experts) as u64 * info.expert_record_bytes
}

fn digest(state: &Shared) -> String {
    state.system_fingerprint.trim_start_matches("fp_").to_string()
}

fn modified_at(state: &Shared) -> String {
    rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(state.created))
}

pub async fn root() -> Response {
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], "Ollama is running").into_response()
}

pub async fn version() -> Response {
    axum::Json(json!({"version": API_VERSION})).into_response()
}

pub async fn tags(State(state): State<Shared>) -> Response {
    let name = tag(&state);
    axum::Json(json!({"models": [{"name": name, "model": name, "modified_at": modified_at(&state),
        "size": container_bytes(&state), "digest": digest(&state), "details": details(&state)}]}))
    .into_response()
}

pub async fn ps(State(state): State<Shared>) -> Response {
    let name = tag(&state);
    // Loaded for as long as the server runs.
    let expires = rfc3339(SystemTime::now() + Duration::from_secs(10 * 365 * 86_400));
    axum::Json(json!({"models": [{"name": name, "model": name, "size": state.model.memory_plan().budget,
        "digest": digest(&state), "details": details(&state), "expires_at": expires, "size_vram": 0,
        "context_length": state.context}]}))
    .into_response()
}

pub async fn show(State(state): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    let answer = async {
        let bytes = read_body(&state, &headers, body).await?;
        let v: Value =
            serde_json::from_slice(&bytes).map_err(|e| ApiError::bad_request(format!("invalid JSON: {e}"), None))?;
        let name = v.get("model").or_else(|| v.get("name")).and_then(Value::as_str).filter(|s| !s.is_empty());
        let name = name.ok_or_else(|| ApiError::bad_request("model is required", None))?;
        if !is_ours(&state, name) {
            return Err(ApiError::not_found(format!("model '{name}' not found"), "model_not_found"));
        }
        let info = state.model.info();
        let template = state.model.chat_template(false).ok().flatten().unwrap_or("{{ .Prompt }}").to_string();
        let mut capabilities = vec!["completion"];
        if state.model.chat_template(true).ok().flatten().is_some_and(|t| t.contains("tools")) {
            capabilities.push("tools");
        }
        let arch = info.family.clone();
        let mut model_info = serde_json::Map::new();
        model_info.insert("general.architecture".into(), json!(arch));
        model_info.insert("general.parameter_count".into(), json!(info.total_params));
        model_info.insert(format!("{arch}.context_length"), json!(state.context));
        model_info.insert(format!("{arch}.embedding_length"), json!(info.hidden_size));
        model_info.insert(format!("{arch}.block_count"), json!(info.num_layers));
        model_info.insert(format!("{arch}.expert_count"), json!(info.num_experts));
        model_info.insert(format!("{arch}.expert_used_count"), json!(info.top_k));
        Ok(axum::Json(json!({
            "modelfile": format!("# a waste container served by waste serve\nFROM {}\n", state.model_id),
            "parameters": "", "template": template, "details": details(&state),
            "model_info": model_info, "capabilities": capabilities, "modified_at": modified_at(&state),
        }))
        .into_response())
    };
    answer.await.unwrap_or_else(error_response)
}

pub async fn chat(State(state): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    handle(state, headers, body, true).await.unwrap_or_else(error_response)
}

pub async fn generate(State(state): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    handle(state, headers, body, false).await.unwrap_or_else(error_response)
}

/// What the answers of one request share.
struct Reply {
    chat: bool,
    model: String,
    /// The answer searched for the request's tool calls and, in a chat
    /// with gpt-oss, its reasoning.
    reading: Reading,
    received: Instant,
}

/// The clock of one generation, for the statistics.
#[derive(Default)]
struct Clock {
    started: Option<Instant>,
    first_token: Option<Instant>,
}

impl Reply {
    fn piece(&self, text: &str) -> Value {
        let mut v = json!({"model": self.model, "created_at": rfc3339(SystemTime::now()), "done": false});
        if self.chat {
            v["message"] = json!({"role": "assistant", "content": text});
        } else {
            v["response"] = json!(text);
        }
        v
    }

    /// The answer's text, thinking and calls; calls only with tools.
    fn split(&self, c: &Completion, raw: &str) -> (String, Option<String>, Vec<tools::Call>) {
        match self.reading.split(&c.text, raw) {
            Some(p) => {
                let content = if p.calls.is_empty() { p.content.unwrap_or_default() } else { String::new() };
                (content, p.reasoning, p.calls)
            }
            None => (c.text.clone(), None, Vec::new()),
        }
    }

    fn message(&self, content: &str, thinking: Option<&str>, calls: &[tools::Call]) -> Value {
        let mut m = json!({"role": "assistant", "content": content});
        if let Some(t) = thinking {
            m["thinking"] = json!(t);
        }
        if !calls.is_empty() {
            let calls: Vec<Value> = calls
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let arguments = match serde_json::from_str::<Value>(&c.arguments) {
                        Ok(v @ Value::Object(_)) => v,
                        _ => json!({}),
                    };
                    json!({"function": {"index": i, "name": c.name, "arguments": arguments}})
                })
                .collect();
            m["tool_calls"] = json!(calls);
        }
        m
    }

    /// The final object: done, the reason, the statistics (nanoseconds).
    fn last(&self, c: &Completion, prompt_tokens: usize, clock: &Clock, text: Option<Value>) -> Value {
        let now = Instant::now();
        let started = clock.started.unwrap_or(self.received);
        let first = clock.first_token.unwrap_or(now);
        let ns = |d: Duration| d.as_nanos().min(u64::MAX as u128) as u64;
        let reason = match c.stop_reason {
            StopReason::Length | StopReason::ContextFull => "length",
            _ => "stop",
        };
        let mut v = json!({
            "model": self.model, "created_at": rfc3339(SystemTime::now()), "done": true, "done_reason": reason,
            "total_duration": ns(now - self.received).max(1), "load_duration": ns(started - self.received),
            "prompt_eval_count": prompt_tokens, "prompt_eval_duration": ns(first - started),
            "eval_count": c.tokens.len(), "eval_duration": ns(now - first),
        });
        match (self.chat, text) {
            (true, Some(m)) => v["message"] = m,
            (true, None) => v["message"] = json!({"role": "assistant", "content": ""}),
            (false, Some(t)) => v["response"] = t,
            (false, None) => v["response"] = json!(""),
        }
        v
    }
}

async fn handle(state: Shared, headers: HeaderMap, body: Body, chat: bool) -> Result<Response, ApiError> {
    let received = Instant::now();
    let bytes = read_body(&state, &headers, body).await?;
    let req = if chat {
        request::parse_chat(&bytes, state.context)?
    } else {
        request::parse_generate(&bytes, state.context)?
    };
    let warning = (!is_ours(&state, &req.model))
        .then(|| format!("the model {:?} is not served here; {:?} answered", req.model, state.model_id));
    if warning.is_some() && state.strict_model_name {
        return Err(ApiError::not_found(format!("model '{}' not found", req.model), "model_not_found"));
    }
    let reply = Reply {
        chat,
        model: state.model_id.clone(),
        reading: Reading::new(
            req.prompt.as_ref().and_then(|p| p.tools()).filter(|_| req.tools_enabled),
            chat && speaks_harmony(&state.model),
        ),
        received,
    };
    let Some(prompt) = req.prompt else {
        // Ollama's way to load (or unload) a model: an empty request. The
        // one model here stays loaded either way.
        let mut v = reply.piece("");
        v["done"] = json!(true);
        v["done_reason"] = json!(if req.unload { "unload" } else { "load" });
        return Ok(axum::Json(v).into_response());
    };
    let (tx, mut rx) = unbounded_channel();
    state.worker.submit(Job {
        prompt,
        params: req.params,
        want_texts: false,
        count_only: false,
        constraint_field: None,
        events: tx,
    })?;
    let mut clock = Clock::default();
    match rx.recv().await {
        Some(Event::Started(_)) => clock.started = Some(Instant::now()),
        Some(Event::Failed(e)) => return Err(e),
        _ => return Err(engine_dropped()),
    }
    let mut response = if req.stream {
        let path = if chat { "/api/chat" } else { "/api/generate" };
        let log = RequestLog::streamed(&state, &headers, path);
        let st = Ndjson { rx, reply, clock, streamed: String::new(), done: false, log };
        streamed_response(Body::from_stream(futures_util::stream::unfold(st, next_line)), "application/x-ndjson")
    } else {
        loop {
            match rx.recv().await {
                Some(Event::Token(..)) => {
                    clock.first_token.get_or_insert_with(Instant::now);
                }
                Some(Event::Done { completion, prompt_tokens, raw, .. }) => {
                    let (content, thinking, calls) = reply.split(&completion, &raw);
                    let text = if chat { reply.message(&content, thinking.as_deref(), &calls) } else { json!(content) };
                    let v = reply.last(&completion, prompt_tokens, &clock, Some(text));
                    break json_answer(v, Tokens { prompt: prompt_tokens, completion: completion.tokens.len() });
                }
                Some(Event::Failed(e)) => return Err(e),
                Some(_) => {}
                None => return Err(engine_dropped()),
            }
        }
    };
    add_warning(&mut response, warning);
    Ok(response)
}

struct Ndjson {
    rx: UnboundedReceiver<Event>,
    reply: Reply,
    clock: Clock,
    streamed: String,
    done: bool,
    log: RequestLog,
}

fn line(out: &mut String, v: &Value) {
    out.push_str(&v.to_string());
    out.push('\n');
}

async fn next_line(mut st: Ndjson) -> Option<(Result<String, Infallible>, Ndjson)> {
    if st.done {
        return None;
    }
    let holds = st.reply.reading.holds();
    let mut out = String::new();
    loop {
        match st.rx.recv().await {
            Some(Event::Token(ev, _)) => {
                st.clock.first_token.get_or_insert_with(Instant::now);
                st.streamed.push_str(&ev.text);
                if holds || ev.text.is_empty() {
                    continue;
                }
                line(&mut out, &st.reply.piece(&ev.text));
                return Some((Ok(out), st));
            }
            Some(Event::Done { completion, prompt_tokens, raw, .. }) => {
                if holds {
                    let (content, thinking, calls) = st.reply.split(&completion, &raw);
                    if !content.is_empty() || thinking.is_some() || !calls.is_empty() {
                        let mut v = st.reply.piece("");
                        v["message"] = st.reply.message(&content, thinking.as_deref(), &calls);
                        line(&mut out, &v);
                    }
                } else {
                    // What the engine held back (a possible stop string).
                    let rest = unsent(&completion.text, &st.streamed);
                    if !rest.is_empty() {
                        line(&mut out, &st.reply.piece(rest));
                    }
                }
                line(&mut out, &st.reply.last(&completion, prompt_tokens, &st.clock, None));
                st.done = true;
                st.log.finish(200, Some((prompt_tokens, completion.tokens.len())));
                return Some((Ok(out), st));
            }
            Some(Event::Failed(e)) => {
                line(&mut out, &json!({"error": e.message}));
                st.done = true;
                st.log.finish(e.status.as_u16(), None);
                return Some((Ok(out), st));
            }
            Some(Event::Started(_)) | Some(Event::Counted(_)) => {}
            None => {
                line(&mut out, &json!({"error": engine_dropped().message}));
                st.done = true;
                st.log.finish(500, None);
                return Some((Ok(out), st));
            }
        }
    }
}
