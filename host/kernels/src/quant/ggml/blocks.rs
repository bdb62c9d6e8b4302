//! The twin of every block type: the legacy (Q4_0..Q8_0), K-quant
//! (Q2_K..Q6_K), MXFP4 and float blocks here, the IQ blocks in iq.rs.

use half::{bf16, f16};

use super::GgmlType;

/// The f16 at byte `at`.
pub(super) fn h(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// `kvalues_mxfp4`: twice the E2M1 values, hence the half-scale below.
pub(super) const MXFP4_VALUES: [f32; 16] = [0., 1., 2., 3., 4., 6., 8., 12., 0., -1., -2., -3., -4., -6., -8., -12.];

/// `ggml_e8m0_to_fp32_half`: 2^(e - 128) built from its bits.
pub(super) fn e8m0_half(e: u8) -> f32 {
    let bits: u32 = match e {
        0 => 0x0020_0000,
        1 => 0x0040_0000,
        e => (u32::from(e) - 1) << 23,
    };
    f32::from_bits(bits)
}

/// `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` of Q4_K / Q5_K.
pub(super) fn scale_min_k4(j: usize, s: &[u8]) -> (f32, f32) {
    let (sc, m) = if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    };
    (f32::from(sc), f32::from(m))
}

/// One block of `ty` (`ggml-quants.c`'s `dequantize_row_*`, with
/// the formulas and their line numbers in tests/fixtures/gguf/GGUF_NOTES.md
/// section 3).
pub(super) fn decode(ty: GgmlType, b: &[u8], y: &mut [f32]) {
    match ty {
        GgmlType::F32 => y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        GgmlType::F16 => y[0] = h(b, 0),
        GgmlType::Bf16 => y[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        GgmlType::Q8_0 => {
            let d = h(b, 0);
            for (i, v) in y.iter_mut().enumerate() {
                *v = f32::from(b[2 + i] as i8) * d;
            }
        }
        GgmlType::Q4_0 => {
            let d = h(b, 0);
            let qs = &b[2..18];
            for j in 0..16 {
                y[j] = (f32::from(qs[j] & 15) - 8.0) * d;
                y[j + 16] = (f32::from(qs[j] >> 4) - 8.0) * d;
            }
        }
        GgmlType::Q4_1 => {
            let (d, m) = (h(b, 0), h(b, 2));
            let qs = &b[4..20];
            for j in 0..16 {
                y[j] = f32::from(qs[j] & 15) * d + m;
                y[j + 16] = f32::from(qs[j] >> 4) * d + m;
            }
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let (d, m, at) = match ty {
                GgmlType::Q5_0 => (h(b, 0), 0.0, 2),
                _ => (h(b, 0), h(b, 2), 4),
            };
            let qh = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
            let qs = &b[at + 4..at + 20];
            for j in 0..16 {
                let lo = i32::from(qs[j] & 15) | (((qh >> j) & 1) << 4) as i32;
                let hi = i32::from(qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4) as i32;
                if ty == GgmlType::Q5_0 {
                    y[j] = (lo - 16) as f32 * d;
                    y[j + 16] = (hi - 16) as f32 * d;
                } else {
                    y[j] = lo as f32 * d + m;
                    y[j + 16] = hi as f32 * d + m;
                }
            }
        }
        GgmlType::Mxfp4 => {
            let d = e8m0_half(b[0]);
            let qs = &b[1..17];
            for j in 0..16 {
                y[j] = MXFP4_VALUES[usize::from(qs[j] & 15)] * d;
                y[j + 16] = MXFP4_VALUES[usize::from(qs[j] >> 4)] * d;
            }
        }
        GgmlType::Q2K => {
            let (scales, qs) = (&b[0..16], &b[16..80]);
            let (d, dmin) = (h(b, 80), h(b, 82));
            for half in 0..2 {
                let q = &qs[32 * half..32 * half + 32];
                for j in 0..4 {
                    let shift = 2 * j;
                    for part in 0..2 {
                        let s = scales[8 * half + 2 * j + part];
                        let (dl, ml) = (d * f32::from(s & 15), dmin * f32::from(s >> 4));
                        for l in 0..16 {
                            let v = f32::from((q[l + 16 * part] >> shift) & 3);
                            y[128 * half + 32 * j + 16 * part + l] = dl * v - ml;
                        }
                    }
                }
            }
        }
        GgmlType::Q3K => {
            let (hmask, qs, sc) = (&b[0..32], &b[32..96], &b[96..108]);
            let d = h(b, 108);
            let scale = |s: usize| -> f32 {
                let low4 = if s < 8 { sc[s] & 15 } else { sc[s - 8] >> 4 };
                let high2 = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
                f32::from(i16::from(low4 | (high2 << 4)) - 32)
            };
            for half in 0..2 {
                let q = &qs[32 * half..32 * half + 32];
                for j in 0..4 {
                    let (shift, bit) = (2 * j, 4 * half + j);
                    for part in 0..2 {
                        let dl = d * scale(8 * half + 2 * j + part);
                        for l in 0..16 {
                            let i = l + 16 * part;
                            let high = if hmask[i] & (1 << bit) != 0 { 0 } else { 4 };
                            let v = i16::from((q[i] >> shift) & 3) - high;
                            y[128 * half + 32 * j + 16 * part + l] = dl * f32::from(v);
                        }
                    }
                }
            }
        }
        GgmlType::Q4K | GgmlType::Q5K => {
            let (d, dmin) = (h(b, 0), h(b, 2));
            let scales = &b[4..16];
            let (qh, qs) = match ty {
                GgmlType::Q4K => (None, &b[16..144]),
                _ => (Some(&b[16..48]), &b[48..176]),
            };
            for c in 0..4 {
                let q = &qs[32 * c..32 * c + 32];
                let (sc1, m1) = scale_min_k4(2 * c, scales);
                let (sc2, m2) = scale_min_k4(2 * c + 1, scales);
                let (d1, min1, d2, min2) = (d * sc1, dmin * m1, d * sc2, dmin * m2);
                for l in 0..32 {
                    let (mut lo, mut hi) = (q[l] & 15, q[l] >> 4);
                    if let Some(qh) = qh {
                        lo += if qh[l] & (1 << (2 * c)) != 0 { 16 } else { 0 };
                        hi += if qh[l] & (2 << (2 * c)) != 0 { 16 } else { 0 };
                    }
                    y[64 * c + l] = d1 * f32::from(lo) - min1;
                    y[64 * c + 32 + l] = d2 * f32::from(hi) - min2;
                }
            }
        }
        GgmlType::Q6K => {
            let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
            let d = h(b, 208);
            for half in 0..2 {
                let (ql, qh, sc) = (&ql[64 * half..], &qh[32 * half..], &sc[8 * half..]);
                for l in 0..32 {
                    let is = l / 16;
                    let q1 = i16::from((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32;
                    let q2 = i16::from((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
                    let q3 = i16::from((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                    let q4 = i16::from((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                    let s = |k: usize| d * f32::from(sc[is + k] as i8);
                    y[128 * half + l] = s(0) * f32::from(q1);
                    y[128 * half + l + 32] = s(2) * f32::from(q2);
                    y[128 * half + l + 64] = s(4) * f32::from(q3);
                    y[128 * half + l + 96] = s(6) * f32::from(q4);
                }
            }
        }
        // iq.rs decodes these; `dequantize_row_portable` sends them there.
        _ => unreachable!("{} is an IQ type", ty.name()),
    }
}
