//! Reading a Hugging Face checkpoint directory: `config.json` plus one
//! `model.safetensors` or several shards listed by
//! `model.safetensors.index.json`.
//!
//! Tensors are read with positional reads and decoded to f32 on request,
//! never mapped: a converter walking a terabyte release keeps its resident
//! memory to the tensor in hand, and no file handle outlives a read, so a
//! shard can be deleted (`convert --reclaim`) while the checkpoint is open.
//!
//! Source dtypes (decode.rs has the exact rules): f32, f16, bf16; fp8 e4m3
//! with a `<name>_scale_inv` block-scale sibling; MXFP4 as the pair
//! `<base>.weight_packed` + `<base>.weight_scale`, exposed under the logical
//! name `<base>.weight`. The scale and shape companions never appear as
//! tensors of their own. A K3 checkpoint's `language_model.` prefix is
//! renamed (`ModelConfig::source_rename`).

mod decode;
mod gguf;
mod gpt_oss;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use waste_platform::FileExt;

use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::Dtype;

pub use decode::{e4m3_to_f32, e8m0_to_f32, FP4_VALUES, MXFP4_GROUP};

use crate::config::{ExpertLayout, ModelConfig};
use crate::error::{Error, Result};
use crate::quant::QMatrix;
use crate::source::TensorSource;

/// A safetensors header larger than this is refused before it is read.
const MAX_HEADER_BYTES: u64 = 256 << 20;
/// fp8 block size when the config does not name one (DeepSeek-V3).
const DEFAULT_FP8_BLOCK: [usize; 2] = [128, 128];

struct Shard {
    path: PathBuf,
    /// False for a shard the index names but that is gone (reclaimed by an
    /// earlier `convert --reclaim`); only `open_with(allow_missing_shards)`
    /// accepts that.
    present: bool,
}

/// One stored safetensors tensor.
#[derive(Clone)]
struct Raw {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Absolute byte range of the data inside the shard file.
    start: u64,
    end: u64,
}

/// How a logical tensor is stored.
#[derive(Clone)]
enum Kind {
    Plain(Raw),
    Fp8 {
        weight: Raw,
        scale: Raw,
        block: [usize; 2],
    },
    Mxfp4 {
        packed: Raw,
        scale: Raw,
    },
    /// In a shard that no longer exists.
    Missing {
        shard: usize,
    },
    /// A tensor of a GGUF file (the checkpoint's only shard), under its
    /// Hugging Face name (gguf/hf/mod.rs).
    Gguf(crate::gguf::hf::Slice),
}

#[derive(Clone)]
struct Entry {
    kind: Kind,
    /// Logical shape (MXFP4: the unpacked `[rows, cols]`); empty when missing.
    shape: Vec<usize>,
}

/// Options of `HfCheckpoint::open_with`.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenCheckpoint {
    /// Accept shards the index names that are not on disk; their tensors
    /// are known by name only and fail when read.
    pub allow_missing_shards: bool,
    /// Treat a shard whose header does not describe its size (a download
    /// still being written in place) as missing (`convert --follow`).
    pub incomplete_as_missing: bool,
}

pub struct HfCheckpoint {
    dir: PathBuf,
    config: ModelConfig,
    shards: Vec<Shard>,
    tensors: HashMap<String, Entry>,
    /// Set when the checkpoint is a GGUF file seen as an HF checkpoint.
    gguf: Option<gguf::GgufSource>,
}

/// `Ok` when the safetensors file at `path` is whole: its header parses and
/// describes exactly the file's size (how `convert --follow` tells a
/// finished download from one still being written).
pub fn shard_complete(path: &Path) -> Result<()> {
    read_header(path).map(|_| ())
}

/// Reads a shard's header: every tensor with its absolute data range.
fn read_header(path: &Path) -> Result<Vec<(String, Raw)>> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let file_len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    let mut len8 = [0u8; 8];
    file.read_exact_at(&mut len8, 0)
        .map_err(|_| Error::format(path, "not a valid safetensors file: shorter than its 8-byte header length"))?;
    let header_len = u64::from_le_bytes(len8);
    if header_len > MAX_HEADER_BYTES || 8 + header_len > file_len {
        return Err(Error::format(
            path,
            format!("not a valid safetensors file: header length {header_len} out of bounds"),
        ));
    }
    let mut buf = vec![0u8; 8 + header_len as usize];
    file.read_exact_at(&mut buf, 0).map_err(|e| Error::io(path, e))?;
    let meta: Metadata = serde_json::from_slice(&buf[8..])
        .map_err(|e| Error::format(path, format!("not a valid safetensors file: header: {e}")))?;
    let base = 8 + header_len;
    let mut infos: Vec<(String, &TensorInfo)> = meta.tensors().into_iter().collect();
    infos.sort_by_key(|(_, i)| i.data_offsets);
    // The data section must be tiled by the tensors, each exactly as long
    // as its dtype and shape say (what safetensors' own validation checks).
    let mut data_end = 0u64;
    let mut out = Vec::with_capacity(infos.len());
    for (name, info) in infos {
        let (s, e) = (info.data_offsets.0 as u64, info.data_offsets.1 as u64);
        let bits = info
            .shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d as u64))
            .and_then(|n| n.checked_mul(info.dtype.bitsize() as u64));
        if s != data_end || e < s || bits != Some((e - s) * 8) {
            return Err(Error::format(
                path,
                format!("not a valid safetensors file: tensor `{name}` has inconsistent data offsets"),
            ));
        }
        data_end = e;
        out.push((
            name,
            Raw { shard: 0, dtype: info.dtype, shape: info.shape.clone(), start: base + s, end: base + e },
        ));
    }
    // A truncated download fails here, by name.
    if base + data_end != file_len {
        return Err(Error::format(
            path,
            format!(
                "not a valid safetensors file: the header describes {} bytes, the file has {file_len} (truncated?)",
                base + data_end
            ),
        ));
    }
    Ok(out)
}

/// Bytes per element of a plainly stored tensor the engine can read as
/// f32. Integers only for the integer tables (DeepSeek-V4's `tid2eid`:
/// expert ids, exact in f32, range-checked where they are used); anywhere
/// else an integer tensor is a layout this engine does not know.
fn plain_size(name: &str, dtype: Dtype) -> Option<usize> {
    match dtype {
        Dtype::F32 => Some(4),
        Dtype::F16 | Dtype::BF16 => Some(2),
        Dtype::I64 if name.ends_with(".tid2eid") => Some(8),
        Dtype::I32 if name.ends_with(".tid2eid") => Some(4),
        _ => None,
    }
}

fn decode_plain(dtype: Dtype, bytes: &[u8], out: &mut Vec<f32>) {
    match dtype {
        Dtype::F32 => out.extend(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
        Dtype::F16 => out.extend(bytes.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())),
        Dtype::BF16 => out.extend(bytes.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())),
        Dtype::I64 => {
            out.extend(bytes.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as f32))
        }
        Dtype::I32 => {
            out.extend(bytes.chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap_or([0; 4])) as f32))
        }
        _ => {}
    }
}

/// The fp8 block size from `quantization_config.weight_block_size`.
fn fp8_block(config_path: &Path) -> Result<[usize; 2]> {
    let text = std::fs::read_to_string(config_path).map_err(|e| Error::io(config_path, e))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::format(config_path, format!("malformed JSON: {e}")))?;
    let q = v.get("quantization_config").or_else(|| v.get("text_config").and_then(|t| t.get("quantization_config")));
    let Some(b) = q.and_then(|q| q.get("weight_block_size")) else {
        return Ok(DEFAULT_FP8_BLOCK);
    };
    match b.as_array().map(|a| a.iter().map(|x| x.as_u64()).collect::<Vec<_>>()).as_deref() {
        Some([Some(m), Some(n)]) if *m > 0 && *n > 0 && *m <= 1 << 20 && *n <= 1 << 20 => {
            Ok([*m as usize, *n as usize])
        }
        _ => Err(Error::format(
            config_path,
            format!("quantization_config.weight_block_size: expected two positive integers, got {b}"),
        )),
    }
}

/// Groups stored tensors into logical ones (module docs).
fn build_entries(raws: HashMap<String, Raw>, shards: &[Shard], block: [usize; 2]) -> Result<HashMap<String, Entry>> {
    let path_of = |r: &Raw| shards[r.shard].path.clone();
    let mut out = HashMap::new();
    for (name, raw) in &raws {
        if name.ends_with("_scale_inv") || name.ends_with(".weight_shape") {
            continue;
        }
        // An MXFP4 scale is part of its packed tensor; a `weight_scale`
        // without one (another quantisation scheme) stays a tensor of its own.
        if let Some(base) = name.strip_suffix(".weight_scale") {
            if raws.contains_key(&format!("{base}.weight_packed")) {
                continue;
            }
        }
        // DeepSeek-V4's FP4 experts: the same E2M1 pairs under `weight`,
        // their E8M0 scales under `weight_scale_inv`.
        let fp4_scale = match raw.dtype {
            Dtype::I8 | Dtype::U8 => raws.get(&format!("{name}_scale_inv")).map(|s| (name.as_str(), s)),
            _ => None,
        };
        let entry = if let Some((base, scale)) = fp4_scale {
            let scale_name = format!("{base}_scale_inv");
            let bad = |msg: String| Error::format(path_of(raw), format!("FP4 tensor `{name}`: {msg}"));
            let [rows, half] = raw.shape[..] else {
                return Err(bad(format!("shape {:?}, expected [rows, cols/2]", raw.shape)));
            };
            let cols = 2 * half;
            if !matches!(scale.dtype, Dtype::U8 | Dtype::F8_E8M0)
                || cols % MXFP4_GROUP != 0
                || scale.shape != [rows, cols / MXFP4_GROUP]
            {
                return Err(bad(format!(
                    "scale `{scale_name}` is {:?} {:?}; F8_E8M0 [{rows}, {}] expected for {rows} x {cols} values in groups of {MXFP4_GROUP}",
                    scale.dtype,
                    scale.shape,
                    cols / MXFP4_GROUP
                )));
            }
            (
                name.clone(),
                Entry { kind: Kind::Mxfp4 { packed: raw.clone(), scale: (*scale).clone() }, shape: vec![rows, cols] },
            )
        } else if let Some(base) = name.strip_suffix(".weight_packed") {
            let scale_name = format!("{base}.weight_scale");
            let scale = raws
                .get(&scale_name)
                .ok_or_else(|| Error::format(path_of(raw), format!("MXFP4 tensor `{name}` has no `{scale_name}`")))?;
            let bad = |msg: String| Error::format(path_of(raw), format!("MXFP4 tensor `{name}`: {msg}"));
            if !matches!(raw.dtype, Dtype::U8 | Dtype::I8) {
                return Err(bad(format!("dtype {:?}, expected U8 (two E2M1 codes a byte)", raw.dtype)));
            }
            if !matches!(scale.dtype, Dtype::U8 | Dtype::F8_E8M0) {
                return Err(bad(format!("scale `{scale_name}` has dtype {:?}, expected U8 or F8_E8M0", scale.dtype)));
            }
            let [rows, half] = raw.shape[..] else {
                return Err(bad(format!("shape {:?}, expected [rows, cols/2]", raw.shape)));
            };
            let cols = 2 * half;
            if cols % MXFP4_GROUP != 0 || scale.shape != [rows, cols / MXFP4_GROUP] {
                return Err(bad(format!(
                    "scale `{scale_name}` has shape {:?}; [{rows}, {}] expected for {rows} x {cols} values in groups of {MXFP4_GROUP} (cols must be a multiple of {MXFP4_GROUP})",
                    scale.shape,
                    cols / MXFP4_GROUP
                )));
            }
            (
                format!("{base}.weight"),
                Entry { kind: Kind::Mxfp4 { packed: raw.clone(), scale: scale.clone() }, shape: vec![rows, cols] },
            )
        } else if let (Dtype::F8_E4M3, Some(scale)) = (raw.dtype, raws.get(&format!("{name}_scale_inv"))) {
            // Without its scale an fp8 tensor stays plain and fails when
            // read (it may be one the engine never reads).
            let scale_name = format!("{name}_scale_inv");
            let bad = |msg: String| Error::format(path_of(raw), format!("fp8 tensor `{name}`: {msg}"));
            let [rows, cols] = raw.shape[..] else {
                return Err(bad(format!("shape {:?}; fp8 block scaling needs a matrix", raw.shape)));
            };
            let want = [rows.div_ceil(block[0]), cols.div_ceil(block[1])];
            // f32 scales (DeepSeek-V3), or E8M0 powers of two (V4's `ue8m0`).
            if !matches!(scale.dtype, Dtype::F32 | Dtype::F8_E8M0 | Dtype::U8) || scale.shape != want {
                return Err(bad(format!(
                    "scale `{scale_name}` is {:?} {:?}; F32 or F8_E8M0 {want:?} expected for {}x{} blocks",
                    scale.dtype, scale.shape, block[0], block[1]
                )));
            }
            (
                name.clone(),
                Entry {
                    kind: Kind::Fp8 { weight: raw.clone(), scale: scale.clone(), block },
                    shape: raw.shape.clone(),
                },
            )
        } else {
            (name.clone(), Entry { kind: Kind::Plain(raw.clone()), shape: raw.shape.clone() })
        };
        out.insert(entry.0, entry.1);
    }
    Ok(out)
}

/// The logical name of a stored name, for shards known only from the index.
fn logical_name(name: &str) -> Option<String> {
    if name.ends_with("_scale_inv") || name.ends_with(".weight_shape") || name.ends_with(".weight_scale") {
        return None;
    }
    Some(match name.strip_suffix(".weight_packed") {
        Some(base) => format!("{base}.weight"),
        None => name.to_string(),
    })
}

impl HfCheckpoint {
    /// A checkpoint directory, or a GGUF file (`open_gguf`).
    pub fn open(src: &Path) -> Result<HfCheckpoint> {
        if src.is_file() {
            return Self::open_gguf(src);
        }
        Self::open_with(src, &OpenCheckpoint::default())
    }

    pub fn open_with(dir: &Path, opts: &OpenCheckpoint) -> Result<HfCheckpoint> {
        let config_path = dir.join("config.json");
        if !config_path.is_file() {
            return Err(Error::format(dir, "no config.json in the checkpoint directory"));
        }
        let mut config = ModelConfig::from_file(&config_path)?;
        let block = fp8_block(&config_path)?;

        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        let (shard_files, weight_map) = if index.is_file() {
            shard_list(&index, dir)?
        } else if single.is_file() {
            (vec![single.clone()], Vec::new())
        } else {
            return Err(Error::format(dir, "neither model.safetensors nor model.safetensors.index.json found"));
        };

        // The text tensors of K3 and of Qwen3.5's release sit under a
        // prefix of their own, DeepSeek-V4's release has names of its own;
        // the rest of the engine uses transformers' names.
        let strip = |name: String| config.canonical_source_name(name);
        let mut shards = Vec::with_capacity(shard_files.len());
        let mut raws: HashMap<String, Raw> = HashMap::new();
        for (i, path) in shard_files.into_iter().enumerate() {
            let header = match path.is_file() {
                false => None,
                true if opts.incomplete_as_missing => read_header(&path).ok(),
                true => Some(read_header(&path)?),
            };
            let present = header.is_some();
            if !present && !opts.allow_missing_shards {
                return Err(Error::format(&index, format!("names shard {} which does not exist", path.display())));
            }
            if let Some(header) = header {
                for (name, mut raw) in header {
                    raw.shard = i;
                    let name = strip(name);
                    if raws.contains_key(&name) {
                        return Err(Error::format(&path, format!("tensor `{name}` also appears in another shard")));
                    }
                    raws.insert(name, raw);
                }
            }
            shards.push(Shard { path, present });
        }
        let mut tensors = build_entries(raws, &shards, block)?;
        for (name, shard) in weight_map {
            let Some(logical) = logical_name(&strip(name)) else {
                continue;
            };
            if !shards[shard].present {
                tensors.entry(logical).or_insert(Entry { kind: Kind::Missing { shard }, shape: Vec::new() });
            }
        }
        config.adapt_to_tensor_names(tensors.keys().map(String::as_str));
        let names: std::collections::HashSet<&str> = tensors.keys().map(String::as_str).collect();
        let weights_file = if index.is_file() { &index } else { &single };
        config.check_layer_tensors(&names, weights_file)?;
        Ok(HfCheckpoint { dir: dir.to_path_buf(), config, shards, tensors, gguf: None })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Logical tensor names, sorted, so callers iterate in a stable order.
    pub fn tensor_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.tensors.keys().cloned().collect();
        names.sort();
        names
    }

    /// The stored (logical) shape, before `ModelConfig::canonical_shape`;
    /// `None` for an unknown tensor or one in a reclaimed shard.
    pub fn tensor_shape(&self, name: &str) -> Option<&[usize]> {
        self.tensors.get(name).filter(|e| !matches!(e.kind, Kind::Missing { .. })).map(|e| e.shape.as_slice())
    }

    /// How a tensor is stored: `f32`, `bf16`, `fp8-e4m3`, `mxfp4`, ...
    pub fn tensor_encoding(&self, name: &str) -> Option<String> {
        Some(match &self.tensors.get(name)?.kind {
            Kind::Plain(r) => format!("{:?}", r.dtype).to_lowercase(),
            Kind::Fp8 { .. } => "fp8-e4m3".into(),
            Kind::Mxfp4 { .. } => "mxfp4".into(),
            Kind::Missing { .. } => "reclaimed".into(),
            Kind::Gguf(s) => self.gguf_encoding(s),
        })
    }

    /// Whether shard `shard` was on disk and complete when the checkpoint
    /// was opened.
    pub fn shard_present(&self, shard: usize) -> bool {
        self.shards.get(shard).is_some_and(|s| s.present)
    }

    /// The shard files, in index order.
    pub fn shard_paths(&self) -> Vec<PathBuf> {
        self.shards.iter().map(|s| s.path.clone()).collect()
    }

    /// Indices of the shards holding a logical tensor (with its companions).
    pub fn shards_of(&self, name: &str) -> Vec<usize> {
        let mut v = match self.tensors.get(name).map(|e| &e.kind) {
            Some(Kind::Plain(r)) => vec![r.shard],
            Some(Kind::Fp8 { weight, scale, .. }) => vec![weight.shard, scale.shard],
            Some(Kind::Mxfp4 { packed, scale }) => vec![packed.shard, scale.shard],
            Some(Kind::Missing { shard }) => vec![*shard],
            Some(Kind::Gguf(_)) => (0..self.shards.len()).collect(),
            None => Vec::new(),
        };
        v.sort_unstable();
        v.dedup();
        v
    }

    fn not_found(&self, name: &str) -> Error {
        Error::format(&self.dir, format!("tensor `{name}` not found in the checkpoint"))
    }

    fn entry(&self, name: &str) -> Result<&Entry> {
        let entry = self.tensors.get(name).ok_or_else(|| self.not_found(name))?;
        if let Kind::Missing { shard } = entry.kind {
            return Err(Error::format(
                &self.shards[shard].path,
                format!("tensor `{name}` is in this shard, which no longer exists (reclaimed?)"),
            ));
        }
        Ok(entry)
    }

    fn read(&self, raw: &Raw, lo: u64, hi: u64) -> Result<Vec<u8>> {
        let path = &self.shards[raw.shard].path;
        debug_assert!(raw.start + hi <= raw.end && lo <= hi);
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let mut buf = vec![0u8; (hi - lo) as usize];
        file.read_exact_at(&mut buf, raw.start + lo).map_err(|e| Error::io(path, e))?;
        Ok(buf)
    }

    fn unsupported(&self, name: &str, raw: &Raw) -> Error {
        let why = match raw.dtype {
            Dtype::F8_E4M3 => {
                format!("; fp8 is read with a `{name}_scale_inv` block scale beside it, and there is none")
            }
            _ => String::new(),
        };
        Error::Unsupported(format!(
            "{}: tensor `{name}` has dtype {:?} (f32, f16, bf16, fp8 e4m3 with block scales and MXFP4 are read){why}",
            self.shards[raw.shard].path.display(),
            raw.dtype
        ))
    }

    /// A tensor decoded to f32, with its canonical shape (conv kernels and
    /// `A_log` flattened to the 1-D shape the config expects).
    pub fn tensor_f32(&self, name: &str) -> Result<(Vec<f32>, Vec<usize>)> {
        let entry = self.entry(name)?;
        let data = match &entry.kind {
            Kind::Plain(raw) => {
                plain_size(name, raw.dtype).ok_or_else(|| self.unsupported(name, raw))?;
                let mut out = Vec::new();
                decode_plain(raw.dtype, &self.read(raw, 0, raw.end - raw.start)?, &mut out);
                out
            }
            Kind::Gguf(slice) if entry.shape.len() != 2 => self.gguf_vector(slice)?,
            _ => self.rows_f32(name, 0, entry.shape[0])?,
        };
        Ok((data, self.config.canonical_shape(name, &entry.shape)))
    }

    /// Rows `[r0, r0 + n)` of a matrix, decoded: what lets a converter
    /// stream a 2 GB embedding table in slices.
    pub fn rows_f32(&self, name: &str, r0: usize, n: usize) -> Result<Vec<f32>> {
        let entry = self.entry(name)?;
        let [rows, cols] = entry.shape[..] else {
            return Err(self.shape_error(name, &entry.shape, "a 2-D matrix"));
        };
        if r0 + n > rows {
            return Err(Error::Arg(format!("rows {r0}..{} of `{name}`, which has {rows}", r0 + n)));
        }
        let mut out = Vec::with_capacity(n * cols);
        match &entry.kind {
            Kind::Plain(raw) => {
                let size = plain_size(name, raw.dtype).ok_or_else(|| self.unsupported(name, raw))? as u64;
                let row = cols as u64 * size;
                decode_plain(raw.dtype, &self.read(raw, r0 as u64 * row, (r0 + n) as u64 * row)?, &mut out);
            }
            Kind::Fp8 { weight, scale, block } => {
                let bytes = self.read(weight, (r0 * cols) as u64, ((r0 + n) * cols) as u64)?;
                let grid = self.read(scale, 0, scale.end - scale.start)?;
                let s = match scale.dtype {
                    Dtype::F32 => {
                        let mut s = Vec::new();
                        decode_plain(Dtype::F32, &grid, &mut s);
                        s
                    }
                    _ => {
                        grid.iter().map(|&b| decode::e8m0_to_f32(b)).collect::<Option<Vec<f32>>>().ok_or_else(|| {
                            Error::format(
                                &self.shards[scale.shard].path,
                                format!("fp8 tensor `{name}`: an E8M0 scale byte is NaN or overflows f32"),
                            )
                        })?
                    }
                };
                decode::fp8_rows(&bytes, r0, cols, &s, *block, &mut out);
            }
            Kind::Mxfp4 { packed, scale } => {
                let (half, groups) = ((cols / 2) as u64, (cols / MXFP4_GROUP) as u64);
                let p = self.read(packed, r0 as u64 * half, (r0 + n) as u64 * half)?;
                let s = self.read(scale, r0 as u64 * groups, (r0 + n) as u64 * groups)?;
                decode::mxfp4_rows(&p, &s, cols, &mut out).map_err(|msg| {
                    Error::format(&self.shards[scale.shard].path, format!("MXFP4 tensor `{name}`: {msg}"))
                })?;
            }
            Kind::Gguf(slice) => out = self.gguf_rows(slice, r0, n)?,
            Kind::Missing { .. } => unreachable!("entry() refuses missing tensors"),
        }
        Ok(out)
    }

    /// Elements `[first, first + count)` of a plainly stored tensor in
    /// row-major order.
    fn tensor_range_f32(&self, name: &str, first: usize, count: usize) -> Result<Vec<f32>> {
        let entry = self.entry(name)?;
        let Kind::Plain(raw) = &entry.kind else {
            return Err(Error::Unsupported(format!(
                "tensor `{name}`: fused expert tensors are read in f32, f16 or bf16 only"
            )));
        };
        let size = plain_size(name, raw.dtype).ok_or_else(|| self.unsupported(name, raw))? as u64;
        let (lo, hi) = (first as u64 * size, (first + count) as u64 * size);
        if raw.start + hi > raw.end {
            return Err(Error::format(
                &self.shards[raw.shard].path,
                format!("tensor `{name}`: element range past its data"),
            ));
        }
        let mut out = Vec::with_capacity(count);
        decode_plain(raw.dtype, &self.read(raw, lo, hi)?, &mut out);
        Ok(out)
    }

    fn shape_error(&self, name: &str, got: &[usize], want: &str) -> Error {
        let path = self.shards_of(name).first().map_or(self.dir.clone(), |&s| self.shards[s].path.clone());
        Error::format(path, format!("tensor `{name}` has shape {got:?}, expected {want}"))
    }
    /// The biases `[gate [I], up [I], down [H]]` of a routed expert, for a
    /// family whose experts have them (gpt-oss); `None` otherwise.
    pub fn expert_biases_f32(&self, layer: usize, expert: usize) -> Result<Option<[Vec<f32>; 3]>> {
        if !self.config.add.expert_bias {
            return Ok(None);
        }
        if !self.config.is_moe_layer(layer) || expert >= self.config.num_experts {
            return Err(Error::Arg(format!("no routed expert {expert} in layer {layer}")));
        }
        if self.gguf.is_some() {
            return self.gguf_expert_biases(layer, expert).map(Some);
        }
        self.gpt_oss_biases(layer, expert).map(Some)
    }

    /// One routed expert as `[gate [I,H], up [I,H], down [H,I]]` (nn.Linear
    /// layout), whichever way the checkpoint stores it.
    pub fn expert_f32(&self, layer: usize, expert: usize) -> Result<[Vec<f32>; 3]> {
        let cfg = &self.config;
        if !cfg.is_moe_layer(layer) || expert >= cfg.num_experts {
            return Err(Error::Arg(format!("no routed expert {expert} in layer {layer}")));
        }
        let (h, i) = (cfg.expert_hidden(), cfg.moe_intermediate_size);
        match cfg.expert_layout {
            ExpertLayout::GptOss => self.gpt_oss_expert(layer, expert),
            ExpertLayout::PerExpert => {
                let names = cfg.expert_tensor_names(layer, expert);
                let wants = [[i, h], [i, h], [h, i]];
                let mut out: [Vec<f32>; 3] = Default::default();
                for ((name, want), slot) in names.iter().zip(wants).zip(out.iter_mut()) {
                    let (w, shape) = self.tensor_f32(name)?;
                    if shape != want {
                        return Err(self.shape_error(name, &shape, &format!("{want:?}")));
                    }
                    *slot = w;
                }
                Ok(out)
            }
            ExpertLayout::Fused => {
                let [gu_name, down_name] = cfg.fused_expert_names(layer);
                let e = cfg.num_experts;
                let gu_shape = self.entry(&gu_name)?.shape.clone();
                let chunk = 2 * i * h;
                // modeling_*.py: `gate, up = linear(x, gate_up_proj[e]).chunk(2, dim=-1)`,
                // so the first I rows are gate. When H == 2I the two layouts
                // look alike; the modeling code's [E, 2I, H] wins.
                let (gate, up) = if gu_shape == [e, 2 * i, h] {
                    let gu = self.tensor_range_f32(&gu_name, expert * chunk, chunk)?;
                    let (g, u) = gu.split_at(i * h);
                    (g.to_vec(), u.to_vec())
                } else if gu_shape == [e, h, 2 * i] {
                    let gu = self.tensor_range_f32(&gu_name, expert * chunk, chunk)?;
                    (transpose(&gu, h, 2 * i, 0, i), transpose(&gu, h, 2 * i, i, i))
                } else {
                    return Err(self.shape_error(&gu_name, &gu_shape, &format!("[{e}, {}, {h}]", 2 * i)));
                };
                let d_shape = self.entry(&down_name)?.shape.clone();
                let down = if d_shape == [e, h, i] {
                    self.tensor_range_f32(&down_name, expert * h * i, h * i)?
                } else if d_shape == [e, i, h] {
                    transpose(&self.tensor_range_f32(&down_name, expert * h * i, h * i)?, i, h, 0, h)
                } else {
                    return Err(self.shape_error(&down_name, &d_shape, &format!("[{e}, {h}, {i}]")));
                };
                Ok([gate, up, down])
            }
        }
    }
}

/// Columns `[c0, c0 + n)` of a row-major `[rows, cols]` matrix, transposed
/// to `[n, rows]`.
fn transpose(m: &[f32], rows: usize, cols: usize, c0: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0.0; n * rows];
    for r in 0..rows {
        for c in 0..n {
            out[c * rows + r] = m[r * cols + c0 + c];
        }
    }
    out
}

/// (shard files, (tensor, shard index) pairs).
type ShardList = (Vec<PathBuf>, Vec<(String, usize)>);

/// The shard files an index names, sorted, and every (tensor, shard index)
/// pair of its weight map.
fn shard_list(index: &Path, dir: &Path) -> Result<ShardList> {
    let text = std::fs::read_to_string(index).map_err(|e| Error::io(index, e))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::format(index, format!("malformed JSON: {e}")))?;
    let Some(map) = value.get("weight_map").and_then(|m| m.as_object()) else {
        return Err(Error::format(index, "key `weight_map`: missing or not an object"));
    };
    let mut files: Vec<String> = Vec::new();
    for (tensor, file) in map {
        let Some(file) = file.as_str() else {
            return Err(Error::format(index, format!("weight_map[`{tensor}`]: expected a file name")));
        };
        // A shard name is a plain file inside the checkpoint directory; an
        // index pointing elsewhere (`../x`, an absolute path) is refused.
        if file.is_empty() || file.contains('/') || file.contains('\\') || file == ".." {
            return Err(Error::format(index, format!("weight_map[`{tensor}`]: invalid shard name `{file}`")));
        }
        if !files.iter().any(|f| f == file) {
            files.push(file.to_string());
        }
    }
    if files.is_empty() {
        return Err(Error::format(index, "weight_map is empty"));
    }
    files.sort();
    let mut pairs = Vec::with_capacity(map.len());
    for (tensor, file) in map {
        if let Some(i) = file.as_str().and_then(|f| files.iter().position(|x| x == f)) {
            pairs.push((tensor.clone(), i));
        }
    }
    Ok((files.into_iter().map(|f| dir.join(f)).collect(), pairs))
}

impl TensorSource for HfCheckpoint {
    fn matrix(&self, name: &str) -> Result<QMatrix> {
        let (w, shape) = self.tensor_f32(name)?;
        let [rows, cols] = shape[..] else {
            return Err(self.shape_error(name, &shape, "a 2-D matrix"));
        };
        Ok(QMatrix::from_f32(w, rows, cols))
    }

    fn vector(&self, name: &str) -> Result<Vec<f32>> {
        let (w, shape) = self.tensor_f32(name)?;
        if shape.len() != 1 {
            return Err(self.shape_error(name, &shape, "a 1-D vector"));
        }
        Ok(w)
    }

    fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    fn matrix_view(&self, name: &str, rows: usize, cols: usize) -> Result<QMatrix> {
        let (w, shape) = self.tensor_f32(name)?;
        if shape.len() < 2 || rows.checked_mul(cols) != Some(w.len()) {
            return Err(self.shape_error(name, &shape, &format!("{rows} x {cols} values")));
        }
        Ok(QMatrix::from_f32(w, rows, cols))
    }
}
