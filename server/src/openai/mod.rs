//! OpenAI's chat and legacy completions: the request into a job for the
//! engine thread, its events into the JSON answer or the SSE stream
//! (`stream`); the bodies are read by `request`.

mod request;
mod stream;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{json, Value};
use tokio::sync::mpsc::unbounded_channel;
use waste_host::StopReason;

use crate::error::ApiError;
use crate::neutral::answer::{speaks_harmony, Reading};
use crate::neutral::engine_dropped;
use crate::state::{
    add_warning, model_warning, next_id, now, read_body, streamed_response, RequestLog, Shared, Tokens,
};
use crate::worker::{Event, Job, TokenTexts};
use request::Request;
use stream::{sse_next, SseState};

pub async fn chat(State(state): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    handle(state, headers, body, true).await.unwrap_or_else(IntoResponse::into_response)
}

pub async fn completions(State(state): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    handle(state, headers, body, false).await.unwrap_or_else(IntoResponse::into_response)
}

/// What the answers of one request share.
pub(crate) struct Reply {
    pub chat: bool,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub logprobs: bool,
    /// The answer searched for the request's tool calls and, with gpt-oss,
    /// its reasoning.
    pub reading: Reading,
    pub include_usage: bool,
}

async fn handle(state: Shared, headers: HeaderMap, body: Body, chat: bool) -> Result<Response, ApiError> {
    let bytes = read_body(&state, &headers, body).await?;
    let req: Request = request::parse(&bytes, chat, state.context)?;
    let vocab = state.model.info().vocab_size;
    if let Some((id, _)) = req.params.logit_bias.iter().find(|(id, _)| *id as usize >= vocab) {
        return Err(ApiError::bad_request(
            format!("`logit_bias` names token {id}; the vocabulary has {vocab}"),
            Some("logit_bias"),
        ));
    }
    let warning = model_warning(&state, req.model.as_deref())?;
    let (tx, mut rx) = unbounded_channel();
    let reply = Reply {
        chat,
        id: next_id(if chat { "chatcmpl" } else { "cmpl" }),
        created: now(),
        model: state.model_id.clone(),
        system_fingerprint: state.system_fingerprint.clone(),
        logprobs: req.logprobs,
        reading: Reading::new(req.prompt.tools().filter(|_| req.tools_enabled), chat && speaks_harmony(&state.model)),
        include_usage: req.include_usage,
    };
    state.worker.submit(Job {
        prompt: req.prompt,
        params: req.params,
        want_texts: req.logprobs,
        count_only: false,
        constraint_field: req.constraint_field,
        events: tx,
    })?;
    // Waiting for the prompt lets its errors be HTTP errors, streaming or not.
    match rx.recv().await {
        Some(Event::Started(_)) => {}
        Some(Event::Failed(e)) => return Err(e),
        _ => return Err(engine_dropped()),
    }
    let mut response = if req.stream {
        let log = RequestLog::streamed(&state, &headers, if chat { "/v1/chat/completions" } else { "/v1/completions" });
        let stream = futures_util::stream::unfold(
            SseState { rx, reply, streamed: String::new(), role_sent: false, done: false, log },
            sse_next,
        );
        streamed_response(Body::from_stream(stream), "text/event-stream")
    } else {
        loop {
            match rx.recv().await {
                Some(Event::Started(_)) | Some(Event::Token(..)) | Some(Event::Counted(_)) => {}
                Some(Event::Done { completion, prompt_tokens, texts, raw }) => {
                    let tokens = Tokens { prompt: prompt_tokens, completion: completion.tokens.len() };
                    let text = full_answer(&reply, completion, &raw, prompt_tokens, &texts);
                    let mut response = ([(header::CONTENT_TYPE, "application/json")], text).into_response();
                    response.extensions_mut().insert(tokens);
                    break response;
                }
                Some(Event::Failed(e)) => return Err(e),
                None => return Err(engine_dropped()),
            }
        }
    };
    add_warning(&mut response, warning);
    Ok(response)
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

/// The whole answer of a request that did not stream, as JSON text.
pub(crate) fn full_answer(
    r: &Reply,
    c: waste_host::Completion,
    raw: &str,
    prompt_tokens: usize,
    texts: &[TokenTexts],
) -> String {
    let mut finish = finish_reason(c.stop_reason);
    if !r.chat {
        let texts: Vec<&TokenTexts> = texts.iter().collect();
        let answer = TextCompletion {
            id: &r.id,
            object: "text_completion",
            created: r.created,
            model: &r.model,
            system_fingerprint: &r.system_fingerprint,
            choices: vec![TextChoice {
                index: 0,
                text: &c.text,
                logprobs: r.logprobs.then(|| text_logprobs(&texts, &c.logprobs, 0)),
                finish_reason: Some(finish),
            }],
            usage: Some(usage(prompt_tokens, c.tokens.len())),
        };
        return to_json(&answer);
    }
    let logprobs = if r.logprobs {
        json!({"content": texts.iter().zip(&c.logprobs).map(|(t, &lp)| chat_logprob(t, lp)).collect::<Vec<_>>()})
    } else {
        Value::Null
    };
    let mut message = json!({"role": "assistant", "content": c.text});
    if let Some(p) = r.reading.split(&c.text, raw) {
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
        "usage": usage(prompt_tokens, c.tokens.len()),
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
