//! The GQA families of the second wave: `qwen2_moe` (Qwen1.5-MoE,
//! Qwen2-57B-A14B), `glm4_moe` (GLM-4.5 / 4.6 / 4.5-Air), `minimax_m2`
//! (MiniMax-M2) and `gpt_oss` (gpt-oss-20b / 120b). Each section of
//! tests/fixtures/FAMILIES_MATH.md says what its config keys mean; the
//! defaults are those of `configuration_<family>.py` (transformers 5.24).
//! Release configs (transformers 4 style) put `rope_theta`,
//! `partial_rotary_factor`, `rotary_dim` and `rope_scaling` at the top
//! level, transformers 5 folds them into `rope_parameters`: both are read.

use serde_json::Value;

use super::rope::rope_settings;
use super::{
    Common, Family, ModelConfig, QkNorm, Reader, RouterKind, Switches, MAX_EXPERTS, MAX_HEADS, MAX_HEAD_DIM, MAX_INTER,
    MAX_LAYERS, MAX_POSITIONS,
};
use crate::error::Result;

/// `layer_types` of gpt-oss: per layer, its sliding window or full
/// attention; the default alternates sliding (even) and full (odd).
fn gpt_oss_windows(r: &Reader<'_>, num_layers: usize, window: usize) -> Result<Vec<Option<usize>>> {
    let kinds: Vec<String> = match r.get("layer_types") {
        None => (0..num_layers)
            .map(|l| if l % 2 == 0 { "sliding_attention" } else { "full_attention" }.to_string())
            .collect(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_owned).ok_or_else(|| r.err("layer_types", format!("{v} is not a string"))))
            .collect::<Result<_>>()?,
        Some(v) => return Err(r.err("layer_types", format!("expected a list, found {v}"))),
    };
    if kinds.len() != num_layers {
        return Err(r.err("layer_types", format!("{} entries for {num_layers} layers", kinds.len())));
    }
    kinds
        .iter()
        .map(|k| match k.as_str() {
            "sliding_attention" => Ok(Some(window)),
            "full_attention" => Ok(None),
            other => Err(r.unsupported("layer_types", format!("`{other}`"))),
        })
        .collect()
}

pub(super) fn parse(r: &Reader<'_>, family: Family, model_type: &str) -> Result<ModelConfig> {
    r.require_silu()?;
    let common = Common::read(r)?;
    let (hidden_size, num_layers) = (common.hidden_size, common.num_layers);
    let num_heads = r.bounded("num_attention_heads", r.usize_req("num_attention_heads")?, MAX_HEADS)?;
    let num_kv_heads = r.usize_opt("num_key_value_heads")?.unwrap_or(num_heads);
    let num_kv_heads = r.bounded("num_key_value_heads", num_kv_heads, MAX_HEADS)?;
    if !num_heads.is_multiple_of(num_kv_heads) {
        return Err(r.err("num_key_value_heads", format!("{num_kv_heads} does not divide {num_heads} heads")));
    }
    let head_dim = match r.usize_opt("head_dim")? {
        Some(d) => d,
        None if hidden_size.is_multiple_of(num_heads) => hidden_size / num_heads,
        None => return Err(r.err("head_dim", "missing, and num_attention_heads does not divide hidden_size")),
    };
    let head_dim = r.bounded("head_dim", head_dim, MAX_HEAD_DIM)?;
    if !head_dim.is_multiple_of(2) {
        return Err(r.err("head_dim", format!("{head_dim} is odd")));
    }
    let (default_theta, default_partial) = match family {
        Family::Glm4Moe => (10000.0, 0.5),
        Family::GptOss => (150000.0, 1.0),
        _ => (10000.0, 1.0),
    };
    let rope = rope_settings(r, head_dim, default_theta, default_partial)?;
    if rope.yarn.is_some() && family != Family::GptOss {
        return Err(r.unsupported("rope_scaling", format!("yarn on {model_type}")));
    }
    let rms_norm_eps = r.rms_norm_eps(1e-6)?;

    let experts_key = ["num_experts", "n_routed_experts", "num_local_experts"]
        .into_iter()
        .find(|k| r.get(k).is_some())
        .unwrap_or("num_experts");
    let num_experts = r.bounded(experts_key, r.usize_req(experts_key)?, MAX_EXPERTS)?;
    let top_k = r.usize_req("num_experts_per_tok")?;
    if top_k == 0 || top_k > num_experts {
        return Err(r.err("num_experts_per_tok", format!("{top_k} is outside 1..={num_experts}")));
    }

    let mut add = Switches { rotary_dim: rope.rotary_dim, rope_yarn: rope.yarn, ..Switches::default() };
    let mut router = RouterKind::Softmax;
    let mut expert_groups = None;
    let mut shared_intermediate_size = 0;
    let mut qk_norm = QkNorm::None;
    let mut attention_bias = false;
    let mut norm_topk_prob = true;
    let mut moe_block = "mlp";
    let (moe_width, dense_width, moe_layers) = match family {
        Family::Qwen2Moe => {
            // configuration_qwen2_moe.py: `qkv_bias` (default true), no o bias.
            add.qkv_bias = r.bool_opt("qkv_bias")?.unwrap_or(true);
            norm_topk_prob = r.bool_opt("norm_topk_prob")?.unwrap_or(false);
            shared_intermediate_size = r.usize_opt("shared_expert_intermediate_size")?.unwrap_or(0);
            add.gated_shared_expert = shared_intermediate_size > 0;
            let step =
                r.bounded("decoder_sparse_step", r.usize_opt("decoder_sparse_step")?.unwrap_or(1), MAX_LAYERS)?;
            let mlp_only = r.usize_list("mlp_only_layers")?;
            let layers: Vec<bool> = (0..num_layers).map(|l| !mlp_only.contains(&l) && (l + 1) % step == 0).collect();
            let (moe, dense) = r.ffn_widths(&layers, MAX_INTER)?;
            (moe, dense, layers)
        }
        Family::Glm4Moe => {
            // `attention_bias` biases q/k/v (never o_proj, modeling_glm4_moe.py:212-222).
            add.qkv_bias = r.bool_opt("attention_bias")?.unwrap_or(false);
            if r.bool_opt("use_qk_norm")?.unwrap_or(false) {
                qk_norm = QkNorm::PerHead;
            }
            norm_topk_prob = r.bool_opt("norm_topk_prob")?.unwrap_or(true);
            let scale = r.f64_opt("routed_scaling_factor")?.unwrap_or(1.0);
            if scale.is_nan() || scale <= 0.0 {
                return Err(r.err("routed_scaling_factor", format!("{scale} is not positive")));
            }
            router = RouterKind::SigmoidBias { routed_scaling_factor: scale as f32 };
            let n_group = r.usize_opt("n_group")?.unwrap_or(1).max(1);
            let topk_group = r.usize_opt("topk_group")?.unwrap_or(n_group);
            if !num_experts.is_multiple_of(n_group) || topk_group == 0 || topk_group > n_group {
                return Err(r.err("n_group", format!("{n_group} groups, {topk_group} kept, of {num_experts} experts")));
            }
            if n_group > 1 {
                expert_groups = Some((n_group, topk_group));
            }
            let moe = r.bounded("moe_intermediate_size", r.usize_req("moe_intermediate_size")?, MAX_INTER)?;
            shared_intermediate_size = moe * r.usize_opt("n_shared_experts")?.unwrap_or(1);
            let first_dense = r.usize_opt("first_k_dense_replace")?.unwrap_or(1).min(num_layers);
            let layers: Vec<bool> = (0..num_layers).map(|l| l >= first_dense).collect();
            let dense = if first_dense > 0 {
                r.bounded("intermediate_size", r.usize_req("intermediate_size")?, MAX_INTER)?
            } else {
                0
            };
            add.extra_layers = r.usize_opt("num_nextn_predict_layers")?.unwrap_or(0);
            (moe, dense, layers)
        }
        Family::MinimaxM2 => {
            // q/k RMSNorms over the whole projection (`qk_norm_type` per_layer).
            if r.bool_opt("use_qk_norm")?.unwrap_or(true) {
                qk_norm = QkNorm::Full;
            }
            if let Some(t) = r.str_opt("qk_norm_type")? {
                if t != "per_layer" {
                    return Err(r.unsupported("qk_norm_type", format!("`{t}` (per_layer)")));
                }
            }
            if let Some(f) = r.str_opt("scoring_func")? {
                if f != "sigmoid" {
                    return Err(r.unsupported("scoring_func", format!("`{f}` (sigmoid)")));
                }
            }
            if r.bool_opt("use_routing_bias")? == Some(false) {
                return Err(r.unsupported("use_routing_bias", "false (the release routes with its bias)"));
            }
            if r.usize_opt("shared_intermediate_size")?.unwrap_or(0) > 0 {
                return Err(r.unsupported("shared_intermediate_size", "a shared expert (MiniMax-M2 has none)"));
            }
            router = RouterKind::SigmoidBias { routed_scaling_factor: 1.0 };
            add.router_bias_on_block = true;
            moe_block = "block_sparse_moe";
            let width = r.bounded("intermediate_size", r.usize_req("intermediate_size")?, MAX_INTER)?;
            (width, 0, vec![true; num_layers])
        }
        Family::GptOss => {
            attention_bias = r.bool_opt("attention_bias")?.unwrap_or(true);
            add.attention_sinks = true;
            add.expert_bias = true;
            router = RouterKind::BiasedTopKSoftmax;
            let window = r.bounded("sliding_window", r.usize_opt("sliding_window")?.unwrap_or(128), MAX_POSITIONS)?;
            add.layer_windows = gpt_oss_windows(r, num_layers, window)?;
            for (key, want) in [("swiglu_alpha", 1.702), ("swiglu_limit", 7.0)] {
                if let Some(v) = r.f64_opt(key)? {
                    if (v - want).abs() > 1e-9 {
                        return Err(r.unsupported(key, format!("{v} (the release's {want})")));
                    }
                }
            }
            let width = r.bounded("intermediate_size", r.usize_req("intermediate_size")?, MAX_INTER)?;
            (width, 0, vec![true; num_layers])
        }
        _ => unreachable!("gqa_families::parse is the parser of these four families only (family::FAMILIES)"),
    };
    let max_position_embeddings = r.usize_opt("max_position_embeddings")?.unwrap_or(32768);
    let max_position_embeddings = r.bounded("max_position_embeddings", max_position_embeddings, MAX_POSITIONS)?;
    Ok(ModelConfig {
        num_heads,
        num_kv_heads,
        head_dim,
        rope_theta: rope.theta,
        rms_norm_eps,
        qk_norm,
        attention_bias,
        num_experts,
        top_k,
        moe_intermediate_size: moe_width,
        intermediate_size: dense_width,
        norm_topk_prob,
        moe_layers,
        max_position_embeddings,
        moe_block: moe_block.to_string(),
        router,
        shared_intermediate_size,
        expert_groups,
        add,
        ..ModelConfig::plain(family, model_type, common)
    })
}
