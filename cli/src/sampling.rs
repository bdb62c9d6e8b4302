//! The sampling and stopping flags `run` and `chat` share, with llama.cpp's
//! spellings as aliases where the meaning is the same, and the seed: the
//! user's, or a fresh random one each run (printed, so a run can be
//! repeated with `--seed`).

use std::hash::{BuildHasher, RandomState};
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use waste_host::{Constraint, GenerateParams, MAX_CONSTRAINT_BYTES};

use crate::errors::usage;
use crate::input::read_text;

/// The flags' defaults are the library's (`GenerateParams::DEFAULTS`).
const DEFAULTS: GenerateParams = GenerateParams::DEFAULTS;

#[derive(Args, Clone)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 = greedy.
    #[arg(long = "temp", visible_alias = "temperature", default_value_t = DEFAULTS.temperature, allow_negative_numbers = true)]
    pub temperature: f32,
    /// Keep the K most likely tokens; 0 = off.
    #[arg(long, default_value_t = DEFAULTS.top_k)]
    pub top_k: u32,
    /// Keep the smallest set of tokens whose probability reaches P; 1 = off.
    #[arg(long, default_value_t = DEFAULTS.top_p, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Drop tokens less likely than P times the most likely one; 0 = off.
    #[arg(long, default_value_t = DEFAULTS.min_p, allow_negative_numbers = true)]
    pub min_p: f32,
    /// Repetition penalty (llama.cpp / HF definition); 1 = off.
    #[arg(long, default_value_t = DEFAULTS.repetition_penalty, allow_negative_numbers = true)]
    pub repeat_penalty: f32,
    /// Presence penalty in [-2, 2]; 0 = off.
    #[arg(long, default_value_t = DEFAULTS.presence_penalty, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// Frequency penalty in [-2, 2]; 0 = off.
    #[arg(long, default_value_t = DEFAULTS.frequency_penalty, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// Recent tokens (prompt included) the penalties look at; 0 = off.
    #[arg(long, default_value_t = DEFAULTS.penalty_last_n)]
    pub repeat_last_n: u32,
    /// Add BIAS to the logit of token ID: ID=BIAS (repeatable; BIAS in [-100, 100]).
    #[arg(long = "logit-bias", value_name = "ID=BIAS", allow_negative_numbers = true)]
    pub logit_bias: Vec<String>,
    /// Stop when this text appears (repeatable); it is not printed.
    #[arg(long = "stop", short = 'r', visible_alias = "reverse-prompt", value_name = "TEXT")]
    pub stop: Vec<String>,
    /// Stop at this token id (repeatable).
    #[arg(long = "stop-token", value_name = "ID")]
    pub stop_token: Vec<u32>,
    /// Seed of the sampler: the same seed gives the same tokens. Default: a
    /// random one, printed at the end (and with --verbose at the start).
    #[arg(long, short = 's')]
    pub seed: Option<u64>,
    /// Keep generating past the model's end-of-sequence token.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Structured output: the answer is JSON valid against the JSON schema
    /// in FILE (each token is sampled among those the schema allows).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["grammar", "json_object"])]
    pub json_schema: Option<PathBuf>,
    /// Structured output: the answer follows the grammar in FILE: llguidance's
    /// Lark syntax for a `.lark` file or one starting with `%llguidance`,
    /// else llama.cpp's GBNF.
    #[arg(long, value_name = "FILE", conflicts_with = "json_object")]
    pub grammar: Option<PathBuf>,
    /// Structured output: the answer is a JSON object.
    #[arg(long)]
    pub json_object: bool,
}

/// The seed of a run: the user's, or a fresh random one (`true`).
pub fn seed(given: Option<u64>) -> (u64, bool) {
    match given {
        Some(s) => (s, false),
        // std's RandomState is keyed from the OS's random source.
        None => (RandomState::new().hash_one(std::process::id()), true),
    }
}

impl SamplingArgs {
    /// The generation parameters, range-checked where a bad value is the
    /// user's mistake (the component checks the rest); `seed` is resolved
    /// by the caller (see [`seed`]).
    pub fn params(&self, max_tokens: u32, seed: u64) -> Result<GenerateParams> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            bail!(usage(format!("--temp {}: the temperature must be a number >= 0", self.temperature)));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            bail!(usage(format!("--top-p {}: must be in (0, 1]", self.top_p)));
        }
        Ok(GenerateParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            penalty_last_n: self.repeat_last_n,
            logit_bias: parse_logit_bias(&self.logit_bias)?,
            top_logprobs: 0,
            seed,
            max_tokens,
            stop_at_eos: !self.ignore_eos,
            stop_strings: self.stop.clone(),
            stop_tokens: self.stop_token.clone(),
            constraint: self.constraint()?,
        })
    }

    /// The structured output asked for, its file read (bounded, UTF-8).
    fn constraint(&self) -> Result<Option<Constraint>> {
        let limit = MAX_CONSTRAINT_BYTES as u64;
        Ok(if let Some(path) = &self.json_schema {
            Some(Constraint::JsonSchema(read_text(path, limit, "the JSON schema")?))
        } else if let Some(path) = &self.grammar {
            let text = read_text(path, limit, "the grammar")?;
            Some(match path.extension().and_then(|e| e.to_str()) {
                Some("lark") => Constraint::Lark(text),
                _ => Constraint::grammar(text),
            })
        } else {
            self.json_object.then_some(Constraint::JsonObject)
        })
    }
}

/// `--logit-bias ID=BIAS` flags.
pub fn parse_logit_bias(items: &[String]) -> Result<Vec<(u32, f32)>> {
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
