//! A streamed Messages answer as Anthropic's events: `message_start`, a
//! `ping`, each block opened, filled by its deltas and stopped in turn,
//! `message_delta` with the stop reason and the output count,
//! `message_stop`. Every frame names its event (the SDK drops frames
//! without `event:`) and there is no `[DONE]`.

use serde_json::{json, Value};
use waste_host::TokenEvent;

use super::{signature, usage, Block, Reply};
use crate::driver::Answer;
use crate::neutral::answer::unsent;
use crate::worker::PromptFacts;

pub(super) fn frame(out: &mut String, data: Value) {
    let name = data["type"].as_str().unwrap_or("error").to_string();
    out.push_str(&format!("event: {name}\ndata: {data}\n\n"));
}

/// Where a stream is among its blocks.
#[derive(Default)]
pub(super) struct Blocks {
    /// Index of the next block, and whether a text block is open now.
    next_index: usize,
    text_open: bool,
    /// The thinking block streamed now, if one is open: its text so far,
    /// which its signature names when it closes.
    thinking: Option<String>,
}

impl Blocks {
    /// Reasoning as it comes: a thinking block opened at its first piece.
    fn thinking_delta(&mut self, out: &mut String, text: &str) {
        if text.is_empty() {
            return;
        }
        self.close_text(out);
        let index = self.next_index;
        let thinking = self.thinking.get_or_insert_with(|| {
            let start = json!({"type": "thinking", "thinking": "", "signature": ""});
            frame(out, json!({"type": "content_block_start", "index": index, "content_block": start}));
            String::new()
        });
        thinking.push_str(text);
        frame(
            out,
            json!({"type": "content_block_delta", "index": index, "delta": {"type": "thinking_delta", "thinking": text}}),
        );
    }

    /// Ends the open thinking block with its signature, as Anthropic's
    /// streams do.
    fn close_thinking(&mut self, out: &mut String) {
        if let Some(thinking) = self.thinking.take() {
            let index = self.next_index;
            let delta = json!({"type": "signature_delta", "signature": signature(&thinking)});
            frame(out, json!({"type": "content_block_delta", "index": index, "delta": delta}));
            frame(out, json!({"type": "content_block_stop", "index": index}));
            self.next_index += 1;
        }
    }

    fn open_text(&mut self, out: &mut String) {
        self.close_thinking(out);
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
    pub(super) fn block(&mut self, out: &mut String, block: &Block) {
        self.close_thinking(out);
        self.close_text(out);
        let index = self.next_index;
        let (start, deltas): (Value, Vec<Value>) = match block {
            Block::Text(t) => (json!({"type": "text", "text": ""}), vec![json!({"type": "text_delta", "text": t})]),
            Block::Thinking(t) => (
                json!({"type": "thinking", "thinking": "", "signature": ""}),
                vec![
                    json!({"type": "thinking_delta", "thinking": t}),
                    json!({"type": "signature_delta", "signature": signature(t)}),
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

impl Reply {
    /// `message_start` and a `ping`, sent before the first token: the SDK
    /// reports the input count from it at once.
    pub(super) fn start(&self, prompt: PromptFacts, out: &mut String) {
        let message = json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": usage(prompt, 0),
        });
        frame(out, json!({"type": "message_start", "message": message}));
        frame(out, json!({"type": "ping"}));
    }

    /// A token's deltas: its reasoning and its text as the live reading
    /// gives them out (no text while the answer is held back for parsing).
    pub(super) fn delta(&mut self, ev: &TokenEvent, out: &mut String) {
        let s = self.live.push(&ev.text);
        self.streamed.thinking_delta(out, &s.reasoning);
        self.streamed.text_delta(out, &s.content);
    }

    /// The parsed blocks or the text not yet sent, then `message_delta`
    /// and `message_stop`.
    pub(super) fn end(&mut self, a: &Answer, text: &str, out: &mut String) {
        let completion = &a.completion;
        let blocks = self.blocks(completion, &a.raw);
        // What the engine held back (a possible stop string that was not
        // one), and what the live reading held.
        let s = self.live.finish(unsent(&completion.text, text));
        self.streamed.thinking_delta(out, &s.reasoning);
        self.streamed.text_delta(out, &s.content);
        if self.reading.holds() {
            let streamed_reasoning = self.live.streamed_reasoning();
            for b in blocks.iter().filter(|b| !(streamed_reasoning && matches!(b, Block::Thinking(_)))) {
                self.streamed.block(out, b);
            }
        }
        self.streamed.close_thinking(out);
        self.streamed.close_text(out);
        let (stop_reason, stop_sequence) = self.stop(completion, &a.raw, &blocks);
        frame(
            out,
            json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                   "usage": {"output_tokens": completion.tokens.len()}}),
        );
        frame(out, json!({"type": "message_stop"}));
    }
}
