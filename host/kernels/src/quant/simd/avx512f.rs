//! Attention's two f32 products on AVX-512 F (`attend::key_scores` and
//! `attend::weighted_rows`), chosen at run time (`simd::has_avx512f`), the
//! same bits as their AVX2 kernels and scalar twins.
//!
//! A score is `dot8`: one 8-lane accumulator per (key, query) pair. A
//! 512-bit register holds two such pairs, a key's eight columns broadcast
//! to both halves against two queries' eight columns side by side, so each
//! lane runs exactly the AVX2 lane's fused chain and each half is summed
//! by the AVX2 `hsum`: half the multiply-adds of the AVX2 tile for the same
//! pairs. A weighted output column is one fused chain over the keys, so
//! sixteen columns a register change nothing but the width.

use super::avx2::{self, hsum};
use std::arch::x86_64::*;

/// Keys per tile of `strided_block`, and pairs of inputs per tile: 6 x 3
/// accumulators, three input pairs and a broadcast key fit the 32
/// registers.
const TILE_KEYS: usize = 6;
const TILE_PAIRS: usize = 3;

/// `avx2::strided_block`, bit for bit: `op[i * o_row + t * o_col] =
/// dot8(row i, input t)` for `nr` rows of `cols` floats at `wp[i * ws..]`
/// and `nt` inputs at `xp[t * xs..]`. Inputs go two to a register; an odd
/// last input runs on the AVX2 tiles.
///
/// # Safety
/// AVX-512 F, AVX2 and FMA; every row, input and output so addressed is
/// readable / writable, and no two outputs alias.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn strided_block(
    wp: *const f32,
    ws: usize,
    nr: usize,
    xp: *const f32,
    xs: usize,
    nt: usize,
    cols: usize,
    op: *mut f32,
    (o_row, o_col): (usize, usize),
) {
    const R: usize = TILE_KEYS;
    const P: usize = TILE_PAIRS;
    let pairs = nt / 2;
    let (whole_r, whole_p) = (nr / R * R, pairs / P * P);
    let at = Tile { ws, xs, cols, o_row, o_col };
    // SAFETY (every call below): rows r.. of the tile's height, input
    // pairs p.. of its width and their outputs lie inside what the caller
    // vouched for.
    let tile = |r: usize, p: usize, rr: usize, pp: usize| unsafe {
        let (wp, xp, op) = (wp.add(r * ws), xp.add(2 * p * xs), op.add(r * o_row + 2 * p * o_col));
        match (rr, pp) {
            (R, P) => pair_tile::<R, P>(wp, xp, op, at),
            (R, 1) => pair_tile::<R, 1>(wp, xp, op, at),
            (1, P) => pair_tile::<1, P>(wp, xp, op, at),
            _ => pair_tile::<1, 1>(wp, xp, op, at),
        }
    };
    for r in (0..whole_r).step_by(R) {
        (0..whole_p).step_by(P).for_each(|p| tile(r, p, R, P));
        (whole_p..pairs).for_each(|p| tile(r, p, R, 1));
    }
    for r in whole_r..nr {
        (0..whole_p).step_by(P).for_each(|p| tile(r, p, 1, P));
        (whole_p..pairs).for_each(|p| tile(r, p, 1, 1));
    }
    if nt % 2 == 1 {
        let t = nt - 1;
        // SAFETY: input t and its outputs are the caller's; AVX2 and FMA
        // come with this function's features.
        unsafe { avx2::strided_block(wp, ws, nr, xp.add(t * xs), xs, 1, cols, op.add(t * o_col), (o_row, o_col)) };
    }
}

/// The strides of one tile's rows, inputs and outputs.
#[derive(Clone, Copy)]
struct Tile {
    ws: usize,
    xs: usize,
    cols: usize,
    o_row: usize,
    o_col: usize,
}

/// Rows `wp[i * ws..]` (i < RR) against input pairs `2p, 2p + 1` (p < PP)
/// at `xp[t * xs..]`, into `op[i * o_row + t * o_col]`.
///
/// # Safety
/// AVX-512 F, AVX2 and FMA; those rows, inputs and outputs exist.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn pair_tile<const RR: usize, const PP: usize>(wp: *const f32, xp: *const f32, op: *mut f32, at: Tile) {
    let Tile { ws, xs, cols, o_row, o_col } = at;
    let whole = cols / 8 * 8;
    let mut acc = [[_mm512_setzero_ps(); PP]; RR];
    let mut k = 0;
    while k < whole {
        let mut xv = [_mm512_setzero_ps(); PP];
        for (p, v) in xv.iter_mut().enumerate() {
            // SAFETY: k + 8 <= cols inside inputs 2p and 2p + 1.
            *v = unsafe {
                let lo = _mm256_castps_pd(_mm256_loadu_ps(xp.add(2 * p * xs + k)));
                let hi = _mm256_castps_pd(_mm256_loadu_ps(xp.add((2 * p + 1) * xs + k)));
                _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castpd256_pd512(lo), hi))
            };
        }
        for (i, a) in acc.iter_mut().enumerate() {
            // SAFETY: k + 8 <= cols inside row i; the same eight columns in
            // both halves.
            let w = unsafe {
                _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(wp.add(i * ws + k)))))
            };
            for (at, v) in a.iter_mut().zip(&xv) {
                *at = _mm512_fmadd_ps(w, *v, *at);
            }
        }
        k += 8;
    }
    for (i, a) in acc.iter().enumerate() {
        for (p, v) in a.iter().enumerate() {
            let halves =
                [_mm512_castps512_ps256(*v), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(*v)))];
            for (h, lanes) in halves.into_iter().enumerate() {
                let t = 2 * p + h;
                let mut s = hsum(lanes);
                for j in whole..cols {
                    // SAFETY: j < cols inside row i and input t.
                    s += unsafe { *wp.add(i * ws + j) * *xp.add(t * xs + j) };
                }
                // SAFETY: output (i, t) of the tile.
                unsafe { *op.add(i * o_row + t * o_col) = s };
            }
        }
    }
}

/// Queries per block of `weighted_rows`: 12 queries x 2 vectors of
/// columns are 24 accumulators, plus two value vectors and a broadcast.
const WEIGHTED_QUERIES: usize = 12;

/// `avx2::weighted_rows` (the definition and its twin are in `attend`):
/// each output column one FMA chain over the keys in order, sixteen
/// columns a register, blocks of queries sharing each value load.
///
/// # Safety
/// AVX-512 F; `p[t * ps + j]` (t < nq, j < nk), `v[j * vs + c]` (c < d) are
/// readable and `out[t * d + c]` writable.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn weighted_rows(
    p: *const f32,
    ps: usize,
    nq: usize,
    v: *const f32,
    vs: usize,
    nk: usize,
    d: usize,
    out: *mut f32,
) {
    // The largest block of 12, 8, 4 or 1 queries that fits what is left.
    let block = |left: usize| [WEIGHTED_QUERIES, 8, 4].into_iter().find(|&q| q <= left).unwrap_or(1);
    super::for_each_weighted_block(nq, nk, avx2::WEIGHTED_KEYS, block, |t, j0, q, keys| {
        // SAFETY: queries t..t+q and keys j0..j0+keys of the caller's.
        unsafe {
            let (p, v, out) = (p.add(t * ps + j0), v.add(j0 * vs), out.add(t * d));
            match q {
                WEIGHTED_QUERIES => weighted_block::<WEIGHTED_QUERIES>(p, ps, v, vs, keys, d, out),
                8 => weighted_block::<8>(p, ps, v, vs, keys, d, out),
                4 => weighted_block::<4>(p, ps, v, vs, keys, d, out),
                _ => weighted_block::<1>(p, ps, v, vs, keys, d, out),
            }
        }
    });
}

/// `weighted_rows` for `Q` queries: columns in blocks of 32, then 16 at a
/// time with the last block masked, each block's accumulators held in
/// registers over all keys.
///
/// # Safety
/// As `weighted_rows`, for `Q` queries.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn weighted_block<const Q: usize>(
    p: *const f32,
    ps: usize,
    v: *const f32,
    vs: usize,
    nk: usize,
    d: usize,
    out: *mut f32,
) {
    let mut c = 0;
    while c + 32 <= d {
        let mut acc = [[_mm512_setzero_ps(); 2]; Q];
        for (t, a) in acc.iter_mut().enumerate() {
            // SAFETY: columns c..c+32 of output t.
            unsafe { *a = [_mm512_loadu_ps(out.add(t * d + c)), _mm512_loadu_ps(out.add(t * d + c + 16))] };
        }
        for j in 0..nk {
            // SAFETY: columns c..c+32 of value row j, weight (t, j).
            unsafe {
                let (v0, v1) = (_mm512_loadu_ps(v.add(j * vs + c)), _mm512_loadu_ps(v.add(j * vs + c + 16)));
                for (t, a) in acc.iter_mut().enumerate() {
                    let w = _mm512_set1_ps(*p.add(t * ps + j));
                    a[0] = _mm512_fmadd_ps(w, v0, a[0]);
                    a[1] = _mm512_fmadd_ps(w, v1, a[1]);
                }
            }
        }
        for (t, a) in acc.iter().enumerate() {
            // SAFETY: columns c..c+32 of output t.
            unsafe {
                _mm512_storeu_ps(out.add(t * d + c), a[0]);
                _mm512_storeu_ps(out.add(t * d + c + 16), a[1]);
            }
        }
        c += 32;
    }
    while c < d {
        // Masked-off lanes are neither read nor written.
        let live = (d - c).min(16);
        let m = ((1u32 << live) - 1) as __mmask16;
        let mut acc = [_mm512_setzero_ps(); Q];
        for (t, a) in acc.iter_mut().enumerate() {
            // SAFETY: the live columns of output t.
            *a = unsafe { _mm512_maskz_loadu_ps(m, out.add(t * d + c)) };
        }
        for j in 0..nk {
            // SAFETY: the live columns of value row j, weight (t, j).
            unsafe {
                let v0 = _mm512_maskz_loadu_ps(m, v.add(j * vs + c));
                for (t, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(_mm512_set1_ps(*p.add(t * ps + j)), v0, *a);
                }
            }
        }
        for (t, a) in acc.iter().enumerate() {
            // SAFETY: the live columns of output t.
            unsafe { _mm512_mask_storeu_ps(out.add(t * d + c), m, *a) };
        }
        c += 16;
    }
}
