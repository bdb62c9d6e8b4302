//! rvq3 and rvq2 over the tokens of a prefill chunk: each row as its values
//! (the stages' codebook entries summed), multiplied in register tiles,
//! instead of one lookup-table walk per token.
//!
//! Decode computes an RVQ row as `scale * sum_j table[j][code_j]` over
//! tables built from each token's input (`expert::RvqRef`): the tables cost
//! a token 2.5 M multiply-adds on a Kimi-Linear expert and the lookups
//! cannot be shared between tokens, so a prompt used to run at decode's
//! speed. Here the definition is
//!
//! ```text
//! y[t][r] = scale_r * dot8(q_r, x_t),
//! q_r[8v + d] = (C_0[c_{r,v,0}][d] + C_1[c_{r,v,1}][d]) (+ C_2[c_{r,v,2}][d]),
//! ```
//!
//! `dot8` being `matmul_block`'s pair product (`simd::dot8_scalar`). With
//! many tokens a task decodes a few rows into f32 once and runs every
//! token against them (`decoded::matmul_decoded`); with few it adds the
//! entries in registers and never stores the row (`dots`). Both are that
//! definition bit for bit, so a token's result depends on neither its
//! chunk nor the tokens it shares an expert with.
//!
//! Against decode's walk the arithmetic differs (the same products, summed
//! in another order): an expert's output is within 1e-5 of the walk's
//! largest value (`quant::tests::expert_batch_is_bit_identical_to_each_token_alone`),
//! and the fixtures' logits within the bounds
//! `prefill::chunked_prefill_logits_match_token_at_a_time_on_every_fixture_and_format`
//! states per trunk format (tests/integration/prefill.rs).

#[cfg(target_arch = "x86_64")]
mod avx2;

use super::decoded::{by_row_blocks, matmul_decoded};
use super::rvq::Codebooks;
use super::simd::{self, dot8_scalar, f16_at, Isa};
use super::{CODEBOOK_ENTRIES, VDIM};

/// Below this many tokens per matrix the entries are added in registers
/// per token (`dots`); from it on rows are decoded once for all tokens.
/// Speed only, never the result. Measured in docs/PERFORMANCE.md ("rvq3
/// over a prompt as a matrix product").
pub(crate) const DECODED_FROM: usize = 3;
/// Rows per task of the few-token path (a task's codes, 128 x 864 bytes
/// for a Kimi-Linear gate, stay in L2 while its tokens pass over them).
const TASK_ROWS: usize = 128;

/// An rvq3/rvq2 matrix: `rows` f16 scales, then per row `ceil(cols / 8)`
/// vectors of `stages` codes, over the layer's codebooks.
pub(crate) struct DenseRvq<'a> {
    rows: usize,
    cols: usize,
    scales: &'a [u8],
    codes: &'a [u8],
    books: &'a Codebooks,
}

impl<'a> DenseRvq<'a> {
    /// Panics unless `bytes` is exactly such a matrix for `books`' stage
    /// count (payloads are checked by `check_expert_payload` first).
    pub(crate) fn new(bytes: &'a [u8], rows: usize, cols: usize, books: &'a Codebooks) -> Self {
        let per_row = cols.div_ceil(VDIM) * books.stages();
        assert_eq!(bytes.len(), rows * (2 + per_row), "rvq matrix bytes");
        let (scales, codes) = bytes.split_at(2 * rows);
        DenseRvq { rows, cols, scales, codes, books }
    }

    fn codes_per_row(&self) -> usize {
        self.cols.div_ceil(VDIM) * self.books.stages()
    }

    fn row_codes(&self, r: usize) -> &'a [u8] {
        let n = self.codes_per_row();
        &self.codes[r * n..(r + 1) * n]
    }

    /// Row `r`'s values before its scale, `q_r` of the module docs.
    pub(crate) fn row_values(&self, r: usize, out: &mut [f32]) {
        assert_eq!(out.len(), self.cols, "row_values: out.len() != cols");
        #[cfg(target_arch = "x86_64")]
        if self.fast_kernels(simd::isa()) {
            // SAFETY: `fast_kernels` checked AVX2, the stages and the entry
            // count; row r exists (`row_codes` slices it) and `out` is a
            // whole row.
            return unsafe { avx2::row_values(self, r, out) };
        }
        self.row_values_scalar(r, out)
    }

    /// `row_values`' portable form, the definition.
    pub(crate) fn row_values_scalar(&self, r: usize, out: &mut [f32]) {
        assert_eq!(out.len(), self.cols, "row_values: out.len() != cols");
        let stages = self.books.stages();
        for (o, cv) in out.chunks_mut(VDIM).zip(self.row_codes(r).chunks_exact(stages)) {
            self.vector_values(cv, o);
        }
    }

    /// One vector's values from its stage codes `cv`, the first `o.len()`.
    fn vector_values(&self, cv: &[u8], o: &mut [f32]) {
        let mut q = [0f32; VDIM];
        q.copy_from_slice(self.books.entry(0, cv[0] as usize));
        for (s, &c) in cv.iter().enumerate().skip(1) {
            for (qd, e) in q.iter_mut().zip(self.books.entry(s, c as usize)) {
                *qd += e;
            }
        }
        o.copy_from_slice(&q[..o.len()]);
    }

    /// Whether the AVX2 kernels serve this matrix at `level`: rvq3 and
    /// rvq2 on 256-entry books (the only ones they index).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn fast_kernels(&self, level: Isa) -> bool {
        level >= Isa::Avx2 && matches!(self.books.stages(), 2 | 3) && self.books.entries() == CODEBOOK_ENTRIES
    }

    /// `y[t][r]` of the module docs for the `n = x.len() / cols` inputs of
    /// `x` (`[n, cols]`, `y` `[n, rows]`). Panics unless the lengths agree.
    pub(crate) fn matmul(&self, x: &[f32], y: &mut [f32]) {
        let (rows, cols) = (self.rows, self.cols);
        assert!(cols > 0 && x.len().is_multiple_of(cols), "rvq matmul: x of {} is not whole rows of {cols}", x.len());
        let n = x.len() / cols;
        assert_eq!(y.len(), n * rows, "rvq matmul: y length");
        if n == 0 || rows == 0 {
            return;
        }
        if n >= DECODED_FROM {
            matmul_decoded(rows, cols, &|r, out: &mut [f32]| self.row_values(r, out), x, y);
        } else {
            // Tasks own blocks of rows and run each of the few inputs over
            // them.
            let level = simd::isa();
            by_row_blocks((rows, cols, n), TASK_ROWS, y, |b, out| {
                let (r0, nr) = (b * TASK_ROWS, out.len() / n);
                for (t, xt) in x.chunks_exact(cols).enumerate() {
                    let mut ys = [0f32; TASK_ROWS];
                    self.dots_at(level, r0, xt, &mut ys[..nr]);
                    for (i, &v) in ys[..nr].iter().enumerate() {
                        out[i * n + t] = v;
                    }
                }
            });
        }
        for yt in y.chunks_exact_mut(rows) {
            for (r, v) in yt.iter_mut().enumerate() {
                *v *= f16_at(self.scales, r);
            }
        }
    }

    /// `ys[i] = dot8(q_{r0 + i}, x)` (unscaled) on the kernels of `level`.
    pub(crate) fn dots_at(&self, level: Isa, r0: usize, x: &[f32], ys: &mut [f32]) {
        assert!(x.len() == self.cols && r0 + ys.len() <= self.rows, "rvq dots: inconsistent lengths");
        #[cfg(target_arch = "x86_64")]
        if self.fast_kernels(level) {
            // SAFETY: the level was detected or forced only where the CPU
            // has AVX2 and FMA, with the stages and entries it indexes;
            // rows `r0..r0 + ys.len()` exist and `x` is a whole row,
            // checked above.
            return unsafe { avx2::dots(self, r0, x, ys) };
        }
        let _ = level;
        self.dots_scalar(r0, x, ys)
    }

    /// The definition: each row decoded, then `dot8`.
    pub(crate) fn dots_scalar(&self, r0: usize, x: &[f32], ys: &mut [f32]) {
        let mut q = vec![0f32; self.cols];
        for (i, y) in ys.iter_mut().enumerate() {
            self.row_values_scalar(r0 + i, &mut q);
            *y = dot8_scalar(&q, x);
        }
    }
}

/// Bytes `DenseRvq::matmul` allocates at most for `tokens` inputs of a
/// `[rows, cols]` matrix (the memory plan counts it): the transposed
/// outputs of the few-token path, or `matmul_decoded`'s.
pub(crate) fn matmul_peak_bytes(rows: usize, cols: usize, tokens: usize) -> usize {
    (4 * rows * tokens.min(DECODED_FROM - 1)).max(super::decoded::matmul_decoded_peak_bytes(rows, cols, tokens))
}

#[cfg(test)]
mod tests;
