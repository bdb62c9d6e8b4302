//! Routed experts: payload layout, encode/decode, and the SwiGLU forward
//! that runs on the stored format (tables + gathers for RVQ).

use super::rvq::{self, Codebooks, LayerCodebooks};
use super::rvq4p::{self, QTables};
use super::simd::{self, f16_at};
use super::trunk::{f32_from_le, quantize_into, MatRef};
use super::Activation;
use super::{ExpertF32, ExpertFormat, ExpertShape, QuantError, TrunkFormat, VDIM};
use rayon::prelude::*;

/// Vectors per rayon task when building tables.
const TABLE_VBLOCK: usize = 32;
/// Code positions per table chunk of the RVQ matvec: 16 x 256 f32 = 16 KB
/// of tables, L1-resident while all of a task's rows walk them.
const RVQ_CHUNK: usize = 16;
/// Rows per rayon task of the RVQ matvec.
const RVQ_TASK_ROWS: usize = 128;

/// Bytes of one `[rows, cols]` matrix of an expert in one of our own
/// formats (`slab_lens` has the GGUF ones).
fn mat_len(fmt: ExpertFormat, rows: usize, cols: usize) -> usize {
    if fmt == ExpertFormat::Rvq4p {
        return rvq4p::mat_len(rows, cols);
    }
    match (fmt.group_format(), fmt.stages()) {
        (Some(t), _) => t.byte_len(rows, cols),
        (None, Some(st)) => {
            rows.saturating_mul(2).saturating_add(rows.saturating_mul(cols.div_ceil(VDIM)).saturating_mul(st))
        }
        (None, None) => TrunkFormat::F32.byte_len(rows, cols),
    }
}

/// Bytes of an expert's gate, up and down matrices (saturating: a shape
/// whose rows are not whole ggml blocks is `usize::MAX`, which no payload
/// has).
fn slab_lens(fmt: ExpertFormat, shape: ExpertShape) -> [usize; 3] {
    let (h, i) = (shape.hidden, shape.inter);
    match fmt {
        ExpertFormat::Ggml(t) => {
            let len = |ty: super::GgmlType, rows, cols| ty.matrix_bytes(rows, cols).unwrap_or(usize::MAX);
            [len(t.gate, i, h), len(t.up, i, h), len(t.down, h, i)]
        }
        _ => [mat_len(fmt, i, h), mat_len(fmt, i, h), mat_len(fmt, h, i)],
    }
}

/// Bytes of one expert's payload (gate, up, down, biases; module docs).
pub fn expert_payload_len(fmt: ExpertFormat, shape: ExpertShape) -> usize {
    let [g, u, d] = slab_lens(fmt, shape);
    g.saturating_add(u).saturating_add(d).saturating_add(bias_len(shape))
}

/// Bytes of an expert's f32 biases (none without them).
fn bias_len(shape: ExpertShape) -> usize {
    if shape.biases {
        shape.inter.saturating_mul(2).saturating_add(shape.hidden).saturating_mul(4)
    } else {
        0
    }
}

/// Validate a payload from disk (length) and the codebooks it needs, so
/// that `expert_forward` / `decode_expert` can then run without failing.
pub fn check_expert_payload(
    fmt: ExpertFormat,
    shape: ExpertShape,
    payload: &[u8],
    cb: Option<&LayerCodebooks>,
) -> Result<(), QuantError> {
    let (h, i) = (shape.hidden, shape.inter);
    if h.checked_mul(i).and_then(|n| n.checked_mul(4 * 3)).is_none() {
        return Err(QuantError::Shape { what: "expert", rows: i, cols: h });
    }
    if let ExpertFormat::Ggml(t) = fmt {
        for (what, ty, cols) in [("gate", t.gate, h), ("up", t.up, h), ("down", t.down, i)] {
            if !cols.is_multiple_of(ty.block_elems()) {
                return Err(QuantError::Shape { what, rows: if what == "down" { h } else { i }, cols });
            }
        }
    }
    let expected = expert_payload_len(fmt, shape);
    if payload.len() != expected {
        return Err(QuantError::Length { what: "expert payload", expected, got: payload.len() });
    }
    check_codebooks(fmt, cb)
}

fn check_codebooks(fmt: ExpertFormat, cb: Option<&LayerCodebooks>) -> Result<(), QuantError> {
    let Some(st) = fmt.stages() else { return Ok(()) };
    let Some(cb) = cb else {
        return Err(QuantError::Codebooks(format!("{} experts need layer codebooks", fmt.name())));
    };
    if cb.gate_up.stages() != st || cb.down.stages() != st {
        return Err(QuantError::Codebooks(format!(
            "{} needs {st} stages, codebooks have {}/{}",
            fmt.name(),
            cb.gate_up.stages(),
            cb.down.stages()
        )));
    }
    let e = fmt.entries();
    if cb.gate_up.entries() != e || cb.down.entries() != e {
        return Err(QuantError::Codebooks(format!(
            "{} needs {e} entries per stage, codebooks have {}/{}",
            fmt.name(),
            cb.gate_up.entries(),
            cb.down.entries()
        )));
    }
    Ok(())
}

/// `(gate, up, down)` byte ranges of a payload, and its biases' bytes
/// (empty without them).
pub(crate) fn split_payload(fmt: ExpertFormat, shape: ExpertShape, payload: &[u8]) -> ([&[u8]; 3], &[u8]) {
    assert_eq!(payload.len(), expert_payload_len(fmt, shape), "expert payload length");
    let [gl, ul, _] = slab_lens(fmt, shape);
    let (matrices, biases) = payload.split_at(payload.len() - bias_len(shape));
    let (g, rest) = matrices.split_at(gl);
    let (u, d) = rest.split_at(ul);
    ([g, u, d], biases)
}

/// The biases of a payload as `[gate, up, down]` f32, if the shape has them.
pub fn decode_expert_biases(fmt: ExpertFormat, shape: ExpertShape, payload: &[u8]) -> Option<[Vec<f32>; 3]> {
    if !shape.biases {
        return None;
    }
    let (_, b) = split_payload(fmt, shape, payload);
    let all = f32_from_le(b);
    let (g, rest) = all.split_at(shape.inter);
    let (u, d) = rest.split_at(shape.inter);
    Some([g.to_vec(), u.to_vec(), d.to_vec()])
}

pub(crate) fn codebooks_for(fmt: ExpertFormat, cb: Option<&LayerCodebooks>) -> Option<&LayerCodebooks> {
    if let Err(e) = check_codebooks(fmt, cb) {
        panic!("{e}");
    }
    cb
}

/// An RVQ matrix over its bytes.
struct RvqRef<'a> {
    rows: usize,
    cols: usize,
    stages: usize,
    scales: &'a [u8],
    codes: &'a [u8],
}

impl<'a> RvqRef<'a> {
    fn new(bytes: &'a [u8], rows: usize, cols: usize, stages: usize) -> Self {
        let (scales, codes) = bytes.split_at(2 * rows);
        RvqRef { rows, cols, stages, scales, codes }
    }
    fn row_codes(&self, r: usize) -> &'a [u8] {
        let n = self.cols.div_ceil(VDIM) * self.stages;
        &self.codes[r * n..(r + 1) * n]
    }
    /// `y = W x` where `table` was built from `x` with this layer's codebooks
    /// (in plane layout when `planes`, `simd::tables_to_planes`).
    ///
    /// Row `r` is `scale[r] * sum_j table[j*256 + code[r][j]]`, summed in
    /// order over `j` (`simd::rvq_row_scalar`). A task walks the positions
    /// in chunks of `RVQ_CHUNK` (16 KB of tables, L1-resident) and runs all
    /// its rows over each chunk before the next: one row's lookups would
    /// otherwise touch 864 different 1 KB tables and miss L1 on nearly
    /// every one. Each row keeps its running sum across chunks, so neither
    /// the chunking nor the task split (the thread count) changes a bit, nor
    /// does the table layout (both kernels are the same in-order sums).
    fn matvec_tables(&self, table: &[f32], planes: bool, y: &mut [f32]) {
        let n = self.cols.div_ceil(VDIM) * self.stages;
        let job = |r0: usize, ys: &mut [f32]| {
            ys.fill(0.0);
            let rows = ys.len();
            let block = &self.codes[r0 * n..(r0 + rows) * n];
            // The chunk-major walk reads the codes with a row stride, which
            // the hardware prefetcher follows poorly: ask for this task's
            // codes now and for the next task's a little per chunk.
            let next_end = ((r0 + 2 * rows) * n).min(self.codes.len());
            let next = &self.codes[(r0 + rows) * n..next_end];
            simd::prefetch(block);
            let per_chunk = next.len().div_ceil(n.div_ceil(RVQ_CHUNK).max(1)).next_multiple_of(64);
            for (k, c0) in (0..n).step_by(RVQ_CHUNK).enumerate() {
                let c1 = (c0 + RVQ_CHUNK).min(n);
                let p0 = (k * per_chunk).min(next.len());
                simd::prefetch(&next[p0..(p0 + per_chunk).min(next.len())]);
                if planes {
                    simd::rvq_rows_planes(table, block, n, c0, c1, ys);
                } else {
                    simd::rvq_rows(table, block, n, c0, c1, ys);
                }
            }
            for (i, yv) in ys.iter_mut().enumerate() {
                *yv *= f16_at(self.scales, r0 + i);
            }
        };
        if self.rows * self.cols >= super::decoded::PAR_MIN_WORK && self.rows > RVQ_TASK_ROWS {
            y.par_chunks_mut(RVQ_TASK_ROWS).enumerate().for_each(|(b, ys)| job(b * RVQ_TASK_ROWS, ys));
        } else if n > 0 {
            job(0, y);
        } else {
            y.fill(0.0);
        }
    }
}

/// The RVQ matvec of one matrix's bytes (kernel tests).
#[cfg(test)]
pub(crate) fn rvq_matvec_for_tests(
    bytes: &[u8],
    rows: usize,
    cols: usize,
    stages: usize,
    table: &[f32],
    y: &mut [f32],
) {
    RvqRef::new(bytes, rows, cols, stages).matvec_tables(table, false, y)
}

/// Encode one expert. RVQ formats need the layer's codebooks; panics if
/// they are missing or the slices do not match `shape`, and for the GGUF
/// formats, which are copied from their file, never encoded here.
pub fn encode_expert(fmt: ExpertFormat, shape: ExpertShape, e: &ExpertF32, cb: Option<&LayerCodebooks>) -> Vec<u8> {
    assert!(!matches!(fmt, ExpertFormat::Ggml(_)), "encode_expert: GGUF experts are copied, not encoded");
    let (h, i) = (shape.hidden, shape.inter);
    assert!(
        e.gate.len() == i * h && e.up.len() == i * h && e.down.len() == h * i,
        "encode_expert: expert slices do not match the shape"
    );
    let cb = codebooks_for(fmt, cb);
    let mut out = vec![0u8; expert_payload_len(fmt, shape)];
    let tail = out.len() - bias_len(shape);
    let (matrices, bias_bytes) = out.split_at_mut(tail);
    match (shape.biases, e.biases) {
        (true, Some([bg, bu, bd])) => {
            assert!(bg.len() == i && bu.len() == i && bd.len() == h, "encode_expert: bias lengths do not match");
            for (dst, v) in bias_bytes.chunks_exact_mut(4).zip(bg.iter().chain(bu).chain(bd)) {
                dst.copy_from_slice(&v.to_le_bytes());
            }
        }
        (false, None) => {}
        _ => panic!("encode_expert: biases given {} for a shape with biases {}", e.biases.is_some(), shape.biases),
    }
    let gu = mat_len(fmt, i, h);
    let (g, rest) = matrices.split_at_mut(gu);
    let (u, d) = rest.split_at_mut(gu);
    for (buf, w, rows, cols, book) in [
        (g, e.gate, i, h, cb.map(|c| &c.gate_up)),
        (u, e.up, i, h, cb.map(|c| &c.gate_up)),
        (d, e.down, h, i, cb.map(|c| &c.down)),
    ] {
        match (fmt.group_format(), book) {
            (Some(t), _) => quantize_into(t, w, rows, cols, buf),
            (None, Some(book)) if fmt == ExpertFormat::Rvq4p => encode_rvq4p(w, rows, cols, book, buf),
            (None, Some(book)) => encode_rvq(w, rows, cols, book, buf),
            (None, None) => quantize_into(TrunkFormat::F32, w, rows, cols, buf),
        }
    }
    out
}

fn encode_rvq(w: &[f32], rows: usize, cols: usize, cb: &Codebooks, buf: &mut [u8]) {
    if rows == 0 || cols == 0 {
        return;
    }
    let n = cols.div_ceil(VDIM) * cb.stages();
    let (scales, codes) = buf.split_at_mut(2 * rows);
    // Encoding is ~2k flops per weight, worth threads even for small rows.
    scales.par_chunks_mut(2).zip(codes.par_chunks_mut(n).zip(w.par_chunks(cols))).for_each(|(s, (c, row))| {
        s.copy_from_slice(&rvq::encode_row(row, cb, c).to_le_bytes());
    });
}

/// Codes row by row as `encode_rvq` does, then packed into row blocks.
fn encode_rvq4p(w: &[f32], rows: usize, cols: usize, cb: &Codebooks, buf: &mut [u8]) {
    if rows == 0 || cols == 0 {
        return;
    }
    let nvec = cols.div_ceil(VDIM);
    // Scales and row-major codes as rvq3 stores them, then repacked.
    let mut plain = vec![0u8; 2 * rows + rows * nvec * rvq4p::STAGES];
    encode_rvq(w, rows, cols, cb, &mut plain);
    let (sp, cp) = plain.split_at(2 * rows);
    let (scales, planes) = buf.split_at_mut(2 * rows);
    scales.copy_from_slice(sp);
    rvq4p::pack_codes(cp, rows, nvec, planes);
}

/// Dequantise an expert to f32 `(gate, up, down)` (tests, `convert
/// --verify`). Panics on a wrong payload length or missing codebooks;
/// check untrusted payloads with `check_expert_payload` first.
pub fn decode_expert(
    fmt: ExpertFormat,
    shape: ExpertShape,
    payload: &[u8],
    cb: Option<&LayerCodebooks>,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (h, i) = (shape.hidden, shape.inter);
    let cb = codebooks_for(fmt, cb);
    let ([g, u, d], _) = split_payload(fmt, shape, payload);
    if let ExpertFormat::Ggml(t) = fmt {
        return super::ggml::expert::decode(t, shape, [g, u, d]);
    }
    let dec = |bytes: &[u8], rows: usize, cols: usize, book: Option<&Codebooks>| -> Vec<f32> {
        match (fmt.group_format(), book) {
            (Some(t), _) => MatRef::quant(t, bytes, rows, cols).dequantize(),
            (None, Some(book)) => {
                let m = RvqRef::new(bytes, rows, cols, book.stages());
                let mut out = vec![0f32; rows * cols];
                if cols > 0 && fmt == ExpertFormat::Rvq4p {
                    let nvec = cols.div_ceil(VDIM);
                    let mut codes = vec![0u8; nvec * rvq4p::STAGES];
                    for (r, o) in out.chunks_exact_mut(cols).enumerate() {
                        for (v, c) in codes.chunks_exact_mut(rvq4p::STAGES).enumerate() {
                            c.copy_from_slice(&rvq4p::row_codes(m.codes, nvec, r, v));
                        }
                        rvq::decode_row(f16_at(m.scales, r), &codes, book, o);
                    }
                } else if cols > 0 {
                    for (r, o) in out.chunks_exact_mut(cols).enumerate() {
                        rvq::decode_row(f16_at(m.scales, r), m.row_codes(r), book, o);
                    }
                }
                out
            }
            (None, None) => f32_from_le(bytes).into_owned(),
        }
    };
    (dec(g, i, h, cb.map(|c| &c.gate_up)), dec(u, i, h, cb.map(|c| &c.gate_up)), dec(d, h, i, cb.map(|c| &c.down)))
}

/// Per token per layer input of the routed experts: for RVQ the gate/up
/// lookup tables `T[v][s][c]` (for `rvq4p` quantised to int8), otherwise a
/// copy of the input.
#[derive(Debug, Clone)]
pub struct GateUpTables {
    fmt: ExpertFormat,
    hidden: usize,
    data: Vec<f32>,
    q: QTables,
    /// `data` holds the rvq3/rvq2 tables in plane layout (AVX-512 kernel).
    planes: bool,
}

#[cfg(test)]
impl GateUpTables {
    /// The f32 tables (RVQ formats other than `rvq4p`).
    pub(crate) fn data(&self) -> &[f32] {
        assert!(!self.planes, "GateUpTables::data: tables are in plane layout");
        &self.data
    }
}

/// Build once per token per layer; shared by every routed expert of the
/// layer. RVQ formats need the codebooks (panics without them).
pub fn build_gate_up_tables(fmt: ExpertFormat, cb: Option<&LayerCodebooks>, x: &[f32]) -> GateUpTables {
    build_gate_up_tables_on(simd::isa(), fmt, cb, x)
}

/// `build_gate_up_tables` for the kernels of level `isa` (rvq3/rvq2 tables
/// are laid out for that level's row kernel; tests compare levels).
pub(crate) fn build_gate_up_tables_on(
    isa: simd::Isa,
    fmt: ExpertFormat,
    cb: Option<&LayerCodebooks>,
    x: &[f32],
) -> GateUpTables {
    let mut q = QTables::default();
    let planes = fmt != ExpertFormat::Rvq4p && fmt.uses_codebooks() && simd::rvq_planes(isa);
    let data = match codebooks_for(fmt, cb) {
        Some(cb) => {
            let mut t = vec![0f32; table_len(x.len(), &cb.gate_up)];
            fill_tables(x, &cb.gate_up, &mut t);
            if fmt == ExpertFormat::Rvq4p {
                q = QTables::with_len(x.len().div_ceil(VDIM));
                q.quantize_from(&t);
                // Only the int8 tables are read from here on.
                t = Vec::new();
            } else if planes {
                simd::tables_to_planes(&mut t);
            }
            t
        }
        None => x.to_vec(),
    };
    GateUpTables { fmt, hidden: x.len(), data, q, planes }
}

fn table_len(n: usize, cb: &Codebooks) -> usize {
    n.div_ceil(VDIM) * cb.stages() * cb.entries()
}

fn fill_tables(x: &[f32], cb: &Codebooks, out: &mut [f32]) {
    let st = cb.stages();
    let e = cb.entries();
    let per_v = st * e;
    if out.len() >= super::decoded::PAR_MIN_WORK * 4 {
        out.par_chunks_mut(per_v * TABLE_VBLOCK).enumerate().for_each(|(b, o)| {
            let v0 = b * TABLE_VBLOCK * VDIM;
            let x1 = (v0 + TABLE_VBLOCK * VDIM).min(x.len());
            simd::build_tables(&x[v0..x1], cb.cbt(), st, e, o);
        });
    } else {
        simd::build_tables(x, cb.cbt(), st, e, out);
    }
}

/// Reusable buffers for `expert_forward` (no allocation per call).
#[derive(Debug, Clone)]
pub struct ExpertScratch {
    fmt: ExpertFormat,
    shape: ExpertShape,
    gate: Vec<f32>,
    up: Vec<f32>,
    down_tables: Vec<f32>,
    down_q: QTables,
}

impl ExpertScratch {
    pub fn new(fmt: ExpertFormat, shape: ExpertShape) -> Self {
        let dt = match fmt.stages() {
            Some(st) => shape.inter.div_ceil(VDIM) * st * fmt.entries(),
            None => 0,
        };
        let down_q =
            if fmt == ExpertFormat::Rvq4p { QTables::with_len(shape.inter.div_ceil(VDIM)) } else { QTables::default() };
        ExpertScratch {
            fmt,
            shape,
            gate: vec![0.0; shape.inter],
            up: vec![0.0; shape.inter],
            down_tables: vec![0.0; dt],
            down_q,
        }
    }

    /// Bytes held, for the memory plan (`plan::scratch_bytes`).
    pub fn bytes(&self) -> usize {
        4 * (self.gate.len() + self.up.len() + self.down_tables.len())
            + self.down_q.q.len()
            + 4 * self.down_q.scales.len()
    }
}

/// The most bytes [`build_gate_up_tables`] holds at once for an input of
/// `hidden` floats (rvq4p: its f32 tables and their int8 copy), from the
/// same lengths it allocates.
pub fn gate_up_tables_peak_bytes(fmt: ExpertFormat, hidden: usize) -> usize {
    let nvec = hidden.div_ceil(VDIM);
    match fmt.stages() {
        Some(st) => {
            let q = if fmt == ExpertFormat::Rvq4p {
                let q = QTables::with_len(nvec);
                q.q.len() + 4 * q.scales.len()
            } else {
                0
            };
            4 * nvec * st * fmt.entries() + q
        }
        None => 4 * hidden,
    }
}

/// `out = down(silu(gate x) * up x)`, computed on the stored format.
/// `tables` must come from `build_gate_up_tables(fmt, cb, x)`. Panics on
/// lengths that do not match `shape` (validate payloads with
/// `check_expert_payload`); a scratch built for another shape is rebuilt.
#[allow(clippy::too_many_arguments)]
pub fn expert_forward(
    fmt: ExpertFormat,
    shape: ExpertShape,
    payload: &[u8],
    cb: Option<&LayerCodebooks>,
    tables: &GateUpTables,
    x: &[f32],
    out: &mut [f32],
    scratch: &mut ExpertScratch,
) {
    expert_forward_on(simd::isa(), fmt, shape, payload, cb, tables, x, out, scratch)
}

/// `expert_forward` with another gated activation in place of SiLU
/// (`down(act(gate x, up x))`; Kimi K3's SiTU). `Activation::Silu` runs the
/// very same loop as `expert_forward`.
#[allow(clippy::too_many_arguments)]
pub fn expert_forward_act(
    fmt: ExpertFormat,
    shape: ExpertShape,
    payload: &[u8],
    cb: Option<&LayerCodebooks>,
    tables: &GateUpTables,
    x: &[f32],
    out: &mut [f32],
    scratch: &mut ExpertScratch,
    act: Activation,
) {
    expert_forward_impl(simd::isa(), fmt, shape, payload, cb, tables, x, out, scratch, act)
}

/// `expert_forward` with the `rvq4p` / `rvq3` / `rvq2` kernel level chosen
/// by the caller (tests run every level side by side; the other formats use
/// the process-wide level). For `rvq3`/`rvq2` the gate/up kernel follows
/// the layout `tables` were built with (`build_gate_up_tables_on`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn expert_forward_on(
    isa: simd::Isa,
    fmt: ExpertFormat,
    shape: ExpertShape,
    payload: &[u8],
    cb: Option<&LayerCodebooks>,
    tables: &GateUpTables,
    x: &[f32],
    out: &mut [f32],
    scratch: &mut ExpertScratch,
) {
    expert_forward_impl(isa, fmt, shape, payload, cb, tables, x, out, scratch, Activation::Silu)
}

#[allow(clippy::too_many_arguments)]
fn expert_forward_impl(
    isa: simd::Isa,
    fmt: ExpertFormat,
    shape: ExpertShape,
    payload: &[u8],
    cb: Option<&LayerCodebooks>,
    tables: &GateUpTables,
    x: &[f32],
    out: &mut [f32],
    scratch: &mut ExpertScratch,
    act: Activation,
) {
    let (h, i) = (shape.hidden, shape.inter);
    assert!(x.len() == h && out.len() == h, "expert_forward: x/out length != hidden");
    assert!(tables.fmt == fmt && tables.hidden == h, "expert_forward: tables built for another format or width");
    if scratch.fmt != fmt || scratch.shape != shape {
        *scratch = ExpertScratch::new(fmt, shape);
    }
    let cb = codebooks_for(fmt, cb);
    let ([gb, ub, db], bias_bytes) = split_payload(fmt, shape, payload);
    let biases = (!bias_bytes.is_empty()).then(|| f32_from_le(bias_bytes));
    let ExpertScratch { gate, up, down_tables, down_q, .. } = scratch;
    if let ExpertFormat::Ggml(t) = fmt {
        let slabs = super::ggml::expert::Slabs::new(t, shape, [gb, ub, db]);
        slabs.gate_up(x, gate, up);
        add_gate_up_biases(biases.as_deref(), gate, up);
        gate_activation(act, gate, up);
        slabs.down(gate, out);
        add_down_biases(biases.as_deref(), i, out);
        return;
    }
    match (fmt.group_format(), cb) {
        (Some(t), _) => {
            let (g, u) = (MatRef::quant(t, gb, i, h), MatRef::quant(t, ub, i, h));
            // q4's int8 input, quantised once for both.
            let inputs = g.int8_inputs(x);
            g.matvec_with(x, inputs.as_ref(), gate);
            u.matvec_with(x, inputs.as_ref(), up);
        }
        (None, Some(_)) if fmt == ExpertFormat::Rvq4p => {
            rvq4p::matvec(isa, gb, i, h, &tables.q, gate);
            rvq4p::matvec(isa, ub, i, h, &tables.q, up);
        }
        (None, Some(cb)) => {
            let st = cb.gate_up.stages();
            // The gate/up tables' layout was chosen when they were built.
            RvqRef::new(gb, i, h, st).matvec_tables(&tables.data, tables.planes, gate);
            RvqRef::new(ub, i, h, st).matvec_tables(&tables.data, tables.planes, up);
        }
        (None, None) => {
            MatRef::f32(&f32_from_le(gb), i, h).matvec(x, gate);
            MatRef::f32(&f32_from_le(ub), i, h).matvec(x, up);
        }
    }
    add_gate_up_biases(biases.as_deref(), gate, up);
    gate_activation(act, gate, up);
    let act: &[f32] = gate;
    match (fmt.group_format(), cb) {
        (Some(t), _) => MatRef::quant(t, db, h, i).matvec(act, out),
        (None, Some(cb)) if fmt == ExpertFormat::Rvq4p => {
            fill_tables(act, &cb.down, down_tables);
            down_q.quantize_from(down_tables);
            rvq4p::matvec(isa, db, h, i, down_q, out);
        }
        (None, Some(cb)) => {
            fill_tables(act, &cb.down, down_tables);
            let planes = simd::rvq_planes(isa);
            if planes {
                simd::tables_to_planes(down_tables);
            }
            RvqRef::new(db, h, i, cb.down.stages()).matvec_tables(down_tables, planes, out);
        }
        (None, None) => MatRef::f32(&f32_from_le(db), h, i).matvec(act, out),
    }
    add_down_biases(biases.as_deref(), i, out);
}

/// `hidden_states @ gate_up_proj[e] + gate_up_proj_bias[e]`, before the
/// activation (gpt-oss; `biases` is `[gate, up, down]`).
pub(crate) fn add_gate_up_biases(biases: Option<&[f32]>, gate: &mut [f32], up: &mut [f32]) {
    if let Some(b) = biases {
        for (v, bias) in gate.iter_mut().chain(up.iter_mut()).zip(b.iter()) {
            *v += bias;
        }
    }
}

/// `... @ down_proj[e] + down_proj_bias[e]`.
pub(crate) fn add_down_biases(biases: Option<&[f32]>, inter: usize, out: &mut [f32]) {
    if let Some(b) = biases {
        for (o, bias) in out.iter_mut().zip(&b[2 * inter..]) {
            *o += bias;
        }
    }
}

/// `gate = act(gate, up)` elementwise: decode's and a chunk's one
/// definition of an expert's activation step.
pub(crate) fn gate_activation(act: Activation, gate: &mut [f32], up: &[f32]) {
    match act {
        Activation::Silu => {
            for (g, u) in gate.iter_mut().zip(up.iter()) {
                *g = silu(*g) * u;
            }
        }
        other => {
            for (g, u) in gate.iter_mut().zip(up.iter()) {
                *g = other.apply(*g, *u);
            }
        }
    }
}

#[inline]
fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}
