//! The model description read from a Hugging Face `config.json`.
//!
//! Configs are untrusted input: every key is type-checked, every dimension is
//! bounded, and each error names the file and the key. Keys that
//! `transformers` gives a default are optional here with the same default
//! (per family, from `configuration_<family>.py`); the dimensions that
//! define the network are required.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};
use crate::kv::KvType;
use crate::quant::TrunkFormat;

mod deepseek;
pub mod deepseek_v4;
mod dsa;
pub mod family;
mod gqa;
mod gqa_families;
mod k3;
mod k3_vision;
mod kimi;
pub mod layout;
mod qwen3_next;
mod reader;
pub mod releases;
mod rope;
mod switches;
mod tensors;

pub use crate::quant::Activation;
pub use deepseek::{MlaRope, Yarn};
pub use deepseek_v4::{V4Attn, V4Params};
pub use dsa::{is_dsa_model_type, Dsa};
pub use family::{FamilyRow, Reasoning, ToolSyntax, FAMILIES};
pub use k3::{K3Params, K3_PREFIX};
pub use k3_vision::{
    is_vision_tensor, GridResize, VisionBlockTensors, VisionConfig, VisionTensors, MAX_GRID_SIDE, MM_PROJECTOR,
    TORCH_F32_EPS, VISION_TOWER,
};
use reader::Reader;
pub use switches::{GdnDims, Switches};

/// The forward-pass paths this engine has. Several `model_type`s can share
/// one (the table of model types is `family::FAMILIES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Qwen3Moe,
    Olmoe,
    Mixtral,
    KimiLinear,
    /// DeepSeek-V3 / Kimi-K2: MLA with q-LoRA and RoPE, grouped sigmoid router.
    DeepseekV3,
    /// Qwen1.5-MoE / Qwen2-57B: q/k/v biases, a sigmoid-gated shared expert.
    Qwen2Moe,
    /// GLM-4.5 / 4.6: partial rotary, DeepSeek's grouped sigmoid router on GQA.
    Glm4Moe,
    /// MiniMax-M2: q/k norms over the whole projection, partial rotary.
    MinimaxM2,
    /// gpt-oss: attention sinks, alternating sliding windows, YaRN, biased
    /// clamped-SwiGLU experts.
    GptOss,
    /// Qwen3-Next and Qwen3.5 (`qwen3_5_moe`, `qwen3_5_moe_text`): Gated
    /// DeltaNet layers and gated full attention.
    Qwen3Next,
    /// DeepSeek-V4: shared-KV attention over a sliding window and
    /// compressed entries, hyper-connections, hash-routed layers.
    DeepseekV4,
}

/// The token mixer of one decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnKind {
    /// Grouped-query attention with RoPE and a K/V cache.
    Gqa,
    /// Multi-head latent attention (no positional encoding on Kimi-Linear),
    /// cached as `[latent | k_rope]` per token.
    Mla,
    /// Kimi Delta Attention: a recurrent state per head plus short-conv rows.
    Kda,
    /// Gated DeltaNet (Qwen3-Next, Qwen3.5): the delta rule with one decay
    /// per head, a causal conv over q, k and v, a gated output norm.
    Gdn,
    /// DeepSeek-V4: one K=V head over a sliding window, plus the entries
    /// of a compressor (`V4Params::layers` says which kind).
    V4,
}

impl AttnKind {
    pub fn name(self) -> &'static str {
        match self {
            AttnKind::Gqa => "GQA",
            AttnKind::Mla => "MLA",
            AttnKind::Kda => "KDA",
            AttnKind::Gdn => "GDN",
            AttnKind::V4 => "V4",
        }
    }
}

/// Shape of the MLA layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlaDims {
    pub num_heads: usize,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    /// DeepSeek's low-rank query (`q_a_proj -> q_a_layernorm -> q_b_proj`).
    pub q_lora_rank: Option<usize>,
}

impl MlaDims {
    /// Floats cached per token: the latent and the shared rope key.
    pub fn cache_width(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }
}

/// Shape of the KDA layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KdaDims {
    pub num_heads: usize,
    pub head_dim: usize,
    pub conv_kernel: usize,
}

impl KdaDims {
    /// Width of each of q, k, v.
    pub fn qkv_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }
    /// Floats of one layer's state: the delta-rule matrices and the previous
    /// `conv_kernel - 1` inputs of q, k and v.
    pub fn state_floats(&self) -> usize {
        self.num_heads * self.head_dim * self.head_dim + 3 * (self.conv_kernel - 1) * self.qkv_dim()
    }
}

/// How the MoE router picks and weighs experts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RouterKind {
    /// top-k of softmax(W h); `norm_topk_prob` renormalises.
    Softmax,
    /// DeepSeek-V3 / Kimi: top-k of `sigmoid(W h) + e_score_correction_bias`
    /// (the bias only selects), weights are the sigmoid scores, renormalised
    /// when `norm_topk_prob`, times `routed_scaling_factor`.
    SigmoidBias { routed_scaling_factor: f32 },
    /// gpt-oss: top-k of `W h + b`, weights the softmax over the k picked.
    BiasedTopKSoftmax,
    /// DeepSeek-V4: `SigmoidBias` with `sqrt(softplus(W h))` scores, always
    /// renormalised; hash layers take the experts from `tid2eid` instead.
    SqrtSoftplusBias { routed_scaling_factor: f32 },
}

/// Where q/k RMSNorms sit, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// Qwen3: one RMSNorm of width head_dim applied to every head.
    PerHead,
    /// OLMoE: one RMSNorm over the whole q (resp. k) projection.
    Full,
}

/// How the converter stores a trunk tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorRole {
    Embedding,
    LmHead,
    /// 1-D: norm weights, biases. Kept f32.
    Vector,
    /// The MoE router (`gate.weight`). Kept f32: routing decisions are
    /// discontinuous, a quantised router changes which experts run.
    Router,
    Matrix,
    /// Kimi K3's vision tower and projector matrices: 8-bit whatever the
    /// trunk's format (the earlier engine measured 0.64% error at q8 and
    /// 17.9% at 4 bits on `wqkv`).
    Vision,
}

impl TensorRole {
    /// The format a tensor of this role is stored in when the trunk's
    /// matrices are `trunk` (the converter's and `synth`'s one rule):
    /// embeddings and the LM head 8-bit even under a 4-bit trunk (read per
    /// token, or deciding every token), the vision tower 8-bit, vectors and
    /// routers f32, everything f32 in an f32 trunk.
    pub fn trunk_format(self, trunk: TrunkFormat) -> TrunkFormat {
        match (self, trunk) {
            (_, TrunkFormat::F32) => TrunkFormat::F32,
            (TensorRole::Embedding | TensorRole::LmHead | TensorRole::Vision, _) => TrunkFormat::Q8,
            (TensorRole::Vector | TensorRole::Router, _) => TrunkFormat::F32,
            (TensorRole::Matrix, fmt) => fmt,
        }
    }
}

/// How the routed experts are laid out in the checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertLayout {
    /// Released checkpoints: `experts.N.{gate,up,down}_proj.weight`
    /// (Mixtral: `experts.N.{w1,w3,w2}.weight`).
    PerExpert,
    /// transformers 5.x in memory (and what `save_pretrained` may write):
    /// `experts.gate_up_proj` [E, 2I, H] (gate rows first) and
    /// `experts.down_proj` [E, H, I]; a transposed variant is accepted by
    /// the checkpoint reader.
    Fused,
    /// gpt-oss: `experts.gate_up_proj` `[E, H, 2I]` input-major with gate
    /// and up interleaved, `experts.down_proj` `[E, I, H]`, their biases,
    /// or the release's MXFP4 `*_blocks` / `*_scales` (checkpoint/gpt_oss.rs).
    GptOss,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub family: Family,
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f64,
    pub rms_norm_eps: f32,
    pub qk_norm: QkNorm,
    pub attention_bias: bool,
    pub num_experts: usize,
    pub top_k: usize,
    /// Width of one routed expert.
    pub moe_intermediate_size: usize,
    /// Width of the dense MLP of non-MoE layers (Qwen3 `mlp_only_layers`).
    pub intermediate_size: usize,
    pub norm_topk_prob: bool,
    pub moe_layers: Vec<bool>,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// Attention sees keys at positions `> q - window` (masking_utils
    /// `sliding_window_overlay`). Qwen3 only when `use_sliding_window`.
    pub sliding_window: Option<usize>,
    /// OLMoE clamps q, k, v to [-clip, clip] after the q/k norms.
    pub clip_qkv: Option<f32>,
    /// The module holding router and experts: `mlp`, or Mixtral's released
    /// `block_sparse_moe` (transformers 5.x renames it to `mlp` on load).
    pub moe_block: String,
    pub expert_layout: ExpertLayout,
    /// The mixer of every layer (all `Gqa` for the GQA families).
    pub attn_kinds: Vec<AttnKind>,
    pub mla: Option<MlaDims>,
    pub kda: Option<KdaDims>,
    pub router: RouterKind,
    /// Width of the shared expert MLP of MoE layers (`moe_intermediate_size *
    /// n_shared_experts`); 0 when there is none.
    pub shared_intermediate_size: usize,
    /// RoPE of the MLA rope parts (DeepSeek-V3); None: no positional encoding.
    pub mla_rope: Option<MlaRope>,
    /// Group-limited routing `(n_group, topk_group)` (DeepSeek-V3).
    pub expert_groups: Option<(usize, usize)>,
    /// Kimi K3 (`model_type: kimi_k3`, config/k3.rs); None elsewhere.
    pub k3: Option<K3Params>,
    /// The decoder layer's per-family switches (biases, partial rotary,
    /// sinks, Gated DeltaNet, DSA, DeepSeek-V4); default: the plain GQA path.
    pub add: Switches,
}

// Bounds for untrusted configs: generous for any real model, small enough
// that products of them cannot overflow and allocations stay sane.
const MAX_VOCAB: usize = 1 << 24;
const MAX_HIDDEN: usize = 1 << 16;
const MAX_LAYERS: usize = 1024;
const MAX_HEADS: usize = 1024;
const MAX_HEAD_DIM: usize = 1024;
const MAX_EXPERTS: usize = 1 << 16;
const MAX_INTER: usize = 1 << 20;
const MAX_POSITIONS: usize = 1 << 26;

/// What every family's config names alike: the dimensions, the special
/// tokens and whether the LM head is the embedding, read by one function.
struct Common {
    vocab_size: usize,
    hidden_size: usize,
    num_layers: usize,
    tie_word_embeddings: bool,
    bos_token_id: Option<u32>,
    eos_token_ids: Vec<u32>,
}

impl Common {
    fn read(r: &Reader<'_>) -> Result<Common> {
        Ok(Common {
            vocab_size: r.bounded("vocab_size", r.usize_req("vocab_size")?, MAX_VOCAB)?,
            hidden_size: r.bounded("hidden_size", r.usize_req("hidden_size")?, MAX_HIDDEN)?,
            num_layers: r.bounded("num_hidden_layers", r.usize_req("num_hidden_layers")?, MAX_LAYERS)?,
            tie_word_embeddings: r.bool_opt("tie_word_embeddings")?.unwrap_or(false),
            bos_token_id: match r.get("bos_token_id") {
                None => None,
                Some(v) => Some(r.token_id("bos_token_id", v)?),
            },
            eos_token_ids: r.token_ids("eos_token_id")?,
        })
    }
}

impl ModelConfig {
    /// `common`'s model on the plain path: grouped-query attention in every
    /// layer, every layer MoE with a softmax router over per-expert SwiGLU
    /// experts under `mlp`, no shared expert, no switches. Each family's
    /// parser writes `ModelConfig { <what it reads>, ..ModelConfig::plain(..) }`;
    /// the sizes only a family's keys give (heads, experts, widths, rope,
    /// eps, positions) start at 0 here and every parser sets them.
    fn plain(family: Family, model_type: &str, common: Common) -> ModelConfig {
        let Common { vocab_size, hidden_size, num_layers, tie_word_embeddings, bos_token_id, eos_token_ids } = common;
        ModelConfig {
            family,
            model_type: model_type.to_string(),
            vocab_size,
            hidden_size,
            num_layers,
            num_heads: 0,
            num_kv_heads: 0,
            head_dim: 0,
            rope_theta: 0.0,
            rms_norm_eps: 0.0,
            qk_norm: QkNorm::None,
            attention_bias: false,
            num_experts: 0,
            top_k: 0,
            moe_intermediate_size: 0,
            intermediate_size: 0,
            norm_topk_prob: false,
            moe_layers: vec![true; num_layers],
            tie_word_embeddings,
            max_position_embeddings: 0,
            bos_token_id,
            eos_token_ids,
            sliding_window: None,
            clip_qkv: None,
            moe_block: "mlp".to_string(),
            expert_layout: ExpertLayout::PerExpert,
            attn_kinds: vec![AttnKind::Gqa; num_layers],
            mla: None,
            kda: None,
            router: RouterKind::Softmax,
            shared_intermediate_size: 0,
            mla_rope: None,
            expert_groups: None,
            k3: None,
            add: Switches::default(),
        }
    }
}

impl ModelConfig {
    pub fn from_file(path: &Path) -> Result<ModelConfig> {
        let bytes = crate::files::read_file(path, 16 << 20)?;
        let text = String::from_utf8(bytes).map_err(|_| Error::format(path, "not UTF-8"))?;
        Self::from_json_str(&text, path)
    }

    /// `path` is only used to name the file in errors.
    pub fn from_json_str(json: &str, path: &Path) -> Result<ModelConfig> {
        let value: Value =
            serde_json::from_str(json).map_err(|e| Error::format(path, format!("malformed JSON: {e}")))?;
        let Some(obj) = value.as_object() else {
            return Err(Error::format(path, "expected a JSON object at the top level"));
        };
        let r = Reader { obj, path };

        let model_type = r.str_opt("model_type")?.ok_or_else(|| r.err("model_type", "missing"))?;
        let Some(row) = family::by_model_type(model_type) else {
            let supported: Vec<&str> = family::model_types().collect();
            return Err(Error::Unsupported(format!(
                "{}: model_type `{other}` (supported: {})",
                path.display(),
                supported.join(", "),
                other = model_type,
            )));
        };
        row.parse(&r, model_type)
    }

    /// Where the text model's tensors sit in the source checkpoint, as
    /// (prefix there, prefix here): K3's under `language_model.`, Qwen3.5's
    /// release under `model.language_model.`; checkpoint readers rename
    /// them to the plain names and leave everything else as it is (the
    /// vision tower, MTP layers: tensors no forward pass reads).
    pub fn source_rename(&self) -> Option<(&'static str, &'static str)> {
        if self.k3.is_some() {
            Some((K3_PREFIX, ""))
        } else if self.add.vl_wrapper {
            Some(("model.language_model.", "model."))
        } else {
            None
        }
    }

    /// The name a checkpoint reader files a stored tensor under:
    /// `source_rename`'s prefix swap, or DeepSeek-V4's release names
    /// mapped to transformers' (`deepseek_v4::canonical_name`).
    pub fn canonical_source_name(&self, name: String) -> String {
        if self.family == Family::DeepseekV4 {
            return deepseek_v4::canonical_name(&name);
        }
        match self.source_rename().and_then(|(from, to)| Some((name.strip_prefix(from)?, to))) {
            Some((rest, to)) => format!("{to}{rest}"),
            None => name,
        }
    }

    /// Width a routed expert reads and writes: the latent of K3's latent
    /// MoE, else the hidden size.
    pub fn expert_hidden(&self) -> usize {
        self.k3.and_then(|k| k.latent).unwrap_or(self.hidden_size)
    }

    /// The gated activation of MLPs and experts.
    pub fn activation(&self) -> Activation {
        if self.family == Family::GptOss {
            // `swiglu_alpha`, `swiglu_limit` (config/gqa_families.rs accepts only these).
            return Activation::ClampedSwiglu { alpha: 1.702, limit: 7.0 };
        }
        if let Some(v4) = &self.add.v4 {
            return Activation::ClampedSilu { limit: v4.swiglu_limit };
        }
        self.k3.map_or(Activation::Silu, |k| k.activation)
    }

    /// The routed experts' shape as the kernels see it.
    pub fn expert_shape(&self) -> crate::quant::ExpertShape {
        crate::quant::ExpertShape {
            hidden: self.expert_hidden(),
            inter: self.moe_intermediate_size,
            biases: self.add.expert_bias,
        }
    }

    /// Adapts the tensor naming (MoE block name, expert layout, fused or
    /// separate GDN projections) to what a checkpoint actually holds;
    /// `HfCheckpoint::open` calls this.
    pub fn adapt_to_tensor_names<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) {
        let moe_layer = self.moe_layers.iter().position(|&m| m);
        let mut block = None;
        let mut fused = false;
        // Qwen3-Next's checkpoints fuse the GDN input projections; Qwen3.5's,
        // and Qwen3-Next's GGUF files (gguf/hf/qwen3next.rs), keep them apart.
        let (mut gdn_fused, mut gdn_separate) = (false, false);
        for name in names {
            gdn_fused |= name.ends_with(".linear_attn.in_proj_qkvz.weight");
            gdn_separate |= name.ends_with(".linear_attn.in_proj_qkv.weight");
            let Some(layer) = moe_layer else { continue };
            for candidate in ["mlp", "block_sparse_moe"] {
                let prefix = format!("model.layers.{layer}.{candidate}.");
                if let Some(rest) = name.strip_prefix(&prefix) {
                    if rest == "gate.weight" || rest.starts_with("experts.") {
                        block = Some(candidate);
                        fused |= rest.starts_with("experts.gate_up_proj");
                    }
                }
            }
        }
        if self.add.gdn.is_some() && gdn_fused != gdn_separate {
            self.add.gdn_fused = gdn_fused;
        }
        if moe_layer.is_none() {
            return;
        }
        if let Some(b) = block {
            self.moe_block = b.to_string();
        }
        self.expert_layout = match (self.family, fused) {
            (Family::GptOss, _) => ExpertLayout::GptOss,
            (_, true) => ExpertLayout::Fused,
            (_, false) => ExpertLayout::PerExpert,
        };
    }

    pub fn is_moe_layer(&self, layer: usize) -> bool {
        self.moe_layers.get(layer).copied().unwrap_or(false)
    }

    /// Floats of a token's residual: `hc_mult` streams on DeepSeek-V4,
    /// one hidden vector elsewhere.
    pub fn residual_width(&self) -> usize {
        self.hidden_size * self.add.v4.as_ref().map_or(1, |v| v.hc_mult)
    }

    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    pub fn router_name(&self, layer: usize) -> String {
        layout::router(self, layer).0.name
    }

    /// The router's bias: selection only on a sigmoid router (on the gate,
    /// or on the block for MiniMax), added to the logits on gpt-oss's.
    pub fn router_bias_name(&self, layer: usize) -> String {
        layout::router(self, layer).1.name
    }

    /// Whether the router has a bias vector.
    pub fn router_has_bias(&self) -> bool {
        !matches!(self.router, RouterKind::Softmax)
    }

    /// Dims of each GQA head that rotate.
    pub fn rotary_dim(&self) -> usize {
        match self.add.rotary_dim {
            0 => self.head_dim,
            d => d,
        }
    }

    /// The sliding window of layer `layer`, if it has one.
    pub fn layer_window(&self, layer: usize) -> Option<usize> {
        match self.add.layer_windows.get(layer) {
            Some(w) => *w,
            None => self.sliding_window,
        }
    }

    pub fn attn_kind(&self, layer: usize) -> AttnKind {
        self.attn_kinds.get(layer).copied().unwrap_or(AttnKind::Gqa)
    }

    /// State floats of one layer that do not grow with the context (KDA).
    pub fn state_floats_fixed(&self, layer: usize) -> usize {
        match (self.attn_kind(layer), &self.kda, &self.add.gdn, &self.add.v4) {
            (AttnKind::Kda, Some(k), _, _) => k.state_floats(),
            (AttnKind::Gdn, _, Some(g), _) => g.state_floats(),
            (AttnKind::V4, _, _, Some(v)) => v.fixed_floats(layer),
            _ => 0,
        }
    }

    /// State floats of one layer per token of context: K and V rows (GQA)
    /// or the absorbed latent row (MLA).
    pub fn state_floats_per_token(&self, layer: usize) -> usize {
        match (self.attn_kind(layer), &self.mla) {
            (AttnKind::Gqa, _) => 2 * self.kv_dim(),
            (AttnKind::Mla, Some(m)) => m.cache_width() + self.index_key_width(layer),
            (AttnKind::V4, _) => self.add.v4.as_ref().map_or(0, |v| v.entry_floats(layer)),
            _ => 0,
        }
    }

    /// Rows of per-token state layer `layer` keeps for `context` tokens:
    /// all of them, or only its sliding window's (a ring).
    pub fn state_rows(&self, layer: usize, context: usize) -> usize {
        match (self.attn_kind(layer), self.layer_window(layer)) {
            (AttnKind::Gqa, Some(w)) => w.min(context),
            // V4: one row per compressed entry (the window ring is fixed).
            (AttnKind::V4, _) => self.add.v4.as_ref().and_then(|v| v.rate(layer)).map_or(0, |m| context / m),
            _ => context,
        }
    }

    /// Whether a forward pass that fails midway can leave state behind that
    /// a retry cannot overwrite: a recurrent layer's (KDA, GDN), or a
    /// windowed layer's ring rows.
    pub fn has_unrewindable_state(&self) -> bool {
        (0..self.num_layers).any(|l| {
            matches!(self.attn_kind(l), AttnKind::Kda | AttnKind::Gdn | AttnKind::V4)
                || (self.attn_kind(l) == AttnKind::Gqa && self.layer_window(l).is_some())
        })
    }

    /// State words (4 bytes each) of one layer per token of context with a
    /// KV cache of type `kv`: `state_floats_per_token`, with a GQA layer's
    /// K and V rows and an MLA layer's latent row in `kv`'s packing
    /// (DeepSeek-V4's compressed entries stay f32).
    pub fn state_words_per_token(&self, layer: usize, kv: KvType) -> usize {
        match self.attn_kind(layer) {
            AttnKind::Gqa => 2 * kv.words(self.kv_dim()),
            AttnKind::Mla => kv.words(self.state_floats_per_token(layer)),
            _ => self.state_floats_per_token(layer),
        }
    }

    /// Bytes of one sequence's state for `context` tokens with a KV cache
    /// of type `kv`, every layer kind counted: what a memory plan should
    /// reserve.
    pub fn state_bytes(&self, context: usize, kv: KvType) -> u64 {
        (0..self.num_layers)
            .map(|l| {
                let rows = self.state_rows(l, context) as u64;
                4 * (self.state_floats_fixed(l) as u64 + rows * self.state_words_per_token(l, kv) as u64)
            })
            .sum()
    }
}

/// The path of `config.json` inside a checkpoint directory.
pub fn config_path(dir: &Path) -> PathBuf {
    dir.join("config.json")
}

#[cfg(test)]
mod tests;
