//! The AVX-512 (F/BW/VBMI) rvq3/rvq2 row kernel of `simd`, chosen at run
//! time (`simd::rvq_planes`), bit-identical to the scalar definition
//! `rvq_row_scalar` (and to its plane-layout twin `rvq_rows_planes_scalar`).
//!
//! Lanes are rows. A position's 256-entry f32 table is held as four byte
//! planes (`PLANE_BYTES` = 4 x 256 bytes, byte `b` of every entry
//! together, `f32_to_planes`), so one two-source byte permute (`vpermi2b`,
//! 128 entries) per half plane looks up 64 rows at once: 8 permutes and 4
//! blends give four bytes for 64 rows, two rounds of unpacks reassemble
//! them into 64 exact f32 table entries, and one `vaddps` per 16 rows adds
//! them to the rows' running sums. Each row's sum is still the in-order
//! sequence of the same IEEE additions, so the result equals the scalar
//! loop bit for bit. The row-major codes are transposed per 16-position
//! chunk into per-position vectors of 64 rows (`transpose_codes`).

use super::super::CODEBOOK_ENTRIES;
use std::arch::x86_64::*;

use super::PLANE_BYTES;
/// Positions per code transpose.
pub(crate) const CHUNK: usize = 16;
/// Rows per lane group (one byte per row in a 512-bit register).
pub(crate) const GROUP_ROWS: usize = 64;

/// Converts `n` f32 tables of 256 entries in place to the plane layout:
/// position `j`'s bytes become `[b][c]` = byte `b` (little endian) of entry
/// `c`.
///
/// # Safety
/// The CPU supports AVX-512 F/BW/VBMI; `t` holds `n * 1024` bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
pub(crate) unsafe fn f32_to_planes(t: *mut u8, n: usize) {
    // SAFETY: 64 readable bytes.
    let perm = _mm512_loadu_si512(FLOATS_TO_PLANES.as_ptr() as *const _);
    for j in 0..n {
        // SAFETY: j < n, so the position's 1024 bytes lie inside `t`.
        let p = t.add(j * PLANE_BYTES);
        let mut f = [_mm512_setzero_si512(); 16];
        for (i, v) in f.iter_mut().enumerate() {
            // SAFETY: bytes 64i..64i+64 of the position.
            *v = _mm512_permutexvar_epi8(perm, _mm512_loadu_si512(p.add(64 * i) as *const _));
        }
        // Lane b of f[4q+t] is plane b of entries 16(4q+t)..: a 4x4
        // transpose of 128-bit lanes per quad of registers.
        for q in 0..4 {
            let (f0, f1, f2, f3) = (f[4 * q], f[4 * q + 1], f[4 * q + 2], f[4 * q + 3]);
            let a = _mm512_shuffle_i32x4::<0x44>(f0, f1);
            let b = _mm512_shuffle_i32x4::<0x44>(f2, f3);
            let c = _mm512_shuffle_i32x4::<0xEE>(f0, f1);
            let d = _mm512_shuffle_i32x4::<0xEE>(f2, f3);
            let o = [
                _mm512_shuffle_i32x4::<0x88>(a, b),
                _mm512_shuffle_i32x4::<0xDD>(a, b),
                _mm512_shuffle_i32x4::<0x88>(c, d),
                _mm512_shuffle_i32x4::<0xDD>(c, d),
            ];
            for (pl, v) in o.iter().enumerate() {
                // SAFETY: plane pl, entries 64q..64q+64, inside the position.
                _mm512_storeu_si512(p.add(pl * CODEBOOK_ENTRIES + 64 * q) as *mut _, *v);
            }
        }
    }
}

/// The row held by byte lane `i` of a transposed code vector, chosen so
/// that the unpacks of `add_position` leave row `16k + d` in dword `d` of
/// accumulator `k` (natural order). The loads use it through `rho`.
#[cfg(test)]
const fn sigma(i: usize) -> usize {
    16 * ((i % 16) / 4) + 4 * (i / 16) + i % 4
}

/// Within 16 floats: byte `16b + e` <- byte `4e + b`.
const FLOATS_TO_PLANES: [u8; 64] = {
    let mut idx = [0u8; 64];
    let mut k = 0;
    while k < 64 {
        idx[k] = (4 * (k % 16) + k / 16) as u8;
        k += 1;
    }
    idx
};

/// The row loaded into 128-bit lane `l` of transpose register `g`, so
/// that the in-lane byte transpose leaves row `sigma(16l + g)` in byte
/// `16l + g` of every position's vector.
const fn rho(l: usize, g: usize) -> usize {
    16 * (g / 4) + 4 * l + g % 4
}

/// Codes of rows `0..rows` (`rows <= 64`, row stride `n`) at positions
/// `c0..c0 + len` (`len <= 16`): `out[p]` byte `i` = code of row
/// `sigma(i)` at position `c0 + p`; rows past `rows` read as 0.
///
/// Register `g` holds rows `rho(l, g)` in its lanes `l` (16 positions
/// each); a 16x16 byte transpose inside each 128-bit lane (four rounds of
/// the perfect shuffle, `unpack{lo,hi}_epi8` of registers `i` and `i + 8`)
/// then turns registers into positions.
///
/// # Safety
/// The CPU supports AVX-512 F/BW/VBMI; bytes `r*n + c0 .. r*n + c0 + len`
/// of `codes` are readable for every `r < rows`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn transpose_codes(codes: *const u8, n: usize, rows: usize, c0: usize, len: usize, out: &mut [__m512i; CHUNK]) {
    let mut z = [_mm512_setzero_si512(); 16];
    if rows == GROUP_ROWS && len == CHUNK {
        // The common case, straight-line so that `z` stays in registers:
        // one broadcast load per row, merged into its lane.
        for (g, zg) in z.iter_mut().enumerate() {
            // SAFETY: rows rho(l, g) < 64 = rows; bytes c0..c0+16 readable.
            let p = codes.add(rho(0, g) * n + c0);
            // rho(l, g) = rho(0, g) + 4l: lane l is 4l rows further on.
            let v = _mm512_broadcast_i32x4(_mm_loadu_si128(p as *const __m128i));
            let v = _mm512_mask_broadcast_i32x4(v, 0x00F0, _mm_loadu_si128(p.add(4 * n) as *const __m128i));
            let v = _mm512_mask_broadcast_i32x4(v, 0x0F00, _mm_loadu_si128(p.add(8 * n) as *const __m128i));
            *zg = _mm512_mask_broadcast_i32x4(v, 0xF000, _mm_loadu_si128(p.add(12 * n) as *const __m128i));
        }
    } else {
        let kmask: u64 = (1u64 << len) - 1;
        for (g, zg) in z.iter_mut().enumerate() {
            for l in 0..4 {
                let r = rho(l, g);
                if r < rows {
                    // SAFETY: the mask selects bytes 16l..16l+len of the
                    // window, which are the row's bytes c0..c0+len
                    // (readable); masked-out bytes are never accessed
                    // (AVX-512 fault suppression), so the window's start may
                    // lie outside the slice (wrapping_sub).
                    let p = codes.add(r * n + c0).wrapping_sub(16 * l);
                    *zg = _mm512_mask_loadu_epi8(*zg, kmask << (16 * l), p as *const i8);
                }
            }
        }
    }
    for _ in 0..4 {
        let mut b = [_mm512_setzero_si512(); 16];
        for i in 0..8 {
            b[2 * i] = _mm512_unpacklo_epi8(z[i], z[i + 8]);
            b[2 * i + 1] = _mm512_unpackhi_epi8(z[i], z[i + 8]);
        }
        z = b;
    }
    *out = z;
}

/// Rows `0..rows` (`rows <= 64 * G`, stride `n` in `codes`) over positions
/// `c0..c1`: `acc[r] += table[j][code[r][j]]` for `j` ascending, with the
/// tables in plane layout at `planes`.
///
/// # Safety
/// The CPU supports AVX-512 F/BW/VBMI; `c0 <= c1`; positions `c0..c1` of
/// every row `r < rows` lie inside `codes` (row `r` starts at `r * n`);
/// `planes` holds `c1 * PLANE_BYTES` bytes; `acc` holds `rows` floats.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[allow(clippy::needless_range_loop)] // indices run over G groups at once
pub(crate) unsafe fn rvq_rows<const G: usize>(
    planes: *const u8,
    codes: *const u8,
    n: usize,
    c0: usize,
    c1: usize,
    rows: usize,
    acc: *mut f32,
) {
    let mut cnt = [0usize; G];
    let mut a = [[_mm512_setzero_ps(); 4]; G];
    for g in 0..G {
        cnt[g] = rows.saturating_sub(GROUP_ROWS * g).min(GROUP_ROWS);
        for (k, ak) in a[g].iter_mut().enumerate() {
            let m = lane_mask(cnt[g], k);
            // SAFETY: the mask covers only rows < rows of `acc`.
            *ak = _mm512_maskz_loadu_ps(m, acc.add(GROUP_ROWS * g + 16 * k));
        }
    }
    let mut tc = [[_mm512_setzero_si512(); CHUNK]; G];
    let mut j0 = c0;
    while j0 < c1 {
        let len = (c1 - j0).min(CHUNK);
        for g in 0..G {
            // SAFETY: rows GROUP_ROWS*g + r (r < cnt[g]) are rows < rows,
            // positions j0..j0+len lie within c0..c1.
            transpose_codes(codes.add(GROUP_ROWS * g * n), n, cnt[g], j0, len, &mut tc[g]);
        }
        for p in 0..len {
            // SAFETY: position j0 + p < c1, inside `planes`.
            let t = planes.add((j0 + p) * PLANE_BYTES);
            let mut c = [_mm512_setzero_si512(); G];
            let mut m = [0u64; G];
            for g in 0..G {
                c[g] = tc[g][p];
                m[g] = _mm512_movepi8_mask(c[g]);
            }
            let mut bytes = [[_mm512_setzero_si512(); 4]; G];
            for b in 0..4 {
                // SAFETY: plane b's 256 bytes lie inside the position.
                let pb = t.add(b * CODEBOOK_ENTRIES);
                let t0 = _mm512_loadu_si512(pb as *const _);
                let t1 = _mm512_loadu_si512(pb.add(64) as *const _);
                let t2 = _mm512_loadu_si512(pb.add(128) as *const _);
                let t3 = _mm512_loadu_si512(pb.add(192) as *const _);
                for g in 0..G {
                    // Index bit 6 picks the second table of a pair, bit 7
                    // (the mask) the upper pair.
                    let lo = _mm512_permutex2var_epi8(t0, c[g], t1);
                    let hi = _mm512_permutex2var_epi8(t2, c[g], t3);
                    bytes[g][b] = _mm512_mask_blend_epi8(m[g], lo, hi);
                }
            }
            for g in 0..G {
                let [b0, b1, b2, b3] = bytes[g];
                let (l01, h01) = (_mm512_unpacklo_epi8(b0, b1), _mm512_unpackhi_epi8(b0, b1));
                let (l23, h23) = (_mm512_unpacklo_epi8(b2, b3), _mm512_unpackhi_epi8(b2, b3));
                let f = [
                    _mm512_unpacklo_epi16(l01, l23),
                    _mm512_unpackhi_epi16(l01, l23),
                    _mm512_unpacklo_epi16(h01, h23),
                    _mm512_unpackhi_epi16(h01, h23),
                ];
                for k in 0..4 {
                    // Same operand order as the scalar `acc += entry`.
                    a[g][k] = _mm512_add_ps(a[g][k], _mm512_castsi512_ps(f[k]));
                }
            }
        }
        j0 += len;
    }
    for g in 0..G {
        for (k, ak) in a[g].iter().enumerate() {
            // SAFETY: as for the loads.
            _mm512_mask_storeu_ps(acc.add(GROUP_ROWS * g + 16 * k), lane_mask(cnt[g], k), *ak);
        }
    }
}

/// Mask of the rows among `16k..16k+16` that are `< cnt`.
#[inline(always)]
fn lane_mask(cnt: usize, k: usize) -> __mmask16 {
    let live = cnt.saturating_sub(16 * k).min(16);
    ((1u32 << live) - 1) as __mmask16
}

#[cfg(test)]
mod tests {
    #[test]
    fn sigma_is_a_permutation() {
        let mut seen = [false; 64];
        for i in 0..64 {
            seen[super::sigma(i)] = true;
        }
        assert!(seen.iter().all(|&s| s));
        for l in 0..4 {
            for g in 0..16 {
                assert_eq!(super::rho(l, g), super::sigma(16 * l + g));
            }
        }
    }
}
