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
