//! A streamed Responses answer as the API's typed events:
//! `response.created` and `response.in_progress`; each output item added,
//! filled by its deltas (`response.reasoning_text.delta`,
//! `response.output_text.delta`, `response.function_call_arguments.delta`),
//! its `.done` events, and `response.output_item.done` with the item
//! whole; then `response.completed` (or `response.incomplete` when the
//! answer was cut at `max_output_tokens`) with every item and the usage.
//! Each event names itself in an `event:` line and carries a
//! `sequence_number`; there is no `[DONE]`.

use serde_json::{json, Value};
use waste_host::TokenEvent;

use super::{cut_short, output_text, Item, Reply};
use crate::driver::Answer;
use crate::error::ApiError;
use crate::neutral::answer::unsent;

/// The item a stream is filling now.
#[derive(Default)]
enum Open {
    #[default]
    None,
    Reasoning(String),
    Message(String),
}

/// Where a stream is: the items it finished and the one it is filling.
#[derive(Default)]
pub(super) struct Items {
    done: Vec<Value>,
    open: Open,
    sequence: u64,
}

impl Reply {
    fn event(&mut self, out: &mut String, mut data: Value) {
        data["sequence_number"] = json!(self.streamed.sequence);
        self.streamed.sequence += 1;
        let name = data["type"].as_str().unwrap_or("error").to_string();
        out.push_str(&format!("event: {name}\ndata: {data}\n\n"));
    }

    /// `response.created` and `response.in_progress`.
    pub(super) fn start(&mut self, out: &mut String) {
        let r = self.response("in_progress", Vec::new(), None, false);
        self.event(out, json!({"type": "response.created", "response": r}));
        let r = self.response("in_progress", Vec::new(), None, false);
        self.event(out, json!({"type": "response.in_progress", "response": r}));
    }

    /// Opens item `item` (empty) at the next index, with its first part.
    fn add(&mut self, out: &mut String, item: &Item) -> usize {
        let index = self.streamed.done.len();
        let mut added = self.item_json(item, index);
        added["status"] = json!("in_progress");
        let part = match item {
            Item::Reasoning(_) => {
                added["content"] = json!([]);
                Some(json!({"type": "reasoning_text", "text": ""}))
            }
            Item::Message(_) => {
                added["content"] = json!([]);
                Some(output_text(""))
            }
            Item::Call { .. } => {
                added["arguments"] = json!("");
                None
            }
        };
        self.event(out, json!({"type": "response.output_item.added", "output_index": index, "item": added}));
        if let Some(part) = part {
            let id = added["id"].clone();
            self.event(
                out,
                json!({"type": "response.content_part.added", "item_id": id, "output_index": index, "content_index": 0, "part": part}),
            );
        }
        index
    }

    /// Ends item `item` at `index`: its `.done` events, then the item whole.
    fn close(&mut self, out: &mut String, item: &Item, index: usize) {
        let whole = self.item_json(item, index);
        let id = whole["id"].clone();
        match item {
            Item::Reasoning(text) => {
                let at = json!({"item_id": id, "output_index": index, "content_index": 0});
                let mut done = at.clone();
                done["type"] = json!("response.reasoning_text.done");
                done["text"] = json!(text);
                self.event(out, done);
                let mut part = at;
                part["type"] = json!("response.content_part.done");
                part["part"] = json!({"type": "reasoning_text", "text": text});
                self.event(out, part);
            }
            Item::Message(text) => {
                let at = json!({"item_id": id, "output_index": index, "content_index": 0});
                let mut done = at.clone();
                done["type"] = json!("response.output_text.done");
                done["text"] = json!(text);
                done["logprobs"] = json!([]);
                self.event(out, done);
                let mut part = at;
                part["type"] = json!("response.content_part.done");
                part["part"] = output_text(text);
                self.event(out, part);
            }
            Item::Call { arguments, .. } => {
                self.event(
                    out,
                    json!({"type": "response.function_call_arguments.done", "item_id": id, "output_index": index, "arguments": arguments}),
                );
            }
        }
        self.event(out, json!({"type": "response.output_item.done", "output_index": index, "item": whole}));
        self.streamed.done.push(whole);
    }

    /// Ends the item being filled, if any.
    fn close_open(&mut self, out: &mut String) {
        let index = self.streamed.done.len();
        match std::mem::take(&mut self.streamed.open) {
            Open::None => {}
            Open::Reasoning(text) => self.close(out, &Item::Reasoning(text), index),
            Open::Message(text) => self.close(out, &Item::Message(text), index),
        }
    }

    fn reasoning_delta(&mut self, out: &mut String, text: &str) {
        self.piece(out, text, true);
    }

    fn text_delta(&mut self, out: &mut String, text: &str) {
        self.piece(out, text, false);
    }

    /// A piece of reasoning or of the answer's text: its item opened first
    /// when another one (or none) is being filled, then its delta.
    fn piece(&mut self, out: &mut String, text: &str, reasoning: bool) {
        if text.is_empty() {
            return;
        }
        let filling = match &mut self.streamed.open {
            Open::Reasoning(so_far) if reasoning => Some(so_far),
            Open::Message(so_far) if !reasoning => Some(so_far),
            _ => None,
        };
        match filling {
            Some(so_far) => so_far.push_str(text),
            None => {
                self.close_open(out);
                let (item, open) = if reasoning {
                    (Item::Reasoning(String::new()), Open::Reasoning(text.to_string()))
                } else {
                    (Item::Message(String::new()), Open::Message(text.to_string()))
                };
                self.add(out, &item);
                self.streamed.open = open;
            }
        }
        let index = self.streamed.done.len();
        let mut delta = if reasoning {
            json!({"type": "response.reasoning_text.delta", "item_id": self.item_id("rs", index)})
        } else {
            json!({"type": "response.output_text.delta", "item_id": self.item_id("msg", index), "logprobs": []})
        };
        delta["output_index"] = json!(index);
        delta["content_index"] = json!(0);
        delta["delta"] = json!(text);
        self.event(out, delta);
    }

    /// A token's deltas: its reasoning and its text as the live reading
    /// gives them out (no text while the answer is held back for parsing).
    pub(super) fn delta(&mut self, ev: &TokenEvent, out: &mut String) {
        let s = self.read(&ev.text);
        self.reasoning_delta(out, &s.reasoning);
        self.text_delta(out, &s.content);
    }

    /// The parsed items or the text not yet sent, then the response whole.
    pub(super) fn end(&mut self, a: &Answer, text: &str, out: &mut String) {
        let completion = &a.completion;
        let s = self.live.finish(unsent(&completion.text, text));
        self.reasoning_delta(out, &s.reasoning);
        self.text_delta(out, &s.content);
        if self.reading.holds() {
            let streamed_reasoning = self.live.streamed_reasoning();
            let items = self.items(completion, &a.raw);
            for item in items.iter().filter(|i| !(streamed_reasoning && matches!(i, Item::Reasoning(_)))) {
                match item {
                    Item::Reasoning(t) => self.reasoning_delta(out, t),
                    Item::Message(t) => self.text_delta(out, t),
                    Item::Call { arguments, .. } => {
                        self.close_open(out);
                        let index = self.add(out, item);
                        let id = self.item_id("fc", index);
                        self.event(
                            out,
                            json!({"type": "response.function_call_arguments.delta", "item_id": id, "output_index": index, "delta": arguments}),
                        );
                        self.close(out, item, index);
                    }
                }
            }
        }
        self.close_open(out);
        let incomplete = cut_short(completion);
        let usage = self.usage(a.prompt, completion.tokens.len());
        let output = std::mem::take(&mut self.streamed.done);
        let (kind, status) =
            if incomplete { ("response.incomplete", "incomplete") } else { ("response.completed", "completed") };
        let r = self.response(status, output, Some(usage), incomplete);
        self.event(out, json!({"type": kind, "response": r}));
    }

    /// A failure once streaming: `response.failed` with the error.
    pub(super) fn failed(&mut self, e: &ApiError, out: &mut String) {
        let output = std::mem::take(&mut self.streamed.done);
        let mut r = self.response("failed", output, None, false);
        r["error"] = json!({"code": e.code.unwrap_or("server_error"), "message": e.message});
        self.event(out, json!({"type": "response.failed", "response": r}));
    }
}
