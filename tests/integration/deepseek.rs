//! DeepSeek-V3 end to end against transformers: the tiny `deepseek_v3`
//! fixture (q-LoRA MLA with interleaved YaRN RoPE and the mscale softmax
//! correction, group-limited sigmoid routing with a score-correction bias,
//! shared expert, two dense layers; tests/gen_deepseek_fixtures.py)
//! converted with an f32 trunk and f32 experts, run through the public API
//! and the bundled component.

use waste_host::Engine;

use crate::common::*;

#[test]
fn deepseek_v3_f32_matches_transformers_at_every_position() {
    crate::oracle::check_f32("deepseek_v3");
}

/// Saving and restoring a session carries the latent rows and the roped
/// keys: the restored session continues bit-identically.
#[test]
fn deepseek_v3_saved_state_continues_bit_identically() {
    let tmp = TempDir::new("deepseek-state");
    let container = convert("deepseek_v3", "f32", "f32", tmp.path());
    let file = tmp.path().join("s.state");
    let reference = reference("deepseek_v3");
    let engine = Engine::new().unwrap();
    assert_saved_state_continues(&engine, &container, &file, reference.prompt_ids.split_at(40), "MLA");
}

/// `waste info` counts what torch counts, plus the router biases (buffers).
#[test]
fn deepseek_v3_info_counts_parameters() {
    let tmp = TempDir::new("deepseek-info");
    let container = convert("deepseek_v3", "f32", "f32", tmp.path());
    let o = waste(&["info", container.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(j["family"], "deepseek_v3");
    let reference: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture("deepseek_v3").join("reference.json")).unwrap()).unwrap();
    // Two MoE layers of 16 experts: 2 x 16 e_score_correction_bias floats.
    assert_eq!(
        j["total_params"].as_u64().unwrap(),
        reference["num_parameters"].as_u64().unwrap() + 2 * 16,
        "total parameters vs torch"
    );
    // kv_lora 16 + rope 8 values per token on each of the 4 MLA layers, in
    // the default bf16 cache.
    assert_eq!(j["state_bytes_per_token"], 2 * 4 * (16 + 8));
}
