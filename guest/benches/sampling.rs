//! The guest's per-token sampling work at a 160k vocabulary: logit bias /
//! penalties, the draw, the token's logprob over the raw logits and the top
//! logprobs, as `generate.rs` does per token. Native code;
//! `wasm_sampling.sh` times the passes compiled to wasm (V8 and Cranelift)
//! and `cargo bench -p waste-host --bench boundary` the component itself.
//!
//! `cargo bench -p waste-guest --bench sampling`; against an earlier
//! revision: `bench/compare-revs.sh REV -p waste-guest --bench sampling`.

use std::time::Instant;

use waste_guest::sampling;

const VOCAB: usize = 160_000;
const STEPS: usize = 8;
const REPEATS: usize = 5;

/// Deterministic logits shaped like a language model's: a broad bell of
/// noise (sum of four uniforms, sd ~2.3) and a handful of strong candidates.
fn logits(step: usize) -> Vec<f32> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ (step as u64) << 17;
    let mut next = || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    let mut v: Vec<f32> = (0..VOCAB).map(|_| (next() + next() + next() + next() - 2.0) * 8.0).collect();
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
    min_p: f32,
    penalties: bool,
    top_logprobs: u32,
}

/// One token's sampling work; (token, its logprob, top logprobs reported).
fn per_token(raw: &[f32], c: &Case, recent: &[u32], rng: &mut sampling::Rng) -> (usize, f32, usize) {
    let sp = sampling::SamplingParams {
        temperature: c.temperature,
        top_k: c.top_k,
        top_p: c.top_p,
        min_p: c.min_p,
        repetition_penalty: if c.penalties { 1.1 } else { 1.0 },
        presence_penalty: if c.penalties { 0.5 } else { 0.0 },
        frequency_penalty: if c.penalties { 0.5 } else { 0.0 },
        top_logprobs: c.top_logprobs,
        seed: 7,
        ..sampling::SamplingParams::greedy()
    };
    let adjusted = sampling::adjust(raw, &sp, recent);
    let token = sampling::sample(&adjusted, &sp, rng);
    drop(adjusted);
    let lse = sampling::log_sum_exp(raw);
    let lp = (raw[token] as f64 - lse) as f32;
    let top = sampling::top_logprobs(raw, lse, sp.top_logprobs as usize);
    (token, lp, top.len())
}

/// How far the fast passes are from the exact definitions on the bench's
/// logits: the reported logprob (f64 `log_sum_exp`) against libm's, and the
/// f32 sampling masses against the exact `exp((l - max) / T)`.
fn numerics(inputs: &[Vec<f32>]) {
    let (mut lse_libm, mut flips, mut values) = (0.0f64, 0usize, 0usize);
    // Worst relative change of masses of at least 1e-30, 1e-6, 1e-3 (relative
    // to the most likely token), and of their total.
    let mut mass = [0.0f64; 4];
    for v in inputs {
        let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let libm = max as f64 + v.iter().map(|&l| (l as f64 - max as f64).exp()).sum::<f64>().ln();
        let a = sampling::log_sum_exp(v);
        lse_libm = lse_libm.max(((a - libm) / libm).abs());
        for &l in v {
            values += 1;
            flips += usize::from((l as f64 - a) as f32 != (l as f64 - libm) as f32);
        }
        for t in [1.0f32, 0.8, 0.3] {
            let (mut total, mut exact_total) = (0.0f64, 0.0f64);
            for &l in v {
                let exact = ((l as f64 - max as f64) / t as f64).exp();
                let got = sampling::exp32_nonpos((l - max) * (1.0 / t)) as f64;
                let change = ((got - exact) / exact).abs();
                for (k, bound) in [1e-30, 1e-6, 1e-3].into_iter().enumerate() {
                    if exact >= bound {
                        mass[k] = mass[k].max(change);
                    }
                }
                total += got;
                exact_total += exact;
            }
            mass[3] = mass[3].max(((total - exact_total) / exact_total).abs());
        }
    }
    println!(
        "log_sum_exp: relative change {lse_libm:.1e} vs libm; f32 logprobs differing from libm's: {flips} of {values}"
    );
    println!(
        "masses (T 1, 0.8, 0.3) vs exact: worst relative change {:.1e} (mass >= 1e-30), {:.1e} (>= 1e-6), {:.1e} (>= 1e-3); total {:.1e}",
        mass[0], mass[1], mass[2], mass[3]
    );
}

fn main() {
    let inputs: Vec<Vec<f32>> = (0..STEPS).map(logits).collect();
    numerics(&inputs);
    let recent: Vec<u32> = (0..64u32).map(|i| (i * 2503) % VOCAB as u32).collect();
    let cases = [
        Case { name: "greedy", temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, penalties: false, top_logprobs: 0 },
        Case {
            name: "temp 0.8, top-k 40, top-p 0.95",
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.0,
            penalties: false,
            top_logprobs: 0,
        },
        Case {
            name: "temp 0.8, top-p 0.95 (no top-k)",
            temperature: 0.8,
            top_k: 0,
            top_p: 0.95,
            min_p: 0.0,
            penalties: false,
            top_logprobs: 0,
        },
        Case {
            name: "temp 1.0, full distribution",
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            penalties: false,
            top_logprobs: 0,
        },
        Case {
            name: "temp 0.8, min-p 0.05 (no top-k)",
            temperature: 0.8,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.05,
            penalties: false,
            top_logprobs: 0,
        },
        Case {
            name: "temp 0.8, top-k 40, 5 top logprobs",
            temperature: 0.8,
            top_k: 40,
            top_p: 1.0,
            min_p: 0.0,
            penalties: false,
            top_logprobs: 5,
        },
        Case {
            name: "temp 0.8, k 40, p 0.95, penalties, 5 lp",
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.0,
            penalties: true,
            top_logprobs: 5,
        },
    ];
    println!("vocabulary {VOCAB}; ms per token, best of {REPEATS} runs of {STEPS} tokens");
    println!("{:<40} {:>10}", "sampling", "ms");
    for case in &cases {
        let mut best = f64::INFINITY;
        for _ in 0..REPEATS {
            let mut rng = sampling::Rng::new(7);
            let started = Instant::now();
            let mut sink = 0usize;
            for raw in &inputs {
                let (t, lp, n) = per_token(raw, case, &recent, &mut rng);
                sink = sink.wrapping_add(t + n + lp.to_bits() as usize);
            }
            std::hint::black_box(sink);
            best = best.min(started.elapsed().as_secs_f64() * 1000.0 / STEPS as f64);
        }
        println!("{:<40} {:>10.3}", case.name, best);
    }
}
