//! Structured output as each API spells it, turned into one
//! [`Constraint`] and the request field that carried it (where a 400 about
//! it points): OpenAI's `response_format`, Ollama's `format`, Anthropic's
//! `output_config.format` (and the beta's `output_format`), and the
//! `grammar` field every endpoint takes, as llama.cpp's server does: GBNF
//! text, Lark text when it starts with `%llguidance`, or
//! `{"syntax": "lark" | "gbnf" | "regex", "definition": TEXT}` (the names
//! of OpenAI's grammar-constrained custom tools). The control component
//! compiles it; a malformed or unsatisfiable one is a 400 from
//! `Session::check_params` before anything is evaluated.

use serde_json::Value;
use waste_host::{Constraint, MAX_CONSTRAINT_BYTES};

use crate::error::ApiError;
use crate::neutral::fields::{bad, field, Obj};

/// A request's constraint and the field that carried it.
pub type Asked = Option<(Constraint, &'static str)>;

const GRAMMAR: &str = "grammar";

fn grammar(o: &Obj) -> Result<Asked, ApiError> {
    let what = "GBNF text, Lark text starting with %llguidance, or {\"syntax\": \"lark\" | \"gbnf\" | \"regex\", \"definition\": TEXT}";
    let constraint = match field(o, GRAMMAR) {
        None => return Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => return Ok(None),
        Some(Value::String(s)) => Constraint::grammar(bounded(s, GRAMMAR)?.to_string()),
        Some(Value::Object(g)) => {
            let Some(Value::String(text)) = g.get("definition") else {
                return Err(ApiError::bad_request("`grammar.definition` must be the grammar's text", Some(GRAMMAR)));
            };
            let text = bounded(text, GRAMMAR)?.to_string();
            match g.get("syntax").and_then(Value::as_str) {
                Some("lark") => Constraint::Lark(text),
                Some("gbnf") => Constraint::Gbnf(text),
                Some("regex") => Constraint::Regex(text),
                _ => return Err(bad(GRAMMAR, "an object whose `syntax` is \"lark\", \"gbnf\" or \"regex\"")),
            }
        }
        Some(_) => return Err(bad(GRAMMAR, what)),
    };
    Ok(Some((constraint, GRAMMAR)))
}

fn bounded<'a>(text: &'a str, param: &str) -> Result<&'a str, ApiError> {
    if text.len() > MAX_CONSTRAINT_BYTES {
        return Err(ApiError::bad_request(
            format!("`{param}` is {} bytes; at most {MAX_CONSTRAINT_BYTES} are accepted", text.len()),
            Some(param),
        ));
    }
    Ok(text)
}

/// A schema value as the JSON text the component compiles (keys in the
/// client's order: the properties are generated in it).
fn schema(v: &Value, param: &str, report: &str) -> Result<Constraint, ApiError> {
    if !(v.is_object() || v.is_boolean()) {
        return Err(ApiError::bad_request(format!("`{param}` must be a JSON schema object"), Some(report)));
    }
    Ok(Constraint::JsonSchema(bounded(&v.to_string(), report)?.to_string()))
}

/// A forced tool call (`tool_choice` "required" / `any`, or one named):
/// the call in the model's syntax with valid arguments. The worker drops it
/// where the template's call syntax has no JSON to constrain.
pub fn forced_tool(tools: &str, name: Option<&str>, vars: Option<&str>) -> Option<Constraint> {
    Some(Constraint::ToolCall {
        tools: tools.to_string(),
        name: name.map(str::to_string),
        vars: vars.map(str::to_string),
    })
}

/// The constraint alone (APIs whose errors name no field).
pub fn constraint(asked: Asked) -> Option<Constraint> {
    asked.map(|(c, _)| c)
}

/// At most one way of asking for structured output per request.
fn one_of(format: Asked, grammar: Asked, names: &str) -> Result<Asked, ApiError> {
    match (format, grammar) {
        (Some(_), Some(_)) => Err(ApiError::bad_request(format!("give only one of {names}"), Some(GRAMMAR))),
        (f, g) => Ok(f.or(g)),
    }
}

/// OpenAI: `response_format` `{"type": "text" | "json_object"}` or
/// `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`.
/// Strict or not, the schema is enforced: decoding cannot leave it.
pub fn openai(o: &Obj) -> Result<Asked, ApiError> {
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
    one_of(format.map(|c| (c, P)), grammar(o)?, "`response_format` and `grammar`")
}

/// Ollama: `format` `"json"` or a JSON schema object.
pub fn ollama(o: &Obj) -> Result<Asked, ApiError> {
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
    one_of(format.map(|c| (c, P)), grammar(o)?, "`format` and `grammar`")
}

/// Anthropic: `output_config.format` (or the beta's `output_format`)
/// `{"type": "json_schema", "schema": {...}}`.
pub fn anthropic(o: &Obj) -> Result<Asked, ApiError> {
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
    one_of(format.map(|c| (c, param)), grammar(o)?, "an output format and `grammar`")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(text: &str) -> Obj {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn each_api_spelling_becomes_one_constraint() {
        let schema = r#"{"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"string"}}}"#;
        let want = Some(Constraint::JsonSchema(schema.to_string()));
        let rf = format!(
            r#"{{"response_format": {{"type": "json_schema", "json_schema": {{"name": "x", "schema": {schema}}}}}}}"#
        );
        assert_eq!(openai(&obj(&rf)).unwrap(), Some((Constraint::JsonSchema(schema.into()), "response_format")));
        assert_eq!(
            constraint(openai(&obj(r#"{"response_format": {"type": "json_object"}}"#)).unwrap()),
            Some(Constraint::JsonObject)
        );
        assert_eq!(openai(&obj(r#"{"response_format": {"type": "text"}}"#)).unwrap(), None);
        assert_eq!(
            constraint(ollama(&obj(&format!(r#"{{"format": {schema}}}"#))).unwrap()),
            want,
            "keys keep the client's order"
        );
        assert_eq!(constraint(ollama(&obj(r#"{"format": "json"}"#)).unwrap()), Some(Constraint::JsonObject));
        let oc = format!(r#"{{"output_config": {{"format": {{"type": "json_schema", "schema": {schema}}}}}}}"#);
        assert_eq!(
            anthropic(&obj(&oc)).unwrap(),
            Some((Constraint::JsonSchema(schema.into()), "output_config.format"))
        );
        assert_eq!(
            openai(&obj(r#"{"grammar": "root ::= \"a\""}"#)).unwrap(),
            Some((Constraint::Gbnf("root ::= \"a\"".into()), "grammar"))
        );
        assert_eq!(
            constraint(ollama(&obj(r#"{"grammar": "%llguidance {}\nstart: \"a\""}"#)).unwrap()),
            Some(Constraint::Lark("%llguidance {}\nstart: \"a\"".into()))
        );
        assert_eq!(
            constraint(openai(&obj(r#"{"grammar": {"syntax": "regex", "definition": "a+"}}"#)).unwrap()),
            Some(Constraint::Regex("a+".into()))
        );
    }

    #[test]
    fn malformed_requests_are_400s_naming_the_field() {
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
            let e = openai(&obj(body)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
        }
        assert!(ollama(&obj(r#"{"format": "yaml"}"#)).is_err());
        assert!(anthropic(&obj(r#"{"output_config": {"format": {"type": "text"}}}"#)).is_err());
    }
}
