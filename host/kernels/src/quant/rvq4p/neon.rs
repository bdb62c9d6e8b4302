//! The aarch64 NEON `rvq4p` kernel, bit-identical to the portable one.

use super::{ENTRIES, ROWS, TBLK, TBYTES, VBYTES};
use std::arch::aarch64::*;

/// # Safety
/// NEON is available (aarch64 baseline); lengths as for the scalar
/// kernel: `planes.len() == nvec * VBYTES`, `q.len() == nvec * TBYTES`,
/// `scales.len() == ceil(nvec / TBLK)`.
#[target_feature(enable = "neon")]
pub(super) unsafe fn block_neon(planes: &[u8], q: &[i8], scales: &[f32], nvec: usize, out: &mut [f32; ROWS]) {
    let mut acc = [vdupq_n_f32(0.0); 8];
    for (b, &ts) in scales.iter().enumerate() {
        // i16 sums of rows 0-7, 8-15, 16-23, 24-31.
        let mut s16 = [vdupq_n_s16(0); 4];
        for v in b * TBLK..((b + 1) * TBLK).min(nvec) {
            // SAFETY: v < nvec keeps every load inside `planes` / `q`.
            let p = planes.as_ptr().add(v * VBYTES);
            let t = q.as_ptr().add(v * TBYTES);
            let tab = |s: usize| -> int8x16x4_t {
                let o = t.add(s * ENTRIES);
                int8x16x4_t(vld1q_s8(o), vld1q_s8(o.add(16)), vld1q_s8(o.add(32)), vld1q_s8(o.add(48)))
            };
            let tabs = [tab(0), tab(1), tab(2), tab(3)];
            for h in 0..2 {
                let b0 = vld1q_u8(p.add(16 * h));
                let b1 = vld1q_u8(p.add(ROWS + 16 * h));
                let b2 = vld1q_u8(p.add(2 * ROWS + 16 * h));
                let m = vdupq_n_u8(63);
                let c3 = vorrq_u8(
                    vshrq_n_u8(b0, 6),
                    vorrq_u8(vshlq_n_u8(vshrq_n_u8(b1, 6), 2), vshlq_n_u8(vshrq_n_u8(b2, 6), 4)),
                );
                let r0 = vqtbl4q_s8(tabs[0], vandq_u8(b0, m));
                let r1 = vqtbl4q_s8(tabs[1], vandq_u8(b1, m));
                let r2 = vqtbl4q_s8(tabs[2], vandq_u8(b2, m));
                let r3 = vqtbl4q_s8(tabs[3], c3);
                let lo =
                    vaddq_s16(vaddl_s8(vget_low_s8(r0), vget_low_s8(r1)), vaddl_s8(vget_low_s8(r2), vget_low_s8(r3)));
                let hi = vaddq_s16(vaddl_high_s8(r0, r1), vaddl_high_s8(r2, r3));
                s16[2 * h] = vaddq_s16(s16[2 * h], lo);
                s16[2 * h + 1] = vaddq_s16(s16[2 * h + 1], hi);
            }
        }
        let sv = vdupq_n_f32(ts);
        for (j, s) in s16.iter().enumerate() {
            let lo = vcvtq_f32_s32(vmovl_s16(vget_low_s16(*s)));
            let hi = vcvtq_f32_s32(vmovl_high_s16(*s));
            // Separate multiply and add, as in the scalar kernel.
            acc[2 * j] = vaddq_f32(acc[2 * j], vmulq_f32(lo, sv));
            acc[2 * j + 1] = vaddq_f32(acc[2 * j + 1], vmulq_f32(hi, sv));
        }
    }
    for (k, a) in acc.iter().enumerate() {
        // SAFETY: 8 x 4 floats fill exactly the 32 of `out`.
        vst1q_f32(out.as_mut_ptr().add(4 * k), *a);
    }
}
