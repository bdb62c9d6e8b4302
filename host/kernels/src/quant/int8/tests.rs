use super::*;
use crate::quant::trunk::quantize_into;
use crate::quant::TrunkFormat;

fn rng(seed: u64) -> impl FnMut() -> f32 {
    let mut s = seed;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

fn matrix(rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let fmt = TrunkFormat::Q4;
    let mut r = rng(seed);
    let w: Vec<f32> = (0..rows * cols).map(|_| r()).collect();
    let mut out = vec![0u8; fmt.byte_len(rows, cols)];
    quantize_into(fmt, &w, rows, cols, &mut out);
    out
}

fn block_of(bytes: &[u8], rows: usize, cols: usize, r0: usize, n: usize) -> Block<'_> {
    let (scales, q) = bytes.split_at(crate::quant::scale_bytes(rows, cols));
    let g2 = 2 * cols.div_ceil(GROUP);
    let rb = cols.div_ceil(2);
    Block { rows: n, scales: &scales[r0 * g2..(r0 + n) * g2], q: &q[r0 * rb..(r0 + n) * rb] }
}

fn bits(v: &[[f32; BLOCK_ROWS]], rows: usize) -> Vec<u32> {
    v.iter().flat_map(|o| o[..rows].iter().map(|x| x.to_bits())).collect()
}

/// Every level this CPU has gives the scalar twin's bits, on widths with
/// partial last groups (odd ones too), blocks short of sixteen rows, tiles
/// and their remainders, and inputs with a zero group and large values.
#[test]
fn every_int8_level_equals_the_scalar_twin_bit_for_bit() {
    let levels: Vec<Level> = [Level::Avx2, Level::Avx512Vnni].into_iter().filter(|l| l.available()).collect();
    if levels.is_empty() {
        eprintln!("SKIP every_int8_level_equals_the_scalar_twin_bit_for_bit: no SIMD int8 level on this CPU");
    }
    for (cols, n) in [(128, 1), (256, 8), (384, 11), (200, 5), (77, 3), (1, 2), (640, 17)] {
        let rows = 19;
        let w = matrix(rows, cols, cols as u64 * 7 + n as u64);
        let mut r = rng(99 + cols as u64);
        let mut x: Vec<f32> = (0..n * cols).map(|_| r() * 40.0).collect();
        // A zero group and an input of one large value.
        x[..cols.min(GROUP)].fill(0.0);
        let big = cols.min(x.len() - 1);
        x[big] = 3.0e4;
        let inputs = Int8Inputs::new(&x, cols);
        for (r0, len) in [(0, BLOCK_ROWS), (BLOCK_ROWS, rows - BLOCK_ROWS), (2, 5)] {
            let block = block_of(&w, rows, cols, r0, len);
            let mut want = vec![[0f32; BLOCK_ROWS]; n];
            dot_block_scalar(block, &inputs, 0, &mut want);
            for &level in &levels {
                let mut got = vec![[f32::NAN; BLOCK_ROWS]; n];
                dot_block_at(level, block, &inputs, 0, &mut got);
                assert_eq!(bits(&got, len), bits(&want, len), "{level:?} cols {cols} inputs {n} rows {r0}+{len}");
                // Each input alone (decode's path) gives the same bits.
                for i in 0..n {
                    let mut one = [[f32::NAN; BLOCK_ROWS]];
                    dot_block_at(level, block, &inputs, i, &mut one);
                    assert_eq!(bits(&one, len), bits(&want[i..i + 1], len), "{level:?} input {i} alone");
                }
                // A window of inputs is the same as those inputs alone.
                if n > 2 {
                    let mut part = vec![[0f32; BLOCK_ROWS]; n - 2];
                    dot_block_at(level, block, &inputs, 1, &mut part);
                    assert_eq!(bits(&part, len), bits(&want[1..n - 1], len), "{level:?} offset window");
                }
            }
        }
    }
}

/// The twin computes the definition: each group's integer dot of the
/// weights' codes and the input's codes, exact, times the two scales;
/// and the input's codes are within half a step of the input.
#[test]
fn the_scalar_twin_is_the_grouped_integer_product() {
    let (rows, cols) = (2, 333);
    let w = matrix(rows, cols, 5);
    let mut r = rng(11);
    let x: Vec<f32> = (0..cols).map(|_| r() * 3.0).collect();
    let inputs = Int8Inputs::new(&x, cols);
    let groups = cols.div_ceil(GROUP);
    // Codes back in column order.
    let code = |g: usize, j: usize| -> i64 {
        let pos = j / 2 + (j % 2) * GROUP_BYTES;
        inputs.codes[g * GROUP + pos] as i64
    };
    for (col, &v) in x.iter().enumerate() {
        let (g, j) = (col / GROUP, col % GROUP);
        let step = inputs.scales[g];
        assert!((code(g, j) as f32 * step - v).abs() <= 0.5 * step * 1.0001, "code of column {col}");
    }
    let block = block_of(&w, rows, cols, 0, rows);
    let mut got = [[0f32; BLOCK_ROWS]];
    dot_block_scalar(block, &inputs, 0, &mut got);
    assert!(got[0][rows..].iter().all(|&v| v == 0.0), "rows the block lacks are zero");
    let rb = cols.div_ceil(2);
    for (rr, &got) in got[0][..rows].iter().enumerate() {
        let q = &block.q[rr * rb..(rr + 1) * rb];
        let scales = &block.scales[rr * 2 * groups..(rr + 1) * 2 * groups];
        let mut want = 0f64;
        for g in 0..groups {
            let mut isum = 0i64;
            for j in 0..GROUP.min(cols - g * GROUP) {
                let col = g * GROUP + j;
                let wq = ((q[col / 2] >> (4 * (col % 2))) & 0x0F) as i64 - 8;
                isum += wq * code(g, j);
            }
            want += f16_at(scales, g) as f64 * inputs.scales[g] as f64 * isum as f64;
        }
        assert!((got as f64 - want).abs() <= 1e-5 * want.abs().max(1.0), "row {rr}: {got} vs {want}");
    }
}
