//! Routed experts read from their banks on demand: one positional read of
//! one fixed-size record per selected expert, computed from its stored
//! format without expanding it.
//!
//! This is the plain path: every use is a read. The bounded cache, direct
//! I/O and read-ahead threads come on top of it and must stay bit-identical.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::manifest::{record, Manifest, MANIFEST_FILE, RECORD_ALIGN};
use super::{expert_format, plain_file_name, read_file};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::model::source::ExpertProvider;
use crate::quant::{self, Codebooks, ExpertFormat, ExpertScratch, ExpertShape, LayerCodebooks};
use crate::stats::StepStats;

struct Bank {
    path: PathBuf,
    file: File,
    experts: usize,
    codebooks: Option<LayerCodebooks>,
}

pub struct ExpertBanks {
    format: ExpertFormat,
    shape: ExpertShape,
    record_bytes: usize,
    payload_offset: usize,
    payload_bytes: usize,
    /// Indexed by decoder layer; `None` for dense layers.
    banks: Vec<Option<Bank>>,
}

impl ExpertBanks {
    pub(super) fn open(dir: &Path, manifest: &Manifest, config: &ModelConfig) -> Result<ExpertBanks> {
        let mpath = dir.join(MANIFEST_FILE);
        let e = &manifest.experts;
        let format = expert_format(&e.format, &mpath)?;
        let bad = |msg: String| Error::format(&mpath, msg);
        if e.hidden != config.hidden_size as u64 || e.inter != config.moe_intermediate_size as u64 {
            return Err(bad(format!(
                "expert shape {}x{} disagrees with the config ({}x{})",
                e.hidden, e.inter, config.hidden_size, config.moe_intermediate_size
            )));
        }
        let shape = ExpertShape { hidden: e.hidden as usize, inter: e.inter as usize };
        let payload_bytes = quant::expert_payload_len(format, shape) as u64;
        if e.payload_bytes != payload_bytes
            || e.payload_offset < record::HEADER_BYTES
            || e.record_bytes % RECORD_ALIGN != 0
            || e.payload_offset + payload_bytes > e.record_bytes
            || e.record_bytes > 1 << 32
        {
            return Err(bad(format!(
                "expert record layout is inconsistent (record {} bytes, payload {} at {}, expected payload {payload_bytes})",
                e.record_bytes, e.payload_bytes, e.payload_offset
            )));
        }
        let mut banks: Vec<Option<Bank>> = (0..config.num_layers).map(|_| None).collect();
        for entry in &e.layers {
            let layer = entry.layer as usize;
            if layer >= config.num_layers || !config.is_moe_layer(layer) {
                return Err(bad(format!("expert bank for layer {layer}, which is not an MoE layer")));
            }
            if entry.experts != config.num_experts as u64 {
                return Err(bad(format!("layer {layer} bank holds {} experts, the config says {}", entry.experts, config.num_experts)));
            }
            let path = plain_file_name(dir, &entry.file, &mpath)?;
            let file = File::open(&path).map_err(|err| Error::io(&path, err))?;
            let len = file.metadata().map_err(|err| Error::io(&path, err))?.len();
            let expected = entry.experts * e.record_bytes;
            if len != expected {
                return Err(Error::format(&path, format!("bank is {len} bytes, {expected} expected: truncated or foreign file")));
            }
            let codebooks = match (&entry.codebooks, format.uses_codebooks()) {
                (Some(cb), true) => Some(load_codebooks(dir, cb, &mpath)?),
                (None, false) => None,
                _ => return Err(bad(format!("layer {layer}: codebooks present/absent contrary to format {}", e.format))),
            };
            // The kernels trust their inputs; everything they will be given
            // (payload length, codebook presence and stage count) is checked here.
            let blank = vec![0u8; payload_bytes as usize];
            quant::check_expert_payload(format, shape, &blank, codebooks.as_ref())
                .map_err(|err| bad(format!("layer {layer}: {err}")))?;
            banks[layer] = Some(Bank { path, file, experts: entry.experts as usize, codebooks });
        }
        for layer in 0..config.num_layers {
            if config.is_moe_layer(layer) && banks[layer].is_none() {
                return Err(bad(format!("no expert bank for MoE layer {layer}")));
            }
        }
        Ok(ExpertBanks {
            format,
            shape,
            record_bytes: e.record_bytes as usize,
            payload_offset: e.payload_offset as usize,
            payload_bytes: payload_bytes as usize,
            banks,
        })
    }

    pub fn format(&self) -> ExpertFormat {
        self.format
    }

    pub fn record_bytes(&self) -> usize {
        self.record_bytes
    }

    /// Reads and validates one record into `buf` (record_bytes long).
    fn read_record(&self, layer: usize, expert: usize, buf: &mut [u8]) -> Result<()> {
        let bank = self.banks[layer].as_ref().ok_or_else(|| Error::Runtime(format!("layer {layer} has no experts")))?;
        if expert >= bank.experts {
            return Err(Error::Runtime(format!("layer {layer}: expert {expert} out of range")));
        }
        let offset = (expert * self.record_bytes) as u64;
        bank.file.read_exact_at(buf, offset).map_err(|e| Error::io(&bank.path, e))?;
        let header = record::Header::parse(buf)
            .ok_or_else(|| Error::format(&bank.path, format!("record of expert {expert} has a bad magic number")))?;
        let expected = record::Header {
            layer: layer as u32,
            expert: expert as u32,
            format: self.format.code(),
            hidden: self.shape.hidden as u32,
            inter: self.shape.inter as u32,
            payload_offset: self.payload_offset as u64,
            payload_bytes: self.payload_bytes as u64,
        };
        if header != expected {
            return Err(Error::format(&bank.path, format!("record of expert {expert} has header {header:?}, expected {expected:?}")));
        }
        Ok(())
    }
}

fn load_codebooks(dir: &Path, cb: &super::manifest::CodebookEntry, mpath: &Path) -> Result<LayerCodebooks> {
    let path = plain_file_name(dir, &cb.file, mpath)?;
    let bytes = read_file(&path, 1 << 32)?;
    let slice = |offset: u64, len: u64| -> Result<&[u8]> {
        offset
            .checked_add(len)
            .filter(|&end| end <= bytes.len() as u64)
            .map(|end| &bytes[offset as usize..end as usize])
            .ok_or_else(|| Error::format(&path, "codebook range lies beyond the end of the file"))
    };
    let stages = cb.stages as usize;
    let gate_up = Codebooks::from_bytes(stages, slice(cb.gate_up_offset, cb.gate_up_bytes)?)
        .map_err(|e| Error::format(&path, e.to_string()))?;
    let down = Codebooks::from_bytes(stages, slice(cb.down_offset, cb.down_bytes)?)
        .map_err(|e| Error::format(&path, e.to_string()))?;
    Ok(LayerCodebooks { gate_up, down })
}

/// A heap buffer whose start is 4 KiB aligned, as direct I/O requires.
pub(crate) struct AlignedBuf {
    words: Vec<Page>,
    len: usize,
}

#[repr(C, align(4096))]
#[derive(Clone, Copy)]
struct Page([u8; 4096]);

impl AlignedBuf {
    pub fn new(len: usize) -> Self {
        AlignedBuf { words: vec![Page([0; 4096]); len.div_ceil(4096)], len }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `words` holds len.div_ceil(4096) pages of plain bytes, at
        // least `len` bytes, contiguous and initialised; Page has no padding.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), self.len) }
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: as in as_mut_slice.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }
}

impl ExpertProvider for ExpertBanks {
    fn forward_experts(
        &self,
        layer: usize,
        x: &[f32],
        picks: &[(usize, f32)],
        out: &mut [f32],
        stats: &mut StepStats,
    ) -> Result<()> {
        let bank = self.banks.get(layer).and_then(|b| b.as_ref())
            .ok_or_else(|| Error::Runtime(format!("layer {layer} has no experts")))?;
        let cb = bank.codebooks.as_ref();
        // Gate/up tables depend only on x and the layer's codebooks: built
        // once here and shared by every routed expert of this token.
        let tables = quant::build_gate_up_tables(self.format, cb, x);
        let mut scratch = ExpertScratch::new(self.format, self.shape);
        let mut records: Vec<AlignedBuf> = picks.iter().map(|_| AlignedBuf::new(self.record_bytes)).collect();
        // Every record of the layer is requested before the first is used.
        let io_started = Instant::now();
        for (&(expert, _), buf) in picks.iter().zip(records.iter_mut()) {
            self.read_record(layer, expert, buf.as_mut_slice())?;
        }
        stats.io_time += io_started.elapsed();
        stats.experts_missed += picks.len() as u32;
        stats.bytes_read += (picks.len() * self.record_bytes) as u64;

        out.fill(0.0);
        let mut y = vec![0.0f32; self.shape.hidden];
        for (&(_, weight), buf) in picks.iter().zip(&records) {
            let payload = &buf.as_slice()[self.payload_offset..self.payload_offset + self.payload_bytes];
            quant::expert_forward(self.format, self.shape, payload, cb, &tables, x, &mut y, &mut scratch);
            for (o, v) in out.iter_mut().zip(&y) {
                *o += weight * v;
            }
        }
        Ok(())
    }
}
