//! The int16 Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS products: every level against the definition
//! (`row_scalar`) bit for bit, the definition against the f32 product of
//! ggml's values within the input rounding's bound, and every entry point
//! of such a matrix giving the same bits.

use super::*;
use crate::quant::ggml::{dequantize_row, GgmlMatrix, GgmlType};
use crate::quant::kmeans::Rng;

/// Random Q4_K (or, `fmt`, Q5_K) super-blocks with f16 `d` and `dmin` of a
/// trained file's size (about 1e-3) and every scale, min, nibble and fifth
/// bit random.
fn q4k_rows(rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    q4k_like_rows(Format::Q4K, rows, cols, rng)
}

fn q4k_like_rows(fmt: Format, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    rows_with_d_dmin(fmt, 0, rows, cols, rng)
}

/// Random super-blocks of `fmt` whose f16 `d` and `dmin`, at bytes `at`
/// and `at + 2`, are about 1e-3 (a trained file's size); every other bit
/// random.
fn rows_with_d_dmin(fmt: Format, at: usize, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let sbb = fmt.super_bytes();
    let mut bytes: Vec<u8> = (0..rows * cols / SUPER * sbb).map(|_| rng.below(256) as u8).collect();
    for b in bytes.chunks_exact_mut(sbb) {
        let d = half::f16::from_f32(0.5e-3 + 1e-3 * rng.unit() as f32).to_le_bytes();
        let dmin = half::f16::from_f32(0.2e-3 + 1e-3 * rng.unit() as f32).to_le_bytes();
        b[at..at + 2].copy_from_slice(&d);
        b[at + 2..at + 4].copy_from_slice(&dmin);
    }
    bytes
}

/// Random Q6_K super-blocks: every quant bit and int8 scale random, an f16
/// `d` of a trained file's size (about 1e-4, so `d * sc` is about 1e-2).
fn q6k_rows(rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    rows_with_d(Format::Q6K, 208, rows, cols, rng)
}

/// Random super-blocks of `fmt` whose one f16 scale `d`, at byte `d_at`,
/// is about 1e-4 (a trained file's size: for IQ4_XS `d * (ls - 32)` is
/// then up to about 3e-3 and a weight up to about 0.4); every other bit
/// random.
fn rows_with_d(fmt: Format, d_at: usize, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let sbb = fmt.super_bytes();
    let mut bytes: Vec<u8> = (0..rows * cols / SUPER * sbb).map(|_| rng.below(256) as u8).collect();
    for b in bytes.chunks_exact_mut(sbb) {
        let d = half::f16::from_f32(0.5e-4 + 1e-4 * rng.unit() as f32).to_le_bytes();
        b[d_at..d_at + 2].copy_from_slice(&d);
    }
    bytes
}

fn rows_of(fmt: Format, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    match fmt {
        Format::Q4K | Format::Q5K => q4k_like_rows(fmt, rows, cols, rng),
        Format::Q6K => q6k_rows(rows, cols, rng),
        Format::Iq4Xs => rows_with_d(fmt, 0, rows, cols, rng),
        Format::Q3K => rows_with_d(fmt, 108, rows, cols, rng),
        Format::Q2K => rows_with_d_dmin(fmt, 80, rows, cols, rng),
    }
}

const FORMATS: [Format; 6] = [Format::Q2K, Format::Q3K, Format::Q4K, Format::Q5K, Format::Q6K, Format::Iq4Xs];

fn ggml_type(fmt: Format) -> GgmlType {
    match fmt {
        Format::Q4K => GgmlType::Q4K,
        Format::Q5K => GgmlType::Q5K,
        Format::Q6K => GgmlType::Q6K,
        Format::Iq4Xs => GgmlType::Iq4Xs,
        Format::Q3K => GgmlType::Q3K,
        Format::Q2K => GgmlType::Q2K,
    }
}

/// Q2_K's, Q3_K's and Q6_K's value `i` as `group_value` reads it is
/// ggml's: its dequantised value is the group's scale times it, less the
/// group's min (`group_scales`; Q2_K's `dl * q - ml`, the others' `dl * q`).
#[test]
fn q2k_q3k_and_q6k_values_are_ggmls() {
    let mut rng = Rng::new(4);
    for fmt in [Format::Q2K, Format::Q3K, Format::Q6K] {
        let b = rows_of(fmt, 1, SUPER, &mut rng);
        let mut values = vec![0f32; SUPER];
        dequantize_row(ggml_type(fmt), &b, &mut values);
        let (d1, m1) = group_scales(fmt, &b);
        for (i, &v) in values.iter().enumerate() {
            let (d1, m1, q) = (d1[i / 16], m1[i / 16], group_value(fmt, &b, i) as f32);
            let want = if fmt.has_mins() { d1 * q - m1 } else { d1 * q };
            assert_eq!(v.to_bits(), want.to_bits(), "{fmt:?} value {i}");
        }
        if fmt == Format::Q2K {
            assert!(m1.iter().any(|&m| m > 0.0) && (0..SUPER).any(|i| group_value(fmt, &b, i) == 3), "{fmt:?}: no min");
        }
    }
}

/// Q4_K's, Q5_K's and IQ4_XS's value `l` of sub-block `j` as `q4k_value`
/// reads it is ggml's: its dequantised value is `d * sc_j * q - dmin *
/// m_j` (IQ4_XS's `dl * kvalues_iq4nl[q]`, no min).
#[test]
fn q4k_q5k_and_iq4xs_values_are_ggmls() {
    let mut rng = Rng::new(6);
    for fmt in [Format::Q4K, Format::Q5K, Format::Iq4Xs] {
        let b = rows_of(fmt, 1, SUPER, &mut rng);
        let mut values = vec![0f32; SUPER];
        dequantize_row(ggml_type(fmt), &b, &mut values);
        let (d1, m1) = super_scales(fmt, &b);
        for (i, &v) in values.iter().enumerate() {
            let (j, l) = (i / SUB, i % SUB);
            assert_eq!(
                v.to_bits(),
                (d1[j] * f32::from(q4k_value(fmt, &b, j, l)) - m1[j]).to_bits(),
                "{fmt:?} value {i}"
            );
        }
        if fmt == Format::Q5K {
            assert!((0..SUPER).any(|i| q4k_value(fmt, &b, i / SUB, i % SUB) >= 16), "no fifth bit set");
        }
    }
}

/// Gaussian-ish inputs with a few outliers, a zero sub-block and a tiny
/// one (where the scale is far below 1).
fn xs(n: usize, cols: usize, rng: &mut Rng) -> Vec<f32> {
    let mut x: Vec<f32> = (0..n * cols).map(|_| (rng.unit() as f32 - 0.5) * 2.0).collect();
    for (i, v) in x.iter_mut().enumerate() {
        if i % 97 == 5 {
            *v *= 40.0;
        }
    }
    x[..SUB].fill(0.0);
    if x.len() >= 3 * SUB {
        x[2 * SUB..3 * SUB].iter_mut().for_each(|v| *v *= 1e-30);
    }
    x
}

fn levels() -> Vec<Level> {
    let all = [Level::Scalar, Level::Avx2, Level::Avx512Vnni];
    let got: Vec<Level> = all.into_iter().filter(|l| l.available()).collect();
    if got.len() == 1 {
        crate::skip::report_skip("SKIP int16 SIMD comparison: this CPU runs only the scalar definition");
    }
    got
}

#[test]
fn scale_bytes_are_get_scale_min_k4() {
    let mut rng = Rng::new(3);
    for _ in 0..2000 {
        let s: [u8; 12] = std::array::from_fn(|_| rng.below(256) as u8);
        let got = scale_bytes(&s);
        for j in 0..8 {
            let (sc, m) = scale_min_k4(j, &s);
            assert_eq!((f32::from(got[j]), f32::from(got[8 + j])), (sc, m), "{s:?} sub-block {j}");
        }
    }
}

/// Every level gives the definition's bits: one super-block (half a
/// window), whole and partial windows, one row and several, one input and
/// many (prefill's transposed blocks), a zero and a tiny sub-block, and NaN
/// where an input is not finite.
#[test]
fn every_int16_level_equals_the_definition_bit_for_bit() {
    let mut rng = Rng::new(11);
    let levels = levels();
    // From four inputs AVX-512 takes blocks of sixteen rows in tiles of
    // eight inputs: partial blocks, whole and partial tiles.
    for fmt in FORMATS {
        for (rows, cols, n) in
            [(1, 256, 1), (3, 512, 1), (5, 768, 3), (33, 1280, 2), (40, 2048, 11), (21, 256, 8), (7, 768, 4)]
        {
            let w = rows_of(fmt, rows, cols, &mut rng);
            let mut x = xs(n, cols, &mut rng);
            if n == 3 {
                x[cols + 7] = f32::NAN;
                x[2 * cols + 300] = f32::INFINITY;
            }
            let inputs = Int16Inputs::new(&x, cols);
            let rb = cols / SUPER * fmt.super_bytes();
            let want: Vec<u32> = (0..n * rows)
                .map(|i| row_scalar(fmt, &w[(i % rows) * rb..][..rb], &inputs, i / rows).to_bits())
                .collect();
            for &level in &levels {
                let mut y = vec![0f32; n * rows];
                products_at(level, fmt, &w, rows, &inputs, &mut y);
                let got: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    let nan = f32::from_bits(*g).is_nan() && f32::from_bits(*e).is_nan();
                    let (t, r) = (i / rows, i % rows);
                    assert!(g == e || nan, "{fmt:?} {level:?} {rows}x{cols}, {n} inputs: input {t} row {r}");
                }
            }
            if n == 3 {
                let at = |t: usize, r: usize| f32::from_bits(want[t * rows + r]);
                assert!((0..rows).all(|r| at(0, r).is_finite() && at(1, r).is_nan() && at(2, r).is_nan()));
            }
        }
    }
}

/// The quantised inputs are the same bits whether their loop ran compiled
/// for AVX2 or for the baseline (`Int16Inputs::new` takes the first where
/// the CPU has it): codes, scales and sums, with a zero, a tiny, a huge and
/// a non-finite sub-block.
#[test]
fn inputs_quantise_to_the_same_bits_at_every_level() {
    if !crate::quant::simd::has_avx2() {
        crate::skip::report_skip("SKIP int16 input quantisation comparison: no AVX2 on this CPU");
        return;
    }
    let mut rng = Rng::new(15);
    let cols = 1024;
    let mut x = xs(3, cols, &mut rng);
    x[5 * SUB..6 * SUB].iter_mut().for_each(|v| *v *= 1e30);
    x[cols + 40] = f32::NEG_INFINITY;
    x[2 * cols + 70] = f32::NAN;
    let subs = x.len() / SUB;
    let (mut c, mut s, mut sums) = (vec![0i16; x.len()], vec![0f32; subs], vec![0f32; subs]);
    let mut halves = vec![0f32; 2 * subs];
    quantise_input_portable(&x, &mut c, &mut s, (&mut sums, &mut halves));
    let inputs = Int16Inputs::new(&x, cols);
    assert_eq!(inputs.codes, c);
    assert_eq!(inputs.sums, sums);
    assert_eq!(inputs.half_sums, halves);
    // The halves are the codes' sums, and add up to the sub-block's.
    for (k, h) in halves.chunks_exact(2).enumerate() {
        let codes = |r: std::ops::Range<usize>| c[r].iter().map(|&v| i32::from(v)).sum::<i32>() as f32;
        assert_eq!((h[0], h[1]), (codes(k * SUB..k * SUB + 16), codes(k * SUB + 16..(k + 1) * SUB)), "sub-block {k}");
        assert_eq!(h[0] + h[1], sums[k]);
    }
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&inputs.scales), bits(&s));
    assert!(s[subs / 3 + 1].is_nan() && s[2 * subs / 3 + 2].is_nan() && s[5] > 1e25);
}

/// The definition against the f64 product of ggml's values: the input's
/// rounding moves each value by at most half its sub-block's step, so a
/// product moves by at most `sum |w| * s_j / 2`, plus f32 rounding. And
/// what that is in practice, relative to the product's size, printed.
#[test]
fn int16_products_are_within_the_input_roundings_bound_of_ggmls_values() {
    let mut rng = Rng::new(12);
    let (rows, cols, n) = (64, 2048, 4);
    for fmt in FORMATS {
        let w = rows_of(fmt, rows, cols, &mut rng);
        let x = xs(n, cols, &mut rng);
        let inputs = Int16Inputs::new(&x, cols);
        let rb = cols / SUPER * fmt.super_bytes();
        let mut worst_rel = 0f64;
        for r in 0..rows {
            let mut values = vec![0f32; cols];
            dequantize_row(ggml_type(fmt), &w[r * rb..(r + 1) * rb], &mut values);
            for t in 0..n {
                let xt = &x[t * cols..(t + 1) * cols];
                let exact: f64 = values.iter().zip(xt).map(|(&a, &b)| a as f64 * b as f64).sum();
                let size: f64 = values.iter().zip(xt).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                let step: f64 = values
                    .iter()
                    .enumerate()
                    .map(|(c, &a)| a.abs() as f64 * inputs.scales[(t * cols + c) / SUB] as f64 * 0.5)
                    .sum();
                let got = row_scalar(fmt, &w[r * rb..(r + 1) * rb], &inputs, t) as f64;
                let err = (got - exact).abs();
                assert!(
                    err <= step * 1.001 + 1e-6 * size,
                    "{fmt:?} row {r} input {t}: {got} vs {exact} ({err:e} > {step:e})"
                );
                worst_rel = worst_rel.max(err / size);
            }
        }
        eprintln!("int16 {fmt:?} products: worst |error| / sum |w x| = {worst_rel:.2e}");
        assert!(worst_rel < 2e-5, "{fmt:?}: {worst_rel:e}");
    }
}

/// An int16 format's matrix's matvec, matmul, row_dots and a trunk view's
/// matvec_many and matmul give each (row, input) the definition's bits, in
/// parallel or not. (A trunk view's matmul had run every GGUF type's
/// decoded rows in f32.)
#[test]
fn every_int16_entry_point_gives_the_definitions_bits() {
    use crate::quant::{QMatrix, TrunkFormat};
    let mut rng = Rng::new(13);
    for fmt in FORMATS {
        let ty = ggml_type(fmt);
        for (rows, cols, n) in [(40, 512, 5), (300, 2048, 3), (70, 768, 19)] {
            let w = rows_of(fmt, rows, cols, &mut rng);
            let x = xs(n, cols, &mut rng);
            let inputs = Int16Inputs::new(&x, cols);
            let rb = cols / SUPER * fmt.super_bytes();
            let m = GgmlMatrix::new("w", ty, rows, cols, &w).unwrap();
            let q = QMatrix::from_bytes(TrunkFormat::Ggml(ty), rows, cols, &w).unwrap();
            let (mut prod, mut many, mut trunk) = (vec![0f32; n * rows], vec![0f32; n * rows], vec![0f32; n * rows]);
            m.matmul(&x, &mut prod);
            q.matvec_many(&x, &mut many);
            q.matmul(&x, &mut trunk);
            for t in 0..n {
                let xt = &x[t * cols..(t + 1) * cols];
                let mut y = vec![0f32; rows];
                m.matvec(xt, &mut y);
                let mut one = [0f32];
                for r in 0..rows {
                    m.row_dots(r, xt, &mut one);
                    let want = row_scalar(fmt, &w[r * rb..(r + 1) * rb], &inputs, t).to_bits();
                    let at = t * rows + r;
                    let got = [y[r], prod[at], many[at], trunk[at], one[0]].map(f32::to_bits);
                    assert_eq!(got, [want; 5], "{fmt:?} {rows}x{cols}: input {t} row {r}");
                }
            }
        }
    }
}

/// Matrices sharing their inputs (an expert's gate and up, of either
/// format and any rows) give each output the bits of their own product,
/// and `GgmlMatrix::matmul_each` those of each matrix's matvec / matmul,
/// also where one type does not take int16 inputs.
#[test]
fn products_sharing_their_inputs_give_each_matrix_its_own_bits() {
    let mut rng = Rng::new(14);
    let cols = 768;
    for n in [1, 2, 5] {
        let x = xs(n, cols, &mut rng);
        let inputs = Int16Inputs::new(&x, cols);
        let (wa, wb) = (q4k_rows(70, cols, &mut rng), q6k_rows(33, cols, &mut rng));
        let (mut ya, mut yb) = (vec![0f32; n * 70], vec![0f32; n * 33]);
        products_each(
            &mut [
                Product { fmt: Format::Q4K, w: &wa, rows: 70, y: &mut ya },
                Product { fmt: Format::Q6K, w: &wb, rows: 33, y: &mut yb },
            ],
            &inputs,
        );
        let (mut wanta, mut wantb) = (vec![0f32; n * 70], vec![0f32; n * 33]);
        products(Format::Q4K, &wa, 70, &inputs, &mut wanta);
        products(Format::Q6K, &wb, 33, &inputs, &mut wantb);
        assert_eq!(
            ya.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            wanta.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(
            yb.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            wantb.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        let a = GgmlMatrix::new("gate", GgmlType::Q4K, 70, cols, &wa).unwrap();
        let b = GgmlMatrix::new("up", GgmlType::Q6K, 33, cols, &wb).unwrap();
        let q8: Vec<u8> = (0..33 * cols / 32 * 34).map(|i| if i % 34 == 1 { 0x10 } else { (i * 7) as u8 }).collect();
        let c = GgmlMatrix::new("up", GgmlType::Q8_0, 33, cols, &q8).unwrap();
        for other in [b, c] {
            let (mut ga, mut gb) = (vec![0f32; n * 70], vec![0f32; n * 33]);
            GgmlMatrix::matmul_each(&mut [(a, &mut ga), (other, &mut gb)], &x);
            let (mut ea, mut eb) = (vec![0f32; n * 70], vec![0f32; n * 33]);
            a.matmul(&x, &mut ea);
            other.matmul(&x, &mut eb);
            assert!(ga.iter().zip(&ea).all(|(p, q)| p.to_bits() == q.to_bits()), "{n} inputs, gate");
            assert!(gb.iter().zip(&eb).all(|(p, q)| p.to_bits() == q.to_bits()), "{n} inputs, {}", other.ty().name());
        }
    }
}
