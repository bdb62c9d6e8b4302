//! Attention's weighted rows on AVX-512 F (`attend::weighted_rows`),
//! chosen at run time (`simd::has_avx512f`), the same bits as the AVX2
//! kernel and the scalar twin: a weighted output column is one fused chain
//! over the keys, so sixteen columns a register change nothing but the
//! width. (The scores' kernels are `attend::scores`'.)

use super::avx2;
use std::arch::x86_64::*;

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

/// `BlockInputs`' layout: each input's whole vectors of eight, two inputs a
/// 512-bit vector, `[pair][vector k][input 2p's eight, input 2p + 1's]`,
/// the upper half zero for an odd last input.
pub(crate) fn pair_inputs(x: &[f32], cols: usize) -> Vec<f32> {
    let whole = cols / 8;
    let nt = x.len() / cols;
    let mut paired = vec![0f32; nt.div_ceil(2) * whole * 16];
    for (t, xt) in x.chunks_exact(cols).enumerate() {
        let (p, half) = (t / 2, t % 2);
        for (k, v) in xt.chunks_exact(8).enumerate() {
            let at = (p * whole + k) * 16 + half * 8;
            paired[at..at + 8].copy_from_slice(v);
        }
    }
    paired
}

/// Rows and input pairs of a full register tile: 8 x 3 is 24
/// accumulators of two dot products each, and each pass of the inputs
/// (from L2: a chunk's worth of them is more than L1 holds) feeds 8 rows.
const PAIRED_ROWS: usize = 8;
const PAIRED_PAIRS: usize = 3;

/// `simd::matmul_block` with its inputs two to a vector (`pair_inputs`):
/// each half of an accumulator is one pair's eight lanes, fed the same
/// fused products in the same order as `avx2::matmul_block`'s and summed by
/// the same `hsum`, the tail added unfused from `x`; so the same bits,
/// sixteen lanes an instruction.
///
/// # Safety
/// AVX-512 F, AVX2 and FMA; `w` and `x` hold whole rows of `cols`, `paired`
/// is `pair_inputs(x, cols)` and `out` holds `(w.len() / cols) * (x.len() /
/// cols)` floats.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn matmul_paired(w: &[f32], x: &[f32], paired: &[f32], cols: usize, out: &mut [f32]) {
    let (nr, nt, whole) = (w.len() / cols, x.len() / cols, cols / 8);
    let pairs = nt.div_ceil(2);
    let at = Paired { cols, whole, nt };
    let mut r = 0;
    while r < nr {
        let rr = [PAIRED_ROWS, 4].into_iter().find(|&rr| nr - r >= rr).unwrap_or(1);
        let mut p = 0;
        while p < pairs {
            let pp = if pairs - p >= PAIRED_PAIRS { PAIRED_PAIRS } else { 1 };
            // SAFETY: rows r..r + rr, pairs p..p + pp (inputs 2p.. below
            // nt) and their outputs lie inside the caller's slices.
            unsafe {
                let (wp, pp_ptr) = (w.as_ptr().add(r * cols), paired.as_ptr().add(p * whole * 16));
                let (xp, op) = (x.as_ptr().add(2 * p * cols), out.as_mut_ptr().add(r * nt + 2 * p));
                let inputs = (nt - 2 * p).min(2 * pp);
                match (rr, pp) {
                    (PAIRED_ROWS, PAIRED_PAIRS) => {
                        paired_tile::<PAIRED_ROWS, PAIRED_PAIRS>(wp, pp_ptr, xp, inputs, op, at)
                    }
                    (PAIRED_ROWS, _) => paired_tile::<PAIRED_ROWS, 1>(wp, pp_ptr, xp, inputs, op, at),
                    (4, PAIRED_PAIRS) => paired_tile::<4, PAIRED_PAIRS>(wp, pp_ptr, xp, inputs, op, at),
                    (4, _) => paired_tile::<4, 1>(wp, pp_ptr, xp, inputs, op, at),
                    (_, PAIRED_PAIRS) => paired_tile::<1, PAIRED_PAIRS>(wp, pp_ptr, xp, inputs, op, at),
                    _ => paired_tile::<1, 1>(wp, pp_ptr, xp, inputs, op, at),
                }
            }
            p += pp;
        }
        r += rr;
    }
}

/// A paired product's widths: row length, whole vectors, inputs (the
/// outputs' row stride).
#[derive(Clone, Copy)]
struct Paired {
    cols: usize,
    whole: usize,
    nt: usize,
}

/// `R` rows at `wp` against the `P` pairs at `pp` (their first `inputs`
/// inputs real, from `xp` on) into `op[i * nt + t]`.
///
/// # Safety
/// AVX-512 F, AVX2 and FMA; those rows, pairs, inputs and outputs exist.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn paired_tile<const R: usize, const P: usize>(
    wp: *const f32,
    pp: *const f32,
    xp: *const f32,
    inputs: usize,
    op: *mut f32,
    at: Paired,
) {
    let Paired { cols, whole, nt } = at;
    let mut acc = [[_mm512_setzero_ps(); P]; R];
    for k in 0..whole {
        // SAFETY: vector k of each pair and of each row.
        unsafe {
            let xv: [__m512; P] = std::array::from_fn(|j| _mm512_loadu_ps(pp.add((j * whole + k) * 16)));
            for (i, a) in acc.iter_mut().enumerate() {
                let half = _mm256_loadu_pd(wp.add(i * cols + 8 * k).cast());
                let wv = _mm512_castpd_ps(_mm512_broadcast_f64x4(half));
                for (aj, xj) in a.iter_mut().zip(&xv) {
                    *aj = _mm512_fmadd_ps(wv, *xj, *aj);
                }
            }
        }
    }
    for (i, a) in acc.iter().enumerate() {
        for (j, aj) in a.iter().enumerate() {
            let halves =
                [_mm512_castps512_ps256(*aj), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(*aj), 1))];
            for (h, v) in halves.into_iter().enumerate() {
                let t = 2 * j + h;
                if t >= inputs {
                    break;
                }
                let mut s = avx2::hsum(v);
                // SAFETY: the tail of row i and input t; output (i, t).
                unsafe {
                    for c in 8 * whole..cols {
                        s += *wp.add(i * cols + c) * *xp.add(t * cols + c);
                    }
                    *op.add(i * nt + t) = s;
                }
            }
        }
    }
}
