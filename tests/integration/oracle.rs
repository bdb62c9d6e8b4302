//! The engine against transformers: every fixture converted to a container,
//! run through the public API (and the bundled component for tokenizing and
//! greedy generation), compared with the reference logits and tokens.

use waste_host::{Engine, GenerateParams, Model, OpenOptions};

use crate::common::*;

/// What an f32 container must meet at every position.
const F32_TOLERANCE: f32 = 1e-4;

struct Comparison {
    /// max over positions of max|diff| / max|reference logit| at that position
    max_rel_error: f32,
    top1_agreement: f32,
}

fn compare(engine_logits: &[f32], reference: &Reference) -> Comparison {
    let v = reference.vocab;
    let positions = reference.logits.len() / v;
    assert_eq!(engine_logits.len(), reference.logits.len());
    let mut max_rel_error = 0.0f32;
    let mut agree = 0;
    for p in 0..positions {
        let ours = &engine_logits[p * v..(p + 1) * v];
        let theirs = &reference.logits[p * v..(p + 1) * v];
        let scale = theirs.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let diff = ours.iter().zip(theirs).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        max_rel_error = max_rel_error.max(diff / scale);
        if argmax(ours) == argmax(theirs) {
            agree += 1;
        }
    }
    Comparison { max_rel_error, top1_agreement: agree as f32 / positions as f32 }
}

pub(crate) fn greedy() -> GenerateParams {
    GenerateParams {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        seed: 0,
        max_tokens: 16,
        stop_at_eos: false,
        ..GenerateParams::default()
    }
}

/// Converts a fixture with an f32 trunk and f32 experts and holds it to the
/// reference: logits at every position within F32_TOLERANCE x max |logit|,
/// the same top-1 everywhere, the tokenizer's ids and the greedy tokens.
pub(crate) fn check_f32(family: &str) {
    let tmp = TempDir::new(&format!("oracle-{family}"));
    let container = convert(family, "f32", "f32", tmp.path());
    let reference = reference(family);
    let model = Model::open(&container, &exact()).unwrap();
    let engine = Engine::new().unwrap();
    let mut session = engine.session(model).unwrap();

    // The bundled component's tokenizer reproduces the reference prompt ids.
    assert_eq!(session.tokenize(&reference.prompt_text).unwrap(), reference.prompt_ids, "{family}: tokenizer");

    let (logits, _) = session.eval(&reference.prompt_ids, true).unwrap();
    let c = compare(&logits, &reference);
    eprintln!("{family} f32: max |logit diff| / max |logit| = {:e}", c.max_rel_error);
    assert!(
        c.max_rel_error <= F32_TOLERANCE,
        "{family}: max |logit diff| / max |logit| = {:e} > {F32_TOLERANCE:e}",
        c.max_rel_error
    );
    assert_eq!(c.top1_agreement, 1.0, "{family}: top-1 disagrees somewhere");

    // Greedy continuation through the component's token loop.
    session.reset();
    let out = session.generate(&reference.prompt_ids, &greedy(), |_| true).unwrap();
    assert_eq!(out.tokens, reference.greedy_ids, "{family}: greedy continuation");
}

#[test]
fn oracle_qwen3_moe_f32_matches_transformers() {
    check_f32("qwen3_moe");
}

#[test]
fn oracle_olmoe_f32_matches_transformers() {
    check_f32("olmoe");
}

#[test]
fn oracle_mixtral_f32_matches_transformers() {
    check_f32("mixtral");
}

/// Quantised formats cannot match to float noise; they are held to error
/// bounds instead. The bounds are the figures measured on these fixtures
/// (docs/PERFORMANCE.md, "Quantised vs f32") plus a margin. They are loose
/// because the fixtures are a worst case for quantisation: random weights
/// have no structure for a codebook to learn, and the prompts were chosen so
/// the routers sit within ~1e-4 of a tie (to make the f32 check strict), so
/// any weight error flips some expert choices, and a flipped expert moves the
/// logits far more than the weight error itself. The bounds still catch a
/// broken format: a wrong layout or kernel gives errors of order 1 and top-1
/// agreement near 1/vocab.
#[test]
fn quantised_formats_stay_within_stated_error() {
    // (experts, trunk, max relative logit error, min top-1 agreement)
    let cases =
        [("q8", "q8", 0.25f32, 0.9f32), ("q4", "q4", 0.6, 0.5), ("rvq3", "q4", 0.6, 0.4), ("rvq2", "q4", 0.65, 0.25)];
    let tmp = TempDir::new("quantised");
    let mut table = String::new();
    let mut failures = Vec::new();
    for family in SAMPLED_FAMILIES {
        let reference = reference(family);
        for (experts, trunk, max_err, min_agree) in cases {
            let container = convert(family, experts, trunk, tmp.path());
            let model = Model::open(&container, &OpenOptions::default()).unwrap();
            let engine = Engine::new().unwrap();
            let mut session = engine.session(model).unwrap();
            let (logits, _) = session.eval(&reference.prompt_ids, true).unwrap();
            let c = compare(&logits, &reference);
            table.push_str(&format!(
                "{family:<10} experts {experts:<4} trunk {trunk:<3}  max rel err {:.4}  top-1 {:.3}\n",
                c.max_rel_error, c.top1_agreement
            ));
            if c.max_rel_error > max_err || c.top1_agreement < min_agree {
                failures.push(format!(
                    "{family} {experts}/{trunk}: max rel error {} (bound {max_err}), top-1 {} (bound {min_agree})",
                    c.max_rel_error, c.top1_agreement
                ));
            }
        }
    }
    eprintln!("{table}");
    assert!(failures.is_empty(), "{failures:#?}");
}
