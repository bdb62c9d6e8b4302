//! The vocabulary-wide passes of sampling without top-k, in f32 on four wasm
//! SIMD lanes, the same bits natively and in the component.
//!
//! Sampling masses `exp((l - max) / T)` are computed in f32 by
//! [`exp32_nonpos`] (IEEE-754 basic operations only, as `exp_nonpos`): the
//! reference (transformers) computes its softmax in f32, and f32 runs four
//! lanes per wasm SIMD instruction where f64 runs two. The sums stay f64, in
//! the eight interleaved lanes of `lane_sum`. The token's reported logprob is
//! not computed here: it stays f64 (`log_sum_exp`).
//!
//! Every vector helper performs, lane by lane, exactly the scalar operation
//! sequence of its definition in `scalar` (tests in sampling/tests.rs;
//! `guest/benches/wasm_sampling.sh` checks the vector paths against the
//! definitions inside wasm).

// The parent's (`lane_sum` order); `guest/benches/wasm_sampling.sh` includes
// this file on its own beside a copy.
use super::combine_lanes;

/// Below this `exp32_nonpos` returns 0: e^-87 is 1.6e-38, and the cut keeps
/// `2^k` a normal f32. (The reference's f32 softmax underflows near -103.)
pub const EXP32_CUT: f32 = -87.0;

const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// Cody-Waite split of ln 2 (Cephes `expf`): `k * LN2_HI` is exact for the
/// |k| <= 126 used here.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits.
const SHIFT: f32 = 12_582_912.0;
/// Cephes `expf`: e^r = 1 + r + r^2 P(r) on |r| <= ln2/2.
const P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5, // Cephes 5.0000001201e-1, which rounds to 0.5 in f32
];

/// `e^x` in f32 for `x <= 0`; anything below `EXP32_CUT`, -inf and NaN give
/// 0; `exp32_nonpos(0) == 1` exactly. Relative error below 2.5e-7 against
/// f64 `exp` of the same f32 `x` (test `exp32_nonpos_matches_libm_closely`).
#[inline(always)]
pub fn exp32_nonpos(x: f32) -> f32 {
    let ok = x >= EXP32_CUT;
    let xc = if ok { x } else { EXP32_CUT };
    let kf = xc * LOG2_E + SHIFT;
    let k = kf - SHIFT;
    let r = (xc - k * LN2_HI) - k * LN2_LO;
    // Estrin's scheme (a short dependency chain, as `exp_nonpos`).
    let r2 = r * r;
    let p = ((P[5] + P[4] * r) + (P[3] + P[2] * r) * r2) + (P[1] + P[0] * r) * (r2 * r2);
    let y = (p * r2 + r) + 1.0;
    // k is in [-126, 0]: 2^k is a normal f32, its exponent field k + 127.
    let scale = f32::from_bits(kf.to_bits().wrapping_sub(SHIFT.to_bits()).wrapping_add(127) << 23);
    let v = y * scale;
    if ok {
        v
    } else {
        0.0
    }
}

/// `1 / temperature` as the f32 factor of `mass_each`, finite: a tiny
/// positive temperature would otherwise give inf, and `0 * inf` would make
/// the most likely token's mass NaN (then 0).
pub fn inv_temperature(temperature: f32) -> f32 {
    ((1.0 / temperature as f64) as f32).min(f32::MAX)
}

/// `f32::total_cmp` as an unsigned key: `a.total_cmp(&b)` is
/// `total_key(a).cmp(&total_key(b))`.
#[inline(always)]
pub fn total_key(v: f32) -> u32 {
    let b = v.to_bits() as i32;
    ((b ^ (((b >> 31) as u32) >> 1) as i32) as u32) ^ 0x8000_0000
}

/// Ids per block of `block_sums`.
pub const BLOCK: usize = 64;

/// Which tokens a draw may land on: mass at least `floor` (> 0, so a token
/// without mass never is), and with `cut = Some((key, id))` a rank at least
/// that of the token `id` whose logit has `total_key` `key`.
#[derive(Debug, Clone, Copy)]
pub struct Kept {
    pub floor: f32,
    pub cut: Option<(u32, u32)>,
}

impl Kept {
    #[inline(always)]
    pub fn keeps(&self, l: f32, q: f32, i: usize) -> bool {
        q >= self.floor
            && match self.cut {
                None => true,
                Some((key, id)) => {
                    let k = total_key(l);
                    k > key || (k == key && i as u32 <= id)
                }
            }
    }
}

/// The kept mass of every block of `BLOCK` ids (the last one may be
/// shorter), each summed in f64 in eight interleaved lanes (`i % 8` within
/// the block) combined as `combine_lanes`: what a draw walks before it walks
/// the ids of one block.
pub fn block_sums(logits: &[f32], rel: &[f32], kept: Kept) -> Vec<f64> {
    assert_eq!(logits.len(), rel.len());
    #[cfg(target_arch = "wasm32")]
    {
        // SAFETY: as in `mass_each`.
        unsafe { simd::block_sums(logits, rel, kept) }
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        scalar::block_sums(logits, rel, kept)
    }
}

/// Adds the mass `rel[i]` of every token with `rel[i] >= floor` to
/// `mass[total_key(logits[i]) >> 20]` (f64, in id order): the first
/// histogram of the nucleus.
pub fn bucket_mass(logits: &[f32], rel: &[f32], floor: f32, mass: &mut [f64; 4096]) {
    assert_eq!(logits.len(), rel.len());
    #[cfg(target_arch = "wasm32")]
    {
        // SAFETY: as in `mass_each`.
        unsafe { simd::bucket_mass(logits, rel, floor, mass) }
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        scalar::bucket_mass(logits, rel, floor, mass)
    }
}

/// The masses `exp32_nonpos((l - max) * inv_t)` of every logit, into `out`
/// (as long as `logits`), and their sum in f64 in `lane_sum` order.
pub fn mass_each(logits: &[f32], max: f32, inv_t: f32, out: &mut [f32]) -> f64 {
    assert_eq!(logits.len(), out.len());
    #[cfg(target_arch = "wasm32")]
    {
        // SAFETY: wasm has no run-time feature test to get wrong: a module
        // that uses SIMD instructions fails validation on an engine without
        // them instead of running, and the engine enables SIMD (wasmtime's
        // default, host/runtime/src/engine_config.rs).
        unsafe { simd::mass_each(logits, max, inv_t, out) }
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        scalar::mass_each(logits, max, inv_t, out)
    }
}

/// Index of the largest logit; the lowest index wins ties (-0.0 and 0.0
/// tie), NaN never wins, 0 when none is above -inf.
pub fn argmax(logits: &[f32]) -> usize {
    #[cfg(target_arch = "wasm32")]
    {
        // SAFETY: as in `mass_each`.
        unsafe { simd::argmax(logits) }
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        scalar::argmax(logits)
    }
}

/// The first index `i >= from` with `values[i] >= floor` (NaN never is), or
/// `values.len()`.
pub fn next_at_least(values: &[f32], from: usize, floor: f32) -> usize {
    #[cfg(target_arch = "wasm32")]
    {
        // SAFETY: as in `mass_each`.
        unsafe { simd::next_at_least(values, from, floor) }
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        scalar::next_at_least(values, from, floor)
    }
}

/// The first index `i >= from` with `total_key(logits[i]) >> 20 == bucket`,
/// or `logits.len()`.
pub fn next_in_bucket(logits: &[f32], from: usize, bucket: u32) -> usize {
    #[cfg(target_arch = "wasm32")]
    {
        // SAFETY: as in `mass_each`.
        unsafe { simd::next_in_bucket(logits, from, bucket) }
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        scalar::next_in_bucket(logits, from, bucket)
    }
}

/// The definitions: plain loops, used natively and as the reference of the
/// vector path.
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
pub mod scalar {
    use super::{combine_lanes, exp32_nonpos, total_key, Kept, BLOCK};

    /// The kept mass of the block starting at `start`.
    pub fn block_sum(logits: &[f32], rel: &[f32], kept: Kept, start: usize) -> f64 {
        let end = (start + BLOCK).min(logits.len());
        let mut acc = [0.0f64; 8];
        for i in start..end {
            if kept.keeps(logits[i], rel[i], i) {
                acc[(i - start) % 8] += rel[i] as f64;
            }
        }
        combine_lanes(&acc)
    }

    pub fn bucket_mass(logits: &[f32], rel: &[f32], floor: f32, mass: &mut [f64; 4096]) {
        for (&l, &q) in logits.iter().zip(rel) {
            if q >= floor {
                mass[(total_key(l) >> 20) as usize] += q as f64;
            }
        }
    }

    pub fn block_sums(logits: &[f32], rel: &[f32], kept: Kept) -> Vec<f64> {
        (0..logits.len()).step_by(BLOCK).map(|start| block_sum(logits, rel, kept, start)).collect()
    }

    pub fn mass_each(logits: &[f32], max: f32, inv_t: f32, out: &mut [f32]) -> f64 {
        let mut acc = [0.0f64; 8];
        let n = logits.len() - logits.len() % 8;
        for (c, o) in logits[..n].chunks_exact(8).zip(out[..n].chunks_exact_mut(8)) {
            for j in 0..8 {
                o[j] = exp32_nonpos((c[j] - max) * inv_t);
                acc[j] += o[j] as f64;
            }
        }
        for (j, (&l, o)) in logits[n..].iter().zip(out[n..].iter_mut()).enumerate() {
            *o = exp32_nonpos((l - max) * inv_t);
            acc[j] += *o as f64;
        }
        combine_lanes(&acc)
    }

    pub fn argmax(logits: &[f32]) -> usize {
        let mut best = 0;
        let mut best_value = f32::NEG_INFINITY;
        for (i, &v) in logits.iter().enumerate() {
            if v > best_value {
                best = i;
                best_value = v;
            }
        }
        best
    }

    pub fn next_at_least(values: &[f32], from: usize, floor: f32) -> usize {
        values.get(from..).and_then(|v| v.iter().position(|&x| x >= floor)).map_or(values.len(), |p| from + p)
    }

    pub fn next_in_bucket(logits: &[f32], from: usize, bucket: u32) -> usize {
        logits
            .get(from..)
            .and_then(|v| v.iter().position(|&x| total_key(x) >> 20 == bucket))
            .map_or(logits.len(), |p| from + p)
    }
}

#[cfg(target_arch = "wasm32")]
mod simd {
    use super::{combine_lanes, exp32_nonpos, scalar, Kept, BLOCK, EXP32_CUT, LN2_HI, LN2_LO, LOG2_E, P, SHIFT};
    use crate::sampling::exp::simd::promote_high;
    use core::arch::wasm32::*;

    // The helpers carry the feature too: an intrinsic only inlines into a
    // function (not a closure) compiled with simd128, else every one of them
    // is a call.

    /// `exp32_nonpos` on four lanes, operation for operation.
    #[inline]
    #[target_feature(enable = "simd128")]
    fn exp4(x: v128) -> v128 {
        let cut = f32x4_splat(EXP32_CUT);
        let ok = f32x4_ge(x, cut);
        let xc = v128_bitselect(x, cut, ok);
        let kf = f32x4_add(f32x4_mul(xc, f32x4_splat(LOG2_E)), f32x4_splat(SHIFT));
        let k = f32x4_sub(kf, f32x4_splat(SHIFT));
        let r = f32x4_sub(f32x4_sub(xc, f32x4_mul(k, f32x4_splat(LN2_HI))), f32x4_mul(k, f32x4_splat(LN2_LO)));
        let r2 = f32x4_mul(r, r);
        let u0 = f32x4_add(f32x4_splat(P[5]), f32x4_mul(f32x4_splat(P[4]), r));
        let u1 = f32x4_add(f32x4_splat(P[3]), f32x4_mul(f32x4_splat(P[2]), r));
        let u2 = f32x4_add(f32x4_splat(P[1]), f32x4_mul(f32x4_splat(P[0]), r));
        let p = f32x4_add(f32x4_add(u0, f32x4_mul(u1, r2)), f32x4_mul(u2, f32x4_mul(r2, r2)));
        let y = f32x4_add(f32x4_add(f32x4_mul(p, r2), r), f32x4_splat(1.0));
        let scale = i32x4_shl(i32x4_add(i32x4_sub(kf, i32x4_splat(SHIFT.to_bits() as i32)), i32x4_splat(127)), 23);
        v128_and(f32x4_mul(y, scale), ok)
    }

    #[inline]
    #[target_feature(enable = "simd128")]
    fn load4(v: &[f32], at: usize) -> v128 {
        assert!(at + 4 <= v.len());
        // SAFETY: in bounds (asserted); wasm loads need no alignment.
        unsafe { v128_load(v.as_ptr().add(at) as *const v128) }
    }

    #[target_feature(enable = "simd128")]
    pub unsafe fn mass_each(logits: &[f32], max: f32, inv_t: f32, out: &mut [f32]) -> f64 {
        let (vmax, vinv) = (f32x4_splat(max), f32x4_splat(inv_t));
        let mut acc = [f64x2_splat(0.0); 4];
        let n = logits.len() - logits.len() % 8;
        let out_head = &mut out[..n];
        let mut i = 0;
        while i < n {
            let a = exp4(f32x4_mul(f32x4_sub(load4(logits, i), vmax), vinv));
            let b = exp4(f32x4_mul(f32x4_sub(load4(logits, i + 4), vmax), vinv));
            assert!(i + 8 <= out_head.len());
            // SAFETY: in bounds (asserted); wasm stores need no alignment.
            unsafe {
                v128_store(out_head.as_mut_ptr().add(i) as *mut v128, a);
                v128_store(out_head.as_mut_ptr().add(i + 4) as *mut v128, b);
            }
            acc[0] = f64x2_add(acc[0], f64x2_promote_low_f32x4(a));
            acc[1] = f64x2_add(acc[1], promote_high(a));
            acc[2] = f64x2_add(acc[2], f64x2_promote_low_f32x4(b));
            acc[3] = f64x2_add(acc[3], promote_high(b));
            i += 8;
        }
        let mut lanes = [0.0f64; 8];
        for (j, a) in acc.iter().enumerate() {
            lanes[2 * j] = f64x2_extract_lane::<0>(*a);
            lanes[2 * j + 1] = f64x2_extract_lane::<1>(*a);
        }
        for (j, (&l, o)) in logits[n..].iter().zip(out[n..].iter_mut()).enumerate() {
            *o = exp32_nonpos((l - max) * inv_t);
            lanes[j] += *o as f64;
        }
        combine_lanes(&lanes)
    }

    /// `total_key(v)` on four lanes: the scalar operations on i32 lanes.
    #[inline]
    #[target_feature(enable = "simd128")]
    fn keys(v: v128) -> v128 {
        v128_xor(v128_xor(v, u32x4_shr(i32x4_shr(v, 31), 1)), u32x4_splat(0x8000_0000))
    }

    #[target_feature(enable = "simd128")]
    pub unsafe fn bucket_mass(logits: &[f32], rel: &[f32], floor: f32, mass: &mut [f64; 4096]) {
        // Keys and masses four at a time; the adds one by one in id order. A
        // token below the floor adds +0.0 (a bucket is never -0.0), which
        // changes nothing, as skipping it does.
        let f = f32x4_splat(floor);
        let n = logits.len() - logits.len() % 4;
        let mut i = 0;
        while i < n {
            let q = load4(rel, i);
            let q = v128_and(q, f32x4_ge(q, f));
            let b = u32x4_shr(keys(load4(logits, i)), 20);
            let (lo, hi) = (f64x2_promote_low_f32x4(q), promote_high(q));
            // `& 0xFFF` is a no-op on a 12-bit value; it lets the indexing
            // go unchecked.
            mass[(u32x4_extract_lane::<0>(b) & 0xFFF) as usize] += f64x2_extract_lane::<0>(lo);
            mass[(u32x4_extract_lane::<1>(b) & 0xFFF) as usize] += f64x2_extract_lane::<1>(lo);
            mass[(u32x4_extract_lane::<2>(b) & 0xFFF) as usize] += f64x2_extract_lane::<0>(hi);
            mass[(u32x4_extract_lane::<3>(b) & 0xFFF) as usize] += f64x2_extract_lane::<1>(hi);
            i += 4;
        }
        scalar::bucket_mass(&logits[n..], &rel[n..], floor, mass);
    }

    #[target_feature(enable = "simd128")]
    pub unsafe fn block_sums(logits: &[f32], rel: &[f32], kept: Kept) -> Vec<f64> {
        let floor = f32x4_splat(kept.floor);
        let (cut, key) = match kept.cut {
            Some((key, _)) => (true, u32x4_splat(key)),
            None => (false, u32x4_splat(0)),
        };
        let full = logits.len() - logits.len() % BLOCK;
        let mut out = Vec::with_capacity(logits.len().div_ceil(BLOCK));
        let mut start = 0;
        while start < full {
            let mut acc = [f64x2_splat(0.0); 4];
            let mut tie = i32x4_splat(0);
            let mut i = start;
            while i < start + BLOCK {
                for h in 0..2 {
                    let q = load4(rel, i + 4 * h);
                    let mut m = f32x4_ge(q, floor);
                    if cut {
                        let k = keys(load4(logits, i + 4 * h));
                        m = v128_and(m, u32x4_gt(k, key));
                        tie = v128_or(tie, i32x4_eq(k, key));
                    }
                    // A token not kept adds +0.0, which leaves a lane (never
                    // -0.0: it starts at +0.0 and adds masses) unchanged.
                    let q = v128_and(q, m);
                    acc[2 * h] = f64x2_add(acc[2 * h], f64x2_promote_low_f32x4(q));
                    acc[2 * h + 1] = f64x2_add(acc[2 * h + 1], promote_high(q));
                }
                i += 8;
            }
            if v128_any_true(tie) {
                // A logit equal to the cut's: the id decides, as in `keeps`.
                out.push(scalar::block_sum(logits, rel, kept, start));
            } else {
                let mut lanes = [0.0f64; 8];
                for (j, a) in acc.iter().enumerate() {
                    lanes[2 * j] = f64x2_extract_lane::<0>(*a);
                    lanes[2 * j + 1] = f64x2_extract_lane::<1>(*a);
                }
                out.push(combine_lanes(&lanes));
            }
            start += BLOCK;
        }
        if full < logits.len() {
            out.push(scalar::block_sum(logits, rel, kept, full));
        }
        out
    }

    #[target_feature(enable = "simd128")]
    pub unsafe fn argmax(logits: &[f32]) -> usize {
        // The largest value first (pmax(m, v) is `m < v ? v : m`: NaN never
        // enters), then its first index: the scalar loop's answer.
        let mut m = f32x4_splat(f32::NEG_INFINITY);
        let n = logits.len() - logits.len() % 4;
        let mut i = 0;
        while i < n {
            m = f32x4_pmax(m, load4(logits, i));
            i += 4;
        }
        let mut max = f32::NEG_INFINITY;
        for x in [
            f32x4_extract_lane::<0>(m),
            f32x4_extract_lane::<1>(m),
            f32x4_extract_lane::<2>(m),
            f32x4_extract_lane::<3>(m),
        ]
        .into_iter()
        .chain(logits[n..].iter().copied())
        {
            if max < x {
                max = x;
            }
        }
        if !(max > f32::NEG_INFINITY) {
            return 0;
        }
        // SAFETY: simd128 is enabled in this function.
        unsafe { next_at_least(logits, 0, max) }
    }

    #[target_feature(enable = "simd128")]
    pub unsafe fn next_at_least(values: &[f32], from: usize, floor: f32) -> usize {
        let f = f32x4_splat(floor);
        let mut i = from;
        while i + 16 <= values.len() {
            let hit = v128_or(
                v128_or(f32x4_ge(load4(values, i), f), f32x4_ge(load4(values, i + 4), f)),
                v128_or(f32x4_ge(load4(values, i + 8), f), f32x4_ge(load4(values, i + 12), f)),
            );
            if v128_any_true(hit) {
                break;
            }
            i += 16;
        }
        scalar::next_at_least(values, i.min(values.len()), floor)
    }

    #[target_feature(enable = "simd128")]
    pub unsafe fn next_in_bucket(logits: &[f32], from: usize, bucket: u32) -> usize {
        let want = u32x4_splat(bucket);
        let mut i = from;
        while i + 8 <= logits.len() {
            let hit = v128_or(
                i32x4_eq(u32x4_shr(keys(load4(logits, i)), 20), want),
                i32x4_eq(u32x4_shr(keys(load4(logits, i + 4)), 20), want),
            );
            if v128_any_true(hit) {
                break;
            }
            i += 8;
        }
        scalar::next_in_bucket(logits, i.min(logits.len()), bucket)
    }
}
