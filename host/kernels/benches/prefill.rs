//! A prefill chunk's products on this machine: `QMatrix::matvec_many` and
//! `expert_forward_batch` (one weight load per tile of tokens) against one
//! `matvec` / `expert_forward_act` per token (what decode, and prefill
//! before them, ran), interleaved in one run, on 1 and 2 threads, beside
//! the machine's FMA peak (an FMA loop with independent accumulators, as
//! wide as the f32 kernels in force: sixteen lanes with AVX-512 F), per
//! thread. Both forms give the same bits, except for
//! rvq3, whose batch is `rvq_dense`'s product (within f32 rounding of the
//! walk; its token counts straddle that product's switch to decoded rows).
//!
//! Shapes: the peer benchmark's Qwen3-MoE (hidden 2048, 32 query and 4 KV
//! heads of 128, experts of width 768): the q projection over a chunk of
//! 512 tokens, and one expert over 16, 64 and 256 tokens (a 2048-token
//! chunk routes 64 tokens per expert on average with top-8 of 256).
//! GMAC/s is multiply-accumulates per second, best of `REPEATS`.
//!
//! The q4 products are int8 (`quant::int8`): their "% of peak" is of the
//! integer ceiling at the level in force (`vpdpbusd` or `maddubs`); GGUF
//! Q2_K's-Q6_K's and IQ4_XS's are int16 (`quant::ggml::int16`), of `vpdpwssd`'s or
//! `pmaddwd`'s; the others' of the FMA peak.
//!
//! `cargo bench -p waste-kernels --bench prefill` (`--quick`: fewer tokens;
//! `--isa=avx2` etc.: a lower kernel level than the CPU's best).

mod common;

use std::hint::black_box;

use common::{int16_peak_gmacs, int8_peak_gmacs, noise, peak_gmacs, side_by_side};

use waste_kernels::pool::Pool;
use waste_kernels::quant::ggml::GgmlType;
use waste_kernels::quant::{
    build_gate_up_tables, encode_expert, expert_forward_act, expert_forward_batch, fit_layer_codebooks, force_isa, isa,
    quantize_trunk, Activation, ExpertBatchScratch, ExpertF32, ExpertFormat, ExpertScratch, ExpertShape, GgmlExpert,
    Isa, QMatrix, TrunkFormat,
};

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let mut unit = noise(0x5EED);
    if let Some(name) = std::env::args().find_map(|a| a.strip_prefix("--isa=").map(str::to_string)) {
        let level = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon].into_iter().find(|l| l.name() == name);
        force_isa(level.unwrap_or_else(|| panic!("--isa={name}: not a level"))).expect("a level this CPU has");
    }
    println!("kernel level: {}", isa().name());
    for threads in [1, 2] {
        let pool = Pool::new(Some(threads), None).expect("pool");
        let peak = pool.install(|| peak_gmacs(threads)).expect("pool");
        let int8 = pool.install(|| int8_peak_gmacs(threads, isa().name())).expect("pool");
        print!("\n{threads} thread(s): FMA peak {peak:.1} GMAC/s ({} lanes)", common::fma_lanes());
        match int8 {
            Some((p, how)) => println!(", int8 peak {p:.1} GMAC/s ({how})"),
            None => println!(),
        }
        let int8_peak = int8.map_or(f64::NAN, |(p, _)| p);
        let int16 = pool.install(|| int16_peak_gmacs(threads, isa().name())).expect("pool");
        if let Some((p, how)) = int16 {
            println!("int16 peak {p:.1} GMAC/s ({how}): GGUF's int16 types' products");
        }
        let int16_peak = int16.map_or(f64::NAN, |(p, _)| p);
        let peak_of = |fmt: TrunkFormat| match fmt {
            TrunkFormat::Q4 => int8_peak,
            TrunkFormat::Ggml(_) => int16_peak,
            _ => peak,
        };
        println!(
            "{:<22} {:>7} {:>14} {:>14} {:>7} {:>9}",
            "product", "tokens", "per token", "batched", "ratio", "% of peak"
        );
        // The q projection of a chunk.
        let (rows, cols, n) = (4096, 2048, if quick { 128 } else { 512 });
        for fmt in
            [TrunkFormat::Q4, TrunkFormat::Q8, TrunkFormat::Ggml(GgmlType::Q4K), TrunkFormat::Ggml(GgmlType::Q6K)]
        {
            let w: Vec<f32> = (0..rows * cols).map(|_| unit() * 0.05).collect();
            let m = QMatrix::from_byte_vec(fmt, rows, cols, trunk_bytes(fmt, &w, rows, cols)).expect("matrix");
            let x: Vec<f32> = (0..n * cols).map(|_| unit()).collect();
            let mut y = vec![0f32; n * rows];
            let (one, many) = side_by_side(
                &pool,
                || {
                    for (xt, yt) in x.chunks_exact(cols).zip(y.chunks_exact_mut(rows)) {
                        m.matvec(xt, yt);
                    }
                    black_box(&y);
                },
                || {
                    let mut z = vec![0f32; n * rows];
                    m.matvec_many(&x, &mut z);
                    black_box(&z);
                },
            );
            report(&format!("q_proj {} 4096x2048", fmt.name()), n, (rows * cols * n) as f64, one, many, peak_of(fmt));
        }
        // Decode: one input at a time over matrices that are not in any
        // cache (64 q_proj-sized matrices, 268 MB in q4), as a token's
        // experts and trunk are.
        for (fmt, rows, cols) in [
            (TrunkFormat::Q4, rows, cols),
            (TrunkFormat::Q8, rows, cols),
            (TrunkFormat::Q4, 1024, 2304),
            (TrunkFormat::Q4, 2304, 1024),
            (TrunkFormat::Ggml(GgmlType::Q4K), rows, cols),
            (TrunkFormat::Ggml(GgmlType::Q6K), rows, cols),
            (TrunkFormat::Ggml(GgmlType::Q3K), rows, cols),
            (TrunkFormat::Ggml(GgmlType::Q2K), rows, cols),
            (TrunkFormat::Ggml(GgmlType::Q8_0), rows, cols),
        ] {
            let w: Vec<f32> = (0..rows * cols).map(|_| unit() * 0.05).collect();
            let bytes = trunk_bytes(fmt, &w, rows, cols);
            let set: Vec<QMatrix> = (0..if quick { 16 } else { 64 } * 4096 * 2048 / (rows * cols))
                .map(|_| QMatrix::from_byte_vec(fmt, rows, cols, bytes.clone()).expect("matrix"))
                .collect();
            let x: Vec<f32> = (0..cols).map(|_| unit()).collect();
            let pass = |forward: bool| {
                let mut y = vec![0f32; rows];
                let order: Vec<&QMatrix> = if forward { set.iter().collect() } else { set.iter().rev().collect() };
                for m in order {
                    m.matvec(&x, &mut y);
                }
                black_box(&y);
            };
            // Both orders, so neither pass finds the other's last matrices
            // in the cache.
            let (a, b) = side_by_side(&pool, || pass(true), || pass(false));
            let best = a.min(b);
            let gb = (bytes.len() * set.len()) as f64 / 1e9;
            println!(
                "{:<22} {:>7} {:>9.1} GMAC/s {:>7.1} GB/s from DRAM",
                format!("decode {} {rows}x{cols}", fmt.name()),
                1,
                (rows * cols * set.len()) as f64 / best / 1e9,
                gb / best
            );
        }
        // One expert over the tokens routed to it.
        let shape = ExpertShape::new(2048, 768);
        let size = shape.hidden * shape.inter;
        let (g, u, d): (Vec<f32>, Vec<f32>, Vec<f32>) = (
            (0..size).map(|_| unit() * 0.05).collect(),
            (0..size).map(|_| unit() * 0.05).collect(),
            (0..size).map(|_| unit() * 0.05).collect(),
        );
        let view = ExpertF32 { gate: &g, up: &u, down: &d, biases: None };
        let q4k = GgmlType::Q4K;
        // rvq3's codebooks fitted on this expert (the speed depends on the
        // shapes, not on how well they fit).
        let rvq3_books = fit_layer_codebooks(ExpertFormat::Rvq3, shape, &[view], 7);
        for fmt in [
            ExpertFormat::Q4,
            ExpertFormat::Q8,
            ExpertFormat::Ggml(GgmlExpert { gate: q4k, up: q4k, down: q4k }),
            ExpertFormat::Rvq3,
        ] {
            let cb = if fmt == ExpertFormat::Rvq3 { rvq3_books.as_ref() } else { None };
            let payload = match fmt {
                ExpertFormat::Ggml(_) => {
                    let slab = |w: &[f32], rows, cols| trunk_bytes(TrunkFormat::Ggml(q4k), w, rows, cols);
                    [
                        slab(&g, shape.inter, shape.hidden),
                        slab(&u, shape.inter, shape.hidden),
                        slab(&d, shape.hidden, shape.inter),
                    ]
                    .concat()
                }
                _ => encode_expert(fmt, shape, &view, cb),
            };
            let counts = match (fmt, quick) {
                // Around `rvq_dense`'s switch from registers to decoded rows.
                (ExpertFormat::Rvq3, _) => vec![1, 2, 3, 4, 8, 16, 64],
                (_, true) => vec![16, 64],
                (_, false) => vec![16, 64, 256],
            };
            for tokens in counts {
                let xs: Vec<f32> = (0..tokens * shape.hidden).map(|_| unit()).collect();
                let mut out = vec![0f32; xs.len()];
                let mut scratch = ExpertScratch::new(fmt, shape);
                let mut batch = ExpertBatchScratch::new(fmt, shape);
                let (one, many) = {
                    let mut per_token = || {
                        for (x, o) in xs.chunks_exact(shape.hidden).zip(out.chunks_exact_mut(shape.hidden)) {
                            let tables = build_gate_up_tables(fmt, cb, x);
                            expert_forward_act(fmt, shape, &payload, cb, &tables, x, o, &mut scratch, Activation::Silu);
                        }
                        black_box(&out);
                    };
                    let mut batched = || {
                        let mut o = vec![0f32; xs.len()];
                        expert_forward_batch(fmt, shape, &payload, cb, &xs, &mut o, &mut batch, Activation::Silu);
                        black_box(&o);
                    };
                    side_by_side(&pool, &mut per_token, &mut batched)
                };
                report(
                    &format!("expert {} 3x768x2048", fmt.name()),
                    tokens,
                    (3 * size * tokens) as f64,
                    one,
                    many,
                    match fmt {
                        ExpertFormat::Q4 => int8_peak,
                        ExpertFormat::Ggml(_) => int16_peak,
                        _ => peak,
                    },
                );
            }
        }
    }
}

fn report(what: &str, tokens: usize, macs: f64, one: f64, many: f64, peak: f64) {
    let (g1, g2) = (macs / one / 1e9, macs / many / 1e9);
    println!(
        "{what:<22} {tokens:>7} {g1:>9.1} GMAC/s {g2:>7.1} GMAC/s {:>6.2}x {:>8.0}%",
        one / many,
        100.0 * g2 / peak
    );
}

/// A trunk matrix's bytes: quantised, or for GGUF's Q2_K-Q6_K and Q8_0
/// random blocks with weight-sized f16 scales (no quantiser for them here; the
/// products' speed does not depend on the values).
fn trunk_bytes(fmt: TrunkFormat, w: &[f32], rows: usize, cols: usize) -> Vec<u8> {
    let TrunkFormat::Ggml(ty) = fmt else {
        return quantize_trunk(fmt, w, rows, cols);
    };
    let scales: &[usize] = match ty {
        GgmlType::Q4K => &[0, 2],
        GgmlType::Q6K => &[208],
        GgmlType::Q3K => &[108],
        GgmlType::Q2K => &[80, 82],
        GgmlType::Q8_0 => &[0],
        _ => panic!("trunk_bytes: Q2_K, Q3_K, Q4_K, Q6_K and Q8_0 only"),
    };
    let mut bytes: Vec<u8> = w
        .iter()
        .take(ty.matrix_bytes(rows, cols).expect("whole blocks"))
        .map(|v| ((v * 5e3) as i32 & 0xFF) as u8)
        .collect();
    bytes.resize(ty.matrix_bytes(rows, cols).expect("whole blocks"), 0x5A);
    let d = half::f16::from_f32(0.002).to_bits().to_le_bytes();
    for block in bytes.chunks_exact_mut(ty.block_bytes()) {
        for &at in scales {
            block[at..at + 2].copy_from_slice(&d);
        }
    }
    bytes
}
