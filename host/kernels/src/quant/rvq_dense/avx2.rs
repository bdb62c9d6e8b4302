//! `DenseRvq::dots_at` on AVX2 + FMA: a row's vector is its stages'
//! entries added in a register, never stored, and fused into the row's
//! eight-lane accumulator; the lanes are summed in `dot8`'s order
//! (`simd::avx2::hsum`) and a partial last vector is added unfused, as
//! `simd::dot8_scalar` does. Several rows at once share each load of `x`.

use super::DenseRvq;
use crate::quant::simd::avx2::hsum;
use crate::quant::VDIM;
use std::arch::x86_64::*;

/// Rows per pass: four accumulators, each row's three entry loads and two
/// adds independent of the others'.
const ROWS: usize = 4;

/// `ys[i] = dot8(q_{r0 + i}, x)`.
///
/// # Safety
/// The CPU has AVX2 and FMA; `m` has 2 or 3 stages, rows `r0..r0 +
/// ys.len()` and `x.len() == m.cols`.
pub(super) unsafe fn dots(m: &DenseRvq<'_>, r0: usize, x: &[f32], ys: &mut [f32]) {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        match m.books.stages() {
            2 => dots_of::<2>(m, r0, x, ys),
            _ => dots_of::<3>(m, r0, x, ys),
        }
    }
}

/// # Safety
/// As `dots`, with `S` the stage count.
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_of<const S: usize>(m: &DenseRvq<'_>, r0: usize, x: &[f32], ys: &mut [f32]) {
    let books: [*const f32; S] = std::array::from_fn(|s| m.books.stage_entries(s).as_ptr());
    let at = Row { per_row: m.codes_per_row(), whole: m.cols / VDIM, tail: m.cols % VDIM };
    let (mut i, nr) = (0, ys.len());
    while i < nr {
        // SAFETY: rows r0 + i.. exist (the caller's contract), their codes
        // are `per_row` apart; every code indexes its stage's 256 (rvq3,
        // rvq2) entries; `x` holds `cols` floats.
        unsafe {
            let codes = m.codes.as_ptr().add((r0 + i) * at.per_row);
            if i + ROWS <= nr {
                rows::<S, ROWS>(&books, codes, x.as_ptr(), at, &mut ys[i..i + ROWS]);
                i += ROWS;
            } else {
                rows::<S, 1>(&books, codes, x.as_ptr(), at, &mut ys[i..i + 1]);
                i += 1;
            }
        }
    }
}

/// A row's layout: its codes' stride, whole vectors and the values of a
/// partial last one.
#[derive(Clone, Copy)]
struct Row {
    per_row: usize,
    whole: usize,
    tail: usize,
}

/// `out[r] = dot8(q, x)` for the `R` rows whose codes start at `codes`.
///
/// # Safety
/// AVX2 and FMA; `R` rows of `at.per_row` codes at `codes`, each code below
/// its stage's entry count; `x` holds `VDIM * at.whole + at.tail` floats.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn rows<const S: usize, const R: usize>(
    books: &[*const f32; S],
    codes: *const u8,
    x: *const f32,
    at: Row,
    out: &mut [f32],
) {
    let Row { per_row, whole, tail } = at;
    let mut acc = [_mm256_setzero_ps(); R];
    for v in 0..whole {
        // SAFETY: vector v of x and of each row's codes (the contract);
        // an entry is VDIM floats at VDIM * code.
        unsafe {
            let xv = _mm256_loadu_ps(x.add(VDIM * v));
            for (r, a) in acc.iter_mut().enumerate() {
                let c = codes.add(r * per_row + S * v);
                let mut q = _mm256_loadu_ps(books[0].add(VDIM * *c as usize));
                for (s, book) in books.iter().enumerate().skip(1) {
                    q = _mm256_add_ps(q, _mm256_loadu_ps(book.add(VDIM * *c.add(s) as usize)));
                }
                *a = _mm256_fmadd_ps(q, xv, *a);
            }
        }
    }
    for (r, (a, o)) in acc.iter().zip(out.iter_mut()).enumerate() {
        let mut sum = hsum(*a);
        // SAFETY: the partial vector `whole` of row r and of x.
        unsafe {
            let c = codes.add(r * per_row + S * whole);
            for d in 0..tail {
                let mut q = *books[0].add(VDIM * *c as usize + d);
                for (s, book) in books.iter().enumerate().skip(1) {
                    q += *book.add(VDIM * *c.add(s) as usize + d);
                }
                sum += q * *x.add(VDIM * whole + d);
            }
        }
        *o = sum;
    }
}

/// `DenseRvq::row_values` of row `r`: each whole vector's entries added in
/// a register and stored (the same adds in the same order, so the same
/// bits), a partial last vector as the portable loop does it.
///
/// # Safety
/// The CPU has AVX2; `m` has 2 or 3 stages of 256 entries, row `r` exists
/// and `out.len() == m.cols`.
pub(super) unsafe fn row_values(m: &DenseRvq<'_>, r: usize, out: &mut [f32]) {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        match m.books.stages() {
            2 => row_values_of::<2>(m, r, out),
            _ => row_values_of::<3>(m, r, out),
        }
    }
}

/// # Safety
/// As `row_values`, with `S` the stage count.
#[target_feature(enable = "avx2")]
unsafe fn row_values_of<const S: usize>(m: &DenseRvq<'_>, r: usize, out: &mut [f32]) {
    let books: [*const f32; S] = std::array::from_fn(|s| m.books.stage_entries(s).as_ptr());
    let codes = m.row_codes(r);
    let whole = m.cols / VDIM;
    for (o, c) in out.chunks_exact_mut(VDIM).zip(codes.chunks_exact(S)).take(whole) {
        // SAFETY: each code indexes its stage's 256 entries of VDIM floats;
        // `o` is VDIM floats.
        unsafe {
            let mut q = _mm256_loadu_ps(books[0].add(VDIM * c[0] as usize));
            for (s, book) in books.iter().enumerate().skip(1) {
                q = _mm256_add_ps(q, _mm256_loadu_ps(book.add(VDIM * c[s] as usize)));
            }
            _mm256_storeu_ps(o.as_mut_ptr(), q);
        }
    }
    if whole * VDIM < m.cols {
        m.vector_values(&codes[S * whole..S * (whole + 1)], &mut out[whole * VDIM..]);
    }
}
