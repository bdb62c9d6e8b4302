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

use std::sync::{Arc, Mutex};
use std::time::Instant;

use waste_host::synth::{preset, synth};
use waste_host::{Engine, GenerateParams, Model, OpenOptions};

const VOCAB: usize = 160_000;
const TOKENS: u32 = 64;

fn main() {
    let dir = std::env::temp_dir().join(format!("waste-boundary-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("vocab160k.waste");
    let mut spec = preset("small").expect("the small preset exists");
    spec.vocab = VOCAB;
    synth(&path, &spec, &mut |_, _| {}).expect("synthesise the container");

    let model = Model::open(&path, &OpenOptions::default()).expect("open");
    let engine = Engine::new().expect("engine");
    println!("vocabulary {VOCAB}, {TOKENS} tokens per run, best of 3 runs");
    println!("{:<40} {:>12} {:>12} {:>12}", "sampling", "wall ms/tok", "fwd ms/tok", "guest+wit");
    let cases: Vec<(&str, GenerateParams)> = vec![
        ("greedy", GenerateParams { temperature: 0.0, top_k: 0, top_p: 1.0, ..GenerateParams::default() }),
        ("temp 0.8, top-k 40, top-p 0.95", GenerateParams { temperature: 0.8, top_k: 40, top_p: 0.95, ..GenerateParams::default() }),
        ("temp 0.8, top-p 0.95 (no top-k)", GenerateParams { temperature: 0.8, top_k: 0, top_p: 0.95, ..GenerateParams::default() }),
        ("temp 1.0, full distribution", GenerateParams { temperature: 1.0, top_k: 0, top_p: 1.0, ..GenerateParams::default() }),
        ("temp 0.8, top-k 40, 5 top logprobs", GenerateParams { temperature: 0.8, top_k: 40, top_p: 1.0, top_logprobs: 5, ..GenerateParams::default() }),
        ("temp 0.8, k 40, p 0.95, penalties, 5 lp", GenerateParams { temperature: 0.8, top_k: 40, top_p: 0.95, repetition_penalty: 1.1, presence_penalty: 0.5, frequency_penalty: 0.5, top_logprobs: 5, ..GenerateParams::default() }),
    ];
    for (name, params) in cases {
        let params = GenerateParams { max_tokens: TOKENS, stop_at_eos: false, seed: 7, ..params };
        let mut best: Option<(f64, f64)> = None;
        for _ in 0..3 {
            let mut session = engine.session(model.clone()).expect("session");
            let forward_ms = Arc::new(Mutex::new(0.0f64));
            let sink = forward_ms.clone();
            let started = Instant::now();
            let out = session
                .generate(&[1, 2, 3], &params, move |e| {
                    *sink.lock().expect("lock") += e.ms_total as f64;
                    true
                })
                .expect("generate");
            let wall = started.elapsed().as_secs_f64() * 1000.0 / out.tokens.len() as f64;
            let fwd = *forward_ms.lock().expect("lock") / out.tokens.len() as f64;
            if best.map_or(true, |(w, _)| wall < w) {
                best = Some((wall, fwd));
            }
        }
        let (wall, fwd) = best.expect("three runs");
        println!("{name:<40} {wall:>12.3} {fwd:>12.3} {:>12.3}", wall - fwd);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
