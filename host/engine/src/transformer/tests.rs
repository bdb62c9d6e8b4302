//! Oracle tests: the f32 forward pass against the transformers reference
//! logits and greedy tokens of the tiny fixtures (tests/fixtures/README.md).

use std::path::PathBuf;

use crate::checkpoint::HfCheckpoint;
use crate::error::Error;
use crate::source::TensorSource;
use crate::stats::StepStats;
use crate::transformer::experts::DenseExperts;

use super::ops::argmax;
use super::{State, Transformer};

fn fixture_dir(family: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(format!("tiny-{family}"))
}

/// A missing fixture fails the test, naming the file: a skipped oracle
/// must never look like a pass.
fn require(path: &std::path::Path) {
    assert!(path.exists(), "fixture file missing: {}", path.display());
}

struct Reference {
    prompt_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
    shape: [usize; 2],
    logits: Vec<f32>,
}

fn reference(family: &str) -> Reference {
    let dir = fixture_dir(family);
    let json_path = dir.join("reference.json");
    let bin_path = dir.join("reference_logits.f32");
    require(&json_path);
    require(&bin_path);
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    let ids = |k: &str| -> Vec<u32> {
        json[k].as_array().unwrap_or_else(|| panic!("{k} missing")).iter().map(|v| v.as_u64().unwrap() as u32).collect()
    };
    let shape = json["logits_shape"].as_array().expect("logits_shape");
    let shape = [shape[0].as_u64().unwrap() as usize, shape[1].as_u64().unwrap() as usize];
    let bytes = std::fs::read(&bin_path).unwrap();
    let logits: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    assert_eq!(logits.len(), shape[0] * shape[1], "{} length", bin_path.display());
    Reference { prompt_ids: ids("prompt_ids"), greedy_ids: ids("greedy_ids"), shape, logits }
}

/// Returns the worst |diff| / max|logit| over the positions.
fn oracle(family: &str) -> f32 {
    let dir = fixture_dir(family);
    require(&dir.join("config.json"));
    let r = reference(family);
    let ckpt = HfCheckpoint::open(&dir).unwrap_or_else(|e| panic!("open {}: {e}", dir.display()));
    let cfg = ckpt.config().clone();
    assert_eq!(r.shape, [r.prompt_ids.len(), cfg.vocab_size]);
    let model = Transformer::load(&cfg, &ckpt).unwrap_or_else(|e| panic!("load {family}: {e}"));
    let experts = DenseExperts(&ckpt);
    let mut state = State::new(&cfg, r.prompt_ids.len() + r.greedy_ids.len() + 4);
    let mut stats = StepStats::default();
    let got = model.forward(&mut state, &r.prompt_ids, &experts, true, &mut stats).unwrap();
    assert_eq!(got.len(), r.logits.len());
    assert!(stats.picks().total() > 0, "no routed expert ran");

    let v = cfg.vocab_size;
    let (mut worst_rel, mut worst_abs) = (0.0f32, 0.0f32);
    for t in 0..r.shape[0] {
        let (a, b) = (&got[t * v..(t + 1) * v], &r.logits[t * v..(t + 1) * v]);
        let max_abs = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let diff = a.iter().zip(b).fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(diff <= 1e-4 * max_abs, "{family} position {t}: max |diff| {diff} > 1e-4 * {max_abs}");
        worst_rel = worst_rel.max(diff / max_abs);
        worst_abs = worst_abs.max(diff);
    }
    println!("{family}: max |logit diff| {worst_abs:e}, relative to max |logit| {worst_rel:e}");

    // Greedy decode one token at a time on the same state.
    let mut next = argmax(&got[(r.shape[0] - 1) * v..]) as u32;
    let mut greedy = Vec::new();
    for _ in 0..r.greedy_ids.len() {
        greedy.push(next);
        let logits = model.forward(&mut state, &[next], &experts, false, &mut stats).unwrap();
        next = argmax(&logits) as u32;
    }
    assert_eq!(greedy, r.greedy_ids, "{family}: greedy tokens differ from the reference");
    worst_rel
}

#[test]
fn oracle_qwen3_moe() {
    let e = oracle("qwen3_moe");
    assert!(e <= 1e-4, "relative error {e}");
}

#[test]
fn oracle_olmoe() {
    let e = oracle("olmoe");
    assert!(e <= 1e-4, "relative error {e}");
}

#[test]
fn oracle_mixtral() {
    let e = oracle("mixtral");
    assert!(e <= 1e-4, "relative error {e}");
}

/// Token-at-a-time prefill and one call with all tokens agree exactly, and
/// the state's position and error paths behave.
#[test]
fn state_and_errors() {
    let dir = fixture_dir("qwen3_moe");
    require(&dir.join("config.json"));
    let ckpt = HfCheckpoint::open(&dir).unwrap();
    let cfg = ckpt.config().clone();
    let model = Transformer::load(&cfg, &ckpt).unwrap();
    let experts = DenseExperts(&ckpt);
    let mut stats = StepStats::default();
    let prompt = [5u32, 17, 300, 42];

    let mut a = State::new(&cfg, 8);
    let all = model.forward(&mut a, &prompt, &experts, false, &mut stats).unwrap();
    assert_eq!(a.position(), 4);
    let mut b = State::new(&cfg, 8);
    let mut last = Vec::new();
    for &t in &prompt {
        last = model.forward(&mut b, &[t], &experts, false, &mut stats).unwrap();
    }
    assert_eq!(all, last);

    let err = model.forward(&mut a, &[cfg.vocab_size as u32], &experts, false, &mut stats).unwrap_err();
    assert!(matches!(err, Error::Arg(_)) && err.to_string().contains("vocabulary"), "{err}");
    let err = model.forward(&mut a, &[1, 2, 3, 4, 5], &experts, false, &mut stats).unwrap_err();
    assert!(err.to_string().contains("context"), "{err}");
    assert_eq!(a.position(), 4, "a refused call must not move the position");
    assert!(model.forward(&mut a, &[], &experts, false, &mut stats).is_err());

    a.reset();
    assert_eq!(a.position(), 0);
    let again = model.forward(&mut a, &prompt, &experts, false, &mut stats).unwrap();
    assert_eq!(again, all);
    assert_eq!(a.bytes(), 2 * cfg.num_layers * 8 * cfg.kv_dim() * 4);
}

/// A checkpoint missing a trunk tensor fails at load, naming it.
#[test]
fn load_names_missing_tensor() {
    struct Without<'a>(&'a HfCheckpoint, &'static str);
    impl TensorSource for Without<'_> {
        fn matrix(&self, name: &str) -> crate::Result<crate::quant::QMatrix> {
            self.0.matrix(name)
        }
        fn vector(&self, name: &str) -> crate::Result<Vec<f32>> {
            self.0.vector(name)
        }
        fn has(&self, name: &str) -> bool {
            name != self.1 && self.0.has(name)
        }
    }
    let dir = fixture_dir("olmoe");
    require(&dir.join("config.json"));
    let ckpt = HfCheckpoint::open(&dir).unwrap();
    let name = "model.layers.1.self_attn.k_norm.weight";
    let err = Transformer::load(ckpt.config(), &Without(&ckpt, name)).err().expect("load must fail");
    assert!(err.to_string().contains(name), "{err}");
}

/// A DeepSeek-V4 hash table comes from an untrusted file and indexes the
/// experts: an id past them (or not an integer) fails at load, naming the
/// tensor, instead of routing to an expert that does not exist.
#[test]
fn hash_table_naming_a_missing_expert_is_refused() {
    struct Patched<'a>(&'a HfCheckpoint, f32);
    impl TensorSource for Patched<'_> {
        fn matrix(&self, name: &str) -> crate::Result<crate::quant::QMatrix> {
            self.0.matrix(name)
        }
        fn vector(&self, name: &str) -> crate::Result<Vec<f32>> {
            let mut v = self.0.vector(name)?;
            if name.ends_with(".tid2eid") {
                v[7] = self.1;
            }
            Ok(v)
        }
        fn has(&self, name: &str) -> bool {
            self.0.has(name)
        }
    }
    let dir = fixture_dir("deepseek_v4");
    require(&dir.join("config.json"));
    let ckpt = HfCheckpoint::open(&dir).unwrap();
    assert!(Transformer::load(ckpt.config(), &Patched(&ckpt, 15.0)).is_ok());
    for bad in [16.0, -1.0, 2.5] {
        let err = Transformer::load(ckpt.config(), &Patched(&ckpt, bad)).err().expect("load must fail");
        assert!(err.to_string().contains("model.layers.0.mlp.gate.tid2eid"), "{err}");
    }
}

/// Kimi-Linear (KDA + MLA layers, sigmoid router with bias, shared expert,
/// dense layer 0) against transformers, prompt longer than one 64-token chunk.
#[test]
fn oracle_kimi_linear() {
    let e = oracle("kimi_linear");
    assert!(e <= 1e-4, "relative error {e}");
}

/// Kimi K3 straight from the checkpoint (`language_model.` prefix, f32
/// experts on the latent with SiTU), decode on the cached state.
#[test]
fn oracle_kimi_k3() {
    let e = oracle("kimi_k3");
    assert!(e <= 1e-4, "relative error {e}");
}

/// A failed forward after a KDA layer moved its recurrent state leaves the
/// state unusable until reset, and reset restores a clean start: prefill in
/// one call, token at a time, and after a reset all agree.
#[test]
fn kda_state_reset_and_token_at_a_time() {
    let dir = fixture_dir("kimi_linear");
    require(&dir.join("config.json"));
    let ckpt = HfCheckpoint::open(&dir).unwrap();
    let cfg = ckpt.config().clone();
    let model = Transformer::load(&cfg, &ckpt).unwrap();
    let experts = DenseExperts(&ckpt);
    let mut stats = StepStats::default();
    let prompt = [5u32, 17, 300, 42, 7, 99];
    let mut a = State::new(&cfg, 8);
    let all = model.forward(&mut a, &prompt, &experts, false, &mut stats).unwrap();
    let mut b = State::new(&cfg, 8);
    let mut last = Vec::new();
    for &t in &prompt {
        last = model.forward(&mut b, &[t], &experts, false, &mut stats).unwrap();
    }
    assert_eq!(all, last);
    a.reset();
    let again = model.forward(&mut a, &prompt, &experts, false, &mut stats).unwrap();
    assert_eq!(again, all, "reset must clear the KDA state and conv rings");
}

/// The second wave's families straight from their checkpoints: within
/// 1e-4 of max |logit| at every position, greedy tokens identical on the
/// cached state (tests/fixtures/FAMILIES_MATH.md says what each computes).
#[test]
fn oracle_qwen2_moe() {
    let e = oracle("qwen2_moe");
    assert!(e <= 1e-4, "relative error {e}");
}

#[test]
fn oracle_glm4_moe() {
    let e = oracle("glm4_moe");
    assert!(e <= 1e-4, "relative error {e}");
}

#[test]
fn oracle_minimax_m2() {
    let e = oracle("minimax_m2");
    assert!(e <= 1e-4, "relative error {e}");
}

#[test]
fn oracle_qwen3_next() {
    let e = oracle("qwen3_next");
    assert!(e <= 1e-4, "relative error {e}");
}

#[test]
fn oracle_qwen3_5_moe_vl_release_layout() {
    let e = oracle("qwen3_5_moe");
    assert!(e <= 1e-4, "relative error {e}");
}

#[test]
fn oracle_qwen3_5_moe_text() {
    let e = oracle("qwen3_5_moe_text");
    assert!(e <= 1e-4, "relative error {e}");
}

#[test]
fn oracle_gpt_oss() {
    let e = oracle("gpt_oss");
    assert!(e <= 1e-4, "relative error {e}");
}

#[test]
fn oracle_gpt_oss_mxfp4_release_layout() {
    let e = oracle("gpt_oss-mxfp4");
    assert!(e <= 1e-4, "relative error {e}");
}

/// The MLA families at the engine level too, so they also run where only
/// the engine's tests execute (ARM Linux under qemu in CI): DeepSeek-V3,
/// and DeepSeek-V3.2 and GLM-5 with the DSA indexer past `index_topk`.
#[test]
fn oracle_deepseek_v3_and_dsa() {
    for family in ["deepseek_v3", "deepseek_v32", "glm_moe_dsa"] {
        let e = oracle(family);
        assert!(e <= 1e-4, "{family}: relative error {e}");
    }
}

#[test]
fn oracle_deepseek_v4() {
    let err = oracle("deepseek_v4");
    assert!(err < 1e-4, "deepseek_v4: max |Δ| / max |logit| = {err}");
}
