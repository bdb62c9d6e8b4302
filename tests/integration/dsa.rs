//! DeepSeek Sparse Attention end to end against transformers: the tiny
//! `deepseek_v32` and `glm_moe_dsa` fixtures (tests/gen_dsa_fixtures.py),
//! MLA plus a lightning indexer with `index_topk` 8, so the 99-token prompt
//! attends a selection at 91 of its positions; GLM's layers 2 and 3 reuse
//! layer 1's selection.

use waste_host::{Engine, Model};

use crate::common::*;

const FAMILIES: [&str; 2] = ["deepseek_v32", "glm_moe_dsa"];

#[test]
fn deepseek_v32_f32_matches_transformers_at_every_position() {
    crate::oracle::check_f32("deepseek_v32");
}

#[test]
fn glm_moe_dsa_f32_matches_transformers_at_every_position() {
    crate::oracle::check_f32("glm_moe_dsa");
}

/// The same checkpoint with `index_topk` past the prompt is plain MLA over
/// every position: its logits are far from the reference, so the oracle
/// above fails any engine that ignores the indexer past `index_topk`.
#[test]
fn dense_mla_past_index_topk_fails_the_oracle() {
    let tmp = TempDir::new("dsa-dense");
    for family in FAMILIES {
        let src = tmp.path().join(format!("{family}-dense"));
        std::fs::create_dir_all(&src).unwrap();
        for entry in std::fs::read_dir(fixture(family)).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), src.join(entry.file_name())).unwrap();
        }
        let mut config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
        config["index_topk"] = 1_000_000.into();
        std::fs::write(src.join("config.json"), config.to_string()).unwrap();
        let out = tmp.path().join(format!("{family}-dense.waste"));
        let o = waste(&["convert", src.to_str().unwrap(), out.to_str().unwrap(), "--experts", "f32", "--trunk", "f32"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let reference = reference(family);
        let model = Model::open(&out, &exact()).unwrap();
        let mut state = model.new_state();
        let (logits, _) = model.forward(&mut state, &reference.prompt_ids, true).unwrap();
        let (rel, _) = compare_positions(&logits, &reference);
        eprintln!("{family}: dense MLA vs DSA reference, max relative logit diff {rel:e}");
        assert!(rel > 1e-2, "{family}: the dense path is within {rel:e} of the DSA reference");
    }
}

/// Saving and restoring a session past `index_topk` carries the indexer's
/// keys with the latent rows: the restored session continues bit-identically.
#[test]
fn dsa_saved_state_continues_bit_identically() {
    let tmp = TempDir::new("dsa-state");
    let engine = Engine::new().unwrap();
    for family in FAMILIES {
        let container = convert(family, "f32", "f32", tmp.path());
        let file = tmp.path().join(format!("{family}.state"));
        let reference = reference(family);
        assert_saved_state_continues(&engine, &container, &file, reference.prompt_ids.split_at(40), family);
    }
}

/// `waste info` counts what torch counts plus the router biases (buffers),
/// and the state per token includes the indexer keys of the layers that
/// run an indexer.
#[test]
fn dsa_info_counts_parameters_and_indexer_keys() {
    let tmp = TempDir::new("dsa-info");
    // (family, layers with their own indexer)
    for (family, indexers) in [("deepseek_v32", 4), ("glm_moe_dsa", 2)] {
        let container = convert(family, "f32", "f32", tmp.path());
        let o = waste(&["info", container.to_str().unwrap(), "--json"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let j: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        let reference: serde_json::Value =
            serde_json::from_slice(&std::fs::read(fixture(family).join("reference.json")).unwrap()).unwrap();
        // Three MoE layers of 16 experts: 3 x 16 e_score_correction_bias floats.
        assert_eq!(
            j["total_params"].as_u64().unwrap(),
            reference["num_parameters"].as_u64().unwrap() + 3 * 16,
            "{family}: total parameters vs torch"
        );
        // kv_lora 16 + rope 8 values on 4 layers, and a 16-value index key
        // on each layer with its own indexer, in the default bf16 cache.
        assert_eq!(j["state_bytes_per_token"], 2 * (4 * (16 + 8) + indexers * 16), "{family}");
        let kinds: Vec<String> = layer_pattern(&j);
        let want = if indexers == 4 {
            vec!["MLA+DSA"; 4]
        } else {
            vec!["MLA+DSA", "MLA+DSA", "MLA+DSA(shared)", "MLA+DSA(shared)"]
        };
        assert_eq!(kinds.iter().map(|k| k.split('/').next().unwrap()).collect::<Vec<_>>(), want, "{family}");
    }
}

/// DeepSeek-V3.2's release ships no Jinja chat template: its container
/// carries llama.cpp's port, so `waste chat` works, and says so; a release
/// that has a template keeps its own.
#[test]
fn deepseek_v32_without_a_template_gets_the_bundled_one() {
    let tmp = TempDir::new("dsa-template");
    let src = tmp.path().join("release");
    std::fs::create_dir_all(&src).unwrap();
    for entry in std::fs::read_dir(fixture("deepseek_v32")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), src.join(entry.file_name())).unwrap();
    }
    let mut tc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("tokenizer_config.json")).unwrap()).unwrap();
    tc.as_object_mut().unwrap().remove("chat_template");
    std::fs::write(src.join("tokenizer_config.json"), tc.to_string()).unwrap();
    let out = tmp.path().join("v32.waste");
    let o = waste(&["convert", src.to_str().unwrap(), out.to_str().unwrap(), "--experts", "q8", "--trunk", "q8"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("chat template: the release ships none"), "{}", stderr(&o));
    let want = std::fs::read(fixtures().join("chat_templates/llamacpp/deepseek-ai-DeepSeek-V3.2.jinja")).unwrap();
    assert_eq!(std::fs::read(out.join("chat_template.jinja")).unwrap(), want);
    // The component renders it: a chat turn runs.
    let o = waste_with_stdin(&["chat", out.to_str().unwrap(), "-n", "2", "--temp", "0"], Some("Hello\n"));
    assert!(o.status.success(), "{}", stderr(&o));

    // The fixture itself has a template: nothing is added.
    let own = convert("deepseek_v32", "q8", "q8", tmp.path());
    assert!(!own.join("chat_template.jinja").exists());
}

/// DeepSeek-V3.2's release layout (tests/gen_dsa_fixtures.py `release`):
/// fp8 block-scaled matrices including the indexer's `wq_b` / `wk`, bf16
/// head weights and norms, the release's config keys and an MTP layer.
/// Converted exactly (f32), it matches transformers on the dequantised
/// weights at every position, and the MTP layer is reported as skipped.
#[test]
fn deepseek_v32_release_layout_converts_and_matches_transformers() {
    let tmp = TempDir::new("dsa-release");
    let out = tmp.path().join("v32-release.waste");
    let src = fixture("deepseek_v32-fp8");
    let o = waste(&["convert", src.to_str().unwrap(), out.to_str().unwrap(), "--experts", "f32", "--trunk", "f32"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("multi-token-prediction layer after the 4 decoder layers (model.layers.4.*)"),
        "{}",
        stderr(&o)
    );
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(src.join("reference.json")).unwrap()).unwrap();
    let ids: Vec<u32> = json["prompt_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let bytes = std::fs::read(src.join("reference_logits.f32")).unwrap();
    let want: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    let v = json["logits_shape"][1].as_u64().unwrap() as usize;
    let model = Model::open(&out, &exact()).unwrap();
    let mut state = model.new_state();
    let (got, _) = model.forward(&mut state, &ids, true).unwrap();
    assert_eq!(got.len(), want.len());
    let mut worst = 0.0f32;
    for (a, b) in got.chunks_exact(v).zip(want.chunks_exact(v)) {
        let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let diff = a.iter().zip(b).fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
        worst = worst.max(diff / scale);
        assert_eq!(argmax(a), argmax(b));
    }
    eprintln!("deepseek_v32 release layout: max |logit diff| / max |logit| = {worst:e}");
    assert!(worst <= 1e-4, "{worst}");
}
