//! Ollama's API (docs/api.md at v0.33.0): /api/chat and /api/generate,
//! NDJSON streams by default with the final object's statistics under
//! Ollama's names, and the routes about the model (`models`); errors as
//! `{"error": "..."}` (server/API_NOTES.md, part B). The same driver,
//! engine thread, templates and tool-call parsers as the other APIs, so the
//! same conversation gives the same text and counts.

mod models;
mod request;

use std::time::{Duration, Instant, SystemTime};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use waste_host::{Completion, StopReason, TokenEvent};

use crate::driver::{self, Answer, Clock, Dialect, Generation, Parsed};
use crate::error::ApiError;
use crate::neutral::answer::{speaks_harmony, thinks_in_blocks, unsent, Live, Reading};
use crate::neutral::Prompt;
use crate::state::{model_warning, AppState, Shared};
use crate::tools;
use crate::tools::think::Split;
use crate::worker::{PromptFacts, TokenTexts};
pub use models::{ps, root, show, tags, version};

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

pub async fn chat(State(state): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    driver::serve(state, headers, body, "/api/chat", |state, body| parse(state, body, true)).await
}

pub async fn generate(State(state): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    driver::serve(state, headers, body, "/api/generate", |state, body| parse(state, body, false)).await
}

/// What the answers of one request share.
struct Reply {
    chat: bool,
    model: String,
    /// The answer searched for the request's tool calls and, in a chat,
    /// its reasoning.
    reading: Reading,
    /// A stream's reading as its tokens come.
    live: Live,
    /// Whether the prompt opened a reasoning block.
    opens_reasoning: bool,
}

fn parse(state: &AppState, body: &[u8], chat: bool) -> Result<Parsed<Reply>, ApiError> {
    let req =
        if chat { request::parse_chat(body, state.context)? } else { request::parse_generate(body, state.context)? };
    // `MODEL:latest` is this model too; any other name is answered with a
    // warning, or Ollama's 404 when strict.
    let other = Some(req.model.as_str()).filter(|m| !models::is_ours(state, m));
    let warning = model_warning(state, other)
        .map_err(|_| ApiError::not_found(format!("model '{}' not found", req.model), "model_not_found"))?;
    // A templated prompt (every chat, `/api/generate` without `raw`) is
    // answered in the template's own markup, reasoning included.
    let templated = matches!(req.prompt, Some(Prompt::Chat { .. }));
    let reply = Reply {
        chat,
        model: state.model_id.clone(),
        reading: Reading::new(
            req.prompt.as_ref().and_then(|p| p.tools()).filter(|_| req.tools_enabled),
            templated && speaks_harmony(state.chat_template(false)),
            templated && thinks_in_blocks(state.chat_template(false)),
        ),
        live: Live::default(),
        opens_reasoning: false,
    };
    let Some(prompt) = req.prompt else {
        // Ollama's way to load (or unload) a model: an empty request. The
        // one model here stays loaded either way.
        let mut v = reply.piece("");
        v["done"] = json!(true);
        v["done_reason"] = json!(if req.unload { "unload" } else { "load" });
        return Ok(Parsed::Answered(axum::Json(v).into_response()));
    };
    Ok(Generation::new(prompt, req.params, req.stream, warning, reply).into())
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

    /// A streamed piece of thinking (Ollama's `message.thinking`, or
    /// `thinking` beside `/api/generate`'s `response`).
    fn thinking_piece(&self, thinking: &str) -> Value {
        let mut v = self.piece("");
        if self.chat {
            v["message"]["thinking"] = json!(thinking);
        } else {
            v["thinking"] = json!(thinking);
        }
        v
    }

    /// A piece of the live reading as its lines.
    fn live_lines(&self, s: &Split, out: &mut String) {
        if !s.reasoning.is_empty() {
            line(out, &self.thinking_piece(&s.reasoning));
        }
        if !s.content.is_empty() {
            line(out, &self.piece(&s.content));
        }
    }

    /// The answer's text, thinking and calls; calls only with tools.
    fn split(&self, c: &Completion, raw: &str) -> (String, Option<String>, Vec<tools::Call>) {
        match self.reading.split(&c.text, raw, self.opens_reasoning) {
            Some(p) => {
                let content = if p.calls.is_empty() { p.content.unwrap_or_default() } else { String::new() };
                (content, p.reasoning, p.calls)
            }
            None => (self.reading.content(&c.text, self.opens_reasoning), None, Vec::new()),
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
        let started = clock.started;
        let first = clock.first_token.unwrap_or(now);
        let ns = |d: Duration| d.as_nanos().min(u64::MAX as u128) as u64;
        let reason = match c.stop_reason {
            StopReason::Length | StopReason::ContextFull => "length",
            _ => "stop",
        };
        let mut v = json!({
            "model": self.model, "created_at": rfc3339(SystemTime::now()), "done": true, "done_reason": reason,
            "total_duration": ns(now - clock.received).max(1), "load_duration": ns(started - clock.received),
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

/// `/api/generate`'s answer fields: `response`, and `thinking` beside it
/// when the model reasoned.
fn generated(v: &mut Value, content: &str, thinking: Option<&str>) {
    v["response"] = json!(content);
    if let Some(t) = thinking {
        v["thinking"] = json!(t);
    }
}

fn line(out: &mut String, v: &Value) {
    out.push_str(&v.to_string());
    out.push('\n');
}

impl Dialect for Reply {
    const STREAM: &'static str = "application/x-ndjson";

    fn open(&mut self, prompt: PromptFacts, _out: &mut String) -> bool {
        self.opens_reasoning = prompt.opens_reasoning;
        self.live = self.reading.live(prompt.opens_reasoning);
        false
    }

    fn frame(&mut self, token: &TokenEvent, _texts: Option<&TokenTexts>, _text: &str, out: &mut String) {
        let s = self.live.push(&token.text);
        self.live_lines(&s, out);
    }

    fn finish(&mut self, a: &Answer, text: &str, out: &mut String) {
        let c = &a.completion;
        // What the engine held back (a possible stop string), and what the
        // reading held.
        let s = self.live.finish(unsent(&c.text, text));
        self.live_lines(&s, out);
        if self.reading.holds() {
            let (content, thinking, calls) = self.split(c, &a.raw);
            let thinking = thinking.filter(|_| !self.live.streamed_reasoning());
            if !content.is_empty() || thinking.is_some() || !calls.is_empty() {
                let mut v = self.piece("");
                match self.chat {
                    true => v["message"] = self.message(&content, thinking.as_deref(), &calls),
                    false => generated(&mut v, &content, thinking.as_deref()),
                }
                line(out, &v);
            }
        }
        line(out, &self.last(c, a.prompt.tokens, &a.clock, None));
    }

    fn error_frame(&mut self, e: &ApiError, out: &mut String) {
        line(out, &json!({"error": e.message}));
    }

    fn answer(mut self, a: Answer) -> String {
        self.opens_reasoning = a.prompt.opens_reasoning;
        let (content, thinking, calls) = self.split(&a.completion, &a.raw);
        if self.chat {
            let message = self.message(&content, thinking.as_deref(), &calls);
            return self.last(&a.completion, a.prompt.tokens, &a.clock, Some(message)).to_string();
        }
        let mut v = self.last(&a.completion, a.prompt.tokens, &a.clock, None);
        generated(&mut v, &content, thinking.as_deref());
        v.to_string()
    }

    fn error_response(e: ApiError) -> Response {
        error_response(e)
    }
}
