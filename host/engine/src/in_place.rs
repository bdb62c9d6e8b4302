//! A GGUF file opened in place (`waste run model.gguf`): no conversion, no
//! second copy on disk.
//!
//! The manifest that `waste convert model.gguf out.waste` would write (the
//! file kept as stored) is built in memory instead, so the planner, `waste
//! info` and state files see the same model as after that conversion, and
//! the logits are the same bits. The trunk is read from the file, each
//! matrix in the format `HfCheckpoint::stored_trunk_format` gives it (the
//! converter's own rule); the routed experts are streamed from the layer's
//! three expert tensors (`ExpertBanks::in_files`, `store::io::read_slabs`).
//!
//! What a GGUF file lacks against a container: checksums (records are not
//! checked as they land, and `--verify` is refused), a directory of its own
//! for the learned hotlist (kept beside the file, `model::usage_path`), and,
//! for gpt-oss, expert biases inside the records (held in RAM instead and
//! counted with the trunk, `plan::resident_bytes`).

use std::collections::HashMap;
use std::path::Path;

use crate::checkpoint::HfCheckpoint;
use crate::config::ModelConfig;
use crate::container::manifest::{ExpertBankEntry, ExpertIndex, GgmlTypeNames, Manifest, TensorEntry, TrunkIndex};
use crate::container::manifest::{FORMAT_NAME, FORMAT_VERSION};
use crate::container::{Container, ExpertBanks, FileLayer, InPlace, Parts, TrunkRows, Verify};
use crate::error::{Error, Result};
use crate::quant::{ExpertFormat, GgmlType, QMatrix, TrunkFormat};
use crate::source::{StoredRows, TensorSource};

/// Opens the GGUF file at `path` (a split one from its first part) as the
/// container its conversion as stored would be.
pub fn open(path: &Path) -> Result<Container> {
    let ckpt = HfCheckpoint::open_gguf(path)?;
    let small = crate::convert::small_files(&ckpt, ckpt.config())?;
    let tensors =
        ckpt.config().trunk_tensor_names().iter().map(|name| stored_entry(&ckpt, name)).collect::<Result<Vec<_>>>()?;
    // The config a container of this file would read back from its
    // manifest, not the checkpoint's own (identical models, one path).
    let config_json = serde_json::to_string(&small.config).map_err(|e| Error::format(path, e.to_string()))?;
    let mut config = ModelConfig::from_json_str(&config_json, path)?;
    config.adapt_to_tensor_names(tensors.iter().map(|t| t.name.as_str()));
    let banks = banks(&ckpt, &config)?;
    let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let layers = (0..config.num_layers)
        .filter_map(|l| banks.bank(l).map(|b| (l, b)))
        .map(|(layer, bank)| ExpertBankEntry {
            layer: layer as u64,
            file: file_name.clone(),
            experts: bank.experts as u64,
            codebooks: None,
            ggml: match bank.format {
                ExpertFormat::Ggml(t) => Some(GgmlTypeNames::of(t)),
                _ => None,
            },
        })
        .collect();
    let shape = banks.shape();
    let payload_bytes = banks.moe_layers().iter().map(|&l| banks.payload_range(l).len()).max().unwrap_or(0);
    let manifest = Manifest {
        format: FORMAT_NAME.to_string(),
        format_version: FORMAT_VERSION,
        writer: format!("waste {} (GGUF file read in place)", env!("CARGO_PKG_VERSION")),
        config: small.config,
        generation_config: small.generation_config,
        trunk: TrunkIndex { file: file_name, format: ExpertFormat::GGUF_NAME.to_string(), tensors },
        experts: ExpertIndex {
            format: ExpertFormat::GGUF_NAME.to_string(),
            hidden: shape.hidden as u64,
            inter: shape.inter as u64,
            biases: shape.biases,
            record_bytes: banks.record_bytes() as u64,
            payload_offset: 0,
            payload_bytes: payload_bytes as u64,
            layers,
        },
        tokenizer_files: small.files.iter().map(|(n, _)| n.clone()).collect(),
        skipped: crate::convert::skipped_parts(&ckpt, &config),
    };
    let trunk = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let entries: HashMap<String, TensorEntry> =
        manifest.trunk.tensors.iter().map(|t| (t.name.clone(), t.clone())).collect();
    let resident_bank_bytes = banks.resident_bytes();
    let source = StoredTrunk { ckpt, entries: entries.clone() };
    Container::assemble(Parts {
        dir: path.to_path_buf(),
        manifest,
        config,
        trunk_path: path.to_path_buf(),
        trunk,
        tensors: entries,
        files: small.files,
        in_place: Some(InPlace {
            trunk: Box::new(source),
            banks: std::sync::Mutex::new(Some(banks)),
            resident_bank_bytes,
        }),
    })
}

/// Each MoE layer's experts as the runs of slabs of its three expert
/// tensors, with gpt-oss's biases (tensors of their own, read here: the
/// converter's own `expert_biases_f32`, as `convert/bank.rs` appends them).
fn banks(ckpt: &HfCheckpoint, config: &ModelConfig) -> Result<ExpertBanks> {
    let g = ckpt.gguf_file().ok_or_else(|| Error::Runtime("not a GGUF checkpoint".into()))?;
    let mut layers = Vec::new();
    for layer in (0..config.num_layers).filter(|&l| config.is_moe_layer(l)) {
        let biases = match config.expert_shape().biases {
            true => {
                let mut all = Vec::new();
                for expert in 0..config.num_experts {
                    let b = ckpt.expert_biases_f32(layer, expert)?.ok_or_else(|| {
                        Error::format(g.path(), format!("layer {layer} expert {expert}: its biases are missing"))
                    })?;
                    all.extend(b.iter().flatten().flat_map(|v| v.to_le_bytes()));
                }
                Some(all)
            }
            false => None,
        };
        let format = ExpertFormat::Ggml(ckpt.gguf_expert_types(layer)?);
        layers.push(FileLayer { layer, format, slabs: ckpt.gguf_expert_extents(layer)?, biases });
    }
    ExpertBanks::in_files(config, g.parts(), &g.part_lens, layers, Verify::default())
}

/// The manifest entry of trunk tensor `name` kept as stored; its offset is
/// unused (the bytes are read through the checkpoint) and it has no
/// checksum.
fn stored_entry(ckpt: &HfCheckpoint, name: &str) -> Result<TensorEntry> {
    let stored = ckpt
        .tensor_shape(name)
        .ok_or_else(|| Error::format(ckpt.dir(), format!("tensor `{name}` not found in the GGUF file")))?;
    let shape = ckpt.config().canonical_shape(name, stored);
    let (format, rows, cols) = match shape[..] {
        [n] => (TrunkFormat::F32, 1, n),
        [rows, cols] => (ckpt.stored_trunk_format(name, rows, cols)?, rows, cols),
        _ => return Err(Error::format(ckpt.dir(), format!("tensor {name} has shape {shape:?}; expected 1-D or 2-D"))),
    };
    Ok(TensorEntry {
        name: name.to_string(),
        shape: shape.iter().map(|&d| d as u64).collect(),
        format: format.name().to_string(),
        offset: 0,
        bytes: format.byte_len(rows, cols) as u64,
        crc32: None,
    })
}

/// The trunk of a GGUF file as a container that kept it as stored holds it.
struct StoredTrunk {
    ckpt: HfCheckpoint,
    entries: HashMap<String, TensorEntry>,
}

impl StoredTrunk {
    fn entry(&self, name: &str) -> Result<&TensorEntry> {
        self.entries
            .get(name)
            .ok_or_else(|| Error::format(self.ckpt.dir(), format!("tensor {name} is missing from the trunk")))
    }
}

impl TensorSource for StoredTrunk {
    /// The same bytes in the tensor's ggml type, or f32 values.
    fn matrix(&self, name: &str) -> Result<QMatrix> {
        let t = self.entry(name)?;
        let [rows, cols] = t.shape[..] else {
            return Err(Error::format(self.ckpt.dir(), format!("tensor {name} is not a matrix")));
        };
        let (rows, cols) = (rows as usize, cols as usize);
        let matrix = match TrunkFormat::parse(&t.format) {
            Some(fmt @ TrunkFormat::Ggml(_)) => {
                QMatrix::from_byte_vec(fmt, rows, cols, self.ckpt.gguf_matrix_rows(name, 0, rows)?)
            }
            _ => Ok(QMatrix::from_f32(self.ckpt.rows_f32(name, 0, rows)?, rows, cols)),
        };
        matrix.map_err(|e| Error::format(self.ckpt.dir(), format!("tensor {name}: {e}")))
    }

    fn vector(&self, name: &str) -> Result<Vec<f32>> {
        Ok(self.ckpt.tensor_f32(name)?.0)
    }

    fn has(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// Rows read from the file as they are needed (an untied embedding
    /// table), where the file holds them in order in the kept format.
    fn stored_rows(&self, name: &str) -> Option<Result<Box<dyn StoredRows>>> {
        let t = self.entries.get(name)?;
        let [rows, cols] = t.shape[..] else { return None };
        let format = TrunkFormat::parse(&t.format)?;
        let (part, offset, ty) = self.ckpt.gguf_matrix_span(name)?;
        let same_bytes = match format {
            TrunkFormat::Ggml(kept) => kept == ty,
            TrunkFormat::F32 => ty == GgmlType::F32,
            _ => false,
        };
        if !same_bytes {
            return None;
        }
        let path = self.ckpt.gguf_file()?.parts()[part].clone();
        let rows = std::fs::File::open(&path)
            .map_err(|e| Error::io(&path, e))
            .and_then(|file| TrunkRows::new(file, &path, offset, format, rows as usize, cols as usize));
        Some(rows.map(|r| Box::new(r) as Box<dyn StoredRows>))
    }
}
