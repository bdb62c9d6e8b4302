//! The token loop: evaluate the prompt, then sample, stream and evaluate one
//! token at a time until a stop condition. Written against `ModelHost` so the
//! same code runs natively in tests and inside the component.
//!
//! The last sampled token of a generation is not evaluated here: the host
//! keeps it and evaluates it in front of whatever comes next (the next
//! turn's prompt), so a conversation never pays for a forward pass whose
//! logits nobody reads, and the state stays one continuous sequence.

use crate::constraint::Guide;
use crate::sampling::{adjust, log_sum_exp, sample, top_logprobs, Rng, SamplingParams};
use crate::stop::StopGate;
use crate::stream::Utf8Stream;
use crate::tokenizer::Tokenizer;

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepStats {
    pub experts_reused: u32,
    pub experts_prefetched: u32,
    pub experts_missed: u32,
    pub bytes_read: u64,
    pub ms_total: f32,
    pub ms_io: f32,
    pub direct_io: bool,
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
    /// The most likely alternatives, most likely first (`top_logprobs` of them).
    pub top_logprobs: Vec<(u32, f32)>,
    pub stats: StepStats,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Length,
    Eos,
    Cancelled,
    ContextFull,
    /// One of the caller's stop strings appeared in the text.
    StopString,
    /// One of the caller's stop tokens was sampled.
    StopToken,
    /// The grammar of a structured output is complete and allows nothing
    /// more, and no end-of-sequence token may end it (`stop_at_eos` off, or
    /// the model has none).
    Grammar,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub tokens: Vec<u32>,
    pub text: String,
    pub stop_reason: StopReason,
    /// Per token: its log-probability and its most likely alternatives.
    pub logprobs: Vec<f32>,
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct GenerateParams {
    pub sampling: SamplingParams,
    pub max_tokens: u32,
    pub stop_at_eos: bool,
    /// Text that ends the generation; it is not part of the output.
    pub stop_strings: Vec<String>,
    /// Token ids that end the generation (besides the model's EOS tokens).
    pub stop_tokens: Vec<u32>,
    /// The host has a sampler plugin attached: the draw is delegated to it.
    pub use_plugin: bool,
}

/// What the loop needs from the engine (the WIT imports, or a test double).
pub trait ModelHost {
    /// Appends `tokens` (after any token the host still holds from the
    /// previous generation) and returns the logits of the last one.
    fn evaluate(&mut self, tokens: &[u32]) -> Result<Evaluation, String>;
    /// Returns false to cancel.
    fn emit(&mut self, event: TokenEvent) -> bool;
    /// The last `n` tokens of the sequence the host holds, oldest first.
    fn recent_tokens(&mut self, n: u32) -> Vec<u32>;
    /// Draws a token with the attached sampler plugin.
    fn plugin_sample(&mut self, logits: &[f32], recent: &[u32]) -> Result<u32, String>;
}

/// Checks every parameter of a generation against its range.
pub fn validate(params: &GenerateParams, vocab_size: u32) -> Result<(), String> {
    params.sampling.validate(vocab_size)?;
    if params.max_tokens == 0 {
        return Err("max-tokens must be at least 1".into());
    }
    if let Some(&bad) = params.stop_tokens.iter().find(|&&t| t >= vocab_size) {
        return Err(format!("stop token {bad} is outside the vocabulary of {vocab_size}"));
    }
    StopGate::new(&params.stop_strings).map(|_| ())
}

/// Runs one generation. `tokenizer` turns tokens into streamed text; without
/// one, events carry empty text. Special tokens (such as the end-of-turn
/// marker) are not rendered into the text. An empty `prompt` continues from
/// the token the host holds from the previous generation. With a `guide`,
/// every step samples only among the tokens its grammar allows.
#[allow(clippy::too_many_arguments)]
pub fn generate(
    host: &mut dyn ModelHost,
    tokenizer: Option<&Tokenizer>,
    eos_tokens: &[u32],
    vocab_size: u32,
    context_length: u32,
    prompt: &[u32],
    params: &GenerateParams,
    mut guide: Option<&mut Guide>,
) -> Result<Completion, String> {
    validate(params, vocab_size)?;
    let sp = &params.sampling;
    let mut gate = StopGate::new(&params.stop_strings)?;
    let window = sp.penalty_last_n as usize;
    let mut recent = if window > 0 { host.recent_tokens(sp.penalty_last_n) } else { Vec::new() };
    recent.extend_from_slice(prompt);
    let mut rng = Rng::new(sp.seed);
    let mut stream = Utf8Stream::default();
    let mut completion = Completion {
        tokens: Vec::new(),
        text: String::new(),
        stop_reason: StopReason::Length,
        logprobs: Vec::new(),
        top_logprobs: Vec::new(),
    };
    // Rows of the embedding the tokenizer has no token for (padding): never
    // sampled, as if a grammar forbade them.
    let padding: Vec<u32> = match tokenizer {
        Some(tok) => (0..vocab_size).filter(|&id| !tok.knows(id)).collect(),
        None => Vec::new(),
    };
    let mut evaluation = host.evaluate(prompt)?;
    loop {
        let raw = &evaluation.logits;
        if raw.len() != vocab_size as usize {
            return Err(format!("the host returned {} logits for a vocabulary of {vocab_size}", raw.len()));
        }
        if recent.len() > window {
            recent.drain(..recent.len() - window);
        }
        let mut adjusted = adjust(raw, sp, &recent);
        if !padding.is_empty() {
            let logits = adjusted.to_mut();
            for &id in &padding {
                logits[id as usize] = f32::NEG_INFINITY;
            }
        }
        if let Some(g) = guide.as_deref_mut() {
            if !g.mask(adjusted.to_mut(), params.stop_at_eos)? {
                return Err("structured output: the grammar allows no token here".into());
            }
        }
        let token = if params.use_plugin {
            let t = host.plugin_sample(&adjusted, &recent)?;
            if t >= vocab_size {
                return Err(format!("the sampler plugin chose token {t}, outside the vocabulary of {vocab_size}"));
            }
            if padding.binary_search(&t).is_ok() {
                return Err(format!(
                    "the sampler plugin chose token {t}, a padding row the tokenizer has no token for"
                ));
            }
            if let Some(g) = guide.as_deref_mut() {
                if !g.allows(t)? {
                    return Err(format!("the sampler plugin chose token {t}, which the grammar does not allow"));
                }
            }
            t
        } else {
            sample(&adjusted, sp, &mut rng) as u32
        };
        drop(adjusted);
        // An end-of-sequence token ends the text; the grammar allowed it.
        // A complete grammar leaves only the model's end of turn, which
        // is sampled next (so the conversation's state ends as the model
        // ends a turn), unless there is none to sample.
        let grammar_done = match guide.as_deref_mut() {
            Some(g) if !g.is_eos(token) => {
                g.advance(token)?;
                g.is_finished() && !(params.stop_at_eos && g.has_eos())
            }
            _ => false,
        };
        let lse = log_sum_exp(raw);
        let token_logprob = (raw[token as usize] as f64 - lse) as f32;
        let top = top_logprobs(raw, lse, sp.top_logprobs as usize);
        recent.push(token);

        let is_eos = params.stop_at_eos && eos_tokens.contains(&token);
        let is_stop_token = params.stop_tokens.contains(&token);
        let mut text = String::new();
        let mut hit_stop = false;
        if let Some(tok) = tokenizer {
            if !tok.is_special(token) {
                let bytes = tok.decode_bytes(&[token]).map_err(|e| e.to_string())?;
                let g = gate.push(&stream.push(&bytes));
                text = g.text;
                hit_stop = g.stopped;
            }
        }
        completion.tokens.push(token);
        let out_of_tokens = completion.tokens.len() >= params.max_tokens as usize;
        let context_full = evaluation.position >= context_length;
        let last = hit_stop || is_eos || is_stop_token || grammar_done || out_of_tokens || context_full;
        if last && !hit_stop {
            // Nothing comes after this token: release what was held back
            // (an incomplete character, a possible start of a stop string).
            let g = gate.push(&stream.finish());
            text.push_str(&g.text);
            hit_stop = g.stopped;
            if !hit_stop {
                text.push_str(&gate.finish());
            }
        }
        completion.text.push_str(&text);
        completion.logprobs.push(token_logprob);
        completion.top_logprobs.push(top.clone());
        let event = TokenEvent { token, text, logprob: token_logprob, top_logprobs: top, stats: evaluation.stats };
        if !host.emit(event) {
            completion.stop_reason = StopReason::Cancelled;
            break;
        }
        if last {
            completion.stop_reason = if hit_stop {
                StopReason::StopString
            } else if is_eos {
                StopReason::Eos
            } else if is_stop_token {
                StopReason::StopToken
            } else if grammar_done {
                StopReason::Grammar
            } else if out_of_tokens {
                StopReason::Length
            } else {
                StopReason::ContextFull
            };
            break;
        }
        evaluation = host.evaluate(&[token])?;
    }
    Ok(completion)
}

#[cfg(test)]
mod tests;
