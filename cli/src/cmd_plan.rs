//! `waste plan`: the memory plan of a model.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;
use waste_host::{fmt_bytes, parse_size, BudgetSource, PlanRequest};

use crate::errors::usage;
use crate::open::{budget_arg, say_budget};
use crate::output::outln;

#[derive(Args)]
pub struct PlanArgs {
    /// Container directory, or GGUF file (run in place).
    pub model: PathBuf,
    /// RAM budget (e.g. 2G, 800M); without it the planner picks one.
    #[arg(long)]
    pub budget: Option<String>,
    /// Tokens of context to plan state for.
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Plan for a machine with this much usable RAM (e.g. 64G) instead of
    /// this one: what the automatic budget would be there.
    #[arg(long)]
    pub ram: Option<String>,
    /// Plan for images too (Kimi K3): the vision tower's weights, its
    /// buffers and the rows of the largest image the processor allows.
    #[arg(long)]
    pub vision: bool,
    /// How the KV cache stores keys and values (f32, bf16, q8); default bf16.
    #[arg(long, value_name = "TYPE")]
    pub kv_type: Option<waste_host::KvType>,
    /// Compute threads to plan for, as `--threads` where the model runs
    /// (each keeps its own kernel buffers); default one per CPU here.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub threads: Option<u32>,
    #[arg(long)]
    pub json: bool,
}

pub fn plan(a: PlanArgs) -> Result<()> {
    let budget = budget_arg(&a.budget)?;
    let ram = match &a.ram {
        None => None,
        Some(t) => Some(
            parse_size(t)
                .filter(|&n| n > 0)
                .ok_or_else(|| usage(format!("--ram {t:?}: expected a size such as 64G or 16GiB")))?,
        ),
    };
    let request = PlanRequest {
        context: a.ctx,
        budget,
        usable_ram: ram,
        kv_type: a.kv_type.unwrap_or_default(),
        threads: a.threads.map(|n| n as usize),
        ..PlanRequest::default()
    };
    let p = waste_host::plan_path_for_images(&a.model, &request, a.vision)
        .with_context(|| format!("planning {}", a.model.display()))?;
    if a.json {
        let source = match p.budget_source {
            BudgetSource::Given => json!("given"),
            BudgetSource::Auto { working_sets } => json!({"auto_working_sets": working_sets}),
        };
        outln!(
            "{}",
            json!({
                "context": p.context, "trunk": p.trunk, "embedding_on_disk": p.embedding_on_disk, "state": p.state, "kv_type": p.kv_type.name(), "scratch": p.scratch, "prefill_chunk": p.prefill_chunk, "vision": p.vision,
                "record_bytes": p.record_bytes, "top_k": p.top_k, "moe_layers": p.moe_layers,
                "min_cache": p.min_cache, "floor": p.floor, "working_set": p.working_set,
                "recommended": p.recommended, "all_experts": p.all_experts, "usable_ram": p.usable_ram,
                "budget": p.budget, "budget_source": source, "cache_slots": p.cache_slots,
                "cache_bytes": p.cache_bytes, "total": p.total(),
            })
        );
    } else {
        say_budget(&p);
        outln!("context        {} tokens", p.context);
        if p.embedding_on_disk > 0 {
            outln!(
                "trunk          {} resident (+ {} embedding table on disk)",
                fmt_bytes(p.trunk),
                fmt_bytes(p.embedding_on_disk)
            );
        } else {
            outln!("trunk          {}", fmt_bytes(p.trunk));
        }
        outln!("state          {} (KV cache {})", fmt_bytes(p.state), p.kv_type);
        outln!("scratch        {} (prefill chunks of {} tokens)", fmt_bytes(p.scratch), p.prefill_chunk);
        if p.vision > 0 {
            outln!("vision tower   {} (weights, buffers and rows of the largest image)", fmt_bytes(p.vision));
        }
        outln!(
            "min cache      {} (top-{} x {} record x 2)",
            fmt_bytes(p.min_cache),
            p.top_k,
            fmt_bytes(p.record_bytes)
        );
        outln!("floor          {}", fmt_bytes(p.floor));
        outln!("working set    {} (one token, {} MoE layers)", fmt_bytes(p.working_set), p.moe_layers);
        outln!("recommended    {} (floor + 3 working sets)", fmt_bytes(p.recommended));
        outln!("all experts    {}", fmt_bytes(p.all_experts));
        outln!("usable RAM     {}", fmt_bytes(p.usable_ram));
        outln!(
            "budget         {} -> cache {} ({} records)",
            fmt_bytes(p.budget),
            fmt_bytes(p.cache_bytes),
            p.cache_slots
        );
    }
    Ok(())
}
