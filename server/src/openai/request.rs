//! Request bodies of /v1/chat/completions and /v1/completions, checked
//! field by field so a wrong type is a 400 naming the field. Fields the
//! server does not know are ignored, as OpenAI-compatible servers do.

use serde_json::Value;
use waste_host::{ChatMessage, Constraint, GenerateParams};

use crate::error::ApiError;
use crate::neutral::fields::{
    bad, boolean, field, integer, number, object, raw_field, raw_items, string, strings, Obj,
};
use crate::neutral::images::Images;
use crate::neutral::{fresh_seed, with_thinking, Prompt};
use crate::structured::{self, schema, with_grammar, Asked};

/// The temperature OpenAI's API reference gives a request that leaves it
/// out (every other sampling field defaults to off).
const OPENAI_DEFAULT_TEMPERATURE: f64 = 1.0;

/// The most answers (`n`) one request may ask for: each is a whole
/// generation on the one engine thread, so a bound keeps one request from
/// holding the queue for long.
pub const MAX_CHOICES: u32 = 8;

pub struct Request {
    pub model: Option<String>,
    pub prompt: Prompt,
    pub params: GenerateParams,
    pub stream: bool,
    pub include_usage: bool,
    /// Log-probabilities requested (per token, with `params.top_logprobs`
    /// alternatives).
    pub logprobs: bool,
    /// A `tools` list was given and `tool_choice` is not "none": the output
    /// is searched for tool calls.
    pub tools_enabled: bool,
    /// The field that asked for structured output (`params.constraint`).
    pub constraint_field: Option<&'static str>,
    /// `n`: answers to generate from the prompt.
    pub choices: u32,
}

fn stop_strings(o: &Obj) -> Result<Vec<String>, ApiError> {
    let Some(v) = field(o, "stop") else { return Ok(Vec::new()) };
    let list = strings(v, true).ok_or_else(|| bad("stop", "a string or a list of strings"))?;
    if list.iter().any(String::is_empty) {
        return Err(bad("stop", "non-empty strings"));
    }
    Ok(list)
}

/// Message content: a string, or a list of text parts and `image_url`
/// parts (inline `data:` URLs); the images' markup is returned apart, for
/// the message's `media` (before the text, whatever the parts' order).
fn content(v: Option<&Value>, i: usize, images: &mut Images) -> Result<(Option<String>, Vec<String>), ApiError> {
    let param = format!("messages[{i}].content");
    match v {
        None | Some(Value::Null) => Ok((None, Vec::new())),
        Some(Value::String(s)) => Ok((Some(s.clone()), Vec::new())),
        Some(Value::Array(parts)) => {
            let (mut text, mut media) = (String::new(), Vec::new());
            for (k, part) in parts.iter().enumerate() {
                match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    (Some("image_url"), _) => {
                        let at = format!("{param}[{k}].image_url.url");
                        let url = part
                            .get("image_url")
                            .and_then(|u| u.get("url").and_then(Value::as_str).or_else(|| u.as_str()))
                            .ok_or_else(|| bad(&at, "a data: URL"))?;
                        media.push(images.add_url(url, &at)?);
                    }
                    (Some(kind), _) if kind != "text" => {
                        return Err(ApiError::bad_request(
                            format!("`{param}`: content parts of type {kind:?} are not supported"),
                            Some(&param),
                        ))
                    }
                    _ => return Err(bad(&param, "a string or a list of {\"type\": \"text\", \"text\": ...} parts")),
                }
            }
            Ok((Some(text), media))
        }
        Some(_) => Err(bad(&param, "a string or a list of content parts")),
    }
}

fn messages(o: &Obj, body: &[u8], images: &mut Images) -> Result<Vec<ChatMessage>, ApiError> {
    let list = crate::neutral::fields::messages(o)?;
    // The same messages as raw JSON, for their fields in the client's order.
    let raw = raw_items(body, "messages");
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let m = m.as_object().ok_or_else(|| bad(&format!("messages[{i}]"), "an object"))?;
        let role = match m.get("role") {
            Some(Value::String(r)) if !r.is_empty() => r.clone(),
            _ => return Err(bad(&format!("messages[{i}].role"), "a non-empty string")),
        };
        let (content, media) = content(m.get("content"), i, images)?;
        let extra = match raw.get(i) {
            Some(r) => crate::ordered::message_extra(r),
            None => {
                let extra: Obj = m
                    .iter()
                    .filter(|(k, v)| *k != "role" && *k != "content" && !v.is_null())
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                (!extra.is_empty()).then(|| Value::Object(extra).to_string())
            }
        };
        out.push(ChatMessage { role, content, extra, media });
    }
    Ok(out)
}

fn tools(o: &Obj) -> Result<(Option<String>, bool), ApiError> {
    let choice_none = match field(o, "tool_choice") {
        None => false,
        Some(Value::String(s)) if s == "none" => true,
        Some(Value::String(s)) if s == "auto" || s == "required" => false,
        Some(Value::Object(_)) => false,
        Some(_) => return Err(bad("tool_choice", "\"none\", \"auto\", \"required\" or an object")),
    };
    match field(o, "tools") {
        None => Ok((None, false)),
        Some(Value::Array(list)) if list.is_empty() => Ok((None, false)),
        Some(Value::Array(list)) => {
            if list.iter().any(|t| !t.is_object()) {
                return Err(bad("tools", "a list of tool objects"));
            }
            if choice_none {
                Ok((None, false))
            } else {
                Ok((Some(Value::Array(list.clone()).to_string()), true))
            }
        }
        Some(_) => Err(bad("tools", "a list of tool objects")),
    }
}

/// `chat_template_kwargs`: a JSON object of further template variables
/// (`{"enable_thinking": false}`), kept as the client wrote it.
fn template_vars(o: &Obj, body: &[u8]) -> Result<Option<String>, ApiError> {
    const PARAM: &str = "chat_template_kwargs";
    match field(o, PARAM) {
        None => Ok(None),
        Some(Value::Object(map)) if map.is_empty() => Ok(None),
        Some(v @ Value::Object(_)) => {
            let text = raw_field(body, PARAM).unwrap_or_else(|| v.to_string());
            waste_host::check_template_vars(&text)
                .map_err(|e| ApiError::bad_request(format!("`{PARAM}`: {e}"), Some(PARAM)))?;
            Ok(Some(text))
        }
        Some(_) => Err(bad(PARAM, "an object")),
    }
}

/// `reasoning_effort`: `none` or `minimal` turns reasoning off, `low`,
/// `medium`, `high` (and DeepSeek-V4's `max`) on at that effort.
fn reasoning_effort(o: &Obj) -> Result<Option<(bool, Option<&str>)>, ApiError> {
    const PARAM: &str = "reasoning_effort";
    match field(o, PARAM) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(e)) => match e.as_str() {
            "none" | "minimal" => Ok(Some((false, None))),
            "low" | "medium" | "high" | "max" => Ok(Some((true, Some(e.as_str())))),
            _ => Err(bad(PARAM, "one of none, minimal, low, medium, high")),
        },
        Some(_) => Err(bad(PARAM, "a string")),
    }
}

/// Parses a request body. `chat` selects the chat shape (messages) over the
/// completions shape (prompt); `context` bounds max_tokens' default.
pub fn parse(body: &[u8], chat: bool, context: usize) -> Result<Request, ApiError> {
    let o = &object(body)?;
    let model = string(o, "model")?;
    // A field that would change the answer is refused rather than ignored.
    if field(o, "best_of").is_some_and(|n| n.as_u64() != Some(1)) {
        return Err(ApiError::bad_request("only `best_of` = 1 is supported", Some("best_of")));
    }
    let choices = integer(o, "n", 1, u64::from(MAX_CHOICES))?.unwrap_or(1) as u32;
    let (prompt, tools_enabled) = if chat {
        let (tools, enabled) = tools(o)?;
        let tools = tools.map(|sorted| raw_field(body, "tools").unwrap_or(sorted));
        let mut images = Images::default();
        let messages = messages(o, body, &mut images)?;
        let mut vars = template_vars(o, body)?;
        if let Some((on, effort)) = reasoning_effort(o)? {
            vars = with_thinking(vars, on, effort);
        }
        (Prompt::Chat { messages, tools, template_vars: vars, images }, enabled)
    } else {
        let text = match field(o, "prompt") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => a[0].as_str().unwrap_or_default().to_string(),
            Some(Value::Array(a)) if a.len() > 1 => {
                return Err(ApiError::bad_request("only one prompt per request is supported", Some("prompt")))
            }
            None => return Err(ApiError::bad_request("`prompt` is required", Some("prompt"))),
            Some(_) => return Err(bad("prompt", "a string")),
        };
        (Prompt::Text(text), false)
    };
    let max_tokens = match integer(o, "max_completion_tokens", 1, u32::MAX as u64)? {
        Some(n) => Some(n),
        None => integer(o, "max_tokens", 1, u32::MAX as u64)?,
    };
    let (logprobs, top_logprobs) = if chat {
        let on = boolean(o, "logprobs")?;
        let top = integer(o, "top_logprobs", 0, 20)?;
        if top.is_some() && !on {
            return Err(ApiError::bad_request("`top_logprobs` needs `logprobs` set to true", Some("top_logprobs")));
        }
        (on, top.unwrap_or(0))
    } else {
        match integer(o, "logprobs", 0, 5)? {
            Some(k) => (true, k),
            None => (false, 0),
        }
    };
    let stream = boolean(o, "stream")?;
    let include_usage = match field(o, "stream_options") {
        None => false,
        Some(Value::Object(so)) => {
            boolean(so, "include_usage").map_err(|_| bad("stream_options.include_usage", "a boolean"))?
        }
        Some(_) => return Err(bad("stream_options", "an object")),
    };
    let seed = match field(o, "seed") {
        None => fresh_seed(),
        // Negative seeds are legal in OpenAI's API; their bit pattern is the seed.
        Some(v) => v.as_i64().map(|s| s as u64).or_else(|| v.as_u64()).ok_or_else(|| bad("seed", "an integer"))?,
    };
    let asked = response_format(o)?;
    let constraint_field = asked.as_ref().map(|(_, f)| *f);
    let mut constraint = structured::constraint(asked);
    if let (None, Prompt::Chat { tools: Some(tools), template_vars, .. }, true) = (&constraint, &prompt, tools_enabled)
    {
        // "required", or one named function: the answer is that call.
        let name = match field(o, "tool_choice") {
            Some(Value::String(s)) if s == "required" => Some(None),
            Some(Value::Object(c)) => Some(c.get("function").and_then(|f| f.get("name")).and_then(Value::as_str)),
            _ => None,
        };
        if let Some(name) = name {
            constraint = structured::forced_tool(tools, name, template_vars.as_deref());
        }
    }
    let params = GenerateParams {
        temperature: number(o, "temperature", 0.0, 2.0)?.unwrap_or(OPENAI_DEFAULT_TEMPERATURE) as f32,
        top_p: number(o, "top_p", 0.0, 1.0)?.map(|p| p.max(f64::MIN_POSITIVE)).unwrap_or(1.0) as f32,
        top_k: integer(o, "top_k", 0, u32::MAX as u64)?.unwrap_or(0) as u32,
        min_p: number(o, "min_p", 0.0, 1.0)?.unwrap_or(0.0) as f32,
        presence_penalty: number(o, "presence_penalty", -2.0, 2.0)?.unwrap_or(0.0) as f32,
        frequency_penalty: number(o, "frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0) as f32,
        repetition_penalty: number(o, "repetition_penalty", 0.01, 10.0)?.unwrap_or(1.0) as f32,
        top_logprobs: top_logprobs as u32,
        seed,
        max_tokens: max_tokens.unwrap_or(context as u64).min(u32::MAX as u64) as u32,
        stop_strings: stop_strings(o)?,
        logit_bias: logit_bias(o)?,
        constraint,
        ..GenerateParams::default()
    };
    Ok(Request { model, prompt, params, stream, include_usage, logprobs, tools_enabled, constraint_field, choices })
}

/// `response_format` `{"type": "text" | "json_object"}` or
/// `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`.
/// Strict or not, the schema is enforced: decoding cannot leave it.
fn response_format(o: &Obj) -> Result<Asked, ApiError> {
    const P: &str = "response_format";
    let invalid = |what: &str| ApiError::bad_request(format!("`{P}`: {what}"), Some(P));
    let format = match field(o, P) {
        None => None,
        Some(Value::Object(rf)) => match rf.get("type").and_then(Value::as_str) {
            Some("text") => None,
            Some("json_object") => Some(Constraint::JsonObject),
            Some("json_schema") => match rf.get("json_schema") {
                Some(Value::Object(js)) => match js.get("schema") {
                    Some(s) => Some(schema(s, "response_format.json_schema.schema", P)?),
                    None => return Err(invalid("`json_schema` needs a `schema`")),
                },
                _ => return Err(invalid("type json_schema needs a `json_schema` object with a `schema`")),
            },
            _ => return Err(invalid("`type` must be \"text\", \"json_object\" or \"json_schema\"")),
        },
        Some(_) => return Err(invalid("must be an object")),
    };
    with_grammar(o, format.map(|c| (c, P)), "`response_format` and `grammar`")
}

/// OpenAI's `logit_bias`: token ids (as JSON object keys) to a bias in
/// [-100, 100] added to their logits; the ids are checked against the
/// vocabulary by the handler, which knows it.
fn logit_bias(o: &Obj) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(v) = field(o, "logit_bias") else {
        return Ok(Vec::new());
    };
    let map = v.as_object().ok_or_else(|| bad("logit_bias", "an object of token ids to numbers"))?;
    let mut out = Vec::with_capacity(map.len());
    for (id, bias) in map {
        let id: u32 = id.parse().map_err(|_| bad("logit_bias", &format!("keyed by token ids; {id:?} is not one")))?;
        let bias = bias
            .as_f64()
            .filter(|b| (-100.0..=100.0).contains(b))
            .ok_or_else(|| bad("logit_bias", &format!("a bias in [-100, 100] for token {id}")))?;
        out.push((id, bias as f32));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::neutral::fields::obj;

    #[test]
    fn response_format_and_grammar_become_one_constraint() {
        let schema = r#"{"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"string"}}}"#;
        let rf = format!(
            r#"{{"response_format": {{"type": "json_schema", "json_schema": {{"name": "x", "schema": {schema}}}}}}}"#
        );
        assert_eq!(
            response_format(&obj(&rf)).unwrap(),
            Some((Constraint::JsonSchema(schema.into()), "response_format"))
        );
        assert_eq!(
            structured::constraint(response_format(&obj(r#"{"response_format": {"type": "json_object"}}"#)).unwrap()),
            Some(Constraint::JsonObject)
        );
        assert_eq!(response_format(&obj(r#"{"response_format": {"type": "text"}}"#)).unwrap(), None);
        assert_eq!(
            response_format(&obj(r#"{"grammar": "root ::= \"a\""}"#)).unwrap(),
            Some((Constraint::Gbnf("root ::= \"a\"".into()), "grammar"))
        );
        assert_eq!(
            structured::constraint(
                response_format(&obj(r#"{"grammar": {"syntax": "regex", "definition": "a+"}}"#)).unwrap()
            ),
            Some(Constraint::Regex("a+".into()))
        );
    }

    #[test]
    fn malformed_response_formats_are_400s_naming_the_field() {
        for (body, param) in [
            (r#"{"response_format": "json"}"#, "response_format"),
            (r#"{"response_format": {"type": "yaml"}}"#, "response_format"),
            (r#"{"response_format": {"type": "json_schema"}}"#, "response_format"),
            (r#"{"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}"#, "response_format"),
            (r#"{"response_format": {"type": "json_schema", "json_schema": {"schema": [1]}}}"#, "response_format"),
            (r#"{"response_format": {"type": "json_object"}, "grammar": "start: \"a\""}"#, "grammar"),
            (r#"{"grammar": 5}"#, "grammar"),
            (r#"{"grammar": {"syntax": "ebnf", "definition": "a"}}"#, "grammar"),
        ] {
            let e = response_format(&obj(body)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
        }
    }

    #[test]
    fn tools_keep_the_clients_key_order() {
        let body = br#"{"messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}"#;
        let req = parse(body, true, 256).unwrap();
        let Prompt::Chat { tools: Some(tools), .. } = req.prompt else {
            panic!("no tools");
        };
        assert!(req.tools_enabled);
        let at = |k: &str| tools.find(k).unwrap();
        assert!(at("\"type\"") < at("\"function\""), "{tools}");
        assert!(at("\"name\"") < at("\"parameters\""), "{tools}");
    }

    #[test]
    fn tool_choice_none_drops_the_tools() {
        let body = br#"{"messages": [{"role": "user", "content": "hi"}], "tool_choice": "none",
            "tools": [{"type": "function", "function": {"name": "f"}}]}"#;
        let req = parse(body, true, 256).unwrap();
        assert!(!req.tools_enabled);
        assert!(matches!(req.prompt, Prompt::Chat { tools: None, .. }));
    }

    #[test]
    fn chat_template_kwargs_reach_the_prompt_as_written() {
        let body = br#"{"messages": [{"role": "user", "content": "hi"}],
            "chat_template_kwargs": {"enable_thinking": false, "a": {"z": 1, "b": 2}}}"#;
        let req = parse(body, true, 256).unwrap();
        let Prompt::Chat { template_vars: Some(vars), .. } = req.prompt else {
            panic!("no template variables");
        };
        assert_eq!(vars, r#"{"enable_thinking": false, "a": {"z": 1, "b": 2}}"#);
        let none =
            parse(br#"{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": null}"#, true, 256)
                .unwrap();
        assert!(matches!(none.prompt, Prompt::Chat { template_vars: None, .. }));
    }

    #[test]
    fn chat_template_kwargs_not_an_object_or_reserved_is_a_bad_request() {
        for body in [
            &br#"{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": [1]}"#[..],
            br#"{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": "enable_thinking"}"#,
            br#"{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"messages": []}}"#,
            br#"{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"add_generation_prompt": false}}"#,
        ] {
            let err = parse(body, true, 256).err().expect("accepted");
            assert_eq!(err.status, axum::http::StatusCode::BAD_REQUEST, "{}", String::from_utf8_lossy(body));
            assert_eq!(err.param.as_deref(), Some("chat_template_kwargs"));
        }
    }
}
