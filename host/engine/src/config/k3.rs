//! Kimi K3 (`model_type: kimi_k3`): a vision-language wrapper whose text
//! config sits under `text_config` and whose text tensors all carry the
//! `language_model.` prefix (../shared/design/K3.md). The text model is
//! Kimi-Linear plus: attention residuals (AttnRes), the SiTU activation, a
//! latent routed-expert MoE, a bounded KDA decay gate with a full-rank
//! output gate, and a gated, q-LoRA MLA without rotary.
//!
//! The text config is parsed by the Kimi-Linear reader after the keys only
//! K3 accepts are taken out; the K3 keys land in `ModelConfig::k3`.
//! Checkpoint readers strip it (`source_rename()`) so every other part of the
//! engine sees the plain `model.layers.N.…` names.

use serde_json::{Map, Value};

use super::k3_vision::{self, VisionConfig};
use super::{kimi, AttnKind, Common, Family, ModelConfig, Reader, MAX_HIDDEN, MAX_INTER, MAX_LAYERS};
use crate::error::{Error, Result};
use crate::quant::Activation;

/// The prefix of every text tensor in a released K3 checkpoint.
pub const K3_PREFIX: &str = "language_model.";

/// What K3 adds to a Kimi-Linear text config.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct K3Params {
    /// `attn_res_block_size`; None: the plain additive residual.
    pub attn_res_block: Option<usize>,
    pub activation: Activation,
    /// `routed_expert_hidden_size`: the routed experts' width L.
    pub latent: Option<usize>,
    /// `latent_moe_use_norm`: RMSNorm over the weighted expert sum.
    pub latent_norm: bool,
    /// `linear_attn_config.gate_lower_bound` (negative).
    pub kda_gate_lower_bound: Option<f32>,
    /// `linear_attn_config.use_full_rank_gate`: `g_proj` instead of g_a/g_b.
    pub kda_full_rank_gate: bool,
    /// `mla_use_output_gate`: `sigmoid(g_proj x)` before `o_proj`.
    pub mla_output_gate: bool,
    /// `vision_config`: the image tower, when the release has one.
    pub vision: Option<VisionConfig>,
}

fn unsupported(r: &Reader<'_>, key: &str, what: impl std::fmt::Display) -> Error {
    Error::Unsupported(format!("{}: key `text_config.{key}`: {what}", r.path.display()))
}

pub(super) fn parse_config(r: &Reader<'_>, _family: Family, _model_type: &str) -> Result<ModelConfig> {
    let text: &Map<String, Value> = match r.get("text_config") {
        Some(Value::Object(o)) => o,
        Some(v) => return Err(r.err("text_config", format!("expected an object, found {v}"))),
        None => return Err(r.err("text_config", "missing (kimi_k3 nests the text model there)")),
    };
    let t = Reader { obj: text, path: r.path };
    let lac = match t.get("linear_attn_config") {
        Some(Value::Object(obj)) => Some(Reader { obj, path: r.path }),
        _ => None,
    };

    let activation = match t.str_opt("hidden_act")? {
        None | Some("silu") => Activation::Silu,
        Some("situ") => {
            let beta = t.f64_opt("activation_situ_beta")?.filter(|&b| b != 0.0).unwrap_or(1.0);
            let linear_beta = t.f64_opt("activation_situ_linear_beta")?.filter(|&b| b != 0.0);
            if beta <= 0.0 || linear_beta.is_some_and(|b| b <= 0.0) {
                return Err(t.err("activation_situ_beta", "SiTU betas must be positive"));
            }
            Activation::Situ { beta: beta as f32, linear_beta: linear_beta.map(|b| b as f32) }
        }
        Some(other) => return Err(unsupported(&t, "hidden_act", format!("`{other}` (silu or situ)"))),
    };
    let q_lora_rank = match t.usize_opt("q_lora_rank")? {
        None => None,
        Some(q) => Some(t.bounded("q_lora_rank", q, MAX_INTER)?),
    };
    let latent = match t.usize_opt("routed_expert_hidden_size")? {
        None => None,
        Some(l) => Some(t.bounded("routed_expert_hidden_size", l, MAX_HIDDEN)?),
    };
    let attn_res_block = match t.usize_opt("attn_res_block_size")? {
        None => None,
        Some(b) => Some(t.bounded("attn_res_block_size", b, MAX_LAYERS)?),
    };
    let (mut lower_bound, mut full_rank) = (None, false);
    if let Some(l) = &lac {
        if let Some(lb) = l.f64_opt("gate_lower_bound")? {
            if lb >= 0.0 {
                return Err(t.err("linear_attn_config", format!("`gate_lower_bound` {lb} must be negative")));
            }
            lower_bound = Some(lb as f32);
        }
        full_rank = l.bool_opt("use_full_rank_gate")?.unwrap_or(false);
    }
    let mut k3 = K3Params {
        attn_res_block,
        activation,
        latent,
        latent_norm: latent.is_some() && t.bool_opt("latent_moe_use_norm")?.unwrap_or(false),
        kda_gate_lower_bound: lower_bound,
        kda_full_rank_gate: full_rank,
        mla_output_gate: t.bool_opt("mla_use_output_gate")?.unwrap_or(false),
        vision: None,
    };

    // The Kimi-Linear reader refuses what it does not run; K3 runs these.
    // Group-limited routing (K3.md §5 step 4) only applies with more than
    // one group and fewer kept than exist; it is read here.
    let group_key = ["num_expert_group", "n_group"].into_iter().find(|k| t.get(k).is_some());
    let n_group = match group_key {
        Some(k) => t.usize_opt(k)?.unwrap_or(1).max(1),
        None => 1,
    };
    let topk_group = t.usize_opt("topk_group")?.unwrap_or(n_group).max(1);
    let mut rest = text.clone();
    for k in ["q_lora_rank", "hidden_act", "num_expert_group", "n_group", "topk_group"] {
        rest.remove(k);
    }
    let kr = Reader { obj: &rest, path: r.path };
    let mut cfg = kimi::parse(&kr, Common::read(&kr)?)?;
    cfg.model_type = "kimi_k3".to_string();
    if n_group > 1 && topk_group < n_group {
        let key = group_key.unwrap_or("num_expert_group");
        let per = cfg.num_experts / n_group;
        if cfg.num_experts % n_group != 0 || per < 2 {
            return Err(t.err(
                key,
                format!(
                    "{n_group} groups of {} experts: each group needs the same number, at least 2",
                    cfg.num_experts
                ),
            ));
        }
        if cfg.top_k > topk_group * per {
            return Err(t.err(
                "topk_group",
                format!("top-k {} exceeds the {topk_group} kept groups of {per} experts", cfg.top_k),
            ));
        }
        cfg.expert_groups = Some((n_group, topk_group));
    }
    if let Some(m) = cfg.mla.as_mut() {
        m.q_lora_rank = q_lora_rank;
    }
    if cfg.eos_token_ids.is_empty() {
        cfg.eos_token_ids = r.token_ids("eos_token_id")?;
    }
    k3.vision = k3_vision::parse(r, cfg.hidden_size)?;
    cfg.k3 = Some(k3);
    Ok(cfg)
}

/// Shapes K3 gives otherwise than `layout` does: its tower's (from
/// `VisionConfig`), and `A_log`, which has no fixed shape: the release pads
/// it (`[128]` for 96 heads), the KDA loader takes the first `num_heads`
/// values and checks that the rest are zero. None defers to `layout`.
pub(super) fn tensor_shape(cfg: &ModelConfig, k: &K3Params, name: &str) -> Option<Option<Vec<usize>>> {
    if let (Some(v), true) = (&k.vision, super::is_vision_tensor(name)) {
        return Some(v.tensor_shapes().into_iter().find(|(n, _)| n == name).map(|(_, s)| s));
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    (layer < cfg.num_layers && cfg.attn_kind(layer) == AttnKind::Kda && rest == "self_attn.A_log").then_some(None)
}

/// Parameters with `experts` routed experts per MoE layer: every trunk
/// tensor by its config shape (`A_log` counted at `num_heads`), plus the
/// experts at the latent width.
pub(super) fn params(cfg: &ModelConfig, k: &K3Params, experts: u64) -> u64 {
    let trunk: u64 = cfg
        .trunk_tensor_names()
        .iter()
        .map(|n| match cfg.trunk_tensor_shape(n) {
            Some(s) => s.iter().product::<usize>() as u64,
            None if n.ends_with(".A_log") => cfg.kda.map_or(0, |d| d.num_heads as u64),
            None => 0,
        })
        .sum();
    let per_expert = 3 * (k.latent.unwrap_or(cfg.hidden_size) * cfg.moe_intermediate_size) as u64;
    let moe_layers = (0..cfg.num_layers).filter(|&l| cfg.is_moe_layer(l)).count() as u64;
    trunk + moe_layers * experts * per_expert
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use super::{Activation, K3_PREFIX};
    use serde_json::json;

    fn fixture_json() -> serde_json::Value {
        let p =
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-kimi_k3/config.json");
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("fixture file missing: {}: {e}", p.display()));
        serde_json::from_str(&text).unwrap()
    }

    fn parse(v: &serde_json::Value) -> Result<ModelConfig> {
        ModelConfig::from_json_str(&v.to_string(), Path::new("/x/config.json"))
    }

    #[test]
    fn k3_fixture_config_parses() {
        let c = parse(&fixture_json()).unwrap();
        use AttnKind::{Kda, Mla};
        assert_eq!(c.model_type, "kimi_k3");
        assert_eq!(c.source_rename(), Some((K3_PREFIX, "")));
        assert_eq!(c.attn_kinds, vec![Kda, Kda, Mla, Kda, Mla]);
        assert_eq!(c.moe_layers, vec![false, true, true, true, true]);
        let k = c.k3.unwrap();
        assert_eq!(k.attn_res_block, Some(2));
        assert_eq!(k.activation, Activation::Situ { beta: 2.0, linear_beta: Some(3.0) });
        assert_eq!((k.latent, k.latent_norm), (Some(32), true));
        assert_eq!((k.kda_gate_lower_bound, k.kda_full_rank_gate, k.mla_output_gate), (Some(-5.0), true, true));
        assert_eq!(c.expert_hidden(), 32);
        assert_eq!(c.mla.unwrap().q_lora_rank, Some(40));
        assert_eq!(c.kda.unwrap().num_heads, 3);
        assert_eq!((c.num_experts, c.top_k, c.shared_intermediate_size), (12, 3, 24));
        let names = c.trunk_tensor_names();
        for n in [
            "model.layers.0.self_attn.g_proj.weight",
            "model.layers.2.self_attn.q_a_proj.weight",
            "model.layers.2.self_attn.g_proj.weight",
            "model.layers.1.block_sparse_moe.routed_expert_down_proj.weight",
            "model.layers.1.block_sparse_moe.routed_expert_norm.weight",
            "model.layers.4.mlp_res_proj.weight",
            "model.output_attn_res_norm.weight",
        ] {
            assert!(names.iter().any(|x| x == n), "{n} missing");
        }
        assert!(!names.iter().any(|x| x.contains("g_a_proj")));
        assert!(names.iter().all(|n| !c.is_expert_tensor(n)));
        assert!(c.is_expert_tensor("model.layers.1.block_sparse_moe.experts.3.w2.weight"));
        assert_eq!(c.canonical_shape("model.layers.3.mlp_res_proj.weight", &[1, 64]), vec![64]);
        assert_eq!(
            c.trunk_tensor_shape("model.layers.1.block_sparse_moe.routed_expert_up_proj.weight"),
            Some(vec![64, 32])
        );
        // torch's count (reference.json) has A_log at its padded length.
        let reference: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(
                std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("../../tests/fixtures/tiny-kimi_k3/reference.json"),
            )
            .unwrap(),
        )
        .unwrap();
        let padded = reference["a_log_stored"].as_u64().unwrap() - 3;
        assert_eq!(c.total_params(), reference["num_parameters"].as_u64().unwrap() - 3 * padded);
        assert_eq!(c.total_params() - c.active_params(), 4 * (12 - 3) * 3 * 32 * 24);
    }

    #[test]
    fn k3_bad_keys_are_named() {
        let mut v = fixture_json();
        v.as_object_mut().unwrap().remove("text_config");
        let e = parse(&v).unwrap_err().to_string();
        assert!(e.contains("text_config") && e.contains("/x/config.json"), "{e}");
        let mut v = fixture_json();
        v["text_config"]["hidden_act"] = "gelu".into();
        assert!(matches!(parse(&v), Err(Error::Unsupported(_))));
        let mut v = fixture_json();
        v["text_config"]["linear_attn_config"]["gate_lower_bound"] = json!(1.0);
        assert!(parse(&v).unwrap_err().to_string().contains("gate_lower_bound"));
        let mut v = fixture_json();
        v["text_config"]["num_expert_group"] = json!(4);
        v["text_config"]["topk_group"] = json!(2);
        assert_eq!(parse(&v).unwrap().expert_groups, Some((4, 2)));
        v["text_config"]["num_expert_group"] = json!(5);
        assert!(parse(&v).unwrap_err().to_string().contains("num_expert_group"));
        let mut v = fixture_json();
        v["text_config"]["activation_situ_beta"] = json!(0.0);
        let c = parse(&v).unwrap();
        assert_eq!(c.activation(), Activation::Situ { beta: 1.0, linear_beta: Some(3.0) });
    }

    #[test]
    fn situ_matches_its_formula() {
        let a = Activation::Situ { beta: 2.0, linear_beta: Some(3.0) };
        let (g, u) = (1.5f64, -4.0f64);
        let want = 2.0 * (g / 2.0).tanh() / (1.0 + (-g).exp()) * 3.0 * (u / 3.0).tanh();
        assert!((a.apply(g as f32, u as f32) as f64 - want).abs() < 1e-6);
        let s = Activation::Silu;
        assert_eq!(s.apply(0.7, 2.0), 0.7 / (1.0 + (-0.7f32).exp()) * 2.0);
    }
}
