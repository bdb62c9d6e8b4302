//! The `{"String": ..}` / `{"Regex": ..}` patterns shared by the Split
//! pre-tokenizer and the Replace normalizer and decoder.

use fancy_regex::Regex;

use super::json::Node;
use super::TokenizerError;

/// Generous on purpose: HF uses Oniguruma, which has no such limit, and a
/// long whitespace run legitimately backtracks once per character.
const BACKTRACK_LIMIT: usize = 50_000_000;

#[derive(Debug)]
pub(crate) struct Pattern {
    re: Regex,
    /// The literal, when the pattern is a plain string (fast path for replace).
    literal: Option<String>,
}

impl Pattern {
    pub fn parse(node: &Node) -> Result<Pattern, TokenizerError> {
        let obj = node.object()?;
        if let Some(s) = node.get("String") {
            let s = s.str()?;
            let re = compile(&fancy_regex::escape(s), node)?;
            return Ok(Pattern { re, literal: Some(s.to_string()) });
        }
        if let Some(r) = node.get("Regex") {
            let re = compile(r.str()?, &r)?;
            return Ok(Pattern { re, literal: None });
        }
        let keys: Vec<&str> = obj.keys().map(|k| k.as_str()).collect();
        Err(node.error(format!("pattern must be {{\"String\": ..}} or {{\"Regex\": ..}}, found keys {keys:?}")))
    }

    pub fn regex(pattern: &str, node: &Node) -> Result<Pattern, TokenizerError> {
        Ok(Pattern { re: compile(pattern, node)?, literal: None })
    }

    /// Splits `text` into consecutive (start, end, is_match) spans covering it
    /// entirely, as HF's `Pattern::find_matches`. A regex runtime failure
    /// (backtrack limit) ends matching: the rest is one non-match span, so
    /// the output stays a deterministic function of the input.
    pub fn find_matches(&self, text: &str) -> Vec<(usize, usize, bool)> {
        if text.is_empty() {
            return vec![(0, 0, false)];
        }
        let mut out = Vec::new();
        let mut prev = 0;
        for m in self.re.find_iter(text) {
            let Ok(m) = m else { break };
            if m.start() != prev {
                out.push((prev, m.start(), false));
            }
            out.push((m.start(), m.end(), true));
            prev = m.end();
        }
        if prev != text.len() {
            out.push((prev, text.len(), false));
        }
        out
    }

    pub fn replace_all(&self, text: &str, content: &str) -> String {
        if let Some(lit) = &self.literal {
            return text.replace(lit.as_str(), content);
        }
        let mut out = String::with_capacity(text.len());
        let mut last = 0;
        for m in self.re.find_iter(text) {
            let Ok(m) = m else { break };
            out.push_str(&text[last..m.start()]);
            out.push_str(content);
            last = m.end();
        }
        out.push_str(&text[last..]);
        out
    }

    pub fn literal(&self) -> Option<&str> {
        self.literal.as_deref()
    }
}

fn compile(pattern: &str, node: &Node) -> Result<Regex, TokenizerError> {
    fancy_regex::RegexBuilder::new(pattern)
        .backtrack_limit(BACKTRACK_LIMIT)
        .build()
        .map_err(|e| node.error(format!("invalid regex {pattern:?}: {e}")))
}
