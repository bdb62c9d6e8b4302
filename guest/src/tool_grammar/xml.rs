//! Calls whose arguments are tagged text, one element per argument:
//! Qwen3-Coder's and Qwen3.5's `<parameter=KEY>`, GLM's `<arg_key>` /
//! `<arg_value>`, MiniMax-M2's and DeepSeek's DSML `<parameter name="KEY">`.
//!
//! The shape comes from three renderings of the probe call: two text
//! arguments (what precedes a key, what lies between a key and its value,
//! what separates two arguments, what closes the call), one whose first
//! value is a number (DSML marks a JSON value `string="false"`), and none
//! (the call without arguments). What separates two arguments is the end
//! of one (`after_value`) and the start of the next (`before_key`): the
//! longest text it shares with what closes the call is taken as the end of
//! a value. Where the split falls does not change the language, only
//! where a text value ends, which is the first `after_value` after it.
//!
//! The grammar writes the tool's parameters in the schema's order, each
//! required one once and each optional one at most once. A parameter the
//! server's parser reads as text (`type: string`, a string enum, or no
//! type at all) is free text up to `after_value`, held to its enum, its
//! pattern or its length where the schema gives them; any other is JSON
//! valid against its schema.

use serde_json::Value;

use super::{
    compact, lark_text, opening, regex_literal, unsupported, until_end_of_turn, ToolGrammarError, PROBE_KEY,
    PROBE_KEY_2, PROBE_NAME, PROBE_NUMBER, PROBE_VALUE, PROBE_VALUE_2,
};
use crate::tokenizer::Tokenizer;

/// The longest text length a `minLength` / `maxLength` becomes a counted
/// repetition for; past it the count would bloat the lexer, and the value
/// is only held to end at `after_value`.
const MAX_COUNTED_LENGTH: u64 = 256;

/// A call as the template writes it, the function's name as the probe's.
#[derive(Debug, PartialEq)]
pub(super) struct TextSyntax {
    /// Up to the first argument's key, less `before_key`.
    prefix: String,
    before_key: String,
    /// Between a key and a value written as text.
    before_text: String,
    /// Between a key and a value written as JSON (DSML's `string="false"`),
    /// where the template tells them apart.
    before_json: Option<String>,
    /// After each value: it ends a text value.
    after_value: String,
    /// After the last argument's `after_value`, to the end of the call.
    suffix: String,
    /// The whole call without arguments.
    empty: String,
    /// The model may reason before the call.
    reasons: bool,
}

/// The byte ranges of `needles` in `text`, each found after the one before.
fn spans<const N: usize>(text: &str, needles: [&str; N]) -> Option<[std::ops::Range<usize>; N]> {
    let mut from = 0;
    let mut out = std::array::from_fn(|_| 0..0);
    for (slot, needle) in out.iter_mut().zip(needles) {
        let at = from + text[from..].find(needle)?;
        *slot = at..at + needle.len();
        from = slot.end;
    }
    Some(out)
}

/// The length in bytes of the longest common prefix of `a` and `b`, on a
/// character boundary.
pub(super) fn common_prefix(a: &str, b: &str) -> usize {
    a.char_indices().zip(b.chars()).find(|((_, x), y)| x != y).map_or(a.len().min(b.len()), |((at, _), _)| at)
}

impl TextSyntax {
    /// The shape from the probe's renderings: `two` calls with two text
    /// arguments, `with_number` with a number first, `empty` with none.
    pub(super) fn find(
        two: &str,
        with_number: &str,
        empty: &str,
        tok: &Tokenizer,
        eos: &[u32],
    ) -> Result<TextSyntax, ToolGrammarError> {
        let unreadable =
            || unsupported("the chat template's call shows neither JSON arguments nor each argument's key and value");
        let [k1, v1, k2, v2] =
            spans(two, [PROBE_KEY, PROBE_VALUE, PROBE_KEY_2, PROBE_VALUE_2]).ok_or_else(unreadable)?;
        let before_text = &two[k1.end..v1.start];
        if &two[k2.end..v2.start] != before_text {
            return Err(unsupported("the chat template writes its two arguments differently"));
        }
        let between = &two[v1.end..k2.start];
        let close = until_end_of_turn(&two[v2.end..], tok, eos);
        let shared = common_prefix(between, &close);
        let (after_value, before_key) = between.split_at(shared);
        if after_value.trim().is_empty() {
            return Err(unsupported("nothing in the chat template's call marks where an argument's value ends"));
        }
        if tok.encode_markup(after_value).iter().any(|&t| tok.is_special(t)) {
            return Err(unsupported("an argument's value ends at a special token, which free text cannot match"));
        }
        let open = &two[..k1.start];
        let prefix = open.strip_suffix(before_key).ok_or_else(unreadable)?;
        let number = PROBE_NUMBER.to_string();
        let before_json = spans(with_number, [PROBE_KEY, number.as_str()])
            .filter(|[_, n]| with_number[n.end..].starts_with(between))
            .map(|[k, n]| with_number[k.end..n.start].to_string());
        Ok(TextSyntax {
            prefix: prefix.to_string(),
            before_key: before_key.to_string(),
            before_text: before_text.to_string(),
            before_json,
            after_value: after_value.to_string(),
            suffix: close[shared..].to_string(),
            empty: until_end_of_turn(empty, tok, eos),
            reasons: open.contains("</think>"),
        })
    }

    /// The right-hand side of the rule of call `i` to `name`, whose
    /// parameters' schema is `params`; the rules it needs go to `rules`.
    pub(super) fn call(&self, i: usize, name: &str, params: &Value, tok: &Tokenizer, rules: &mut String) -> String {
        let props = params.get("properties").and_then(Value::as_object).filter(|p| !p.is_empty());
        let Some(props) = props else {
            return opening(i, &self.empty, self.reasons, name, tok, rules);
        };
        let required: Vec<&str> =
            params.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
        let mut parts = vec![opening(i, &self.prefix, self.reasons, name, tok, rules)];
        for (j, (key, schema)) in props.iter().enumerate() {
            let arg = format!("arg_{i}_{j}");
            let value = if written_as_text(schema) {
                let text = format!("text_{i}_{j}");
                let pattern = format!("{}{}", text_regex(schema), regex_literal(&self.after_value));
                rules.push_str(&format!("{text}[lazy]: /{}/\n", pattern.replace('/', "\\/")));
                join(&[lark_text(&self.before_text, tok), text])
            } else {
                let before = self.before_json.as_deref().unwrap_or(&self.before_text);
                let schema = compact(with_definitions(schema, params));
                join(&[lark_text(before, tok), format!("%json {schema}"), lark_text(&self.after_value, tok)])
            };
            rules.push_str(&format!(
                "{arg}: {}\n",
                join(&[lark_text(&self.before_key, tok), lark_text(key, tok), value])
            ));
            parts.push(if required.contains(&key.as_str()) { arg } else { format!("{arg}?") });
        }
        parts.push(lark_text(&self.suffix.replace(PROBE_NAME, name), tok));
        join(&parts)
    }
}

/// Lark items in sequence, empty ones (an empty literal) left out.
fn join(items: &[String]) -> String {
    items.iter().filter(|s| !s.is_empty()).cloned().collect::<Vec<_>>().join(" ")
}

/// The strings a schema allows when it allows only listed strings.
fn string_options(schema: &Value) -> Option<Vec<&str>> {
    if let Some(c) = schema.get("const") {
        return c.as_str().map(|s| vec![s]);
    }
    let list = schema.get("enum")?.as_array()?;
    list.iter().map(Value::as_str).collect::<Option<Vec<_>>>().filter(|l| !l.is_empty())
}

/// Whether the server reads this parameter's value as text (tools/mod.rs,
/// `Schema::value`): declared a string, a list of strings, or untyped
/// (then text is what the templates show; a value that reads as a number
/// still becomes one).
fn written_as_text(schema: &Value) -> bool {
    match schema.get("type") {
        Some(Value::String(t)) => t == "string",
        Some(_) => false,
        None if string_options(schema).is_some() => true,
        None => !["enum", "const", "anyOf", "oneOf", "allOf", "properties", "items", "$ref"]
            .iter()
            .any(|k| schema.get(k).is_some()),
    }
}

/// A regular expression for a text value: its listed strings, its pattern
/// (JSON Schema's patterns match anywhere unless anchored) or its length.
fn text_regex(schema: &Value) -> String {
    if let Some(options) = string_options(schema) {
        return format!("(?:{})", options.iter().map(|o| regex_literal(o)).collect::<Vec<_>>().join("|"));
    }
    if let Some(p) = schema.get("pattern").and_then(Value::as_str) {
        return match p.strip_prefix('^').and_then(|p| p.strip_suffix('$')) {
            Some(inner) => format!("(?:{inner})"),
            None => format!("(?s:.*)(?:{p})(?s:.*)"),
        };
    }
    let min = schema.get("minLength").and_then(Value::as_u64).unwrap_or(0);
    match schema.get("maxLength").and_then(Value::as_u64) {
        Some(max) if max <= MAX_COUNTED_LENGTH && min <= max => format!("(?s:.{{{min},{max}}})"),
        _ if min > 0 && min <= MAX_COUNTED_LENGTH => format!("(?s:.{{{min},}})"),
        _ => "(?s:.*)".to_string(),
    }
}

/// A parameter's schema with the tool's definitions, which its `$ref`s
/// name from the root of the tool's schema.
fn with_definitions(schema: &Value, params: &Value) -> Value {
    let mut schema = schema.clone();
    if let Value::Object(m) = &mut schema {
        for key in ["$defs", "definitions"] {
            if let Some(d) = params.get(key) {
                m.entry(key).or_insert_with(|| d.clone());
            }
        }
    }
    schema
}
