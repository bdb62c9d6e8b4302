//! The trunk's tensors, mechanism by mechanism. Each struct names one
//! mechanism's tensors after their checkpoint names (transformers' layout)
//! and gives each the shape the config implies; a tensor a config does not
//! have is `None`. The shape table (`trunk_tensor_names`,
//! `trunk_tensor_shape` and the parameter counts, in tensors.rs) and the
//! loaders in `transformer/` both read these, so a name, a shape and
//! whether a tensor exists are written once.
//!
//! The mixers are in attention.rs, DeepSeek-V4's own pieces in v4.rs; K3's
//! vision tower is `VisionConfig::tensors`.

mod attention;
mod v4;

pub use attention::*;
pub use v4::*;

use super::{AttnKind, Family, ModelConfig};

/// One trunk tensor: its name and the shape the config implies (vectors
/// 1-D, a conv kernel `[C, 1, K]` flattened to `[C * K]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tensor {
    pub name: String,
    pub shape: Vec<usize>,
}

impl Tensor {
    fn at(prefix: &str, local: &str, shape: Vec<usize>) -> Tensor {
        Tensor { name: format!("{prefix}.{local}"), shape }
    }

    pub fn params(&self) -> u64 {
        self.shape.iter().product::<usize>() as u64
    }
}

/// K3's latent around the routed experts (`routed_expert_hidden_size`).
#[derive(Debug, Clone)]
pub struct LatentTensors {
    pub routed_expert_down_proj: Tensor,    // [latent, H]
    pub routed_expert_norm: Option<Tensor>, // [latent]
    pub routed_expert_up_proj: Tensor,      // [H, latent]
}

/// A SwiGLU MLP: a dense layer's `mlp`, or a MoE block's shared experts.
#[derive(Debug, Clone)]
pub struct MlpTensors {
    pub gate_proj: Tensor, // [I, H]
    pub up_proj: Tensor,   // [I, H]
    pub down_proj: Tensor, // [H, I]
}

impl MlpTensors {
    fn at(p: &str, width: usize, hidden: usize) -> MlpTensors {
        MlpTensors {
            gate_proj: Tensor::at(p, "gate_proj.weight", vec![width, hidden]),
            up_proj: Tensor::at(p, "up_proj.weight", vec![width, hidden]),
            down_proj: Tensor::at(p, "down_proj.weight", vec![hidden, width]),
        }
    }

    /// `model.layers.L.mlp` of a dense layer.
    pub fn dense(cfg: &ModelConfig, layer: usize) -> MlpTensors {
        MlpTensors::at(&format!("model.layers.{layer}.mlp"), cfg.intermediate_size, cfg.hidden_size)
    }

    fn list<'a>(&'a self, out: &mut Vec<&'a Tensor>) {
        out.extend([&self.gate_proj, &self.up_proj, &self.down_proj]);
    }
}

/// The trunk half of a MoE block (`mlp`, or Mixtral's and MiniMax's
/// `block_sparse_moe`): the router and the shared experts; the routed
/// experts are the store's.
#[derive(Debug, Clone)]
pub struct MoeTensors {
    /// `gate.weight`, gpt-oss's `router.weight`: `[E, H]`.
    pub router: Tensor,
    /// `[E]`: a sigmoid router's selection bias (`gate.e_score_correction_bias`,
    /// on the block for MiniMax), or gpt-oss's `router.bias`.
    pub router_bias: Option<Tensor>,
    /// `shared_experts` (`shared_expert` when gated): `[S, H]`, `[S, H]`, `[H, S]`.
    pub shared_experts: Option<MlpTensors>,
    /// Qwen2-MoE's and Qwen3-Next's `shared_expert_gate.weight`, `[1, H]`.
    pub shared_expert_gate: Option<Tensor>,
    /// K3: the latent the routed experts run in.
    pub latent: Option<LatentTensors>,
    /// DeepSeek-V4's hash layers: `gate.tid2eid` `[V, top_k]` (read flat),
    /// the experts of each token id; such a layer has no router bias.
    pub tid2eid: Option<Tensor>,
}

impl MoeTensors {
    pub fn of(cfg: &ModelConfig, layer: usize) -> MoeTensors {
        let b = format!("model.layers.{layer}.{}", cfg.moe_block);
        let (h, s) = (cfg.hidden_size, cfg.shared_intermediate_size);
        let (router, bias) = router(cfg, layer);
        let hashed = cfg.add.v4.as_ref().is_some_and(|v| v.hash_layers[layer]);
        let shared = if cfg.add.gated_shared_expert { "shared_expert" } else { "shared_experts" };
        MoeTensors {
            router,
            router_bias: (cfg.router_has_bias() && !hashed).then_some(bias),
            tid2eid: hashed.then(|| Tensor::at(&b, "gate.tid2eid", vec![cfg.vocab_size * cfg.top_k])),
            shared_experts: (s > 0).then(|| MlpTensors::at(&format!("{b}.{shared}"), s, h)),
            shared_expert_gate: (s > 0 && cfg.add.gated_shared_expert)
                .then(|| Tensor::at(&b, "shared_expert_gate.weight", vec![1, h])),
            latent: cfg.k3.as_ref().and_then(|k| Some((k.latent?, k.latent_norm))).map(|(l, norm)| LatentTensors {
                routed_expert_down_proj: Tensor::at(&b, "routed_expert_down_proj.weight", vec![l, h]),
                routed_expert_norm: norm.then(|| Tensor::at(&b, "routed_expert_norm.weight", vec![l])),
                routed_expert_up_proj: Tensor::at(&b, "routed_expert_up_proj.weight", vec![h, l]),
            }),
        }
    }

    /// The router, its bias, the shared experts and their gate, in the
    /// container's order.
    pub fn list(&self) -> Vec<&Tensor> {
        let mut out = Vec::new();
        self.list_into(&mut out);
        out
    }

    fn list_into<'a>(&'a self, out: &mut Vec<&'a Tensor>) {
        out.extend([&self.router]);
        out.extend(self.router_bias.iter().chain(&self.tid2eid));
        if let Some(m) = &self.shared_experts {
            m.list(out);
        }
        out.extend(&self.shared_expert_gate);
        if let Some(l) = &self.latent {
            out.push(&l.routed_expert_down_proj);
            out.extend(&l.routed_expert_norm);
            out.push(&l.routed_expert_up_proj);
        }
    }
}

/// The router of MoE layer `layer` and its bias, whether or not the config
/// has one: `[E, H]` and `[E]`.
pub(super) fn router(cfg: &ModelConfig, layer: usize) -> (Tensor, Tensor) {
    let b = format!("model.layers.{layer}.{}", cfg.moe_block);
    let (h, e) = (cfg.hidden_size, cfg.num_experts);
    match cfg.family {
        Family::GptOss => {
            let p = format!("model.layers.{layer}.mlp.router");
            (Tensor::at(&p, "weight", vec![e, h]), Tensor::at(&p, "bias", vec![e]))
        }
        _ if cfg.add.router_bias_on_block => {
            (Tensor::at(&b, "gate.weight", vec![e, h]), Tensor::at(&b, "e_score_correction_bias", vec![e]))
        }
        _ => (Tensor::at(&b, "gate.weight", vec![e, h]), Tensor::at(&b, "gate.e_score_correction_bias", vec![e])),
    }
}

/// The mixer of a decoder layer.
#[derive(Debug, Clone)]
pub enum MixerTensors {
    Gqa(GqaTensors),
    Gdn(GdnTensors),
    Mla(MlaTensors),
    Kda(KdaTensors),
    V4(V4AttnTensors),
    /// A mixer whose shape the config lacks (the loader names the layer).
    Missing,
}

/// The feed-forward half of a decoder layer.
#[derive(Debug, Clone)]
// Built once per layer at load, never on a path where the size matters.
#[allow(clippy::large_enum_variant)]
pub enum FfnTensors {
    Dense(MlpTensors),
    Moe(MoeTensors),
}

/// `model.layers.L`.
#[derive(Debug, Clone)]
pub struct LayerTensors {
    pub input_layernorm: Tensor, // [H]
    /// DeepSeek-V4's hyper-connections around the attention and the MLP.
    pub hyper: Option<(HcTensors, HcTensors)>,
    /// K3's attention residuals (`attn_res_block`).
    pub attn_res: Option<AttnResTensors>,
    pub mixer: MixerTensors,
    pub post_attention_layernorm: Tensor, // [H]
    pub ffn: FfnTensors,
}

impl LayerTensors {
    pub fn of(cfg: &ModelConfig, layer: usize) -> LayerTensors {
        let p = format!("model.layers.{layer}");
        let h = cfg.hidden_size;
        let mixer = match cfg.attn_kind(layer) {
            AttnKind::Gqa => Some(MixerTensors::Gqa(GqaTensors::of(cfg, layer))),
            AttnKind::Gdn => GdnTensors::of(cfg, layer).map(MixerTensors::Gdn),
            AttnKind::Mla => MlaTensors::of(cfg, layer).map(MixerTensors::Mla),
            AttnKind::Kda => KdaTensors::of(cfg, layer).map(MixerTensors::Kda),
            AttnKind::V4 => cfg.add.v4.as_ref().map(|v| MixerTensors::V4(V4AttnTensors::of(cfg, v, layer))),
        }
        .unwrap_or(MixerTensors::Missing);
        LayerTensors {
            input_layernorm: Tensor::at(&p, "input_layernorm.weight", vec![h]),
            hyper: cfg.add.v4.as_ref().map(|v| {
                (HcTensors::block(cfg, v, &format!("{p}.attn_hc")), HcTensors::block(cfg, v, &format!("{p}.ffn_hc")))
            }),
            attn_res: cfg.k3.as_ref().and_then(|k| k.attn_res_block).map(|_| AttnResTensors::at(&p, h)),
            mixer,
            post_attention_layernorm: Tensor::at(&p, "post_attention_layernorm.weight", vec![h]),
            ffn: if cfg.is_moe_layer(layer) {
                FfnTensors::Moe(MoeTensors::of(cfg, layer))
            } else {
                FfnTensors::Dense(MlpTensors::dense(cfg, layer))
            },
        }
    }

    /// The layer's parameters: its tensors but the hash table, which holds
    /// expert ids, not weights.
    pub fn params(&self) -> u64 {
        let hash = match &self.ffn {
            FfnTensors::Moe(m) => m.tid2eid.as_ref().map_or(0, Tensor::params),
            FfnTensors::Dense(_) => 0,
        };
        self.list().into_iter().map(Tensor::params).sum::<u64>() - hash
    }

    /// Every tensor of the layer, in the container's order.
    pub fn list(&self) -> Vec<&Tensor> {
        let mut out = vec![&self.input_layernorm];
        if let Some((attn_hc, ffn_hc)) = &self.hyper {
            out.extend(attn_hc.list().into_iter().chain(ffn_hc.list()));
        }
        if let Some(r) = &self.attn_res {
            out.extend([&r.self_attention_res_proj, &r.self_attention_res_norm, &r.mlp_res_proj, &r.mlp_res_norm]);
        }
        match &self.mixer {
            MixerTensors::Gqa(g) => g.list(&mut out),
            MixerTensors::Gdn(g) => g.list(&mut out),
            MixerTensors::Mla(m) => m.list(&mut out),
            MixerTensors::Kda(k) => k.list(&mut out),
            MixerTensors::V4(v) => v.list(&mut out),
            MixerTensors::Missing => {}
        }
        out.push(&self.post_attention_layernorm);
        match &self.ffn {
            FfnTensors::Dense(m) => m.list(&mut out),
            FfnTensors::Moe(m) => m.list_into(&mut out),
        }
        out
    }
}

/// The tensors outside the decoder layers.
pub struct EdgeTensors {
    pub embed_tokens: Tensor, // [V, H]
    /// K3's attention residual before the final norm: `output_attn_res_proj`
    /// (`[1, H]` read as `[H]`) and `output_attn_res_norm` `[H]`.
    pub output_attn_res: Option<(Tensor, Tensor)>,
    /// DeepSeek-V4's collapse of the streams.
    pub hc_head: Option<HcTensors>,
    pub norm: Tensor, // [H]
    /// None with tied embeddings.
    pub lm_head: Option<Tensor>, // [V, H]
}

impl EdgeTensors {
    /// The tensors after the last layer, in the container's order.
    pub fn after_layers(&self) -> Vec<&Tensor> {
        let mut out = Vec::new();
        if let Some((proj, norm)) = &self.output_attn_res {
            out.extend([proj, norm]);
        }
        if let Some(hc) = &self.hc_head {
            out.extend(hc.list());
        }
        out.push(&self.norm);
        out.extend(&self.lm_head);
        out
    }

    pub fn of(cfg: &ModelConfig) -> EdgeTensors {
        let (h, v) = (cfg.hidden_size, cfg.vocab_size);
        EdgeTensors {
            embed_tokens: Tensor::at("model", "embed_tokens.weight", vec![v, h]),
            hc_head: cfg.add.v4.as_ref().map(|v| HcTensors::head(cfg, v)),
            output_attn_res: cfg.k3.as_ref().and_then(|k| k.attn_res_block).map(|_| {
                (
                    Tensor::at("model", "output_attn_res_proj.weight", vec![h]),
                    Tensor::at("model", "output_attn_res_norm.weight", vec![h]),
                )
            }),
            norm: Tensor::at("model", "norm.weight", vec![h]),
            lm_head: (!cfg.tie_word_embeddings).then(|| Tensor { name: "lm_head.weight".into(), shape: vec![v, h] }),
        }
    }
}
