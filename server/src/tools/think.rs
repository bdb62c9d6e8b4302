//! Reasoning written between `<think>` and `</think>`, as the templates of
//! Qwen3 / Qwen3.5, GLM-4.5+ / GLM-5, MiniMax-M2, DeepSeek-R1 / V3.1+ /
//! V3.2 / V4 and Kimi's thinking models ask for. Some of those templates
//! open the block in the generation prompt (Qwen3.5, MiniMax-M2,
//! DeepSeek-V3.1 with thinking on: the answer starts inside it), the others
//! let the model write `<think>` itself, and a template with thinking off
//! writes an empty block into the prompt (the answer is all content).
//!
//! One splitter serves a stream and a whole answer alike (a whole answer is
//! one piece), so the two never disagree: the reasoning is what lies
//! between the markers, without the whitespace around it; the content is
//! what follows `</think>`, without the whitespace the templates put
//! before it. A marker cut across pieces is held back until it is whole
//! or cannot be one; a block never closed (an answer cut by its token
//! limit) is all reasoning.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// Whether a template writes reasoning in these markers.
pub fn template_thinks(template: &str) -> bool {
    template.contains(CLOSE)
}

/// Whether a rendered prompt leaves the answer inside a reasoning block.
pub fn prompt_opens_block(prompt_tail: &str) -> bool {
    prompt_tail.trim_end().ends_with(OPEN)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Before anything but whitespace: `<think>` may still open a block.
    Start,
    /// Inside the block, before its first non-blank character.
    ReasoningStart,
    Reasoning,
    /// After `</think>`, before the content's first non-blank character.
    ContentStart,
    Content,
}

/// What one piece added: reasoning and content, either possibly empty.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

/// The splitter of one answer.
#[derive(Debug, Clone)]
pub struct ThinkSplitter {
    phase: Phase,
    /// Text received but not yet given out: a possible marker, or blanks
    /// that are only kept if more reasoning follows.
    held: String,
    /// Whether the answer had any reasoning block (even an empty one).
    saw_block: bool,
}

impl ThinkSplitter {
    /// `in_block`: the prompt opened the block ([`prompt_opens_block`]).
    pub fn new(in_block: bool) -> ThinkSplitter {
        let phase = if in_block { Phase::ReasoningStart } else { Phase::Start };
        ThinkSplitter { phase, held: String::new(), saw_block: in_block }
    }

    /// Takes the next piece of the answer.
    pub fn push(&mut self, piece: &str) -> Split {
        self.held.push_str(piece);
        let mut out = Split::default();
        self.advance(&mut out, false);
        out
    }

    /// The answer is complete: gives out what was held.
    pub fn finish(&mut self) -> Split {
        let mut out = Split::default();
        self.advance(&mut out, true);
        out
    }

    /// A whole answer: (reasoning, content); reasoning None when the answer
    /// had no block.
    pub fn split_whole(in_block: bool, text: &str) -> (Option<String>, String) {
        let mut s = ThinkSplitter::new(in_block);
        let mut all = s.push(text);
        let rest = s.finish();
        all.reasoning.push_str(&rest.reasoning);
        all.content.push_str(&rest.content);
        (s.saw_block.then_some(all.reasoning), all.content)
    }

    fn advance(&mut self, out: &mut Split, done: bool) {
        loop {
            match self.phase {
                Phase::Start => {
                    let text = self.held.trim_start();
                    if let Some(rest) = text.strip_prefix(OPEN) {
                        self.held = rest.to_string();
                        self.phase = Phase::ReasoningStart;
                        self.saw_block = true;
                    } else if !done && OPEN.starts_with(text) {
                        // Blank, or a marker not yet whole.
                        return;
                    } else {
                        self.phase = Phase::Content;
                    }
                }
                Phase::ReasoningStart | Phase::ContentStart => {
                    let text = self.held.trim_start();
                    if text.is_empty() && !done {
                        self.held.clear();
                        return;
                    }
                    self.held = text.to_string();
                    self.phase = if self.phase == Phase::ReasoningStart { Phase::Reasoning } else { Phase::Content };
                }
                Phase::Reasoning => {
                    if let Some(at) = self.held.find(CLOSE) {
                        out.reasoning.push_str(self.held[..at].trim_end());
                        self.held = self.held[at + CLOSE.len()..].to_string();
                        self.phase = Phase::ContentStart;
                        continue;
                    }
                    if done {
                        out.reasoning.push_str(self.held.trim_end());
                        self.held.clear();
                        return;
                    }
                    // Keep back a possible start of `</think>` and the
                    // blanks before it (dropped if the block ends there).
                    let keep_from = partial_marker_start(&self.held, CLOSE);
                    let give = self.held[..keep_from].trim_end().len();
                    out.reasoning.push_str(&self.held[..give]);
                    self.held = self.held[give..].to_string();
                    return;
                }
                Phase::Content => {
                    out.content.push_str(&self.held);
                    self.held.clear();
                    return;
                }
            }
        }
    }
}

/// Where a suffix of `text` that begins `marker` starts (`text.len()` when
/// none does).
fn partial_marker_start(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .map(|n| text.len() - n)
        .find(|&at| text.is_char_boundary(at) && marker.starts_with(&text[at..]))
        .unwrap_or(text.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every way of cutting `text` into pieces gives what the whole does.
    fn streamed_in_every_cut(in_block: bool, text: &str) -> (Option<String>, String) {
        let whole = ThinkSplitter::split_whole(in_block, text);
        let bounds: Vec<usize> = (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
        for &a in &bounds {
            for &b in bounds.iter().filter(|&&b| b >= a) {
                let mut s = ThinkSplitter::new(in_block);
                let (mut r, mut c) = (String::new(), String::new());
                for piece in [&text[..a], &text[a..b], &text[b..]] {
                    let p = s.push(piece);
                    r.push_str(&p.reasoning);
                    c.push_str(&p.content);
                }
                let p = s.finish();
                r.push_str(&p.reasoning);
                c.push_str(&p.content);
                assert_eq!((s.saw_block.then_some(r), c), whole, "{text:?} cut at {a}, {b}");
            }
        }
        whole
    }

    #[test]
    fn a_block_the_model_opens_is_reasoning() {
        let got = streamed_in_every_cut(false, "<think>\nLet me see.\n</think>\n\nLight.");
        assert_eq!(got, (Some("Let me see.".into()), "Light.".into()));
    }

    #[test]
    fn a_block_the_prompt_opened_is_reasoning_from_the_first_token() {
        let got = streamed_in_every_cut(true, "\nFirst, the waters.\n\nThen </ the light.\n</think>\n\nLight.");
        assert_eq!(got, (Some("First, the waters.\n\nThen </ the light.".into()), "Light.".into()));
    }

    #[test]
    fn an_answer_without_a_block_is_all_content() {
        assert_eq!(
            streamed_in_every_cut(false, "  Light. <think> is text here"),
            (None, "  Light. <think> is text here".into())
        );
        assert_eq!(streamed_in_every_cut(false, "<thin"), (None, "<thin".into()));
        assert_eq!(streamed_in_every_cut(false, ""), (None, String::new()));
    }

    #[test]
    fn an_unclosed_block_is_all_reasoning_and_an_empty_one_is_empty() {
        assert_eq!(
            streamed_in_every_cut(true, "Let me see, the wat"),
            (Some("Let me see, the wat".into()), String::new())
        );
        assert_eq!(streamed_in_every_cut(false, "<think>Let me </thi"), (Some("Let me </thi".into()), String::new()));
        assert_eq!(streamed_in_every_cut(false, "<think></think>Light."), (Some(String::new()), "Light.".into()));
    }

    #[test]
    fn templates_and_prompts_are_told_by_their_markers() {
        assert!(template_thinks("{{ '<think>\\n' + reasoning_content + '\\n</think>' }}"));
        assert!(!template_thinks("<|im_start|>assistant\n"));
        assert!(prompt_opens_block("<|im_start|>assistant\n<think>\n"));
        assert!(!prompt_opens_block("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert!(!prompt_opens_block("<｜Assistant｜></think>"));
    }
}
