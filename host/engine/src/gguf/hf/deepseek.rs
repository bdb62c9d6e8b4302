//! `deepseek2` (DeepSeek-V3, Kimi-K2; `conversion/deepseek.py`,
//! `src/models/deepseek2.cpp`) as transformers' `deepseek_v3`
//! (GGUF_NOTES.md 4.6): MLA with an optional q-LoRA, leading dense layers,
//! shared experts, a sigmoid router with `exp_probs_b` and groups, YaRN.
//! `deepseek32` (DeepSeek-V3.2, `src/models/deepseek32.cpp`) and `glm-dsa`
//! (GLM-5, `conversion/glm.py:316`, `src/models/glm-dsa.cpp`) are the same
//! layer with DSA's lightning indexer (`blk.L.indexer.*`, copied from
//! `self_attn.indexer.*`) and the MTP block appended after the last layer
//! (`nextn_predict_layers`), as transformers' `deepseek_v32` and
//! `glm_moe_dsa` (GGUF_NOTES.md 4.10).
//!
//! `kv_b_proj` is split by the converter into `attn_k_b` / `attn_v_b` for
//! llama.cpp's absorbed attention; `kv_b` reassembles it exactly (rows are
//! read back, never recomputed). Files from converters that kept it whole
//! (`attn_kv_b`) are read as they are.
//!
//! `expert_gating_func`: the converter writes it only when config.json
//! has `scoring_func` (transformers 5's `save_pretrained` drops it), and
//! llama.cpp routes a deepseek2 file without it with **softmax**,
//! DeepSeek-V2's function (deepseek2.cpp:22-31), and refuses a deepseek32
//! one. WASTE runs only V3's sigmoid, so such a file is refused rather than
//! guessed: llama.cpp and WASTE would disagree on it whichever way we
//! picked. glm-dsa defaults to sigmoid (glm-dsa.cpp:53-57), as we do.

use serde_json::{json, Value as Json};

use super::{base, decoder_layers, sigmoid_moe, yarn, GgufFile, Keys, KvB, Slice};
use crate::error::{Error, Result};

/// Which MLA architecture a file is.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Variant {
    /// `deepseek2` as `deepseek_v3`.
    V3,
    /// `deepseek32` as `deepseek_v32`.
    V32,
    /// `glm-dsa` as `glm_moe_dsa`.
    GlmDsa,
}

impl Variant {
    /// The variant of the family row whose `model_type` the file's
    /// architecture named.
    pub(super) fn of(model_type: &str) -> Variant {
        match model_type {
            "deepseek_v32" => Variant::V32,
            "glm_moe_dsa" => Variant::GlmDsa,
            _ => Variant::V3,
        }
    }

    fn names(self) -> (&'static str, &'static str) {
        match self {
            Variant::V3 => ("DeepseekV3ForCausalLM", "deepseek_v3"),
            Variant::V32 => ("DeepseekV32ForCausalLM", "deepseek_v32"),
            Variant::GlmDsa => ("GlmMoeDsaForCausalLM", "glm_moe_dsa"),
        }
    }
}

/// llama.cpp assumes GLM-5.2's pattern of full and shared indexers for a
/// glm-dsa file with a context this long and no `attention.indexer.types`
/// (glm-dsa.cpp:59-65); shorter ones have an indexer in every layer.
const GLM_5_2_CONTEXT: usize = 1 << 20;

pub(super) fn config(k: &Keys, variant: Variant) -> Result<Json> {
    let g = k.g;
    let path = g.path().display();
    match k.usize_opt("expert_gating_func")? {
        Some(2) => {}
        None if variant == Variant::GlmDsa => {}
        None => {
            return Err(Error::Unsupported(format!(
                "{path}: {} without `{}.expert_gating_func`: llama.cpp routes such a file with softmax \
                 (DeepSeek-V2) or refuses it, WASTE runs DeepSeek-V3's sigmoid only; reconvert with \
                 `scoring_func: sigmoid` in config.json",
                k.arch, k.arch
            )))
        }
        Some(f) => {
            return Err(Error::Unsupported(format!(
                "{path}: {} with expert_gating_func {f} (WASTE runs sigmoid, 2, only)",
                k.arch
            )))
        }
    }
    // deepseek2's converter drops the MTP layer; the DSA ones append it.
    let (layers, nextn) = match variant {
        Variant::V3 => (k.usize_req("block_count")?, 0),
        Variant::V32 | Variant::GlmDsa => decoder_layers(k)?,
    };
    let (architecture, model_type) = variant.names();
    let mut c = base(k, architecture, model_type, layers)?;
    c.insert("num_nextn_predict_layers".into(), json!(nextn));
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
    // GGUF keeps HF's rope rows (NORM rope, no permute); deepseek_v3 spells
    // its default out, the DSA types rely on their config classes'.
    if variant == Variant::V3 {
        c.insert("rope_interleave".into(), json!(true));
    }
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
    if variant != Variant::V3 {
        dsa(k, &mut c, variant, layers)?;
    }
    Ok(Json::Object(c))
}

/// The indexer's keys (`attention.indexer.*`) as HF's `index_*`, and
/// glm-dsa's full / shared indexer per layer as `indexer_types`.
fn dsa(k: &Keys, c: &mut serde_json::Map<String, Json>, variant: Variant, layers: usize) -> Result<()> {
    c.insert("index_n_heads".into(), json!(k.usize_req("attention.indexer.head_count")?));
    c.insert("index_head_dim".into(), json!(k.usize_req("attention.indexer.key_length")?));
    c.insert("index_topk".into(), json!(k.usize_req("attention.indexer.top_k")?));
    let full: Vec<bool> = match k.get("attention.indexer.types") {
        Some(super::Value::Array(items)) => items
            .iter()
            .map(|v| v.as_bool())
            .collect::<Option<Vec<bool>>>()
            .filter(|v| v.len() >= layers)
            .ok_or_else(|| k.err(&format!("{}.attention.indexer.types", k.arch), "expected a bool per layer"))?,
        Some(_) => return Err(k.err(&format!("{}.attention.indexer.types", k.arch), "expected an array of bools")),
        None if variant == Variant::GlmDsa && k.usize_opt("context_length")?.unwrap_or(0) >= GLM_5_2_CONTEXT => {
            return Err(Error::Unsupported(format!(
                "{}: glm-dsa without `glm-dsa.attention.indexer.types` and a context of 1M: llama.cpp assumes \
                 GLM-5.2's built-in pattern of shared indexers; reconvert with a converter that writes the key",
                k.g.path().display()
            )))
        }
        None => vec![true; layers],
    };
    for (l, &own) in full.iter().enumerate().take(layers) {
        let has = k.g.tensor(&format!("blk.{l}.indexer.proj.weight")).is_some();
        if has != own {
            let (said, found) = match own {
                true => ("its own indexer", "lacks"),
                false => ("a shared indexer", "has"),
            };
            return Err(Error::format(
                k.g.path(),
                format!("layer {l}: the indexer types say {said}, but the file {found} indexer tensors"),
            ));
        }
    }
    if variant == Variant::GlmDsa {
        let kinds: Vec<&str> = full[..layers].iter().map(|&f| if f { "full" } else { "shared" }).collect();
        c.insert("indexer_types".into(), json!(kinds));
    } else if full.iter().take(layers).any(|f| !f) {
        return Err(Error::Unsupported(format!("{}: deepseek32 with shared indexers", k.g.path().display())));
    }
    Ok(())
}

/// The HF name (after `self_attn.`) of a DSA indexer tensor
/// (`blk.L.indexer.*`).
pub(super) fn indexer(rest: &str) -> Option<&'static str> {
    Some(match rest {
        "indexer.k_norm.weight" => "indexer.k_norm.weight",
        "indexer.k_norm.bias" => "indexer.k_norm.bias",
        "indexer.proj.weight" => "indexer.weights_proj.weight",
        "indexer.attn_k.weight" => "indexer.wk.weight",
        "indexer.attn_q_b.weight" => "indexer.wq_b.weight",
        _ => return None,
    })
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
        kv_b: Some(KvB { v_b, heads, nope, v, kv_lora: lora }),
        ..Slice::rows(i, 0, rows as u64, vec![rows, lora])
    })
}
