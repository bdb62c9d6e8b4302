//! The tag syntaxes: `<tool_call>` blocks (Hermes JSON, Qwen3.5's XML,
//! GLM's key/value pairs, told apart by what follows the tag) and
//! MiniMax-M2's `<minimax:tool_call>` and DeepSeek-V3.2's DSML invocations.

use super::{hermes, leading, Call, Parsed, Schema};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// Every `<tool_call>` block of `text`. A call the generation cut short
/// has no closing tag; its body is still whole when the model ended right
/// after it.
pub(super) fn parse_tool_call_tags(text: &str, schema: &Schema) -> Option<Parsed> {
    let first = text.find(OPEN)?;
    let mut calls = Vec::new();
    let mut rest = &text[first..];
    while let Some(start) = rest.find(OPEN) {
        let body = &rest[start + OPEN.len()..];
        let (inner, after) = match body.find(CLOSE) {
            Some(end) => (&body[..end], &body[end + CLOSE.len()..]),
            None => (body, ""),
        };
        let head = inner.trim_start();
        let call = if head.starts_with('{') {
            hermes::call(inner)?
        } else if head.starts_with("<function=") {
            qwen_function(head, schema)?
        } else {
            glm_call(inner, schema)?
        };
        calls.push(call);
        rest = after;
    }
    Some(Parsed { content: leading(text, first), reasoning: None, calls })
}

/// `<function=NAME>` then `<parameter=KEY>\nVALUE\n</parameter>`s, as
/// Qwen3-Coder's and Qwen3.5's templates write them (the value on lines of
/// its own: one newline after the opening and before the closing tag is
/// layout, not value).
fn qwen_function(body: &str, schema: &Schema) -> Option<Call> {
    let rest = body.strip_prefix("<function=")?;
    let (name, mut rest) = rest.split_once('>')?;
    let name = name.trim().to_string();
    let mut pairs = Vec::new();
    while let Some(at) = rest.find("<parameter=") {
        let after = &rest[at + "<parameter=".len()..];
        let (key, after) = after.split_once('>')?;
        let end = after.find("</parameter>")?;
        let value = &after[..end];
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        pairs.push((key.trim().to_string(), value.to_string()));
        rest = &after[end + "</parameter>".len()..];
    }
    if !rest.trim().trim_end_matches("</function>").trim().is_empty() {
        return None;
    }
    Some(Call { arguments: schema.arguments(&name, &pairs), name })
}

/// GLM-4.5 / 4.6: `NAME\n<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>...`.
fn glm_call(body: &str, schema: &Schema) -> Option<Call> {
    let name_end = body.find("<arg_key>").unwrap_or(body.len());
    let name = body[..name_end].trim();
    if name.is_empty() || name.contains(['<', '>', '{', '\n']) {
        return None;
    }
    let mut pairs = Vec::new();
    let mut rest = &body[name_end..];
    while let Some(at) = rest.find("<arg_key>") {
        let after = &rest[at + "<arg_key>".len()..];
        let key_end = after.find("</arg_key>")?;
        let key = after[..key_end].trim().to_string();
        let after = after[key_end + "</arg_key>".len()..].trim_start().strip_prefix("<arg_value>")?;
        let value_end = after.find("</arg_value>")?;
        pairs.push((key, after[..value_end].to_string()));
        rest = &after[value_end + "</arg_value>".len()..];
    }
    if !rest.trim().is_empty() {
        return None;
    }
    Some(Call { arguments: schema.arguments(name, &pairs), name: name.to_string() })
}

/// The invoke/parameter syntaxes: MiniMax-M2's and DeepSeek-V3.2's DSML,
/// which differ in their markers and in DSML's `string` attribute.
struct Invocations {
    open: &'static str,
    close: &'static str,
    invoke: &'static str,
    invoke_end: &'static str,
    parameter: &'static str,
    parameter_end: &'static str,
}

/// MiniMax-M2: `<minimax:tool_call>` holding `<invoke name="NAME">` with
/// `<parameter name="KEY">VALUE</parameter>`s.
const MINIMAX: Invocations = Invocations {
    open: "<minimax:tool_call>",
    close: "</minimax:tool_call>",
    invoke: "<invoke name=",
    invoke_end: "</invoke>",
    parameter: "<parameter name=",
    parameter_end: "</parameter>",
};

/// DeepSeek-V3.2: `<｜DSML｜function_calls>` holding `<｜DSML｜invoke
/// name="NAME">` with `<｜DSML｜parameter name="KEY" string="true|false">`:
/// `true` marks the value as text, `false` as JSON.
const DSML: Invocations = Invocations {
    open: "<｜DSML｜function_calls>",
    close: "</｜DSML｜function_calls>",
    invoke: "<｜DSML｜invoke name=",
    invoke_end: "</｜DSML｜invoke>",
    parameter: "<｜DSML｜parameter name=",
    parameter_end: "</｜DSML｜parameter>",
};

/// DeepSeek-V4: the same invocations in a `<｜DSML｜tool_calls>` block.
const DSML_V4: Invocations = Invocations { open: "<｜DSML｜tool_calls>", close: "</｜DSML｜tool_calls>", ..DSML };

pub(super) fn parse_minimax(text: &str, schema: &Schema) -> Option<Parsed> {
    parse_invocations(&MINIMAX, text, schema)
}

pub(super) fn parse_dsml(text: &str, schema: &Schema) -> Option<Parsed> {
    parse_invocations(&DSML, text, schema).or_else(|| parse_invocations(&DSML_V4, text, schema))
}

fn parse_invocations(syntax: &Invocations, text: &str, schema: &Schema) -> Option<Parsed> {
    let first = text.find(syntax.open)?;
    let mut calls = Vec::new();
    let mut rest = &text[first..];
    while let Some(start) = rest.find(syntax.open) {
        let body = &rest[start + syntax.open.len()..];
        let (mut inner, after) = match body.find(syntax.close) {
            Some(end) => (&body[..end], &body[end + syntax.close.len()..]),
            None => (body, ""),
        };
        while let Some(at) = inner.find(syntax.invoke) {
            let (name, after_name) = quoted(&inner[at + syntax.invoke.len()..])?;
            let after_name = after_name.strip_prefix('>')?;
            let end = after_name.find(syntax.invoke_end)?;
            let mut params = &after_name[..end];
            let mut args = serde_json::Map::new();
            while let Some(p) = params.find(syntax.parameter) {
                let (key, after_key) = quoted(&params[p + syntax.parameter.len()..])?;
                let (as_text, after_key) = match after_key.strip_prefix(" string=") {
                    Some(attr) => {
                        let (flag, after) = quoted(attr)?;
                        (Some(flag == "true"), after)
                    }
                    None => (None, after_key),
                };
                let after_key = after_key.strip_prefix('>')?;
                let value_end = after_key.find(syntax.parameter_end)?;
                let value = &after_key[..value_end];
                let value = match as_text {
                    Some(true) => serde_json::Value::String(value.to_string()),
                    Some(false) => serde_json::from_str(value.trim()).ok()?,
                    None => schema.value(&name, &key, value),
                };
                args.insert(key, value);
                params = &after_key[value_end + syntax.parameter_end.len()..];
            }
            calls.push(Call { arguments: serde_json::Value::Object(args).to_string(), name });
            inner = &after_name[end + syntax.invoke_end.len()..];
        }
        rest = after;
    }
    if calls.is_empty() {
        return None;
    }
    Some(Parsed { content: leading(text, first), reasoning: None, calls })
}

/// `"value"` at the start of `s`: the value and what follows the quote.
fn quoted(s: &str) -> Option<(String, &str)> {
    let s = s.strip_prefix('"')?;
    let end = s.find('"')?;
    Some((s[..end].to_string(), &s[end + 1..]))
}
