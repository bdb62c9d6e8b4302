use std::path::PathBuf;

use super::*;
use crate::config::AttnKind;
use crate::container::Container;
use crate::{Model, OpenOptions};

/// A directory under the system temp dir, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let d = std::env::temp_dir().join(format!("waste-synth-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn parse(config: &serde_json::Value) -> ModelConfig {
    ModelConfig::from_json_str(&config.to_string(), Path::new("config.json")).unwrap()
}

#[test]
fn synth_kimi_linear_48b_config_has_the_released_shapes() {
    let c = parse(&like_config("kimi-linear-48b", None).unwrap());
    assert_eq!((c.hidden_size, c.num_layers, c.vocab_size), (2304, 27, 163_840));
    let mla: Vec<usize> = (0..27).filter(|&l| c.attn_kind(l) == AttnKind::Mla).collect();
    assert_eq!(mla, [3, 7, 11, 15, 19, 23, 26]);
    assert!((0..27).all(|l| mla.contains(&l) || c.attn_kind(l) == AttnKind::Kda));
    let k = c.kda.unwrap();
    assert_eq!((k.num_heads, k.head_dim, k.conv_kernel), (32, 128, 4));
    let m = c.mla.unwrap();
    assert_eq!(
        (m.num_heads, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim),
        (32, 512, 128, 64, 128)
    );
    assert_eq!((c.num_experts, c.top_k, c.moe_intermediate_size, c.intermediate_size), (256, 8, 1024, 9216));
    assert_eq!(c.shared_intermediate_size, 1024);
    assert!(!c.is_moe_layer(0) && (1..27).all(|l| c.is_moe_layer(l)));

    // Fewer experts: the same shapes and top-k, a smaller router.
    let few = parse(&like_config("kimi-linear-48b", Some(16)).unwrap());
    assert_eq!((few.num_experts, few.top_k, few.moe_intermediate_size), (16, 8, 1024));
    assert_eq!(few.trunk_tensor_names(), c.trunk_tensor_names());
    let router = c.router_name(1);
    assert_eq!(few.trunk_tensor_shape(&router), Some(vec![16, 2304]));
    // A count below top-k cannot route.
    let bad = like_config("kimi-linear-48b", Some(4)).unwrap();
    assert!(ModelConfig::from_json_str(&bad.to_string(), Path::new("config.json")).is_err());
}

/// Full size, manifest only: the sizes a real conversion would give, and
/// every trunk tensor of the KDA / MLA trunk listed.
#[test]
fn synth_like_kimi_linear_manifest_only_has_full_scale_records() {
    let tmp = Scratch::new("kl-manifest");
    let out = tmp.0.join("kl.waste");
    let options = LikeOptions { manifest_only: true, ..LikeOptions::default() };
    let r = synth_like(&out, "kimi-linear-48b", &options, &mut |_, _| {}).unwrap();
    assert_eq!(r.moe_layers, 26);
    assert_eq!(r.record_bytes, 2_666_496);
    assert_eq!(r.expert_bytes, 26 * 256 * 2_666_496);
    let c = Container::open(&out).unwrap();
    let m = c.manifest();
    let cfg = c.config();
    assert_eq!(m.trunk.tensors.len(), cfg.trunk_tensor_names().len());
    assert!(m.trunk.tensors.iter().any(|t| t.name == "model.layers.0.self_attn.A_log"));
    assert!(m.trunk.tensors.iter().any(|t| t.name == "model.layers.3.self_attn.kv_b_proj.weight"));
    assert_eq!(m.trunk.tensors.iter().map(|t| t.bytes).sum::<u64>(), r.trunk_bytes);
    // kimi-k3 is manifest-only; an unknown model is refused.
    let k3 = tmp.0.join("k3.waste");
    assert!(matches!(synth_like(&k3, "kimi-k3", &LikeOptions::default(), &mut |_, _| {}), Err(Error::Arg(_))));
    assert!(matches!(like_config("gpt-9", None), Err(Error::Arg(_))));
}

/// A Kimi-Linear config in the released layout at a small size: KDA and
/// MLA layers, a dense first layer, a shared expert, the sigmoid router.
fn small_kimi_linear(layers: usize) -> serde_json::Value {
    let mut config = crate::config::releases::kimi_linear_48b();
    let full: Vec<usize> = (1..=layers).filter(|i| i % 2 == 0).collect();
    let kda: Vec<usize> = (1..=layers).filter(|i| i % 2 == 1).collect();
    let small = serde_json::json!({
        "vocab_size": 320,
        "hidden_size": 256,
        "intermediate_size": 384,
        "moe_intermediate_size": 128,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "kv_lora_rank": 64,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        "linear_attn_config": {
            "kda_layers": kda,
            "full_attn_layers": full,
            "num_heads": 4,
            "head_dim": 64,
            "short_conv_kernel_size": 4
        },
        "num_experts": 16,
        "model_max_length": 256,
        "bos_token_id": 1,
        "eos_token_id": 2
    });
    if let (Some(c), serde_json::Value::Object(s)) = (config.as_object_mut(), small) {
        c.extend(s);
    }
    config
}

#[test]
fn synth_small_kimi_linear_opens_and_decodes_finite_logits() {
    decodes_finite_logits(ExpertFormat::Rvq3);
}

/// rvq4p records (4 stages x 64 entries, int8 tables) too: the synthetic
/// layout of their scales agrees with the format's payload.
#[test]
fn synth_small_kimi_linear_rvq4p_decodes_finite_logits() {
    decodes_finite_logits(ExpertFormat::Rvq4p);
}

fn decodes_finite_logits(experts: ExpertFormat) {
    let tmp = Scratch::new(&format!("kl-small-{}", experts.name()));
    let out = tmp.0.join("kl.waste");
    let options = LikeOptions { experts, ..LikeOptions::default() };
    let r = synth_config(&out, small_kimi_linear(4), &options, &mut |_, _| {}).unwrap();
    assert_eq!(r.moe_layers, 3);
    let options = OpenOptions { context: Some(64), threads: Some(1), ..OpenOptions::default() };
    let container = Container::open(&out).unwrap();
    assert_eq!(container.config().attn_kind(0), AttnKind::Kda);
    assert_eq!(container.config().attn_kind(1), AttnKind::Mla);
    let model = Model::open(&out, &options).unwrap();
    let mut state = model.new_state();
    let mut previous: Option<Vec<f32>> = None;
    // Decode past the short-conv window (4) so the conv and the KDA state
    // carry real history, and the MLA cache holds several positions.
    for (i, &t) in [5u32, 17, 300, 2, 99, 42, 7, 250].iter().enumerate() {
        let (logits, _) = model.forward(&mut state, &[t], false).unwrap();
        assert_eq!(logits.len(), 320);
        assert!(logits.iter().all(|v| v.is_finite()), "non-finite logits at step {i}");
        let spread = logits.iter().fold(f32::MIN, |a, &b| a.max(b)) - logits.iter().fold(f32::MAX, |a, &b| a.min(b));
        assert!(spread > 1e-4, "flat logits at step {i}: {spread}");
        if let Some(p) = &previous {
            assert_ne!(p, &logits, "step {i} repeats the previous logits");
        }
        previous = Some(logits);
    }
    // Prefilling the same tokens at once ends on the same logits: every
    // position ran through the recurrence.
    let mut again = model.new_state();
    let (all, _) = model.forward(&mut again, &[5, 17, 300, 2, 99, 42, 7, 250], false).unwrap();
    let last = previous.unwrap();
    let diff = all.iter().zip(&last).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    let scale = last.iter().map(|v| v.abs()).fold(0f32, f32::max);
    assert!(diff <= 1e-3 * scale.max(1.0), "prefill vs decode: {diff} (max |logit| {scale})");
}
