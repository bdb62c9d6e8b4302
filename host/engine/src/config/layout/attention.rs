//! The mixers' tensors: grouped-query attention, Gated DeltaNet, MLA (with
//! DeepSeek's q-LoRA and DSA indexer, K3's output gate), KDA, and K3's
//! attention residuals.

use super::Tensor;
use crate::config::{ModelConfig, QkNorm};

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

    pub(super) fn list<'a>(&'a self, out: &mut Vec<&'a Tensor>) {
        out.extend([&self.q_proj]);
        out.extend(&self.q_proj_bias);
        out.extend([&self.k_proj]);
        out.extend(&self.k_proj_bias);
        out.extend([&self.v_proj]);
        out.extend(&self.v_proj_bias);
        out.extend([&self.o_proj]);
        out.extend(&self.o_proj_bias);
        out.extend(self.q_norm.iter().chain(&self.k_norm));
        out.extend(&self.sinks);
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

    pub(super) fn list<'a>(&'a self, out: &mut Vec<&'a Tensor>) {
        match &self.projections {
            GdnProjections::Fused { in_proj_qkvz, in_proj_ba } => out.extend([in_proj_qkvz, in_proj_ba]),
            GdnProjections::Separate { in_proj_qkv, in_proj_z, in_proj_b, in_proj_a } => {
                out.extend([in_proj_qkv, in_proj_z, in_proj_b, in_proj_a])
            }
        }
        out.extend([&self.conv1d, &self.a_log, &self.dt_bias, &self.norm, &self.out_proj]);
    }
}

/// The query projection of an MLA layer.
#[derive(Debug, Clone)]
pub enum MlaQuery {
    /// `q_proj` `[heads * qk_head_dim, H]` (Kimi-Linear).
    Full { q_proj: Tensor },
    /// DeepSeek's q-LoRA: `q_a_proj` `[q_lora, H]`, `q_a_layernorm`
    /// `[q_lora]`, `q_b_proj` `[heads * qk_head_dim, q_lora]`.
    LowRank { q_a_proj: Tensor, q_a_layernorm: Tensor, q_b_proj: Tensor, q_a_proj_bias: Option<Tensor> },
}

/// `self_attn.indexer` of a DSA layer with its own lightning indexer.
#[derive(Debug, Clone)]
pub struct IndexerTensors {
    pub wq_b: Tensor,         // [n_heads * head_dim, q_lora]
    pub wk: Tensor,           // [head_dim, H]
    pub k_norm: Tensor,       // [head_dim]
    pub k_norm_bias: Tensor,  // [head_dim]
    pub weights_proj: Tensor, // [n_heads, H]
}

/// `model.layers.L.self_attn` of a multi-head latent attention layer
/// (Kimi-Linear, DeepSeek-V3 and its DSA variants, Kimi K3).
#[derive(Debug, Clone)]
pub struct MlaTensors {
    pub q: MlaQuery,
    pub kv_a_proj_with_mqa: Tensor,              // [kv_lora + rope, H]
    pub kv_a_proj_with_mqa_bias: Option<Tensor>, // [kv_lora + rope]
    pub kv_a_layernorm: Tensor,                  // [kv_lora]
    pub kv_b_proj: Tensor,                       // [heads * (qk_nope + v), kv_lora]
    /// K3's `mla_use_output_gate`: `[heads * v, H]`.
    pub g_proj: Option<Tensor>,
    pub o_proj: Tensor,              // [H, heads * v]
    pub o_proj_bias: Option<Tensor>, // [H]
    pub indexer: Option<IndexerTensors>,
}

impl MlaTensors {
    /// None when the config has no MLA shape.
    pub fn of(cfg: &ModelConfig, layer: usize) -> Option<MlaTensors> {
        let m = cfg.mla?;
        let p = format!("model.layers.{layer}.self_attn");
        let t = |local: &str, shape: Vec<usize>| Tensor::at(&p, local, shape);
        let h = cfg.hidden_size;
        let (nh, q) = (m.num_heads, m.num_heads * m.qk_head_dim());
        let bias = |local: &str, width: usize| cfg.attention_bias.then(|| t(local, vec![width]));
        let query = match m.q_lora_rank {
            Some(ql) => MlaQuery::LowRank {
                q_a_proj: t("q_a_proj.weight", vec![ql, h]),
                q_a_layernorm: t("q_a_layernorm.weight", vec![ql]),
                q_b_proj: t("q_b_proj.weight", vec![q, ql]),
                q_a_proj_bias: bias("q_a_proj.bias", ql),
            },
            None => MlaQuery::Full { q_proj: t("q_proj.weight", vec![q, h]) },
        };
        // The indexer's query reads the q-LoRA latent (the DSA config requires one).
        let indexer = match (cfg.add.dsa.as_ref().filter(|d| d.has_indexer(layer)), m.q_lora_rank) {
            (Some(d), Some(ql)) => Some(IndexerTensors {
                wq_b: t("indexer.wq_b.weight", vec![d.n_heads * d.head_dim, ql]),
                wk: t("indexer.wk.weight", vec![d.head_dim, h]),
                k_norm: t("indexer.k_norm.weight", vec![d.head_dim]),
                k_norm_bias: t("indexer.k_norm.bias", vec![d.head_dim]),
                weights_proj: t("indexer.weights_proj.weight", vec![d.n_heads, h]),
            }),
            _ => None,
        };
        Some(MlaTensors {
            q: query,
            kv_a_proj_with_mqa: t("kv_a_proj_with_mqa.weight", vec![m.cache_width(), h]),
            kv_a_proj_with_mqa_bias: bias("kv_a_proj_with_mqa.bias", m.cache_width()),
            kv_a_layernorm: t("kv_a_layernorm.weight", vec![m.kv_lora_rank]),
            kv_b_proj: t("kv_b_proj.weight", vec![nh * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank]),
            g_proj: cfg
                .k3
                .as_ref()
                .is_some_and(|k| k.mla_output_gate)
                .then(|| t("g_proj.weight", vec![nh * m.v_head_dim, h])),
            o_proj: t("o_proj.weight", vec![h, nh * m.v_head_dim]),
            o_proj_bias: bias("o_proj.bias", h),
            indexer,
        })
    }

    pub(super) fn list<'a>(&'a self, out: &mut Vec<&'a Tensor>) {
        let mut q_a_bias = None;
        match &self.q {
            MlaQuery::Full { q_proj } => out.push(q_proj),
            MlaQuery::LowRank { q_a_proj, q_a_layernorm, q_b_proj, q_a_proj_bias } => {
                out.extend([q_a_proj, q_a_layernorm, q_b_proj]);
                q_a_bias = q_a_proj_bias.as_ref();
            }
        }
        out.extend([&self.kv_a_proj_with_mqa, &self.kv_a_layernorm, &self.kv_b_proj]);
        out.extend(&self.g_proj);
        out.push(&self.o_proj);
        out.extend(q_a_bias.into_iter().chain(&self.kv_a_proj_with_mqa_bias).chain(&self.o_proj_bias));
        if let Some(ix) = &self.indexer {
            out.extend([&ix.wq_b, &ix.wk, &ix.k_norm, &ix.k_norm_bias, &ix.weights_proj]);
        }
    }
}

/// The output gate of a KDA layer.
#[derive(Debug, Clone)]
pub enum KdaGate {
    /// `g_a_proj` `[head_dim, H]`, `g_b_proj` `[qkv, head_dim]`.
    LowRank { g_a_proj: Tensor, g_b_proj: Tensor },
    /// K3's full-rank `g_proj` `[qkv, H]`.
    Full { g_proj: Tensor },
}

/// `model.layers.L.self_attn` of a Kimi Delta Attention layer.
#[derive(Debug, Clone)]
pub struct KdaTensors {
    pub q_proj: Tensor,   // [qkv, H] (qkv = heads * head_dim)
    pub k_proj: Tensor,   // [qkv, H]
    pub v_proj: Tensor,   // [qkv, H]
    pub q_conv1d: Tensor, // [qkv * kernel] (stored [qkv, 1, kernel])
    pub k_conv1d: Tensor,
    pub v_conv1d: Tensor,
    /// `A_log` `[heads]` (K3's release pads it; k3.rs leaves its shape open).
    pub a_log: Tensor,
    pub dt_bias: Tensor,  // [qkv]
    pub f_a_proj: Tensor, // [head_dim, H]
    pub f_b_proj: Tensor, // [qkv, head_dim]
    pub b_proj: Tensor,   // [heads, H]
    pub gate: KdaGate,
    pub o_norm: Tensor, // [head_dim]
    pub o_proj: Tensor, // [H, qkv]
}

impl KdaTensors {
    /// None when the config has no KDA shape.
    pub fn of(cfg: &ModelConfig, layer: usize) -> Option<KdaTensors> {
        let k = cfg.kda?;
        let p = format!("model.layers.{layer}.self_attn");
        let t = |local: &str, shape: Vec<usize>| Tensor::at(&p, local, shape);
        let (h, c, d, nh) = (cfg.hidden_size, k.qkv_dim(), k.head_dim, k.num_heads);
        let gate = if cfg.k3.as_ref().is_some_and(|k| k.kda_full_rank_gate) {
            KdaGate::Full { g_proj: t("g_proj.weight", vec![c, h]) }
        } else {
            KdaGate::LowRank { g_a_proj: t("g_a_proj.weight", vec![d, h]), g_b_proj: t("g_b_proj.weight", vec![c, d]) }
        };
        Some(KdaTensors {
            q_proj: t("q_proj.weight", vec![c, h]),
            k_proj: t("k_proj.weight", vec![c, h]),
            v_proj: t("v_proj.weight", vec![c, h]),
            q_conv1d: t("q_conv1d.weight", vec![c * k.conv_kernel]),
            k_conv1d: t("k_conv1d.weight", vec![c * k.conv_kernel]),
            v_conv1d: t("v_conv1d.weight", vec![c * k.conv_kernel]),
            a_log: t("A_log", vec![nh]),
            dt_bias: t("dt_bias", vec![c]),
            f_a_proj: t("f_a_proj.weight", vec![d, h]),
            f_b_proj: t("f_b_proj.weight", vec![c, d]),
            b_proj: t("b_proj.weight", vec![nh, h]),
            gate,
            o_norm: t("o_norm.weight", vec![d]),
            o_proj: t("o_proj.weight", vec![h, c]),
        })
    }

    pub(super) fn list<'a>(&'a self, out: &mut Vec<&'a Tensor>) {
        out.extend([&self.q_proj, &self.k_proj, &self.v_proj, &self.q_conv1d, &self.k_conv1d, &self.v_conv1d]);
        out.extend([&self.a_log, &self.dt_bias, &self.f_a_proj, &self.f_b_proj, &self.b_proj]);
        match &self.gate {
            KdaGate::LowRank { g_a_proj, g_b_proj } => out.extend([g_a_proj, g_b_proj]),
            KdaGate::Full { g_proj } => out.push(g_proj),
        }
        out.extend([&self.o_norm, &self.o_proj]);
    }
}

/// K3's attention residuals of one layer: a `[1, H]` projection (read as
/// the vector `[H]`) and an RMSNorm `[H]` before attention and before the MLP.
#[derive(Debug, Clone)]
pub struct AttnResTensors {
    pub self_attention_res_proj: Tensor,
    pub self_attention_res_norm: Tensor,
    pub mlp_res_proj: Tensor,
    pub mlp_res_norm: Tensor,
}

impl AttnResTensors {
    pub(super) fn at(p: &str, h: usize) -> AttnResTensors {
        let t = |local: &str| Tensor::at(p, local, vec![h]);
        AttnResTensors {
            self_attention_res_proj: t("self_attention_res_proj.weight"),
            self_attention_res_norm: t("self_attention_res_norm.weight"),
            mlp_res_proj: t("mlp_res_proj.weight"),
            mlp_res_norm: t("mlp_res_norm.weight"),
        }
    }
}
