//! Products over a matrix given by its row decoder, shared by the trunk's
//! formats (`trunk`) and GGUF's block types (`ggml`): each weight row is
//! decoded into f32 and multiplied with `dot8`'s order, so a format only
//! has to say how to decode a row.

use super::simd::BlockInputs;
use rayon::prelude::*;

/// Matrices at least this large (rows * cols) are split across rayon
/// threads; below it the fork/join costs more than it saves.
pub(crate) const PAR_MIN_WORK: usize = 1 << 16;
/// `matmul_decoded`: inputs per task (48 rows of 4096 f32, the K3 tower's
/// widest, are 786 KB, in L2) and weight rows dequantised at a time, whole
/// register tiles of `simd::matmul_block` (3 inputs, 4 rows). Speed only,
/// never the result.
const MATMUL_INPUTS: usize = 48;
const MATMUL_ROWS: usize = 8;
/// Rows per task when tasks own rows (few inputs): several blocks of
/// `MATMUL_ROWS` sharing one buffer of decoded rows.
const MATMUL_TASK_ROWS: usize = 4 * MATMUL_ROWS;

/// The most bytes `matmul_decoded` allocates for `n` inputs of a `[rows,
/// cols]` matrix, from the lengths it allocates: the transposed outputs
/// when tasks own rows, the inputs as `BlockInputs` lays them out, and one
/// task's decoded rows and outputs (each further thread holds another such
/// task's, under 100 KB at the widest matrices we run, and with 96 inputs
/// or more its own block of inputs laid out).
pub(crate) fn matmul_decoded_peak_bytes(rows: usize, cols: usize, n: usize) -> usize {
    let transposed = if n >= 2 * MATMUL_INPUTS { 0 } else { rows * n };
    // `BlockInputs`' copy of a task's inputs (AVX-512 F), an even count.
    let paired = if n >= 2 * MATMUL_INPUTS { MATMUL_INPUTS } else { n }.next_multiple_of(2) * cols;
    4 * (transposed + paired + MATMUL_ROWS * cols + MATMUL_ROWS * n.min(MATMUL_INPUTS))
}

/// A matrix's values, row-major, from its row decoder `row_into(r, out)`
/// (tests and conversion: the kernels never expand a matrix whole).
pub(crate) fn dequantize_rows(rows: usize, cols: usize, row_into: &dyn Fn(usize, &mut [f32])) -> Vec<f32> {
    let mut out = vec![0f32; rows * cols];
    if cols > 0 {
        for (r, o) in out.chunks_exact_mut(cols).enumerate() {
            row_into(r, o);
        }
    }
    out
}

/// `y[t] = W x[t]` for the `n = x.len() / cols` inputs of `x` (`[n, cols]`,
/// `y` `[n, rows]`), with `row_into(r, out)` writing row r's values: each
/// weight row is decoded once per block of inputs and the block runs in
/// register tiles (`simd::matmul_block`), so every `y[t][r]` is `dot8` of
/// row r's values and x[t] (`simd::dot8_scalar`) whatever the thread
/// count, the number of inputs or the CPU. Panics unless the lengths agree.
pub(crate) fn matmul_decoded(
    rows: usize,
    cols: usize,
    row_into: &(dyn Fn(usize, &mut [f32]) + Sync),
    x: &[f32],
    y: &mut [f32],
) {
    assert!(cols > 0 && x.len().is_multiple_of(cols), "matmul: x of {} is not whole rows of {cols}", x.len());
    let n = x.len() / cols;
    assert_eq!(y.len(), n * rows, "matmul: y length");
    if n == 0 || rows == 0 {
        return;
    }
    // A block of dequantised weight rows, then every input of the task
    // against it: the rows stay in L1/L2, the inputs in L2.
    let rows_into = |r0: usize, nr: usize, w: &mut [f32]| {
        for i in 0..nr {
            row_into(r0 + i, &mut w[i * cols..(i + 1) * cols]);
        }
    };
    if n >= 2 * MATMUL_INPUTS {
        // Tasks own blocks of inputs and run every weight row.
        y.par_chunks_mut(MATMUL_INPUTS * rows).zip(x.par_chunks(MATMUL_INPUTS * cols)).for_each(|(yb, xb)| {
            let nt = xb.len() / cols;
            let mut w = vec![0f32; MATMUL_ROWS * cols];
            let mut out = vec![0f32; MATMUL_ROWS * nt];
            let inputs = BlockInputs::new(xb, cols);
            for r0 in (0..rows).step_by(MATMUL_ROWS) {
                let nr = MATMUL_ROWS.min(rows - r0);
                rows_into(r0, nr, &mut w);
                inputs.matmul_block(&w[..nr * cols], &mut out[..nr * nt]);
                for (t, yt) in yb.chunks_exact_mut(rows).enumerate() {
                    for i in 0..nr {
                        yt[r0 + i] = out[i * nt + t];
                    }
                }
            }
        });
    } else {
        // Few inputs: tasks own blocks of weight rows instead.
        let inputs = BlockInputs::new(x, cols);
        by_row_blocks((rows, cols, n), MATMUL_TASK_ROWS, y, |b, out| {
            let mut w = vec![0f32; MATMUL_ROWS * cols];
            for (k, out) in out.chunks_mut(MATMUL_ROWS * n).enumerate() {
                let (r0, nr) = (b * MATMUL_TASK_ROWS + k * MATMUL_ROWS, out.len() / n);
                rows_into(r0, nr, &mut w);
                inputs.matmul_block(&w[..nr * cols], out);
            }
        });
    }
}

/// `y` (`[n, rows]`) from `task(b, out)`, which fills `out` with rows
/// `b * block..` of `y` transposed (`[rows in the block][n]`): the tasks
/// own blocks of rows, in parallel when the product (`rows * cols * n`
/// multiply-adds) is large, and their results are turned around once at
/// the end.
pub(crate) fn by_row_blocks(
    (rows, cols, n): (usize, usize, usize),
    block: usize,
    y: &mut [f32],
    task: impl Fn(usize, &mut [f32]) + Sync,
) {
    let mut yt = vec![0f32; rows * n];
    if rows * cols * n >= PAR_MIN_WORK {
        yt.par_chunks_mut(block * n).enumerate().for_each(|(b, out)| task(b, out));
    } else {
        yt.chunks_mut(block * n).enumerate().for_each(|(b, out)| task(b, out));
    }
    for (r, col) in yt.chunks_exact(n).enumerate() {
        for (t, &v) in col.iter().enumerate() {
            y[t * rows + r] = v;
        }
    }
}
