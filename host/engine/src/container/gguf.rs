//! A GGUF file opened in place (`waste run model.gguf`): no conversion, no
//! second copy on disk.
//!
//! The manifest that `waste convert model.gguf out.waste` would write (the
//! file kept as stored) is built in memory instead, so the planner, `waste
//! info` and state files see the same model as after that conversion, and
//! the logits are the same bits. The trunk is read from the file, each
//! matrix in the format `HfCheckpoint::stored_trunk_format` gives it (the
//! converter's own rule); the routed experts are streamed from the layer's
//! three expert tensors (`ExpertBanks::in_gguf`, `store::io::read_slabs`).
//!
//! What a GGUF file lacks against a container: checksums (records are not
//! checked as they land, and `--verify` is refused), a directory of its own
//! for the learned hotlist (kept beside the file, `usage_path`), and, for
//! gpt-oss, expert biases inside the records (held in RAM instead and
//! counted with the trunk, `resident_trunk_bytes`).

use std::path::{Path, PathBuf};

use super::experts::ExpertBanks;
use super::manifest::{ExpertBankEntry, ExpertIndex, GgmlTypeNames, Manifest, TensorEntry, TrunkIndex};
use super::manifest::{FORMAT_NAME, FORMAT_VERSION};
use super::{Container, Parts, Verify};
use crate::checkpoint::HfCheckpoint;
use crate::config::ModelConfig;
use crate::container::rows::TrunkRows;
use crate::error::{Error, Result};
use crate::quant::{self, ExpertFormat, QMatrix, TrunkFormat};
use crate::source::StoredRows;

/// The GGUF file behind a container opened in place.
pub(super) struct InPlace {
    ckpt: HfCheckpoint,
    /// What the expert banks hold in RAM (gpt-oss's expert biases).
    resident_bank_bytes: u64,
    /// The banks made at open, handed to the first `expert_banks` call
    /// (making them again would read every expert's biases again).
    banks: std::sync::Mutex<Option<ExpertBanks>>,
}

impl Container {
    pub(super) fn open_gguf(path: &Path) -> Result<Container> {
        let ckpt = HfCheckpoint::open_gguf(path)?;
        let small = crate::convert::small_files(&ckpt, ckpt.config())?;
        let tensors = ckpt
            .config()
            .trunk_tensor_names()
            .iter()
            .map(|name| stored_entry(&ckpt, name))
            .collect::<Result<Vec<_>>>()?;
        // The config a container of this file would read back from its
        // manifest, not the checkpoint's own (identical models, one path).
        let config_json = serde_json::to_string(&small.config).map_err(|e| Error::format(path, e.to_string()))?;
        let mut config = ModelConfig::from_json_str(&config_json, path)?;
        config.adapt_to_tensor_names(tensors.iter().map(|t| t.name.as_str()));
        let banks = ExpertBanks::in_gguf(&ckpt, &config, Verify::default())?;
        let resident_bank_bytes = banks.resident_bytes();
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
        let by_name = manifest.trunk.tensors.iter().map(|t| (t.name.clone(), t.clone())).collect();
        Container::assemble(Parts {
            dir: path.to_path_buf(),
            manifest,
            config,
            trunk_path: path.to_path_buf(),
            trunk,
            tensors: by_name,
            files: small.files,
            gguf: Some(InPlace { ckpt, resident_bank_bytes, banks: std::sync::Mutex::new(Some(banks)) }),
        })
    }

    /// Where the learned hotlist of this model is kept: `usage.json` in a
    /// container's directory, `FILE.gguf.usage.json` beside a GGUF file.
    pub fn usage_path(&self) -> PathBuf {
        match &self.gguf {
            Some(_) => {
                let mut name = self.dir.as_os_str().to_owned();
                name.push(".usage.json");
                PathBuf::from(name)
            }
            None => self.dir.join(crate::store::USAGE_FILE),
        }
    }

    /// Bytes of the trunk held in RAM, as the planner counts them: the
    /// resident trunk tensors, and for a GGUF file read in place what its
    /// expert banks hold (gpt-oss's expert biases, which a container's
    /// records carry).
    pub fn resident_trunk_bytes(&self) -> u64 {
        let banks = self.gguf.as_ref().map_or(0, |g| g.resident_bank_bytes);
        crate::plan::resident_trunk_bytes(&self.config, &self.manifest) + banks
    }

    /// Whether this is a GGUF file read in place.
    pub fn in_place(&self) -> bool {
        self.gguf.is_some()
    }

    /// The expert banks of a GGUF file read in place.
    pub(super) fn gguf_banks(&self) -> Option<Result<ExpertBanks>> {
        let g = self.gguf.as_ref()?;
        let made = g.banks.lock().unwrap_or_else(|p| p.into_inner()).take();
        Some(made.map_or_else(|| ExpertBanks::in_gguf(&g.ckpt, &self.config, self.verify), Ok))
    }
}

/// The manifest entry of trunk tensor `name` kept as stored; its offset is
/// unused (the bytes are read through the checkpoint) and it has no
/// checksum.
fn stored_entry(ckpt: &HfCheckpoint, name: &str) -> Result<TensorEntry> {
    let stored = ckpt
        .tensor_shape(name)
        .ok_or_else(|| Error::format(ckpt.dir(), format!("tensor `{name}` not found in the GGUF file")))?;
    let shape = ckpt.config().canonical_shape(name, stored);
    let format = match shape[..] {
        [_] => TrunkFormat::F32,
        [rows, cols] => ckpt.stored_trunk_format(name, rows, cols)?,
        _ => return Err(Error::format(ckpt.dir(), format!("tensor {name} has shape {shape:?}; expected 1-D or 2-D"))),
    };
    let (rows, cols) = match shape[..] {
        [n] => (1, n),
        [r, c] => (r, c),
        _ => unreachable!("refused above"),
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

impl InPlace {
    /// Trunk matrix `t` as a container that kept the file as stored holds
    /// it: the same bytes in its ggml type, or f32 values.
    pub(super) fn matrix(&self, t: &TensorEntry) -> Result<QMatrix> {
        let [rows, cols] = t.shape[..] else {
            return Err(Error::format(self.ckpt.dir(), format!("tensor {} is not a matrix", t.name)));
        };
        let (rows, cols) = (rows as usize, cols as usize);
        let matrix = match TrunkFormat::parse(&t.format) {
            Some(fmt @ TrunkFormat::Ggml(_)) => {
                QMatrix::from_byte_vec(fmt, rows, cols, self.ckpt.gguf_matrix_rows(&t.name, 0, rows)?)
            }
            _ => Ok(QMatrix::from_f32(self.ckpt.rows_f32(&t.name, 0, rows)?, rows, cols)),
        };
        matrix.map_err(|e| Error::format(self.ckpt.dir(), format!("tensor {}: {e}", t.name)))
    }

    pub(super) fn vector(&self, name: &str) -> Result<Vec<f32>> {
        Ok(self.ckpt.tensor_f32(name)?.0)
    }

    /// The rows of trunk matrix `t` read from the file as they are needed
    /// (an untied embedding table), where the file holds them in order.
    pub(super) fn stored_rows(&self, t: &TensorEntry) -> Option<Result<Box<dyn StoredRows>>> {
        let [rows, cols] = t.shape[..] else { return None };
        let format = TrunkFormat::parse(&t.format)?;
        let (part, offset, ty) = self.ckpt.gguf_matrix_span(&t.name)?;
        let same_bytes = match format {
            TrunkFormat::Ggml(kept) => kept == ty,
            TrunkFormat::F32 => ty == quant::GgmlType::F32,
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
