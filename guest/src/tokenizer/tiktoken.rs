//! tiktoken BPE (Kimi's `tiktoken.model`), reproducing Python tiktoken's ids.
//!
//! The rank file holds one `<base64 bytes> <rank>` per line; a token's rank
//! is its id. Text is split into special tokens (markup mode only) and the
//! rest, the rest is cut into pieces by the pre-tokenizer pattern (only the
//! matches are encoded, as in tiktoken), and each piece that is not itself a
//! token is merged bytewise, always joining the leftmost adjacent pair whose
//! concatenation has the lowest rank.
//!
//! Special tokens follow Kimi's `TikTokenTokenizer`: the 256 ids after the
//! base vocabulary are reserved; `added_tokens_decoder` in
//! tokenizer_config.json names some of them (and may add others), the rest
//! are `<|reserved_token_N|>`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};

use fancy_regex::Regex;

use super::added::Trie;
use super::TokenizerError;

/// The pre-tokenizer pattern of Kimi's tokenizer (tokenization_kimi.py).
pub const KIMI_PATTERN: &str = include_str!("kimi_pat_str.txt");
/// Kimi reserves this many ids after the base vocabulary for special tokens.
pub const KIMI_RESERVED_SPECIAL: u32 = 256;
/// Same bound as the HF model: the reverse table is dense.
const MAX_ID: u64 = 1 << 24;
/// As in pattern.rs: a long whitespace run backtracks once per character.
const BACKTRACK_LIMIT: usize = 50_000_000;

#[derive(Debug)]
pub struct TiktokenTokenizer {
    ranks: HashMap<Vec<u8>, u32>,
    /// id -> bytes, dense over base and special ids.
    decoder: Vec<Option<Vec<u8>>>,
    special: HashMap<String, u32>,
    special_ids: HashSet<u32>,
    special_trie: Trie,
    pattern: Regex,
}

fn err(what: &str, msg: impl std::fmt::Display) -> TokenizerError {
    TokenizerError(format!("{what}: {msg}"))
}

/// Standard base64 (RFC 4648, `=` padding optional), as Python's
/// `base64.b64decode` accepts it in rank files.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    fn val(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    }
    let body = s.trim_end_matches('=');
    if s.len() - body.len() > 2 || body.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(body.len() * 3 / 4);
    for chunk in body.as_bytes().chunks(4) {
        let mut acc = 0u32;
        for &c in chunk {
            acc = (acc << 6) | val(c)?;
        }
        match chunk.len() {
            4 => out.extend_from_slice(&[(acc >> 16) as u8, (acc >> 8) as u8, acc as u8]),
            3 => out.extend_from_slice(&[(acc >> 10) as u8, (acc >> 2) as u8]),
            2 => out.push((acc >> 4) as u8),
            _ => return None,
        }
    }
    Some(out)
}

/// Parses a tiktoken rank file: `<base64> <rank>` per line, blank lines
/// skipped. Every single byte must have a rank, or some text could not be
/// encoded at all.
pub fn parse_ranks(data: &[u8], file: &str) -> Result<HashMap<Vec<u8>, u32>, TokenizerError> {
    let text = std::str::from_utf8(data).map_err(|e| err(file, format!("not UTF-8 text: {e}")))?;
    let mut ranks: HashMap<Vec<u8>, u32> = HashMap::new();
    let mut seen_ranks: HashMap<u32, usize> = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        let mut fields = line.split_whitespace();
        let (Some(tok), Some(rank), None) = (fields.next(), fields.next(), fields.next()) else {
            return Err(err(file, format!("line {line_no}: expected \"<base64 token> <rank>\", found {line:?}")));
        };
        let bytes =
            base64_decode(tok).ok_or_else(|| err(file, format!("line {line_no}: {tok:?} is not valid base64")))?;
        let rank: u64 = rank
            .parse()
            .map_err(|_| err(file, format!("line {line_no}: rank {rank:?} is not a non-negative integer")))?;
        if rank >= MAX_ID {
            return Err(err(file, format!("line {line_no}: rank {rank} is above the supported {MAX_ID}")));
        }
        let rank = rank as u32;
        if let Some(prev) = seen_ranks.insert(rank, line_no) {
            return Err(err(file, format!("line {line_no}: rank {rank} already given on line {prev}")));
        }
        if ranks.insert(bytes, rank).is_some() {
            return Err(err(file, format!("line {line_no}: token {tok:?} listed twice")));
        }
    }
    if let Some(b) = (0..=255u8).find(|b| !ranks.contains_key(&[*b][..])) {
        return Err(err(file, format!("byte 0x{b:02x} has no rank (every single byte needs one)")));
    }
    Ok(ranks)
}

/// Special tokens from tokenizer_config.json's `added_tokens_decoder`
/// (`{"<id>": {"content": .., ..}}`), completed as Kimi does with
/// `<|reserved_token_N|>` for the unnamed reserved ids.
pub fn kimi_special_tokens(config_json: Option<&str>, num_base: u32) -> Result<Vec<(String, u32)>, TokenizerError> {
    const FILE: &str = "tokenizer_config.json";
    let mut named: HashMap<u32, String> = HashMap::new();
    if let Some(json) = config_json {
        let v: serde_json::Value = serde_json::from_str(json).map_err(|e| err(FILE, format!("invalid JSON: {e}")))?;
        if let Some(dec) = v.get("added_tokens_decoder") {
            let obj = dec.as_object().ok_or_else(|| err(FILE, "$.added_tokens_decoder: expected an object"))?;
            for (k, t) in obj {
                let path = format!("$.added_tokens_decoder[{k:?}]");
                let id: u64 = k.parse().map_err(|_| err(FILE, format!("{path}: key is not a token id")))?;
                if id >= MAX_ID {
                    return Err(err(FILE, format!("{path}: id {id} is above the supported {MAX_ID}")));
                }
                let content = t
                    .get("content")
                    .and_then(|c| c.as_str())
                    .ok_or_else(|| err(FILE, format!("{path}.content: expected a string")))?;
                if content.is_empty() {
                    return Err(err(FILE, format!("{path}.content: empty token")));
                }
                named.insert(id as u32, content.to_string());
            }
        }
    }
    let mut out: Vec<(String, u32)> = (num_base..num_base + KIMI_RESERVED_SPECIAL)
        .map(|i| (named.remove(&i).unwrap_or_else(|| format!("<|reserved_token_{i}|>")), i))
        .collect();
    let mut rest: Vec<(String, u32)> = named.into_iter().map(|(i, s)| (s, i)).collect();
    rest.sort_by_key(|&(_, i)| i);
    out.extend(rest);
    Ok(out)
}

impl TiktokenTokenizer {
    /// `pattern` is the pre-tokenizer regex (`KIMI_PATTERN` for Kimi).
    pub fn new(
        ranks: HashMap<Vec<u8>, u32>,
        specials: Vec<(String, u32)>,
        pattern: &str,
    ) -> Result<TiktokenTokenizer, TokenizerError> {
        let pattern = fancy_regex::RegexBuilder::new(pattern)
            .backtrack_limit(BACKTRACK_LIMIT)
            .build()
            .map_err(|e| err("tiktoken pre-tokenizer pattern", format!("cannot compile {pattern:?}: {e}")))?;
        let max_id = ranks.values().chain(specials.iter().map(|(_, i)| i)).copied().max().unwrap_or(0);
        let mut decoder: Vec<Option<Vec<u8>>> = vec![None; max_id as usize + 1];
        for (bytes, &id) in &ranks {
            decoder[id as usize] = Some(bytes.clone());
        }
        let mut special = HashMap::new();
        let mut special_trie = Trie::default();
        for (content, id) in specials {
            if decoder[id as usize].is_some() {
                return Err(err("tokenizer_config.json", format!("special token {content:?} reuses id {id}")));
            }
            decoder[id as usize] = Some(content.as_bytes().to_vec());
            special_trie.insert(&content, id);
            special.insert(content, id);
        }
        let special_ids = special.values().copied().collect();
        Ok(TiktokenTokenizer { ranks, decoder, special, special_ids, special_trie, pattern })
    }

    /// Kimi's layout: `tiktoken.model` plus the specials of
    /// tokenizer_config.json, pre-tokenised with `pattern`.
    pub fn from_kimi_files(
        rank_file: &[u8],
        config_json: Option<&str>,
        pattern: &str,
    ) -> Result<TiktokenTokenizer, TokenizerError> {
        let ranks = parse_ranks(rank_file, "tiktoken.model")?;
        let num_base = ranks.len() as u32;
        let specials = kimi_special_tokens(config_json, num_base)?;
        TiktokenTokenizer::new(ranks, specials, pattern)
    }

    /// tiktoken's `encode_ordinary`: special-token strings are plain text.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 1);
        self.encode_ordinary_into(text, &mut ids);
        ids
    }

    /// tiktoken's `encode(text, allowed_special="all")`.
    pub fn encode_markup(&self, text: &str) -> Vec<u32> {
        self.encode_allowing(text, &|_, _| true)
    }

    /// Special tokens resolved only where `allow(start, end)` says.
    pub fn encode_allowing(&self, text: &str, allow: &dyn Fn(usize, usize) -> bool) -> Vec<u32> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 1);
        let mut at = 0;
        for (id, s, e) in self.special_trie.find_iter(text) {
            if !allow(s, e) {
                continue;
            }
            self.encode_ordinary_into(&text[at..s], &mut ids);
            ids.push(id);
            at = e;
        }
        self.encode_ordinary_into(&text[at..], &mut ids);
        ids
    }

    fn encode_ordinary_into(&self, text: &str, ids: &mut Vec<u32>) {
        let mut at = 0;
        for m in self.pattern.find_iter(text) {
            let Ok(m) = m else {
                // The backtrack limit was hit (tiktoken would panic): the
                // rest is merged as one piece, so the output stays a
                // deterministic, lossless function of the input.
                self.encode_piece(&text.as_bytes()[at..], ids);
                return;
            };
            self.encode_piece(m.as_str().as_bytes(), ids);
            at = m.end();
        }
    }

    fn encode_piece(&self, piece: &[u8], ids: &mut Vec<u32>) {
        if piece.is_empty() {
            return;
        }
        if let Some(&r) = self.ranks.get(piece) {
            ids.push(r);
            return;
        }
        for (s, e) in byte_pair_merge(&self.ranks, piece) {
            // Every part is a single byte (all ranked, checked at load) or
            // the result of a merge, which exists by construction.
            if let Some(&r) = self.ranks.get(&piece[s..e]) {
                ids.push(r);
            }
        }
    }

    fn token_bytes(&self, id: u32) -> Result<&[u8], TokenizerError> {
        self.decoder
            .get(id as usize)
            .and_then(|b| b.as_deref())
            .ok_or_else(|| TokenizerError(format!("unknown token id {id}")))
    }

    /// Whether `id` has bytes (every id below the vocabulary size of a
    /// Kimi rank file does: its reserved ids are named special tokens).
    pub fn knows(&self, id: u32) -> bool {
        self.token_bytes(id).is_ok()
    }

    pub fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>, TokenizerError> {
        let mut out = Vec::new();
        for &id in ids {
            out.extend_from_slice(self.token_bytes(id)?);
        }
        Ok(out)
    }

    /// tiktoken's `decode(errors="replace")`.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        Ok(String::from_utf8_lossy(&self.decode_bytes(ids)?).into_owned())
    }

    pub fn vocab_size(&self) -> usize {
        self.decoder.len()
    }

    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.special.get(token).or_else(|| self.ranks.get(token.as_bytes())).copied()
    }

    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
    }
}

/// tiktoken's `_byte_pair_merge` with a heap instead of its linear scan:
/// both repeatedly merge the leftmost adjacent pair of lowest rank (ranks
/// are unique per byte string, so equal ranks only tie on equal strings and
/// the heap's (rank, position) order breaks them leftmost, as the scan
/// does). O(n log n), so a 100 kB piece is no worse than a short one.
/// Returns the final parts as byte ranges.
pub(crate) fn byte_pair_merge(ranks: &HashMap<Vec<u8>, u32>, piece: &[u8]) -> Vec<(usize, usize)> {
    let n = piece.len();
    // Parts are a linked list over byte offsets; `next[i]` is the end of the
    // part starting at i.
    let mut next: Vec<usize> = (1..=n).collect();
    let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
    let mut alive = vec![true; n];
    let mut rank_at = vec![u32::MAX; n];
    let pair_rank = |next: &[usize], i: usize| -> u32 {
        let j = next[i];
        if j >= n {
            return u32::MAX;
        }
        ranks.get(&piece[i..next[j]]).copied().unwrap_or(u32::MAX)
    };
    let mut heap = BinaryHeap::with_capacity(n);
    for (i, r) in rank_at.iter_mut().enumerate() {
        *r = pair_rank(&next, i);
        if *r != u32::MAX {
            heap.push(Reverse((*r, i)));
        }
    }
    while let Some(Reverse((r, i))) = heap.pop() {
        if !alive[i] || rank_at[i] != r {
            continue;
        }
        let j = next[i];
        next[i] = next[j];
        if next[j] < n {
            prev[next[j]] = i;
        }
        alive[j] = false;
        rank_at[i] = pair_rank(&next, i);
        if rank_at[i] != u32::MAX {
            heap.push(Reverse((rank_at[i], i)));
        }
        let p = prev[i];
        if p < n {
            rank_at[p] = pair_rank(&next, p);
            if rank_at[p] != u32::MAX {
                heap.push(Reverse((rank_at[p], p)));
            }
        }
    }
    let mut parts = Vec::new();
    let mut i = 0;
    while i < n {
        parts.push((i, next[i]));
        i = next[i];
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// tiktoken's own quadratic loop, kept as the reference for the heap.
    fn reference_merge(ranks: &HashMap<Vec<u8>, u32>, piece: &[u8]) -> Vec<(usize, usize)> {
        let get = |b: &[u8]| ranks.get(b).copied().unwrap_or(u32::MAX);
        let mut parts: Vec<(usize, u32)> = (0..piece.len() - 1).map(|i| (i, get(&piece[i..i + 2]))).collect();
        parts.push((piece.len() - 1, u32::MAX));
        parts.push((piece.len(), u32::MAX));
        let rank3 = |parts: &Vec<(usize, u32)>, i: usize| {
            if i + 3 < parts.len() {
                get(&piece[parts[i].0..parts[i + 3].0])
            } else {
                u32::MAX
            }
        };
        loop {
            let mut min = (u32::MAX, usize::MAX);
            for (i, &(_, r)) in parts[..parts.len() - 1].iter().enumerate() {
                if r < min.0 {
                    min = (r, i);
                }
            }
            if min.0 == u32::MAX {
                break;
            }
            let i = min.1;
            if i > 0 {
                parts[i - 1].1 = rank3(&parts, i - 1);
            }
            parts[i].1 = rank3(&parts, i);
            parts.remove(i + 1);
        }
        parts.windows(2).map(|w| (w[0].0, w[1].0)).collect()
    }

    fn xorshift(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    #[test]
    fn heap_merge_equals_tiktoken_scan() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        // A small alphabet makes repeated pairs, hence ties, common.
        let alphabet = b"abcab ";
        let mut ranks: HashMap<Vec<u8>, u32> = (0..=255u8).map(|b| (vec![b], b as u32)).collect();
        let mut next_rank = 256;
        for _ in 0..300 {
            let len = 2 + (xorshift(&mut seed) % 5) as usize;
            let tok: Vec<u8> = (0..len).map(|_| alphabet[(xorshift(&mut seed) % 6) as usize]).collect();
            ranks.entry(tok).or_insert_with(|| {
                next_rank += 1;
                next_rank
            });
        }
        for _ in 0..2000 {
            let len = 1 + (xorshift(&mut seed) % 40) as usize;
            let piece: Vec<u8> = (0..len).map(|_| alphabet[(xorshift(&mut seed) % 6) as usize]).collect();
            assert_eq!(byte_pair_merge(&ranks, &piece), reference_merge(&ranks, &piece), "{piece:?}");
        }
    }

    #[test]
    fn base64_matches_python() {
        assert_eq!(base64_decode("IQ==").unwrap(), b"!");
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("4oCU").unwrap(), "\u{2014}".as_bytes());
        assert!(base64_decode("a").is_none());
        assert!(base64_decode("a$==").is_none());
    }

    #[test]
    fn kimi_pattern_compiles() {
        let t = TiktokenTokenizer::new((0..=255u8).map(|b| (vec![b], b as u32)).collect(), vec![], KIMI_PATTERN);
        assert!(t.is_ok(), "{:?}", t.err());
    }
}
