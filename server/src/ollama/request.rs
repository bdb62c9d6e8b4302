//! Request bodies of Ollama's /api/chat and /api/generate (docs/api.md at
//! v0.33.0): the model name, messages or prompt, `options` type-checked as
//! Ollama's `Options.FromMap` does, Ollama's sampling defaults where an
//! option is absent (`OllamaDefaults`).

use serde_json::Value;
use waste_host::{ChatMessage, Constraint, GenerateParams};

use crate::error::ApiError;
use crate::neutral::fields::{field, number_in, raw_field, raw_items, strings, Obj, Refused};
use crate::neutral::images::Images;
use crate::neutral::{fresh_seed, with_thinking, Prompt};
use crate::structured::{self, schema, with_grammar, Asked};

pub struct Request {
    pub model: String,
    /// None: /api/generate without a prompt (load or unload the model).
    pub prompt: Option<Prompt>,
    pub params: GenerateParams,
    pub stream: bool,
    pub tools_enabled: bool,
    /// `keep_alive` 0: the client asked to unload.
    pub unload: bool,
}

/// The sampling options Ollama documents a default for (docs/modelfile.md,
/// `api.DefaultOptions`): an Ollama client that leaves one out gets these,
/// not another API's.
pub struct OllamaDefaults;

impl OllamaDefaults {
    pub const TEMPERATURE: f64 = 0.8;
    pub const TOP_K: u32 = 40;
    pub const TOP_P: f64 = 0.9;
    /// llama.cpp's repeat penalty (a positive logit divided by it, a
    /// negative one multiplied) over the last `REPEAT_LAST_N` tokens.
    pub const REPEAT_PENALTY: f64 = 1.1;
    pub const REPEAT_LAST_N: u32 = 64;
}

/// Ollama's errors name no field: `{"error": "..."}`.
fn bad(what: impl Into<String>) -> ApiError {
    ApiError::bad_request(what, None)
}

/// `options`: Ollama's names, each a 400 naming it when of the wrong type.
fn options(o: &Obj, context: usize) -> Result<GenerateParams, ApiError> {
    let opts = match field(o, "options") {
        None => Obj::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => return Err(bad("options must be an object")),
    };
    let float = |k: &str, lo: f64, hi: f64| -> Result<Option<f64>, ApiError> {
        let wrong = |why| match why {
            Refused::Range => bad(format!("option {k:?} must be in [{lo}, {hi}]")),
            Refused::Type => bad(format!("option {k:?} must be of type float")),
        };
        field(&opts, k).map(|v| number_in(v, lo, hi).map_err(wrong)).transpose()
    };
    let int = |k: &str| -> Result<Option<i64>, ApiError> {
        field(&opts, k)
            .map(|v| v.as_i64().ok_or_else(|| bad(format!("option {k:?} must be of type integer"))))
            .transpose()
    };
    // Accepted and meaningless here (the runner's own settings), but still
    // of the right type, as Ollama checks them.
    for k in ["num_ctx", "num_batch", "num_gpu", "main_gpu", "num_thread", "num_keep"] {
        int(k)?;
    }
    let max_tokens = match int("num_predict")? {
        None | Some(-1) | Some(-2) => context,
        Some(n) if n >= 1 => (n as u64).min(context as u64) as usize,
        Some(n) => return Err(bad(format!("option \"num_predict\" must be -1, -2 or at least 1, not {n}"))),
    };
    let stop_strings = match field(&opts, "stop") {
        None => Vec::new(),
        Some(v) => strings(v, false).ok_or_else(|| bad("option \"stop\" must be of type []string"))?,
    };
    let seed = match int("seed")? {
        None | Some(-1) => fresh_seed(),
        Some(s) => s as u64,
    };
    // 0 turns the penalties off; -1 is the whole context (`num_ctx`).
    let penalty_last_n = match int("repeat_last_n")? {
        None => OllamaDefaults::REPEAT_LAST_N,
        Some(-1) => context.min(u32::MAX as usize) as u32,
        Some(n) if n >= 0 => n.min(u32::MAX as i64) as u32,
        Some(n) => return Err(bad(format!("option \"repeat_last_n\" must be -1 or at least 0, not {n}"))),
    };
    let top_k = match int("top_k")? {
        None => OllamaDefaults::TOP_K,
        Some(k) if k >= 0 => k.min(u32::MAX as i64) as u32,
        Some(_) => return Err(bad("option \"top_k\" must be at least 0")),
    };
    Ok(GenerateParams {
        temperature: float("temperature", 0.0, 2.0)?.unwrap_or(OllamaDefaults::TEMPERATURE) as f32,
        top_p: float("top_p", 0.0, 1.0)?.unwrap_or(OllamaDefaults::TOP_P).max(f64::MIN_POSITIVE) as f32,
        top_k,
        min_p: float("min_p", 0.0, 1.0)?.unwrap_or(0.0) as f32,
        presence_penalty: float("presence_penalty", -2.0, 2.0)?.unwrap_or(0.0) as f32,
        frequency_penalty: float("frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0) as f32,
        repetition_penalty: float("repeat_penalty", 0.01, 10.0)?.unwrap_or(OllamaDefaults::REPEAT_PENALTY) as f32,
        penalty_last_n,
        seed,
        max_tokens: max_tokens as u32,
        stop_strings,
        ..GenerateParams::default()
    })
}

/// `format` `"json"` or a JSON schema object.
fn format(o: &Obj) -> Result<Asked, ApiError> {
    const P: &str = "format";
    let format = match field(o, P) {
        None => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(Value::String(s)) if s == "json" => Some(Constraint::JsonObject),
        Some(v @ Value::Object(_)) => Some(schema(v, P, P)?),
        Some(other) => {
            return Err(ApiError::bad_request(
                format!("invalid format: {other}; expected \"json\" or a valid JSON Schema object"),
                Some(P),
            ))
        }
    };
    with_grammar(o, format.map(|c| (c, P)), "`format` and `grammar`")
}

/// An `images` field: a list of base64 image files (the clients encode a
/// path or bytes before sending), each decoded into `images` and its
/// markup returned, in order.
fn images_of(v: Option<&Value>, param: &str, images: &mut Images) -> Result<Vec<String>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(k, x)| match x.as_str() {
                Some(data) => images.add_base64(data, &format!("{param}[{k}]")),
                None => Err(bad(format!("{param}[{k}] must be a base64 string"))),
            })
            .collect(),
        Some(_) => Err(bad(format!("{param} must be a list of base64 strings"))),
    }
}

fn messages(o: &Obj, body: &[u8], images: &mut Images) -> Result<Vec<ChatMessage>, ApiError> {
    let list: &[Value] = match field(o, "messages") {
        Some(Value::Array(list)) => list,
        None => &[],
        Some(_) => return Err(bad("messages must be a list of messages")),
    };
    let raw = raw_items(body, "messages");
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let m = m.as_object().ok_or_else(|| bad(format!("messages[{i}] must be an object")))?;
        let role = match m.get("role").and_then(Value::as_str) {
            Some(r @ ("system" | "user" | "assistant" | "tool")) => r.to_string(),
            _ => return Err(bad(format!("messages[{i}].role must be system, user, assistant or tool"))),
        };
        let content = match m.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(bad(format!("messages[{i}].content must be a string"))),
        };
        let media = images_of(m.get("images"), &format!("messages[{i}].images"), images)?;
        // Further fields (tool_calls with object arguments, tool_name,
        // tool_call_id) reach the template as the client wrote them.
        let extra = raw.get(i).and_then(|r| crate::ordered::message_extra(r));
        out.push(ChatMessage { role, content: Some(content), extra, media });
    }
    Ok(out)
}

fn model(o: &Obj) -> Result<String, ApiError> {
    match field(o, "model") {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(_) => Err(bad("model must be a string")),
        None => Err(bad("model is required")),
    }
}

/// A boolean field, `default` when absent.
fn boolean(o: &Obj, key: &str, default: bool) -> Result<bool, ApiError> {
    match field(o, key) {
        None => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(bad(format!("{key} must be a boolean"))),
    }
}

fn stream_and_keep_alive(o: &Obj) -> Result<(bool, bool), ApiError> {
    let stream = boolean(o, "stream", true)?;
    let unload = matches!(field(o, "keep_alive"), Some(v) if v.as_f64() == Some(0.0) || v.as_str() == Some("0"));
    Ok((stream, unload))
}

fn object(body: &[u8]) -> Result<Obj, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(bad("the request body must be a JSON object")),
        Err(e) => Err(bad(format!("invalid JSON: {e}"))),
    }
}

/// `think`: true or false, or gpt-oss's effort (`"low"`, `"medium"`,
/// `"high"`), as template variables; absent, the template's own default.
fn think(o: &Obj) -> Result<Option<String>, ApiError> {
    let (on, effort) = match field(o, "think") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Bool(on)) => (*on, None),
        Some(Value::String(e)) if matches!(e.as_str(), "low" | "medium" | "high") => (true, Some(e.as_str())),
        Some(_) => return Err(bad("think must be true, false, \"low\", \"medium\" or \"high\"")),
    };
    Ok(with_thinking(None, on, effort))
}

pub fn parse_chat(body: &[u8], context: usize) -> Result<Request, ApiError> {
    let o = object(body)?;
    let model = model(&o)?;
    let mut images = Images::default();
    let messages = messages(&o, body, &mut images)?;
    let constraint = structured::constraint(format(&o)?);
    let (stream, unload) = stream_and_keep_alive(&o)?;
    let tools = match field(&o, "tools") {
        None => None,
        Some(Value::Array(list)) if list.is_empty() => None,
        Some(Value::Array(list)) if list.iter().all(Value::is_object) => raw_field(body, "tools"),
        Some(_) => return Err(bad("tools must be a list of tools")),
    };
    let params = GenerateParams { constraint, ..options(&o, context)? };
    let tools_enabled = tools.is_some();
    let template_vars = think(&o)?;
    let prompt = (!messages.is_empty()).then_some(Prompt::Chat { messages, tools, template_vars, images });
    Ok(Request { model, prompt, params, stream, tools_enabled, unload })
}

pub fn parse_generate(body: &[u8], context: usize) -> Result<Request, ApiError> {
    let o = object(body)?;
    let model = model(&o)?;
    let constraint = structured::constraint(format(&o)?);
    let (stream, unload) = stream_and_keep_alive(&o)?;
    for key in ["suffix", "template"] {
        if field(&o, key).is_some_and(|v| v.as_str() != Some("")) {
            return Err(bad(format!("{key} is not supported by this server")));
        }
    }
    let text = match field(&o, "prompt") {
        None => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(bad("prompt must be a string")),
    };
    let raw = boolean(&o, "raw", false)?;
    let system = match field(&o, "system") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(bad("system must be a string")),
    };
    let mut images = Images::default();
    let media = images_of(field(&o, "images"), "images", &mut images)?;
    if raw && !media.is_empty() {
        // A raw prompt is the model's text as written: there is no
        // template to place the images' markup in.
        return Err(bad("images need a templated prompt: raw must be false"));
    }
    let params = GenerateParams { constraint, ..options(&o, context)? };
    let template_vars = think(&o)?;
    let prompt = text.map(|text| {
        if raw {
            Prompt::Text(text)
        } else {
            let mut messages: Vec<ChatMessage> = system
                .map(|s| ChatMessage { role: "system".into(), content: Some(s), extra: None, media: Vec::new() })
                .into_iter()
                .collect();
            messages.push(ChatMessage { role: "user".into(), content: Some(text), extra: None, media });
            Prompt::Chat { messages, tools: None, template_vars, images }
        }
    });
    Ok(Request { model, prompt, params, stream, tools_enabled: false, unload })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::neutral::fields::obj;

    #[test]
    fn format_and_grammar_become_one_constraint() {
        let schema = r#"{"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"string"}}}"#;
        assert_eq!(
            structured::constraint(format(&obj(&format!(r#"{{"format": {schema}}}"#))).unwrap()),
            Some(Constraint::JsonSchema(schema.to_string())),
            "keys keep the client's order"
        );
        assert_eq!(
            structured::constraint(format(&obj(r#"{"format": "json"}"#)).unwrap()),
            Some(Constraint::JsonObject)
        );
        assert_eq!(
            structured::constraint(format(&obj(r#"{"grammar": "%llguidance {}\nstart: \"a\""}"#)).unwrap()),
            Some(Constraint::Lark("%llguidance {}\nstart: \"a\"".into()))
        );
        assert!(format(&obj(r#"{"format": "yaml"}"#)).is_err());
    }

    /// A request without options samples as Ollama does by default, repeat
    /// penalty included; each option replaces its default, and
    /// `repeat_last_n` -1 is the whole context, 0 no penalty window.
    #[test]
    fn absent_options_take_ollamas_documented_defaults_repeat_penalty_included() {
        let p = options(&obj("{}"), 4096).unwrap();
        assert_eq!(p.temperature, OllamaDefaults::TEMPERATURE as f32);
        assert_eq!(p.top_k, OllamaDefaults::TOP_K);
        assert_eq!(p.top_p, OllamaDefaults::TOP_P as f32);
        assert_eq!(p.repetition_penalty, OllamaDefaults::REPEAT_PENALTY as f32);
        assert_eq!(p.penalty_last_n, OllamaDefaults::REPEAT_LAST_N);

        let p = options(&obj(r#"{"options": {"repeat_penalty": 1.0, "repeat_last_n": 8}}"#), 4096).unwrap();
        assert_eq!((p.repetition_penalty, p.penalty_last_n), (1.0, 8));
        assert_eq!(options(&obj(r#"{"options": {"repeat_last_n": -1}}"#), 4096).unwrap().penalty_last_n, 4096);
        assert_eq!(options(&obj(r#"{"options": {"repeat_last_n": 0}}"#), 4096).unwrap().penalty_last_n, 0);
        assert!(options(&obj(r#"{"options": {"repeat_last_n": -2}}"#), 4096).is_err());
        assert!(options(&obj(r#"{"options": {"repeat_last_n": 1.5}}"#), 4096).is_err());
    }
}
