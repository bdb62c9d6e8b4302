//! Kimi-Linear end to end against transformers: the tiny `kimi_linear`
//! fixture (KDA and MLA layers, sigmoid router with score-correction bias,
//! shared expert, dense layer 0; tests/gen_kimi_fixtures.py) converted with
//! an f32 trunk and f32 experts, run through the public API and the bundled
//! component, and described by `waste info`.

use waste_host::Engine;

use crate::common::*;

#[test]
fn kimi_linear_f32_matches_transformers_at_every_position() {
    let reference = reference("kimi_linear");
    assert!(reference.prompt_ids.len() > 64, "the prompt must cross a 64-token KDA chunk");
    crate::oracle::check_f32("kimi_linear");
}

#[test]
fn kimi_linear_info_shows_layer_pattern_and_state() {
    let tmp = TempDir::new("kimi-info");
    let container = convert("kimi_linear", "f32", "f32", tmp.path());
    let o = waste(&["info", container.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(j["family"], "kimi_linear");
    let pattern = layer_pattern(&j);
    assert_eq!(pattern, ["KDA/dense", "KDA/moe", "MLA/moe", "KDA/moe", "MLA/moe"]);
    assert_eq!((j["experts"].as_u64(), j["top_k"].as_u64()), (Some(8), Some(2)));
    // MLA caches kv_lora 16 + rope 8 values per token (bf16 by default);
    // KDA keeps 2 heads of 16x16 plus 3 conv rows of q, k, v (3 x 3 x 32
    // floats), whatever the context.
    assert_eq!(j["layer_pattern"][2]["state_bytes_per_token"], 2 * (16 + 8));
    assert_eq!(j["layer_pattern"][0]["state_bytes_per_token"], 0);
    assert_eq!(j["layer_pattern"][0]["state_bytes_fixed"], 4 * (2 * 16 * 16 + 3 * 3 * 32));
    assert_eq!(j["state_bytes_per_token"], 2 * 2 * (16 + 8));
    let reference: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture("kimi_linear").join("reference.json")).unwrap()).unwrap();
    // torch counts parameters only; e_score_correction_bias is a buffer (8 per MoE layer).
    assert_eq!(
        j["total_params"].as_u64().unwrap(),
        reference["num_parameters"].as_u64().unwrap() + 4 * 8,
        "total parameters vs torch"
    );
    assert!(j["active_params"].as_u64().unwrap() < j["total_params"].as_u64().unwrap());

    let o = waste(&["info", container.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("layer pattern KDA/dense KDA/MoE MLA/MoE KDA/MoE MLA/MoE"), "{text}");
}

/// Saving and restoring a session carries the KDA matrices, the conv rings
/// and the MLA latent rows: the restored session continues bit-identically.
#[test]
fn kimi_linear_saved_state_continues_bit_identically() {
    let tmp = TempDir::new("kimi-state");
    let container = convert("kimi_linear", "f32", "f32", tmp.path());
    let file = tmp.path().join("s.state");
    let reference = reference("kimi_linear");
    let engine = Engine::new().unwrap();
    assert_saved_state_continues(&engine, &container, &file, reference.prompt_ids.split_at(40), "KDA/MLA");
}

/// Quantised Kimi containers are held to error bounds, like the GQA
/// families in oracle.rs: the measured figures (docs/PERFORMANCE.md,
/// "Kimi-Linear quantised vs f32") plus a margin. A broken layout or
/// kernel gives errors of order 1 and top-1 agreement near 1/vocab.
#[test]
fn kimi_linear_quantised_formats_stay_within_stated_error() {
    // (experts, trunk, max relative logit error, min top-1 agreement)
    let cases = [("q8", "q8", BOUND_Q8), ("q4", "q4", BOUND_Q4), ("rvq3", "q4", BOUND_RVQ3)];
    let tmp = TempDir::new("kimi-quantised");
    let reference = reference("kimi_linear");
    let mut failures = Vec::new();
    for (experts, trunk, (max_err, min_agree)) in cases {
        let container = convert("kimi_linear", experts, trunk, tmp.path());
        let engine = Engine::new().unwrap();
        let mut session = open_session(&engine, &container);
        let (logits, _) = session.eval(&reference.prompt_ids, true).unwrap();
        let (worst, agree) = compare_positions(&logits, &reference);
        eprintln!("kimi_linear experts {experts:<4} trunk {trunk:<3} max rel err {worst:.4} top-1 {agree:.3}");
        if worst > max_err || agree < min_agree {
            failures.push(format!("{experts}/{trunk}: {worst} (bound {max_err}), top-1 {agree} (bound {min_agree})"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

// Measured 1.10 / 0.778, 1.58 / 0.283, 1.51 / 0.273. The errors are large
// because the fixture is a worst case: 99 positions x 4 routers within
// 2.7e-4 of a tie, so any weight error flips experts somewhere, and a flip
// (scaled by 2.446) moves every later position through the KDA state.
// Quantising one tensor group alone shows pure quantisation noise where no
// flip follows (q8 on g_a/g_b: 0.004, on the MLA kv projections: 0.005).
const BOUND_Q8: (f32, f32) = (1.3, 0.7);
const BOUND_Q4: (f32, f32) = (1.9, 0.2);
const BOUND_RVQ3: (f32, f32) = (1.8, 0.2);
