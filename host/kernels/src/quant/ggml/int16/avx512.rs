//! Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS rows on int16 inputs with AVX-512
//! VNNI. A row
//! window of sixteen Q4_K or Q5_K sub-blocks (two super-blocks) against an input is two
//! `vpdpbusd` per pair of sub-blocks (their 64 nibbles as bytes against the
//! codes' high and low bytes), the eight partial vectors summed into one
//! vector of the window's exact dots, then scaled as vectors and added
//! into the sixteen lanes of the definition. A Q6_K window is one
//! super-block: its eight sub-blocks' `vpmaddwd` partial vectors summed
//! per half sub-block into its sixteen groups' dots. Blocks of sixteen
//! rows, for many inputs, are transposed once into int16 words for
//! `vpdpwssd` against each input's codes broadcast.

use super::avx2::{pair_bytes, prefetch_next_row};
use super::{
    q3k_scales, scale_bytes, super_scales, Format, Int16Inputs, Outputs, IQ4XS_BYTES, LANES, Q3K_BYTES, SUB, SUPER,
};
use crate::quant::int8::avx512::sum_pair;
use std::arch::x86_64::*;

/// `out[t]` = `row` against input `t`, bit for bit `row_scalar`.
///
/// # Safety
/// The CPU supports AVX-512 F/BW/VNNI; `row` is whole super-blocks of
/// `fmt` of `inputs.cols` values and `out.len() == inputs.inputs()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn row_products(fmt: Format, row: &[u8], inputs: &Int16Inputs, out: &mut [f32]) {
    let supers = inputs.cols / SUPER;
    debug_assert!(row.len() == supers * fmt.super_bytes() && out.len() == inputs.inputs());
    // Every window but IQ4_XS's reads the codes' byte planes through raw
    // pointers: `Int16Inputs::new` makes them for every call that takes
    // this path (fewer than `BLOCK_MIN_INPUTS` inputs), and this holds it
    // to that.
    assert!(
        fmt == Format::Iq4Xs || (inputs.high.len() == inputs.codes.len() && inputs.low.len() == inputs.codes.len()),
        "int16 rows: inputs without their byte planes"
    );
    prefetch_next_row(row);
    // One loop per format, each compiled with its format a constant: with
    // the format a variable, its branches sat inside the loop.
    // SAFETY: the caller's contract, passed on.
    unsafe {
        match fmt {
            Format::Q2K => group_rows(Format::Q2K, row, inputs, out),
            Format::Q3K => group_rows(Format::Q3K, row, inputs, out),
            Format::Q6K => group_rows(Format::Q6K, row, inputs, out),
            Format::Q4K => window_rows(Format::Q4K, row, inputs, out),
            Format::Q5K => window_rows(Format::Q5K, row, inputs, out),
            Format::Iq4Xs => window_rows(Format::Iq4Xs, row, inputs, out),
        }
    }
}

/// `row_products` for a Q4_K, Q5_K or IQ4_XS row (`fmt`), two super-blocks
/// a window.
///
/// # Safety
/// As `row_products`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn window_rows(fmt: Format, row: &[u8], inputs: &Int16Inputs, out: &mut [f32]) {
    let supers = inputs.cols / SUPER;
    for (t, o) in out.iter_mut().enumerate() {
        let mut f = _mm512_setzero_ps();
        for w0 in (0..supers).step_by(2) {
            let sbs = (supers - w0).min(2);
            // SAFETY: super-blocks w0..w0 + sbs lie in the row and their
            // sub-blocks in input t (the caller's contract).
            unsafe {
                let b = row.as_ptr().add(w0 * fmt.super_bytes());
                let at = t * (inputs.cols / SUB) + w0 * 8;
                f = match (fmt, sbs) {
                    (Format::Iq4Xs, 2) => iq4xs_window::<2>(b, inputs, at, f),
                    (Format::Iq4Xs, _) => iq4xs_window::<1>(b, inputs, at, f),
                    (_, 2) => window::<2>(fmt, b, inputs, at, f),
                    _ => window::<1>(fmt, b, inputs, at, f),
                };
            }
        }
        *o = reduce(f);
    }
}

/// `row_products` for a Q2_K, Q3_K or Q6_K row (`fmt`).
///
/// # Safety
/// As `row_products`, with the inputs' byte planes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn group_rows(fmt: Format, row: &[u8], inputs: &Int16Inputs, out: &mut [f32]) {
    let supers = inputs.cols / SUPER;
    for (t, o) in out.iter_mut().enumerate() {
        let mut f = _mm512_setzero_ps();
        for sb in 0..supers {
            let (b, at) = (row.as_ptr().wrapping_add(sb * fmt.super_bytes()), t * (inputs.cols / SUB) + sb * 8);
            // SAFETY: super-block sb lies in the row and its sub-blocks in
            // input t (the caller's contract).
            f = unsafe { group_super(fmt, b, inputs, at, f) };
        }
        *o = reduce(f);
    }
}

/// `reduce_lanes` of a vector's sixteen lanes.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn reduce(f: __m512) -> f32 {
    let mut lanes = [0f32; LANES];
    // SAFETY: sixteen floats.
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), f) };
    super::reduce_lanes(&lanes)
}

/// Where `sum_sub_block_pairs`' summed vector holds unit `u`'s sum before
/// its last step: the vectors' halves summed apart leave the even units of
/// vectors 0-3 in lanes 0-3, their odd units in 4-7, and those of vectors
/// 4-7 in 8-11 and 12-15.
const UNIT_LANE: [i32; 16] = [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15];
/// Group `g`'s sub-block: the input scale it takes.
const Q6K_GROUP_SUB: [i32; 16] = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7];

/// Where `group_super`'s reduced vector holds group `g`: the four
/// vectors' groups `4c + L` sit in 128-bit lane `L`, and the two folds
/// leave group `4c + L` in lane `4L + c`.
const GROUP_LANE: [i32; 16] = [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15];

/// The Q2_K, Q3_K or Q6_K (`fmt`) super-block at `b` against sub-blocks
/// `at..at + 8` of the inputs, added to `f`'s sixteen lanes (one per group).
///
/// The values stay bytes, as `window`'s nibbles do: each made unsigned by
/// its format's offset (Q6_K's `q - 32` + 32, Q3_K's `q - 4` + 4, Q2_K's
/// `q` as it is), dotted with the codes' high and low bytes by two
/// `vpdpbusd` per pair of sub-blocks (four values a lane, so a group is
/// four lanes), and the offset taken back as `offset * hsum_g`, the
/// group's code sum: the same exact integer `dot_g` as the definition's.
/// Widening the values to int16 for `vpmaddwd` left eight lanes a group,
/// a fold more, and a widening per sub-block, all shuffles: a Q6_K row ran
/// at 11 GMAC/s on one thread, below a q4 row's 22.
///
/// # Safety
/// AVX-512 F/BW/VNNI; a super-block of `fmt` at `b`, eight sub-blocks from
/// `at` in the inputs, whose `high` and `low` bytes exist.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn group_super(fmt: Format, b: *const u8, inputs: &Int16Inputs, at: usize, f: __m512) -> __m512 {
    let offset: i8 = match fmt {
        Format::Q6K => 32,
        Format::Q3K => 4,
        _ => 0,
    };
    // SAFETY: the super-block's bytes at b; its sub-blocks' code bytes,
    // scales and half sums from `at` (the caller's).
    unsafe {
        let (high, low) = (inputs.high.as_ptr().add(at * SUB), inputs.low.as_ptr().add(at * SUB));
        let off = _mm256_set1_epi8(offset);
        // Vector c: sub-block 2c's groups 4c, 4c + 1 (lanes 0-3, 4-7),
        // 2c + 1's 4c + 2, 4c + 3.
        let mut t = [_mm512_setzero_si512(); 4];
        for (c, t) in t.iter_mut().enumerate() {
            let (u, v) = pair_bytes(fmt, b, c);
            let q = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(_mm256_add_epi8(u, off)), _mm256_add_epi8(v, off));
            let hi = _mm512_loadu_si512(high.add(64 * c) as *const _);
            let lo = _mm512_loadu_si512(low.add(64 * c) as *const _);
            let h = _mm512_slli_epi32::<8>(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q, hi));
            *t = _mm512_dpbusd_epi32(h, lo, q);
        }
        let fold = |a: __m512i, b: __m512i| _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
        let (x01, x23) = (fold(t[0], t[1]), fold(t[2], t[3]));
        let y = _mm512_add_epi32(_mm512_unpacklo_epi64(x01, x23), _mm512_unpackhi_epi64(x01, x23));
        let mut dots = _mm512_permutexvar_epi32(_mm512_loadu_si512(GROUP_LANE.as_ptr() as *const _), y);
        if offset != 0 {
            let hsums = _mm512_cvtps_epi32(_mm512_loadu_ps(inputs.half_sums.as_ptr().add(2 * at)));
            dots = _mm512_sub_epi32(dots, _mm512_mullo_epi32(hsums, _mm512_set1_epi32(i32::from(offset))));
        }
        let h16 = |at: usize| super::super::avx2::h16(std::slice::from_raw_parts(b, at + 2), at);
        let mut v = match fmt {
            Format::Q2K => {
                let sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(b as *const __m128i));
                let low = _mm512_cvtepi32_ps(_mm512_and_si512(sc, _mm512_set1_epi32(15)));
                let d1 = _mm512_mul_ps(_mm512_set1_ps(h16(80)), low);
                _mm512_mul_ps(d1, _mm512_cvtepi32_ps(dots))
            }
            Format::Q3K => {
                let d1 = _mm512_loadu_ps(q3k_scales(std::slice::from_raw_parts(b, Q3K_BYTES)).as_ptr());
                _mm512_mul_ps(d1, _mm512_cvtepi32_ps(dots))
            }
            _ => {
                let sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(b.add(192) as *const __m128i)));
                let d1 = _mm512_mul_ps(_mm512_set1_ps(h16(208)), sc);
                _mm512_mul_ps(d1, _mm512_cvtepi32_ps(dots))
            }
        };
        if fmt.has_mins() {
            // Q2_K's mins, times each group's codes' sum.
            let sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(b as *const __m128i));
            let m1 = _mm512_mul_ps(_mm512_set1_ps(h16(82)), _mm512_cvtepi32_ps(_mm512_srli_epi32::<4>(sc)));
            v = _mm512_fnmadd_ps(m1, _mm512_loadu_ps(inputs.half_sums.as_ptr().add(2 * at)), v);
        }
        let scales = _mm512_castps256_ps512(_mm256_loadu_ps(inputs.scales.as_ptr().add(at)));
        let s = _mm512_permutexvar_ps(_mm512_loadu_si512(Q6K_GROUP_SUB.as_ptr() as *const _), scales);
        _mm512_fmadd_ps(s, v, f)
    }
}

/// `S` Q4_K or Q5_K (`fmt`) super-blocks at `b` (one window, or its first
/// half) against input sub-blocks `at..` of the inputs, added to `f`.
///
/// The nibbles stay bytes: each code is `256 * high + low`, so a
/// sub-block's dot is `256 * sum q * high + sum q * low`, two `vpdpbusd`
/// (the nibbles unsigned against the signed high bytes, the unsigned low
/// bytes against the nibbles as signed), the same exact integer as the
/// definition's (below 2^24). Widening the nibbles to int16 for
/// `vpmaddwd` cost a lane-crossing shuffle per sub-block, and this row
/// kernel is bound by its shuffles.
///
/// # Safety
/// AVX-512 F/BW/VNNI; `S` super-blocks of `fmt` at `b`, `8 * S` sub-blocks
/// from `at` in the inputs, whose `high` and `low` bytes exist.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn window<const S: usize>(fmt: Format, b: *const u8, inputs: &Int16Inputs, at: usize, f: __m512) -> __m512 {
    // Vector c: sub-blocks 2c (lanes 0-7) and 2c + 1 (lanes 8-15).
    let mut dots = [_mm512_setzero_si512(); 8];
    let mut bytes = [0u8; 32];
    let mut halves = [0u16; 32];
    for s in 0..S {
        // SAFETY: super-block s at b (the caller's), its sub-blocks' code
        // bytes from `at`.
        unsafe {
            let sb = b.add(s * fmt.super_bytes());
            let scales = &*(sb.add(4) as *const [u8; 12]);
            let sc = scale_bytes(scales);
            bytes[8 * s..8 * s + 8].copy_from_slice(&sc[..8]);
            bytes[16 + 8 * s..16 + 8 * s + 8].copy_from_slice(&sc[8..]);
            let (d, dmin) = (u16::from_le_bytes([*sb, *sb.add(1)]), u16::from_le_bytes([*sb.add(2), *sb.add(3)]));
            halves[8 * s..8 * s + 8].fill(d);
            halves[16 + 8 * s..16 + 8 * s + 8].fill(dmin);
            for c in 0..4 {
                let (lo, hi) = pair_bytes(fmt, sb, c);
                let q = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
                let k = at + 8 * s + 2 * c;
                let high = _mm512_loadu_si512(inputs.high.as_ptr().add(k * SUB) as *const _);
                let low = _mm512_loadu_si512(inputs.low.as_ptr().add(k * SUB) as *const _);
                let h = _mm512_slli_epi32::<8>(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q, high));
                dots[4 * s + c] = _mm512_dpbusd_epi32(h, low, q);
            }
        }
    }
    // SAFETY: the arrays hold sixteen values of each kind; the inputs'
    // scales and sums hold 8 * S from `at` (masked beyond).
    unsafe {
        let mask: __mmask16 = if S == 2 { 0xFFFF } else { 0x00FF };
        let dots = _mm512_cvtepi32_ps(sum_sub_block_pairs(&dots));
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(halves.as_ptr() as *const __m256i));
        let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(halves.as_ptr().add(16) as *const __m256i));
        let d1 = _mm512_mul_ps(d, widen(bytes.as_ptr()));
        let m1 = _mm512_mul_ps(dmin, widen(bytes.as_ptr().add(16)));
        let sums = _mm512_maskz_loadu_ps(mask, inputs.sums.as_ptr().add(at));
        let scales = _mm512_maskz_loadu_ps(mask, inputs.scales.as_ptr().add(at));
        let v = _mm512_fnmadd_ps(m1, sums, _mm512_mul_ps(d1, dots));
        _mm512_mask3_fmadd_ps(scales, v, f, mask)
    }
}

/// `window` for IQ4_XS, whose values are signed, so `vpdpbusd` cannot
/// take them against the codes' unsigned low bytes: each sub-block's
/// values widened to int16 and `vpmaddwd` with its codes, the two halves
/// of the products folded so that vector `c` holds sub-block `2c`'s
/// partial sums in lanes 0-7 and `2c + 1`'s in 8-15, as `window`'s do;
/// the scales `d * (ls - 32)`, no mins.
///
/// # Safety
/// AVX-512 F/BW/VNNI; `S` IQ4_XS super-blocks at `b`, `8 * S` sub-blocks
/// from `at` in the inputs.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn iq4xs_window<const S: usize>(b: *const u8, inputs: &Int16Inputs, at: usize, f: __m512) -> __m512 {
    let mut dots = [_mm512_setzero_si512(); 8];
    let mut d1 = [0f32; LANES];
    for s in 0..S {
        // SAFETY: super-block s at b (the caller's), its sub-blocks' codes
        // from `at`.
        unsafe {
            let sb = b.add(s * IQ4XS_BYTES);
            d1[8 * s..8 * s + 8]
                .copy_from_slice(&super_scales(Format::Iq4Xs, std::slice::from_raw_parts(sb, IQ4XS_BYTES)).0);
            for c in 0..4 {
                let (lo, hi) = pair_bytes(Format::Iq4Xs, sb, c);
                let k = at + 8 * s + 2 * c;
                let x = |k: usize| _mm512_loadu_si512(inputs.codes.as_ptr().add(k * SUB) as *const _);
                let m0 = _mm512_madd_epi16(_mm512_cvtepi8_epi16(lo), x(k));
                let m1 = _mm512_madd_epi16(_mm512_cvtepi8_epi16(hi), x(k + 1));
                let first = _mm512_shuffle_i64x2::<0x44>(m0, m1);
                let second = _mm512_shuffle_i64x2::<0xEE>(m0, m1);
                dots[4 * s + c] = _mm512_add_epi32(first, second);
            }
        }
    }
    // SAFETY: sixteen scales; the inputs' scales and sums hold 8 * S from
    // `at` (masked beyond).
    unsafe {
        let mask: __mmask16 = if S == 2 { 0xFFFF } else { 0x00FF };
        let dots = _mm512_cvtepi32_ps(sum_sub_block_pairs(&dots));
        let sums = _mm512_maskz_loadu_ps(mask, inputs.sums.as_ptr().add(at));
        let scales = _mm512_maskz_loadu_ps(mask, inputs.scales.as_ptr().add(at));
        // The definition's min step with `m_j` 0, as every level takes it.
        let v = _mm512_fnmadd_ps(_mm512_setzero_ps(), sums, _mm512_mul_ps(_mm512_loadu_ps(d1.as_ptr()), dots));
        _mm512_mask3_fmadd_ps(scales, v, f, mask)
    }
}

/// Lane `u` = the sum of unit `u`'s eight lanes, where vector `i` holds
/// unit `2i` in lanes 0-7 and unit `2i + 1` in lanes 8-15 (Q4_K's
/// sub-blocks in a row window, Q6_K's groups in a super-block).
///
/// # Safety
/// AVX-512 F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn sum_sub_block_pairs(a: &[__m512i; 8]) -> __m512i {
    let mut pairs = [_mm512_setzero_si512(); 4];
    for (c, p) in pairs.iter_mut().enumerate() {
        // SAFETY: AVX-512 F (this function's).
        *p = unsafe { sum_pair(a[2 * c], a[2 * c + 1]) };
    }
    // `int8::avx512::sum_lane_pairs`' second step; then each vector's 128-bit lanes 0+1
    // and 2+3 apart.
    let mut y = [_mm512_setzero_si512(); 2];
    for (q, yq) in y.iter_mut().enumerate() {
        let (u, v) = (pairs[2 * q], pairs[2 * q + 1]);
        *yq = _mm512_add_epi32(_mm512_unpacklo_epi64(u, v), _mm512_unpackhi_epi64(u, v));
    }
    let z = _mm512_add_epi32(_mm512_shuffle_i32x4::<0x88>(y[0], y[1]), _mm512_shuffle_i32x4::<0xDD>(y[0], y[1]));
    // SAFETY: sixteen indices.
    _mm512_permutexvar_epi32(unsafe { _mm512_loadu_si512(UNIT_LANE.as_ptr() as *const _) }, z)
}

/// Sixteen bytes as sixteen floats.
///
/// # Safety
/// AVX-512 F; sixteen readable bytes at `p`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn widen(p: *const u8) -> __m512 {
    // SAFETY: sixteen bytes (the caller's).
    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(p as *const __m128i) }))
}

/// Inputs per tile of `block_products`: two chains of `vpdpwssd` each
/// (`tile`), sixteen in all, enough to cover its latency, each input's
/// broadcast folded into the instruction.
const TILE: usize = 8;

/// A block's sub-blocks transposed (`block_products`), per thread.
type Transposed = super::Transposed<__m512i, LANES>;

std::thread_local! {
    static TRANSPOSED: std::cell::RefCell<Transposed> = const { std::cell::RefCell::new(Transposed::new()) };
}

/// Bytes this thread's transposed block holds.
#[cfg(test)]
pub(super) fn held_bytes() -> usize {
    TRANSPOSED.with_borrow(|t| t.held_bytes())
}

/// Row `r` of `rows` (`nr <= 16` rows) against every input `t`, into
/// `out` as row `first + r`, bit for bit `row_scalar`: the block transposed
/// once so that one `vpdpwssd` against an input's two codes broadcast adds
/// two columns into each row's lane, and the transpose serves every input
/// (prefill). Lanes are rows here, so the definition's sixteen lanes of a
/// row are sixteen vectors per input.
///
/// # Safety
/// The CPU supports AVX-512 F/BW/VNNI; `rows` is `nr` rows of whole
/// super-blocks of `fmt` of `inputs.cols` values; rows `first..first + nr`
/// of `out` are the caller's to write.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn block_products(
    fmt: Format,
    rows: &[u8],
    nr: usize,
    inputs: &Int16Inputs,
    out: Outputs,
    first: usize,
) {
    use crate::quant::int8::avx512::transpose_words;
    let (cols, n) = (inputs.cols, inputs.inputs());
    let (supers, sbb) = (cols / SUPER, fmt.super_bytes());
    let rb = supers * sbb;
    assert!(nr <= LANES && rows.len() == nr * rb, "int16 block: lengths");
    TRANSPOSED.with_borrow_mut(|tr| {
        tr.prepare(fmt, rows, rb, _mm512_setzero_si512());
        // Cleared once per block, not per pair of sub-blocks (a memset of
        // 64 KB a block of 2048 columns, 4% of a GGUF prefill): rows past
        // `nr` stay zero, the others are overwritten each time.
        let (mut lo, mut hi) = ([_mm512_setzero_si512(); LANES], [_mm512_setzero_si512(); LANES]);
        for sb in 0..supers {
            for c in 0..4 {
                for r in 0..nr {
                    // SAFETY: super-block sb of row r.
                    let (u, v) = unsafe { pair_bytes(fmt, rows.as_ptr().add(r * rb + sb * sbb), c) };
                    (lo[r], hi[r]) = (_mm512_cvtepi8_epi16(u), _mm512_cvtepi8_epi16(v));
                }
                let j = sb * 8 + 2 * c;
                // SAFETY: AVX-512 F (this function's).
                let (lo, hi) = unsafe { (transpose_words(&lo), transpose_words(&hi)) };
                tr.words[j * 16..(j + 1) * 16].copy_from_slice(&lo);
                tr.words[(j + 1) * 16..(j + 2) * 16].copy_from_slice(&hi);
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
/// AVX-512 F/BW/VNNI; the inputs exist and `tr` holds every sub-block of
/// their width.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
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
    let mut f = [[std::mem::MaybeUninit::<__m512>::uninit(); LANES]; T];
    // SAFETY: the caller's inputs t0..t0 + T exist.
    let codes: [*const i16; T] = std::array::from_fn(|i| unsafe { inputs.codes.as_ptr().add((t0 + i) * cols) });
    for j in 0..subs {
        // The sub-block's sixteen words in two halves, each half its own
        // chain per input, the halves interleaved: `vpdpwssd`'s latency
        // needs about twelve chains in flight to keep both of its ports
        // busy, and eight (one per input) ran it at two thirds of its peak.
        // A Q6_K half is its group; a Q4_K sub-block's dot is the sum of
        // its halves' (exact integers, so the same bits).
        let mut acc = [[_mm512_setzero_si512(); T]; 2];
        for step in 0..8 {
            for (q, acc) in acc.iter_mut().enumerate() {
                let m = q * 8 + step;
                // SAFETY: word m of sub-block j (the caller's `tr`); codes
                // 32j + 2m, + 1 of each input.
                unsafe {
                    let w = _mm512_load_si512(tr.words.as_ptr().add(j * 16 + m) as *const _);
                    for (i, a) in acc.iter_mut().enumerate() {
                        let x = codes[i].add(j * SUB + 2 * m);
                        *a = dpwssd_broadcast(*a, w, x);
                    }
                }
            }
        }
        if G == 1 {
            let [whole, second] = &mut acc;
            for (a, b) in whole.iter_mut().zip(second.iter()) {
                *a = _mm512_add_epi32(*a, *b);
            }
        }
        for (q, acc) in acc.iter().take(G).enumerate() {
            let g = j * G + q;
            // SAFETY: sixteen floats each.
            let (d1, m1) = unsafe { (_mm512_loadu_ps(tr.d1[g].as_ptr()), _mm512_loadu_ps(tr.m1[g].as_ptr())) };
            for (i, (a, fi)) in acc.iter().zip(f.iter_mut()).enumerate() {
                let at = (t0 + i) * subs + j;
                let mut v = _mm512_mul_ps(d1, _mm512_cvtepi32_ps(*a));
                if M {
                    // The group's min, times its codes' sum.
                    let sum = if G == 1 { inputs.sums[at] } else { inputs.half_sums[2 * at + q] };
                    v = _mm512_fnmadd_ps(m1, _mm512_set1_ps(sum), v);
                }
                // SAFETY: lane g % 16 was written at group g - 16.
                let prev = if g < LANES { _mm512_setzero_ps() } else { unsafe { fi[g % LANES].assume_init() } };
                fi[g % LANES].write(_mm512_fmadd_ps(_mm512_set1_ps(inputs.scales[at]), v, prev));
            }
        }
    }
    for (i, fi) in f.iter().enumerate() {
        // Lanes no group reached (rows of fewer than sixteen groups) are 0.
        // SAFETY: lane k < subs * G was written at group k.
        let fi: [__m512; LANES] =
            std::array::from_fn(|k| if k < subs * G { unsafe { fi[k].assume_init() } } else { _mm512_setzero_ps() });
        // `reduce_lanes` on vectors: each lane a row.
        let h: [__m512; 8] = [0, 1, 2, 3, 4, 5, 6, 7].map(|k| _mm512_add_ps(fi[k], fi[k + 8]));
        let g: [__m512; 4] = [0, 1, 2, 3].map(|k| _mm512_add_ps(h[k], h[k + 4]));
        let e = [_mm512_add_ps(g[0], g[2]), _mm512_add_ps(g[1], g[3])];
        let mut rows = [0f32; LANES];
        // SAFETY: sixteen floats.
        unsafe { _mm512_storeu_ps(rows.as_mut_ptr(), _mm512_add_ps(e[0], e[1])) };
        for (r, &v) in rows[..nr].iter().enumerate() {
            // SAFETY: input t0 + i exists; rows first.. are the caller's.
            unsafe { out.write(t0 + i, first + r, v) };
        }
    }
}

/// `a + vpdpwssd(w, the two int16 at x broadcast)`, as that one
/// instruction. LLVM splits `_mm512_dpwssd_epi32` into `vpmaddwd` and
/// `vpaddd` for CPUs it does not know to run it fast (all of them, at the
/// generic tuning we build with), which doubled the block products'
/// instructions.
///
/// # Safety
/// AVX-512 VNNI; four readable bytes at `x`.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn dpwssd_broadcast(a: __m512i, w: __m512i, x: *const i16) -> __m512i {
    let mut a = a;
    // SAFETY: the caller's: VNNI, and x points at two int16.
    unsafe {
        std::arch::asm!(
            "vpdpwssd {a}, {w}, dword ptr [{x}]{{1to16}}",
            a = inout(zmm_reg) a,
            w = in(zmm_reg) w,
            x = in(reg) x,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    a
}
