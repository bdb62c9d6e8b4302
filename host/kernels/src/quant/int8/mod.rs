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
//! The definition all levels compute bit for bit (`dot_rows_scalar` is the
//! reference):
//!
//! - An input's group `g` of values `x` (padded with zeros to `GROUP`):
//!   `amax = max |x|`, scale `a = amax / 127`, codes
//!   `c = round_ties_even(x * (127 / amax))` (0 where `amax == 0`).
//!   Codes are kept in the weights' byte order: byte `i` of a q4 row packs
//!   columns `2i` (low nibble) and `2i + 1`, so the even columns come
//!   first, then the odd ones.
//! - A weight group of 128 stored positions as unsigned bytes `u`: the
//!   nibbles, low ones first (each the signed weight plus 8).
//! - Sixteen int32 lanes: lane `l` sums `u[j] * c[j]` over
//!   `j in 4l..4l+4` and `64+4l..64+4l+4`, minus 8 times the lane's code
//!   sum: exact integers, so any instruction sequence that forms them
//!   agrees.
//! - Sixteen f32 lanes: `f[l] = fma(w_scale * a, lane_l as f32, f[l])`
//!   over the groups in order, then the fixed tree
//!   `((f[i] + f[i+8]) + (.. + f[i+4])) ..` down to one value.

use super::simd::{f16_at, fused_mul_add};
use super::GROUP;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

/// The int32 / f32 lanes of the definition above.
pub(crate) const LANES: usize = 16;

/// What a q4 weight's unsigned nibble adds to its signed code.
const NIBBLE_OFFSET: i32 = 8;

/// Inputs quantised to int8 per group, for the q4 rows of one width.
pub(crate) struct Int8Inputs {
    cols: usize,
    groups: usize,
    /// `[input][group][GROUP]` codes, in the q4 bytes' order.
    codes: Vec<i8>,
    /// `[input][group][LANES]`: minus 8 times each lane's codes.
    init: Vec<i32>,
    /// `[input][group]` scales.
    scales: Vec<f32>,
}

/// Bytes `Int8Inputs` holds for `inputs` inputs of `cols` values: codes,
/// lane offsets and a scale per group (1.53 bytes a value).
pub fn int8_input_bytes(inputs: usize, cols: usize) -> usize {
    inputs * cols.div_ceil(GROUP) * (GROUP + 4 * LANES + 4)
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
            init: vec![0; n * groups * LANES],
            scales: vec![0.0; n * groups],
        };
        let mut column = [0i8; GROUP];
        let mut stored = [0i8; GROUP];
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
                for (i, pair) in column.chunks_exact(2).enumerate() {
                    stored[i] = pair[0];
                    stored[GROUP / 2 + i] = pair[1];
                }
                let at = t * groups + g;
                me.scales[at] = amax / 127.0;
                me.codes[at * GROUP..(at + 1) * GROUP].copy_from_slice(&stored);
                for (l, init) in me.init[at * LANES..(at + 1) * LANES].iter_mut().enumerate() {
                    let lane: i32 =
                        (0..4).map(|k| stored[4 * l + k] as i32 + stored[GROUP / 2 + 4 * l + k] as i32).sum();
                    *init = -NIBBLE_OFFSET * lane;
                }
            }
        }
        me
    }

    pub(crate) fn inputs(&self) -> usize {
        self.scales.len() / self.groups.max(1)
    }
}

/// One q4 row's bytes and group scales.
#[derive(Clone, Copy)]
pub(crate) struct Row<'a> {
    /// `2 * groups` bytes of f16 scales.
    pub scales: &'a [u8],
    /// `cols.div_ceil(2)` bytes, low nibble first.
    pub q: &'a [u8],
}

/// Group `g` of a row as 128 unsigned bytes in stored order (zeros past
/// the row's end; their codes are zero too).
fn unsigned_group(row: Row<'_>, g: usize) -> [u8; GROUP] {
    let mut u = [0u8; GROUP];
    for (j, &b) in row.q.iter().skip(g * GROUP / 2).take(GROUP / 2).enumerate() {
        u[j] = b & 0x0F;
        u[GROUP / 2 + j] = b >> 4;
    }
    u
}

/// The fixed lane tree of the definition.
#[inline]
pub(crate) fn reduce_lanes(f: &[f32; LANES]) -> f32 {
    let mut h = *f;
    let mut width = LANES / 2;
    while width >= 1 {
        for i in 0..width {
            h[i] += h[i + width];
        }
        width /= 2;
    }
    h[0]
}

/// `out[i]` = the row dotted with input `first + i`: the reference of
/// every level.
pub(crate) fn dot_rows_scalar(row: Row<'_>, inputs: &Int8Inputs, first: usize, out: &mut [f32]) {
    let groups = inputs.groups;
    for (i, o) in out.iter_mut().enumerate() {
        let t = first + i;
        let mut f = [0f32; LANES];
        for g in 0..groups {
            let u = unsigned_group(row, g);
            let at = t * groups + g;
            let c = &inputs.codes[at * GROUP..(at + 1) * GROUP];
            let s = f16_at(row.scales, g) * inputs.scales[at];
            for (l, fl) in f.iter_mut().enumerate() {
                let mut lane = inputs.init[at * LANES + l];
                for j in (4 * l..4 * l + 4).chain(GROUP / 2 + 4 * l..GROUP / 2 + 4 * l + 4) {
                    lane += u[j] as i32 * c[j] as i32;
                }
                // Not `mul_add`: MinGW's `fmaf` is not fused (CI under wine).
                *fl = fused_mul_add(s, lane as f32, *fl);
            }
        }
        *o = reduce_lanes(&f);
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

/// `out[i]` = the row dotted with input `first + i`, at `level` (which
/// must be available).
pub(crate) fn dot_rows_at(level: Level, row: Row<'_>, inputs: &Int8Inputs, first: usize, out: &mut [f32]) {
    let groups = inputs.groups;
    assert!(
        row.scales.len() == 2 * groups
            && row.q.len() == inputs.cols.div_ceil(2)
            && first + out.len() <= inputs.inputs(),
        "int8 dot: inconsistent lengths"
    );
    assert!(level.available(), "int8 dot: level {level:?} not available");
    match level {
        Level::Scalar => dot_rows_scalar(row, inputs, first, out),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 and FMA are available (checked above); lengths checked above.
        Level::Avx2 => unsafe { avx2::dot_rows(row, inputs, first, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512 F/BW/VNNI are available (checked above); lengths checked above.
        Level::Avx512Vnni => unsafe { avx512::dot_rows(row, inputs, first, out) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("no x86 levels here"),
    }
}

/// `dot_rows_at` at the level in force.
#[inline]
pub(crate) fn dot_rows(row: Row<'_>, inputs: &Int8Inputs, first: usize, out: &mut [f32]) {
    dot_rows_at(Level::current(), row, inputs, first, out)
}

/// Bytes of a q4 group.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const GROUP_BYTES: usize = GROUP / 2;

/// Group `g` of a row's bytes, padded with zeros to a whole group when the
/// row ends inside it: the SIMD levels read whole groups.
#[inline]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn padded_group<'a>(q: &'a [u8], g: usize, buf: &'a mut [u8; GROUP_BYTES]) -> &'a [u8; GROUP_BYTES] {
    let start = g * GROUP_BYTES;
    match q.get(start..start + GROUP_BYTES) {
        Some(whole) => whole.try_into().expect("a whole group"),
        None => {
            buf.fill(0);
            let tail = &q[start..];
            buf[..tail.len()].copy_from_slice(tail);
            buf
        }
    }
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
            *o = q.codes[at * GROUP + j / 2 + (j % 2) * (GROUP / 2)] as f32 * q.scales[at];
        }
    }
    out
}

#[cfg(test)]
mod tests;
