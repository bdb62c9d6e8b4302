//! Tensor names, shapes and parameter counts: what the converter, the
//! planner and `waste info` derive from a config.

use super::*;

impl ModelConfig {
    /// The shape a tensor is stored under: a checkpoint tensor whose expected
    /// shape is 1-D (a conv kernel `[C, 1, K]`, `A_log` `[1, 1, H, 1]`) is
    /// flattened to it when the element counts agree; anything else is kept.
    pub fn canonical_shape(&self, name: &str, stored: &[usize]) -> Vec<usize> {
        match self.trunk_tensor_shape(name) {
            Some(want) if want.len() == 1 && stored.len() > 1 && stored.iter().product::<usize>() == want[0] => want,
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
        kimi::check_layer_tensors(self, names, file)
    }

    /// Names of one routed expert's gate, up, down tensors in the per-expert layout.
    pub fn expert_tensor_names(&self, layer: usize, expert: usize) -> [String; 3] {
        let p = format!("model.layers.{layer}.{}.experts.{expert}", self.moe_block);
        match self.family {
            Family::Mixtral | Family::KimiLinear => {
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

    pub fn tensor_role(&self, name: &str) -> TensorRole {
        if name == "model.embed_tokens.weight" {
            TensorRole::Embedding
        } else if name == "lm_head.weight" {
            TensorRole::LmHead
        } else if name.ends_with(".bias") || name.ends_with("norm.weight") {
            TensorRole::Vector
        } else if name.ends_with(".mlp.gate.weight") || name.ends_with(".block_sparse_moe.gate.weight") {
            TensorRole::Router
        } else {
            TensorRole::Matrix
        }
    }

    /// Routed-expert weights in either layout and either block name.
    pub fn is_expert_tensor(&self, name: &str) -> bool {
        let Some(rest) = name.strip_prefix("model.layers.") else {
            return false;
        };
        let Some((layer, rest)) = rest.split_once('.') else {
            return false;
        };
        if layer.parse::<usize>().is_err() {
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
        let mut names = vec!["model.embed_tokens.weight".to_string()];
        for l in 0..self.num_layers {
            let p = format!("model.layers.{l}");
            names.push(format!("{p}.input_layernorm.weight"));
            match self.attn_kind(l) {
                AttnKind::Gqa => {
                    for proj in ["q_proj", "k_proj", "v_proj", "o_proj"] {
                        names.push(format!("{p}.self_attn.{proj}.weight"));
                        if self.attention_bias {
                            names.push(format!("{p}.self_attn.{proj}.bias"));
                        }
                    }
                    if self.qk_norm != QkNorm::None {
                        names.push(format!("{p}.self_attn.q_norm.weight"));
                        names.push(format!("{p}.self_attn.k_norm.weight"));
                    }
                }
                _ if self.family == Family::DeepseekV3 => names.extend(deepseek::attention_names(self, &p)),
                kind => names.extend(kimi::attention_names(self, kind, &p)),
            }
            names.push(format!("{p}.post_attention_layernorm.weight"));
            if self.is_moe_layer(l) {
                names.push(self.router_name(l));
                if let RouterKind::SigmoidBias { .. } = self.router {
                    names.push(self.router_bias_name(l));
                }
                if self.shared_intermediate_size > 0 {
                    for proj in ["gate_proj", "up_proj", "down_proj"] {
                        names.push(format!("{}.{proj}.weight", self.shared_expert_prefix(l)));
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
        let rest = name.strip_prefix("model.layers.")?;
        let (layer, rest) = rest.split_once('.')?;
        let layer: usize = layer.parse().ok()?;
        let kind = self.attn_kind(layer);
        if kind != AttnKind::Gqa {
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
            match moe {
                "gate.e_score_correction_bias" => return Some(vec![self.num_experts]),
                "shared_experts.gate_proj.weight" | "shared_experts.up_proj.weight" if s > 0 => {
                    return Some(vec![s, h])
                }
                "shared_experts.down_proj.weight" if s > 0 => return Some(vec![h, s]),
                _ => {}
            }
        }
        let (q, kv) = (self.q_dim(), self.kv_dim());
        let shape = match rest {
            "input_layernorm.weight" | "post_attention_layernorm.weight" => vec![h],
            "self_attn.q_proj.weight" => vec![q, h],
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

    fn attention_params(&self, layer: usize) -> u64 {
        if self.family == Family::DeepseekV3 {
            return deepseek::attention_params(self) + 2 * self.hidden_size as u64;
        }
        if self.attn_kind(layer) != AttnKind::Gqa {
            return kimi::attention_params(self, self.attn_kind(layer)) + 2 * self.hidden_size as u64;
        }
        let (h, q, kv) = (self.hidden_size as u64, self.q_dim() as u64, self.kv_dim() as u64);
        let mut n = 2 * h * q + 2 * h * kv;
        if self.attention_bias {
            n += q + 2 * kv + h;
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
        let (h, v) = (self.hidden_size as u64, self.vocab_size as u64);
        let mut n = v * h + h;
        if !self.tie_word_embeddings {
            n += v * h;
        }
        for l in 0..self.num_layers {
            n += self.attention_params(l);
            n += if self.is_moe_layer(l) {
                let bias = match self.router {
                    RouterKind::SigmoidBias { .. } => self.num_experts as u64,
                    RouterKind::Softmax => 0,
                };
                self.num_experts as u64 * h
                    + bias
                    + 3 * h * self.shared_intermediate_size as u64
                    + experts_per_layer * 3 * h * self.moe_intermediate_size as u64
            } else {
                3 * h * self.intermediate_size as u64
            };
        }
        n
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
