//! The one bindings module: wasmtime's `bindgen!` of both worlds in wit/
//! (the bundled control component's `engine`, the sampler plugins'
//! `sampler-plugin`), and every conversion between the generated WIT types
//! and the public Rust API, each a `From`, in this one place.

use waste_engine::{Error, StepStats};

use crate::params::{ChatMessage, Completion, Constraint, GenerateParams, StopReason, TokenEvent, TokenStats};

/// The `engine` world: the control component's exports and the host's
/// imports.
pub(crate) mod engine {
    wasmtime::component::bindgen!({ world: "engine", path: "../../wit", imports: { default: trappable } });
}

/// The `sampler-plugin` world.
pub(crate) mod sampler {
    wasmtime::component::bindgen!({ world: "sampler-plugin", path: "../../wit" });
}

pub(crate) use engine::exports::waste::engine::control as wit_control;
pub(crate) use engine::waste::engine::model as wit_model;

impl From<&GenerateParams> for wit_control::SamplingParams {
    /// `plugin` is the session's to set (whether a plugin is attached).
    fn from(p: &GenerateParams) -> Self {
        wit_control::SamplingParams {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
            repetition_penalty: p.repetition_penalty,
            presence_penalty: p.presence_penalty,
            frequency_penalty: p.frequency_penalty,
            penalty_last_n: p.penalty_last_n,
            logit_bias: p.logit_bias.clone(),
            top_logprobs: p.top_logprobs,
            seed: p.seed,
            max_tokens: p.max_tokens,
            stop_at_eos: p.stop_at_eos,
            stop_strings: p.stop_strings.clone(),
            stop_tokens: p.stop_tokens.clone(),
            plugin: false,
            constraint: p.constraint.as_ref().map(wit_control::Constraint::from),
        }
    }
}

impl From<&Constraint> for wit_control::Constraint {
    fn from(c: &Constraint) -> Self {
        match c {
            Constraint::JsonObject => wit_control::Constraint::JsonObject,
            Constraint::JsonSchema(s) => wit_control::Constraint::JsonSchema(s.clone()),
            Constraint::Lark(s) => wit_control::Constraint::Lark(s.clone()),
            Constraint::Gbnf(s) => wit_control::Constraint::Gbnf(s.clone()),
            Constraint::Regex(s) => wit_control::Constraint::Regex(s.clone()),
            Constraint::ToolCall { tools, name, vars } => {
                wit_control::Constraint::ToolCall(wit_control::ToolCallConstraint {
                    tools: tools.clone(),
                    name: name.clone(),
                    vars: vars.clone(),
                })
            }
        }
    }
}

impl From<&ChatMessage> for wit_control::ChatMessage {
    fn from(m: &ChatMessage) -> Self {
        wit_control::ChatMessage {
            role: m.role.clone(),
            content: m.content.clone(),
            extra: m.extra.clone(),
            media: m.media.clone(),
        }
    }
}

impl From<wit_control::StopReason> for StopReason {
    fn from(r: wit_control::StopReason) -> Self {
        use wit_control::StopReason as W;
        match r {
            W::Length => StopReason::Length,
            W::Eos => StopReason::Eos,
            W::Cancelled => StopReason::Cancelled,
            W::ContextFull => StopReason::ContextFull,
            W::StopString => StopReason::StopString,
            W::StopToken => StopReason::StopToken,
            W::Grammar => StopReason::Grammar,
        }
    }
}

impl From<wit_control::Completion> for Completion {
    fn from(c: wit_control::Completion) -> Self {
        let (logprobs, top_logprobs) = c
            .logprobs
            .into_iter()
            .map(|l| (l.logprob, l.top.into_iter().map(|t| (t.token, t.logprob)).collect()))
            .unzip();
        Completion { tokens: c.tokens, text: c.text, stop_reason: c.stop_reason.into(), logprobs, top_logprobs }
    }
}

impl From<wit_control::Error> for Error {
    /// What the caller can do about it decides the variant: fix an argument,
    /// change the conversation, use another model, or report a failure.
    fn from(e: wit_control::Error) -> Self {
        use wit_control::Error as W;
        match e {
            W::InvalidArgument(m) => Error::Arg(m),
            W::ChatTemplate(m) => Error::ChatTemplate(m),
            W::Unsupported(m) => Error::Unsupported(m),
            W::Failed(m) => Error::Guest(m),
        }
    }
}

impl From<wit_model::StepStats> for TokenStats {
    fn from(s: wit_model::StepStats) -> Self {
        let wit_model::StepStats {
            experts_reused,
            experts_prefetched,
            experts_missed,
            bytes_read,
            ms_total,
            ms_io,
            direct_io,
        } = s;
        TokenStats { experts_reused, experts_prefetched, experts_missed, bytes_read, ms_total, ms_io, direct_io }
    }
}

impl From<wit_model::TokenEvent> for TokenEvent {
    fn from(e: wit_model::TokenEvent) -> Self {
        TokenEvent {
            token: e.token,
            text: e.text,
            logprob: e.logprob,
            top_logprobs: e.top_logprobs.iter().map(|t| (t.token, t.logprob)).collect(),
            stats: e.stats.into(),
        }
    }
}

/// The step statistics of a forward pass as the WIT reports them: the
/// engine's counters, the pass's wall time and whether reads bypass the
/// page cache.
pub(crate) fn wit_step_stats(stats: &StepStats, ms_total: f32, direct_io: bool) -> wit_model::StepStats {
    wit_model::StepStats {
        experts_reused: stats.experts_reused,
        experts_prefetched: stats.experts_prefetched,
        experts_missed: stats.experts_missed,
        bytes_read: stats.bytes_read,
        ms_total,
        ms_io: stats.io_time.as_secs_f32() * 1000.0,
        direct_io,
    }
}
