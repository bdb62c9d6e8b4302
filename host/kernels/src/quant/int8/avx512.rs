//! The integer row products on AVX-512 VNNI: one `vpdpbusd` adds 64 codes
//! into the definition's sixteen int32 lanes, so a 128-value group is two
//! instructions per input. Inputs go in tiles of
//! eight, sharing each loaded and unpacked weight group.

use super::{padded_group, Int8Inputs, Row, GROUP_BYTES, LANES};
use crate::quant::simd::f16_at;
use crate::quant::GROUP;
use std::arch::x86_64::*;

/// Inputs per tile: eight f32 accumulators, the two weight registers and
/// temporaries fit the 32 vector registers.
const TILE: usize = 8;

/// Whether this CPU has AVX-512 F/BW/VNNI (probed by std, cached there).
pub(crate) fn detected() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni")
}

/// `out[i]` = the row dotted with input `first + i`, bit for bit
/// `dot_rows_scalar`.
///
/// # Safety
/// The CPU supports AVX-512 F/BW/VNNI; the row's lengths agree with
/// `inputs` and `first + out.len() <= inputs.inputs()` (checked by the
/// caller).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
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

/// # Safety
/// As `dot_rows`, for inputs `first..first + N`.
#[inline(always)]
unsafe fn tile_dots<const N: usize>(row: Row<'_>, inputs: &Int8Inputs, first: usize, out: &mut [f32; N]) {
    let groups = inputs.groups;
    let mut f = [_mm512_setzero_ps(); N];
    let mut buf = [0u8; GROUP_BYTES];
    let nib = _mm512_set1_epi8(0x0F);
    for g in 0..groups {
        // Low nibbles meet codes 0..64, high ones codes 64..128.
        let v = _mm512_loadu_si512(padded_group(row.q, g, &mut buf).as_ptr() as *const _);
        let (w0, w1) = (_mm512_and_si512(v, nib), _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib));
        let ws = f16_at(row.scales, g);
        for (i, fi) in f.iter_mut().enumerate() {
            let at = (first + i) * groups + g;
            // SAFETY: input first+i exists, so its group g's 128 codes and
            // 16 init lanes lie inside the buffers.
            let c = inputs.codes.as_ptr().add(at * GROUP);
            let mut acc = _mm512_loadu_si512(inputs.init.as_ptr().add(at * LANES) as *const _);
            acc = _mm512_dpbusd_epi32(acc, w0, _mm512_loadu_si512(c as *const _));
            acc = _mm512_dpbusd_epi32(acc, w1, _mm512_loadu_si512(c.add(64) as *const _));
            let s = _mm512_set1_ps(ws * *inputs.scales.get_unchecked(at));
            *fi = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(acc), *fi);
        }
    }
    for (o, fi) in out.iter_mut().zip(&f) {
        *o = reduce(*fi);
    }
}

/// The definition's lane tree: lanes `i` and `i + 8`, then `i + 4`, ...
#[inline(always)]
unsafe fn reduce(v: __m512) -> f32 {
    let h8 =
        _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))));
    let h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps::<1>(h8));
    let h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
    _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps::<1>(h2, h2)))
}
