//! The guest's token loop compiled natively (the `waste-guest` rlib) and the
//! same code inside the bundled component must draw the same tokens with the
//! same log-probabilities from the same logits and seed: the sampling passes
//! run on wasm SIMD lanes in the component and as scalar code natively, and
//! "same seed, same tokens on every platform" rests on the two being
//! bit-identical. A 160k-entry vocabulary exercises the vector paths' whole
//! blocks and the nucleus histograms the way a real model's vocabulary does.

use std::sync::Arc;

use waste_engine::synth::{preset, synth};
use waste_engine::transformer::State;
use waste_guest::generate::{self as native, Evaluation, ModelHost, StepStats, TokenEvent};
use waste_guest::sampling::SamplingParams;
use waste_host::{Engine, GenerateParams, Model, OpenOptions};

use crate::common::TempDir;

const VOCAB: usize = 160_000;

/// The engine's forward pass behind the guest's `ModelHost`, without the
/// component: the logits the component would be handed, token for token.
struct NativeHost {
    model: Arc<Model>,
    state: State,
    seen: Vec<u32>,
}

impl ModelHost for NativeHost {
    fn evaluate(&mut self, tokens: &[u32]) -> Result<Evaluation, String> {
        let (logits, _) = self.model.forward(&mut self.state, tokens, false).map_err(|e| e.to_string())?;
        self.seen.extend_from_slice(tokens);
        Ok(Evaluation { logits, position: self.seen.len() as u32, stats: StepStats::default() })
    }

    fn emit(&mut self, _event: TokenEvent) -> bool {
        true
    }

    fn recent_tokens(&mut self, n: u32) -> Vec<u32> {
        let from = self.seen.len().saturating_sub(n as usize);
        self.seen[from..].to_vec()
    }

    fn plugin_sample(&mut self, _logits: &[f32], _recent: &[u32]) -> Result<u32, String> {
        Err("no plugin in this test".into())
    }
}

fn native_params(p: &GenerateParams) -> native::GenerateParams {
    native::GenerateParams {
        sampling: SamplingParams {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
            repetition_penalty: p.repetition_penalty,
            presence_penalty: p.presence_penalty,
            frequency_penalty: p.frequency_penalty,
            penalty_last_n: p.penalty_last_n,
            logit_bias: p.logit_bias.clone(),
            top_logprobs: p.top_logprobs,
            seed: p.seed,
        },
        max_tokens: p.max_tokens,
        stop_at_eos: p.stop_at_eos,
        stop_strings: Vec::new(),
        stop_tokens: Vec::new(),
        use_plugin: false,
    }
}

#[test]
fn component_and_native_guest_draw_the_same_tokens_and_logprobs() {
    let tmp = TempDir::new("native-guest");
    let path = tmp.path().join("vocab160k.waste");
    let mut spec = preset("small").expect("the small preset exists");
    spec.vocab = VOCAB;
    synth(&path, &spec, &mut |_, _| {}).expect("synthesise the container");
    let model = Model::open(&path, &OpenOptions::default()).expect("open");
    let engine = Engine::new().expect("engine");
    let base = GenerateParams { max_tokens: 12, stop_at_eos: false, top_logprobs: 3, ..GenerateParams::default() };
    let cases = [
        ("greedy", GenerateParams { temperature: 0.0, top_p: 1.0, ..base.clone() }),
        ("top-p 0.95, no top-k", GenerateParams { temperature: 0.8, top_p: 0.95, ..base.clone() }),
        ("full distribution, temp 1.3", GenerateParams { temperature: 1.3, top_p: 1.0, ..base.clone() }),
        ("min-p 0.05", GenerateParams { temperature: 0.8, top_p: 1.0, min_p: 0.05, ..base.clone() }),
        ("tiny temperature", GenerateParams { temperature: 1e-6, top_p: 0.9, ..base.clone() }),
        (
            "top-k 40, top-p 0.9, penalties, bias",
            GenerateParams {
                temperature: 0.9,
                top_k: 40,
                top_p: 0.9,
                repetition_penalty: 1.2,
                presence_penalty: 0.5,
                frequency_penalty: 0.3,
                penalty_last_n: 16,
                logit_bias: vec![(7, 3.0), (11, -100.0)],
                ..base.clone()
            },
        ),
    ];
    let prompt = [1u32, 17, 4242, 99_999, 159_999];
    let mut sampled_tokens = 0;
    for (name, params) in cases {
        for seed in [0u64, 7, 123_456_789] {
            let params = GenerateParams { seed, ..params.clone() };
            let mut session = engine.session(model.clone()).expect("session");
            let component = session.generate(&prompt, &params, |_| true).expect("component generate");
            let mut host = NativeHost { model: model.clone(), state: model.new_state(), seen: Vec::new() };
            let ran = native::generate(
                &mut host,
                None,
                &[],
                VOCAB as u32,
                model.context() as u32,
                &prompt,
                &native_params(&params),
                None,
            )
            .expect("native generate");
            assert_eq!(ran.tokens, component.tokens, "{name}, seed {seed}: tokens");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&ran.logprobs), bits(&component.logprobs), "{name}, seed {seed}: logprobs");
            assert_eq!(ran.top_logprobs.len(), component.top_logprobs.len());
            for (a, b) in ran.top_logprobs.iter().zip(&component.top_logprobs) {
                let key = |t: &[(u32, f32)]| t.iter().map(|&(id, lp)| (id, lp.to_bits())).collect::<Vec<_>>();
                assert_eq!(key(a), key(b), "{name}, seed {seed}: top logprobs");
            }
            if params.temperature > 0.0 {
                sampled_tokens += ran.tokens.len();
            }
        }
    }
    assert!(sampled_tokens >= 150, "only {sampled_tokens} sampled tokens compared");
}
