//! The public types of a generation: what a front end passes in
//! (`GenerateParams`, `ChatMessage`) and gets back (`TokenEvent`,
//! `Completion`). Their WIT twins are converted with `From` in
//! `bindings.rs`, the C structs in the ffi crate; nothing copies them field
//! by field anywhere else.

use crate::{Error, Result};

/// Sampling and stopping for [`Session::generate`](crate::Session::generate). Every value is
/// range-checked by the control component; nonsense is an error. The order
/// and definitions follow llama.cpp's sampler chain (see
/// guest/src/sampling.rs): logit bias, penalties, top-k, temperature,
/// top-p, min-p.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: u32,
    /// 1.0 = off; in (0, 1].
    pub top_p: f32,
    /// 0 = off; in [0, 1].
    pub min_p: f32,
    /// 1.0 = off; > 0.
    pub repetition_penalty: f32,
    /// 0 = off; in [-2, 2].
    pub presence_penalty: f32,
    /// 0 = off; in [-2, 2].
    pub frequency_penalty: f32,
    /// Recent tokens (prompt and earlier turns included) the penalties see.
    pub penalty_last_n: u32,
    /// (token, bias) added to the raw logits; bias in [-100, 100].
    pub logit_bias: Vec<(u32, f32)>,
    /// Alternatives reported per token, 0..=20.
    pub top_logprobs: u32,
    pub seed: u64,
    pub max_tokens: u32,
    pub stop_at_eos: bool,
    /// Text that ends the generation; it is never emitted.
    pub stop_strings: Vec<String>,
    /// Token ids that end the generation.
    pub stop_tokens: Vec<u32>,
    /// Structured output: sample only what this grammar allows.
    pub constraint: Option<Constraint>,
}

/// The longest grammar or schema text taken; the control component refuses
/// longer (its `MAX_GRAMMAR_BYTES`, held equal by a test).
pub const MAX_CONSTRAINT_BYTES: usize = 1 << 20;

/// What a structured output must follow (the WIT `constraint`). The control
/// component compiles it with llguidance and masks every step's logits, so
/// the text always belongs to the language it defines (unless the
/// generation is cut short by `max_tokens` or a stop string).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Constraint {
    /// Any JSON object.
    JsonObject,
    /// The JSON text of a JSON schema.
    JsonSchema(String),
    /// A grammar in llguidance's Lark syntax.
    Lark(String),
    /// A grammar in llama.cpp's GBNF, start rule `root`.
    Gbnf(String),
    /// A regular expression the whole output matches.
    Regex(String),
    /// One call of a declared tool (a forced `tool_choice`), in the syntax
    /// the model's chat template renders calls in, its arguments valid
    /// against the tool's schema. [`Error::Unsupported`] when the template
    /// writes arguments as text.
    ToolCall {
        /// The tools the prompt was rendered with (a JSON array, OpenAI's shape).
        tools: String,
        /// The tool to call; None: any.
        name: Option<String>,
        /// The template variables the prompt was rendered with.
        vars: Option<String>,
    },
}

impl Constraint {
    /// A grammar given as bare text, read as llama.cpp's server reads its
    /// `grammar`: GBNF, unless it starts with llguidance's `%llguidance`
    /// directive, which marks Lark.
    pub fn grammar(text: String) -> Constraint {
        if text.trim_start().starts_with("%llguidance") {
            Constraint::Lark(text)
        } else {
            Constraint::Gbnf(text)
        }
    }
}

impl GenerateParams {
    /// The defaults of every front end that does not document its own (the
    /// CLI's flags take theirs from here; each HTTP API applies its own
    /// documented defaults).
    pub const DEFAULTS: GenerateParams = GenerateParams {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.0,
        repetition_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        penalty_last_n: 64,
        logit_bias: Vec::new(),
        top_logprobs: 0,
        seed: 0,
        max_tokens: 128,
        stop_at_eos: true,
        stop_strings: Vec::new(),
        stop_tokens: Vec::new(),
        constraint: None,
    };
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams::DEFAULTS
    }
}

/// One message of a conversation for
/// [`Session::apply_chat_template`](crate::Session::apply_chat_template).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatMessage {
    /// "system", "user", "assistant", "tool", ...
    pub role: String,
    /// None: no `content` field (an assistant turn with only tool calls).
    pub content: Option<String>,
    /// Further fields as a JSON object text (`tool_calls`, `name`,
    /// `tool_call_id`, `reasoning_content`, ...), key order kept.
    pub extra: Option<String>,
    /// The prompt text of each image in the message, in order
    /// ([`Image::markup`](crate::Image::markup) of images
    /// attached to the session): rendered before the content as markup.
    pub media: Vec<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage { role: role.into(), content: Some(content.into()), extra: None, media: Vec::new() }
    }
}

/// Names the chat template renderer sets itself; a template variable may not
/// shadow them.
pub const RESERVED_TEMPLATE_VARS: [&str; 3] = ["messages", "tools", "add_generation_prompt"];

/// Checks template variables (a JSON object text, see
/// [`Session::apply_chat_template_with_vars`](crate::Session::apply_chat_template_with_vars))
/// before they reach the guest,
/// so a caller's mistake is [`Error::Arg`] rather than a component error.
pub fn check_template_vars(vars: &str) -> Result<()> {
    let value: serde_json::Value =
        serde_json::from_str(vars).map_err(|e| Error::Arg(format!("template variables: invalid JSON: {e}")))?;
    let serde_json::Value::Object(map) = value else {
        return Err(Error::Arg(format!("template variables: expected a JSON object, got {vars}")));
    };
    if let Some(name) = map.keys().find(|k| RESERVED_TEMPLATE_VARS.contains(&k.as_str())) {
        return Err(Error::Arg(format!("template variables: {name:?} is set by the renderer itself")));
    }
    Ok(())
}

/// One generated token, as streamed to the caller's callback.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    pub token: u32,
    /// Text completed by this token (empty while a character is split).
    pub text: String,
    pub logprob: f32,
    /// The most likely tokens at this step with their log-probabilities
    /// under the raw distribution, most likely first.
    pub top_logprobs: Vec<(u32, f32)>,
    /// What the forward pass that produced this token cost.
    pub stats: TokenStats,
}

/// What one forward pass cost, as a token event reports it (the WIT
/// `step-stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TokenStats {
    /// Routed-expert picks served by a record already in RAM, by one a
    /// router lookahead read, and read on demand (`Picks`).
    pub experts_reused: u32,
    pub experts_prefetched: u32,
    pub experts_missed: u32,
    pub bytes_read: u64,
    /// Wall time of the whole forward pass, milliseconds.
    pub ms_total: f32,
    /// Time spent waiting for expert reads, milliseconds.
    pub ms_io: f32,
    /// Expert reads bypass the page cache; false when the file system
    /// refused O_DIRECT / F_NOCACHE and reads are buffered.
    pub direct_io: bool,
}

impl TokenStats {
    pub fn picks(&self) -> waste_engine::stats::Picks {
        waste_engine::stats::Picks {
            reused: self.experts_reused.into(),
            prefetched: self.experts_prefetched.into(),
            missed: self.experts_missed.into(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Length,
    Eos,
    Cancelled,
    ContextFull,
    StopString,
    StopToken,
    /// The structured output's grammar is complete.
    Grammar,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Length => "length",
            StopReason::Eos => "eos",
            StopReason::Cancelled => "cancelled",
            StopReason::ContextFull => "context-full",
            StopReason::StopString => "stop-string",
            StopReason::StopToken => "stop-token",
            StopReason::Grammar => "grammar",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub tokens: Vec<u32>,
    pub text: String,
    pub stop_reason: StopReason,
    /// Per token: its log-probability under the raw distribution.
    pub logprobs: Vec<f32>,
    /// Per token: the `top_logprobs` most likely alternatives.
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
}
