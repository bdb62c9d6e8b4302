//! The rvq3/rvq2 row walk on aarch64, modelled before building (issue 19):
//! the portable loop of `simd::rvq_rows8` as LLVM compiles it for aarch64,
//! against two NEON formulations of the same in-order f32 sums with lanes
//! as rows, a position's 256-entry table held as four byte planes and
//! looked up with `tbl`/`tbx` over four 64-byte quarters (the AVX-512 VBMI
//! kernel's plan, `simd/avx512.rs`, with 16-byte instead of 64-byte
//! vectors). Not part of the build: `run.sh` compiles it to assembly and
//! gives each loop to llvm-mca's scheduling models. The NEON loops take
//! codes already transposed to one vector of 16 rows per position (the
//! 16x16 byte transpose they would need is left out, in their favour).
#![allow(clippy::missing_safety_doc)]
use core::arch::aarch64::*;

/// Scalar: the portable rvq_rows8 walk (8 rows, u64 code words).
#[no_mangle]
pub unsafe extern "C" fn scalar8(tp: *const f32, cp: *const u8, n: usize, c0: usize, c1: usize, acc: &mut [f32; 8]) {
    let mut s = *acc;
    let mut j = c0;
    while j + 8 <= c1 {
        let mut w = [0u64; 8];
        for (r, wr) in w.iter_mut().enumerate() {
            *wr = u64::from_le(core::ptr::read_unaligned(cp.add(r * n + j) as *const u64));
        }
        for k in 0..8 {
            let t = tp.add((j + k) * 256);
            for r in 0..8 {
                s[r] += *t.add((w[r] & 255) as usize);
                w[r] >>= 8;
            }
        }
        j += 8;
    }
    *acc = s;
}

/// NEON, one group of 16 rows, the position's 1 KiB of planes loaded per
/// position; `tc[p]` = codes of the 16 rows at position p (pre-transposed).
#[no_mangle]
#[target_feature(enable = "neon")]
pub unsafe extern "C" fn neon16(planes: *const u8, tc: *const u8, len: usize, acc: *mut f32) {
    let mut a = [vld1q_f32(acc), vld1q_f32(acc.add(4)), vld1q_f32(acc.add(8)), vld1q_f32(acc.add(12))];
    for p in 0..len {
        let t = planes.add(p * 1024);
        let c = vld1q_u8(tc.add(16 * p));
        let i1 = veorq_u8(c, vdupq_n_u8(0x40));
        let i2 = veorq_u8(c, vdupq_n_u8(0x80));
        let i3 = veorq_u8(c, vdupq_n_u8(0xC0));
        let mut b = [vdupq_n_u8(0); 4];
        for (k, bk) in b.iter_mut().enumerate() {
            let pb = t.add(256 * k);
            let r = vqtbl4q_u8(vld1q_u8_x4(pb), c);
            let r = vqtbx4q_u8(r, vld1q_u8_x4(pb.add(64)), i1);
            let r = vqtbx4q_u8(r, vld1q_u8_x4(pb.add(128)), i2);
            *bk = vqtbx4q_u8(r, vld1q_u8_x4(pb.add(192)), i3);
        }
        let f = planes_to_floats(b);
        for k in 0..4 {
            a[k] = vaddq_f32(a[k], f[k]);
        }
    }
    for k in 0..4 {
        vst1q_f32(acc.add(4 * k), a[k]);
    }
}

/// NEON, four groups (64 rows) sharing each table quadrant load.
#[no_mangle]
#[target_feature(enable = "neon")]
pub unsafe extern "C" fn neon64(planes: *const u8, tc: *const u8, len: usize, acc: *mut f32) {
    for p in 0..len {
        let t = planes.add(p * 1024);
        let mut c = [vdupq_n_u8(0); 4];
        for g in 0..4 {
            c[g] = vld1q_u8(tc.add(64 * p + 16 * g));
        }
        let mut b = [[vdupq_n_u8(0); 4]; 4];
        for q in 0..4 {
            let x = vdupq_n_u8(64 * q as u8);
            let mut i = [vdupq_n_u8(0); 4];
            for g in 0..4 {
                i[g] = veorq_u8(c[g], x);
            }
            for k in 0..4 {
                let tab = vld1q_u8_x4(t.add(256 * k + 64 * q));
                for g in 0..4 {
                    b[g][k] = if q == 0 { vqtbl4q_u8(tab, i[g]) } else { vqtbx4q_u8(b[g][k], tab, i[g]) };
                }
            }
        }
        for g in 0..4 {
            let ap = acc.add(16 * g);
            let f = planes_to_floats(b[g]);
            for k in 0..4 {
                vst1q_f32(ap.add(4 * k), vaddq_f32(vld1q_f32(ap.add(4 * k)), f[k]));
            }
        }
    }
}

/// Four byte planes of 16 rows (byte b of each row's f32 in plane b) back
/// into the rows' floats, 4 a register: two rounds of zips.
#[inline(always)]
unsafe fn planes_to_floats(b: [uint8x16_t; 4]) -> [float32x4_t; 4] {
    let l01 = vreinterpretq_u16_u8(vzip1q_u8(b[0], b[1]));
    let h01 = vreinterpretq_u16_u8(vzip2q_u8(b[0], b[1]));
    let l23 = vreinterpretq_u16_u8(vzip1q_u8(b[2], b[3]));
    let h23 = vreinterpretq_u16_u8(vzip2q_u8(b[2], b[3]));
    [
        vreinterpretq_f32_u16(vzip1q_u16(l01, l23)),
        vreinterpretq_f32_u16(vzip2q_u16(l01, l23)),
        vreinterpretq_f32_u16(vzip1q_u16(h01, h23)),
        vreinterpretq_f32_u16(vzip2q_u16(h01, h23)),
    ]
}
