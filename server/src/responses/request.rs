//! A Responses request read as the chat request it amounts to: its
//! `instructions` and `input` items become chat messages, its function
//! tools chat tools, its knobs the chat fields of the same meaning. The
//! chat parser (openai/request.rs) then checks and renders it as it does
//! every chat request, so the two APIs cannot drift apart; what only the
//! Responses API has is checked here, each error naming its field.
//!
//! The server keeps nothing between requests: `previous_response_id` and
//! `item_reference` items, which name a stored response, are refused (send
//! the items themselves, as Codex does with `store: false`).

use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::neutral::fields::{bad, field, object, Obj};
use crate::openai::request::{self, Request};

/// Tool types OpenAI's servers run themselves (web search, file search, a
/// computer, code, images, MCP servers): no model here can be given them,
/// so they are left out of the prompt rather than refused, and a client
/// that declares them (Codex declares `web_search`) still works.
const HOSTED_TOOLS: &[&str] = &[
    "web_search",
    "web_search_preview",
    "file_search",
    "computer_use_preview",
    "code_interpreter",
    "image_generation",
    "mcp",
    "local_shell",
];

/// The parsed request and what the answer repeats of it.
pub(crate) struct Parsed {
    pub request: Request,
    /// `instructions`, `tool_choice`, `parallel_tool_calls`,
    /// `max_output_tokens`, `temperature`, `top_p`, `reasoning`,
    /// `metadata` and `text` as the request gave them (defaults where it did
    /// not), for the response object, which repeats them.
    pub echo: Map<String, Value>,
}

fn refused(param: &str, why: &str) -> ApiError {
    ApiError::bad_request(format!("`{param}`: {why}"), Some(param))
}

/// The text of a message's content: a string, or its text parts joined;
/// images become chat `image_url` parts (inline `data:` URLs).
fn content(v: &Value, param: &str) -> Result<Value, ApiError> {
    let parts = match v {
        Value::String(s) => return Ok(Value::String(s.clone())),
        Value::Array(parts) => parts,
        _ => return Err(bad(param, "a string or a list of content parts")),
    };
    let mut out = Vec::with_capacity(parts.len());
    for (k, p) in parts.iter().enumerate() {
        let pp = format!("{param}[{k}]");
        match p.get("type").and_then(Value::as_str) {
            Some("input_text" | "output_text" | "text" | "summary_text" | "reasoning_text") => {
                let text = p.get("text").and_then(Value::as_str).ok_or_else(|| bad(&pp, "a part with `text`"))?;
                out.push(json!({"type": "text", "text": text}));
            }
            Some("refusal") => {
                let text = p.get("refusal").and_then(Value::as_str).ok_or_else(|| bad(&pp, "a part with `refusal`"))?;
                out.push(json!({"type": "text", "text": text}));
            }
            Some("input_image") => match p.get("image_url").and_then(Value::as_str) {
                Some(url) => out.push(json!({"type": "image_url", "image_url": {"url": url}})),
                None => return Err(refused(&pp, "images are taken as `image_url` data: URLs; files are not stored")),
            },
            Some(kind) => return Err(refused(&pp, &format!("content parts of type {kind:?} are not supported"))),
            None => return Err(bad(&pp, "a content part with a `type`")),
        }
    }
    Ok(Value::Array(out))
}

/// Content as plain text (system text, an assistant turn, tool output),
/// its parts joined; an image there is refused rather than dropped (only
/// user messages carry images to the template).
fn text_of(v: &Value, param: &str) -> Result<String, ApiError> {
    Ok(match content(v, param)? {
        Value::String(s) => s,
        Value::Array(parts) => {
            if parts.iter().any(|p| p["type"] == "image_url") {
                return Err(refused(param, "images are taken in user messages only"));
            }
            parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect()
        }
        _ => String::new(),
    })
}

/// The chat messages of `instructions` and `input`. System and developer
/// text goes first as one system message (the templates render a system
/// turn only there); reasoning items go to the next assistant turn as its
/// `reasoning_content`, rendered as the template renders earlier
/// reasoning; function calls join the assistant turn they follow.
fn messages(o: &Obj) -> Result<Vec<Value>, ApiError> {
    let mut system: Vec<String> = Vec::new();
    match field(o, "instructions") {
        None => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(s)) => system.push(s.clone()),
        Some(_) => return Err(bad("instructions", "a string")),
    }
    let items: Vec<Value> = match field(o, "input") {
        Some(Value::String(s)) => vec![json!({"role": "user", "content": s})],
        Some(Value::Array(items)) if !items.is_empty() => items.clone(),
        None => return Err(ApiError::bad_request("`input` is required", Some("input"))),
        Some(_) => return Err(bad("input", "a string or a non-empty list of items")),
    };
    let mut out: Vec<Value> = Vec::new();
    let mut reasoning: Option<String> = None;
    let mut call_ids: Vec<String> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let param = format!("input[{i}]");
        let item = item.as_object().ok_or_else(|| bad(&param, "an object"))?;
        let kind = item.get("type").and_then(Value::as_str).unwrap_or("message");
        match kind {
            "message" => {
                let role = item.get("role").and_then(Value::as_str).unwrap_or_default();
                let c = item.get("content").ok_or_else(|| bad(&format!("{param}.content"), "given"))?;
                let cp = format!("{param}.content");
                match role {
                    "system" | "developer" => system.push(text_of(c, &cp)?),
                    "user" => out.push(json!({"role": "user", "content": content(c, &cp)?})),
                    "assistant" => {
                        let mut m = json!({"role": "assistant", "content": text_of(c, &cp)?});
                        if let Some(r) = reasoning.take() {
                            m["reasoning_content"] = r.into();
                        }
                        out.push(m);
                    }
                    _ => {
                        return Err(bad(
                            &format!("{param}.role"),
                            "\"user\", \"assistant\", \"system\" or \"developer\"",
                        ))
                    }
                }
            }
            "reasoning" => {
                // The reasoning's own text where the client kept it, else
                // its summary; `encrypted_content` is another server's.
                let mut text = String::new();
                for key in ["content", "summary"] {
                    if let Some(parts @ Value::Array(_)) = item.get(key) {
                        text = text_of(parts, &format!("{param}.{key}"))?;
                        if !text.is_empty() {
                            break;
                        }
                    }
                }
                reasoning.get_or_insert_with(String::new).push_str(&text);
            }
            "function_call" => {
                let (Some(call_id), Some(name), Some(arguments)) = (
                    item.get("call_id").and_then(Value::as_str),
                    item.get("name").and_then(Value::as_str),
                    item.get("arguments").and_then(Value::as_str),
                ) else {
                    return Err(bad(&param, "a function_call with `call_id`, `name` and `arguments`"));
                };
                call_ids.push(call_id.to_string());
                let call =
                    json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}});
                // Calls made in one turn are one assistant message.
                let joins = out.last().is_some_and(|m| m["role"] == "assistant") && reasoning.is_none();
                if joins {
                    let last = out.last_mut().expect("checked above");
                    match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                        Some(calls) => calls.push(call),
                        None => last["tool_calls"] = json!([call]),
                    }
                } else {
                    let mut m = json!({"role": "assistant", "content": "", "tool_calls": [call]});
                    if let Some(r) = reasoning.take() {
                        m["reasoning_content"] = r.into();
                    }
                    out.push(m);
                }
            }
            "function_call_output" => {
                let call_id = item
                    .get("call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(&format!("{param}.call_id"), "a string"))?;
                if !call_ids.iter().any(|c| c == call_id) {
                    return Err(refused(
                        &format!("{param}.call_id"),
                        &format!("{call_id:?} answers no earlier function_call"),
                    ));
                }
                let output = match item.get("output") {
                    Some(v @ (Value::String(_) | Value::Array(_))) => text_of(v, &format!("{param}.output"))?,
                    _ => return Err(bad(&format!("{param}.output"), "a string or a list of content parts")),
                };
                out.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
            }
            "item_reference" => {
                return Err(refused(&param, "items are not stored here; send the item itself"));
            }
            other => return Err(refused(&format!("{param}.type"), &format!("{other:?} items are not supported"))),
        }
    }
    if !system.is_empty() {
        out.insert(0, json!({"role": "system", "content": system.join("\n\n")}));
    }
    Ok(out)
}

/// Function tools in the chat shape; a `namespace`'s tools as plain
/// functions; hosted tools left out.
fn tools(list: &[Value], into: &mut Vec<Value>, param: &str) -> Result<(), ApiError> {
    for (i, t) in list.iter().enumerate() {
        let tp = format!("{param}[{i}]");
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {
                let name = t
                    .get("name")
                    .and_then(Value::as_str)
                    .filter(|n| !n.is_empty())
                    .ok_or_else(|| bad(&format!("{tp}.name"), "a non-empty string"))?;
                let mut f = json!({"name": name});
                if let Some(d) = t.get("description").filter(|d| !d.is_null()) {
                    f["description"] = d.clone();
                }
                f["parameters"] =
                    t.get("parameters").filter(|p| p.is_object()).cloned().unwrap_or(json!({"type": "object"}));
                into.push(json!({"type": "function", "function": f}));
            }
            Some("namespace") => match t.get("tools") {
                Some(Value::Array(inner)) => tools(inner, into, &format!("{tp}.tools"))?,
                _ => return Err(bad(&format!("{tp}.tools"), "a list of tools")),
            },
            Some(kind) if HOSTED_TOOLS.contains(&kind) => {}
            Some(kind) => return Err(refused(&format!("{tp}.type"), &format!("{kind:?} tools are not supported"))),
            None => return Err(bad(&tp, "a tool with a `type`")),
        }
    }
    Ok(())
}

/// `tool_choice` in the chat shape: "auto", "none", "required", or
/// `{"type": "function", "name": ...}` as `{"type": "function",
/// "function": {"name": ...}}`; a hosted tool's choice is "auto".
fn tool_choice(v: &Value) -> Result<Value, ApiError> {
    match v {
        Value::String(s) if ["auto", "none", "required"].contains(&s.as_str()) => Ok(v.clone()),
        Value::Object(c) => match (c.get("type").and_then(Value::as_str), c.get("name").and_then(Value::as_str)) {
            (Some("function"), Some(name)) => Ok(json!({"type": "function", "function": {"name": name}})),
            (Some(kind), _) if HOSTED_TOOLS.contains(&kind) => Ok(json!("auto")),
            _ => Err(bad("tool_choice", "\"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}")),
        },
        _ => Err(bad("tool_choice", "\"auto\", \"none\", \"required\" or an object")),
    }
}

/// `text.format`: plain text, a JSON object, or a JSON schema (the chat
/// `response_format` of the same meaning).
fn text_format(v: &Value) -> Result<Option<Value>, ApiError> {
    const P: &str = "text.format";
    let Some(format) = v.get("format").filter(|f| !f.is_null()) else { return Ok(None) };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => match format.get("schema") {
            Some(schema) => Ok(Some(json!({"type": "json_schema", "json_schema": {
                "name": format.get("name").cloned().unwrap_or(json!("answer")), "schema": schema}}))),
            None => Err(refused(P, "type json_schema needs a `schema`")),
        },
        _ => Err(bad(P, "{\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}")),
    }
}

/// Parses a Responses request body; `context` bounds the answer's length.
pub(crate) fn parse(body: &[u8], context: usize) -> Result<Parsed, ApiError> {
    let o = object(body)?;
    if field(&o, "previous_response_id").is_some() {
        return Err(refused(
            "previous_response_id",
            "responses are not stored here; send the whole conversation in `input`",
        ));
    }
    let mut chat = Map::new();
    for key in ["model", "temperature", "top_p", "stream", "top_logprobs", "grammar"] {
        if let Some(v) = field(&o, key) {
            chat.insert(key.into(), v.clone());
        }
    }
    chat.insert("messages".into(), Value::Array(messages(&o)?));
    if let Some(v) = field(&o, "max_output_tokens") {
        chat.insert("max_tokens".into(), v.clone());
    }
    match field(&o, "tools") {
        None => {}
        Some(Value::Array(list)) => {
            let mut out = Vec::new();
            tools(list, &mut out, "tools")?;
            if !out.is_empty() {
                chat.insert("tools".into(), Value::Array(out));
            }
        }
        Some(_) => return Err(bad("tools", "a list of tools")),
    }
    if let Some(choice) = field(&o, "tool_choice") {
        if chat.contains_key("tools") {
            chat.insert("tool_choice".into(), tool_choice(choice)?);
        } else {
            tool_choice(choice)?;
        }
    }
    if let Some(reasoning) = field(&o, "reasoning") {
        match reasoning.get("effort").filter(|e| !e.is_null()) {
            None => {}
            Some(Value::String(e)) => {
                chat.insert("reasoning_effort".into(), e.clone().into());
            }
            Some(_) => return Err(bad("reasoning.effort", "a string")),
        }
    }
    if let Some(text) = field(&o, "text") {
        if let Some(format) = text_format(text)? {
            chat.insert("response_format".into(), format);
        }
    }
    let chat_body = Value::Object(chat).to_string();
    let request = request::parse(chat_body.as_bytes(), true, context).map_err(rename_chat_fields)?;
    let mut echo = Map::new();
    echo.insert("instructions".into(), field(&o, "instructions").cloned().unwrap_or(Value::Null));
    echo.insert("tool_choice".into(), field(&o, "tool_choice").cloned().unwrap_or(json!("auto")));
    echo.insert("parallel_tool_calls".into(), field(&o, "parallel_tool_calls").cloned().unwrap_or(json!(true)));
    echo.insert("max_output_tokens".into(), field(&o, "max_output_tokens").cloned().unwrap_or(Value::Null));
    echo.insert("temperature".into(), json!(request.params.temperature));
    echo.insert("top_p".into(), json!(request.params.top_p));
    echo.insert(
        "reasoning".into(),
        field(&o, "reasoning").cloned().unwrap_or(json!({"effort": null, "summary": null})),
    );
    echo.insert("text".into(), field(&o, "text").cloned().unwrap_or(json!({"format": {"type": "text"}})));
    echo.insert("metadata".into(), field(&o, "metadata").cloned().unwrap_or(json!({})));
    echo.insert("tools".into(), field(&o, "tools").cloned().unwrap_or(json!([])));
    echo.insert("store".into(), json!(false));
    echo.insert("truncation".into(), json!("disabled"));
    Ok(Parsed { request, echo })
}

/// A chat parser's error about a field this request spelled differently.
fn rename_chat_fields(mut e: ApiError) -> ApiError {
    let renamed = match e.param.as_deref() {
        Some("max_tokens") => Some("max_output_tokens"),
        Some("reasoning_effort") => Some("reasoning.effort"),
        Some("response_format") => Some("text.format"),
        Some(p) if p.starts_with("messages") => Some("input"),
        _ => None,
    };
    if let Some(to) = renamed {
        if let Some(from) = e.param.take() {
            e.message = e.message.replace(&from, to);
        }
        e.param = Some(to.to_string());
    }
    e
}
