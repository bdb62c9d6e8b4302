//! `waste run`: stream a completion of a prompt.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use waste_host::GenerateParams;

use crate::errors::usage;
use crate::input::{attach_images, encode, read_prompt};
use crate::open::{open, sampler_plugin, ModelArgs};
use crate::output;
use crate::output::outln;
use crate::sampling::{seed, SamplingArgs};

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt; `-` or nothing reads it from stdin.
    pub prompt: Option<String>,
    /// The prompt, as llama.cpp's `-p`.
    #[arg(short = 'p', long = "prompt", value_name = "TEXT", conflicts_with_all = ["prompt", "file"])]
    pub prompt_flag: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long, conflicts_with = "prompt")]
    pub file: Option<PathBuf>,
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "tokens", visible_alias = "n-predict", default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tokens: u32,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Print each token's log-probability and its N most likely alternatives
    /// to stderr as JSON lines (N in 0..=20).
    #[arg(long, value_name = "N")]
    pub logprobs: Option<u32>,
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
    /// An image for the prompt (repeatable; PNG, JPEG, WebP or a GIF's
    /// first frame): through the model's vision tower (Kimi K3), placed
    /// before the prompt text.
    #[arg(long = "image", value_name = "FILE")]
    pub images: Vec<PathBuf>,
    /// Write the routing of every token run on its own (decode, single-token
    /// prompt steps) to FILE as JSON lines, the trace `waste bench
    /// --route-trace` replays: `{"tok": i, "layers": [[experts], ...]}`.
    #[arg(long, value_name = "FILE")]
    pub route_log: Option<PathBuf>,
    /// Say on stderr what the run uses before it starts (the seed, the sampling).
    #[arg(long, short = 'v')]
    pub verbose: bool,
}

pub fn run(a: RunArgs) -> Result<()> {
    let (seed, random_seed) = seed(a.sampling.seed);
    let params = GenerateParams { top_logprobs: a.logprobs.unwrap_or(0), ..a.sampling.params(a.max_tokens, seed)? };
    let prompt = read_prompt(a.prompt_flag.as_deref().or(a.prompt.as_deref()), a.file.as_deref())?;
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
    tokens.extend(attach_images(&mut session, &a.images)?);
    tokens.extend(encode(&mut session, &prompt, a.markup)?);
    if tokens.is_empty() {
        bail!(usage("the prompt encodes to no tokens"));
    }
    if a.verbose {
        eprintln!(
            "seed {seed}{}; temp {}, top-k {}, top-p {}, min-p {}; {} prompt tokens, up to {} new",
            if random_seed { " (random)" } else { "" },
            params.temperature,
            params.top_k,
            params.top_p,
            params.min_p,
            tokens.len(),
            params.max_tokens
        );
    }
    if a.route_log.is_some() {
        session.model().expert_store().log_routes(true);
    }
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
    outln!();
    if let Some(path) = &a.route_log {
        let lines: String = session
            .model()
            .expert_store()
            .take_routes()
            .iter()
            .enumerate()
            .map(|(i, layers)| format!("{}\n", json!({"tok": i, "layers": layers})))
            .collect();
        std::fs::write(path, lines).with_context(|| format!("writing the route log {}", path.display()))?;
    }
    if let Some(path) = &a.save_state {
        session.save_state(path).with_context(|| format!("saving the session to {}", path.display()))?;
    }
    let totals = {
        let mut r = renderer.lock().map_err(|_| anyhow::anyhow!("statistics lock poisoned"))?;
        r.clear();
        r.totals
    };
    // A random seed is printed so the run can be repeated with --seed.
    let seed_note = if random_seed { format!(", seed {seed}") } else { String::new() };
    eprintln!("{} (stop: {}{seed_note})", output::stats_line(&totals, seconds), completion.stop_reason.as_str());
    Ok(())
}
