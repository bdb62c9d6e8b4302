//! Integer products for the q4 group format: each input quantised to int8
//! per group of `GROUP` values (one f32 scale a group), each group of a row
//! dotted in int32, exact, and the groups summed in f32. This is the
//! arithmetic of every q4 matrix product, decode and prefill alike (one
//! definition, so a prompt's logits do not depend on how it is split into
//! chunks, and the prefix cache stays bit-identical to evaluating the whole
//! prompt), as llama.cpp's `Q8_0`/`Q8_K` activations are for its quantised
//! weights. The input's rounding (about 0.6% of a Gaussian input's size)
//! is small beside the q4 weights' (10%): a q4 expert's output moves from
//! 0.1691 to 0.1692 relative error. q8 matrices keep f32 products: there
//! the input's rounding would nearly double the output's error (0.010 ->
//! 0.019; docs/PERFORMANCE.md). f32 and GGUF matrices keep theirs.
//!
//! The definition all levels compute bit for bit (`dot_block_scalar` is the
//! reference):
//!
//! - An input's group `g` of values `x` (padded with zeros to `GROUP`):
//!   `amax = max |x|`, scale `a = amax / 127`, codes
//!   `c = round_ties_even(x * (127 / amax))` (0 where `amax == 0`).
//!   Codes are kept in the weights' byte order: byte `i` of a q4 row packs
//!   columns `2i` (low nibble) and `2i + 1`, so the even columns come
//!   first, then the odd ones.
//! - A weight group's dot with an input group: `sum (nibble - 8) * c` over
//!   its 128 columns, an exact integer (at most 8 * 127 * 128 in size, so
//!   exact in f32 too): any instruction sequence that forms it agrees.
//! - The row's product: `f = fma(w_scale * a, dot as f32, f)` over the
//!   groups in order, from `f = 0`.
//!
//! The SIMD levels compute sixteen rows at once: a group of sixteen rows
//! is interleaved into a 1 KB tile whose vector `k` holds bytes `4k..4k+4`
//! of every row's group (`interleave`), so one `vpdpbusd` against four
//! codes broadcast adds eight columns into each row's int32 lane, and the
//! tile is shared by every input of the call. The row-per-vector form this
//! replaced spent five instructions per input and group beside its two
//! products, converting sixteen partial lanes per row; here one conversion
//! and one FMA serve sixteen rows and thirty-two products.

use super::simd::{f16_at, fused_mul_add};
use super::GROUP;

/// The SIMD levels' loop over a call's inputs for group `$g`: tiles of
/// `$tile` inputs through `$group_tile::<$tile>`, the remainder one at a
/// time through `$group_tile::<1>`, each adding the group to `$out`'s rows.
/// A macro, not a function taking a closure, so the loop is expanded
/// inside each level's `#[target_feature]` function.
#[cfg(target_arch = "x86_64")]
macro_rules! for_input_tiles {
    ($out:expr, $first:expr, $tile:ident, |$t:ident, $o:ident| $group_tile:ident($($arg:expr),*)) => {{
        let mut $t = $first;
        for chunk in $out.chunks_mut($tile) {
            if let Ok($o) = <&mut [[f32; BLOCK_ROWS]; $tile]>::try_from(&mut *chunk) {
                $group_tile::<$tile>($($arg),*);
            } else {
                for (i, v) in chunk.iter_mut().enumerate() {
                    let ($t, $o) = ($t + i, std::array::from_mut(v));
                    $group_tile::<1>($($arg),*);
                }
            }
            $t += chunk.len();
        }
    }};
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;

/// Rows a block: one int32 / f32 lane each in a 512-bit vector.
pub(crate) const BLOCK_ROWS: usize = 16;

/// Bytes of a q4 group.
pub(crate) const GROUP_BYTES: usize = GROUP / 2;

/// Four-byte words of a q4 group.
#[cfg(target_arch = "x86_64")]
const GROUP_WORDS: usize = GROUP_BYTES / 4;

/// What a q4 weight's unsigned nibble adds to its signed code.
const NIBBLE_OFFSET: i32 = 8;

/// Inputs quantised to int8 per group, for the q4 rows of one width.
pub(crate) struct Int8Inputs {
    cols: usize,
    groups: usize,
    /// `[input][group][GROUP]` codes, in the q4 bytes' order.
    codes: Vec<i8>,
    /// `[input][group]`: minus 8 times the group's code sum.
    init: Vec<i32>,
    /// `[input][group]` scales.
    scales: Vec<f32>,
}

/// Bytes `Int8Inputs` holds for `inputs` inputs of `cols` values: codes,
/// the code sum and a scale per group (1.06 bytes a value).
pub fn int8_input_bytes(inputs: usize, cols: usize) -> usize {
    inputs * cols.div_ceil(GROUP) * (GROUP + 4 + 4)
}

/// Rounds to the nearest integer, ties to even, for `|v| <= 2^22`: the
/// sum's rounding does it, in the default rounding mode that every level
/// (and `_mm*_cvtps_epi32`) uses.
#[inline]
fn round_even(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
    (v + MAGIC) - MAGIC
}

impl Int8Inputs {
    /// Quantises the `x.len() / cols` inputs of `x` (`[n, cols]`).
    pub(crate) fn new(x: &[f32], cols: usize) -> Self {
        assert!(cols > 0 && x.len().is_multiple_of(cols), "Int8Inputs: inputs are not whole rows");
        let n = x.len() / cols;
        let groups = cols.div_ceil(GROUP);
        let mut me = Int8Inputs {
            cols,
            groups,
            codes: vec![0; n * groups * GROUP],
            init: vec![0; n * groups],
            scales: vec![0.0; n * groups],
        };
        let mut column = [0i8; GROUP];
        for (t, xt) in x.chunks_exact(cols).enumerate() {
            for (g, xg) in xt.chunks(GROUP).enumerate() {
                // Max is exact in any order; eight lanes let it vectorise.
                let mut m = [0f32; 8];
                for c in xg.chunks(8) {
                    for (mk, v) in m.iter_mut().zip(c) {
                        let a = v.abs();
                        *mk = if a > *mk { a } else { *mk };
                    }
                }
                let amax = m.iter().fold(0f32, |a, &b| if b > a { b } else { a });
                let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
                column.fill(0);
                for (c, &v) in column.iter_mut().zip(xg) {
                    *c = round_even((v * inv).clamp(-127.0, 127.0)) as i8;
                }
                let at = t * groups + g;
                let stored = &mut me.codes[at * GROUP..(at + 1) * GROUP];
                for (i, pair) in column.chunks_exact(2).enumerate() {
                    stored[i] = pair[0];
                    stored[GROUP_BYTES + i] = pair[1];
                }
                me.scales[at] = amax / 127.0;
                me.init[at] = -NIBBLE_OFFSET * column.iter().map(|&c| c as i32).sum::<i32>();
            }
        }
        me
    }

    pub(crate) fn inputs(&self) -> usize {
        self.scales.len() / self.groups.max(1)
    }
}

/// Up to `BLOCK_ROWS` consecutive rows of a q4 matrix.
#[derive(Clone, Copy)]
pub(crate) struct Block<'a> {
    pub rows: usize,
    /// `rows * 2 * groups` bytes of f16 scales, row-major.
    pub scales: &'a [u8],
    /// `rows * cols.div_ceil(2)` bytes, each row low nibble first.
    pub q: &'a [u8],
}

/// Group `g` of a block's rows interleaved: `words[k][j]` is bytes
/// `4k..4k+4` of row `j`'s group (zeros past the row's end and for rows
/// the block lacks, whose scales are zero too).
#[cfg(target_arch = "x86_64")]
#[repr(C, align(64))]
pub(crate) struct Tile {
    pub words: [[u32; BLOCK_ROWS]; GROUP_WORDS],
    pub scales: [f32; BLOCK_ROWS],
}

#[cfg(target_arch = "x86_64")]
impl Tile {
    pub(crate) fn new() -> Self {
        Tile { words: [[0; BLOCK_ROWS]; GROUP_WORDS], scales: [0.0; BLOCK_ROWS] }
    }
}

/// Fills `tile` with group `g` of `block` (a matrix of `cols` columns).
#[cfg(target_arch = "x86_64")]
pub(crate) fn interleave(block: Block<'_>, cols: usize, g: usize, tile: &mut Tile) {
    let rb = cols.div_ceil(2);
    let start = g * GROUP_BYTES;
    tile_scales(block, cols, g, &mut tile.scales);
    for j in 0..BLOCK_ROWS {
        let mut padded = [0u8; GROUP_BYTES];
        if j < block.rows {
            let row = &block.q[j * rb..(j + 1) * rb];
            let end = rb.min(start + GROUP_BYTES);
            padded[..end - start].copy_from_slice(&row[start..end]);
        }
        for (k, w) in tile.words.iter_mut().enumerate() {
            w[j] = u32::from_le_bytes(padded[4 * k..4 * k + 4].try_into().expect("four bytes"));
        }
    }
}

/// Prefetches part `g` of `groups` of the bytes after the block (`rb`
/// bytes a row), in address order, into L2: the next block of the same
/// matrix, which the thread most likely computes next. A block reads its
/// sixteen rows as sixteen short streams, a group at a time, which the
/// hardware prefetcher follows late: decode (one input, the weights from
/// DRAM) ran at 0.65x the old row-at-a-time walk without this (kl16). Into L1
/// instead, the next block (16-18 KB at these widths) evicts the one being
/// computed: 0.92x. Past the matrix's end this is a hint about other
/// memory, or about none: prefetches read nothing and never fault.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_next_block(q: *const u8, rb: usize, g: usize, groups: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
    const LINE: usize = 64;
    let len = BLOCK_ROWS * rb;
    let (from, to) = (len * g / groups, len * (g + 1) / groups);
    for off in (from..to).step_by(LINE) {
        // SAFETY: a prefetch is a hint; it reads nothing and cannot fault.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(q.wrapping_add(len + off) as *const i8) };
    }
}

/// A block's scales of group `g`, one a row, zero for rows the
/// block lacks.
#[cfg(target_arch = "x86_64")]
pub(crate) fn tile_scales(block: Block<'_>, cols: usize, g: usize, scales: &mut [f32; BLOCK_ROWS]) {
    let g2 = 2 * cols.div_ceil(GROUP);
    for (j, s) in scales.iter_mut().enumerate() {
        *s = if j < block.rows { f16_at(&block.scales[j * g2..(j + 1) * g2], g) } else { 0.0 };
    }
}

/// `out[i][j]` = row `j` of the block dotted with input `first + i` (0
/// for rows the block lacks): the reference of every level.
pub(crate) fn dot_block_scalar(block: Block<'_>, inputs: &Int8Inputs, first: usize, out: &mut [[f32; BLOCK_ROWS]]) {
    let (cols, groups) = (inputs.cols, inputs.groups);
    let rb = cols.div_ceil(2);
    for (i, o) in out.iter_mut().enumerate() {
        let t = first + i;
        for (j, oj) in o.iter_mut().enumerate() {
            if j >= block.rows {
                *oj = 0.0;
                continue;
            }
            let scales = &block.scales[j * 2 * groups..(j + 1) * 2 * groups];
            let q = &block.q[j * rb..(j + 1) * rb];
            let mut f = 0f32;
            for g in 0..groups {
                let at = t * groups + g;
                let c = &inputs.codes[at * GROUP..(at + 1) * GROUP];
                let mut dot = inputs.init[at];
                for (b, &byte) in q.iter().skip(g * GROUP_BYTES).take(GROUP_BYTES).enumerate() {
                    dot += (byte & 0x0F) as i32 * c[b] as i32 + (byte >> 4) as i32 * c[GROUP_BYTES + b] as i32;
                }
                // Not `mul_add`: MinGW's `fmaf` is not fused (CI under wine).
                f = fused_mul_add(f16_at(scales, g) * inputs.scales[at], dot as f32, f);
            }
            *oj = f;
        }
    }
}

/// The kernel levels, for the tests that hold each to the scalar twin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    Scalar,
    /// x86-64 AVX2 (`maddubs`).
    Avx2,
    /// x86-64 AVX-512 VNNI (`vpdpbusd`).
    Avx512Vnni,
}

impl Level {
    /// Whether this CPU can run the level (independent of `force_isa`).
    pub(crate) fn available(self) -> bool {
        match self {
            Level::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => super::simd::isa_available(super::simd::Isa::Avx2),
            #[cfg(target_arch = "x86_64")]
            Level::Avx512Vnni => avx512::detected(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The level in force: the best this CPU has, unless `force_isa` chose
    /// a lower level than the CPU's best (then that level's: AVX2 or the
    /// scalar twin).
    pub(crate) fn current() -> Level {
        use super::simd::{isa, isa_available, Isa};
        let level = isa();
        if level < Isa::Avx2 || level == Isa::Neon {
            return Level::Scalar;
        }
        let forced_lower = level == Isa::Avx2 && isa_available(Isa::Avx512);
        if !forced_lower && Level::Avx512Vnni.available() {
            Level::Avx512Vnni
        } else {
            Level::Avx2
        }
    }
}

/// `out[i][j]` = row `j` of the block dotted with input `first + i` (0 for
/// rows the block lacks), at `level` (which must be available).
pub(crate) fn dot_block_at(
    level: Level,
    block: Block<'_>,
    inputs: &Int8Inputs,
    first: usize,
    out: &mut [[f32; BLOCK_ROWS]],
) {
    let (cols, groups) = (inputs.cols, inputs.groups);
    assert!(
        block.rows <= BLOCK_ROWS
            && block.scales.len() == block.rows * 2 * groups
            && block.q.len() == block.rows * cols.div_ceil(2)
            && first + out.len() <= inputs.inputs(),
        "int8 dot: inconsistent lengths"
    );
    assert!(level.available(), "int8 dot: level {level:?} not available");
    match level {
        Level::Scalar => dot_block_scalar(block, inputs, first, out),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 and FMA are available (checked above); lengths checked above.
        Level::Avx2 => unsafe { avx2::dot_block(block, inputs, first, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512 F/BW/VNNI are available (checked above); lengths checked above.
        Level::Avx512Vnni => unsafe { avx512::dot_block(block, inputs, first, out) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("no x86 levels here"),
    }
}

/// `dot_block_at` at the level in force.
#[inline]
pub(crate) fn dot_block(block: Block<'_>, inputs: &Int8Inputs, first: usize, out: &mut [[f32; BLOCK_ROWS]]) {
    dot_block_at(Level::current(), block, inputs, first, out)
}

/// The inputs as the integer products see them: each value its code times
/// its group's scale (the f32 references of the tests).
#[cfg(test)]
pub(crate) fn rounded(x: &[f32], cols: usize) -> Vec<f32> {
    let q = Int8Inputs::new(x, cols);
    let mut out = vec![0f32; x.len()];
    for (t, ot) in out.chunks_exact_mut(cols).enumerate() {
        for (col, o) in ot.iter_mut().enumerate() {
            let (g, j) = (col / GROUP, col % GROUP);
            let at = t * q.groups + g;
            *o = q.codes[at * GROUP + j / 2 + (j % 2) * GROUP_BYTES] as f32 * q.scales[at];
        }
    }
    out
}

#[cfg(test)]
mod tests;
