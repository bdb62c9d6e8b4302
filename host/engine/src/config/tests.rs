use super::*;

fn fixture_config(family: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(format!("tiny-{family}"))
        .join("config.json");
    assert!(p.is_file(), "fixture file missing: {}", p.display());
    p
}

fn qwen_json() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(fixture_config("qwen3_moe")).unwrap()).unwrap()
}

fn parse(v: &serde_json::Value) -> Result<ModelConfig> {
    ModelConfig::from_json_str(&v.to_string(), Path::new("/x/config.json"))
}

#[test]
fn fixtures_parse() {
    let q = ModelConfig::from_file(&fixture_config("qwen3_moe")).unwrap();
    assert_eq!(q.family, Family::Qwen3Moe);
    assert_eq!((q.hidden_size, q.num_heads, q.num_kv_heads, q.head_dim), (64, 4, 2, 16));
    assert_eq!((q.num_experts, q.top_k, q.moe_intermediate_size, q.intermediate_size), (8, 2, 32, 96));
    assert_eq!(q.moe_layers, vec![false, true, true, true]);
    assert_eq!(q.rope_theta, 50000.0);
    assert!(q.attention_bias && q.norm_topk_prob && !q.tie_word_embeddings);
    assert_eq!(q.qk_norm, QkNorm::PerHead);
    assert_eq!((q.bos_token_id, q.eos_token_ids.clone()), (None, vec![2]));
    assert_eq!(q.sliding_window, None);
    assert_eq!(q.router_name(1), "model.layers.1.mlp.gate.weight");
    assert!(q.trunk_tensor_names().contains(&"model.layers.0.mlp.gate_proj.weight".to_string()));
    assert!(q.trunk_tensor_names().contains(&"lm_head.weight".to_string()));
    assert!(q.total_params() > q.active_params());

    let o = ModelConfig::from_file(&fixture_config("olmoe")).unwrap();
    assert_eq!(o.family, Family::Olmoe);
    assert_eq!((o.num_experts, o.moe_intermediate_size, o.num_layers), (8, 48, 3));
    assert_eq!(o.qk_norm, QkNorm::Full);
    assert!(o.tie_word_embeddings && !o.norm_topk_prob);
    assert!(!o.trunk_tensor_names().contains(&"lm_head.weight".to_string()));
    assert_eq!(o.trunk_tensor_shape("model.layers.0.self_attn.k_norm.weight"), Some(vec![32]));

    let m = ModelConfig::from_file(&fixture_config("mixtral")).unwrap();
    assert_eq!(m.family, Family::Mixtral);
    assert!(m.norm_topk_prob && m.moe_layers.iter().all(|&x| x));
    assert_eq!(m.rope_theta, 250000.0);
    assert_eq!(m.router_name(0), "model.layers.0.block_sparse_moe.gate.weight");
    assert_eq!(m.tensor_role("model.layers.0.block_sparse_moe.gate.weight"), TensorRole::Router);
    assert!(m.is_expert_tensor("model.layers.3.block_sparse_moe.experts.7.w2.weight"));
    assert!(m.is_expert_tensor("model.layers.3.mlp.experts.gate_up_proj"));
    assert!(!m.is_expert_tensor("model.layers.3.block_sparse_moe.gate.weight"));
    assert_eq!(m.tensor_role("model.embed_tokens.weight"), TensorRole::Embedding);
    assert_eq!(m.tensor_role("lm_head.weight"), TensorRole::LmHead);
    assert_eq!(m.tensor_role("model.layers.0.input_layernorm.weight"), TensorRole::Vector);
    assert_eq!(m.tensor_role("model.layers.0.self_attn.q_proj.weight"), TensorRole::Matrix);
    let names = m.trunk_tensor_names();
    assert!(names.iter().all(|n| !m.is_expert_tensor(n) && m.trunk_tensor_shape(n).is_some()), "{names:?}");
}

fn expect_format(v: &serde_json::Value, key: &str) {
    match parse(v) {
        Err(e @ Error::Format { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("/x/config.json") && msg.contains(key), "{msg}");
        }
        other => panic!("expected a format error on `{key}`, got {other:?}"),
    }
}

#[test]
fn errors_name_file_and_key() {
    let mut v = qwen_json();
    v.as_object_mut().unwrap().remove("hidden_size");
    expect_format(&v, "hidden_size");

    let mut v = qwen_json();
    v["num_hidden_layers"] = "four".into();
    expect_format(&v, "num_hidden_layers");

    let mut v = qwen_json();
    v["num_key_value_heads"] = 3.into();
    expect_format(&v, "num_key_value_heads");

    let mut v = qwen_json();
    v["num_experts_per_tok"] = 9.into();
    expect_format(&v, "num_experts_per_tok");

    let mut v = qwen_json();
    v["vocab_size"] = 0.into();
    expect_format(&v, "vocab_size");

    let mut v = qwen_json();
    v["hidden_size"] = (1u64 << 40).into();
    expect_format(&v, "hidden_size");

    let mut v = qwen_json();
    v["head_dim"] = 15.into();
    expect_format(&v, "head_dim");

    let mut v = qwen_json();
    v["model_type"] = "llama4".into();
    let e = parse(&v).unwrap_err();
    assert!(matches!(e, Error::Unsupported(_)) && e.to_string().contains("llama4"), "{e}");

    let mut v = qwen_json();
    v["rope_parameters"]["rope_type"] = "yarn".into();
    assert!(matches!(parse(&v), Err(Error::Unsupported(_))));

    let e = ModelConfig::from_json_str("{ not json", Path::new("/x/config.json")).unwrap_err();
    assert!(e.to_string().contains("/x/config.json"), "{e}");
    let e = ModelConfig::from_file(Path::new("/nonexistent/config.json")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/config.json"), "{e}");
}

#[test]
fn released_layout_keys() {
    // Released checkpoints write `rope_theta` at the top level and may
    // carry `rope_scaling: null`.
    let mut v = qwen_json();
    let o = v.as_object_mut().unwrap();
    o.remove("rope_parameters");
    o.insert("rope_theta".into(), 1e6.into());
    o.insert("rope_scaling".into(), serde_json::Value::Null);
    o.insert("eos_token_id".into(), serde_json::json!([2, 5]));
    o.insert("use_sliding_window".into(), true.into());
    o.insert("sliding_window".into(), 16.into());
    o.insert("decoder_sparse_step".into(), 2.into());
    o.insert("mlp_only_layers".into(), serde_json::json!([]));
    let c = parse(&v).unwrap();
    assert_eq!(c.rope_theta, 1e6);
    assert_eq!(c.eos_token_ids, vec![2, 5]);
    assert_eq!(c.sliding_window, Some(16));
    assert_eq!(c.moe_layers, vec![false, true, false, true]);
}

/// gpt-oss's sliding layers keep a ring of their window (8 in the
/// fixture) whatever the context; its full layers grow with it; a failed
/// forward must then poison the state (the ring rows cannot be rolled back).
#[test]
fn gpt_oss_state_counts_only_the_window_on_sliding_layers() {
    let c = ModelConfig::from_file(&fixture_config("gpt_oss")).unwrap();
    assert_eq!(c.add.layer_windows, vec![Some(8), None, Some(8), None]);
    let row = 4 * 2 * c.kv_dim() as u64; // k and v, f32
    for context in [4usize, 8, 1000] {
        let windowed = 2 * row * context.min(8) as u64;
        assert_eq!(c.state_bytes(context, KvType::F32), windowed + 2 * row * context as u64, "context {context}");
    }
    assert!(c.has_unrewindable_state());
    let q = ModelConfig::from_file(&fixture_config("qwen2_moe")).unwrap();
    assert!(!q.has_unrewindable_state());
    assert_eq!(q.state_bytes(10, KvType::F32), q.num_layers as u64 * 10 * 2 * 4 * q.kv_dim() as u64);
}

/// A model_type outside the supported families fails with one line naming
/// it and every supported one.
#[test]
fn unsupported_model_type_names_it_and_the_supported_ones() {
    let mut v = qwen_json();
    v["model_type"] = "llama4_text".into();
    let err = parse(&v).unwrap_err().to_string();
    assert!(!err.contains('\n'), "{err}");
    assert!(err.contains("`llama4_text`"), "{err}");
    for t in family::model_types() {
        assert!(err.contains(t), "{err} does not list {t}");
    }
}
