//! `waste synth`: synthetic containers of real models' shapes.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;

use waste_host::fmt_bytes;
use waste_host::{like_names, preset, LikeOptions, PRESETS};

use crate::errors::usage;
use crate::output;

#[derive(Args)]
pub struct SynthArgs {
    /// Output container directory (must not exist).
    pub out: PathBuf,
    /// Shape: kimi-linear-48b, olmoe-trace, kimi-trace or small.
    #[arg(long, default_value = "kimi-linear-48b", conflicts_with = "like")]
    pub shape: String,
    /// A real model's config and layout instead of a shape, random weights
    /// (kimi-k3 needs --manifest-only).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(like_names()))]
    pub like: Option<String>,
    /// Write the manifest and sparse files only (for `plan` and `info`;
    /// the container cannot run).
    #[arg(long)]
    pub manifest_only: bool,
    /// With --like: routed experts per MoE layer instead of the model's
    /// (top-k and all shapes stay, so per-token compute is the model's;
    /// fewer experts fit in RAM).
    #[arg(long, requires = "like")]
    pub num_experts: Option<usize>,
    /// Expert format: rvq3, rvq4p, rvq2, q8 or q4.
    #[arg(long, default_value = "rvq3")]
    pub experts: String,
    /// Trunk format of --like: q4, q8 or f32.
    #[arg(long, default_value = "q4")]
    pub trunk: String,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

pub fn synth(a: SynthArgs) -> Result<()> {
    if let Some(like) = &a.like {
        return synth_like(&a, like);
    }
    if a.manifest_only {
        bail!(usage("--manifest-only goes with --like"));
    }
    let mut spec = preset(&a.shape)
        .ok_or_else(|| usage(format!("--shape {:?}: expected one of {}", a.shape, PRESETS.join(", "))))?;
    spec.format = waste_host::ExpertFormat::parse(&a.experts)
        .ok_or_else(|| usage(format!("--experts {:?}: expected rvq3, rvq4p, rvq2, q8 or q4", a.experts)))?;
    spec.seed = a.seed;
    let started = Instant::now();
    let mut bar: Option<indicatif::ProgressBar> = None;
    let r = waste_host::synth(&a.out, &spec, &mut |done, total| {
        bar.get_or_insert_with(|| output::progress_bar(total)).set_position(done);
    })?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    eprintln!(
        "wrote {} in {:.1} s: trunk {}, experts {} ({} MoE layers x {} experts, {} bytes per record)",
        a.out.display(),
        started.elapsed().as_secs_f64(),
        fmt_bytes(r.trunk_bytes),
        fmt_bytes(r.expert_bytes),
        r.moe_layers,
        spec.experts,
        r.record_bytes
    );
    Ok(())
}

fn synth_like(a: &SynthArgs, like: &str) -> Result<()> {
    let Some(release) = waste_host::release_like(like) else {
        let names: Vec<&str> = like_names().collect();
        bail!(usage(format!("--like {like:?}: expected one of {}", names.join(", "))));
    };
    if release.manifest_only && !a.manifest_only {
        bail!(usage(format!(
            "--like {like} writes a manifest-only container (its experts are terabytes): pass --manifest-only"
        )));
    }
    let experts = waste_host::ExpertFormat::parse(&a.experts)
        .ok_or_else(|| usage(format!("--experts {:?}: expected rvq3, rvq4p, rvq2, q8 or q4", a.experts)))?;
    let trunk = waste_host::TrunkFormat::parse(&a.trunk)
        .ok_or_else(|| usage(format!("--trunk {:?}: expected q4, q8 or f32", a.trunk)))?;
    if a.num_experts == Some(0) {
        bail!(usage("--num-experts must be at least 1"));
    }
    let options =
        LikeOptions { experts, trunk, seed: a.seed, num_experts: a.num_experts, manifest_only: a.manifest_only };
    let started = Instant::now();
    let mut bar: Option<indicatif::ProgressBar> = None;
    let r = waste_host::synth_like(&a.out, like, &options, &mut |done, total| {
        bar.get_or_insert_with(|| output::progress_bar(total)).set_position(done);
    })?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let how = if a.manifest_only { "manifest only, sparse files" } else { "random weights" };
    eprintln!(
        "wrote {} ({how}) in {:.1} s: trunk {}, experts {} ({} MoE layers, {} bytes per record)",
        a.out.display(),
        started.elapsed().as_secs_f64(),
        fmt_bytes(r.trunk_bytes),
        fmt_bytes(r.expert_bytes),
        r.moe_layers,
        r.record_bytes
    );
    Ok(())
}
