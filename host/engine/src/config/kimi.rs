//! Kimi-Linear (`model_type: kimi_linear`): KDA and MLA layers, a sigmoid
//! router with a score-correction bias and shared experts.
//!
//! Two config layouts exist. The released checkpoints write
//! `linear_attn_config: {kda_layers, full_attn_layers (1-based), head_dim,
//! num_heads, short_conv_kernel_size}` and `first_k_dense_replace`;
//! transformers 5 writes `layer_types`, `mlp_layer_types`, `linear_head_dim`,
//! `linear_num_heads`, `linear_conv_kernel_dim`. Precedence follows
//! `KimiLinearConfig.__post_init__`: `layer_types` > `linear_attn_config` >
//! the default (MLA at 0-based i > 0 with i % 4 == 0). Several keys have
//! aliases (`attribute_map`): num_experts / num_local_experts,
//! num_experts_per_token / num_experts_per_tok, moe_renormalize /
//! norm_topk_prob, num_shared_experts / n_shared_experts, num_expert_group /
//! n_group, model_max_length / max_position_embeddings.

use std::collections::HashSet;
use std::path::Path;

use serde_json::Value;

use super::layout::MlpTensors;
use super::{
    AttnKind, Common, Family, KdaDims, MlaDims, ModelConfig, Reader, RouterKind, MAX_EXPERTS, MAX_HEADS, MAX_HEAD_DIM,
    MAX_INTER, MAX_LAYERS, MAX_POSITIONS,
};
use crate::error::{Error, Result};

/// The first of `keys` present in the config.
fn first_key<'k>(r: &Reader<'_>, keys: &[&'k str]) -> &'k str {
    keys.iter().copied().find(|k| r.get(k).is_some()).unwrap_or(keys[0])
}

/// The table's parser (`family::FAMILIES`): the common dimensions, then
/// this family's own keys.
pub(super) fn parse_config(r: &Reader<'_>, _family: Family, _model_type: &str) -> Result<ModelConfig> {
    r.require_silu()?;
    parse(r, Common::read(r)?)
}

pub(super) fn parse(r: &Reader<'_>, common: Common) -> Result<ModelConfig> {
    let num_layers = common.num_layers;
    let lac = match r.get("linear_attn_config") {
        None => None,
        Some(Value::Object(obj)) => Some(Reader { obj, path: r.path }),
        Some(v) => return Err(r.err("linear_attn_config", format!("expected an object, found {v}"))),
    };

    let attn_kinds = layer_kinds(r, lac.as_ref(), num_layers)?;

    // MLA.
    let num_heads = r.bounded("num_attention_heads", r.usize_req("num_attention_heads")?, MAX_HEADS)?;
    if let Some(kv) = r.usize_opt("num_key_value_heads")? {
        if kv != num_heads {
            return Err(r.unsupported(
                "num_key_value_heads",
                format!("{kv} != num_attention_heads {num_heads} (MLA expands one latent to every head)"),
            ));
        }
    }
    if r.usize_opt("q_lora_rank")?.is_some() {
        return Err(r.unsupported("q_lora_rank", "a low-rank query (Kimi-Linear has none)"));
    }
    if r.bool_opt("mla_use_nope")? == Some(false) {
        return Err(r.unsupported("mla_use_nope", "false (RoPE on MLA layers)"));
    }
    let mla = if attn_kinds.contains(&AttnKind::Mla) {
        let dim = |key: &str| -> Result<usize> { r.bounded(key, r.usize_req(key)?, MAX_INTER) };
        Some(MlaDims {
            num_heads,
            kv_lora_rank: dim("kv_lora_rank")?,
            qk_nope_head_dim: r.bounded("qk_nope_head_dim", r.usize_req("qk_nope_head_dim")?, MAX_HEAD_DIM)?,
            qk_rope_head_dim: r.bounded("qk_rope_head_dim", r.usize_req("qk_rope_head_dim")?, MAX_HEAD_DIM)?,
            v_head_dim: r.bounded("v_head_dim", r.usize_req("v_head_dim")?, MAX_HEAD_DIM)?,
            q_lora_rank: None,
        })
    } else {
        None
    };

    // KDA: `linear_attn_config` wins over the transformers keys.
    let kda = if attn_kinds.contains(&AttnKind::Kda) {
        let pick = |lac_key: &str, key: &str, default: usize, max: usize| -> Result<usize> {
            if let Some(l) = &lac {
                if let Some(v) = l.usize_opt(lac_key)? {
                    return l
                        .bounded(lac_key, v, max)
                        .map_err(|_| r.err("linear_attn_config", format!("`{lac_key}` {v} is outside 1..={max}")));
                }
            }
            r.bounded(key, r.usize_opt(key)?.unwrap_or(default), max)
        };
        let dims = KdaDims {
            num_heads: pick("num_heads", "linear_num_heads", 32, MAX_HEADS)?,
            head_dim: pick("head_dim", "linear_head_dim", 128, MAX_HEAD_DIM)?,
            conv_kernel: pick("short_conv_kernel_size", "linear_conv_kernel_dim", 4, 64)?,
        };
        if dims.conv_kernel < 2 {
            return Err(r.err("linear_conv_kernel_dim", "a short convolution needs a kernel of at least 2"));
        }
        Some(dims)
    } else {
        None
    };

    // MoE.
    let experts_key = first_key(r, &["num_experts", "num_local_experts", "n_routed_experts"]);
    let num_experts = r.bounded(experts_key, r.usize_req(experts_key)?, MAX_EXPERTS)?;
    let topk_key = first_key(r, &["num_experts_per_token", "num_experts_per_tok"]);
    let top_k = r.usize_opt(topk_key)?.unwrap_or(8);
    if top_k == 0 || top_k > num_experts {
        return Err(r.err(topk_key, format!("{top_k} is outside 1..={num_experts}")));
    }
    let moe_layers = mlp_kinds(r, num_layers)?;
    let (moe_intermediate_size, intermediate_size) = r.ffn_widths(&moe_layers, MAX_INTER)?;
    let shared_key = first_key(r, &["num_shared_experts", "n_shared_experts"]);
    let n_shared = r.usize_opt(shared_key)?.unwrap_or(1);
    if n_shared > 64 {
        return Err(r.err(shared_key, format!("{n_shared} exceeds 64")));
    }
    let norm_key = first_key(r, &["moe_renormalize", "norm_topk_prob"]);
    let norm_topk_prob = r.bool_opt(norm_key)?.unwrap_or(true);
    let scale = r.f64_opt("routed_scaling_factor")?.unwrap_or(2.446);
    if !(scale > 0.0 && scale < 1e6) {
        return Err(r.err("routed_scaling_factor", format!("{scale} is not a positive factor")));
    }
    if let Some(f) = r.str_opt("moe_router_activation_func")? {
        if f != "sigmoid" {
            return Err(r.unsupported("moe_router_activation_func", format!("`{f}` (only sigmoid)")));
        }
    }
    let group_key = first_key(r, &["num_expert_group", "n_group"]);
    let n_group = r.usize_opt(group_key)?.unwrap_or(1).max(1);
    let topk_group = r.usize_opt("topk_group")?.unwrap_or(1).max(1);
    // With every group kept, grouped selection is plain top-k.
    if n_group > 1 && topk_group < n_group {
        return Err(r.unsupported(
            group_key,
            format!("{n_group} expert groups with topk_group {topk_group} (group-limited routing)"),
        ));
    }

    let rms_norm_eps = r.rms_norm_eps(1e-5)?;
    let pos_key = first_key(r, &["model_max_length", "max_position_embeddings"]);
    let max_position_embeddings = r.bounded(pos_key, r.usize_opt(pos_key)?.unwrap_or(1 << 20), MAX_POSITIONS)?;
    let head_dim = mla.map_or(1, |m| m.qk_head_dim());

    Ok(ModelConfig {
        num_heads,
        num_kv_heads: num_heads,
        head_dim,
        // Kimi-Linear applies no positional encoding anywhere.
        rope_theta: 1e4,
        rms_norm_eps,
        attention_bias: r.bool_opt("attention_bias")?.unwrap_or(false),
        num_experts,
        top_k,
        moe_intermediate_size,
        intermediate_size,
        norm_topk_prob,
        moe_layers,
        max_position_embeddings,
        moe_block: "block_sparse_moe".to_string(),
        attn_kinds,
        mla,
        kda,
        router: RouterKind::SigmoidBias { routed_scaling_factor: scale as f32 },
        shared_intermediate_size: moe_intermediate_size * n_shared,
        ..ModelConfig::plain(Family::KimiLinear, "kimi_linear", common)
    })
}

fn layer_kinds(r: &Reader<'_>, lac: Option<&Reader<'_>>, n: usize) -> Result<Vec<AttnKind>> {
    if let Some(v) = r.get("layer_types") {
        let Some(items) = v.as_array() else {
            return Err(r.err("layer_types", format!("expected a list of strings, found {v}")));
        };
        if items.len() != n {
            return Err(r.err("layer_types", format!("{} entries for num_hidden_layers {n}", items.len())));
        }
        return items
            .iter()
            .enumerate()
            .map(|(i, t)| match t.as_str() {
                Some("linear_attention") => Ok(AttnKind::Kda),
                Some("full_attention") => Ok(AttnKind::Mla),
                _ => Err(r.err(
                    "layer_types",
                    format!("entry {i} is {t}; expected \"linear_attention\" or \"full_attention\""),
                )),
            })
            .collect();
    }
    if let Some(l) = lac {
        if l.get("kda_layers").is_some() && l.get("full_attn_layers").is_some() {
            let mut kinds: Vec<Option<AttnKind>> = vec![None; n];
            for (key, kind) in [("kda_layers", AttnKind::Kda), ("full_attn_layers", AttnKind::Mla)] {
                let bad = |msg: String| r.err("linear_attn_config", format!("`{key}`: {msg}"));
                for one_based in l.usize_list(key).map_err(|e| bad(e.to_string()))? {
                    if one_based == 0 || one_based > n {
                        return Err(bad(format!("layer {one_based} is outside 1..={n} (the lists are 1-based)")));
                    }
                    if kinds[one_based - 1].is_some() {
                        return Err(bad(format!("layer {one_based} is listed twice")));
                    }
                    kinds[one_based - 1] = Some(kind);
                }
            }
            return kinds
                .into_iter()
                .enumerate()
                .map(|(i, k)| {
                    k.ok_or_else(|| {
                        r.err(
                            "linear_attn_config",
                            format!("layer {} (1-based) is in neither kda_layers nor full_attn_layers", i + 1),
                        )
                    })
                })
                .collect();
        }
    }
    Ok((0..n).map(|i| if i > 0 && i % 4 == 0 { AttnKind::Mla } else { AttnKind::Kda }).collect())
}

/// Which layers are MoE: `mlp_layer_types` (transformers), else
/// `first_k_dense_replace` and `moe_layer_freq` (released modeling_kimi.py:
/// `layer_idx >= first_k_dense_replace and layer_idx % moe_layer_freq == 0`).
fn mlp_kinds(r: &Reader<'_>, n: usize) -> Result<Vec<bool>> {
    if let Some(v) = r.get("mlp_layer_types") {
        let Some(items) = v.as_array().filter(|a| a.len() == n) else {
            return Err(r.err("mlp_layer_types", format!("expected {n} strings, found {v}")));
        };
        return items
            .iter()
            .enumerate()
            .map(|(i, t)| match t.as_str() {
                Some("sparse") => Ok(true),
                Some("dense") => Ok(false),
                _ => Err(r.err("mlp_layer_types", format!("entry {i} is {t}; expected \"dense\" or \"sparse\""))),
            })
            .collect();
    }
    let first_dense = r.usize_opt("first_k_dense_replace")?.unwrap_or(1);
    let freq = r.usize_opt("moe_layer_freq")?.unwrap_or(1);
    let freq = r.bounded("moe_layer_freq", freq, MAX_LAYERS)?;
    Ok((0..n).map(|l| l >= first_dense && l % freq == 0).collect())
}

pub(super) fn check_layer_tensors(cfg: &ModelConfig, names: &HashSet<&str>, file: &Path) -> Result<()> {
    if cfg.family != Family::KimiLinear {
        return Ok(());
    }
    let source = "config.json (`layer_types` or `linear_attn_config`, whose lists are 1-based)";
    for l in 0..cfg.num_layers {
        let kda = format!("model.layers.{l}.self_attn.A_log");
        let mla = format!("model.layers.{l}.self_attn.kv_a_proj_with_mqa.weight");
        let (want, other, want_name) = match cfg.attn_kind(l) {
            AttnKind::Kda => (&kda, &mla, "KDA"),
            _ => (&mla, &kda, "MLA"),
        };
        if !names.contains(want.as_str()) && names.contains(other.as_str()) {
            return Err(Error::format(
                file,
                format!(
                    "{source} makes layer {l} (1-based {}) {want_name}, but the checkpoint holds `{other}` and no `{want}`",
                    l + 1
                ),
            ));
        }
        let router = cfg.router_name(l);
        let dense = MlpTensors::dense(cfg, l).gate_proj.name;
        if cfg.is_moe_layer(l) && !names.contains(router.as_str()) && names.contains(dense.as_str()) {
            return Err(Error::format(
                file,
                format!(
                    "config.json (`mlp_layer_types` or `first_k_dense_replace`) makes layer {l} MoE, but the checkpoint holds the dense `{dense}` and no router `{router}`"
                ),
            ));
        }
        if !cfg.is_moe_layer(l) && names.contains(router.as_str()) {
            return Err(Error::format(
                file,
                format!(
                    "config.json (`mlp_layer_types` or `first_k_dense_replace`) makes layer {l} dense, but the checkpoint holds the router `{router}`"
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use serde_json::json;

    fn fixture_json() -> serde_json::Value {
        let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/tiny-kimi_linear/config.json");
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("fixture file missing: {}: {e}", p.display()));
        serde_json::from_str(&text).unwrap()
    }

    fn parse(v: &serde_json::Value) -> Result<ModelConfig> {
        ModelConfig::from_json_str(&v.to_string(), Path::new("/x/config.json"))
    }

    /// The transformers layout of the fixture rewritten in the released
    /// layout: `linear_attn_config` with 1-based lists, `first_k_dense_replace`.
    fn released_json() -> serde_json::Value {
        let mut v = fixture_json();
        let o = v.as_object_mut().unwrap();
        for k in ["layer_types", "mlp_layer_types", "linear_head_dim", "linear_num_heads", "linear_conv_kernel_dim"] {
            o.remove(k);
        }
        o.insert(
            "linear_attn_config".into(),
            json!({"kda_layers": [1, 2, 4], "full_attn_layers": [3, 5], "head_dim": 16,
                   "num_heads": 2, "short_conv_kernel_size": 4}),
        );
        o.insert("first_k_dense_replace".into(), 1.into());
        o.insert("moe_layer_freq".into(), 1.into());
        o.insert("moe_router_activation_func".into(), "sigmoid".into());
        o.insert("mla_use_nope".into(), true.into());
        v
    }

    #[test]
    fn kimi_fixture_config_parses() {
        let c = parse(&fixture_json()).unwrap();
        use AttnKind::{Kda, Mla};
        assert_eq!(c.family, Family::KimiLinear);
        assert_eq!(c.attn_kinds, vec![Kda, Kda, Mla, Kda, Mla]);
        assert_eq!(c.moe_layers, vec![false, true, true, true, true]);
        assert_eq!(c.kda, Some(KdaDims { num_heads: 2, head_dim: 16, conv_kernel: 4 }));
        let m = c.mla.unwrap();
        assert_eq!(
            (m.num_heads, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim),
            (4, 16, 16, 8, 12)
        );
        assert_eq!((c.num_experts, c.top_k, c.shared_intermediate_size), (8, 2, 32));
        assert_eq!(c.router, RouterKind::SigmoidBias { routed_scaling_factor: 2.446 });
        assert_eq!(c.max_position_embeddings, 512);
        assert_eq!(c.state_floats_per_token(2), 16 + 8);
        assert_eq!(c.state_floats_fixed(0), 2 * 16 * 16 + 3 * 3 * 32);
        assert_eq!(c.state_floats_per_token(0), 0);
        // KDA state is f32 whatever the KV cache type; the two MLA layers'
        // latent rows (24 values) take the cache's type.
        for kv in crate::kv::KvType::ALL {
            assert_eq!(c.state_bytes(10, kv), 9600 + 10 * 2 * 4 * kv.words(24) as u64);
        }
        assert_eq!(c.state_bytes(10, crate::kv::KvType::F32), 9600 + 10 * 192);
        assert_eq!(c.canonical_shape("model.layers.0.self_attn.q_conv1d.weight", &[32, 1, 4]), vec![128]);
        assert_eq!(c.canonical_shape("model.layers.0.self_attn.A_log", &[1, 1, 2, 1]), vec![2]);
        assert_eq!(c.canonical_shape("model.layers.0.self_attn.q_proj.weight", &[32, 64]), vec![32, 64]);
        assert!(c.total_params() > c.active_params());
    }

    #[test]
    fn released_layout_equals_transformers_layout() {
        let a = parse(&fixture_json()).unwrap();
        let b = parse(&released_json()).unwrap();
        assert_eq!(a, b);
    }

    fn expect_err(v: &serde_json::Value, needles: &[&str]) {
        let e = parse(v).expect_err("must fail");
        let msg = e.to_string();
        for n in needles {
            assert!(msg.contains(n), "{msg} lacks {n}");
        }
    }

    #[test]
    fn bad_layer_lists_are_named() {
        let mut v = released_json();
        v["linear_attn_config"]["kda_layers"] = json!([0, 1, 2, 4]);
        expect_err(&v, &["/x/config.json", "linear_attn_config", "kda_layers", "1-based"]);
        let mut v = released_json();
        v["linear_attn_config"]["full_attn_layers"] = json!([3, 4, 5]);
        expect_err(&v, &["linear_attn_config", "layer 4", "twice"]);
        let mut v = released_json();
        v["linear_attn_config"]["full_attn_layers"] = json!([3]);
        expect_err(&v, &["linear_attn_config", "layer 5", "neither"]);
        let mut v = fixture_json();
        v["layer_types"] = json!(["linear_attention", "full_attention"]);
        expect_err(&v, &["layer_types", "2 entries"]);
        let mut v = fixture_json();
        v["layer_types"][1] = "sliding_attention".into();
        expect_err(&v, &["layer_types", "entry 1"]);
        let mut v = fixture_json();
        v["q_lora_rank"] = 8.into();
        assert!(matches!(parse(&v), Err(Error::Unsupported(_))));
        let mut v = fixture_json();
        v["num_expert_group"] = 2.into();
        assert!(matches!(parse(&v), Err(Error::Unsupported(_))));
    }
}
