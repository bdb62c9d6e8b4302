//! `exp` over a whole vocabulary, the same bits natively and in the
//! component.
//!
//! [`exp_nonpos`] uses IEEE-754 basic operations only (Rust never fuses
//! them), so it does not depend on a platform's libm. In the component the
//! vocabulary-wide passes run two f64 lanes at a time with wasm SIMD: every
//! lane performs exactly the scalar operation sequence (an f32 -> f64
//! promotion is exact, a select is a select), and the sums use the same eight
//! interleaved lanes (`values[i]` into lane `i % 8`) combined in the same
//! fixed order, so the vector and scalar paths agree bit for bit (test
//! `exp_passes_match_the_definition` natively; `lse_check` of
//! `guest/benches/wasm_sampling.sh` in wasm).

/// Below this `exp_nonpos` returns 0: e^-700 is 1e-304, and the cut keeps
/// `2^k` a normal number.
pub const EXP_CUT: f64 = -700.0;

const LOG2_E: f64 = std::f64::consts::LOG2_E;
/// fdlibm's split of ln 2: `k * LN2_HI` is exact for |k| < 2^11.
const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
/// 1.5 * 2^52: adding it rounds to an integer held in the low mantissa bits
/// (round to nearest even); integer operations only after that.
const SHIFT: f64 = 6755399441055744.0;
/// Taylor coefficients 1/n!, n = 0..=10.
const C: [f64; 11] = [
    1.0,
    1.0,
    1.0 / 2.0,
    1.0 / 6.0,
    1.0 / 24.0,
    1.0 / 120.0,
    1.0 / 720.0,
    1.0 / 5040.0,
    1.0 / 40320.0,
    1.0 / 362880.0,
    1.0 / 3628800.0,
];

/// `e^x` for `x <= 0`; anything below `EXP_CUT`, -inf and NaN give 0.
///
/// `x = k ln2 + r` with `|r| <= ln2/2`, the Taylor series of `e^r` to degree
/// 10 (truncation error < r^11/11! < 2.2e-13 relative; Estrin's scheme),
/// and `2^k` from its
/// exponent bits. Relative error below 3e-13 (test
/// `exp_nonpos_matches_libm_closely`): the f32 logits themselves resolve a
/// probability only to ~1e-6 (one ulp of a logit of 10), so the error never
/// matters beyond the last bits of a sum.
#[inline(always)]
pub fn exp_nonpos(x: f64) -> f64 {
    // Clamped first so NaN / -inf give finite values; the select zeroes them.
    let ok = x >= EXP_CUT;
    let xc = if ok { x } else { EXP_CUT };
    let kf = xc * LOG2_E + SHIFT;
    let k = kf - SHIFT;
    let r = (xc - k * LN2_HI) - k * LN2_LO;
    // Estrin's scheme: a dependency chain of 5 operations instead of
    // Horner's 20, which bounded the vector loop by latency.
    let (r2, a) = (r * r, |i: usize| C[i] + C[i + 1] * r);
    let (r4, b0, b1) = (r2 * r2, a(0) + a(2) * r2, a(4) + a(6) * r2);
    let b2 = a(8) + C[10] * r2;
    let p = (b0 + b1 * r4) + b2 * (r4 * r4);
    // k is in [-1010, 1]: 2^k is a normal f64, its exponent field k + 1023.
    let scale = f64::from_bits(kf.to_bits().wrapping_sub(SHIFT.to_bits()).wrapping_add(1023) << 52);
    let y = p * scale;
    if ok {
        y
    } else {
        0.0
    }
}

/// The eight lanes of a sum, combined pairwise.
pub fn combine_lanes(acc: &[f64; 8]) -> f64 {
    ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
}

/// The largest logit (NaN ignored; -inf for none) and whether any is NaN.
pub fn max_and_nan(logits: &[f32]) -> (f32, bool) {
    #[cfg(target_arch = "wasm32")]
    {
        // SAFETY: wasm has no run-time feature test to get wrong: a module
        // that uses SIMD instructions fails validation on an engine without
        // them instead of running, and the engine enables SIMD
        // (wasmtime's default, host/runtime/src/engine_config.rs).
        unsafe { simd::max_and_nan(logits) }
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        scalar::max_and_nan(logits)
    }
}

/// `sum(exp_nonpos((l - max) * inv_t))` over `logits`, in `i % 8` lanes.
pub fn exp_sum(logits: &[f32], max: f64, inv_t: f64) -> f64 {
    #[cfg(target_arch = "wasm32")]
    {
        // SAFETY: as in `max_and_nan`.
        unsafe { simd::exp_sum(logits, max, inv_t) }
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        scalar::exp_sum(logits, max, inv_t)
    }
}

/// The definitions: plain loops, used natively and as the reference of the
/// vector path.
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
pub mod scalar {
    use super::{combine_lanes, exp_nonpos};

    pub fn max_and_nan(logits: &[f32]) -> (f32, bool) {
        let mut max = f32::NEG_INFINITY;
        let mut nan = false;
        for &l in logits {
            if max < l {
                max = l;
            }
            nan |= l.is_nan();
        }
        (max, nan)
    }

    // Chunks of eight (lane j of a chunk is lane i % 8) so that the compiler
    // can vectorise natively; same operations, same order.
    pub fn exp_sum(logits: &[f32], max: f64, inv_t: f64) -> f64 {
        let mut acc = [0.0f64; 8];
        let chunks = logits.chunks_exact(8);
        let rest = chunks.remainder();
        for c in chunks {
            for j in 0..8 {
                acc[j] += exp_nonpos((c[j] as f64 - max) * inv_t);
            }
        }
        for (j, &l) in rest.iter().enumerate() {
            acc[j] += exp_nonpos((l as f64 - max) * inv_t);
        }
        combine_lanes(&acc)
    }
}

#[cfg(target_arch = "wasm32")]
pub(crate) mod simd {
    use super::{combine_lanes, exp_nonpos, C, EXP_CUT, LN2_HI, LN2_LO, LOG2_E, SHIFT};
    use core::arch::wasm32::*;

    // The helpers carry the feature too: an intrinsic only inlines into a
    // function (not a closure) compiled with simd128, else every one of them
    // is a call.

    /// `exp_nonpos` on two lanes, operation for operation.
    #[inline]
    #[target_feature(enable = "simd128")]
    fn exp2(x: v128) -> v128 {
        let cut = f64x2_splat(EXP_CUT);
        let ok = f64x2_ge(x, cut);
        let xc = v128_bitselect(x, cut, ok);
        let kf = f64x2_add(f64x2_mul(xc, f64x2_splat(LOG2_E)), f64x2_splat(SHIFT));
        let k = f64x2_sub(kf, f64x2_splat(SHIFT));
        let r = f64x2_sub(f64x2_sub(xc, f64x2_mul(k, f64x2_splat(LN2_HI))), f64x2_mul(k, f64x2_splat(LN2_LO)));
        let r2 = f64x2_mul(r, r);
        let r4 = f64x2_mul(r2, r2);
        // No closure: it would not inherit simd128 (see above).
        let a0 = f64x2_add(f64x2_splat(C[0]), f64x2_mul(f64x2_splat(C[1]), r));
        let a1 = f64x2_add(f64x2_splat(C[2]), f64x2_mul(f64x2_splat(C[3]), r));
        let a2 = f64x2_add(f64x2_splat(C[4]), f64x2_mul(f64x2_splat(C[5]), r));
        let a3 = f64x2_add(f64x2_splat(C[6]), f64x2_mul(f64x2_splat(C[7]), r));
        let a4 = f64x2_add(f64x2_splat(C[8]), f64x2_mul(f64x2_splat(C[9]), r));
        let b0 = f64x2_add(a0, f64x2_mul(a1, r2));
        let b1 = f64x2_add(a2, f64x2_mul(a3, r2));
        let b2 = f64x2_add(a4, f64x2_mul(f64x2_splat(C[10]), r2));
        let p = f64x2_add(f64x2_add(b0, f64x2_mul(b1, r4)), f64x2_mul(b2, f64x2_mul(r4, r4)));
        let bits = i64x2_shl(i64x2_add(i64x2_sub(kf, i64x2_splat(SHIFT.to_bits() as i64)), i64x2_splat(1023)), 52);
        v128_and(f64x2_mul(p, bits), ok)
    }

    /// The upper two f32 lanes of `v` as f64.
    #[inline]
    #[target_feature(enable = "simd128")]
    pub(crate) fn promote_high(v: v128) -> v128 {
        f64x2_promote_low_f32x4(i32x4_shuffle::<2, 3, 2, 3>(v, v))
    }

    /// `(x - max) * inv_t` on two lanes.
    #[inline]
    #[target_feature(enable = "simd128")]
    fn shifted(x: v128, max: v128, inv_t: v128) -> v128 {
        f64x2_mul(f64x2_sub(x, max), inv_t)
    }

    /// Logits 8c..8c+8 as four f64 pairs, shifted and scaled.
    #[inline]
    #[target_feature(enable = "simd128")]
    fn load8(chunk: &[f32], max: v128, inv_t: v128) -> [v128; 4] {
        assert!(chunk.len() >= 8);
        // SAFETY: `chunk` holds at least 8 f32 (32 bytes); wasm loads need no
        // alignment.
        let (a, b) =
            unsafe { (v128_load(chunk.as_ptr() as *const v128), v128_load(chunk.as_ptr().add(4) as *const v128)) };
        [
            shifted(f64x2_promote_low_f32x4(a), max, inv_t),
            shifted(promote_high(a), max, inv_t),
            shifted(f64x2_promote_low_f32x4(b), max, inv_t),
            shifted(promote_high(b), max, inv_t),
        ]
    }

    #[inline]
    #[target_feature(enable = "simd128")]
    fn lanes(acc: &[v128; 4]) -> [f64; 8] {
        let mut out = [0.0f64; 8];
        for (j, a) in acc.iter().enumerate() {
            out[2 * j] = f64x2_extract_lane::<0>(*a);
            out[2 * j + 1] = f64x2_extract_lane::<1>(*a);
        }
        out
    }

    #[target_feature(enable = "simd128")]
    pub unsafe fn max_and_nan(logits: &[f32]) -> (f32, bool) {
        let mut m = f32x4_splat(f32::NEG_INFINITY);
        let mut nan = i32x4_splat(0);
        let chunks = logits.chunks_exact(4);
        let rest = chunks.remainder();
        for c in chunks {
            // SAFETY: 4 f32; wasm loads need no alignment.
            let v = unsafe { v128_load(c.as_ptr() as *const v128) };
            // pmax(m, v) is `m < v ? v : m`, the scalar loop's step.
            m = f32x4_pmax(m, v);
            nan = v128_or(nan, f32x4_ne(v, v));
        }
        let mut max = f32::NEG_INFINITY;
        for x in [
            f32x4_extract_lane::<0>(m),
            f32x4_extract_lane::<1>(m),
            f32x4_extract_lane::<2>(m),
            f32x4_extract_lane::<3>(m),
        ] {
            if max < x {
                max = x;
            }
        }
        let mut any_nan = v128_any_true(nan);
        for &l in rest {
            if max < l {
                max = l;
            }
            any_nan |= l.is_nan();
        }
        (max, any_nan)
    }

    #[target_feature(enable = "simd128")]
    pub unsafe fn exp_sum(logits: &[f32], max: f64, inv_t: f64) -> f64 {
        let (vmax, vinv) = (f64x2_splat(max), f64x2_splat(inv_t));
        let mut acc = [f64x2_splat(0.0); 4];
        let chunks = logits.chunks_exact(8);
        let rest = chunks.remainder();
        for c in chunks {
            let xs = load8(c, vmax, vinv);
            for j in 0..4 {
                acc[j] = f64x2_add(acc[j], exp2(xs[j]));
            }
        }
        let mut acc = lanes(&acc);
        for (j, &l) in rest.iter().enumerate() {
            acc[j] += exp_nonpos((l as f64 - max) * inv_t);
        }
        combine_lanes(&acc)
    }
}
