//! Tool calls in a model's output, in the syntax its chat template asks
//! for, turned into OpenAI's `tool_calls`:
//!
//! * Hermes JSON (Qwen2.5, Qwen3): `<tool_call>{"name": .., "arguments": {..}}</tool_call>`;
//! * Qwen3-Coder and Qwen3.5 XML: `<tool_call><function=NAME><parameter=KEY>VALUE</parameter>..</function></tool_call>`;
//! * GLM-4.5 / 4.6: `<tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>..</tool_call>`;
//! * MiniMax-M2: `<minimax:tool_call><invoke name="NAME"><parameter name="KEY">VALUE</parameter>..</invoke></minimax:tool_call>`;
//! * DeepSeek-V3.2's DSML: `<｜DSML｜function_calls><｜DSML｜invoke name="NAME"><｜DSML｜parameter name="KEY" string="true|false">VALUE</｜DSML｜parameter>..`,
//!   and DeepSeek-V4's, the same in a `<｜DSML｜tool_calls>` block
//!   (GLM-5 writes GLM-4.5's syntax);
//! * gpt-oss's harmony channels: `analysis` is the reasoning, a
//!   `commentary` message to `functions.NAME` a call, `final` the answer;
//!
//! and reasoning in `<think>` blocks ([`think`]), which the other reasoning
//! families write before their content and calls.
//!
//! Each syntax is told by its own markers, so no per-model switch is
//! needed; the XML syntaxes carry every value as text, which becomes a JSON
//! string or, where the tool's schema declares another type, that JSON
//! value. Of the other templates in tests/fixtures/chat_templates,
//! DeepSeek-V3's renders calls in its own `<｜tool▁call▁begin｜>` syntax (not
//! parsed here), Kimi-K2's declares tools but renders no calls, and
//! Mixtral's and OLMoE's (Tulu) know no tools.

mod harmony;
mod hermes;
pub(crate) mod think;
mod xml;

use serde_json::{json, Map, Value};

/// One call: the function's name and its arguments as JSON text.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub name: String,
    pub arguments: String,
}

/// An answer split into what the user reads, the model's reasoning and
/// its calls.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Parsed {
    pub content: Option<String>,
    pub reasoning: Option<String>,
    pub calls: Vec<Call>,
}

impl Parsed {
    /// The calls in OpenAI's shape, ids derived from the answer's.
    pub fn calls_json(&self, id: &str) -> Value {
        Value::Array(
            self.calls
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    json!({"id": format!("call_{id}_{i}"), "type": "function",
                           "function": {"name": c.name, "arguments": c.arguments}})
                })
                .collect(),
        )
    }
}

/// The declared JSON type of each tool parameter, from the request's
/// `tools` (for the syntaxes that write values as text).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Schema {
    /// (function, parameter, JSON schema `type`).
    types: Vec<(String, String, String)>,
}

impl Schema {
    /// From the request's `tools` JSON text; what it cannot read it leaves
    /// out (a parameter of unknown type is then text).
    pub fn from_tools(tools: &str) -> Schema {
        let mut types = Vec::new();
        let Ok(Value::Array(list)) = serde_json::from_str::<Value>(tools) else {
            return Schema::default();
        };
        for t in &list {
            let f = t.get("function").unwrap_or(t);
            let (Some(name), Some(Value::Object(props))) =
                (f.get("name").and_then(Value::as_str), f.pointer("/parameters/properties"))
            else {
                continue;
            };
            for (param, spec) in props {
                if let Some(ty) = spec.get("type").and_then(Value::as_str) {
                    types.push((name.to_string(), param.clone(), ty.to_string()));
                }
            }
        }
        Schema { types }
    }

    fn type_of(&self, function: &str, param: &str) -> Option<&str> {
        self.types.iter().find(|(f, p, _)| f == function && p == param).map(|(_, _, t)| t.as_str())
    }

    /// A value written as text, as the JSON its parameter's type asks for:
    /// a string for `string` (and for text no JSON reading fits), else the
    /// JSON the text spells (`42`, `true`, `{"a": 1}`).
    fn value(&self, function: &str, param: &str, text: &str) -> Value {
        match self.type_of(function, param) {
            Some("string") => Value::String(text.to_string()),
            _ => match serde_json::from_str::<Value>(text.trim()) {
                Ok(v) if !v.is_string() => v,
                _ => Value::String(text.to_string()),
            },
        }
    }

    /// The arguments object of a call written as (key, text) pairs.
    fn arguments(&self, function: &str, pairs: &[(String, String)]) -> String {
        let mut m = Map::new();
        for (k, v) in pairs {
            m.insert(k.clone(), self.value(function, k, v));
        }
        Value::Object(m).to_string()
    }
}

/// Arguments given as JSON (Hermes, harmony), compacted as the server
/// writes all JSON; text that is not JSON stays as it is.
fn compact_json(text: &str) -> String {
    match serde_json::from_str::<Value>(text.trim()) {
        Ok(Value::String(s)) => s,
        Ok(v) => v.to_string(),
        Err(_) => text.trim().to_string(),
    }
}

/// The answer's calls, content and reasoning, or None when it holds no
/// well-formed call (and, for harmony, no channels), so it stays plain
/// text. `text` is the answer as the user sees it (special tokens left
/// out), `raw` the same tokens with them (harmony's channels are special
/// tokens).
pub fn parse(text: &str, raw: &str, schema: &Schema) -> Option<Parsed> {
    if let Some(p) = harmony::parse(raw) {
        return Some(p);
    }
    xml::parse_minimax(text, schema)
        .or_else(|| xml::parse_dsml(text, schema))
        .or_else(|| xml::parse_tool_call_tags(text, schema))
}

/// The text before a syntax's first marker, None when blank.
fn leading(text: &str, at: usize) -> Option<String> {
    let before = text[..at].trim();
    (!before.is_empty()).then(|| before.to_string())
}

#[cfg(test)]
mod tests;
