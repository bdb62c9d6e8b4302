//! The KV cache's storage types against the f32 cache: every family with
//! GQA or MLA layers, logits at every position of its reference prompt; the
//! trained bible-moe's held-out perplexity. Each non-f32 type computes
//! exactly attention on keys and values rounded once as they are written
//! (`waste_kernels::kv`); what that rounding changes downstream is a
//! property of the model, so the bounds here are measured, per family.

use waste_host::{Engine, KvType, Model, OpenOptions};

use crate::common::*;

/// max over positions of max|logit - f32 cache's| / max|f32 cache's logit|
/// at that position: the bound per family and type, about twice the
/// figure measured (`KV_TYPE_BOUNDS=print` prints them). The tiny
/// fixtures are random and most route by thin margins: a rounded key can
/// flip an expert pick, and a flipped pick moves the logits by far more
/// than the rounding itself (gpt-oss, qwen3_moe). bible-moe below is the
/// trained model's figure.
const BOUNDS: &[(&str, f32, f32)] = &[
    // (family, bf16, q8): measured 2026-12-04 (bf16, q8)
    ("qwen3_moe", 0.3, 0.3),          // 0.152, 0.152
    ("olmoe", 1e-2, 3e-2),            // 3.6e-3, 1.4e-2
    ("mixtral", 1e-2, 0.2),           // 3.4e-3, 0.109
    ("qwen2_moe", 1e-2, 0.15),        // 2.8e-3, 7.0e-2
    ("glm4_moe", 1e-2, 3e-2),         // 5.4e-3, 1.3e-2
    ("minimax_m2", 1e-2, 0.3),        // 2.8e-3, 0.141
    ("gpt_oss", 2.0, 2.0),            // 1.04, 1.01
    ("qwen3_next", 1e-2, 1e-2),       // 1.4e-3, 4.7e-3
    ("qwen3_5_moe_text", 1e-2, 1e-2), // 1.9e-3, 4.2e-3
    // MLA: the latent rows (and DSA's index keys) take the cache's type.
    // DSA picks its top-k positions by the rounded index keys: a changed
    // pick is a jump, as a changed expert is.
    ("deepseek_v3", 1e-2, 0.8),  // 5.7e-3, 0.357
    ("kimi_linear", 1e-2, 1e-2), // 9.4e-4, 3.0e-3
    ("deepseek_v32", 2.5, 2.5),  // 1.17, 1.09
    ("glm_moe_dsa", 1.0, 1.2),   // 0.512, 0.578
    ("kimi_k3", 0.25, 3.0),      // 0.111, 1.53
];

fn max_rel_error(got: &[f32], want: &[f32], vocab: usize) -> f32 {
    got.chunks_exact(vocab).zip(want.chunks_exact(vocab)).fold(0.0f32, |worst, (g, w)| {
        let scale = w.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        worst.max(g.iter().zip(w).fold(0.0f32, |m, (a, b)| m.max((a - b).abs())) / scale)
    })
}

fn logits(engine: &Engine, container: &std::path::Path, kv_type: KvType, prompt: &[u32]) -> Vec<f32> {
    let options = OpenOptions { kv_type, ..exact() };
    let mut session = engine.session(Model::open(container, &options).unwrap()).unwrap();
    session.eval(prompt, true).unwrap().0
}

#[test]
fn a_bf16_or_q8_kv_cache_stays_within_each_familys_recorded_bound() {
    let tmp = TempDir::new("kv-type");
    let engine = Engine::new().unwrap();
    let print = std::env::var("KV_TYPE_BOUNDS").is_ok_and(|v| v == "print");
    let mut failures = Vec::new();
    for &(family, bf16_bound, q8_bound) in BOUNDS {
        let container = convert(family, "f32", "f32", tmp.path());
        let reference = reference(family);
        let want = logits(&engine, &container, KvType::F32, &reference.prompt_ids);
        for (ty, bound) in [(KvType::Bf16, bf16_bound), (KvType::Q8, q8_bound)] {
            let got = logits(&engine, &container, ty, &reference.prompt_ids);
            let err = max_rel_error(&got, &want, reference.vocab);
            if print {
                eprintln!("{family} {ty}: {err:e}");
            }
            assert!(err > 0.0, "{family} {ty}: the logits equal the f32 cache's: the cache is not {ty}");
            if err > bound {
                failures.push(format!("{family} {ty}: {err:e} > {bound:e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}
