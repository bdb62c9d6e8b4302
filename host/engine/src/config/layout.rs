//! The trunk's tensors, mechanism by mechanism. Each struct names one
//! mechanism's tensors after their checkpoint names (transformers' layout)
//! and gives each the shape the config implies; a tensor a config does not
//! have is `None`. The shape table (`trunk_tensor_names`,
//! `trunk_tensor_shape` and the parameter counts, in tensors.rs) and the
//! loaders in `transformer/` both read these, so a name, a shape and
//! whether a tensor exists are written once.
//!
//! Kimi K3 (k3.rs) and DeepSeek-V4 (deepseek_v4.rs), whose layers are
//! their family's alone, keep their tables in their own files.

use super::{AttnKind, Family, ModelConfig, QkNorm};

pub use super::Tensor;

impl Tensor {
    fn at(prefix: &str, local: &str, shape: Vec<usize>) -> Tensor {
        Tensor { name: format!("{prefix}.{local}"), shape }
    }
}

/// Appends `t` and the present ones of `opt`, in order.
fn push<'a>(out: &mut Vec<&'a Tensor>, t: impl IntoIterator<Item = &'a Tensor>) {
    out.extend(t);
}

/// `model.layers.L.self_attn` of a grouped-query attention layer.
#[derive(Debug, Clone)]
pub struct GqaTensors {
    /// `[heads * head_dim, H]`; Qwen3-Next's also yields each head's output
    /// gate: `[2 * heads * head_dim, H]`.
    pub q_proj: Tensor,
    pub q_proj_bias: Option<Tensor>, // [heads * head_dim]
    pub k_proj: Tensor,              // [kv_heads * head_dim, H]
    pub k_proj_bias: Option<Tensor>, // [kv_heads * head_dim]
    pub v_proj: Tensor,              // [kv_heads * head_dim, H]
    pub v_proj_bias: Option<Tensor>, // [kv_heads * head_dim]
    pub o_proj: Tensor,              // [H, heads * head_dim]
    pub o_proj_bias: Option<Tensor>, // [H]
    /// `[head_dim]` per head (Qwen3), or over the whole projection (OLMoE).
    pub q_norm: Option<Tensor>,
    pub k_norm: Option<Tensor>,
    /// gpt-oss's learned sink logit per head, `[heads]`.
    pub sinks: Option<Tensor>,
}

impl GqaTensors {
    pub fn of(cfg: &ModelConfig, layer: usize) -> GqaTensors {
        let p = format!("model.layers.{layer}.self_attn");
        let (h, q, kv) = (cfg.hidden_size, cfg.q_dim(), cfg.kv_dim());
        let q_rows = if cfg.add.attn_output_gate { 2 * q } else { q };
        // `qkv_bias`: q/k/v only (Qwen2-MoE, GLM); `attention_bias`: all four.
        let bias = |proj: &str, width: usize| {
            (cfg.attention_bias || (cfg.add.qkv_bias && proj != "o_proj"))
                .then(|| Tensor::at(&p, &format!("{proj}.bias"), vec![width]))
        };
        let norm = |which: &str, full: usize| match cfg.qk_norm {
            QkNorm::None => None,
            QkNorm::PerHead => Some(Tensor::at(&p, &format!("{which}.weight"), vec![cfg.head_dim])),
            QkNorm::Full => Some(Tensor::at(&p, &format!("{which}.weight"), vec![full])),
        };
        GqaTensors {
            q_proj: Tensor::at(&p, "q_proj.weight", vec![q_rows, h]),
            q_proj_bias: bias("q_proj", q),
            k_proj: Tensor::at(&p, "k_proj.weight", vec![kv, h]),
            k_proj_bias: bias("k_proj", kv),
            v_proj: Tensor::at(&p, "v_proj.weight", vec![kv, h]),
            v_proj_bias: bias("v_proj", kv),
            o_proj: Tensor::at(&p, "o_proj.weight", vec![h, q]),
            o_proj_bias: bias("o_proj", h),
            q_norm: norm("q_norm", q),
            k_norm: norm("k_norm", kv),
            sinks: cfg.add.attention_sinks.then(|| Tensor::at(&p, "sinks", vec![cfg.num_heads])),
        }
    }

    fn list<'a>(&'a self, out: &mut Vec<&'a Tensor>) {
        push(out, [&self.q_proj]);
        push(out, &self.q_proj_bias);
        push(out, [&self.k_proj]);
        push(out, &self.k_proj_bias);
        push(out, [&self.v_proj]);
        push(out, &self.v_proj_bias);
        push(out, [&self.o_proj]);
        push(out, &self.o_proj_bias);
        push(out, self.q_norm.iter().chain(&self.k_norm));
        push(out, &self.sinks);
    }
}

/// The input projections of a Gated DeltaNet layer: the release's fused
/// pair, or transformers' four.
#[derive(Debug, Clone)]
pub enum GdnProjections {
    Fused {
        in_proj_qkvz: Tensor, // [2 * key_dim + 2 * value_dim, H]
        in_proj_ba: Tensor,   // [2 * value_heads, H]
    },
    Separate {
        in_proj_qkv: Tensor, // [2 * key_dim + value_dim, H]
        in_proj_z: Tensor,   // [value_dim, H]
        in_proj_b: Tensor,   // [value_heads, H]
        in_proj_a: Tensor,   // [value_heads, H]
    },
}

/// `model.layers.L.linear_attn` of a Gated DeltaNet layer.
#[derive(Debug, Clone)]
pub struct GdnTensors {
    pub projections: GdnProjections,
    pub conv1d: Tensor,   // [conv_dim * kernel] (stored [conv_dim, 1, kernel])
    pub a_log: Tensor,    // `A_log` [value_heads]
    pub dt_bias: Tensor,  // [value_heads]
    pub norm: Tensor,     // [value_head_dim]
    pub out_proj: Tensor, // [H, value_dim]
}

impl GdnTensors {
    /// None when the config has no GDN shape.
    pub fn of(cfg: &ModelConfig, layer: usize) -> Option<GdnTensors> {
        let g = cfg.add.gdn?;
        let p = format!("model.layers.{layer}.linear_attn");
        let h = cfg.hidden_size;
        let (k, v, nv) = (g.key_dim(), g.value_dim(), g.value_heads);
        let t = |local: &str, shape: Vec<usize>| Tensor::at(&p, local, shape);
        let projections = if cfg.add.gdn_fused {
            GdnProjections::Fused {
                in_proj_qkvz: t("in_proj_qkvz.weight", vec![2 * k + 2 * v, h]),
                in_proj_ba: t("in_proj_ba.weight", vec![2 * nv, h]),
            }
        } else {
            GdnProjections::Separate {
                in_proj_qkv: t("in_proj_qkv.weight", vec![2 * k + v, h]),
                in_proj_z: t("in_proj_z.weight", vec![v, h]),
                in_proj_b: t("in_proj_b.weight", vec![nv, h]),
                in_proj_a: t("in_proj_a.weight", vec![nv, h]),
            }
        };
        Some(GdnTensors {
            projections,
            conv1d: t("conv1d.weight", vec![g.conv_dim() * g.conv_kernel]),
            a_log: t("A_log", vec![nv]),
            dt_bias: t("dt_bias", vec![nv]),
            norm: t("norm.weight", vec![g.value_head_dim]),
            out_proj: t("out_proj.weight", vec![h, v]),
        })
    }

    fn list<'a>(&'a self, out: &mut Vec<&'a Tensor>) {
        match &self.projections {
            GdnProjections::Fused { in_proj_qkvz, in_proj_ba } => push(out, [in_proj_qkvz, in_proj_ba]),
            GdnProjections::Separate { in_proj_qkv, in_proj_z, in_proj_b, in_proj_a } => {
                push(out, [in_proj_qkv, in_proj_z, in_proj_b, in_proj_a])
            }
        }
        push(out, [&self.conv1d, &self.a_log, &self.dt_bias, &self.norm, &self.out_proj]);
    }
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
        push(out, [&self.gate_proj, &self.up_proj, &self.down_proj]);
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
}

impl MoeTensors {
    pub fn of(cfg: &ModelConfig, layer: usize) -> MoeTensors {
        let b = format!("model.layers.{layer}.{}", cfg.moe_block);
        let (h, s) = (cfg.hidden_size, cfg.shared_intermediate_size);
        let (router, bias) = router(cfg, layer);
        let shared = if cfg.add.gated_shared_expert { "shared_expert" } else { "shared_experts" };
        MoeTensors {
            router,
            router_bias: cfg.router_has_bias().then_some(bias),
            shared_experts: (s > 0).then(|| MlpTensors::at(&format!("{b}.{shared}"), s, h)),
            shared_expert_gate: (s > 0 && cfg.add.gated_shared_expert)
                .then(|| Tensor::at(&b, "shared_expert_gate.weight", vec![1, h])),
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
        push(out, [&self.router]);
        push(out, &self.router_bias);
        if let Some(m) = &self.shared_experts {
            m.list(out);
        }
        push(out, &self.shared_expert_gate);
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

/// The mixer of a decoder layer, as far as this file tabulates it.
#[derive(Debug, Clone)]
pub enum MixerTensors {
    Gqa(GqaTensors),
    Gdn(GdnTensors),
    /// MLA and KDA: `(name, shape)` from the Kimi and DeepSeek tables.
    Listed(Vec<Tensor>),
}

/// The feed-forward half of a decoder layer.
#[derive(Debug, Clone)]
pub enum FfnTensors {
    Dense(MlpTensors),
    Moe(MoeTensors),
}

/// `model.layers.L` of every family but K3 and DeepSeek-V4.
#[derive(Debug, Clone)]
pub struct LayerTensors {
    pub input_layernorm: Tensor, // [H]
    pub mixer: MixerTensors,
    pub post_attention_layernorm: Tensor, // [H]
    pub ffn: FfnTensors,
}

impl LayerTensors {
    pub fn of(cfg: &ModelConfig, layer: usize) -> LayerTensors {
        let p = format!("model.layers.{layer}");
        let h = cfg.hidden_size;
        let mixer = match cfg.attn_kind(layer) {
            AttnKind::Gqa => MixerTensors::Gqa(GqaTensors::of(cfg, layer)),
            AttnKind::Gdn => match GdnTensors::of(cfg, layer) {
                Some(g) => MixerTensors::Gdn(g),
                None => MixerTensors::Listed(Vec::new()),
            },
            _ if cfg.family == Family::DeepseekV3 => {
                MixerTensors::Listed(super::deepseek::attention_tensors(cfg, layer))
            }
            kind => MixerTensors::Listed(super::kimi::attention_tensors(cfg, kind, &p)),
        };
        LayerTensors {
            input_layernorm: Tensor::at(&p, "input_layernorm.weight", vec![h]),
            mixer,
            post_attention_layernorm: Tensor::at(&p, "post_attention_layernorm.weight", vec![h]),
            ffn: if cfg.is_moe_layer(layer) {
                FfnTensors::Moe(MoeTensors::of(cfg, layer))
            } else {
                FfnTensors::Dense(MlpTensors::dense(cfg, layer))
            },
        }
    }

    /// Every tensor of the layer, in the container's order.
    pub fn list(&self) -> Vec<&Tensor> {
        let mut out = vec![&self.input_layernorm];
        match &self.mixer {
            MixerTensors::Gqa(g) => g.list(&mut out),
            MixerTensors::Gdn(g) => g.list(&mut out),
            MixerTensors::Listed(ts) => out.extend(ts),
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
    pub norm: Tensor,         // [H]
    /// None with tied embeddings.
    pub lm_head: Option<Tensor>, // [V, H]
}

impl EdgeTensors {
    pub fn of(cfg: &ModelConfig) -> EdgeTensors {
        let (h, v) = (cfg.hidden_size, cfg.vocab_size);
        EdgeTensors {
            embed_tokens: Tensor::at("model", "embed_tokens.weight", vec![v, h]),
            norm: Tensor::at("model", "norm.weight", vec![h]),
            lm_head: (!cfg.tie_word_embeddings).then(|| Tensor { name: "lm_head.weight".into(), shape: vec![v, h] }),
        }
    }
}
