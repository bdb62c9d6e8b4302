//! `waste plan`, `waste bench`, `waste synth`: the streaming engine's
//! memory planner, benchmark and synthetic-container generator.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use waste_host::plan::{fmt_bytes, parse_size, BudgetSource, MemoryPlan};
use waste_host::store::trace::read_route_trace;
use waste_host::store::CachePolicy;
use waste_host::synth::{preset, LikeOptions, LIKE, PRESETS};
use waste_host::{Model, OpenOptions};

use crate::commands::usage;

/// `--budget SIZE` parsed: `1.5G`, `800M`, `2GiB`, bytes.
pub fn budget_arg(s: &Option<String>) -> Result<Option<u64>> {
    match s {
        None => Ok(None),
        Some(t) => parse_size(t)
            .map(Some)
            .ok_or_else(|| usage(format!("--budget {t:?}: expected a size such as 1.5G, 800M or 2GiB"))),
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

#[derive(Args)]
pub struct PlanArgs {
    /// Container directory.
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
    let p = waste_host::plan::plan_path_for_ram(&a.model, a.ctx, budget, ram)
        .with_context(|| format!("planning {}", a.model.display()))?;
    if a.json {
        let source = match p.budget_source {
            BudgetSource::Given => json!("given"),
            BudgetSource::Auto { working_sets } => json!({"auto_working_sets": working_sets}),
        };
        println!(
            "{}",
            json!({
                "context": p.context, "trunk": p.trunk, "embedding_on_disk": p.embedding_on_disk, "state": p.state, "scratch": p.scratch,
                "record_bytes": p.record_bytes, "top_k": p.top_k, "moe_layers": p.moe_layers,
                "min_cache": p.min_cache, "floor": p.floor, "working_set": p.working_set,
                "recommended": p.recommended, "all_experts": p.all_experts, "usable_ram": p.usable_ram,
                "budget": p.budget, "budget_source": source, "cache_slots": p.cache_slots,
                "cache_bytes": p.cache_bytes, "total": p.total(),
            })
        );
    } else {
        say_budget(&p);
        println!("context        {} tokens", p.context);
        if p.embedding_on_disk > 0 {
            println!("trunk          {} resident (+ {} embedding table on disk)", fmt_bytes(p.trunk), fmt_bytes(p.embedding_on_disk));
        } else {
            println!("trunk          {}", fmt_bytes(p.trunk));
        }
        println!("state          {}", fmt_bytes(p.state));
        println!("scratch        {}", fmt_bytes(p.scratch));
        println!(
            "min cache      {} (top-{} x {} record x 2)",
            fmt_bytes(p.min_cache),
            p.top_k,
            fmt_bytes(p.record_bytes)
        );
        println!("floor          {}", fmt_bytes(p.floor));
        println!(
            "working set    {} (one token, {} MoE layers)",
            fmt_bytes(p.working_set),
            p.moe_layers
        );
        println!("recommended    {} (floor + 3 working sets)", fmt_bytes(p.recommended));
        println!("all experts    {}", fmt_bytes(p.all_experts));
        println!("usable RAM     {}", fmt_bytes(p.usable_ram));
        println!(
            "budget         {} -> cache {} ({} records)",
            fmt_bytes(p.budget),
            fmt_bytes(p.cache_bytes),
            p.cache_slots
        );
    }
    Ok(())
}

#[derive(Args)]
pub struct SynthArgs {
    /// Output container directory (must not exist).
    pub out: PathBuf,
    /// Shape: kimi-linear-48b, olmoe-trace, kimi-trace or small.
    #[arg(long, default_value = "kimi-linear-48b", conflicts_with = "like")]
    pub shape: String,
    /// A real model's config and layout instead of a shape: kimi-linear-48b
    /// (its real KDA + MLA trunk, random weights) or kimi-k3 (needs
    /// --manifest-only).
    #[arg(long)]
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
    spec.format = waste_host::quant::ExpertFormat::parse(&a.experts)
        .ok_or_else(|| usage(format!("--experts {:?}: expected rvq3, rvq4p, rvq2, q8 or q4", a.experts)))?;
    spec.seed = a.seed;
    let started = Instant::now();
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let r = waste_host::synth::synth(&a.out, &spec, &mut |done, total| {
        if tty {
            eprint!("\r{done}/{total}");
        }
    })?;
    eprintln!(
        "\rwrote {} in {:.1} s: trunk {}, experts {} ({} MoE layers x {} experts, {} bytes per record)",
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
    if !LIKE.contains(&like) {
        bail!(usage(format!("--like {like:?}: expected one of {}", LIKE.join(", "))));
    }
    if like == "kimi-k3" && !a.manifest_only {
        bail!(usage(format!("--like {like} writes a manifest-only container (its experts are terabytes): pass --manifest-only")));
    }
    let experts = waste_host::quant::ExpertFormat::parse(&a.experts)
        .ok_or_else(|| usage(format!("--experts {:?}: expected rvq3, rvq4p, rvq2, q8 or q4", a.experts)))?;
    let trunk = waste_host::quant::TrunkFormat::parse(&a.trunk)
        .ok_or_else(|| usage(format!("--trunk {:?}: expected q4, q8 or f32", a.trunk)))?;
    if a.num_experts == Some(0) {
        bail!(usage("--num-experts must be at least 1"));
    }
    let options = LikeOptions { experts, trunk, seed: a.seed, num_experts: a.num_experts, manifest_only: a.manifest_only };
    let started = Instant::now();
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let r = waste_host::synth::synth_like(&a.out, like, &options, &mut |done, total| {
        if tty {
            eprint!("\r{done}/{total}");
        }
    })?;
    let how = if a.manifest_only { "manifest only, sparse files" } else { "random weights" };
    eprintln!(
        "\rwrote {} ({how}) in {:.1} s: trunk {}, experts {} ({} MoE layers, {} bytes per record)",
        a.out.display(),
        started.elapsed().as_secs_f64(),
        fmt_bytes(r.trunk_bytes),
        fmt_bytes(r.expert_bytes),
        r.moe_layers,
        r.record_bytes
    );
    Ok(())
}

#[derive(Args)]
pub struct BenchArgs {
    /// Container directory.
    pub model: PathBuf,
    /// RAM budget (e.g. 2G); default: chosen by the planner.
    #[arg(long)]
    pub budget: Option<String>,
    /// Several budgets, one run each in this process: 1.5G,2G,4G.
    #[arg(long, value_delimiter = ',', conflicts_with = "budget")]
    pub sweep: Option<Vec<String>>,
    /// Decode steps to run.
    #[arg(long, default_value_t = 32)]
    pub tokens: usize,
    /// Replay recorded routing (JSONL) instead of running the model.
    #[arg(long)]
    pub route_trace: Option<PathBuf>,
    /// Tokens of context (default: 512, or the model's maximum if smaller).
    #[arg(long)]
    pub ctx: Option<usize>,
    #[arg(long, default_value_t = 2)]
    pub readers: usize,
    /// Eviction policy: lru (default) or frequency.
    #[arg(long, default_value = "lru")]
    pub policy: String,
    /// Router lookahead: experts of the next layer read speculatively (0 =
    /// off). Several values (`0,6`) run side by side, each budget once per
    /// value, in this process. Default: the engine's (6; 0 with
    /// --route-trace).
    #[arg(long, value_delimiter = ',')]
    pub lookahead: Option<Vec<usize>>,
    /// Time one prefill of this many tokens instead of `--tokens` decode
    /// steps (0 = decode).
    #[arg(long, default_value_t = 0)]
    pub prefill: usize,
    /// Prefill chunk sizes (1 = token at a time); several (`1,64`) run side
    /// by side in this process. Default: the engine's.
    #[arg(long, value_delimiter = ',')]
    pub chunk: Option<Vec<usize>>,
    /// Read every use (no cache).
    #[arg(long)]
    pub no_cache: bool,
    /// Read each record only when it is needed (no read-ahead).
    #[arg(long)]
    pub no_read_ahead: bool,
    /// Read through the page cache.
    #[arg(long)]
    pub buffered: bool,
    /// Also measure raw random-read bandwidth of records: this many reads.
    #[arg(long, default_value_t = 0)]
    pub raw_reads: usize,
    /// Save expert-use counts to the container's usage file afterwards.
    #[arg(long)]
    pub learn: bool,
    /// Ignore the container's usage file.
    #[arg(long)]
    pub no_preload: bool,
    /// Compute threads; several values (`1,2`) run side by side, each
    /// budget and lookahead once per value, in this process. Default: one
    /// per CPU.
    #[arg(long, value_delimiter = ',')]
    pub threads: Option<Vec<usize>>,
    /// Decode steps run (on their own state) after open and before the
    /// measured ones, to fill the cache; not counted.
    #[arg(long, default_value_t = 0)]
    pub warmup: usize,
    #[arg(long)]
    pub json: bool,
}

pub fn bench(a: BenchArgs) -> Result<()> {
    let policy = CachePolicy::parse(&a.policy)
        .ok_or_else(|| usage(format!("--policy {:?}: expected frequency or lru", a.policy)))?;
    let budgets: Vec<Option<u64>> = match &a.sweep {
        Some(list) => list
            .iter()
            .map(|s| budget_arg(&Some(s.clone())))
            .collect::<Result<_>>()?,
        None => vec![budget_arg(&a.budget)?],
    };
    if a.route_trace.is_some() && a.lookahead.as_ref().is_some_and(|l| l.iter().any(|&n| n > 0)) {
        // Replay feeds recorded routing to the store: no router runs, so
        // there is nothing to look ahead with.
        bail!(usage("--lookahead needs the model's own routing; it does nothing with --route-trace"));
    }
    let trace = match &a.route_trace {
        Some(p) => Some(read_route_trace(p)?),
        None => None,
    };
    if a.tokens == 0 {
        bail!(usage("--tokens must be at least 1"));
    }
    // Regression: a fixed default of 512 refused models with a shorter context.
    let ctx = match a.ctx {
        Some(n) => n,
        None => waste_host::container::Container::open(&a.model)
            .with_context(|| format!("opening {}", a.model.display()))?
            .config()
            .max_position_embeddings
            .min(512),
    };
    // Replay runs no router, so the default lookahead would do nothing
    // there but appear in the rows.
    let lookaheads = match (&a.lookahead, &trace) {
        (Some(l), _) => l.clone(),
        (None, Some(_)) => vec![0],
        (None, None) => vec![OpenOptions::default().lookahead],
    };
    if a.threads.as_ref().is_some_and(|t| t.contains(&0)) {
        bail!(usage("--threads must be at least 1"));
    }
    let threads: Vec<Option<usize>> = match &a.threads {
        Some(t) => t.iter().map(|&n| Some(n)).collect(),
        None => vec![None],
    };
    let chunks = a.chunk.clone().unwrap_or_else(|| vec![OpenOptions::default().prefill_chunk]);
    if let Some(&bad) = chunks.iter().find(|&&c| waste_host::model::prefill::check_chunk(c).is_err()) {
        bail!(usage(format!("--chunk {bad}: expected 1 to {}", waste_host::model::prefill::MAX_PREFILL_CHUNK)));
    }
    let mut runs: Vec<(Option<u64>, usize, Option<usize>, usize)> = Vec::new();
    for &b in &budgets {
        for &l in &lookaheads {
            for &t in &threads {
                runs.extend(chunks.iter().map(|&c| (b, l, t, c)));
            }
        }
    }
    let mut rows = Vec::new();
    for (run, (budget, lookahead, threads, chunk)) in runs.into_iter().enumerate() {
        let options = OpenOptions {
            context: Some(ctx),
            budget,
            cache: !a.no_cache,
            cache_policy: policy,
            readers: a.readers,
            read_ahead: !a.no_read_ahead,
            direct_io: !a.buffered,
            lookahead,
            preload: !a.no_preload,
            threads,
            cpus: None,
            prefill_chunk: chunk,
        };
        let model = crate::render::open_model(&a.model, &options)
            .with_context(|| format!("opening {}", a.model.display()))?;
        say_budget(model.memory_plan());
        // Raw bandwidth with the store's own buffers, and with 4 KiB-page and
        // huge-page buffers side by side (alternating which goes first). Each
        // probe reads records no earlier probe of this process read, so no
        // cache below the guest flatters a later one.
        let (mut raw, mut raw_4k, mut raw_huge) = (None, None, None);
        if a.raw_reads > 0 {
            let store = model.expert_store();
            let seed = 42 + 3 * run as u64;
            let (bytes, secs) = store.measure_random_reads(a.raw_reads, a.readers.max(1), seed)?;
            raw = Some(bytes as f64 / secs / 1e9);
            let order = if run % 2 == 0 { [false, true] } else { [true, false] };
            for (i, huge) in order.into_iter().enumerate() {
                let (bytes, secs) =
                    store.measure_random_reads_with(a.raw_reads, a.readers.max(1), seed + 1 + i as u64, huge)?;
                *(if huge { &mut raw_huge } else { &mut raw_4k }) = Some(bytes as f64 / secs / 1e9);
            }
        }
        let preloaded = model.store_stats().preloaded;
        warm_up(&model, trace.as_ref(), a.warmup.min(ctx))?;
        model.reset_store_stats();
        let cpu_before = waste_host::stats::cpu_times(false);
        let started = Instant::now();
        let mut embedding_rows_read = 0u64;
        let steps = match &trace {
            Some(t) => {
                for i in 0..a.tokens {
                    model.replay_routing(&t.steps[i % t.steps.len()])?;
                }
                a.tokens
            }
            None => {
                let mut state = model.new_state();
                let vocab = model.info().vocab_size as u64;
                let mut rng = 0x2545_F491_4F6C_DD1Du64;
                let n = if a.prefill > 0 { 0 } else { a.tokens.min(ctx) };
                if a.prefill > 0 {
                    let prompt: Vec<u32> = (0..a.prefill.min(ctx))
                        .map(|_| {
                            rng ^= rng << 13;
                            rng ^= rng >> 7;
                            rng ^= rng << 17;
                            (rng % vocab) as u32
                        })
                        .collect();
                    let (_, step) = model.forward(&mut state, &prompt, false)?;
                    embedding_rows_read += step.embedding_rows_read as u64;
                }
                for _ in 0..n {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let (_, step) = model.forward(&mut state, &[(rng % vocab) as u32], false)?;
                    embedding_rows_read += step.embedding_rows_read as u64;
                }
                if a.prefill > 0 { a.prefill.min(ctx) } else { n }
            }
        };
        let secs = started.elapsed().as_secs_f64();
        let cpu = cpu_times_since(cpu_before);
        let s = model.store_stats();
        let useful_gb = s.useful_bytes() as f64 / 1e9;
        let ratio = |gb_per_s: f64| raw.map(|r| gb_per_s / r);
        if a.learn {
            model.save_usage()?;
        }
        let plan = model.memory_plan();
        let used = model.memory_used();
        let mut row = json!({
            "budget": plan.budget, "cache_slots": plan.cache_slots, "cache_bytes": plan.cache_bytes,
            "planned_total": plan.total(), "used_total": used.total(), "floor": plan.floor,
            "working_set": plan.working_set, "tokens": steps, "seconds": secs,
            "tok_per_s": steps as f64 / secs, "hits": s.hits, "misses": s.misses, "hit_rate": s.hit_rate(),
            "gb_read": s.bytes_read as f64 / 1e9, "gb_per_token": s.bytes_read as f64 / 1e9 / steps as f64,
            "achieved_gb_per_s": s.bytes_read as f64 / 1e9 / secs, "io_wait_s": s.io_wait.as_secs_f64(),
            "read_time_s": s.read_time.as_secs_f64(), "direct_io": s.direct_io, "policy": policy.name(),
            "readers": a.readers, "lookahead": lookahead, "threads": threads, "warmup": a.warmup, "embedding_rows_read": embedding_rows_read, "prefetch_issued": s.prefetch_issued,
            "prefetch_used": s.prefetch_used, "preloaded": preloaded, "raw_random_read_gb_per_s": raw,
            "record_bytes": s.record_bytes, "replay": trace.is_some(),
            "prefill": a.prefill, "chunk": chunk, "reads": s.reads,
            "peak_rss": waste_host::plan::peak_rss(),
        });
        // Speculative reads never used inflate `gb_read`: `useful_*` counts
        // only records a forward pass consumed.
        let more = json!({
            "raw_random_read_4k_gb_per_s": raw_4k, "raw_random_read_huge_gb_per_s": raw_huge,
            "huge_pages": s.huge_pages, "useful_gb_read": useful_gb, "useful_gb_per_s": useful_gb / secs,
            "achieved_over_raw": ratio(s.bytes_read as f64 / 1e9 / secs), "useful_over_raw": ratio(useful_gb / secs),
            "reader_sys_s": s.reader_sys_time.as_secs_f64(), "process_user_s": cpu.map(|c| c.0),
            "process_sys_s": cpu.map(|c| c.1),
        });
        if let (Some(row), serde_json::Value::Object(more)) = (row.as_object_mut(), more) {
            row.extend(more);
        }
        rows.push(row);
    }
    if a.json {
        let out = if rows.len() == 1 { rows.remove(0) } else { json!(rows) };
        println!("{out}");
    } else {
        for r in &rows {
            let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
            let raw = r["raw_random_read_gb_per_s"]
                .as_f64()
                .map(|v| format!(", raw random read {v:.2} GB/s"))
                .unwrap_or_default();
            println!(
                "budget {}, lookahead {}, threads {}: {:.2} tok/s, hit {:.1}% ({} hit / {} miss), {:.3} GB read, {:.3} GB/token, {:.2} GB/s achieved ({:.2} GB/s useful){raw}, direct_io {}",
                fmt_bytes(f("budget") as u64),
                r["lookahead"],
                r["threads"],
                f("tok_per_s"),
                100.0 * f("hit_rate"),
                r["hits"],
                r["misses"],
                f("gb_read"),
                f("gb_per_token"),
                f("achieved_gb_per_s"),
                f("useful_gb_per_s"),
                r["direct_io"]
            );
        }
    }
    Ok(())
}

/// Process (user, system) CPU seconds since `before` was taken.
fn cpu_times_since(before: Option<(std::time::Duration, std::time::Duration)>) -> Option<(f64, f64)> {
    let (b, n) = (before?, waste_host::stats::cpu_times(false)?);
    Some(((n.0.saturating_sub(b.0)).as_secs_f64(), (n.1.saturating_sub(b.1)).as_secs_f64()))
}

/// Runs `steps` decode steps (replayed routing with a trace, else random
/// tokens on a state of their own, from a seed other than the measured
/// run's) so the measured steps start with the cache filled.
fn warm_up(model: &Model, trace: Option<&waste_host::store::trace::RouteTrace>, steps: usize) -> Result<()> {
    if steps == 0 {
        return Ok(());
    }
    if let Some(t) = trace {
        for i in 0..steps {
            model.replay_routing(&t.steps[i % t.steps.len()])?;
        }
        return Ok(());
    }
    let mut state = model.new_state();
    let vocab = model.info().vocab_size as u64;
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..steps {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        model.forward(&mut state, &[(rng % vocab) as u32], false)?;
    }
    Ok(())
}
