//! Request bodies of /v1/messages and /v1/messages/count_tokens, checked
//! field by field (a 400 naming the field, in Anthropic's ranges), turned
//! into the same chat-template input the OpenAI routes give the engine:
//! `system` first, text blocks joined, `tool_use` blocks as an assistant
//! message's OpenAI-style `tool_calls`, `tool_result` blocks as `tool`
//! messages, tools as `{"type": "function", "function": {...}}` with the
//! client's key order kept (server/API_NOTES.md A.2).

use serde_json::value::RawValue;
use serde_json::Value;
use waste_host::{ChatMessage, GenerateParams};

use crate::error::ApiError;
use crate::neutral::fields::{self, bad, boolean, field, integer_in, number, object, raw_items, string, strings, Obj};
use crate::neutral::images::Images;
use crate::neutral::{fresh_seed, with_thinking, Prompt};
use crate::ordered::Ordered;
use crate::structured::{self, schema, with_grammar, Asked};

/// The temperature Anthropic's Messages API reference gives a request that
/// leaves it out (top_p and top_k default to off).
const ANTHROPIC_DEFAULT_TEMPERATURE: f64 = 1.0;

pub struct Request {
    pub model: Option<String>,
    pub prompt: Prompt,
    pub params: GenerateParams,
    pub stream: bool,
    /// Tools were declared and `tool_choice` is not `none`: the answer is
    /// searched for calls.
    pub tools_enabled: bool,
}

/// The text of a `system` or of a message's content: a string, or text
/// blocks joined with no separator.
fn text_blocks(v: &Value, param: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut text = String::new();
            for b in blocks {
                match (b.get("type").and_then(Value::as_str), b.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    _ => return Err(bad(param, "a string or a list of {\"type\": \"text\", \"text\": ...} blocks")),
                }
            }
            Ok(text)
        }
        _ => Err(bad(param, "a string or a list of text blocks")),
    }
}

/// JSON text without the whitespace between tokens, in the order written.
fn compact(json: &str) -> String {
    let (mut out, mut in_string, mut escaped) = (String::with_capacity(json.len()), false, false);
    for c in json.chars() {
        if in_string {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
        } else if !c.is_whitespace() {
            in_string = c == '"';
            out.push(c);
        }
    }
    out
}

/// The messages as the chat template's input. `raw` is the same list as
/// the client wrote it, for `tool_use` inputs in their own key order.
fn messages(
    list: &[Value],
    raw: &[Box<RawValue>],
    system: Option<String>,
    images: &mut Images,
) -> Result<Vec<ChatMessage>, ApiError> {
    let mut out = Vec::with_capacity(list.len() + 1);
    if let Some(text) = system {
        out.push(ChatMessage { role: "system".into(), content: Some(text), extra: None, media: Vec::new() });
    }
    let mut tool_ids: Vec<String> = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let param = format!("messages[{i}]");
        let m = m.as_object().ok_or_else(|| bad(&param, "an object"))?;
        let role = match m.get("role").and_then(Value::as_str) {
            Some(r @ ("user" | "assistant" | "system")) => r.to_string(),
            _ => return Err(bad(&format!("{param}.role"), "\"user\" or \"assistant\"")),
        };
        let content_param = format!("{param}.content");
        let blocks = match m.get("content") {
            Some(Value::String(s)) => {
                out.push(ChatMessage { role, content: Some(s.clone()), extra: None, media: Vec::new() });
                continue;
            }
            Some(Value::Array(blocks)) => blocks,
            _ => return Err(bad(&content_param, "a string or a list of content blocks")),
        };
        let raw_blocks: Vec<Box<RawValue>> = raw
            .get(i)
            .and_then(|r| serde_json::from_str::<Ordered>(r.get()).ok())
            .and_then(|Ordered(pairs)| pairs.into_iter().find(|(k, _)| k == "content"))
            .and_then(|(_, v)| serde_json::from_str(v.get()).ok())
            .unwrap_or_default();
        let (mut text, mut calls, mut results, mut media) = (String::new(), Vec::new(), Vec::new(), Vec::new());
        // An earlier turn's reasoning, which clients with extended thinking
        // send back on every turn.
        let mut reasoning: Option<String> = None;
        for (j, b) in blocks.iter().enumerate() {
            let bp = format!("{content_param}[{j}]");
            match b.get("type").and_then(Value::as_str) {
                Some("text") => text.push_str(
                    b.get("text").and_then(Value::as_str).ok_or_else(|| bad(&bp, "a text block with `text`"))?,
                ),
                Some("tool_use") if role == "assistant" => {
                    let (Some(id), Some(name)) =
                        (b.get("id").and_then(Value::as_str), b.get("name").and_then(Value::as_str))
                    else {
                        return Err(bad(&bp, "a tool_use block with `id`, `name` and `input`"));
                    };
                    if !b.get("input").is_some_and(Value::is_object) {
                        return Err(bad(&format!("{bp}.input"), "an object"));
                    }
                    let input = raw_blocks
                        .get(j)
                        .and_then(|r| serde_json::from_str::<Ordered>(r.get()).ok())
                        .and_then(|Ordered(pairs)| pairs.into_iter().find(|(k, _)| k == "input"))
                        .map(|(_, v)| compact(v.get()))
                        .unwrap_or_else(|| b["input"].to_string());
                    tool_ids.push(id.to_string());
                    calls.push(format!(
                        "{{\"id\":{},\"type\":\"function\",\"function\":{{\"name\":{},\"arguments\":{input}}}}}",
                        Value::from(id),
                        Value::from(name)
                    ));
                }
                Some("thinking") if role == "assistant" => {
                    // The signature is not checked: it is ours
                    // (`anthropic::signature`) or another server's, and
                    // either way the text is only rendered back.
                    let t = b
                        .get("thinking")
                        .and_then(Value::as_str)
                        .ok_or_else(|| bad(&bp, "a thinking block with `thinking`"))?;
                    reasoning.get_or_insert_with(String::new).push_str(t);
                }
                // Reasoning another server encrypted: nothing to render.
                Some("redacted_thinking") if role == "assistant" => {}
                Some("tool_result") if role == "user" => {
                    let id = b
                        .get("tool_use_id")
                        .and_then(Value::as_str)
                        .ok_or_else(|| bad(&bp, "a tool_result block with `tool_use_id`"))?;
                    if !tool_ids.iter().any(|t| t == id) {
                        return Err(ApiError::bad_request(
                            format!("`{bp}.tool_use_id`: {id:?} answers no earlier tool_use block"),
                            Some(&format!("{bp}.tool_use_id")),
                        ));
                    }
                    let content = match b.get("content") {
                        None | Some(Value::Null) => String::new(),
                        Some(c) => text_blocks(c, &format!("{bp}.content"))?,
                    };
                    results.push(ChatMessage {
                        role: "tool".into(),
                        content: Some(content),
                        extra: Some(format!("{{\"tool_call_id\":{}}}", Value::from(id))),
                        media: Vec::new(),
                    });
                }
                Some("image") if role == "user" => {
                    let source = b.get("source");
                    match source.and_then(|s| s.get("type")).and_then(Value::as_str) {
                        Some("base64") => {
                            let data = source
                                .and_then(|s| s.get("data"))
                                .and_then(Value::as_str)
                                .ok_or_else(|| bad(&format!("{bp}.source.data"), "base64 image data"))?;
                            media.push(images.add_base64(data, &format!("{bp}.source.data"))?);
                        }
                        Some(other) => {
                            return Err(ApiError::bad_request(
                                format!(
                                    "`{bp}.source`: {other:?} image sources are not fetched; send the image as base64"
                                ),
                                Some(&format!("{bp}.source")),
                            ))
                        }
                        None => {
                            return Err(bad(&format!("{bp}.source"), "an image source {\"type\": \"base64\", ...}"))
                        }
                    }
                }
                Some(kind @ ("image" | "document" | "search_result" | "container_upload")) => {
                    return Err(ApiError::bad_request(
                        format!("`{bp}`: {kind} blocks are not supported by a text model"),
                        Some(&bp),
                    ))
                }
                Some(kind) => {
                    return Err(ApiError::bad_request(
                        format!("`{bp}`: a {kind:?} block is not supported in a {role} message"),
                        Some(&bp),
                    ))
                }
                None => return Err(bad(&bp, "a content block with a `type`")),
            }
        }
        // Tool results answer the calls before them and come first, as
        // OpenAI's `tool` messages do; any text the user added follows.
        let had_results = !results.is_empty();
        out.extend(results);
        // Reasoning goes where the templates read it (`reasoning_content`,
        // as OpenAI-style clients send it), and each template renders it
        // as it renders earlier reasoning (most drop it from past turns).
        let mut extra: Vec<String> = Vec::new();
        if let Some(r) = &reasoning {
            extra.push(format!("\"reasoning_content\":{}", Value::from(r.as_str())));
        }
        if !calls.is_empty() {
            extra.push(format!("\"tool_calls\":[{}]", calls.join(",")));
        }
        let extra = (!extra.is_empty()).then(|| format!("{{{}}}", extra.join(",")));
        if !calls.is_empty() || reasoning.is_some() {
            // An empty string, not null: Qwen3's template fails on a null.
            out.push(ChatMessage { role, content: Some(text), extra, media: Vec::new() });
        } else if !had_results || !text.is_empty() || !media.is_empty() {
            out.push(ChatMessage { role, content: Some(text), extra: None, media });
        }
    }
    Ok(out)
}

/// `tools` in OpenAI's shape (what the templates render), each tool's
/// `input_schema` as the client wrote it; and the declared names.
fn tools(o: &Obj, body: &[u8]) -> Result<Option<(String, Vec<String>)>, ApiError> {
    let list = match field(o, "tools") {
        None => return Ok(None),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(bad("tools", "a list of tools")),
    };
    if list.is_empty() {
        return Ok(None);
    }
    let raw = raw_items(body, "tools");
    let (mut out, mut names) = (Vec::new(), Vec::new());
    for (i, t) in list.iter().enumerate() {
        let param = format!("tools[{i}]");
        let name = t
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| bad(&format!("{param}.name"), "a non-empty string"))?;
        if !t.get("input_schema").is_some_and(Value::is_object) {
            return Err(bad(&format!("{param}.input_schema"), "a JSON schema object"));
        }
        let fields =
            raw.get(i).and_then(|r| serde_json::from_str::<Ordered>(r.get()).ok()).map(|o| o.0).unwrap_or_default();
        let raw_of = |key: &str| fields.iter().find(|(k, _)| k == key).map(|(_, v)| v.get().to_string());
        let schema = raw_of("input_schema").unwrap_or_else(|| t["input_schema"].to_string());
        let description = match t.get("description") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(_)) => format!(",\"description\":{}", raw_of("description").unwrap_or_default()),
            Some(_) => return Err(bad(&format!("{param}.description"), "a string")),
        };
        out.push(format!(
            "{{\"type\":\"function\",\"function\":{{\"name\":{}{description},\"parameters\":{schema}}}}}",
            Value::from(name)
        ));
        names.push(name.to_string());
    }
    Ok(Some((format!("[{}]", out.join(",")), names)))
}

/// `thinking`: `{"type": "enabled", "budget_tokens": N}` (or `adaptive`)
/// turns reasoning on, `{"type": "disabled"}` off; absent, the template's
/// own default. The budget is not enforced: `max_tokens` bounds the answer.
fn thinking(o: &Obj) -> Result<Option<bool>, ApiError> {
    let Some(t) = field(o, "thinking") else { return Ok(None) };
    match t.get("type").and_then(Value::as_str) {
        Some("enabled" | "adaptive") => Ok(Some(true)),
        Some("disabled") => Ok(Some(false)),
        _ => Err(bad("thinking", "{\"type\": \"enabled\" | \"adaptive\" | \"disabled\"}")),
    }
}

/// Whether the declared tools stay in the prompt: `tool_choice` none drops
/// them; any `tool_choice` needs tools; a named tool must be declared.
fn tool_choice(o: &Obj, names: Option<&[String]>) -> Result<bool, ApiError> {
    let Some(choice) = field(o, "tool_choice") else { return Ok(names.is_some()) };
    let kind = choice.get("type").and_then(Value::as_str);
    let Some(names) = names else {
        return Err(ApiError::bad_request("`tool_choice` needs `tools`", Some("tool_choice")));
    };
    match kind {
        Some("auto" | "any") => Ok(true),
        Some("none") => Ok(false),
        Some("tool") => match choice.get("name").and_then(Value::as_str) {
            Some(n) if names.iter().any(|d| d == n) => Ok(true),
            Some(n) => Err(ApiError::bad_request(
                format!("`tool_choice.name`: no tool {n:?} is declared"),
                Some("tool_choice.name"),
            )),
            None => Err(bad("tool_choice.name", "the name of a declared tool")),
        },
        _ => Err(bad("tool_choice.type", "\"auto\", \"any\", \"tool\" or \"none\"")),
    }
}

/// `output_config.format` (or the beta's `output_format`)
/// `{"type": "json_schema", "schema": {...}}`.
fn output_format(o: &Obj) -> Result<Asked, ApiError> {
    let (param, format): (&'static str, _) = match field(o, "output_config").and_then(|c| c.get("format")) {
        Some(f) => ("output_config.format", Some(f)),
        None => ("output_format", field(o, "output_format")),
    };
    let format = match format {
        None | Some(Value::Null) => None,
        Some(Value::Object(f)) if f.get("type").and_then(Value::as_str) == Some("json_schema") => {
            let s = f.get("schema").ok_or_else(|| bad(param, "{\"type\": \"json_schema\", \"schema\": {...}}"))?;
            Some(schema(s, param, param)?)
        }
        Some(_) => return Err(bad(param, "{\"type\": \"json_schema\", \"schema\": {...}}")),
    };
    with_grammar(o, format.map(|c| (c, param)), "an output format and `grammar`")
}

/// A count (`max_tokens`, `top_k`) of at least `lo`, in Anthropic's words.
fn at_least(v: &Value, key: &str, lo: u64) -> Result<u64, ApiError> {
    integer_in(v, lo, u32::MAX as u64).map_err(|_| bad(key, &format!("an integer of at least {lo}")))
}

/// Parses a Messages request; `count_only` for count_tokens, which has no
/// `max_tokens` and generates nothing.
pub fn parse(body: &[u8], count_only: bool, context: usize) -> Result<Request, ApiError> {
    let o = &object(body)?;
    let model = string(o, "model")?;
    let max_tokens = match (field(o, "max_tokens"), count_only) {
        (None, false) => return Err(ApiError::bad_request("`max_tokens` is required", Some("max_tokens"))),
        (None, true) => 1,
        (Some(v), _) => at_least(v, "max_tokens", 1)?,
    };
    let list = fields::messages(o)?;
    let system = field(o, "system").map(|s| text_blocks(s, "system")).transpose()?;
    let raw = raw_items(body, "messages");
    let mut images = Images::default();
    let messages = messages(list, &raw, system, &mut images)?;
    let tools = tools(o, body)?;
    let tools_enabled = tool_choice(o, tools.as_ref().map(|(_, n)| n.as_slice()))?;
    let temperature = number(o, "temperature", 0.0, 1.0)?.unwrap_or(ANTHROPIC_DEFAULT_TEMPERATURE);
    let top_p = number(o, "top_p", 0.0, 1.0)?.unwrap_or(1.0);
    let top_k = field(o, "top_k").map(|v| at_least(v, "top_k", 0)).transpose()?;
    let stop_strings = match field(o, "stop_sequences") {
        None => Vec::new(),
        Some(v) => strings(v, false)
            .filter(|list| list.iter().all(|s| !s.is_empty()))
            .ok_or_else(|| bad("stop_sequences", "a list of non-empty strings"))?,
    };
    let stream = boolean(o, "stream")?;
    // `any` / `tool`: the answer is a call, its input valid against the
    // tool's schema (where the template's call syntax can be read).
    let forced = match field(o, "tool_choice").and_then(|c| c.get("type")).and_then(Value::as_str) {
        Some("any") => Some(None),
        Some("tool") => Some(field(o, "tool_choice").and_then(|c| c.get("name")).and_then(Value::as_str)),
        _ => None,
    };
    let format = structured::constraint(output_format(o)?);
    // The forced call's syntax is read off the template rendered as the
    // prompt is: with thinking off, the call comes first.
    let template_vars = thinking(o)?.and_then(|on| with_thinking(None, on, None));
    let constraint = match (format, forced, &tools) {
        (Some(c), _, _) => Some(c),
        (None, Some(name), Some((tools, _))) if tools_enabled => {
            structured::forced_tool(tools, name, template_vars.as_deref())
        }
        _ => None,
    };
    let params = GenerateParams {
        temperature: temperature as f32,
        top_p: top_p.max(f64::MIN_POSITIVE) as f32,
        top_k: top_k.unwrap_or(0) as u32,
        max_tokens: max_tokens.min(context as u64) as u32,
        stop_strings,
        seed: fresh_seed(),
        constraint,
        ..GenerateParams::default()
    };
    let tools = if tools_enabled { tools.map(|(t, _)| t) } else { None };
    Ok(Request {
        model,
        prompt: Prompt::Chat { messages, tools, template_vars, images },
        params,
        stream,
        tools_enabled,
    })
}

#[cfg(test)]
mod tests {
    use waste_host::Constraint;

    use super::*;
    use crate::neutral::fields::obj;

    #[test]
    fn output_config_format_becomes_one_constraint() {
        let schema = r#"{"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"string"}}}"#;
        let oc = format!(r#"{{"output_config": {{"format": {{"type": "json_schema", "schema": {schema}}}}}}}"#);
        assert_eq!(
            output_format(&obj(&oc)).unwrap(),
            Some((Constraint::JsonSchema(schema.into()), "output_config.format"))
        );
        assert!(output_format(&obj(r#"{"output_config": {"format": {"type": "text"}}}"#)).is_err());
    }

    #[test]
    fn compact_drops_whitespace_outside_strings_only() {
        assert_eq!(compact("{ \"a b\" : [1, 2],\n \"c\\\" d\": \"x y\" }"), "{\"a b\":[1,2],\"c\\\" d\":\"x y\"}");
    }

    /// The conversion the tool-call prompt counts depend on: a tool_use
    /// turn becomes an assistant message with content "" and tool_calls, a
    /// tool_result a tool message, the tools OpenAI's function shape.
    #[test]
    fn tool_turns_become_the_openai_shapes_the_templates_render() {
        let body = br#"{"max_tokens": 4, "system": [{"type": "text", "text": "S"}],
            "tools": [{"name": "get_weather", "description": "d", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "messages": [{"role": "user", "content": "weather?"},
                         {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}]}"#;
        let r = parse(body, false, 256).unwrap();
        let Prompt::Chat { messages, tools, .. } = r.prompt else { panic!("a chat") };
        let roles: Vec<&str> = messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        assert_eq!(messages[2].content.as_deref(), Some(""));
        assert_eq!(
            messages[2].extra.as_deref(),
            Some(
                r#"{"tool_calls":[{"id":"toolu_1","type":"function","function":{"name":"get_weather","arguments":{"city":"Paris"}}}]}"#
            )
        );
        assert_eq!(messages[3].extra.as_deref(), Some(r#"{"tool_call_id":"toolu_1"}"#));
        assert_eq!(
            tools.as_deref(),
            Some(
                r#"[{"type":"function","function":{"name":"get_weather","description":"d","parameters":{"type": "object", "properties": {"city": {"type": "string"}}}}}]"#
            )
        );
        assert!(r.tools_enabled);
    }

    /// Claude Code sends an earlier turn's `thinking` block (with its
    /// signature) back on every turn with thinking on, and that was a 400
    /// (`a "thinking" block is not supported in a assistant message`).
    /// The reasoning reaches the template as `reasoning_content`, beside
    /// the turn's tool calls; a `redacted_thinking` block is accepted and
    /// renders nothing; thinking in a user message is still refused.
    #[test]
    fn thinking_block_in_history_was_a_400() {
        let body = br#"{"max_tokens": 4,
            "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": "q"},
                         {"role": "assistant", "content": [
                            {"type": "thinking", "thinking": "Let me \"see\".", "signature": "waste-0123"},
                            {"type": "redacted_thinking", "data": "opaque"},
                            {"type": "text", "text": "Calling."},
                            {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "r"}]},
                         {"role": "assistant", "content": [{"type": "thinking", "thinking": "Done.", "signature": ""}]}]}"#;
        let Prompt::Chat { messages, .. } = parse(body, false, 256).unwrap().prompt else { panic!("a chat") };
        let roles: Vec<&str> = messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["user", "assistant", "tool", "assistant"]);
        assert_eq!(messages[1].content.as_deref(), Some("Calling."));
        assert_eq!(
            messages[1].extra.as_deref(),
            Some(
                r#"{"reasoning_content":"Let me \"see\".","tool_calls":[{"id":"toolu_1","type":"function","function":{"name":"f","arguments":{}}}]}"#
            )
        );
        assert_eq!(messages[3].content.as_deref(), Some(""));
        assert_eq!(messages[3].extra.as_deref(), Some(r#"{"reasoning_content":"Done."}"#));
        let in_user =
            br#"{"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}]}"#;
        assert!(parse(in_user, false, 256).is_err());
    }

    /// A forced call (`tool_choice` any) with thinking disabled was
    /// constrained in the syntax of the template rendered with thinking
    /// on, so a reasoning template's grammar waited for reasoning the
    /// prompt had closed, and the answer never became a call.
    #[test]
    fn forced_tool_call_ignored_the_thinking_setting() {
        let body = br#"{"max_tokens": 4, "thinking": {"type": "disabled"}, "tool_choice": {"type": "any"},
            "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": "q"}]}"#;
        let r = parse(body, false, 256).unwrap();
        let Prompt::Chat { template_vars, .. } = &r.prompt else { panic!("a chat") };
        let Some(Constraint::ToolCall { vars, .. }) = &r.params.constraint else { panic!("{:?}", r.params.constraint) };
        assert_eq!(vars, template_vars);
        assert!(vars.as_deref().is_some_and(|v| v.contains(r#""enable_thinking":false"#)), "{vars:?}");
    }
}
