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
    if rows * cols >= super::trunk::PAR_MIN_WORK && rows > chunk {
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
        acc.len() % ROWS == 0
            && planes.len() == n * per
            && t.q.len() == nvec * TBYTES
            && t.scales.len() == nvec.div_ceil(TBLK),
        "rvq4p blocks: inconsistent lengths"
    );
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
mod x86 {
    use super::{ENTRIES, ROWS, TBLK, TBYTES, VBYTES};
    use std::arch::x86_64::*;

    /// 32 rows' 6-bit codes of one vector from the three planes.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn codes(p: *const u8) -> [__m256i; 4] {
        // SAFETY: the caller guarantees VBYTES readable bytes at `p`.
        let b0 = _mm256_loadu_si256(p as *const __m256i);
        let b1 = _mm256_loadu_si256(p.add(ROWS) as *const __m256i);
        let b2 = _mm256_loadu_si256(p.add(2 * ROWS) as *const __m256i);
        // 16-bit shifts carry bits across bytes; the masks drop them.
        let c3 = _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16(b0, 6), _mm256_set1_epi8(0x03)),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(b1, 4), _mm256_set1_epi8(0x0C)),
                _mm256_and_si256(_mm256_srli_epi16(b2, 2), _mm256_set1_epi8(0x30)),
            ),
        );
        let m = _mm256_set1_epi8(63);
        [_mm256_and_si256(b0, m), _mm256_and_si256(b1, m), _mm256_and_si256(b2, m), c3]
    }

    /// 64-entry byte lookup: four in-lane shuffles, then bits 4 and 5 of
    /// the code pick among them (`blendv` reads bit 7 of each byte).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn lookup64(t: *const i8, c: __m256i) -> __m256i {
        // SAFETY: the caller guarantees 64 readable bytes at `t`.
        let tb = |j: usize| _mm256_broadcastsi128_si256(_mm_loadu_si128(t.add(16 * j) as *const __m128i));
        let s4 = _mm256_slli_epi16(c, 3);
        let s5 = _mm256_slli_epi16(c, 2);
        let lo = _mm256_blendv_epi8(_mm256_shuffle_epi8(tb(0), c), _mm256_shuffle_epi8(tb(1), c), s4);
        let hi = _mm256_blendv_epi8(_mm256_shuffle_epi8(tb(2), c), _mm256_shuffle_epi8(tb(3), c), s4);
        _mm256_blendv_epi8(lo, hi, s5)
    }

    /// `acc += cvt(isum) * ts` in row order, from the i16 sums laid out as
    /// `lo = [rows 0-7 | 16-23]`, `hi = [rows 8-15 | 24-31]` (what the
    /// in-lane unpacks produce).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn flush(lo: __m256i, hi: __m256i, ts: f32, acc: &mut [__m256; 4]) {
        let s = _mm256_set1_ps(ts);
        let parts = [
            _mm256_castsi256_si128(lo),
            _mm256_castsi256_si128(hi),
            _mm256_extracti128_si256(lo, 1),
            _mm256_extracti128_si256(hi, 1),
        ];
        for (a, p) in acc.iter_mut().zip(parts) {
            let f = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(p));
            *a = _mm256_add_ps(*a, _mm256_mul_ps(f, s));
        }
    }

    /// # Safety
    /// The CPU supports AVX2; `planes.len() == nvec * VBYTES`,
    /// `q.len() == nvec * TBYTES`, `scales.len() == ceil(nvec / TBLK)`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn block_avx2(planes: &[u8], q: &[i8], scales: &[f32], nvec: usize, out: &mut [f32; ROWS]) {
        let ones = _mm256_set1_epi8(1);
        let mut acc = [_mm256_setzero_ps(); 4];
        for (b, &ts) in scales.iter().enumerate() {
            let mut lo = _mm256_setzero_si256();
            let mut hi = _mm256_setzero_si256();
            for v in b * TBLK..((b + 1) * TBLK).min(nvec) {
                // SAFETY: v < nvec, so VBYTES code bytes and TBYTES table
                // bytes lie inside `planes` and `q`.
                let c = codes(planes.as_ptr().add(v * VBYTES));
                let t = q.as_ptr().add(v * TBYTES);
                let r0 = lookup64(t, c[0]);
                let r1 = lookup64(t.add(ENTRIES), c[1]);
                let r2 = lookup64(t.add(2 * ENTRIES), c[2]);
                let r3 = lookup64(t.add(3 * ENTRIES), c[3]);
                // maddubs(1, pairs) adds two stages of one row into an i16.
                let l = _mm256_add_epi16(
                    _mm256_maddubs_epi16(ones, _mm256_unpacklo_epi8(r0, r1)),
                    _mm256_maddubs_epi16(ones, _mm256_unpacklo_epi8(r2, r3)),
                );
                let h = _mm256_add_epi16(
                    _mm256_maddubs_epi16(ones, _mm256_unpackhi_epi8(r0, r1)),
                    _mm256_maddubs_epi16(ones, _mm256_unpackhi_epi8(r2, r3)),
                );
                lo = _mm256_add_epi16(lo, l);
                hi = _mm256_add_epi16(hi, h);
            }
            flush(lo, hi, ts, &mut acc);
        }
        for (k, a) in acc.iter().enumerate() {
            // SAFETY: 4 x 8 floats fill exactly the 32 of `out`.
            _mm256_storeu_ps(out.as_mut_ptr().add(8 * k), *a);
        }
    }

    /// Two row blocks at once: byte lanes 0-31 are block `a`, 32-63 block
    /// `b`, and one 64-entry `vpermb` per stage looks up all 64 rows.
    ///
    /// # Safety
    /// The CPU supports AVX-512 F/BW/VBMI and AVX2; `pa` and `pb` each hold
    /// `nvec * VBYTES` bytes, `q.len() == nvec * TBYTES`,
    /// `scales.len() == ceil(nvec / TBLK)`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx2")]
    pub(super) unsafe fn block2_avx512(
        pa: &[u8],
        pb: &[u8],
        q: &[i8],
        scales: &[f32],
        nvec: usize,
        oa: &mut [f32; ROWS],
        ob: &mut [f32; ROWS],
    ) {
        let ones = _mm512_set1_epi8(1);
        let mut acc_a = [_mm256_setzero_ps(); 4];
        let mut acc_b = [_mm256_setzero_ps(); 4];
        for (b, &ts) in scales.iter().enumerate() {
            let mut lo = _mm512_setzero_si512();
            let mut hi = _mm512_setzero_si512();
            for v in b * TBLK..((b + 1) * TBLK).min(nvec) {
                // SAFETY: v < nvec, so VBYTES code bytes of both blocks and
                // TBYTES table bytes lie inside `pa`, `pb` and `q`.
                let (a, bb) = (pa.as_ptr().add(v * VBYTES), pb.as_ptr().add(v * VBYTES));
                let ld = |off: usize| -> __m512i {
                    let x = _mm256_loadu_si256(a.add(off) as *const __m256i);
                    let y = _mm256_loadu_si256(bb.add(off) as *const __m256i);
                    _mm512_inserti64x4(_mm512_castsi256_si512(x), y, 1)
                };
                let (b0, b1, b2) = (ld(0), ld(ROWS), ld(2 * ROWS));
                let c3 = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi16(b0, 6), _mm512_set1_epi8(0x03)),
                    _mm512_or_si512(
                        _mm512_and_si512(_mm512_srli_epi16(b1, 4), _mm512_set1_epi8(0x0C)),
                        _mm512_and_si512(_mm512_srli_epi16(b2, 2), _mm512_set1_epi8(0x30)),
                    ),
                );
                let t = q.as_ptr().add(v * TBYTES);
                // vpermb reads the low 6 bits of each index, so the plane
                // bytes need no mask.
                let look = |s: usize, c: __m512i| {
                    _mm512_permutexvar_epi8(c, _mm512_loadu_si512(t.add(s * ENTRIES) as *const _))
                };
                let (r0, r1, r2, r3) = (look(0, b0), look(1, b1), look(2, b2), look(3, c3));
                let l = _mm512_add_epi16(
                    _mm512_maddubs_epi16(ones, _mm512_unpacklo_epi8(r0, r1)),
                    _mm512_maddubs_epi16(ones, _mm512_unpacklo_epi8(r2, r3)),
                );
                let h = _mm512_add_epi16(
                    _mm512_maddubs_epi16(ones, _mm512_unpackhi_epi8(r0, r1)),
                    _mm512_maddubs_epi16(ones, _mm512_unpackhi_epi8(r2, r3)),
                );
                lo = _mm512_add_epi16(lo, l);
                hi = _mm512_add_epi16(hi, h);
            }
            // Each 256-bit half has the AVX2 kernel's lane layout.
            flush(_mm512_castsi512_si256(lo), _mm512_castsi512_si256(hi), ts, &mut acc_a);
            flush(_mm512_extracti64x4_epi64(lo, 1), _mm512_extracti64x4_epi64(hi, 1), ts, &mut acc_b);
        }
        for k in 0..4 {
            // SAFETY: 4 x 8 floats fill exactly the 32 of each output.
            _mm256_storeu_ps(oa.as_mut_ptr().add(8 * k), acc_a[k]);
            _mm256_storeu_ps(ob.as_mut_ptr().add(8 * k), acc_b[k]);
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use super::{ENTRIES, ROWS, TBLK, TBYTES, VBYTES};
    use std::arch::aarch64::*;

    /// # Safety
    /// NEON is available (aarch64 baseline); lengths as for the scalar
    /// kernel: `planes.len() == nvec * VBYTES`, `q.len() == nvec * TBYTES`,
    /// `scales.len() == ceil(nvec / TBLK)`.
    #[target_feature(enable = "neon")]
    pub(super) unsafe fn block_neon(planes: &[u8], q: &[i8], scales: &[f32], nvec: usize, out: &mut [f32; ROWS]) {
        let mut acc = [vdupq_n_f32(0.0); 8];
        for (b, &ts) in scales.iter().enumerate() {
            // i16 sums of rows 0-7, 8-15, 16-23, 24-31.
            let mut s16 = [vdupq_n_s16(0); 4];
            for v in b * TBLK..((b + 1) * TBLK).min(nvec) {
                // SAFETY: v < nvec keeps every load inside `planes` / `q`.
                let p = planes.as_ptr().add(v * VBYTES);
                let t = q.as_ptr().add(v * TBYTES);
                let tab = |s: usize| -> int8x16x4_t {
                    let o = t.add(s * ENTRIES);
                    int8x16x4_t(vld1q_s8(o), vld1q_s8(o.add(16)), vld1q_s8(o.add(32)), vld1q_s8(o.add(48)))
                };
                let tabs = [tab(0), tab(1), tab(2), tab(3)];
                for h in 0..2 {
                    let b0 = vld1q_u8(p.add(16 * h));
                    let b1 = vld1q_u8(p.add(ROWS + 16 * h));
                    let b2 = vld1q_u8(p.add(2 * ROWS + 16 * h));
                    let m = vdupq_n_u8(63);
                    let c3 = vorrq_u8(
                        vshrq_n_u8(b0, 6),
                        vorrq_u8(vshlq_n_u8(vshrq_n_u8(b1, 6), 2), vshlq_n_u8(vshrq_n_u8(b2, 6), 4)),
                    );
                    let r0 = vqtbl4q_s8(tabs[0], vandq_u8(b0, m));
                    let r1 = vqtbl4q_s8(tabs[1], vandq_u8(b1, m));
                    let r2 = vqtbl4q_s8(tabs[2], vandq_u8(b2, m));
                    let r3 = vqtbl4q_s8(tabs[3], c3);
                    let lo = vaddq_s16(
                        vaddl_s8(vget_low_s8(r0), vget_low_s8(r1)),
                        vaddl_s8(vget_low_s8(r2), vget_low_s8(r3)),
                    );
                    let hi = vaddq_s16(vaddl_high_s8(r0, r1), vaddl_high_s8(r2, r3));
                    s16[2 * h] = vaddq_s16(s16[2 * h], lo);
                    s16[2 * h + 1] = vaddq_s16(s16[2 * h + 1], hi);
                }
            }
            let sv = vdupq_n_f32(ts);
            for (j, s) in s16.iter().enumerate() {
                let lo = vcvtq_f32_s32(vmovl_s16(vget_low_s16(*s)));
                let hi = vcvtq_f32_s32(vmovl_high_s16(*s));
                // Separate multiply and add, as in the scalar kernel.
                acc[2 * j] = vaddq_f32(acc[2 * j], vmulq_f32(lo, sv));
                acc[2 * j + 1] = vaddq_f32(acc[2 * j + 1], vmulq_f32(hi, sv));
            }
        }
        for (k, a) in acc.iter().enumerate() {
            // SAFETY: 8 x 4 floats fill exactly the 32 of `out`.
            vst1q_f32(out.as_mut_ptr().add(4 * k), *a);
        }
    }
}
