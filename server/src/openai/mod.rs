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
use waste_host::{StopReason, TokenEvent};

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
    /// The choice being streamed (OpenAI's `index`) of `choices`.
    pub index: u32,
    pub choices: u32,
    /// Completion tokens of the choices streamed before this one.
    pub completed: usize,
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
        index: 0,
        choices: req.choices,
        completed: 0,
    };
    Ok(Generation {
        want_texts: req.logprobs,
        constraint_field: req.constraint_field,
        choices: req.choices,
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

    fn answer(self, a: Answer) -> String {
        self.answers(vec![a])
    }

    fn answers(mut self, answers: Vec<Answer>) -> String {
        self.opens_reasoning = answers.first().is_some_and(|a| a.prompt.opens_reasoning);
        full_answer(&self, &answers)
    }

    fn next_choice(&mut self, prompt: PromptFacts, out: &mut String) {
        self.index += 1;
        self.open(prompt, out);
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

impl Reply {
    /// The id a choice's tool calls are numbered under: the answer's, and
    /// the choice's index after it past the first.
    fn calls_id(&self, index: u32) -> String {
        if index == 0 {
            self.id.clone()
        } else {
            format!("{}_{index}", self.id)
        }
    }
}

/// The whole answer of a request that did not stream, one choice per
/// answer (all from one prompt), as JSON text; usage counts the prompt
/// once and every choice's tokens.
pub(crate) fn full_answer(r: &Reply, answers: &[Answer]) -> String {
    let Some(first) = answers.first() else { return r.text_completion(Vec::new(), None) };
    let completion_tokens = answers.iter().map(|a| a.completion.tokens.len()).sum();
    let usage = usage(first.prompt, completion_tokens);
    if !r.chat {
        let texts: Vec<Vec<&TokenTexts>> = answers.iter().map(|a| a.texts.iter().collect()).collect();
        let choices = answers
            .iter()
            .zip(&texts)
            .zip(0..)
            .map(|((a, texts), index)| TextChoice {
                index,
                text: &a.completion.text,
                logprobs: r.logprobs.then(|| text_logprobs(texts, &a.completion.logprobs, 0)),
                finish_reason: Some(finish_reason(a.completion.stop_reason)),
            })
            .collect();
        return r.text_completion(choices, Some(usage));
    }
    let choices: Vec<Value> = answers.iter().zip(0..).map(|(a, index)| chat_choice(r, a, index)).collect();
    json!({
        "id": r.id,
        "object": "chat.completion",
        "created": r.created,
        "model": r.model,
        "system_fingerprint": r.system_fingerprint,
        "choices": choices,
        "usage": usage,
    })
    .to_string()
}

/// One choice of a chat answer: the message read for its reasoning and
/// tool calls.
fn chat_choice(r: &Reply, a: &Answer, index: u32) -> Value {
    let c = &a.completion;
    let mut finish = finish_reason(c.stop_reason);
    let logprobs = if r.logprobs {
        json!({"content": a.texts.iter().zip(&c.logprobs).map(|(t, &lp)| chat_logprob(t, lp)).collect::<Vec<_>>()})
    } else {
        Value::Null
    };
    let mut message = json!({"role": "assistant", "content": r.reading.content(&c.text, r.opens_reasoning)});
    if let Some(p) = r.reading.split(&c.text, &a.raw, r.opens_reasoning) {
        message = json!({"role": "assistant", "content": p.content});
        if let Some(reasoning) = &p.reasoning {
            message["reasoning_content"] = json!(reasoning);
        }
        if !p.calls.is_empty() {
            message["tool_calls"] = p.calls_json(&r.calls_id(index));
            finish = "tool_calls";
        }
    }
    json!({"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish})
}

/// JSON text of a value whose maps keep their own order (a `Value` would
/// sort them).
fn to_json(v: &impl Serialize) -> String {
    serde_json::to_string(v)
        .unwrap_or_else(|e| format!("{{\"error\": {{\"message\": \"serialising the answer: {e}\"}}}}"))
}

#[cfg(test)]
mod tests;
