//! Structured output as one [`Constraint`] and the request field that
//! carried it (where a 400 about it points), whichever API asked: a JSON
//! schema, a forced tool call, or the `grammar` field every endpoint takes,
//! as llama.cpp's server does: GBNF text, Lark text when it starts with
//! `%llguidance`, or `{"syntax": "lark" | "gbnf" | "regex", "definition":
//! TEXT}` (the names of OpenAI's grammar-constrained custom tools). Each
//! API's own format field (OpenAI's `response_format`, Ollama's `format`,
//! Anthropic's `output_config.format`) is read by its parser, which joins
//! it to the grammar here. The control component compiles it; a malformed
//! or unsatisfiable one is a 400 from `Session::check_params` before
//! anything is evaluated.

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
pub fn schema(v: &Value, param: &str, report: &str) -> Result<Constraint, ApiError> {
    if !(v.is_object() || v.is_boolean()) {
        return Err(ApiError::bad_request(format!("`{param}` must be a JSON schema object"), Some(report)));
    }
    Ok(Constraint::JsonSchema(bounded(&v.to_string(), report)?.to_string()))
}

/// A forced tool call (`tool_choice` "required" / `any`, or one named):
/// the call in the model's syntax with valid arguments. The worker drops it
/// where the probe finds no call syntax in the template.
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

/// The format an API's own field asked for (`names` names it and
/// `grammar` in the error), or else the `grammar` field: at most one way of
/// asking for structured output per request.
pub fn with_grammar(o: &Obj, format: Asked, names: &str) -> Result<Asked, ApiError> {
    match (format, grammar(o)?) {
        (Some(_), Some(_)) => Err(ApiError::bad_request(format!("give only one of {names}"), Some(GRAMMAR))),
        (f, g) => Ok(f.or(g)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::neutral::fields::obj;

    fn grammar_of(text: &str) -> Result<Asked, ApiError> {
        with_grammar(&obj(text), None, "a format and `grammar`")
    }

    #[test]
    fn each_grammar_spelling_becomes_one_constraint() {
        assert_eq!(
            grammar_of(r#"{"grammar": "root ::= \"a\""}"#).unwrap(),
            Some((Constraint::Gbnf("root ::= \"a\"".into()), "grammar"))
        );
        assert_eq!(
            constraint(grammar_of(r#"{"grammar": "%llguidance {}\nstart: \"a\""}"#).unwrap()),
            Some(Constraint::Lark("%llguidance {}\nstart: \"a\"".into()))
        );
        assert_eq!(
            constraint(grammar_of(r#"{"grammar": {"syntax": "regex", "definition": "a+"}}"#).unwrap()),
            Some(Constraint::Regex("a+".into()))
        );
        assert_eq!(grammar_of(r#"{"grammar": " "}"#).unwrap(), None);
    }

    #[test]
    fn a_malformed_grammar_or_two_formats_are_400s_naming_grammar() {
        for body in [r#"{"grammar": 5}"#, r#"{"grammar": {"syntax": "ebnf", "definition": "a"}}"#] {
            assert_eq!(grammar_of(body).unwrap_err().param.as_deref(), Some(GRAMMAR), "{body}");
        }
        let both = with_grammar(&obj(r#"{"grammar": "start: \"a\""}"#), Some((Constraint::JsonObject, "format")), "x");
        assert_eq!(both.unwrap_err().param.as_deref(), Some(GRAMMAR));
    }
}
