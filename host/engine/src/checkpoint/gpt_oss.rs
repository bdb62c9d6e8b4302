//! gpt-oss's routed experts, as its checkpoints store them
//! (tests/fixtures/FAMILIES_MATH.md §4), turned into the nn.Linear layout
//! the rest of the engine uses (`gate`, `up` `[I, H]`, `down` `[H, I]`):
//!
//! * transformers' layout (what `save_pretrained` writes for a dequantised
//!   model): `experts.gate_up_proj` `[E, H, 2I]` input-major with gate and
//!   up **interleaved** along the output (`gate_up[..., ::2]` is gate),
//!   `experts.down_proj` `[E, I, H]`, biases `gate_up_proj_bias` `[E, 2I]`
//!   (interleaved likewise) and `down_proj_bias` `[E, H]`;
//! * the release's MXFP4 layout: `gate_up_proj_blocks` u8 `[E, 2I, H/32,
//!   16]` with `gate_up_proj_scales` u8 `[E, 2I, H/32]`, `down_proj_blocks`
//!   `[E, H, I/32, 16]` with `down_proj_scales`; a block row is one output
//!   feature (gate_up rows interleaved: even gate, odd up), decoded exactly
//!   as `integrations/mxfp4.py` `convert_moe_packed_tensors` does (the
//!   same E2M1 table and nibble order as the MXFP4 trunk tensors).

use safetensors::Dtype;

use super::{decode, HfCheckpoint, Kind, MXFP4_GROUP};
use crate::error::{Error, Result};

impl HfCheckpoint {
    fn gpt_oss_name(&self, layer: usize, what: &str) -> String {
        format!("model.layers.{layer}.mlp.experts.{what}")
    }

    /// Whether the experts are the release's MXFP4 blocks.
    fn gpt_oss_mxfp4(&self, layer: usize) -> bool {
        self.tensors.contains_key(&self.gpt_oss_name(layer, "gate_up_proj_blocks"))
    }

    /// `[gate, up, down]` of one expert in nn.Linear layout.
    pub(super) fn gpt_oss_expert(&self, layer: usize, expert: usize) -> Result<[Vec<f32>; 3]> {
        let cfg = &self.config;
        let (e, h, i) = (cfg.num_experts, cfg.expert_hidden(), cfg.moe_intermediate_size);
        if self.gpt_oss_mxfp4(layer) {
            let gate_up = self.mxfp4_expert(layer, "gate_up_proj", expert, [e, 2 * i, h])?; // [2I, H]
            let (mut gate, mut up) = (Vec::with_capacity(i * h), Vec::with_capacity(i * h));
            for (r, row) in gate_up.chunks_exact(h).enumerate() {
                if r % 2 == 0 { &mut gate } else { &mut up }.extend_from_slice(row);
            }
            let down = self.mxfp4_expert(layer, "down_proj", expert, [e, h, i])?; // [H, I]
            return Ok([gate, up, down]);
        }
        let gu_name = self.gpt_oss_name(layer, "gate_up_proj");
        let want = [e, h, 2 * i];
        let got = self.entry(&gu_name)?.shape.clone();
        if got != want {
            return Err(self.shape_error(&gu_name, &got, &format!("{want:?} (input-major, gate and up interleaved)")));
        }
        let gu = self.tensor_range_f32(&gu_name, expert * h * 2 * i, h * 2 * i)?; // [H, 2I]
        let (mut gate, mut up) = (vec![0.0; i * h], vec![0.0; i * h]);
        for (c, row) in gu.chunks_exact(2 * i).enumerate() {
            for j in 0..i {
                gate[j * h + c] = row[2 * j];
                up[j * h + c] = row[2 * j + 1];
            }
        }
        let d_name = self.gpt_oss_name(layer, "down_proj");
        let want = [e, i, h];
        let got = self.entry(&d_name)?.shape.clone();
        if got != want {
            return Err(self.shape_error(&d_name, &got, &format!("{want:?} (input-major)")));
        }
        let d = self.tensor_range_f32(&d_name, expert * i * h, i * h)?; // [I, H]
        let mut down = vec![0.0; h * i];
        for (c, row) in d.chunks_exact(h).enumerate() {
            for (r, v) in row.iter().enumerate() {
                down[r * i + c] = *v;
            }
        }
        Ok([gate, up, down])
    }

    /// `[gate [I], up [I], down [H]]` biases of one expert.
    pub(super) fn gpt_oss_biases(&self, layer: usize, expert: usize) -> Result<[Vec<f32>; 3]> {
        let cfg = &self.config;
        let (e, h, i) = (cfg.num_experts, cfg.expert_hidden(), cfg.moe_intermediate_size);
        let gu_name = self.gpt_oss_name(layer, "gate_up_proj_bias");
        let got = self.entry(&gu_name)?.shape.clone();
        if got != [e, 2 * i] {
            return Err(self.shape_error(&gu_name, &got, &format!("[{e}, {}]", 2 * i)));
        }
        let gu = self.tensor_range_f32(&gu_name, expert * 2 * i, 2 * i)?;
        let gate = gu.iter().step_by(2).copied().collect();
        let up = gu.iter().skip(1).step_by(2).copied().collect();
        let d_name = self.gpt_oss_name(layer, "down_proj_bias");
        let got = self.entry(&d_name)?.shape.clone();
        if got != [e, h] {
            return Err(self.shape_error(&d_name, &got, &format!("[{e}, {h}]")));
        }
        Ok([gate, up, self.tensor_range_f32(&d_name, expert * h, h)?])
    }

    /// One expert's `[rows, cols]` matrix from `<what>_blocks` `[E, rows,
    /// cols/32, 16]` and `<what>_scales` `[E, rows, cols/32]`.
    fn mxfp4_expert(&self, layer: usize, what: &str, expert: usize, [e, rows, cols]: [usize; 3]) -> Result<Vec<f32>> {
        let (b_name, s_name) =
            (self.gpt_oss_name(layer, &format!("{what}_blocks")), self.gpt_oss_name(layer, &format!("{what}_scales")));
        if !cols.is_multiple_of(MXFP4_GROUP) {
            return Err(Error::Unsupported(format!(
                "`{b_name}`: {cols} inputs are not a multiple of the MXFP4 group of {MXFP4_GROUP}"
            )));
        }
        let groups = cols / MXFP4_GROUP;
        let blocks =
            self.u8_range(&b_name, &[e, rows, groups, MXFP4_GROUP / 2], expert * rows * cols / 2, rows * cols / 2)?;
        let scales = self.u8_range(&s_name, &[e, rows, groups], expert * rows * groups, rows * groups)?;
        let mut out = Vec::with_capacity(rows * cols);
        decode::mxfp4_rows(&blocks, &scales, cols, &mut out)
            .map_err(|msg| Error::format(&self.dir, format!("MXFP4 tensor `{b_name}`, expert {expert}: {msg}")))?;
        Ok(out)
    }

    /// Bytes `[first, first + count)` of a u8 tensor whose shape must be
    /// `want`.
    fn u8_range(&self, name: &str, want: &[usize], first: usize, count: usize) -> Result<Vec<u8>> {
        let entry = self.entry(name)?;
        let Kind::Plain(raw) = &entry.kind else {
            return Err(Error::Unsupported(format!("tensor `{name}`: MXFP4 blocks are read from plain u8 tensors")));
        };
        if raw.dtype != Dtype::U8 || entry.shape != want {
            return Err(self.shape_error(name, &entry.shape, &format!("U8 {want:?} (found {:?})", raw.dtype)));
        }
        self.read(raw, first as u64, (first + count) as u64)
    }
}
