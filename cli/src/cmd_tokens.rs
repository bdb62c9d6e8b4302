//! `waste tokenize` and `waste detokenize`.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use serde_json::json;

use crate::errors::usage;
use crate::input::{encode, read_prompt};
use crate::open::{open, ModelArgs};
use crate::output::outln;

#[derive(Args)]
pub struct TokenizeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text to tokenize; `-` or nothing reads stdin.
    pub text: Option<String>,
    /// Read the text from a file.
    #[arg(long, conflicts_with = "text")]
    pub file: Option<PathBuf>,
    /// Treat the text as template markup: special-token strings become control tokens.
    /// Without it the text is content and can never produce a control token.
    #[arg(long)]
    pub markup: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct DetokenizeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Token ids, separated by commas or spaces.
    #[arg(required = true, num_args = 1..)]
    pub ids: Vec<String>,
    #[arg(long)]
    pub json: bool,
}

pub fn tokenize(a: TokenizeArgs) -> Result<()> {
    let text = read_prompt(a.text.as_deref(), a.file.as_deref())?;
    let (_engine, mut session) = open(&a.model)?;
    let ids = encode(&mut session, &text, a.markup)?;
    let mode = if a.markup { "markup" } else { "content" };
    if a.json {
        outln!("{}", json!({"mode": mode, "tokens": ids}));
    } else {
        eprintln!("mode: {mode} ({} tokens)", ids.len());
        outln!("{}", ids.iter().map(u32::to_string).collect::<Vec<_>>().join(","));
    }
    Ok(())
}

pub fn detokenize(a: DetokenizeArgs) -> Result<()> {
    let mut ids = Vec::new();
    for part in a.ids.iter().flat_map(|s| s.split([',', ' '])).filter(|s| !s.is_empty()) {
        let id: u32 = part.trim().parse().map_err(|_| usage(format!("{part:?} is not a token id")))?;
        ids.push(id);
    }
    let (_engine, mut session) = open(&a.model)?;
    let text = session.detokenize(&ids)?;
    if a.json {
        outln!("{}", json!({"tokens": ids, "text": text}));
    } else {
        outln!("{text}");
    }
    Ok(())
}
