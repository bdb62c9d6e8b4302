//! An OpenAI answer as its SSE stream: the role first (chat), a chunk per
//! token, or, when the answer is parsed for reasoning or tool calls, the
//! whole of it at the end; then the finish reason, the usage chunk when
//! asked for, and `[DONE]`.

use std::convert::Infallible;

use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use super::{
    chat_logprob, finish_reason, text_logprobs, to_json, usage, Reply, TextChoice, TextCompletion, TextLogprobs,
};
use crate::neutral::answer::unsent;
use crate::neutral::engine_dropped;
use crate::state::RequestLog;
use crate::worker::Event;

pub(super) struct SseState {
    pub(super) rx: UnboundedReceiver<Event>,
    pub(super) reply: Reply,
    /// Text sent so far (or held back, when tool calls may follow).
    pub(super) streamed: String,
    pub(super) role_sent: bool,
    pub(super) done: bool,
    /// Written when the stream ends, with its token counts.
    pub(super) log: RequestLog,
}

fn data(json: &str) -> String {
    format!("data: {json}\n\n")
}

/// The `logprobs` of one chunk.
enum ChunkLogprobs<'a> {
    None,
    Chat(Value),
    Text(TextLogprobs<'a>),
}

impl Reply {
    /// One chunk; `delta` is the chat delta, or the completion text as a
    /// JSON string.
    fn chunk(&self, delta: Value, logprobs: ChunkLogprobs<'_>, finish: Option<&str>) -> String {
        if !self.chat {
            let chunk = TextCompletion {
                id: &self.id,
                object: "text_completion",
                created: self.created,
                model: &self.model,
                system_fingerprint: &self.system_fingerprint,
                choices: vec![TextChoice {
                    index: 0,
                    text: delta.as_str().unwrap_or(""),
                    logprobs: match logprobs {
                        ChunkLogprobs::Text(t) => Some(t),
                        _ => None,
                    },
                    finish_reason: finish,
                }],
                usage: self.include_usage.then_some(Value::Null),
            };
            return to_json(&chunk);
        }
        let logprobs = match logprobs {
            ChunkLogprobs::Chat(v) => v,
            _ => Value::Null,
        };
        let mut v = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.system_fingerprint,
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
        });
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        v.to_string()
    }

    /// The final usage chunk of a stream with `include_usage`.
    fn usage_chunk(&self, prompt: usize, completion: usize) -> String {
        if !self.chat {
            let chunk = TextCompletion {
                id: &self.id,
                object: "text_completion",
                created: self.created,
                model: &self.model,
                system_fingerprint: &self.system_fingerprint,
                choices: Vec::new(),
                usage: Some(usage(prompt, completion)),
            };
            return to_json(&chunk);
        }
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.system_fingerprint,
            "choices": [],
            "usage": usage(prompt, completion),
        })
        .to_string()
    }

    fn content(&self, text: &str) -> Value {
        if self.chat {
            json!({"content": text})
        } else {
            json!(text)
        }
    }
}

pub(super) async fn sse_next(mut st: SseState) -> Option<(Result<String, Infallible>, SseState)> {
    if st.done {
        return None;
    }
    let mut out = String::new();
    if st.reply.chat && !st.role_sent {
        // The role comes first, as in OpenAI's streams.
        out.push_str(&data(&st.reply.chunk(json!({"role": "assistant", "content": ""}), ChunkLogprobs::None, None)));
        st.role_sent = true;
    }
    loop {
        match st.rx.recv().await {
            Some(Event::Started(_)) | Some(Event::Counted(_)) => {}
            Some(Event::Token(ev, texts)) => {
                st.streamed.push_str(&ev.text);
                if st.reply.reading.holds() {
                    continue;
                }
                let offset = st.streamed.len() - ev.text.len();
                let logprobs = match (&texts, st.reply.logprobs, st.reply.chat) {
                    (Some(t), true, true) => ChunkLogprobs::Chat(json!({"content": [chat_logprob(t, ev.logprob)]})),
                    (Some(t), true, false) => {
                        ChunkLogprobs::Text(text_logprobs(&[t], std::slice::from_ref(&ev.logprob), offset))
                    }
                    _ => ChunkLogprobs::None,
                };
                if ev.text.is_empty() && matches!(logprobs, ChunkLogprobs::None) {
                    continue;
                }
                let chunk = st.reply.chunk(st.reply.content(&ev.text), logprobs, None);
                out.push_str(&data(&chunk));
                return Some((Ok(out), st));
            }
            Some(Event::Done { completion, prompt_tokens, raw, .. }) => {
                let mut finish = finish_reason(completion.stop_reason);
                if let Some(p) = st.reply.reading.split(&completion.text, &raw) {
                    if let Some(text) = &p.reasoning {
                        let delta = json!({"reasoning_content": text});
                        out.push_str(&data(&st.reply.chunk(delta, ChunkLogprobs::None, None)));
                    }
                    if let Some(text) = &p.content {
                        out.push_str(&data(&st.reply.chunk(json!({"content": text}), ChunkLogprobs::None, None)));
                    }
                    if !p.calls.is_empty() {
                        let calls: Vec<Value> = p
                            .calls_json(&st.reply.id)
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
                        out.push_str(&data(&st.reply.chunk(json!({"tool_calls": calls}), ChunkLogprobs::None, None)));
                        finish = "tool_calls";
                    }
                } else {
                    // Text the engine held back (a possible stop string that
                    // was not one) or, when parsing, everything.
                    let sent = if st.reply.reading.holds() { "" } else { st.streamed.as_str() };
                    let rest = unsent(&completion.text, sent);
                    if !rest.is_empty() {
                        out.push_str(&data(&st.reply.chunk(st.reply.content(rest), ChunkLogprobs::None, None)));
                    }
                }
                let empty = if st.reply.chat { json!({}) } else { json!("") };
                out.push_str(&data(&st.reply.chunk(empty, ChunkLogprobs::None, Some(finish))));
                if st.reply.include_usage {
                    out.push_str(&data(&st.reply.usage_chunk(prompt_tokens, completion.tokens.len())));
                }
                out.push_str("data: [DONE]\n\n");
                st.done = true;
                st.log.finish(200, Some((prompt_tokens, completion.tokens.len())));
                return Some((Ok(out), st));
            }
            Some(Event::Failed(e)) => {
                out.push_str(&data(&e.body().to_string()));
                out.push_str("data: [DONE]\n\n");
                st.done = true;
                st.log.finish(e.status.as_u16(), None);
                return Some((Ok(out), st));
            }
            None => {
                out.push_str(&data(&engine_dropped().body().to_string()));
                out.push_str("data: [DONE]\n\n");
                st.done = true;
                st.log.finish(500, None);
                return Some((Ok(out), st));
            }
        }
    }
}
