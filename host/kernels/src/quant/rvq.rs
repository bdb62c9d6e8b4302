//! Residual VQ: per-layer codebooks, their fit, and row encode/decode.

use super::kmeans::{kmeans, Book, Rng, Vec8, K64};
use super::{ExpertF32, ExpertFormat, ExpertShape, QuantError, CODEBOOK_ENTRIES, VDIM};
use half::f16;
use rayon::prelude::*;

/// Vectors sampled per codebook fit.
const FIT_SAMPLE: usize = 1 << 16;
/// Lloyd iterations per stage (stops earlier once assignments settle).
const FIT_ITERS: usize = 15;
/// Codebooks with more stages than this are rejected as malformed.
const MAX_STAGES: usize = 8;

/// `stages` successive codebooks of 8-dim vectors, all with 256 entries
/// (`rvq3`/`rvq2`) or all with 64 (`rvq4p`).
#[derive(Debug, Clone)]
pub struct Codebooks {
    books: Vec<Book>,
    /// `[s][d][c]` of all stages, the layout table building reads.
    cbt: Vec<f32>,
}

impl Codebooks {
    pub(crate) fn from_books(books: Vec<Book>) -> Codebooks {
        let cbt = books.iter().flat_map(|b| b.cbt.iter().copied()).collect();
        Codebooks { books, cbt }
    }

    pub fn stages(&self) -> usize {
        self.books.len()
    }

    /// Entries per stage (256 or 64).
    pub fn entries(&self) -> usize {
        self.books.first().map_or(CODEBOOK_ENTRIES, |b| b.len())
    }

    /// `stages x entries x 8` f32 little endian.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.books.iter().flat_map(|b| b.entries.iter().flat_map(|v| v.to_le_bytes())).collect()
    }

    /// The entry count (256 or 64) follows from the length; which one a
    /// format needs is checked against the payload's format later
    /// (`check_expert_payload`).
    pub fn from_bytes(stages: usize, bytes: &[u8]) -> Result<Codebooks, QuantError> {
        if stages == 0 || stages > MAX_STAGES {
            return Err(QuantError::Codebooks(format!("{stages} stages (1..={MAX_STAGES})")));
        }
        let per = if bytes.len() == stages * K64 * VDIM * 4 { K64 * VDIM * 4 } else { CODEBOOK_ENTRIES * VDIM * 4 };
        if bytes.len() != stages * per {
            return Err(QuantError::Length { what: "codebooks", expected: stages * per, got: bytes.len() });
        }
        let mut books = Vec::with_capacity(stages);
        for chunk in bytes.chunks_exact(per) {
            let e: Vec<f32> = chunk.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            if e.iter().any(|v| !v.is_finite()) {
                return Err(QuantError::Codebooks("non-finite entry".into()));
            }
            books.push(Book::new(e));
        }
        Ok(Codebooks::from_books(books))
    }

    /// Entry `c` of stage `s`, its `VDIM` values.
    pub(crate) fn entry(&self, s: usize, c: usize) -> &[f32] {
        self.books[s].entry(c)
    }

    /// Stage `s`'s entries, `[c][d]` (the AVX2 kernels of `rvq_dense`).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn stage_entries(&self, s: usize) -> &[f32] {
        &self.books[s].entries
    }

    pub(crate) fn cbt(&self) -> &[f32] {
        &self.cbt
    }
}

/// A layer's codebooks: `gate_up` serves gate and up of every expert of the
/// layer (they share the input, so their tables are built once per token),
/// `down` serves down.
#[derive(Debug, Clone)]
pub struct LayerCodebooks {
    pub gate_up: Codebooks,
    pub down: Codebooks,
}

/// Fit a layer's codebooks on its experts. `None` unless `fmt` uses
/// codebooks. Deterministic for a given seed, whatever the thread count.
/// Panics if an expert's slices do not match `shape`.
pub fn fit_layer_codebooks(
    fmt: ExpertFormat,
    shape: ExpertShape,
    experts: &[ExpertF32],
    seed: u64,
) -> Option<LayerCodebooks> {
    let stages = fmt.stages()?;
    let entries = fmt.entries();
    let (h, i) = (shape.hidden, shape.inter);
    for e in experts {
        assert!(
            e.gate.len() == i * h && e.up.len() == i * h && e.down.len() == h * i,
            "fit_layer_codebooks: expert slices do not match the shape"
        );
    }
    let gu: Vec<&[f32]> = experts.iter().flat_map(|e| [e.gate, e.up]).collect();
    let dn: Vec<&[f32]> = experts.iter().map(|e| e.down).collect();
    let mut rng = Rng::new(seed);
    let s1 = rng.next_u64();
    let s2 = rng.next_u64();
    Some(LayerCodebooks { gate_up: fit(&gu, i, h, stages, entries, s1), down: fit(&dn, h, i, stages, entries, s2) })
}

/// Fit `stages` codebooks of `entries` entries on sampled, row-normalised
/// vectors of `mats` (each `[rows, cols]`).
fn fit(mats: &[&[f32]], rows: usize, cols: usize, stages: usize, entries: usize, seed: u64) -> Codebooks {
    let nvec = cols.div_ceil(VDIM);
    let total = mats.len() * rows * nvec;
    let mut rng = Rng::new(seed);
    let mut idx: Vec<usize> =
        if total <= FIT_SAMPLE { (0..total).collect() } else { (0..FIT_SAMPLE).map(|_| rng.below(total)).collect() };
    // Sorted, vectors of one row are adjacent and its scale is computed once.
    idx.sort_unstable();
    idx.dedup();
    let row_of = |k: usize| k / nvec;
    let mut starts = vec![0usize];
    for j in 1..idx.len() {
        if row_of(idx[j]) != row_of(idx[j - 1]) {
            starts.push(j);
        }
    }
    starts.push(idx.len());
    let mut points: Vec<Vec8> = starts
        .par_windows(2)
        .flat_map_iter(|w| {
            let run = &idx[w[0]..w[1]];
            let grow = row_of(run[0]);
            let row = &mats[grow / rows][(grow % rows) * cols..(grow % rows + 1) * cols];
            let s = rms_scale(row);
            let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
            run.iter().filter(move |_| s > 0.0).map(move |&k| vector(row, k % nvec, inv)).collect::<Vec<_>>()
        })
        .collect();
    let mut books = Vec::with_capacity(stages);
    for _ in 0..stages {
        let book = kmeans(&points, entries, FIT_ITERS, rng.next_u64());
        points.par_iter_mut().for_each(|p| {
            let e = book.entry(book.nearest(p));
            for d in 0..VDIM {
                p[d] -= e[d];
            }
        });
        books.push(book);
    }
    Codebooks::from_books(books)
}

/// Vector `v` of `row`, times `inv`, zero-padded past the row's end.
fn vector(row: &[f32], v: usize, inv: f32) -> Vec8 {
    let mut out = [0f32; VDIM];
    for (d, o) in out.iter_mut().enumerate() {
        if let Some(&w) = row.get(v * VDIM + d) {
            *o = w * inv;
        }
    }
    out
}

/// Row RMS rounded to f16 (what normalises the row before coding).
fn rms_scale(row: &[f32]) -> f32 {
    let ss: f64 = row.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let rms = (ss / row.len().max(1) as f64).sqrt() as f32;
    if !rms.is_finite() {
        return 0.0;
    }
    f16::from_f32(rms.min(f16::MAX.to_f32())).to_f32()
}

/// Encode one row: returns the f16 scale bits and writes
/// `ceil(len/8) * stages` codes. Codes are picked greedily per stage on the
/// RMS-normalised row; the stored scale is then refit by least squares
/// against the decoded row, which only lowers the error.
pub(crate) fn encode_row(row: &[f32], cb: &Codebooks, codes: &mut [u8]) -> u16 {
    let stages = cb.stages();
    let s0 = rms_scale(row);
    if s0 == 0.0 {
        codes.fill(0);
        return 0;
    }
    let inv = 1.0 / s0;
    let mut wq = 0f64;
    let mut qq = 0f64;
    for (v, cv) in codes.chunks_exact_mut(stages).enumerate() {
        let mut r = vector(row, v, inv);
        let mut q = [0f32; VDIM];
        for (s, book) in cb.books.iter().enumerate() {
            let c = book.nearest(&r);
            cv[s] = c as u8;
            let e = book.entry(c);
            for d in 0..VDIM {
                r[d] -= e[d];
                q[d] += e[d];
            }
        }
        for (d, &qd) in q.iter().enumerate() {
            if let Some(&w) = row.get(v * VDIM + d) {
                wq += w as f64 * qd as f64;
                qq += qd as f64 * qd as f64;
            }
        }
    }
    let s = if qq > 0.0 { (wq / qq) as f32 } else { s0 };
    let s = if s.is_finite() && s != 0.0 { s } else { s0 };
    f16::from_f32(s.clamp(-f16::MAX.to_f32(), f16::MAX.to_f32())).to_bits()
}

/// Decode one row of `out.len()` values.
pub(crate) fn decode_row(scale: f32, codes: &[u8], cb: &Codebooks, out: &mut [f32]) {
    let stages = cb.stages();
    let cols = out.len();
    for (v, cv) in codes.chunks_exact(stages).enumerate() {
        let mut q = [0f32; VDIM];
        for (s, book) in cb.books.iter().enumerate() {
            let e = book.entry(cv[s] as usize);
            for d in 0..VDIM {
                q[d] += e[d];
            }
        }
        for (o, qd) in out[(v * VDIM).min(cols)..].iter_mut().zip(q) {
            *o = scale * qd;
        }
    }
}
