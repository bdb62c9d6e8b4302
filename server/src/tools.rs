//! Tool calls in a model's output, in the Hermes syntax Qwen3's chat
//! template asks for and renders:
//! `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`. Of the other
//! templates in tests/fixtures/chat_templates, DeepSeek-V3's renders calls
//! in its own `<｜tool▁call▁begin｜>` syntax (not parsed here: its template
//! declares no tools to the model, and transformers cannot render its tool
//! turns, which need a null content), Kimi-K2's declares tools but renders
//! no calls, and Mixtral's and OLMoE's (Tulu) know no tools.

use serde_json::{json, Value};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// The text before the first call (None when blank) and the calls in
/// OpenAI's shape; None when the output holds no well-formed call, so the
/// answer stays plain text.
pub fn parse(text: &str, id: &str) -> Option<(Option<String>, Value)> {
    let first = text.find(OPEN)?;
    let mut calls = Vec::new();
    let mut rest = &text[first..];
    while let Some(start) = rest.find(OPEN) {
        let body = &rest[start + OPEN.len()..];
        // A call the generation cut short has no closing tag; its JSON is
        // still whole when the model ended right after it.
        let (inner, after) = match body.find(CLOSE) {
            Some(end) => (&body[..end], &body[end + CLOSE.len()..]),
            None => (body, ""),
        };
        let v: Value = serde_json::from_str(inner.trim()).ok()?;
        let name = v.get("name")?.as_str()?.to_string();
        let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
            None => "{}".to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(a) => a.to_string(),
        };
        calls.push(json!({
            "id": format!("call_{}_{}", id, calls.len()),
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }));
        rest = after;
    }
    let before = text[..first].trim();
    Some(((!before.is_empty()).then(|| before.to_string()), Value::Array(calls)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hermes_tool_call_is_parsed_with_leading_text() {
        let out =
            "Let me check.\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let (content, calls) = parse(out, "x").unwrap();
        assert_eq!(content.as_deref(), Some("Let me check."));
        assert_eq!(calls[0]["function"]["name"], "weather");
        assert_eq!(calls[0]["function"]["arguments"], "{\"city\":\"Paris\"}");
    }

    #[test]
    fn malformed_tool_call_stays_text() {
        assert!(parse("<tool_call>{not json</tool_call>", "x").is_none());
        assert!(parse("no calls here", "x").is_none());
    }

    #[test]
    fn two_calls_are_both_returned() {
        let out = "<tool_call>{\"name\":\"a\"}</tool_call><tool_call>{\"name\":\"b\",\"arguments\":\"{}\"}</tool_call>";
        let (content, calls) = parse(out, "x").unwrap();
        assert!(content.is_none());
        assert_eq!(calls.as_array().unwrap().len(), 2);
        assert_eq!(calls[1]["function"]["name"], "b");
    }
}
