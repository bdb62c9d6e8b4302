//! The second wave's families end to end against transformers 5.24: each
//! tiny fixture (tests/gen_family_fixtures*.py; the math each computes is
//! tests/fixtures/FAMILIES_MATH.md) converted from its Hugging Face layout,
//! run through the public API and the bundled component: f32 logits at
//! every position and greedy tokens, quantised containers held to error
//! bounds, saved state continuing bit-identically, and `waste info`'s
//! shape of the model.

use waste_host::Engine;

use crate::common::*;

/// Every fixture of the second wave, as `tests/fixtures/tiny-<name>`.
const FIXTURES: &[&str] = &[
    "qwen2_moe",
    "glm4_moe",
    "minimax_m2",
    "gpt_oss",
    "gpt_oss-mxfp4",
    "qwen3_next",
    "qwen3_5_moe",
    "qwen3_5_moe_text",
];

#[test]
fn qwen2_moe_f32_matches_transformers_at_every_position() {
    crate::oracle::check_f32("qwen2_moe");
}

#[test]
fn glm4_moe_f32_matches_transformers_at_every_position() {
    crate::oracle::check_f32("glm4_moe");
}

#[test]
fn minimax_m2_f32_matches_transformers_at_every_position() {
    crate::oracle::check_f32("minimax_m2");
}

#[test]
fn gpt_oss_f32_matches_transformers_at_every_position() {
    crate::oracle::check_f32("gpt_oss");
}

/// The release's MXFP4 experts and bf16 trunk, decoded exactly.
#[test]
fn gpt_oss_mxfp4_release_layout_matches_transformers_at_every_position() {
    crate::oracle::check_f32("gpt_oss-mxfp4");
}

#[test]
fn qwen3_next_f32_matches_transformers_at_every_position() {
    let reference = reference("qwen3_next");
    assert!(reference.prompt_ids.len() > 64, "the prompt must cross a 64-token GDN chunk");
    crate::oracle::check_f32("qwen3_next");
}

/// The vision-language release: text tensors under `model.language_model.`,
/// fused experts, a vision tower and MTP layers the converter leaves out.
#[test]
fn qwen3_5_moe_vl_release_layout_matches_transformers_at_every_position() {
    crate::oracle::check_f32("qwen3_5_moe");
}

#[test]
fn qwen3_5_moe_text_f32_matches_transformers_at_every_position() {
    crate::oracle::check_f32("qwen3_5_moe_text");
}

/// A session saved halfway and restored continues bit-identically: KV rows
/// (a sliding-window layer's ring on gpt-oss), GDN matrices and conv rings.
#[test]
fn second_wave_saved_state_continues_bit_identically() {
    let tmp = TempDir::new("families-state");
    let engine = Engine::new().unwrap();
    for family in FIXTURES {
        let container = convert(family, "f32", "f32", tmp.path());
        let file = tmp.path().join(format!("{family}.state"));
        let reference = reference(family);
        // Past gpt-oss's window of 8, so its ring has wrapped when saved.
        let split = reference.prompt_ids.split_at(reference.prompt_ids.len() / 2);
        assert_saved_state_continues(&engine, &container, &file, split, family);
    }
}

/// rvq3 experts on a q4 trunk: the top-1 agreement and error of each
/// family, recorded (docs/PERFORMANCE.md, "Second-wave families quantised")
/// and held to bounds that catch a broken layout or kernel (errors of order
/// one, top-1 near 1/vocab), as for the first wave in oracle.rs.
#[test]
fn second_wave_quantised_rvq3_q4_stays_within_stated_error() {
    let tmp = TempDir::new("families-quantised");
    let engine = Engine::new().unwrap();
    let mut failures = Vec::new();
    for family in FIXTURES {
        let reference = reference(family);
        let bounds = BOUNDS.iter().find(|b| b.0 == *family).expect("bounds for every fixture");
        for (experts, trunk, (max_err, min_agree)) in [("q8", "q8", bounds.1), ("rvq3", "q4", bounds.2)] {
            let container = convert(family, experts, trunk, tmp.path());
            let mut session = open_session(&engine, &container);
            let (logits, _) = session.eval(&reference.prompt_ids, true).unwrap();
            let (worst, agree) = compare_positions(&logits, &reference);
            eprintln!("{family:<17} experts {experts:<4} trunk {trunk:<3} max rel err {worst:.4} top-1 {agree:.3}");
            if worst > max_err || agree < min_agree {
                failures.push(format!(
                    "{family} {experts}/{trunk}: {worst} (bound {max_err}), top-1 {agree} (bound {min_agree})"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

// The fixtures are a worst case for quantisation (random weights, prompts
// chosen with routers within ~1e-4 of a tie so the f32 check is strict):
// any weight error flips experts, and on the GDN families a flip travels
// on through the recurrent state. Bounds: the measured figures
// (docs/PERFORMANCE.md) with a margin, (max rel error, min top-1) for
// q8/q8 and rvq3/q4.
type Bound = (f32, f32);
const BOUNDS: &[(&str, Bound, Bound)] = &[
    ("qwen2_moe", (0.15, 0.85), (0.45, 0.6)),
    ("glm4_moe", (0.35, 0.75), (0.9, 0.35)),
    ("minimax_m2", (0.35, 0.8), (0.55, 0.55)),
    ("gpt_oss", (0.7, 0.75), (1.7, 0.1)),
    ("gpt_oss-mxfp4", (1.35, 0.65), (1.75, 0.1)),
    ("qwen3_next", (1.45, 0.65), (2.1, 0.15)),
    ("qwen3_5_moe", (1.25, 0.6), (2.2, 0.2)),
    ("qwen3_5_moe_text", (1.25, 0.6), (2.2, 0.2)),
];

/// `waste info` of each container: the family, the layer pattern, state
/// per token (a windowed layer's KV counted up to its window only), and
/// the parameter count torch reports for the fixture.
#[test]
fn second_wave_info_shows_layers_state_and_parameters() {
    let tmp = TempDir::new("families-info");
    for family in FIXTURES {
        let container = convert(family, "f32", "f32", tmp.path());
        let o = waste(&["info", container.to_str().unwrap(), "--json"]);
        assert!(o.status.success(), "{family}: {}", stderr(&o));
        let j: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        // torch counts parameters only: a router's correction bias is a
        // buffer (one per expert per MoE layer). The VL release's count
        // includes its vision tower and MTP layer, which the container
        // leaves out, and the MXFP4 layout is the gpt_oss fixture's model.
        let buffers = match *family {
            "glm4_moe" | "minimax_m2" => 8 * layer_pattern(&j).iter().filter(|l| l.ends_with("/moe")).count() as u64,
            _ => 0,
        };
        let counted_by = match *family {
            "qwen3_5_moe" => "qwen3_5_moe_text",
            "gpt_oss-mxfp4" => "gpt_oss",
            f => f,
        };
        let r: serde_json::Value =
            serde_json::from_slice(&std::fs::read(fixture(counted_by).join("reference.json")).unwrap()).unwrap();
        let torch = r["num_parameters"].as_u64().unwrap();
        assert_eq!(j["total_params"].as_u64().unwrap(), torch + buffers, "{family}: total parameters vs torch");
        assert!(j["active_params"].as_u64().unwrap() < j["total_params"].as_u64().unwrap(), "{family}");
        let skipped: Vec<&str> = j["skipped"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        match *family {
            "qwen3_5_moe" => {
                assert!(skipped.len() == 2, "{skipped:?}");
                assert!(skipped[0].starts_with("the vision tower (model.visual.*"), "{skipped:?}");
                assert!(skipped[1].starts_with("the multi-token-prediction head (mtp.*"), "{skipped:?}");
            }
            "qwen3_next" => assert!(skipped.iter().any(|s| s.contains("(mtp.*")), "{skipped:?}"),
            "glm4_moe" => assert_eq!(
                skipped,
                ["the multi-token-prediction layer after the 4 decoder layers (model.layers.4.*)"],
                "{family}"
            ),
            _ => assert!(skipped.is_empty(), "{family}: {skipped:?}"),
        }
        let pattern = layer_pattern(&j);
        if family.starts_with("gpt_oss") {
            // layer_types alternate sliding (window 8 in the fixture) and full.
            let windows: Vec<Option<u64>> =
                j["layer_pattern"].as_array().unwrap().iter().map(|l| l["window"].as_u64()).collect();
            assert_eq!(windows, [Some(8), None, Some(8), None], "{family}");
        }
        match *family {
            "qwen3_next" | "qwen3_5_moe" | "qwen3_5_moe_text" => {
                assert_eq!(pattern, ["GDN/moe", "GDN/moe", "GDN/moe", "GQA/moe"], "{family}")
            }
            _ => assert!(pattern.iter().all(|l| l.starts_with("GQA/")), "{family}: {pattern:?}"),
        }
    }
}
