//! AVX2 decoders of the block types most GGUF experts use (Q4_K_M files:
//! Q4_K and Q6_K; Q8_0). Each forms the twin's products in the twin's
//! order, 8 values at a time; the products are exact (module docs), so
//! each gives the twin's bits (`the_avx2_build_of_the_twins_gives_their_bits`).

use std::arch::x86_64::*;

/// The f16 at byte `at` of `b`, converted by F16C: exactly `blocks::h`'s
/// value (the half crate runs the same instruction where it finds F16C),
/// without its call and run-time check per block.
#[inline(always)]
pub(super) unsafe fn h16(b: &[u8], at: usize) -> f32 {
    half_bits(u16::from_le_bytes([b[at], b[at + 1]]))
}

#[inline(always)]
unsafe fn half_bits(bits: u16) -> f32 {
    // SAFETY (callers): F16C is enabled in the calling function.
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// 8 bytes at `p` as 8 i32 lanes, zero-extended.
#[inline(always)]
unsafe fn u8x8(p: *const u8) -> __m256i {
    // SAFETY (callers): `p` points at 8 readable bytes.
    _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i))
}

/// `block_q8_0`: `y = q * d`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q8_0(b: &[u8], y: &mut [f32]) {
    assert!(b.len() >= 34 && y.len() >= 32);
    let d = _mm256_set1_ps(h16(b, 0));
    for k in 0..4 {
        // SAFETY: bytes 2 + 8k .. 10 + 8k and values 8k .. 8k + 8 are in
        // bounds (asserted above).
        let q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(b.as_ptr().add(2 + 8 * k) as *const __m128i));
        _mm256_storeu_ps(y.as_mut_ptr().add(8 * k), _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
    }
}

/// `block_q4_K`: `y = d * sc * q - dmin * m` per 32 values, the product
/// exact and the subtraction rounded once, as in the twin.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_k(b: &[u8], y: &mut [f32]) {
    assert!(b.len() >= 144 && y.len() >= 256);
    let (d, dmin) = (h16(b, 0), h16(b, 2));
    let scales = &b[4..16];
    let fifteen = _mm256_set1_epi32(15);
    for c in 0..4 {
        let (sc1, m1) = super::blocks::scale_min_k4(2 * c, scales);
        let (sc2, m2) = super::blocks::scale_min_k4(2 * c + 1, scales);
        let (d1, min1) = (_mm256_set1_ps(d * sc1), _mm256_set1_ps(dmin * m1));
        let (d2, min2) = (_mm256_set1_ps(d * sc2), _mm256_set1_ps(dmin * m2));
        for k in 0..4 {
            // SAFETY: bytes 16 + 32c + 8k .. + 8 lie in the 144-byte block;
            // values 64c + 8k .. 64c + 40 + 8k lie in the 256 (asserted).
            let q = u8x8(b.as_ptr().add(16 + 32 * c + 8 * k));
            let lo = _mm256_cvtepi32_ps(_mm256_and_si256(q, fifteen));
            let hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(q, 4));
            let out = y.as_mut_ptr().add(64 * c + 8 * k);
            _mm256_storeu_ps(out, _mm256_sub_ps(_mm256_mul_ps(d1, lo), min1));
            _mm256_storeu_ps(out.add(32), _mm256_sub_ps(_mm256_mul_ps(d2, hi), min2));
        }
    }
}

/// `block_q6_K`: `y = (d * sc) * (q - 32)` with 6-bit quants split into
/// 4 low bits (`ql`) and 2 high bits (`qh`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q6_k(b: &[u8], y: &mut [f32]) {
    assert!(b.len() >= 210 && y.len() >= 256);
    let d = h16(b, 208);
    let (fifteen, three, thirty_two) = (_mm256_set1_epi32(15), _mm256_set1_epi32(3), _mm256_set1_epi32(32));
    for half in 0..2 {
        let (ql, qh) = (b.as_ptr().add(64 * half), b.as_ptr().add(128 + 32 * half));
        let sc = &b[192 + 8 * half..200 + 8 * half];
        for g in 0..4 {
            let l = 8 * g;
            let is = l / 16;
            let s = |k: usize| _mm256_set1_ps(d * f32::from(sc[is + k] as i8));
            // SAFETY: ql + l .. + 40 and qh + l .. + 8 lie in the block;
            // values 128 half + l + 96 + 8 are in the 256 (asserted).
            let (a, c, hbits) = (u8x8(ql.add(l)), u8x8(ql.add(l + 32)), u8x8(qh.add(l)));
            let top = |shift: i32| {
                _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(hbits, _mm256_set1_epi32(shift)), three), 4)
            };
            let q1 = _mm256_sub_epi32(_mm256_or_si256(_mm256_and_si256(a, fifteen), top(0)), thirty_two);
            let q2 = _mm256_sub_epi32(_mm256_or_si256(_mm256_and_si256(c, fifteen), top(2)), thirty_two);
            let q3 = _mm256_sub_epi32(_mm256_or_si256(_mm256_srli_epi32(a, 4), top(4)), thirty_two);
            let q4 = _mm256_sub_epi32(_mm256_or_si256(_mm256_srli_epi32(c, 4), top(6)), thirty_two);
            let out = y.as_mut_ptr().add(128 * half + l);
            _mm256_storeu_ps(out, _mm256_mul_ps(s(0), _mm256_cvtepi32_ps(q1)));
            _mm256_storeu_ps(out.add(32), _mm256_mul_ps(s(2), _mm256_cvtepi32_ps(q2)));
            _mm256_storeu_ps(out.add(64), _mm256_mul_ps(s(4), _mm256_cvtepi32_ps(q3)));
            _mm256_storeu_ps(out.add(96), _mm256_mul_ps(s(6), _mm256_cvtepi32_ps(q4)));
        }
    }
}

/// `block_q2_K`: `y = (d * sc) * q - dmin * m` per 16 values, 2-bit `q`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q2_k(b: &[u8], y: &mut [f32]) {
    assert!(b.len() >= 84 && y.len() >= 256);
    let (d, dmin) = (h16(b, 80), h16(b, 82));
    let three = _mm256_set1_epi32(3);
    for half in 0..2 {
        for j in 0..4 {
            let shift = _mm_cvtsi32_si128(2 * j as i32);
            for part in 0..2 {
                let s = b[8 * half + 2 * j + part];
                let dl = _mm256_set1_ps(d * f32::from(s & 15));
                let ml = _mm256_set1_ps(dmin * f32::from(s >> 4));
                for k in 0..2 {
                    // SAFETY: bytes 16 + 32 half + 16 part + 8k .. + 8 lie in
                    // the 84-byte block, the 8 values in the 256 (asserted).
                    let q = u8x8(b.as_ptr().add(16 + 32 * half + 16 * part + 8 * k));
                    let v = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srl_epi32(q, shift), three));
                    let at = 128 * half + 32 * j + 16 * part + 8 * k;
                    _mm256_storeu_ps(y.as_mut_ptr().add(at), _mm256_sub_ps(_mm256_mul_ps(dl, v), ml));
                }
            }
        }
    }
}

/// `block_q3_K`: `y = (d * (sc - 32)) * (q - (hmask bit ? 0 : 4))` per 16.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q3_k(b: &[u8], y: &mut [f32]) {
    assert!(b.len() >= 110 && y.len() >= 256);
    let d = h16(b, 108);
    let sc = &b[96..108];
    let scale = |s: usize| -> f32 {
        let low4 = if s < 8 { sc[s] & 15 } else { sc[s - 8] >> 4 };
        let high2 = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
        f32::from(i16::from(low4 | (high2 << 4)) - 32)
    };
    let (three, four) = (_mm256_set1_epi32(3), _mm256_set1_epi32(4));
    for half in 0..2 {
        for j in 0..4 {
            let shift = _mm_cvtsi32_si128(2 * j as i32);
            let bit = _mm256_set1_epi32(1 << (4 * half + j));
            for part in 0..2 {
                let dl = _mm256_set1_ps(d * scale(8 * half + 2 * j + part));
                for k in 0..2 {
                    let i = 16 * part + 8 * k;
                    // SAFETY: hmask bytes i .. i + 8 < 32 and quant bytes
                    // 32 + 32 half + i .. + 8 < 96 lie in the block; the 8
                    // values in the 256 (asserted).
                    let (q, m) = (u8x8(b.as_ptr().add(32 + 32 * half + i)), u8x8(b.as_ptr().add(i)));
                    let low = _mm256_and_si256(_mm256_srl_epi32(q, shift), three);
                    // 4 where the mask bit is clear, 0 where it is set.
                    let high = _mm256_andnot_si256(_mm256_cmpeq_epi32(_mm256_and_si256(m, bit), bit), four);
                    let v = _mm256_cvtepi32_ps(_mm256_sub_epi32(low, high));
                    let at = 128 * half + 32 * j + 16 * part + 8 * k;
                    _mm256_storeu_ps(y.as_mut_ptr().add(at), _mm256_mul_ps(dl, v));
                }
            }
        }
    }
}

/// `block_q5_K`: Q4_K with a fifth bit per value from `qh`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_k(b: &[u8], y: &mut [f32]) {
    assert!(b.len() >= 176 && y.len() >= 256);
    let (d, dmin) = (h16(b, 0), h16(b, 2));
    let scales = &b[4..16];
    let (fifteen, sixteen) = (_mm256_set1_epi32(15), _mm256_set1_epi32(16));
    for c in 0..4 {
        let (sc1, m1) = super::blocks::scale_min_k4(2 * c, scales);
        let (sc2, m2) = super::blocks::scale_min_k4(2 * c + 1, scales);
        let (d1, min1) = (_mm256_set1_ps(d * sc1), _mm256_set1_ps(dmin * m1));
        let (d2, min2) = (_mm256_set1_ps(d * sc2), _mm256_set1_ps(dmin * m2));
        let (bit1, bit2) = (_mm256_set1_epi32(1 << (2 * c)), _mm256_set1_epi32(2 << (2 * c)));
        for k in 0..4 {
            // SAFETY: qh bytes 16 + 8k .. + 8 and quant bytes 48 + 32c + 8k
            // .. + 8 lie in the 176-byte block; values in the 256 (asserted).
            let q = u8x8(b.as_ptr().add(48 + 32 * c + 8 * k));
            let qh = u8x8(b.as_ptr().add(16 + 8 * k));
            let top = |bit: __m256i| _mm256_and_si256(_mm256_cmpeq_epi32(_mm256_and_si256(qh, bit), bit), sixteen);
            let lo = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_and_si256(q, fifteen), top(bit1)));
            let hi = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_srli_epi32(q, 4), top(bit2)));
            let out = y.as_mut_ptr().add(64 * c + 8 * k);
            _mm256_storeu_ps(out, _mm256_sub_ps(_mm256_mul_ps(d1, lo), min1));
            _mm256_storeu_ps(out.add(32), _mm256_sub_ps(_mm256_mul_ps(d2, hi), min2));
        }
    }
}

/// A 16-entry table looked up for 8 indices (0..16), in two 8-entry halves.
#[inline(always)]
unsafe fn lookup16(table: &[f32; 16], idx: __m256i) -> __m256 {
    // SAFETY (callers): AVX2; the table has 16 entries.
    let (low, high) = (_mm256_loadu_ps(table.as_ptr()), _mm256_loadu_ps(table.as_ptr().add(8)));
    let upper = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28));
    _mm256_blendv_ps(_mm256_permutevar8x32_ps(low, idx), _mm256_permutevar8x32_ps(high, idx), upper)
}

/// 32 values `table[nibble] * d` from 16 bytes at `q`: low nibbles the
/// first 16 (IQ4_NL, IQ4_XS, MXFP4 and, with `q - 8` as the table, Q4_0).
#[inline(always)]
unsafe fn nibbles32(table: &[f32; 16], q: *const u8, d: f32, y: *mut f32) {
    let (fifteen, d) = (_mm256_set1_epi32(15), _mm256_set1_ps(d));
    for k in 0..2 {
        // SAFETY (callers): 16 bytes at `q`, 32 values at `y`.
        let v = u8x8(q.add(8 * k));
        _mm256_storeu_ps(y.add(8 * k), _mm256_mul_ps(lookup16(table, _mm256_and_si256(v, fifteen)), d));
        _mm256_storeu_ps(y.add(16 + 8 * k), _mm256_mul_ps(lookup16(table, _mm256_srli_epi32(v, 4)), d));
    }
}

const IQ4NL_F32: [f32; 16] = [-127., -104., -83., -65., -49., -35., -22., -10., 1., 13., 25., 38., 53., 69., 89., 113.];
const Q4_0_F32: [f32; 16] = [-8., -7., -6., -5., -4., -3., -2., -1., 0., 1., 2., 3., 4., 5., 6., 7.];

/// `block_q4_0`: `y = (q - 8) * d`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_0(b: &[u8], y: &mut [f32]) {
    assert!(b.len() >= 18 && y.len() >= 32);
    // SAFETY: 16 quant bytes after the scale, 32 values (asserted).
    nibbles32(&Q4_0_F32, b.as_ptr().add(2), h16(b, 0), y.as_mut_ptr());
}

/// `block_mxfp4`: `y = kvalues_mxfp4[q] * d`, d the E8M0 half-scale.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn mxfp4(b: &[u8], y: &mut [f32]) {
    assert!(b.len() >= 17 && y.len() >= 32);
    // SAFETY: 16 quant bytes after the exponent, 32 values (asserted).
    nibbles32(&super::blocks::MXFP4_VALUES, b.as_ptr().add(1), super::blocks::e8m0_half(b[0]), y.as_mut_ptr());
}

/// `block_iq4_nl`: `y = d * kvalues[q]`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn iq4_nl(b: &[u8], y: &mut [f32]) {
    assert!(b.len() >= 18 && y.len() >= 32);
    // SAFETY: 16 quant bytes after the scale, 32 values (asserted).
    nibbles32(&IQ4NL_F32, b.as_ptr().add(2), h16(b, 0), y.as_mut_ptr());
}

/// `block_iq4_xs`: `y = (d * (scale - 32)) * kvalues[q]` per 32 values.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn iq4_xs(b: &[u8], y: &mut [f32]) {
    assert!(b.len() >= 136 && y.len() >= 256);
    let d = h16(b, 0);
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    for ib in 0..8 {
        let low = (b[4 + ib / 2] >> (4 * (ib % 2))) & 15;
        let high = ((scales_h >> (2 * ib)) & 3) as u8;
        let dl = d * f32::from(i16::from(low | (high << 4)) - 32);
        // SAFETY: quant bytes 8 + 16 ib .. + 16 < 136, values 32 ib .. + 32
        // < 256 (asserted).
        nibbles32(&IQ4NL_F32, b.as_ptr().add(8 + 16 * ib), dl, y.as_mut_ptr().add(32 * ib));
    }
}

/// The IQ decoders' 8-value writes in AVX2 lanes: the grid bytes widened
/// and converted, then the twin's `db * value * sign` (a multiply by +-1,
/// as the twin does, not a sign-bit flip, so even a NaN keeps its bits).
pub(super) struct Avx2;

/// Lane j's sign bit.
#[inline(always)]
unsafe fn lane_signs(signs: u8) -> __m256 {
    let bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    let set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(i32::from(signs)), bits), bits);
    _mm256_blendv_ps(_mm256_set1_ps(1.0), _mm256_set1_ps(-1.0), _mm256_castsi256_ps(set))
}

impl super::iq::Lanes for Avx2 {
    #[inline(always)]
    fn half(b: &[u8], at: usize) -> f32 {
        // SAFETY: only called from decoders running under
        // `dequantize_row_avx2` (AVX2, FMA and F16C detected).
        unsafe { h16(b, at) }
    }

    #[inline(always)]
    fn half_bits(bits: u16) -> f32 {
        // SAFETY: as `half`.
        unsafe { half_bits(bits) }
    }

    #[inline(always)]
    fn grid8(y: &mut [f32], db: f32, entry: u64, signs: u8) {
        assert!(y.len() >= 8);
        // SAFETY: only called from decoders running under
        // `dequantize_row_avx2` (AVX2 detected); 8 values asserted.
        unsafe {
            let v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(entry as i64)));
            let out = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(db), v), lane_signs(signs));
            _mm256_storeu_ps(y.as_mut_ptr(), out);
        }
    }

    #[inline(always)]
    fn grid4x2(y: &mut [f32], db: f32, first: u32, second: u32, signs: u8) {
        Self::grid8(y, db, u64::from(first) | u64::from(second) << 32, signs);
    }

    #[inline(always)]
    fn iq1(y: &mut [f32], dl: f32, entry: u64, delta: f32) {
        assert!(y.len() >= 8);
        // SAFETY: as `grid8`.
        unsafe {
            let v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(entry as i64)));
            let out = _mm256_mul_ps(_mm256_set1_ps(dl), _mm256_add_ps(v, _mm256_set1_ps(delta)));
            _mm256_storeu_ps(y.as_mut_ptr(), out);
        }
    }
}

/// `iq::$name` with AVX2 lanes, as a decoder of `dequantize_row_avx2`.
macro_rules! iq_avx2 {
    ($($name:ident),*) => {$(
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) unsafe fn $name(b: &[u8], y: &mut [f32]) {
            super::iq::$name::<Avx2>(b, y)
        }
    )*};
}

iq_avx2!(iq1_s, iq1_m, iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s);

/// `hsum` of `simd::avx2`: `dot8`'s lane order,
/// `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`.
#[inline(always)]
pub(super) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
}

/// Whether `dot_rows` computes `ty` in registers: Q8_0 (a GGUF's LM head
/// and many of its matrices), 1.3x faster so than decoded rows. Q4_K and
/// Q6_K in registers were slower than their decoders plus `matmul_block`
/// (1.36x and 2.2x the time: the per-row scales of four interleaved rows
/// do not fit the 16 registers), and were dropped (docs/PERFORMANCE.md).
pub(super) fn fused(ty: super::GgmlType) -> bool {
    ty == super::GgmlType::Q8_0
}

/// `out[i] = dot8(row i's values, x)` for the rows of `rows` (`out.len()`
/// of them, each `row_bytes` long, 4 at most), decoded in registers and
/// never stored: each lane accumulates the fused products of its
/// positions in position order, as `simd::dot8_scalar` does, from the
/// twin's values (exact), so the bits are `matmul_block`'s on the decoded
/// rows. The rows' chains are interleaved step by step (one FMA chain per
/// row would wait on the FMA latency). `fused(ty)` must hold and
/// `x.len()` be the row's values.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_rows(ty: super::GgmlType, rows: &[u8], row_bytes: usize, x: &[f32], out: &mut [f32]) {
    match out.len() {
        4 => dot_rows_n::<4>(ty, rows, row_bytes, x, out),
        3 => dot_rows_n::<3>(ty, rows, row_bytes, x, out),
        2 => dot_rows_n::<2>(ty, rows, row_bytes, x, out),
        1 => dot_rows_n::<1>(ty, rows, row_bytes, x, out),
        n => assert!(n == 0, "dot_rows: {n} rows"),
    }
}

#[inline(always)]
unsafe fn dot_rows_n<const N: usize>(ty: super::GgmlType, rows: &[u8], row_bytes: usize, x: &[f32], out: &mut [f32]) {
    use super::GgmlType as T;
    let (be, bb) = (ty.block_elems(), ty.block_bytes());
    assert!(rows.len() == N * row_bytes && x.len() / be * bb == row_bytes && out.len() == N);
    let mut acc = [_mm256_setzero_ps(); N];
    for blk in 0..row_bytes / bb {
        let b: [&[u8]; N] = std::array::from_fn(|i| &rows[i * row_bytes + blk * bb..][..bb]);
        // SAFETY: block `blk` of each row lies in `rows` and its values'
        // inputs `x[blk * be..][..be]` in `x` (asserted above).
        let xb = x.as_ptr().add(blk * be);
        // The next rows' block: each row is a short stream (34 cache lines
        // at 2048 columns) that the hardware's prefetch does not catch
        // before it ends; asked for a group ahead, a thread's decode of a
        // Q8_0 matrix from DRAM went from 7.2 to 11.1 GMAC/s.
        for i in 0..N {
            let ahead = rows.as_ptr().wrapping_add((N + i) * row_bytes + blk * bb);
            // SAFETY: a prefetch reads nothing and faults on no address
            // (past the matrix's end it names memory it never touches).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8) };
        }
        match ty {
            T::Q8_0 => q8_0_dot(b, xb, &mut acc),
            _ => unreachable!("dot_rows: {} is not fused", ty.name()),
        }
    }
    for (o, a) in out.iter_mut().zip(acc) {
        *o = hsum(a);
    }
}

#[inline(always)]
unsafe fn q8_0_dot<const N: usize>(b: [&[u8]; N], x: *const f32, acc: &mut [__m256; N]) {
    let d: [__m256; N] = std::array::from_fn(|i| _mm256_set1_ps(h16(b[i], 0)));
    for k in 0..4 {
        // SAFETY (callers): 34-byte blocks and their 32 inputs.
        let xv = _mm256_loadu_ps(x.add(8 * k));
        for i in 0..N {
            let q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(b[i].as_ptr().add(2 + 8 * k) as *const __m128i));
            acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), d[i]), xv, acc[i]);
        }
    }
}
