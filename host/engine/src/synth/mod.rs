//! Synthetic containers: the exact shapes, record sizes and layout of a real
//! model, filled with random codes, so the I/O path and the forward pass run
//! at true scale without real weights. Two kinds: the `--shape` presets
//! (a Qwen3-MoE GQA trunk with the named model's expert banks) and
//! `synth_like` (a real model's own config, so its own trunk: KDA + MLA for
//! Kimi-Linear), both written by one generic writer over
//! `ModelConfig::trunk_tensor_names` / `trunk_tensor_shape`.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use waste_platform::FileExt;

use rayon::prelude::*;

use crate::config::ModelConfig;
use crate::container::checksum::{self, Crc32};
use crate::container::manifest::{
    align_up, record, CodebookEntry, ExpertBankEntry, ExpertIndex, Manifest, TensorEntry, TrunkIndex, CODEBOOK_FILE,
    FORMAT_NAME, FORMAT_VERSION, MANIFEST_FILE, RECORD_ALIGN, TENSOR_ALIGN, TRUNK_FILE,
};
use crate::error::{Error, Result};
use crate::quant::{self, ExpertFormat, ExpertShape, TrunkFormat};

#[derive(Debug, Clone, PartialEq)]
pub struct SynthSpec {
    pub hidden: usize,
    pub inter: usize,
    pub experts: usize,
    pub top_k: usize,
    /// Decoder layers; the first `dense_layers` have a dense MLP.
    pub layers: usize,
    pub dense_layers: usize,
    pub dense_inter: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub max_context: usize,
    pub format: ExpertFormat,
    pub trunk: TrunkFormat,
    pub seed: u64,
}

/// Named shapes: `kimi-linear-48b` (26 MoE layers x 256 experts, hidden
/// 2304, expert width 1024, top-8; its trunk is stood in by GQA attention
/// of the same width; `synth_like("kimi-linear-48b")` has the real KDA +
/// MLA trunk), `olmoe-trace` and `kimi-trace` (the expert counts of the
/// shared routing traces with tiny records), `small` (tests).
pub fn preset(name: &str) -> Option<SynthSpec> {
    let base = SynthSpec {
        hidden: 64,
        inter: 64,
        experts: 64,
        top_k: 8,
        layers: 16,
        dense_layers: 0,
        dense_inter: 128,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        vocab: 256,
        max_context: 4096,
        format: ExpertFormat::Rvq3,
        trunk: TrunkFormat::Q8,
        seed: 1,
    };
    Some(match name {
        "kimi-linear-48b" => SynthSpec {
            hidden: 2304,
            inter: 1024,
            experts: 256,
            layers: 27,
            dense_layers: 1,
            dense_inter: 9216,
            heads: 32,
            kv_heads: 2,
            head_dim: 128,
            vocab: 163_840,
            trunk: TrunkFormat::Q4,
            ..base
        },
        "olmoe-trace" => base,
        "kimi-trace" => SynthSpec { experts: 256, layers: 27, dense_layers: 1, ..base },
        "small" => SynthSpec { hidden: 512, inter: 1024, experts: 64, layers: 8, vocab: 1024, head_dim: 64, ..base },
        _ => return None,
    })
}

pub const PRESETS: &[&str] = &["kimi-linear-48b", "olmoe-trace", "kimi-trace", "small"];

impl SynthSpec {
    pub fn config_json(&self) -> serde_json::Value {
        serde_json::json!({
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "hidden_size": self.hidden,
            "intermediate_size": self.dense_inter,
            "moe_intermediate_size": self.inter,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "num_hidden_layers": self.layers,
            "num_experts": self.experts,
            "num_experts_per_tok": self.top_k,
            "norm_topk_prob": true,
            "decoder_sparse_step": 1,
            "mlp_only_layers": (0..self.dense_layers).collect::<Vec<_>>(),
            "vocab_size": self.vocab,
            "max_position_embeddings": self.max_context,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "tie_word_embeddings": false,
            "attention_bias": false,
            "bos_token_id": null,
            "eos_token_id": 1,
        })
    }
}

/// What `synth` wrote.
#[derive(Debug, Clone, Default)]
pub struct SynthReport {
    pub trunk_bytes: u64,
    pub expert_bytes: u64,
    pub record_bytes: u64,
    pub moe_layers: usize,
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }

    /// Uniform in (-a, a).
    fn uniform(&mut self, a: f32) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * a
    }
}

fn seeded(seed: u64, a: u64, b: u64) -> Rng {
    Rng((seed ^ a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b.wrapping_mul(0xD1B5_4A32_D192_ED03)) | 1)
}

/// Writes a synthetic container to `out` (which must not exist).
/// `progress(done, total)` counts tensors and expert banks.
pub fn synth(out: &Path, spec: &SynthSpec, progress: &mut dyn FnMut(u64, u64)) -> Result<SynthReport> {
    let options = LikeOptions {
        experts: spec.format,
        trunk: spec.trunk,
        seed: spec.seed,
        num_experts: None,
        manifest_only: false,
    };
    synth_config_as(out, spec.config_json(), &options, "synth", progress)
}

fn check_expert_format(format: ExpertFormat) -> Result<()> {
    if format == ExpertFormat::F32 {
        Err(Error::Arg("synthetic experts must be rvq3, rvq4p, rvq2, q8 or q4, not f32".into()))
    } else {
        Ok(())
    }
}

/// Where an expert record's parts lie.
struct RecordLayout {
    format: ExpertFormat,
    shape: ExpertShape,
    payload_offset: u64,
    payload_bytes: u64,
    record_bytes: u64,
}

impl RecordLayout {
    fn new(format: ExpertFormat, shape: ExpertShape) -> Result<Self> {
        let payload_bytes = quant::expert_payload_len(format, shape) as u64;
        // `scale_blocks` restates the payload layout of `quant`: refuse to
        // write records if the two ever disagree.
        let laid_out = matrix_parts(format, shape).iter().map(|(s, d)| s + d).sum::<usize>() + bias_bytes(shape);
        if laid_out as u64 != payload_bytes {
            return Err(Error::Runtime(format!(
                "synthetic {} layout is {laid_out} bytes, the format's payload {payload_bytes}",
                format.name()
            )));
        }
        let payload_offset = record::HEADER_BYTES;
        Ok(RecordLayout {
            format,
            shape,
            payload_offset,
            payload_bytes,
            record_bytes: align_up(payload_offset + payload_bytes, RECORD_ALIGN),
        })
    }
}

/// Writes the bank of `layer` (`experts` random records) to `path`, 16
/// records at a time, filled in parallel.
fn write_bank(path: &Path, layout: &RecordLayout, layer: usize, experts: usize, seed: u64) -> Result<()> {
    let record_bytes = layout.record_bytes as usize;
    let (payload_offset, payload_bytes) = (layout.payload_offset as usize, layout.payload_bytes as usize);
    let scale_blocks = scale_blocks(layout.format, layout.shape);
    let mut bank = std::io::BufWriter::with_capacity(8 << 20, File::create(path).map_err(|e| Error::io(path, e))?);
    const CHUNK: usize = 16;
    for first in (0..experts).step_by(CHUNK) {
        let n = CHUNK.min(experts - first);
        let mut buf = vec![0u8; n * record_bytes];
        buf.par_chunks_mut(record_bytes).enumerate().for_each(|(j, rec)| {
            let expert = first + j;
            let payload = &mut rec[payload_offset..payload_offset + payload_bytes];
            seeded(seed, layer as u64 + 1, expert as u64).fill(payload);
            // Scales: a fixed small f16 so outputs stay finite.
            for range in &scale_blocks {
                for s in payload[range.clone()].chunks_exact_mut(2) {
                    s.copy_from_slice(&half::f16::from_f32(0.02).to_le_bytes());
                }
            }
            // Biases (gpt-oss): zero, a valid f32 whatever random bytes would be.
            let biases = bias_bytes(layout.shape);
            payload[payload_bytes - biases..].fill(0);
            let header = record::Header {
                layer: layer as u32,
                expert: expert as u32,
                format: layout.format.code(),
                hidden: layout.shape.hidden as u32,
                inter: layout.shape.inter as u32,
                payload_offset: layout.payload_offset,
                payload_bytes: layout.payload_bytes,
                payload_crc32: Some(checksum::crc32(payload)),
            };
            rec[..record::HEADER_BYTES as usize].copy_from_slice(&header.to_bytes());
        });
        bank.write_all(&buf).map_err(|e| Error::io(path, e))?;
    }
    let f = bank.into_inner().map_err(|e| Error::io(path, e.into_error()))?;
    f.sync_all().map_err(|e| Error::io(path, e))
}

/// Random RVQ codebooks of `layer` (gate/up and down) appended to `f` at
/// `*pos`.
fn write_codebooks(
    f: &File,
    path: &Path,
    pos: &mut u64,
    format: ExpertFormat,
    seed: u64,
    layer: usize,
) -> Result<CodebookEntry> {
    let stages = format.stages().unwrap_or(3);
    let mut rng = seeded(seed, 77, layer as u64);
    let mut book = |pos: &mut u64| -> Result<(u64, u64, u32)> {
        let vals: Vec<u8> = (0..stages * format.entries() * 8).flat_map(|_| rng.uniform(0.3).to_le_bytes()).collect();
        let at = align_up(*pos, TENSOR_ALIGN);
        f.write_all_at(&vals, at).map_err(|e| Error::io(path, e))?;
        *pos = at + vals.len() as u64;
        Ok((at, vals.len() as u64, checksum::crc32(&vals)))
    };
    let (gate_up_offset, gate_up_bytes, gate_up_crc) = book(pos)?;
    let (down_offset, down_bytes, down_crc) = book(pos)?;
    Ok(CodebookEntry {
        file: CODEBOOK_FILE.into(),
        stages: stages as u64,
        gate_up_offset,
        gate_up_bytes,
        down_offset,
        down_bytes,
        gate_up_crc32: Some(gate_up_crc),
        down_crc32: Some(down_crc),
    })
}

/// Byte ranges of the f16 scale blocks inside an expert payload (gate, up,
/// down; see the layouts in `quant`).
fn scale_blocks(fmt: ExpertFormat, shape: ExpertShape) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut at = 0;
    for (scales, data) in matrix_parts(fmt, shape) {
        out.push(at..at + scales);
        at += scales + data;
    }
    out
}

/// The f32 biases ending a payload whose shape has them (`quant`'s layout).
fn bias_bytes(shape: ExpertShape) -> usize {
    if shape.biases {
        4 * (2 * shape.inter + shape.hidden)
    } else {
        0
    }
}

/// (scale bytes, data bytes) of gate, up and down: q8/q4 keep one f16 per
/// group of 128 ahead of the data; the RVQ formats one f16 per row ahead of
/// the codes (rvq3/rvq2: a byte per stage and 8-vector; rvq4p: row blocks
/// of 32 x 8-vectors in 96 bytes of three 6-bit code planes).
fn matrix_parts(fmt: ExpertFormat, shape: ExpertShape) -> [(usize, usize); 3] {
    let (h, i) = (shape.hidden, shape.inter);
    [(i, h), (i, h), (h, i)].map(|(rows, cols)| match fmt {
        ExpertFormat::Q8 => (rows * cols.div_ceil(128) * 2, rows * cols),
        ExpertFormat::Q4 => (rows * cols.div_ceil(128) * 2, rows * cols.div_ceil(2)),
        ExpertFormat::Rvq4p => (rows * 2, rows.div_ceil(32) * cols.div_ceil(8) * 96),
        _ => (rows * 2, rows * cols.div_ceil(8) * fmt.stages().unwrap_or(3)),
    })
}

/// Writes a random matrix (or a vector of ones) at `offset` in chunks of
/// rows, so a 377 MB embedding never exists as f32 in memory.
#[allow(clippy::too_many_arguments)]
fn write_matrix(
    file: &File,
    path: &Path,
    offset: u64,
    fmt: TrunkFormat,
    rows: usize,
    cols: usize,
    vector: bool,
    seed: u64,
) -> Result<(u64, u32)> {
    let total = fmt.byte_len(rows, cols);
    if vector {
        let ones: Vec<u8> = (0..cols).flat_map(|_| 1.0f32.to_le_bytes()).collect();
        file.write_all_at(&ones, offset).map_err(|e| Error::io(path, e))?;
        return Ok((ones.len() as u64, checksum::crc32(&ones)));
    }
    let per_row = fmt.byte_len(1, cols);
    let scales_per_row = match fmt {
        TrunkFormat::F32 => 0,
        _ => cols.div_ceil(128) * 2,
    };
    let data_per_row = per_row - scales_per_row;
    let a = 1.0 / (cols as f32).sqrt();
    const CHUNK: usize = 256;
    let chunks: Vec<usize> = (0..rows).step_by(CHUNK).collect();
    // Each chunk's scales and data hashed apart, joined in file order: the
    // scale block, then the data block.
    let results: Vec<Result<(Crc32, Crc32)>> = chunks
        .par_iter()
        .map(|&r0| {
            let n = CHUNK.min(rows - r0);
            let mut rng = seeded(seed, r0 as u64, 3);
            let w: Vec<f32> = (0..n * cols).map(|_| rng.uniform(a)).collect();
            let bytes = quant::quantize_trunk(fmt, &w, n, cols);
            let (scales, data) = bytes.split_at(n * scales_per_row);
            file.write_all_at(scales, offset + (r0 * scales_per_row) as u64).map_err(|e| Error::io(path, e))?;
            file.write_all_at(data, offset + (rows * scales_per_row + r0 * data_per_row) as u64)
                .map_err(|e| Error::io(path, e))?;
            let (mut s, mut d) = (Crc32::new(), Crc32::new());
            s.update(scales);
            d.update(data);
            Ok((s, d))
        })
        .collect();
    let parts = results.into_iter().collect::<Result<Vec<_>>>()?;
    let mut crc = Crc32::new();
    for (s, _) in &parts {
        crc.append(s);
    }
    for (_, d) in &parts {
        crc.append(d);
    }
    Ok((total as u64, crc.finish()))
}

/// The `--like` names of the real models a container can be made for
/// (`synth_like`): the releases of the family table (`config::family`),
/// with their configs in config/releases.rs.
pub fn like_names() -> impl Iterator<Item = &'static str> {
    crate::config::family::releases().map(|r| r.name)
}

/// How [`synth_like`] / [`synth_config`] fill a container.
#[derive(Debug, Clone, PartialEq)]
pub struct LikeOptions {
    pub experts: ExpertFormat,
    pub trunk: TrunkFormat,
    pub seed: u64,
    /// Routed experts per MoE layer instead of the model's own count. Top-k
    /// and every shape stay, so the per-token compute is the model's; the
    /// router matrix shrinks with the count, and so does the expert data.
    pub num_experts: Option<usize>,
    /// Write the manifest and full-length sparse files only: the planner and
    /// `info` see the model at true scale; it cannot run (its records read as
    /// zeros, which the expert store refuses).
    pub manifest_only: bool,
}

impl Default for LikeOptions {
    fn default() -> Self {
        LikeOptions {
            experts: ExpertFormat::Rvq3,
            trunk: TrunkFormat::Q4,
            seed: 1,
            num_experts: None,
            manifest_only: false,
        }
    }
}

/// The config of the real model `like` (one of [`like_names`]), with its routed
/// expert count replaced by `num_experts` when given.
pub fn like_config(like: &str, num_experts: Option<usize>) -> Result<serde_json::Value> {
    let Some(release) = crate::config::family::release(like) else {
        let names: Vec<&str> = like_names().collect();
        return Err(Error::Arg(format!("unknown model {like:?}: expected one of {}", names.join(", "))));
    };
    let mut config = (release.config)();
    if let Some(n) = num_experts {
        let obj = match config.get_mut("text_config") {
            Some(text) => text,
            None => &mut config,
        };
        if let Some(o) = obj.as_object_mut() {
            // Each family's own key for the routed expert count.
            let key = ["n_routed_experts", "num_local_experts"].into_iter().find(|k| o.contains_key(*k));
            o.insert(key.unwrap_or("num_experts").into(), n.into());
        }
    }
    Ok(config)
}

/// Writes a container for the real model `like` (one of [`like_names`]) to `out`
/// (which must not exist): see [`synth_config`]. `kimi-k3` needs
/// `manifest_only`.
pub fn synth_like(
    out: &Path,
    like: &str,
    options: &LikeOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<SynthReport> {
    let config = like_config(like, options.num_experts)?;
    if crate::config::family::release(like).is_some_and(|r| r.manifest_only) && !options.manifest_only {
        return Err(Error::Arg(format!("{like} is written manifest-only (its experts are terabytes)")));
    }
    let mode = if options.manifest_only { " --manifest-only" } else { "" };
    synth_config_as(out, config, options, &format!("synth --like {like}{mode}"), progress)
}

/// Writes a container for `config` (a HF `config.json` value) to `out`
/// (which must not exist), generic over the config's trunk: every tensor of
/// `ModelConfig::trunk_tensor_names` at its `trunk_tensor_shape`, matrices
/// random (uniform, scaled 1/sqrt(columns) so activations stay finite) in
/// the converter's formats, vectors ones; expert banks of random records
/// with small fixed scales and random codebooks. With `manifest_only` the
/// files are full-length but sparse. `progress(done, total)` counts tensors
/// and banks.
pub fn synth_config(
    out: &Path,
    config: serde_json::Value,
    options: &LikeOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<SynthReport> {
    synth_config_as(out, config, options, "synth", progress)
}

fn synth_config_as(
    out: &Path,
    config: serde_json::Value,
    options: &LikeOptions,
    how: &str,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<SynthReport> {
    let experts = options.experts;
    check_expert_format(experts)?;
    if out.exists() {
        return Err(Error::Arg(format!("{} already exists", out.display())));
    }
    let cfg = ModelConfig::from_json_str(&config.to_string(), &out.join("config.json"))?;
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;

    let names = cfg.trunk_tensor_names();
    let moe_layers: Vec<usize> = (0..cfg.num_layers).filter(|&l| cfg.is_moe_layer(l)).collect();
    let total = (names.len() + moe_layers.len()) as u64;
    let mut done = 0;
    let mut report = SynthReport::default();
    let trunk_path = out.join(TRUNK_FILE);
    let trunk_file = File::create(&trunk_path).map_err(|e| Error::io(&trunk_path, e))?;
    let mut offset = 0u64;
    let mut tensors = Vec::new();
    for (i, name) in names.into_iter().enumerate() {
        let shape = match cfg.trunk_tensor_shape(&name) {
            Some(s) => s,
            // K3's `A_log` has no fixed stored length; a conversion keeps [num_heads].
            None if name.ends_with(".A_log") => vec![cfg.kda.map_or(1, |k| k.num_heads)],
            None => return Err(Error::Runtime(format!("no shape for {name}"))),
        };
        let (fmt, rows, cols) = match shape.as_slice() {
            [n] => (TrunkFormat::F32, 1, *n),
            [r, c] => (cfg.tensor_role(&name).trunk_format(options.trunk), *r, *c),
            _ => return Err(Error::Runtime(format!("tensor {name} has shape {shape:?}"))),
        };
        offset = align_up(offset, TENSOR_ALIGN);
        let (bytes, crc32) = if options.manifest_only {
            (fmt.byte_len(rows, cols) as u64, None)
        } else if name.ends_with(".tid2eid") {
            let table: Vec<u8> = hash_table(&cfg).iter().flat_map(|v| v.to_le_bytes()).collect();
            trunk_file.write_all_at(&table, offset).map_err(|e| Error::io(&trunk_path, e))?;
            (table.len() as u64, Some(checksum::crc32(&table)))
        } else {
            let seed = options.seed ^ i as u64;
            let (bytes, crc) = write_matrix(&trunk_file, &trunk_path, offset, fmt, rows, cols, shape.len() == 1, seed)?;
            (bytes, Some(crc))
        };
        tensors.push(TensorEntry {
            name,
            shape: shape.iter().map(|&d| d as u64).collect(),
            format: fmt.name().into(),
            offset,
            bytes,
            crc32,
        });
        offset += bytes;
        report.trunk_bytes += bytes;
        done += 1;
        progress(done, total);
    }
    if options.manifest_only {
        trunk_file.set_len(offset).map_err(|e| Error::io(&trunk_path, e))?;
    } else {
        trunk_file.sync_all().map_err(|e| Error::io(&trunk_path, e))?;
    }
    drop(trunk_file);

    let shape = cfg.expert_shape();
    let layout = RecordLayout::new(experts, shape)?;
    let mut cb = if experts.uses_codebooks() {
        let p = out.join(CODEBOOK_FILE);
        Some((File::create(&p).map_err(|e| Error::io(&p, e))?, p, 0u64))
    } else {
        None
    };
    let mut banks = Vec::new();
    for layer in moe_layers {
        let codebooks = match cb.as_mut() {
            Some((f, p, pos)) => Some(write_codebooks(f, p, pos, experts, options.seed, layer)?),
            None => None,
        };
        let file = format!("experts-{layer:03}.bin");
        let path = out.join(&file);
        if options.manifest_only {
            sparse_file(&path, cfg.num_experts as u64 * layout.record_bytes)?;
        } else {
            write_bank(&path, &layout, layer, cfg.num_experts, options.seed)?;
        }
        report.expert_bytes += cfg.num_experts as u64 * layout.record_bytes;
        banks.push(ExpertBankEntry {
            layer: layer as u64,
            file,
            experts: cfg.num_experts as u64,
            codebooks,
            ggml: None,
        });
        done += 1;
        progress(done, total);
    }
    report.moe_layers = banks.len();
    report.record_bytes = layout.record_bytes;
    let manifest = Manifest {
        format: FORMAT_NAME.into(),
        format_version: FORMAT_VERSION,
        writer: format!("waste {} {how}", env!("CARGO_PKG_VERSION")),
        config,
        generation_config: None,
        trunk: TrunkIndex { file: TRUNK_FILE.into(), format: options.trunk.name().into(), tensors },
        experts: ExpertIndex {
            format: experts.name().into(),
            hidden: shape.hidden as u64,
            inter: shape.inter as u64,
            biases: shape.biases,
            record_bytes: layout.record_bytes,
            payload_offset: layout.payload_offset,
            payload_bytes: layout.payload_bytes,
            layers: banks,
        },
        tokenizer_files: Vec::new(),
        skipped: Vec::new(),
    };
    let json = serde_json::to_vec_pretty(&manifest).map_err(|e| Error::Runtime(e.to_string()))?;
    let mpath = out.join(MANIFEST_FILE);
    std::fs::write(&mpath, json).map_err(|e| Error::io(&mpath, e))?;
    Ok(report)
}

/// A DeepSeek-V4 hash layer's `tid2eid` `[V, top_k]`: distinct experts per
/// token, spread over all of them (a table of ones would send every token
/// to one expert).
fn hash_table(cfg: &ModelConfig) -> Vec<f32> {
    let (e, k) = (cfg.num_experts, cfg.top_k);
    let step = (e / k).max(1);
    (0..cfg.vocab_size).flat_map(|t| (0..k).map(move |j| ((t * 7919 + j * step) % e) as f32)).collect()
}

/// A file of `len` bytes that holds no data blocks (reads as zeros).
fn sparse_file(path: &Path, len: u64) -> Result<()> {
    let f = File::create(path).map_err(|e| Error::io(path, e))?;
    f.set_len(len).map_err(|e| Error::io(path, e))
}

#[cfg(test)]
mod tests;
