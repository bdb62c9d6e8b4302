//! The expert banks of a container, validated: record layout, one bank
//! file per MoE layer, per-layer codebooks. Reading records (direct I/O,
//! cache, reader threads) is the expert store's job.

use std::path::{Path, PathBuf};

use super::manifest::{record, Manifest, MANIFEST_FILE, RECORD_ALIGN};
use super::{checksum, expert_format, plain_file_name, Verify};
use crate::config::{Activation, ModelConfig};
use crate::error::{Error, Result};
use crate::files::read_file;
use crate::quant::{self, Codebooks, ExpertFormat, ExpertShape, LayerCodebooks};

/// One slab (gate, up or down) of every expert of a layer in a model file
/// read in place: the layer's 3-D expert tensor, expert after expert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlabRun {
    /// Which file of a split model holds it.
    pub part: usize,
    /// Byte offset of expert 0's slab in that file.
    pub start: u64,
    /// Bytes of one expert's slab.
    pub bytes: u64,
}

/// One MoE layer of a model file read in place (`ExpertBanks::in_files`).
pub struct FileLayer {
    pub layer: usize,
    pub format: ExpertFormat,
    /// Gate, up and down.
    pub slabs: [SlabRun; 3],
    /// Every expert's bias bytes, in expert order, as a payload ends with
    /// them (gpt-oss); held in RAM.
    pub biases: Option<Vec<u8>>,
}

/// One MoE layer's bank: `experts` records of `record_bytes` each.
pub struct Bank {
    pub path: PathBuf,
    pub experts: usize,
    pub codebooks: Option<LayerCodebooks>,
    /// The layer's expert format: the container's, or for a `gguf`
    /// container this layer's ggml types.
    pub format: ExpertFormat,
    /// Bytes of each record's payload in this layer.
    pub payload_bytes: usize,
    /// A GGUF file read in place: where each expert's gate, up and down
    /// slabs lie (in `ExpertBanks::parts`); `path` is then the file that
    /// holds the gate slabs, for messages. `None`: records of `path`.
    pub slabs: Option<[SlabRun; 3]>,
    /// A GGUF file read in place whose experts have biases (gpt-oss: tensors
    /// of their own, not part of the slabs): every expert's bias bytes, in
    /// expert order, as a record's payload ends with them. Held in RAM.
    pub biases: Option<Vec<u8>>,
}

pub struct ExpertBanks {
    shape: ExpertShape,
    record_bytes: usize,
    payload_offset: usize,
    /// Indexed by decoder layer; `None` for dense layers.
    banks: Vec<Option<Bank>>,
    /// The experts' gated activation (SiTU on Kimi K3).
    activation: Activation,
    /// Which record checksums to check as records land.
    verify: Verify,
    /// A GGUF file read in place: its files, in part order (the banks'
    /// `slabs` index them). Empty for a container.
    parts: Vec<PathBuf>,
}

impl ExpertBanks {
    pub(super) fn open(dir: &Path, manifest: &Manifest, config: &ModelConfig, verify: Verify) -> Result<ExpertBanks> {
        let mpath = dir.join(MANIFEST_FILE);
        let e = &manifest.experts;
        // `gguf`: each layer names its ggml types; otherwise one format.
        let format = match e.format.as_str() {
            ExpertFormat::GGUF_NAME => None,
            name => Some(expert_format(name, &mpath)?),
        };
        let bad = |msg: String| Error::format(&mpath, msg);
        let shape = config.expert_shape();
        if e.hidden != shape.hidden as u64 || e.inter != shape.inter as u64 || e.biases != shape.biases {
            return Err(bad(format!(
                "expert shape {}x{}{} disagrees with the config ({}x{}{})",
                e.hidden,
                e.inter,
                if e.biases { " with biases" } else { "" },
                shape.hidden,
                shape.inter,
                if shape.biases { " with biases" } else { "" },
            )));
        }
        let layout_error = |payload: u64| {
            bad(format!(
                "expert record layout is inconsistent (record {} bytes, payload {} at {}, expected payload {payload})",
                e.record_bytes, e.payload_bytes, e.payload_offset
            ))
        };
        // The longest payload of any layer: the index's own, and what
        // every record must hold.
        let mut longest = format.map_or(0, |f| quant::expert_payload_len(f, shape) as u64);
        if e.payload_offset < record::HEADER_BYTES
            || !e.record_bytes.is_multiple_of(RECORD_ALIGN)
            || e.record_bytes > 1 << 32
            || e.payload_offset.saturating_add(e.payload_bytes) > e.record_bytes
        {
            return Err(layout_error(e.payload_bytes));
        }
        let mut banks: Vec<Option<Bank>> = (0..config.num_layers).map(|_| None).collect();
        for entry in &e.layers {
            let layer = entry.layer as usize;
            if layer >= config.num_layers || !config.is_moe_layer(layer) {
                return Err(bad(format!("expert bank for layer {layer}, which is not an MoE layer")));
            }
            if entry.experts != config.num_experts as u64 {
                return Err(bad(format!(
                    "layer {layer} bank holds {} experts, the config says {}",
                    entry.experts, config.num_experts
                )));
            }
            if banks[layer].is_some() {
                return Err(bad(format!("two expert banks for layer {layer}")));
            }
            let path = plain_file_name(dir, &entry.file, &mpath)?;
            if banks.iter().flatten().any(|b| b.path == path) {
                return Err(bad(format!("layer {layer}'s bank file {} is another layer's too", entry.file)));
            }
            let len = crate::files::regular_file(&path)?.len();
            let expected = entry.experts * e.record_bytes;
            if len != expected {
                return Err(Error::format(
                    &path,
                    format!("bank is {len} bytes, {expected} expected: truncated or foreign file"),
                ));
            }
            let layer_format = match (format, &entry.ggml) {
                (Some(f), None) => f,
                (None, Some(names)) => ExpertFormat::Ggml(names.parse().ok_or_else(|| {
                    bad(format!("layer {layer}: ggml types {names:?} are not ones WASTE computes on"))
                })?),
                _ => {
                    return Err(bad(format!(
                        "layer {layer}: ggml types present/absent contrary to format {}",
                        e.format
                    )))
                }
            };
            let payload_bytes = quant::expert_payload_len(layer_format, shape) as u64;
            if e.payload_offset.saturating_add(payload_bytes) > e.record_bytes {
                return Err(layout_error(payload_bytes));
            }
            longest = longest.max(payload_bytes);
            let codebooks = match (&entry.codebooks, layer_format.uses_codebooks()) {
                (Some(cb), true) => Some(load_codebooks(dir, entry.layer, cb, &mpath)?),
                (None, false) => None,
                _ => {
                    return Err(bad(format!("layer {layer}: codebooks present/absent contrary to format {}", e.format)))
                }
            };
            // The kernels trust their inputs; everything they will be given
            // (payload length, codebook presence and stage count) is checked here.
            let blank = vec![0u8; payload_bytes as usize];
            quant::check_expert_payload(layer_format, shape, &blank, codebooks.as_ref())
                .map_err(|err| bad(format!("layer {layer}: {err}")))?;
            banks[layer] = Some(Bank {
                path,
                experts: entry.experts as usize,
                codebooks,
                format: layer_format,
                payload_bytes: payload_bytes as usize,
                slabs: None,
                biases: None,
            });
        }
        if e.payload_bytes != longest {
            return Err(layout_error(longest));
        }
        for (layer, bank) in banks.iter().enumerate() {
            if config.is_moe_layer(layer) && bank.is_none() {
                return Err(bad(format!("no expert bank for MoE layer {layer}")));
            }
        }
        Ok(ExpertBanks {
            shape,
            record_bytes: e.record_bytes as usize,
            payload_offset: e.payload_offset as usize,
            banks,
            activation: config.activation(),
            verify,
            parts: Vec::new(),
        })
    }

    /// The banks of a model file read in place (a GGUF file: the in_place
    /// module gathers `layers` from it): each MoE layer's experts are the
    /// slabs of its three expert tensors in `parts`. A slot holds each
    /// slab's enclosing 4 KiB-aligned span (direct reads need whole aligned
    /// blocks; GGUF aligns tensors to 32 bytes), so a record is the three
    /// spans' worst case; the store moves the slabs together into the
    /// payload a container's record holds (`store::io::read_slabs`).
    pub fn in_files(
        config: &ModelConfig,
        parts: &[PathBuf],
        part_lens: &[u64],
        layers: Vec<FileLayer>,
        verify: Verify,
    ) -> Result<ExpertBanks> {
        let shape = config.expert_shape();
        let mut banks: Vec<Option<Bank>> = (0..config.num_layers).map(|_| None).collect();
        let (mut record, mut longest) = (0u64, 0usize);
        for FileLayer { layer, format, slabs, biases } in layers {
            if layer >= config.num_layers || !config.is_moe_layer(layer) || banks[layer].is_some() {
                return Err(Error::Runtime(format!("layer {layer}: not an MoE layer, or given twice")));
            }
            for run in &slabs {
                let end = run.bytes.checked_mul(config.num_experts as u64).and_then(|b| b.checked_add(run.start));
                if part_lens.get(run.part).is_none_or(|&len| end.is_none_or(|end| end > len)) {
                    return Err(Error::format(
                        parts.get(run.part).map_or(Path::new("?"), PathBuf::as_path),
                        format!("layer {layer}'s expert slabs lie beyond the end of the file: truncated?"),
                    ));
                }
            }
            let payload_bytes = quant::expert_payload_len(format, shape);
            let blank = vec![0u8; payload_bytes];
            quant::check_expert_payload(format, shape, &blank, None)
                .map_err(|err| Error::format(&parts[slabs[0].part], format!("layer {layer}: {err}")))?;
            let bias_bytes = payload_bytes - slabs.iter().map(|r| r.bytes as usize).sum::<usize>();
            if biases.as_ref().map_or(0, Vec::len) != bias_bytes * config.num_experts {
                return Err(Error::Runtime(format!("layer {layer}: expert biases do not fit the payload")));
            }
            record = record.max(slabs.iter().map(|r| slab_span_bound(r.bytes)).sum());
            longest = longest.max(payload_bytes);
            banks[layer] = Some(Bank {
                path: parts[slabs[0].part].clone(),
                experts: config.num_experts,
                codebooks: None,
                format,
                payload_bytes,
                slabs: Some(slabs),
                biases,
            });
        }
        if let Some(missing) = (0..config.num_layers).find(|&l| config.is_moe_layer(l) && banks[l].is_none()) {
            return Err(Error::Runtime(format!("no expert slabs for MoE layer {missing}")));
        }
        Ok(ExpertBanks {
            shape,
            record_bytes: record.max(longest as u64) as usize,
            payload_offset: 0,
            banks,
            activation: config.activation(),
            verify,
            parts: parts.to_vec(),
        })
    }

    /// Bytes the banks hold in RAM: a GGUF file's expert biases read in
    /// place (none for a container, whose records carry them).
    pub fn resident_bytes(&self) -> u64 {
        self.banks.iter().flatten().filter_map(|b| b.biases.as_ref()).map(|b| b.len() as u64).sum()
    }

    /// A GGUF file read in place: its files, in part order. Empty for a
    /// container.
    pub fn parts(&self) -> &[PathBuf] {
        &self.parts
    }

    pub fn activation(&self) -> Activation {
        self.activation
    }

    /// The expert format of MoE layer `layer` (the container's, or for a
    /// `gguf` container that layer's ggml types). Panics for a dense layer.
    pub fn format(&self, layer: usize) -> ExpertFormat {
        self.layer_bank(layer).format
    }

    fn layer_bank(&self, layer: usize) -> &Bank {
        self.bank(layer).unwrap_or_else(|| panic!("layer {layer} has no expert bank"))
    }

    pub fn record_bytes(&self) -> usize {
        self.record_bytes
    }

    pub fn shape(&self) -> ExpertShape {
        self.shape
    }

    /// Where the payload of a record of MoE layer `layer` lies inside it.
    pub fn payload_range(&self, layer: usize) -> std::ops::Range<usize> {
        self.payload_offset..self.payload_offset + self.layer_bank(layer).payload_bytes
    }

    /// The bank of decoder layer `layer`; `None` for a dense layer.
    pub fn bank(&self, layer: usize) -> Option<&Bank> {
        self.banks.get(layer).and_then(|b| b.as_ref())
    }

    /// Decoder layers that have a bank, ascending.
    pub fn moe_layers(&self) -> Vec<usize> {
        (0..self.banks.len()).filter(|&l| self.banks[l].is_some()).collect()
    }

    /// Checks a record just read for (`layer`, `expert`): its header always,
    /// its payload's checksum with `--verify`.
    pub fn check_record(&self, layer: usize, expert: usize, buf: &[u8]) -> Result<()> {
        let bank = self.bank(layer).ok_or_else(|| Error::Runtime(format!("layer {layer} has no expert bank")))?;
        if bank.slabs.is_some() {
            // A GGUF file has no record headers and no checksums
            // (`Container::set_verify` refuses `--verify` on one).
            return Ok(());
        }
        let path = bank.path.as_path();
        let what = || format!("layer {layer} expert {expert}");
        let header = record::Header::parse(buf).ok_or_else(|| {
            Error::format(path, format!("{}: the record header is not one (bad magic or flags)", what()))
        })?;
        let expected = record::Header {
            layer: layer as u32,
            expert: expert as u32,
            format: bank.format.code(),
            hidden: self.shape.hidden as u32,
            inter: self.shape.inter as u32,
            payload_offset: self.payload_offset as u64,
            payload_bytes: bank.payload_bytes as u64,
            payload_crc32: header.payload_crc32,
        };
        if header != expected {
            return Err(Error::format(
                path,
                format!("{}: record has header {header:?}, expected {expected:?}", what()),
            ));
        }
        match (self.verify, header.payload_crc32) {
            (Verify::Off, _) | (Verify::Records, None) => {}
            (Verify::All, None) => return Err(checksum::missing(path, &what())),
            (_, Some(crc)) => checksum::check(path, &what(), crc, &buf[self.payload_range(layer)])?,
        }
        Ok(())
    }
}

/// The most bytes the 4 KiB-aligned span enclosing `bytes` bytes at any
/// offset covers.
pub fn slab_span_bound(bytes: u64) -> u64 {
    bytes.div_ceil(RECORD_ALIGN) * RECORD_ALIGN + RECORD_ALIGN
}

fn load_codebooks(dir: &Path, layer: u64, cb: &super::manifest::CodebookEntry, mpath: &Path) -> Result<LayerCodebooks> {
    let path = plain_file_name(dir, &cb.file, mpath)?;
    let bytes = read_file(&path, 1 << 32)?;
    let slice = |offset: u64, len: u64| -> Result<&[u8]> {
        offset
            .checked_add(len)
            .filter(|&end| end <= bytes.len() as u64)
            .map(|end| &bytes[offset as usize..end as usize])
            .ok_or_else(|| Error::format(&path, "codebook range lies beyond the end of the file"))
    };
    // Gate/up and down have codebooks of their own; one range for both is
    // a damaged manifest, not a layout.
    let (a, b) = ((cb.gate_up_offset, cb.gate_up_bytes), (cb.down_offset, cb.down_bytes));
    if a.0 < b.0.saturating_add(b.1) && b.0 < a.0.saturating_add(a.1) {
        return Err(Error::format(
            mpath,
            format!(
                "codebooks of {}: the gate/up range {}+{} and the down range {}+{} overlap",
                cb.file, a.0, a.1, b.0, b.1
            ),
        ));
    }
    let stages = cb.stages as usize;
    let (gate_up, down) = (slice(cb.gate_up_offset, cb.gate_up_bytes)?, slice(cb.down_offset, cb.down_bytes)?);
    // Read whole anyway: checked whenever a checksum was written
    // (`set_verify` refused their absence under `Verify::All`).
    for (bytes, crc, part) in [(gate_up, cb.gate_up_crc32, "gate/up"), (down, cb.down_crc32, "down")] {
        if let Some(crc) = crc {
            checksum::check(&path, &format!("layer {layer}'s {part} codebooks"), crc, bytes)?;
        }
    }
    let gate_up = Codebooks::from_bytes(stages, gate_up).map_err(|e| Error::format(&path, e.to_string()))?;
    let down = Codebooks::from_bytes(stages, down).map_err(|e| Error::format(&path, e.to_string()))?;
    Ok(LayerCodebooks { gate_up, down })
}
