//! Group quantisation (q8/q4, shared by trunk and experts), the borrowed
//! matrix view the kernels run on, and the owned trunk matrix `QMatrix`.

use super::decoded::{by_row_blocks, dequantize_rows, matmul_decoded, PAR_MIN_WORK};
use super::ggml::GgmlMatrix;
use super::int8::{self, Int8Inputs};
use super::simd::{self, f16_at};
use super::{QuantError, TrunkFormat, GROUP};
use half::f16;
use rayon::prelude::*;
use std::borrow::Cow;

/// Rows per rayon task. Every row is computed whole by one thread, so the
/// block size only affects speed, never the result.
const ROW_BLOCK: usize = 16;
/// `matvec_many`: inputs per task when tasks own blocks of inputs (32
/// rows of 4096 f32 are 512 KB, in L2, while every weight row passes
/// over them once). Speed only, never the result.
const MANY_INPUTS: usize = 32;

/// Quantise a row-major `[rows, cols]` f32 matrix into `fmt`'s byte layout
/// (module docs). Panics if `w.len() != rows * cols`.
pub fn quantize_trunk(fmt: TrunkFormat, w: &[f32], rows: usize, cols: usize) -> Vec<u8> {
    assert_eq!(w.len(), rows * cols, "quantize_trunk: w.len() != rows * cols");
    let mut out = vec![0u8; fmt.byte_len(rows, cols)];
    quantize_into(fmt, w, rows, cols, &mut out);
    out
}

/// Quantise into a preallocated buffer of exactly `fmt.byte_len(rows, cols)`.
pub(crate) fn quantize_into(fmt: TrunkFormat, w: &[f32], rows: usize, cols: usize, out: &mut [u8]) {
    debug_assert_eq!(out.len(), fmt.byte_len(rows, cols));
    if rows == 0 || cols == 0 {
        return;
    }
    let par = rows * cols >= PAR_MIN_WORK;
    match fmt {
        TrunkFormat::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(w) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        TrunkFormat::Ggml(t) => panic!("quantize_trunk: {} rows are copied from a GGUF file, not quantised", t.name()),
        TrunkFormat::Q8 | TrunkFormat::Q4 => {
            let g = cols.div_ceil(GROUP);
            let row_bytes = if fmt == TrunkFormat::Q8 { cols } else { cols.div_ceil(2) };
            let (sc, data) = out.split_at_mut(rows * g * 2);
            let job = |(sr, (dr, wr)): (&mut [u8], (&mut [u8], &[f32]))| quantize_row(fmt, wr, sr, dr);
            if par {
                sc.par_chunks_mut(g * 2).zip(data.par_chunks_mut(row_bytes).zip(w.par_chunks(cols))).for_each(job);
            } else {
                sc.chunks_mut(g * 2).zip(data.chunks_mut(row_bytes).zip(w.chunks(cols))).for_each(job);
            }
        }
    }
}

fn quantize_row(fmt: TrunkFormat, w: &[f32], scales: &mut [u8], q: &mut [u8]) {
    for (g, wg) in w.chunks(GROUP).enumerate() {
        let scale = match fmt {
            TrunkFormat::Q8 => f16_round(absmax(wg) / 127.0),
            _ => best_q4_scale(wg),
        };
        scales[2 * g..2 * g + 2].copy_from_slice(&f16::from_f32(scale).to_bits().to_le_bytes());
        let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        let c0 = g * GROUP;
        for (i, &v) in wg.iter().enumerate() {
            let c = c0 + i;
            match fmt {
                TrunkFormat::Q8 => q[c] = quant(v, inv, -127, 127) as u8,
                _ => {
                    let nib = (quant(v, inv, -8, 7) + 8) as u8;
                    if c & 1 == 0 {
                        q[c / 2] = nib;
                    } else {
                        q[c / 2] |= nib << 4;
                    }
                }
            }
        }
    }
}

#[inline]
fn quant(v: f32, inv: f32, lo: i32, hi: i32) -> i8 {
    // `as i32` maps NaN to 0 and saturates infinities, so bad weights cannot
    // produce an out-of-range code.
    // Adding ±0.5 and truncating rounds half away from zero like `round`,
    // without the libm call baseline x86_64 makes for `round` (the q4 scale
    // search quantises every value 14 times).
    let y = v * inv;
    ((y + 0.5f32.copysign(y)) as i32).clamp(lo, hi) as i8
}

fn absmax(w: &[f32]) -> f32 {
    w.iter().fold(0f32, |m, v| m.max(v.abs()))
}

/// Round to the nearest f16 (what is stored), keeping it finite.
fn f16_round(s: f32) -> f32 {
    if !s.is_finite() {
        return 0.0;
    }
    f16::from_f32(s.min(f16::MAX.to_f32())).to_f32()
}

/// q4 scale with the least squared error among `±max|w| / d`, d in
/// 7..=8.5: a negative scale lets the extreme value use code -8, and a
/// slightly smaller step often beats the plain `max/7` on the bulk.
fn best_q4_scale(w: &[f32]) -> f32 {
    let m = absmax(w);
    if m == 0.0 || !m.is_finite() {
        return 0.0;
    }
    let mut best = (f32::INFINITY, 0f32);
    for k in 0..7 {
        let d = 7.0 + 0.25 * k as f32;
        for sign in [1.0f32, -1.0] {
            let s = f16_round(sign * m / d);
            if s == 0.0 {
                continue;
            }
            let inv = 1.0 / s;
            let err: f32 = w
                .iter()
                .map(|&v| {
                    let e = v - s * quant(v, inv, -8, 7) as f32;
                    e * e
                })
                .sum();
            if err < best.0 {
                best = (err, s);
            }
        }
    }
    best.1
}

/// Reinterpret little-endian f32 bytes without copying when the buffer is
/// suitably aligned (record buffers are), copying otherwise.
pub(crate) fn f32_from_le(bytes: &[u8]) -> Cow<'_, [f32]> {
    #[cfg(target_endian = "little")]
    {
        // SAFETY: every bit pattern is a valid f32, and align_to only puts
        // properly aligned, in-bounds elements in the middle slice.
        let (head, mid, tail) = unsafe { bytes.align_to::<f32>() };
        if head.is_empty() && tail.is_empty() {
            return Cow::Borrowed(mid);
        }
    }
    Cow::Owned(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
}

/// A borrowed matrix in any group format (lengths already validated).
#[derive(Clone, Copy)]
pub(crate) struct MatRef<'a> {
    pub rows: usize,
    pub cols: usize,
    kind: Kind<'a>,
}

#[derive(Clone, Copy)]
enum Kind<'a> {
    F32(&'a [f32]),
    Q8 {
        scales: &'a [u8],
        q: &'a [u8],
    },
    Q4 {
        scales: &'a [u8],
        q: &'a [u8],
    },
    /// A GGUF tensor's rows: every product is `dot8` of a decoded row
    /// (`GgmlMatrix`), so `matvec`, `matvec_many` and `matmul` agree bit
    /// for bit.
    Ggml(GgmlMatrix<'a>),
}

impl<'a> MatRef<'a> {
    pub fn f32(w: &'a [f32], rows: usize, cols: usize) -> Self {
        assert_eq!(w.len(), rows * cols, "matrix: w.len() != rows * cols");
        MatRef { rows, cols, kind: Kind::F32(w) }
    }

    /// A q8/q4/ggml matrix over `fmt.byte_len(rows, cols)` bytes.
    pub fn quant(fmt: TrunkFormat, bytes: &'a [u8], rows: usize, cols: usize) -> Self {
        assert_eq!(bytes.len(), fmt.byte_len(rows, cols), "matrix: byte length");
        if let TrunkFormat::Ggml(t) = fmt {
            let m = GgmlMatrix::new("trunk matrix", t, rows, cols, bytes).unwrap_or_else(|e| panic!("{e}"));
            return MatRef { rows, cols, kind: Kind::Ggml(m) };
        }
        let (scales, q) = bytes.split_at(super::scale_bytes(rows, cols));
        let kind = match fmt {
            TrunkFormat::Q8 => Kind::Q8 { scales, q },
            TrunkFormat::Q4 => Kind::Q4 { scales, q },
            TrunkFormat::F32 | TrunkFormat::Ggml(_) => unreachable!("f32 matrices go through MatRef::f32"),
        };
        MatRef { rows, cols, kind }
    }

    #[inline]
    fn row_scales(&self, scales: &'a [u8], r: usize) -> &'a [u8] {
        let g2 = 2 * self.cols.div_ceil(GROUP);
        &scales[r * g2..(r + 1) * g2]
    }

    /// The inputs `x` (`[n, cols]`) quantised for a q4 matrix's integer
    /// products (`int8`), or `None`: f32, q8 and GGUF matrices compute in
    /// f32. Matrices of one format and width that take the same inputs
    /// (an expert's gate and up) can share them (`matvec_many_with`).
    pub(crate) fn int8_inputs(&self, x: &[f32]) -> Option<Int8Inputs> {
        matches!(self.kind, Kind::Q4 { .. }).then(|| Int8Inputs::new(x, self.cols))
    }

    /// Rows `r0..r0 + n` (`n <= int8::BLOCK_ROWS`) of a q4 matrix as the
    /// integer kernels take them.
    #[inline]
    fn q4_block(&self, r0: usize, n: usize) -> int8::Block<'a> {
        let Kind::Q4 { scales, q } = self.kind else { unreachable!("int8 products are q4's") };
        let (g2, rb) = (2 * self.cols.div_ceil(GROUP), self.cols.div_ceil(2));
        int8::Block { rows: n, scales: &scales[r0 * g2..(r0 + n) * g2], q: &q[r0 * rb..(r0 + n) * rb] }
    }

    /// `y[i]` = q4 row `first + i` times the one input quantised in
    /// `inputs`, in blocks of sixteen rows, in parallel when large.
    fn q4_matvec_rows(&self, first: usize, inputs: &Int8Inputs, y: &mut [f32]) {
        let task = |(b, ys): (usize, &mut [f32])| {
            let mut o = [[0f32; int8::BLOCK_ROWS]];
            int8::dot_block(self.q4_block(first + b * ROW_BLOCK, ys.len()), inputs, 0, &mut o);
            ys.copy_from_slice(&o[0][..ys.len()]);
        };
        if y.len() * self.cols >= PAR_MIN_WORK && y.len() > ROW_BLOCK {
            y.par_chunks_mut(ROW_BLOCK).enumerate().for_each(task);
        } else {
            y.chunks_mut(ROW_BLOCK).enumerate().for_each(task);
        }
    }

    /// `matvec_many_with` for q4: every input against every block of
    /// sixteen rows, each block's groups interleaved once per task.
    fn q4_matvec_many(&self, inputs: &Int8Inputs, n: usize, y: &mut [f32]) {
        let rows = self.rows;
        if n >= 2 * MANY_INPUTS {
            // Tasks own blocks of inputs and pass every row block over them.
            y.par_chunks_mut(MANY_INPUTS * rows).enumerate().for_each(|(b, yb)| {
                let mut o = [[0f32; int8::BLOCK_ROWS]; MANY_INPUTS];
                let o = &mut o[..yb.len() / rows];
                for r0 in (0..rows).step_by(ROW_BLOCK) {
                    let len = ROW_BLOCK.min(rows - r0);
                    int8::dot_block(self.q4_block(r0, len), inputs, b * MANY_INPUTS, o);
                    for (yt, ot) in yb.chunks_exact_mut(rows).zip(o.iter()) {
                        yt[r0..r0 + len].copy_from_slice(&ot[..len]);
                    }
                }
            });
            return;
        }
        // Few inputs: tasks own blocks of rows.
        by_row_blocks((rows, self.cols, n), ROW_BLOCK, y, |b, out| {
            let mut o = [[0f32; int8::BLOCK_ROWS]; 2 * MANY_INPUTS];
            let o = &mut o[..n];
            let len = out.len() / n;
            int8::dot_block(self.q4_block(b * ROW_BLOCK, len), inputs, 0, o);
            for (j, col) in out.chunks_exact_mut(n).enumerate() {
                for (v, ot) in col.iter_mut().zip(o.iter()) {
                    *v = ot[j];
                }
            }
        });
    }

    /// `out[t] = ` row `r` times input `t` of `x` (f32 rows) for the f32,
    /// q8 and GGUF matrices, bit for bit what `row_dot` gives each input
    /// alone, the weights loaded once per tile of inputs.
    #[inline]
    fn row_dots(&self, r: usize, x: &[f32], out: &mut [f32]) {
        let c = self.cols;
        match self.kind {
            Kind::F32(w) => simd::dot_f32_rows(&w[r * c..(r + 1) * c], x, out),
            Kind::Q8 { scales, q } => simd::dot_q8_rows(self.row_scales(scales, r), &q[r * c..(r + 1) * c], x, out),
            Kind::Ggml(m) => m.row_dots(r, x, out),
            Kind::Q4 { .. } => unreachable!("q4 products are int8 blocks"),
        }
    }

    /// Row `r` of an f32, q8 or GGUF matrix dotted with the one input `x`.
    #[inline]
    fn row_dot(&self, r: usize, x: &[f32]) -> f32 {
        let c = self.cols;
        match self.kind {
            Kind::F32(w) => simd::dot_f32(&w[r * c..(r + 1) * c], x),
            Kind::Q8 { scales, q } => simd::dot_q8(self.row_scales(scales, r), &q[r * c..(r + 1) * c], x),
            _ => {
                let mut y = [0f32];
                self.row_dots(r, x, &mut y);
                y[0]
            }
        }
    }

    /// `y[t] = W x[t]` for the `n = x.len() / cols` inputs of a prefill
    /// chunk (`x` `[n, cols]`, `y` `[n, rows]`), every value bit-identical
    /// to what `matvec` gives for that input alone: the same row-dot
    /// kernel, run over several inputs per load of the weights. Panics
    /// unless the lengths agree.
    pub fn matvec_many(&self, x: &[f32], y: &mut [f32]) {
        let inputs = self.int8_inputs(x);
        self.matvec_many_with(x, inputs.as_ref(), y)
    }

    /// `matvec_many` on inputs already quantised by `int8_inputs` of a
    /// matrix of the same format and width (`None` where that gives none).
    pub(crate) fn matvec_many_with(&self, x: &[f32], inputs: Option<&Int8Inputs>, y: &mut [f32]) {
        let (rows, cols) = (self.rows, self.cols);
        assert!(cols > 0 && x.len().is_multiple_of(cols), "matvec_many: x of {} is not whole rows of {cols}", x.len());
        let n = x.len() / cols;
        assert_eq!(y.len(), n * rows, "matvec_many: y length");
        if n == 0 || rows == 0 {
            return;
        }
        if n == 1 {
            return self.matvec_with(x, inputs, y);
        }
        if let Some(q) = inputs {
            return self.q4_matvec_many(q, n, y);
        }
        if let Kind::Ggml(m) = self.kind {
            // Rows decoded a block at a time and run in register tiles of
            // several rows: one row against the inputs made one weight
            // load per FMA's worth of inputs. Same `dot8` bits.
            return m.matmul(x, y);
        }
        if n >= 2 * MANY_INPUTS {
            // Tasks own blocks of inputs and pass every weight row over them.
            let blocks = y.par_chunks_mut(MANY_INPUTS * rows).zip(x.par_chunks(MANY_INPUTS * cols));
            blocks.for_each(|(yb, xb)| {
                let mut col = vec![0f32; xb.len() / cols];
                for r in 0..rows {
                    self.row_dots(r, xb, &mut col);
                    for (yt, &v) in yb.chunks_exact_mut(rows).zip(&col) {
                        yt[r] = v;
                    }
                }
            });
            return;
        }
        // Few inputs: tasks own blocks of rows.
        by_row_blocks((rows, cols, n), ROW_BLOCK, y, |b, out| {
            for (i, col) in out.chunks_exact_mut(n).enumerate() {
                self.row_dots(b * ROW_BLOCK + i, x, col);
            }
        });
    }

    /// Dequantised row `r` into `out` (`out.len() == cols`).
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        let c = self.cols;
        assert_eq!(out.len(), c, "row: out.len() != cols");
        match self.kind {
            Kind::F32(w) => out.copy_from_slice(&w[r * c..(r + 1) * c]),
            Kind::Ggml(m) => m.row_into(r, out),
            // One scale conversion per group, not per value: the software
            // f16 conversion cost 1.5 ns a value, which `matmul` paid for
            // every weight of every input block (docs/PERFORMANCE.md).
            Kind::Q8 { scales, q } => {
                let sc = self.row_scales(scales, r);
                for (g, (og, qg)) in out.chunks_mut(GROUP).zip(q[r * c..(r + 1) * c].chunks(GROUP)).enumerate() {
                    let s = f16_at(sc, g);
                    for (o, &b) in og.iter_mut().zip(qg) {
                        *o = s * (b as i8) as f32;
                    }
                }
            }
            Kind::Q4 { scales, q } => {
                let sc = self.row_scales(scales, r);
                let rb = c.div_ceil(2);
                let qr = &q[r * rb..(r + 1) * rb];
                // GROUP is even, so every group starts on a byte.
                for (g, (og, qg)) in out.chunks_mut(GROUP).zip(qr.chunks(GROUP / 2)).enumerate() {
                    let s = f16_at(sc, g);
                    for (o2, &b) in og.chunks_mut(2).zip(qg) {
                        o2[0] = s * ((b & 0x0F) as i32 - 8) as f32;
                        if let Some(hi) = o2.get_mut(1) {
                            *hi = s * ((b >> 4) as i32 - 8) as f32;
                        }
                    }
                }
            }
        }
    }

    /// `y = W x`, rows split across rayon for large matrices.
    pub fn matvec(&self, x: &[f32], y: &mut [f32]) {
        assert!(x.len() == self.cols && y.len() == self.rows, "matvec: x/y length");
        if let Kind::Ggml(m) = self.kind {
            return m.matvec(x, y);
        }
        let inputs = self.int8_inputs(x);
        self.matvec_with(x, inputs.as_ref(), y)
    }

    /// `matvec` on an input already quantised by `int8_inputs` (`None`
    /// where that gives none).
    pub(crate) fn matvec_with(&self, x: &[f32], inputs: Option<&Int8Inputs>, y: &mut [f32]) {
        assert!(x.len() == self.cols && y.len() == self.rows, "matvec: x/y length");
        if let Kind::Ggml(m) = self.kind {
            return m.matvec(x, y);
        }
        assert_eq!(inputs.is_some(), matches!(self.kind, Kind::Q4 { .. }), "matvec: int8 inputs are q4's alone");
        match inputs {
            Some(q) => self.q4_matvec_rows(0, q, y),
            None => self.rows_matvec(0, x, y),
        }
    }

    /// `y[i] = ` row `first + i` times the one input `x`, for the f32, q8
    /// and GGUF matrices: each row's `row_dot` bits.
    fn rows_matvec(&self, first: usize, x: &[f32], y: &mut [f32]) {
        let work = y.len() * self.cols;
        match self.kind {
            // Several rows a pass: one q8 row's FMA chains were
            // latency-bound (`simd::dot_q8_many_rows`).
            Kind::Q8 { scales, q } => par_row_blocks(y, work, |b, ys| {
                let (c, g2) = (self.cols, 2 * self.cols.div_ceil(GROUP));
                let rows = first + b..first + b + ys.len();
                simd::dot_q8_many_rows(&scales[rows.start * g2..rows.end * g2], &q[rows.start * c..rows.end * c], x, ys)
            }),
            _ => par_rows(y, work, |i| self.row_dot(first + i, x)),
        }
    }

    /// `y[t] = W x[t]` for `n = x.len() / cols` inputs at once (`x`
    /// `[n, cols]`, `y` `[n, rows]`): `matmul_decoded` on this matrix's rows,
    /// or a GGUF matrix's own product (its int16 types' bits).
    pub fn matmul(&self, x: &[f32], y: &mut [f32]) {
        if let Kind::Ggml(m) = self.kind {
            return m.matmul(x, y);
        }
        let v = *self;
        matmul_decoded(self.rows, self.cols, &|r, out: &mut [f32]| v.row_into(r, out), x, y);
    }

    pub fn dequantize(&self) -> Vec<f32> {
        dequantize_rows(self.rows, self.cols, &|r, out: &mut [f32]| self.row_into(r, out))
    }
}

/// `y[r] = f(r)` for every row; in parallel blocks when `work` is large.
/// Each row is computed by exactly one call, so the result does not depend
/// on the thread count.
pub(crate) fn par_rows(y: &mut [f32], work: usize, f: impl Fn(usize) -> f32 + Sync) {
    par_row_blocks(y, work, |first, ys| {
        for (i, v) in ys.iter_mut().enumerate() {
            *v = f(first + i);
        }
    })
}

/// `f(first, ys)` fills the rows `first..first + ys.len()` of `y`: blocks
/// of `ROW_BLOCK` rows in parallel when `work` is large, else all of `y`
/// at once. Each row is computed by exactly one call.
fn par_row_blocks(y: &mut [f32], work: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    if work >= PAR_MIN_WORK && y.len() > ROW_BLOCK {
        y.par_chunks_mut(ROW_BLOCK).enumerate().for_each(|(b, ys)| f(b * ROW_BLOCK, ys));
    } else {
        f(0, y)
    }
}

/// A resident matrix that owns its weights.
#[derive(Debug, Clone)]
pub struct QMatrix {
    fmt: TrunkFormat,
    rows: usize,
    cols: usize,
    data: Data,
}

/// f32 weights are kept as `Vec<f32>` so they are aligned; q8/q4 bytes are
/// only ever read bytewise or with unaligned loads, so `Vec<u8>` suffices.
#[derive(Debug, Clone)]
enum Data {
    F32(Vec<f32>),
    Bytes(Vec<u8>),
}

impl QMatrix {
    /// An f32 matrix. Panics if `w.len() != rows * cols`.
    pub fn from_f32(w: Vec<f32>, rows: usize, cols: usize) -> QMatrix {
        assert_eq!(w.len(), rows * cols, "QMatrix::from_f32: w.len() != rows * cols");
        QMatrix { fmt: TrunkFormat::F32, rows, cols, data: Data::F32(w) }
    }

    /// A matrix from its stored bytes (copied); the length must be exactly
    /// `fmt.byte_len(rows, cols)`.
    pub fn from_bytes(fmt: TrunkFormat, rows: usize, cols: usize, bytes: &[u8]) -> Result<QMatrix, QuantError> {
        if rows.checked_mul(cols).and_then(|n| n.checked_mul(4)).is_none() {
            return Err(QuantError::Shape { what: "trunk matrix", rows, cols });
        }
        let expected = fmt.byte_len(rows, cols);
        if bytes.len() != expected {
            return Err(QuantError::Length { what: "trunk matrix", expected, got: bytes.len() });
        }
        let data = match fmt {
            TrunkFormat::F32 => Data::F32(f32_from_le(bytes).into_owned()),
            _ => Data::Bytes(bytes.to_vec()),
        };
        Ok(QMatrix { fmt, rows, cols, data })
    }

    /// A quantised matrix that takes `bytes` (its stored form) as its
    /// storage, without copying; the length must be exactly
    /// `fmt.byte_len(rows, cols)`. f32 matrices use `from_f32`.
    pub fn from_byte_vec(fmt: TrunkFormat, rows: usize, cols: usize, bytes: Vec<u8>) -> Result<QMatrix, QuantError> {
        if fmt == TrunkFormat::F32 {
            return QMatrix::from_bytes(fmt, rows, cols, &bytes);
        }
        if rows.checked_mul(cols).and_then(|n| n.checked_mul(4)).is_none() {
            return Err(QuantError::Shape { what: "trunk matrix", rows, cols });
        }
        let expected = fmt.byte_len(rows, cols);
        if bytes.len() != expected {
            return Err(QuantError::Length { what: "trunk matrix", expected, got: bytes.len() });
        }
        Ok(QMatrix { fmt, rows, cols, data: Data::Bytes(bytes) })
    }

    pub fn format(&self) -> TrunkFormat {
        self.fmt
    }
    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Bytes held, equal to `format().byte_len(rows, cols)`.
    pub fn byte_len(&self) -> usize {
        self.fmt.byte_len(self.rows, self.cols)
    }

    fn view(&self) -> MatRef<'_> {
        match &self.data {
            Data::F32(w) => MatRef::f32(w, self.rows, self.cols),
            Data::Bytes(b) => MatRef::quant(self.fmt, b, self.rows, self.cols),
        }
    }

    /// `y = W x`. Panics unless `x.len() == cols` and `y.len() == rows`.
    pub fn matvec(&self, x: &[f32], y: &mut [f32]) {
        self.view().matvec(x, y)
    }

    /// `y[i] = W[first + i] . x` for a block of consecutive rows (MLA's
    /// per-head slices of `kv_b_proj`). Panics unless `x.len() == cols` and
    /// the block lies inside the matrix.
    pub fn matvec_rows(&self, first: usize, x: &[f32], y: &mut [f32]) {
        assert!(
            x.len() == self.cols && first.checked_add(y.len()).is_some_and(|end| end <= self.rows),
            "QMatrix::matvec_rows: rows {first}+{} of {}, x {} of {}",
            y.len(),
            self.rows,
            x.len(),
            self.cols
        );
        let v = self.view();
        match v.int8_inputs(x) {
            Some(q) => v.q4_matvec_rows(first, &q, y),
            None => v.rows_matvec(first, x, y),
        }
    }

    /// `y += a * W[r]`, each weight dequantised to exactly the f32 that
    /// `row` / `dequantize` give and then multiplied and added as an f32
    /// loop over those values would, so the result is bit-identical to that
    /// loop without holding the f32 matrix (MLA's `W_nope^T q` side).
    /// Panics unless `r < rows` and `y.len() == cols`.
    pub fn add_scaled_row(&self, r: usize, a: f32, y: &mut [f32]) {
        let c = self.cols;
        assert!(
            r < self.rows && y.len() == c,
            "QMatrix::add_scaled_row: row {r} of {}, y {} of {c}",
            self.rows,
            y.len()
        );
        let v = self.view();
        match v.kind {
            Kind::F32(w) => {
                for (o, &wv) in y.iter_mut().zip(&w[r * c..(r + 1) * c]) {
                    *o += a * wv;
                }
            }
            Kind::Q8 { scales, q } => {
                let sc = v.row_scales(scales, r);
                let qr = &q[r * c..(r + 1) * c];
                for (g, (yg, qg)) in y.chunks_mut(GROUP).zip(qr.chunks(GROUP)).enumerate() {
                    let s = f16_at(sc, g);
                    for (o, &b) in yg.iter_mut().zip(qg) {
                        *o += a * (s * (b as i8) as f32);
                    }
                }
            }
            Kind::Q4 { scales, q } => {
                let sc = v.row_scales(scales, r);
                let rb = c.div_ceil(2);
                let qr = &q[r * rb..(r + 1) * rb];
                // GROUP is even, so every group starts on a byte.
                // Unpacking a group into a buffer first lets both loops
                // vectorise; interleaving them into `y` did not.
                let mut buf = [0f32; GROUP];
                for (g, (yg, qg)) in y.chunks_mut(GROUP).zip(qr.chunks(GROUP / 2)).enumerate() {
                    let s = f16_at(sc, g);
                    for (v2, &b) in buf.chunks_exact_mut(2).zip(qg) {
                        v2[0] = s * ((b & 0x0F) as i32 - 8) as f32;
                        v2[1] = s * ((b >> 4) as i32 - 8) as f32;
                    }
                    for (o, &v) in yg.iter_mut().zip(&buf) {
                        *o += a * v;
                    }
                }
            }
            Kind::Ggml(m) => {
                let mut w = vec![0f32; c];
                m.row_into(r, &mut w);
                for (o, &wv) in y.iter_mut().zip(&w) {
                    *o += a * wv;
                }
            }
        }
    }

    /// `y[t] = W x[t]` for `n = x.len() / cols` inputs at once (`x`
    /// `[n, cols]`, `y` `[n, rows]`): a vision tower's patches or a prefill
    /// chunk's tokens, where a weight row serves many inputs. See
    /// `MatRef::matmul`. Panics unless the lengths agree.
    pub fn matmul(&self, x: &[f32], y: &mut [f32]) {
        self.view().matmul(x, y)
    }

    /// `y[t] = W x[t]` for the inputs of a prefill chunk, each value
    /// bit-identical to `matvec`'s for that input (see
    /// `MatRef::matvec_many`). Panics unless the lengths agree.
    pub fn matvec_many(&self, x: &[f32], y: &mut [f32]) {
        self.view().matvec_many(x, y)
    }

    /// `matvec_many` of several matrices on the same inputs (a layer's q, k
    /// and v; a dense MLP's gate and up), each output the bits of its own
    /// `matvec_many`: the inputs quantised once, not once per matrix, where
    /// the matrices' products take them so (q4's int8, GGUF Q4_K's and
    /// Q6_K's int16, then in one parallel call). Panics unless the lengths
    /// agree.
    pub fn matvec_many_each(products: &mut [(&QMatrix, &mut [f32])], x: &[f32]) {
        let views: Vec<MatRef> = products.iter().map(|(m, _)| m.view()).collect();
        let Some(cols) = views.first().map(|v| v.cols) else { return };
        let same_width = views.iter().all(|v| v.cols == cols && v.rows > 0 && cols > 0);
        let int16 = |v: &MatRef| matches!(v.kind, Kind::Ggml(m) if m.ty().takes_int16_inputs());
        if same_width && views.iter().all(int16) {
            assert!(x.len().is_multiple_of(cols), "matvec_many: x of {} is not whole rows of {cols}", x.len());
            let mut each: Vec<(GgmlMatrix, &mut [f32])> = views
                .iter()
                .zip(products.iter_mut())
                .map(|(v, (_, y))| match v.kind {
                    Kind::Ggml(m) => (m, &mut **y),
                    _ => unreachable!("checked above"),
                })
                .collect();
            return GgmlMatrix::matmul_each(&mut each, x);
        }
        if same_width && views.iter().all(|v| matches!(v.kind, Kind::Q4 { .. })) {
            let inputs = views[0].int8_inputs(x);
            for (v, (_, y)) in views.iter().zip(products.iter_mut()) {
                v.matvec_many_with(x, inputs.as_ref(), y);
            }
            return;
        }
        for (m, y) in products.iter_mut() {
            m.matvec_many(x, y);
        }
    }

    /// Dequantised row `r` (embedding lookup). Panics unless `r < rows` and
    /// `out.len() == cols`; callers check token ids first.
    pub fn row(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows, "QMatrix::row: row {r} out of {}", self.rows);
        self.view().row_into(r, out)
    }

    pub fn dequantize(&self) -> Vec<f32> {
        self.view().dequantize()
    }
}

#[cfg(test)]
mod tests;
