//! Real models' configs for `synth_like`: the released values, so a
//! synthetic container has the real trunk shapes, layer pattern and expert
//! banks.

/// The released Kimi-Linear-48B-A3B config (the checkpoint's own layout:
/// `linear_attn_config` with 1-based layer lists; values from
/// ../shared/design/MODELS.md): 27 layers, layer 0 dense (9216), hidden 2304,
/// MLA at 1-based 4, 8, 12, 16, 20, 24, 27 (32 heads, kv_lora 512, nope 128,
/// rope 64, v 128, NoPE), KDA elsewhere (32 heads x 128, conv 4), 256 routed
/// experts of 1024 top-8 with one shared expert, sigmoid router scaled by
/// 2.446, vocabulary 163840.
pub fn kimi_linear_48b_config() -> serde_json::Value {
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
pub fn kimi_k3_config() -> serde_json::Value {
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
