//! What the control component costs per token: time in the guest (sampling,
//! detokenising, the token loop) plus crossing the boundary (the logits
//! copied into the component, the event copied out), beside the forward
//! pass, on a synthetic model with a 160k-entry vocabulary.
//!
//! `cargo bench -p waste-host --bench boundary`
//!
//! Per token, `ms_total` of the event is the host's forward pass (measured
//! inside `evaluate`); the wall time between events minus that is what the
//! component and the boundary add.
//!
//! `cargo bench -p waste-host --bench boundary -- --structured` times
//! instead structured output beside the same sampling unconstrained, on the
//! same container given a synthetic 160k byte-level BPE tokenizer (the
//! mask's cost depends on the vocabulary's size and shape, not its words):
//! the once-per-session vocabulary index, and per token the mask.
//!
//! `cargo bench -p waste-host --bench boundary -- --passes MODULE.wasm` times
//! instead the exported passes of a core module built by
//! `guest/benches/wasm_sampling.sh` (the guest's sampling code, previous and
//! current, without the component around it) compiled by Cranelift with the
//! component's own wasmtime configuration: the compiler the component runs
//! under, which V8's figures do not show.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use waste_host::{preset, synth};
use waste_host::{Constraint, Engine, GenerateParams, Model, OpenOptions};

const VOCAB: usize = 160_000;
const TOKENS: u32 = 64;
const RUNS: usize = 5;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--passes") {
        let module = args.get(at + 1).expect("--passes MODULE.wasm");
        passes(std::path::Path::new(module));
        return;
    }
    let dir = std::env::temp_dir().join(format!("waste-boundary-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("vocab160k.waste");
    let mut spec = preset("small").expect("the small preset exists");
    spec.vocab = VOCAB;
    synth(&path, &spec, &mut |_, _| {}).expect("synthesise the container");
    if args.iter().any(|a| a == "--structured") {
        add_tokenizer(&path);
        structured(&path);
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }

    let model = Model::open(&path, &OpenOptions::default()).expect("open");
    let engine = Engine::new().expect("engine");
    // The figure is the smallest guest + boundary time of the runs: other
    // processes on the machine only ever add to it (the forward pass, read
    // from the events, is subtracted per run).
    println!("vocabulary {VOCAB}, {TOKENS} tokens per run, best of {RUNS} runs");
    println!("{:<40} {:>12} {:>12} {:>12}", "sampling", "wall ms/tok", "fwd ms/tok", "guest+wit");
    let cases: Vec<(&str, GenerateParams)> = vec![
        ("greedy", GenerateParams { temperature: 0.0, top_k: 0, top_p: 1.0, ..GenerateParams::default() }),
        (
            "temp 0.8, top-k 40, top-p 0.95",
            GenerateParams { temperature: 0.8, top_k: 40, top_p: 0.95, ..GenerateParams::default() },
        ),
        (
            "temp 0.8, top-p 0.95 (no top-k)",
            GenerateParams { temperature: 0.8, top_k: 0, top_p: 0.95, ..GenerateParams::default() },
        ),
        (
            "temp 1.0, full distribution",
            GenerateParams { temperature: 1.0, top_k: 0, top_p: 1.0, ..GenerateParams::default() },
        ),
        (
            "temp 0.8, min-p 0.05 (no top-k)",
            GenerateParams { temperature: 0.8, top_k: 0, top_p: 1.0, min_p: 0.05, ..GenerateParams::default() },
        ),
        (
            "temp 0.8, top-k 40, 5 top logprobs",
            GenerateParams { temperature: 0.8, top_k: 40, top_p: 1.0, top_logprobs: 5, ..GenerateParams::default() },
        ),
        (
            "temp 0.8, k 40, p 0.95, penalties, 5 lp",
            GenerateParams {
                temperature: 0.8,
                top_k: 40,
                top_p: 0.95,
                repetition_penalty: 1.1,
                presence_penalty: 0.5,
                frequency_penalty: 0.5,
                top_logprobs: 5,
                ..GenerateParams::default()
            },
        ),
    ];
    for (name, params) in cases {
        let params = GenerateParams { max_tokens: TOKENS, stop_at_eos: false, seed: 7, ..params };
        let mut best: Option<(f64, f64)> = None;
        for _ in 0..RUNS {
            let mut session = engine.session(model.clone()).expect("session");
            let forward_ms = Arc::new(Mutex::new(0.0f64));
            let sink = forward_ms.clone();
            let started = Instant::now();
            let out = session
                .generate(&[1, 2, 3], &params, move |e| {
                    *sink.lock().expect("lock") += e.stats.ms_total as f64;
                    true
                })
                .expect("generate");
            let wall = started.elapsed().as_secs_f64() * 1000.0 / out.tokens.len() as f64;
            let fwd = *forward_ms.lock().expect("lock") / out.tokens.len() as f64;
            if best.is_none_or(|(w, f)| wall - fwd < w - f) {
                best = Some((wall, fwd));
            }
        }
        let (wall, fwd) = best.expect("at least one run");
        println!("{name:<40} {wall:>12.3} {fwd:>12.3} {:>12.3}", wall - fwd);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A byte-level BPE tokenizer.json of `VOCAB` tokens (the 256 byte symbols,
/// then tokens grown one symbol at a time from earlier ones, each with its
/// merge, biased to letters and JSON punctuation, half with a leading
/// space), added to the container's manifest.
fn add_tokenizer(container: &std::path::Path) {
    // GPT-2's byte-to-symbol map: printable bytes stand for themselves.
    let symbol = |b: u8| -> char {
        match b {
            b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF => b as char,
            _ => {
                let rank = (0..b).filter(|&x| !matches!(x, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)).count();
                char::from_u32(256 + rank as u32).expect("a symbol")
            }
        }
    };
    let mut tokens: Vec<String> = (0..=255u8).map(|b| symbol(b).to_string()).collect();
    let mut seen: std::collections::HashSet<String> = tokens.iter().cloned().collect();
    let mut merges = Vec::new();
    let alphabet = b"etaoinshrdlucmfwypvbgkqjxzETAOINSHRDLU0123456789{}[]\",:._- ";
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    while tokens.len() < VOCAB - 1 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let base = &tokens[(x % tokens.len() as u64) as usize];
        if base.chars().count() > 10 {
            continue;
        }
        let next = symbol(alphabet[((x >> 32) % alphabet.len() as u64) as usize]).to_string();
        let word = format!("{base}{next}");
        if seen.insert(word.clone()) {
            merges.push(format!("{base} {next}"));
            tokens.push(word);
        }
    }
    let vocab: serde_json::Map<String, serde_json::Value> =
        tokens.iter().enumerate().map(|(i, t)| (t.clone(), i.into())).collect();
    let tokenizer = serde_json::json!({
        "version": "1.0",
        "added_tokens": [{"id": VOCAB - 1, "content": "<|im_end|>", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges},
    });
    std::fs::write(container.join("tokenizer.json"), tokenizer.to_string()).expect("write tokenizer.json");
    let manifest_path = container.join("manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest_path).expect("manifest")).expect("manifest JSON");
    manifest["tokenizer_files"] = serde_json::json!(["tokenizer.json"]);
    std::fs::write(&manifest_path, manifest.to_string()).expect("write the manifest");
}

/// Structured output beside the same sampling unconstrained: per token, the
/// guest + boundary time (the wall time between events less the forward
/// pass), best of `RUNS` runs on one session; and the first constrained
/// generation's extra time, which builds the vocabulary index once per
/// session (component instance).
fn structured(path: &std::path::Path) {
    let model = Model::open(path, &OpenOptions::default()).expect("open");
    let engine = Engine::new().expect("engine");
    let person = r#"{"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150}, "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 8}},
        "required": ["name", "age", "email", "tags"], "additionalProperties": false}"#;
    let base = GenerateParams {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        max_tokens: TOKENS,
        seed: 7,
        ..GenerateParams::default()
    };
    let cases: Vec<(&str, GenerateParams)> = vec![
        ("unconstrained (temp 0.8, k 40, p 0.95)", base.clone()),
        (
            "json_schema (4 fields)",
            GenerateParams { constraint: Some(Constraint::JsonSchema(person.into())), ..base.clone() },
        ),
        ("json_object", GenerateParams { constraint: Some(Constraint::JsonObject), ..base.clone() }),
        (
            "regex [a-z ]{1,200}",
            GenerateParams { constraint: Some(Constraint::Regex("[a-z ]{1,200}".into())), ..base.clone() },
        ),
        ("unconstrained, greedy", GenerateParams { temperature: 0.0, ..base.clone() }),
        (
            "json_object, greedy",
            GenerateParams { temperature: 0.0, constraint: Some(Constraint::JsonObject), ..base.clone() },
        ),
    ];
    let mut session = engine.session(model.clone()).expect("session");
    let prompt = [1u32, 2, 3];
    let started = Instant::now();
    session.check_params(&cases[2].1).expect("the constraint compiles");
    println!(
        "vocabulary {VOCAB}: first constrained check (index built) {:.0} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
    println!("{TOKENS} tokens at most per run, best of {RUNS} runs");
    println!("{:<40} {:>8} {:>12} {:>12} {:>12}", "case", "tokens", "wall ms/tok", "fwd ms/tok", "guest+wit");
    for (name, params) in cases {
        let mut best: Option<(f64, f64, usize)> = None;
        for _ in 0..RUNS {
            session.reset();
            let forward_ms = Arc::new(Mutex::new(0.0f64));
            let sink = forward_ms.clone();
            let started = Instant::now();
            let out = session
                .generate(&prompt, &params, move |e| {
                    *sink.lock().expect("lock") += e.stats.ms_total as f64;
                    true
                })
                .expect("generate");
            let n = out.tokens.len();
            let wall = started.elapsed().as_secs_f64() * 1000.0 / n as f64;
            let fwd = *forward_ms.lock().expect("lock") / n as f64;
            if best.is_none_or(|(w, f, _)| wall - fwd < w - f) {
                best = Some((wall, fwd, n));
            }
        }
        let (wall, fwd, n) = best.expect("at least one run");
        println!("{name:<40} {n:>8} {wall:>12.3} {fwd:>12.3} {:>12.3}", wall - fwd);
    }
}

/// Best of `RUNS` calls of every exported `() -> f64` function of the module
/// (after its `setup(160000)`), in export order; the value each returned is
/// printed beside it so that two variants can be seen to agree.
fn passes(path: &std::path::Path) {
    use wasmtime::{Config, Engine, Linker, Module, Store};
    const RUNS: usize = 30;
    // The component's configuration (host/runtime/src/engine_config.rs is
    // `Config::new()`; a bench cannot include that private module).
    let engine = Engine::new(&Config::new()).expect("engine");
    let module = Module::from_file(&engine, path).expect("load the module");
    let mut linker = Linker::new(&engine);
    linker.define_unknown_imports_as_traps(&module).expect("stub imports");
    let mut store = Store::new(&engine, ());
    let instance = linker.instantiate(&mut store, &module).expect("instantiate");
    let setup = instance.get_typed_func::<u32, ()>(&mut store, "setup").expect("setup(n)");
    setup.call(&mut store, VOCAB as u32).expect("setup");
    let names: Vec<String> = module
        .exports()
        .filter(|e| e.ty().func().is_some_and(|f| f.params().len() == 0 && f.results().len() == 1))
        .map(|e| e.name().to_string())
        .collect();
    println!("Cranelift (wasmtime, the component's Config), vocabulary {VOCAB}, best of {RUNS} calls");
    println!("{:<24} {:>10} {:>16}", "pass", "ms", "value");
    for name in names {
        let Ok(f) = instance.get_typed_func::<(), f64>(&mut store, &name) else {
            continue;
        };
        let mut best = f64::INFINITY;
        let mut value = 0.0;
        for _ in 0..RUNS {
            let started = Instant::now();
            value = f.call(&mut store, ()).expect("call");
            best = best.min(started.elapsed().as_secs_f64() * 1000.0);
        }
        println!("{name:<24} {best:>10.3} {value:>16}");
    }
}
