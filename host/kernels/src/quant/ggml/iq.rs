//! The twins of ggml's IQ blocks (`dequantize_row_iq*` of ggml-quants.c).
//! Each groups 8 (or 4) weights into one entry of a fixed lattice grid
//! (grids.rs) with 7 or 8 sign bits, under per-32 (or per-16) scales.
//!
//! ggml forms each value as `db * grid * sign` (IQ1: `dl * (grid +
//! delta)`); every one of those products is exact in f32 (module docs of
//! `ggml`), so the order below matches ggml's where it matters: the IQ1
//! sum `grid + delta` is formed first, as ggml does.

use super::blocks::h;
use super::grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};

/// `kvalues_iq4nl`: the 16 levels of IQ4_NL / IQ4_XS.
pub(crate) const IQ4NL_VALUES: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// `IQ1S_DELTA` / `IQ1M_DELTA`.
const IQ1_DELTA: f32 = 0.125;

/// `ksigns_iq2xs`: 7 stored sign bits, the 8th making the count even.
const KSIGNS: [u8; 128] = {
    let mut t = [0u8; 128];
    let mut i = 0;
    while i < 128 {
        t[i] = i as u8 | if (i as u8).count_ones() % 2 == 1 { 0x80 } else { 0 };
        i += 1;
    }
    t
};

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn sign(bits: u8, j: usize) -> f32 {
    if bits & (1 << j) != 0 {
        -1.0
    } else {
        1.0
    }
}

/// How a decoder writes 8 values: the portable loops (the definition) or
/// AVX2 lanes (avx2.rs), which form the same products in the same order.
pub(super) trait Lanes {
    /// The f16 at byte `at` of `b`, as f32.
    fn half(b: &[u8], at: usize) -> f32;
    /// An f16 from its bits, as f32.
    fn half_bits(bits: u16) -> f32;
    /// `y[j] = db * entry byte j * (sign bit j ? -1 : 1)`, j < 8.
    fn grid8(y: &mut [f32], db: f32, entry: u64, signs: u8);
    /// The same for two 4-wide entries: `first`'s values, then `second`'s,
    /// under sign bits 0..4 and 4..8.
    fn grid4x2(y: &mut [f32], db: f32, first: u32, second: u32, signs: u8);
    /// IQ1: `y[j] = dl * (int8 entry byte j + delta)`, j < 8.
    fn iq1(y: &mut [f32], dl: f32, entry: u64, delta: f32);
}

pub(super) struct Portable;

impl Lanes for Portable {
    #[inline(always)]
    fn half(b: &[u8], at: usize) -> f32 {
        h(b, at)
    }

    #[inline(always)]
    fn half_bits(bits: u16) -> f32 {
        half::f16::from_bits(bits).to_f32()
    }

    #[inline(always)]
    fn grid8(y: &mut [f32], db: f32, entry: u64, signs: u8) {
        for (j, v) in y[..8].iter_mut().enumerate() {
            *v = db * f32::from((entry >> (8 * j)) as u8) * sign(signs, j);
        }
    }

    #[inline(always)]
    fn grid4x2(y: &mut [f32], db: f32, first: u32, second: u32, signs: u8) {
        let entry = u64::from(first) | u64::from(second) << 32;
        Self::grid8(y, db, entry, signs);
    }

    #[inline(always)]
    fn iq1(y: &mut [f32], dl: f32, entry: u64, delta: f32) {
        for (j, v) in y[..8].iter_mut().enumerate() {
            *v = dl * (f32::from((entry >> (8 * j)) as u8 as i8) + delta);
        }
    }
}

/// `block_iq2_xxs`: d, then per 32 values two u32: four 8-bit grid
/// indices; four 7-bit sign indices and a 4-bit scale.
#[inline(always)]
pub(super) fn iq2_xxs<L: Lanes>(b: &[u8], y: &mut [f32]) {
    let d = L::half(b, 0);
    for ib in 0..8 {
        let (grid, rest) = (u32_at(b, 2 + 8 * ib), u32_at(b, 6 + 8 * ib));
        let db = d * (0.5 + (rest >> 28) as f32) * 0.25;
        for l in 0..4 {
            let entry = IQ2XXS_GRID[((grid >> (8 * l)) & 255) as usize];
            let signs = KSIGNS[((rest >> (7 * l)) & 127) as usize];
            L::grid8(&mut y[32 * ib + 8 * l..], db, entry, signs);
        }
    }
}

/// `block_iq2_xs`: d, 32 u16 (9-bit grid index, 7-bit sign index), then a
/// 4-bit scale per 16 values.
#[inline(always)]
pub(super) fn iq2_xs<L: Lanes>(b: &[u8], y: &mut [f32]) {
    let d = L::half(b, 0);
    let scales = &b[66..74];
    for ib in 0..8 {
        let db = [d * (0.5 + f32::from(scales[ib] & 15)) * 0.25, d * (0.5 + f32::from(scales[ib] >> 4)) * 0.25];
        for l in 0..4 {
            let q = u16_at(b, 2 + 2 * (4 * ib + l));
            let entry = IQ2XS_GRID[usize::from(q & 511)];
            L::grid8(&mut y[32 * ib + 8 * l..], db[l / 2], entry, KSIGNS[usize::from(q >> 9)]);
        }
    }
}

/// `block_iq2_s`: d, 32 low index bytes, 32 sign bytes, 8 bytes of 2-bit
/// index tops, a 4-bit scale per 16 values.
#[inline(always)]
pub(super) fn iq2_s<L: Lanes>(b: &[u8], y: &mut [f32]) {
    let d = L::half(b, 0);
    let (qs, signs, qh, scales) = (&b[2..34], &b[34..66], &b[66..74], &b[74..82]);
    for ib in 0..8 {
        let db = [d * (0.5 + f32::from(scales[ib] & 15)) * 0.25, d * (0.5 + f32::from(scales[ib] >> 4)) * 0.25];
        for l in 0..4 {
            let top = (usize::from(qh[ib]) << (8 - 2 * l)) & 0x300;
            let entry = IQ2S_GRID[usize::from(qs[4 * ib + l]) | top];
            L::grid8(&mut y[32 * ib + 8 * l..], db[l / 2], entry, signs[4 * ib + l]);
        }
    }
}

/// `block_iq3_xxs`: d, 64 grid indices (4 values each), then per 32 values
/// a u32 of four 7-bit sign indices and a 4-bit scale.
#[inline(always)]
pub(super) fn iq3_xxs<L: Lanes>(b: &[u8], y: &mut [f32]) {
    let d = L::half(b, 0);
    let qs = &b[2..66];
    for ib in 0..8 {
        let aux = u32_at(b, 66 + 4 * ib);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        for l in 0..4 {
            let signs = KSIGNS[((aux >> (7 * l)) & 127) as usize];
            let (first, second) = (qs[8 * ib + 2 * l], qs[8 * ib + 2 * l + 1]);
            let (first, second) = (IQ3XXS_GRID[usize::from(first)], IQ3XXS_GRID[usize::from(second)]);
            L::grid4x2(&mut y[32 * ib + 8 * l..], db, first, second, signs);
        }
    }
}

/// `block_iq3_s`: d, 64 low index bytes, 8 bytes of index top bits, 32
/// sign bytes, a 4-bit scale per 32 values (`db = d * (1 + 2 * scale)`).
#[inline(always)]
pub(super) fn iq3_s<L: Lanes>(b: &[u8], y: &mut [f32]) {
    let d = L::half(b, 0);
    let (qs, qh, signs, scales) = (&b[2..66], &b[66..74], &b[74..106], &b[106..110]);
    for ib in 0..8 {
        let scale = if ib % 2 == 0 { scales[ib / 2] & 15 } else { scales[ib / 2] >> 4 };
        let db = d * f32::from(1 + 2 * scale);
        for l in 0..4 {
            let top1 = (usize::from(qh[ib]) << (8 - 2 * l)) & 256;
            let top2 = (usize::from(qh[ib]) << (7 - 2 * l)) & 256;
            let first = IQ3S_GRID[usize::from(qs[8 * ib + 2 * l]) | top1];
            let second = IQ3S_GRID[usize::from(qs[8 * ib + 2 * l + 1]) | top2];
            L::grid4x2(&mut y[32 * ib + 8 * l..], db, first, second, signs[4 * ib + l]);
        }
    }
}

/// `block_iq1_s`: d, 32 low index bytes, then per 32 values a u16 of four
/// 3-bit index tops, a 3-bit scale and the delta's sign.
#[inline(always)]
pub(super) fn iq1_s<L: Lanes>(b: &[u8], y: &mut [f32]) {
    let d = L::half(b, 0);
    let qs = &b[2..34];
    for ib in 0..8 {
        let qh = u16_at(b, 34 + 2 * ib);
        let dl = d * f32::from(2 * ((qh >> 12) & 7) + 1);
        let delta = if qh & 0x8000 != 0 { -IQ1_DELTA } else { IQ1_DELTA };
        for l in 0..4 {
            let index = usize::from(qs[4 * ib + l]) | (usize::from((qh >> (3 * l)) & 7) << 8);
            L::iq1(&mut y[32 * ib + 8 * l..], dl, IQ1S_GRID[index], delta);
        }
    }
}

/// `block_iq1_m`: 32 low index bytes, 16 bytes of (3-bit index top,
/// delta sign) nibbles, four u16 of 3-bit scales whose top nibbles are
/// the block's f16 scale.
#[inline(always)]
pub(super) fn iq1_m<L: Lanes>(b: &[u8], y: &mut [f32]) {
    let (qs, qh) = (&b[0..32], &b[32..48]);
    let sc = [u16_at(b, 48), u16_at(b, 50), u16_at(b, 52), u16_at(b, 54)];
    let bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
    let d = L::half_bits(bits);
    for ib in 0..8 {
        let s = sc[ib / 2] >> (6 * (ib % 2));
        let dl = [d * f32::from(2 * (s & 7) + 1), d * f32::from(2 * ((s >> 3) & 7) + 1)];
        for l in 0..4 {
            let nibble = qh[2 * ib + l / 2] >> (4 * (l % 2));
            let index = usize::from(qs[4 * ib + l]) | (usize::from(nibble & 7) << 8);
            let delta = if nibble & 8 != 0 { -IQ1_DELTA } else { IQ1_DELTA };
            L::iq1(&mut y[32 * ib + 8 * l..], dl[l / 2], IQ1S_GRID[index], delta);
        }
    }
}

/// `block_iq4_nl`: d, 16 bytes of two 4-bit indices into `kvalues_iq4nl`
/// (low nibbles the first 16 values, high the last 16).
pub(super) fn iq4_nl(b: &[u8], y: &mut [f32]) {
    let d = h(b, 0);
    for j in 0..16 {
        y[j] = d * f32::from(IQ4NL_VALUES[usize::from(b[2 + j] & 15)]);
        y[j + 16] = d * f32::from(IQ4NL_VALUES[usize::from(b[2 + j] >> 4)]);
    }
}

/// `block_iq4_xs`: d, a u16 of 2-bit scale tops, 4 bytes of 4-bit scale
/// bottoms, then IQ4_NL's nibbles per 32 values under `d * (scale - 32)`.
pub(super) fn iq4_xs(b: &[u8], y: &mut [f32]) {
    let d = h(b, 0);
    let scales_h = u16_at(b, 2);
    let (scales_l, qs) = (&b[4..8], &b[8..136]);
    for ib in 0..8 {
        let low = (scales_l[ib / 2] >> (4 * (ib % 2))) & 15;
        let high = ((scales_h >> (2 * ib)) & 3) as u8;
        let dl = d * f32::from(i16::from(low | (high << 4)) - 32);
        let (q, out) = (&qs[16 * ib..16 * ib + 16], &mut y[32 * ib..32 * ib + 32]);
        for j in 0..16 {
            out[j] = dl * f32::from(IQ4NL_VALUES[usize::from(q[j] & 15)]);
            out[j + 16] = dl * f32::from(IQ4NL_VALUES[usize::from(q[j] >> 4)]);
        }
    }
}
