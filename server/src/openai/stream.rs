//! An OpenAI answer as its SSE stream: the role first (chat), a chunk per
//! token, or, when the answer is parsed for reasoning or tool calls, all of
//! it at the end; then the finish reason; each choice (`n`) in turn, its
//! `index` on each chunk; then the usage chunk when asked for, and
//! `[DONE]`.

use serde_json::{json, Value};
use waste_host::TokenEvent;

use super::{chat_logprob, finish_reason, text_logprobs, usage, Reply, TextChoice, TextLogprobs};
use crate::driver::Answer;
use crate::error::ApiError;
use crate::neutral::answer::unsent;
use crate::worker::{PromptFacts, TokenTexts};

fn data(json: &str) -> String {
    format!("data: {json}\n\n")
}

/// A failure once streaming: OpenAI's error object as one event, then the
/// end, so a client waiting for `[DONE]` stops.
pub(super) fn error(e: &ApiError, out: &mut String) {
    out.push_str(&data(&e.body().to_string()));
    out.push_str("data: [DONE]\n\n");
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
            let choice = TextChoice {
                index: self.index,
                text: delta.as_str().unwrap_or(""),
                logprobs: match logprobs {
                    ChunkLogprobs::Text(t) => Some(t),
                    _ => None,
                },
                finish_reason: finish,
            };
            return self.text_completion(vec![choice], self.include_usage.then_some(Value::Null));
        }
        let logprobs = match logprobs {
            ChunkLogprobs::Chat(v) => v,
            _ => Value::Null,
        };
        let choices = json!([{"index": self.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]);
        let mut v = self.chat_chunk(choices);
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        v.to_string()
    }

    /// The final usage chunk of a stream with `include_usage`.
    fn usage_chunk(&self, prompt: PromptFacts, completion: usize) -> String {
        if !self.chat {
            return self.text_completion(Vec::new(), Some(usage(prompt, completion)));
        }
        let mut v = self.chat_chunk(json!([]));
        v["usage"] = usage(prompt, completion);
        v.to_string()
    }

    /// A chat chunk with these choices, its fields in OpenAI's order.
    fn chat_chunk(&self, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.system_fingerprint,
            "choices": choices,
        })
    }

    fn content(&self, text: &str) -> Value {
        if self.chat {
            json!({"content": text})
        } else {
            json!(text)
        }
    }

    /// The role comes first, as in OpenAI's streams (chat only).
    pub(super) fn open_stream(&self, out: &mut String) {
        if self.chat {
            out.push_str(&data(&self.chunk(json!({"role": "assistant", "content": ""}), ChunkLogprobs::None, None)));
        }
    }

    /// A token's chunks: its reasoning and its content as the live reading
    /// gives them out (no content while it is held back for parsing), its
    /// log-probabilities with the last; `text` is the answer so far.
    pub(super) fn token_chunk(&mut self, ev: &TokenEvent, texts: Option<&TokenTexts>, text: &str, out: &mut String) {
        let s = self.live.push(&ev.text);
        let offset = text.len() - ev.text.len();
        let mut logprobs = match (texts, self.logprobs && !self.reading.holds(), self.chat) {
            (Some(t), true, true) => ChunkLogprobs::Chat(json!({"content": [chat_logprob(t, ev.logprob)]})),
            (Some(t), true, false) => {
                ChunkLogprobs::Text(text_logprobs(&[t], std::slice::from_ref(&ev.logprob), offset))
            }
            _ => ChunkLogprobs::None,
        };
        if !s.reasoning.is_empty() {
            let last = if s.content.is_empty() {
                std::mem::replace(&mut logprobs, ChunkLogprobs::None)
            } else {
                ChunkLogprobs::None
            };
            out.push_str(&data(&self.chunk(json!({"reasoning_content": s.reasoning}), last, None)));
        }
        if s.content.is_empty() && matches!(logprobs, ChunkLogprobs::None) {
            return;
        }
        out.push_str(&data(&self.chunk(self.content(&s.content), logprobs, None)));
    }

    /// The parsed answer or the text not yet sent, the finish reason, the
    /// usage when asked for, `[DONE]`.
    pub(super) fn last_chunks(&mut self, a: &Answer, text: &str, out: &mut String) {
        let completion = &a.completion;
        let mut finish = finish_reason(completion.stop_reason);
        // What the engine held back (a possible stop string), and what the
        // live reading held.
        let s = self.live.finish(unsent(&completion.text, text));
        if !s.reasoning.is_empty() {
            out.push_str(&data(&self.chunk(json!({"reasoning_content": s.reasoning}), ChunkLogprobs::None, None)));
        }
        if !s.content.is_empty() {
            out.push_str(&data(&self.chunk(self.content(&s.content), ChunkLogprobs::None, None)));
        }
        if !self.reading.holds() {
            // Everything was sent as it came.
        } else if let Some(p) = self.reading.split(&completion.text, &a.raw, self.opens_reasoning) {
            if let Some(text) = p.reasoning.as_ref().filter(|_| !self.live.streamed_reasoning()) {
                let delta = json!({"reasoning_content": text});
                out.push_str(&data(&self.chunk(delta, ChunkLogprobs::None, None)));
            }
            if let Some(text) = &p.content {
                out.push_str(&data(&self.chunk(json!({"content": text}), ChunkLogprobs::None, None)));
            }
            if !p.calls.is_empty() {
                let calls: Vec<Value> = p
                    .calls_json(&self.calls_id(self.index))
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
                out.push_str(&data(&self.chunk(json!({"tool_calls": calls}), ChunkLogprobs::None, None)));
                finish = "tool_calls";
            }
        } else {
            // Held back for parsing and nothing found: the content as it is
            // (without any reasoning already sent).
            let content = self.reading.content(&completion.text, self.opens_reasoning);
            if !content.is_empty() {
                out.push_str(&data(&self.chunk(self.content(&content), ChunkLogprobs::None, None)));
            }
        }
        let empty = if self.chat { json!({}) } else { json!("") };
        out.push_str(&data(&self.chunk(empty, ChunkLogprobs::None, Some(finish))));
        self.completed += completion.tokens.len();
        if self.index + 1 < self.choices {
            return; // The next choice follows.
        }
        if self.include_usage {
            out.push_str(&data(&self.usage_chunk(a.prompt, self.completed)));
        }
        out.push_str("data: [DONE]\n\n");
    }
}
