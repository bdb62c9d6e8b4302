use super::*;

/// A model whose next token is always (last token + 1) mod vocab. Like the
/// real host, it holds the last sampled token until the next evaluate.
struct Counting {
    vocab: usize,
    /// Every token evaluated, in order (the host's sequence).
    evaluated: Vec<u32>,
    pending: Option<u32>,
    cancel_after: Option<usize>,
    emitted: Vec<TokenEvent>,
    plugin_calls: usize,
    plugin_recent: Vec<Vec<u32>>,
}

impl Counting {
    fn new(vocab: usize) -> Self {
        Counting {
            vocab,
            evaluated: vec![],
            pending: None,
            cancel_after: None,
            emitted: vec![],
            plugin_calls: 0,
            plugin_recent: vec![],
        }
    }

    /// What the real host does after `generate` returns.
    fn end_turn(&mut self, out: &Completion) {
        self.pending = out.tokens.last().copied();
    }
}

impl ModelHost for Counting {
    fn evaluate(&mut self, tokens: &[u32]) -> Result<Evaluation, String> {
        self.evaluated.extend(self.pending.take());
        self.evaluated.extend_from_slice(tokens);
        let last = *self.evaluated.last().ok_or("nothing to evaluate")?;
        let mut logits = vec![0.0; self.vocab];
        logits[(last as usize + 1) % self.vocab] = 10.0;
        Ok(Evaluation { logits, position: self.evaluated.len() as u32, stats: StepStats::default() })
    }
    fn emit(&mut self, event: TokenEvent) -> bool {
        self.emitted.push(event);
        self.cancel_after.is_none_or(|n| self.emitted.len() < n)
    }
    fn recent_tokens(&mut self, n: u32) -> Vec<u32> {
        let all: Vec<u32> = self.evaluated.iter().copied().chain(self.pending).collect();
        all[all.len().saturating_sub(n as usize)..].to_vec()
    }
    fn plugin_sample(&mut self, logits: &[f32], recent: &[u32]) -> Result<u32, String> {
        self.plugin_calls += 1;
        self.plugin_recent.push(recent.to_vec());
        // A "plugin" that always picks the least likely token.
        Ok(logits.iter().enumerate().min_by(|a, b| a.1.total_cmp(b.1)).unwrap().0 as u32)
    }
}

fn greedy(max_tokens: u32) -> GenerateParams {
    GenerateParams {
        sampling: SamplingParams::greedy(),
        max_tokens,
        stop_at_eos: true,
        stop_strings: vec![],
        stop_tokens: vec![],
        use_plugin: false,
    }
}

fn run(host: &mut Counting, eos: &[u32], ctx: u32, prompt: &[u32], p: &GenerateParams) -> Result<Completion, String> {
    let vocab = host.vocab as u32;
    generate(host, None, eos, vocab, ctx, prompt, p, None)
}

#[test]
fn stops_at_max_tokens_without_evaluating_the_last_token() {
    let mut host = Counting::new(100);
    let out = run(&mut host, &[], 1000, &[5, 6], &greedy(3)).unwrap();
    assert_eq!(out.tokens, vec![7, 8, 9]);
    assert_eq!(out.stop_reason, StopReason::Length);
    assert_eq!(host.evaluated, vec![5, 6, 7, 8]);
    assert_eq!(host.emitted.len(), 3);
    assert_eq!(out.logprobs.len(), 3);
}

#[test]
fn a_second_turn_continues_after_the_held_token() {
    let mut host = Counting::new(100);
    let first = run(&mut host, &[], 1000, &[5], &greedy(2)).unwrap();
    host.end_turn(&first);
    let second = run(&mut host, &[], 1000, &[50], &greedy(2)).unwrap();
    assert_eq!(second.tokens, vec![51, 52]);
    assert_eq!(host.evaluated, vec![5, 6, 7, 50, 51]);
    // An empty prompt continues straight from the held token.
    host.end_turn(&second);
    let third = run(&mut host, &[], 1000, &[], &greedy(1)).unwrap();
    assert_eq!(third.tokens, vec![53]);
}

#[test]
fn stops_at_eos_and_reports_it() {
    let mut host = Counting::new(100);
    let out = run(&mut host, &[9], 1000, &[5], &greedy(50)).unwrap();
    assert_eq!(out.tokens, vec![6, 7, 8, 9]);
    assert_eq!(out.stop_reason, StopReason::Eos);
}

#[test]
fn stop_tokens_end_the_generation() {
    let mut host = Counting::new(100);
    let mut p = greedy(50);
    p.stop_tokens = vec![8];
    let out = run(&mut host, &[], 1000, &[5], &p).unwrap();
    assert_eq!(out.tokens, vec![6, 7, 8]);
    assert_eq!(out.stop_reason, StopReason::StopToken);
    p.stop_tokens = vec![100];
    assert!(run(&mut host, &[], 1000, &[5], &p).is_err());
}

#[test]
fn cancellation_from_the_event_stops_the_loop() {
    let mut host = Counting::new(100);
    host.cancel_after = Some(2);
    let out = run(&mut host, &[], 1000, &[1], &greedy(50)).unwrap();
    assert_eq!(out.tokens, vec![2, 3]);
    assert_eq!(out.stop_reason, StopReason::Cancelled);
}

#[test]
fn context_full_ends_the_generation() {
    let mut host = Counting::new(100);
    let out = run(&mut host, &[], 4, &[1, 2], &greedy(50)).unwrap();
    assert_eq!(out.stop_reason, StopReason::ContextFull);
    assert_eq!(host.evaluated.len(), 4);
}

#[test]
fn the_penalty_window_holds_history_prompt_and_held_token() {
    let mut host = Counting::new(10);
    let first = run(&mut host, &[], 100, &[1, 2], &greedy(2)).unwrap();
    host.end_turn(&first);
    let mut p = greedy(2);
    p.use_plugin = true;
    p.sampling.penalty_last_n = 64;
    run(&mut host, &[], 100, &[7], &p).unwrap();
    assert_eq!(host.plugin_recent[0], vec![1, 2, 3, 4, 7]);
    // the sampled token joins the window
    assert_eq!(host.plugin_recent[1], vec![1, 2, 3, 4, 7, 0]);
    let mut host = Counting::new(10);
    p.sampling.penalty_last_n = 3;
    run(&mut host, &[], 100, &[1, 2, 3, 4, 5], &p).unwrap();
    assert_eq!(host.plugin_recent[0], vec![3, 4, 5]);
}

#[test]
fn the_plugin_replaces_the_draw() {
    let mut host = Counting::new(10);
    let mut p = greedy(3);
    p.use_plugin = true;
    let out = run(&mut host, &[], 100, &[5], &p).unwrap();
    assert_eq!(host.plugin_calls, 3);
    // the least likely token (lowest id among the zeros) is 0, or 1 after 0
    assert_eq!(out.tokens, vec![0, 0, 0]);
}

#[test]
fn top_logprobs_reach_the_event_and_the_completion() {
    let mut host = Counting::new(10);
    let mut p = greedy(2);
    p.sampling.top_logprobs = 3;
    let out = run(&mut host, &[], 100, &[5], &p).unwrap();
    assert_eq!(out.top_logprobs.len(), 2);
    assert_eq!(out.top_logprobs[0].len(), 3);
    assert_eq!(out.top_logprobs[0][0].0, 6);
    assert_eq!(out.top_logprobs[0][0].1, out.logprobs[0]);
    assert_eq!(host.emitted[1].top_logprobs, out.top_logprobs[1]);
}

#[test]
fn bad_requests_are_errors() {
    let mut host = Counting::new(10);
    assert!(run(&mut host, &[], 100, &[], &greedy(5)).is_err());
    assert!(run(&mut host, &[], 100, &[1], &greedy(0)).is_err());
    let mut hot = greedy(5);
    hot.sampling.temperature = -1.0;
    assert!(run(&mut host, &[], 100, &[1], &hot).is_err());
    let mut stop = greedy(5);
    stop.stop_strings = vec![String::new()];
    assert!(run(&mut host, &[], 100, &[1], &stop).is_err());
}

/// An embedding 16 rows wider than its tokenizer (llama.cpp's `[PAD{id}]`
/// rows, Qwen's 151,936 rows for 151,669 tokens) whose padding rows have
/// the largest logits: a quarter of the mass at temperature 2.
struct PaddedEmbedding {
    vocab: usize,
    evaluated: usize,
}

impl ModelHost for PaddedEmbedding {
    fn evaluate(&mut self, tokens: &[u32]) -> Result<Evaluation, String> {
        self.evaluated += tokens.len();
        let mut logits = vec![0.0; self.vocab];
        logits[self.vocab - 16..].fill(5.0);
        Ok(Evaluation { logits, position: self.evaluated as u32, stats: StepStats::default() })
    }
    fn emit(&mut self, _: TokenEvent) -> bool {
        true
    }
    fn recent_tokens(&mut self, _: u32) -> Vec<u32> {
        Vec::new()
    }
    fn plugin_sample(&mut self, logits: &[f32], _: &[u32]) -> Result<u32, String> {
        // A plugin that ignores the mask and takes the first padding row.
        Ok(logits.len() as u32 - 16)
    }
}

fn qwen_tokenizer() -> Tokenizer {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/tiny-qwen3_moe/tokenizer.json");
    Tokenizer::from_json(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// `waste run` on a converted llama.cpp GGUF at temperature 2 ended with
/// "unknown token id": a padding row was sampled and could not be decoded.
#[test]
fn sampling_at_temperature_2_never_picks_a_padding_row() {
    let tok = qwen_tokenizer();
    let vocab = tok.vocab_size() as u32 + 16;
    let mut host = PaddedEmbedding { vocab: vocab as usize, evaluated: 0 };
    let params = GenerateParams {
        sampling: SamplingParams { temperature: 2.0, top_k: 0, top_p: 1.0, seed: 7, ..SamplingParams::greedy() },
        max_tokens: 400,
        stop_at_eos: false,
        ..greedy(1)
    };
    let out = generate(&mut host, Some(&tok), &[], vocab, 4096, &[1, 2, 3], &params, None).unwrap();
    assert_eq!(out.tokens.len(), 400);
    assert!(out.tokens.iter().all(|&t| tok.knows(t)), "a padding row was sampled: {:?}", out.tokens);
    // Without a tokenizer there is no padding to know of: the same logits
    // then do give padding rows, so the mask above is what kept them out.
    let bare = generate(&mut host, None, &[], vocab, 4096, &[1, 2, 3], &params, None).unwrap();
    assert!(bare.tokens.iter().any(|&t| t >= vocab - 16));
    // A plugin's choice gets the same check as any other.
    let plugin = GenerateParams { use_plugin: true, ..params };
    let err = generate(&mut host, Some(&tok), &[], vocab, 4096, &[1], &plugin, None).unwrap_err();
    assert!(err.contains("padding row"), "{err}");
}

/// HF tokenizers' `decode` drops ids it has no token for
/// (`Tokenizer.from_file(tiny-qwen3_moe).decode([300, 100000, 301])` is
/// "ccmp", as `decode([300, 301])` is), so a padding row decodes to nothing.
#[test]
fn an_id_the_tokenizer_lacks_decodes_to_nothing_as_hf_tokenizers_does() {
    let tok = qwen_tokenizer();
    assert_eq!(tok.decode(&[300, 100_000, 301]).unwrap(), "ccmp");
    assert_eq!(tok.decode(&[300, 301]).unwrap(), "ccmp");
    assert_eq!(tok.decode_bytes(&[512]).unwrap(), b"");
    assert!(tok.knows(511) && !tok.knows(512));
}
