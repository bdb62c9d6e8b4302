//! Perplexity of a text under an open model, prefilled in chunks.

use crate::error::{Error, Result};
use crate::model::Model;

impl Model {
    /// Scores `tokens` as a text: window k is `tokens[k*(window-1) ..][..window]`
    /// on a fresh state, so consecutive windows share one token and every
    /// token after the first is predicted once, from the ones before it in
    /// its window (the scheme of tests/train_bible_moe.py). Each window is
    /// prefilled `chunk` tokens at a time, which bounds the logits held to
    /// `chunk * vocab` floats.
    pub fn perplexity(&self, tokens: &[u32], window: usize, chunk: usize) -> Result<Perplexity> {
        if tokens.len() < 2 {
            return Err(Error::Arg(format!("perplexity needs at least 2 tokens, got {}", tokens.len())));
        }
        if window < 2 || window > self.context() {
            return Err(Error::Arg(format!("window {window}: expected 2..={} (the context)", self.context())));
        }
        if chunk == 0 {
            return Err(Error::Arg("chunk 0: expected at least 1 token".into()));
        }
        let vocab = self.info().vocab_size;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::Arg(format!("token id {bad} is outside the vocabulary (size {vocab})")));
        }
        let mut result = Perplexity { tokens: tokens.len(), window, ..Perplexity::default() };
        let mut start = 0;
        while start + 1 < tokens.len() {
            let ids = &tokens[start..(start + window).min(tokens.len())];
            let mut state = self.new_state();
            for (c, piece) in ids.chunks(chunk).enumerate() {
                let (logits, _) = self.forward(&mut state, piece, true)?;
                for (i, row) in logits.chunks_exact(vocab).enumerate() {
                    // Row i predicts the token after position c*chunk + i of the window.
                    if let Some(&next) = ids.get(c * chunk + i + 1) {
                        result.nll_sum += negative_log_prob(row, next as usize);
                        result.scored += 1;
                    }
                }
            }
            result.windows += 1;
            start += window - 1;
        }
        Ok(result)
    }
}

/// `-ln softmax(row)[target]`, accumulated in f64.
fn negative_log_prob(row: &[f32], target: usize) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = row.iter().map(|&l| (l as f64 - max).exp()).sum();
    sum.ln() + max - row[target] as f64
}

/// The result of [`Model::perplexity`]: natural-log units.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Perplexity {
    /// Tokens of the text.
    pub tokens: usize,
    /// Tokens predicted (every token but the first).
    pub scored: usize,
    /// Windows evaluated, each on a fresh state.
    pub windows: usize,
    /// Tokens per window.
    pub window: usize,
    /// Sum over the scored tokens of -ln p(token | its window's earlier tokens).
    pub nll_sum: f64,
}

impl Perplexity {
    /// Mean negative log-likelihood per scored token (nats).
    pub fn mean_nll(&self) -> f64 {
        self.nll_sum / self.scored.max(1) as f64
    }

    /// `exp(mean_nll)`.
    pub fn perplexity(&self) -> f64 {
        self.mean_nll().exp()
    }
}

/// Tokens per prefill call of a perplexity run (the host's `Session::perplexity`).
pub const PERPLEXITY_CHUNK: usize = 64;
