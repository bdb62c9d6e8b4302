//! The token loop: evaluate the prompt, then sample, stream and evaluate one
//! token at a time until a stop condition. Written against `ModelHost` so the
//! same code runs natively in tests and inside the component.

use crate::sampling::{logprob, sample, Rng, SamplingParams};
use crate::stream::Utf8Stream;
use crate::tokenizer::Tokenizer;

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepStats {
    pub experts_hit: u32,
    pub experts_missed: u32,
    pub bytes_read: u64,
    pub ms_total: f32,
    pub ms_io: f32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    pub logits: Vec<f32>,
    pub position: u32,
    pub stats: StepStats,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    pub token: u32,
    pub text: String,
    pub logprob: f32,
    pub stats: StepStats,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Length,
    Eos,
    Cancelled,
    ContextFull,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub tokens: Vec<u32>,
    pub text: String,
    pub stop_reason: StopReason,
}

#[derive(Debug, Clone, PartialEq)]
pub struct GenerateParams {
    pub sampling: SamplingParams,
    pub max_tokens: u32,
    pub stop_at_eos: bool,
}

/// What the loop needs from the engine (the WIT imports, or a test double).
pub trait ModelHost {
    fn evaluate(&mut self, tokens: &[u32]) -> Result<Evaluation, String>;
    /// Returns false to cancel.
    fn emit(&mut self, event: TokenEvent) -> bool;
}

/// Runs one generation. `tokenizer` turns tokens into streamed text; without
/// one, events carry empty text. Special tokens (such as the end-of-turn
/// marker) are not rendered into the text.
pub fn generate(
    host: &mut dyn ModelHost,
    tokenizer: Option<&Tokenizer>,
    eos_tokens: &[u32],
    context_length: u32,
    prompt: &[u32],
    params: &GenerateParams,
) -> Result<Completion, String> {
    params.sampling.validate()?;
    if params.max_tokens == 0 {
        return Err("max-tokens must be at least 1".into());
    }
    if prompt.is_empty() {
        return Err("the prompt is empty: nothing to continue from".into());
    }
    let mut rng = Rng::new(params.sampling.seed);
    let mut stream = Utf8Stream::default();
    let mut completion = Completion { tokens: Vec::new(), text: String::new(), stop_reason: StopReason::Length };
    let mut evaluation = host.evaluate(prompt)?;
    loop {
        let logits = &evaluation.logits;
        if logits.is_empty() {
            return Err("the host returned no logits".into());
        }
        let token = sample(logits, &params.sampling, &mut rng);
        let event_logprob = logprob(logits, token);
        let token = token as u32;
        let is_eos = params.stop_at_eos && eos_tokens.contains(&token);
        let mut text = String::new();
        if let Some(tok) = tokenizer {
            if !tok.is_special(token) {
                let bytes = tok.decode_bytes(&[token]).map_err(|e| e.to_string())?;
                text = stream.push(&bytes);
            }
        }
        completion.tokens.push(token);
        completion.text.push_str(&text);
        let event = TokenEvent { token, text, logprob: event_logprob, stats: evaluation.stats };
        if !host.emit(event) {
            completion.stop_reason = StopReason::Cancelled;
            break;
        }
        if is_eos {
            completion.stop_reason = StopReason::Eos;
            break;
        }
        if completion.tokens.len() >= params.max_tokens as usize {
            completion.stop_reason = StopReason::Length;
            break;
        }
        if evaluation.position >= context_length {
            completion.stop_reason = StopReason::ContextFull;
            break;
        }
        evaluation = host.evaluate(&[token])?;
    }
    let tail = stream.finish();
    completion.text.push_str(&tail);
    Ok(completion)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model whose next token is always (last token + 1) mod vocab.
    struct Counting {
        vocab: usize,
        position: u32,
        evaluated: Vec<u32>,
        cancel_after: Option<usize>,
        emitted: Vec<TokenEvent>,
    }

    impl Counting {
        fn new(vocab: usize) -> Self {
            Counting { vocab, position: 0, evaluated: vec![], cancel_after: None, emitted: vec![] }
        }
    }

    impl ModelHost for Counting {
        fn evaluate(&mut self, tokens: &[u32]) -> Result<Evaluation, String> {
            self.evaluated.extend_from_slice(tokens);
            self.position += tokens.len() as u32;
            let mut logits = vec![0.0; self.vocab];
            logits[(*tokens.last().unwrap() as usize + 1) % self.vocab] = 10.0;
            Ok(Evaluation { logits, position: self.position, stats: StepStats::default() })
        }
        fn emit(&mut self, event: TokenEvent) -> bool {
            self.emitted.push(event);
            self.cancel_after.map_or(true, |n| self.emitted.len() < n)
        }
    }

    fn greedy(max_tokens: u32) -> GenerateParams {
        GenerateParams {
            sampling: SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 },
            max_tokens,
            stop_at_eos: true,
        }
    }

    #[test]
    fn stops_at_max_tokens_without_evaluating_the_last_token() {
        let mut host = Counting::new(100);
        let out = generate(&mut host, None, &[], 1000, &[5, 6], &greedy(3)).unwrap();
        assert_eq!(out.tokens, vec![7, 8, 9]);
        assert_eq!(out.stop_reason, StopReason::Length);
        assert_eq!(host.evaluated, vec![5, 6, 7, 8]);
        assert_eq!(host.emitted.len(), 3);
    }

    #[test]
    fn stops_at_eos_and_reports_it() {
        let mut host = Counting::new(100);
        let out = generate(&mut host, None, &[9], 1000, &[5], &greedy(50)).unwrap();
        assert_eq!(out.tokens, vec![6, 7, 8, 9]);
        assert_eq!(out.stop_reason, StopReason::Eos);
    }

    #[test]
    fn cancellation_from_the_event_stops_the_loop() {
        let mut host = Counting::new(100);
        host.cancel_after = Some(2);
        let out = generate(&mut host, None, &[], 1000, &[1], &greedy(50)).unwrap();
        assert_eq!(out.tokens, vec![2, 3]);
        assert_eq!(out.stop_reason, StopReason::Cancelled);
    }

    #[test]
    fn context_full_ends_the_generation() {
        let mut host = Counting::new(100);
        let out = generate(&mut host, None, &[], 4, &[1, 2], &greedy(50)).unwrap();
        assert_eq!(out.stop_reason, StopReason::ContextFull);
        assert_eq!(host.position, 4);
    }

    #[test]
    fn bad_requests_are_errors() {
        let mut host = Counting::new(10);
        assert!(generate(&mut host, None, &[], 100, &[], &greedy(5)).is_err());
        assert!(generate(&mut host, None, &[], 100, &[1], &greedy(0)).is_err());
        let mut hot = greedy(5);
        hot.sampling.temperature = -1.0;
        assert!(generate(&mut host, None, &[], 100, &[1], &hot).is_err());
    }
}
