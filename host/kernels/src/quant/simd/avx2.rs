//! The AVX2 + FMA kernels of `simd` (x86-64), chosen at run time by
//! `isa()`; each with its scalar twin in `simd/mod.rs`.

use super::{f16_at, GROUP};
use std::arch::x86_64::*;

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// `simd::matmul_block` in `R x T` register tiles (`simd::for_each_tile`),
/// each pair exactly `simd::dot8_scalar`: one 8-lane FMA accumulator per
/// pair, `hsum`'s lane order, the tail unfused.
///
/// # Safety
/// The CPU supports AVX2 and FMA; `w` and `x` hold whole rows of `cols`
/// and `out` holds `(w.len() / cols) * (x.len() / cols)` floats.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn matmul_block(w: &[f32], x: &[f32], cols: usize, out: &mut [f32]) {
    use super::{TILE_INPUTS as T, TILE_ROWS as R};
    let (nr, nt) = (w.len() / cols, x.len() / cols);
    super::for_each_tile(nr, nt, |r, t, rr, tt| {
        let (wp, xp) = (w[r * cols..].as_ptr(), x[t * cols..].as_ptr());
        let op = out[r * nt + t..].as_mut_ptr();
        // SAFETY: the tile's rr rows of w from r, tt rows of x from t and
        // its outputs (rows r..r+rr at stride nt) lie inside the slices.
        unsafe {
            match (rr, tt) {
                (R, T) => tile::<R, T>(wp, xp, cols, op, nt),
                (R, 1) => tile::<R, 1>(wp, xp, cols, op, nt),
                (1, T) => tile::<1, T>(wp, xp, cols, op, nt),
                _ => tile::<1, 1>(wp, xp, cols, op, nt),
            }
        }
    });
}

/// One tile: rows `wp[i * cols..]` (i < RR) against inputs `xp[t * cols..]`
/// (t < TT) into `op[i * nt + t]`.
///
/// # Safety
/// AVX2 and FMA; those rows, inputs and outputs are readable / writable.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile<const RR: usize, const TT: usize>(wp: *const f32, xp: *const f32, cols: usize, op: *mut f32, nt: usize) {
    let whole = cols / 8 * 8;
    let mut acc = [[_mm256_setzero_ps(); TT]; RR];
    let mut k = 0;
    while k < whole {
        let mut xv = [_mm256_setzero_ps(); TT];
        for (t, v) in xv.iter_mut().enumerate() {
            // SAFETY: k + 8 <= cols inside input t.
            *v = unsafe { _mm256_loadu_ps(xp.add(t * cols + k)) };
        }
        for (i, a) in acc.iter_mut().enumerate() {
            // SAFETY: k + 8 <= cols inside row i.
            let wv = unsafe { _mm256_loadu_ps(wp.add(i * cols + k)) };
            for (at, v) in a.iter_mut().zip(&xv) {
                *at = _mm256_fmadd_ps(wv, *v, *at);
            }
        }
        k += 8;
    }
    for (i, a) in acc.iter().enumerate() {
        for (t, at) in a.iter().enumerate() {
            let mut s = hsum(*at);
            for j in whole..cols {
                // SAFETY: j < cols inside row i and input t.
                s += unsafe { *wp.add(i * cols + j) * *xp.add(t * cols + j) };
            }
            // SAFETY: output (i, t) of the tile.
            unsafe { *op.add(i * nt + t) = s };
        }
    }
}

/// # Safety
/// The CPU supports AVX2 and FMA; `w.len() == x.len()`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
    let n = w.len();
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY (all loads): i + 32 <= n, resp. i + 8 <= n, bounds every
    // unaligned 8-lane load inside both slices.
    while i + 32 <= n {
        for (k, a) in acc.iter_mut().enumerate() {
            let o = i + 8 * k;
            *a = _mm256_fmadd_ps(_mm256_loadu_ps(wp.add(o)), _mm256_loadu_ps(xp.add(o)), *a);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(wp.add(i)), _mm256_loadu_ps(xp.add(i)), acc[0]);
        i += 8;
    }
    let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut s = hsum(v);
    while i < n {
        s += w[i] * x[i];
        i += 1;
    }
    s
}

/// # Safety
/// The CPU supports AVX2 and FMA; `q.len() == x.len()` and `scales`
/// holds `2 * ceil(x.len() / 128)` bytes.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_q8(scales: &[u8], q: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    let mut racc = _mm256_setzero_ps();
    let mut tail = 0f32;
    let mut g0 = 0;
    while g0 < n {
        let glen = GROUP.min(n - g0);
        let scale = f16_at(scales, g0 / GROUP);
        let mut a0 = _mm256_setzero_ps();
        let mut a1 = _mm256_setzero_ps();
        let mut i = 0;
        // SAFETY (all loads): g0 + i + 16 <= n (resp. + 8) keeps the
        // 8-byte and 8-float loads inside `q` and `x`.
        while i + 16 <= glen {
            let p = g0 + i;
            let qa = _mm256_cvtepi8_epi32(_mm_loadl_epi64(q.as_ptr().add(p) as *const __m128i));
            let qb = _mm256_cvtepi8_epi32(_mm_loadl_epi64(q.as_ptr().add(p + 8) as *const __m128i));
            a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(qa), _mm256_loadu_ps(x.as_ptr().add(p)), a0);
            a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(qb), _mm256_loadu_ps(x.as_ptr().add(p + 8)), a1);
            i += 16;
        }
        if i + 8 <= glen {
            let p = g0 + i;
            let qa = _mm256_cvtepi8_epi32(_mm_loadl_epi64(q.as_ptr().add(p) as *const __m128i));
            a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(qa), _mm256_loadu_ps(x.as_ptr().add(p)), a0);
            i += 8;
        }
        let mut ts = 0f32;
        while i < glen {
            ts += (q[g0 + i] as i8) as f32 * x[g0 + i];
            i += 1;
        }
        tail += scale * ts;
        racc = _mm256_fmadd_ps(_mm256_add_ps(a0, a1), _mm256_set1_ps(scale), racc);
        g0 += glen;
    }
    hsum(racc) + tail
}

/// # Safety
/// The CPU supports AVX2 and FMA; `q.len() == ceil(x.len() / 2)` and
/// `scales` holds `2 * ceil(x.len() / 128)` bytes.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_q4(scales: &[u8], q: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    let mask = _mm_set1_epi8(0x0F);
    let eight = _mm256_set1_epi32(8);
    let mut racc = _mm256_setzero_ps();
    let mut tail = 0f32;
    let mut g0 = 0;
    while g0 < n {
        let glen = GROUP.min(n - g0);
        let scale = f16_at(scales, g0 / GROUP);
        let mut a0 = _mm256_setzero_ps();
        let mut a1 = _mm256_setzero_ps();
        let mut i = 0;
        while i + 16 <= glen {
            let p = g0 + i;
            // SAFETY: p is even and p + 16 <= n, so bytes p/2..p/2+8 lie
            // inside `q` and floats p..p+16 inside `x`.
            let b = _mm_loadl_epi64(q.as_ptr().add(p / 2) as *const __m128i);
            let lo = _mm_and_si128(b, mask);
            let hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
            // Interleaving restores column order: low nibble = even column.
            let v = _mm_unpacklo_epi8(lo, hi);
            let va = _mm256_sub_epi32(_mm256_cvtepu8_epi32(v), eight);
            let vb = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)), eight);
            a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(va), _mm256_loadu_ps(x.as_ptr().add(p)), a0);
            a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(vb), _mm256_loadu_ps(x.as_ptr().add(p + 8)), a1);
            i += 16;
        }
        let mut ts = 0f32;
        while i < glen {
            let p = g0 + i;
            let b = q[p / 2];
            let nib = if p % 2 == 0 { b & 0x0F } else { b >> 4 };
            ts += (nib as i32 - 8) as f32 * x[p];
            i += 1;
        }
        tail += scale * ts;
        racc = _mm256_fmadd_ps(_mm256_add_ps(a0, a1), _mm256_set1_ps(scale), racc);
        g0 += glen;
    }
    hsum(racc) + tail
}

/// # Safety
/// The CPU supports AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn build_tables(x: &[f32], cbt: &[f32], stages: usize, entries: usize, out: &mut [f32]) {
    super::build_tables_generic(x, cbt, stages, entries, out)
}
