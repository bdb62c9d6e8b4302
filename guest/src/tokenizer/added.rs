//! Added tokens (`added_tokens` in tokenizer.json) and the byte trie that
//! finds them with Aho-Corasick's leftmost-longest semantics, as HF does.

use super::json::Node;
use super::TokenizerError;

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AddedToken {
    pub content: String,
    pub single_word: bool,
    pub lstrip: bool,
    pub rstrip: bool,
    pub normalized: bool,
    pub special: bool,
}

impl AddedToken {
    pub fn parse(node: &Node) -> Result<AddedToken, TokenizerError> {
        // HF requires the id but then ignores it; check it is well-formed.
        let id = node.req("id")?;
        id.u64()?;
        Ok(AddedToken {
            content: node.req("content")?.str()?.to_string(),
            single_word: node.opt_bool("single_word", false)?,
            lstrip: node.opt_bool("lstrip", false)?,
            rstrip: node.opt_bool("rstrip", false)?,
            normalized: node.opt_bool("normalized", true)?,
            special: node.opt_bool("special", false)?,
        })
    }
}

/// `\w` exactly as the regex crate defines it (what HF's `single_word`
/// check uses); only consulted for `single_word` tokens, so compiled lazily.
fn is_word_char(c: char) -> bool {
    static WORD: std::sync::OnceLock<Option<fancy_regex::Regex>> = std::sync::OnceLock::new();
    match WORD.get_or_init(|| fancy_regex::Regex::new(r"\w").ok()) {
        Some(re) => {
            let mut buf = [0u8; 4];
            re.is_match(c.encode_utf8(&mut buf)).unwrap_or(false)
        }
        None => c.is_alphanumeric() || c == '_',
    }
}

pub(crate) fn ends_with_word(s: &str) -> bool {
    s.chars().next_back().is_some_and(is_word_char)
}

pub(crate) fn starts_with_word(s: &str) -> bool {
    s.chars().next().is_some_and(is_word_char)
}

#[derive(Debug, Default)]
struct TrieNode {
    /// Sorted by byte.
    next: Vec<(u8, u32)>,
    id: Option<u32>,
}

#[derive(Debug)]
pub(crate) struct Trie {
    nodes: Vec<TrieNode>,
    /// Bytes that start at least one pattern: a quick reject for most text.
    first: [bool; 256],
}

impl Default for Trie {
    fn default() -> Self {
        Trie { nodes: vec![TrieNode::default()], first: [false; 256] }
    }
}

impl Trie {
    /// The first insertion of a pattern wins, as with duplicate patterns in
    /// Aho-Corasick.
    pub fn insert(&mut self, pattern: &str, id: u32) {
        let bytes = pattern.as_bytes();
        let Some(&b0) = bytes.first() else { return };
        self.first[b0 as usize] = true;
        let mut cur = 0usize;
        for &b in bytes {
            cur = match self.nodes[cur].next.binary_search_by_key(&b, |e| e.0) {
                Ok(i) => self.nodes[cur].next[i].1 as usize,
                Err(i) => {
                    let n = self.nodes.len() as u32;
                    self.nodes.push(TrieNode::default());
                    self.nodes[cur].next.insert(i, (b, n));
                    n as usize
                }
            };
        }
        if self.nodes[cur].id.is_none() {
            self.nodes[cur].id = Some(id);
        }
    }

    /// Non-overlapping leftmost-longest matches as (id, start, end).
    /// Patterns are valid UTF-8, so matches fall on char boundaries.
    pub fn find_iter(&self, text: &str) -> Vec<(u32, usize, usize)> {
        let mut out = Vec::new();
        if self.nodes.len() == 1 {
            return out;
        }
        let bytes = text.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            if !self.first[bytes[i] as usize] {
                i += 1;
                continue;
            }
            let mut cur = 0usize;
            let mut best: Option<(u32, usize)> = None;
            for (j, &b) in bytes[i..].iter().enumerate() {
                match self.nodes[cur].next.binary_search_by_key(&b, |e| e.0) {
                    Ok(k) => cur = self.nodes[cur].next[k].1 as usize,
                    Err(_) => break,
                }
                if let Some(id) = self.nodes[cur].id {
                    best = Some((id, i + j + 1));
                }
            }
            match best {
                Some((id, end)) => {
                    out.push((id, i, end));
                    i = end;
                }
                None => i += 1,
            }
        }
        out
    }
}
