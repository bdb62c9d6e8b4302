//! rvq3 expert kernel, every ISA level side by side: time per Kimi-Linear
//! routed expert (gate + up + down through `expert_forward`, gate/up tables
//! built once per token for `TOP_K` experts, as the engine does), with 1
//! and 2 compute threads, the levels **interleaved** pass by pass so that a
//! shared, noisy machine disturbs them alike; read the ratios.
//!
//! `cargo bench -p waste-kernels --bench rvq3` (`--quick`: fewer passes;
//! a positional `k3` adds the K3 shape). Scalar and AVX2 run the portable
//! row kernel on f32 tables; AVX-512 (VBMI) the byte-plane kernel
//! (`quant::simd::avx512`). Experts rotate over `WORKING_SET` bytes of
//! distinct random payloads, so codes come from RAM, as for experts cached
//! in memory. Each figure is the best of the passes.

use std::hint::black_box;
use std::time::Instant;

use half::f16;
use waste_kernels::pool::Pool;
use waste_kernels::quant::{
    build_gate_up_tables, expert_forward, expert_payload_len, force_isa, isa, Codebooks, ExpertFormat, ExpertScratch,
    ExpertShape, Isa, LayerCodebooks,
};

const WORKING_SET: usize = 256 << 20;
const TOP_K: usize = 8;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// A random rvq3 payload: f16 row scales 0.02, random codes.
fn payload(s: ExpertShape, rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::with_capacity(expert_payload_len(ExpertFormat::Rvq3, s));
    for (rows, cols) in [(s.inter, s.hidden), (s.inter, s.hidden), (s.hidden, s.inter)] {
        let sc = f16::from_f32(0.02).to_bits().to_le_bytes();
        for _ in 0..rows {
            out.extend_from_slice(&sc);
        }
        let codes = rows * cols.div_ceil(8) * 3;
        let start = out.len();
        out.resize(start + codes, 0);
        for c in out[start..].chunks_mut(8) {
            let v = rng.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
    assert_eq!(out.len(), expert_payload_len(ExpertFormat::Rvq3, s));
    out
}

fn codebooks(rng: &mut Rng) -> LayerCodebooks {
    let mut book = || {
        let bytes: Vec<u8> = (0..3 * 256 * 8).flat_map(|_| (rng.unit() * 0.5).to_le_bytes()).collect();
        Codebooks::from_bytes(3, &bytes).expect("codebooks")
    };
    LayerCodebooks { gate_up: book(), down: book() }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let k3 = std::env::args().any(|a| a == "k3");
    let (passes, tokens) = if quick { (3, 2) } else { (7, 6) };
    // `--only=avx512` etc.: one level (profiling).
    let only = std::env::args().find_map(|a| a.strip_prefix("--only=").map(str::to_string));
    let levels: Vec<Isa> = [Isa::Scalar, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|l| force_isa(*l).is_ok() && only.as_deref().is_none_or(|o| o == l.name()))
        .collect();
    let best_isa = *levels.last().expect("scalar");
    force_isa(best_isa).expect("level");
    println!("levels: {:?} (best {})", levels, isa().name());
    let mut shapes = vec![("kimi-linear", ExpertShape::new(2304, 1024))];
    if k3 {
        shapes.push(("k3", ExpertShape::new(3584, 3072)));
    }
    let pools: Vec<Pool> = [1, 2].iter().map(|&n| Pool::new(Some(n), None).expect("pool")).collect();
    let fmt = ExpertFormat::Rvq3;
    let mut rng = Rng(0x5EED);
    for (name, s) in shapes {
        let n = WORKING_SET.div_ceil(expert_payload_len(fmt, s)).max(2);
        let experts: Vec<Vec<u8>> = (0..n).map(|_| payload(s, &mut rng)).collect();
        let cb = codebooks(&mut rng);
        let xs: Vec<Vec<f32>> = (0..4).map(|_| (0..s.hidden).map(|_| rng.unit()).collect()).collect();
        let mut next = 0usize;
        let mut pass = |pool: &Pool, tokens: usize| -> f64 {
            let t0 = Instant::now();
            pool.install(|| {
                let mut scratch = ExpertScratch::new(fmt, s);
                let mut out = vec![0f32; s.hidden];
                for t in 0..tokens {
                    let x = &xs[t % xs.len()];
                    let tables = build_gate_up_tables(fmt, Some(&cb), x);
                    for _ in 0..TOP_K {
                        let p = &experts[next % experts.len()];
                        next += 1;
                        expert_forward(fmt, s, p, Some(&cb), &tables, x, &mut out, &mut scratch);
                        black_box(&out);
                    }
                }
            })
            .expect("pool");
            t0.elapsed().as_secs_f64() / (tokens * TOP_K) as f64
        };
        // Warm-up: every expert once (page faults untimed).
        pass(&pools[0], experts.len().div_ceil(TOP_K));
        let mut best = vec![[f64::MAX; 2]; levels.len()];
        for _ in 0..passes {
            for (li, &level) in levels.iter().enumerate() {
                force_isa(level).expect("level");
                for (pi, p) in pools.iter().enumerate() {
                    let sec = pass(p, tokens);
                    best[li][pi] = best[li][pi].min(sec);
                }
            }
        }
        force_isa(best_isa).expect("level");
        println!(
            "{name}: {} experts of {:.2} MB, best of {passes} interleaved passes",
            n,
            expert_payload_len(fmt, s) as f64 / 1e6
        );
        println!(
            "{:<8} {:>12} {:>12} {:>14} {:>14}",
            "isa", "us 1 thread", "us 2 threads", "scalar/this 1t", "scalar/this 2t"
        );
        for (li, level) in levels.iter().enumerate() {
            println!(
                "{:<8} {:>12.1} {:>12.1} {:>14.2} {:>14.2}",
                level.name(),
                best[li][0] * 1e6,
                best[li][1] * 1e6,
                best[0][0] / best[li][0],
                best[0][1] / best[li][1]
            );
        }
    }
}
