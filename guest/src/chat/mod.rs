//! Chat templates: the checkpoint's own Jinja `chat_template`, rendered with
//! minijinja the way transformers' `apply_chat_template` renders it, and
//! split into segments so message content can never forge a control token.
//!
//! Environment, as in transformers: `trim_blocks` and `lstrip_blocks`, loop
//! controls, Python string/dict/list methods (minijinja-contrib pycompat),
//! `raise_exception(msg)`, `strftime_now(fmt)`, and `tojson` with Python's
//! `json.dumps` output (`indent`, `separators`, `sort_keys`, `ensure_ascii`).
//! Variables: `messages`, `tools`, `add_generation_prompt`, the special
//! tokens of tokenizer_config.json (`bos_token`, `eos_token`, ...) and the
//! caller's extra variables (`enable_thinking`, ...), which override the
//! special tokens as apply_chat_template's keyword arguments do.
//!
//! Segmentation: the template is rendered twice, once with the real
//! messages (text A, the reference rendering) and once with every message's
//! `content` and `reasoning_content` replaced by a unique marker (text B).
//! When B with the markers replaced by the contents equals A, the text
//! between markers is template markup and the markers are content: exact.
//! Templates that transform content (Qwen3 strips `<think>` blocks from old
//! assistant turns, others `trim`) make B differ from A; then A is aligned
//! against B's markup pieces in order, each gap being the longest substring
//! of its message's content that lets the next markup piece follow. If that
//! fails the call errors rather than guess. Limits: strings other than
//! content and reasoning_content (tool call arguments, tool definitions,
//! names) are rendered as markup, so they are trusted like the template; a
//! template that branches on the content's exact text renders B through the
//! other branch and falls back to the alignment.

use std::sync::Arc;

use minijinja::value::{Object, ObjectRepr, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};

mod strftime;
mod tojson;

use crate::tokenizer::Segment;
pub use strftime::strftime;
use strftime::strftime_now;
use tojson::tojson;

/// Message fields treated as content (never markup); `thinking` is
/// transformers' copy of `reasoning_content`.
const CONTENT_FIELDS: &[&str] = &["content", "reasoning_content", "thinking"];
/// Marker delimiters: supplementary private-use characters, which neither
/// templates nor tokenizer files use.
const MARK_OPEN: char = '\u{F0000}';
const MARK_CLOSE: char = '\u{F0001}';
/// Special-token variables transformers passes to the template.
const SPECIAL_KEYS: &[&str] =
    &["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"];

#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatMessage {
    pub role: String,
    /// None: the message has no `content` field (an assistant turn with
    /// only tool calls), as transformers passes a null content.
    pub content: Option<String>,
    /// Further fields as a JSON object (`tool_calls`, `name`,
    /// `tool_call_id`, `reasoning_content`, ...), key order kept.
    pub extra: Option<String>,
    /// Prompt text of each image in the message, rendered before the
    /// content as markup (WIT `chat-message.media`).
    pub media: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct ChatTemplate {
    source: String,
    /// (variable, value) from tokenizer_config.json.
    specials: Vec<(String, Value)>,
    /// What `strftime_now` reads as now (Unix seconds); None: the clock.
    now: Option<i64>,
}

fn json_err(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

/// A special token in tokenizer_config.json: a string or an AddedToken
/// object `{"content": ..}`.
fn token_text(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content").and_then(|c| c.as_str()).map(str::to_owned),
        _ => None,
    }
}

impl ChatTemplate {
    pub fn new(source: impl Into<String>, tokenizer_config: Option<&str>) -> Result<ChatTemplate, String> {
        let mut specials = Vec::new();
        if let Some(cfg) = tokenizer_config {
            let v: serde_json::Value =
                serde_json::from_str(cfg).map_err(|e| json_err("tokenizer_config.json: invalid JSON", e))?;
            for key in SPECIAL_KEYS {
                if let Some(t) = v.get(*key).and_then(token_text) {
                    specials.push((key.to_string(), Value::from(t)));
                }
            }
            if let Some(list) = v.get("additional_special_tokens").and_then(|l| l.as_array()) {
                let list: Vec<Value> = list.iter().filter_map(token_text).map(Value::from).collect();
                specials.push(("additional_special_tokens".into(), Value::from(list)));
            }
        }
        let t = ChatTemplate { source: without_generation_tags(&source.into()), specials, now: None };
        // Compile once now so a broken template is reported when loaded.
        t.env().template_from_str(&t.source).map_err(|e| format!("chat template: {}", describe(&e)))?;
        Ok(t)
    }

    /// The template with `strftime_now` pinned to `unix_secs` (tests
    /// against a reference rendered at a known time).
    pub fn with_now(mut self, unix_secs: i64) -> ChatTemplate {
        self.now = Some(unix_secs);
        self
    }

    fn env(&self) -> Environment<'static> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build();
        if let Ok(syntax) = syntax {
            env.set_syntax(syntax);
        }
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, format!("the template raised: {msg}")))
        });
        let now = self.now;
        env.add_function("strftime_now", move |fmt: String| match now {
            Some(secs) => strftime(&fmt, secs),
            None => strftime_now(&fmt),
        });
        env.add_filter("tojson", tojson);
        // Jinja's tests on Python values: None is not iterable (minijinja
        // iterates it as empty), Undefined is; the `tools` / `documents`
        // None of apply_chat_template is none.
        env.add_test("iterable", |v: Value| {
            !is_python_none(&v)
                && matches!(
                    v.kind(),
                    ValueKind::Seq | ValueKind::Map | ValueKind::Iterable | ValueKind::String | ValueKind::Undefined
                )
        });
        env.add_test("none", |v: Value| v.is_none() || is_python_none(&v));
        add_generator_filters(&mut env);
        env
    }

    fn render_values(
        &self,
        messages: Value,
        tools: &Value,
        add_generation_prompt: bool,
        vars: &[(String, Value)],
    ) -> Result<String, String> {
        // As transformers: the caller's variables override the special tokens.
        let mut ctx: Vec<(String, Value)> =
            self.specials.iter().filter(|(k, _)| !vars.iter().any(|(v, _)| v == k)).cloned().collect();
        ctx.extend(vars.iter().cloned());
        ctx.push(("messages".into(), messages));
        ctx.push(("tools".into(), tools.clone()));
        // apply_chat_template passes `documents=None` too.
        ctx.push(("documents".into(), python_none()));
        ctx.push(("add_generation_prompt".into(), Value::from(add_generation_prompt)));
        self.env()
            .render_str(&self.source, Value::from_pairs(ctx))
            .map_err(|e| format!("chat template: {}", describe(&e)))
    }

    /// The prompt as text, as transformers' `apply_chat_template(...,
    /// tokenize=False)` renders it. `tools`: a JSON array, or None.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        tools: Option<&str>,
        add_generation_prompt: bool,
    ) -> Result<String, String> {
        self.render_with_vars(messages, tools, add_generation_prompt, None)
    }

    /// [`render`](Self::render) with extra template variables, as the
    /// keyword arguments of transformers' `apply_chat_template` (Qwen3's
    /// `enable_thinking`, DeepSeek-V3.1's `thinking`, ...). `vars`: a JSON
    /// object, or None.
    pub fn render_with_vars(
        &self,
        messages: &[ChatMessage],
        tools: Option<&str>,
        add_generation_prompt: bool,
        vars: Option<&str>,
    ) -> Result<String, String> {
        let tools = parse_tools(tools)?;
        let vars = parse_vars(vars)?;
        let msgs = messages_value(messages, None)?;
        self.render_values(msgs, &tools, add_generation_prompt, &vars)
    }

    /// The prompt as markup / content segments (see the module docs).
    pub fn render_segments(
        &self,
        messages: &[ChatMessage],
        tools: Option<&str>,
        add_generation_prompt: bool,
    ) -> Result<Vec<Segment>, String> {
        self.render_segments_with_vars(messages, tools, add_generation_prompt, None)
    }

    /// [`render_segments`](Self::render_segments) with extra template
    /// variables (see [`render_with_vars`](Self::render_with_vars)).
    pub fn render_segments_with_vars(
        &self,
        messages: &[ChatMessage],
        tools: Option<&str>,
        add_generation_prompt: bool,
        vars: Option<&str>,
    ) -> Result<Vec<Segment>, String> {
        let tools = parse_tools(tools)?;
        let vars = parse_vars(vars)?;
        let mut contents: Vec<String> = Vec::new();
        let real = self.render_values(messages_value(messages, None)?, &tools, add_generation_prompt, &vars)?;
        let marked =
            self.render_values(messages_value(messages, Some(&mut contents))?, &tools, add_generation_prompt, &vars)?;
        if real.contains([MARK_OPEN, MARK_CLOSE]) {
            return Err("chat template: the conversation contains the reserved characters U+F0000/U+F0001".into());
        }
        // B as alternating markup / marker pieces.
        let mut pieces: Vec<(String, Option<usize>)> = Vec::new();
        let mut rest = marked.as_str();
        while let Some(open) = rest.find(MARK_OPEN) {
            let after = &rest[open + MARK_OPEN.len_utf8()..];
            let close = after
                .find(MARK_CLOSE)
                .ok_or("chat template: a content marker was cut (template sliced the content)")?;
            let idx: usize = after[..close].parse().map_err(|_| {
                "chat template: a content marker was altered (template transformed the content)".to_string()
            })?;
            if idx >= contents.len() {
                return Err("chat template: unknown content marker".into());
            }
            pieces.push((rest[..open].to_string(), None));
            pieces.push((String::new(), Some(idx)));
            rest = &after[close + MARK_CLOSE.len_utf8()..];
        }
        pieces.push((rest.to_string(), None));
        let substituted: String = pieces.iter().map(|(t, i)| i.map_or(t.as_str(), |i| contents[i].as_str())).collect();
        let segments: Vec<Segment> = if substituted == real {
            pieces
                .into_iter()
                .map(|(t, i)| match i {
                    Some(i) => Segment { text: contents[i].clone(), markup: false },
                    None => Segment { text: t, markup: true },
                })
                .collect()
        } else {
            align(&real, &pieces, &contents)?
        };
        Ok(segments.into_iter().filter(|s| !s.text.is_empty()).collect())
    }
}

/// Fallback segmentation for templates that transform content: walks the
/// real rendering, matching B's markup pieces literally and taking for each
/// marker the longest substring of its content after which the next markup
/// piece follows. Greedy, no backtracking: an ambiguity it cannot settle is
/// an error.
fn align(real: &str, pieces: &[(String, Option<usize>)], contents: &[String]) -> Result<Vec<Segment>, String> {
    let fail = || {
        "chat template: the template rewrites message content in a way that cannot be split safely into markup and content".to_string()
    };
    let mut out = Vec::new();
    let mut pos = 0usize;
    let mut i = 0;
    while i < pieces.len() {
        match &pieces[i] {
            (text, None) => {
                if !real[pos..].starts_with(text.as_str()) {
                    return Err(fail());
                }
                out.push(Segment { text: text.clone(), markup: true });
                pos += text.len();
            }
            (_, Some(idx)) => {
                let next = pieces.get(i + 1).map(|(t, _)| t.as_str()).unwrap_or("");
                let is_last = i + 2 >= pieces.len();
                let content = &contents[*idx];
                let mut chosen = None;
                // A substring of the content is no longer than the content; the
                // cheap `follows` test runs before the substring search.
                let mut end = real.len().min(pos + content.len());
                loop {
                    if real.is_char_boundary(end) {
                        let gap = &real[pos..end];
                        let follows = if is_last { &real[end..] == next } else { real[end..].starts_with(next) };
                        if follows && content.contains(gap) {
                            chosen = Some(end);
                            break;
                        }
                    }
                    if end == pos {
                        break;
                    }
                    end -= 1;
                }
                let end = chosen.ok_or_else(fail)?;
                out.push(Segment { text: real[pos..end].to_string(), markup: false });
                pos = end;
            }
        }
        i += 1;
    }
    if pos != real.len() {
        return Err(fail());
    }
    Ok(out)
}

/// Python's `None` where apply_chat_template passes it as a variable
/// (`tools`, `documents`): false, `none`, printed "None", serialised
/// `null`, and, unlike minijinja's none, not iterable, so `{% for t in
/// tools %}` without tools fails as it does in Jinja.
#[derive(Debug)]
struct PythonNone;

impl Object for PythonNone {
    /// Plain objects are not enumerable: iterating one is an error.
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Plain
    }

    fn is_true(self: &Arc<Self>) -> bool {
        false
    }

    fn render(self: &Arc<Self>, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("None")
    }
}

fn python_none() -> Value {
    Value::from_object(PythonNone)
}

pub(crate) fn is_python_none(v: &Value) -> bool {
    v.downcast_object_ref::<PythonNone>().is_some()
}

/// Jinja's `map`, `select`, `reject`, `selectattr` and `rejectattr` return
/// generators, minijinja's lists: a generator iterates once, has no length
/// and is not JSON (llama.cpp's DeepSeek-R1 template's `tools | map(...) |
/// tojson` fails under transformers). Like Jinja's, they yield nothing for
/// a None input (`if value:` guards their loops).
fn add_generator_filters(env: &mut Environment<'static>) {
    use minijinja::filters;
    use minijinja::value::{Rest, ValueOrKwargs};
    use minijinja::State;
    use std::borrow::Cow;
    fn generator(items: Vec<Value>) -> Value {
        Value::make_one_shot_iterator(items.into_iter())
    }
    fn none_or(v: &Value) -> Option<Value> {
        is_python_none(v).then(|| generator(Vec::new()))
    }
    env.add_filter("map", |state: &mut State, v: Value, args: Rest<ValueOrKwargs>| -> Result<Value, Error> {
        match none_or(&v) {
            Some(empty) => Ok(empty),
            None => filters::map(state, v, args).map(generator),
        }
    });
    env.add_filter(
        "select",
        |state: &mut State, v: Value, test: Option<Cow<'_, str>>, args: Rest<ValueOrKwargs>| -> Result<Value, Error> {
            match none_or(&v) {
                Some(empty) => Ok(empty),
                None => filters::select(state, v, test, args).map(generator),
            }
        },
    );
    env.add_filter(
        "reject",
        |state: &mut State, v: Value, test: Option<Cow<'_, str>>, args: Rest<ValueOrKwargs>| -> Result<Value, Error> {
            match none_or(&v) {
                Some(empty) => Ok(empty),
                None => filters::reject(state, v, test, args).map(generator),
            }
        },
    );
    env.add_filter(
        "selectattr",
        |state: &mut State,
         v: Value,
         attr: Cow<'_, str>,
         test: Option<Cow<'_, str>>,
         args: Rest<ValueOrKwargs>|
         -> Result<Value, Error> {
            match none_or(&v) {
                Some(empty) => Ok(empty),
                None => filters::selectattr(state, v, attr, test, args).map(generator),
            }
        },
    );
    env.add_filter(
        "rejectattr",
        |state: &mut State,
         v: Value,
         attr: Cow<'_, str>,
         test: Option<Cow<'_, str>>,
         args: Rest<ValueOrKwargs>|
         -> Result<Value, Error> {
            match none_or(&v) {
                Some(empty) => Ok(empty),
                None => filters::rejectattr(state, v, attr, test, args).map(generator),
            }
        },
    );
}

/// transformers' `{% generation %}` blocks (its AssistantTracker marks the
/// assistant's tokens for training masks and otherwise renders the body as
/// it is) as blocks minijinja knows, whitespace control kept.
fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(open) = rest.find("{%") {
        out.push_str(&rest[..open]);
        let tag = &rest[open..];
        let Some(close) = tag.find("%}") else { break };
        let inner = &tag[2..close];
        let (lead, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, trail) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[body.len() - 1..]),
            None => (body, ""),
        };
        match body.trim() {
            "generation" => out.push_str(&format!("{{%{lead} if true {trail}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{lead} endif {trail}%}}")),
            _ => out.push_str(&tag[..close + 2]),
        }
        rest = &tag[close + 2..];
    }
    out.push_str(rest);
    out
}

fn parse_tools(tools: Option<&str>) -> Result<Value, String> {
    match tools {
        None => Ok(python_none()),
        Some(t) => {
            let v: Value = serde_json::from_str(t).map_err(|e| json_err("tools: invalid JSON", e))?;
            if v.kind() != ValueKind::Seq {
                return Err("tools: expected a JSON array of tool definitions".into());
            }
            Ok(v)
        }
    }
}

/// Checks extra template variables (a JSON object text) without rendering:
/// a caller's mistake, told apart from the template's own refusal.
pub fn check_vars(vars: Option<&str>) -> Result<(), String> {
    parse_vars(vars).map(|_| ())
}

/// Extra template variables from a JSON object. The names the renderer sets
/// itself are refused rather than silently shadowed.
fn parse_vars(vars: Option<&str>) -> Result<Vec<(String, Value)>, String> {
    let Some(text) = vars else {
        return Ok(Vec::new());
    };
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| json_err("template variables: invalid JSON", e))?;
    let serde_json::Value::Object(map) = v else {
        return Err("template variables: expected a JSON object".into());
    };
    let mut out = Vec::with_capacity(map.len());
    for (name, val) in map {
        if matches!(name.as_str(), "messages" | "tools" | "add_generation_prompt") {
            return Err(format!("template variables: {name:?} is set by the renderer itself"));
        }
        let val: Value =
            serde_json::from_value(val).map_err(|e| json_err(&format!("template variables: {name}"), e))?;
        out.push((name, val));
    }
    Ok(out)
}

/// The messages as template values; with `markers`, content fields become
/// markers and their texts are collected there.
fn messages_value(messages: &[ChatMessage], mut markers: Option<&mut Vec<String>>) -> Result<Value, String> {
    let mut list = Vec::with_capacity(messages.len());
    for (n, m) in messages.iter().enumerate() {
        let mut fields: Vec<(String, Value)> = vec![("role".into(), Value::from(m.role.clone()))];
        // transformers' apply_chat_template drops a null content entirely.
        // The images' markup goes before the content, inside it, as the
        // release's processor puts it.
        let media: String = m.media.concat();
        match &m.content {
            Some(c) => fields.push(("content".into(), Value::from(format!("{media}{c}")))),
            None if !media.is_empty() => fields.push(("content".into(), Value::from(media.clone()))),
            None => {}
        }
        if let Some(extra) = &m.extra {
            let v: Value =
                serde_json::from_str(extra).map_err(|e| json_err(&format!("message {n}: extra: invalid JSON"), e))?;
            if v.kind() != ValueKind::Map {
                return Err(format!("message {n}: extra: expected a JSON object"));
            }
            for key in v.try_iter().map_err(|e| e.to_string())? {
                let name = key.as_str().unwrap_or_default().to_string();
                if name == "role" || name == "content" {
                    return Err(format!("message {n}: extra: {name:?} belongs in the message itself"));
                }
                let val = v.get_item(&key).map_err(|e| e.to_string())?;
                // apply_chat_template drops every key whose value is None.
                if !val.is_none() {
                    fields.push((name, val));
                }
            }
        }
        // ... and copies `reasoning_content` to `thinking`, as the message's
        // first key (gpt-oss's and LFM2.5's templates read `thinking`).
        if !fields.iter().any(|(k, _)| k == "thinking") {
            if let Some((_, r)) = fields.iter().find(|(k, _)| k == "reasoning_content") {
                let r = r.clone();
                fields.insert(0, ("thinking".into(), r));
            }
        }
        if let Some(texts) = markers.as_deref_mut() {
            for (name, val) in fields.iter_mut() {
                if CONTENT_FIELDS.contains(&name.as_str()) {
                    // The media markup stays outside the marker: markup.
                    let prefix = if name == "content" { media.as_str() } else { "" };
                    // An empty text has nothing to protect, and a marker
                    // in its place would turn `{% if content %}` true (Qwen3
                    // then adds a newline before an assistant's tool call).
                    if let Some(s) = val.as_str().and_then(|s| s.strip_prefix(prefix)).filter(|s| !s.is_empty()) {
                        texts.push(s.to_string());
                        *val = Value::from(format!("{prefix}{MARK_OPEN}{}{MARK_CLOSE}", texts.len() - 1));
                    }
                }
            }
        }
        list.push(Value::from_pairs(fields));
    }
    Ok(Value::from(list))
}

/// The error with minijinja's location ("line N") and the template's own
/// message for `raise_exception`.
fn describe(e: &Error) -> String {
    // Name the template instead of minijinja's "<string>".
    let mut s = e.to_string().replace("(in <string>:", "(chat_template line ");
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(&format!(": {inner}"));
        src = inner.source();
    }
    s
}
