//! The scores on AVX-512 F: sixteen queries a vector, one or two vectors
//! (a block's lanes) against eight keys at a time, each key's column
//! broadcast from memory. Sixteen accumulators and the two query columns
//! leave registers for the broadcasts; eight keys a tile is what the 8 x 8
//! transposition on the way out takes.

use std::arch::x86_64::*;

use super::avx2::{store_column, transpose8};

/// Keys a tile.
const KEYS: usize = 8;

/// `avx2::block` for 16 or 32 lanes (`l`): the same chains.
///
/// # Safety
/// AVX-512 F (with AVX2 and FMA); `cols` is `[d][l]`; keys `j < nk` at
/// `kp[j * ks..][..d]` are readable and outputs `out[t * os + j]` (`t < m
/// <= l`) writable.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn block(
    cols: &[f32],
    l: usize,
    m: usize,
    d: usize,
    (kp, ks, nk): (*const f32, usize, usize),
    out: *mut f32,
    os: usize,
) {
    debug_assert!(cols.len() == l * d && m <= l);
    // SAFETY (both): the caller's.
    unsafe {
        match l {
            32 => tiles::<2>(cols, m, d, (kp, ks, nk), out, os),
            _ => tiles::<1>(cols, m, d, (kp, ks, nk), out, os),
        }
    }
}

/// # Safety
/// As `block`, with `l = 16 * V`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn tiles<const V: usize>(
    cols: &[f32],
    m: usize,
    d: usize,
    (kp, ks, nk): (*const f32, usize, usize),
    out: *mut f32,
    os: usize,
) {
    let (l, qp) = (16 * V, cols.as_ptr());
    let whole = nk / KEYS * KEYS;
    let mut j = 0;
    while j < whole {
        let mut acc = [[_mm512_setzero_ps(); V]; KEYS];
        for c in 0..d {
            // SAFETY: column c of the block's lanes, and column c of keys
            // j..j + KEYS.
            unsafe {
                let mut q = [_mm512_setzero_ps(); V];
                for (v, qv) in q.iter_mut().enumerate() {
                    *qv = _mm512_loadu_ps(qp.add(c * l + 16 * v));
                }
                for (i, a) in acc.iter_mut().enumerate() {
                    let k = _mm512_set1_ps(*kp.add((j + i) * ks + c));
                    for (av, qv) in a.iter_mut().zip(&q) {
                        *av = _mm512_fmadd_ps(*qv, k, *av);
                    }
                }
            }
        }
        for v in 0..V {
            for half in 0..2 {
                let first = 16 * v + 8 * half;
                if first >= m {
                    break;
                }
                let mut rows = [_mm256_setzero_ps(); KEYS];
                for (r, a) in rows.iter_mut().zip(&acc) {
                    let z = _mm512_castps_pd(a[v]);
                    *r = _mm256_castpd_ps(if half == 0 {
                        _mm512_castpd512_pd256(z)
                    } else {
                        _mm512_extractf64x4_pd::<1>(z)
                    });
                }
                let queries = transpose8(rows);
                // SAFETY: queries first.. (< m) and keys j..j + KEYS.
                unsafe { store_column(&queries, (m - first).min(8), out.add(first * os + j), os) };
            }
        }
        j += KEYS;
    }
    for j in whole..nk {
        let mut acc = [_mm512_setzero_ps(); V];
        for c in 0..d {
            // SAFETY: as above, for key j alone.
            unsafe {
                let k = _mm512_set1_ps(*kp.add(j * ks + c));
                for (v, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(_mm512_loadu_ps(qp.add(c * l + 16 * v)), k, *a);
                }
            }
        }
        let mut lanes = [0f32; 32];
        for (v, a) in acc.iter().enumerate() {
            // SAFETY: 16 floats at lane 16v of `lanes`.
            unsafe { _mm512_storeu_ps(lanes.as_mut_ptr().add(16 * v), *a) };
        }
        for (t, s) in lanes[..m].iter().enumerate() {
            // SAFETY: query t < m, key j < nk.
            unsafe { *out.add(t * os + j) = *s };
        }
    }
}
