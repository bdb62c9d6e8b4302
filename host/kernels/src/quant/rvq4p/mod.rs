//! `rvq4p`: 4 stages x 64 entries (3 bits per weight) with int8 lookup
//! tables, so a table lookup is a byte shuffle over 32 rows at once.
//!
//! Layout: module docs of `quant` (row blocks of 32, three code planes).
//!
//! # Arithmetic (identical on every ISA)
//!
//! The float tables `T[v][s][c] = x_v . cb_s[c]` are quantised per block of
//! `TBLK` vectors: `ts[b] = max|T| / 127` over the block, `q = round(T /
//! ts[b])` in `[-127, 127]`. A row then computes, in this order,
//!
//! ```text
//! acc = 0f32
//! for each block b:  isum = sum over v in b, s of q[v][s][code]   (exact i32)
//!                    acc  = acc + (isum as f32) * ts[b]          (mul, then add)
//! y = f16 row scale * acc
//! ```
//!
//! Integer sums are exact in any order, and the float steps are the same
//! IEEE operations in the same order in every path (no fused multiply-add),
//! so the scalar, AVX2, AVX-512 and NEON kernels are bit-identical.
//! `|isum| <= TBLK * 4 * 127 = 16256` also fits the i16 lanes the SIMD
//! paths accumulate in.

use super::simd::Isa;
use super::VDIM;
use rayon::prelude::*;

/// Stages of an `rvq4p` code.
pub(crate) const STAGES: usize = 4;
/// Entries per stage.
pub(crate) const ENTRIES: usize = 64;
/// Rows per code block (one 256-bit register of byte lanes).
pub(crate) const ROWS: usize = 32;
/// Vectors per table-scale block (bounded by the i16 accumulators).
pub(crate) const TBLK: usize = 32;
/// Code bytes of one vector of one row block: three planes of 32.
const VBYTES: usize = 3 * ROWS;
/// Table bytes of one vector: 4 stages x 64 entries.
const TBYTES: usize = STAGES * ENTRIES;
/// Row blocks per rayon task.
const PAR_BLOCKS: usize = 2;

/// Bytes of an `rvq4p` matrix `[rows, cols]` (saturating).
pub(crate) fn mat_len(rows: usize, cols: usize) -> usize {
    let blocks = rows.div_ceil(ROWS);
    rows.saturating_mul(2).saturating_add(blocks.saturating_mul(cols.div_ceil(VDIM)).saturating_mul(VBYTES))
}

/// Packs per-row codes `[rows][nvec][4]` (each < 64) into the blocked planes.
pub(crate) fn pack_codes(codes: &[u8], rows: usize, nvec: usize, out: &mut [u8]) {
    debug_assert_eq!(codes.len(), rows * nvec * STAGES);
    debug_assert_eq!(out.len(), rows.div_ceil(ROWS) * nvec * VBYTES);
    out.fill(0);
    for r in 0..rows {
        let (blk, k) = (r / ROWS, r % ROWS);
        for v in 0..nvec {
            let c = &codes[(r * nvec + v) * STAGES..][..STAGES];
            let p = &mut out[(blk * nvec + v) * VBYTES..][..VBYTES];
            p[k] = c[0] | (c[3] & 3) << 6;
            p[ROWS + k] = c[1] | (c[3] >> 2 & 3) << 6;
            p[2 * ROWS + k] = c[2] | (c[3] >> 4 & 3) << 6;
        }
    }
}

/// The 4 codes of vector `v` of row `r` (inverse of `pack_codes`).
pub(crate) fn row_codes(planes: &[u8], nvec: usize, r: usize, v: usize) -> [u8; STAGES] {
    let (blk, k) = (r / ROWS, r % ROWS);
    let p = &planes[(blk * nvec + v) * VBYTES..][..VBYTES];
    let (b0, b1, b2) = (p[k], p[ROWS + k], p[2 * ROWS + k]);
    [b0 & 63, b1 & 63, b2 & 63, b0 >> 6 | (b1 >> 6) << 2 | (b2 >> 6) << 4]
}

/// Quantised lookup tables of one input: `q[v][s][c]` and one scale per
/// block of `TBLK` vectors.
#[derive(Debug, Clone, Default)]
pub(crate) struct QTables {
    pub q: Vec<i8>,
    pub scales: Vec<f32>,
}

impl QTables {
    pub fn with_len(nvec: usize) -> QTables {
        QTables { q: vec![0; nvec * TBYTES], scales: vec![0.0; nvec.div_ceil(TBLK)] }
    }

    pub fn nvec(&self) -> usize {
        self.q.len() / TBYTES
    }

    /// Quantise float tables `[nvec][4][64]` into `self` (sized by
    /// `with_len(nvec)`). A block whose maximum is not finite gets a NaN
    /// scale, so a NaN or infinite activation shows in the output as NaN
    /// instead of vanishing.
    pub fn quantize_from(&mut self, t: &[f32]) {
        assert_eq!(t.len(), self.q.len(), "rvq4p tables: length");
        let job = |(tb, (qb, sb)): (&[f32], (&mut [i8], &mut f32))| {
            let m = tb.iter().fold(0f32, |m, v| if v.abs() > m || v.is_nan() { v.abs() } else { m });
            if m == 0.0 || !m.is_finite() {
                qb.fill(0);
                *sb = if m == 0.0 { 0.0 } else { f32::NAN };
                return;
            }
            let inv = 127.0 / m;
            for (q, &v) in qb.iter_mut().zip(tb) {
                let y = v * inv;
                // Half away from zero, clamped: |y| <= 127 up to rounding.
                *q = ((y + 0.5f32.copysign(y)) as i32).clamp(-127, 127) as i8;
            }
            *sb = m / 127.0;
        };
        let chunk = TBLK * TBYTES;
        if self.q.len() >= 4 * chunk {
            t.par_chunks(chunk).zip(self.q.par_chunks_mut(chunk).zip(self.scales.par_iter_mut())).for_each(job);
        } else {
            t.chunks(chunk).zip(self.q.chunks_mut(chunk).zip(self.scales.iter_mut())).for_each(job);
        }
    }
}

/// `y = W x` for an `rvq4p` matrix over `bytes` (length `mat_len`), with
/// tables built from `x`. Row blocks go to rayon tasks; each row is computed
/// whole by one task, so the thread count never changes the result.
pub(crate) fn matvec(isa: Isa, bytes: &[u8], rows: usize, cols: usize, t: &QTables, y: &mut [f32]) {
    let nvec = cols.div_ceil(VDIM);
    assert!(
        bytes.len() == mat_len(rows, cols) && y.len() == rows && t.nvec() == nvec,
        "rvq4p matvec: inconsistent lengths"
    );
    let (scales, planes) = bytes.split_at(2 * rows);
    let per = nvec * VBYTES;
    // Up to PAR_BLOCKS row blocks per call; the last block may be short.
    let run = |b0: usize, ys: &mut [f32]| {
        let nb = ys.len().div_ceil(ROWS);
        let mut acc = [0f32; ROWS * PAR_BLOCKS];
        blocks(isa, &planes[b0 * per..(b0 + nb) * per], t, nvec, &mut acc[..nb * ROWS]);
        for (k, yv) in ys.iter_mut().enumerate() {
            *yv = super::simd::f16_at(scales, b0 * ROWS + k) * acc[k];
        }
    };
    let chunk = ROWS * PAR_BLOCKS;
    if rows * cols >= super::decoded::PAR_MIN_WORK && rows > chunk {
        y.par_chunks_mut(chunk).enumerate().for_each(|(i, ys)| run(i * PAR_BLOCKS, ys));
    } else {
        for (i, ys) in y.chunks_mut(chunk).enumerate() {
            run(i * PAR_BLOCKS, ys);
        }
    }
}

/// `acc` (before the row scale) of consecutive row blocks: `planes` holds
/// `acc.len() / 32` blocks. A level this build or CPU lacks falls back to
/// the scalar kernel, which gives the same bits.
pub(crate) fn blocks(isa: Isa, planes: &[u8], t: &QTables, nvec: usize, acc: &mut [f32]) {
    let per = nvec * VBYTES;
    let n = acc.len() / ROWS;
    assert!(
        acc.len().is_multiple_of(ROWS)
            && planes.len() == n * per
            && t.q.len() == nvec * TBYTES
            && t.scales.len() == nvec.div_ceil(TBLK),
        "rvq4p blocks: inconsistent lengths"
    );
    // Blocks done in pairs by the AVX-512 kernel; the rest one at a time.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut b = 0;
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && super::simd::isa_available(Isa::Avx512) {
        while b + 2 <= n {
            let (pair, _) = acc[b * ROWS..(b + 2) * ROWS].as_chunks_mut::<ROWS>();
            let [oa, ob] = pair else { break };
            let (pa, pb) = planes[b * per..(b + 2) * per].split_at(per);
            // SAFETY: AVX-512 F/BW/VBMI and AVX2 were detected on this CPU;
            // lengths checked above.
            unsafe { x86::block2_avx512(pa, pb, &t.q, &t.scales, nvec, oa, ob) };
            b += 2;
        }
    }
    for (pl, o) in planes[b * per..].chunks_exact(per).zip(acc[b * ROWS..].as_chunks_mut::<ROWS>().0.iter_mut()) {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 | Isa::Avx512 if super::simd::isa_available(Isa::Avx2) => {
                // SAFETY: AVX2 was detected on this CPU; lengths checked
                // above.
                unsafe { x86::block_avx2(pl, &t.q, &t.scales, nvec, o) }
            }
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => {
                // SAFETY: NEON is part of the aarch64 baseline; lengths
                // checked above.
                unsafe { neon::block_neon(pl, &t.q, &t.scales, nvec, o) }
            }
            _ => block_scalar(pl, &t.q, &t.scales, nvec, o),
        }
    }
}

/// The portable reference (module docs, "Arithmetic").
pub(crate) fn block_scalar(planes: &[u8], q: &[i8], scales: &[f32], nvec: usize, acc: &mut [f32; ROWS]) {
    *acc = [0.0; ROWS];
    for (b, &ts) in scales.iter().enumerate() {
        let mut isum = [0i32; ROWS];
        for v in b * TBLK..((b + 1) * TBLK).min(nvec) {
            let p = &planes[v * VBYTES..][..VBYTES];
            let t = &q[v * TBYTES..][..TBYTES];
            for (k, s) in isum.iter_mut().enumerate() {
                let (b0, b1, b2) = (p[k], p[ROWS + k], p[2 * ROWS + k]);
                let c3 = (b0 >> 6 | (b1 >> 6) << 2 | (b2 >> 6) << 4) as usize;
                *s += t[(b0 & 63) as usize] as i32
                    + t[ENTRIES + (b1 & 63) as usize] as i32
                    + t[2 * ENTRIES + (b2 & 63) as usize] as i32
                    + t[3 * ENTRIES + c3] as i32;
            }
        }
        for (a, &s) in acc.iter_mut().zip(&isum) {
            *a += s as f32 * ts;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(target_arch = "aarch64")]
mod neon;
