//! `waste eval`: the next-token distribution of a text, or raw logits.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;

use crate::errors::usage;
use crate::input::{encode, read_prompt};
use crate::open::{open, ModelArgs};
use crate::output::outln;

#[derive(Args)]
pub struct EvalArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text to evaluate (or use --tokens); `-` or nothing reads stdin.
    pub prompt: Option<String>,
    /// Read the text to evaluate from a file.
    #[arg(long, conflicts_with_all = ["prompt", "tokens"])]
    pub file: Option<PathBuf>,
    /// Token ids to evaluate instead of text: 1,2,3.
    #[arg(long, value_delimiter = ',', conflicts_with = "prompt")]
    pub tokens: Option<Vec<u32>>,
    /// How many of the most likely next tokens to show.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Write raw little-endian f32 logits of the last position to FILE.
    #[arg(long)]
    pub logits: Option<PathBuf>,
    /// With --logits: write every position's logits, T x V.
    #[arg(long, requires = "logits")]
    pub all_positions: bool,
    /// Encode the prompt as template markup.
    #[arg(long)]
    pub markup: bool,
    #[arg(long)]
    pub json: bool,
}

pub fn eval(a: EvalArgs) -> Result<()> {
    let (_engine, mut session) = open(&a.model)?;
    let tokens = match (&a.tokens, &a.prompt) {
        (Some(ids), _) => ids.clone(),
        (None, prompt) => {
            let text = read_prompt(prompt.as_deref(), a.file.as_deref())?;
            encode(&mut session, &text, a.markup)?
        }
    };
    if tokens.is_empty() {
        bail!(usage("nothing to evaluate: no tokens"));
    }
    let vocab = session.model().info().vocab_size;
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
        bail!(usage(format!("token id {bad} is outside the vocabulary (size {vocab})")));
    }
    let all = a.all_positions;
    let (logits, _stats) = session.eval(&tokens, all)?;
    let last = &logits[logits.len() - vocab..];
    if let Some(path) = &a.logits {
        let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(path, bytes).with_context(|| format!("writing logits to {}", path.display()))?;
    }
    let mut order: Vec<usize> = (0..vocab).collect();
    order.sort_by(|&x, &y| last[y].total_cmp(&last[x]).then(x.cmp(&y)));
    let max = last.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let log_sum = last.iter().map(|&l| (l as f64 - max).exp()).sum::<f64>().ln() + max;
    let has_tokenizer = session.model().info().has_tokenizer;
    let mut top = Vec::new();
    for &id in order.iter().take(a.top) {
        let text = if has_tokenizer { Some(session.detokenize(&[id as u32])?) } else { None };
        top.push((id, last[id], last[id] as f64 - log_sum, text));
    }
    if a.json {
        let top: Vec<_> = top
            .iter()
            .map(|(id, logit, lp, text)| json!({"id": id, "logit": logit, "logprob": lp, "text": text}))
            .collect();
        outln!("{}", json!({"tokens": tokens, "positions": tokens.len(), "vocab_size": vocab, "top": top}));
    } else {
        outln!("{} tokens evaluated; most likely next tokens:", tokens.len());
        for (id, logit, lp, text) in &top {
            let shown = text.as_deref().map(|t| format!("{t:?}")).unwrap_or_default();
            outln!("{id:>8}  logprob {lp:>9.4}  logit {logit:>9.4}  {shown}");
        }
    }
    Ok(())
}
