//! The AVX2 + FMA kernels of `simd` (x86-64), chosen at run time by
//! `isa()`; each with its scalar twin in `simd/mod.rs`.

use super::{f16_at, GROUP};
use std::arch::x86_64::*;

#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn hsum(v: __m256) -> f32 {
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
    let (nr, nt) = (w.len() / cols, x.len() / cols);
    // SAFETY: rows of `cols` floats at stride `cols`, outputs `[nr][nt]`
    // (the caller's contract above).
    unsafe { strided_block(w.as_ptr(), cols, nr, x.as_ptr(), cols, nt, cols, out.as_mut_ptr(), (nt, 1)) }
}

/// `op[i * o_row + t * o_col] = dot8(row i, input t)` for `nr` rows of
/// `cols` floats at `wp[i * ws..]` and `nt` inputs at `xp[t * xs..]`, in the
/// register tiles of `simd::for_each_tile`.
///
/// # Safety
/// AVX2 and FMA; every row, input and output so addressed is readable /
/// writable, and no two outputs alias.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
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
    use super::{TILE_INPUTS as T, TILE_ROWS as R};
    super::for_each_tile(nr, nt, |r, t, rr, tt| {
        // SAFETY: the tile's rr rows from r, tt inputs from t and their
        // outputs lie inside what the caller vouched for.
        unsafe {
            let (wp, xp, op) = (wp.add(r * ws), xp.add(t * xs), op.add(r * o_row + t * o_col));
            let at = Tile { ws, xs, cols, o_row, o_col };
            match (rr, tt) {
                (R, T) => tile::<R, T>(wp, xp, op, at),
                (R, 1) => tile::<R, 1>(wp, xp, op, at),
                (1, T) => tile::<1, T>(wp, xp, op, at),
                _ => tile::<1, 1>(wp, xp, op, at),
            }
        }
    });
}

/// The strides of one register tile's rows, inputs and outputs.
#[derive(Clone, Copy)]
struct Tile {
    ws: usize,
    xs: usize,
    cols: usize,
    o_row: usize,
    o_col: usize,
}

/// One tile: rows `wp[i * ws..]` (i < RR) against inputs `xp[t * xs..]`
/// (t < TT) into `op[i * o_row + t * o_col]`.
///
/// # Safety
/// AVX2 and FMA; those rows, inputs and outputs are readable / writable.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile<const RR: usize, const TT: usize>(wp: *const f32, xp: *const f32, op: *mut f32, at: Tile) {
    let Tile { ws, xs, cols, o_row, o_col } = at;
    let whole = cols / 8 * 8;
    let mut acc = [[_mm256_setzero_ps(); TT]; RR];
    let mut k = 0;
    while k < whole {
        let mut xv = [_mm256_setzero_ps(); TT];
        for (t, v) in xv.iter_mut().enumerate() {
            // SAFETY: k + 8 <= cols inside input t.
            *v = unsafe { _mm256_loadu_ps(xp.add(t * xs + k)) };
        }
        for (i, a) in acc.iter_mut().enumerate() {
            // SAFETY: k + 8 <= cols inside row i.
            let wv = unsafe { _mm256_loadu_ps(wp.add(i * ws + k)) };
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
                s += unsafe { *wp.add(i * ws + j) * *xp.add(t * xs + j) };
            }
            // SAFETY: output (i, t) of the tile.
            unsafe { *op.add(i * o_row + t * o_col) = s };
        }
    }
}

/// `attend::exp_scalar` on eight lanes: the very same operations, so the
/// same bits.
///
/// # Safety
/// AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn exp8(x: __m256) -> __m256 {
    use super::exp_consts::*;
    let n =
        _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)));
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), x);
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
    let z = _mm256_mul_ps(r, r);
    let mut p = _mm256_set1_ps(POLY[0]);
    for c in &POLY[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(*c));
    }
    let y = _mm256_add_ps(_mm256_fmadd_ps(p, z, r), _mm256_set1_ps(1.0));
    let two_n = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)));
    let e = _mm256_mul_ps(y, _mm256_castsi256_ps(two_n));
    _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(FLOOR)), e)
}

/// `attend::exp_shifted_sum`: `x[i] = exp(x[i] - max)` and their sum in
/// eight lanes, `hsum`'s order, the tail added in order.
///
/// # Safety
/// AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn exp_shifted_sum(x: &mut [f32], max: f32) -> f32 {
    let m = _mm256_set1_ps(max);
    let (whole, tail) = x.as_chunks_mut::<8>();
    let mut acc = _mm256_setzero_ps();
    for c in whole {
        // SAFETY: `c` holds eight floats.
        unsafe {
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), m));
            _mm256_storeu_ps(c.as_mut_ptr(), e);
            acc = _mm256_add_ps(acc, e);
        }
    }
    let mut sum = hsum(acc);
    if !tail.is_empty() {
        let mut lanes = [0f32; 8];
        lanes[..tail.len()].copy_from_slice(tail);
        // SAFETY: `lanes` holds eight floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), exp8(_mm256_sub_ps(_mm256_loadu_ps(lanes.as_ptr()), m))) };
        for (t, e) in tail.iter_mut().zip(lanes) {
            *t = e;
            sum += e;
        }
    }
    sum
}

/// Queries per block of `weighted_rows`: 6 queries x 2 vectors of columns
/// are 12 accumulators, plus two value vectors and a broadcast weight.
const WEIGHTED_QUERIES: usize = 6;

/// Keys per pass of `weighted_rows` (128 value rows of a 128-wide head are
/// 64 KB), at every level.
pub(crate) const WEIGHTED_KEYS: usize = 128;

/// `attend::weighted_rows` (its definition and its twin are there): each
/// output column one FMA chain over the keys in order, blocks of queries
/// sharing each load of a value row's columns.
///
/// # Safety
/// AVX2 and FMA; `p[t * ps + j]` (t < nq, j < nk), `v[j * vs + c]`
/// (c < d) are readable and `out[t * d + c]` writable.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
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
    let block = |left: usize| left.min(WEIGHTED_QUERIES);
    super::for_each_weighted_block(nq, nk, WEIGHTED_KEYS, block, |t, j0, q, keys| {
        // SAFETY: queries t..t+q and keys j0..j0+keys of the caller's.
        unsafe {
            let (p, v, out) = (p.add(t * ps + j0), v.add(j0 * vs), out.add(t * d));
            match q {
                6 => weighted_block::<6>(p, ps, v, vs, keys, d, out),
                5 => weighted_block::<5>(p, ps, v, vs, keys, d, out),
                4 => weighted_block::<4>(p, ps, v, vs, keys, d, out),
                3 => weighted_block::<3>(p, ps, v, vs, keys, d, out),
                2 => weighted_block::<2>(p, ps, v, vs, keys, d, out),
                _ => weighted_block::<1>(p, ps, v, vs, keys, d, out),
            }
        }
    });
}

/// `weighted_rows` for `Q` queries: columns in blocks of 16, then 8, then
/// one at a time, each block's accumulators held in registers over all keys.
///
/// # Safety
/// As `weighted_rows`, for `Q` queries.
#[inline]
#[target_feature(enable = "avx2,fma")]
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
    while c + 16 <= d {
        let mut acc = [[_mm256_setzero_ps(); 2]; Q];
        for (t, a) in acc.iter_mut().enumerate() {
            // SAFETY: columns c..c+16 of output t.
            unsafe { *a = [_mm256_loadu_ps(out.add(t * d + c)), _mm256_loadu_ps(out.add(t * d + c + 8))] };
        }
        for j in 0..nk {
            // SAFETY: columns c..c+16 of value row j, weight (t, j).
            unsafe {
                let (v0, v1) = (_mm256_loadu_ps(v.add(j * vs + c)), _mm256_loadu_ps(v.add(j * vs + c + 8)));
                for (t, a) in acc.iter_mut().enumerate() {
                    let w = _mm256_broadcast_ss(&*p.add(t * ps + j));
                    a[0] = _mm256_fmadd_ps(w, v0, a[0]);
                    a[1] = _mm256_fmadd_ps(w, v1, a[1]);
                }
            }
        }
        for (t, a) in acc.iter().enumerate() {
            // SAFETY: columns c..c+16 of output t.
            unsafe {
                _mm256_storeu_ps(out.add(t * d + c), a[0]);
                _mm256_storeu_ps(out.add(t * d + c + 8), a[1]);
            }
        }
        c += 16;
    }
    if c + 8 <= d {
        let mut acc = [_mm256_setzero_ps(); Q];
        for (t, a) in acc.iter_mut().enumerate() {
            // SAFETY: columns c..c+8 of output t.
            *a = unsafe { _mm256_loadu_ps(out.add(t * d + c)) };
        }
        for j in 0..nk {
            // SAFETY: columns c..c+8 of value row j, weight (t, j).
            unsafe {
                let v0 = _mm256_loadu_ps(v.add(j * vs + c));
                for (t, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(_mm256_broadcast_ss(&*p.add(t * ps + j)), v0, *a);
                }
            }
        }
        for (t, a) in acc.iter().enumerate() {
            // SAFETY: columns c..c+8 of output t.
            unsafe { _mm256_storeu_ps(out.add(t * d + c), *a) };
        }
        c += 8;
    }
    for c in c..d {
        for t in 0..Q {
            // SAFETY: column c of output t, value rows j < nk, weights (t, j).
            unsafe {
                let mut a = _mm_set_ss(*out.add(t * d + c));
                for j in 0..nk {
                    a = _mm_fmadd_ss(_mm_set_ss(*p.add(t * ps + j)), _mm_set_ss(*v.add(j * vs + c)), a);
                }
                *out.add(t * d + c) = _mm_cvtss_f32(a);
            }
        }
    }
}

/// # Safety
/// The CPU supports AVX2 and FMA; `w.len() == x.len()`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
    let mut out = [0f32];
    // SAFETY: one input of w.len() floats at x.
    unsafe { dot_f32_multi::<1>(w, x.as_ptr(), &mut out) };
    out[0]
}

/// `out[t] = dot_f32(w, x row t)` for the `out.len()` rows of `x`, each
/// `w.len()` long: tiles of `F32_INPUTS` rows share each load of `w`.
///
/// # Safety
/// The CPU supports AVX2 and FMA; `x.len() == out.len() * w.len()`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_f32_rows(w: &[f32], x: &[f32], out: &mut [f32]) {
    let n = w.len();
    for (o, xs) in out.chunks_mut(F32_INPUTS).zip(x.chunks(F32_INPUTS * n.max(1))) {
        // SAFETY: `xs` holds `o.len()` inputs of n floats.
        unsafe {
            match o.len() {
                F32_INPUTS => dot_f32_multi::<F32_INPUTS>(w, xs.as_ptr(), o.try_into().unwrap()),
                _ => dot_f32_multi::<1>(w, xs.as_ptr(), (&mut o[..1]).try_into().unwrap()),
            }
        }
    }
}

/// Inputs per tile of the f32 multi-input dot (4 accumulators each).
const F32_INPUTS: usize = 2;
/// Inputs per tile of the q8/q4 multi-input dots (2 accumulators and a
/// running sum each; the decoded weights are shared).
const QUANT_INPUTS: usize = 4;

/// `dot_f32` of `w` with the `T` inputs `xp[t * n..][..n]` (`n = w.len()`),
/// each input's operations exactly those of the one-input kernel.
///
/// # Safety
/// AVX2 and FMA; `T * w.len()` floats are readable at `xp`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_f32_multi<const T: usize>(w: &[f32], xp: *const f32, out: &mut [f32; T]) {
    let n = w.len();
    let wp = w.as_ptr();
    let mut acc = [[_mm256_setzero_ps(); 4]; T];
    let mut i = 0;
    // SAFETY (all loads): i + 32 <= n, resp. i + 8 <= n, bounds every
    // unaligned 8-lane load inside `w` and inside each input.
    while i + 32 <= n {
        for k in 0..4 {
            let o = i + 8 * k;
            let wv = _mm256_loadu_ps(wp.add(o));
            for (t, a) in acc.iter_mut().enumerate() {
                a[k] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xp.add(t * n + o)), a[k]);
            }
        }
        i += 32;
    }
    while i + 8 <= n {
        let wv = _mm256_loadu_ps(wp.add(i));
        for (t, a) in acc.iter_mut().enumerate() {
            a[0] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xp.add(t * n + i)), a[0]);
        }
        i += 8;
    }
    for (t, (a, o)) in acc.iter().zip(out.iter_mut()).enumerate() {
        let v = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
        let mut s = hsum(v);
        for (j, wj) in w.iter().enumerate().skip(i) {
            s += wj * *xp.add(t * n + j);
        }
        *o = s;
    }
}

/// # Safety
/// The CPU supports AVX2 and FMA; `q.len() == x.len()` and `scales`
/// holds `2 * ceil(x.len() / 128)` bytes.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_q8(scales: &[u8], q: &[u8], x: &[f32]) -> f32 {
    let mut out = [0f32];
    // SAFETY: one input of x.len() floats.
    unsafe { quant_multi::<1>(scales, q, x.len(), x.as_ptr(), &mut out) };
    out[0]
}

/// `out[t] = dot_q8` of the row with x row t for the `out.len()` rows of
/// `x`, each `n` long: tiles of `QUANT_INPUTS` rows share each decoded
/// block of weights.
///
/// # Safety
/// The CPU supports AVX2 and FMA; `x.len() == out.len() * n`, `q` holds
/// the row's `n` bytes and `scales` its `2 * ceil(n / 128)`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_q8_rows(scales: &[u8], q: &[u8], n: usize, x: &[f32], out: &mut [f32]) {
    // SAFETY: as this function's.
    unsafe { quant_rows_tiled::<QUANT_INPUTS>(scales, q, n, x, out) }
}

/// `dot_q8_rows` on a CPU with AVX-512VL: the very same 256-bit
/// operations per input (so the same bits), but 8 inputs per decoded block
/// of weights, whose 24 accumulators the 32 vector registers AVX-512VL
/// makes addressable hold without spilling.
///
/// # Safety
/// The CPU supports AVX2, FMA, AVX-512F and AVX-512VL; as `dot_q8_rows`.
#[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
pub(crate) unsafe fn dot_q8_rows_wide(scales: &[u8], q: &[u8], n: usize, x: &[f32], out: &mut [f32]) {
    // SAFETY: as this function's.
    unsafe { quant_rows_tiled::<WIDE_INPUTS>(scales, q, n, x, out) }
}

/// `out[i] = dot_q8` of row `i` of `out.len()` rows with the one input
/// `x`, bit for bit: the rows lie one after another in `q` (`n` bytes
/// each) and their scales in `scales` (`2 * ceil(n / 128)` bytes each).
/// Rows go `MANY_ROWS` at a time, each row's operations those of the
/// one-row kernel in the same order: one row's two FMA chains left the
/// core waiting on their latency (a q8 matrix decoded at 4.8 GB/s a
/// thread where the same thread reads q4 at 11), and several rows' chains
/// interleaved fill that wait.
///
/// # Safety
/// The CPU supports AVX2 and FMA; `x.len() == n`, `q.len() == out.len() *
/// n` and `scales` holds `out.len() * 2 * ceil(n / 128)` bytes.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_q8_many_rows(scales: &[u8], q: &[u8], n: usize, x: &[f32], out: &mut [f32]) {
    // SAFETY: as this function's.
    unsafe { quant_rows_grouped::<MANY_ROWS>(scales, q, n, x, out) }
}

/// Rows per pass of `dot_q8_many_rows`: their twelve accumulators and
/// the input's and weights' vectors fill AVX2's sixteen registers. Eight
/// rows in AVX-512VL's thirty-two ran no faster (a matrix from DRAM,
/// 6.5-11.1 against 12.4-12.7 GMAC/s on one thread, three rounds).
const MANY_ROWS: usize = 4;

/// The rows of `q` in passes of `R`, a last partial pass one row at a
/// time. Inlined into its callers, so compiled with their features.
///
/// # Safety
/// As `dot_q8_many_rows`; the caller's features include AVX2 and FMA.
#[inline(always)]
unsafe fn quant_rows_grouped<const R: usize>(scales: &[u8], q: &[u8], n: usize, x: &[f32], out: &mut [f32]) {
    let g2 = 2 * n.div_ceil(GROUP);
    assert!(x.len() == n && q.len() == out.len() * n && scales.len() == out.len() * g2, "dot_q8_many_rows: lengths");
    for (p, o) in out.chunks_mut(R).enumerate() {
        let (first, len) = (p * R, o.len());
        let (sc, qr) = (&scales[first * g2..(first + len) * g2], &q[first * n..(first + len) * n]);
        // SAFETY: `sc` and `qr` hold `len` rows, `x` one input of n floats.
        unsafe {
            if let Ok(pass) = <&mut [f32; R]>::try_from(&mut *o) {
                quant_rows_multi::<R>(sc, qr, n, x.as_ptr(), pass);
            } else {
                for (i, v) in o.iter_mut().enumerate() {
                    let mut one = [0f32];
                    quant_multi::<1>(&sc[i * g2..(i + 1) * g2], &qr[i * n..(i + 1) * n], n, x.as_ptr(), &mut one);
                    *v = one[0];
                }
            }
        }
    }
}

/// `R` rows (`q`: `R * n` bytes, `scales`: their scales) dotted with the
/// one input at `xp`, each row exactly as `quant_multi::<1>` computes it:
/// the same chains over the same values in the same order, the rows'
/// chains interleaved. The next `R` rows' bytes at the same position are
/// prefetched once per cache line: each row is a short stream (36 lines at
/// 2304 columns) that the hardware's prefetch catches late.
///
/// # Safety
/// The caller's features include AVX2 and FMA; `n` floats are readable at
/// `xp`; `q` holds `R` rows of `n` bytes and `scales` their scales.
#[inline(always)]
unsafe fn quant_rows_multi<const R: usize>(scales: &[u8], q: &[u8], n: usize, xp: *const f32, out: &mut [f32; R]) {
    let g2 = 2 * n.div_ceil(GROUP);
    let rows: [&[u8]; R] = std::array::from_fn(|r| &q[r * n..(r + 1) * n]);
    let mut racc = [_mm256_setzero_ps(); R];
    let mut tail = [0f32; R];
    let mut g0 = 0;
    while g0 < n {
        let glen = GROUP.min(n - g0);
        let scale: [f32; R] = std::array::from_fn(|r| f16_at(&scales[r * g2..(r + 1) * g2], g0 / GROUP));
        let mut a0 = [_mm256_setzero_ps(); R];
        let mut a1 = [_mm256_setzero_ps(); R];
        let mut i = 0;
        // SAFETY (all loads): g0 + i + 16 <= n (resp. + 8) keeps each row's
        // weight bytes inside it and the input's 8-float loads inside x.
        while i + 16 <= glen {
            let p = g0 + i;
            if p % 64 == 0 {
                for r in 0..R {
                    let ahead = q.as_ptr().wrapping_add((R + r) * n + p);
                    // SAFETY: a prefetch reads nothing and faults on no
                    // address (past the matrix's end it names memory it
                    // never touches).
                    unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8) };
                }
            }
            let (xa, xb) = (_mm256_loadu_ps(xp.add(p)), _mm256_loadu_ps(xp.add(p + 8)));
            for r in 0..R {
                let (wa, wb) = decode16(rows[r], p);
                a0[r] = _mm256_fmadd_ps(wa, xa, a0[r]);
                a1[r] = _mm256_fmadd_ps(wb, xb, a1[r]);
            }
            i += 16;
        }
        if i + 8 <= glen {
            let p = g0 + i;
            let xa = _mm256_loadu_ps(xp.add(p));
            for r in 0..R {
                a0[r] = _mm256_fmadd_ps(decode8_q8(rows[r], p), xa, a0[r]);
            }
            i += 8;
        }
        let mut ts = [0f32; R];
        while i < glen {
            let p = g0 + i;
            let xv = *xp.add(p);
            for (r, s) in ts.iter_mut().enumerate() {
                *s += weight(rows[r], p) * xv;
            }
            i += 1;
        }
        for r in 0..R {
            let vs = _mm256_set1_ps(scale[r]);
            tail[r] += scale[r] * ts[r];
            racc[r] = _mm256_fmadd_ps(_mm256_add_ps(a0[r], a1[r]), vs, racc[r]);
        }
        g0 += glen;
    }
    for r in 0..R {
        out[r] = hsum(racc[r]) + tail[r];
    }
}

/// Inputs per tile of `dot_q8_rows_wide`.
const WIDE_INPUTS: usize = 8;

/// The rows of `x` in tiles of `TILE` inputs, a last partial tile one
/// input at a time. Inlined into its callers, so compiled with their
/// target features.
///
/// # Safety
/// As `dot_q8_rows`; the caller's features include AVX2 and FMA.
#[inline(always)]
unsafe fn quant_rows_tiled<const TILE: usize>(scales: &[u8], q: &[u8], n: usize, x: &[f32], out: &mut [f32]) {
    for (o, xs) in out.chunks_mut(TILE).zip(x.chunks(TILE * n.max(1))) {
        // SAFETY: `xs` holds `o.len()` inputs of n floats.
        unsafe {
            if let Ok(tile) = <&mut [f32; TILE]>::try_from(&mut *o) {
                quant_multi::<TILE>(scales, q, n, xs.as_ptr(), tile);
            } else {
                for (t, v) in o.iter_mut().enumerate() {
                    let mut one = [0f32];
                    quant_multi::<1>(scales, q, n, xs.as_ptr().add(t * n), &mut one);
                    *v = one[0];
                }
            }
        }
    }
}

/// Sixteen weights of a q8 row from position `p`, as two vectors of eight
/// signed values.
///
/// # Safety
/// AVX2; the row's bytes for positions `p..p + 16` lie inside `q`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn decode16(q: &[u8], p: usize) -> (__m256, __m256) {
    let qa = _mm256_cvtepi8_epi32(_mm_loadl_epi64(q.as_ptr().add(p) as *const __m128i));
    let qb = _mm256_cvtepi8_epi32(_mm_loadl_epi64(q.as_ptr().add(p + 8) as *const __m128i));
    (_mm256_cvtepi32_ps(qa), _mm256_cvtepi32_ps(qb))
}

/// Eight weights of a q8 row from position `p`.
///
/// # Safety
/// AVX2; bytes `p..p + 8` lie inside `q`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn decode8_q8(q: &[u8], p: usize) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(q.as_ptr().add(p) as *const __m128i)))
}

/// Weight `p` of a q8 row as a float.
#[inline]
fn weight(q: &[u8], p: usize) -> f32 {
    (q[p] as i8) as f32
}

/// The q8 row dot of one row with the `T` inputs `xp[t * n..][..n]`: per
/// group of 128, two 8-lane FMA chains over 16 values at a time, then one
/// chain over a last 8, the rest summed unfused and scaled into
/// `tail`, the chains' sum scaled into a running 8-lane sum; at the end
/// `hsum(running) + tail`. Each input's operations are those of the
/// one-input kernel (`T == 1`), in the same order.
///
/// Inlined into its callers (no target features of its own), so it is
/// compiled with theirs: AVX2 and FMA, or those and AVX-512VL's registers.
///
/// # Safety
/// The caller's features include AVX2 and FMA; `T * n` floats are
/// readable at `xp`; `q` and `scales` hold the row (see `dot_q8_rows`).
#[inline(always)]
unsafe fn quant_multi<const T: usize>(scales: &[u8], q: &[u8], n: usize, xp: *const f32, out: &mut [f32; T]) {
    let mut racc = [_mm256_setzero_ps(); T];
    let mut tail = [0f32; T];
    let mut g0 = 0;
    while g0 < n {
        let glen = GROUP.min(n - g0);
        let scale = f16_at(scales, g0 / GROUP);
        let mut a0 = [_mm256_setzero_ps(); T];
        let mut a1 = [_mm256_setzero_ps(); T];
        let mut i = 0;
        // SAFETY (all loads): g0 + i + 16 <= n (resp. + 8) keeps the weight
        // bytes inside `q` and each input's 8-float loads inside it.
        while i + 16 <= glen {
            let p = g0 + i;
            let (wa, wb) = decode16(q, p);
            for t in 0..T {
                let x = xp.add(t * n + p);
                a0[t] = _mm256_fmadd_ps(wa, _mm256_loadu_ps(x), a0[t]);
                a1[t] = _mm256_fmadd_ps(wb, _mm256_loadu_ps(x.add(8)), a1[t]);
            }
            i += 16;
        }
        if i + 8 <= glen {
            let p = g0 + i;
            let wa = decode8_q8(q, p);
            for (t, a) in a0.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(wa, _mm256_loadu_ps(xp.add(t * n + p)), *a);
            }
            i += 8;
        }
        let mut ts = [0f32; T];
        while i < glen {
            let p = g0 + i;
            let w = weight(q, p);
            for (t, s) in ts.iter_mut().enumerate() {
                *s += w * *xp.add(t * n + p);
            }
            i += 1;
        }
        let vs = _mm256_set1_ps(scale);
        for t in 0..T {
            tail[t] += scale * ts[t];
            racc[t] = _mm256_fmadd_ps(_mm256_add_ps(a0[t], a1[t]), vs, racc[t]);
        }
        g0 += glen;
    }
    for t in 0..T {
        out[t] = hsum(racc[t]) + tail[t];
    }
}

/// # Safety
/// The CPU supports AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn build_tables(x: &[f32], cbt: &[f32], stages: usize, entries: usize, out: &mut [f32]) {
    super::build_tables_generic(x, cbt, stages, entries, out)
}
