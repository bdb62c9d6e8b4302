//! A prefill chunk's causal attention on this machine: blocks of query
//! heads sharing a KV head through `attend::key_scores` and
//! `attend::weighted_rows` (what GQA decode and prefill run now) against
//! one (token, head) pair at a time with the four-lane `dot` and a scalar
//! value loop (what they ran before), interleaved in one run, on 1 and 2
//! threads, beside the machine's FMA peak.
//!
//! Shape: the peer benchmark's Qwen3-MoE (32 query and 4 KV heads of 128):
//! the last `CHUNK` tokens of a prompt of `keys` tokens attend every
//! earlier position, keys and values read in place from a KV cache of
//! `[positions][4 x 128]` rows. GMAC/s counts the scores' and the weighted
//! sums' multiply-accumulates (`2 x 128` per query and key), best of
//! `REPEATS`; the softmax is in both (libm's `expf` before, `attend`'s
//! eight-lane polynomial now).
//!
//! `cargo bench -p waste-kernels --bench attention` (`--quick`: shorter prompts).

mod common;

use common::{noise, peak_gmacs, side_by_side};
use rayon::prelude::*;
use waste_kernels::attend::{self, key_scores, weighted_rows, QueryColumns};
use waste_kernels::pool::Pool;
use waste_kernels::quant::isa;

const CHUNK: usize = 256;
const HEADS: usize = 32;
const KV_HEADS: usize = 4;
const D: usize = 128;

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let mut unit = noise(0x5EED);
    println!("kernel level: {}", isa().name());
    let lengths: &[usize] = if quick { &[1024, 4096] } else { &[2048, 8192, 16384] };
    let (qd, kvd) = (HEADS * D, KV_HEADS * D);
    for threads in [1, 2] {
        let pool = Pool::new(Some(threads), None).expect("pool");
        let peak = pool.install(|| peak_gmacs(threads)).expect("pool");
        println!("\n{threads} thread(s): FMA peak {peak:.1} GMAC/s ({} lanes)", common::fma_lanes());
        println!("{:<30} {:>14} {:>14} {:>7} {:>9}", "attention", "per pair", "blocks", "ratio", "% of peak");
        for &keys in lengths {
            let k: Vec<f32> = (0..keys * kvd).map(|_| unit()).collect();
            let v: Vec<f32> = (0..keys * kvd).map(|_| unit()).collect();
            let q: Vec<f32> = (0..CHUNK * qd).map(|_| unit()).collect();
            let start = keys - CHUNK;
            let (mut one, mut many) = (vec![0f32; CHUNK * qd], vec![0f32; CHUNK * qd]);
            let (t_one, t_many) = side_by_side(
                &pool,
                || per_pair(&q, (&k, &v), start, &mut one),
                || blocks(&q, (&k, &v), start, &mut many),
            );
            let worst = one.iter().zip(&many).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(worst < 1e-4, "the two forms disagree by {worst}");
            let macs = (0..CHUNK).map(|i| 2 * D * HEADS * (start + i + 1)).sum::<usize>() as f64;
            let (g1, g2) = (macs / t_one / 1e9, macs / t_many / 1e9);
            println!(
                "{:<30} {g1:>7.1} GMAC/s {g2:>7.1} GMAC/s {:>6.2}x {:>8.0}%",
                format!("{CHUNK} tokens ending at {keys}"),
                t_one / t_many,
                100.0 * g2 / peak
            );
        }
    }
}

/// The form before: each (token, head) pair on its own.
fn per_pair(q: &[f32], (k, v): (&[f32], &[f32]), start: usize, out: &mut [f32]) {
    let kvd = KV_HEADS * D;
    let scale = 1.0 / (D as f32).sqrt();
    out.par_chunks_mut(D).enumerate().for_each_init(
        || vec![0f32; start + CHUNK],
        |scores, (u, o)| {
            let (i, h) = (u / HEADS, u % HEADS);
            let kvh = h / (HEADS / KV_HEADS);
            let qh = &q[i * HEADS * D + h * D..][..D];
            let scores = &mut scores[..start + i + 1];
            for (t, sc) in scores.iter_mut().enumerate() {
                *sc = dot4(qh, &k[t * kvd + kvh * D..][..D]) * scale;
            }
            softmax(scores);
            o.fill(0.0);
            for (t, &a) in scores.iter().enumerate() {
                for (oi, vi) in o.iter_mut().zip(&v[t * kvd + kvh * D..][..D]) {
                    *oi += a * vi;
                }
            }
        },
    );
}

/// The form now: blocks of 4 tokens x 8 query heads per KV head.
fn blocks(q: &[f32], (k, v): (&[f32], &[f32]), start: usize, out: &mut [f32]) {
    const TOKENS: usize = 4;
    let (group, qd, kvd) = (HEADS / KV_HEADS, HEADS * D, KV_HEADS * D);
    let scale = 1.0 / (D as f32).sqrt();
    out.par_chunks_mut(TOKENS * qd).enumerate().for_each_init(
        || {
            (
                vec![0f32; TOKENS * group * D],
                vec![0f32; TOKENS * group * D],
                vec![0f32; TOKENS * group * (start + CHUNK)],
                vec![0f32; QueryColumns::len(TOKENS * group, D)],
            )
        },
        |(qs, os, scores, columns), (b, out)| {
            let n = out.len() / qd;
            let width = start + b * TOKENS + n;
            let (qs, os, scores) =
                (&mut qs[..n * group * D], &mut os[..n * group * D], &mut scores[..n * group * width]);
            for kvh in 0..KV_HEADS {
                let heads = kvh * group * D..(kvh + 1) * group * D;
                for (g, qt) in qs.chunks_exact_mut(group * D).zip(q[b * TOKENS * qd..].chunks_exact(qd)) {
                    g.copy_from_slice(&qt[heads.clone()]);
                }
                key_scores(&QueryColumns::new(qs, D, columns), (&k[kvh * D..], kvd, width), scores, width);
                for (u, row) in scores.chunks_exact_mut(width).enumerate() {
                    let last = start + b * TOKENS + u / group;
                    let (live, after) = row.split_at_mut(last + 1);
                    live.iter_mut().for_each(|s| *s *= scale);
                    attend::softmax(live, None);
                    after.fill(0.0);
                }
                os.fill(0.0);
                weighted_rows((scores, width), (&v[kvh * D..], kvd, width), D, os);
                for (o, ot) in os.chunks_exact(group * D).zip(out.chunks_exact_mut(qd)) {
                    ot[heads.clone()].copy_from_slice(o);
                }
            }
        },
    );
}

fn dot4(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 4];
    for (x, y) in a.chunks_exact(4).zip(b.chunks_exact(4)) {
        for j in 0..4 {
            acc[j] += x[j] * y[j];
        }
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3])
}

fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    x.iter_mut().for_each(|v| *v *= inv);
}
