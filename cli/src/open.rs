//! Opening a model from the command line: the options every command that
//! opens one takes (`--budget`, `--ctx`, `--threads`, `--cpus`, `--verify`/`--no-verify`,
//! `--prefill-chunk`)
//! and the sampler plugin of `run` and `serve`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use waste_host::Verify;
use waste_host::{fmt_bytes, parse_size, BudgetSource, MemoryPlan};
use waste_host::{Engine, KvType, OpenOptions, Session};

use crate::errors::usage;
use waste_host::MAX_PREFILL_CHUNK;

#[derive(Args)]
pub struct ModelArgs {
    /// Container directory (made by `waste convert`) or GGUF file (run in
    /// place, its first part if split); `-m PATH` works too.
    pub model: PathBuf,
    /// Tokens of context to allocate (default: the model's maximum, at most 4096).
    #[arg(long, short = 'c', visible_alias = "ctx-size")]
    pub ctx: Option<usize>,
    /// RAM budget for everything the model allocates (e.g. 2G, 800M); default: planned from usable RAM.
    #[arg(long)]
    pub budget: Option<String>,
    /// Compute threads (default: one per CPU, or per CPU of --cpus); results do not depend on it.
    #[arg(long, short = 't', value_parser = clap::value_parser!(u32).range(1..))]
    pub threads: Option<u32>,
    /// Bind the compute threads to these CPUs, Linux cpu-list syntax: 0-2,6-8.
    #[arg(long)]
    pub cpus: Option<String>,
    #[command(flatten)]
    pub verify: VerifyArgs,
    /// Tokens per prefill chunk, 1 (token at a time) to 8192; default: the largest the budget leaves room for.
    #[arg(long)]
    pub prefill_chunk: Option<usize>,
    /// How the KV cache stores keys and values: f32 (exact), bf16 (half the memory) or q8 (a quarter); default bf16.
    #[arg(long, value_name = "TYPE")]
    pub kv_type: Option<KvType>,
}

impl ModelArgs {
    /// The engine's options these flags ask for; the rest are the defaults.
    pub fn open_options(&self) -> Result<OpenOptions> {
        let budget = budget_arg(&self.budget)?;
        let (threads, cpus) = thread_args(self)?;
        if let Some(bad) = self.prefill_chunk.filter(|&c| waste_host::check_prefill_chunk(c).is_err()) {
            return Err(usage(format!("--prefill-chunk {bad}: expected 1 to {}", MAX_PREFILL_CHUNK)));
        }
        Ok(OpenOptions {
            context: self.ctx,
            budget,
            threads,
            cpus,
            verify: self.verify.level(),
            prefill_chunk: self.prefill_chunk,
            kv_type: self.kv_type.unwrap_or_default(),
            ..OpenOptions::default()
        })
    }
}

/// Which checksums to check, for every command that opens a model.
#[derive(Args)]
pub struct VerifyArgs {
    /// Check every checksum in the container: also the whole trunk at open (expert records are checked by default); a container without checksums is refused.
    #[arg(long, conflicts_with = "no_verify")]
    pub verify: bool,
    /// Do not check each expert record's checksum as it lands: a damaged record then changes the output silently.
    #[arg(long)]
    pub no_verify: bool,
}

impl VerifyArgs {
    pub fn level(&self) -> Verify {
        match (self.verify, self.no_verify) {
            (true, _) => Verify::All,
            (false, true) => Verify::Off,
            (false, false) => Verify::Records,
        }
    }
}

/// `--budget SIZE` parsed: `1.5G`, `800M`, `2GiB`, bytes.
pub fn budget_arg(s: &Option<String>) -> Result<Option<u64>> {
    size_arg("--budget", s)
}

/// A size option (`1.5G`, `800M`, `2GiB`), named in its error.
pub fn size_arg(flag: &str, s: &Option<String>) -> Result<Option<u64>> {
    match s {
        None => Ok(None),
        Some(t) => parse_size(t)
            .map(Some)
            .ok_or_else(|| usage(format!("{flag} {t:?}: expected a size such as 1.5G, 800M or 2GiB"))),
    }
}

/// Says on stderr how an automatic budget was chosen.
pub fn say_budget(plan: &MemoryPlan) {
    if let BudgetSource::Auto { working_sets } = plan.budget_source {
        let how = if working_sets == 0 {
            "the floor (not even one working set fits)".to_string()
        } else {
            format!("floor + {working_sets} working sets")
        };
        eprintln!(
            "budget {} ({how}, under 7/8 of usable RAM {}); set one with --budget",
            fmt_bytes(plan.budget),
            fmt_bytes(plan.usable_ram)
        );
    }
}

pub fn open(args: &ModelArgs) -> Result<(Engine, Session)> {
    let options = args.open_options()?;
    let model = crate::render::open_model(&args.model, &options)
        .with_context(|| format!("opening {}", args.model.display()))?;
    let engine = Engine::new()?;
    let session = engine.session(model)?;
    Ok((engine, session))
}

/// `--threads` / `--cpus`; a malformed cpu list is a usage error.
pub fn thread_args(args: &ModelArgs) -> Result<(Option<usize>, Option<waste_host::CpuSet>)> {
    let cpus = match &args.cpus {
        None => None,
        Some(list) => Some(waste_host::CpuSet::parse(list).map_err(|e| usage(format!("--cpus: {e}")))?),
    };
    // More threads than CPUs only queue behind each other (4 tokens took
    // 35-60 s at --threads 3000).
    let available = std::thread::available_parallelism().map_or(1, |n| n.get());
    if let Some(n) = args.threads.filter(|&n| n as usize > available) {
        return Err(usage(format!("--threads {n}: this machine has {available} CPUs available")));
    }
    Ok((args.threads.map(|n| n as usize), cpus))
}

/// Loads `--sampler PATH` with its `--sampler-opt NAME=NUMBER` options
/// (shared by `run` and `serve`).
pub fn sampler_plugin(path: &std::path::Path, opts: &[String]) -> Result<waste_host::plugin::SamplerPlugin> {
    let mut options = Vec::new();
    for item in opts {
        let parsed =
            item.split_once('=').and_then(|(k, v)| Some((k.trim().to_string(), v.trim().parse::<f32>().ok()?)));
        options.push(parsed.ok_or_else(|| usage(format!("--sampler-opt {item:?}: expected NAME=NUMBER, e.g. tau=5")))?);
    }
    waste_host::plugin::SamplerPlugin::load(path, options, Default::default())
        .with_context(|| format!("loading the sampler plugin {}", path.display()))
}
