//! Qwen3-Next (`qwen3_next`) and Qwen3.5 (`qwen3_5_moe`, the release's
//! vision-language wrapper with the text model in `text_config`, and the
//! text-only `qwen3_5_moe_text`): Gated DeltaNet on the `linear_attention`
//! layers, gated full attention on the others (by default every 4th),
//! zero-centred RMSNorms, softmax top-k routing with a sigmoid-gated shared
//! expert (tests/fixtures/FAMILIES_MATH.md sections 5 and 6).

use serde_json::Value;

use super::rope::rope_settings;
use super::{
    AttnKind, Common, ExpertLayout, Family, GdnDims, ModelConfig, QkNorm, Reader, Switches, MAX_EXPERTS, MAX_HEADS,
    MAX_HEAD_DIM, MAX_INTER, MAX_LAYERS, MAX_POSITIONS,
};
use crate::error::Result;

/// Per layer: Gated DeltaNet or full attention, from `layer_types`, else
/// `full_attention_interval` (full iff `(l + 1) % interval == 0`).
fn layer_kinds(r: &Reader<'_>, num_layers: usize) -> Result<Vec<AttnKind>> {
    if let Some(v) = r.get("layer_types") {
        let Value::Array(items) = v else {
            return Err(r.err("layer_types", format!("expected a list, found {v}")));
        };
        if items.len() != num_layers {
            return Err(r.err("layer_types", format!("{} entries for {num_layers} layers", items.len())));
        }
        return items
            .iter()
            .map(|v| match v.as_str() {
                Some("linear_attention") => Ok(AttnKind::Gdn),
                Some("full_attention") => Ok(AttnKind::Gqa),
                _ => Err(r.unsupported("layer_types", format!("{v}"))),
            })
            .collect();
    }
    let interval =
        r.bounded("full_attention_interval", r.usize_opt("full_attention_interval")?.unwrap_or(4), MAX_LAYERS)?;
    Ok((0..num_layers).map(|l| if (l + 1) % interval == 0 { AttnKind::Gqa } else { AttnKind::Gdn }).collect())
}

pub(super) fn parse(top: &Reader<'_>, _family: Family, model_type: &str) -> Result<ModelConfig> {
    // The release wraps the text model: its keys are in `text_config`.
    let wrapped = model_type == "qwen3_5_moe";
    let text = match (wrapped, top.get("text_config")) {
        (true, Some(Value::Object(obj))) => Some(obj),
        (true, Some(v)) => return Err(top.err("text_config", format!("expected an object, found {v}"))),
        (true, None) => return Err(top.err("text_config", "missing (qwen3_5_moe nests the text model there)")),
        (false, _) => None,
    };
    let r = match text {
        Some(obj) => &Reader { obj, path: top.path },
        None => top,
    };
    let qwen35 = model_type != "qwen3_next";
    r.require_silu()?;
    let mut common = Common::read(r)?;
    let (hidden_size, num_layers) = (common.hidden_size, common.num_layers);
    let attn_kinds = layer_kinds(r, num_layers)?;
    let num_heads = r.bounded("num_attention_heads", r.usize_req("num_attention_heads")?, MAX_HEADS)?;
    let num_kv_heads =
        r.bounded("num_key_value_heads", r.usize_opt("num_key_value_heads")?.unwrap_or(num_heads), MAX_HEADS)?;
    if !num_heads.is_multiple_of(num_kv_heads) {
        return Err(r.err("num_key_value_heads", format!("{num_kv_heads} does not divide {num_heads} heads")));
    }
    let head_dim = r.bounded("head_dim", r.usize_opt("head_dim")?.unwrap_or(hidden_size / num_heads), MAX_HEAD_DIM)?;
    let rope = rope_settings(r, head_dim, 10000.0, 0.25)?;
    if rope.yarn.is_some() {
        return Err(r.unsupported("rope_scaling", "yarn"));
    }
    if r.bool_opt("attention_bias")? == Some(true) {
        return Err(r.unsupported("attention_bias", "true (the releases have none)"));
    }
    let gdn = GdnDims {
        key_heads: r.bounded("linear_num_key_heads", r.usize_req("linear_num_key_heads")?, MAX_HEADS)?,
        value_heads: r.bounded("linear_num_value_heads", r.usize_req("linear_num_value_heads")?, MAX_HEADS)?,
        key_head_dim: r.bounded("linear_key_head_dim", r.usize_req("linear_key_head_dim")?, MAX_HEAD_DIM)?,
        value_head_dim: r.bounded("linear_value_head_dim", r.usize_req("linear_value_head_dim")?, MAX_HEAD_DIM)?,
        conv_kernel: r.bounded("linear_conv_kernel_dim", r.usize_opt("linear_conv_kernel_dim")?.unwrap_or(4), 64)?,
        // Not a transformers key: the GGUF view (gguf/hf/qwen3next.rs) writes
        // it for a Qwen3.5 file, whose value heads llama.cpp tiled.
        tiled_value_heads: r.bool_opt("linear_value_heads_tiled")?.unwrap_or(false),
    };
    if !gdn.value_heads.is_multiple_of(gdn.key_heads) {
        return Err(r.err(
            "linear_num_value_heads",
            format!("{} is not a multiple of linear_num_key_heads {}", gdn.value_heads, gdn.key_heads),
        ));
    }
    if gdn.conv_kernel < 2 {
        return Err(r.err("linear_conv_kernel_dim", format!("{} is below 2", gdn.conv_kernel)));
    }
    let num_experts = r.bounded("num_experts", r.usize_req("num_experts")?, MAX_EXPERTS)?;
    let top_k = r.usize_req("num_experts_per_tok")?;
    if top_k == 0 || top_k > num_experts {
        return Err(r.err("num_experts_per_tok", format!("{top_k} is outside 1..={num_experts}")));
    }
    // Qwen3.5: every layer MoE, always renormalised (no such keys).
    let moe_layers: Vec<bool> = if qwen35 {
        vec![true; num_layers]
    } else {
        let step = r.bounded("decoder_sparse_step", r.usize_opt("decoder_sparse_step")?.unwrap_or(1), MAX_LAYERS)?;
        let mlp_only = r.usize_list("mlp_only_layers")?;
        (0..num_layers).map(|l| !mlp_only.contains(&l) && (l + 1) % step == 0).collect()
    };
    let (moe_width, dense_width) = r.ffn_widths(&moe_layers, MAX_INTER)?;
    let norm_topk_prob = if qwen35 { true } else { r.bool_opt("norm_topk_prob")?.unwrap_or(true) };
    let shared = r.usize_opt("shared_expert_intermediate_size")?.unwrap_or(0);
    let rms_norm_eps = r.rms_norm_eps(1e-6)?;
    let max_position_embeddings =
        r.bounded("max_position_embeddings", r.usize_opt("max_position_embeddings")?.unwrap_or(262144), MAX_POSITIONS)?;
    // The vision-language wrapper may keep these beside `text_config`.
    if common.eos_token_ids.is_empty() {
        common.eos_token_ids = top.token_ids("eos_token_id")?;
    }
    if r.bool_opt("tie_word_embeddings")?.is_none() {
        common.tie_word_embeddings = top.bool_opt("tie_word_embeddings")?.unwrap_or(false);
    }
    let add = Switches {
        rotary_dim: rope.rotary_dim,
        zero_centred_norms: true,
        attn_output_gate: true,
        gated_shared_expert: shared > 0,
        gdn: Some(gdn),
        gdn_fused: !qwen35,
        vl_wrapper: wrapped,
        ..Switches::default()
    };
    Ok(ModelConfig {
        num_heads,
        num_kv_heads,
        head_dim,
        rope_theta: rope.theta,
        rms_norm_eps,
        qk_norm: QkNorm::PerHead,
        num_experts,
        top_k,
        moe_intermediate_size: moe_width,
        intermediate_size: dense_width,
        norm_topk_prob,
        moe_layers,
        max_position_embeddings,
        // The releases fuse the routed experts (`adapt_to_tensor_names`
        // sees which layout a checkpoint holds).
        expert_layout: ExpertLayout::PerExpert,
        attn_kinds,
        shared_intermediate_size: shared,
        add,
        ..ModelConfig::plain(Family::Qwen3Next, model_type, common)
    })
}
