//! Anthropic's Messages API: `POST /v1/messages` (whole or streamed as
//! Anthropic's events, `stream`) and `POST /v1/messages/count_tokens`,
//! over the same driver, engine thread, chat templates and tool-call
//! parsers as the other APIs; errors in Anthropic's shape
//! (server/API_NOTES.md, part A).

mod request;
mod stream;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use waste_host::{Completion, StopReason, TokenEvent};

use crate::driver::{self, Answer, Dialect, Generation, Parsed};
use crate::error::ApiError;
use crate::neutral::answer::{speaks_harmony, thinks_in_blocks, Live, Reading};
use crate::state::{model_warning, next_id, read_body, AppState, Shared};
use crate::worker::{PromptFacts, TokenTexts};

/// Anthropic's error type for an HTTP status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

pub(crate) fn error_body(e: &ApiError) -> Value {
    json!({"type": "error", "error": {"type": error_type(e.status), "message": e.message}})
}

/// An error answer in Anthropic's shape, with the headers of OpenAI's
/// (`Retry-After` on 429 and 503).
pub(crate) fn error_response(e: ApiError) -> Response {
    let body = error_body(&e).to_string();
    let mut response = e.into_response();
    response.headers_mut().remove(header::CONTENT_LENGTH);
    *response.body_mut() = Body::from(body);
    response
}

pub async fn messages(State(state): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    driver::serve(state, headers, body, "/v1/messages", parse).await
}

pub async fn count_tokens(State(state): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    count(state, headers, body).await.unwrap_or_else(error_response)
}

async fn count(state: Shared, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let bytes = read_body(&state, &headers, body).await?;
    let req = request::parse(&bytes, true, state.context)?;
    let n = driver::count(&state, req.prompt, req.params).await?;
    Ok(axum::Json(json!({"input_tokens": n})).into_response())
}

/// What the answer of one request needs besides the completion.
pub(crate) struct Reply {
    pub id: String,
    pub model: String,
    /// The answer searched for the declared tools' calls and its
    /// reasoning.
    pub reading: Reading,
    pub stop_sequences: Vec<String>,
    /// Where a stream of this answer is among its blocks.
    streamed: stream::Blocks,
    /// A stream's reading as its tokens come.
    live: Live,
    /// Whether the prompt opened a reasoning block.
    opens_reasoning: bool,
}

fn parse(state: &AppState, body: &[u8]) -> Result<Parsed<Reply>, ApiError> {
    let req = request::parse(body, false, state.context)?;
    let warning = model_warning(state, req.model.as_deref())?;
    let reply = Reply {
        // Anthropic's ids are `msg_...` (the SDK's users match on it).
        id: next_id("msg").replacen("msg-", "msg_", 1),
        model: state.model_id.clone(),
        reading: Reading::new(
            req.prompt.tools().filter(|_| req.tools_enabled),
            speaks_harmony(state.chat_template(false)),
            thinks_in_blocks(state.chat_template(false)),
        ),
        stop_sequences: req.params.stop_strings.clone(),
        streamed: stream::Blocks::default(),
        live: Live::default(),
        opens_reasoning: false,
    };
    Ok(Generation::new(req.prompt, req.params, req.stream, warning, reply).into())
}

/// One block of an answer.
pub(crate) enum Block {
    Thinking(String),
    Text(String),
    ToolUse { id: String, name: String, input: Value },
}

impl Block {
    pub(crate) fn json(&self) -> Value {
        match self {
            Block::Thinking(t) => json!({"type": "thinking", "thinking": t, "signature": signature(t)}),
            Block::Text(t) => json!({"type": "text", "text": t}),
            Block::ToolUse { id, name, input } => json!({"type": "tool_use", "id": id, "name": name, "input": input}),
        }
    }
}

/// A thinking block's `signature`: Anthropic's clients keep a block and
/// send it back only with one. It names the text it was given for; WASTE
/// renders returned reasoning whatever its signature (a conversation moved
/// from another server keeps working), so it is not a secret.
pub(crate) fn signature(thinking: &str) -> String {
    let mut h = waste_host::Fnv::new();
    h.update(thinking.as_bytes());
    format!("waste-{}", h.hex())
}

/// Anthropic's `usage`. Its input count leaves out what a cache supplied:
/// input_tokens + cache_read_input_tokens + cache_creation_input_tokens is
/// the prompt. WASTE's prefix cache keeps every finished request's state
/// without being asked (no `cache_control` breakpoint, no write billed
/// apart), so nothing is counted as a cache write: every evaluated token is
/// input.
fn usage(prompt: PromptFacts, output_tokens: usize) -> Value {
    json!({
        "input_tokens": prompt.tokens - prompt.cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": prompt.cached,
        "output_tokens": output_tokens,
    })
}

impl Reply {
    /// The answer's blocks: reasoning, text, then calls (`tool_use`) when
    /// tools were declared.
    pub(crate) fn blocks(&self, c: &Completion, raw: &str) -> Vec<Block> {
        let Some(p) = self.reading.split(&c.text, raw, self.opens_reasoning) else {
            let text = self.reading.content(&c.text, self.opens_reasoning);
            return if text.is_empty() { Vec::new() } else { vec![Block::Text(text)] };
        };
        let mut blocks = Vec::new();
        if let Some(r) = p.reasoning.filter(|r| !r.is_empty()) {
            blocks.push(Block::Thinking(r));
        }
        if let Some(t) = p.content.filter(|t| !t.trim().is_empty() || p.calls.is_empty()) {
            if !t.is_empty() {
                blocks.push(Block::Text(t));
            }
        }
        for (i, call) in p.calls.iter().enumerate() {
            let input = match serde_json::from_str::<Value>(&call.arguments) {
                Ok(v @ Value::Object(_)) => v,
                Ok(other) => json!({"value": other}),
                Err(_) => json!({}),
            };
            blocks.push(Block::ToolUse { id: format!("toolu_{}_{i}", &self.id[4..]), name: call.name.clone(), input });
        }
        blocks
    }

    /// `stop_reason` and `stop_sequence` of an answer with these blocks.
    pub(crate) fn stop(&self, c: &Completion, raw: &str, blocks: &[Block]) -> (&'static str, Option<String>) {
        if blocks.iter().any(|b| matches!(b, Block::ToolUse { .. })) {
            return ("tool_use", None);
        }
        match c.stop_reason {
            StopReason::Length => ("max_tokens", None),
            StopReason::ContextFull => ("model_context_window_exceeded", None),
            StopReason::StopString => {
                // The text ends where the stop string began; the raw decoding
                // of the answer's tokens goes on with it.
                let after = raw.get(c.text.len()..).unwrap_or("");
                let matched = self.stop_sequences.iter().find(|s| after.starts_with(s.as_str())).or_else(|| {
                    self.stop_sequences
                        .iter()
                        .filter_map(|s| raw.find(s.as_str()).map(|at| (at, s)))
                        .min()
                        .map(|(_, s)| s)
                });
                ("stop_sequence", matched.cloned())
            }
            _ => ("end_turn", None),
        }
    }
}

impl Dialect for Reply {
    const STREAM: &'static str = "text/event-stream";

    fn open(&mut self, prompt: PromptFacts, out: &mut String) -> bool {
        self.opens_reasoning = prompt.opens_reasoning;
        self.live = self.reading.live(prompt.opens_reasoning);
        self.start(prompt, out);
        true
    }

    fn frame(&mut self, token: &TokenEvent, _texts: Option<&TokenTexts>, _text: &str, out: &mut String) {
        self.delta(token, out);
    }

    fn finish(&mut self, answer: &Answer, text: &str, out: &mut String) {
        self.end(answer, text, out);
    }

    fn error_frame(&mut self, e: &ApiError, out: &mut String) {
        stream::frame(out, error_body(e));
    }

    fn answer(mut self, a: Answer) -> String {
        self.opens_reasoning = a.prompt.opens_reasoning;
        let blocks = self.blocks(&a.completion, &a.raw);
        let (stop_reason, stop_sequence) = self.stop(&a.completion, &a.raw, &blocks);
        json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": blocks.iter().map(Block::json).collect::<Vec<_>>(),
            "stop_reason": stop_reason, "stop_sequence": stop_sequence,
            "usage": usage(a.prompt, a.completion.tokens.len()),
        })
        .to_string()
    }

    fn error_response(e: ApiError) -> Response {
        error_response(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Streamed thinking blocks carried an empty `signature`, which
    /// Anthropic's clients take as a block they may not send back.
    #[test]
    fn thinking_blocks_were_signed_with_an_empty_signature() {
        let b = Block::Thinking("Let me see.".into()).json();
        let sig = b["signature"].as_str().unwrap();
        assert!(sig.starts_with("waste-") && sig.len() > "waste-".len(), "{b}");
        assert_eq!(sig, signature("Let me see."));
        assert_ne!(sig, signature("Let me see!"));
        let mut out = String::new();
        stream::Blocks::default().block(&mut out, &Block::Thinking("Let me see.".into()));
        assert!(out.contains("signature_delta") && out.contains(&format!(r#""signature":"{sig}""#)), "{out}");
    }
}
