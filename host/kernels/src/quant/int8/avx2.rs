//! The integer row products on AVX2: `maddubs` pairs and `madd` by ones
//! form the definition's sixteen int32 lanes as two vectors of eight.
//! Nibbles (0..15) times codes (-127..127) cannot saturate `maddubs`'s
//! int16 pairs.

use super::{padded_group, Int8Inputs, Row, GROUP_BYTES, LANES};
use crate::quant::simd::f16_at;
use crate::quant::GROUP;
use std::arch::x86_64::*;

/// Inputs per tile: two f32 accumulators an input.
const TILE: usize = 4;

/// `out[i]` = the row dotted with input `first + i`, bit for bit
/// `dot_rows_scalar`.
///
/// # Safety
/// The CPU supports AVX2 and FMA; the row's lengths agree with `inputs`
/// and `first + out.len() <= inputs.inputs()` (checked by the caller).
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_rows(row: Row<'_>, inputs: &Int8Inputs, first: usize, out: &mut [f32]) {
    let mut t = first;
    for o in out.chunks_mut(TILE) {
        // SAFETY: as this function's; inputs t..t+o.len() exist.
        unsafe {
            if let Ok(tile) = <&mut [f32; TILE]>::try_from(&mut *o) {
                tile_dots::<TILE>(row, inputs, t, tile);
            } else {
                for (i, v) in o.iter_mut().enumerate() {
                    let mut one = [0f32];
                    tile_dots::<1>(row, inputs, t + i, &mut one);
                    *v = one[0];
                }
            }
        }
        t += o.len();
    }
}

/// Eight int32 lanes: `u * c` summed over each four bytes (`u` unsigned).
#[inline(always)]
unsafe fn lanes(u: __m256i, c: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, c), _mm256_set1_epi16(1))
}

#[inline(always)]
unsafe fn load(p: *const u8) -> __m256i {
    // SAFETY: the caller's 32 readable bytes.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// # Safety
/// As `dot_rows`, for inputs `first..first + N`.
#[inline(always)]
unsafe fn tile_dots<const N: usize>(row: Row<'_>, inputs: &Int8Inputs, first: usize, out: &mut [f32; N]) {
    let groups = inputs.groups;
    let mut f = [[_mm256_setzero_ps(); 2]; N];
    let mut buf = [0u8; GROUP_BYTES];
    let nib = _mm256_set1_epi8(0x0F);
    for g in 0..groups {
        let ws = f16_at(row.scales, g);
        // Weight vector w[k] meets codes c[32k..32k+32]: lanes 0..8 come
        // from w[0] and w[2], lanes 8..16 from w[1] and w[3].
        let b = padded_group(row.q, g, &mut buf).as_ptr();
        let (v0, v1) = (load(b), load(b.add(32)));
        let w = [
            _mm256_and_si256(v0, nib),
            _mm256_and_si256(v1, nib),
            _mm256_and_si256(_mm256_srli_epi16::<4>(v0), nib),
            _mm256_and_si256(_mm256_srli_epi16::<4>(v1), nib),
        ];
        for (i, fi) in f.iter_mut().enumerate() {
            let at = (first + i) * groups + g;
            // SAFETY: input first+i exists, so its group g's 128 codes and
            // 16 init lanes lie inside the buffers.
            let c = inputs.codes.as_ptr().add(at * GROUP) as *const u8;
            let init = inputs.init.as_ptr().add(at * LANES) as *const u8;
            let acc = [
                _mm256_add_epi32(load(init), _mm256_add_epi32(lanes(w[0], load(c)), lanes(w[2], load(c.add(64))))),
                _mm256_add_epi32(
                    load(init.add(32)),
                    _mm256_add_epi32(lanes(w[1], load(c.add(32))), lanes(w[3], load(c.add(96)))),
                ),
            ];
            let s = _mm256_set1_ps(ws * *inputs.scales.get_unchecked(at));
            fi[0] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(acc[0]), fi[0]);
            fi[1] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(acc[1]), fi[1]);
        }
    }
    for (o, fi) in out.iter_mut().zip(&f) {
        let h8 = _mm256_add_ps(fi[0], fi[1]);
        let h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps::<1>(h8));
        let h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
        *o = _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps::<1>(h2, h2)));
    }
}
