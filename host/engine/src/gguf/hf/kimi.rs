//! `kimi-linear` (Kimi-Linear; `conversion/kimi_linear.py`,
//! `src/models/kimi-linear.cpp`) as transformers' `kimi_linear`
//! (GGUF_NOTES.md 4.13): KDA layers and MLA layers without rope, a dense
//! lead, a sigmoid router with `exp_probs_b`, shared experts, routed
//! scaling, the chosen weights renormalised (`build_moe_ffn(..., norm_w =
//! true, ...)`).
//!
//! `attention.head_count_kv` is a per-layer array: 0 marks a KDA layer,
//! 1 an MLA one (the converter's MQA view of MLA). The KDA head count is
//! in no key: it is `ssm_a`'s length. What the converter changes, undone
//! here: `A_log` stored as `ssm_a = -exp(A_log)`, the q/k/v convolutions'
//! `[channels, 1, kernel]` weights stored as `ne = [kernel, 1, channels,
//! 1]` (the same values in the same order), `kv_b_proj` split as
//! deepseek2's is (deepseek.rs).

use serde_json::{json, Value as Json};

use super::{base, GgufFile, Keys, Slice, TensorInfo, Value, ValueMap};
use crate::error::{Error, Result};

pub(super) fn config(k: &Keys) -> Result<Json> {
    let g = k.g;
    let path = g.path().display();
    let layers = k.usize_req("block_count")?;
    let mut c = base(k, "KimiLinearForCausalLM", "kimi_linear", layers)?;
    match k.usize_opt("expert_gating_func")? {
        None | Some(2) => {}
        Some(f) => {
            return Err(Error::Unsupported(format!(
                "{path}: kimi-linear with expert_gating_func {f} (sigmoid, 2, only)"
            )))
        }
    }
    let kinds: Vec<&str> = match k.get("attention.head_count_kv") {
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_u64().map(|n| if n == 0 { "linear_attention" } else { "full_attention" }))
            .collect::<Option<Vec<&str>>>()
            .filter(|v| v.len() == layers)
            .ok_or_else(|| k.err("kimi-linear.attention.head_count_kv", "expected a count per layer"))?,
        _ => return Err(k.err("kimi-linear.attention.head_count_kv", "expected a per-layer array (0 marks KDA)")),
    };
    let kda = kinds.iter().position(|&kind| kind == "linear_attention");
    let kda_heads = match kda {
        Some(l) => match g.tensor(&format!("blk.{l}.ssm_a")) {
            Some(t) => t.ne.iter().product::<u64>() as usize,
            None => return Err(Error::format(g.path(), format!("KDA layer {l} has no `blk.{l}.ssm_a`"))),
        },
        None => 0,
    };
    c.insert("layer_types".into(), json!(kinds));
    // The MLA layers' shape; the absorbed view says one KV head.
    let heads = k.usize_req("attention.head_count")?;
    c.insert("num_key_value_heads".into(), json!(heads));
    let rope = k.usize_req("rope.dimension_count")?;
    let qk = k.usize_req("attention.key_length_mla")?;
    let nope =
        qk.checked_sub(rope).ok_or_else(|| k.err("kimi-linear.rope.dimension_count", "exceeds the key length"))?;
    c.insert("kv_lora_rank".into(), json!(k.usize_req("attention.kv_lora_rank")?));
    c.insert("q_lora_rank".into(), json!(k.usize_opt("attention.q_lora_rank")?));
    c.insert("qk_nope_head_dim".into(), json!(nope));
    c.insert("qk_rope_head_dim".into(), json!(rope));
    c.insert("qk_head_dim".into(), json!(qk));
    c.insert("v_head_dim".into(), json!(k.usize_req("attention.value_length_mla")?));
    c.insert("head_dim".into(), json!(rope));
    c.insert("linear_num_heads".into(), json!(kda_heads));
    c.insert("linear_head_dim".into(), json!(k.usize_req("kda.head_dim")?));
    c.insert("linear_conv_kernel_dim".into(), json!(k.usize_req("ssm.conv_kernel")?));
    let dense = k.usize_opt("leading_dense_block_count")?.unwrap_or(0);
    let mlp: Vec<&str> = (0..layers).map(|l| if l < dense { "dense" } else { "sparse" }).collect();
    for (l, kind) in mlp.iter().enumerate() {
        if (g.tensor(&format!("blk.{l}.ffn_gate_inp.weight")).is_some()) != (*kind == "sparse") {
            return Err(Error::format(
                g.path(),
                format!("`kimi-linear.leading_dense_block_count` = {dense}, but layer {l} disagrees"),
            ));
        }
    }
    c.insert("mlp_layer_types".into(), json!(mlp));
    if dense > 0 {
        c.insert("intermediate_size".into(), json!(k.usize_req("feed_forward_length")?));
    }
    c.insert("num_experts".into(), json!(k.usize_req("expert_count")?));
    c.insert("num_experts_per_token".into(), json!(k.usize_req("expert_used_count")?));
    c.insert("moe_intermediate_size".into(), json!(k.usize_req("expert_feed_forward_length")?));
    c.insert("num_shared_experts".into(), json!(k.usize_opt("expert_shared_count")?.unwrap_or(0)));
    c.insert("routed_scaling_factor".into(), json!(k.f64_opt("expert_weights_scale")?.unwrap_or(1.0)));
    c.insert("moe_renormalize".into(), json!(true));
    c.insert("moe_router_activation_func".into(), json!("sigmoid"));
    let groups = k.usize_opt("expert_group_count")?.unwrap_or(1);
    c.insert("num_expert_group".into(), json!(groups));
    c.insert("topk_group".into(), json!(k.usize_opt("expert_group_used_count")?.unwrap_or(groups)));
    Ok(Json::Object(c))
}

/// The HF tensor of KDA tensor `rest` (after `blk.L.`) of layer prefix
/// `p`, or `None` if `rest` is no KDA tensor.
pub(super) fn kda(g: &GgufFile, i: usize, t: &TensorInfo, p: &str, rest: &str) -> Result<Option<(String, Slice)>> {
    let slice = |shape: Vec<usize>, values: ValueMap| Slice { shape, values, ..Slice::whole(i, t) };
    let (hf, s) = match rest {
        "ssm_f_a.weight" => ("f_a_proj.weight", slice(t.shape(), ValueMap::Stored)),
        "ssm_f_b.weight" => ("f_b_proj.weight", slice(t.shape(), ValueMap::Stored)),
        "ssm_g_a.weight" => ("g_a_proj.weight", slice(t.shape(), ValueMap::Stored)),
        "ssm_g_b.weight" => ("g_b_proj.weight", slice(t.shape(), ValueMap::Stored)),
        "ssm_beta.weight" => ("b_proj.weight", slice(t.shape(), ValueMap::Stored)),
        "ssm_dt.bias" => ("dt_bias", slice(t.shape(), ValueMap::Stored)),
        "ssm_norm.weight" => ("o_norm.weight", slice(t.shape(), ValueMap::Stored)),
        // HF `[1, 1, heads, 1]`.
        "ssm_a" => ("A_log", slice(vec![1, 1, t.ne.iter().product::<u64>() as usize, 1], ValueMap::NegExp)),
        "ssm_conv1d_q.weight" | "ssm_conv1d_k.weight" | "ssm_conv1d_v.weight" => {
            let &[kernel, 1, channels, 1] = &t.ne[..] else {
                return Err(Error::format(
                    g.path(),
                    format!("tensor `{}`: expected ne [kernel, 1, channels, 1], has {:?}", t.name, t.ne),
                ));
            };
            let hf = match rest {
                "ssm_conv1d_q.weight" => "q_conv1d.weight",
                "ssm_conv1d_k.weight" => "k_conv1d.weight",
                _ => "v_conv1d.weight",
            };
            (hf, slice(vec![channels as usize, 1, kernel as usize], ValueMap::Stored))
        }
        _ => return Ok(None),
    };
    Ok(Some((format!("{p}.self_attn.{hf}"), s)))
}
