//! `waste`: run mixture-of-experts models larger than RAM.
//!
//! A thin client of the waste-host API: everything it does, an embedder can
//! do. Exit codes: 0 success, 1 runtime error, 2 usage error.

mod chat;
mod cmd_convert_verify;
mod cmd_perplexity;
mod cmd_serve;
mod cmd_stream;
mod commands;
mod output;
mod render;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "waste", version, about = "Weight-Aware Streaming Tensor Engine: MoE models larger than RAM")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Convert a Hugging Face checkpoint directory into a waste container.
    Convert(ConvertArgs),
    /// Generate text from a prompt, streaming it to stdout.
    Run(RunArgs),
    /// Chat with a model through its chat template (a REPL; /help inside).
    Chat(chat::ChatArgs),
    /// Evaluate tokens and print the next-token distribution (or raw logits).
    Eval(EvalArgs),
    /// Text -> token ids.
    Tokenize(TokenizeArgs),
    /// Token ids -> text.
    Detokenize(DetokenizeArgs),
    /// Describe a container.
    Info(InfoArgs),
    /// Print the version of waste and of its container format.
    Version(VersionArgs),
    /// Memory plan of a model: floor, working set, recommended budget, cache.
    Plan(cmd_stream::PlanArgs),
    /// Perplexity of a text file, scored in windows of the context.
    Perplexity(cmd_perplexity::PerplexityArgs),
    /// Decode benchmark: tok/s, cache hit rate, GB read, achieved GB/s.
    Bench(cmd_stream::BenchArgs),
    /// Write a synthetic container with a real model's shapes and random codes.
    Synth(cmd_stream::SynthArgs),
    /// Write the bundled control component (wasm32-wasip2) for other wasmtime hosts.
    Component(ComponentArgs),
    /// OpenAI-compatible HTTP server: /v1/chat/completions, /v1/completions, /v1/models.
    Serve(cmd_serve::ServeArgs),
}

#[derive(Args)]
pub struct ConvertArgs {
    /// Hugging Face checkpoint directory (config.json + *.safetensors).
    pub src: PathBuf,
    /// Output container directory, e.g. model.waste.
    pub out: PathBuf,
    /// Routed-expert format: f32, q8, q4, rvq3, rvq2 or rvq4p.
    #[arg(long, default_value = "rvq3")]
    pub experts: String,
    /// Trunk format: f32, q8 or q4 (embeddings and LM head stay q8; norms and routers f32).
    #[arg(long, default_value = "q4")]
    pub trunk: String,
    /// Layer banks converted in parallel; the output is the same for any value.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub jobs: u32,
    /// Delete each source shard once everything it holds is written (off unless asked).
    #[arg(long)]
    pub reclaim: bool,
    /// Convert while the source is still downloading: start from config.json and
    /// model.safetensors.index.json, wait for each shard to be complete (its header
    /// describes its size). With --reclaim, the disk holds the output plus the shards in flight.
    #[arg(long)]
    pub follow: bool,
    /// With --follow: give up after this many seconds without a new shard.
    #[arg(long, requires = "follow", default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..))]
    pub follow_timeout: u64,
    /// Decode every expert record back and report its error against the source.
    #[arg(long)]
    pub verify: bool,
    /// With --verify: print the per-matrix errors as JSON.
    #[arg(long, requires = "verify")]
    pub json: bool,
}

#[derive(Args)]
pub struct ModelArgs {
    /// Container directory (made by `waste convert`).
    pub model: PathBuf,
    /// Tokens of context to allocate (default: the model's maximum, at most 4096).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// RAM budget for everything the model allocates (e.g. 2G, 800M); default: planned from usable RAM.
    #[arg(long)]
    pub budget: Option<String>,
    /// Compute threads (default: one per CPU, or per CPU of --cpus); results do not depend on it.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub threads: Option<u32>,
    /// Bind the compute threads to these CPUs, Linux cpu-list syntax: 0-2,6-8.
    #[arg(long)]
    pub cpus: Option<String>,
}

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

#[derive(Args)]
pub struct InfoArgs {
    /// Container directory.
    pub model: PathBuf,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct ComponentArgs {
    /// Where to write the component.
    #[arg(long)]
    pub out: PathBuf,
}

#[derive(Args)]
pub struct VersionArgs {
    #[arg(long)]
    pub json: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Convert(a) => commands::convert(a),
        Command::Run(a) => commands::run(a),
        Command::Chat(a) => chat::chat(a),
        Command::Eval(a) => commands::eval(a),
        Command::Tokenize(a) => commands::tokenize(a),
        Command::Detokenize(a) => commands::detokenize(a),
        Command::Info(a) => commands::info(a),
        Command::Version(a) => commands::version(a),
        Command::Plan(a) => cmd_stream::plan(a),
        Command::Perplexity(a) => cmd_perplexity::perplexity(a),
        Command::Bench(a) => cmd_stream::bench(a),
        Command::Synth(a) => cmd_stream::synth(a),
        Command::Component(a) => commands::component(a),
        Command::Serve(a) => cmd_serve::serve(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            output::error_line(&e);
            ExitCode::from(if commands::is_usage_error(&e) { 2 } else { 1 })
        }
    }
}
