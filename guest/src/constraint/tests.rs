use super::*;
use crate::generate::{generate, Completion, Evaluation, GenerateParams, ModelHost, StepStats, StopReason, TokenEvent};
use crate::sampling::SamplingParams;

/// A model that knows nothing: seeded random logits every step, so the mask
/// alone decides what the text looks like.
struct Noise {
    vocab: usize,
    state: u64,
    position: u32,
}

impl ModelHost for Noise {
    fn evaluate(&mut self, tokens: &[u32]) -> Result<Evaluation, String> {
        self.position += tokens.len() as u32 + 1;
        let logits = (0..self.vocab)
            .map(|_| {
                self.state ^= self.state << 13;
                self.state ^= self.state >> 7;
                self.state ^= self.state << 17;
                (self.state >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0
            })
            .collect();
        Ok(Evaluation { logits, position: self.position, stats: StepStats::default() })
    }
    fn emit(&mut self, _: TokenEvent) -> bool {
        true
    }
    fn recent_tokens(&mut self, _: u32) -> Vec<u32> {
        Vec::new()
    }
    fn plugin_sample(&mut self, _: &[f32], _: &[u32]) -> Result<u32, String> {
        Err("no plugin".into())
    }
}

fn tokenizer() -> Tokenizer {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/tiny-qwen3_moe/tokenizer.json");
    Tokenizer::from_json(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn run(tok: &Tokenizer, vocab: &Vocabulary, constraint: &Constraint, seed: u64, max_tokens: u32) -> Completion {
    let mut guide = vocab.compile(constraint).unwrap();
    let params = GenerateParams {
        sampling: SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, seed, ..SamplingParams::greedy() },
        max_tokens,
        stop_at_eos: true,
        stop_strings: vec![],
        stop_tokens: vec![],
        use_plugin: false,
    };
    let mut host = Noise { vocab: tok.vocab_size(), state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1, position: 0 };
    let n = tok.vocab_size() as u32;
    generate(&mut host, Some(tok), &[eos(tok)], n, 100_000, &[1, 2], &params, Some(&mut guide)).unwrap()
}

/// The fixture's end of turn, its EOS.
fn eos(tok: &Tokenizer) -> u32 {
    tok.token_id("<|im_end|>").expect("the fixture has <|im_end|>")
}

fn ended(c: &Completion) -> bool {
    matches!(c.stop_reason, StopReason::Eos | StopReason::Grammar)
}

#[test]
fn random_logits_under_a_json_schema_always_give_valid_json() {
    let tok = tokenizer();
    let vocab = Vocabulary::new(&tok, tok.vocab_size() as u32, &[eos(&tok)]).unwrap();
    let schema = r#"{"type": "object", "properties": {
        "n": {"type": "integer", "minimum": -5, "maximum": 99},
        "ok": {"type": "boolean"},
        "tag": {"enum": ["red", "green", "blue"]}},
        "required": ["n", "ok", "tag"], "additionalProperties": false}"#;
    for seed in 0..40 {
        let out = run(&tok, &vocab, &Constraint::JsonSchema(schema.into()), seed, 200);
        assert!(ended(&out), "seed {seed}: {:?} {:?}", out.stop_reason, out.text);
        let v: Value = serde_json::from_str(&out.text).unwrap_or_else(|e| panic!("seed {seed}: {e}: {:?}", out.text));
        // `-0` is an integer too (serde_json reads it as a float).
        let n = v["n"].as_f64().unwrap_or_else(|| panic!("seed {seed}: n in {:?}", out.text));
        assert!(n.fract() == 0.0 && (-5.0..=99.0).contains(&n), "{}", out.text);
        assert!(v["ok"].is_boolean());
        assert!(["red", "green", "blue"].contains(&v["tag"].as_str().unwrap()));
        assert_eq!(v.as_object().unwrap().len(), 3);
    }
}

#[test]
fn regex_lark_and_gbnf_outputs_match_their_grammars() {
    let tok = tokenizer();
    let vocab = Vocabulary::new(&tok, tok.vocab_size() as u32, &[eos(&tok)]).unwrap();
    let date = |t: &str| {
        let b = t.as_bytes();
        b.len() == 10 && b[4] == b'-' && b[7] == b'-' && t.chars().filter(char::is_ascii_digit).count() == 8
    };
    for seed in 0..10 {
        let out = run(&tok, &vocab, &Constraint::Regex(r"[0-9]{4}-[0-9]{2}-[0-9]{2}".into()), seed, 40);
        assert!(ended(&out) && date(&out.text), "regex, seed {seed}: {:?}", out.text);
        let lark = Constraint::Lark("start: \"(\" NUM (\"+\" NUM){0,3} \")\"\nNUM: /[1-9][0-9]{0,2}/".into());
        let out = run(&tok, &vocab, &lark, seed, 60);
        let inner = out.text.strip_prefix('(').and_then(|t| t.strip_suffix(')'));
        let ok = inner.is_some_and(|i| i.split('+').all(|n| !n.is_empty() && n.len() <= 3 && !n.starts_with('0')));
        assert!(ended(&out) && ok, "lark, seed {seed}: {:?}", out.text);
        let gbnf = Constraint::Gbnf("root ::= word (\",\" word){0,2}\nword ::= [a-c]{1,4}\n".into());
        let out = run(&tok, &vocab, &gbnf, seed, 60);
        let words: Vec<&str> = out.text.split(',').collect();
        let ok = words.len() <= 3
            && words.iter().all(|w| (1..=4).contains(&w.len()) && w.chars().all(|c| "abc".contains(c)));
        assert!(ended(&out) && ok, "gbnf, seed {seed}: {:?}", out.text);
    }
}

#[test]
fn malformed_and_unsatisfiable_grammars_are_refused() {
    let tok = tokenizer();
    let vocab = Vocabulary::new(&tok, tok.vocab_size() as u32, &[eos(&tok)]).unwrap();
    for bad in [
        Constraint::JsonSchema("{not json".into()),
        Constraint::JsonSchema("[1, 2]".into()),
        Constraint::JsonSchema(r#"{"type": "integer", "minimum": 5, "maximum": 1}"#.into()),
        Constraint::JsonSchema(r#"{"allOf": [{"type": "string"}, {"type": "integer"}]}"#.into()),
        Constraint::Lark("start: undefined_rule".into()),
        Constraint::Gbnf("root ::= \"a".into()),
        Constraint::Regex("(unclosed".into()),
        Constraint::Lark("x".repeat(MAX_GRAMMAR_BYTES + 1)),
    ] {
        assert!(vocab.compile(&bad).is_err(), "{bad:?} compiled");
    }
}

#[test]
fn special_tokens_never_match_grammar_text() {
    // `<|im_end|>` spelled by a grammar is text, and the special token of
    // the same spelling is not that text.
    let tok = tokenizer();
    let im_end = eos(&tok);
    let vocab = Vocabulary::new(&tok, tok.vocab_size() as u32, &[]).unwrap();
    let mut guide = vocab.compile(&Constraint::Lark("start: \"<|im_end|>\"".into())).unwrap();
    let mut logits = vec![0.0; tok.vocab_size()];
    assert!(guide.mask(&mut logits, true).unwrap());
    assert_eq!(logits[im_end as usize], f32::NEG_INFINITY);
}
