//! Hot loops: one portable scalar version of each, plus AVX2+FMA versions
//! (x86-64) and NEON versions (aarch64, `neon.rs`: the dot products and the
//! table build) picked at run time by `isa()`; the rvq3/rvq2 row kernel has an AVX-512
//! VBMI version instead (`avx512.rs`, on plane-layout tables: see
//! `rvq_planes`), and none for AVX2 (see `rvq_rows`). The scalar
//! versions are always compiled (they are the fallback on other CPUs and the
//! reference in the tests). The `rvq4p` kernels live in `rvq4p.rs`.

use super::{QuantError, CODEBOOK_ENTRIES, GROUP, VDIM};
use half::f16;
use std::sync::atomic::{AtomicU8, Ordering};

/// An instruction-set level the kernels dispatch on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Portable Rust, always compiled; the reference of every test.
    Scalar,
    /// aarch64 Advanced SIMD: the `rvq4p` kernel, the trunk dot products
    /// and the table build; the rvq3/rvq2 row walk runs its portable loop
    /// (a `tbl`/`tbx` formulation models 3-5x slower on Neoverse cores:
    /// bench/mca, docs/PERFORMANCE.md).
    Neon,
    /// x86-64 AVX2 + FMA (+ F16C-free: scales are converted in software).
    Avx2,
    /// x86-64 AVX-512 F/BW/VBMI on top of AVX2+FMA: the `rvq4p` kernel uses
    /// a 64-entry byte permute, the rvq3/rvq2 row kernel 128-entry byte
    /// permutes over byte-plane tables; the other kernels run their AVX2
    /// versions.
    Avx512,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Neon => "neon",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    fn code(self) -> u8 {
        match self {
            Isa::Scalar => 1,
            Isa::Neon => 2,
            Isa::Avx2 => 3,
            Isa::Avx512 => 4,
        }
    }

    /// Every level this CPU can run, best last (always starts with Scalar).
    pub fn supported() -> Vec<Isa> {
        [Isa::Scalar, Isa::Neon, Isa::Avx2, Isa::Avx512].into_iter().filter(|&i| isa_available(i)).collect()
    }
}

/// 0 = not probed yet, else `Isa::code`.
static LEVEL: AtomicU8 = AtomicU8::new(0);

/// The level the kernels use: the best this CPU supports, unless
/// `force_isa` chose another.
#[inline]
pub fn isa() -> Isa {
    match LEVEL.load(Ordering::Relaxed) {
        1 => Isa::Scalar,
        2 => Isa::Neon,
        3 => Isa::Avx2,
        4 => Isa::Avx512,
        _ => {
            let best = detect();
            LEVEL.store(best.code(), Ordering::Relaxed);
            best
        }
    }
}

/// Make every kernel of the process use `level` (benchmarks, and the
/// force-scalar switch). An error if this CPU cannot run it. Process-wide:
/// tests that compare levels call the per-level kernels directly instead.
pub fn force_isa(level: Isa) -> Result<(), QuantError> {
    if !Isa::supported().contains(&level) {
        return Err(QuantError::Isa(level.name()));
    }
    LEVEL.store(level.code(), Ordering::Relaxed);
    Ok(())
}

/// Whether this CPU can run `level` (independent of `force_isa`).
#[inline]
pub(crate) fn isa_available(level: Isa) -> bool {
    static BEST: AtomicU8 = AtomicU8::new(0);
    let best = match BEST.load(Ordering::Relaxed) {
        0 => {
            let d = detect();
            BEST.store(d.code(), Ordering::Relaxed);
            d
        }
        c => [Isa::Scalar, Isa::Neon, Isa::Avx2, Isa::Avx512][c as usize - 1],
    };
    match level {
        Isa::Scalar => true,
        Isa::Neon => best == Isa::Neon,
        _ => best >= level,
    }
}

/// Whether the AVX2+FMA kernels may run (probed once). Elsewhere than
/// x86-64 only the tests ask (and skip).
#[inline]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn has_avx2() -> bool {
    isa() >= Isa::Avx2
}

/// Whether the AVX-512 level is in force and the CPU has AVX-512VL (the
/// wide multi-input dots, which use its registers for AVX2 operations).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_avx512vl() -> bool {
    isa() == Isa::Avx512 && is_x86_feature_detected!("avx512vl")
}

/// Whether the f32 attention products run on AVX-512 F: the CPU has it
/// and `force_isa` chose no lower level than the CPU's best (AVX-512 F
/// alone, without the VBMI that `Isa::Avx512` needs, is enough).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_avx512f() -> bool {
    let level = isa();
    let forced_lower = level < Isa::Avx512 && isa_available(Isa::Avx512);
    level >= Isa::Avx2 && !forced_lower && is_x86_feature_detected!("avx512f")
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Isa {
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
        return Isa::Scalar;
    }
    if is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vbmi")
    {
        return Isa::Avx512;
    }
    Isa::Avx2
}

#[cfg(target_arch = "aarch64")]
fn detect() -> Isa {
    if std::arch::is_aarch64_feature_detected!("neon") {
        Isa::Neon
    } else {
        Isa::Scalar
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn detect() -> Isa {
    Isa::Scalar
}

#[inline]
pub(crate) fn f16_at(bytes: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])).to_f32()
}

// ---------------------------------------------------------------- dispatch

/// `w . x`, with the best kernel this CPU has (the forward pass's f32 dot
/// products outside matrices: the DSA indexer's scores).
#[inline]
pub fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len(), "dot_f32: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and FMA were detected on this CPU; lengths are equal.
        return unsafe { avx2::dot_f32(w, x) };
    }
    #[cfg(target_arch = "aarch64")]
    if isa() == Isa::Neon {
        // SAFETY: NEON is the aarch64 baseline; lengths checked as above.
        return unsafe { neon::dot_f32(w, x) };
    }
    dot_f32_scalar(w, x)
}

/// One q8 row: `scales` holds the row's `ceil(len/128)` f16 group scales,
/// `q` its `x.len()` i8 values.
#[inline]
pub(crate) fn dot_q8(scales: &[u8], q: &[u8], x: &[f32]) -> f32 {
    check_row(scales, q.len(), x.len(), x.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and FMA were detected; lengths checked above.
        return unsafe { avx2::dot_q8(scales, q, x) };
    }
    #[cfg(target_arch = "aarch64")]
    if isa() == Isa::Neon {
        // SAFETY: NEON is the aarch64 baseline; lengths checked as above.
        return unsafe { neon::dot_q8(scales, q, x) };
    }
    dot_q8_scalar(scales, q, x)
}

/// `out[i] = dot_q8` of row `i` of the `out.len()` q8 rows held one after
/// another (`q`: `x.len()` bytes a row; `scales`: each row's f16 group
/// scales in turn) with the one input `x`, bit for bit: a matvec's rows
/// several at a time (AVX2; elsewhere one row at a time, the same kernel).
pub(crate) fn dot_q8_many_rows(scales: &[u8], q: &[u8], x: &[f32], out: &mut [f32]) {
    let (n, rows) = (x.len(), out.len());
    let g2 = 2 * n.div_ceil(GROUP);
    assert!(q.len() == rows * n && scales.len() == rows * g2, "dot_q8_many_rows: lengths");
    if n == 0 {
        out.fill(0.0);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and FMA were detected; lengths checked above.
        return unsafe { avx2::dot_q8_many_rows(scales, q, n, x, out) };
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = dot_q8(&scales[i * g2..(i + 1) * g2], &q[i * n..(i + 1) * n], x);
    }
}

/// `out[t] = dot_f32(w, x row t)` for the `out.len()` rows of `x`, each
/// `w.len()` long, bit for bit: the matrix-product form of a matvec, where
/// each load of `w` serves several inputs (AVX2; elsewhere one input at a
/// time, the same kernel).
pub(crate) fn dot_f32_rows(w: &[f32], x: &[f32], out: &mut [f32]) {
    assert_eq!(x.len(), out.len() * w.len(), "dot_f32_rows: inputs are not whole rows");
    if out.is_empty() || x.is_empty() {
        out.fill(0.0);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and FMA were detected; lengths checked above.
        return unsafe { avx2::dot_f32_rows(w, x, out) };
    }
    for (o, xr) in out.iter_mut().zip(x.chunks(w.len().max(1))) {
        *o = dot_f32(w, &xr[..w.len()]);
    }
}

/// `out[t] = dot_q8(scales, q, x row t)` for the `out.len()` rows of `x`
/// (each `q.len()` long), bit for bit, each decoded block of weights
/// serving several inputs (AVX2; elsewhere one input at a time).
pub(crate) fn dot_q8_rows(scales: &[u8], q: &[u8], x: &[f32], out: &mut [f32]) {
    let n = q.len();
    check_row(scales, q.len(), n, n);
    assert_eq!(x.len(), out.len() * n, "dot_q8_rows: inputs are not whole rows");
    if out.is_empty() || x.is_empty() {
        out.fill(0.0);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx512vl() {
        // SAFETY: AVX2, FMA, AVX-512F and VL were detected; lengths checked above.
        return unsafe { avx2::dot_q8_rows_wide(scales, q, n, x, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and FMA were detected; lengths checked above.
        return unsafe { avx2::dot_q8_rows(scales, q, n, x, out) };
    }
    for (o, xr) in out.iter_mut().zip(x.chunks(n.max(1))) {
        *o = dot_q8(scales, q, &xr[..n]);
    }
}

fn check_row(scales: &[u8], qlen: usize, cols: usize, want_q: usize) {
    assert!(scales.len() == 2 * cols.div_ceil(GROUP) && qlen == want_q, "quantised row: inconsistent lengths");
}

/// Rows interleaved by the RVQ row kernel (independent add chains).
pub(crate) const RVQ_ROWS: usize = 8;

/// RVQ table walk over code positions `c0..c1` for the rows of `acc`:
/// `acc[r] += table[j*256 + codes[r*n + j]]` for `j` ascending.
///
/// Each row's sum is a plain sequential sum over its positions, so walking
/// the positions in chunks (a caller keeps a chunk's tables L1-resident and
/// runs all its rows over it) gives the very same floats as one pass, equal
/// bit for bit to `rvq_row_scalar`. This portable kernel serves the scalar
/// and AVX2 levels: on this CPU (Zen 4) hand-written 8- and 16-lane gathers
/// over the same walk, and LLVM's own gathers in an AVX2 / AVX-512 build of
/// this loop, were 1.4-1.6x slower than these scalar loads, and a 256-entry
/// `vpshufb` lookup needs 16 shuffles per byte plane (docs/PERFORMANCE.md,
/// "Tried and dropped"). AVX-512 VBMI runs `rvq_rows_planes`.
#[inline]
pub(crate) fn rvq_rows(table: &[f32], codes: &[u8], n: usize, c0: usize, c1: usize, acc: &mut [f32]) {
    assert!(
        c0 <= c1 && c1 <= n && table.len() >= c1 * CODEBOOK_ENTRIES && codes.len() >= acc.len() * n,
        "rvq_rows: inconsistent lengths"
    );
    let tp = table.as_ptr();
    let done = acc.len() / RVQ_ROWS * RVQ_ROWS;
    let (groups, _) = acc.as_chunks_mut::<RVQ_ROWS>();
    for (g, a) in groups.iter_mut().enumerate() {
        // SAFETY: rows g*8..g*8+8 < acc.len(), so their positions 0..n lie
        // inside `codes`; `table` holds c1*256 floats (both checked above).
        unsafe { rvq_rows8(tp, codes.as_ptr().add(g * RVQ_ROWS * n), n, c0, c1, a) };
    }
    for (r, a) in acc.iter_mut().enumerate().skip(done) {
        let row = &codes[r * n..r * n + c1];
        for (j, &c) in row.iter().enumerate().skip(c0) {
            *a += table[j * CODEBOOK_ENTRIES + c as usize];
        }
    }
}

/// Whether the rvq3/rvq2 kernels run on plane-layout tables at `level`
/// (the AVX-512 VBMI row kernel, `avx512::rvq_rows`). Tables are converted
/// with `tables_to_planes` and read with `rvq_rows_planes`.
#[inline]
pub(crate) fn rvq_planes(level: Isa) -> bool {
    cfg!(target_arch = "x86_64") && level == Isa::Avx512 && isa_available(Isa::Avx512)
}

/// Bytes of one position's tables in plane layout (4 planes x 256).
pub(crate) const PLANE_BYTES: usize = 4 * CODEBOOK_ENTRIES;

/// The bytes of a table buffer (plane layout is stored in the same
/// `Vec<f32>` the f32 tables use, same size).
#[inline]
pub(crate) fn table_bytes(t: &[f32]) -> &[u8] {
    // SAFETY: u8 has alignment 1 and every bit pattern is valid; the slice
    // covers exactly the 4 * len bytes of `t`, borrowed for as long.
    unsafe { std::slice::from_raw_parts(t.as_ptr() as *const u8, 4 * t.len()) }
}

/// Converts f32 tables `[n][256]` in place to the plane layout: position
/// `j`'s 1024 bytes become `[b][c]`, byte `b` (little endian) of entry `c`.
pub(crate) fn tables_to_planes(t: &mut [f32]) {
    assert!(t.len().is_multiple_of(CODEBOOK_ENTRIES), "tables_to_planes: not whole tables");
    #[cfg(target_arch = "x86_64")]
    if isa_available(Isa::Avx512) {
        let n = t.len() / CODEBOOK_ENTRIES;
        // SAFETY: AVX-512 F/BW/VBMI were detected; `t` holds n * 1024 bytes,
        // borrowed mutably for the call.
        return unsafe { avx512::f32_to_planes(t.as_mut_ptr() as *mut u8, n) };
    }
    tables_to_planes_scalar(t)
}

/// The portable twin of `avx512::f32_to_planes`.
pub(crate) fn tables_to_planes_scalar(t: &mut [f32]) {
    for tj in t.chunks_exact_mut(CODEBOOK_ENTRIES) {
        let mut p = [0u8; PLANE_BYTES];
        for (c, v) in tj.iter().enumerate() {
            for (b, byte) in v.to_le_bytes().into_iter().enumerate() {
                p[b * CODEBOOK_ENTRIES + c] = byte;
            }
        }
        for (o, w) in tj.iter_mut().zip(p.as_chunks::<4>().0) {
            // Stored as raw bytes: the f32 view is only storage.
            *o = f32::from_ne_bytes(*w);
        }
    }
}

/// `rvq_rows` on plane-layout tables (`tables_to_planes`): the same sums,
/// bit for bit. Runs the AVX-512 kernel where the CPU has it, else its
/// portable twin.
#[inline]
pub(crate) fn rvq_rows_planes(planes: &[f32], codes: &[u8], n: usize, c0: usize, c1: usize, acc: &mut [f32]) {
    assert!(
        c0 <= c1 && c1 <= n && planes.len() >= c1 * CODEBOOK_ENTRIES && codes.len() >= acc.len() * n,
        "rvq_rows_planes: inconsistent lengths"
    );
    let pb = table_bytes(planes);
    #[cfg(target_arch = "x86_64")]
    if isa_available(Isa::Avx512) {
        const BLOCK: usize = 2 * avx512::GROUP_ROWS;
        for (b, a) in acc.chunks_mut(BLOCK).enumerate() {
            let cp = codes[b * BLOCK * n..].as_ptr();
            // SAFETY: AVX-512 F/BW/VBMI were detected; the block's rows
            // (a.len() of them, from row b*BLOCK) hold positions 0..n inside
            // `codes`, `planes` holds c1 positions (checked above).
            unsafe {
                if a.len() > avx512::GROUP_ROWS {
                    avx512::rvq_rows::<2>(pb.as_ptr(), cp, n, c0, c1, a.len(), a.as_mut_ptr())
                } else {
                    avx512::rvq_rows::<1>(pb.as_ptr(), cp, n, c0, c1, a.len(), a.as_mut_ptr())
                }
            }
        }
        return;
    }
    rvq_rows_planes_scalar(pb, codes, n, c0, c1, acc)
}

/// Portable twin of the AVX-512 row kernel on plane-layout table bytes.
pub(crate) fn rvq_rows_planes_scalar(planes: &[u8], codes: &[u8], n: usize, c0: usize, c1: usize, acc: &mut [f32]) {
    for (r, a) in acc.iter_mut().enumerate() {
        for (j, &c) in codes[r * n..r * n + c1].iter().enumerate().skip(c0) {
            let t = &planes[j * PLANE_BYTES + c as usize..];
            let e = CODEBOOK_ENTRIES;
            *a += f32::from_le_bytes([t[0], t[e], t[2 * e], t[3 * e]]);
        }
    }
}

/// Hint the cache hierarchy (L2) to fetch `bytes`; no effect on results.
#[inline]
pub(crate) fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        // SAFETY: SSE is part of x86-64; a prefetch never faults and the
        // address lies inside `bytes`.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(line.as_ptr() as *const i8) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// Lookup tables `out[(v*stages+s)*E + c] = x[8v..8v+8] . cb_s[c]` from
/// the transposed codebooks `cbt[(s*8+d)*E + c]` (`E` = `entries`, a
/// multiple of 16); `x` is zero-padded to whole vectors.
pub(crate) fn build_tables(x: &[f32], cbt: &[f32], stages: usize, entries: usize, out: &mut [f32]) {
    let nvec = x.len().div_ceil(VDIM);
    assert!(
        entries.is_multiple_of(16) && cbt.len() == stages * VDIM * entries && out.len() == nvec * stages * entries,
        "build_tables: inconsistent lengths"
    );
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and FMA were detected on this CPU.
        return unsafe { avx2::build_tables(x, cbt, stages, entries, out) };
    }
    #[cfg(target_arch = "aarch64")]
    if isa() == Isa::Neon {
        // SAFETY: NEON is the aarch64 baseline.
        return unsafe { neon::build_tables(x, cbt, stages, entries, out) };
    }
    build_tables_generic(x, cbt, stages, entries, out)
}

/// Rows by inputs of `QMatrix::matmul`'s register tiles (AVX2: 12
/// accumulators, 3 inputs and a weight vector fill the 16 registers).
/// Only the x86-64 kernel tiles; elsewhere the portable loop runs.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const TILE_ROWS: usize = 4;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const TILE_INPUTS: usize = 3;

/// `out[i * nt + t] = dot8(w row i, x row t)` for the `nr = w.len() / cols`
/// rows of `w` and the `nt = x.len() / cols` rows of `x`: the matmul's
/// pair product, computed in register tiles of several rows against several
/// inputs (each vector load feeds three or four FMAs instead of one).
///
/// `dot8` (`dot8_scalar`) is one definition on every level: eight lanes,
/// lane `l` accumulating the fused products of positions `l, l + 8, ..`
/// below the last multiple of 8, the lanes summed as
/// `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`, then the tail's
/// products added (unfused) in order. A pair's value depends on its row and
/// input alone, never on the tile, the block or the thread it ran in.
pub fn matmul_block(w: &[f32], x: &[f32], cols: usize, out: &mut [f32]) {
    assert!(
        cols > 0
            && w.len().is_multiple_of(cols)
            && x.len().is_multiple_of(cols)
            && out.len() == (w.len() / cols) * (x.len() / cols),
        "matmul_block: inconsistent lengths"
    );
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and FMA were detected; lengths checked above.
        return unsafe { avx2::matmul_block(w, x, cols, out) };
    }
    matmul_block_scalar(w, x, cols, out)
}

/// `matmul_block`'s inputs laid out once for the many blocks of rows a
/// caller runs against them: on AVX-512 F two inputs to a vector
/// (`avx512f::pair_inputs`), elsewhere as they are.
pub(crate) struct BlockInputs<'a> {
    x: &'a [f32],
    cols: usize,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    paired: Option<Vec<f32>>,
}

impl<'a> BlockInputs<'a> {
    pub(crate) fn new(x: &'a [f32], cols: usize) -> Self {
        assert!(cols > 0 && x.len().is_multiple_of(cols), "BlockInputs: x is not whole rows");
        #[cfg(target_arch = "x86_64")]
        if has_avx512f() {
            return BlockInputs { x, cols, paired: Some(avx512f::pair_inputs(x, cols)) };
        }
        BlockInputs { x, cols, paired: None }
    }

    /// `matmul_block(w, x, cols, out)`: the same bits.
    pub(crate) fn matmul_block(&self, w: &[f32], out: &mut [f32]) {
        let (x, cols) = (self.x, self.cols);
        assert!(
            w.len().is_multiple_of(cols) && out.len() == (w.len() / cols) * (x.len() / cols),
            "BlockInputs::matmul_block: inconsistent lengths"
        );
        #[cfg(target_arch = "x86_64")]
        if let Some(paired) = &self.paired {
            // SAFETY: `paired` exists only where AVX-512 F was detected
            // (and AVX2 + FMA with it); lengths checked above.
            return unsafe { avx512f::matmul_paired(w, x, paired, cols, out) };
        }
        matmul_block(w, x, cols, out)
    }
}

/// The passes of a `weighted_rows` kernel over `nq` queries and `nk`
/// keys: keys in runs of `keys_per_pass` (their value rows stay in L2
/// while every block of queries passes over them; each output's chain
/// still runs over the keys in order, its accumulator stored and reloaded
/// exactly between runs), queries in blocks of `block(left)` for `left`
/// queries still to do. `f(t, j0, q, keys)` covers queries `t..t + q` and
/// keys `j0..j0 + keys`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn for_each_weighted_block(
    nq: usize,
    nk: usize,
    keys_per_pass: usize,
    block: impl Fn(usize) -> usize,
    mut f: impl FnMut(usize, usize, usize, usize),
) {
    let mut j0 = 0;
    while j0 < nk {
        let keys = (nk - j0).min(keys_per_pass);
        let mut t = 0;
        while t < nq {
            let q = block(nq - t).clamp(1, nq - t);
            f(t, j0, q, keys);
            t += q;
        }
        j0 += keys;
    }
}

/// The tiles of an `nr x nt` block: whole `TILE_ROWS x TILE_INPUTS` tiles,
/// then the leftover inputs of each row group one at a time, then each
/// leftover row against input groups and single inputs. `f(r, t, rr, tt)`
/// covers rows `r..r + rr` and inputs `t..t + tt`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn for_each_tile(nr: usize, nt: usize, mut f: impl FnMut(usize, usize, usize, usize)) {
    let (whole_r, whole_t) = (nr / TILE_ROWS * TILE_ROWS, nt / TILE_INPUTS * TILE_INPUTS);
    for r in (0..whole_r).step_by(TILE_ROWS) {
        for t in (0..whole_t).step_by(TILE_INPUTS) {
            f(r, t, TILE_ROWS, TILE_INPUTS);
        }
        for t in whole_t..nt {
            f(r, t, TILE_ROWS, 1);
        }
    }
    for r in whole_r..nr {
        for t in (0..whole_t).step_by(TILE_INPUTS) {
            f(r, t, 1, TILE_INPUTS);
        }
        for t in whole_t..nt {
            f(r, t, 1, 1);
        }
    }
}

// ---------------------------------------------------------------- scalar

pub(crate) fn dot_f32_scalar(w: &[f32], x: &[f32]) -> f32 {
    // Four chains so the scalar fallback is not latency bound.
    let mut acc = [0f32; 4];
    let wc = w.chunks_exact(4);
    let xc = x.chunks_exact(4);
    let (wr, xr) = (wc.remainder(), xc.remainder());
    for (a, b) in wc.zip(xc) {
        for k in 0..4 {
            acc[k] += a[k] * b[k];
        }
    }
    let mut s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    for (a, b) in wr.iter().zip(xr) {
        s += a * b;
    }
    s
}

pub(crate) fn dot_q8_scalar(scales: &[u8], q: &[u8], x: &[f32]) -> f32 {
    let mut total = 0f32;
    for (g, (qg, xg)) in q.chunks(GROUP).zip(x.chunks(GROUP)).enumerate() {
        let mut acc = [0f32; 4];
        let qc = qg.chunks_exact(4);
        let xc = xg.chunks_exact(4);
        let (qr, xr) = (qc.remainder(), xc.remainder());
        for (a, b) in qc.zip(xc) {
            for k in 0..4 {
                acc[k] += (a[k] as i8) as f32 * b[k];
            }
        }
        let mut s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        for (a, b) in qr.iter().zip(xr) {
            s += (*a as i8) as f32 * b;
        }
        total += f16_at(scales, g) * s;
    }
    total
}

/// The matmul's pair product (`matmul_block`'s definition): eight fused
/// lanes, a fixed lane sum, the tail unfused.
pub(crate) fn dot8_scalar(w: &[f32], x: &[f32]) -> f32 {
    let (wc, xc) = (w.as_chunks::<8>(), x.as_chunks::<8>());
    let mut l = [0f32; 8];
    for (a, b) in wc.0.iter().zip(xc.0) {
        for k in 0..8 {
            l[k] = fused_mul_add(a[k], b[k], l[k]);
        }
    }
    let mut s = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    for (a, b) in wc.1.iter().zip(xc.1) {
        s += a * b;
    }
    s
}

/// The constants of `attend::exp_scalar` (Cephes' `expf`: the reduction by a
/// two-part ln 2, the minimax polynomial on [-ln2/2, ln2/2]).
pub(crate) mod exp_consts {
    pub const LOG2E: f32 = std::f32::consts::LOG2_E;
    pub const LN2_HI: f32 = 0.693_359_4;
    pub const LN2_LO: f32 = -2.121_944_4e-4;
    pub const POLY: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5];
    /// Below this `exp` is under f32's smallest normal; it returns zero
    /// (the reduction's `2^n` needs n >= -126).
    pub const FLOOR: f32 = -87.0;
}

/// `a * b + c` rounded once, as the FMA instruction does. On aarch64 that
/// is `mul_add` (FMA is baseline there). Elsewhere `mul_add` may be a C
/// library call, and MinGW's `fmaf` is not fused (12 ulps off under wine,
/// where CI caught it), so it is computed here: the product is exact in
/// f64, the sum is rounded to odd (Boldo and Melquiond: then rounding to
/// f32 is correct, 53 >= 24 + 2 bits), infinities and NaNs as f64 gives them.
#[inline]
pub(crate) fn fused_mul_add(a: f32, b: f32, c: f32) -> f32 {
    if cfg!(target_arch = "aarch64") {
        return a.mul_add(b, c);
    }
    let p = a as f64 * b as f64;
    let c = c as f64;
    let s = p + c;
    if !s.is_finite() {
        return s as f32;
    }
    // TwoSum: s + e == p + c exactly.
    let pb = s - c;
    let e = (p - pb) + (c - (s - pb));
    let bits = s.to_bits();
    let odd = if e != 0.0 && bits & 1 == 0 {
        // One ulp toward the exact sum (bits + 1 moves away from zero).
        f64::from_bits(if (e > 0.0) == (s > 0.0) { bits + 1 } else { bits - 1 })
    } else {
        s
    };
    odd as f32
}

pub(crate) fn matmul_block_scalar(w: &[f32], x: &[f32], cols: usize, out: &mut [f32]) {
    let nt = x.len() / cols;
    for (i, wr) in w.chunks_exact(cols).enumerate() {
        for (t, xt) in x.chunks_exact(cols).enumerate() {
            out[i * nt + t] = dot8_scalar(wr, xt);
        }
    }
}

/// The definition of an RVQ row: `sum_j table[j*256 + codes[j]]`, summed in
/// order. Every `rvq_rows` level equals it bit for bit (the tests hold
/// them to it).
#[cfg(test)]
pub(crate) fn rvq_row_scalar(table: &[f32], codes: &[u8]) -> f32 {
    let mut s = 0f32;
    for (j, &c) in codes.iter().enumerate() {
        s += table[j * CODEBOOK_ENTRIES + c as usize];
    }
    s
}

/// Eight rows at once: their codes read 8 at a time as one `u64` per row,
/// then one scalar load + add per code; eight independent add chains.
/// Written with raw pointers so that no bounds check sits in the loop.
///
/// # Safety
/// Rows `0..8` of `cp` (stride `n`) hold positions `c0..c1` (`c1 <= n`);
/// `tp` holds `c1 * 256` floats.
#[inline(always)]
unsafe fn rvq_rows8(tp: *const f32, cp: *const u8, n: usize, c0: usize, c1: usize, acc: &mut [f32; RVQ_ROWS]) {
    const E: usize = CODEBOOK_ENTRIES;
    let mut s = *acc;
    let mut j = c0;
    while j + 8 <= c1 {
        let mut w = [0u64; RVQ_ROWS];
        for (r, wr) in w.iter_mut().enumerate() {
            // SAFETY: j + 8 <= c1 <= n keeps the 8 bytes inside row r.
            *wr = u64::from_le(unsafe { std::ptr::read_unaligned(cp.add(r * n + j) as *const u64) });
        }
        for k in 0..8 {
            // SAFETY: j + k < c1, so table j+k lies inside `tp`.
            let t = unsafe { tp.add((j + k) * E) };
            for r in 0..RVQ_ROWS {
                // SAFETY: a code is < 256, inside its table.
                s[r] += unsafe { *t.add((w[r] & 255) as usize) };
                w[r] >>= 8;
            }
        }
        j += 8;
    }
    while j < c1 {
        // SAFETY: j < c1: as above, one byte per row.
        let t = unsafe { tp.add(j * E) };
        for (r, sr) in s.iter_mut().enumerate() {
            // SAFETY: byte j of row r is inside the rows; a code is < 256.
            *sr += unsafe { *t.add(*cp.add(r * n + j) as usize) };
        }
        j += 1;
    }
    *acc = s;
}

/// Written so that the per-entry loop vectorises; each output is the same
/// sequence of IEEE mul/add in every build (no FMA contraction in Rust), so
/// the AVX2 clone is bit-identical to the scalar one.
#[inline(always)]
pub(crate) fn build_tables_generic(x: &[f32], cbt: &[f32], stages: usize, entries: usize, out: &mut [f32]) {
    let e = entries;
    for (v, tv) in out.chunks_exact_mut(stages * e).enumerate() {
        let mut xv = [0f32; VDIM];
        for (d, xd) in xv.iter_mut().enumerate() {
            *xd = x.get(v * VDIM + d).copied().unwrap_or(0.0);
        }
        for (s, t) in tv.chunks_exact_mut(e).enumerate() {
            let cb = &cbt[s * VDIM * e..(s + 1) * VDIM * e];
            // Blocks of 16 entries stay in registers across all 8 dims:
            // one store per entry instead of a load+store per dim.
            for (b, tb) in t.chunks_exact_mut(16).enumerate() {
                let mut acc = [0f32; 16];
                for (d, &xd) in xv.iter().enumerate() {
                    let cd: &[f32; 16] = &cb[d * e + 16 * b..].as_chunks::<16>().0[0];
                    for k in 0..16 {
                        acc[k] += xd * cd[k];
                    }
                }
                tb.copy_from_slice(&acc);
            }
        }
    }
}

// ---------------------------------------------------------------- AVX2

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512f;

#[cfg(target_arch = "aarch64")]
pub(crate) mod neon;
