//! llguidance at a 160k vocabulary: how long one token's mask takes for a JSON
//! schema and for JSON mode, measured before structured output is built on it.

use std::sync::Arc;
use std::time::Instant;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};

fn main() {
    // A 160k vocabulary: the 256 bytes, then pseudo-random printable words
    // (2-12 bytes, a leading space on half, as byte-level BPE vocabularies have).
    let n = 160_000usize;
    let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    let mut seen = std::collections::HashSet::new();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let alphabet = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789{}[]\",:._-";
    while words.len() < n - 1 {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        let len = 2 + (x % 11) as usize;
        let mut w = Vec::with_capacity(len + 1);
        if x & 0x100 != 0 { w.push(b' '); }
        let mut y = x;
        for _ in 0..len { y = y.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); w.push(alphabet[(y >> 33) as usize % alphabet.len()]); }
        if seen.insert(w.clone()) { words.push(w); }
    }
    let mut eos = vec![0xffu8]; eos.extend_from_slice(b"<|im_end|>");
    words.push(eos);
    let trie = TokTrie::from(&TokRxInfo::new(n as u32, (n - 1) as u32), &words);
    let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
    let t = Instant::now();
    let factory = ParserFactory::new_simple(&env).unwrap();
    println!("factory {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    let schema = serde_json::json!({"type": "object",
        "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 150}, "available": {"type": "boolean"},
                       "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,8}$"}},
        "required": ["age", "available", "name"], "additionalProperties": false});
    for (what, grammar) in [("json_schema PERSON", TopLevelGrammar::from_json_schema(schema)),
                            ("json_object", TopLevelGrammar::from_json_schema(serde_json::json!({"type": "object"})))] {
        let t = Instant::now();
        let mut m = Matcher::new(factory.create_parser(grammar));
        let setup = t.elapsed().as_secs_f64() * 1e3;
        let mut times = Vec::new();
        let mut out = Vec::new();
        let mut r: u64 = 42;
        for _ in 0..200 {
            if m.is_stopped() { break; }
            let t = Instant::now();
            let mask = m.compute_mask_or_eos().unwrap();
            times.push(t.elapsed().as_secs_f64() * 1e3);
            let mut allowed = Vec::new();
            mask.iter_set_entries(|i| allowed.push(i as u32));
            if allowed.is_empty() { break; }
            r ^= r << 13; r ^= r >> 7; r ^= r << 17;
            let tok = allowed[(r as usize) % allowed.len()];
            out.push(tok);
            if m.consume_token(tok).is_err() { break; }
        }
        times.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let text: Vec<u8> = out.iter().flat_map(|&t| words[t as usize].clone()).collect();
        println!("{what}: setup {setup:.1} ms, {} steps, mask ms median {:.3} p90 {:.3} max {:.3}; output {:?}",
            times.len(), times[times.len()/2], times[times.len()*9/10], times[times.len()-1], String::from_utf8_lossy(&text));
    }
}
