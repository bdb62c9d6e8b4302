//! Tensor names, shapes and parameter counts: what the converter, the
//! planner and `waste info` derive from a config.

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
        if let Some(k) = &self.k3 {
            return k3::trunk_tensor_names(self, k);
        }
        if let Some(v4) = &self.add.v4 {
            return deepseek_v4::trunk_tensor_names(self, v4);
        }
        let mut names = vec!["model.embed_tokens.weight".to_string()];
        for l in 0..self.num_layers {
            let p = format!("model.layers.{l}");
            names.push(format!("{p}.input_layernorm.weight"));
            match self.attn_kind(l) {
                AttnKind::Gqa => {
                    for proj in ["q_proj", "k_proj", "v_proj", "o_proj"] {
                        names.push(format!("{p}.self_attn.{proj}.weight"));
                        if self.has_attn_bias(proj) {
                            names.push(format!("{p}.self_attn.{proj}.bias"));
                        }
                    }
                    if self.qk_norm != QkNorm::None {
                        names.push(format!("{p}.self_attn.q_norm.weight"));
                        names.push(format!("{p}.self_attn.k_norm.weight"));
                    }
                    if self.add.attention_sinks {
                        names.push(format!("{p}.self_attn.sinks"));
                    }
                }
                AttnKind::Gdn => names.extend(self.gdn_names(&p)),
                _ if self.family == Family::DeepseekV3 => names.extend(deepseek::attention_names(self, l)),
                kind => names.extend(kimi::attention_names(self, kind, &p)),
            }
            names.push(format!("{p}.post_attention_layernorm.weight"));
            if self.is_moe_layer(l) {
                names.push(self.router_name(l));
                if self.router_has_bias() {
                    names.push(self.router_bias_name(l));
                }
                if self.shared_intermediate_size > 0 {
                    for proj in ["gate_proj", "up_proj", "down_proj"] {
                        names.push(format!("{}.{proj}.weight", self.shared_expert_prefix(l)));
                    }
                    if self.add.gated_shared_expert {
                        names.push(self.shared_expert_gate_name(l));
                    }
                }
            } else {
                for proj in ["gate_proj", "up_proj", "down_proj"] {
                    names.push(format!("{p}.mlp.{proj}.weight"));
                }
            }
        }
        names.push("model.norm.weight".to_string());
        if !self.tie_word_embeddings {
            names.push("lm_head.weight".to_string());
        }
        names
    }

    /// Expected shape of a trunk tensor, for load-time checks.
    pub fn trunk_tensor_shape(&self, name: &str) -> Option<Vec<usize>> {
        let (h, v) = (self.hidden_size, self.vocab_size);
        if name == "model.embed_tokens.weight" || name == "lm_head.weight" {
            return Some(vec![v, h]);
        }
        if name == "model.norm.weight" {
            return Some(vec![h]);
        }
        if let Some(shape) = self.k3.as_ref().and_then(|k| k3::tensor_shape(self, k, name)) {
            return shape;
        }
        if let Some(v4) = &self.add.v4 {
            return deepseek_v4::tensor_shape(self, v4, name);
        }
        let rest = name.strip_prefix("model.layers.")?;
        let (layer, rest) = rest.split_once('.')?;
        let layer: usize = layer.parse().ok()?;
        let kind = self.attn_kind(layer);
        if kind == AttnKind::Gdn {
            if let Some(rest) = rest.strip_prefix("linear_attn.") {
                return self.gdn_shape(rest);
            }
        }
        if kind != AttnKind::Gqa && kind != AttnKind::Gdn {
            if let Some(attn) = rest.strip_prefix("self_attn.") {
                if self.family == Family::DeepseekV3 {
                    return deepseek::attention_shape(self, attn);
                }
                return kimi::attention_shape(self, kind, attn);
            }
        }
        if let Some(moe) = rest
            .strip_prefix(self.moe_block.as_str())
            .and_then(|r| r.strip_prefix('.'))
            .filter(|_| self.is_moe_layer(layer))
        {
            let s = self.shared_intermediate_size;
            let shared = if self.add.gated_shared_expert { "shared_expert." } else { "shared_experts." };
            if let Some(proj) = moe.strip_prefix(shared).filter(|_| s > 0) {
                match proj {
                    "gate_proj.weight" | "up_proj.weight" => return Some(vec![s, h]),
                    "down_proj.weight" => return Some(vec![h, s]),
                    _ => {}
                }
            }
            match moe {
                "gate.e_score_correction_bias" | "e_score_correction_bias" | "router.bias" => {
                    return Some(vec![self.num_experts])
                }
                "shared_expert_gate.weight" if self.add.gated_shared_expert => return Some(vec![1, h]),
                _ => {}
            }
        }
        let (q, kv) = (self.q_dim(), self.kv_dim());
        // Qwen3-Next's q_proj also yields the output gate of every head.
        let q_rows = if self.add.attn_output_gate { 2 * q } else { q };
        let shape = match rest {
            "input_layernorm.weight" | "post_attention_layernorm.weight" => vec![h],
            "self_attn.q_proj.weight" => vec![q_rows, h],
            "self_attn.sinks" if self.add.attention_sinks => vec![self.num_heads],
            "self_attn.k_proj.weight" | "self_attn.v_proj.weight" => vec![kv, h],
            "self_attn.o_proj.weight" => vec![h, q],
            "self_attn.q_proj.bias" => vec![q],
            "self_attn.k_proj.bias" | "self_attn.v_proj.bias" => vec![kv],
            "self_attn.o_proj.bias" => vec![h],
            "self_attn.q_norm.weight" => match self.qk_norm {
                QkNorm::Full => vec![q],
                _ => vec![self.head_dim],
            },
            "self_attn.k_norm.weight" => match self.qk_norm {
                QkNorm::Full => vec![kv],
                _ => vec![self.head_dim],
            },
            "mlp.gate_proj.weight" | "mlp.up_proj.weight" => vec![self.intermediate_size, h],
            "mlp.down_proj.weight" => vec![h, self.intermediate_size],
            _ if name == self.router_name(layer) => vec![self.num_experts, h],
            _ => return None,
        };
        Some(shape)
    }

    /// Whether the attention projection `proj` (`q_proj`, ..., `o_proj`)
    /// has a bias.
    pub fn has_attn_bias(&self, proj: &str) -> bool {
        self.attention_bias || (self.add.qkv_bias && proj != "o_proj")
    }

    fn attention_params(&self, layer: usize) -> u64 {
        if self.family == Family::DeepseekV3 {
            return deepseek::attention_params(self, layer) + 2 * self.hidden_size as u64;
        }
        if self.attn_kind(layer) == AttnKind::Gdn {
            return self.gdn_params() + 2 * self.hidden_size as u64;
        }
        if self.attn_kind(layer) != AttnKind::Gqa {
            return kimi::attention_params(self, self.attn_kind(layer)) + 2 * self.hidden_size as u64;
        }
        let (h, q, kv) = (self.hidden_size as u64, self.q_dim() as u64, self.kv_dim() as u64);
        let q_rows = if self.add.attn_output_gate { 2 * q } else { q };
        let mut n = h * q_rows + h * q + 2 * h * kv;
        if self.has_attn_bias("q_proj") {
            n += q + 2 * kv;
        }
        if self.has_attn_bias("o_proj") {
            n += h;
        }
        if self.add.attention_sinks {
            n += self.num_heads as u64;
        }
        n += match self.qk_norm {
            QkNorm::None => 0,
            QkNorm::PerHead => 2 * self.head_dim as u64,
            QkNorm::Full => q + kv,
        };
        n + 2 * h
    }

    fn params(&self, experts_per_layer: u64) -> u64 {
        if let Some(k) = &self.k3 {
            return k3::params(self, k, experts_per_layer);
        }
        if let Some(v4) = &self.add.v4 {
            return deepseek_v4::params(self, v4, experts_per_layer);
        }
        let (h, v) = (self.hidden_size as u64, self.vocab_size as u64);
        let mut n = v * h + h;
        if !self.tie_word_embeddings {
            n += v * h;
        }
        for l in 0..self.num_layers {
            n += self.attention_params(l);
            n += if self.is_moe_layer(l) {
                let bias = if self.router_has_bias() { self.num_experts as u64 } else { 0 };
                let shared_gate = if self.add.gated_shared_expert && self.shared_intermediate_size > 0 { h } else { 0 };
                // gpt-oss: a bias on each expert's gate, up and down.
                let expert_bias = if self.add.expert_bias { 2 * self.moe_intermediate_size as u64 + h } else { 0 };
                self.num_experts as u64 * h
                    + bias
                    + 3 * h * self.shared_intermediate_size as u64
                    + shared_gate
                    + experts_per_layer * (3 * h * self.moe_intermediate_size as u64 + expert_bias)
            } else {
                3 * h * self.intermediate_size as u64
            };
        }
        n
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

/// The Gated DeltaNet tensors (`linear_attn.*`).
impl ModelConfig {
    /// Names of one GDN layer's tensors; `p` is `model.layers.L`.
    pub fn gdn_names(&self, p: &str) -> Vec<String> {
        let projections: &[&str] = if self.add.gdn_fused {
            &["in_proj_qkvz.weight", "in_proj_ba.weight"]
        } else {
            &["in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight"]
        };
        projections
            .iter()
            .chain(&["conv1d.weight", "A_log", "dt_bias", "norm.weight", "out_proj.weight"])
            .map(|t| format!("{p}.linear_attn.{t}"))
            .collect()
    }

    /// Shape of a GDN tensor by its name after `linear_attn.`; the conv
    /// kernel `[C, 1, K]` is given 1-D (its canonical, stored shape).
    fn gdn_shape(&self, rest: &str) -> Option<Vec<usize>> {
        let g = self.add.gdn?;
        let h = self.hidden_size;
        let (k, v, nv) = (g.key_dim(), g.value_dim(), g.value_heads);
        Some(match rest {
            "in_proj_qkvz.weight" if self.add.gdn_fused => vec![2 * k + 2 * v, h],
            "in_proj_ba.weight" if self.add.gdn_fused => vec![2 * nv, h],
            "in_proj_qkv.weight" if !self.add.gdn_fused => vec![2 * k + v, h],
            "in_proj_z.weight" if !self.add.gdn_fused => vec![v, h],
            "in_proj_b.weight" | "in_proj_a.weight" if !self.add.gdn_fused => vec![nv, h],
            "conv1d.weight" => vec![g.conv_dim() * g.conv_kernel],
            "A_log" | "dt_bias" => vec![nv],
            "norm.weight" => vec![g.value_head_dim],
            "out_proj.weight" => vec![h, v],
            _ => return None,
        })
    }

    fn gdn_params(&self) -> u64 {
        let Some(g) = self.add.gdn else { return 0 };
        let (h, k, v, nv) = (self.hidden_size as u64, g.key_dim() as u64, g.value_dim() as u64, g.value_heads as u64);
        // The projections (fused or not: the same rows), the conv, A_log,
        // dt_bias, the gated norm, out_proj.
        h * (2 * k + 2 * v + 2 * nv)
            + g.conv_dim() as u64 * g.conv_kernel as u64
            + 2 * nv
            + g.value_head_dim as u64
            + v * h
    }
}
