//! The plain GQA families: `qwen3_moe`, `olmoe` and `mixtral` (grouped-query
//! attention with RoPE over the whole head, a softmax router, per-expert
//! SwiGLU). The defaults are those of `configuration_<family>.py`.

use super::{
    rope, Common, Family, ModelConfig, QkNorm, Reader, MAX_EXPERTS, MAX_HEADS, MAX_HEAD_DIM, MAX_INTER, MAX_LAYERS,
    MAX_POSITIONS,
};
use crate::error::Result;

pub(super) fn parse(r: &Reader<'_>, family: Family, model_type: &str) -> Result<ModelConfig> {
    r.require_silu()?;
    let common = Common::read(r)?;
    let (hidden_size, num_layers) = (common.hidden_size, common.num_layers);
    let num_heads = r.bounded("num_attention_heads", r.usize_req("num_attention_heads")?, MAX_HEADS)?;
    let num_kv_heads = r.usize_opt("num_key_value_heads")?.unwrap_or(num_heads);
    let num_kv_heads = r.bounded("num_key_value_heads", num_kv_heads, MAX_HEADS)?;
    if num_heads % num_kv_heads != 0 {
        return Err(
            r.err("num_key_value_heads", format!("{num_kv_heads} does not divide num_attention_heads {num_heads}"))
        );
    }
    // OLMoE sizes q_norm by hidden_size, so a head_dim other than
    // hidden / heads fails the q_norm shape check at load.
    let head_dim = match r.usize_opt("head_dim")? {
        None => {
            if hidden_size % num_heads != 0 {
                return Err(r.err(
                    "num_attention_heads",
                    format!("{num_heads} does not divide hidden_size {hidden_size} and there is no head_dim"),
                ));
            }
            hidden_size / num_heads
        }
        Some(d) => d,
    };
    let head_dim = r.bounded("head_dim", head_dim, MAX_HEAD_DIM)?;
    if head_dim % 2 != 0 {
        return Err(r.err("head_dim", format!("{head_dim} is odd; rotate_half RoPE needs an even head_dim")));
    }

    let rope_theta = rope::read_rope_theta(r, family)?;
    let rms_norm_eps = r.rms_norm_eps(match family {
        Family::Qwen3Moe => 1e-6,
        _ => 1e-5,
    })?;

    // configuration_*.py `attribute_map` aliases num_experts and
    // num_local_experts; which one is written depends on the family and
    // the transformers version (the Qwen3 fixture has num_local_experts).
    let experts_key = if r.get("num_experts").is_some() { "num_experts" } else { "num_local_experts" };
    let num_experts = r.bounded(experts_key, r.usize_req(experts_key)?, MAX_EXPERTS)?;
    let top_k = r.usize_req("num_experts_per_tok")?;
    if top_k == 0 || top_k > num_experts {
        return Err(r.err("num_experts_per_tok", format!("{top_k} is outside 1..={num_experts}")));
    }

    let (moe_intermediate_size, intermediate_size, moe_layers) = match family {
        Family::Qwen3Moe => {
            let moe = r.bounded("moe_intermediate_size", r.usize_req("moe_intermediate_size")?, MAX_INTER)?;
            let step = r.usize_opt("decoder_sparse_step")?.unwrap_or(1);
            let step = r.bounded("decoder_sparse_step", step, MAX_LAYERS)?;
            let mlp_only = r.usize_list("mlp_only_layers")?;
            // modeling_qwen3_moe.py: `(layer_idx not in config.mlp_only_layers) and
            // (config.num_experts > 0 and (layer_idx + 1) % config.decoder_sparse_step == 0)`
            let layers: Vec<bool> = (0..num_layers).map(|l| !mlp_only.contains(&l) && (l + 1) % step == 0).collect();
            let dense = if layers.iter().all(|&m| m) {
                r.usize_opt("intermediate_size")?.unwrap_or(0)
            } else {
                r.bounded("intermediate_size", r.usize_req("intermediate_size")?, MAX_INTER)?
            };
            if dense > MAX_INTER {
                return Err(r.err("intermediate_size", format!("{dense} exceeds {MAX_INTER}")));
            }
            (moe, dense, layers)
        }
        _ => {
            let i = r.bounded("intermediate_size", r.usize_req("intermediate_size")?, MAX_INTER)?;
            (i, 0, vec![true; num_layers])
        }
    };

    let norm_topk_prob = match family {
        // MixtralTopKRouter always divides by the sum of the picked probabilities.
        Family::Qwen3Moe | Family::Olmoe => r.bool_opt("norm_topk_prob")?.unwrap_or(false),
        _ => true,
    };
    let attention_bias = match family {
        Family::Mixtral => false,
        _ => r.bool_opt("attention_bias")?.unwrap_or(false),
    };
    let qk_norm = match family {
        Family::Qwen3Moe => QkNorm::PerHead,
        Family::Olmoe => QkNorm::Full,
        _ => QkNorm::None,
    };
    let sliding_window = match family {
        Family::Mixtral => r.usize_opt("sliding_window")?,
        Family::Qwen3Moe if r.bool_opt("use_sliding_window")?.unwrap_or(false) => {
            Some(r.usize_opt("sliding_window")?.unwrap_or(4096))
        }
        _ => None,
    };
    if sliding_window == Some(0) {
        return Err(r.err("sliding_window", "0 would mask every key"));
    }
    let clip_qkv = match family {
        Family::Olmoe => match r.f64_opt("clip_qkv")? {
            Some(c) if c <= 0.0 => return Err(r.err("clip_qkv", format!("{c} is not positive"))),
            c => c.map(|c| c as f32),
        },
        _ => None,
    };

    let max_position_embeddings = r.usize_opt("max_position_embeddings")?.unwrap_or(match family {
        Family::Qwen3Moe => 32768,
        Family::Olmoe => 4096,
        _ => 4096 * 32,
    });
    let max_position_embeddings = r.bounded("max_position_embeddings", max_position_embeddings, MAX_POSITIONS)?;

    Ok(ModelConfig {
        num_heads,
        num_kv_heads,
        head_dim,
        rope_theta,
        rms_norm_eps,
        qk_norm,
        attention_bias,
        num_experts,
        top_k,
        moe_intermediate_size,
        intermediate_size,
        norm_topk_prob,
        moe_layers,
        max_position_embeddings,
        sliding_window,
        clip_qkv,
        moe_block: match family {
            Family::Mixtral => "block_sparse_moe".to_string(),
            _ => "mlp".to_string(),
        },
        ..ModelConfig::plain(family, model_type, common)
    })
}
