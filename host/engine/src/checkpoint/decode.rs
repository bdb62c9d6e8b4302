//! Element decoders for the source dtypes a release may ship.
//!
//! * f32, f16, bf16: plain little-endian values.
//! * fp8 e4m3 (`F8_E4M3`, the OCP "fn" variant: bias 7, no infinities,
//!   `S.1111.111` is NaN) with DeepSeek-style block scales: a sibling
//!   `<name>_scale_inv` f32 tensor `[ceil(rows/bm), ceil(cols/bn)]`, and
//!   `w[r][c] = fp8[r][c] * scale_inv[r/bm][c/bn]` (bm x bn from
//!   `quantization_config.weight_block_size`, default 128 x 128), as
//!   transformers' `finegrained_fp8._dequantize_fp8_weight` computes it.
//! * MXFP4 (OCP microscaling, compressed-tensors `mxfp4-pack-quantized`
//!   naming): `<base>.weight_packed` u8 `[rows, cols/2]`, two E2M1 codes a
//!   byte, the LOW nibble holding the even column; `<base>.weight_scale` u8
//!   (or `F8_E8M0`) `[rows, cols/32]`, an E8M0 exponent per 32 consecutive
//!   values of a row: `w = e2m1(code) * 2^(scale - 127)`. This is the code
//!   table and nibble order of transformers' `integrations/mxfp4.py`
//!   (`FP4_VALUES`, `_convert_moe_packed_tensors`) and the scale rule of its
//!   `Fp8Dequantize._dequantize_one` for uint8 scales. Scale 255 is NaN in
//!   E8M0 and is refused.

/// E2M1 code -> value; bit 3 is the sign.
pub const FP4_VALUES: [f32; 16] =
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// Values sharing one E8M0 scale along a row.
pub const MXFP4_GROUP: usize = 32;

/// fp8 e4m3fn -> f32 (exact).
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((b >> 3) & 0x0F) as i32;
    let man = (b & 0x07) as f32;
    if exp == 0x0F && b & 0x07 == 0x07 {
        return f32::NAN;
    }
    if exp == 0 {
        // Subnormal: man/8 * 2^-6.
        sign * man * (2.0f32).powi(-9)
    } else {
        sign * (1.0 + man / 8.0) * (2.0f32).powi(exp - 7)
    }
}

/// `2^(s - 127)` as f32, exactly (2^-127 is a subnormal f32); `None` for
/// the E8M0 NaN (255) and for 2^128, which f32 cannot hold.
pub fn e8m0_to_f32(s: u8) -> Option<f32> {
    if s == 255 {
        return None;
    }
    let v = (2.0f64).powi(s as i32 - 127) as f32;
    v.is_finite().then_some(v)
}

/// Decodes `n` MXFP4 rows. `packed` holds `n * cols/2` bytes, `scales`
/// `n * cols/32`; appends `n * cols` values to `out`. Fails on a NaN or
/// out-of-range scale, naming the row offset.
pub fn mxfp4_rows(packed: &[u8], scales: &[u8], cols: usize, out: &mut Vec<f32>) -> Result<(), String> {
    let groups = cols / MXFP4_GROUP;
    let rows = scales.len() / groups.max(1);
    debug_assert_eq!(packed.len(), rows * cols / 2);
    out.reserve(rows * cols);
    for (r, (prow, srow)) in packed.chunks_exact(cols / 2).zip(scales.chunks_exact(groups)).enumerate() {
        for (g, (pg, &s)) in prow.chunks_exact(MXFP4_GROUP / 2).zip(srow).enumerate() {
            let scale = e8m0_to_f32(s)
                .ok_or_else(|| format!("row {r}, group {g}: E8M0 scale byte {s} is NaN or overflows f32"))?;
            for &b in pg {
                // Products of an E2M1 value and a power of two are exact.
                out.push(FP4_VALUES[(b & 0x0F) as usize] * scale);
                out.push(FP4_VALUES[(b >> 4) as usize] * scale);
            }
        }
    }
    Ok(())
}

/// Decodes rows `[r0, r0 + n)` of an fp8 e4m3 matrix with block scales.
/// `bytes` holds those rows; `scale_inv` is the whole f32 scale grid
/// `[ceil(rows/bm), sc]`.
pub fn fp8_rows(bytes: &[u8], r0: usize, cols: usize, scale_inv: &[f32], block: [usize; 2], out: &mut Vec<f32>) {
    let sc = cols.div_ceil(block[1]);
    out.reserve(bytes.len());
    for (i, row) in bytes.chunks_exact(cols).enumerate() {
        let srow = &scale_inv[((r0 + i) / block[0]) * sc..][..sc];
        for (c, &b) in row.iter().enumerate() {
            out.push(e4m3_to_f32(b) * srow[c / block[1]]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_table_matches_the_format() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert_eq!(e4m3_to_f32(0x38), 1.0); // exp 7, man 0
        assert_eq!(e4m3_to_f32(0x7E), 448.0); // largest finite
        assert_eq!(e4m3_to_f32(0xFE), -448.0);
        assert_eq!(e4m3_to_f32(0x01), 2.0f32.powi(-9)); // smallest subnormal
        assert_eq!(e4m3_to_f32(0x08), 2.0f32.powi(-6)); // smallest normal
        assert!(e4m3_to_f32(0x7F).is_nan() && e4m3_to_f32(0xFF).is_nan());
        assert_eq!(e4m3_to_f32(0x78), 256.0); // exp 15 with man != 7 is a number
    }

    #[test]
    fn mxfp4_low_nibble_first_and_scale() {
        // One row of 32 values: byte 0 = codes (1 -> 0.5, 0xF -> -6.0).
        let mut packed = vec![0u8; 16];
        packed[0] = 0xF1;
        packed[15] = 0x27; // col 30 = 6.0, col 31 = 1.0
        let mut out = Vec::new();
        mxfp4_rows(&packed, &[128], 32, &mut out).unwrap();
        assert_eq!(out.len(), 32);
        assert_eq!((out[0], out[1], out[30], out[31]), (1.0, -12.0, 12.0, 2.0));
        out.clear();
        mxfp4_rows(&packed, &[0], 32, &mut out).unwrap();
        // 2^-128 is subnormal: `2.0f32.powi(-128)` is 1 / 2^128 = 1 / inf = 0
        // where powi is not folded at compile time (debug builds), so the
        // expected value is spelled in bits.
        assert_eq!(out[0], f32::from_bits(1 << 21));
        assert!(mxfp4_rows(&packed, &[255], 32, &mut out).unwrap_err().contains("255"));
        assert!(mxfp4_rows(&packed, &[254], 32, &mut Vec::new()).is_ok());
        assert_eq!(e8m0_to_f32(254), Some(2.0f32.powi(127)));
    }

    #[test]
    fn fp8_blocks_with_partial_edges() {
        // 3 x 3 with 2 x 2 blocks: grid 2 x 2.
        let bytes = [0x38u8; 9];
        let scale = [1.0f32, 2.0, 3.0, 4.0];
        let mut out = Vec::new();
        fp8_rows(&bytes, 0, 3, &scale, [2, 2], &mut out);
        assert_eq!(out, vec![1.0, 1.0, 2.0, 1.0, 1.0, 2.0, 3.0, 3.0, 4.0]);
        out.clear();
        fp8_rows(&bytes[6..], 2, 3, &scale, [2, 2], &mut out);
        assert_eq!(out, vec![3.0, 3.0, 4.0]);
    }
}
