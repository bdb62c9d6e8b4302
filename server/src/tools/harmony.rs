//! gpt-oss's harmony format: the answer is a run of messages, each
//! `[<|start|>ROLE] [to=RECIPIENT] <|channel|>CHANNEL [to=RECIPIENT]
//! [<|constrain|>FORMAT] <|message|>BODY` ended by `<|end|>`, `<|call|>` or
//! `<|return|>` (the first one's `<|start|>assistant` is the prompt's
//! last, so it starts at `<|channel|>`). Channel `analysis` is the
//! reasoning (`reasoning_content`), a `commentary` message to
//! `functions.NAME` a call with JSON arguments, `final` (and a commentary
//! preamble to no one) the content.

use super::{compact_json, Call, Parsed};

const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const START: &str = "<|start|>";
const ENDS: [&str; 3] = ["<|end|>", "<|call|>", "<|return|>"];

/// None unless `raw` is harmony (it holds a `<|channel|>`).
pub(super) fn parse(raw: &str) -> Option<Parsed> {
    if !raw.contains(CHANNEL) {
        return None;
    }
    let mut parsed = Parsed::default();
    let (mut reasoning, mut content) = (Vec::new(), Vec::new());
    let mut rest = raw;
    while let Some(at) = rest.find(MESSAGE) {
        let header = &rest[..at];
        let body_and_rest = &rest[at + MESSAGE.len()..];
        let (body, after) = match ENDS.iter().filter_map(|e| body_and_rest.find(e).map(|i| (i, e.len()))).min() {
            Some((i, n)) => (&body_and_rest[..i], &body_and_rest[i + n..]),
            // Cut short by the token limit: the body runs to the end.
            None => (body_and_rest, ""),
        };
        let header = header.rsplit(START).next().unwrap_or(header);
        let channel =
            header.split(CHANNEL).nth(1).and_then(|c| c.split([' ', '<']).next()).unwrap_or("").trim().to_string();
        let recipient = header
            .split_whitespace()
            .chain(header.split(CHANNEL).flat_map(str::split_whitespace))
            .find_map(|w| w.strip_prefix("to="))
            .map(|r| r.trim_end_matches(|c: char| c == '<' || c.is_whitespace()).to_string());
        match (channel.as_str(), recipient) {
            (_, Some(r)) if r.starts_with("functions.") => parsed.calls.push(Call {
                name: r["functions.".len()..].split('<').next().unwrap_or_default().to_string(),
                arguments: compact_json(body),
            }),
            ("analysis", _) => reasoning.push(body.to_string()),
            _ => content.push(body.to_string()),
        }
        rest = after;
    }
    let join = |parts: Vec<String>| (!parts.is_empty()).then(|| parts.join("\n\n")).filter(|s| !s.trim().is_empty());
    parsed.reasoning = join(reasoning);
    parsed.content = join(content);
    Some(parsed)
}
