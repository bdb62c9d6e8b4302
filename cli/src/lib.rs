//! `waste`: run mixture-of-experts models larger than RAM.
//!
//! A thin client of the waste-host API: everything it does, an embedder can
//! do. Exit codes: 0 success, 1 runtime error, 2 usage error.
//!
//! Layering inside the crate, each module using only those listed before
//! it (tests/integration/layering.rs holds it): `errors`, `output`,
//! `render`, `input`, `open`, `sampling`, `compat`, `cmd_convert_verify`,
//! `cmd_convert`, `cmd_info`, `cmd_synth`, `cmd_plan`, `cmd_bench`,
//! `cmd_tokens`, `cmd_eval`, `cmd_perplexity`, `cmd_run`, `cmd_serve`,
//! `chat_images`, `chat`.

mod chat;
mod chat_images;
mod cmd_bench;
mod cmd_convert;
mod cmd_convert_verify;
mod cmd_eval;
mod cmd_info;
mod cmd_perplexity;
mod cmd_plan;
mod cmd_run;
mod cmd_serve;
mod cmd_synth;
mod cmd_tokens;
mod compat;
mod errors;
mod input;
mod open;
mod output;
mod render;
mod sampling;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "waste", version, about = "Weight-Aware Streaming Tensor Engine: MoE models larger than RAM")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Convert a Hugging Face checkpoint directory into a waste container.
    Convert(cmd_convert::ConvertArgs),
    /// Generate text from a prompt, streaming it to stdout.
    Run(cmd_run::RunArgs),
    /// Chat with a model through its chat template (a REPL; /help inside).
    Chat(chat::ChatArgs),
    /// Evaluate tokens and print the next-token distribution (or raw logits).
    Eval(cmd_eval::EvalArgs),
    /// Text -> token ids.
    Tokenize(cmd_tokens::TokenizeArgs),
    /// Token ids -> text.
    Detokenize(cmd_tokens::DetokenizeArgs),
    /// Describe a container.
    Info(cmd_info::InfoArgs),
    /// Print the version of waste and of its container format.
    Version(cmd_info::VersionArgs),
    /// Memory plan of a model: floor, working set, recommended budget, cache.
    Plan(cmd_plan::PlanArgs),
    /// Perplexity of a text file, scored in windows of the context.
    Perplexity(cmd_perplexity::PerplexityArgs),
    /// Decode benchmark: tok/s, where the expert picks came from (reused, prefetched, read), GB read, achieved GB/s.
    Bench(cmd_bench::BenchArgs),
    /// Write a synthetic container with a real model's shapes and random codes.
    Synth(cmd_synth::SynthArgs),
    /// Write the bundled control component (wasm32-wasip2) for other wasmtime hosts.
    Component(cmd_info::ComponentArgs),
    /// HTTP server: OpenAI (/v1/chat/completions, /v1/completions), Anthropic (/v1/messages), Ollama (/api/chat).
    Serve(cmd_serve::ServeArgs),
}

/// The `waste` command line: parses the arguments, runs the command, and
/// turns its outcome into the exit status (after one error line on stderr).
pub fn main() -> ExitCode {
    let args = match compat::rewrite(std::env::args_os().collect()) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(2);
        }
    };
    let cli = Cli::parse_from(args);
    let result = match cli.command {
        Command::Convert(a) => cmd_convert::convert(a),
        Command::Run(a) => cmd_run::run(a),
        Command::Chat(a) => chat::chat(a),
        Command::Eval(a) => cmd_eval::eval(a),
        Command::Tokenize(a) => cmd_tokens::tokenize(a),
        Command::Detokenize(a) => cmd_tokens::detokenize(a),
        Command::Info(a) => cmd_info::info(a),
        Command::Version(a) => cmd_info::version(a),
        Command::Plan(a) => cmd_plan::plan(a),
        Command::Perplexity(a) => cmd_perplexity::perplexity(a),
        Command::Bench(a) => cmd_bench::bench(a),
        Command::Synth(a) => cmd_synth::synth(a),
        Command::Component(a) => cmd_info::component(a),
        Command::Serve(a) => cmd_serve::serve(a),
    };
    // A reader that went away (a pipe to `head`) ends a command quietly,
    // status 0; a failed write to a file or a device is an error.
    let result = result.and_then(|()| match output::stdout_error() {
        Some(e) => Err(anyhow::anyhow!("writing to stdout: {e}")),
        None => Ok(()),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            output::error_line(&e);
            ExitCode::from(if errors::is_usage_error(&e) { 2 } else { 1 })
        }
    }
}
