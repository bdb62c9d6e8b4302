//! How a finished answer is read, whichever API returns it: searched for
//! the request's tool calls and for reasoning channels. The one rule every
//! dialect keeps: without tools in the request a call stays text (a client
//! that declared none has nothing to run it with, and the text may be the
//! model writing about calls).

use waste_host::Model;

use super::Prompt;
use crate::tools::{self, Parsed, Schema};

/// What a finished answer is searched for.
pub(crate) struct Reading {
    /// The request's tools, whose calls are taken out of the answer.
    tools: Option<Schema>,
    /// gpt-oss's harmony channels: its reasoning is split out even without
    /// tools, since the channel markup is never meant for the reader.
    harmony: bool,
}

impl Reading {
    /// `tools` is the request's `tools` JSON text, when the answer may call
    /// them; `harmony` whether the answer is a conversation in harmony's
    /// channels (see [`speaks_harmony`]).
    pub(crate) fn new(tools: Option<&str>, harmony: bool) -> Reading {
        Reading { tools: tools.map(Schema::from_tools), harmony }
    }

    /// Whether the answer is parsed once complete, so a stream holds its
    /// text back until then: a call's markup must never reach the client as
    /// text.
    pub(crate) fn holds(&self) -> bool {
        self.tools.is_some() || self.harmony
    }

    /// The answer split into content, reasoning and calls; None: it stays
    /// plain text (nothing is searched for, nothing was found, or it holds
    /// calls that no tool of the request allowed). `raw` is the answer with
    /// its special tokens (harmony's channels are special tokens).
    pub(crate) fn split(&self, text: &str, raw: &str) -> Option<Parsed> {
        if !self.holds() {
            return None;
        }
        let empty = Schema::default();
        let parsed = tools::parse(text, raw, self.tools.as_ref().unwrap_or(&empty))?;
        (self.tools.is_some() || parsed.calls.is_empty()).then_some(parsed)
    }
}

impl Prompt {
    /// The tools a conversation declares, whose calls its answer may hold.
    pub(crate) fn tools(&self) -> Option<&str> {
        match self {
            Prompt::Chat { tools, .. } => tools.as_deref(),
            Prompt::Text(_) => None,
        }
    }
}

/// Whether `model`'s chat template writes gpt-oss's harmony channels: only
/// then is reasoning split out of an answer without tools.
pub(crate) fn speaks_harmony(model: &Model) -> bool {
    matches!(model.chat_template(false), Ok(Some(t)) if t.contains("<|channel|>"))
}

/// What a stream has yet to send of `text` once the answer is complete,
/// `sent` being what it streamed: the engine holds back text that may begin
/// a stop string until it knows it does not.
pub(crate) fn unsent<'a>(text: &'a str, sent: &str) -> &'a str {
    text.strip_prefix(sent).unwrap_or("")
}
