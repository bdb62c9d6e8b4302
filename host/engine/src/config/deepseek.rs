//! DeepSeek-V3 and Kimi-K2 (`model_type: deepseek_v3` / `kimi_k2`, both
//! `DeepseekV3ForCausalLM`): MLA on every layer with an optional low-rank
//! query (`q_lora_rank`), RoPE on the rope parts (interleaved pairs unless
//! `rope_interleave: false`) with optional YaRN scaling, a sigmoid router
//! with a score-correction bias and group-limited selection (`n_group`,
//! `topk_group`), shared experts, and dense MLPs on the first
//! `first_k_dense_replace` layers.
//!
//! Config keys follow transformers 5.24 `DeepseekV3Config`; released
//! checkpoints write `rope_scaling` (with `type`) and a top-level
//! `rope_theta`, transformers writes `rope_parameters` (with `rope_type`).

use std::collections::HashSet;
use std::path::Path;

use serde_json::Value;

use super::layout::MlpTensors;
use super::{
    AttnKind, Common, Family, MlaDims, ModelConfig, Reader, RouterKind, MAX_EXPERTS, MAX_HEADS, MAX_HEAD_DIM,
    MAX_INTER, MAX_POSITIONS,
};
use crate::error::{Error, Result};

/// YaRN parameters (`_compute_yarn_parameters` in modeling_rope_utils.py).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    pub factor: f64,
    pub original_max_position_embeddings: usize,
    pub beta_fast: f64,
    pub beta_slow: f64,
    /// Multiplies cos and sin (`attention_scaling` of the rotary module).
    pub attention_factor: f64,
    /// Round the correction range outward (`truncate`, default true).
    pub truncate: bool,
}

/// Rotary embedding of the rope part of MLA queries and keys.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MlaRope {
    pub theta: f64,
    /// Rotated width: `qk_rope_head_dim`.
    pub dim: usize,
    /// DeepSeek's layout: pairs `(x0, x1), (x2, x3), ...` share a frequency.
    pub interleave: bool,
    pub yarn: Option<Yarn>,
    /// Factor on `qk_head_dim^-1/2` (`yarn_apply_mscale`: mscale(factor,
    /// mscale_all_dim)^2 when `mscale_all_dim` is set, else 1).
    pub softmax_scale_factor: f64,
}

/// `yarn_get_mscale`.
fn get_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

/// The YaRN keys of the rope object `sub` (found under `key`): the scaling
/// and the factor MLA's softmax scale is multiplied by (`mscale_all_dim`).
pub(super) fn read_yarn(r: &Reader<'_>, sub: &Reader<'_>, key: &str, max_pos: usize) -> Result<(Yarn, f64)> {
    let orig = sub
        .usize_opt("original_max_position_embeddings")?
        .ok_or_else(|| r.err(key, "YaRN needs `original_max_position_embeddings`"))?;
    let orig = sub.bounded("original_max_position_embeddings", orig, MAX_POSITIONS)?;
    let factor = sub.f64_opt("factor")?.unwrap_or(max_pos as f64 / orig as f64);
    if !(factor > 0.0 && factor < 1e6) {
        return Err(r.err(key, format!("`factor` {factor} is not a positive factor")));
    }
    let nonzero = |k: &str, d: f64| -> Result<f64> { Ok(sub.f64_opt(k)?.filter(|&v| v != 0.0).unwrap_or(d)) };
    let mscale = sub.f64_opt("mscale")?.unwrap_or(0.0);
    let mscale_all_dim = sub.f64_opt("mscale_all_dim")?.unwrap_or(0.0);
    let attention_factor = match sub.f64_opt("attention_factor")? {
        Some(a) => a,
        None if mscale != 0.0 && mscale_all_dim != 0.0 => {
            get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
        }
        None => get_mscale(factor, 1.0),
    };
    let mut softmax_scale_factor = 1.0;
    if mscale_all_dim != 0.0 {
        let m = get_mscale(factor, mscale_all_dim);
        softmax_scale_factor = m * m;
    }
    let yarn = Yarn {
        factor,
        original_max_position_embeddings: orig,
        beta_fast: nonzero("beta_fast", 32.0)?,
        beta_slow: nonzero("beta_slow", 1.0)?,
        attention_factor,
        truncate: sub.bool_opt("truncate")?.unwrap_or(true),
    };
    Ok((yarn, softmax_scale_factor))
}

fn read_rope(r: &Reader<'_>, dim: usize, max_pos: usize) -> Result<MlaRope> {
    let mut theta = r.f64_opt("rope_theta")?;
    let mut yarn = None;
    let mut softmax_scale_factor = 1.0;
    let key = ["rope_parameters", "rope_scaling"].into_iter().find(|k| r.get(k).is_some());
    if let Some(key) = key {
        let Some(Value::Object(obj)) = r.get(key) else {
            return Err(r.err(key, "expected an object"));
        };
        let sub = Reader { obj, path: r.path };
        if let Some(t) = sub.f64_opt("rope_theta")? {
            theta = Some(t);
        }
        let kind = sub.rope_type()?.unwrap_or("default");
        match kind {
            "default" => {}
            "yarn" => {
                let (y, scale) = read_yarn(r, &sub, key, max_pos)?;
                yarn = Some(y);
                softmax_scale_factor = scale;
            }
            other => return Err(r.unsupported(key, format!("rope_type `{other}` (default and yarn only)"))),
        }
        if let Some(f) = sub.f64_opt("partial_rotary_factor")? {
            if f != 1.0 {
                return Err(r.unsupported(key, format!("partial_rotary_factor {f}")));
            }
        }
    }
    let theta = theta.unwrap_or(1e4);
    if theta <= 1.0 {
        return Err(r.err("rope_theta", format!("{theta} must be > 1")));
    }
    if !dim.is_multiple_of(2) {
        return Err(r.err("qk_rope_head_dim", format!("{dim} must be even for RoPE")));
    }
    Ok(MlaRope { theta, dim, interleave: r.bool_opt("rope_interleave")?.unwrap_or(true), yarn, softmax_scale_factor })
}

/// The table's parser (`family::FAMILIES`): the common dimensions, then
/// this family's own keys.
pub(super) fn parse_config(r: &Reader<'_>, _family: Family, model_type: &str) -> Result<ModelConfig> {
    r.require_silu()?;
    parse(r, model_type, Common::read(r)?)
}

pub(super) fn parse(r: &Reader<'_>, model_type: &str, common: Common) -> Result<ModelConfig> {
    let num_layers = common.num_layers;
    let num_heads = r.bounded("num_attention_heads", r.usize_req("num_attention_heads")?, MAX_HEADS)?;
    if let Some(kv) = r.usize_opt("num_key_value_heads")? {
        if kv != num_heads {
            return Err(r.unsupported(
                "num_key_value_heads",
                format!("{kv} != num_attention_heads {num_heads} (MLA expands one latent to every head)"),
            ));
        }
    }
    let head = |key: &str| -> Result<usize> { r.bounded(key, r.usize_req(key)?, MAX_HEAD_DIM) };
    let q_lora_rank = match r.usize_opt("q_lora_rank")? {
        None => None,
        Some(q) => Some(r.bounded("q_lora_rank", q, MAX_INTER)?),
    };
    let mla = MlaDims {
        num_heads,
        kv_lora_rank: r.bounded("kv_lora_rank", r.usize_req("kv_lora_rank")?, MAX_INTER)?,
        qk_nope_head_dim: head("qk_nope_head_dim")?,
        qk_rope_head_dim: head("qk_rope_head_dim")?,
        v_head_dim: head("v_head_dim")?,
        q_lora_rank,
    };
    let max_position_embeddings =
        r.bounded("max_position_embeddings", r.usize_opt("max_position_embeddings")?.unwrap_or(4096), MAX_POSITIONS)?;
    let mut rope = read_rope(r, mla.qk_rope_head_dim, max_position_embeddings)?;
    let dsa = if super::is_dsa_model_type(model_type) {
        // Both DSA families rotate MLA's rope dims interleaved whatever the
        // config says (`apply_rotary_pos_emb_interleave` unconditionally).
        rope.interleave = true;
        if mla.q_lora_rank.is_none() {
            return Err(
                r.err("q_lora_rank", "is required: the DSA indexer projects its queries from the q-LoRA latent")
            );
        }
        Some(super::dsa::parse(r, model_type, num_layers, mla.qk_rope_head_dim)?)
    } else {
        None
    };

    // MoE.
    let num_experts = r.bounded("n_routed_experts", r.usize_req("n_routed_experts")?, MAX_EXPERTS)?;
    let top_k = r.usize_opt("num_experts_per_tok")?.unwrap_or(8);
    if top_k == 0 || top_k > num_experts {
        return Err(r.err("num_experts_per_tok", format!("{top_k} is outside 1..={num_experts}")));
    }
    if let Some(f) = r.usize_opt("moe_layer_freq")? {
        if f != 1 {
            return Err(r.unsupported("moe_layer_freq", format!("{f} (only 1)")));
        }
    }
    for (key, want) in [("scoring_func", "sigmoid"), ("topk_method", "noaux_tc")] {
        if let Some(v) = r.str_opt(key)? {
            if v != want {
                return Err(r.unsupported(key, format!("`{v}` (only {want})")));
            }
        }
    }
    let moe_layers = moe_layers(r, num_layers)?;
    let (moe_intermediate_size, intermediate_size) = r.ffn_widths(&moe_layers, MAX_INTER)?;
    let n_shared = r.usize_opt("n_shared_experts")?.unwrap_or(1);
    if n_shared > 64 {
        return Err(r.err("n_shared_experts", format!("{n_shared} exceeds 64")));
    }
    let scale = r.f64_opt("routed_scaling_factor")?.unwrap_or(2.5);
    if !(scale > 0.0 && scale < 1e6) {
        return Err(r.err("routed_scaling_factor", format!("{scale} is not a positive factor")));
    }
    let n_group = r.usize_opt("n_group")?.unwrap_or(1).max(1);
    let topk_group = r.usize_opt("topk_group")?.unwrap_or(n_group);
    if num_experts % n_group != 0 {
        return Err(r.err("n_group", format!("{n_group} groups do not divide {num_experts} experts")));
    }
    if topk_group == 0 || topk_group > n_group {
        return Err(r.err("topk_group", format!("{topk_group} is outside 1..={n_group}")));
    }
    let expert_groups = if n_group > 1 {
        // A group's score is the sum of its two best experts.
        if num_experts / n_group < 2 {
            return Err(
                r.err("n_group", format!("{n_group} groups of {num_experts} experts leave fewer than 2 per group"))
            );
        }
        if top_k > topk_group * (num_experts / n_group) {
            return Err(r.err(
                "num_experts_per_tok",
                format!("{top_k} exceeds the {topk_group} kept groups of {} experts", num_experts / n_group),
            ));
        }
        Some((n_group, topk_group))
    } else {
        None
    };

    let rms_norm_eps = r.rms_norm_eps(1e-6)?;

    Ok(ModelConfig {
        num_heads,
        num_kv_heads: num_heads,
        head_dim: mla.qk_head_dim(),
        rope_theta: rope.theta,
        rms_norm_eps,
        attention_bias: r.bool_opt("attention_bias")?.unwrap_or(false),
        num_experts,
        top_k,
        moe_intermediate_size,
        intermediate_size,
        norm_topk_prob: r.bool_opt("norm_topk_prob")?.unwrap_or(true),
        moe_layers,
        max_position_embeddings,
        attn_kinds: vec![AttnKind::Mla; num_layers],
        mla: Some(mla),
        router: RouterKind::SigmoidBias { routed_scaling_factor: scale as f32 },
        shared_intermediate_size: moe_intermediate_size * n_shared,
        mla_rope: Some(rope),
        expert_groups,
        add: super::Switches { dsa, ..super::Switches::default() },
        ..ModelConfig::plain(Family::DeepseekV3, model_type, common)
    })
}

/// Which layers are MoE: `mlp_layer_types` (transformers' DeepSeek-V3.2 and
/// GLM-5 configs write it) or the first `first_k_dense_replace` dense.
fn moe_layers(r: &Reader<'_>, num_layers: usize) -> Result<Vec<bool>> {
    if let Some(kinds) = r.label_list("mlp_layer_types", num_layers, false, &[("sparse", true), ("dense", false)])? {
        return Ok(kinds);
    }
    let first_dense = r.usize_opt("first_k_dense_replace")?.unwrap_or(3);
    Ok((0..num_layers).map(|l| l >= first_dense).collect())
}

/// `self_attn.*` tensor names of DeepSeek MLA layer `layer`.
/// A config whose dense-layer count disagrees with the checkpoint fails
/// naming the layer and the tensor.
pub(super) fn check_layer_tensors(cfg: &ModelConfig, names: &HashSet<&str>, file: &Path) -> Result<()> {
    for l in 0..cfg.num_layers {
        let router = cfg.router_name(l);
        let dense = MlpTensors::dense(cfg, l).gate_proj.name;
        let (moe, has_router, has_dense) =
            (cfg.is_moe_layer(l), names.contains(router.as_str()), names.contains(dense.as_str()));
        if (moe && !has_router && has_dense) || (!moe && has_router) {
            return Err(Error::format(
                file,
                format!(
                    "config.json (`first_k_dense_replace`) makes layer {l} {}, but the checkpoint holds `{}`",
                    if moe { "MoE" } else { "dense" },
                    if moe { &dense } else { &router }
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::*;

    fn fixture_json() -> serde_json::Value {
        let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/tiny-deepseek_v3/config.json");
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    }

    fn parse(v: &serde_json::Value) -> Result<ModelConfig> {
        ModelConfig::from_json_str(&v.to_string(), Path::new("/x/config.json"))
    }

    /// Released DeepSeek-V3 / Kimi-K2 configs write `rope_scaling` with
    /// `type`, a top-level `rope_theta` and no `rope_interleave`.
    #[test]
    fn released_layout_equals_transformers_layout() {
        let a = parse(&fixture_json()).unwrap();
        let mut v = fixture_json();
        let o = v.as_object_mut().unwrap();
        let mut rs = o.remove("rope_parameters").unwrap();
        let rs_o = rs.as_object_mut().unwrap();
        rs_o.remove("rope_type");
        rs_o.remove("rope_theta");
        rs_o.insert("type".into(), "yarn".into());
        o.insert("rope_scaling".into(), rs);
        o.insert("rope_theta".into(), 10000.0.into());
        o.remove("rope_interleave");
        o.insert("scoring_func".into(), "sigmoid".into());
        o.insert("topk_method".into(), "noaux_tc".into());
        o.insert("moe_layer_freq".into(), 1.into());
        let b = parse(&v).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.family, Family::DeepseekV3);
        assert_eq!(a.expert_groups, Some((4, 2)));
        assert_eq!(a.moe_layers, vec![false, false, true, true]);
        v["model_type"] = "kimi_k2".into();
        assert_eq!(parse(&v).unwrap().family, Family::DeepseekV3);
    }

    #[test]
    fn bad_routing_keys_are_named() {
        let mut v = fixture_json();
        v["n_group"] = 3.into();
        let e = parse(&v).unwrap_err().to_string();
        assert!(e.contains("n_group") && e.contains("/x/config.json"), "{e}");
        let mut v = fixture_json();
        v["topk_group"] = 5.into();
        assert!(parse(&v).unwrap_err().to_string().contains("topk_group"));
        let mut v = fixture_json();
        v["topk_method"] = "greedy".into();
        assert!(matches!(parse(&v), Err(Error::Unsupported(_))));
        let mut v = fixture_json();
        v["rope_parameters"]["rope_type"] = "longrope".into();
        assert!(matches!(parse(&v), Err(Error::Unsupported(_))));
    }
}
