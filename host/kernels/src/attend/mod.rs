//! Attention's two products over a block of queries that share one key /
//! value head: the scores `q . k` of every query against a run of cached
//! keys, and the probability-weighted sum of the value rows. Keys and
//! values are read in place from a KV cache (rows `stride` floats apart),
//! so decode (one token's query heads) and prefill (many tokens' heads)
//! run the same kernels and each output depends on its own query alone,
//! never on the block it ran in: decode and chunked prefill agree bit for
//! bit.
//!
//! Both are defined by a portable twin that every level equals bit for
//! bit, so the bits do not depend on the CPU either:
//! - a score is one fused multiply-add chain over the head's columns in
//!   order, from zero (`scores`: the queries in the vector lanes);
//! - an output column is one fused multiply-add chain over the keys in
//!   order, from the output's value on entry. A key whose weight is zero
//!   adds an exact zero, so a block may pad a query's key range with zero
//!   weights and leave its result unchanged;
//! - the softmax's exponential is one polynomial (`exp_scalar`), its sum
//!   eight lanes in `dot8`'s order.

mod scores;

pub use scores::QueryColumns;

use crate::quant::simd::{exp_consts, fused_mul_add};

#[cfg(target_arch = "x86_64")]
use crate::quant::simd::{avx2, avx512f, has_avx2, has_avx512f};

/// `n` rows of `width` floats, `stride` apart, inside `len` floats.
fn rows_fit(len: usize, n: usize, stride: usize, width: usize) -> bool {
    n == 0
        || (stride >= width && (n - 1).checked_mul(stride).and_then(|s| s.checked_add(width)).is_some_and(|e| e <= len))
}

/// `out[t * out_stride + j]` = the score of query `t` of `queries` and the
/// key at `keys[j * key_stride..][..d]`, for the `n_keys` keys: `fma(q[c],
/// k[c], s)` over the columns `c` in order, from zero.
pub fn key_scores(
    queries: &QueryColumns<'_>,
    (keys, key_stride, n_keys): (&[f32], usize, usize),
    out: &mut [f32],
    out_stride: usize,
) {
    let (nq, d) = (queries.queries(), queries.width());
    assert!(
        rows_fit(keys.len(), n_keys, key_stride, d) && rows_fit(out.len(), nq, out_stride, n_keys),
        "key_scores: inconsistent lengths"
    );
    if nq == 0 || n_keys == 0 {
        return;
    }
    scores::scores(scores::Level::detect(), queries, (keys, key_stride, n_keys), out, out_stride);
}

/// `out[t * d + c] = fma(p[t * p_stride + j], values[j * v_stride + c], ..)`
/// folded over the `n_keys` keys in ascending order, starting from the
/// value `out` holds, for the `out.len() / d` queries: each query's
/// attention output accumulated from its weights.
pub fn weighted_rows(
    (p, p_stride): (&[f32], usize),
    (values, v_stride, n_keys): (&[f32], usize, usize),
    d: usize,
    out: &mut [f32],
) {
    assert!(d > 0 && out.len().is_multiple_of(d), "weighted_rows: outputs are not whole rows");
    let nq = out.len() / d;
    assert!(
        rows_fit(p.len(), nq, p_stride, n_keys) && rows_fit(values.len(), n_keys, v_stride, d),
        "weighted_rows: inconsistent lengths"
    );
    if nq == 0 || n_keys == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx512f() {
        // SAFETY: AVX-512 F was detected; the slices are as below.
        return unsafe {
            avx512f::weighted_rows(p.as_ptr(), p_stride, nq, values.as_ptr(), v_stride, n_keys, d, out.as_mut_ptr())
        };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and FMA were detected; weights, value rows and the
        // outputs lie inside the slices (checked above).
        return unsafe {
            avx2::weighted_rows(p.as_ptr(), p_stride, nq, values.as_ptr(), v_stride, n_keys, d, out.as_mut_ptr())
        };
    }
    weighted_rows_scalar((p, p_stride), (values, v_stride, n_keys), d, out)
}

/// The portable twin of `weighted_rows`.
pub(crate) fn weighted_rows_scalar(
    (p, p_stride): (&[f32], usize),
    (values, v_stride, n_keys): (&[f32], usize, usize),
    d: usize,
    out: &mut [f32],
) {
    for (t, o) in out.chunks_exact_mut(d).enumerate() {
        for j in 0..n_keys {
            let w = p[t * p_stride + j];
            for (oc, &vc) in o.iter_mut().zip(&values[j * v_stride..][..d]) {
                *oc = fused_mul_add(w, vc, *oc);
            }
        }
    }
}

/// `exp(x)` for `x <= 0` as the softmax uses it: `n = round(x log2 e)`, `r =
/// x - n ln2` in two fused steps, `e^r = 1 + r + r^2 p(r)`, times `2^n`;
/// within 2 ulp of the true value, exactly 1 at 0, zero below `FLOOR`.
/// Every level computes these very operations.
pub(crate) fn exp_scalar(x: f32) -> f32 {
    use exp_consts::*;
    if x < FLOOR {
        return 0.0;
    }
    let n = (x * LOG2E).round_ties_even();
    let r = fused_mul_add(n, -LN2_LO, fused_mul_add(n, -LN2_HI, x));
    let z = r * r;
    let p = POLY[1..].iter().fold(POLY[0], |p, &c| fused_mul_add(p, r, c));
    let y = fused_mul_add(p, z, r) + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// `x[i] = exp(x[i] - max)`, returning their sum: eight lanes `l` summing
/// the positions `l, l + 8, ..` below the last multiple of 8, the lanes
/// as `dot8` sums them, then the tail in order.
fn exp_shifted_sum(x: &mut [f32], max: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and FMA were detected.
        return unsafe { avx2::exp_shifted_sum(x, max) };
    }
    exp_shifted_sum_scalar(x, max)
}

/// The portable twin of `exp_shifted_sum`.
pub(crate) fn exp_shifted_sum_scalar(x: &mut [f32], max: f32) -> f32 {
    let (whole, tail) = x.as_chunks_mut::<8>();
    let mut l = [0f32; 8];
    for c in whole {
        for (v, acc) in c.iter_mut().zip(l.iter_mut()) {
            *v = exp_scalar(*v - max);
            *acc += *v;
        }
    }
    let mut sum = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    for v in tail {
        *v = exp_scalar(*v - max);
        sum += *v;
    }
    sum
}

/// Attention's softmax of `scores` in place, with `extra_logit` (gpt-oss's
/// sink) joining the normalisation but not the output, so the weights then
/// sum to less than one: `softmax(cat([scores, sink]))` with the sink's
/// column dropped.
pub fn softmax(scores: &mut [f32], extra_logit: Option<f32>) {
    let max = scores.iter().copied().fold(extra_logit.unwrap_or(f32::NEG_INFINITY), f32::max);
    let mut sum = exp_shifted_sum(scores, max);
    if let Some(e) = extra_logit {
        sum += exp_scalar(e - max);
    }
    let inv = 1.0 / sum;
    for v in scores.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in [-1, 1) of every magnitude down to 2^-12.
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let m = (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                m * (1.0 / (1 << (s % 12)) as f32)
            })
            .collect()
    }

    #[cfg(target_arch = "x86_64")]
    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// One x86 level's kernels of the weighted rows.
    #[cfg(target_arch = "x86_64")]
    #[derive(Clone, Copy)]
    enum Kernels {
        Avx2,
        Avx512f,
    }

    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::too_many_arguments)]
    impl Kernels {
        /// # Safety
        /// As `avx2::weighted_rows`, and this level's features detected.
        unsafe fn weighted(
            self,
            p: *const f32,
            ps: usize,
            nq: usize,
            v: *const f32,
            vs: usize,
            nk: usize,
            d: usize,
            out: *mut f32,
        ) {
            // SAFETY: the caller's.
            unsafe {
                match self {
                    Kernels::Avx2 => avx2::weighted_rows(p, ps, nq, v, vs, nk, d, out),
                    Kernels::Avx512f => avx512f::weighted_rows(p, ps, nq, v, vs, nk, d, out),
                }
            }
        }
    }

    /// Every x86 level of the two products this CPU runs, whichever the
    /// dispatch picks, so that each is held to the twin (the dispatched
    /// one is checked as well). Elsewhere the twin is the kernel.
    #[cfg(target_arch = "x86_64")]
    fn x86_levels() -> Vec<(&'static str, Kernels)> {
        let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
        let mut levels = Vec::new();
        if avx2 {
            levels.push(("avx2", Kernels::Avx2));
        }
        if avx2 && is_x86_feature_detected!("avx512f") {
            levels.push(("avx512f", Kernels::Avx512f));
        } else {
            crate::skip::report_skip("SKIP attention's AVX-512 F kernels: this CPU lacks AVX-512 F");
        }
        levels
    }

    /// Head widths with and without whole vectors, block counts with and
    /// without whole tiles, strides wider than a row (a KV cache's).
    const SHAPES: [(usize, usize, usize); 6] =
        [(128, 7, 37), (64, 13, 5), (24, 6, 16), (5, 1, 3), (136, 32, 66), (48, 9, 300)];

    /// Every level this CPU runs, and the portable twin, give the
    /// definition's bits (`scores::score`: the chain from the queries'
    /// rows) for blocks of 1-8, 9-16 and 17-32 lanes and several blocks,
    /// keys with and without whole tiles; within 1e-5 of the exact sums.
    #[test]
    fn key_scores_equal_the_definition_bit_for_bit_and_the_exact_sums_closely() {
        use scores::Level;
        #[allow(unused_mut)] // only x86 adds levels
        let mut levels = vec![Level::Portable];
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            levels.push(Level::Avx2);
            if has_avx512f() {
                levels.push(Level::Avx512);
            } else {
                crate::skip::report_skip("SKIP attention scores' AVX-512 F kernel: this CPU lacks AVX-512 F");
            }
        }
        let shapes =
            SHAPES.iter().copied().chain([(128, 8, 300), (16, 16, 9), (96, 33, 17), (8, 70, 8), (576, 20, 11)]);
        for (d, nq, nk) in shapes {
            let stride = d * 3 + 1;
            let (q, k) = (values(nq * d, 1), values(nk * stride, 2));
            let os = nk + 2;
            let mut buf = vec![f32::NAN; QueryColumns::len(nq, d)];
            let columns = QueryColumns::new(&q, d, &mut buf);
            let mut dispatched = vec![7f32; nq * os];
            key_scores(&columns, (&k, stride, nk), &mut dispatched, os);
            for &level in &levels {
                let mut out = vec![7f32; nq * os];
                scores::scores(level, &columns, (&k, stride, nk), &mut out, os);
                for t in 0..nq {
                    for j in 0..nk {
                        let (qt, kj) = (&q[t * d..][..d], &k[j * stride..][..d]);
                        let (got, want) = (out[t * os + j], scores::score(qt, kj));
                        assert_eq!(got.to_bits(), want.to_bits(), "{level:?}: d {d}, {nq} queries, query {t} key {j}");
                        let exact: f64 = qt.iter().zip(kj).map(|(&a, &b)| a as f64 * b as f64).sum();
                        assert!((got as f64 - exact).abs() <= 1e-5 * (1.0 + exact.abs()), "d {d}: {got} vs {exact}");
                    }
                    assert_eq!(out[t * os + nk], 7.0, "{level:?}: a score past the keys was written");
                }
            }
            let want: Vec<f32> =
                (0..nq * os)
                    .map(|i| {
                        if i % os < nk {
                            scores::score(&q[i / os * d..][..d], &k[i % os * stride..][..d])
                        } else {
                            7.0
                        }
                    })
                    .collect();
            assert!(
                dispatched.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                "dispatched: d {d}, {nq} queries"
            );
        }
    }

    /// A block of queries fills only its own lanes' columns; the rest are
    /// zero, whatever the buffer held.
    #[test]
    fn query_columns_pad_their_last_block_with_zeros() {
        let (d, nq) = (3, 37);
        let q: Vec<f32> = (0..nq * d).map(|i| i as f32 + 1.0).collect();
        assert_eq!(QueryColumns::len(nq, d), (32 + 8) * d);
        assert_eq!(QueryColumns::len(8, d), 8 * d);
        assert_eq!(QueryColumns::len(9, d), 16 * d);
        let mut buf = vec![f32::NAN; QueryColumns::len(nq, d) + 5];
        QueryColumns::new(&q, d, &mut buf);
        let last = &buf[32 * d..40 * d];
        for c in 0..d {
            for t in 0..8 {
                let want = if t < 5 { q[(32 + t) * d + c] } else { 0.0 };
                assert_eq!(last[c * 8 + t], want, "column {c} lane {t}");
            }
        }
        assert!(buf[40 * d..].iter().all(|v| v.is_nan()), "written past the columns");
    }

    #[test]
    fn weighted_rows_equal_their_twin_bit_for_bit_and_the_exact_sums_closely() {
        for (d, nq, nk) in SHAPES {
            let (vs, ps) = (d + 9, nk + 3);
            let (p, v, start) = (values(nq * ps, 3), values(nk * vs, 4), values(nq * d, 5));
            let (mut got, mut twin) = (start.clone(), start.clone());
            weighted_rows((&p, ps), (&v, vs, nk), d, &mut got);
            weighted_rows_scalar((&p, ps), (&v, vs, nk), d, &mut twin);
            #[cfg(target_arch = "x86_64")]
            for (level, kernel) in x86_levels() {
                let mut out = start.clone();
                // SAFETY: the level's features were detected; weights, value
                // rows and outputs are the slices just made.
                unsafe { kernel.weighted(p.as_ptr(), ps, nq, v.as_ptr(), vs, nk, d, out.as_mut_ptr()) };
                assert!(bits(&out) == bits(&twin), "{level}: d {d}, {nq} queries, {nk} keys differ from the twin");
            }
            for t in 0..nq {
                for c in 0..d {
                    let at = t * d + c;
                    assert_eq!(got[at].to_bits(), twin[at].to_bits(), "d {d} query {t} column {c}");
                    let exact: f64 =
                        start[at] as f64 + (0..nk).map(|j| p[t * ps + j] as f64 * v[j * vs + c] as f64).sum::<f64>();
                    assert!(
                        (twin[at] as f64 - exact).abs() <= 1e-5 * (1.0 + exact.abs()),
                        "d {d}: {} vs {exact}",
                        twin[at]
                    );
                }
            }
        }
    }

    #[test]
    fn zero_weights_leave_a_query_output_unchanged() {
        let (d, nk, vs) = (40, 11, 48);
        let v = values(nk * vs, 6);
        let mut p = values(nk, 7);
        let mut alone = vec![0f32; d];
        weighted_rows((&p[2..9], 7), (&v[2 * vs..], vs, 7), d, &mut alone);
        for j in (0..2).chain(9..nk) {
            p[j] = 0.0;
        }
        let mut padded = vec![0f32; d];
        weighted_rows((&p, nk), (&v, vs, nk), d, &mut padded);
        assert_eq!(alone, padded);
    }

    #[test]
    fn exp_is_within_two_ulp_of_the_true_value_and_one_at_zero() {
        assert_eq!(exp_scalar(0.0), 1.0);
        assert_eq!(exp_scalar(-100.0), 0.0);
        assert_eq!(exp_scalar(f32::NEG_INFINITY), 0.0);
        assert!(exp_scalar(f32::NAN).is_nan());
        let mut x = -87.0f32;
        while x <= 0.0 {
            let (got, want) = (exp_scalar(x) as f64, (x as f64).exp());
            let ulp = (want as f32).to_bits().abs_diff((got as f32).to_bits());
            assert!(ulp <= 2, "exp({x}) = {got}, true {want}: {ulp} ulp");
            x += 0.000_731;
        }
    }

    #[test]
    fn exp_sums_equal_their_twin_bit_for_bit() {
        for n in [0, 1, 7, 8, 9, 64, 1000, 4099] {
            let mut x: Vec<f32> = values(n, 8).iter().map(|v| v * 90.0 - 1.0).collect();
            x.push(f32::NEG_INFINITY);
            x.push(-87.01);
            let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut twin = x.clone();
            let (a, b) = (exp_shifted_sum(&mut x, max), exp_shifted_sum_scalar(&mut twin, max));
            assert_eq!(a.to_bits(), b.to_bits(), "sum of {n}");
            assert!(x.iter().zip(&twin).all(|(p, q)| p.to_bits() == q.to_bits()), "values of {n}");
        }
    }

    #[test]
    fn softmax_with_a_sink_sums_to_less_than_one() {
        let mut s = vec![1.0f32, 2.0, 3.0];
        softmax(&mut s, None);
        assert!((s.iter().sum::<f32>() - 1.0).abs() < 1e-6 && s[2] > s[1]);
        let mut t = vec![1.0f32, 2.0, 3.0];
        softmax(&mut t, Some(3.0));
        let want = [1f64, 2.0, 3.0].map(|v| v.exp() / (1f64.exp() + 2f64.exp() + 2.0 * 3f64.exp()));
        for (g, w) in t.iter().zip(want) {
            assert!((*g as f64 - w).abs() < 1e-6, "{g} vs {w}");
        }
    }

    #[test]
    #[should_panic(expected = "inconsistent lengths")]
    fn key_rows_past_the_cache_are_refused() {
        let mut out = vec![0f32; 4];
        let mut buf = vec![0f32; QueryColumns::len(1, 8)];
        key_scores(&QueryColumns::new(&[0.0; 8], 8, &mut buf), (&[0.0; 17], 10, 2), &mut out, 2);
    }
}
