//! `waste convert`: a Hugging Face checkpoint directory -> a container.
//!
//! The trunk is quantised tensor by tensor into trunk.bin; each MoE layer's
//! experts are encoded one by one into fixed-size records of their bank, so
//! peak memory is one layer's codebook sample plus one expert, whatever the
//! model size. Everything is written into a temporary directory that is
//! renamed into place last: a failed conversion leaves nothing half-made.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::checkpoint::HfCheckpoint;
use crate::config::{ModelConfig, TensorRole};
use crate::container::manifest::{
    align_up, record, CodebookEntry, ExpertBankEntry, ExpertIndex, Manifest, TensorEntry, TrunkIndex, CODEBOOK_FILE,
    FORMAT_NAME, FORMAT_VERSION, MANIFEST_FILE, RECORD_ALIGN, TENSOR_ALIGN, TRUNK_FILE,
};
use crate::error::{Error, Result};
use crate::quant::{self, ExpertF32, ExpertFormat, ExpertShape, TrunkFormat};

/// Files copied verbatim so a container is self-contained.
const TOKENIZER_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "tokenizer.model",
    "tiktoken.model",
];

/// At most this many experts of a layer feed its codebook fit.
const CODEBOOK_SAMPLE_EXPERTS: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConvertOptions {
    pub experts: ExpertFormat,
    pub trunk: TrunkFormat,
    /// Seed of the codebook fit.
    pub seed: u64,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions { experts: ExpertFormat::Rvq3, trunk: TrunkFormat::Q4, seed: 0x5EED }
    }
}

/// Reported to the caller's progress callback.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvertProgress {
    /// Units of work done and in all: one per trunk tensor and one per expert.
    pub done: u64,
    pub total: u64,
    pub what: String,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConvertReport {
    pub trunk_bytes: u64,
    pub expert_bytes: u64,
    pub expert_record_bytes: u64,
    pub moe_layers: usize,
    /// Checkpoint tensors the engine does not use (e.g. stale rotary buffers).
    pub ignored_tensors: Vec<String>,
}

pub fn convert(
    src: &Path,
    out: &Path,
    opts: &ConvertOptions,
    progress: &mut dyn FnMut(&ConvertProgress),
) -> Result<ConvertReport> {
    let ckpt = HfCheckpoint::open(src)?;
    let cfg = ckpt.config().clone();
    check_destination(out)?;
    let tmp = temp_dir_for(out)?;
    let result = write_container(&ckpt, &cfg, &tmp, opts, progress);
    match result {
        Ok(report) => {
            if out.exists() {
                fs::remove_dir_all(out).map_err(|e| Error::io(out, e))?;
            }
            fs::rename(&tmp, out).map_err(|e| Error::io(out, e))?;
            Ok(report)
        }
        Err(e) => {
            let _ = fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

/// A previous container may be replaced; anything else is not ours to delete.
fn check_destination(out: &Path) -> Result<()> {
    if !out.exists() {
        return Ok(());
    }
    if out.is_dir() {
        let empty = fs::read_dir(out).map_err(|e| Error::io(out, e))?.next().is_none();
        if empty || out.join(MANIFEST_FILE).is_file() {
            return Ok(());
        }
    }
    Err(Error::Arg(format!("{} exists and is not a waste container; refusing to overwrite it", out.display())))
}

fn temp_dir_for(out: &Path) -> Result<PathBuf> {
    let name = out.file_name().ok_or_else(|| Error::Arg(format!("{} has no file name", out.display())))?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !parent.is_dir() {
        return Err(Error::Arg(format!("the directory {} does not exist", parent.display())));
    }
    let tmp = parent.join(format!(".{}.partial-{}", name.to_string_lossy(), std::process::id()));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    }
    fs::create_dir(&tmp).map_err(|e| Error::io(&tmp, e))?;
    Ok(tmp)
}

fn write_container(
    ckpt: &HfCheckpoint,
    cfg: &ModelConfig,
    dir: &Path,
    opts: &ConvertOptions,
    progress: &mut dyn FnMut(&ConvertProgress),
) -> Result<ConvertReport> {
    let trunk_names = cfg.trunk_tensor_names();
    let moe_layers: Vec<usize> = (0..cfg.num_layers).filter(|&l| cfg.is_moe_layer(l)).collect();
    let total = (trunk_names.len() + moe_layers.len() * cfg.num_experts) as u64;
    let mut done = 0u64;
    let mut report = ConvertReport { moe_layers: moe_layers.len(), ..Default::default() };

    let known: std::collections::HashSet<&str> = trunk_names.iter().map(String::as_str).collect();
    report.ignored_tensors =
        ckpt.tensor_names().into_iter().filter(|n| !known.contains(n.as_str()) && !cfg.is_expert_tensor(n)).collect();

    // Trunk.
    let trunk_path = dir.join(TRUNK_FILE);
    let mut trunk = Writer::create(&trunk_path)?;
    let mut tensors = Vec::with_capacity(trunk_names.len());
    for name in &trunk_names {
        let (data, shape) = ckpt.tensor_f32(name)?;
        let (fmt, rows, cols) = match shape.as_slice() {
            [n] => (TrunkFormat::F32, 1, *n),
            [r, c] => (trunk_format_for(cfg.tensor_role(name), opts.trunk), *r, *c),
            _ => return Err(Error::format(ckpt.dir(), format!("tensor {name} has shape {shape:?}; expected 1-D or 2-D"))),
        };
        let bytes = quant::quantize_trunk(fmt, &data, rows, cols);
        let offset = trunk.pad_to(TENSOR_ALIGN)?;
        trunk.write(&bytes)?;
        tensors.push(TensorEntry {
            name: name.clone(),
            shape: shape.iter().map(|&d| d as u64).collect(),
            format: fmt.name().to_string(),
            offset,
            bytes: bytes.len() as u64,
        });
        report.trunk_bytes += bytes.len() as u64;
        done += 1;
        progress(&ConvertProgress { done, total, what: format!("trunk {name}") });
    }
    trunk.finish()?;

    // Experts.
    let shape = ExpertShape { hidden: cfg.hidden_size, inter: cfg.moe_intermediate_size };
    let payload_bytes = quant::expert_payload_len(opts.experts, shape) as u64;
    let payload_offset = record::HEADER_BYTES;
    let record_bytes = align_up(payload_offset + payload_bytes, RECORD_ALIGN);
    let codebook_path = dir.join(CODEBOOK_FILE);
    let mut codebook_file = if opts.experts.uses_codebooks() { Some(Writer::create(&codebook_path)?) } else { None };
    let mut banks = Vec::new();
    for &layer in &moe_layers {
        let codebooks = match codebook_file.as_mut() {
            Some(w) => {
                let step = (cfg.num_experts / CODEBOOK_SAMPLE_EXPERTS).max(1);
                let sample: Vec<[Vec<f32>; 3]> = (0..cfg.num_experts)
                    .step_by(step)
                    .take(CODEBOOK_SAMPLE_EXPERTS)
                    .map(|e| ckpt.expert_f32(layer, e))
                    .collect::<Result<_>>()?;
                let views: Vec<ExpertF32> =
                    sample.iter().map(|[g, u, d]| ExpertF32 { gate: g, up: u, down: d }).collect();
                let seed = opts.seed ^ (layer as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let cb = quant::fit_layer_codebooks(opts.experts, shape, &views, seed).ok_or_else(|| {
                    Error::Runtime(format!("no codebooks were fitted for format {}", opts.experts.name()))
                })?;
                let gate_up = cb.gate_up.to_bytes();
                let down = cb.down.to_bytes();
                let gate_up_offset = w.pad_to(TENSOR_ALIGN)?;
                w.write(&gate_up)?;
                let down_offset = w.pad_to(TENSOR_ALIGN)?;
                w.write(&down)?;
                let entry = CodebookEntry {
                    file: CODEBOOK_FILE.to_string(),
                    stages: stages_of(opts.experts),
                    gate_up_offset,
                    gate_up_bytes: gate_up.len() as u64,
                    down_offset,
                    down_bytes: down.len() as u64,
                };
                Some((cb, entry))
            }
            None => None,
        };
        let file = format!("experts-{layer:03}.bin");
        let mut bank = Writer::create(&dir.join(&file))?;
        for expert in 0..cfg.num_experts {
            let [gate, up, down] = ckpt.expert_f32(layer, expert)?;
            let view = ExpertF32 { gate: &gate, up: &up, down: &down };
            let payload = quant::encode_expert(opts.experts, shape, &view, codebooks.as_ref().map(|(cb, _)| cb));
            let header = record::Header {
                layer: layer as u32,
                expert: expert as u32,
                format: opts.experts.code(),
                hidden: shape.hidden as u32,
                inter: shape.inter as u32,
                payload_offset,
                payload_bytes,
            };
            let start = bank.position();
            bank.write(&header.to_bytes())?;
            bank.write(&payload)?;
            bank.pad_to(RECORD_ALIGN)?;
            debug_assert_eq!(bank.position() - start, record_bytes);
            report.expert_bytes += record_bytes;
            done += 1;
            progress(&ConvertProgress { done, total, what: format!("layer {layer} expert {expert}") });
        }
        bank.finish()?;
        banks.push(ExpertBankEntry {
            layer: layer as u64,
            file,
            experts: cfg.num_experts as u64,
            codebooks: codebooks.map(|(_, entry)| entry),
        });
    }
    if let Some(w) = codebook_file {
        w.finish()?;
    }
    report.expert_record_bytes = record_bytes;

    // Tokenizer and template files, and the source configs.
    let mut tokenizer_files = Vec::new();
    for name in TOKENIZER_FILES {
        let from = ckpt.dir().join(name);
        if from.is_file() {
            fs::copy(&from, dir.join(name)).map_err(|e| Error::io(&from, e))?;
            tokenizer_files.push(name.to_string());
        }
    }
    let config = read_json(&ckpt.dir().join("config.json"))?;
    let gen_path = ckpt.dir().join("generation_config.json");
    let generation_config = if gen_path.is_file() { Some(read_json(&gen_path)?) } else { None };

    // The manifest last: a directory without one is not a container.
    let manifest = Manifest {
        format: FORMAT_NAME.to_string(),
        format_version: FORMAT_VERSION,
        writer: format!("waste {}", env!("CARGO_PKG_VERSION")),
        config,
        generation_config,
        trunk: TrunkIndex { file: TRUNK_FILE.to_string(), format: opts.trunk.name().to_string(), tensors },
        experts: ExpertIndex {
            format: opts.experts.name().to_string(),
            hidden: shape.hidden as u64,
            inter: shape.inter as u64,
            record_bytes,
            payload_offset,
            payload_bytes,
            layers: banks,
        },
        tokenizer_files,
    };
    let json = serde_json::to_vec_pretty(&manifest).map_err(|e| Error::Runtime(e.to_string()))?;
    let mpath = dir.join(MANIFEST_FILE);
    fs::write(&mpath, json).map_err(|e| Error::io(&mpath, e))?;
    Ok(report)
}

/// Embeddings and the LM head stay 8-bit even under a 4-bit trunk: they are
/// read per token (embedding) or decide every token (head).
fn trunk_format_for(role: TensorRole, trunk: TrunkFormat) -> TrunkFormat {
    match (role, trunk) {
        (_, TrunkFormat::F32) => TrunkFormat::F32,
        (TensorRole::Embedding | TensorRole::LmHead, _) => TrunkFormat::Q8,
        (TensorRole::Vector | TensorRole::Router, _) => TrunkFormat::F32,
        (TensorRole::Matrix, fmt) => fmt,
    }
}

fn stages_of(fmt: ExpertFormat) -> u64 {
    match fmt {
        ExpertFormat::Rvq2 => 2,
        ExpertFormat::Rvq4p => 4,
        _ => 3,
    }
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let bytes = fs::read(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_slice(&bytes).map_err(|e| Error::format(path, format!("malformed JSON: {e}")))
}

/// A buffered file writer that knows its position, for aligned layouts.
struct Writer {
    path: PathBuf,
    out: BufWriter<File>,
    pos: u64,
}

impl Writer {
    fn create(path: &Path) -> Result<Writer> {
        let file = File::create(path).map_err(|e| Error::io(path, e))?;
        Ok(Writer { path: path.to_path_buf(), out: BufWriter::with_capacity(1 << 20, file), pos: 0 })
    }

    fn position(&self) -> u64 {
        self.pos
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes).map_err(|e| Error::io(&self.path, e))?;
        self.pos += bytes.len() as u64;
        Ok(())
    }

    /// Zero-pads to a multiple of `align`; returns the new position.
    fn pad_to(&mut self, align: u64) -> Result<u64> {
        let target = align_up(self.pos, align);
        let zeros = vec![0u8; (target - self.pos) as usize];
        self.write(&zeros)?;
        Ok(self.pos)
    }

    fn finish(mut self) -> Result<()> {
        self.out.flush().map_err(|e| Error::io(&self.path, e))?;
        let file = self.out.into_inner().map_err(|e| Error::io(&self.path, e.into_error()))?;
        file.sync_all().map_err(|e| Error::io(&self.path, e))
    }
}
