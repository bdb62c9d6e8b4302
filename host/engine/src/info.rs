//! What a caller may want to know about a container: family, shapes,
//! formats, sizes and parameter counts, derived from its config and
//! manifest (`waste info`, the WIT `model-info`, the C ABI).

use crate::config::RouterKind;
use crate::container::Container;

/// What a caller may want to know about an open model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    /// `model_type` of the source checkpoint.
    pub family: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub moe_layers: usize,
    pub num_experts: usize,
    pub top_k: usize,
    pub max_position_embeddings: usize,
    pub bos_token: Option<u32>,
    pub eos_tokens: Vec<u32>,
    pub trunk_format: String,
    pub expert_format: String,
    /// The trunk's tensors by stored format, most first: (format,
    /// tensors). A GGUF file's trunk kept as stored names ggml types.
    pub trunk_types: Vec<(String, usize)>,
    /// The MoE layers by expert format, most first: (format, layers); for
    /// a `gguf` container each layer's gate/up/down ggml types, which
    /// llama.cpp's quantiser mixes (`Q4_K/Q4_K/Q6_K`).
    pub expert_types: Vec<(String, usize)>,
    /// Bytes of one expert record on disk.
    pub expert_record_bytes: u64,
    /// Bytes of the resident trunk.
    pub trunk_bytes: u64,
    pub has_tokenizer: bool,
    pub has_chat_template: bool,
    /// Per decoder layer: mixer, feed-forward kind and state sizes.
    pub layers: Vec<LayerInfo>,
    /// `softmax` or `sigmoid+bias`.
    pub router: String,
    /// Width of the shared expert MLP of each MoE layer (0 = none).
    pub shared_expert_width: usize,
    /// Parameters of the whole model and those one token touches.
    pub total_params: u64,
    pub active_params: u64,
    /// Of those: the input embedding table (a token reads one row) and a
    /// separate LM head (0 when tied).
    pub embedding_params: u64,
    pub lm_head_params: u64,
    /// What the conversion left out of the source (a vision tower, MTP
    /// layers), one line each.
    pub skipped: Vec<String>,
    /// Kimi K3's vision tower, when the container holds one.
    pub vision: Option<VisionInfo>,
}

/// The vision tower and projector of a container.
#[derive(Debug, Clone, PartialEq)]
pub struct VisionInfo {
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    /// Tower and projector.
    pub parameters: u64,
    /// Stored bytes (read when the first image is given).
    pub bytes: u64,
    /// The matrices' format (`q8`, or `f32` in an f32 trunk).
    pub format: String,
    /// `bilinear` or `bicubic`: how the position grid is resized.
    pub grid_resize: String,
}

/// One decoder layer as `ModelInfo` describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerInfo {
    /// `GQA`, `MLA`, `KDA`, `GDN`; `MLA+DSA` with a sparse-attention
    /// indexer, `MLA+DSA(shared)` reusing an earlier layer's selection.
    pub attention: String,
    /// A routed MoE block (else a dense MLP).
    pub moe: bool,
    /// State bytes that do not grow with the context (KDA).
    pub state_bytes_fixed: u64,
    /// State bytes per token of context with the default KV cache type
    /// (`KvType::default()`: K/V rows; MLA latent rows; a compressed
    /// entry's share, rounded up).
    pub state_bytes_per_token: u64,
    /// Tokens one row of that state stands for: 1, or DeepSeek-V4's
    /// compression rate (a row of `state_bytes_per_token * rate` bytes).
    pub state_tokens_per_row: u64,
    /// A sliding-window layer's window: its per-token state stops growing
    /// there.
    pub window: Option<usize>,
}

impl ModelInfo {
    pub fn of(container: &Container) -> ModelInfo {
        let c = container.config();
        let tokens_per_row = |l: usize| c.add.v4.as_ref().and_then(|v| v.rate(l)).unwrap_or(1) as u64;
        let e = &container.manifest().experts;
        let vision = c.k3.as_ref().and_then(|k| k.vision.as_ref()).and_then(|v| {
            let m = container.manifest();
            let wqkv = format!("{}.encoder.blocks.0.wqkv.weight", crate::config::VISION_TOWER);
            let stored = m.trunk.tensors.iter().find(|t| t.name == wqkv)?;
            Some(VisionInfo {
                layers: v.layers,
                hidden: v.hidden,
                heads: v.heads,
                parameters: v.parameters(),
                bytes: crate::plan::vision_tower_bytes(m),
                format: stored.format.clone(),
                grid_resize: match v.grid_resize {
                    crate::config::GridResize::Bilinear => "bilinear",
                    crate::config::GridResize::Bicubic => "bicubic",
                }
                .to_string(),
            })
        });
        ModelInfo {
            vision,
            family: c.model_type.clone(),
            vocab_size: c.vocab_size,
            hidden_size: c.hidden_size,
            num_layers: c.num_layers,
            moe_layers: (0..c.num_layers).filter(|&l| c.is_moe_layer(l)).count(),
            num_experts: c.num_experts,
            top_k: c.top_k,
            max_position_embeddings: c.max_position_embeddings,
            bos_token: c.bos_token_id,
            eos_tokens: container.eos_tokens().to_vec(),
            trunk_format: container.manifest().trunk.format.clone(),
            expert_format: e.format.clone(),
            trunk_types: tally(container.manifest().trunk.tensors.iter().map(|t| t.format.clone())),
            expert_types: tally(e.layers.iter().map(|l| {
                l.ggml.as_ref().map_or_else(|| e.format.clone(), |g| format!("{}/{}/{}", g.gate, g.up, g.down))
            })),
            expert_record_bytes: e.record_bytes,
            trunk_bytes: crate::plan::resident_bytes(container),
            has_tokenizer: container
                .tokenizer_files()
                .iter()
                .any(|(n, _)| n == "tokenizer.json" || n == "tiktoken.model"),
            has_chat_template: matches!(container.chat_template(false), Ok(Some(_))),
            layers: (0..c.num_layers)
                .map(|l| LayerInfo {
                    attention: match (&c.add.dsa, &c.add.v4) {
                        (Some(d), _) if d.has_indexer(l) => "MLA+DSA".to_string(),
                        (Some(_), _) => "MLA+DSA(shared)".to_string(),
                        (None, Some(v)) => match v.rate(l) {
                            Some(m) => format!("{}/{m}", v.layers[l].name()),
                            None => v.layers[l].name().to_string(),
                        },
                        (None, None) => c.attn_kind(l).name().to_string(),
                    },
                    moe: c.is_moe_layer(l),
                    state_bytes_fixed: 4 * c.state_floats_fixed(l) as u64,
                    state_bytes_per_token: (4 * c.state_words_per_token(l, crate::kv::KvType::default()) as u64)
                        .div_ceil(tokens_per_row(l)),
                    state_tokens_per_row: tokens_per_row(l),
                    window: c.layer_window(l).filter(|_| c.attn_kind(l) == crate::config::AttnKind::Gqa),
                })
                .collect(),
            router: match c.router {
                RouterKind::Softmax => "softmax".to_string(),
                RouterKind::SigmoidBias { routed_scaling_factor } => {
                    format!("sigmoid+bias (scale {routed_scaling_factor})")
                }
                RouterKind::BiasedTopKSoftmax => "top-k of logits+bias, softmax over the picked".to_string(),
                RouterKind::SqrtSoftplusBias { routed_scaling_factor } => {
                    let hashed = c.add.v4.as_ref().map_or(0, |v| v.hash_layers.iter().filter(|&&h| h).count());
                    format!("sqrtsoftplus+bias (scale {routed_scaling_factor}), {hashed} hash-routed layers")
                }
            },
            shared_expert_width: c.shared_intermediate_size,
            total_params: c.total_params(),
            active_params: c.active_params(),
            embedding_params: c.embedding_params().0,
            lm_head_params: c.embedding_params().1,
            skipped: container.manifest().skipped.clone(),
        }
    }
}

/// Each distinct name with how often it occurs, most frequent first (ties
/// by name).
fn tally(names: impl Iterator<Item = String>) -> Vec<(String, usize)> {
    let mut counts = std::collections::BTreeMap::new();
    for n in names {
        *counts.entry(n).or_insert(0) += 1;
    }
    let mut v: Vec<(String, usize)> = counts.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v
}
