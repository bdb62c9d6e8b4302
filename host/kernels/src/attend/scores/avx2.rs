//! The scores on AVX2: eight queries a vector against eight keys at a
//! time (eight accumulators, a query column, a broadcast key), the block's
//! lanes eight at a time.

use std::arch::x86_64::*;

/// Keys a tile.
const KEYS: usize = 8;

/// `out[t * os + j]` = the chain of query `t` (lane `t` of `cols`, `[d][l]`)
/// and key `j`, for `t < m` and `j < nk`.
///
/// # Safety
/// AVX2 and FMA; `cols` is `[d][l]` with `l` a multiple of 8; keys `j < nk`
/// at `kp[j * ks..][..d]` are readable and outputs `out[t * os + j]` (`t <
/// m <= l`) writable.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn block(
    cols: &[f32],
    l: usize,
    m: usize,
    d: usize,
    (kp, ks, nk): (*const f32, usize, usize),
    out: *mut f32,
    os: usize,
) {
    debug_assert!(cols.len() == l * d && m <= l && l.is_multiple_of(8));
    let qp = cols.as_ptr();
    for first in (0..m).step_by(8) {
        let n = (m - first).min(8);
        let whole = nk / KEYS * KEYS;
        let mut j = 0;
        while j < whole {
            let mut acc = [_mm256_setzero_ps(); KEYS];
            for c in 0..d {
                // SAFETY: lanes first.. of column c, and column c of keys
                // j..j + KEYS.
                unsafe {
                    let q = _mm256_loadu_ps(qp.add(c * l + first));
                    for (i, a) in acc.iter_mut().enumerate() {
                        *a = _mm256_fmadd_ps(q, _mm256_set1_ps(*kp.add((j + i) * ks + c)), *a);
                    }
                }
            }
            // SAFETY: queries first..first + n (< m), keys j..j + KEYS.
            unsafe { store_column(&transpose8(acc), n, out.add(first * os + j), os) };
            j += KEYS;
        }
        for j in whole..nk {
            let mut acc = _mm256_setzero_ps();
            for c in 0..d {
                // SAFETY: as above, for key j alone.
                unsafe {
                    acc = _mm256_fmadd_ps(
                        _mm256_loadu_ps(qp.add(c * l + first)),
                        _mm256_set1_ps(*kp.add(j * ks + c)),
                        acc,
                    )
                };
            }
            let mut lanes = [0f32; 8];
            // SAFETY: 8 floats.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
            for (t, s) in lanes[..n].iter().enumerate() {
                // SAFETY: query first + t < m, key j < nk.
                unsafe { *out.add((first + t) * os + j) = *s };
            }
        }
    }
}

/// Rows `r[i]` (lane `t`: key `i`, query `t`) as rows per query (lane `i`:
/// key `i`): the 8 x 8 transposition, moves only.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ]
}

/// The first `n` query rows of `rows` (eight keys each) to `out[t * os..][..8]`.
///
/// # Safety
/// AVX; those outputs are writable.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn store_column(rows: &[__m256; 8], n: usize, out: *mut f32, os: usize) {
    for (t, r) in rows.iter().take(n).enumerate() {
        // SAFETY: the caller's.
        unsafe { _mm256_storeu_ps(out.add(t * os), *r) };
    }
}
