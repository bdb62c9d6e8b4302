//! A forced tool call (OpenAI `tool_choice` "required" or a named
//! function, Anthropic `any` / `tool`) as a grammar: the call in the
//! model's own syntax, its arguments valid against the tool's schema.
//!
//! The syntax is read off the model's chat template rather than listed per
//! model: the template renders a probe conversation whose last assistant
//! turn makes one call with known arguments, and the text it adds after
//! the generation prompt is the call's shape. Where the arguments are one
//! JSON text, that is what precedes the JSON (the `<tool_call>` tag,
//! harmony's `to=functions.NAME` header, DeepSeek's markers), the JSON
//! itself (the arguments, or a `{"name", "arguments"}` wrapper as Hermes
//! writes it) and what follows it, up to the end of the turn. Where each
//! argument is tagged text (the XML syntaxes of Qwen3-Coder and Qwen3.5,
//! GLM, MiniMax-M2, DeepSeek's DSML), [`xml`] reads the tags around a key
//! and a value from renderings with two arguments, a number and none.
//!
//! A reasoning model may think first: where the template shows reasoning
//! before a call (a `</think>` in the probe's prefix, or harmony's analysis
//! channel), whatever precedes the call's opening marker is free text,
//! ended lazily at the first marker. Elsewhere the call comes first. A
//! marker made of special tokens (harmony's real `<|channel|>`) cannot be
//! matched inside free text; then too the call comes first.

use serde_json::{json, Map, Value};

use crate::chat::{ChatMessage, ChatTemplate};
use crate::tokenizer::Tokenizer;

mod xml;

const PROBE_NAME: &str = "waste_probe_function";
/// Two parameters (named so that any key order, the call's or a sorted
/// one, renders them alike), so the text between two parameters shows.
const PROBE_KEY: &str = "waste_probe_a";
const PROBE_VALUE: &str = "waste probe value";
const PROBE_KEY_2: &str = "waste_probe_b";
const PROBE_VALUE_2: &str = "waste second value";
/// A value that is not text, to see how the template writes one.
const PROBE_NUMBER: i64 = 7_654_321;
/// An answer without calls, to see how the template ends a turn.
const PROBE_ANSWER: &str = "waste probe answer";

/// Why a forced call cannot be a grammar.
#[derive(Debug, PartialEq)]
pub enum ToolGrammarError {
    /// The request is wrong (no such tool, tools not a list).
    Invalid(String),
    /// The template's call syntax cannot be found or constrained.
    Unsupported(String),
}

fn unsupported(why: &str) -> ToolGrammarError {
    ToolGrammarError::Unsupported(format!("a forced tool call cannot be constrained: {why}"))
}

/// How the call's JSON holds the arguments.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Shape {
    /// The JSON is the arguments object.
    Arguments,
    /// `{"name": NAME, KEY: arguments}`; `name_first` keeps the template's order.
    Wrapper { key: &'static str, name_first: bool },
}

/// A call whose arguments are one JSON text, as the template writes it.
#[derive(Debug, PartialEq)]
struct JsonSyntax {
    prefix: String,
    shape: Shape,
    suffix: String,
    /// The model may reason before the call.
    reasons: bool,
}

/// The call syntaxes a probe can find.
#[derive(Debug, PartialEq)]
enum Syntax {
    Json(JsonSyntax),
    /// Each argument its own tagged text (the XML syntaxes).
    Text(xml::TextSyntax),
}

/// Renders the probe conversation: a user turn, then an assistant turn
/// calling the probe function with given arguments.
struct Probe<'a> {
    template: &'a ChatTemplate,
    vars: Option<&'a str>,
    tools: String,
    user: ChatMessage,
}

impl<'a> Probe<'a> {
    fn new(template: &'a ChatTemplate, vars: Option<&'a str>) -> Self {
        let tools = json!([{"type": "function", "function": {"name": PROBE_NAME, "description": "probe",
            "parameters": {"type": "object", "properties": {PROBE_KEY: {"type": "string"}, PROBE_KEY_2: {"type": "string"}},
            "required": [PROBE_KEY, PROBE_KEY_2]}}}])
        .to_string();
        let user = ChatMessage { role: "user".into(), content: Some("probe".into()), ..Default::default() };
        Probe { template, vars, tools, user }
    }

    /// The text the assistant's call turn adds after the generation
    /// prompt, less what ends every assistant turn: the grammar ends with
    /// the call, and the model's own end of turn follows (as a token, or
    /// as text where the tokenizer has no token for the template's).
    fn turn(&self, arguments: &Value) -> Result<String, ToolGrammarError> {
        let call = json!({"tool_calls": [{"id": "call_0", "type": "function",
            "function": {"name": PROBE_NAME, "arguments": arguments}}]});
        let turn = self.assistant_turn(String::new(), Some(call.to_string()))?;
        let answer = self.assistant_turn(PROBE_ANSWER.into(), None)?;
        let end = answer.rfind(PROBE_ANSWER).map_or("", |at| &answer[at + PROBE_ANSWER.len()..]);
        Ok(turn.strip_suffix(end).filter(|_| !end.is_empty()).unwrap_or(&turn).to_string())
    }

    /// What an assistant turn of `content` (and `extra`: its calls) adds
    /// after the generation prompt.
    fn assistant_turn(&self, content: String, extra: Option<String>) -> Result<String, ToolGrammarError> {
        let refused = |e: String| unsupported(&format!("the chat template refused the probe: {e}"));
        let assistant = ChatMessage { role: "assistant".into(), content: Some(content), extra, ..Default::default() };
        let tools = Some(self.tools.as_str());
        let open = self
            .template
            .render_with_vars(std::slice::from_ref(&self.user), tools, true, self.vars)
            .map_err(refused)?;
        let with_call = self
            .template
            .render_with_vars(&[self.user.clone(), assistant], tools, false, self.vars)
            .map_err(refused)?;
        if let Some(turn) = with_call.strip_prefix(open.as_str()) {
            return Ok(turn.to_string());
        }
        past_reasoning(&open, &with_call)
            .ok_or_else(|| unsupported("the template's assistant turn does not continue its generation prompt"))
    }
}

/// The turn the model writes, for a template whose past turns differ from
/// its generation prompt in their reasoning alone: the prompt opens a think
/// block (MiniMax-M2: `<think>\n`) or writes an empty one (DeepSeek-V3.2
/// with thinking off: `<think></think>`), while a past call is rendered
/// without its reasoning. An open block is the model's to close before the
/// call; after a closed one the call comes first.
fn past_reasoning(open: &str, with_call: &str) -> Option<String> {
    let mut common = xml::common_prefix(open, with_call);
    // Not inside a tag: `<think>` and `</think>` share their `<`.
    if let Some(lt) = open[..common].rfind('<').filter(|&lt| !open[lt..common].contains('>')) {
        common = lt;
    }
    let prompt_rest = open[common..].trim();
    let call_rest = &with_call[common..];
    let call = call_rest.rfind("</think>").map_or(call_rest, |at| &call_rest[at + "</think>".len()..]);
    let thinking = prompt_rest.strip_prefix("<think>")?;
    if thinking.trim().is_empty() {
        Some(format!("</think>{call}"))
    } else if thinking.trim() == "</think>" {
        Some(call.to_string())
    } else {
        None
    }
}

/// Finds the call in the template's rendering of the probe conversation.
fn syntax(
    template: &ChatTemplate,
    tok: &Tokenizer,
    eos: &[u32],
    vars: Option<&str>,
) -> Result<Syntax, ToolGrammarError> {
    let probe = Probe::new(template, vars);
    let args = json!({PROBE_KEY: PROBE_VALUE, PROBE_KEY_2: PROBE_VALUE_2});
    let turn = probe.turn(&args)?;
    if turn.contains("<|channel|>") && turn.contains("to=functions.") {
        // Harmony (gpt-oss): its template renders a past call with the
        // recipient in the role header, but the model writes it in the
        // channel header, as OpenAI's harmony format documents it (and as
        // tools/harmony.rs in the server parses it).
        let prefix = format!("<|channel|>commentary to=functions.{PROBE_NAME} <|constrain|>json<|message|>");
        let suffix = until_end_of_turn("<|call|>", tok, eos);
        return Ok(Syntax::Json(JsonSyntax { prefix, shape: Shape::Arguments, suffix, reasons: true }));
    }
    for (at, _) in turn.match_indices('{') {
        let mut values = serde_json::Deserializer::from_str(&turn[at..]).into_iter::<Value>();
        let Some(Ok(value)) = values.next() else { continue };
        let end = at + values.byte_offset();
        let shape = if value == args {
            Shape::Arguments
        } else {
            let Some(obj) = value.as_object().filter(|o| o.get("name") == Some(&Value::from(PROBE_NAME))) else {
                continue;
            };
            let Some(key) = ["arguments", "parameters"].into_iter().find(|k| obj.get(*k) == Some(&args)) else {
                continue;
            };
            Shape::Wrapper { key, name_first: obj.keys().next().is_some_and(|k| k == "name") }
        };
        let suffix = until_end_of_turn(&turn[end..], tok, eos);
        let prefix = turn[..at].to_string();
        let reasons = prefix.contains("</think>");
        return Ok(Syntax::Json(JsonSyntax { prefix, shape, suffix, reasons }));
    }
    let with_number = probe.turn(&json!({PROBE_KEY: PROBE_NUMBER, PROBE_KEY_2: PROBE_VALUE_2}))?;
    let without_arguments = probe.turn(&json!({}))?;
    xml::TextSyntax::find(&turn, &with_number, &without_arguments, tok, eos).map(Syntax::Text)
}

/// `text` up to the first end-of-sequence token in it: the grammar ends
/// there, and the model's own end of turn may follow.
fn until_end_of_turn(text: &str, tok: &Tokenizer, eos: &[u32]) -> String {
    let ids = tok.encode_markup(text);
    let cut = ids.iter().position(|t| eos.contains(t)).unwrap_or(ids.len());
    tok.decode_bytes(&ids[..cut]).ok().and_then(|b| String::from_utf8(b).ok()).unwrap_or_else(|| text.to_string())
}

/// The call's own opening: the probe's prefix past the reasoning the
/// template wrote before it (an empty think block), without leading
/// whitespace.
fn opening_marker(prefix: &str) -> &str {
    let after = prefix.rfind("</think>").map_or(prefix, |at| &prefix[at + "</think>".len()..]);
    after.trim_start()
}

/// `text` as a regular expression matching exactly it.
fn regex_literal(text: &str) -> String {
    text.chars().map(|c| format!("\\x{{{:x}}}", c as u32)).collect()
}

/// Lark for literal text: special tokens by id (they are tokens, not text
/// a grammar can spell), the rest as JSON-escaped strings.
fn lark_text(text: &str, tok: &Tokenizer) -> String {
    let mut parts = Vec::new();
    let mut run: Vec<u32> = Vec::new();
    let flush = |run: &mut Vec<u32>, parts: &mut Vec<String>| {
        if !run.is_empty() {
            let bytes = tok.decode_bytes(run).unwrap_or_default();
            let s = String::from_utf8_lossy(&bytes).into_owned();
            parts.push(serde_json::to_string(&s).unwrap_or_default().replace('\u{7f}', "\\u007f"));
            run.clear();
        }
    };
    for id in tok.encode_markup(text) {
        if tok.is_special(id) {
            flush(&mut run, &mut parts);
            parts.push(format!("<[{id}]>"));
        } else {
            run.push(id);
        }
    }
    flush(&mut run, &mut parts);
    parts.join(" ")
}

/// The Lark grammar of one call to `name` (or to any of `tools`), in the
/// syntax `template` renders. `tools` is the JSON array the prompt was
/// rendered with (OpenAI's shape); `vars` the template variables.
pub fn lark(
    template: &ChatTemplate,
    tok: &Tokenizer,
    eos: &[u32],
    tools: &str,
    name: Option<&str>,
    vars: Option<&str>,
) -> Result<String, ToolGrammarError> {
    let list: Vec<Value> = serde_json::from_str(tools)
        .map_err(|e| ToolGrammarError::Invalid(format!("the tools are not a JSON list: {e}")))?;
    let mut chosen = Vec::new();
    for t in &list {
        let f = t.get("function").unwrap_or(t);
        let Some(n) = f.get("name").and_then(Value::as_str) else { continue };
        if name.is_none_or(|want| want == n) {
            let params =
                f.get("parameters").filter(|p| p.is_object()).cloned().unwrap_or_else(|| json!({"type": "object"}));
            chosen.push((n.to_string(), params));
        }
    }
    if chosen.is_empty() {
        return Err(ToolGrammarError::Invalid(match name {
            Some(n) => format!("no tool named {n:?} is declared"),
            None => "no tool is declared".into(),
        }));
    }
    let syntax = syntax(template, tok, eos, vars)?;
    let mut out =
        format!("start: {}\n", (0..chosen.len()).map(|i| format!("call_{i}")).collect::<Vec<_>>().join(" | "));
    let mut rules = String::new();
    for (i, (n, params)) in chosen.iter().enumerate() {
        let body = match &syntax {
            Syntax::Json(json) => json.call(i, n, params, tok, &mut rules),
            Syntax::Text(text) => text.call(i, n, params, tok, &mut rules),
        };
        out.push_str(&format!("call_{i}: {body}\n"));
    }
    out.push_str(&rules);
    Ok(out)
}

impl JsonSyntax {
    /// The right-hand side of the rule of one call to `name`.
    fn call(&self, i: usize, name: &str, params: &Value, tok: &Tokenizer, rules: &mut String) -> String {
        let schema = match self.shape {
            Shape::Arguments => params.clone(),
            Shape::Wrapper { key, name_first } => {
                let mut props = Map::new();
                let name_schema = json!({"const": name});
                if name_first {
                    props.insert("name".into(), name_schema);
                    props.insert(key.into(), params.clone());
                } else {
                    props.insert(key.into(), params.clone());
                    props.insert("name".into(), name_schema);
                }
                let order: Vec<&String> = props.keys().collect();
                json!({"type": "object", "properties": props, "required": order, "additionalProperties": false})
            }
        };
        let opening = opening(i, &self.prefix, self.reasons, name, tok, rules);
        let suffix = lark_text(&self.suffix.replace(PROBE_NAME, name), tok);
        format!("{opening} %json {} {suffix}", compact(schema))
    }
}

/// `schema` with one optional space between JSON tokens: templates write
/// calls as `{"name": "f", "arguments": {"a": 1}}` (tojson's separators),
/// so a model writes them so; more would let it pad forever.
fn compact(mut schema: Value) -> Value {
    if let Value::Object(m) = &mut schema {
        m.entry("x-guidance").or_insert_with(|| json!({"whitespace_pattern": "\\x20"}));
    }
    schema
}

/// The call's opening for call `i` to `name`: its marker, or, where the
/// model may reason first, free text ended lazily at the marker (a rule
/// added to `rules`). Where the generation prompt opened the think block
/// (the probe's call turn closes one it did not open: Qwen3.5, MiniMax-M2),
/// the free text must close it, or the answer would be all reasoning. A
/// marker made of special tokens cannot end free text: the call then comes
/// first.
fn opening(i: usize, prefix: &str, reasons: bool, name: &str, tok: &Tokenizer, rules: &mut String) -> String {
    let marker = opening_marker(prefix).replace(PROBE_NAME, name);
    if !reasons || tok.encode_markup(&marker).iter().any(|&t| tok.is_special(t)) {
        return lark_text(&marker, tok);
    }
    let close = match prefix.find("</think>") {
        Some(at) if !prefix[..at].contains("<think>") => format!("{}\\s*", regex_literal("</think>")),
        _ => String::new(),
    };
    rules.push_str(&format!("before_{i}[lazy]: /(?s:.*){close}{}/\n", regex_literal(&marker)));
    format!("before_{i}")
}

#[cfg(test)]
mod tests;
