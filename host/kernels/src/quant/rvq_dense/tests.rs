//! `DenseRvq` held to its definition: every kernel level and both of
//! `matmul`'s paths, bit for bit.

use super::DenseRvq;
use crate::quant::kmeans::{Book, Rng};
use crate::quant::rvq::Codebooks;
use crate::quant::simd::{dot8_scalar, f16_at, Isa};
use crate::quant::tests::{gauss, pool};
use crate::quant::{CODEBOOK_ENTRIES, VDIM};
use half::f16;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Random books and a random `[rows, cols]` matrix over them.
fn matrix(rng: &mut Rng, stages: usize, rows: usize, cols: usize) -> (Codebooks, Vec<u8>) {
    let books = (0..stages).map(|s| Book::new(gauss(rng, CODEBOOK_ENTRIES * VDIM, 1.0 / (1 + s) as f32))).collect();
    let scales = gauss(rng, rows, 0.05).into_iter().flat_map(|v| f16::from_f32(v).to_bits().to_le_bytes());
    let codes = (0..rows * cols.div_ceil(VDIM) * stages).map(|_| rng.next_u64() as u8);
    (Codebooks::from_books(books), scales.chain(codes).collect())
}

/// `y[t][r] = scale_r * dot8(q_r, x_t)`, from the portable row decode.
fn definition(m: &DenseRvq<'_>, x: &[f32]) -> Vec<f32> {
    let mut q = vec![0f32; m.cols];
    let mut y = vec![0f32; (x.len() / m.cols) * m.rows];
    for r in 0..m.rows {
        m.row_values_scalar(r, &mut q);
        for (t, xt) in x.chunks_exact(m.cols).enumerate() {
            y[t * m.rows + r] = f16_at(m.scales, r) * dot8_scalar(&q, xt);
        }
    }
    y
}

/// Whole and partial vectors and four-row passes, rvq3 and rvq2, every
/// level this CPU has, the few-token and decoded-row paths of `matmul`
/// (below and above `DECODED_FROM`, both of `matmul_decoded`'s splits), on
/// one and two threads.
#[test]
fn every_rvq_dense_level_and_path_equals_the_definition_bit_for_bit() {
    let mut rng = Rng::new(71);
    for stages in [3, 2] {
        for (rows, cols) in [(1, 7), (4, 8), (13, 64), (9, 301), (133, 130), (300, 256)] {
            let (books, bytes) = matrix(&mut rng, stages, rows, cols);
            let m = DenseRvq::new(&bytes, rows, cols, &books);
            let (mut fast, mut slow) = (vec![0f32; cols], vec![0f32; cols]);
            for r in 0..rows {
                m.row_values(r, &mut fast);
                m.row_values_scalar(r, &mut slow);
                assert_eq!(bits(&fast), bits(&slow), "stages {stages} {rows}x{cols}: row {r}'s values");
            }
            let x = gauss(&mut rng, cols, 1.0);
            let mut want = vec![0f32; rows];
            m.dots_scalar(0, &x, &mut want);
            for level in Isa::supported() {
                let mut got = vec![f32::NAN; rows];
                m.dots_at(level, 0, &x, &mut got);
                assert_eq!(bits(&got), bits(&want), "stages {stages} {rows}x{cols} {}: dots", level.name());
            }
            for n in [1, 2, super::DECODED_FROM, 5, 100] {
                let x = gauss(&mut rng, n * cols, 1.0);
                let want = definition(&m, &x);
                for threads in [1, 2] {
                    let mut y = vec![f32::NAN; n * rows];
                    pool(threads).install(|| m.matmul(&x, &mut y));
                    assert_eq!(bits(&y), bits(&want), "stages {stages} {rows}x{cols}, {n} inputs, {threads} threads");
                }
            }
        }
    }
}
