//! Sampler plugins: the example Mirostat plugin, and plugins that trap, loop
//! forever or hoard memory, which must end only their own generation.

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use waste_host::plugin::{PluginLimits, SamplerPlugin};
use waste_host::{Engine, GenerateParams, Model, OpenOptions, StopReason};

use crate::common::*;

/// Builds a plugin crate under examples/ for wasm32-wasip2 (its own target
/// directory: the outer cargo holds the lock on the shared one).
pub(crate) fn plugin(name: &str) -> PathBuf {
    static LOCK: Mutex<()> = Mutex::new(());
    let _one_build_at_a_time = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = target_dir().join("plugins");
    let crate_name = format!("waste-sampler-{name}");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(&root)
        .args(["build", "--release", "-p", &crate_name, "--target", "wasm32-wasip2", "--target-dir"])
        .arg(&target)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .status()
        .expect("run cargo");
    assert!(status.success(), "building {crate_name} for wasm32-wasip2 failed");
    let wasm = target.join(format!("wasm32-wasip2/release/waste_sampler_{name}.wasm"));
    assert!(wasm.is_file(), "{} is missing", wasm.display());
    wasm
}

fn session() -> waste_host::Session {
    static DIR: OnceLock<(TempDir, PathBuf)> = OnceLock::new();
    let (_, path) = DIR.get_or_init(|| {
        let tmp = TempDir::new("plugins");
        let path = convert("qwen3_moe", "f32", "f32", tmp.path());
        (tmp, path)
    });
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    let engine = ENGINE.get_or_init(|| Engine::new().unwrap());
    engine.session(Model::open(path, &OpenOptions::default()).unwrap()).unwrap()
}

fn params(n: u32, seed: u64) -> GenerateParams {
    GenerateParams { temperature: 1.0, seed, max_tokens: n, stop_at_eos: false, ..GenerateParams::default() }
}

#[test]
fn mirostat_plugin_samples_reproducibly() {
    let wasm = plugin("mirostat");
    let mut s = session();
    let prompt = s.tokenize("And God said").unwrap();
    let opts = vec![("tau".to_string(), 3.0), ("eta".to_string(), 0.1)];
    s.set_sampler(Some(SamplerPlugin::load(&wasm, opts.clone(), PluginLimits::default()).unwrap()));
    let a = s.generate(&prompt, &params(12, 5), |_| true).unwrap();
    s.reset();
    let b = s.generate(&prompt, &params(12, 5), |_| true).unwrap();
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(a.tokens.len(), 12);
    // A tiny tau makes mirostat greedy: it must agree with greedy decoding.
    s.set_sampler(Some(SamplerPlugin::load(&wasm, vec![("tau".into(), 0.001)], PluginLimits::default()).unwrap()));
    s.reset();
    let low = s.generate(&prompt, &params(6, 5), |_| true).unwrap();
    s.set_sampler(None);
    s.reset();
    let greedy = s.generate(&prompt, &GenerateParams { temperature: 0.0, ..params(6, 5) }, |_| true).unwrap();
    assert_eq!(low.tokens, greedy.tokens);
    // Its own option checks reach the caller.
    s.set_sampler(Some(SamplerPlugin::load(&wasm, vec![("eta".into(), 5.0)], PluginLimits::default()).unwrap()));
    let err = s.generate(&prompt, &params(2, 5), |_| true).unwrap_err().to_string();
    assert!(err.contains("eta"), "{err}");
}

#[test]
fn misbehaving_plugins_end_only_their_generation() {
    let wasm = plugin("misbehave");
    let limits = PluginLimits { fuel_per_call: 50_000_000, memory_bytes: 32 << 20 };
    let mut s = session();
    let prompt = s.tokenize("And God said").unwrap();
    let mut greedy_ref = session();
    let expected =
        greedy_ref.generate(&prompt, &GenerateParams { temperature: 0.0, ..params(4, 0) }, |_| true).unwrap();
    for (mode, needle) in [
        (1.0, "trapped"),
        (2.0, "fuel limit of 50000000"),
        (3.0, "memory limit of 33554432"),
        (4.0, "outside the vocabulary of"),
    ] {
        let p = SamplerPlugin::load(&wasm, vec![("mode".into(), mode)], limits).unwrap();
        s.set_sampler(Some(p));
        s.reset();
        let err = s.generate(&prompt, &params(4, 0), |_| true).unwrap_err().to_string();
        assert!(err.contains("waste_sampler_misbehave.wasm") && err.contains(needle), "mode {mode}: {err}");
        // The session and the model stay usable.
        s.set_sampler(None);
        s.reset();
        let after = s.generate(&prompt, &GenerateParams { temperature: 0.0, ..params(4, 0) }, |_| true).unwrap();
        assert_eq!(after.tokens, expected.tokens);
        assert_eq!(after.stop_reason, StopReason::Length);
    }
    // A well-behaved mode of the same plugin (greedy) works through it.
    s.set_sampler(Some(SamplerPlugin::load(&wasm, vec![("mode".into(), 0.0)], limits).unwrap()));
    s.reset();
    let ok = s.generate(&prompt, &params(4, 0), |_| true).unwrap();
    assert_eq!(ok.tokens, expected.tokens);
}

#[test]
fn a_file_that_is_not_a_plugin_is_rejected_by_name() {
    let tmp = TempDir::new("not-plugin");
    let f = tmp.path().join("junk.wasm");
    std::fs::write(&f, b"\0asm junk").unwrap();
    let err = SamplerPlugin::load(&f, vec![], PluginLimits::default()).err().unwrap().to_string();
    assert!(err.contains("junk.wasm"), "{err}");
}
