//! Hugging Face `tokenizer.json` tokenizer (BPE models: byte-level as in
//! GPT-2/Qwen/DeepSeek/OLMoE, and SentencePiece-style with byte fallback as
//! in Llama/Mixtral), reproducing the `tokenizers` library's ids exactly.
//!
//! Pipeline, as in HF: added tokens are cut out of the raw text, each
//! remaining piece is normalized, added tokens marked `normalized` are cut
//! out of the normalized text, the pre-tokenizer splits the rest into words
//! and the BPE model turns each word into ids. No post-processor runs: the
//! caller adds BOS and friends. Components this module does not implement
//! make `from_json` fail with the component's name and JSON path.

use std::collections::{HashMap, HashSet};

use super::added::{self, AddedToken, Trie};
use super::bpe::Bpe;
use super::decoder::{Decoder, Mode};
use super::json::Node;
use super::normalizer::Normalizer;
use super::pretok::{Piece, PreTokenizer};
use super::TokenizerError;

pub struct HfTokenizer {
    model: Bpe,
    normalizer: Option<Normalizer>,
    pre_tokenizer: Option<PreTokenizer>,
    decoder: Option<Decoder>,
    /// Added-token content -> id.
    added: HashMap<String, u32>,
    /// Id -> the added token that owns it.
    added_r: HashMap<u32, AddedToken>,
    special: HashSet<String>,
    /// Added tokens matched on the raw text (`normalized: false`).
    raw_trie: Trie,
    /// Added tokens matched on normalized text, keyed by normalized content.
    norm_trie: Trie,
    vocab_size: usize,
}

impl std::fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfTokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("added_tokens", &self.added.len())
            .finish_non_exhaustive()
    }
}

impl HfTokenizer {
    /// Parses a `tokenizer.json`. Errors name what is wrong and where.
    pub fn from_json(json: &str) -> Result<HfTokenizer, TokenizerError> {
        let value: serde_json::Value =
            serde_json::from_str(json).map_err(|e| TokenizerError(format!("tokenizer.json: invalid JSON: {e}")))?;
        let root = Node::root(&value);
        root.object()?;

        let model = Bpe::parse(&root.req("model")?)?;
        let normalizer = root.opt("normalizer").map(|n| Normalizer::parse(&n)).transpose()?;
        let pre_tokenizer = root.opt("pre_tokenizer").map(|n| PreTokenizer::parse(&n)).transpose()?;
        let decoder = root.opt("decoder").map(|n| Decoder::parse(&n)).transpose()?;

        let tokens = match root.opt("added_tokens") {
            Some(n) => n.items()?.iter().map(AddedToken::parse).collect::<Result<Vec<_>, _>>()?,
            None => Vec::new(),
        };
        let mut tk = HfTokenizer {
            model,
            normalizer,
            pre_tokenizer,
            decoder,
            added: HashMap::new(),
            added_r: HashMap::new(),
            special: HashSet::new(),
            raw_trie: Trie::default(),
            norm_trie: Trie::default(),
            vocab_size: 0,
        };
        tk.add_tokens(tokens);
        Ok(tk)
    }

    /// HF's `AddedVocabulary::add_tokens`: the ids in the JSON are ignored;
    /// a token takes its model-vocab id if it has one, else the next free id
    /// after the model vocabulary, in list order.
    fn add_tokens(&mut self, tokens: Vec<AddedToken>) {
        let model_len = self.model.vocab.len() as u32;
        let mut specials: Vec<AddedToken> = Vec::new();
        for t in &tokens {
            if t.special && !t.content.is_empty() && self.special.insert(t.content.clone()) {
                specials.push(t.clone());
            }
        }
        let mut plain: Vec<AddedToken> = Vec::new();
        for t in tokens {
            if t.content.is_empty() || self.added_r.values().any(|v| *v == t) {
                continue;
            }
            let id = match self.added.get(&t.content).or_else(|| self.model.vocab.get(&t.content)) {
                Some(&id) => id,
                None => match self.added.values().max() {
                    None => model_len,
                    Some(&max) if max >= model_len || model_len == 0 => max.saturating_add(1),
                    Some(_) => model_len,
                },
            };
            self.added.insert(t.content.clone(), id);
            if !self.special.contains(&t.content) {
                plain.push(t.clone());
            }
            self.added_r.insert(id, t);
        }
        for t in specials.iter().chain(plain.iter()) {
            let Some(&id) = self.added.get(&t.content) else {
                continue;
            };
            if t.normalized {
                let pattern = match &self.normalizer {
                    Some(n) => n.apply(t.content.clone()),
                    None => t.content.clone(),
                };
                self.norm_trie.insert(&pattern, id);
            } else {
                self.raw_trie.insert(&t.content, id);
            }
        }
        let max_added = self.added.values().map(|&i| i as usize + 1).max().unwrap_or(0);
        self.vocab_size = self.model.vocab_r.len().max(max_added);
    }

    /// Text as plain content: special-token strings are ordinary text, so a
    /// user cannot forge control tokens. Non-special added tokens are still
    /// matched (as HF does with `encode_special_tokens = true`).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.encode_with(text, &|_, _| false)
    }

    /// Text as template markup: every added token is matched first, as HF's
    /// default encode.
    pub fn encode_markup(&self, text: &str) -> Vec<u32> {
        self.encode_with(text, &|_, _| true)
    }

    /// One text whose special tokens are resolved only where
    /// `allow(start, end)` says (byte range in `text`); everything else is
    /// encoded exactly as one HF encode of the whole text would.
    pub fn encode_allowing(&self, text: &str, allow: &dyn Fn(usize, usize) -> bool) -> Vec<u32> {
        self.encode_with(text, allow)
    }

    fn encode_with(&self, text: &str, allow: &dyn Fn(usize, usize) -> bool) -> Vec<u32> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 1);
        for (tok, s, e) in self.split_added(&self.raw_trie, text, allow) {
            if let Some(id) = tok {
                ids.push(id);
                continue;
            }
            if s == e {
                continue;
            }
            let piece = text[s..e].to_string();
            let normalized = match &self.normalizer {
                Some(n) => n.apply(piece),
                None => piece,
            };
            // Offsets in the normalized text do not map back to the raw
            // text: a special token matched there is allowed only when the
            // whole raw piece is.
            let piece_allowed = allow(s, e);
            for (tok2, s2, e2) in self.split_added(&self.norm_trie, &normalized, &|_, _| piece_allowed) {
                if let Some(id) = tok2 {
                    ids.push(id);
                    continue;
                }
                if s2 == e2 {
                    continue;
                }
                let piece = Piece { text: normalized[s2..e2].to_string(), at_start: s == 0 && s2 == 0 };
                match &self.pre_tokenizer {
                    Some(pt) => {
                        for word in pt.apply(vec![piece]) {
                            self.model.tokenize(&word.text, &mut ids);
                        }
                    }
                    None => self.model.tokenize(&piece.text, &mut ids),
                }
            }
        }
        ids
    }

    /// HF's `AddedVocabulary::find_matches`: leftmost-longest matches,
    /// special tokens skipped (left as text) unless `allow`ed at their place.
    fn split_added(
        &self,
        trie: &Trie,
        text: &str,
        allow: &dyn Fn(usize, usize) -> bool,
    ) -> Vec<(Option<u32>, usize, usize)> {
        let mut out = Vec::new();
        let mut start_offset = 0;
        for (id, ms, me) in trie.find_iter(text) {
            let Some(tok) = self.added_r.get(&id) else {
                continue;
            };
            if self.special.contains(&tok.content) && !allow(ms, me) {
                continue;
            }
            let (mut start, mut stop) = (ms, me);
            if tok.single_word {
                let start_space = start == 0 || !added::ends_with_word(&text[..start]);
                let stop_space = stop == text.len() || !added::starts_with_word(&text[stop..]);
                if !start_space || !stop_space {
                    continue;
                }
            }
            if tok.lstrip {
                let new_start = text[..start].trim_end().len();
                start = new_start.max(start_offset);
            }
            if tok.rstrip {
                stop += text[stop..].len() - text[stop..].trim_start().len();
            }
            if start > start_offset {
                out.push((None, start_offset, start));
            }
            out.push((Some(id), start, stop));
            start_offset = stop;
        }
        if start_offset != text.len() {
            out.push((None, start_offset, text.len()));
        }
        out
    }

    fn token_str(&self, id: u32) -> Option<&str> {
        self.added_r.get(&id).map(|t| t.content.as_str()).or_else(|| self.model.id_to_token(id))
    }

    /// Whether `id` is one of this tokenizer's tokens (an embedding padded
    /// past the tokenizer has rows that are not).
    pub fn knows(&self, id: u32) -> bool {
        self.token_str(id).is_some()
    }

    /// An id the tokenizer does not have decodes to nothing, as HF
    /// tokenizers' `decode` does (`filter_map` over `id_to_token`): the
    /// padding rows of an embedding wider than its tokenizer. Whether an id
    /// is inside the model's vocabulary is the caller's check.
    fn token_bytes(&self, ids: &[u32]) -> Vec<Vec<u8>> {
        ids.iter().filter_map(|&id| self.token_str(id)).map(|s| s.as_bytes().to_vec()).collect()
    }

    fn decode_mode(&self, ids: &[u32], mode: Mode) -> Result<Vec<u8>, TokenizerError> {
        let tokens = self.token_bytes(ids);
        Ok(match &self.decoder {
            Some(d) => d.decode_chain(tokens, mode).concat(),
            None => tokens.join(&b' '),
        })
    }

    /// Raw bytes of the concatenated tokens (after the decoder), with no
    /// UTF-8 repair, so a streaming caller can hold back partial characters.
    pub fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>, TokenizerError> {
        self.decode_mode(ids, Mode::Raw)
    }

    /// Text of the tokens, invalid UTF-8 replaced the way HF does it.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        let bytes = self.decode_mode(ids, Mode::Hf)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Max id + 1 over the vocabulary and the added tokens.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.added.get(token).or_else(|| self.model.vocab.get(token)).copied()
    }

    /// Whether `id` is an added token marked `"special": true`.
    pub fn is_special(&self, id: u32) -> bool {
        self.added_r.get(&id).is_some_and(|t| self.special.contains(&t.content))
    }
}
