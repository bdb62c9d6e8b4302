//! The BPE model: vocabulary, ranked merges and HF's exact merge loop.

use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;

use super::json::{err, Node};
use super::TokenizerError;

/// Ids above this are rejected: real vocabularies stay below ~300k, and the
/// reverse table is a dense Vec indexed by id.
pub(crate) const MAX_ID: u64 = 1 << 24;
/// Words longer than this (bytes) are not cached, as in HF.
const CACHE_MAX_WORD: usize = 256;
const CACHE_MAX_ENTRIES: usize = 100_000;

/// Multiplicative hash for the packed (left, right) id pair: SipHash costs
/// more than the whole merge step.
#[derive(Default)]
pub(crate) struct PairHasher(u64);

impl Hasher for PairHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0 ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
    }
}

type MergeMap = HashMap<u64, (u32, u32), BuildHasherDefault<PairHasher>>;

fn pair(a: u32, b: u32) -> u64 {
    (u64::from(a) << 32) | u64::from(b)
}

#[derive(Debug)]
pub(crate) struct Bpe {
    pub vocab: HashMap<String, u32>,
    /// id -> token, dense.
    pub vocab_r: Vec<Option<String>>,
    merges: MergeMap,
    unk: Option<u32>,
    fuse_unk: bool,
    /// `<0xNN>` ids when `byte_fallback` is on and the token exists.
    byte_ids: Option<Box<[Option<u32>; 256]>>,
    prefix: Option<String>,
    suffix: Option<String>,
    ignore_merges: bool,
    cache: Mutex<HashMap<String, Vec<u32>>>,
}

impl Bpe {
    pub fn parse(node: &Node) -> Result<Bpe, TokenizerError> {
        let obj = node.object()?;
        match node.opt("type") {
            Some(t) if t.str()? != "BPE" => {
                return Err(t.error(format!("unsupported model type {:?} (only \"BPE\" is implemented)", t.str()?)));
            }
            Some(_) => {}
            None if obj.contains_key("merges") => {}
            None => return Err(node.error("missing field \"type\"")),
        }
        if let Some(d) = node.opt("dropout") {
            let v = d.value.as_f64().ok_or_else(|| d.error("expected a number or null"))?;
            if v != 0.0 {
                return Err(d.error("BPE dropout is not supported (it makes encoding random)"));
            }
        }

        let vnode = node.req("vocab")?;
        let vmap = vnode.object()?;
        let mut vocab = HashMap::with_capacity(vmap.len());
        let mut max_id = 0u64;
        for (k, v) in vmap {
            let id = v.as_u64().filter(|&i| i < MAX_ID).ok_or_else(|| {
                err(&format!("{}[{k:?}]", vnode.path()), format!("expected an id in 0..{MAX_ID}, found {v}"))
            })?;
            max_id = max_id.max(id + 1);
            vocab.insert(k.clone(), id as u32);
        }
        let mut vocab_r = vec![None; max_id as usize];
        for (k, &id) in &vocab {
            vocab_r[id as usize] = Some(k.clone());
        }

        let prefix = node.opt_str("continuing_subword_prefix")?.map(str::to_string);
        let suffix = node.opt_str("end_of_word_suffix")?.map(str::to_string);
        let prefix_len = prefix.as_ref().map_or(0, |p| p.len());

        let mnode = node.req("merges")?;
        let mut merges = MergeMap::default();
        let mut rank = 0u32;
        for (i, m) in mnode.array()?.iter().enumerate() {
            let here = || format!("{}[{i}]", mnode.path());
            let (a, b): (&str, &str) = match m {
                serde_json::Value::String(s) => {
                    if s.starts_with("#version") {
                        continue;
                    }
                    let mut parts = s.split(' ');
                    match (parts.next(), parts.next(), parts.next()) {
                        (Some(a), Some(b), None) => (a, b),
                        _ => {
                            return Err(err(&here(), format!("merge {s:?} must be two tokens separated by one space")));
                        }
                    }
                }
                serde_json::Value::Array(p) => match p.as_slice() {
                    [serde_json::Value::String(a), serde_json::Value::String(b)] => (a, b),
                    _ => return Err(err(&here(), "merge must be a pair of strings")),
                },
                _ => return Err(err(&here(), "merge must be a string \"a b\" or a pair [a, b]")),
            };
            let id_of = |t: &str| {
                vocab.get(t).copied().ok_or_else(|| err(&here(), format!("merge token {t:?} is not in model.vocab")))
            };
            let (ia, ib) = (id_of(a)?, id_of(b)?);
            let b_rest = b
                .get(prefix_len..)
                .ok_or_else(|| err(&here(), format!("merge token {b:?} lacks the continuing_subword_prefix")))?;
            let new_id = id_of(&format!("{a}{b_rest}"))?;
            // Later duplicates override earlier ones, as in HF's HashMap collect.
            merges.insert(pair(ia, ib), (rank, new_id));
            rank += 1;
        }

        let unk = match node.opt("unk_token") {
            Some(u) => {
                let s = u.str()?;
                Some(*vocab.get(s).ok_or_else(|| u.error(format!("unk_token {s:?} is not in model.vocab")))?)
            }
            None => None,
        };
        let byte_ids = if node.opt_bool("byte_fallback", false)? {
            let mut t = Box::new([None; 256]);
            for (b, slot) in t.iter_mut().enumerate() {
                *slot = vocab.get(&format!("<0x{b:02X}>")).copied();
            }
            Some(t)
        } else {
            None
        };
        Ok(Bpe {
            vocab,
            vocab_r,
            merges,
            unk,
            fuse_unk: node.opt_bool("fuse_unk", false)?,
            byte_ids,
            prefix,
            suffix,
            ignore_merges: node.opt_bool("ignore_merges", false)?,
            cache: Mutex::new(HashMap::new()),
        })
    }

    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.vocab_r.get(id as usize).and_then(|t| t.as_deref())
    }

    /// Appends the ids of one pre-tokenized word.
    pub fn tokenize(&self, word: &str, out: &mut Vec<u32>) {
        if word.is_empty() {
            return;
        }
        if self.ignore_merges {
            if let Some(&id) = self.vocab.get(word) {
                out.push(id);
                return;
            }
        }
        let cacheable = word.len() < CACHE_MAX_WORD;
        if cacheable {
            if let Ok(cache) = self.cache.lock() {
                if let Some(ids) = cache.get(word) {
                    out.extend_from_slice(ids);
                    return;
                }
            }
        }
        let start = out.len();
        self.merge_word(word, out);
        if cacheable {
            if let Ok(mut cache) = self.cache.lock() {
                if cache.len() >= CACHE_MAX_ENTRIES {
                    cache.clear();
                }
                cache.insert(word.to_string(), out[start..].to_vec());
            }
        }
    }

    /// HF's `BPE::merge_word` + `Word::merge_all`, without dropout.
    fn merge_word(&self, w: &str, out: &mut Vec<u32>) {
        let mut syms: Vec<Symbol> = Vec::with_capacity(w.len());
        let mut unk: Option<(u32, usize)> = None;
        let mut buf = String::new();
        let mut it = w.char_indices().peekable();
        let push = |syms: &mut Vec<Symbol>, c: u32, len: usize| {
            let i = syms.len() as isize;
            if let Some(last) = syms.last_mut() {
                last.next = i;
            }
            syms.push(Symbol { c, prev: i - 1, next: -1, len });
        };
        while let Some((i, ch)) = it.next() {
            let end = it.peek().map_or(w.len(), |&(e, _)| e);
            let is_first = i == 0;
            let is_last = end == w.len();
            let byte_len = ch.len_utf8();
            let s: &str = if (!is_first && self.prefix.is_some()) || (is_last && self.suffix.is_some()) {
                buf.clear();
                if let (false, Some(p)) = (is_first, &self.prefix) {
                    buf.push_str(p);
                }
                buf.push_str(&w[i..end]);
                if let (true, Some(sfx)) = (is_last, &self.suffix) {
                    buf.push_str(sfx);
                }
                &buf
            } else {
                &w[i..end]
            };
            if let Some(&id) = self.vocab.get(s) {
                if let Some((uid, ulen)) = unk.take() {
                    push(&mut syms, uid, ulen);
                }
                push(&mut syms, id, byte_len);
                continue;
            }
            if let Some(table) = &self.byte_ids {
                let ids: Option<Vec<u32>> = s.bytes().map(|b| table[b as usize]).collect();
                if let Some(ids) = ids {
                    // A pending unk stays pending across byte tokens, as in HF.
                    for id in ids {
                        push(&mut syms, id, 1);
                    }
                    continue;
                }
            }
            if let Some(uid) = self.unk {
                unk = match unk {
                    Some((u, l)) if self.fuse_unk => Some((u, l + byte_len)),
                    Some((u, l)) => {
                        push(&mut syms, u, l);
                        Some((uid, byte_len))
                    }
                    None => Some((uid, byte_len)),
                };
            }
            // Without an unk token HF drops the character silently.
        }
        if let Some((uid, ulen)) = unk {
            push(&mut syms, uid, ulen);
        }
        self.merge_all(&mut syms);
        out.extend(syms.iter().filter(|s| s.len != 0).map(|s| s.c));
    }

    fn merge_all(&self, syms: &mut [Symbol]) {
        let mut queue: BinaryHeap<Merge> = syms
            .windows(2)
            .enumerate()
            .filter_map(|(pos, w)| {
                self.merges.get(&pair(w[0].c, w[1].c)).map(|&(rank, new_id)| Merge { pos, rank, new_id })
            })
            .collect();
        while let Some(top) = queue.pop() {
            if syms[top.pos].len == 0 || syms[top.pos].next == -1 {
                continue;
            }
            let next_pos = syms[top.pos].next as usize;
            let right = syms[next_pos];
            // Skip stale entries: the pair at `pos` changed since it was queued.
            match self.merges.get(&pair(syms[top.pos].c, right.c)) {
                Some(&(_, id)) if id == top.new_id => {}
                _ => continue,
            }
            let cur = &mut syms[top.pos];
            cur.c = top.new_id;
            cur.len += right.len;
            cur.next = right.next;
            syms[next_pos].len = 0;
            if right.next > -1 && (right.next as usize) < syms.len() {
                syms[right.next as usize].prev = top.pos as isize;
            }
            let cur = syms[top.pos];
            if cur.prev >= 0 {
                let prev = cur.prev as usize;
                if let Some(&(rank, new_id)) = self.merges.get(&pair(syms[prev].c, cur.c)) {
                    queue.push(Merge { pos: prev, rank, new_id });
                }
            }
            if cur.next >= 0 && (cur.next as usize) < syms.len() {
                let next = cur.next as usize;
                if let Some(&(rank, new_id)) = self.merges.get(&pair(cur.c, syms[next].c)) {
                    queue.push(Merge { pos: top.pos, rank, new_id });
                }
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Symbol {
    c: u32,
    prev: isize,
    next: isize,
    len: usize,
}

#[derive(Debug, PartialEq, Eq)]
struct Merge {
    pos: usize,
    rank: u32,
    new_id: u32,
}

impl PartialOrd for Merge {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Merge {
    /// Max-heap order reversed: lowest rank first, then leftmost position.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.rank.cmp(&self.rank).then_with(|| other.pos.cmp(&self.pos))
    }
}
