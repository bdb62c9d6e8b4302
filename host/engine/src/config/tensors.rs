//! Tensor names, shapes and parameter counts: what the converter, the
//! planner and `waste info` derive from a config.

use super::layout::{EdgeTensors, LayerTensors, Tensor};
use super::*;

impl ModelConfig {
    /// The shape a tensor is stored under: a checkpoint tensor whose expected
    /// shape is 1-D (a conv kernel `[C, 1, K]`, `A_log` `[1, 1, H, 1]`) is
    /// flattened to it when the element counts agree; anything else is kept.
    pub fn canonical_shape(&self, name: &str, stored: &[usize]) -> Vec<usize> {
        // A vector stored `[1, H]`, or a conv kernel / position grid read as
        // the matrix it is row-major (K3's vision tower).
        match self.trunk_tensor_shape(name) {
            Some(want)
                if want.len() < stored.len()
                    && want.len() <= 2
                    && stored.iter().product::<usize>() == want.iter().product::<usize>() =>
            {
                want
            }
            _ => stored.to_vec(),
        }
    }

    /// Checks that the layer kinds the config declares match the tensors a
    /// checkpoint holds (`names`, read from `file`), so a wrong
    /// `layer_types` / `linear_attn_config` / dense-layer count fails with the
    /// layer and the tensor rather than as a missing weight later.
    pub fn check_layer_tensors(&self, names: &std::collections::HashSet<&str>, file: &Path) -> Result<()> {
        if self.family == Family::DeepseekV3 {
            return deepseek::check_layer_tensors(self, names, file);
        }
        if let Some(v4) = &self.add.v4 {
            return deepseek_v4::check_layer_tensors(v4, names, file);
        }
        kimi::check_layer_tensors(self, names, file)
    }

    /// Names of one routed expert's gate, up, down tensors in the per-expert layout.
    pub fn expert_tensor_names(&self, layer: usize, expert: usize) -> [String; 3] {
        let p = format!("model.layers.{layer}.{}.experts.{expert}", self.moe_block);
        match self.family {
            Family::Mixtral | Family::KimiLinear | Family::MinimaxM2 => {
                [format!("{p}.w1.weight"), format!("{p}.w3.weight"), format!("{p}.w2.weight")]
            }
            _ => [format!("{p}.gate_proj.weight"), format!("{p}.up_proj.weight"), format!("{p}.down_proj.weight")],
        }
    }

    /// Names of the fused `[gate_up, down]` expert tensors of one layer.
    pub fn fused_expert_names(&self, layer: usize) -> [String; 2] {
        let p = format!("model.layers.{layer}.{}.experts", self.moe_block);
        [format!("{p}.gate_up_proj"), format!("{p}.down_proj")]
    }

    /// Every tensor gpt-oss's experts of `layer` may be stored in: the f32
    /// layout's and the MXFP4 release's (a checkpoint holds one set).
    pub fn gpt_oss_expert_names(&self, layer: usize) -> Vec<String> {
        let p = format!("model.layers.{layer}.mlp.experts");
        ["gate_up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias"]
            .iter()
            .chain(&["gate_up_proj_blocks", "gate_up_proj_scales", "down_proj_blocks", "down_proj_scales"])
            .map(|t| format!("{p}.{t}"))
            .collect()
    }

    pub fn tensor_role(&self, name: &str) -> TensorRole {
        if super::is_vision_tensor(name) {
            return match self.trunk_tensor_shape(name) {
                Some(s) if s.len() == 2 => TensorRole::Vision,
                _ => TensorRole::Vector,
            };
        }
        if name == "model.embed_tokens.weight" {
            TensorRole::Embedding
        } else if name == "lm_head.weight" {
            TensorRole::LmHead
        } else if name.ends_with(".bias")
            || name.ends_with("norm.weight")
            || name.ends_with(".sinks")
            || self.is_v4_f32_tensor(name)
        {
            TensorRole::Vector
        } else if name.ends_with(".mlp.gate.weight")
            || name.ends_with(".block_sparse_moe.gate.weight")
            || name.ends_with(".mlp.router.weight")
            || name.ends_with(".shared_expert_gate.weight")
            || name.ends_with(".indexer.weights_proj.weight")
            || name.ends_with(".indexer.scorer.weights_proj.weight")
        {
            // Routing and gating decisions (the DSA indexer's head weights
            // choose which positions are attended), and 1-row matrices:
            // kept f32, as transformers keeps `indexer.weights_proj`.
            TensorRole::Router
        } else {
            TensorRole::Matrix
        }
    }

    /// DeepSeek-V4 tensors kept f32 whatever their rank: the
    /// hyper-connection mixes and the compressors' position biases (in
    /// `_keep_in_fp32_modules_strict`), and the hash tables (expert ids).
    fn is_v4_f32_tensor(&self, name: &str) -> bool {
        self.add.v4.is_some()
            && (name.contains("_hc.")
                || name.starts_with("model.hc_head.")
                || name.ends_with(".position_bias")
                || name.ends_with(".tid2eid"))
    }

    /// Routed-expert weights of a decoder layer the forward pass runs, in
    /// any layout and either block name (an MTP layer's stored after the
    /// last are not: the converter skips them).
    pub fn is_expert_tensor(&self, name: &str) -> bool {
        let Some(rest) = name.strip_prefix("model.layers.") else {
            return false;
        };
        let Some((layer, rest)) = rest.split_once('.') else {
            return false;
        };
        if !layer.parse::<usize>().is_ok_and(|l| l < self.num_layers) {
            return false;
        }
        rest.strip_prefix("mlp.")
            .or_else(|| rest.strip_prefix("block_sparse_moe."))
            .is_some_and(|r| r.starts_with("experts."))
    }

    /// Every non-expert tensor the forward pass reads, in a stable order.
    pub fn trunk_tensor_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.trunk_tensors().into_iter().map(|t| t.name).collect();
        // K3's tower is stored with the trunk but read only for an image.
        if let Some(v) = self.k3.as_ref().and_then(|k| k.vision.as_ref()) {
            names.extend(v.tensor_shapes().into_iter().map(|(n, _)| n));
        }
        names
    }

    /// The text model's trunk tensors with their shapes, in the container's order.
    fn trunk_tensors(&self) -> Vec<Tensor> {
        let edges = EdgeTensors::of(self);
        let mut out = vec![edges.embed_tokens.clone()];
        for l in 0..self.num_layers {
            out.extend(LayerTensors::of(self, l).list().into_iter().cloned());
        }
        out.extend(edges.after_layers().into_iter().cloned());
        out
    }

    /// Expected shape of a trunk tensor, for load-time checks.
    pub fn trunk_tensor_shape(&self, name: &str) -> Option<Vec<usize>> {
        let edges = EdgeTensors::of(self);
        if let Some(t) = std::iter::once(&edges.embed_tokens).chain(edges.after_layers()).find(|t| t.name == name) {
            return Some(t.shape.clone());
        }
        if name == "lm_head.weight" {
            // Tied: a stored head is still the embedding's shape.
            return Some(edges.embed_tokens.shape);
        }
        if let Some(shape) = self.k3.as_ref().and_then(|k| k3::tensor_shape(self, k, name)) {
            return shape;
        }
        let rest = name.strip_prefix("model.layers.")?;
        let layer: usize = rest.split_once('.')?.0.parse().ok()?;
        if layer >= self.num_layers {
            return None;
        }
        LayerTensors::of(self, layer).list().into_iter().find(|t| t.name == name).map(|t| t.shape.clone())
    }

    fn params(&self, experts_per_layer: u64) -> u64 {
        if let Some(k) = &self.k3 {
            return k3::params(self, k, experts_per_layer);
        }
        let edges = EdgeTensors::of(self);
        let edge: u64 = std::iter::once(&edges.embed_tokens).chain(edges.after_layers()).map(Tensor::params).sum();
        let layers: u64 = (0..self.num_layers).map(|l| LayerTensors::of(self, l).params()).sum();
        // gpt-oss: a bias on each expert's gate, up and down.
        let h = self.hidden_size as u64;
        let expert_bias = if self.add.expert_bias { 2 * self.moe_intermediate_size as u64 + h } else { 0 };
        let per_expert = 3 * h * self.moe_intermediate_size as u64 + expert_bias;
        let moe_layers = (0..self.num_layers).filter(|&l| self.is_moe_layer(l)).count() as u64;
        edge + layers + moe_layers * experts_per_layer * per_expert
    }

    /// Parameters of the input embedding table and of a separate LM head
    /// (0 when tied): vendors' "active" counts differ in which they include.
    pub fn embedding_params(&self) -> (u64, u64) {
        let table = self.vocab_size as u64 * self.hidden_size as u64;
        (table, if self.tie_word_embeddings { 0 } else { table })
    }

    /// Parameters of the whole model.
    pub fn total_params(&self) -> u64 {
        self.params(self.num_experts as u64)
    }

    /// Parameters one token touches (top_k routed experts per MoE layer).
    pub fn active_params(&self) -> u64 {
        self.params(self.top_k as u64)
    }
}
