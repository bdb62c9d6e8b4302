//! `qwen3next` (Qwen3-Next; `conversion/qwen.py:370`, `src/models/qwen3next.cpp`)
//! as transformers' `qwen3_next`, and `qwen35moe` (Qwen3.5's text model;
//! `conversion/qwen.py` `Qwen3_5MoeTextModel`, `src/models/qwen35moe.cpp`)
//! as `qwen3_5_moe_text` (GGUF_NOTES.md 4.11, 4.12): Gated DeltaNet layers
//! and gated full attention, a softmax router renormalised over the top-k
//! (`build_moe_ffn(..., norm_w = true, ...)`), a sigmoid-gated shared
//! expert, and the MTP block appended after the last layer.
//!
//! What the converter changes, undone here:
//! - every zero-centred RMSNorm weight is stored plus one (llama.cpp
//!   multiplies by it directly); the GDN's gated norm is not;
//! - `A_log` is stored as `ssm_a = -exp(A_log)`;
//! - the fused `in_proj_qkvz`, grouped per key head, is stored as
//!   `attn_qkv` (all queries, all keys, all values: the convolution's
//!   order) and `attn_gate` (z); the view offers them as the separate
//!   `in_proj_qkv` / `in_proj_z` of Qwen3.5's layout, which the forward
//!   pass reads as they are (`ModelConfig::adapt_to_tensor_names` picks
//!   the layout the tensors have), so both stay in their stored types;
//! - `in_proj_ba` is copied whole as `ssm_ba`; its `b` and `a` rows are
//!   read out of each key head's group (`RowMap::Strided`);
//! - the convolution's `[channels, 1, kernel]` weight is squeezed;
//! - Qwen3.5 only: its separate projections are copied (`in_proj_b` /
//!   `in_proj_a` as `ssm_beta` / `ssm_alpha`), but the value heads of every
//!   GDN tensor are reordered from grouped to tiled (`out_proj`'s columns
//!   too). Undoing that would mean a column permutation of a quantised
//!   matrix; the forward pass instead reads the heads in tiled order
//!   (`GdnDims::tiled_value_heads`, set by the config's
//!   `linear_value_heads_tiled`, a key only this view writes).

use serde_json::{json, Value as Json};

use super::{base, decoder_layers, head_dim, GgufFile, Keys, RowMap, Slice, TensorInfo, Value, ValueMap};
use crate::error::{Error, Result};

/// Qwen3-Next, or Qwen3.5's text model.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Variant {
    Qwen3Next,
    Qwen35,
}

pub(super) fn config(k: &Keys, variant: Variant) -> Result<Json> {
    let g = k.g;
    let path = g.path().display();
    let (layers, nextn) = decoder_layers(k)?;
    let (architecture, model_type) = match variant {
        Variant::Qwen3Next => ("Qwen3NextForCausalLM", "qwen3_next"),
        Variant::Qwen35 => ("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text"),
    };
    let mut c = base(k, architecture, model_type, layers)?;
    c.insert("num_nextn_predict_layers".into(), json!(nextn));
    let head = head_dim(k, &mut c)?.unwrap_or(k.usize_req("embedding_length")? / k.usize_req("attention.head_count")?);
    let rotary = k.usize_opt("rope.dimension_count")?.unwrap_or(head);
    let partial = rotary as f64 / head as f64;
    if (head as f64 * partial) as usize != rotary {
        return Err(Error::Unsupported(format!(
            "{path}: rotary width {rotary} of {head} is not a representable factor"
        )));
    }
    if k.get("rope.scaling.type").is_some_and(|t| t.as_str() != Some("none")) {
        return Err(Error::Unsupported(format!("{path}: {} with rope scaling", k.arch)));
    }
    // Qwen3.5's `rope.dimension_sections` split the rotary pairs between
    // text, height and width positions (interleaved MRoPE); a text token's
    // three positions are equal, so for text they rotate as one rope does.
    let theta = k.f64_opt("rope.freq_base")?.unwrap_or(10_000.0);
    c.insert(
        "rope_parameters".into(),
        json!({"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": partial}),
    );
    let key_heads = k.usize_req("ssm.group_count")?;
    let value_heads = k.usize_req("ssm.time_step_rank")?;
    let inner = k.usize_req("ssm.inner_size")?;
    if value_heads == 0 || !inner.is_multiple_of(value_heads) {
        return Err(k.err(&format!("{}.ssm.inner_size", k.arch), "is not a whole number of value heads"));
    }
    if key_heads == 0 || !value_heads.is_multiple_of(key_heads) {
        return Err(k.err(&format!("{}.ssm.time_step_rank", k.arch), "is not a multiple of ssm.group_count"));
    }
    if variant == Variant::Qwen35 && key_heads != value_heads {
        c.insert("linear_value_heads_tiled".into(), json!(true));
    }
    c.insert("linear_num_key_heads".into(), json!(key_heads));
    c.insert("linear_num_value_heads".into(), json!(value_heads));
    c.insert("linear_key_head_dim".into(), json!(k.usize_req("ssm.state_size")?));
    c.insert("linear_value_head_dim".into(), json!(inner / value_heads));
    c.insert("linear_conv_kernel_dim".into(), json!(k.usize_req("ssm.conv_kernel")?));
    let recurrent: Vec<bool> = match k.get("attention.recurrent_layers") {
        Some(Value::Array(items)) => items
            .iter()
            .take(layers)
            .map(Value::as_bool)
            .collect::<Option<Vec<bool>>>()
            .filter(|v| v.len() == layers)
            .ok_or_else(|| k.err(&format!("{}.attention.recurrent_layers", k.arch), "expected a bool per layer"))?,
        Some(_) => return Err(k.err(&format!("{}.attention.recurrent_layers", k.arch), "expected an array of bools")),
        // llama.cpp's default: every `full_attention_interval`-th layer is full attention.
        None => {
            let every = k.usize_opt("full_attention_interval")?.unwrap_or(4).max(1);
            (0..layers).map(|l| (l + 1) % every != 0).collect()
        }
    };
    let kinds: Vec<&str> = recurrent.iter().map(|&r| if r { "linear_attention" } else { "full_attention" }).collect();
    c.insert("layer_types".into(), json!(kinds));
    c.insert("num_experts".into(), json!(k.usize_req("expert_count")?));
    c.insert("num_experts_per_tok".into(), json!(k.usize_req("expert_used_count")?));
    c.insert("moe_intermediate_size".into(), json!(k.usize_req("expert_feed_forward_length")?));
    let shared = k.usize_opt("expert_shared_feed_forward_length")?.unwrap_or(0);
    c.insert("shared_expert_intermediate_size".into(), json!(shared));
    let dense: Vec<usize> =
        (0..layers).filter(|l| g.tensor(&format!("blk.{l}.ffn_gate_inp.weight")).is_none()).collect();
    match variant {
        Variant::Qwen3Next => {
            if !dense.is_empty() {
                c.insert("intermediate_size".into(), json!(k.usize_req("feed_forward_length")?));
            }
            c.insert("mlp_only_layers".into(), json!(dense));
            c.insert("decoder_sparse_step".into(), json!(1));
            c.insert("norm_topk_prob".into(), json!(true));
        }
        // transformers' Qwen3.5 has no dense layers and always renormalises.
        Variant::Qwen35 if !dense.is_empty() => {
            return Err(Error::format(g.path(), format!("qwen35moe layer {} has no router", dense[0])));
        }
        Variant::Qwen35 => {}
    }
    Ok(Json::Object(c))
}

/// The HF tensors of a Gated DeltaNet tensor `rest` (after `blk.L.`) of
/// layer prefix `p`, or `None` if `rest` is no GDN tensor.
pub(super) fn linear_attention(
    g: &GgufFile,
    i: usize,
    t: &TensorInfo,
    p: &str,
    rest: &str,
    config: &Json,
) -> Result<Option<Vec<(String, Slice)>>> {
    let whole = |hf: &str, shape: Vec<usize>, values: ValueMap| {
        (format!("{p}.linear_attn.{hf}"), Slice { shape, values, ..Slice::whole(i, t) })
    };
    Ok(Some(match rest {
        "attn_qkv.weight" => vec![whole("in_proj_qkv.weight", t.shape(), ValueMap::Stored)],
        "attn_gate.weight" => vec![whole("in_proj_z.weight", t.shape(), ValueMap::Stored)],
        "ssm_beta.weight" => vec![whole("in_proj_b.weight", t.shape(), ValueMap::Stored)],
        "ssm_alpha.weight" => vec![whole("in_proj_a.weight", t.shape(), ValueMap::Stored)],
        "ssm_out.weight" => vec![whole("out_proj.weight", t.shape(), ValueMap::Stored)],
        "ssm_norm.weight" => vec![whole("norm.weight", t.shape(), ValueMap::Stored)],
        "ssm_dt.bias" => vec![whole("dt_bias", t.shape(), ValueMap::Stored)],
        "ssm_a" => vec![whole("A_log", t.shape(), ValueMap::NegExp)],
        "ssm_conv1d.weight" => {
            let [kernel, channels] = t.ne[..] else {
                return Err(Error::format(
                    g.path(),
                    format!("tensor `{}`: expected 2 dimensions, has {:?}", t.name, t.ne),
                ));
            };
            vec![whole("conv1d.weight", vec![channels as usize, 1, kernel as usize], ValueMap::Stored)]
        }
        "ssm_ba.weight" => {
            let key_heads = config["linear_num_key_heads"].as_u64().unwrap_or(0) as usize;
            let value_heads = config["linear_num_value_heads"].as_u64().unwrap_or(0) as usize;
            let [cols, rows] = t.ne[..] else {
                return Err(Error::format(
                    g.path(),
                    format!("tensor `{}`: expected 2 dimensions, has {:?}", t.name, t.ne),
                ));
            };
            if key_heads == 0 || rows as usize != 2 * value_heads || !value_heads.is_multiple_of(key_heads) {
                return Err(Error::format(
                    g.path(),
                    format!("tensor `{}`: {rows} rows for {value_heads} value heads in {key_heads} groups", t.name),
                ));
            }
            let len = value_heads / key_heads;
            ["in_proj_b.weight", "in_proj_a.weight"]
                .into_iter()
                .enumerate()
                .map(|(part, hf)| {
                    let row_map = RowMap::Strided { period: 2 * len, offset: part * len, len };
                    let slice = Slice {
                        row_map: Some(row_map),
                        ..Slice::rows(i, 0, value_heads as u64, vec![value_heads, cols as usize])
                    };
                    (format!("{p}.linear_attn.{hf}"), slice)
                })
                .collect()
        }
        _ => return Ok(None),
    }))
}

/// The zero-centred RMSNorm weights the converter stored plus one: every
/// norm but the GDN's gated one (`linear_attn.norm`).
pub(super) fn undo_norm_shift(out: &mut [(String, Slice)]) {
    for (name, slice) in out {
        let zero_centred = name == "model.norm.weight"
            || name.ends_with("layernorm.weight")
            || name.ends_with("self_attn.q_norm.weight")
            || name.ends_with("self_attn.k_norm.weight");
        if zero_centred {
            slice.values = ValueMap::PlusOne;
        }
    }
}
