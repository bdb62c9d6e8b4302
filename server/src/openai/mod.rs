//! OpenAI's chat and legacy completions: the request (`request`) into a
//! generation for the driver, its answer as OpenAI's JSON, or as the SSE
//! stream (`stream`).

pub(crate) mod request;
mod stream;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{json, Value};
use waste_host::{Completion, StopReason, TokenEvent};

use crate::driver::{self, Answer, Dialect, Generation, Parsed};
use crate::error::ApiError;
use crate::neutral::answer::{speaks_harmony, thinks_in_blocks, Live, Reading};
use crate::state::{model_warning, next_id, now, AppState, Shared};
use crate::worker::{PromptFacts, TokenTexts};

pub async fn chat(State(state): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    driver::serve(state, headers, body, "/v1/chat/completions", |state, body| parse(state, body, true)).await
}

pub async fn completions(State(state): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    driver::serve(state, headers, body, "/v1/completions", |state, body| parse(state, body, false)).await
}

/// What the answers of one request share.
pub(crate) struct Reply {
    pub chat: bool,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub logprobs: bool,
    /// The answer searched for the request's tool calls and its reasoning.
    pub reading: Reading,
    pub include_usage: bool,
    /// A stream's reading as its tokens come.
    pub live: Live,
    /// Whether the prompt opened a reasoning block.
    pub opens_reasoning: bool,
}

fn parse(state: &AppState, body: &[u8], chat: bool) -> Result<Parsed<Reply>, ApiError> {
    let req = request::parse(body, chat, state.context)?;
    let vocab = state.model.info().vocab_size;
    if let Some((id, _)) = req.params.logit_bias.iter().find(|(id, _)| *id as usize >= vocab) {
        return Err(ApiError::bad_request(
            format!("`logit_bias` names token {id}; the vocabulary has {vocab}"),
            Some("logit_bias"),
        ));
    }
    let warning = model_warning(state, req.model.as_deref())?;
    let reply = Reply {
        chat,
        id: next_id(if chat { "chatcmpl" } else { "cmpl" }),
        created: now(),
        model: state.model_id.clone(),
        system_fingerprint: state.system_fingerprint.clone(),
        logprobs: req.logprobs,
        reading: Reading::new(
            req.prompt.tools().filter(|_| req.tools_enabled),
            chat && speaks_harmony(state.chat_template(false)),
            chat && thinks_in_blocks(state.chat_template(false)),
        ),
        include_usage: req.include_usage,
        live: Live::default(),
        opens_reasoning: false,
    };
    Ok(Generation {
        want_texts: req.logprobs,
        constraint_field: req.constraint_field,
        ..Generation::new(req.prompt, req.params, req.stream, warning, reply)
    }
    .into())
}

impl Dialect for Reply {
    const STREAM: &'static str = "text/event-stream";

    fn open(&mut self, prompt: PromptFacts, out: &mut String) -> bool {
        self.opens_reasoning = prompt.opens_reasoning;
        self.live = self.reading.live(prompt.opens_reasoning);
        self.open_stream(out);
        // The role chunk rides with the first content chunk: a role alone
        // tells a client nothing, and the stream's chunks stay as they were.
        false
    }

    fn frame(&mut self, token: &TokenEvent, texts: Option<&TokenTexts>, text: &str, out: &mut String) {
        self.token_chunk(token, texts, text, out);
    }

    fn finish(&mut self, answer: &Answer, text: &str, out: &mut String) {
        self.last_chunks(answer, text, out);
    }

    fn error_frame(&mut self, e: &ApiError, out: &mut String) {
        stream::error(e, out);
    }

    fn answer(mut self, a: Answer) -> String {
        self.opens_reasoning = a.prompt.opens_reasoning;
        full_answer(&self, a.completion, &a.raw, a.prompt, &a.texts)
    }

    fn error_response(e: ApiError) -> Response {
        e.into_response()
    }
}

fn finish_reason(reason: StopReason) -> &'static str {
    match reason {
        StopReason::Length | StopReason::ContextFull => "length",
        _ => "stop",
    }
}

/// OpenAI's `usage`, with the prompt tokens the prefix cache supplied as
/// `prompt_tokens_details.cached_tokens` (OpenAI's prompt caching field).
fn usage(prompt: PromptFacts, completion: usize) -> Value {
    json!({
        "prompt_tokens": prompt.tokens, "completion_tokens": completion, "total_tokens": prompt.tokens + completion,
        "prompt_tokens_details": {"cached_tokens": prompt.cached},
    })
}

fn chat_logprob(t: &TokenTexts, logprob: f32) -> Value {
    let top: Vec<Value> =
        t.top.iter().map(|(s, lp)| json!({"token": s, "logprob": lp, "bytes": s.as_bytes()})).collect();
    json!({"token": t.token, "logprob": logprob, "bytes": t.token.as_bytes(), "top_logprobs": top})
}

/// A token's alternatives as the legacy completions list them: a JSON
/// object of text -> logprob, most likely first (a JSON object keeps its
/// order on the wire, and clients read it in that order). Two ids with the
/// same text keep the more likely one.
struct InOrder<'a>(&'a [(String, f32)]);

impl Serialize for InOrder<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seen = std::collections::HashSet::new();
        let mut map = s.serialize_map(None)?;
        for (text, lp) in self.0 {
            if seen.insert(text.as_str()) {
                map.serialize_entry(text, lp)?;
            }
        }
        map.end()
    }
}

/// The legacy completions' `logprobs` object.
#[derive(serde::Serialize)]
struct TextLogprobs<'a> {
    tokens: Vec<&'a str>,
    token_logprobs: &'a [f32],
    top_logprobs: Vec<InOrder<'a>>,
    text_offset: Vec<usize>,
}

fn text_logprobs<'a>(texts: &[&'a TokenTexts], logprobs: &'a [f32], start_offset: usize) -> TextLogprobs<'a> {
    let mut offset = start_offset;
    let mut offsets = Vec::with_capacity(texts.len());
    for t in texts {
        offsets.push(offset);
        offset += t.token.len();
    }
    TextLogprobs {
        tokens: texts.iter().map(|t| t.token.as_str()).collect(),
        token_logprobs: logprobs,
        top_logprobs: texts.iter().map(|t| InOrder(&t.top)).collect(),
        text_offset: offsets,
    }
}

/// One choice of a legacy completion (answer or chunk).
#[derive(serde::Serialize)]
struct TextChoice<'a> {
    index: u32,
    text: &'a str,
    logprobs: Option<TextLogprobs<'a>>,
    finish_reason: Option<&'a str>,
}

/// A legacy completion, whole or one chunk of its stream.
#[derive(serde::Serialize)]
struct TextCompletion<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    system_fingerprint: &'a str,
    choices: Vec<TextChoice<'a>>,
    /// Absent, `null` (a chunk before the usage chunk) or the counts.
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Value>,
}

impl Reply {
    /// A legacy completion, whole or one chunk, as JSON text.
    fn text_completion(&self, choices: Vec<TextChoice<'_>>, usage: Option<Value>) -> String {
        to_json(&TextCompletion {
            id: &self.id,
            object: "text_completion",
            created: self.created,
            model: &self.model,
            system_fingerprint: &self.system_fingerprint,
            choices,
            usage,
        })
    }
}

/// The whole answer of a request that did not stream, as JSON text.
pub(crate) fn full_answer(r: &Reply, c: Completion, raw: &str, prompt: PromptFacts, texts: &[TokenTexts]) -> String {
    let mut finish = finish_reason(c.stop_reason);
    if !r.chat {
        let texts: Vec<&TokenTexts> = texts.iter().collect();
        let choice = TextChoice {
            index: 0,
            text: &c.text,
            logprobs: r.logprobs.then(|| text_logprobs(&texts, &c.logprobs, 0)),
            finish_reason: Some(finish),
        };
        return r.text_completion(vec![choice], Some(usage(prompt, c.tokens.len())));
    }
    let logprobs = if r.logprobs {
        json!({"content": texts.iter().zip(&c.logprobs).map(|(t, &lp)| chat_logprob(t, lp)).collect::<Vec<_>>()})
    } else {
        Value::Null
    };
    let mut message = json!({"role": "assistant", "content": r.reading.content(&c.text, r.opens_reasoning)});
    if let Some(p) = r.reading.split(&c.text, raw, r.opens_reasoning) {
        message = json!({"role": "assistant", "content": p.content});
        if let Some(reasoning) = &p.reasoning {
            message["reasoning_content"] = json!(reasoning);
        }
        if !p.calls.is_empty() {
            message["tool_calls"] = p.calls_json(&r.id);
            finish = "tool_calls";
        }
    }
    json!({
        "id": r.id,
        "object": "chat.completion",
        "created": r.created,
        "model": r.model,
        "system_fingerprint": r.system_fingerprint,
        "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}],
        "usage": usage(prompt, c.tokens.len()),
    })
    .to_string()
}

/// JSON text of a value whose maps keep their own order (a `Value` would
/// sort them).
fn to_json(v: &impl Serialize) -> String {
    serde_json::to_string(v)
        .unwrap_or_else(|e| format!("{{\"error\": {{\"message\": \"serialising the answer: {e}\"}}}}"))
}

#[cfg(test)]
mod tests;
