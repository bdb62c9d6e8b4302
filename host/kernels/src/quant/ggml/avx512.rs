//! AVX-512 form of `avx2::dot_rows` for Q8_0: the same operations on two
//! rows per 512-bit vector, each row's eight lanes in one half, so each
//! row gets the bits `avx2::dot_rows` (and `matmul_block` on the twin's
//! values) gives it, for half the instructions.
//!
//! Why: the AVX2 form spends three floating-point operations (convert,
//! scale, fused add) per eight values of a row, all on the two ports that
//! take them, so a thread computed at most 2.7 products a cycle, about 7
//! GMAC/s here: a Q8_0 LM head read from DRAM at 7 GB/s where the thread
//! reads q8 at 14.

use std::arch::x86_64::*;

use super::avx2::{h16, hsum};
use super::GgmlType;

/// Rows per call: four pairs, four independent FMA chains per step of
/// eight values, enough to cover the FMA latency.
pub(super) const ROWS: usize = 8;

/// Whether this CPU, at the kernel level in force, runs `dot_rows` for
/// `ty`.
pub(super) fn runs(ty: GgmlType) -> bool {
    static FEATURES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let features = *FEATURES.get_or_init(|| {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512dq") && is_x86_feature_detected!("f16c")
    });
    ty == GgmlType::Q8_0 && features && crate::quant::simd::isa() == crate::quant::simd::Isa::Avx512
}

/// `out[i] = dot8(row i's values, x)` for the `ROWS` Q8_0 rows of `rows`
/// (each `row_bytes` long), decoded in registers: row `2p` in the low half
/// of pair `p`'s vectors, row `2p + 1` in the high half, each half the
/// operations `avx2::dot_rows` runs on that row in the same order.
///
/// # Safety
/// The CPU supports AVX-512F, AVX-512DQ, AVX2, FMA and F16C (`runs`).
#[target_feature(enable = "avx512f,avx512dq,avx2,fma,f16c")]
pub(super) unsafe fn dot_rows(rows: &[u8], row_bytes: usize, x: &[f32], out: &mut [f32; ROWS]) {
    const PAIRS: usize = ROWS / 2;
    let (be, bb) = (GgmlType::Q8_0.block_elems(), GgmlType::Q8_0.block_bytes());
    assert!(rows.len() == ROWS * row_bytes && x.len() / be * bb == row_bytes && x.len().is_multiple_of(be));
    let mut acc = [_mm512_setzero_ps(); PAIRS];
    // SAFETY (all pointer arithmetic and loads): each row's blocks are 34
    // bytes (an f16 scale, 32 codes) inside `rows`, and block `blk`'s
    // inputs are x[blk * 32..][..32], asserted above.
    let row: [*const u8; ROWS] = std::array::from_fn(|i| rows.as_ptr().add(i * row_bytes));
    for blk in 0..row_bytes / bb {
        let block: [*const u8; ROWS] = std::array::from_fn(|i| row[i].add(blk * bb));
        // The next rows' block, as `avx2::dot_rows` asks for it.
        for i in 0..ROWS {
            // Past the matrix's end this names memory it never touches: a
            // prefetch reads nothing and faults on no address.
            let ahead = rows.as_ptr().wrapping_add((ROWS + i) * row_bytes + blk * bb);
            _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
        }
        let scale = |i: usize| h16(std::slice::from_raw_parts(block[i], 2), 0);
        let d: [__m512; PAIRS] = std::array::from_fn(|p| {
            _mm512_insertf32x8::<1>(_mm512_set1_ps(scale(2 * p)), _mm256_set1_ps(scale(2 * p + 1)))
        });
        for k in 0..4 {
            let xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(x.as_ptr().add(blk * be + 8 * k)));
            for p in 0..PAIRS {
                let low = _mm_loadl_epi64(block[2 * p].add(2 + 8 * k) as *const __m128i);
                let high = block[2 * p + 1].add(2 + 8 * k) as *const f64;
                let both = _mm_castpd_si128(_mm_loadh_pd(_mm_castsi128_pd(low), high));
                let q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(both));
                acc[p] = _mm512_fmadd_ps(_mm512_mul_ps(q, d[p]), xv, acc[p]);
            }
        }
    }
    for (p, a) in acc.into_iter().enumerate() {
        out[2 * p] = hsum(_mm512_castps512_ps256(a));
        out[2 * p + 1] = hsum(_mm512_extractf32x8_ps::<1>(a));
    }
}
