//! Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS products on int16 inputs: every
//! product of such a matrix (trunk and experts, decode and prefill alike: one
//! definition, so a prompt's logits do not depend on its chunks and the
//! prefix cache gives the uncached bits) quantises its input to int16 per
//! sub-block of 32 values and dots each group of the row that shares a
//! scale in int32, exactly, from the blocks as stored.
//!
//! Why int16 and not ggml's own int8 (`Q8_K`): the file's model is its
//! weights as ggml dequantises them, and llama.cpp's 8-bit inputs put its
//! logits 0.03-0.9 (relative) from that model on our fixtures while f32
//! products were within 2e-6 (docs/PERFORMANCE.md, GGUF fidelity). An
//! int16 input is rounded to 1/65534 of its sub-block's largest value (the
//! wide Q4_K_M fixture's logits move 5.8e-5 of their largest, against 0.13
//! for llama.cpp), and the products still run on integer multiply-adds:
//! `vpdpwssd` makes 117 GMAC/s on one core of the machine we measure on,
//! twice its 58 of f32 FMAs (the prefill bench's peaks). And decoding a
//! row to f32 first, the form this replaces, cost more than its products.
//! Q8_0 is not computed so: its fixtures' narrow rows moved past 1e-4.
//!
//! The definition all levels compute bit for bit (`row_scalar` is the
//! reference):
//!
//! - An input's sub-block `j` of 32 values `x`: `amax = max |x|`, scale
//!   `s_j = amax / 32767`, codes `c = round_ties_even(x * (32767 / amax))`
//!   clamped to +-32767 (all 0, scale 0, where `amax == 0`; scale NaN,
//!   codes 0, where a value is not finite, so the product is NaN as f32
//!   products would make it), and `sum_j = sum c`.
//! - Q4_K and Q5_K: a row's sub-block `j` (ggml's `d * sc_j * q - dmin *
//!   m_j`, q a nibble, or for Q5_K five bits, a nibble and one bit of
//!   `qh`): `dot_j = sum q * c` over its 32 columns, an exact integer
//!   (Q4_K's below 2^24, so exact in f32 too; Q5_K's up to 2^25, converted
//!   to f32 rounded to nearest, as every level converts it); `v = (d *
//!   sc_j) * dot_j` rounded,
//!   then `v = fma(-(dmin * m_j), sum_j, v)` (both scale products are
//!   exact, as ggml's). Sixteen lanes `F`, zero at first, take
//!   `F[j % 16] = fma(s_j, v, F[j % 16])` over the sub-blocks in order.
//! - Q6_K: a row's group `g` of 16 values (ggml's `d * sc_g * (q - 32)`,
//!   q six bits; the first or second half of sub-block `j = g / 2`):
//!   `dot_g = sum (q - 32) * c`, exact (below 2^24); `v = (d * sc_g) *
//!   dot_g` rounded; `F[g % 16] = fma(s_j, v, F[g % 16])` over the groups
//!   in order (a super-block's sixteen groups fill the sixteen lanes).
//! - IQ4_XS: Q4_K's steps with its own values and scales and no mins
//!   (`m_j` 0, so the min's `fma` adds a zero): a sub-block's values are
//!   `kvalues_iq4nl[q]` (signed, at most 127 in size), its scale `d *
//!   (ls_j - 32)`, ggml's `dl`.
//! - Q3_K: Q6_K's steps with its own values and scales: a group's values
//!   `q - 4` (two bits of `qs` and a bit of `hmask`, ggml's `q3 - (hm ?
//!   0 : 4)`), its scale `d * (ls_g - 32)`.
//! - Q2_K: Q6_K's steps with its values `q` (two bits of `qs`, 0..3) and
//!   its group's min: `v = (d * sc_g) * dot_g` rounded, then `v = fma(-(dmin
//!   * m_g), hsum_g, v)` with `hsum_g` the sum of the group's 16 codes (ggml's
//!   `dl * q - ml`, `sc_g` and `m_g` the low and high nibbles of
//!   `scales[g]`).
//! - The row's product is `((F0+F8)+(F4+F12))+((F2+F10)+(F6+F14))` plus
//!   the same of the odd lanes, `(e0 + e1)` in `reduce_lanes`.
//!
//! Sixteen lanes, because the SIMD levels take a Q4_K row sixteen
//! sub-blocks (two super-blocks, 512 columns) and a Q6_K row one
//! super-block at a time: one integer multiply-add per sub-block, the
//! partial vectors summed into one vector of the window's sixteen exact
//! dots, and the scales applied as vectors. A row's unpacked sub-blocks
//! are shared by every input of the call.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(test)]
mod tests;

use rayon::prelude::*;

use super::blocks::{h, scale_min_k4};
use super::iq::IQ4NL_VALUES;
use super::GgmlType;
use crate::quant::int8::Level;
use crate::quant::simd::fused_mul_add;

/// Values per sub-block: one input scale and one exact dot each.
pub(crate) const SUB: usize = 32;
/// Lanes of the row sum (sub-blocks per SIMD window).
pub(crate) const LANES: usize = 16;
/// Values and bytes of a Q4_K super-block (`block_q4_K`: f16 d, f16 dmin,
/// 12 bytes of 6-bit scales and mins, 128 bytes of nibbles).
pub(crate) const SUPER: usize = 256;
pub(crate) const SUPER_BYTES: usize = 144;
/// Bytes of a Q6_K super-block (`block_q6_K`: 128 bytes of low nibbles,
/// 64 of high bit pairs, 16 int8 scales, f16 d).
pub(crate) const Q6K_BYTES: usize = 210;
/// Bytes of a Q5_K super-block (`block_q5_K`: Q4_K's d, dmin and scales,
/// then 32 bytes of fifth bits `qh`, then the 128 bytes of nibbles).
pub(crate) const Q5K_BYTES: usize = 176;
/// Bytes of a Q3_K super-block (`block_q3_K`: 32 bytes of `hmask`, 64 of
/// two-bit values, 12 of 6-bit scales, f16 d).
pub(crate) const Q3K_BYTES: usize = 110;
/// Bytes of a Q2_K super-block (`block_q2_K`: 16 bytes of 4-bit scales
/// and mins, 64 of two-bit values, f16 d, f16 dmin).
pub(crate) const Q2K_BYTES: usize = 84;
/// Bytes of an IQ4_XS super-block (`block_iq4_xs`: f16 d, a u16 of the
/// scales' top two bits, 4 bytes of their low nibbles, 128 bytes of
/// indices into `kvalues_iq4nl`, two a byte).
pub(crate) const IQ4XS_BYTES: usize = 136;
const CODE_MAX: f32 = 32767.0;

/// The block types computed on int16 inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Iq4Xs,
}

impl Format {
    /// The format whose products `ty` takes, if it takes int16 inputs (the
    /// one place that says which types do).
    pub(crate) fn of(ty: GgmlType) -> Option<Format> {
        match ty {
            GgmlType::Q2K => Some(Format::Q2K),
            GgmlType::Q3K => Some(Format::Q3K),
            GgmlType::Q4K => Some(Format::Q4K),
            GgmlType::Q5K => Some(Format::Q5K),
            GgmlType::Q6K => Some(Format::Q6K),
            GgmlType::Iq4Xs => Some(Format::Iq4Xs),
            _ => None,
        }
    }

    pub(crate) const fn super_bytes(self) -> usize {
        match self {
            Format::Q2K => Q2K_BYTES,
            Format::Q3K => Q3K_BYTES,
            Format::Q4K => SUPER_BYTES,
            Format::Q5K => Q5K_BYTES,
            Format::Q6K => Q6K_BYTES,
            Format::Iq4Xs => IQ4XS_BYTES,
        }
    }

    /// Groups of values sharing a scale per sub-block of 32.
    pub(crate) const fn groups(self) -> usize {
        match self {
            Format::Q4K | Format::Q5K | Format::Iq4Xs => 1,
            Format::Q2K | Format::Q3K | Format::Q6K => 2,
        }
    }

    /// Whether its groups have mins (an offset times the group's code sum).
    pub(crate) const fn has_mins(self) -> bool {
        matches!(self, Format::Q2K | Format::Q4K | Format::Q5K)
    }
}

/// Inputs quantised for `products`: codes `[n][cols]`, per sub-block a
/// scale and the codes' sum, `[n][cols / SUB]`, and per half sub-block the
/// sum of its 16 codes, `[n][cols / 16]` (Q2_K's mins). The sums are kept
/// as f32 (exact: at most 32 * 32767 in size, below 2^24) because the
/// products only ever use them so, and a kernel then broadcasts them from
/// memory rather than converting them first.
pub(crate) struct Int16Inputs {
    pub(crate) cols: usize,
    pub(crate) codes: Vec<i16>,
    pub(crate) scales: Vec<f32>,
    pub(crate) sums: Vec<f32>,
    pub(crate) half_sums: Vec<f32>,
    /// Each code as `256 * high + low` (`high` its signed top byte, `low`
    /// its unsigned bottom one), `[n][cols]` each, for the few inputs the
    /// row kernels take (fewer than `BLOCK_MIN_INPUTS`; empty otherwise):
    /// AVX-512's Q4_K rows dot their nibbles with these bytes by
    /// `vpdpbusd`, never widening the nibbles, and get the same exact
    /// integers.
    pub(crate) high: Vec<i8>,
    pub(crate) low: Vec<u8>,
}

impl Int16Inputs {
    /// `x` is `[n, cols]`, `cols` a whole number of super-blocks.
    pub(crate) fn new(x: &[f32], cols: usize) -> Int16Inputs {
        assert!(cols > 0 && cols.is_multiple_of(SUPER) && x.len().is_multiple_of(cols), "Int16Inputs: shape");
        let subs = x.len() / SUB;
        let mut q = Int16Inputs {
            cols,
            codes: vec![0; x.len()],
            scales: vec![0.0; subs],
            sums: vec![0.0; subs],
            half_sums: vec![0.0; 2 * subs],
            high: Vec::new(),
            low: Vec::new(),
        };
        let input = |(xs, (((c, s), sums), halves)): (&[f32], InputParts)| quantise_input(xs, c, s, (sums, halves));
        let per = cols / SUB;
        let parts = q.codes.chunks_mut(cols).zip(q.scales.chunks_mut(per)).zip(q.sums.chunks_mut(per));
        let parts = parts.zip(q.half_sums.chunks_mut(2 * per));
        if x.len() >= PAR_MIN_WORK {
            let parts = q.codes.par_chunks_mut(cols).zip(q.scales.par_chunks_mut(per)).zip(q.sums.par_chunks_mut(per));
            let parts = parts.zip(q.half_sums.par_chunks_mut(2 * per));
            x.par_chunks(cols).zip(parts).for_each(input);
        } else {
            x.chunks(cols).zip(parts).for_each(input);
        }
        if x.len() / cols < BLOCK_MIN_INPUTS {
            q.high = q.codes.iter().map(|&c| (c >> 8) as i8).collect();
            q.low = q.codes.iter().map(|&c| c as u8).collect();
        }
        q
    }

    pub(crate) fn inputs(&self) -> usize {
        self.codes.len() / self.cols
    }
}

/// Bytes `Int16Inputs` holds for `inputs` inputs of `cols` values: the
/// codes, a scale and a code sum per sub-block and a code sum per half
/// (2.5 bytes a value; fewer than `BLOCK_MIN_INPUTS` inputs, a decode's,
/// add two more). The memory plan counts them for a chunk's int16 products
/// (`Format::of`).
pub fn int16_input_bytes(inputs: usize, cols: usize) -> usize {
    let bytes = if inputs < BLOCK_MIN_INPUTS { 2 } else { 0 };
    inputs * ((2 + bytes) * cols + 16 * cols.div_ceil(SUB))
}

/// One input's codes, scales, sums and half sums, as `Int16Inputs::new`
/// fills them.
type InputParts<'a> = (((&'a mut [i16], &'a mut [f32]), &'a mut [f32]), &'a mut [f32]);
/// An input's code sums per sub-block and per half sub-block.
type Sums<'a> = (&'a mut [f32], &'a mut [f32]);

/// One input's sub-blocks (`quantise_sub_block` each) into its codes,
/// scales and sums; on AVX2 eight values a vector, the same operations
/// element by element, so the same bits (held by
/// `inputs_quantise_to_the_same_bits_at_every_level`): the baseline build's
/// loop was 5% of a GGUF prefill.
fn quantise_input(x: &[f32], c: &mut [i16], s: &mut [f32], sums: Sums) {
    #[cfg(target_arch = "x86_64")]
    if crate::quant::simd::has_avx2() {
        // SAFETY: AVX2 is available (just checked).
        return unsafe { avx2::quantise_input(x, c, s, sums) };
    }
    quantise_input_portable(x, c, s, sums)
}

fn quantise_input_portable(x: &[f32], c: &mut [i16], s: &mut [f32], (sums, halves): Sums) {
    let parts = c.chunks_exact_mut(SUB).zip(s.iter_mut()).zip(sums.iter_mut()).zip(halves.chunks_exact_mut(2));
    for (xs, (((c, s), sum), halves)) in x.chunks_exact(SUB).zip(parts) {
        let (xs, c): (&[f32; SUB], &mut [i16; SUB]) =
            (xs.try_into().expect("a sub-block"), c.try_into().expect("a sub-block"));
        let (scale, [h0, h1]) = quantise_sub_block(xs, c);
        (*s, *sum) = (scale, (h0 + h1) as f32);
        (halves[0], halves[1]) = (h0 as f32, h1 as f32);
    }
}

/// One sub-block's codes into `c`; its scale and the sums of the codes'
/// halves.
fn quantise_sub_block(x: &[f32; SUB], c: &mut [i16; SUB]) -> (f32, [i32; 2]) {
    // Folds without early exits, so that they vectorise.
    if !x.iter().fold(true, |ok, v| ok & v.is_finite()) {
        c.fill(0);
        return (f32::NAN, [0; 2]);
    }
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    if amax == 0.0 {
        c.fill(0);
        return (0.0, [0; 2]);
    }
    // 1.5 * 2^23: adding it leaves no fraction bits, so the sum rounds
    // to an integer, ties to even, for |v| <= 2^22 (here |v| <= 32767).
    // `round_ties_even` was a libm call: 5% of a prefill.
    const ROUND: f32 = 12_582_912.0;
    let inv = CODE_MAX / amax;
    let mut sums = [0i32; 2];
    for (l, (o, &v)) in c.iter_mut().zip(x).enumerate() {
        *o = (((v * inv) + ROUND) - ROUND).clamp(-CODE_MAX, CODE_MAX) as i16;
        sums[l / 16] += i32::from(*o);
    }
    (amax / CODE_MAX, sums)
}

/// The row sum of the sixteen lanes, in the definition's order.
#[inline(always)]
pub(crate) fn reduce_lanes(f: &[f32; LANES]) -> f32 {
    let h: [f32; 8] = std::array::from_fn(|i| f[i] + f[i + 8]);
    let g: [f32; 4] = std::array::from_fn(|i| h[i] + h[i + 4]);
    let e: [f32; 2] = std::array::from_fn(|i| g[i] + g[i + 2]);
    e[0] + e[1]
}

/// The scales and mins of one Q4_K or Q5_K super-block, ggml's
/// products: `(d * sc_j, dmin * m_j)` for its eight sub-blocks; an IQ4_XS
/// one's `d * (ls_j - 32)` and zeros (`fmt`).
#[inline(always)]
pub(crate) fn super_scales(fmt: Format, b: &[u8]) -> ([f32; 8], [f32; 8]) {
    let mut out = ([0f32; 8], [0f32; 8]);
    if fmt == Format::Iq4Xs {
        let d = h(b, 0);
        let scales_h = u16::from_le_bytes([b[2], b[3]]);
        for (j, d1) in out.0.iter_mut().enumerate() {
            let low = (b[4 + j / 2] >> (4 * (j % 2))) & 15;
            let high = ((scales_h >> (2 * j)) & 3) as u8;
            *d1 = d * f32::from(i16::from(low | (high << 4)) - 32);
        }
        return out;
    }
    let (d, dmin) = (h(b, 0), h(b, 2));
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &b[4..16]);
        (out.0[j], out.1[j]) = (d * sc, dmin * m);
    }
    out
}

/// The eight 6-bit scales then the eight mins of a super-block's twelve
/// scale bytes (ggml's `utmp` shuffle of its x86 Q4_K dot): the values of
/// `scale_min_k4`, all sixteen in a few word operations, for the SIMD
/// levels to widen as a vector.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[inline(always)]
pub(crate) fn scale_bytes(scales: &[u8; 12]) -> [u8; 16] {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let word = |i: usize| u32::from_le_bytes([scales[4 * i], scales[4 * i + 1], scales[4 * i + 2], scales[4 * i + 3]]);
    let (u0, u1, u2) = (word(0), word(1), word(2));
    let sc_lo = u0 & LOW6;
    let sc_hi = (u2 & LOW4) | (((u0 >> 6) & LOW2) << 4);
    let m_lo = u1 & LOW6;
    let m_hi = ((u2 >> 4) & LOW4) | (((u1 >> 6) & LOW2) << 4);
    let mut out = [0u8; 16];
    for (o, w) in out.chunks_exact_mut(4).zip([sc_lo, sc_hi, m_lo, m_hi]) {
        o.copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// A block of rows prepared for a level's block kernel, per thread: its
/// sub-blocks transposed into the level's vectors `W`, and each row's scales
/// (`B` rows a block).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) struct Transposed<W, const B: usize> {
    /// `words[j * 16 + m]`: lane `r` holds values `2m, 2m + 1` of row `r`'s
    /// sub-block `j`, as int16 (Q6_K's `q - 32`).
    pub(crate) words: Vec<W>,
    /// Per group `g` (a sub-block for Q4_K, half of one for Q6_K):
    /// `d1[g][r]` row `r`'s `d * sc_g`, `m1[g][r]` its `dmin * m_g` (Q4_K,
    /// Q2_K; 0 for Q6_K, which has none), both 0 past the block's rows.
    pub(crate) d1: Vec<[f32; B]>,
    pub(crate) m1: Vec<[f32; B]>,
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
impl<W: Copy, const B: usize> Transposed<W, B> {
    pub(crate) const fn new() -> Self {
        Transposed { words: Vec::new(), d1: Vec::new(), m1: Vec::new() }
    }

    /// Bytes the buffers hold, their whole capacity.
    #[cfg(test)]
    pub(crate) fn held_bytes(&self) -> usize {
        use std::mem::size_of;
        self.words.capacity() * size_of::<W>() + (self.d1.capacity() + self.m1.capacity()) * size_of::<[f32; B]>()
    }

    /// Sizes the buffers for rows of `rb` bytes (whole super-blocks of
    /// `fmt`) and fills the scales of the `rows.len() / rb` rows of `rows`.
    pub(crate) fn prepare(&mut self, fmt: Format, rows: &[u8], rb: usize, zero: W) {
        let (sbb, nr) = (fmt.super_bytes(), rows.len() / rb);
        let supers = rb / sbb;
        let groups = supers * 8 * fmt.groups();
        // Exact reservations: the memory plan counts these buffers at
        // their peak (`transposed_peak_bytes`), not at a doubled capacity.
        grow_exact(&mut self.words, supers * 8 * 16, zero);
        grow_exact(&mut self.d1, groups, [0.0; B]);
        grow_exact(&mut self.m1, groups, [0.0; B]);
        for sb in 0..supers {
            for r in 0..B {
                let b = (r < nr).then(|| &rows[r * rb + sb * sbb..][..sbb]);
                match fmt {
                    Format::Q4K | Format::Q5K | Format::Iq4Xs => {
                        let (d1, m1) = b.map_or(([0.0; 8], [0.0; 8]), |b| super_scales(fmt, b));
                        for k in 0..8 {
                            (self.d1[sb * 8 + k][r], self.m1[sb * 8 + k][r]) = (d1[k], m1[k]);
                        }
                    }
                    Format::Q2K | Format::Q3K | Format::Q6K => {
                        let (d1, m1) = b.map_or(([0.0; 16], [0.0; 16]), |b| group_scales(fmt, b));
                        for (g, (d1, m1)) in d1.into_iter().zip(m1).enumerate() {
                            (self.d1[sb * 16 + g][r], self.m1[sb * 16 + g][r]) = (d1, m1);
                        }
                    }
                }
            }
        }
    }
}

/// Bytes a thread's `Transposed` reaches for rows of up to `cols` values,
/// on the widest level (AVX-512: sixteen rows a block, 64-byte vectors):
/// the words, 32 bytes a value, and a scale and a min per group of each
/// row, Q6_K's two groups a sub-block.
pub(crate) fn transposed_peak_bytes(cols: usize) -> usize {
    const VECTOR: usize = 64;
    const ROWS: usize = 16;
    let supers = cols.div_ceil(SUPER);
    let words = supers * 8 * 16 * VECTOR;
    let groups = supers * 8 * 2;
    words + 2 * groups * ROWS * std::mem::size_of::<f32>()
}

/// Bytes this thread's transposed blocks hold, every level's.
#[cfg(test)]
pub(crate) fn held_bytes() -> usize {
    #[cfg(target_arch = "x86_64")]
    return avx2::held_bytes() + avx512::held_bytes();
    #[cfg(not(target_arch = "x86_64"))]
    0
}

/// Grows `v` to at least `len` elements (`fill` in the new ones), the
/// allocation to exactly that; never shrinks it. Callers index the part
/// they need and overwrite it. Shrinking had re-filled the tail each time a
/// thread went from an expert's 768-wide down to its 2048-wide gate and up
/// again: a memset that was 4% of a GGUF prefill.
pub(crate) fn grow_exact<T: Clone>(v: &mut Vec<T>, len: usize, fill: T) {
    if v.len() < len {
        v.reserve_exact(len - v.len());
        v.resize(len, fill);
    }
}

/// A Q6_K super-block's sixteen `d * sc_g` (exact products, as ggml's).
#[inline(always)]
pub(crate) fn q6k_scales(b: &[u8]) -> [f32; 16] {
    let d = h(b, 208);
    std::array::from_fn(|g| d * f32::from(b[192 + g] as i8))
}

/// A Q3_K super-block's sixteen `d * (ls_g - 32)` (exact products, as
/// ggml's `dl`; `dequantize_row_q3_K`'s scale unpacking).
#[inline(always)]
pub(crate) fn q3k_scales(b: &[u8]) -> [f32; 16] {
    let (sc, d) = (&b[96..108], h(b, 108));
    std::array::from_fn(|g| {
        let low4 = if g < 8 { sc[g] & 15 } else { sc[g - 8] >> 4 };
        let high2 = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
        d * f32::from(i16::from(low4 | (high2 << 4)) - 32)
    })
}

/// A Q2_K super-block's sixteen `d * sc_g` and `dmin * m_g` (exact
/// products, ggml's `dl` and `ml`): `sc_g` the low nibble of `scales[g]`,
/// `m_g` the high one.
#[inline(always)]
pub(crate) fn q2k_scales(b: &[u8]) -> ([f32; 16], [f32; 16]) {
    let (d, dmin) = (h(b, 80), h(b, 82));
    (std::array::from_fn(|g| d * f32::from(b[g] & 15)), std::array::from_fn(|g| dmin * f32::from(b[g] >> 4)))
}

/// The sixteen group scales and mins of a Q2_K, Q3_K or Q6_K super-block
/// (`fmt`; the last two have no mins: zeros).
#[inline(always)]
pub(crate) fn group_scales(fmt: Format, b: &[u8]) -> ([f32; 16], [f32; 16]) {
    match fmt {
        Format::Q2K => q2k_scales(b),
        Format::Q3K => (q3k_scales(b), [0.0; 16]),
        _ => (q6k_scales(b), [0.0; 16]),
    }
}

/// Value `i` (0..256) of a Q2_K, Q3_K or Q6_K super-block (`fmt`), the
/// integer its group's scale multiplies.
#[inline(always)]
fn group_value(fmt: Format, b: &[u8], i: usize) -> i32 {
    match fmt {
        Format::Q2K => q2k_value(b, i),
        Format::Q3K => q3k_value(b, i),
        _ => q6k_value(b, i),
    }
}

/// Value `i` (0..256) of a Q2_K super-block, `q` (ggml's
/// `dequantize_row_q2_K` indexing): sub-block `s = i / 32` is bits `2 * (s
/// % 4)` of the 32 `qs` bytes of its half.
#[inline(always)]
fn q2k_value(b: &[u8], i: usize) -> i32 {
    let (s, l) = (i / 32, i % 32);
    i32::from((b[16 + 32 * (s / 4) + l] >> (2 * (s % 4))) & 3)
}

/// Value `i` (0..256) of a Q3_K super-block, `q - 4` (ggml's
/// `dequantize_row_q3_K` indexing): sub-block `s = i / 32` is bits `2 * (s
/// % 4)` of the 32 `qs` bytes of its half, and bit `s` of `hmask[i % 32]`
/// unset takes 4 off.
#[inline(always)]
fn q3k_value(b: &[u8], i: usize) -> i32 {
    let (s, l) = (i / 32, i % 32);
    let q = (b[32 + 32 * (s / 4) + l] >> (2 * (s % 4))) & 3;
    let high = (b[l] >> s) & 1;
    i32::from(q) - if high == 1 { 0 } else { 4 }
}

/// Value `i` (0..256) of a Q6_K super-block, `q - 32` (ggml's
/// `dequantize_row_q6_K` indexing).
#[inline(always)]
fn q6k_value(b: &[u8], i: usize) -> i32 {
    let (half, k, l) = (i / 128, i % 128 / 32, i % 32);
    let ql = b[64 * half + 32 * (k % 2) + l] >> (4 * (k / 2));
    let qh = b[128 + 32 * half + l] >> (2 * k);
    i32::from((ql & 15) | ((qh & 3) << 4)) - 32
}

/// The definition: row `row` (whole super-blocks of `fmt`, as stored)
/// against input `t`.
pub(crate) fn row_scalar(fmt: Format, row: &[u8], inputs: &Int16Inputs, t: usize) -> f32 {
    match fmt {
        Format::Q4K | Format::Q5K | Format::Iq4Xs => row_scalar_q4k(fmt, row, inputs, t),
        Format::Q2K | Format::Q3K | Format::Q6K => row_scalar_groups(fmt, row, inputs, t),
    }
}

/// A Q4_K, Q5_K or IQ4_XS row (`fmt`) against input `t`.
fn row_scalar_q4k(fmt: Format, row: &[u8], inputs: &Int16Inputs, t: usize) -> f32 {
    let cols = inputs.cols;
    let base = t * cols / SUB;
    let mut f = [0f32; LANES];
    for (sb, b) in row.chunks_exact(fmt.super_bytes()).enumerate() {
        let (d1, m1) = super_scales(fmt, b);
        for j in 0..8 {
            let at = base + sb * 8 + j;
            let codes = &inputs.codes[at * SUB..(at + 1) * SUB];
            let mut dot = 0i32;
            for (l, &code) in codes.iter().enumerate() {
                dot += i32::from(q4k_value(fmt, b, j, l)) * i32::from(code);
            }
            let v = d1[j] * dot as f32;
            // Not `mul_add`: MinGW's `fmaf` is not fused (CI under wine).
            let v = fused_mul_add(-m1[j], inputs.sums[at], v);
            let lane = (sb * 8 + j) % LANES;
            f[lane] = fused_mul_add(inputs.scales[at], v, f[lane]);
        }
    }
    reduce_lanes(&f)
}

/// Value `l` of sub-block `j` of a Q4_K, Q5_K or IQ4_XS super-block, the
/// integer ggml's `dequantize_row_q4_K` / `_q5_K` / `_iq4_xs` scales: for
/// Q4_K the nibble of byte `l` of the sub-block pair's 32 (low for even
/// `j`), for Q5_K 16 more where bit `j` of `qh[l]` is set, for IQ4_XS
/// `kvalues_iq4nl` at the low nibble of byte `l` of the sub-block's 16
/// (`l < 16`) or the high nibble of byte `l - 16`.
#[inline(always)]
fn q4k_value(fmt: Format, b: &[u8], j: usize, l: usize) -> i16 {
    if fmt == Format::Iq4Xs {
        let byte = b[8 + 16 * j + l % 16];
        let q = if l < 16 { byte & 15 } else { byte >> 4 };
        return i16::from(IQ4NL_VALUES[usize::from(q)]);
    }
    let (c, high) = (j / 2, j % 2 == 1);
    let qs = if fmt == Format::Q5K { 48 } else { 16 };
    let byte = b[qs + 32 * c + l];
    let q = if high { byte >> 4 } else { byte & 15 };
    i16::from(match fmt {
        Format::Q5K => q | (((b[16 + l] >> j) & 1) << 4),
        _ => q,
    })
}

/// A Q2_K, Q3_K or Q6_K row (`fmt`: groups of 16 values) against input `t`.
fn row_scalar_groups(fmt: Format, row: &[u8], inputs: &Int16Inputs, t: usize) -> f32 {
    let base = t * inputs.cols / SUB;
    let mut f = [0f32; LANES];
    for (sb, b) in row.chunks_exact(fmt.super_bytes()).enumerate() {
        let (d1, m1) = group_scales(fmt, b);
        for (g, (d1, m1)) in d1.iter().zip(m1).enumerate() {
            let at = base + sb * 8 + g / 2;
            let codes = &inputs.codes[at * SUB + 16 * (g % 2)..][..16];
            let dot: i32 = codes.iter().enumerate().map(|(l, &c)| group_value(fmt, b, 16 * g + l) * i32::from(c)).sum();
            let mut v = d1 * dot as f32;
            if fmt.has_mins() {
                v = fused_mul_add(-m1, inputs.half_sums[2 * at + g % 2], v);
            }
            f[g] = fused_mul_add(inputs.scales[at], v, f[g]);
        }
    }
    reduce_lanes(&f)
}

/// Rows of one task: a few tasks a matrix (rayon's cost per task is about
/// a row's work), each row's unpacked window shared by all the inputs.
const TASK_ROWS: usize = 32;
/// From this many inputs a call transposes blocks of sixteen rows (eight
/// on AVX2) once for all of them (`block_products`), below it each row is
/// read as stored for each input.
const BLOCK_MIN_INPUTS: usize = 4;
/// Below this many multiply-adds a call runs on the calling thread.
const PAR_MIN_WORK: usize = 1 << 16;

/// `y[t * rows + r]` = row `r` of the `fmt` matrix `w` (`rows` rows of
/// `cols / 256` super-blocks) against input `t`, at the level in force.
pub(crate) fn products(fmt: Format, w: &[u8], rows: usize, inputs: &Int16Inputs, y: &mut [f32]) {
    products_at(Level::current(), fmt, w, rows, inputs, y)
}

/// `products` at `level`, which must be available.
pub(crate) fn products_at(level: Level, fmt: Format, w: &[u8], rows: usize, inputs: &Int16Inputs, y: &mut [f32]) {
    products_each_at(level, &mut [Product { fmt, w, rows, y }], inputs)
}

/// One matrix of a `products_each` call, and its outputs `[input][row]`.
pub(crate) struct Product<'a> {
    pub(crate) fmt: Format,
    pub(crate) w: &'a [u8],
    pub(crate) rows: usize,
    pub(crate) y: &'a mut [f32],
}

/// `products` of several matrices of the inputs' width against the same
/// inputs (an expert's gate and up), their rows' tasks in one parallel
/// call: each output the bits `products` gives it.
pub(crate) fn products_each(products: &mut [Product], inputs: &Int16Inputs) {
    products_each_at(Level::current(), products, inputs)
}

/// `products_each` at `level`, which must be available.
pub(crate) fn products_each_at(level: Level, products: &mut [Product], inputs: &Int16Inputs) {
    let (cols, n) = (inputs.cols, inputs.inputs());
    assert!(level.available(), "int16 products: level {level:?} not available");
    // (format, rows' bytes, bytes a row, outputs) per matrix, and where
    // each matrix's tasks start among all of them.
    let mut jobs = Vec::with_capacity(products.len());
    let mut starts = Vec::with_capacity(products.len() + 1);
    let (mut tasks, mut work) = (0, 0);
    for p in products.iter_mut() {
        let rb = cols / SUPER * p.fmt.super_bytes();
        assert!(p.w.len() == p.rows * rb && p.y.len() == n * p.rows, "int16 products: inconsistent lengths");
        jobs.push((p.fmt, p.w, rb, Outputs { y: p.y.as_mut_ptr(), rows: p.rows }));
        starts.push(tasks);
        tasks += p.rows.div_ceil(TASK_ROWS);
        work += p.rows * cols * n;
    }
    if n == 0 || tasks == 0 {
        return;
    }
    let task = |k: usize| {
        let m = starts.partition_point(|&s| s <= k) - 1;
        let (fmt, w, rb, out) = jobs[m];
        let r0 = (k - starts[m]) * TASK_ROWS;
        let nr = TASK_ROWS.min(out.rows - r0);
        block_or_rows(level, fmt, &w[r0 * rb..(r0 + nr) * rb], r0, nr, inputs, out);
    };
    if work >= PAR_MIN_WORK && tasks > 1 {
        (0..tasks).into_par_iter().for_each(task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// `y` (`[input][row]`), shared by `products_each_at`'s tasks, each of which
/// writes the outputs of its own rows only; no task buffers a chunk's
/// worth of outputs (the memory plan counts none).
#[derive(Clone, Copy)]
pub(crate) struct Outputs {
    y: *mut f32,
    rows: usize,
}

// SAFETY: the tasks that share it write disjoint elements (their own
// rows), and `y` outlives them (rayon joins before `products_each_at`
// returns).
unsafe impl Send for Outputs {}
// SAFETY: as above.
unsafe impl Sync for Outputs {}

impl Outputs {
    /// Writes the output of row `r` for input `t`.
    ///
    /// # Safety
    /// `t` and `r` index `y`, and row `r` belongs to the caller's task.
    #[inline(always)]
    pub(crate) unsafe fn write(self, t: usize, r: usize, v: f32) {
        // SAFETY: the caller's.
        unsafe { *self.y.add(t * self.rows + r) = v };
    }
}

/// Rows `first..first + nr` (the bytes `w`) against every input, into `out`.
fn block_or_rows(level: Level, fmt: Format, w: &[u8], first: usize, nr: usize, inputs: &Int16Inputs, out: Outputs) {
    let (n, rb) = (inputs.inputs(), w.len() / nr);
    #[cfg(target_arch = "x86_64")]
    if level != Level::Scalar && n >= BLOCK_MIN_INPUTS {
        let block = if level == Level::Avx512Vnni { LANES } else { avx2::BLOCK_ROWS };
        for (b, rows) in w.chunks(block * rb).enumerate() {
            let (r0, nb) = (first + b * block, rows.len() / rb);
            // SAFETY: the level is available (checked by `products_each_at`);
            // whole rows of the inputs' width, rows r0..r0 + nb of the
            // caller's task.
            unsafe {
                if level == Level::Avx512Vnni {
                    avx512::block_products(fmt, rows, nb, inputs, out, r0)
                } else {
                    avx2::block_products(fmt, rows, nb, inputs, out, r0)
                }
            }
        }
        return;
    }
    let mut row_out = vec![0f32; n];
    for (i, row) in w.chunks_exact(rb).enumerate() {
        row_products(level, fmt, row, inputs, &mut row_out);
        for (t, &v) in row_out.iter().enumerate() {
            // SAFETY: t < n, and row first + i is the caller's.
            unsafe { out.write(t, first + i, v) };
        }
    }
}

/// `out[t]` = `row` against input `t`, for every input.
fn row_products(level: Level, fmt: Format, row: &[u8], inputs: &Int16Inputs, out: &mut [f32]) {
    match level {
        Level::Scalar => {
            for (t, o) in out.iter_mut().enumerate() {
                *o = row_scalar(fmt, row, inputs, t);
            }
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 and FMA are available (checked by `products_each_at`);
        // the row is whole super-blocks of the inputs' width.
        Level::Avx2 => unsafe { avx2::row_products(fmt, row, inputs, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512 F/BW/VNNI are available (as above).
        Level::Avx512Vnni => unsafe { avx512::row_products(fmt, row, inputs, out) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("int16 products: {level:?} on this architecture"),
    }
}
