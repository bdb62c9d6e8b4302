//! The integer block products on AVX2: `maddubs` of a tile vector (four
//! bytes of each of eight rows) against four codes broadcast, then `madd`
//! by ones, adds eight columns into every row's int32 lane; sixteen rows
//! are two vectors. Nibbles (0..15) times codes (-127..127) cannot
//! saturate `maddubs`'s int16 pairs, nor the sum of two of them.

use super::{
    interleave, prefetch_next_block, tile_scales, Block, Int8Inputs, Tile, BLOCK_ROWS, GROUP_BYTES, GROUP_WORDS,
};
use crate::quant::GROUP;
use std::arch::x86_64::*;

/// Inputs per tile: eight int32 accumulators, four weight registers, the
/// two broadcasts and the ones fill the sixteen vector registers.
const TILE: usize = 4;

/// `out[i][j]` = row `j` of the block dotted with input `first + i`, bit
/// for bit `dot_block_scalar`.
///
/// # Safety
/// The CPU supports AVX2 and FMA; the block's lengths agree with `inputs`
/// and `first + out.len() <= inputs.inputs()` (checked by the caller).
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_block(block: Block<'_>, inputs: &Int8Inputs, first: usize, out: &mut [[f32; BLOCK_ROWS]]) {
    if let [one] = out {
        if block.rows == BLOCK_ROWS && inputs.cols.is_multiple_of(GROUP) {
            // SAFETY: as this function's, with a whole block of whole groups.
            return unsafe { dot_block_one(block, inputs, first, one) };
        }
    }
    out.iter_mut().for_each(|o| *o = [0.0; BLOCK_ROWS]);
    let mut tile = Tile::new();
    for g in 0..inputs.groups {
        // SAFETY: AVX2 is available (this function's contract).
        unsafe { interleave_whole(block, inputs.cols, g, &mut tile) };
        // SAFETY: as this function's; each tile's inputs t.. exist.
        unsafe { for_input_tiles!(out, first, TILE, |t, o| group_tile(&tile, inputs, t, g, o)) };
    }
}

/// One input (decode) against a whole block of whole groups, as AVX-512's
/// `dot_block_one`: each row's group as stored against the input's codes,
/// eight partial lanes a row, then each eight rows' lanes summed into one
/// vector of their exact group dots.
///
/// # Safety
/// As `dot_block`, with `block.rows == BLOCK_ROWS` and `cols` a multiple
/// of `GROUP`.
#[inline(always)]
unsafe fn dot_block_one(block: Block<'_>, inputs: &Int8Inputs, t: usize, out: &mut [f32; BLOCK_ROWS]) {
    let (cols, groups) = (inputs.cols, inputs.groups);
    let rb = cols / 2;
    let (nib, ones) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi16(1));
    let mut scales = [0f32; BLOCK_ROWS];
    let mut f = [_mm256_setzero_ps(); 2];
    for g in 0..groups {
        // SAFETY: rows 0..16 hold whole groups (caller); input t exists.
        unsafe {
            prefetch_next_block(block.q.as_ptr(), rb, g, groups);
            let at = t * groups + g;
            let c = inputs.codes.as_ptr().add(at * GROUP);
            // Codes 0..32 and 32..64 meet the low nibbles of bytes 0..32
            // and 32..64, codes 64..96 and 96..128 their high nibbles.
            let cv = c as *const __m256i;
            let c_lo = [_mm256_loadu_si256(cv), _mm256_loadu_si256(cv.add(1))];
            let c_hi = [_mm256_loadu_si256(cv.add(2)), _mm256_loadu_si256(cv.add(3))];
            let base = block.q.as_ptr().add(g * GROUP_BYTES);
            let mut a = [_mm256_setzero_si256(); BLOCK_ROWS];
            for (j, aj) in a.iter_mut().enumerate() {
                let p = base.add(j * rb) as *const __m256i;
                let mut sum = _mm256_setzero_si256();
                for (h, (&cl, &ch)) in c_lo.iter().zip(&c_hi).enumerate() {
                    let v = _mm256_loadu_si256(p.add(h));
                    let (lo, hi) = (_mm256_and_si256(v, nib), _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib));
                    sum = _mm256_add_epi32(sum, lanes(lo, cl, hi, ch, ones));
                }
                *aj = sum;
            }
            tile_scales(block, cols, g, &mut scales);
            let init = _mm256_set1_epi32(*inputs.init.get_unchecked(at));
            let a_scale = _mm256_set1_ps(*inputs.scales.get_unchecked(at));
            for (h, fh) in f.iter_mut().enumerate() {
                let rows: &[__m256i; 8] = a[8 * h..8 * h + 8].try_into().expect("eight rows");
                let dot = _mm256_add_epi32(sum_lanes(rows), init);
                let s = _mm256_mul_ps(_mm256_loadu_ps(scales.as_ptr().add(8 * h)), a_scale);
                *fh = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(dot), *fh);
            }
        }
    }
    // SAFETY: `out` is sixteen floats.
    unsafe {
        _mm256_storeu_ps(out.as_mut_ptr(), f[0]);
        _mm256_storeu_ps(out.as_mut_ptr().add(8), f[1]);
    }
}

/// Lane `j` of the result = the sum of `a[j]`'s eight lanes (exact int32).
#[inline(always)]
unsafe fn sum_lanes(a: &[__m256i; 8]) -> __m256i {
    // Per 128-bit half: pairs, then quads of each row's lanes.
    let h01 = _mm256_hadd_epi32(a[0], a[1]);
    let h23 = _mm256_hadd_epi32(a[2], a[3]);
    let h45 = _mm256_hadd_epi32(a[4], a[5]);
    let h67 = _mm256_hadd_epi32(a[6], a[7]);
    // Rows 0..4 (low half: their lanes 0..4, high half: lanes 4..8).
    let q0 = _mm256_hadd_epi32(h01, h23);
    let q1 = _mm256_hadd_epi32(h45, h67);
    _mm256_add_epi32(_mm256_permute2x128_si256::<0x20>(q0, q1), _mm256_permute2x128_si256::<0x31>(q0, q1))
}

/// `interleave` as four 8x8 transposes of four-byte words where the block
/// has sixteen rows and the group is whole; `interleave` itself otherwise.
///
/// # Safety
/// The CPU supports AVX2; `block` is `inputs`-consistent for `cols`.
#[inline(always)]
unsafe fn interleave_whole(block: Block<'_>, cols: usize, g: usize, tile: &mut Tile) {
    let rb = cols.div_ceil(2);
    let start = g * GROUP_BYTES;
    if block.rows != BLOCK_ROWS || start + GROUP_BYTES > rb {
        return interleave(block, cols, g, tile);
    }
    tile_scales(block, cols, g, &mut tile.scales);
    // SAFETY: each row j has bytes start..start+64 (checked above); the
    // tile's vectors are 32-byte aligned.
    unsafe {
        let base = block.q.as_ptr().add(start);
        prefetch_next_block(block.q.as_ptr(), rb, g, cols.div_ceil(GROUP));
        let words = tile.words.as_mut_ptr() as *mut __m256i;
        // Rows 8h..8h+8, words 8w..8w+8: word k of those rows is the tile's
        // vector 2k + h.
        for h in 0..2 {
            for w in 0..2 {
                let mut r = [_mm256_setzero_si256(); 8];
                for (i, ri) in r.iter_mut().enumerate() {
                    *ri = _mm256_loadu_si256(base.add((8 * h + i) * rb + 32 * w) as *const __m256i);
                }
                let t = transpose8(r);
                for (i, ti) in t.iter().enumerate() {
                    words.add(2 * (8 * w + i) + h).write(*ti);
                }
            }
        }
    }
}

/// Transposes eight vectors of eight four-byte words: lane `r` of result
/// `m` is word `m` of `r[r]`.
#[inline(always)]
pub(crate) unsafe fn transpose8(r: [__m256i; 8]) -> [__m256i; 8] {
    let mut u = [_mm256_setzero_si256(); 8];
    for q in 0..2 {
        let (r0, r1, r2, r3) = (r[4 * q], r[4 * q + 1], r[4 * q + 2], r[4 * q + 3]);
        let (t0, t1) = (_mm256_unpacklo_epi32(r0, r1), _mm256_unpackhi_epi32(r0, r1));
        let (t2, t3) = (_mm256_unpacklo_epi32(r2, r3), _mm256_unpackhi_epi32(r2, r3));
        // Rows 4q..4q+4 at words m (low lane) and m + 4 (high lane).
        u[4 * q] = _mm256_unpacklo_epi64(t0, t2);
        u[4 * q + 1] = _mm256_unpackhi_epi64(t0, t2);
        u[4 * q + 2] = _mm256_unpacklo_epi64(t1, t3);
        u[4 * q + 3] = _mm256_unpackhi_epi64(t1, t3);
    }
    let mut out = [_mm256_setzero_si256(); 8];
    for m in 0..4 {
        out[m] = _mm256_permute2x128_si256::<0x20>(u[m], u[4 + m]);
        out[m + 4] = _mm256_permute2x128_si256::<0x31>(u[m], u[4 + m]);
    }
    out
}

/// Eight int32 lanes: the two `maddubs` pair sums added (at most 4 * 15 *
/// 127 in size), then widened and summed by `madd`.
#[inline(always)]
unsafe fn lanes(lo: __m256i, c_lo: __m256i, hi: __m256i, c_hi: __m256i, ones: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, c_lo), _mm256_maddubs_epi16(hi, c_hi)), ones)
}

/// Adds group `g` of inputs `first..first + N` against the tile to `out`.
///
/// # Safety
/// As `dot_block`, for inputs `first..first + N` and `g < groups`.
#[inline(always)]
unsafe fn group_tile<const N: usize>(
    tile: &Tile,
    inputs: &Int8Inputs,
    first: usize,
    g: usize,
    out: &mut [[f32; BLOCK_ROWS]; N],
) {
    let groups = inputs.groups;
    let nib = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_si256(); 2]; N];
    let mut codes = [std::ptr::null::<u8>(); N];
    for i in 0..N {
        let at = (first + i) * groups + g;
        // SAFETY: input first+i exists (caller), so group g's code sum and
        // 128 codes lie inside the buffers.
        unsafe {
            let init = _mm256_set1_epi32(*inputs.init.get_unchecked(at));
            acc[i] = [init, init];
            codes[i] = inputs.codes.as_ptr().add(at * GROUP) as *const u8;
        }
    }
    for k in 0..GROUP_WORDS {
        // SAFETY: `words[k]` is 64 bytes; codes 4k..4k+4 and 64+4k.. lie
        // inside the input's group.
        unsafe {
            let p = tile.words[k].as_ptr() as *const __m256i;
            let (v0, v1) = (_mm256_load_si256(p), _mm256_load_si256(p.add(1)));
            let lo = [_mm256_and_si256(v0, nib), _mm256_and_si256(v1, nib)];
            let hi =
                [_mm256_and_si256(_mm256_srli_epi16::<4>(v0), nib), _mm256_and_si256(_mm256_srli_epi16::<4>(v1), nib)];
            for i in 0..N {
                let c_lo = _mm256_set1_epi32((codes[i].add(4 * k) as *const i32).read_unaligned());
                let c_hi = _mm256_set1_epi32((codes[i].add(GROUP_BYTES + 4 * k) as *const i32).read_unaligned());
                for h in 0..2 {
                    acc[i][h] = _mm256_add_epi32(acc[i][h], lanes(lo[h], c_lo, hi[h], c_hi, ones));
                }
            }
        }
    }
    // SAFETY: `scales` is 64 bytes, each half 32; input scale indices as above.
    unsafe {
        for i in 0..N {
            let a = _mm256_set1_ps(*inputs.scales.get_unchecked((first + i) * groups + g));
            for (h, &dot) in acc[i].iter().enumerate() {
                let s = _mm256_mul_ps(_mm256_load_ps(tile.scales.as_ptr().add(8 * h)), a);
                let o = out[i].as_mut_ptr().add(8 * h);
                _mm256_storeu_ps(o, _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(dot), _mm256_loadu_ps(o)));
            }
        }
    }
}
