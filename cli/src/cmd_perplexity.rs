//! `waste perplexity`: how well a model predicts a text file.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;
use waste_host::Engine;

use crate::errors::usage;
use crate::open::ModelArgs;
use crate::output::outln;

#[derive(Args)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// UTF-8 text file to score (tokenized as content).
    pub file: PathBuf,
    /// Tokens per window (default: the context). Windows overlap by one token,
    /// so every token after the first is predicted once.
    #[arg(long)]
    pub window: Option<usize>,
    #[arg(long)]
    pub json: bool,
}

pub fn perplexity(a: PerplexityArgs) -> Result<()> {
    // A held-out corpus (wikitext-2's test split is 1.3 MB) is far below this.
    let text = crate::input::read_text(&a.file, 1 << 30, "the text")?;
    if text.is_empty() {
        return Err(usage(format!("{} is empty: nothing to score", a.file.display())));
    }
    let model = crate::render::open_model(&a.model.model, &a.model.open_options()?)
        .with_context(|| format!("opening {}", a.model.model.display()))?;
    let engine = Engine::new()?;
    let mut session = engine.session(model)?;
    let started = Instant::now();
    let p = session.perplexity(&text, a.window)?;
    let seconds = started.elapsed().as_secs_f64();
    if a.json {
        outln!(
            "{}",
            json!({
                "file": a.file.display().to_string(),
                "tokens": p.tokens,
                "scored": p.scored,
                "windows": p.windows,
                "window": p.window,
                "nll_sum": p.nll_sum,
                "mean_nll": p.mean_nll(),
                "perplexity": p.perplexity(),
                "seconds": seconds,
            })
        );
    } else {
        outln!(
            "perplexity {:.4} (mean nll {:.5} nats) over {} scored tokens of {}, {} windows of {} tokens, {:.1} s",
            p.perplexity(),
            p.mean_nll(),
            p.scored,
            p.tokens,
            p.windows,
            p.window,
            seconds
        );
    }
    Ok(())
}
