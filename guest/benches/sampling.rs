//! The guest's per-token sampling work at a 160k vocabulary, the current
//! `waste_guest::sampling` beside the previous implementation (kept verbatim
//! in `baseline_sampling.rs`), in one run: logit bias / penalties, the draw,
//! the token's logprob over the raw logits and the top logprobs, as
//! `generate.rs` does per token. Native code (the previous `exp` is the
//! platform libm's); `wasm_sampling.sh` times the passes compiled to wasm and
//! `cargo bench -p waste-host --bench boundary` the component itself.
//!
//! `cargo bench -p waste-guest --bench sampling`

use std::time::Instant;

use waste_guest::sampling as after;

#[allow(dead_code)]
#[path = "baseline_sampling.rs"]
mod before;

const VOCAB: usize = 160_000;
const STEPS: usize = 8;
const REPEATS: usize = 5;

/// Deterministic logits shaped like a language model's: a broad bell of
/// noise (sum of four uniforms, sd ~2.3) and a handful of strong candidates.
fn logits(step: usize) -> Vec<f32> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ (step as u64) << 17;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    let mut v: Vec<f32> = (0..VOCAB)
        .map(|_| (next() + next() + next() + next() - 2.0) * 8.0)
        .collect();
    for k in 0..12 {
        let id = (k * 7919 + step * 104729) % VOCAB;
        v[id] = 14.0 + k as f32 * 0.3;
    }
    v
}

struct Case {
    name: &'static str,
    temperature: f32,
    top_k: u32,
    top_p: f32,
    penalties: bool,
    top_logprobs: u32,
}

macro_rules! per_token {
    ($m:ident, $raw:expr, $case:expr, $recent:expr, $rng:expr) => {{
        let c: &Case = $case;
        let sp = $m::SamplingParams {
            temperature: c.temperature,
            top_k: c.top_k,
            top_p: c.top_p,
            repetition_penalty: if c.penalties { 1.1 } else { 1.0 },
            presence_penalty: if c.penalties { 0.5 } else { 0.0 },
            frequency_penalty: if c.penalties { 0.5 } else { 0.0 },
            top_logprobs: c.top_logprobs,
            seed: 7,
            ..$m::SamplingParams::default()
        };
        let raw: &[f32] = $raw;
        let adjusted = $m::adjust(raw, &sp, $recent);
        let token = $m::sample(&adjusted, &sp, $rng);
        drop(adjusted);
        let lse = $m::log_sum_exp(raw);
        let lp = (raw[token] as f64 - lse) as f32;
        let top = $m::top_logprobs(raw, lse, sp.top_logprobs as usize);
        (token, lp, top.len())
    }};
}

fn main() {
    let inputs: Vec<Vec<f32>> = (0..STEPS).map(logits).collect();
    let recent: Vec<u32> = (0..64u32).map(|i| (i * 2503) % VOCAB as u32).collect();
    let cases = [
        Case {
            name: "greedy",
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            penalties: false,
            top_logprobs: 0,
        },
        Case {
            name: "temp 0.8, top-k 40, top-p 0.95",
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            penalties: false,
            top_logprobs: 0,
        },
        Case {
            name: "temp 0.8, top-p 0.95 (no top-k)",
            temperature: 0.8,
            top_k: 0,
            top_p: 0.95,
            penalties: false,
            top_logprobs: 0,
        },
        Case {
            name: "temp 1.0, full distribution",
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            penalties: false,
            top_logprobs: 0,
        },
        Case {
            name: "temp 0.8, top-k 40, 5 top logprobs",
            temperature: 0.8,
            top_k: 40,
            top_p: 1.0,
            penalties: false,
            top_logprobs: 5,
        },
        Case {
            name: "temp 0.8, k 40, p 0.95, penalties, 5 lp",
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            penalties: true,
            top_logprobs: 5,
        },
    ];
    println!("vocabulary {VOCAB}; ms per token, best of {REPEATS} runs of {STEPS} tokens; before and after interleaved");
    println!(
        "{:<40} {:>10} {:>10} {:>8}",
        "sampling", "before", "after", "ratio"
    );
    for case in &cases {
        let mut best = [f64::INFINITY; 2];
        for _ in 0..REPEATS {
            // Alternate which goes first so neither always meets a warm cache.
            for which in [0usize, 1] {
                let mut rng_b = before::Rng::new(7);
                let mut rng_a = after::Rng::new(7);
                let started = Instant::now();
                let mut sink = 0usize;
                for raw in &inputs {
                    let (t, lp, n) = if which == 0 {
                        per_token!(before, raw, case, &recent, &mut rng_b)
                    } else {
                        per_token!(after, raw, case, &recent, &mut rng_a)
                    };
                    sink = sink.wrapping_add(t + n + lp.to_bits() as usize);
                }
                std::hint::black_box(sink);
                let ms = started.elapsed().as_secs_f64() * 1000.0 / STEPS as f64;
                best[which] = best[which].min(ms);
            }
        }
        println!(
            "{:<40} {:>10.3} {:>10.3} {:>8.2}",
            case.name,
            best[0],
            best[1],
            best[0] / best[1]
        );
    }
}
