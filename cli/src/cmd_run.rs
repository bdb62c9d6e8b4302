//! `waste run`: stream a completion of a prompt.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use waste_host::GenerateParams;

use crate::errors::usage;
use crate::input::{encode, read_prompt};
use crate::open::{open, sampler_plugin, ModelArgs};
use crate::output;

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt; `-` or nothing reads it from stdin.
    pub prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(long, conflicts_with = "prompt")]
    pub file: Option<PathBuf>,
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "tokens", default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tokens: u32,
    /// Sampling temperature; 0 = greedy.
    #[arg(long = "temp", default_value_t = 0.8, allow_negative_numbers = true)]
    pub temperature: f32,
    /// Keep the K most likely tokens; 0 = off.
    #[arg(long, default_value_t = 40)]
    pub top_k: u32,
    /// Keep the smallest set of tokens whose probability reaches P; 1 = off.
    #[arg(long, default_value_t = 0.95, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Drop tokens less likely than P times the most likely one; 0 = off.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub min_p: f32,
    /// Repetition penalty (llama.cpp / HF definition); 1 = off.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub repeat_penalty: f32,
    /// Presence penalty in [-2, 2]; 0 = off.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// Frequency penalty in [-2, 2]; 0 = off.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// Recent tokens (prompt included) the penalties look at; 0 = off.
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: u32,
    /// Add BIAS to the logit of token ID: ID=BIAS (repeatable; BIAS in [-100, 100]).
    #[arg(long = "logit-bias", value_name = "ID=BIAS", allow_negative_numbers = true)]
    pub logit_bias: Vec<String>,
    /// Stop when this text appears (repeatable); it is not printed.
    #[arg(long = "stop", value_name = "TEXT")]
    pub stop: Vec<String>,
    /// Stop at this token id (repeatable).
    #[arg(long = "stop-token", value_name = "ID")]
    pub stop_token: Vec<u32>,
    /// Print each token's log-probability and its N most likely alternatives
    /// to stderr as JSON lines (N in 0..=20).
    #[arg(long, value_name = "N")]
    pub logprobs: Option<u32>,
    /// Seed of the sampler: the same seed gives the same tokens.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Keep generating past the model's end-of-sequence token.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Route every draw to a sampler plugin (a wasm32-wasip2 component of the
    /// `sampler-plugin` world, e.g. examples/sampler-mirostat).
    #[arg(long, value_name = "PLUGIN.wasm")]
    pub sampler: Option<PathBuf>,
    /// An option for the sampler plugin: NAME=VALUE (repeatable), e.g. tau=5.
    #[arg(long = "sampler-opt", value_name = "NAME=VALUE", requires = "sampler", allow_negative_numbers = true)]
    pub sampler_opt: Vec<String>,
    /// Restore the conversation saved in FILE before the prompt.
    #[arg(long, value_name = "FILE")]
    pub load_state: Option<PathBuf>,
    /// Save the conversation (state, position, tokens) to FILE at the end.
    #[arg(long, value_name = "FILE")]
    pub save_state: Option<PathBuf>,
    /// Encode the prompt as template markup (special-token strings become control tokens).
    #[arg(long)]
    pub markup: bool,
}

pub fn run(a: RunArgs) -> Result<()> {
    if !(a.temperature.is_finite() && a.temperature >= 0.0) {
        bail!(usage(format!("--temp {}: the temperature must be a number >= 0", a.temperature)));
    }
    if !(a.top_p > 0.0 && a.top_p <= 1.0) {
        bail!(usage(format!("--top-p {}: must be in (0, 1]", a.top_p)));
    }
    let prompt = read_prompt(a.prompt.as_deref(), a.file.as_deref())?;
    let (_engine, mut session) = open(&a.model)?;
    if let Some(path) = &a.sampler {
        session.set_sampler(Some(sampler_plugin(path, &a.sampler_opt)?));
    }
    if let Some(path) = &a.load_state {
        session.load_state(path).with_context(|| format!("loading the session from {}", path.display()))?;
    }
    let mut tokens = Vec::new();
    if let (Some(bos), 0) = (session.model().info().bos_token, session.tokens().len()) {
        tokens.push(bos);
    }
    tokens.extend(encode(&mut session, &prompt, a.markup)?);
    if tokens.is_empty() {
        bail!(usage("the prompt encodes to no tokens"));
    }
    let logit_bias = parse_logit_bias(&a.logit_bias)?;
    let params = GenerateParams {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repetition_penalty: a.repeat_penalty,
        presence_penalty: a.presence_penalty,
        frequency_penalty: a.frequency_penalty,
        penalty_last_n: a.repeat_last_n,
        logit_bias,
        top_logprobs: a.logprobs.unwrap_or(0),
        seed: a.seed,
        max_tokens: a.max_tokens,
        stop_at_eos: !a.ignore_eos,
        stop_strings: a.stop.clone(),
        stop_tokens: a.stop_token.clone(),
    };
    let show_logprobs = a.logprobs.is_some();
    let renderer = Arc::new(Mutex::new(crate::render::Renderer::new()));
    let sink = renderer.clone();
    let started = Instant::now();
    let completion = session.generate(&tokens, &params, move |event| {
        if show_logprobs {
            let top: Vec<_> = event.top_logprobs.iter().map(|(id, lp)| json!({"id": id, "logprob": lp})).collect();
            eprintln!("{}", json!({"token": event.token, "text": event.text, "logprob": event.logprob, "top": top}));
        }
        // A closed stdout (a pipe to `head`) ends the generation quietly.
        sink.lock().map(|mut r| r.token(event)).unwrap_or(false)
    })?;
    let seconds = started.elapsed().as_secs_f64();
    println!();
    if let Some(path) = &a.save_state {
        session.save_state(path).with_context(|| format!("saving the session to {}", path.display()))?;
    }
    let totals = {
        let mut r = renderer.lock().map_err(|_| anyhow::anyhow!("statistics lock poisoned"))?;
        r.clear();
        r.totals
    };
    eprintln!("{} (stop: {})", output::stats_line(&totals, seconds), completion.stop_reason.as_str());
    Ok(())
}

/// `ID=BIAS` pairs of `--logit-bias`.
fn parse_logit_bias(items: &[String]) -> Result<Vec<(u32, f32)>> {
    items
        .iter()
        .map(|item| {
            let parsed = item
                .split_once('=')
                .and_then(|(id, bias)| Some((id.trim().parse::<u32>().ok()?, bias.trim().parse::<f32>().ok()?)));
            parsed.ok_or_else(|| usage(format!("--logit-bias {item:?}: expected ID=BIAS, e.g. 42=-5")))
        })
        .collect()
}
