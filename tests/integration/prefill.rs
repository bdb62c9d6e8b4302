//! Chunked prefill (host/engine/src/transformer/prefill.rs): a prompt run layer-major in
//! chunks, each distinct expert read once per chunk, must give the logits of
//! token-at-a-time prefill bit for bit, on every tiny fixture and for exact
//! and quantised expert formats, whatever the store does with the bytes.
//! rvq3 and rvq2 experts are the exception the arithmetic makes: a chunk
//! runs them as products over their rows' values (`quant::rvq_dense`),
//! token at a time runs decode's table walk, so their logits agree within
//! f32 rounding (1e-5 of the largest) and are bit-identical across chunk
//! sizes of two and more.

use std::sync::{Arc, Mutex, OnceLock};

use waste_engine::paths::plan_path;
use waste_engine::plan::PlanRequest;
use waste_host::{Engine, Error, GenerateParams, Model, OpenOptions};

use crate::common::*;

/// (fixture, expert format, trunk format): every tiny fixture, once exact
/// and once quantised, the quantised formats spread over the families.
const CASES: &[(&str, &str, &str)] = &[
    ("qwen3_moe", "f32", "f32"),
    ("qwen3_moe", "rvq3", "q4"),
    ("qwen3_moe", "rvq3", "f32"),
    ("olmoe", "f32", "f32"),
    ("olmoe", "q8", "q8"),
    ("olmoe", "rvq2", "f32"),
    ("mixtral", "f32", "f32"),
    ("mixtral", "q4", "q8"),
    ("kimi_linear", "f32", "f32"),
    ("kimi_linear", "rvq4p", "q8"),
    ("deepseek_v3", "f32", "f32"),
    ("deepseek_v3", "rvq3", "q8"),
    ("deepseek_v3-mxfp4", "q4", "q8"),
    ("deepseek_v32", "f32", "f32"),
    ("deepseek_v32", "rvq3", "q8"),
    ("glm_moe_dsa", "f32", "f32"),
    ("glm_moe_dsa", "q8", "q4"),
    ("deepseek_v4", "f32", "f32"),
    ("deepseek_v4", "rvq3", "q8"),
    ("kimi_k3", "f32", "f32"),
    ("kimi_k3", "q8", "f32"),
    ("kimi_k3-mxfp4", "rvq3", "q8"),
    ("qwen2_moe", "f32", "f32"),
    ("qwen2_moe", "rvq3", "q4"),
    ("glm4_moe", "f32", "f32"),
    ("glm4_moe", "q8", "q8"),
    ("minimax_m2", "f32", "f32"),
    ("minimax_m2", "q4", "q8"),
    ("gpt_oss", "f32", "f32"),
    ("gpt_oss", "rvq3", "q4"),
    ("gpt_oss-mxfp4", "rvq4p", "q8"),
    ("qwen3_next", "f32", "f32"),
    ("qwen3_next", "rvq3", "q4"),
    ("qwen3_5_moe", "q8", "f32"),
    ("qwen3_5_moe_text", "f32", "f32"),
];

const CONTEXT: usize = 96;

/// The fixture's prompt repeated to 70 tokens: longer than a 64-token chunk.
fn prompt(family: &str) -> Vec<u32> {
    // A release-style fixture is its base fixture requantised: same vocab.
    let ids = reference(family.trim_end_matches("-mxfp4")).prompt_ids;
    ids.iter().copied().cycle().take(70).collect()
}

fn options(chunk: usize) -> OpenOptions {
    OpenOptions { context: Some(CONTEXT), preload: false, prefill_chunk: Some(chunk), ..OpenOptions::default() }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Whether a chunk computes `experts` with other arithmetic than token at
/// a time does (`quant::rvq_dense`).
fn chunks_change_the_arithmetic(experts: &str) -> bool {
    matches!(experts, "rvq3" | "rvq2")
}

/// How far (max |delta| / max |logit|) a chunk's logits may be from token
/// at a time's where the experts' arithmetic differs (their outputs within
/// 1e-5 of each other: `quant::tests::expert_batch_is_bit_identical_to_each_token_alone`).
/// An f32 trunk carries that on as f32 rounding does: 1e-4, transformers'
/// oracle bound, whose arithmetic also differs from ours only in order
/// (measured up to 4.2e-5, qwen3_moe). A q8 or q4 trunk rounds its inputs to
/// int8, so a difference that moves one input across a rounding step moves
/// it by a whole step (measured up to 3.9e-2, qwen2_moe rvq3/q4, whose own
/// error against transformers is 0.29: docs/PERFORMANCE.md).
fn token_at_a_time_bound(trunk: &str) -> f32 {
    if trunk == "f32" {
        1e-4
    } else {
        0.1
    }
}

/// max |a - b| / max |b| over all positions' logits.
fn relative_gap(a: &[f32], b: &[f32]) -> f32 {
    let top = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / top
}

#[test]
fn chunked_prefill_logits_match_token_at_a_time_on_every_fixture_and_format() {
    let tmp = TempDir::new("prefill-ident");
    for &(family, experts, trunk) in CASES {
        let path = convert(family, experts, trunk, tmp.path());
        let prompt = prompt(family);
        let plain = Model::open(&path, &options(1)).unwrap();
        let mut state = plain.new_state();
        let (token_at_a_time, _) = plain.forward(&mut state, &prompt, true).unwrap();
        let v = plain.info().vocab_size;
        // Where chunks change the arithmetic, every chunk size of two and
        // more must still give the bits of a chunk of two.
        let want = if chunks_change_the_arithmetic(experts) {
            let m = Model::open(&path, &options(2)).unwrap();
            let (two, _) = m.forward(&mut m.new_state(), &prompt, true).unwrap();
            let gap = relative_gap(&two, &token_at_a_time);
            let bound = token_at_a_time_bound(trunk);
            assert!(
                gap <= bound,
                "{family} {experts}/{trunk}: chunks of 2 are {gap:e} from token at a time (bound {bound})"
            );
            assert!(gap > 0.0, "{family} {experts}/{trunk}: chunks no longer change the arithmetic; test them exactly");
            bits(&two)
        } else {
            bits(&token_at_a_time)
        };
        let floor = plan_path(&path, &PlanRequest { context: Some(CONTEXT), ..PlanRequest::default() }).unwrap().floor;
        // The store moves bytes differently in each; none may change a bit.
        let variants: Vec<(&str, OpenOptions)> = vec![
            ("chunk 3, cache", options(3)),
            ("chunk 64, cache", options(64)),
            ("the plan's chunk (the whole prompt)", OpenOptions { prefill_chunk: None, ..options(1) }),
            (
                "chunk 64, smallest cache, no readers",
                with_store(OpenOptions { budget: Some(floor), ..options(64) }, |s| {
                    s.readers = 0;
                    s.keep = false;
                }),
            ),
            (
                "chunk 3, smallest cache, no read-ahead",
                with_store(OpenOptions { budget: Some(floor), ..options(3) }, |s| s.read_ahead = false),
            ),
        ];
        for (what, o) in variants {
            let m = Model::open(&path, &o).unwrap();
            let mut state = m.new_state();
            let (got, _) = m.forward(&mut state, &prompt, true).unwrap();
            assert!(bits(&got) == want, "{family} {experts}/{trunk} {what}: all-position logits differ");
            let mut state = m.new_state();
            let (last, _) = m.forward(&mut state, &prompt, false).unwrap();
            assert!(
                bits(&last) == want[(prompt.len() - 1) * v..],
                "{family} {experts}/{trunk} {what}: last-position logits differ"
            );
        }
    }
}

/// Prefill in chunks, then decode: the same greedy continuation, logits
/// bit for bit, through the Rust API and through a component session.
#[test]
fn decode_after_chunked_prefill_gives_the_same_tokens() {
    let tmp = TempDir::new("prefill-decode");
    for (family, experts, trunk) in [
        ("kimi_linear", "f32", "f32"),
        ("kimi_k3", "q8", "f32"),
        ("olmoe", "q8", "q8"),
        ("gpt_oss", "q8", "q8"),
        ("qwen3_next", "f32", "f32"),
        ("deepseek_v32", "f32", "f32"),
        ("glm_moe_dsa", "q8", "q8"),
    ] {
        let path = convert(family, experts, trunk, tmp.path());
        let prompt = prompt(family);
        let run = |chunk: usize| {
            let m = Model::open(&path, &options(chunk)).unwrap();
            let mut state = m.new_state();
            let (mut logits, _) = m.forward(&mut state, &prompt, false).unwrap();
            let mut out = vec![bits(&logits)];
            for _ in 0..8 {
                let next = greedy_next(&logits);
                logits = m.forward(&mut state, &[next], false).unwrap().0;
                out.push(bits(&logits));
            }
            out
        };
        assert!(run(1) == run(64), "{family}: decode after a chunked prefill differs");
        let generate = |chunk: usize| {
            let m = Model::open(&path, &options(chunk)).unwrap();
            let mut s = engine().session(m).unwrap();
            let p = GenerateParams { temperature: 0.0, max_tokens: 6, stop_at_eos: false, ..GenerateParams::default() };
            let seen = Arc::new(Mutex::new(0usize));
            let count = seen.clone();
            let c = s
                .generate(&prompt, &p, move |_| {
                    *count.lock().unwrap() += 1;
                    true
                })
                .unwrap();
            assert_eq!(*seen.lock().unwrap(), c.tokens.len());
            c.tokens
        };
        let (plain, chunked) = (generate(1), generate(5));
        assert_eq!(plain.len(), 6);
        assert_eq!(plain, chunked, "{family}: a session's tokens differ after a chunked prefill");
    }
}

fn engine() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| Engine::new().unwrap())
}

/// With no cache every use is a read token at a time; a chunk reads each
/// distinct (layer, expert) of the chunk once, and counts one miss per read.
#[test]
fn chunked_prefill_reads_each_distinct_expert_once_per_chunk() {
    let tmp = TempDir::new("prefill-reads");
    let path = convert("olmoe", "q8", "q8", tmp.path());
    let floor = plan_path(&path, &PlanRequest { context: Some(CONTEXT), ..PlanRequest::default() }).unwrap().floor;
    let prompt = prompt("olmoe")[..40].to_vec();
    let open = |chunk: usize| {
        Model::open(
            &path,
            &with_store(OpenOptions { budget: Some(floor), ..options(chunk) }, |s| {
                s.keep = false;
                s.readers = 0;
            }),
        )
        .unwrap()
    };
    let plain = open(1);
    let info = plain.info().clone();
    let mut state = plain.new_state();
    let (_, step) = plain.forward(&mut state, &prompt, false).unwrap();
    let uses = (prompt.len() * info.top_k * info.moe_layers) as u64;
    let s = plain.store_stats();
    assert_eq!((s.reads, s.picks.missed, step.experts_missed as u64), (uses, uses, uses));
    // One chunk holds the whole prompt: reads = distinct (layer, expert)
    // pairs the prompt routes to, which the plain run's usage counts show.
    let distinct = plain.expert_store().usage().iter().filter(|&&n| n > 0).count() as u64;
    assert!(distinct < uses, "the fixture routes {distinct} distinct of {uses} uses");
    let one = open(64);
    let mut state = one.new_state();
    let (_, step) = one.forward(&mut state, &prompt, false).unwrap();
    let s = one.store_stats();
    assert_eq!((s.reads, s.picks.missed, s.picks.reused + s.picks.prefetched), (distinct, distinct, 0));
    assert_eq!(step.experts_missed as u64, distinct);
    assert_eq!(step.bytes_read, distinct * s.record_bytes);
    // The hotlist still counts every token's use.
    assert_eq!(one.expert_store().usage(), plain.expert_store().usage());
    // Chunks of 3: each chunk reads its own distinct experts.
    let three = open(3);
    let mut state = three.new_state();
    three.forward(&mut state, &prompt, false).unwrap();
    let r3 = three.store_stats().reads;
    assert!(distinct < r3 && r3 < uses, "chunk 3 read {r3}, one chunk {distinct}, plain {uses}");
    // Decode is one token: every use is a read.
    let before = one.store_stats().reads;
    let mut state = one.new_state();
    one.forward(&mut state, &prompt[..1], false).unwrap();
    assert_eq!(one.store_stats().reads - before, (info.top_k * info.moe_layers) as u64);
}

#[test]
fn prefill_chunk_outside_1_to_8192_is_refused() {
    let tmp = TempDir::new("prefill-arg");
    let path = convert("qwen3_moe", "f32", "f32", tmp.path());
    for bad in [0, 8193] {
        match Model::open(&path, &options(bad)) {
            Err(Error::Arg(msg)) => assert!(msg.contains("prefill chunk"), "{msg}"),
            Err(e) => panic!("chunk {bad}: {e}"),
            Ok(_) => panic!("chunk {bad} was accepted"),
        }
    }
    let o = waste(&["bench", path.to_str().unwrap(), "--prefill", "4", "--chunk", "1,0"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--chunk 0"), "{}", stderr(&o));
}

/// `bench` said "prefill chunks of 4 tokens on cache the experts lent" for a
/// prompt merely shorter than the plan's chunk, where nothing was lent: the
/// line is for a chunk larger than the plan's, which only a loan makes.
#[test]
fn a_prompt_shorter_than_the_plans_chunk_is_not_reported_as_lent_cache() {
    let tmp = TempDir::new("prefill-short-bench");
    let path = convert("qwen3_moe", "f32", "f32", tmp.path());
    let o = waste(&["bench", path.to_str().unwrap(), "--prefill", "4", "--tokens", "2", "--budget", "1G"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("tok/s"), "{out}");
    assert!(!out.contains("lent"), "a 4-token prompt under the plan's chunk reported a loan:\n{out}");
}
