//! Reading a Hugging Face checkpoint directory: `config.json` plus one
//! `model.safetensors` or several shards listed by
//! `model.safetensors.index.json`. Shards are memory-mapped; tensors are
//! decoded to f32 on request.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use crate::config::{ExpertLayout, ModelConfig};
use crate::error::{Error, Result};
use crate::model::source::{ExpertProvider, TensorSource};
use crate::quant::QMatrix;
use crate::stats::StepStats;

struct Shard {
    path: PathBuf,
    map: Mmap,
}

struct Entry {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Absolute byte range of the data inside the shard file.
    start: usize,
    end: usize,
}

pub struct HfCheckpoint {
    dir: PathBuf,
    config: ModelConfig,
    shards: Vec<Shard>,
    tensors: HashMap<String, Entry>,
}

fn open_shard(path: &Path) -> Result<(Mmap, Vec<(String, Entry)>)> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: the mapping is read-only and lives as long as the checkpoint.
    // A checkpoint file truncated or rewritten by another process while
    // mapped is outside what we can defend against (same contract as every
    // mmap-based safetensors reader); everything read from it is validated
    // against the header, which is parsed once here.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
    let (header_len, meta) = SafeTensors::read_metadata(&map)
        .map_err(|e| Error::format(path, format!("not a valid safetensors file: {e}")))?;
    let base = 8 + header_len;
    let mut out = Vec::new();
    for (name, info) in meta.tensors() {
        let (s, e) = info.data_offsets;
        // read_metadata checked that the offsets tile the data section and
        // that the file is exactly as long; keep the check local anyway.
        if s > e || base + e > map.len() {
            return Err(Error::format(
                path,
                format!("tensor `{name}`: data offsets out of the file"),
            ));
        }
        let entry = Entry {
            shard: 0,
            dtype: info.dtype,
            shape: info.shape.clone(),
            start: base + s,
            end: base + e,
        };
        out.push((name, entry));
    }
    Ok((map, out))
}

fn dtype_size(dtype: Dtype) -> Option<usize> {
    match dtype {
        Dtype::F32 => Some(4),
        Dtype::F16 | Dtype::BF16 => Some(2),
        _ => None,
    }
}

fn decode_into(dtype: Dtype, bytes: &[u8], out: &mut Vec<f32>) {
    match dtype {
        Dtype::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
        Dtype::F16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()),
        ),
        Dtype::BF16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()),
        ),
        _ => {}
    }
}

impl HfCheckpoint {
    pub fn open(dir: &Path) -> Result<HfCheckpoint> {
        let config_path = dir.join("config.json");
        if !config_path.is_file() {
            return Err(Error::format(
                dir,
                "no config.json in the checkpoint directory",
            ));
        }
        let mut config = ModelConfig::from_file(&config_path)?;

        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        let shard_files: Vec<PathBuf> = if index.is_file() {
            shard_list(&index, dir)?
        } else if single.is_file() {
            vec![single.clone()]
        } else {
            return Err(Error::format(
                dir,
                "neither model.safetensors nor model.safetensors.index.json found",
            ));
        };

        let mut shards = Vec::with_capacity(shard_files.len());
        let mut tensors = HashMap::new();
        for (i, path) in shard_files.into_iter().enumerate() {
            if !path.is_file() {
                return Err(Error::format(
                    &index,
                    format!("names shard {} which does not exist", path.display()),
                ));
            }
            let (map, entries) = open_shard(&path)?;
            for (name, mut entry) in entries {
                entry.shard = i;
                if tensors.contains_key(&name) {
                    return Err(Error::format(
                        &path,
                        format!("tensor `{name}` also appears in another shard"),
                    ));
                }
                tensors.insert(name, entry);
            }
            shards.push(Shard { path, map });
        }
        config.adapt_to_tensor_names(tensors.keys().map(String::as_str));
        let names: std::collections::HashSet<&str> = tensors.keys().map(String::as_str).collect();
        let weights_file = if index.is_file() { &index } else { &single };
        config.check_layer_tensors(&names, weights_file)?;
        Ok(HfCheckpoint {
            dir: dir.to_path_buf(),
            config,
            shards,
            tensors,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Sorted, so callers iterate in a stable order.
    pub fn tensor_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.tensors.keys().cloned().collect();
        names.sort();
        names
    }

    /// The stored shape, before `ModelConfig::canonical_shape`.
    pub fn tensor_shape(&self, name: &str) -> Option<&[usize]> {
        self.tensors.get(name).map(|e| e.shape.as_slice())
    }

    fn entry(&self, name: &str) -> Result<(&Entry, &Path)> {
        let entry = self.tensors.get(name).ok_or_else(|| {
            Error::format(
                &self.dir,
                format!("tensor `{name}` not found in the checkpoint"),
            )
        })?;
        let path = self.shards[entry.shard].path.as_path();
        if dtype_size(entry.dtype).is_none() {
            return Err(Error::Unsupported(format!(
                "{}: tensor `{name}` has dtype {:?} (f32, f16, bf16 are read)",
                path.display(),
                entry.dtype
            )));
        }
        Ok((entry, path))
    }

    /// A tensor decoded to f32, with its canonical shape (conv kernels and
    /// `A_log` flattened to the 1-D shape the config expects).
    pub fn tensor_f32(&self, name: &str) -> Result<(Vec<f32>, Vec<usize>)> {
        let (entry, _) = self.entry(name)?;
        let bytes = &self.shards[entry.shard].map[entry.start..entry.end];
        let mut out = Vec::with_capacity(bytes.len() / 2);
        decode_into(entry.dtype, bytes, &mut out);
        Ok((out, self.config.canonical_shape(name, &entry.shape)))
    }

    /// Elements `[first, first + count)` of a tensor in row-major order.
    fn tensor_range_f32(&self, name: &str, first: usize, count: usize) -> Result<Vec<f32>> {
        let (entry, path) = self.entry(name)?;
        let size = dtype_size(entry.dtype).unwrap_or(4);
        let lo = entry.start + first * size;
        let hi = lo + count * size;
        if hi > entry.end {
            return Err(Error::format(
                path,
                format!("tensor `{name}`: element range past its data"),
            ));
        }
        let mut out = Vec::with_capacity(count);
        decode_into(entry.dtype, &self.shards[entry.shard].map[lo..hi], &mut out);
        Ok(out)
    }

    fn shape_error(&self, name: &str, got: &[usize], want: &str) -> Error {
        let path = self
            .tensors
            .get(name)
            .map_or(self.dir.as_path(), |e| self.shards[e.shard].path.as_path());
        Error::format(
            path,
            format!("tensor `{name}` has shape {got:?}, expected {want}"),
        )
    }

    /// One routed expert as `[gate [I,H], up [I,H], down [H,I]]` (nn.Linear
    /// layout), whichever way the checkpoint stores it.
    pub fn expert_f32(&self, layer: usize, expert: usize) -> Result<[Vec<f32>; 3]> {
        let cfg = &self.config;
        if !cfg.is_moe_layer(layer) || expert >= cfg.num_experts {
            return Err(Error::Arg(format!(
                "no routed expert {expert} in layer {layer}"
            )));
        }
        let (h, i) = (cfg.hidden_size, cfg.moe_intermediate_size);
        match cfg.expert_layout {
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
                let gu_shape = self.entry(&gu_name)?.0.shape.clone();
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
                    (
                        transpose(&gu, h, 2 * i, 0, i),
                        transpose(&gu, h, 2 * i, i, i),
                    )
                } else {
                    return Err(self.shape_error(
                        &gu_name,
                        &gu_shape,
                        &format!("[{e}, {}, {h}]", 2 * i),
                    ));
                };
                let d_shape = self.entry(&down_name)?.0.shape.clone();
                let down = if d_shape == [e, h, i] {
                    self.tensor_range_f32(&down_name, expert * h * i, h * i)?
                } else if d_shape == [e, i, h] {
                    transpose(
                        &self.tensor_range_f32(&down_name, expert * h * i, h * i)?,
                        i,
                        h,
                        0,
                        h,
                    )
                } else {
                    return Err(self.shape_error(
                        &down_name,
                        &d_shape,
                        &format!("[{e}, {h}, {i}]"),
                    ));
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

fn shard_list(index: &Path, dir: &Path) -> Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string(index).map_err(|e| Error::io(index, e))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::format(index, format!("malformed JSON: {e}")))?;
    let Some(map) = value.get("weight_map").and_then(|m| m.as_object()) else {
        return Err(Error::format(
            index,
            "key `weight_map`: missing or not an object",
        ));
    };
    let mut files: Vec<String> = Vec::new();
    for (tensor, file) in map {
        let Some(file) = file.as_str() else {
            return Err(Error::format(
                index,
                format!("weight_map[`{tensor}`]: expected a file name"),
            ));
        };
        // A shard name is a plain file inside the checkpoint directory; an
        // index pointing elsewhere (`../x`, an absolute path) is refused.
        if file.is_empty() || file.contains('/') || file.contains('\\') || file == ".." {
            return Err(Error::format(
                index,
                format!("weight_map[`{tensor}`]: invalid shard name `{file}`"),
            ));
        }
        if !files.iter().any(|f| f == file) {
            files.push(file.to_string());
        }
    }
    if files.is_empty() {
        return Err(Error::format(index, "weight_map is empty"));
    }
    files.sort();
    Ok(files.into_iter().map(|f| dir.join(f)).collect())
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
}

/// Exact f32 experts straight from the checkpoint: the reference the
/// quantised expert stores are measured against.
pub struct DenseExperts<'a>(pub &'a HfCheckpoint);

impl ExpertProvider for DenseExperts<'_> {
    fn forward_experts(
        &self,
        layer: usize,
        x: &[f32],
        picks: &[(usize, f32)],
        out: &mut [f32],
        stats: &mut StepStats,
    ) -> Result<()> {
        let cfg = self.0.config();
        let (h, inter) = (cfg.hidden_size, cfg.moe_intermediate_size);
        if x.len() != h || out.len() != h {
            return Err(Error::Arg(format!(
                "expert input/output length {}/{} != hidden {h}",
                x.len(),
                out.len()
            )));
        }
        out.fill(0.0);
        let mut act = vec![0.0f32; inter];
        for &(e, weight) in picks {
            let [gate, up, down] = self.0.expert_f32(layer, e)?;
            for (r, a) in act.iter_mut().enumerate() {
                let g = dot(&gate[r * h..(r + 1) * h], x);
                let u = dot(&up[r * h..(r + 1) * h], x);
                *a = g / (1.0 + (-g).exp()) * u;
            }
            for (r, o) in out.iter_mut().enumerate() {
                *o += weight * dot(&down[r * inter..(r + 1) * inter], &act);
            }
            stats.experts_hit += 1;
        }
        Ok(())
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh, empty directory under the system temp dir.
    fn scratch_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("waste-ckpt-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn fixture(family: &str) -> PathBuf {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures")
            .join(format!("tiny-{family}"));
        assert!(
            d.join("config.json").is_file(),
            "fixture file missing: {}",
            d.join("config.json").display()
        );
        d
    }

    fn write_tensors(path: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)]) {
        let bytes: Vec<Vec<u8>> = tensors
            .iter()
            .map(|t| t.2.iter().flat_map(|x| x.to_le_bytes()).collect())
            .collect();
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
            .iter()
            .zip(&bytes)
            .map(|(t, b)| {
                (
                    t.0.clone(),
                    safetensors::tensor::TensorView::new(Dtype::F32, t.1.clone(), b).unwrap(),
                )
            })
            .collect();
        safetensors::serialize_to_file(views, None, path).unwrap();
    }

    #[test]
    fn opens_fixtures_single_and_sharded() {
        let q = HfCheckpoint::open(&fixture("qwen3_moe")).unwrap();
        assert_eq!(q.config().expert_layout, ExpertLayout::PerExpert);
        let (w, shape) = q.tensor_f32("model.embed_tokens.weight").unwrap();
        assert_eq!(shape, vec![512, 64]);
        assert_eq!(w.len(), 512 * 64);
        let [g, u, d] = q.expert_f32(1, 7).unwrap();
        assert_eq!((g.len(), u.len(), d.len()), (32 * 64, 32 * 64, 64 * 32));
        assert!(
            matches!(q.expert_f32(0, 0), Err(Error::Arg(_))),
            "layer 0 is dense"
        );

        let m = HfCheckpoint::open(&fixture("mixtral")).unwrap();
        assert_eq!(m.shards.len(), 4);
        for name in m.config().trunk_tensor_names() {
            assert!(m.has(&name), "{name}");
        }
        let n_expert = m
            .tensor_names()
            .iter()
            .filter(|n| m.config().is_expert_tensor(n))
            .count();
        assert_eq!(n_expert, 4 * 8 * 3);
        let e = m.tensor_f32("nope").unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
    }

    #[test]
    fn missing_config_and_weights() {
        let d = scratch_dir("noconfig");
        let e = HfCheckpoint::open(&d).err().unwrap();
        assert!(e.to_string().contains("config.json"), "{e}");

        std::fs::copy(fixture("olmoe").join("config.json"), d.join("config.json")).unwrap();
        let e = HfCheckpoint::open(&d).err().unwrap();
        assert!(e.to_string().contains("model.safetensors"), "{e}");

        std::fs::write(d.join("config.json"), "{\"model_type\": ").unwrap();
        let e = HfCheckpoint::open(&d).err().unwrap();
        assert!(
            e.to_string().contains("config.json") && e.to_string().contains("malformed"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn truncated_and_corrupt_safetensors() {
        let src = fixture("olmoe");
        let d = scratch_dir("truncated");
        std::fs::copy(src.join("config.json"), d.join("config.json")).unwrap();
        let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
        let file = d.join("model.safetensors");

        std::fs::write(&file, &bytes[..bytes.len() - 100]).unwrap();
        let e = HfCheckpoint::open(&d).err().unwrap();
        assert!(
            matches!(e, Error::Format { .. }) && e.to_string().contains("model.safetensors"),
            "{e}"
        );

        std::fs::write(&file, &bytes[..5]).unwrap();
        let e = HfCheckpoint::open(&d).err().unwrap();
        assert!(e.to_string().contains("model.safetensors"), "{e}");

        let mut bad = bytes.clone();
        bad[0..8].copy_from_slice(&u64::MAX.to_le_bytes());
        std::fs::write(&file, &bad).unwrap();
        let e = HfCheckpoint::open(&d).err().unwrap();
        assert!(e.to_string().contains("model.safetensors"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn index_naming_missing_or_foreign_shard() {
        let src = fixture("mixtral");
        let d = scratch_dir("shards");
        for f in [
            "config.json",
            "model.safetensors.index.json",
            "model-00001-of-00004.safetensors",
        ] {
            std::fs::copy(src.join(f), d.join(f)).unwrap();
        }
        let e = HfCheckpoint::open(&d).err().unwrap();
        let msg = e.to_string();
        assert!(
            msg.contains("model.safetensors.index.json") && msg.contains("model-00002-of-00004"),
            "{msg}"
        );

        std::fs::write(
            d.join("model.safetensors.index.json"),
            r#"{"weight_map": {"model.norm.weight": "../etc/passwd"}}"#,
        )
        .unwrap();
        let e = HfCheckpoint::open(&d).err().unwrap();
        assert!(e.to_string().contains("invalid shard name"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn unsupported_dtype_is_named() {
        let d = scratch_dir("dtype");
        std::fs::copy(fixture("olmoe").join("config.json"), d.join("config.json")).unwrap();
        let data = [0u8; 8];
        let view = safetensors::tensor::TensorView::new(Dtype::I32, vec![2], &data).unwrap();
        safetensors::serialize_to_file(
            vec![("model.norm.weight", view)],
            None,
            &d.join("model.safetensors"),
        )
        .unwrap();
        let c = HfCheckpoint::open(&d).unwrap();
        let e = c.tensor_f32("model.norm.weight").unwrap_err();
        assert!(
            matches!(e, Error::Unsupported(_)) && e.to_string().contains("I32"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Rewrites a per-expert fixture in the fused transformers-5 layout
    /// (optionally transposed, with Mixtral's block renamed to `mlp`) and
    /// checks every expert reads back identically.
    fn fused_roundtrip(family: &str, transposed: bool) -> PathBuf {
        let src = HfCheckpoint::open(&fixture(family)).unwrap();
        let cfg = src.config().clone();
        let (e, h, i) = (cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size);
        let d = scratch_dir(&format!("fused-{family}-{transposed}"));
        std::fs::copy(fixture(family).join("config.json"), d.join("config.json")).unwrap();
        let mut out = Vec::new();
        for name in src.tensor_names() {
            if !cfg.is_expert_tensor(&name) {
                let (w, shape) = src.tensor_f32(&name).unwrap();
                out.push((name.replace(".block_sparse_moe.", ".mlp."), shape, w));
            }
        }
        for l in (0..cfg.num_layers).filter(|&l| cfg.is_moe_layer(l)) {
            let (mut gu, mut dn) = (Vec::new(), Vec::new());
            for x in 0..e {
                let [g, u, dw] = src.expert_f32(l, x).unwrap();
                if transposed {
                    // [H, 2I] and [I, H]
                    for r in 0..h {
                        gu.extend((0..i).map(|c| g[c * h + r]));
                        gu.extend((0..i).map(|c| u[c * h + r]));
                    }
                    for r in 0..i {
                        dn.extend((0..h).map(|c| dw[c * i + r]));
                    }
                } else {
                    gu.extend_from_slice(&g);
                    gu.extend_from_slice(&u);
                    dn.extend_from_slice(&dw);
                }
            }
            let (gs, ds) = if transposed {
                (vec![e, h, 2 * i], vec![e, i, h])
            } else {
                (vec![e, 2 * i, h], vec![e, h, i])
            };
            out.push((format!("model.layers.{l}.mlp.experts.gate_up_proj"), gs, gu));
            out.push((format!("model.layers.{l}.mlp.experts.down_proj"), ds, dn));
        }
        write_tensors(&d.join("model.safetensors"), &out);

        let fused = HfCheckpoint::open(&d).unwrap();
        assert_eq!(fused.config().expert_layout, ExpertLayout::Fused);
        assert_eq!(fused.config().moe_block, "mlp");
        for l in (0..cfg.num_layers).filter(|&l| cfg.is_moe_layer(l)) {
            for x in 0..e {
                assert!(
                    fused.expert_f32(l, x).unwrap() == src.expert_f32(l, x).unwrap(),
                    "{family} layer {l} expert {x}"
                );
            }
        }
        d
    }

    #[test]
    fn fused_expert_layouts() {
        let _ = std::fs::remove_dir_all(fused_roundtrip("qwen3_moe", false));
        // The forward pass over the renamed, transposed Mixtral still
        // matches the reference logits.
        let d = fused_roundtrip("mixtral", true);
        let ckpt = HfCheckpoint::open(&d).unwrap();
        let cfg = ckpt.config().clone();
        let reference: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(fixture("mixtral").join("reference.json")).unwrap(),
        )
        .unwrap();
        let prompt: Vec<u32> = reference["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let want: Vec<f32> = std::fs::read(fixture("mixtral").join("reference_logits.f32"))
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let model = crate::model::Model::load(&cfg, &ckpt).unwrap();
        let mut state = crate::model::State::new(&cfg, prompt.len());
        let got = model
            .forward(
                &mut state,
                &prompt,
                &DenseExperts(&ckpt),
                false,
                &mut StepStats::default(),
            )
            .unwrap();
        let want = &want[(prompt.len() - 1) * cfg.vocab_size..];
        let max = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let diff = got
            .iter()
            .zip(want)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(diff <= 1e-4 * max, "fused mixtral: {diff} vs max {max}");
        let _ = std::fs::remove_dir_all(d);
    }
}

#[cfg(test)]
mod kimi_tests {
    use super::*;

    /// A config whose layer lists disagree with the tensors present fails
    /// at open, naming the config keys, the layer and the tensor.
    #[test]
    fn layer_lists_disagreeing_with_tensors_are_named() {
        let src =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-kimi_linear");
        let d =
            std::env::temp_dir().join(format!("waste-ckpt-test-{}-kimi-lists", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::copy(src.join("model.safetensors"), d.join("model.safetensors")).unwrap();
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap())
                .unwrap();
        // Layers 1 and 2 swapped: layer 1 holds KDA tensors.
        cfg["layer_types"][1] = "full_attention".into();
        cfg["layer_types"][2] = "linear_attention".into();
        std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
        let msg = HfCheckpoint::open(&d).err().expect("must fail").to_string();
        for needle in [
            "model.safetensors",
            "layer_types",
            "layer 1",
            "MLA",
            "model.layers.1.self_attn.A_log",
        ] {
            assert!(msg.contains(needle), "{msg} lacks {needle}");
        }

        // Released layout with 0-based lists by mistake (all in range).
        let o = cfg.as_object_mut().unwrap();
        o.remove("layer_types");
        o.insert(
            "linear_attn_config".into(),
            serde_json::json!({"kda_layers": [0, 1, 3], "full_attn_layers": [2, 4], "head_dim": 16, "num_heads": 2}),
        );
        std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
        let msg = HfCheckpoint::open(&d).err().expect("must fail").to_string();
        assert!(
            msg.contains("linear_attn_config") && msg.contains("1-based"),
            "{msg}"
        );

        // Dense layer 0 declared MoE.
        let o = cfg.as_object_mut().unwrap();
        o.insert(
            "linear_attn_config".into(),
            serde_json::json!({"kda_layers": [1, 2, 4], "full_attn_layers": [3, 5], "head_dim": 16, "num_heads": 2}),
        );
        o.insert(
            "mlp_layer_types".into(),
            serde_json::json!(["sparse", "sparse", "sparse", "sparse", "sparse"]),
        );
        std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
        let msg = HfCheckpoint::open(&d).err().expect("must fail").to_string();
        for needle in [
            "mlp_layer_types",
            "layer 0",
            "model.layers.0.mlp.gate_proj.weight",
        ] {
            assert!(msg.contains(needle), "{msg} lacks {needle}");
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}
