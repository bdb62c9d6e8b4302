//! Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS products on int16 inputs with
//! AVX2: the AVX-512 forms on two halves, the sixteen lanes of the
//! definition two `__m256`. The rows (few inputs) keep a sub-block's values
//! as bytes against the codes' high and low bytes (`plane_dot`, `pmaddubsw`;
//! IQ4_XS's signed values widened for `pmaddwd`), and fold the partial
//! vectors into one vector of exact dots per super-block. The blocks (many
//! inputs) transpose eight rows' values into int16 words for `pmaddwd`
//! against each input's codes broadcast.

use super::{
    scale_bytes, super_scales, Format, Int16Inputs, Outputs, Sums, CODE_MAX, LANES, Q2K_BYTES, Q3K_BYTES, Q6K_BYTES,
    SUB, SUPER,
};
use crate::quant::ggml::iq::IQ4NL_VALUES;
use crate::quant::int8::avx2::transpose8;
use std::arch::x86_64::*;

/// Sub-blocks `2c` and `2c + 1` of the `fmt` super-block at `b`, 32
/// signed bytes each: the integers ggml's dequantisation scales (Q4_K's
/// nibbles, Q5_K's nibbles with their fifth bits, Q6_K's `q - 32`,
/// IQ4_XS's `kvalues_iq4nl[q]`, Q3_K's `q - 4`, Q2_K's `q`).
///
/// # Safety
/// AVX2; a whole super-block of `fmt` at `b`, `c < 4`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn pair_bytes(fmt: Format, b: *const u8, c: usize) -> (__m256i, __m256i) {
    let nib = _mm256_set1_epi8(0x0F);
    // SAFETY: the loads lie in the super-block (the caller's).
    unsafe {
        match fmt {
            Format::Q4K => {
                let v = _mm256_loadu_si256(b.add(16 + 32 * c) as *const __m256i);
                (_mm256_and_si256(v, nib), _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib))
            }
            Format::Q5K => {
                // Bits 2c and 2c + 1 of each `qh` byte become bit 4 of the
                // pair's values: shifted right then left within 16-bit
                // lanes (left first would drop the high byte's top bits),
                // then masked to each byte's bit 4, which no bit of the
                // lane's other byte reaches.
                let v = _mm256_loadu_si256(b.add(48 + 32 * c) as *const __m256i);
                let qh = _mm256_loadu_si256(b.add(16) as *const __m256i);
                let five = _mm256_set1_epi8(0x10);
                let lo_bit = _mm256_slli_epi16::<4>(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32)));
                let hi_bit = _mm256_slli_epi16::<4>(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32 + 1)));
                let lo = _mm256_or_si256(_mm256_and_si256(v, nib), _mm256_and_si256(lo_bit, five));
                let hi =
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(v), nib), _mm256_and_si256(hi_bit, five));
                (lo, hi)
            }
            Format::Q2K => {
                // Sub-blocks 2c and 2c + 1 lie in half c / 2: bit pairs 2j
                // and 2j + 2 (j = 2 (c % 2)) of its 32 `qs` bytes, shifted
                // within 16-bit lanes and masked per byte.
                let q = _mm256_loadu_si256(b.add(16 + 32 * (c / 2)) as *const __m256i);
                let three = _mm256_set1_epi8(3);
                let j = 2 * (c % 2) as i32;
                let value = |shift: i32| _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(shift)), three);
                (value(2 * j), value(2 * j + 2))
            }
            Format::Q3K => {
                // Sub-blocks 2c and 2c + 1 lie in half c / 2: bit pairs
                // 2j and 2j + 2 (j = 2 (c % 2)) of its 32 `qs` bytes, and
                // bits 2c and 2c + 1 of `hmask` as each value's bit 2
                // (shifted within 16-bit lanes, then masked per byte, which
                // no bit of the lane's other byte reaches); then `- 4`.
                let q = _mm256_loadu_si256(b.add(32 + 32 * (c / 2)) as *const __m256i);
                let hm = _mm256_loadu_si256(b as *const __m256i);
                let (three, four) = (_mm256_set1_epi8(3), _mm256_set1_epi8(4));
                let value = |s: usize, shift: usize| {
                    let low = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(shift as i32)), three);
                    let high = _mm256_slli_epi16::<2>(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(s as i32)));
                    _mm256_sub_epi8(_mm256_or_si256(low, _mm256_and_si256(high, four)), four)
                };
                let j = 2 * (c % 2);
                (value(2 * c, 2 * j), value(2 * c + 1, 2 * j + 2))
            }
            Format::Iq4Xs => {
                // Sub-block 2c's 16 bytes then 2c + 1's: each sub-block's
                // low nibbles are its values 0..16, its high nibbles 16..32,
                // looked up in the table (the same in both 128-bit lanes).
                let v = _mm256_loadu_si256(b.add(8 + 32 * c) as *const __m256i);
                let (lo, hi) = (_mm256_and_si256(v, nib), _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib));
                let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(IQ4NL_VALUES.as_ptr() as *const __m128i));
                let first = _mm256_permute2x128_si256::<0x20>(lo, hi);
                let second = _mm256_permute2x128_si256::<0x31>(lo, hi);
                (_mm256_shuffle_epi8(table, first), _mm256_shuffle_epi8(table, second))
            }
            Format::Q6K => {
                // Half `c / 2` of the block: its sub-blocks 0 and 1 are the
                // low nibbles of `ql[0..32]` and `ql[32..64]` with bit pairs
                // 0 and 1 of `qh`, sub-blocks 2 and 3 the high nibbles with
                // pairs 2 and 3 (`dequantize_row_q6_K`'s q1..q4).
                let half = c / 2;
                let ql0 = _mm256_loadu_si256(b.add(64 * half) as *const __m256i);
                let ql1 = _mm256_loadu_si256(b.add(64 * half + 32) as *const __m256i);
                let qh = _mm256_loadu_si256(b.add(128 + 32 * half) as *const __m256i);
                let pair = _mm256_set1_epi8(0x30);
                let (lo0, lo1, hi0, hi1) = if c.is_multiple_of(2) {
                    let (h0, h1) = (_mm256_slli_epi16::<4>(qh), _mm256_slli_epi16::<2>(qh));
                    (_mm256_and_si256(ql0, nib), _mm256_and_si256(ql1, nib), h0, h1)
                } else {
                    let (l0, l1) = (_mm256_srli_epi16::<4>(ql0), _mm256_srli_epi16::<4>(ql1));
                    (_mm256_and_si256(l0, nib), _mm256_and_si256(l1, nib), qh, _mm256_srli_epi16::<2>(qh))
                };
                let m32 = _mm256_set1_epi8(32);
                let q0 = _mm256_sub_epi8(_mm256_or_si256(lo0, _mm256_and_si256(hi0, pair)), m32);
                let q1 = _mm256_sub_epi8(_mm256_or_si256(lo1, _mm256_and_si256(hi1, pair)), m32);
                (q0, q1)
            }
        }
    }
}

/// `out[t]` = `row` against input `t`, bit for bit `row_scalar`.
///
/// # Safety
/// The CPU supports AVX2 and FMA; `row` is whole super-blocks of `fmt` of
/// `inputs.cols` values and `out.len() == inputs.inputs()`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn row_products(fmt: Format, row: &[u8], inputs: &Int16Inputs, out: &mut [f32]) {
    let supers = inputs.cols / SUPER;
    debug_assert!(row.len() == supers * fmt.super_bytes() && out.len() == inputs.inputs());
    // The group rows read the codes' byte planes through raw pointers:
    // `Int16Inputs::new` makes them for every call that takes this path
    // (fewer than `BLOCK_MIN_INPUTS` inputs), and this holds it to that.
    assert!(
        fmt == Format::Iq4Xs || (inputs.high.len() == inputs.codes.len() && inputs.low.len() == inputs.codes.len()),
        "int16 rows: inputs without their byte planes"
    );
    prefetch_next_row(row);
    // One loop per format, each compiled with its format a constant (the
    // value unpacking is most of a row's work; with the format a variable
    // its branches sat inside the loop).
    // SAFETY: the caller's contract, passed on.
    unsafe {
        match fmt {
            Format::Q2K => rows_of(Format::Q2K, row, inputs, out),
            Format::Q3K => rows_of(Format::Q3K, row, inputs, out),
            Format::Q6K => rows_of(Format::Q6K, row, inputs, out),
            Format::Q4K => rows_of(Format::Q4K, row, inputs, out),
            Format::Q5K => rows_of(Format::Q5K, row, inputs, out),
            Format::Iq4Xs => rows_of(Format::Iq4Xs, row, inputs, out),
        }
    }
}

/// `row_products`' loop for one format.
///
/// # Safety
/// As `row_products`.
#[inline(always)]
unsafe fn rows_of(fmt: Format, row: &[u8], inputs: &Int16Inputs, out: &mut [f32]) {
    let supers = inputs.cols / SUPER;
    for (t, o) in out.iter_mut().enumerate() {
        // Lanes 0..8 and 8..16; a Q4_K super-block fills one half, a Q6_K
        // one both.
        let mut f = [_mm256_setzero_ps(); 2];
        for sb in 0..supers {
            let at = t * (inputs.cols / SUB) + sb * 8;
            // SAFETY: super-block sb lies in the row and its sub-blocks in
            // input t (the caller's contract).
            unsafe {
                if fmt.groups() == 2 {
                    f = group_super(fmt, row.as_ptr().add(sb * fmt.super_bytes()), inputs, at, f);
                } else {
                    let b = row.as_ptr().add(sb * fmt.super_bytes());
                    f[sb % 2] = super_block(fmt, b, inputs, at, f[sb % 2]);
                }
            }
        }
        let mut lanes = [0f32; LANES];
        // SAFETY: sixteen floats.
        unsafe {
            _mm256_storeu_ps(lanes.as_mut_ptr(), f[0]);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), f[1]);
        }
        *o = super::reduce_lanes(&lanes);
    }
}

/// The Q4_K, Q5_K or IQ4_XS (`fmt`) super-block at `b` against sub-blocks
/// `at..at + 8` of the inputs, added to `f`'s eight lanes.
///
/// Q4_K's and Q5_K's values (at most 31, unsigned) stay bytes against the
/// codes' byte planes (`plane_dot`), as the group formats' do; IQ4_XS's
/// are signed, so they are widened to int16 for `pmaddwd` with the codes.
/// Always inlined, as `group_super`.
///
/// # Safety
/// AVX2 and FMA; a super-block of `fmt` at `b`, eight sub-blocks from `at`
/// in the inputs, whose `high` and `low` bytes exist unless `fmt` is
/// IQ4_XS.
#[inline(always)]
unsafe fn super_block(fmt: Format, b: *const u8, inputs: &Int16Inputs, at: usize, f: __m256) -> __m256 {
    // SAFETY: the block's bytes at b; its sub-blocks' codes (or code
    // bytes), scales and sums from `at` (the caller's).
    unsafe {
        let x = inputs.codes.as_ptr().add(at * SUB);
        let (high, low) = (inputs.high.as_ptr().wrapping_add(at * SUB), inputs.low.as_ptr().wrapping_add(at * SUB));
        let mut a = [_mm256_setzero_si256(); 8];
        for c in 0..4 {
            let (lo, hi) = pair_bytes(fmt, b, c);
            for (k, half) in [(2 * c, lo), (2 * c + 1, hi)] {
                if fmt == Format::Iq4Xs {
                    let x0 = _mm256_loadu_si256(x.add(k * SUB) as *const __m256i);
                    let x1 = _mm256_loadu_si256(x.add(k * SUB + 16) as *const __m256i);
                    let q0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(half));
                    let q1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(half));
                    a[k] = _mm256_add_epi32(_mm256_madd_epi16(q0, x0), _mm256_madd_epi16(q1, x1));
                } else {
                    a[k] = plane_dot(half, high.add(k * SUB), low.add(k * SUB));
                }
            }
        }
        let (d1, m1) = if fmt == Format::Iq4Xs {
            let (d1, m1) = super_scales(fmt, std::slice::from_raw_parts(b, super::IQ4XS_BYTES));
            (_mm256_loadu_ps(d1.as_ptr()), _mm256_loadu_ps(m1.as_ptr()))
        } else {
            let bytes = scale_bytes(&*(b.add(4) as *const [u8; 12]));
            let d = super::h(std::slice::from_raw_parts(b, 4), 0);
            let dmin = super::h(std::slice::from_raw_parts(b, 4), 2);
            (
                _mm256_mul_ps(_mm256_set1_ps(d), widen(bytes.as_ptr())),
                _mm256_mul_ps(_mm256_set1_ps(dmin), widen(bytes.as_ptr().add(8))),
            )
        };
        let dots = _mm256_cvtepi32_ps(sum_lanes(&a));
        let sums = _mm256_loadu_ps(inputs.sums.as_ptr().add(at));
        let scales = _mm256_loadu_ps(inputs.scales.as_ptr().add(at));
        let v = _mm256_fnmadd_ps(m1, sums, _mm256_mul_ps(d1, dots));
        _mm256_fmadd_ps(scales, v, f)
    }
}

/// The Q2_K, Q3_K or Q6_K (`fmt`) super-block at `b` against sub-blocks
/// `at..at + 8` of the inputs, added to `f`'s sixteen lanes (one per group).
///
/// The values stay bytes, as AVX-512's `group_super` keeps them: each made
/// unsigned by its format's offset (Q6_K's `q - 32` + 32, Q3_K's `q - 4` +
/// 4, Q2_K's `q` as it is; at most 63), dotted with the codes' high and
/// low bytes by `pmaddubsw` (`plane_dot`), four values an int32 lane, so a
/// group is four lanes, and the offset taken back as `offset * hsum_g`:
/// the same exact integer `dot_g` as the definition's. Widening the values
/// to int16 for `pmaddwd` had cost three shuffles a sub-block and left
/// eight lanes a group to fold: a Q3_K row ran at 2.7 GB/s from DRAM on
/// one thread, a third of what the thread reads.
///
/// # Safety
/// AVX2 and FMA; a super-block of `fmt` at `b`, eight sub-blocks from `at`
/// in the inputs, whose `high` and `low` bytes exist. Always inlined
/// (no features of its own: its caller's), so that each format's loop
/// compiles its own copy with the format a constant; as a call it took
/// the format as a variable.
#[inline(always)]
unsafe fn group_super(fmt: Format, b: *const u8, inputs: &Int16Inputs, at: usize, f: [__m256; 2]) -> [__m256; 2] {
    // The offset's power of two: Q6_K's 32, Q3_K's 4, Q2_K's none.
    let shift: Option<i32> = match fmt {
        Format::Q6K => Some(5),
        Format::Q3K => Some(2),
        _ => None,
    };
    // SAFETY: the block's bytes at b; its sub-blocks' code bytes, scales
    // and half sums from `at` (the caller's).
    unsafe {
        let (high, low) = (inputs.high.as_ptr().add(at * SUB), inputs.low.as_ptr().add(at * SUB));
        let off = _mm256_set1_epi8(shift.map_or(0, |s| 1 << s));
        // The sixteen groups' scales (and Q2_K's mins), groups 0..8 then
        // 8..16.
        let zero = [_mm256_setzero_ps(); 2];
        let (d1, m1): ([__m256; 2], [__m256; 2]) = match fmt {
            Format::Q2K => {
                let d = _mm256_set1_ps(super::super::avx2::h16(std::slice::from_raw_parts(b, Q2K_BYTES), 80));
                let dmin = _mm256_set1_ps(super::super::avx2::h16(std::slice::from_raw_parts(b, Q2K_BYTES), 82));
                let bytes = [0, 1].map(|half| _mm256_cvtepu8_epi32(_mm_loadl_epi64(b.add(8 * half) as *const __m128i)));
                let low = bytes.map(|v| _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15))));
                let high = bytes.map(|v| _mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(v)));
                (low.map(|v| _mm256_mul_ps(d, v)), high.map(|v| _mm256_mul_ps(dmin, v)))
            }
            Format::Q3K => (q3k_scales_vectors(b), zero),
            _ => {
                let d = _mm256_set1_ps(super::super::avx2::h16(std::slice::from_raw_parts(b, Q6K_BYTES), 208));
                let d1 = [0, 1].map(|half| {
                    let sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64(b.add(192 + 8 * half) as *const __m128i));
                    _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc))
                });
                (d1, zero)
            }
        };
        let scales = _mm256_loadu_ps(inputs.scales.as_ptr().add(at));
        // Groups 4c + 1 and 4c + 3 sit after 4c and 4c + 2 in the folded
        // vector's 128-bit halves; this puts each group in its own lane.
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        let mut out = f;
        // Groups 0..8 (sub-blocks 0..4), then 8..16.
        for (half, o) in out.iter_mut().enumerate() {
            // Vector k: sub-block 4 half + k's two groups, lanes 0-3 and 4-7.
            let mut r = [_mm256_setzero_si256(); 4];
            for c in 0..2 {
                let (u, v) = pair_bytes(fmt, b, 2 * half + c);
                for (h, bytes) in [u, v].into_iter().enumerate() {
                    let k = 4 * half + 2 * c + h;
                    let qu = _mm256_add_epi8(bytes, off);
                    r[2 * c + h] = plane_dot(qu, high.add(k * SUB), low.add(k * SUB));
                }
            }
            // Each group's four lanes summed: [g0 g2 g4 g6 | g1 g3 g5 g7]
            // (for half 0), then in order.
            let folded = _mm256_hadd_epi32(_mm256_hadd_epi32(r[0], r[1]), _mm256_hadd_epi32(r[2], r[3]));
            let mut dots = _mm256_permutevar8x32_epi32(folded, order);
            if let Some(shift) = shift {
                let hsums = _mm256_cvtps_epi32(_mm256_loadu_ps(inputs.half_sums.as_ptr().add(2 * at + 8 * half)));
                dots = _mm256_sub_epi32(dots, _mm256_sll_epi32(hsums, _mm_cvtsi32_si128(shift)));
            }
            let dots = _mm256_cvtepi32_ps(dots);
            let pairs = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
            let sub = _mm256_add_epi32(pairs, _mm256_set1_epi32(4 * half as i32));
            let s = _mm256_permutevar8x32_ps(scales, sub);
            let mut v = _mm256_mul_ps(d1[half], dots);
            if fmt.has_mins() {
                let hsums = _mm256_loadu_ps(inputs.half_sums.as_ptr().add(2 * at + 8 * half));
                v = _mm256_fnmadd_ps(m1[half], hsums, v);
            }
            *o = _mm256_fmadd_ps(s, v, *o);
        }
        out
    }
}

/// `q3k_scales` of the Q3_K super-block at `b`, groups 0..8 then 8..16, in
/// vector operations: the same products (`d` times a small integer, exact),
/// so the same bits. Its sixteen scalar iterations had been as many
/// operations as the super-block's dots.
///
/// # Safety
/// AVX2, FMA and F16C; a whole Q3_K super-block at `b`.
#[inline(always)]
unsafe fn q3k_scales_vectors(b: *const u8) -> [__m256; 2] {
    // SAFETY: the scale bytes (96..108) and d (108..110) lie in the block.
    unsafe {
        let low = _mm_loadl_epi64(b.add(96) as *const __m128i);
        let nib = _mm_set1_epi8(15);
        // Groups 0..8 take the low nibbles of scales[0..8], 8..16 the high.
        let low4 = _mm_unpacklo_epi64(_mm_and_si128(low, nib), _mm_and_si128(_mm_srli_epi16::<4>(low), nib));
        // Group g's top two bits: bits 2 (g / 4) of scales[8 + g % 4], so
        // dword k holds that word shifted right by 2k.
        let word = _mm_set1_epi32((b.add(104) as *const i32).read_unaligned());
        let high2 = _mm_and_si128(_mm_srlv_epi32(word, _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
        let ls = _mm_sub_epi8(_mm_or_si128(low4, _mm_slli_epi16::<4>(high2)), _mm_set1_epi8(32));
        let d = _mm256_set1_ps(super::super::avx2::h16(std::slice::from_raw_parts(b, Q3K_BYTES), 108));
        let widen = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
        [_mm256_mul_ps(d, widen(ls)), _mm256_mul_ps(d, widen(_mm_srli_si128::<8>(ls)))]
    }
}

/// `sum qu * code` over 32 values in eight int32 lanes (lane `i` values
/// `4i..4i + 4`), exact: `qu` unsigned bytes of at most 63, each code
/// `256 * high + low`. `pmaddubsw` takes its first operand unsigned and
/// its second signed, so the values go first against the signed high
/// bytes and second against the unsigned low bytes; its int16 pair sums
/// do not saturate (at most 2 * 63 * 128 and 2 * 255 * 63 in size).
///
/// # Safety
/// AVX2; 32 readable bytes at `high` and at `low`.
#[inline(always)]
unsafe fn plane_dot(qu: __m256i, high: *const i8, low: *const u8) -> __m256i {
    // SAFETY: the caller's.
    let (hi, lo) = unsafe { (_mm256_loadu_si256(high as *const __m256i), _mm256_loadu_si256(low as *const __m256i)) };
    let (h, l) = (_mm256_maddubs_epi16(qu, hi), _mm256_maddubs_epi16(lo, qu));
    _mm256_add_epi32(_mm256_madd_epi16(h, _mm256_set1_epi16(256)), _mm256_madd_epi16(l, _mm256_set1_epi16(1)))
}

/// Lane `k` = the sum of `a[k]`'s eight lanes (exact int32).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn sum_lanes(a: &[__m256i; 8]) -> __m256i {
    let s01 = _mm256_hadd_epi32(a[0], a[1]);
    let s23 = _mm256_hadd_epi32(a[2], a[3]);
    let s45 = _mm256_hadd_epi32(a[4], a[5]);
    let s67 = _mm256_hadd_epi32(a[6], a[7]);
    // Per 128-bit half: a0..a3's (t0) and a4..a7's (t1) partial sums.
    let t0 = _mm256_hadd_epi32(s01, s23);
    let t1 = _mm256_hadd_epi32(s45, s67);
    _mm256_add_epi32(_mm256_permute2x128_si256::<0x20>(t0, t1), _mm256_permute2x128_si256::<0x31>(t0, t1))
}

/// Eight bytes as eight floats.
///
/// # Safety
/// AVX2; `p` points at eight readable bytes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn widen(p: *const u8) -> __m256 {
    // SAFETY: eight bytes (the caller's).
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(p as *const __m128i) }))
}

/// Rows of `block_products`' blocks: one int32 lane each in a `__m256i`.
pub(super) const BLOCK_ROWS: usize = 8;
/// Inputs per tile of `block_products`: four accumulators, a weight vector
/// and the broadcasts fit AVX2's sixteen registers.
const TILE: usize = 4;

/// A block's sub-blocks transposed (`block_products`), per thread.
type Transposed = super::Transposed<__m256i, BLOCK_ROWS>;

std::thread_local! {
    static TRANSPOSED: std::cell::RefCell<Transposed> = const { std::cell::RefCell::new(Transposed::new()) };
}

/// Bytes this thread's transposed block holds.
#[cfg(test)]
pub(super) fn held_bytes() -> usize {
    TRANSPOSED.with_borrow(|t| t.held_bytes())
}

/// Row `r` of `rows` (`nr <= 8` rows) against every input, into `out` as
/// row `first + r`, bit for bit `row_scalar`: `avx512::block_products` on
/// eight rows, `pmaddwd` + add for `vpdpwssd`.
///
/// # Safety
/// The CPU supports AVX2 and FMA; `rows` is `nr` rows of whole
/// super-blocks of `fmt` of `inputs.cols` values; rows `first..first + nr`
/// of `out` are the caller's to write.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn block_products(
    fmt: Format,
    rows: &[u8],
    nr: usize,
    inputs: &Int16Inputs,
    out: Outputs,
    first: usize,
) {
    let (cols, n) = (inputs.cols, inputs.inputs());
    let (supers, sbb) = (cols / SUPER, fmt.super_bytes());
    let rb = supers * sbb;
    assert!(nr <= BLOCK_ROWS && rows.len() == nr * rb, "int16 block: lengths");
    TRANSPOSED.with_borrow_mut(|tr| {
        tr.prepare(fmt, rows, rb, _mm256_setzero_si256());
        // [sub-block of the pair][16 values of the sub-block][row], cleared
        // once per block (as AVX-512's): rows past `nr` stay zero.
        let mut q = [[[_mm256_setzero_si256(); BLOCK_ROWS]; 2]; 2];
        for sb in 0..supers {
            for c in 0..4 {
                for (r, row) in rows.chunks_exact(rb).enumerate() {
                    // SAFETY: super-block sb of the row.
                    let (u, v) = unsafe { pair_bytes(fmt, row.as_ptr().add(sb * sbb), c) };
                    for (h, bytes) in [u, v].into_iter().enumerate() {
                        q[h][0][r] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(bytes));
                        q[h][1][r] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(bytes));
                    }
                }
                for (h, halves) in q.iter().enumerate() {
                    let j = sb * 8 + 2 * c + h;
                    for (part, rows8) in halves.iter().enumerate() {
                        // SAFETY: AVX2 (this function's).
                        let t = unsafe { transpose8(*rows8) };
                        tr.words[j * 16 + 8 * part..j * 16 + 8 * part + 8].copy_from_slice(&t);
                    }
                }
            }
        }
        let mut t0 = 0;
        while t0 < n {
            let whole = n - t0 >= TILE;
            // SAFETY: inputs t0.. of `inputs`; `tr` holds the block's
            // sub-blocks.
            unsafe {
                match (fmt.groups(), fmt.has_mins(), whole) {
                    (1, _, true) => tile::<TILE, 1, true>(tr, inputs, t0, (nr, first), out),
                    (1, _, false) => tile::<1, 1, true>(tr, inputs, t0, (nr, first), out),
                    (_, false, true) => tile::<TILE, 2, false>(tr, inputs, t0, (nr, first), out),
                    (_, false, false) => tile::<1, 2, false>(tr, inputs, t0, (nr, first), out),
                    (_, true, true) => tile::<TILE, 2, true>(tr, inputs, t0, (nr, first), out),
                    (_, true, false) => tile::<1, 2, true>(tr, inputs, t0, (nr, first), out),
                }
            }
            t0 += if whole { TILE } else { 1 };
        }
    });
}

/// Inputs `t0..t0 + T` against the transposed block of `G` groups a
/// sub-block, with mins (`M`: Q4_K's, Q2_K's) or without, into rows
/// `first..first + nr` of `out`.
///
/// # Safety
/// AVX2 and FMA; the inputs exist and `tr` holds every sub-block of their
/// width.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile<const T: usize, const G: usize, const M: bool>(
    tr: &Transposed,
    inputs: &Int16Inputs,
    t0: usize,
    (nr, first): (usize, usize),
    out: Outputs,
) {
    let cols = inputs.cols;
    let subs = cols / SUB;
    // Each lane is written at its first group (`fma(s, v, 0)`, the
    // definition's first step) rather than cleared beforehand: clearing
    // this tile's lanes was a memset per call, 4% of a GGUF prefill.
    let mut f = [[std::mem::MaybeUninit::<__m256>::uninit(); LANES]; T];
    for j in 0..subs {
        // Each group's words, the groups' chains interleaved (one loop over
        // the words of both, so that no word waits in memory for a group).
        let mut acc = [[_mm256_setzero_si256(); T]; G];
        for step in 0..16 / G {
            for (q, acc) in acc.iter_mut().enumerate() {
                let m = q * 16 / G + step;
                // SAFETY: word m of sub-block j (the caller's `tr`); codes
                // 32j + 2m, + 1 of each input.
                unsafe {
                    let w = _mm256_load_si256(tr.words.as_ptr().add(j * 16 + m));
                    for (i, a) in acc.iter_mut().enumerate() {
                        let x = inputs.codes.as_ptr().add((t0 + i) * cols + j * SUB + 2 * m) as *const i32;
                        *a = _mm256_add_epi32(*a, _mm256_madd_epi16(w, _mm256_set1_epi32(x.read_unaligned())));
                    }
                }
            }
        }
        for (q, acc) in acc.iter().enumerate() {
            let g = j * G + q;
            // SAFETY: eight floats each.
            let (d1, m1) = unsafe { (_mm256_loadu_ps(tr.d1[g].as_ptr()), _mm256_loadu_ps(tr.m1[g].as_ptr())) };
            for (i, (a, fi)) in acc.iter().zip(f.iter_mut()).enumerate() {
                let at = (t0 + i) * subs + j;
                let mut v = _mm256_mul_ps(d1, _mm256_cvtepi32_ps(*a));
                if M {
                    // The group's min, times its codes' sum.
                    let sum = if G == 1 { inputs.sums[at] } else { inputs.half_sums[2 * at + q] };
                    v = _mm256_fnmadd_ps(m1, _mm256_set1_ps(sum), v);
                }
                // SAFETY: lane g % 16 was written at group g - 16.
                let prev = if g < LANES { _mm256_setzero_ps() } else { unsafe { fi[g % LANES].assume_init() } };
                fi[g % LANES].write(_mm256_fmadd_ps(_mm256_set1_ps(inputs.scales[at]), v, prev));
            }
        }
    }
    for (i, fi) in f.iter().enumerate() {
        // Lanes no group reached (rows of fewer than sixteen groups) are 0.
        // SAFETY: lane k < subs * G was written at group k.
        let fi: [__m256; LANES] =
            std::array::from_fn(|k| if k < subs * G { unsafe { fi[k].assume_init() } } else { _mm256_setzero_ps() });
        // `reduce_lanes` on vectors: each lane a row.
        let h: [__m256; 8] = [0, 1, 2, 3, 4, 5, 6, 7].map(|k| _mm256_add_ps(fi[k], fi[k + 8]));
        let g: [__m256; 4] = [0, 1, 2, 3].map(|k| _mm256_add_ps(h[k], h[k + 4]));
        let e = [_mm256_add_ps(g[0], g[2]), _mm256_add_ps(g[1], g[3])];
        let mut rows = [0f32; BLOCK_ROWS];
        // SAFETY: eight floats.
        unsafe { _mm256_storeu_ps(rows.as_mut_ptr(), _mm256_add_ps(e[0], e[1])) };
        for (r, &v) in rows[..nr].iter().enumerate() {
            // SAFETY: input t0 + i exists; rows first.. are the caller's.
            unsafe { out.write(t0 + i, first + r, v) };
        }
    }
}

/// Asks for the row after `row`, which the callers of the row kernels
/// hold next (`block_or_rows`' rows are consecutive). Read one row at a
/// time, a row's loads waited on DRAM: a profile put the time on the
/// instructions after them, the hardware's prefetch catching each short
/// row (18 lines at 2048 columns) late. Two rows ahead ran no faster.
#[inline(always)]
pub(super) fn prefetch_next_row(row: &[u8]) {
    let next = row.as_ptr().wrapping_add(row.len());
    for line in (0..row.len()).step_by(64) {
        // SAFETY: SSE is x86-64's baseline; a prefetch reads nothing and
        // faults on no address (past the matrix's end it names memory it
        // never touches).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(line) as *const i8) };
    }
}

/// `quantise_sub_block` on each sub-block of an input, the same operations
/// element by element (so the same bits), eight values a vector.
///
/// # Safety
/// The CPU supports AVX2; `x` and `c` hold `SUB` values per entry of `s`
/// and `sums`, two per entry of `halves`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quantise_input(x: &[f32], c: &mut [i16], s: &mut [f32], (sums, halves): Sums) {
    assert!(
        x.len() == c.len() && x.len() == s.len() * SUB && s.len() == sums.len() && halves.len() == 2 * sums.len(),
        "quantise_input: lengths"
    );
    // 1.5 * 2^23, as `quantise_sub_block`.
    const ROUND: f32 = 12_582_912.0;
    let sign = _mm256_set1_ps(-0.0);
    let (inf, round) = (_mm256_set1_ps(f32::INFINITY), _mm256_set1_ps(ROUND));
    let (lo, hi) = (_mm256_set1_ps(-CODE_MAX), _mm256_set1_ps(CODE_MAX));
    for (k, ((s, sum), halves)) in s.iter_mut().zip(sums.iter_mut()).zip(halves.chunks_exact_mut(2)).enumerate() {
        // SAFETY: sub-block k's 32 values and codes (the lengths checked).
        unsafe {
            let p = x.as_ptr().add(k * SUB);
            let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(p.add(8 * i)));
            let a: [__m256; 4] = v.map(|v| _mm256_andnot_ps(sign, v));
            // Finite: |v| < inf, false for NaN.
            let finite = a.iter().fold(_mm256_castsi256_ps(_mm256_set1_epi32(-1)), |ok, &a| {
                _mm256_and_ps(ok, _mm256_cmp_ps::<_CMP_LT_OQ>(a, inf))
            });
            let out = c.as_mut_ptr().add(k * SUB) as *mut __m256i;
            if _mm256_movemask_ps(finite) != 0xff {
                _mm256_storeu_si256(out, _mm256_setzero_si256());
                _mm256_storeu_si256(out.add(1), _mm256_setzero_si256());
                (*s, *sum) = (f32::NAN, 0.0);
                halves.fill(0.0);
                continue;
            }
            let m = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
            let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)));
            if amax == 0.0 {
                _mm256_storeu_si256(out, _mm256_setzero_si256());
                _mm256_storeu_si256(out.add(1), _mm256_setzero_si256());
                (*s, *sum) = (0.0, 0.0);
                halves.fill(0.0);
                continue;
            }
            let inv = _mm256_set1_ps(CODE_MAX / amax);
            let q: [__m256i; 4] = v.map(|v| {
                let r = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(v, inv), round), round);
                _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi))
            });
            // The halves' sums (exact integers, so their sum is the
            // sub-block's whatever the order).
            let hsum = |a: __m256i, b: __m256i| {
                let total = _mm256_add_epi32(a, b);
                let t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256::<1>(total));
                let t = _mm_add_epi32(t, _mm_shuffle_epi32::<0b01_00_11_10>(t));
                _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32::<0b10_11_00_01>(t)))
            };
            let (h0, h1) = (hsum(q[0], q[1]), hsum(q[2], q[3]));
            // `packs` interleaves the 128-bit halves; the permute restores order.
            let pack = |a, b| _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(a, b));
            _mm256_storeu_si256(out, pack(q[0], q[1]));
            _mm256_storeu_si256(out.add(1), pack(q[2], q[3]));
            (*s, *sum) = (amax / CODE_MAX, (h0 + h1) as f32);
            (halves[0], halves[1]) = (h0 as f32, h1 as f32);
        }
    }
}
