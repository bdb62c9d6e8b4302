//! A GGUF file opened as an [`HfCheckpoint`]: its tensors under their
//! Hugging Face names (crate::gguf::hf), its config.json and tokenizer
//! files generated from its metadata, its files (one, or a split model's
//! parts) the shards.

use std::collections::HashMap;
use std::path::Path;

use super::{Entry, HfCheckpoint, Kind, Shard};
use crate::config::{ExpertLayout, Family, ModelConfig, TensorRole};
use crate::container::SlabRun;
use crate::error::{Error, Result};
use crate::gguf::hf::{self, KvB, RowMap, Slice, ValueMap};
use crate::gguf::{tokenizer, GgmlType, GgufFile};
use crate::quant::{GgmlExpert, TrunkFormat};

/// What a GGUF checkpoint holds besides its tensors.
pub(super) struct GgufSource {
    file: GgufFile,
    /// The generated config.json, and the tokenizer files by name.
    side_files: Vec<(&'static str, Vec<u8>)>,
}

impl HfCheckpoint {
    /// Opens a GGUF file (`waste convert MODEL.gguf OUT`).
    pub fn open_gguf(path: &Path) -> Result<HfCheckpoint> {
        let file = GgufFile::open(path)?;
        let view = hf::view(&file)?;
        let config_json = serde_json::to_vec_pretty(&view.config).map_err(|e| Error::Runtime(e.to_string()))?;
        let mut config = ModelConfig::from_json_str(
            std::str::from_utf8(&config_json).map_err(|e| Error::Runtime(e.to_string()))?,
            path,
        )?;
        let vocab = tokenizer::Vocab::read(&file)?;
        let mut side_files = tokenizer::files(&vocab).map_err(|msg| Error::format(path, msg))?;
        side_files.push(("config.json", config_json));

        let mut tensors = HashMap::new();
        for (name, slice) in view.tensors {
            let shape = slice.shape.clone();
            if tensors.insert(name.clone(), Entry { kind: Kind::Gguf(slice), shape }).is_some() {
                return Err(Error::format(path, format!("two GGUF tensors map to `{name}`")));
            }
        }
        config.adapt_to_tensor_names(tensors.keys().map(String::as_str));
        if config.family == Family::GptOss {
            // The view offers gpt-oss's experts one by one in nn.Linear
            // layout (gguf/hf/gpt_oss.rs), not as HF's fused tensors.
            config.expert_layout = ExpertLayout::PerExpert;
        }
        let names: std::collections::HashSet<&str> = tensors.keys().map(String::as_str).collect();
        config.check_layer_tensors(&names, path)?;
        Ok(HfCheckpoint {
            dir: path.parent().map_or_else(|| Path::new(".").to_path_buf(), Path::to_path_buf),
            config,
            // A split model's parts are its shards; each tensor counts as
            // in every part (`shards_of`), so `--reclaim` deletes them
            // together once all is written, as it does an unsplit file.
            shards: file.parts().iter().map(|p| Shard { path: p.clone(), present: true }).collect(),
            tensors,
            gguf: Some(GgufSource { file, side_files }),
        })
    }

    /// A small file of the checkpoint (config.json, generation_config.json,
    /// a tokenizer file): read from the directory, or the one generated
    /// from a GGUF file's metadata; `None` when there is none.
    pub fn side_file(&self, name: &str) -> Result<Option<Vec<u8>>> {
        if let Some(g) = &self.gguf {
            return Ok(g.side_files.iter().find(|(n, _)| *n == name).map(|(_, b)| b.clone()));
        }
        let path = self.dir.join(name);
        if !path.is_file() {
            return Ok(None);
        }
        std::fs::read(&path).map(Some).map_err(|e| Error::io(&path, e))
    }

    /// The GGUF file behind this checkpoint, if it is one.
    pub fn gguf_file(&self) -> Option<&GgufFile> {
        self.gguf.as_ref().map(|g| &g.file)
    }

    fn gguf(&self) -> &GgufFile {
        &self.gguf.as_ref().expect("Kind::Gguf entries exist only in GGUF checkpoints").file
    }

    pub(super) fn gguf_encoding(&self, s: &Slice) -> String {
        format!("gguf-{}", self.gguf().tensors[s.tensor].ty.name().to_lowercase())
    }

    /// Rows `[r0, r0 + n)` of a matrix slice, in HF row order.
    pub(super) fn gguf_rows(&self, s: &Slice, r0: usize, n: usize) -> Result<Vec<f32>> {
        let g = self.gguf();
        let t = &g.tensors[s.tensor];
        if let Some(kv) = &s.kv_b {
            return self.gguf_kv_b_rows(kv, s.tensor, r0, n);
        }
        let Some(map) = self.row_map(s)? else {
            return g.rows_f32(t, s.first_row + r0 as u64, n as u64);
        };
        let mut out = Vec::with_capacity(n * t.ne[0] as usize);
        for r in r0..r0 + n {
            out.extend(g.rows_f32(t, s.first_row + map.stored_row(r, s.rows as usize) as u64, 1)?);
        }
        Ok(out)
    }

    /// A slice's row map, checked against its row count.
    fn row_map(&self, s: &Slice) -> Result<Option<RowMap>> {
        match s.row_map {
            Some(map) if !map.fits(s.rows as usize) => Err(Error::format(
                self.gguf().path(),
                format!("tensor `{}`: {} rows do not split as {map:?}", self.gguf().tensors[s.tensor].name, s.rows),
            )),
            map => Ok(map),
        }
    }

    /// A 1-D slice (norms, biases), in HF element order with HF's values.
    pub(super) fn gguf_vector(&self, s: &Slice) -> Result<Vec<f32>> {
        let g = self.gguf();
        let t = &g.tensors[s.tensor];
        let v = g.rows_f32(t, s.first_row, s.rows)?;
        let v = match s.row_map {
            Some(map) if !map.fits(v.len()) => {
                return Err(Error::format(
                    g.path(),
                    format!("tensor `{}`: {} values do not split as {map:?}", t.name, v.len()),
                ))
            }
            Some(map) => (0..v.len()).map(|i| v[map.stored_row(i, v.len())]).collect(),
            None => v,
        };
        Ok(match s.values {
            ValueMap::Stored => v,
            map => v.into_iter().map(|x| map.undo(x)).collect(),
        })
    }
}

impl HfCheckpoint {
    /// Rows `[r0, r0 + n)` of DeepSeek's `kv_b_proj` `[heads * (nope + v),
    /// kv_lora]`: per head, its `nope` key rows are the columns of
    /// `attn_k_b`'s `[kv_lora, nope]` slab, its `v` value rows the rows of
    /// `attn_v_b`'s `[v, kv_lora]` slab.
    fn gguf_kv_b_rows(&self, kv: &KvB, k_b: usize, r0: usize, n: usize) -> Result<Vec<f32>> {
        let g = self.gguf();
        let (kt, vt) = (&g.tensors[k_b], &g.tensors[kv.v_b]);
        let per_head = kv.nope + kv.v;
        let mut out = Vec::with_capacity(n * kv.kv_lora);
        let mut head: Option<(usize, Vec<f32>, Vec<f32>)> = None;
        for r in r0..r0 + n {
            let (h, j) = (r / per_head, r % per_head);
            if head.as_ref().is_none_or(|(cur, _, _)| *cur != h) {
                let keys = g.rows_f32(kt, (h * kv.kv_lora) as u64, kv.kv_lora as u64)?; // [kv_lora, nope]
                let values = g.rows_f32(vt, (h * kv.v) as u64, kv.v as u64)?; // [v, kv_lora]
                head = Some((h, keys, values));
            }
            let (_, keys, values) = head.as_ref().expect("just read");
            if j < kv.nope {
                out.extend((0..kv.kv_lora).map(|c| keys[c * kv.nope + j]));
            } else {
                let row = j - kv.nope;
                out.extend_from_slice(&values[row * kv.kv_lora..(row + 1) * kv.kv_lora]);
            }
        }
        Ok(out)
    }

    /// The ggml type a trunk matrix `[rows, cols]` can be kept in: its GGUF
    /// tensor's, when each HF row is one stored row (in order, or in the
    /// order llama.cpp's q/k permutation put it); `None` when its values
    /// must be decoded (an F32 tensor, DeepSeek's rebuilt `kv_b_proj`, a
    /// checkpoint that is no GGUF file).
    pub fn gguf_matrix_type(&self, name: &str, rows: usize, cols: usize) -> Result<Option<GgmlType>> {
        let Some(g) = self.gguf.as_ref().map(|g| &g.file) else { return Ok(None) };
        let Kind::Gguf(s) = &self.entry(name)?.kind else { return Ok(None) };
        let t = &g.tensors[s.tensor];
        let plain = s.kv_b.is_none()
            && s.values == ValueMap::Stored
            && s.shape == [rows, cols]
            && t.ne[0] == cols as u64
            && s.rows == rows as u64;
        Ok((plain && t.ty != GgmlType::F32).then_some(t.ty))
    }

    /// The format trunk matrix `name` `[rows, cols]` keeps when a GGUF
    /// file's trunk is kept as stored (`--trunk gguf`, or a GGUF run in
    /// place): its ggml type where `gguf_matrix_type` allows, f32 for
    /// routers (routing must not depend on a quantised router) and for
    /// what must be decoded.
    pub fn stored_trunk_format(&self, name: &str, rows: usize, cols: usize) -> Result<TrunkFormat> {
        if matches!(self.config.tensor_role(name), TensorRole::Vector | TensorRole::Router) {
            return Ok(TrunkFormat::F32);
        }
        Ok(self.gguf_matrix_type(name, rows, cols)?.map_or(TrunkFormat::F32, TrunkFormat::Ggml))
    }

    /// Where a trunk matrix's stored rows lie in the GGUF file, when they
    /// lie there in HF order as one run: (part, byte offset, ggml type).
    /// `None` for a permuted or rebuilt matrix, or a checkpoint that is no
    /// GGUF file.
    pub fn gguf_matrix_span(&self, name: &str) -> Option<(usize, u64, GgmlType)> {
        let g = self.gguf.as_ref().map(|g| &g.file)?;
        let Kind::Gguf(s) = &self.tensors.get(name)?.kind else { return None };
        let t = &g.tensors[s.tensor];
        (s.row_map.is_none() && s.kv_b.is_none()).then(|| (t.part, t.start + s.first_row * t.row_bytes(), t.ty))
    }

    /// Where each expert of MoE layer `layer` keeps its gate, up and down
    /// slabs in the GGUF file: expert `e`'s slab of each is the run of
    /// `bytes` at `start + e * bytes` of its part.
    pub fn gguf_expert_extents(&self, layer: usize) -> Result<[SlabRun; 3]> {
        let g = self.gguf();
        let slices = self.gguf_expert_slices(layer, 0)?;
        Ok(slices.map(|s| {
            let t = &g.tensors[s.tensor];
            SlabRun { part: t.part, start: t.start, bytes: s.rows * t.row_bytes() }
        }))
    }

    /// The stored bytes of HF rows `[r0, r0 + n)` of a matrix whose type
    /// `gguf_matrix_type` gave.
    pub fn gguf_matrix_rows(&self, name: &str, r0: usize, n: usize) -> Result<Vec<u8>> {
        let g = self.gguf();
        let Kind::Gguf(s) = &self.entry(name)?.kind else {
            return Err(Error::format(g.path(), format!("tensor `{name}` is not a GGUF slab")));
        };
        let t = &g.tensors[s.tensor];
        let Some(map) = self.row_map(s)? else {
            return g.rows_bytes(t, s.first_row + r0 as u64, n as u64);
        };
        let mut out = Vec::with_capacity(n * t.row_bytes() as usize);
        for r in r0..r0 + n {
            out.extend(g.rows_bytes(t, s.first_row + map.stored_row(r, s.rows as usize) as u64, 1)?);
        }
        Ok(out)
    }

    /// One routed expert's gate, up and down slabs as the GGUF file stores
    /// them (whole blocks of their ggml types, nn.Linear row order), for a
    /// container that keeps them (`waste convert --experts gguf`).
    pub fn gguf_expert_slabs(&self, layer: usize, expert: usize) -> Result<(GgmlExpert, [Vec<u8>; 3])> {
        let g = self.gguf();
        let slices = self.gguf_expert_slices(layer, expert)?;
        let mut slabs: [Vec<u8>; 3] = Default::default();
        for (slab, s) in slabs.iter_mut().zip(&slices) {
            *slab = g.rows_bytes(&g.tensors[s.tensor], s.first_row, s.rows)?;
        }
        Ok((self.slice_types(&slices), slabs))
    }

    /// The ggml types of layer `layer`'s experts (its first expert's: every
    /// expert of a layer is a slab of the same three tensors).
    pub fn gguf_expert_types(&self, layer: usize) -> Result<GgmlExpert> {
        Ok(self.slice_types(&self.gguf_expert_slices(layer, 0)?))
    }

    fn slice_types(&self, slices: &[&Slice; 3]) -> GgmlExpert {
        let ty = |s: &Slice| self.gguf().tensors[s.tensor].ty;
        GgmlExpert { gate: ty(slices[0]), up: ty(slices[1]), down: ty(slices[2]) }
    }

    /// The three slices of an expert, each a plain run of rows of its
    /// expert tensor in HF shape; an error names the tensor otherwise, or
    /// says the checkpoint is not a GGUF file.
    fn gguf_expert_slices(&self, layer: usize, expert: usize) -> Result<[&Slice; 3]> {
        let cfg = &self.config;
        if !cfg.is_moe_layer(layer) || expert >= cfg.num_experts {
            return Err(Error::Arg(format!("no routed expert {expert} in layer {layer}")));
        }
        let Some(g) = self.gguf.as_ref().map(|g| &g.file) else {
            return Err(Error::Arg(format!(
                "{}: experts are kept as stored only from a GGUF file; choose --experts f32, q8, q4, rvq3, rvq2 or rvq4p",
                self.dir.display()
            )));
        };
        let (h, i) = (cfg.expert_hidden(), cfg.moe_intermediate_size);
        let names = cfg.expert_tensor_names(layer, expert);
        let mut out = Vec::with_capacity(3);
        for (name, want) in names.iter().zip([[i, h], [i, h], [h, i]]) {
            let Kind::Gguf(s) = &self.entry(name)?.kind else {
                return Err(Error::format(g.path(), format!("tensor `{name}` is not a GGUF slab")));
            };
            if s.row_map.is_some() || s.values != ValueMap::Stored || s.kv_b.is_some() || s.shape != want {
                let t = &g.tensors[s.tensor];
                return Err(Error::format(
                    g.path(),
                    format!("tensor `{}` does not hold `{name}` as {want:?} rows to copy", t.name),
                ));
            }
            out.push(s);
        }
        Ok([out[0], out[1], out[2]])
    }

    /// gpt-oss's `[gate [I], up [I], down [H]]` biases of one expert, which
    /// the view offers per expert (gguf/hf/gpt_oss.rs).
    pub(super) fn gguf_expert_biases(&self, layer: usize, expert: usize) -> Result<[Vec<f32>; 3]> {
        let p = format!("model.layers.{layer}.mlp.experts.{expert}");
        let (i, h) = (self.config.moe_intermediate_size, self.config.expert_hidden());
        let mut out: [Vec<f32>; 3] = Default::default();
        for ((proj, want), slot) in [("gate", i), ("up", i), ("down", h)].into_iter().zip(out.iter_mut()) {
            let name = format!("{p}.{proj}_proj.bias");
            let (b, shape) = self.tensor_f32(&name)?;
            if shape != [want] {
                return Err(self.shape_error(&name, &shape, &format!("[{want}]")));
            }
            *slot = b;
        }
        Ok(out)
    }
}
