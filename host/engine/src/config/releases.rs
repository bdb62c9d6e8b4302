//! Released models' own configs, the `releases` of the family table
//! (`family::FAMILIES`): `waste synth --like` builds a container from one,
//! so it has the real trunk shapes, layer pattern and expert banks.

/// The released Kimi-Linear-48B-A3B config (the checkpoint's own layout:
/// `linear_attn_config` with 1-based layer lists; values from
/// ../shared/design/MODELS.md): 27 layers, layer 0 dense (9216), hidden 2304,
/// MLA at 1-based 4, 8, 12, 16, 20, 24, 27 (32 heads, kv_lora 512, nope 128,
/// rope 64, v 128, NoPE), KDA elsewhere (32 heads x 128, conv 4), 256 routed
/// experts of 1024 top-8 with one shared expert, sigmoid router scaled by
/// 2.446, vocabulary 163840.
pub fn kimi_linear_48b() -> serde_json::Value {
    let full = [4usize, 8, 12, 16, 20, 24, 27];
    let kda: Vec<usize> = (1..=27).filter(|i| !full.contains(i)).collect();
    serde_json::json!({
        "architectures": ["KimiLinearForCausalLM"],
        "model_type": "kimi_linear",
        "vocab_size": 163_840,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "moe_intermediate_size": 1024,
        "num_hidden_layers": 27,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "kv_lora_rank": 512,
        "q_lora_rank": null,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "mla_use_nope": true,
        "linear_attn_config": {
            "kda_layers": kda,
            "full_attn_layers": full,
            "num_heads": 32,
            "head_dim": 128,
            "short_conv_kernel_size": 4
        },
        "num_experts": 256,
        "num_experts_per_token": 8,
        "num_shared_experts": 1,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "moe_router_activation_func": "sigmoid",
        "moe_renormalize": true,
        "routed_scaling_factor": 2.446,
        "num_expert_group": 1,
        "topk_group": 1,
        "use_grouped_topk": true,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": false,
        "model_max_length": 1_048_576,
        "bos_token_id": 163_584,
        "eos_token_id": 163_585
    })
}

/// The released Kimi K3 text config (values from ../shared/design/K3.md:
/// 93 layers, 69 KDA with 96 heads x 128 and 24 gated q-LoRA MLA, 896
/// routed experts top-16 on a 3584-wide latent, 2 shared experts of 3072,
/// layer 0 dense with 33792, AttnRes blocks of 12, SiTU 4 / 25). Keys the
/// text forward ignores (`rope_theta`) carry neutral values; `eos_token_id`
/// is left out, since only generation reads it.
pub fn kimi_k3() -> serde_json::Value {
    let (kda, full): (Vec<usize>, Vec<usize>) = (1..=93).partition(|&i| i % 4 != 0 && i != 93);
    // Built in three parts: one json! literal this long exceeds the macro
    // recursion limit.
    let mut text = serde_json::json!({
        "model_type": "kimi_linear",
        "vocab_size": 163_840,
        "hidden_size": 7168,
        "num_hidden_layers": 93,
        "intermediate_size": 33_792,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": false,
        "hidden_act": "situ",
        "activation_situ_beta": 4.0,
        "activation_situ_linear_beta": 25.0,
        "num_attention_heads": 96,
        "num_key_value_heads": 96,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "mla_use_nope": true,
        "mla_use_output_gate": true,
        "linear_attn_config": {
            "kda_layers": kda,
            "full_attn_layers": full,
            "num_heads": 96,
            "head_dim": 128,
            "short_conv_kernel_size": 4,
            "gate_lower_bound": -5.0,
            "use_full_rank_gate": true
        }
    });
    let moe = serde_json::json!({
        "num_experts": 896,
        "num_experts_per_token": 16,
        "num_shared_experts": 2,
        "moe_intermediate_size": 3072,
        "routed_expert_hidden_size": 3584,
        "latent_moe_use_norm": true,
        "moe_router_activation_func": "sigmoid",
        "moe_renormalize": true,
        "routed_scaling_factor": 1.0,
        "num_expert_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "use_grouped_topk": true,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "attn_res_block_size": 12,
        "rope_theta": 10000.0,
        "max_position_embeddings": 1_048_576,
        "num_nextn_predict_layers": 0
    });
    if let (Some(t), serde_json::Value::Object(m)) = (text.as_object_mut(), moe) {
        t.extend(m);
    }
    serde_json::json!({
        "architectures": ["KimiK3ForConditionalGeneration"],
        "model_type": "kimi_k3",
        "text_config": text
    })
}

/// The released Qwen3.5-397B-A17B config, text part (the release wraps it
/// in a vision-language config: `text_config`): 60 layers, 15 x (3 Gated
/// DeltaNet + 1 gated full attention), hidden 4096; GDN with 16 key heads
/// and 64 value heads of 128, conv 4; attention 32 q / 2 kv heads of 256,
/// rotary 0.25 of theta 1e7; 512 experts of 1024, top-10, plus one gated
/// shared expert of 1024; vocabulary 248320, untied. The vision tower and
/// the MTP layer are not part of a converted container, so not here.
pub fn qwen3_5_397b() -> serde_json::Value {
    serde_json::json!({
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "tie_word_embeddings": false,
        "text_config": {
            "model_type": "qwen3_5_moe_text",
            "vocab_size": 248_320,
            "hidden_size": 4096,
            "num_hidden_layers": 60,
            "full_attention_interval": 4,
            "num_attention_heads": 32,
            "num_key_value_heads": 2,
            "head_dim": 256,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 64,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "linear_conv_kernel_dim": 4,
            "num_experts": 512,
            "num_experts_per_tok": 10,
            "moe_intermediate_size": 1024,
            "shared_expert_intermediate_size": 1024,
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 262_144,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10_000_000.0,
                "partial_rotary_factor": 0.25,
                "mrope_section": [11, 11, 10],
                "mrope_interleaved": true
            },
            "tie_word_embeddings": false
        }
    })
}

/// The released GLM-4.6 config: 92 layers, the first 3 dense (12288),
/// hidden 5120, 96 q / 8 kv heads of 128 with q/k/v biases and per-head
/// q/k norms, rotary 0.5 of theta 1e6; 160 experts of 1536, top-8, one
/// shared, sigmoid router with correction bias scaled by 2.5 (one group);
/// vocabulary 151552, untied; one MTP layer after the last (not converted).
pub fn glm_4_6() -> serde_json::Value {
    serde_json::json!({
        "architectures": ["Glm4MoeForCausalLM"],
        "model_type": "glm4_moe",
        "vocab_size": 151_552,
        "hidden_size": 5120,
        "intermediate_size": 12288,
        "moe_intermediate_size": 1536,
        "num_hidden_layers": 92,
        "num_attention_heads": 96,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "attention_bias": true,
        "use_qk_norm": true,
        "partial_rotary_factor": 0.5,
        "rope_theta": 1_000_000.0,
        "n_routed_experts": 160,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 3,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": true,
        "routed_scaling_factor": 2.5,
        "num_nextn_predict_layers": 1,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 202_752,
        "tie_word_embeddings": false,
        "eos_token_id": [151_329, 151_336, 151_338]
    })
}

/// The released MiniMax-M2 config (its own keys kept): 62 layers, hidden
/// 3072, 48 q / 8 kv heads of 128 with q/k RMSNorm over the whole
/// projection, rotary on 64 dims of theta 5e6; 256 experts of 1536, top-8,
/// sigmoid router with a routing bias, no shared expert; vocabulary
/// 200064, untied.
pub fn minimax_m2() -> serde_json::Value {
    serde_json::json!({
        "architectures": ["MiniMaxM2ForCausalLM"],
        "model_type": "minimax_m2",
        "vocab_size": 200_064,
        "hidden_size": 3072,
        "intermediate_size": 1536,
        "num_hidden_layers": 62,
        "num_attention_heads": 48,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rotary_dim": 64,
        "rope_theta": 5_000_000.0,
        "use_qk_norm": true,
        "qk_norm_type": "per_layer",
        "num_local_experts": 256,
        "num_experts_per_tok": 8,
        "scoring_func": "sigmoid",
        "use_routing_bias": true,
        "shared_intermediate_size": 0,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 196_608,
        "tie_word_embeddings": false
    })
}

/// The released gpt-oss-120b config: 36 layers alternating a 128-token
/// sliding window and full attention, hidden 2880, 64 q / 8 kv heads of 64
/// with biases and sinks, YaRN (factor 32 over 4096) of theta 150000; 128
/// experts of 2880, top-4, with biases and the clamped SwiGLU; vocabulary
/// 201088, untied.
pub fn gpt_oss_120b() -> serde_json::Value {
    let layer_types: Vec<&str> =
        (0..36).map(|l| if l % 2 == 0 { "sliding_attention" } else { "full_attention" }).collect();
    serde_json::json!({
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "vocab_size": 201_088,
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "num_hidden_layers": 36,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "attention_bias": true,
        "sliding_window": 128,
        "layer_types": layer_types,
        "num_local_experts": 128,
        "num_experts_per_tok": 4,
        "swiglu_limit": 7.0,
        "rope_theta": 150_000.0,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": false,
            "original_max_position_embeddings": 4096
        },
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 131_072,
        "tie_word_embeddings": false,
        "hidden_act": "silu",
        "eos_token_id": 200_002
    })
}

/// The released DeepSeek-V3.2 config (its own keys: `rope_scaling` with
/// `type`, a top-level `rope_theta`): DeepSeek-V3's 61 layers (3 dense of
/// 18432), hidden 7168, 128 MLA heads (q-LoRA 1536, kv-LoRA 512, nope 128,
/// rope 64, v 128, YaRN 40 over 4096), 256 experts of 2048 top-8 in 8 groups
/// (4 kept) with one shared expert; the DSA indexer with 64 heads of 128
/// choosing 2048 positions; vocabulary 129280, one MTP layer (not run).
pub fn deepseek_v3_2() -> serde_json::Value {
    serde_json::json!({
        "architectures": ["DeepseekV32ForCausalLM"],
        "model_type": "deepseek_v32",
        "vocab_size": 129_280,
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "n_group": 8,
        "topk_group": 4,
        "first_k_dense_replace": 3,
        "moe_layer_freq": 1,
        "norm_topk_prob": true,
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "index_head_dim": 128,
        "index_n_heads": 64,
        "index_topk": 2048,
        "num_nextn_predict_layers": 1,
        "rope_theta": 10_000.0,
        "rope_scaling": {
            "type": "yarn",
            "factor": 40.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0
        },
        "max_position_embeddings": 163_840,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": false,
        "bos_token_id": 0,
        "eos_token_id": 1
    })
}

/// The released GLM-5 config: 78 layers (3 dense of 12288), hidden 6144,
/// 64 MLA heads (q-LoRA 2048, kv-LoRA 512, nope 192, rope 64, v 256, theta
/// 1e6), 256 experts of 2048 top-8 with one shared expert, no groups; the
/// DSA indexer with 32 heads of 128 choosing 2048 positions on every layer;
/// vocabulary 154880, one MTP layer (not run).
pub fn glm_5() -> serde_json::Value {
    serde_json::json!({
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
        "vocab_size": 154_880,
        "hidden_size": 6144,
        "intermediate_size": 12288,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 78,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "head_dim": 64,
        "q_lora_rank": 2048,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 192,
        "qk_rope_head_dim": 64,
        "v_head_dim": 256,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "n_group": 1,
        "topk_group": 1,
        "first_k_dense_replace": 3,
        "moe_layer_freq": 1,
        "norm_topk_prob": true,
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "index_head_dim": 128,
        "index_n_heads": 32,
        "index_topk": 2048,
        "num_nextn_predict_layers": 1,
        "rope_parameters": {"rope_theta": 1_000_000.0, "rope_type": "default"},
        "max_position_embeddings": 202_752,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": false,
        "eos_token_id": [154_820, 154_827, 154_829]
    })
}

/// DeepSeek-V4-Flash as transformers 5.24's `DeepseekV4Config` defaults
/// describe it (its docstring's checkpoint is DeepSeek-V4-Flash-Base): 43
/// layers, hidden 4096, 64 query heads of 512 sharing one K=V head (q-LoRA
/// 1024, rope 64), output in 8 groups through 1024; two HCA layers then CSA
/// and HCA alternating (rates 4 and 128, window 128, indexer 64 x 128
/// choosing 512); 256 experts of 2048 top-6 with one shared, the first 3
/// layers hash-routed; 4 hyper-connection streams; YaRN x16 on the
/// compressed layers; one MTP layer (not run). 284B parameters.
pub fn deepseek_v4_flash() -> serde_json::Value {
    let layers = 43;
    let layer_types: Vec<&str> = (0..layers)
        .map(|l| if l < 2 || (l - 2) % 2 == 0 { "heavily_compressed_attention" } else { "compressed_sparse_attention" })
        .collect();
    serde_json::json!({
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": 129_280,
        "hidden_size": 4096,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": layers,
        "num_attention_heads": 64,
        "num_key_value_heads": 1,
        "head_dim": 512,
        "qk_rope_head_dim": 64,
        "q_lora_rank": 1024,
        "o_groups": 8,
        "o_lora_rank": 1024,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 6,
        "scoring_func": "sqrtsoftplus",
        "routed_scaling_factor": 1.5,
        "num_hash_layers": 3,
        "layer_types": layer_types,
        "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
        "sliding_window": 128,
        "index_n_heads": 64,
        "index_head_dim": 128,
        "index_topk": 512,
        "hc_mult": 4,
        "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6,
        "swiglu_limit": 10.0,
        "rope_theta": 10_000.0,
        "compress_rope_theta": 160_000.0,
        "rope_scaling": {"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65_536,
                         "beta_fast": 32, "beta_slow": 1},
        "max_position_embeddings": 1_048_576,
        "num_nextn_predict_layers": 1,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": false,
        "bos_token_id": 0,
        "eos_token_id": 1
    })
}
