//! GGUF's block formats (ggml's tensor types), computed on as stored.
//!
//! A matrix `[rows, cols]` of a block type is `rows` rows of
//! `cols / block_elems` blocks each (ggml's `ne[0]` is our `cols`); a
//! block's layout is its `block_*` struct in ggml-common.h. The twins here
//! decode one block exactly as ggml-quants.c's `dequantize_row_*` does,
//! held bit for bit to `gguf.quants.dequantize` on random blocks
//! (tests/fixtures/ggml_blocks, made by tests/gen_ggml_blocks.py).
//!
//! Every product a twin forms is exact in f32: an f16 scale has 11
//! significant bits, and the sub-block scales, grid values, signs and
//! quants it is multiplied by add at most 13 more. So the only rounding is
//! where ggml itself rounds (the subtraction of a minimum, IQ1's delta
//! added to its grid value), and any kernel that forms the same products
//! gets the same values whatever its order: a SIMD decoder is held to the
//! twin bit for bit, not within a tolerance.
//!
//! `GgmlMatrix::matvec` and `matmul` decode rows a few at a time into a
//! small buffer and run `simd::matmul_block` on them (`dot8` per pair,
//! one definition on every ISA), so the matrix is never expanded whole and
//! each output is the same bits on every CPU, thread count and batch size:
//! a prefill that runs a GGUF matrix as a product gets exactly the logits
//! of one matvec per token.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod blocks;
pub(crate) mod expert;
mod grids;
mod int16;
mod iq;

#[cfg(test)]
mod tests;

pub use int16::int16_input_bytes;

use rayon::prelude::*;

use super::decoded::{dequantize_rows, matmul_decoded, PAR_MIN_WORK};
use super::{simd, QuantError};

/// The ggml types WASTE decodes and computes on (`ggml_type` of ggml.h).
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Bf16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Iq1S,
    Iq1M,
    Iq2Xxs,
    Iq2Xs,
    Iq2S,
    Iq3Xxs,
    Iq3S,
    Iq4Nl,
    Iq4Xs,
    Mxfp4,
}

impl GgmlType {
    pub const ALL: [GgmlType; 23] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Bf16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Iq1S,
        GgmlType::Iq1M,
        GgmlType::Iq2Xxs,
        GgmlType::Iq2Xs,
        GgmlType::Iq2S,
        GgmlType::Iq3Xxs,
        GgmlType::Iq3S,
        GgmlType::Iq4Nl,
        GgmlType::Iq4Xs,
        GgmlType::Mxfp4,
    ];

    /// Whether this type's products quantise their inputs to int16
    /// (`int16`'s module docs; 2.5 bytes a value the memory plan counts),
    /// rather than taking them as f32.
    pub fn takes_int16_inputs(self) -> bool {
        int16::Format::of(self).is_some()
    }

    /// The `ggml_type` code; stable, as GGUF files store it.
    pub fn code(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q2K => 10,
            GgmlType::Q3K => 11,
            GgmlType::Q4K => 12,
            GgmlType::Q5K => 13,
            GgmlType::Q6K => 14,
            GgmlType::Iq2Xxs => 16,
            GgmlType::Iq2Xs => 17,
            GgmlType::Iq3Xxs => 18,
            GgmlType::Iq1S => 19,
            GgmlType::Iq4Nl => 20,
            GgmlType::Iq3S => 21,
            GgmlType::Iq2S => 22,
            GgmlType::Iq4Xs => 23,
            GgmlType::Iq1M => 29,
            GgmlType::Bf16 => 30,
            GgmlType::Mxfp4 => 39,
        }
    }

    /// `None` for codes we do not decode (TQ*, NVFP4, Q1_0, integer
    /// tensors, removed codes).
    pub fn from_code(code: u32) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| t.code() == code)
    }

    /// The name GGUF tools print (`GGMLQuantizationType.name`).
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Bf16 => "BF16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q2K => "Q2_K",
            GgmlType::Q3K => "Q3_K",
            GgmlType::Q4K => "Q4_K",
            GgmlType::Q5K => "Q5_K",
            GgmlType::Q6K => "Q6_K",
            GgmlType::Iq1S => "IQ1_S",
            GgmlType::Iq1M => "IQ1_M",
            GgmlType::Iq2Xxs => "IQ2_XXS",
            GgmlType::Iq2Xs => "IQ2_XS",
            GgmlType::Iq2S => "IQ2_S",
            GgmlType::Iq3Xxs => "IQ3_XXS",
            GgmlType::Iq3S => "IQ3_S",
            GgmlType::Iq4Nl => "IQ4_NL",
            GgmlType::Iq4Xs => "IQ4_XS",
            GgmlType::Mxfp4 => "MXFP4",
        }
    }

    /// The type `name()` names.
    pub fn parse(name: &str) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Values per block (`ggml_blck_size`).
    pub fn block_elems(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 => 1,
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::Iq4Nl
            | GgmlType::Mxfp4 => 32,
            _ => 256,
        }
    }

    /// Bytes per block (`ggml_type_size`).
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::Bf16 => 2,
            GgmlType::Q4_0 | GgmlType::Iq4Nl => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q8_0 => 34,
            GgmlType::Mxfp4 => 17,
            GgmlType::Q2K => 84,
            GgmlType::Q3K => 110,
            GgmlType::Q4K => 144,
            GgmlType::Q5K => 176,
            GgmlType::Q6K => 210,
            GgmlType::Iq1S => 50,
            GgmlType::Iq1M => 56,
            GgmlType::Iq2Xxs => 66,
            GgmlType::Iq2Xs => 74,
            GgmlType::Iq2S => 82,
            GgmlType::Iq3Xxs => 98,
            GgmlType::Iq3S => 110,
            GgmlType::Iq4Xs => 136,
        }
    }

    /// Bytes of one row of `cols` values; `None` when `cols` is not a whole
    /// number of blocks (ggml refuses such a tensor too).
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        cols.is_multiple_of(self.block_elems()).then(|| cols / self.block_elems() * self.block_bytes())
    }

    /// Bytes of a `[rows, cols]` matrix, `None` when a row is not whole
    /// blocks or the size overflows.
    pub fn matrix_bytes(self, rows: usize, cols: usize) -> Option<usize> {
        self.row_bytes(cols)?.checked_mul(rows)
    }
}

/// Decodes `bytes` (whole blocks of `ty`) into `out` (their values), as
/// ggml's `dequantize_row_*`. Panics unless `out` has exactly the values
/// of `bytes`: callers check untrusted lengths with `GgmlMatrix::new`.
pub fn dequantize_row(ty: GgmlType, bytes: &[u8], out: &mut [f32]) {
    let (be, bb) = (ty.block_elems(), ty.block_bytes());
    assert!(
        bytes.len().is_multiple_of(bb) && bytes.len() / bb * be == out.len(),
        "dequantize_row {}: {} bytes for {} values",
        ty.name(),
        bytes.len(),
        out.len()
    );
    #[cfg(target_arch = "x86_64")]
    if simd::has_avx2() && has_f16c() {
        // SAFETY: AVX2, FMA and F16C were detected on this CPU; the lengths
        // were checked above.
        return unsafe { dequantize_row_avx2(ty, bytes, out) };
    }
    dequantize_row_portable(ty, bytes, out)
}

/// The twins, block after block: the definition. The AVX2 build runs the
/// hand-written decoders of avx2.rs where there is one and this same source
/// compiled with AVX2 enabled elsewhere: the products are exact, so both
/// give the twins' bits (`the_avx2_build_of_the_twins_gives_their_bits`).
#[inline(always)]
fn dequantize_row_portable(ty: GgmlType, bytes: &[u8], out: &mut [f32]) {
    let (be, bb) = (ty.block_elems(), ty.block_bytes());
    for (b, y) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(be)) {
        match ty {
            GgmlType::Iq1S => iq::iq1_s::<iq::Portable>(b, y),
            GgmlType::Iq1M => iq::iq1_m::<iq::Portable>(b, y),
            GgmlType::Iq2Xxs => iq::iq2_xxs::<iq::Portable>(b, y),
            GgmlType::Iq2Xs => iq::iq2_xs::<iq::Portable>(b, y),
            GgmlType::Iq2S => iq::iq2_s::<iq::Portable>(b, y),
            GgmlType::Iq3Xxs => iq::iq3_xxs::<iq::Portable>(b, y),
            GgmlType::Iq3S => iq::iq3_s::<iq::Portable>(b, y),
            GgmlType::Iq4Nl => iq::iq4_nl(b, y),
            GgmlType::Iq4Xs => iq::iq4_xs(b, y),
            _ => blocks::decode(ty, b, y),
        }
    }
}

/// Whether this CPU converts f16 in hardware (every AVX2 CPU we know of
/// does; the AVX2 decoders need it, and run only where it is).
#[cfg(target_arch = "x86_64")]
fn has_f16c() -> bool {
    static F16C: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *F16C.get_or_init(|| is_x86_feature_detected!("f16c"))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dequantize_row_avx2(ty: GgmlType, bytes: &[u8], out: &mut [f32]) {
    let decode: unsafe fn(&[u8], &mut [f32]) = match ty {
        GgmlType::Q8_0 => avx2::q8_0,
        GgmlType::Q4K => avx2::q4_k,
        GgmlType::Q6K => avx2::q6_k,
        GgmlType::Q4_0 => avx2::q4_0,
        GgmlType::Mxfp4 => avx2::mxfp4,
        GgmlType::Q2K => avx2::q2_k,
        GgmlType::Q3K => avx2::q3_k,
        GgmlType::Q5K => avx2::q5_k,
        GgmlType::Iq4Nl => avx2::iq4_nl,
        GgmlType::Iq4Xs => avx2::iq4_xs,
        GgmlType::Iq1S => avx2::iq1_s,
        GgmlType::Iq1M => avx2::iq1_m,
        GgmlType::Iq2Xxs => avx2::iq2_xxs,
        GgmlType::Iq2Xs => avx2::iq2_xs,
        GgmlType::Iq2S => avx2::iq2_s,
        GgmlType::Iq3Xxs => avx2::iq3_xxs,
        GgmlType::Iq3S => avx2::iq3_s,
        _ => return dequantize_row_portable(ty, bytes, out),
    };
    let (be, bb) = (ty.block_elems(), ty.block_bytes());
    for (b, y) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(be)) {
        // SAFETY: this function runs only where AVX2 and FMA were detected;
        // each decoder checks its block and output lengths.
        unsafe { decode(b, y) };
    }
}

/// Rows decoded per step of `matvec` (the rows of one task): a few rows of
/// a wide matrix stay in L1 between their decoding and their products.
const ROW_BLOCK: usize = 4;
/// Rows of one `matvec` task.
const TASK_ROWS: usize = 64;

/// Bytes each thread that computes GGUF products keeps between calls, for
/// matrices of up to `cols` columns: `matvec`'s decoded rows (`ROWS`) and
/// the int16 block kernel's transposed block. The memory plan counts them
/// per compute thread.
pub fn per_thread_bytes(cols: usize) -> usize {
    ROW_BLOCK * cols * std::mem::size_of::<f32>() + int16::transposed_peak_bytes(cols)
}

/// Bytes this thread's GGUF kernel buffers hold, their whole capacity.
#[cfg(test)]
fn held_bytes() -> usize {
    ROWS.with_borrow(|w| w.capacity() * std::mem::size_of::<f32>()) + int16::held_bytes()
}

std::thread_local! {
    /// `matvec`'s decoded rows, kept per thread: allocating them per task
    /// cost more than the products (a large `Vec` is a fresh mmap).
    static ROWS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A `[rows, cols]` matrix in a ggml block type, borrowed as stored.
#[derive(Debug, Clone, Copy)]
pub struct GgmlMatrix<'a> {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    data: &'a [u8],
}

impl<'a> GgmlMatrix<'a> {
    /// `what` names the tensor in the error of a malformed length.
    pub fn new(
        what: &'static str,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: &'a [u8],
    ) -> Result<GgmlMatrix<'a>, QuantError> {
        let expected = ty.matrix_bytes(rows, cols).ok_or(QuantError::Shape { what, rows, cols })?;
        if data.len() != expected {
            return Err(QuantError::Length { what, expected, got: data.len() });
        }
        Ok(GgmlMatrix { ty, rows, cols, data })
    }

    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row `r`'s values into `out` (`cols` of them).
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        let rb = self.data.len() / self.rows;
        dequantize_row(self.ty, &self.data[r * rb..(r + 1) * rb], out);
    }

    /// `out[t] = dot8(row r, x row t)` for the `out.len()` inputs of `x`:
    /// the bits `matvec` and `matmul` give for that row and input, the row
    /// decoded once.
    pub fn row_dots(&self, r: usize, x: &[f32], out: &mut [f32]) {
        assert_eq!(x.len(), out.len() * self.cols, "GgmlMatrix::row_dots: x length");
        if self.cols == 0 {
            return out.fill(0.0);
        }
        if let Some(fmt) = int16::Format::of(self.ty) {
            let rb = self.data.len() / self.rows;
            let inputs = int16::Int16Inputs::new(x, self.cols);
            return int16::products(fmt, &self.data[r * rb..(r + 1) * rb], 1, &inputs, out);
        }
        ROWS.with_borrow_mut(|w| {
            int16::grow_exact(w, ROW_BLOCK * self.cols, 0.0);
            let row = &mut w[..self.cols];
            self.row_into(r, row);
            simd::matmul_block(row, x, self.cols, out);
        });
    }

    /// `y = W x`. Each `y[r]` is `dot8` of row r's values and `x`: the bits
    /// of `matmul` on the same input, on every CPU and thread count.
    pub fn matvec(&self, x: &[f32], y: &mut [f32]) {
        let (rows, cols) = (self.rows, self.cols);
        assert_eq!(x.len(), cols, "GgmlMatrix::matvec: x length");
        assert_eq!(y.len(), rows, "GgmlMatrix::matvec: y length");
        if rows == 0 || cols == 0 {
            y.fill(0.0);
            return;
        }
        if let Some(fmt) = int16::Format::of(self.ty) {
            return int16::products(fmt, self.data, rows, &int16::Int16Inputs::new(x, cols), y);
        }
        // A task owns TASK_ROWS rows (few tasks: rayon's per-task cost is
        // about a row's work) and decodes them ROW_BLOCK at a time.
        #[cfg(target_arch = "x86_64")]
        if simd::has_avx2() && has_f16c() && avx2::fused(self.ty) {
            let rb = self.data.len() / rows;
            let wide = avx512::runs(self.ty);
            let task = |(b, ys): (usize, &mut [f32])| {
                let mut r0 = b * TASK_ROWS;
                // Eight rows a call where the task has them (every task
                // but a matrix's last: TASK_ROWS is a multiple).
                let whole = if wide { ys.len() / avx512::ROWS * avx512::ROWS } else { 0 };
                let (eights, rest) = ys.split_at_mut(whole);
                for yb in eights.as_chunks_mut::<{ avx512::ROWS }>().0 {
                    let block = &self.data[r0 * rb..(r0 + avx512::ROWS) * rb];
                    // SAFETY: `runs` checked the features; the rows are
                    // whole rows of this matrix and x its width.
                    unsafe { avx512::dot_rows(block, rb, x, yb) };
                    r0 += avx512::ROWS;
                }
                for yb in rest.chunks_mut(ROW_BLOCK) {
                    let block = &self.data[r0 * rb..(r0 + yb.len()) * rb];
                    // SAFETY: AVX2, FMA and F16C were detected; the rows
                    // are whole rows of this matrix and x its width.
                    unsafe { avx2::dot_rows(self.ty, block, rb, x, yb) };
                    r0 += yb.len();
                }
            };
            if rows * cols >= PAR_MIN_WORK && rows > TASK_ROWS {
                y.par_chunks_mut(TASK_ROWS).enumerate().for_each(task);
            } else {
                y.chunks_mut(TASK_ROWS).enumerate().for_each(task);
            }
            return;
        }
        let task = |(b, ys): (usize, &mut [f32])| {
            ROWS.with_borrow_mut(|w| {
                int16::grow_exact(w, ROW_BLOCK * cols, 0.0);
                for (k, yb) in ys.chunks_mut(ROW_BLOCK).enumerate() {
                    let r0 = b * TASK_ROWS + k * ROW_BLOCK;
                    let w = &mut w[..yb.len() * cols];
                    for (i, wr) in w.chunks_exact_mut(cols).enumerate() {
                        self.row_into(r0 + i, wr);
                    }
                    simd::matmul_block(w, x, cols, yb);
                }
            });
        };
        if rows * cols >= PAR_MIN_WORK && rows > TASK_ROWS {
            y.par_chunks_mut(TASK_ROWS).enumerate().for_each(task);
        } else {
            y.chunks_mut(TASK_ROWS).enumerate().for_each(task);
        }
    }

    /// `y[t] = W x[t]` for `n = x.len() / cols` inputs (`x` `[n, cols]`,
    /// `y` `[n, rows]`): each row decoded once per block of inputs.
    pub fn matmul(&self, x: &[f32], y: &mut [f32]) {
        if let Some(fmt) = int16::Format::of(self.ty).filter(|_| self.rows > 0 && self.cols > 0) {
            assert!(x.len().is_multiple_of(self.cols), "matmul: x of {} is not whole rows of {}", x.len(), self.cols);
            assert_eq!(y.len(), x.len() / self.cols * self.rows, "matmul: y length");
            return int16::products(fmt, self.data, self.rows, &int16::Int16Inputs::new(x, self.cols), y);
        }
        let v = *self;
        matmul_decoded(self.rows, self.cols, &|r, out: &mut [f32]| v.row_into(r, out), x, y);
    }

    /// `y_i[t] = W_i x[t]` for matrices of `x`'s width (an expert's gate
    /// and up), each output the bits of that matrix's `matmul` (or
    /// `matvec`): where every matrix takes int16 inputs, `x` is quantised
    /// once for all of them and their rows run as one parallel call, not
    /// one per matrix.
    pub fn matmul_each(products: &mut [(GgmlMatrix<'_>, &mut [f32])], x: &[f32]) {
        let Some(&(first, _)) = products.first() else { return };
        let shared = products
            .iter()
            .all(|(m, _)| m.cols == first.cols && m.rows > 0 && m.cols > 0 && int16::Format::of(m.ty).is_some());
        if shared && x.len().is_multiple_of(first.cols) {
            let inputs = int16::Int16Inputs::new(x, first.cols);
            let mut each: Vec<int16::Product> = products
                .iter_mut()
                .map(|(m, y)| int16::Product {
                    fmt: int16::Format::of(m.ty).expect("checked above"),
                    w: m.data,
                    rows: m.rows,
                    y,
                })
                .collect();
            return int16::products_each(&mut each, &inputs);
        }
        for (m, y) in products.iter_mut() {
            if x.len() == m.cols {
                m.matvec(x, y);
            } else {
                m.matmul(x, y);
            }
        }
    }

    /// The matrix's values, row-major (tests and conversion only: the
    /// kernels above never expand a matrix whole).
    pub fn dequantize(&self) -> Vec<f32> {
        dequantize_rows(self.rows, self.cols, &|r, out: &mut [f32]| self.row_into(r, out))
    }
}
