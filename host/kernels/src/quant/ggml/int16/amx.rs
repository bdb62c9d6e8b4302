//! Q4_K products over many inputs on AMX tiles (Sapphire Rapids and later),
//! bit for bit the int16 definition (`row_scalar`).
//!
//! A sub-block's exact dot `sum q * c` is two int8 tile products: each
//! int16 code is `256 * h + l` (`h` its signed high byte, `l` its unsigned
//! low one), so `dot = 256 * (q . h) + (q . l)`, `tdpbssd` for the first
//! and `tdpbsud` for the second, 16 rows by 16 inputs by the sub-block's 32
//! columns each. Both are exact integers (below 2^24), so the dot is the
//! definition's, and the scales are then applied as AVX-512 vectors over
//! the 16 inputs in the definition's order: `v = (d * sc_j) * dot`,
//! `v = fma(-(dmin * m_j), sum_j, v)`, `F[j % 16] = fma(s_j, v, F[j % 16])`.
//! A tile's product adds 8,192 multiplies in one instruction where
//! `vpdpwssd` adds 32: the block kernel on VNNI reached 75 GMAC/s a core,
//! a prototype of this loop 150-170 (docs/PERFORMANCE.md).
//!
//! The inputs' bytes are laid out as the tiles take them once per call
//! (`AmxInputs`, made by `Int16Inputs::new`); each task's rows are unpacked
//! to one nibble a byte once per call, per thread (`UNPACKED`).

use super::{super_scales, Int16Inputs, Outputs, LANES, SUB, SUPER, SUPER_BYTES};
use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// Inputs per tile (a tile row holds 16 int32 sums).
pub(crate) const TILE_INPUTS: usize = 16;
/// Rows per tile.
const TILE_ROWS: usize = 16;
/// Rows of one task: the rows unpacked once and run against each tile of
/// inputs in turn, so that an input tile's bytes are read from the cache
/// once per 64 rows.
pub(crate) const TASK_ROWS: usize = 64;
/// From this many inputs a call takes the tiles; fewer would leave most of
/// a tile's 16 input columns empty.
pub(crate) const MIN_INPUTS: usize = 8;
/// Bytes of one input tile's plane for one sub-block: 8 rows of 64 (16
/// inputs by 4 columns each).
const PLANE: usize = 512;

static ALLOWED: AtomicBool = AtomicBool::new(true);

/// Lets (the default) or stops Q4_K products taking AMX tiles where the
/// CPU and OS offer them, process-wide: benchmarks compare the two.
pub fn allow_amx(allowed: bool) {
    ALLOWED.store(allowed, Ordering::Relaxed);
}

/// Whether this CPU has AMX-INT8 and AVX-512 F/BW/VNNI, and the OS lets
/// this process use the tiles (asked once).
pub(crate) fn usable() -> bool {
    static USABLE: OnceLock<bool> = OnceLock::new();
    *USABLE.get_or_init(|| {
        cpu_has_amx_int8() && crate::quant::int8::avx512::detected() && waste_platform::request_tile_registers()
    })
}

/// Whether a call made now takes the tiles (`usable`, and not stopped by
/// `allow_amx`).
pub(crate) fn in_use() -> bool {
    ALLOWED.load(Ordering::Relaxed) && usable()
}

fn cpu_has_amx_int8() -> bool {
    // Leaf 7 is read only where leaf 0 says it exists.
    if __cpuid(0).eax < 7 {
        return false;
    }
    let leaf7 = __cpuid_count(7, 0);
    // EDX bit 24: AMX-TILE; bit 25: AMX-INT8.
    leaf7.edx & (1 << 24) != 0 && leaf7.edx & (1 << 25) != 0
}

/// The inputs' codes as the tiles read them: per tile of 16 inputs and
/// sub-block `j`, the high bytes' plane then the low bytes', each 8 rows
/// (4 columns each) of 16 inputs by 4 bytes; and per tile and sub-block
/// the 16 inputs' scales and code sums (as f32, exact) as vectors. Inputs
/// past the last fill their tile with zeros.
pub(crate) struct AmxInputs {
    pub(crate) planes: Vec<u8>,
    pub(crate) scales: Vec<f32>,
    pub(crate) sums: Vec<f32>,
}

impl AmxInputs {
    /// From `Int16Inputs`' codes, scales and sums; in parallel over the
    /// tiles when there are several.
    pub(crate) fn new(codes: &[i16], scales: &[f32], sums: &[i32], cols: usize) -> AmxInputs {
        use rayon::prelude::*;
        let n = codes.len() / cols;
        let subs = cols / SUB;
        let tiles = n.div_ceil(TILE_INPUTS);
        let mut a = AmxInputs {
            planes: vec![0; tiles * subs * 2 * PLANE],
            scales: vec![0.0; tiles * subs * TILE_INPUTS],
            sums: vec![0.0; tiles * subs * TILE_INPUTS],
        };
        let per_tile = |(tile, ((planes, sc), su)): (usize, TileParts)| {
            for i in 0..TILE_INPUTS.min(n - tile * TILE_INPUTS) {
                let t = tile * TILE_INPUTS + i;
                for j in 0..subs {
                    let c = &codes[t * cols + j * SUB..][..SUB];
                    let plane = &mut planes[j * 2 * PLANE..][..2 * PLANE];
                    for (k, c) in c.chunks_exact(4).enumerate() {
                        let at = k * 64 + i * 4;
                        let high: [u8; 4] = std::array::from_fn(|b| (c[b] >> 8) as u8);
                        let low: [u8; 4] = std::array::from_fn(|b| c[b] as u8);
                        plane[at..at + 4].copy_from_slice(&high);
                        plane[PLANE + at..PLANE + at + 4].copy_from_slice(&low);
                    }
                    sc[j * TILE_INPUTS + i] = scales[t * subs + j];
                    su[j * TILE_INPUTS + i] = sums[t * subs + j] as f32;
                }
            }
        };
        let (tile_planes, tile_values) = (subs * 2 * PLANE, subs * TILE_INPUTS);
        let parts = a
            .planes
            .par_chunks_mut(tile_planes)
            .zip(a.scales.par_chunks_mut(tile_values))
            .zip(a.sums.par_chunks_mut(tile_values));
        parts.enumerate().for_each(per_tile);
        a
    }

    /// Bytes these hold for `inputs` inputs of `cols` values (the memory
    /// plan's count): 2 a value, 8 per sub-block, a whole tile of inputs.
    pub(crate) fn bytes(inputs: usize, cols: usize) -> usize {
        let padded = inputs.div_ceil(TILE_INPUTS) * TILE_INPUTS;
        padded * (2 * cols + 8 * (cols / SUB))
    }
}

/// One tile's planes, scales and sums, as `AmxInputs::new` fills them.
type TileParts<'a> = ((&'a mut [u8], &'a mut [f32]), &'a mut [f32]);

/// A task's rows unpacked for the tiles, per thread: per block of 16 rows
/// and sub-block, the 16 rows' 32 nibbles one a byte (the tile's rows), and
/// each row's `d * sc_j` and `dmin * m_j` (0 past the task's rows).
struct Unpacked {
    nibbles: Vec<u8>,
    d1: Vec<[f32; TILE_ROWS]>,
    m1: Vec<[f32; TILE_ROWS]>,
}

std::thread_local! {
    static UNPACKED: std::cell::RefCell<Unpacked> =
        const { std::cell::RefCell::new(Unpacked { nibbles: Vec::new(), d1: Vec::new(), m1: Vec::new() }) };
}

/// Bytes this thread's unpacked rows hold.
#[cfg(test)]
pub(super) fn held_bytes() -> usize {
    UNPACKED.with_borrow(|u| u.nibbles.capacity() + (u.d1.capacity() + u.m1.capacity()) * TILE_ROWS * 4)
}

/// Bytes a thread's unpacked rows reach for rows of `cols` values.
pub(crate) fn peak_bytes(cols: usize) -> usize {
    TASK_ROWS * cols + 2 * TASK_ROWS * (cols / SUB) * std::mem::size_of::<f32>()
}

impl Unpacked {
    /// Unpacks `nr` rows of `rb` bytes.
    ///
    /// # Safety
    /// AVX2; `rows` is `nr` rows of `rb` bytes, whole Q4_K super-blocks.
    #[target_feature(enable = "avx2")]
    unsafe fn fill(&mut self, rows: &[u8], nr: usize, rb: usize) {
        let supers = rb / SUPER_BYTES;
        let subs = supers * 8;
        let blocks = nr.div_ceil(TILE_ROWS);
        super::resize_exact(&mut self.nibbles, blocks * subs * TILE_ROWS * SUB, 0);
        super::resize_exact(&mut self.d1, blocks * subs, [0.0; TILE_ROWS]);
        super::resize_exact(&mut self.m1, blocks * subs, [0.0; TILE_ROWS]);
        let low4 = _mm256_set1_epi8(15);
        for b in 0..blocks {
            for r in 0..TILE_ROWS {
                let row = b * TILE_ROWS + r;
                for sb in 0..supers {
                    let block = (row < nr).then(|| &rows[row * rb + sb * SUPER_BYTES..][..SUPER_BYTES]);
                    let (d1, m1) = block.map_or(([0.0; 8], [0.0; 8]), super_scales);
                    for c in 0..4 {
                        // ggml's layout: sub-blocks 2c and 2c + 1 are the low
                        // and high nibbles of the same 32 bytes.
                        let (j0, j1) = (sb * 8 + 2 * c, sb * 8 + 2 * c + 1);
                        (self.d1[b * subs + j0][r], self.m1[b * subs + j0][r]) = (d1[2 * c], m1[2 * c]);
                        (self.d1[b * subs + j1][r], self.m1[b * subs + j1][r]) = (d1[2 * c + 1], m1[2 * c + 1]);
                        let q = match block {
                            // SAFETY: 32 bytes of the super-block's 128 of nibbles.
                            Some(blk) => unsafe { _mm256_loadu_si256(blk[16 + 32 * c..].as_ptr() as *const __m256i) },
                            None => _mm256_setzero_si256(),
                        };
                        let at = |j: usize| ((b * subs + j) * TILE_ROWS + r) * SUB;
                        let (lo, hi) = (_mm256_and_si256(q, low4), _mm256_and_si256(_mm256_srli_epi16::<4>(q), low4));
                        // SAFETY: 32 bytes at each sub-block's row, inside
                        // the buffer sized above.
                        unsafe {
                            _mm256_storeu_si256(self.nibbles[at(j0)..].as_mut_ptr() as *mut __m256i, lo);
                            _mm256_storeu_si256(self.nibbles[at(j1)..].as_mut_ptr() as *mut __m256i, hi);
                        }
                    }
                }
            }
        }
    }
}

/// The tile shapes: 0, 1 and 4, 5 the two pairs of accumulators (16 rows by
/// 16 int32), 2 the rows' nibbles (16 by 32 bytes), 3 and 6 an input
/// tile's high and low planes (8 rows by 64 bytes).
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

const CONFIG: TileConfig = {
    let mut c = TileConfig { palette: 1, start_row: 0, reserved: [0; 14], colsb: [0; 16], rows: [0; 16] };
    let shapes: [(usize, u16, u8); 7] =
        [(0, 64, 16), (1, 64, 16), (2, 32, 16), (3, 64, 8), (4, 64, 16), (5, 64, 16), (6, 64, 8)];
    let mut i = 0;
    while i < shapes.len() {
        let (t, colsb, rows) = shapes[i];
        c.colsb[t] = colsb;
        c.rows[t] = rows;
        i += 1;
    }
    c
};

/// Where one sub-block's two dots land: `[pair][plane][row][input]`.
#[repr(C, align(64))]
struct Staging([[[i32; TILE_ROWS * TILE_INPUTS]; 2]; 2]);

/// Rows `first..first + nr` of the Q4_K matrix `rows` (`nr <= TASK_ROWS`,
/// rows of `rb` bytes) against every input, into `out`, bit for bit
/// `row_scalar`.
///
/// # Safety
/// `usable()` holds; `inputs.amx` is `Some`; `rows` is `nr` rows of whole
/// Q4_K super-blocks of `inputs.cols` values; rows `first..first + nr` of
/// `out` are the caller's to write.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn task_products(rows: &[u8], nr: usize, inputs: &Int16Inputs, out: Outputs, first: usize) {
    let (cols, n) = (inputs.cols, inputs.inputs());
    let subs = cols / SUB;
    let rb = cols / SUPER * SUPER_BYTES;
    let amx = inputs.amx.as_ref().expect("AMX products: inputs without their tiles");
    assert!(nr <= TASK_ROWS && rows.len() == nr * rb, "AMX products: lengths");
    UNPACKED.with_borrow_mut(|u| {
        // SAFETY: AVX-512 implies AVX2; the rows are the caller's.
        unsafe { u.fill(rows, nr, rb) };
        let mut stage = Staging([[[0; TILE_ROWS * TILE_INPUTS]; 2]; 2]);
        // SAFETY: the tile registers are this process's (`usable`); the
        // configuration is 64 readable bytes.
        unsafe { asm!("ldtilecfg [{}]", in(reg) &CONFIG, options(nostack, readonly, preserves_flags)) };
        for tile in 0..n.div_ceil(TILE_INPUTS) {
            for b in 0..nr.div_ceil(TILE_ROWS) {
                // SAFETY: block b of the unpacked rows and input tile
                // `tile` exist; the tiles are configured.
                let sums = unsafe { block_tile(u, b, amx, tile, subs, &mut stage) };
                let (r_end, t_end) = ((nr - b * TILE_ROWS).min(TILE_ROWS), (n - tile * TILE_INPUTS).min(TILE_INPUTS));
                for (r, row) in sums[..r_end].iter().enumerate() {
                    for (i, &v) in row[..t_end].iter().enumerate() {
                        // SAFETY: the input exists; the row is the caller's.
                        unsafe { out.write(tile * TILE_INPUTS + i, first + b * TILE_ROWS + r, v) };
                    }
                }
            }
        }
        // SAFETY: ends this thread's use of the tiles (their state is then
        // not saved at each switch).
        unsafe { asm!("tilerelease", options(nostack, nomem, preserves_flags)) };
    });
}

/// Block `b` of the unpacked rows against input tile `tile`: `[row][input]`.
///
/// # Safety
/// The tiles are configured as `CONFIG`; block `b` and tile `tile` exist.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn block_tile(
    u: &Unpacked,
    b: usize,
    amx: &AmxInputs,
    tile: usize,
    subs: usize,
    stage: &mut Staging,
) -> [[f32; TILE_INPUTS]; TILE_ROWS] {
    let nibbles = |j: usize| u.nibbles[(b * subs + j) * TILE_ROWS * SUB..].as_ptr();
    let planes = |j: usize| amx.planes[(tile * subs + j) * 2 * PLANE..].as_ptr();
    // lanes[L][r]: lane L of the definition's sixteen, rows' vectors over
    // the tile's inputs.
    let mut lanes = [[_mm512_setzero_ps(); TILE_ROWS]; LANES];
    for (l, lane) in lanes.iter_mut().enumerate().take(subs) {
        // Sub-blocks l, l + 16, ..., each one's tile products issued while
        // the one before is scaled.
        // SAFETY: sub-block l exists (l < subs).
        unsafe { issue(0, nibbles(l), planes(l), &mut stage.0[0]) };
        let mut f = [_mm512_setzero_ps(); TILE_ROWS];
        let mut pair = 0;
        for j in (l..subs).step_by(LANES) {
            if j + LANES < subs {
                // SAFETY: sub-block j + 16 exists.
                unsafe { issue(1 - pair, nibbles(j + LANES), planes(j + LANES), &mut stage.0[1 - pair]) };
            }
            let at = (tile * subs + j) * TILE_INPUTS;
            // SAFETY: sixteen floats each.
            let (s, sum) =
                unsafe { (_mm512_loadu_ps(amx.scales[at..].as_ptr()), _mm512_loadu_ps(amx.sums[at..].as_ptr())) };
            let (d1, m1) = (&u.d1[b * subs + j], &u.m1[b * subs + j]);
            let [high, low] = &stage.0[pair];
            // Unrolled, so that the sixteen rows' lanes stay in registers.
            macro_rules! row {
                ($($r:literal)*) => {$(
                    // SAFETY: sixteen int32 each, 64-byte aligned (`Staging`).
                    let dot = unsafe {
                        let h = _mm512_load_si512(high[$r * TILE_INPUTS..].as_ptr() as *const _);
                        let l = _mm512_load_si512(low[$r * TILE_INPUTS..].as_ptr() as *const _);
                        _mm512_add_epi32(_mm512_slli_epi32::<8>(h), l)
                    };
                    let v = _mm512_mul_ps(_mm512_set1_ps(d1[$r]), _mm512_cvtepi32_ps(dot));
                    let v = _mm512_fnmadd_ps(_mm512_set1_ps(m1[$r]), sum, v);
                    f[$r] = _mm512_fmadd_ps(s, v, f[$r]);
                )*};
            }
            row!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
            pair = 1 - pair;
        }
        *lane = f;
    }
    // `reduce_lanes`, each vector lane an input.
    let mut sums = [[0f32; TILE_INPUTS]; TILE_ROWS];
    for (r, out) in sums.iter_mut().enumerate() {
        let h: [__m512; 8] = std::array::from_fn(|k| _mm512_add_ps(lanes[k][r], lanes[k + 8][r]));
        let g: [__m512; 4] = std::array::from_fn(|k| _mm512_add_ps(h[k], h[k + 4]));
        let e = [_mm512_add_ps(g[0], g[2]), _mm512_add_ps(g[1], g[3])];
        // SAFETY: sixteen floats.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), _mm512_add_ps(e[0], e[1])) };
    }
    sums
}

/// One sub-block's two dots into accumulator pair `pair` (tiles 0, 1 or
/// 4, 5: the other pair's products may still be in flight), then stored to
/// `stage` (`[plane][row][input]`).
///
/// # Safety
/// Configured tiles; 512 nibble bytes at `nibbles`, two 512-byte planes at
/// `planes`.
#[inline(always)]
unsafe fn issue(pair: usize, nibbles: *const u8, planes: *const u8, stage: &mut [[i32; TILE_ROWS * TILE_INPUTS]; 2]) {
    macro_rules! products {
        ($high:literal, $low:literal) => {
            asm!(
                "tileloadd tmm2, [{w} + {w_stride}*1]",
                "tileloadd tmm3, [{x} + {x_stride}*1]",
                "tileloadd tmm6, [{x} + {x_stride}*1 + 512]",
                concat!("tilezero ", $high),
                concat!("tilezero ", $low),
                concat!("tdpbssd ", $high, ", tmm2, tmm3"),
                concat!("tdpbsud ", $low, ", tmm2, tmm6"),
                concat!("tilestored [{high} + {x_stride}*1], ", $high),
                concat!("tilestored [{low} + {x_stride}*1], ", $low),
                w = in(reg) nibbles,
                x = in(reg) planes,
                high = in(reg) stage[0].as_mut_ptr(),
                low = in(reg) stage[1].as_mut_ptr(),
                w_stride = in(reg) SUB,
                x_stride = in(reg) 64usize,
                options(nostack, preserves_flags),
            )
        };
    }
    // SAFETY: the caller's; the stores write the 2 KB of `stage`.
    unsafe {
        if pair == 0 {
            products!("tmm0", "tmm1")
        } else {
            products!("tmm4", "tmm5")
        }
    }
}
