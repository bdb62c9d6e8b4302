//! One decode token's attention over a long KV cache stored as f32, bf16
//! and q8 (`waste_kernels::kv`), its KV heads one after another and on two
//! threads, interleaved in one run: what the engine's GQA layer does per
//! KV head (`transformer::attention::attend_kv_head`):
//! the keys `KEY_TILE` positions at a time through `KvRows::view` (the f32
//! cache read in place, the others decoded into a tile), the scores, the
//! softmax, then the values the same way into the weighted sum.
//!
//! Shape: the peer benchmark's Qwen3-MoE (32 query and 4 KV heads of 128),
//! one layer; a decode token attends every cached position. Per type: the
//! cache's bytes for the layer and microseconds per layer per token, best
//! of the passes, the ratio to f32, and what running the four KV heads on a
//! pool of two threads gives (decode does past `PARALLEL_DECODE_WORK`).
//!
//! `cargo bench -p waste-kernels --bench kv_cache` (`--quick`: shorter
//! contexts, fewer passes).

use rayon::prelude::*;
// The shared bench helpers; this bench needs only `noise`.
#[allow(dead_code)]
mod common;

use common::noise;
use std::hint::black_box;
use std::time::Instant;
use waste_kernels::attend::{key_scores, softmax, weighted_rows, QueryColumns};
use waste_kernels::kv::{KvRows, KvType, KEY_TILE};
use waste_kernels::quant::isa;

const HEADS: usize = 32;
const KV_HEADS: usize = 4;
const D: usize = 128;

/// One token's attention over positions `0..n` of `k`, `v` into `out`,
/// its KV heads one after another, or on the current pool with `parallel`
/// (`scores`, `tile`: room for every KV head's).
fn attend(
    (k, v): (&KvRows, &KvRows),
    n: usize,
    q: &[f32],
    (scores, tile): (&mut [f32], &mut [f32]),
    out: &mut [f32],
    parallel: bool,
) {
    let group = HEADS / KV_HEADS;
    let heads = q.chunks_exact(group * D).zip(out.chunks_exact_mut(group * D));
    let buffers = scores.chunks_exact_mut(scores.len() / KV_HEADS).zip(tile.chunks_exact_mut(KEY_TILE * D));
    let jobs: Vec<_> = heads.zip(buffers).enumerate().collect();
    let job = |(kvh, ((qs, o), (sc, t))): (usize, HeadJob)| attend_head((k, v), n, kvh, qs, (sc, t), o);
    if parallel {
        jobs.into_par_iter().for_each(job);
    } else {
        jobs.into_iter().for_each(job);
    }
}

/// One KV head's query heads and outputs, scores and tile.
type HeadJob<'a> = ((&'a [f32], &'a mut [f32]), (&'a mut [f32], &'a mut [f32]));

/// KV head `kvh`'s query heads `qs` over positions `0..n`.
fn attend_head(
    (k, v): (&KvRows, &KvRows),
    n: usize,
    kvh: usize,
    qs: &[f32],
    (scores, tile): (&mut [f32], &mut [f32]),
    o: &mut [f32],
) {
    let group = HEADS / KV_HEADS;
    let scale = 1.0 / (D as f32).sqrt();
    {
        let head = kvh * D..(kvh + 1) * D;
        let scores = &mut scores[..group * n];
        let mut columns = [0f32; HEADS / KV_HEADS * D];
        let queries = QueryColumns::new(qs, D, &mut columns);
        for t in (0..n).step_by(KEY_TILE) {
            let len = KEY_TILE.min(n - t);
            let (keys, stride) = k.view(t, len, head.clone(), tile);
            key_scores(&queries, (keys, stride, len), &mut scores[t..], n);
        }
        for row in scores.chunks_exact_mut(n) {
            row.iter_mut().for_each(|s| *s *= scale);
            softmax(row, None);
        }
        o.fill(0.0);
        for t in (0..n).step_by(KEY_TILE) {
            let len = KEY_TILE.min(n - t);
            let (values, stride) = v.view(t, len, head.clone(), tile);
            weighted_rows((&scores[t..], n), (values, stride, len), D, o);
        }
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (contexts, passes): (&[usize], usize) = if quick { (&[4096], 3) } else { (&[4096, 16384, 32768], 7) };
    let mut unit = noise(0x4B56);
    println!("kernel level: {}", isa().name());
    let two = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("a pool of 2 threads");
    let kvd = KV_HEADS * D;
    for &n in contexts {
        let row: Vec<f32> = (0..kvd).map(|_| unit()).collect();
        let caches: Vec<(KvType, KvRows, KvRows)> = KvType::ALL
            .into_iter()
            .map(|ty| {
                let (mut k, mut v) = (KvRows::new(ty, n, kvd), KvRows::new(ty, n, kvd));
                for r in 0..n {
                    // Shifted rows: distinct keys without a second RNG pass.
                    let shift = r % kvd;
                    let shifted: Vec<f32> = row[shift..].iter().chain(&row[..shift]).copied().collect();
                    k.write_row(r, &shifted);
                    v.write_row(r, &row);
                }
                (ty, k, v)
            })
            .collect();
        let q: Vec<f32> = (0..HEADS * D).map(|_| unit()).collect();
        let mut scores = vec![0.0; HEADS * n];
        let mut tile = vec![0.0; KEY_TILE * D * KV_HEADS];
        let mut out = vec![0.0; HEADS * D];
        // (type, parallel) -> best us; one pass times every variant in turn.
        let variants: Vec<(usize, bool)> = (0..caches.len()).flat_map(|i| [(i, false), (i, true)]).collect();
        let mut best = vec![f64::INFINITY; variants.len()];
        for _ in 0..passes {
            for (b, &(i, parallel)) in variants.iter().enumerate() {
                let (_, k, v) = &caches[i];
                let t = Instant::now();
                let mut run = || attend((k, v), n, &q, (&mut scores, &mut tile), &mut out, parallel);
                if parallel {
                    two.install(run);
                } else {
                    run();
                }
                black_box(&out);
                best[b] = best[b].min(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        println!("\ncontext {n}:");
        println!("| KV cache | bytes per layer | us, KV heads in turn | f32 / this | us, KV heads on 2 threads | in turn / on 2 threads |");
        println!("|---|---|---|---|---|---|");
        for (i, (ty, k, v)) in caches.iter().enumerate() {
            let mb = (k.bytes() + v.bytes()) as f64 / (1 << 20) as f64;
            let (serial, parallel) = (best[2 * i], best[2 * i + 1]);
            println!(
                "| {ty} | {mb:.1} MiB | {serial:.0} | {:.2} | {parallel:.0} | {:.2} |",
                best[0] / serial,
                serial / parallel
            );
        }
    }
}
