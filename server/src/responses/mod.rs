//! OpenAI's Responses API (`POST /v1/responses`), which Codex and the
//! Agents SDK speak: stateless requests whose `input` is a list of items
//! (messages, reasoning, function calls and their outputs), answered with
//! output items (a `reasoning` item, a `message`, `function_call`s), whole
//! or streamed as the API's typed events (`stream`). The request is read
//! as the chat request it amounts to (`request`), over the same driver,
//! engine thread, templates and tool-call parsers as the other APIs; errors
//! in OpenAI's shape.

mod request;
mod stream;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use waste_host::{Completion, StopReason, TokenEvent};

use crate::driver::{self, Answer, Dialect, Generation, Parsed};
use crate::error::ApiError;
use crate::neutral::answer::{speaks_harmony, thinks_in_blocks, Live, Reading};
use crate::state::{model_warning, next_id, now, AppState, Shared};
use crate::worker::{PromptFacts, TokenTexts};

pub async fn responses(State(state): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    driver::serve(state, headers, body, "/v1/responses", parse).await
}

/// What the answer of one request needs besides the completion.
pub(crate) struct Reply {
    /// `resp_...`; its items' ids are made from it.
    id: String,
    created_at: u64,
    model: String,
    /// The request's fields the response object repeats.
    echo: Map<String, Value>,
    reading: Reading,
    /// Whether the prompt opened a reasoning block.
    opens_reasoning: bool,
    /// The reasoning read as the tokens come, to count its tokens (and, in
    /// a stream, to send it).
    live: Live,
    /// `live` is set up for this answer's prompt.
    live_ready: bool,
    reasoning_tokens: usize,
    /// Where a stream is.
    streamed: stream::Items,
}

fn parse(state: &AppState, body: &[u8]) -> Result<Parsed<Reply>, ApiError> {
    let request::Parsed { request: req, echo } = request::parse(body, state.context)?;
    let warning = model_warning(state, req.model.as_deref())?;
    let reply = Reply {
        id: next_id("resp").replace('-', "_"),
        created_at: now(),
        model: state.model_id.clone(),
        echo,
        reading: Reading::new(
            req.prompt.tools().filter(|_| req.tools_enabled),
            speaks_harmony(state.chat_template(false)),
            thinks_in_blocks(state.chat_template(false)),
        ),
        opens_reasoning: false,
        live: Live::default(),
        live_ready: false,
        reasoning_tokens: 0,
        streamed: stream::Items::default(),
    };
    Ok(Generation {
        constraint_field: req.constraint_field,
        ..Generation::new(req.prompt, req.params, req.stream, warning, reply)
    }
    .into())
}

/// One output item of an answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Item {
    Reasoning(String),
    Message(String),
    Call { name: String, arguments: String },
}

impl Reply {
    /// The id of output item `index` of kind `prefix` (`rs`, `msg`, `fc`,
    /// and `call` for a call's `call_id`).
    fn item_id(&self, prefix: &str, index: usize) -> String {
        format!("{prefix}_{}_{index}", self.id.trim_start_matches("resp_"))
    }

    /// Item `index` in the API's shape, complete.
    fn item_json(&self, item: &Item, index: usize) -> Value {
        match item {
            Item::Reasoning(text) => json!({"id": self.item_id("rs", index), "type": "reasoning", "summary": [],
                "content": [{"type": "reasoning_text", "text": text}], "status": "completed"}),
            Item::Message(text) => json!({"id": self.item_id("msg", index), "type": "message", "status": "completed",
                "role": "assistant", "content": [output_text(text)]}),
            Item::Call { name, arguments } => json!({"id": self.item_id("fc", index), "type": "function_call",
                "status": "completed", "call_id": self.item_id("call", index), "name": name, "arguments": arguments}),
        }
    }

    /// The answer's items: reasoning, text, then calls when tools were
    /// declared.
    fn items(&self, c: &Completion, raw: &str) -> Vec<Item> {
        let Some(p) = self.reading.split(&c.text, raw, self.opens_reasoning) else {
            let text = self.reading.content(&c.text, self.opens_reasoning);
            return if text.is_empty() { Vec::new() } else { vec![Item::Message(text)] };
        };
        let mut items = Vec::new();
        if let Some(r) = p.reasoning.filter(|r| !r.is_empty()) {
            items.push(Item::Reasoning(r));
        }
        if let Some(t) = p.content.filter(|t| !t.trim().is_empty()) {
            items.push(Item::Message(t));
        }
        items.extend(p.calls.into_iter().map(|c| Item::Call { name: c.name, arguments: c.arguments }));
        items
    }

    /// The response object: `status` and `output` as they stand, the
    /// request's fields repeated, `usage` once known.
    fn response(&self, status: &str, output: Vec<Value>, usage: Option<Value>, incomplete: bool) -> Value {
        let mut r = json!({
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "error": null,
            "incomplete_details": if incomplete { json!({"reason": "max_output_tokens"}) } else { Value::Null },
            "model": self.model, "output": output, "previous_response_id": null, "usage": usage,
        });
        if let Value::Object(m) = &mut r {
            m.extend(self.echo.clone());
        }
        r
    }

    /// Counts a token of the answer as reasoning or not, and gives what of
    /// it to send now.
    fn read(&mut self, piece: &str) -> crate::tools::think::Split {
        let s = self.live.push(piece);
        if !s.reasoning.is_empty() {
            self.reasoning_tokens += 1;
        }
        s
    }

    /// OpenAI's `usage` for the Responses API: the prompt's tokens with
    /// those the prefix cache supplied, the answer's with those it spent
    /// reasoning in `<think>` blocks (harmony's analysis channel is told
    /// apart only once the answer is whole, so it counts as output).
    fn usage(&self, prompt: PromptFacts, output_tokens: usize) -> Value {
        json!({
            "input_tokens": prompt.tokens, "input_tokens_details": {"cached_tokens": prompt.cached},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "total_tokens": prompt.tokens + output_tokens,
        })
    }
}

/// An `output_text` content part.
fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// Whether the answer stopped at `max_output_tokens` (or the context's
/// end): the response is `incomplete`.
fn cut_short(c: &Completion) -> bool {
    matches!(c.stop_reason, StopReason::Length | StopReason::ContextFull)
}

impl Dialect for Reply {
    const STREAM: &'static str = "text/event-stream";

    fn open(&mut self, prompt: PromptFacts, out: &mut String) -> bool {
        self.opens_reasoning = prompt.opens_reasoning;
        self.live = self.reading.live(prompt.opens_reasoning);
        self.live_ready = true;
        self.start(out);
        true
    }

    fn frame(&mut self, token: &TokenEvent, _texts: Option<&TokenTexts>, _text: &str, out: &mut String) {
        self.delta(token, out);
    }

    fn token(&mut self, prompt: PromptFacts, token: &TokenEvent) {
        if !self.live_ready {
            self.live = self.reading.live(prompt.opens_reasoning);
            self.live_ready = true;
        }
        self.read(&token.text);
    }

    fn finish(&mut self, answer: &Answer, text: &str, out: &mut String) {
        self.end(answer, text, out);
    }

    fn error_frame(&mut self, e: &ApiError, out: &mut String) {
        self.failed(e, out);
    }

    fn answer(mut self, a: Answer) -> String {
        self.opens_reasoning = a.prompt.opens_reasoning;
        let items = self.items(&a.completion, &a.raw);
        let output = items.iter().enumerate().map(|(i, item)| self.item_json(item, i)).collect();
        let incomplete = cut_short(&a.completion);
        let usage = self.usage(a.prompt, a.completion.tokens.len());
        self.response(if incomplete { "incomplete" } else { "completed" }, output, Some(usage), incomplete).to_string()
    }

    fn error_response(e: ApiError) -> Response {
        e.into_response()
    }
}

#[cfg(test)]
mod tests;
