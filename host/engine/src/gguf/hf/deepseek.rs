//! `deepseek2` (DeepSeek-V3, Kimi-K2; `conversion/deepseek.py`,
//! `src/models/deepseek2.cpp`) as transformers' `deepseek_v3`
//! (GGUF_NOTES.md 4.6): MLA with an optional q-LoRA, leading dense layers,
//! shared experts, a sigmoid router with `exp_probs_b` and groups, YaRN.
//!
//! `kv_b_proj` is split by the converter into `attn_k_b` / `attn_v_b` for
//! llama.cpp's absorbed attention; `kv_b` reassembles it exactly (rows are
//! read back, never recomputed). Files from converters that kept it whole
//! (`attn_kv_b`) are read as they are.
//!
//! `expert_gating_func`: the converter writes it only when config.json
//! has `scoring_func` (transformers 5's `save_pretrained` drops it), and
//! llama.cpp routes a file without it with **softmax**, DeepSeek-V2's
//! function (deepseek2.cpp:22-31). WASTE runs only V3's sigmoid, so a file
//! without the key is refused rather than guessed: llama.cpp and WASTE
//! would disagree on it whichever way we picked.

use serde_json::{json, Value as Json};

use super::{base, sigmoid_moe, yarn, GgufFile, Keys, KvB, Slice};
use crate::error::{Error, Result};

pub(super) fn config(k: &Keys) -> Result<Json> {
    let g = k.g;
    let path = g.path().display();
    match k.usize_opt("expert_gating_func")? {
        Some(2) => {}
        None => {
            return Err(Error::Unsupported(format!(
                "{path}: deepseek2 without `deepseek2.expert_gating_func`: llama.cpp routes such a file with softmax \
                 (DeepSeek-V2), WASTE runs DeepSeek-V3 / Kimi-K2's sigmoid only; reconvert with `scoring_func: sigmoid` \
                 in config.json"
            )))
        }
        Some(f) => {
            return Err(Error::Unsupported(format!(
                "{path}: deepseek2 with expert_gating_func {f} (WASTE runs sigmoid, 2, only)"
            )))
        }
    }
    let layers = k.usize_req("block_count")?;
    let mut c = base(k, "DeepseekV3ForCausalLM", "deepseek_v3", layers)?;
    let heads = k.usize_req("attention.head_count")?;
    // The absorbed view says one KV head; HF's MLA expands the latent to every head.
    c.insert("num_key_value_heads".into(), json!(heads));
    let split = g.tensor("blk.0.attn_k_b.weight").is_some();
    let rope = k.usize_req("rope.dimension_count")?;
    // `key_length_mla` / `value_length_mla` with the split kv_b (key_length
    // is then kv_lora + rope); key_length / value_length without it.
    let (qk, v) = match (k.usize_opt("attention.key_length_mla")?, k.usize_opt("attention.value_length_mla")?) {
        (Some(qk), Some(v)) => (qk, v),
        _ if !split => (k.usize_req("attention.key_length")?, k.usize_req("attention.value_length")?),
        _ => return Err(k.err("deepseek2.attention.key_length_mla", "missing with a split kv_b (attn_k_b)")),
    };
    let nope = qk.checked_sub(rope).ok_or_else(|| k.err("deepseek2.rope.dimension_count", "exceeds the key length"))?;
    c.insert("kv_lora_rank".into(), json!(k.usize_req("attention.kv_lora_rank")?));
    if g.tensor("blk.0.attn_q_a.weight").is_some() {
        c.insert("q_lora_rank".into(), json!(k.usize_req("attention.q_lora_rank")?));
    } else {
        c.insert("q_lora_rank".into(), Json::Null);
    }
    c.insert("qk_nope_head_dim".into(), json!(nope));
    c.insert("qk_rope_head_dim".into(), json!(rope));
    c.insert("qk_head_dim".into(), json!(qk));
    c.insert("v_head_dim".into(), json!(v));
    c.insert("head_dim".into(), json!(rope));
    // GGUF keeps HF's interleaved rope rows (NORM rope, no permute).
    c.insert("rope_interleave".into(), json!(true));
    let theta = k.f64_opt("rope.freq_base")?.unwrap_or(10_000.0);
    let mut params = yarn(k)?.unwrap_or_default();
    if params.is_empty() {
        params.insert("rope_type".into(), json!("default"));
    } else {
        // The converter writes 0.1 * mscale_all_dim; llama.cpp takes mscale
        // equal to it (llama-context.cpp, TAG_DEEPSEEK2_YARN_LOG_MUL_FIX).
        let log_mul = k
            .f64_opt("rope.scaling.yarn_log_multiplier")?
            .ok_or_else(|| k.err("deepseek2.rope.scaling.yarn_log_multiplier", "missing with yarn"))?;
        let m: f64 = ((log_mul * 10.0) as f32).to_string().parse().unwrap_or(log_mul * 10.0);
        params.insert("mscale".into(), json!(m));
        params.insert("mscale_all_dim".into(), json!(m));
    }
    params.insert("rope_theta".into(), json!(theta));
    c.insert("rope_parameters".into(), Json::Object(params));
    c.insert("attention_bias".into(), json!(false));
    c.insert("scoring_func".into(), json!("sigmoid"));
    c.insert("topk_method".into(), json!("noaux_tc"));
    sigmoid_moe(k, &mut c, layers)?;
    Ok(Json::Object(c))
}

/// The HF name (after `self_attn.`) of a deepseek2 attention tensor.
pub(super) fn attention(rest: &str) -> Option<&'static str> {
    Some(match rest {
        "attn_q_a.weight" => "q_a_proj.weight",
        "attn_q_a_norm.weight" => "q_a_layernorm.weight",
        "attn_q_b.weight" => "q_b_proj.weight",
        "attn_kv_a_mqa.weight" => "kv_a_proj_with_mqa.weight",
        "attn_kv_a_norm.weight" => "kv_a_layernorm.weight",
        "attn_kv_b.weight" => "kv_b_proj.weight",
        _ => return None,
    })
}

/// `kv_b_proj` of a layer from its `attn_k_b` (tensor `i`) and `attn_v_b`.
pub(super) fn kv_b(g: &GgufFile, i: usize, layer: usize) -> Result<Slice> {
    let k_b = &g.tensors[i];
    let v_name = format!("blk.{layer}.attn_v_b.weight");
    let v_b = g
        .tensors
        .iter()
        .position(|t| t.name == v_name)
        .ok_or_else(|| Error::format(g.path(), format!("tensor `{}` without `{v_name}`", k_b.name)))?;
    let (&[nope, lora, heads], &[lora2, v, heads2]) = (&k_b.ne[..], &g.tensors[v_b].ne[..]) else {
        return Err(Error::format(
            g.path(),
            format!("`{}` / `{v_name}`: expected 3 dimensions, have {:?} / {:?}", k_b.name, k_b.ne, g.tensors[v_b].ne),
        ));
    };
    if lora != lora2 || heads != heads2 {
        return Err(Error::format(
            g.path(),
            format!("`{}` {:?} and `{v_name}` {:?} disagree on kv_lora or heads", k_b.name, k_b.ne, g.tensors[v_b].ne),
        ));
    }
    let [nope, v, lora, heads] = [nope, v, lora, heads].map(|x| x as usize);
    let rows = heads * (nope + v);
    Ok(Slice {
        tensor: i,
        first_row: 0,
        rows: rows as u64,
        shape: vec![rows, lora],
        unpermute_heads: None,
        kv_b: Some(KvB { v_b, heads, nope, v, kv_lora: lora }),
    })
}
