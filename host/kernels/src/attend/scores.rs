//! Attention's scores `q . k` with the queries in the vector lanes.
//!
//! A score is one fused multiply-add chain over the head's columns in
//! order, from zero: `s = fma(q[c], k[c], s)` for `c = 0..d`. Each SIMD
//! lane runs exactly that chain for one (query, key) pair, so every level
//! and every block shape gives the twin's bits.
//!
//! Why this form and not `dot8` (eight lanes over the columns, summed at
//! the end): with the columns in the lanes, every pair ends in a
//! horizontal sum, and on AVX-512 the sums, the broadcast keys and the
//! inserted queries made two operations for each multiply-add; the scores
//! ran at 41 GMAC/s (2048 keys) and 33 (16384) of this machine's 85. With
//! the queries in the lanes (a column of up to 32 queries a vector, a key's
//! value broadcast to it) there is nothing to sum: 85 and 64 GMAC/s in the
//! same measurement (docs/PERFORMANCE.md, "Attention's scores with the
//! queries in the lanes"). The price is the queries' transposition
//! (`QueryColumns`, once per block of queries, not per run of keys) and
//! the scores' (eight keys by eight queries in registers, on the way out).

use crate::quant::simd::fused_mul_add;

#[cfg(target_arch = "x86_64")]
use crate::quant::simd::{has_avx2, has_avx512f};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

/// Queries per column block at most: two AVX-512 vectors of lanes.
const BLOCK: usize = 32;

/// The lanes of a block of `n` queries (`1..=BLOCK`): the fewest whole
/// AVX2 vectors up to one, then AVX-512 vectors, so a decode token's
/// eight query heads take one AVX2 vector and no padding.
fn lanes(n: usize) -> usize {
    match n {
        0..=8 => 8,
        9..=16 => 16,
        _ => BLOCK,
    }
}

/// The queries of a block of heads, transposed for `key_scores`: blocks of
/// up to `BLOCK` queries, each `[d][lanes]` (query `t`'s column `c` at `c *
/// lanes + t`), the lanes past the queries zero.
pub struct QueryColumns<'a> {
    columns: &'a [f32],
    n: usize,
    d: usize,
}

impl<'a> QueryColumns<'a> {
    /// Floats `new` needs for `n` queries of `d` columns: the plan counts
    /// them wherever attention holds a buffer of queries.
    pub fn len(n: usize, d: usize) -> usize {
        let whole = n / BLOCK * BLOCK;
        let rest = if n > whole { lanes(n - whole) } else { 0 };
        (whole + rest) * d
    }

    /// `queries` (`[n][d]`, rows) into `buf` (at least `len(n, d)` floats).
    pub fn new(queries: &[f32], d: usize, buf: &'a mut [f32]) -> QueryColumns<'a> {
        assert!(d > 0 && queries.len().is_multiple_of(d), "QueryColumns: queries are not whole rows");
        let n = queries.len() / d;
        let columns = &mut buf[..Self::len(n, d)];
        let mut at = 0;
        for block in queries.chunks(BLOCK * d) {
            let (m, l) = (block.len() / d, lanes(block.len() / d));
            let cols = &mut columns[at..at + l * d];
            for (c, col) in cols.chunks_exact_mut(l).enumerate() {
                for (t, v) in col.iter_mut().enumerate() {
                    *v = if t < m { block[t * d + c] } else { 0.0 };
                }
            }
            at += l * d;
        }
        QueryColumns { columns, n, d }
    }

    pub fn queries(&self) -> usize {
        self.n
    }

    pub fn width(&self) -> usize {
        self.d
    }

    /// Each block: its first query, its queries, its lanes and its columns.
    fn blocks(&self) -> impl Iterator<Item = (usize, usize, usize, &[f32])> {
        let mut at = 0;
        (0..self.n).step_by(BLOCK).map(move |q0| {
            let m = BLOCK.min(self.n - q0);
            let l = lanes(m);
            let cols = &self.columns[at..at + l * self.d];
            at += l * self.d;
            (q0, m, l, cols)
        })
    }
}

/// Which kernels run the blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Level {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// Blocks of more than eight lanes on AVX-512, the rest on AVX2.
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Level {
    /// The fastest this CPU runs.
    pub(super) fn detect() -> Level {
        #[cfg(target_arch = "x86_64")]
        if has_avx512f() {
            return Level::Avx512;
        }
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            return Level::Avx2;
        }
        Level::Portable
    }
}

/// `out[t * out_stride + j]` = the chain of query `t` and key `j`, for
/// every query of `queries` and the `n_keys` keys at `keys[j *
/// key_stride..][..d]` (the caller checked that they fit), on `level`
/// (which this CPU runs).
pub(super) fn scores(
    level: Level,
    queries: &QueryColumns<'_>,
    (keys, key_stride, n_keys): (&[f32], usize, usize),
    out: &mut [f32],
    out_stride: usize,
) {
    for (q0, m, l, cols) in queries.blocks() {
        let out = &mut out[q0 * out_stride..];
        let d = queries.d;
        match level {
            // SAFETY (both): the level's features were detected (`detect`,
            // or the tests' own check); `cols` is `[d][l]` and the keys and
            // the outputs (m rows of `out_stride`, n_keys each) lie in their
            // slices (checked by `key_scores`).
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 if l > 8 => unsafe {
                avx512::block(cols, l, m, d, (keys.as_ptr(), key_stride, n_keys), out.as_mut_ptr(), out_stride)
            },
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 | Level::Avx512 => unsafe {
                avx2::block(cols, l, m, d, (keys.as_ptr(), key_stride, n_keys), out.as_mut_ptr(), out_stride)
            },
            Level::Portable => block_scalar(cols, l, m, d, (keys, key_stride, n_keys), out, out_stride),
        }
    }
}

/// The portable twin of one block.
fn block_scalar(
    cols: &[f32],
    l: usize,
    m: usize,
    d: usize,
    (keys, key_stride, n_keys): (&[f32], usize, usize),
    out: &mut [f32],
    out_stride: usize,
) {
    for t in 0..m {
        for j in 0..n_keys {
            let k = &keys[j * key_stride..][..d];
            out[t * out_stride + j] = (0..d).fold(0.0, |s, c| fused_mul_add(cols[c * l + t], k[c], s));
        }
    }
}

/// The definition, from the queries' rows: the tests' reference.
#[cfg(test)]
pub(super) fn score(q: &[f32], k: &[f32]) -> f32 {
    q.iter().zip(k).fold(0.0, |s, (&a, &b)| fused_mul_add(a, b, s))
}
