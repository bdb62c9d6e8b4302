//! What the second wave of families adds to the first wave's config: the
//! Gated DeltaNet shape and the per-family switches of the decoder layer.

use super::{Dsa, V4Params, Yarn};

/// Shape of the Gated DeltaNet layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GdnDims {
    /// `linear_num_key_heads`, `linear_num_value_heads` (a multiple of it).
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_head_dim: usize,
    pub value_head_dim: usize,
    pub conv_kernel: usize,
    /// The value heads of every GDN tensor are in llama.cpp's tiled order
    /// (value head `h` reads key head `h % key_heads`), not transformers'
    /// grouped one (`h / (value_heads / key_heads)`): a Qwen3.5 GGUF file,
    /// whose converter reorders them for ggml's broadcast
    /// (`_LinearAttentionVReorderBase`).
    pub tiled_value_heads: bool,
}

impl GdnDims {
    /// The key head value head `h` reads its query and key from.
    pub fn key_head_of(&self, h: usize) -> usize {
        if self.tiled_value_heads {
            h % self.key_heads
        } else {
            h / (self.value_heads / self.key_heads)
        }
    }

    pub fn key_dim(&self) -> usize {
        self.key_heads * self.key_head_dim
    }
    pub fn value_dim(&self) -> usize {
        self.value_heads * self.value_head_dim
    }
    /// Channels of the causal conv: q, k, v.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
    /// Floats of one layer's state: the delta-rule matrix of every value
    /// head and the previous `conv_kernel - 1` conv inputs.
    pub fn state_floats(&self) -> usize {
        self.value_heads * self.key_head_dim * self.value_head_dim + (self.conv_kernel - 1) * self.conv_dim()
    }
}

/// What the families after the first wave add to the decoder layer; the
/// `Default` is the first wave's behaviour, so their configs set none of it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Switches {
    /// Dims at the start of each head that rotate (GLM's partial rotary
    /// 0.5, MiniMax's `rotary_dim`, Qwen3-Next's 0.25); 0: all of head_dim.
    pub rotary_dim: usize,
    /// YaRN scaling of the GQA rotary (gpt-oss).
    pub rope_yarn: Option<Yarn>,
    /// q/k/v carry biases and o_proj none (Qwen2-MoE's `qkv_bias`, GLM's
    /// `attention_bias`); `attention_bias` alone biases all four.
    pub qkv_bias: bool,
    /// RMSNorm weights apply as `1 + w` (Qwen3-Next, Qwen3.5).
    pub zero_centred_norms: bool,
    /// `q_proj` also yields, per head, a sigmoid gate on the attention
    /// output (Qwen3-Next): its rows are `[query | gate]` per head.
    pub attn_output_gate: bool,
    /// A learned sink logit per head joins the softmax (gpt-oss).
    pub attention_sinks: bool,
    /// Per layer, its sliding window (gpt-oss `layer_types`); empty: every
    /// layer uses `sliding_window`.
    pub layer_windows: Vec<Option<usize>>,
    /// The shared expert is `shared_expert`, scaled by
    /// `sigmoid(shared_expert_gate . x)` (Qwen2-MoE, Qwen3-Next); else the
    /// ungated `shared_experts` of DeepSeek and GLM.
    pub gated_shared_expert: bool,
    /// Routed experts carry biases and gpt-oss's clamped SwiGLU.
    pub expert_bias: bool,
    /// The Gated DeltaNet layers (`AttnKind::Gdn`).
    pub gdn: Option<GdnDims>,
    /// GDN projections are Qwen3-Next's fused `in_proj_qkvz` / `in_proj_ba`
    /// (grouped per key head), not Qwen3.5's separate ones.
    pub gdn_fused: bool,
    /// Decoder layers stored after the last one the forward pass runs
    /// (GLM's MTP layer): skipped by the converter.
    pub extra_layers: usize,
    /// The router's bias sits on the MoE block (MiniMax:
    /// `block_sparse_moe.e_score_correction_bias`), not on its gate.
    pub router_bias_on_block: bool,
    /// The checkpoint is Qwen3.5's vision-language release: the text model
    /// under `model.language_model.`, a vision tower and MTP layers beside.
    pub vl_wrapper: bool,
    /// DeepSeek Sparse Attention on the MLA layers (DeepSeek-V3.2, GLM-5).
    pub dsa: Option<Dsa>,
    /// DeepSeek-V4's attention, hyper-connections and hash routing.
    pub v4: Option<V4Params>,
}
