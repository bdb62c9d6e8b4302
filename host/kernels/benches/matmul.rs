//! `QMatrix::matmul` at the Kimi K3 vision tower's shapes (q8 weights, 1024
//! patches), against the formulation it replaced (each dequantised weight
//! row dotted with each input by `dot_f32`, rows in blocks of 8 against
//! blocks of 32 inputs), interleaved in one run, on 1 and 2 threads.
//! GMAC/s is multiply-accumulates per second. Best of `REPEATS` passes.
//!
//! `cargo bench -p waste-kernels --bench matmul` (`--quick`: 256 patches).

use std::hint::black_box;
use std::time::Instant;

use waste_kernels::pool::Pool;
use waste_kernels::quant::{dot_f32, isa, quantize_trunk, QMatrix, TrunkFormat};

const REPEATS: usize = 3;

/// The earlier `QMatrix::matmul` (many-inputs path), from public parts.
fn per_pair_dot(m: &QMatrix, x: &[f32], y: &mut [f32]) {
    use rayon::prelude::*;
    let (rows, cols) = (m.rows(), m.cols());
    y.par_chunks_mut(32 * rows).zip(x.par_chunks(32 * cols)).for_each(|(yb, xb)| {
        let mut w = vec![0f32; 8 * cols];
        for r0 in (0..rows).step_by(8) {
            let nr = 8.min(rows - r0);
            for i in 0..nr {
                m.row(r0 + i, &mut w[i * cols..(i + 1) * cols]);
            }
            for (yt, xt) in yb.chunks_exact_mut(rows).zip(xb.chunks_exact(cols)) {
                for i in 0..nr {
                    yt[r0 + i] = dot_f32(&w[i * cols..(i + 1) * cols], xt);
                }
            }
        }
    });
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let n = if quick { 256 } else { 1024 };
    println!("kernel level: {}; {n} inputs, q8 weights", isa().name());
    // (name, rows, cols): the K3 tower's packed qkv, output, MLP in and MLP
    // out (../shared/design/K3-VISION.md: width 1024, qkv 3 x 1536, MLP 4096).
    let shapes = [("wqkv", 4608, 1024), ("wo", 1024, 1536), ("mlp_fc0", 4096, 1024), ("mlp_fc1", 1024, 4096)];
    println!("{:<8} {:>7} {:>14} {:>14} {:>7}", "matrix", "threads", "per-pair GMAC/s", "tiled GMAC/s", "ratio");
    let mut seed = 0x5EEDu64;
    let mut unit = move || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    for threads in [1, 2] {
        let pool = Pool::new(Some(threads), None).expect("pool");
        for (name, rows, cols) in shapes {
            let w: Vec<f32> = (0..rows * cols).map(|_| unit() * 0.05).collect();
            let m =
                QMatrix::from_byte_vec(TrunkFormat::Q8, rows, cols, quantize_trunk(TrunkFormat::Q8, &w, rows, cols))
                    .expect("q8 matrix");
            let x: Vec<f32> = (0..n * cols).map(|_| unit()).collect();
            let mut y = vec![0f32; n * rows];
            let macs = (rows * cols * n) as f64;
            let (mut old, mut new) = (f64::MAX, f64::MAX);
            for _ in 0..REPEATS {
                let t = Instant::now();
                pool.install(|| per_pair_dot(&m, &x, &mut y)).expect("pool");
                old = old.min(t.elapsed().as_secs_f64());
                black_box(&y);
                let t = Instant::now();
                pool.install(|| m.matmul(&x, &mut y)).expect("pool");
                new = new.min(t.elapsed().as_secs_f64());
                black_box(&y);
            }
            println!(
                "{:<8} {:>7} {:>14.1} {:>14.1} {:>7.2}",
                name,
                threads,
                macs / old / 1e9,
                macs / new / 1e9,
                old / new
            );
        }
    }
}
