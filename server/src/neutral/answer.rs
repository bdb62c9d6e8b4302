//! How a finished answer is read, whichever API returns it: searched for
//! the request's tool calls and for reasoning channels. The one rule every
//! dialect keeps: without tools in the request a call stays text (a client
//! that declared none has nothing to run it with, and the text may be the
//! model writing about calls).

use super::Prompt;
use crate::tools::think::{template_thinks, Split, ThinkSplitter};
use crate::tools::{self, Parsed, Schema};

/// What a finished answer is searched for.
pub(crate) struct Reading {
    /// The request's tools, whose calls are taken out of the answer.
    tools: Option<Schema>,
    /// gpt-oss's harmony channels: its reasoning is split out even without
    /// tools, since the channel markup is never meant for the reader.
    harmony: bool,
    /// The chat template writes reasoning in `<think>` blocks
    /// ([`tools::think`]): split out of every answer, and streamed as
    /// reasoning as it comes.
    thinks: bool,
}

impl Reading {
    /// `tools` is the request's `tools` JSON text, when the answer may call
    /// them; `harmony` whether the answer is a conversation in harmony's
    /// channels (see [`speaks_harmony`]); `thinks` whether it may reason in
    /// `<think>` blocks (see [`thinks_in_blocks`]).
    pub(crate) fn new(tools: Option<&str>, harmony: bool, thinks: bool) -> Reading {
        Reading { tools: tools.map(Schema::from_tools), harmony, thinks }
    }

    /// Whether the answer's content is parsed once complete, so a stream
    /// holds it back until then: a call's markup must never reach the
    /// client as text.
    pub(crate) fn holds(&self) -> bool {
        self.tools.is_some() || self.harmony
    }

    /// The answer split into content, reasoning and calls; None: it stays
    /// plain text (nothing is searched for, nothing was found, or it holds
    /// calls that no tool of the request allowed). `raw` is the answer with
    /// its special tokens (harmony's channels are special tokens);
    /// `opens_reasoning` whether its prompt opened a reasoning block.
    pub(crate) fn split(&self, text: &str, raw: &str, opens_reasoning: bool) -> Option<Parsed> {
        if !self.thinks {
            return self.split_calls(text, raw);
        }
        let (reasoning, content) = ThinkSplitter::split_whole(opens_reasoning, text);
        let reasoning = reasoning.filter(|r| !r.is_empty());
        match (self.split_calls(&content, &content), reasoning) {
            (parsed, None) => parsed,
            (Some(parsed), Some(r)) => Some(Parsed { reasoning: Some(r), ..parsed }),
            (None, Some(r)) => Some(Parsed {
                content: (!content.is_empty()).then_some(content),
                reasoning: Some(r),
                calls: Vec::new(),
            }),
        }
    }

    /// The content of an answer [`split`](Self::split) found nothing in:
    /// its text, less an empty reasoning block.
    pub(crate) fn content(&self, text: &str, opens_reasoning: bool) -> String {
        match self.thinks {
            true => ThinkSplitter::split_whole(opens_reasoning, text).1,
            false => text.to_string(),
        }
    }

    fn split_calls(&self, text: &str, raw: &str) -> Option<Parsed> {
        if !self.holds() {
            return None;
        }
        let empty = Schema::default();
        let parsed = tools::parse(text, raw, self.tools.as_ref().unwrap_or(&empty))?;
        (self.tools.is_some() || parsed.calls.is_empty()).then_some(parsed)
    }

    /// How a stream of this answer sends its text as it comes, once the
    /// prompt is known.
    pub(crate) fn live(&self, opens_reasoning: bool) -> Live {
        Live { splitter: self.thinks.then(|| ThinkSplitter::new(opens_reasoning)), holds: self.holds() }
    }
}

/// A stream's reading as the tokens come: reasoning goes out at once,
/// content unless it is held for the parse at the end ([`Reading::holds`]).
#[derive(Default)]
pub(crate) struct Live {
    splitter: Option<ThinkSplitter>,
    holds: bool,
}

impl Live {
    /// What of the next piece of the answer to send now.
    pub(crate) fn push(&mut self, piece: &str) -> Split {
        let mut s = match &mut self.splitter {
            Some(splitter) => splitter.push(piece),
            None => Split { reasoning: String::new(), content: piece.to_string() },
        };
        if self.holds {
            s.content.clear();
        }
        s
    }

    /// The answer is complete: `rest` is the text the engine held back (a
    /// possible stop string that was not one); gives out what is left.
    pub(crate) fn finish(&mut self, rest: &str) -> Split {
        let mut s = self.push(rest);
        if let Some(splitter) = &mut self.splitter {
            let last = splitter.finish();
            s.reasoning.push_str(&last.reasoning);
            if !self.holds {
                s.content.push_str(&last.content);
            }
        }
        s
    }

    /// Whether reasoning was sent as it came (so the parse at the end must
    /// not send it again).
    pub(crate) fn streamed_reasoning(&self) -> bool {
        self.splitter.is_some()
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

/// Whether a chat template writes gpt-oss's harmony channels: only then is
/// reasoning split out of an answer without tools (`template` is the one
/// conversations are rendered with).
pub(crate) fn speaks_harmony(template: Option<&str>) -> bool {
    template.is_some_and(|t| t.contains("<|channel|>"))
}

/// Whether a chat template writes reasoning in `<think>` blocks
/// (`template` is the one conversations are rendered with).
pub(crate) fn thinks_in_blocks(template: Option<&str>) -> bool {
    template.is_some_and(template_thinks)
}

/// What a stream has yet to send of `text` once the answer is complete,
/// `sent` being what it streamed: the engine holds back text that may begin
/// a stop string until it knows it does not.
pub(crate) fn unsent<'a>(text: &'a str, sent: &str) -> &'a str {
    text.strip_prefix(sent).unwrap_or("")
}
