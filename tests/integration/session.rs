//! Sessions through the Rust API and the bundled component: multi-turn state,
//! stop strings, sampling parameters, log-probabilities, save/load.

use std::sync::{Arc, Mutex, OnceLock};

use waste_host::{Engine, Error, GenerateParams, Model, OpenOptions, Session, StopReason, TokenEvent};

use crate::common::*;

/// f32 containers (exact arithmetic, so equal inputs give equal bits).
fn container(family: &str) -> std::path::PathBuf {
    static DIR: OnceLock<TempDir> = OnceLock::new();
    static LOCK: Mutex<()> = Mutex::new(());
    let dir = DIR.get_or_init(|| TempDir::new("session"));
    let _one_at_a_time = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let path = dir.path().join(format!("{family}-f32-f32.waste"));
    if !path.exists() {
        convert(family, "f32", "f32", dir.path());
    }
    path
}

fn engine() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| Engine::new().unwrap())
}

fn session(family: &str) -> Session {
    session_ctx(family, None)
}

fn session_ctx(family: &str, context: Option<usize>) -> Session {
    let options = OpenOptions { context, ..OpenOptions::default() };
    let model = Model::open(&container(family), &options).unwrap();
    engine().session(model).unwrap()
}

fn greedy(n: u32) -> GenerateParams {
    GenerateParams { temperature: 0.0, max_tokens: n, stop_at_eos: false, ..GenerateParams::default() }
}

fn sampled(n: u32, seed: u64) -> GenerateParams {
    GenerateParams {
        temperature: 0.9,
        top_k: 0,
        top_p: 0.95,
        min_p: 0.02,
        repetition_penalty: 1.3,
        presence_penalty: 0.4,
        frequency_penalty: 0.2,
        seed,
        max_tokens: n,
        stop_at_eos: false,
        ..GenerateParams::default()
    }
}

/// Runs a generation and returns it with the events it streamed.
fn generate(s: &mut Session, prompt: &[u32], p: &GenerateParams) -> (waste_host::Completion, Vec<TokenEvent>) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    let c = s.generate(prompt, p, move |e| {
        sink.lock().unwrap().push(e.clone());
        true
    });
    let c = c.unwrap();
    let events = events.lock().unwrap().clone();
    (c, events)
}

#[test]
fn turn_two_logits_equal_one_prefill_of_the_whole_conversation() {
    let mut a = session("qwen3_moe");
    let turn1 = a.tokenize("And God said").unwrap();
    let (c1, _) = generate(&mut a, &turn1, &greedy(5));
    assert_eq!(c1.tokens.len(), 5);
    // The last sampled token is held, not yet evaluated.
    assert_eq!(a.position(), turn1.len() + 4);
    let turn2 = a.tokenize(" Let there be light").unwrap();
    let (logits, _) = a.eval(&turn2, false).unwrap();

    let mut whole = turn1.clone();
    whole.extend(&c1.tokens);
    whole.extend(&turn2);
    assert_eq!(a.tokens(), whole);
    assert_eq!(a.position(), whole.len());
    let mut b = session("qwen3_moe");
    let (reference, _) = b.eval(&whole, false).unwrap();
    assert_eq!(logits, reference, "turn 2 differs from a single prefill of the concatenation");
}

#[test]
fn a_second_generate_continues_the_conversation() {
    // generate(turn1) + generate(turn2) == generate(turn1 ++ c1 ++ turn2)'s
    // continuation, greedy.
    let mut a = session("qwen3_moe");
    let turn1 = a.tokenize("In the beginning").unwrap();
    let turn2 = a.tokenize(" and the earth").unwrap();
    let (c1, _) = generate(&mut a, &turn1, &greedy(4));
    let (c2, _) = generate(&mut a, &turn2, &greedy(4));
    let mut b = session("qwen3_moe");
    let mut whole = turn1.clone();
    whole.extend(&c1.tokens);
    whole.extend(&turn2);
    let (c2_ref, _) = generate(&mut b, &whole, &greedy(4));
    assert_eq!(c2.tokens, c2_ref.tokens);
}

#[test]
fn reset_forgets_the_conversation() {
    let mut a = session("qwen3_moe");
    let prompt = a.tokenize("hello world").unwrap();
    let (first, _) = generate(&mut a, &prompt, &sampled(6, 9));
    a.reset();
    assert_eq!(a.position(), 0);
    assert!(a.tokens().is_empty());
    let (again, _) = generate(&mut a, &prompt, &sampled(6, 9));
    assert_eq!(first.tokens, again.tokens);
}

/// A first turn saved to `file`, then the second turn's prompt and what
/// the session that saved it generated for it.
fn saved_first_turn(file: &std::path::Path) -> (Session, Vec<u32>, waste_host::Completion) {
    let mut a = session("qwen3_moe");
    let turn1 = a.tokenize("And God said").unwrap();
    generate(&mut a, &turn1, &sampled(7, 1));
    a.save_state(file).unwrap();
    let turn2 = a.tokenize(" and it was so").unwrap();
    let (expected, _) = generate(&mut a, &turn2, &sampled(8, 2));
    (a, turn2, expected)
}

#[test]
fn reloaded_session_continues_with_exactly_the_same_tokens() {
    let tmp = TempDir::new("state");
    let file = tmp.path().join("s.state");
    let (a, turn2, expected) = saved_first_turn(&file);

    let mut b = session("qwen3_moe");
    b.load_state(&file).unwrap();
    let (got, _) = generate(&mut b, &turn2, &sampled(8, 2));
    assert_eq!(got.tokens, expected.tokens);
    assert_eq!(got.logprobs, expected.logprobs);
    assert_eq!(a.tokens(), b.tokens());
}

/// Version 2 of the state file changed its checksum from FNV-1a (a byte at
/// a time: over a second for a 16K-token state) to CRC-32; a version 1
/// file saved before must still load and continue the same.
#[test]
fn version_1_state_file_still_loads() {
    let tmp = TempDir::new("state-v1");
    let file = tmp.path().join("s.state");
    let (_, turn2, expected) = saved_first_turn(&file);

    let mut bytes = std::fs::read(&file).unwrap();
    assert_eq!(bytes[8..12], 2u32.to_le_bytes(), "states are written as version 2");
    bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
    let body = bytes.len() - 8;
    let mut sum = waste_host::Fnv::new();
    sum.update(&bytes[..body]);
    bytes[body..].copy_from_slice(&sum.finish().to_le_bytes());
    let old = tmp.path().join("v1.state");
    std::fs::write(&old, &bytes).unwrap();

    let mut b = session("qwen3_moe");
    b.load_state(&old).unwrap();
    let (got, _) = generate(&mut b, &turn2, &sampled(8, 2));
    assert_eq!(got.tokens, expected.tokens);
    assert_eq!(got.logprobs, expected.logprobs);
}

#[test]
fn state_from_another_model_or_shape_is_rejected() {
    let tmp = TempDir::new("state-bad");
    let file = tmp.path().join("s.state");
    let mut a = session("qwen3_moe");
    let prompt = a.tokenize("And God said").unwrap();
    generate(&mut a, &prompt, &greedy(6));
    a.save_state(&file).unwrap();

    let mut other = session("olmoe");
    let err = other.load_state(&file).unwrap_err().to_string();
    assert!(err.contains("another model"), "{err}");
    assert_eq!(other.position(), 0);

    let mut small = session_ctx("qwen3_moe", Some(4));
    let err = small.load_state(&file).unwrap_err().to_string();
    assert!(err.contains("context"), "{err}");

    let bytes = std::fs::read(&file).unwrap();
    let cut = tmp.path().join("cut.state");
    std::fs::write(&cut, &bytes[..bytes.len() - 100]).unwrap();
    let mut b = session("qwen3_moe");
    let err = b.load_state(&cut).unwrap_err().to_string();
    assert!(err.contains("truncated or damaged"), "{err}");
    let junk = tmp.path().join("junk.state");
    std::fs::write(&junk, b"not a state file at all, clearly").unwrap();
    let err = b.load_state(&junk).unwrap_err().to_string();
    assert!(err.contains("not a waste session file"), "{err}");
    assert_eq!(b.position(), 0, "a failed load must leave the session alone");
}

#[test]
fn stop_string_split_across_tokens_fires_and_is_not_emitted() {
    let mut a = session("qwen3_moe");
    let prompt = a.tokenize("And God said").unwrap();
    let (free, events) = generate(&mut a, &prompt, &greedy(24));
    // A stop string made of the last character of one token's text and the
    // first of the next one's, whose first occurrence is at that boundary.
    let mut offset = 0;
    let mut found = None;
    for w in events.windows(2) {
        offset += w[0].text.len();
        let (Some(x), Some(y)) = (w[0].text.chars().last(), w[1].text.chars().next()) else {
            continue;
        };
        let stop = format!("{x}{y}");
        if free.text.find(&stop) == Some(offset - x.len_utf8()) {
            found = Some((stop, offset - x.len_utf8()));
            break;
        }
    }
    let (stop, at) = found.expect("a token boundary to split a stop string across");
    a.reset();
    let p = GenerateParams { stop_strings: vec![stop.clone()], ..greedy(24) };
    let (stopped, events) = generate(&mut a, &prompt, &p);
    assert_eq!(stopped.stop_reason, StopReason::StopString);
    assert_eq!(stopped.text, free.text[..at], "stop {stop:?}");
    let streamed: String = events.iter().map(|e| e.text.as_str()).collect();
    assert_eq!(streamed, stopped.text);
}

#[test]
fn stop_tokens_and_cancellation_end_the_generation() {
    let mut a = session("qwen3_moe");
    let prompt = a.tokenize("And God said").unwrap();
    let (free, _) = generate(&mut a, &prompt, &greedy(6));
    a.reset();
    let p = GenerateParams { stop_tokens: vec![free.tokens[2]], ..greedy(6) };
    let (c, _) = generate(&mut a, &prompt, &p);
    let first = free.tokens.iter().position(|&t| t == free.tokens[2]).unwrap();
    assert_eq!(c.tokens, free.tokens[..=first]);
    assert_eq!(c.stop_reason, StopReason::StopToken);

    a.reset();
    let mut seen = 0;
    let c = a
        .generate(&prompt, &greedy(6), move |_| {
            seen += 1;
            seen < 2
        })
        .unwrap();
    assert_eq!(c.stop_reason, StopReason::Cancelled);
    assert_eq!(c.tokens, free.tokens[..2]);
    // The cancelled turn's last token is held like any other.
    assert_eq!(a.tokens().len(), prompt.len() + 2);
}

#[test]
fn logprobs_match_the_raw_distribution() {
    let mut a = session("qwen3_moe");
    let prompt = a.tokenize("And God said").unwrap();
    let p = GenerateParams { top_logprobs: 5, ..sampled(3, 4) };
    let (c, events) = generate(&mut a, &prompt, &p);
    let mut b = session("qwen3_moe");
    let (logits, _) = b.eval(&prompt, false).unwrap();
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max + logits.iter().map(|&l| (l as f64 - max).exp()).sum::<f64>().ln();
    let lp = |t: u32| (logits[t as usize] as f64 - lse) as f32;
    assert_eq!(c.logprobs[0], lp(c.tokens[0]));
    assert_eq!(events[0].logprob, c.logprobs[0]);
    let top = &c.top_logprobs[0];
    assert_eq!(top.len(), 5);
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    order.sort_by(|&x, &y| logits[y as usize].total_cmp(&logits[x as usize]).then(x.cmp(&y)));
    for (i, &(id, l)) in top.iter().enumerate() {
        assert_eq!(id, order[i]);
        assert_eq!(l, lp(id));
    }
    assert_eq!(&events[2].top_logprobs, &c.top_logprobs[2]);
}

#[test]
fn same_seed_same_tokens_and_logit_bias_steers() {
    let mut a = session("qwen3_moe");
    let prompt = a.tokenize("And God said").unwrap();
    let (x, _) = generate(&mut a, &prompt, &sampled(10, 77));
    a.reset();
    let (y, _) = generate(&mut a, &prompt, &sampled(10, 77));
    a.reset();
    let (z, _) = generate(&mut a, &prompt, &sampled(10, 78));
    assert_eq!(x.tokens, y.tokens);
    assert_ne!(x.tokens, z.tokens);
    a.reset();
    let p = GenerateParams { logit_bias: vec![(42, 100.0)], ..greedy(4) };
    let (forced, _) = generate(&mut a, &prompt, &p);
    assert_eq!(forced.tokens, vec![42; 4]);
}

#[test]
fn out_of_range_sampling_parameters_are_argument_errors() {
    let mut a = session("qwen3_moe");
    let prompt = a.tokenize("And God said").unwrap();
    let vocab = a.model().info().vocab_size as u32;
    let bad = [
        GenerateParams { temperature: -1.0, ..greedy(2) },
        GenerateParams { top_p: 0.0, ..greedy(2) },
        GenerateParams { min_p: 2.0, ..greedy(2) },
        GenerateParams { repetition_penalty: 0.0, ..greedy(2) },
        GenerateParams { presence_penalty: 3.0, ..greedy(2) },
        GenerateParams { frequency_penalty: f32::NAN, ..greedy(2) },
        GenerateParams { logit_bias: vec![(vocab, 1.0)], ..greedy(2) },
        GenerateParams { top_logprobs: 21, ..greedy(2) },
        GenerateParams { stop_strings: vec![String::new()], ..greedy(2) },
        GenerateParams { stop_tokens: vec![vocab], ..greedy(2) },
        GenerateParams { max_tokens: 0, ..greedy(2) },
    ];
    for p in bad {
        match a.generate(&prompt, &p, |_| true) {
            Err(Error::Arg(_)) => {}
            other => panic!("{p:?} gave {other:?}"),
        }
    }
    assert_eq!(a.position(), 0, "a rejected request must not touch the state");
}
