//! The integer block products on AVX-512 VNNI: one `vpdpbusd` of a tile
//! vector (four bytes of each of sixteen rows) against four codes
//! broadcast adds eight columns into every row's int32 lane, so a group is
//! thirty-two instructions per input for sixteen rows. Inputs go in tiles
//! of eight, sharing each loaded and unpacked tile vector.

use super::{interleave, prefetch_next_block, Block, Int8Inputs, Tile, BLOCK_ROWS, GROUP_BYTES, GROUP_WORDS};
use crate::quant::GROUP;
use std::arch::x86_64::*;

/// Inputs per tile: eight int32 accumulators, two weight registers and
/// the broadcasts fit the 32 vector registers with room to spare.
const TILE: usize = 8;

/// Whether this CPU has AVX-512 F/BW/VNNI (probed by std, cached there).
pub(crate) fn detected() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni")
}

/// `out[i][j]` = row `j` of the block dotted with input `first + i`, bit
/// for bit `dot_block_scalar`.
///
/// # Safety
/// The CPU supports AVX-512 F/BW/VNNI; the block's lengths agree with
/// `inputs` and `first + out.len() <= inputs.inputs()` (checked by the
/// caller).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn dot_block(block: Block<'_>, inputs: &Int8Inputs, first: usize, out: &mut [[f32; BLOCK_ROWS]]) {
    if let [one] = out {
        if block.rows == BLOCK_ROWS && inputs.cols.is_multiple_of(GROUP) && inputs.groups >= 2 {
            // SAFETY: as this function's, with a whole block of whole groups.
            return unsafe { dot_block_one(block, inputs, first, one) };
        }
    }
    out.iter_mut().for_each(|o| *o = [0.0; BLOCK_ROWS]);
    let mut tile = Tile::new();
    for g in 0..inputs.groups {
        // SAFETY: AVX-512 F is available (this function's contract).
        let tile = unsafe { interleave_whole(block, inputs.cols, g, &mut tile) };
        // SAFETY: as this function's; each tile's inputs t.. exist.
        unsafe { for_input_tiles!(out, first, TILE, |t, o| group_tile(&tile, inputs, t, g, o)) };
    }
}

/// One input (decode) against a whole block of whole groups: each row's
/// group as the row stores it against the input's 128 codes (two
/// `vpdpbusd`, sixteen partial lanes), then the sixteen rows' partial
/// lanes summed into one vector of the rows' exact group dots (45
/// instructions a group). With no other input to share a transpose of the
/// weights this is the cheaper form: 65 against 22-27 GMAC/s on one thread
/// with the matrix in cache, 25 against 18 from DRAM (the prefill bench).
///
/// # Safety
/// As `dot_block`, with `block.rows == BLOCK_ROWS` and `cols` a multiple
/// of `GROUP`, at least two groups.
#[inline(always)]
unsafe fn dot_block_one(block: Block<'_>, inputs: &Int8Inputs, t: usize, out: &mut [f32; BLOCK_ROWS]) {
    let (cols, groups) = (inputs.cols, inputs.groups);
    let rb = cols / 2;
    let nib = _mm512_set1_epi8(0x0F);
    // Row j's scale of group g is the u16 at `scales[j * 2 * groups + 2 * g]`.
    let scale_at = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(2 * groups as i32),
    );
    let mut f = _mm512_setzero_ps();
    for g in 0..groups {
        // SAFETY: rows 0..16 hold whole groups (caller); input t exists.
        unsafe {
            prefetch_next_block(block.q.as_ptr(), rb, g, groups);
            let at = t * groups + g;
            let c = inputs.codes.as_ptr().add(at * GROUP);
            let (c_lo, c_hi) = (_mm512_loadu_si512(c as *const _), _mm512_loadu_si512(c.add(GROUP_BYTES) as *const _));
            let base = block.q.as_ptr().add(g * GROUP_BYTES);
            let mut a = [_mm512_setzero_si512(); BLOCK_ROWS];
            for (j, aj) in a.iter_mut().enumerate() {
                let v = _mm512_loadu_si512(base.add(j * rb) as *const _);
                let (lo, hi) = (_mm512_and_si512(v, nib), _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib));
                *aj = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, c_lo), hi, c_hi);
            }
            let dot = _mm512_add_epi32(sum_lanes(&a), _mm512_set1_epi32(*inputs.init.get_unchecked(at)));
            // Four bytes of each row's scales, inside the row's: groups
            // 0 and 1 (group 0's the low half), else g - 1 and g.
            let from = 2 * g.saturating_sub(1);
            let pairs = _mm512_i32gather_epi32::<1>(scale_at, block.scales.as_ptr().add(from) as *const _);
            let halves = if g == 0 { pairs } else { _mm512_srli_epi32::<16>(pairs) };
            let ws = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(halves));
            let s = _mm512_mul_ps(ws, _mm512_set1_ps(*inputs.scales.get_unchecked(at)));
            f = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(dot), f);
        }
    }
    // SAFETY: `out` is sixteen floats.
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), f) };
}

/// Lane `j` of the result = the sum of `a[j]`'s sixteen lanes (exact
/// int32): pairs of rows, then pairs of pairs within 128-bit lanes, then
/// across the four 128-bit lanes.
#[inline(always)]
unsafe fn sum_lanes(a: &[__m512i; BLOCK_ROWS]) -> __m512i {
    let mut x = [_mm512_setzero_si512(); 8];
    for (p, xp) in x.iter_mut().enumerate() {
        *xp = sum_pair(a[2 * p], a[2 * p + 1]);
    }
    sum_lane_pairs(&x)
}

/// The first step of `sum_lanes`, for `a[2p]` and `a[2p + 1]`: lanes
/// `4i` and `4i + 2` hold two partial sums of `u`'s 128-bit lane `i`,
/// lanes `4i + 1` and `4i + 3` two of `v`'s.
#[inline(always)]
pub(crate) unsafe fn sum_pair(u: __m512i, v: __m512i) -> __m512i {
    _mm512_add_epi32(_mm512_unpacklo_epi32(u, v), _mm512_unpackhi_epi32(u, v))
}

/// The rest of `sum_lanes` from its first step's eight vectors
/// (`x[p] = sum_pair(a[2p], a[2p + 1])`).
#[inline(always)]
pub(crate) unsafe fn sum_lane_pairs(x: &[__m512i; 8]) -> __m512i {
    // y[q]'s 128-bit lane L: rows 4q..4q+4, each the sum of its lane L.
    let mut y = [_mm512_setzero_si512(); 4];
    for (q, yq) in y.iter_mut().enumerate() {
        let (u, v) = (x[2 * q], x[2 * q + 1]);
        *yq = _mm512_add_epi32(_mm512_unpacklo_epi64(u, v), _mm512_unpackhi_epi64(u, v));
    }
    let z0 = _mm512_add_epi32(_mm512_shuffle_i32x4::<0x88>(y[0], y[1]), _mm512_shuffle_i32x4::<0xDD>(y[0], y[1]));
    let z1 = _mm512_add_epi32(_mm512_shuffle_i32x4::<0x88>(y[2], y[3]), _mm512_shuffle_i32x4::<0xDD>(y[2], y[3]));
    _mm512_add_epi32(_mm512_shuffle_i32x4::<0x88>(z0, z1), _mm512_shuffle_i32x4::<0xDD>(z0, z1))
}

/// A group of the block in registers: `words[k]` as `Tile::words[k]`.
struct Words {
    words: [__m512i; GROUP_WORDS],
    scales: __m512,
}

/// `interleave` as one 16x16 transpose of four-byte words, kept in
/// registers, where the block has sixteen rows and the group is whole
/// (every block but a matrix's last, or a row's tail); `interleave`
/// into `tile` and loaded from there otherwise. The scalar form cost three
/// times the group's products at one input, and the tile's store and
/// reload 15% of decode.
///
/// # Safety
/// The CPU supports AVX-512 F; `block` is `inputs`-consistent for `cols`.
#[inline(always)]
unsafe fn interleave_whole(block: Block<'_>, cols: usize, g: usize, tile: &mut Tile) -> Words {
    let rb = cols.div_ceil(2);
    let start = g * GROUP_BYTES;
    if block.rows != BLOCK_ROWS || start + GROUP_BYTES > rb {
        interleave(block, cols, g, tile);
        // SAFETY: the tile's vectors are 64-byte aligned.
        return unsafe {
            Words {
                words: std::array::from_fn(|k| _mm512_load_si512(tile.words[k].as_ptr() as *const _)),
                scales: _mm512_load_ps(tile.scales.as_ptr()),
            }
        };
    }
    let groups = cols.div_ceil(GROUP);
    let mut halves = [0u16; BLOCK_ROWS];
    for (j, h) in halves.iter_mut().enumerate() {
        let at = j * 2 * groups + 2 * g;
        *h = u16::from_le_bytes([block.scales[at], block.scales[at + 1]]);
    }
    // SAFETY: each row j has bytes start..start+64 (checked above); the
    // tile's vectors are 64-byte aligned; `halves` is 32 bytes.
    unsafe {
        let scales = _mm512_cvtph_ps(_mm256_loadu_si256(halves.as_ptr() as *const __m256i));
        let base = block.q.as_ptr().add(start);
        prefetch_next_block(block.q.as_ptr(), rb, g, cols.div_ceil(GROUP));
        let mut rows = [_mm512_setzero_si512(); BLOCK_ROWS];
        for (j, r) in rows.iter_mut().enumerate() {
            *r = _mm512_loadu_si512(base.add(j * rb) as *const _);
        }
        Words { words: transpose_words(&rows), scales }
    }
}

/// The 16x16 transpose of four-byte words: lane `j` of result `m` is
/// word `m` of `rows[j]`.
#[inline(always)]
pub(crate) unsafe fn transpose_words(rows: &[__m512i; 16]) -> [__m512i; 16] {
    // Pairs of rows interleave their words, then pairs of pairs, so
    // u[4q + m] holds rows 4q..4q+4 at words m, m+4, m+8, m+12 (one per
    // 128-bit lane).
    let mut u = [_mm512_setzero_si512(); 16];
    for q in 0..4 {
        let (r0, r1, r2, r3) = (rows[4 * q], rows[4 * q + 1], rows[4 * q + 2], rows[4 * q + 3]);
        let (t0, t1) = (_mm512_unpacklo_epi32(r0, r1), _mm512_unpackhi_epi32(r0, r1));
        let (t2, t3) = (_mm512_unpacklo_epi32(r2, r3), _mm512_unpackhi_epi32(r2, r3));
        u[4 * q] = _mm512_unpacklo_epi64(t0, t2);
        u[4 * q + 1] = _mm512_unpackhi_epi64(t0, t2);
        u[4 * q + 2] = _mm512_unpacklo_epi64(t1, t3);
        u[4 * q + 3] = _mm512_unpackhi_epi64(t1, t3);
    }
    // Then the 128-bit lanes: word m of rows 0..16 from the four quads'
    // lane 0, word m + 4 from lane 1, ...
    let mut w = [_mm512_setzero_si512(); 16];
    for m in 0..4 {
        let v0 = _mm512_shuffle_i32x4::<0x88>(u[m], u[4 + m]);
        let v1 = _mm512_shuffle_i32x4::<0xDD>(u[m], u[4 + m]);
        let v2 = _mm512_shuffle_i32x4::<0x88>(u[8 + m], u[12 + m]);
        let v3 = _mm512_shuffle_i32x4::<0xDD>(u[8 + m], u[12 + m]);
        w[m] = _mm512_shuffle_i32x4::<0x88>(v0, v2);
        w[m + 8] = _mm512_shuffle_i32x4::<0xDD>(v0, v2);
        w[m + 4] = _mm512_shuffle_i32x4::<0x88>(v1, v3);
        w[m + 12] = _mm512_shuffle_i32x4::<0xDD>(v1, v3);
    }
    w
}

/// Adds group `g` of inputs `first..first + N` against the tile to `out`.
///
/// # Safety
/// As `dot_block`, for inputs `first..first + N` and `g < groups`.
#[inline(always)]
unsafe fn group_tile<const N: usize>(
    tile: &Words,
    inputs: &Int8Inputs,
    first: usize,
    g: usize,
    out: &mut [[f32; BLOCK_ROWS]; N],
) {
    let groups = inputs.groups;
    let nib = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_si512(); N];
    let mut codes = [std::ptr::null::<u8>(); N];
    for i in 0..N {
        let at = (first + i) * groups + g;
        // SAFETY: input first+i exists (caller), so group g's code sum and
        // 128 codes lie inside the buffers.
        unsafe {
            acc[i] = _mm512_set1_epi32(*inputs.init.get_unchecked(at));
            codes[i] = inputs.codes.as_ptr().add(at * GROUP) as *const u8;
        }
    }
    for k in 0..GROUP_WORDS {
        // SAFETY: `words[k]` is 64 bytes; codes 4k..4k+4 and 64+4k.. lie
        // inside the input's group.
        unsafe {
            let v = tile.words[k];
            let (lo, hi) = (_mm512_and_si512(v, nib), _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib));
            for i in 0..N {
                let c_lo = (codes[i].add(4 * k) as *const i32).read_unaligned();
                let c_hi = (codes[i].add(GROUP_BYTES + 4 * k) as *const i32).read_unaligned();
                acc[i] = _mm512_dpbusd_epi32(acc[i], lo, _mm512_set1_epi32(c_lo));
                acc[i] = _mm512_dpbusd_epi32(acc[i], hi, _mm512_set1_epi32(c_hi));
            }
        }
    }
    // SAFETY: input scale indices as above.
    unsafe {
        let ws = tile.scales;
        for i in 0..N {
            let s = _mm512_mul_ps(ws, _mm512_set1_ps(*inputs.scales.get_unchecked((first + i) * groups + g)));
            let f = _mm512_loadu_ps(out[i].as_ptr());
            _mm512_storeu_ps(out[i].as_mut_ptr(), _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(acc[i]), f));
        }
    }
}
