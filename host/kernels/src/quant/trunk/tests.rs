use super::{quantize_trunk, QMatrix, TrunkFormat};
use crate::quant::simd::dot8_scalar;

/// Dequantised rows (`row_into`, one scale conversion per group) equal
/// what the dot kernels compute against unit vectors (a group's scale
/// times the exact code; for q4 within an ulp), on odd widths and
/// partial last groups.
#[test]
fn dequantised_rows_equal_the_dot_kernels_on_unit_vectors() {
    for (rows, cols) in [(3, 7), (4, 129), (2, 300)] {
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3).collect();
        for fmt in [TrunkFormat::Q8, TrunkFormat::Q4] {
            let m = QMatrix::from_byte_vec(fmt, rows, cols, quantize_trunk(fmt, &w, rows, cols)).unwrap();
            let d = m.dequantize();
            let mut e = vec![0f32; cols];
            let mut col = vec![0f32; rows];
            for j in 0..cols {
                e.fill(0.0);
                e[j] = 1.0;
                m.matvec(&e, &mut col);
                for r in 0..rows {
                    // `==`: a zero code under a negative scale dequantises to
                    // -0, which the dot's sum starting at +0 makes +0. q4's
                    // integer products scale by 127 * (1/127), within an ulp.
                    let want = d[r * cols + j];
                    let ok = match fmt {
                        TrunkFormat::Q4 => (want - col[r]).abs() <= want.abs() * 2.5e-7,
                        _ => want == col[r],
                    };
                    assert!(ok, "{fmt:?} {rows}x{cols} ({r}, {j}): {want} vs {}", col[r]);
                }
            }
        }
    }
}

/// `w` (`rows x cols`) as a trunk matrix of `fmt`: kept as f32, or quantised.
fn matrix_of(fmt: TrunkFormat, w: &[f32], rows: usize, cols: usize) -> QMatrix {
    if fmt == TrunkFormat::F32 {
        QMatrix::from_f32(w.to_vec(), rows, cols)
    } else {
        QMatrix::from_byte_vec(fmt, rows, cols, quantize_trunk(fmt, w, rows, cols)).unwrap()
    }
}

/// `matmul` gives `dot8` of each dequantised row with each input, bit
/// for bit, on both of its paths (few inputs: tasks over rows; many:
/// tasks over inputs), on partial blocks and partial register tiles,
/// whatever the CPU's level (the scalar definition is the reference).
#[test]
fn matmul_equals_dot8_of_each_dequantised_row() {
    for (rows, cols, n) in [(3, 300, 1), (20, 129, 5), (17, 64, 70), (9, 40, 100), (6, 23, 97), (4, 7, 3)] {
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3).collect();
        let x: Vec<f32> = (0..n * cols).map(|i| ((i * 104_729 % 997) as f32 - 498.0) * 1e-2).collect();
        for fmt in [TrunkFormat::F32, TrunkFormat::Q8, TrunkFormat::Q4] {
            let m = matrix_of(fmt, &w, rows, cols);
            let mut y = vec![0f32; n * rows];
            m.matmul(&x, &mut y);
            let mut row = vec![0f32; cols];
            for r in 0..rows {
                m.row(r, &mut row);
                for t in 0..n {
                    let want = dot8_scalar(&row, &x[t * cols..(t + 1) * cols]);
                    assert_eq!(y[t * rows + r].to_bits(), want.to_bits(), "{fmt:?} {rows}x{cols} n={n} r={r} t={t}");
                }
            }
        }
    }
}

/// `add_scaled_row` on a quantised matrix is bit-identical to the f32
/// loop over its dequantised rows (MLA's query side relies on it), odd
/// widths and a partial last group included.
#[test]
fn add_scaled_row_equals_the_loop_over_dequantised_rows() {
    for (rows, cols) in [(3, 300), (2, 129), (4, 7)] {
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3).collect();
        for fmt in [TrunkFormat::F32, TrunkFormat::Q8, TrunkFormat::Q4] {
            let m = matrix_of(fmt, &w, rows, cols);
            let f = m.dequantize();
            let (mut got, mut want) = (vec![0.25f32; cols], vec![0.25f32; cols]);
            for r in 0..rows {
                let a = 0.3 + r as f32 * -0.71;
                m.add_scaled_row(r, a, &mut got);
                for (o, &v) in want.iter_mut().zip(&f[r * cols..(r + 1) * cols]) {
                    *o += a * v;
                }
            }
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{fmt:?} {rows}x{cols}");
            let mut y = vec![0f32; 2];
            m.matvec_rows(rows - 2, &w[..cols], &mut y);
            let mut full = vec![0f32; rows];
            m.matvec(&w[..cols], &mut full);
            assert_eq!(y, full[rows - 2..], "{fmt:?} {rows}x{cols}: row block");
        }
    }
}
