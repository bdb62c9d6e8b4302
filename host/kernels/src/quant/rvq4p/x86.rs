//! The x86-64 `rvq4p` kernels (AVX2 byte shuffles, and AVX-512 VBMI),
//! bit-identical to the portable kernel in `rvq4p/mod.rs`.

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
            let look =
                |s: usize, c: __m512i| _mm512_permutexvar_epi8(c, _mm512_loadu_si512(t.add(s * ENTRIES) as *const _));
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
