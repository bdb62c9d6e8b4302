//! The aarch64 NEON kernels of `simd`, chosen at run time by `isa()`; each
//! with its scalar twin in `simd/mod.rs`. The dot products fuse multiply
//! and add (`vfmaq_f32`) and sum in another order than the scalar loops,
//! so they agree with them to rounding, as the AVX2 ones do; the table
//! build is the portable loop, which LLVM vectorises with NEON and which
//! is bit-identical by construction (no contraction in Rust).

use super::{f16_at, GROUP};
use std::arch::aarch64::*;

/// # Safety
/// NEON is available (the aarch64 baseline); `w.len() == x.len()`.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
    let n = w.len();
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let mut acc = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    // SAFETY (all loads): i + 16 <= n, resp. i + 4 <= n, bounds every
    // 4-lane load inside both slices.
    while i + 16 <= n {
        for (k, a) in acc.iter_mut().enumerate() {
            let o = i + 4 * k;
            *a = vfmaq_f32(*a, vld1q_f32(wp.add(o)), vld1q_f32(xp.add(o)));
        }
        i += 16;
    }
    while i + 4 <= n {
        acc[0] = vfmaq_f32(acc[0], vld1q_f32(wp.add(i)), vld1q_f32(xp.add(i)));
        i += 4;
    }
    let mut s = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
    while i < n {
        s += w[i] * x[i];
        i += 1;
    }
    s
}

/// Eight i8 widened to two f32x4.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn i8x8_to_f32(v: int8x8_t) -> (float32x4_t, float32x4_t) {
    let w = vmovl_s8(v);
    (vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), vcvtq_f32_s32(vmovl_high_s16(w)))
}

/// # Safety
/// NEON is available; `q.len() == x.len()` and `scales` holds
/// `2 * ceil(x.len() / 128)` bytes.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn dot_q8(scales: &[u8], q: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    let (qp, xp) = (q.as_ptr() as *const i8, x.as_ptr());
    let mut racc = vdupq_n_f32(0.0);
    let mut tail = 0f32;
    let mut g0 = 0;
    while g0 < n {
        let glen = GROUP.min(n - g0);
        let scale = f16_at(scales, g0 / GROUP);
        let (mut a0, mut a1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
        let mut i = 0;
        // SAFETY (all loads): g0 + i + 8 <= n keeps the 8 bytes and 8
        // floats inside `q` and `x`.
        while i + 8 <= glen {
            let p = g0 + i;
            let (lo, hi) = i8x8_to_f32(vld1_s8(qp.add(p)));
            a0 = vfmaq_f32(a0, lo, vld1q_f32(xp.add(p)));
            a1 = vfmaq_f32(a1, hi, vld1q_f32(xp.add(p + 4)));
            i += 8;
        }
        let mut ts = 0f32;
        while i < glen {
            ts += (q[g0 + i] as i8) as f32 * x[g0 + i];
            i += 1;
        }
        tail += scale * ts;
        racc = vfmaq_n_f32(racc, vaddq_f32(a0, a1), scale);
        g0 += glen;
    }
    vaddvq_f32(racc) + tail
}

/// # Safety
/// NEON is available.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn build_tables(x: &[f32], cbt: &[f32], stages: usize, entries: usize, out: &mut [f32]) {
    super::build_tables_generic(x, cbt, stages, entries, out)
}
