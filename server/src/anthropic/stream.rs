//! A streamed Messages answer as Anthropic's events: `message_start`, a
//! `ping`, each block opened, filled by its deltas and stopped in turn,
//! `message_delta` with the stop reason and the output count,
//! `message_stop`. Every frame names its event (the SDK drops frames
//! without `event:`) and there is no `[DONE]`.

use std::convert::Infallible;

use futures_util::Stream;
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use super::{error_body, Block, Reply};
use crate::neutral::answer::unsent;
use crate::neutral::engine_dropped;
use crate::state::RequestLog;
use crate::worker::Event;

fn frame(out: &mut String, data: Value) {
    let name = data["type"].as_str().unwrap_or("error").to_string();
    out.push_str(&format!("event: {name}\ndata: {data}\n\n"));
}

struct Sse {
    rx: UnboundedReceiver<Event>,
    reply: Reply,
    input_tokens: usize,
    started: bool,
    /// Index of the next block, and whether a text block is open now.
    next_index: usize,
    text_open: bool,
    streamed: String,
    done: bool,
    log: RequestLog,
}

impl Sse {
    fn open_text(&mut self, out: &mut String) {
        if !self.text_open {
            let index = self.next_index;
            frame(
                out,
                json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}),
            );
            self.text_open = true;
        }
    }

    fn close_text(&mut self, out: &mut String) {
        if self.text_open {
            frame(out, json!({"type": "content_block_stop", "index": self.next_index}));
            self.text_open = false;
            self.next_index += 1;
        }
    }

    fn text_delta(&mut self, out: &mut String, text: &str) {
        if !text.is_empty() {
            self.open_text(out);
            let index = self.next_index;
            frame(
                out,
                json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}),
            );
        }
    }

    /// A whole block of a parsed answer: start, its deltas, stop.
    fn block(&mut self, out: &mut String, block: &Block) {
        let index = self.next_index;
        let (start, deltas): (Value, Vec<Value>) = match block {
            Block::Text(t) => (json!({"type": "text", "text": ""}), vec![json!({"type": "text_delta", "text": t})]),
            Block::Thinking(t) => (
                json!({"type": "thinking", "thinking": "", "signature": ""}),
                vec![
                    json!({"type": "thinking_delta", "thinking": t}),
                    json!({"type": "signature_delta", "signature": ""}),
                ],
            ),
            Block::ToolUse { id, name, input } => {
                // Two slices of one serialisation: each prefix is a JSON
                // prefix, which the SDK's partial parser needs.
                let text = input.to_string();
                let cut = (1..text.len())
                    .rev()
                    .find(|&i| text.is_char_boundary(i) && i <= text.len() / 2)
                    .unwrap_or(text.len());
                let pieces = [&text[..cut], &text[cut..]];
                (
                    json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                    pieces
                        .iter()
                        .filter(|p| !p.is_empty())
                        .map(|p| json!({"type": "input_json_delta", "partial_json": p}))
                        .collect(),
                )
            }
        };
        frame(out, json!({"type": "content_block_start", "index": index, "content_block": start}));
        for d in deltas {
            frame(out, json!({"type": "content_block_delta", "index": index, "delta": d}));
        }
        frame(out, json!({"type": "content_block_stop", "index": index}));
        self.next_index += 1;
    }
}

pub(super) fn events(
    rx: UnboundedReceiver<Event>,
    reply: Reply,
    input_tokens: usize,
    log: RequestLog,
) -> impl Stream<Item = Result<String, Infallible>> {
    let st = Sse {
        rx,
        reply,
        input_tokens,
        started: false,
        next_index: 0,
        text_open: false,
        streamed: String::new(),
        done: false,
        log,
    };
    futures_util::stream::unfold(st, next)
}

async fn next(mut st: Sse) -> Option<(Result<String, Infallible>, Sse)> {
    if st.done {
        return None;
    }
    let mut out = String::new();
    if !st.started {
        st.started = true;
        let message = json!({
            "id": st.reply.id, "type": "message", "role": "assistant", "model": st.reply.model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": st.input_tokens, "output_tokens": 0},
        });
        frame(&mut out, json!({"type": "message_start", "message": message}));
        frame(&mut out, json!({"type": "ping"}));
        return Some((Ok(out), st));
    }
    loop {
        match st.rx.recv().await {
            Some(Event::Token(ev, _)) => {
                st.streamed.push_str(&ev.text);
                if st.reply.reading.holds() || ev.text.is_empty() {
                    continue;
                }
                st.text_delta(&mut out, &ev.text);
                return Some((Ok(out), st));
            }
            Some(Event::Done { completion, prompt_tokens, raw, .. }) => {
                let blocks = st.reply.blocks(&completion, &raw);
                if st.reply.reading.holds() {
                    for b in &blocks {
                        st.block(&mut out, b);
                    }
                } else {
                    // What the engine held back (a possible stop string that
                    // was not one).
                    let rest = unsent(&completion.text, &st.streamed);
                    st.text_delta(&mut out, rest);
                    st.close_text(&mut out);
                }
                let (stop_reason, stop_sequence) = st.reply.stop(&completion, &raw, &blocks);
                let n = completion.tokens.len();
                frame(
                    &mut out,
                    json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                           "usage": {"output_tokens": n}}),
                );
                frame(&mut out, json!({"type": "message_stop"}));
                st.done = true;
                st.log.finish(200, Some((prompt_tokens, n)));
                return Some((Ok(out), st));
            }
            Some(Event::Failed(e)) => {
                frame(&mut out, error_body(&e));
                st.done = true;
                st.log.finish(e.status.as_u16(), None);
                return Some((Ok(out), st));
            }
            Some(Event::Started(_)) | Some(Event::Counted(_)) => {}
            None => {
                frame(&mut out, error_body(&engine_dropped()));
                st.done = true;
                st.log.finish(500, None);
                return Some((Ok(out), st));
            }
        }
    }
}
