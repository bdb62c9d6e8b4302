//! `waste convert`: a Hugging Face checkpoint or a GGUF file into a container.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use waste_host::ConvertOptions;
use waste_host::{ExpertsAs, TrunkAs};

use crate::errors::usage;
use crate::output;

#[derive(Args)]
pub struct ConvertArgs {
    /// Hugging Face checkpoint directory (config.json + *.safetensors), or a GGUF file
    /// (qwen3moe, qwen2moe, olmoe, Mixtral; the tokenizer and chat template come from it).
    pub src: PathBuf,
    /// Output container directory, e.g. model.waste.
    pub out: PathBuf,
    /// Routed-expert format: f32, q8, q4, rvq3, rvq2, rvq4p, or gguf (a GGUF file's experts copied in their own quant types, no re-quantising). Default: gguf for a GGUF file, rvq3 for a checkpoint directory.
    #[arg(long)]
    pub experts: Option<String>,
    /// Trunk format: f32, q8 or q4 (embeddings and LM head stay q8; norms and routers f32), or gguf (a GGUF file's matrices in their own types; F32 tensors and DeepSeek's rebuilt kv_b_proj in f32). Default: gguf for a GGUF file, q4 for a checkpoint directory.
    #[arg(long)]
    pub trunk: Option<String>,
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
    /// Check every checksum, decode every expert record back and report its error against the source; exit 1 past the format's error limit.
    #[arg(long)]
    pub verify: bool,
    /// With --verify: print the per-matrix errors as JSON.
    #[arg(long, requires = "verify")]
    pub json: bool,
    /// With --verify: the largest relative RMS error accepted, instead of the format's limit (q8 0.02, q4 0.2, rvq3 0.3, rvq4p 0.35, rvq2 0.5).
    #[arg(long, requires = "verify")]
    pub max_error: Option<f64>,
}

pub fn convert(a: ConvertArgs) -> Result<()> {
    let experts = match &a.experts {
        Some(name) => ExpertsAs::parse(name)
            .ok_or_else(|| usage(format!("--experts {name:?}: expected f32, q8, q4, rvq3, rvq2, rvq4p or gguf")))?,
        None => ExpertsAs::default_for(&a.src),
    };
    let trunk = match &a.trunk {
        Some(name) => {
            TrunkAs::parse(name).ok_or_else(|| usage(format!("--trunk {name:?}: expected f32, q8, q4 or gguf")))?
        }
        None => TrunkAs::default_for(&a.src),
    };
    if a.verify && a.reclaim {
        return Err(usage("--verify reads the source checkpoint, which --reclaim deletes; run them separately"));
    }
    if let Some(m) = a.max_error.filter(|m| !(m.is_finite() && *m >= 0.0)) {
        return Err(usage(format!("--max-error {m}: expected a finite number at least 0")));
    }
    if a.verify && a.follow {
        return Err(usage("--verify reads the whole source, which --follow does not wait to have; run it separately"));
    }
    let opts = ConvertOptions {
        experts,
        trunk,
        jobs: a.jobs as usize,
        reclaim: a.reclaim,
        follow: a.follow.then(|| std::time::Duration::from_secs(a.follow_timeout)),
        ..ConvertOptions::default()
    };
    let started = Instant::now();
    let mut bar: Option<indicatif::ProgressBar> = None;
    let report = waste_host::convert(&a.src, &a.out, &opts, &mut |p| {
        let bar = bar.get_or_insert_with(|| output::progress_bar(p.total));
        bar.set_position(p.done);
        bar.set_message(p.what.clone());
    })
    .with_context(|| format!("converting {}", a.src.display()))?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    eprintln!(
        "wrote {} in {:.1} s: trunk {:.2} MB ({}), experts {:.2} MB ({}, {} layers, {} bytes per record)",
        a.out.display(),
        started.elapsed().as_secs_f64(),
        report.trunk_bytes as f64 / 1e6,
        trunk.name(),
        report.expert_bytes as f64 / 1e6,
        experts.name(),
        report.moe_layers,
        report.expert_record_bytes
    );
    for s in &report.skipped {
        eprintln!("not converted: {s}");
    }
    if let Some(source) = report.bundled_template {
        eprintln!("chat template: the release ships none; the container carries {source}");
    }
    if report.trunk_reused || !report.reused_banks.is_empty() {
        let layers: Vec<String> = report.reused_banks.iter().map(|l| l.to_string()).collect();
        eprintln!(
            "resumed: reused {}{} finished bank(s) (layers {})",
            if report.trunk_reused { "the trunk and " } else { "" },
            layers.len(),
            layers.join(",")
        );
    }
    for shard in &report.reclaimed_shards {
        eprintln!("reclaimed {}", shard.display());
    }
    if a.verify {
        crate::cmd_convert_verify::verify(&a.src, &a.out, a.json, a.max_error)?;
    }
    Ok(())
}
