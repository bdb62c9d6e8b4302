//! Routed experts: payload layout, encode/decode, and the SwiGLU forward
//! that runs on the stored format (tables + gathers for RVQ).

use super::rvq::{self, Codebooks, LayerCodebooks};
use super::simd::{self, f16_at};
use super::trunk::{f32_from_le, par_rows, quantize_into, MatRef};
use super::{
    ExpertF32, ExpertFormat, ExpertShape, QuantError, TrunkFormat, CODEBOOK_ENTRIES, VDIM,
};
use rayon::prelude::*;

/// Vectors per rayon task when building tables.
const TABLE_VBLOCK: usize = 32;

/// Bytes of one `[rows, cols]` matrix of an expert in `fmt`.
fn mat_len(fmt: ExpertFormat, rows: usize, cols: usize) -> usize {
    match (fmt.group_format(), fmt.stages()) {
        (Some(t), _) => t.byte_len(rows, cols),
        (None, Some(st)) => rows
            .saturating_mul(2)
            .saturating_add(rows.saturating_mul(cols.div_ceil(VDIM)).saturating_mul(st)),
        (None, None) => TrunkFormat::F32.byte_len(rows, cols),
    }
}

/// Bytes of one expert's payload (gate, up, down; module docs).
pub fn expert_payload_len(fmt: ExpertFormat, shape: ExpertShape) -> usize {
    let gu = mat_len(fmt, shape.inter, shape.hidden);
    gu.saturating_mul(2).saturating_add(mat_len(fmt, shape.hidden, shape.inter))
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
    Ok(())
}

/// `(gate, up, down)` byte ranges of a payload.
fn split(fmt: ExpertFormat, shape: ExpertShape, payload: &[u8]) -> [&[u8]; 3] {
    assert_eq!(payload.len(), expert_payload_len(fmt, shape), "expert payload length");
    let gu = mat_len(fmt, shape.inter, shape.hidden);
    let (g, rest) = payload.split_at(gu);
    let (u, d) = rest.split_at(gu);
    [g, u, d]
}

fn codebooks_for(fmt: ExpertFormat, cb: Option<&LayerCodebooks>) -> Option<&LayerCodebooks> {
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
    /// `y = W x` where `table` was built from `x` with this layer's codebooks.
    fn matvec_tables(&self, table: &[f32], y: &mut [f32]) {
        par_rows(y, self.rows * self.cols, |r| {
            f16_at(self.scales, r) * simd::rvq_gather(table, self.row_codes(r))
        });
    }
}

/// Encode one expert. RVQ formats need the layer's codebooks; panics if
/// they are missing or the slices do not match `shape`.
pub fn encode_expert(
    fmt: ExpertFormat,
    shape: ExpertShape,
    e: &ExpertF32,
    cb: Option<&LayerCodebooks>,
) -> Vec<u8> {
    let (h, i) = (shape.hidden, shape.inter);
    assert!(
        e.gate.len() == i * h && e.up.len() == i * h && e.down.len() == h * i,
        "encode_expert: expert slices do not match the shape"
    );
    let cb = codebooks_for(fmt, cb);
    let mut out = vec![0u8; expert_payload_len(fmt, shape)];
    let gu = mat_len(fmt, i, h);
    let (g, rest) = out.split_at_mut(gu);
    let (u, d) = rest.split_at_mut(gu);
    for (buf, w, rows, cols, book) in [
        (g, e.gate, i, h, cb.map(|c| &c.gate_up)),
        (u, e.up, i, h, cb.map(|c| &c.gate_up)),
        (d, e.down, h, i, cb.map(|c| &c.down)),
    ] {
        match (fmt.group_format(), book) {
            (Some(t), _) => quantize_into(t, w, rows, cols, buf),
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
    scales
        .par_chunks_mut(2)
        .zip(codes.par_chunks_mut(n).zip(w.par_chunks(cols)))
        .for_each(|(s, (c, row))| {
            s.copy_from_slice(&rvq::encode_row(row, cb, c).to_le_bytes());
        });
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
    let [g, u, d] = split(fmt, shape, payload);
    let dec = |bytes: &[u8], rows: usize, cols: usize, book: Option<&Codebooks>| -> Vec<f32> {
        match (fmt.group_format(), book) {
            (Some(t), _) => MatRef::quant(t, bytes, rows, cols).dequantize(),
            (None, Some(book)) => {
                let m = RvqRef::new(bytes, rows, cols, book.stages());
                let mut out = vec![0f32; rows * cols];
                if cols > 0 {
                    for (r, o) in out.chunks_exact_mut(cols).enumerate() {
                        rvq::decode_row(f16_at(m.scales, r), m.row_codes(r), book, o);
                    }
                }
                out
            }
            (None, None) => f32_from_le(bytes).into_owned(),
        }
    };
    (
        dec(g, i, h, cb.map(|c| &c.gate_up)),
        dec(u, i, h, cb.map(|c| &c.gate_up)),
        dec(d, h, i, cb.map(|c| &c.down)),
    )
}

/// Per token per layer input of the routed experts: for RVQ the gate/up
/// lookup tables `T[v][s][c]`, otherwise a copy of the input.
#[derive(Debug, Clone)]
pub struct GateUpTables {
    fmt: ExpertFormat,
    hidden: usize,
    data: Vec<f32>,
}

/// Build once per token per layer; shared by every routed expert of the
/// layer. RVQ formats need the codebooks (panics without them).
pub fn build_gate_up_tables(
    fmt: ExpertFormat,
    cb: Option<&LayerCodebooks>,
    x: &[f32],
) -> GateUpTables {
    let data = match codebooks_for(fmt, cb) {
        Some(cb) => {
            let mut t = vec![0f32; table_len(x.len(), &cb.gate_up)];
            fill_tables(x, &cb.gate_up, &mut t);
            t
        }
        None => x.to_vec(),
    };
    GateUpTables { fmt, hidden: x.len(), data }
}

fn table_len(n: usize, cb: &Codebooks) -> usize {
    n.div_ceil(VDIM) * cb.stages() * CODEBOOK_ENTRIES
}

fn fill_tables(x: &[f32], cb: &Codebooks, out: &mut [f32]) {
    let st = cb.stages();
    let per_v = st * CODEBOOK_ENTRIES;
    if out.len() >= super::trunk::PAR_MIN_WORK * 4 {
        out.par_chunks_mut(per_v * TABLE_VBLOCK).enumerate().for_each(|(b, o)| {
            let v0 = b * TABLE_VBLOCK * VDIM;
            let x1 = (v0 + TABLE_VBLOCK * VDIM).min(x.len());
            simd::build_tables(&x[v0..x1], cb.cbt(), st, o);
        });
    } else {
        simd::build_tables(x, cb.cbt(), st, out);
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
}

impl ExpertScratch {
    pub fn new(fmt: ExpertFormat, shape: ExpertShape) -> Self {
        let dt = match fmt.stages() {
            Some(st) => shape.inter.div_ceil(VDIM) * st * CODEBOOK_ENTRIES,
            None => 0,
        };
        ExpertScratch {
            fmt,
            shape,
            gate: vec![0.0; shape.inter],
            up: vec![0.0; shape.inter],
            down_tables: vec![0.0; dt],
        }
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
    let (h, i) = (shape.hidden, shape.inter);
    assert!(x.len() == h && out.len() == h, "expert_forward: x/out length != hidden");
    assert!(
        tables.fmt == fmt && tables.hidden == h,
        "expert_forward: tables built for another format or width"
    );
    if scratch.fmt != fmt || scratch.shape != shape {
        *scratch = ExpertScratch::new(fmt, shape);
    }
    let cb = codebooks_for(fmt, cb);
    let [gb, ub, db] = split(fmt, shape, payload);
    let ExpertScratch { gate, up, down_tables, .. } = scratch;
    match (fmt.group_format(), cb) {
        (Some(t), _) => {
            MatRef::quant(t, gb, i, h).matvec(x, gate);
            MatRef::quant(t, ub, i, h).matvec(x, up);
        }
        (None, Some(cb)) => {
            let st = cb.gate_up.stages();
            RvqRef::new(gb, i, h, st).matvec_tables(&tables.data, gate);
            RvqRef::new(ub, i, h, st).matvec_tables(&tables.data, up);
        }
        (None, None) => {
            MatRef::f32(&f32_from_le(gb), i, h).matvec(x, gate);
            MatRef::f32(&f32_from_le(ub), i, h).matvec(x, up);
        }
    }
    for (g, u) in gate.iter_mut().zip(up.iter()) {
        *g = silu(*g) * u;
    }
    let act: &[f32] = gate;
    match (fmt.group_format(), cb) {
        (Some(t), _) => MatRef::quant(t, db, h, i).matvec(act, out),
        (None, Some(cb)) => {
            fill_tables(act, &cb.down, down_tables);
            RvqRef::new(db, h, i, cb.down.stages()).matvec_tables(down_tables, out);
        }
        (None, None) => MatRef::f32(&f32_from_le(db), h, i).matvec(act, out),
    }
}

#[inline]
fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}
