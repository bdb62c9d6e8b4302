//! `waste bench`: decode speed, where expert picks came from, bytes and GB/s read.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use waste_host::fmt_bytes;
use waste_host::read_route_trace;
use waste_host::CachePolicy;
use waste_host::StoreOptions;
use waste_host::{Model, OpenOptions};

use crate::errors::usage;
use crate::open::{budget_arg, say_budget};
use crate::output::outln;

#[derive(Args)]
pub struct BenchArgs {
    /// Container directory, or GGUF file (run in place).
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
    /// Feed this UTF-8 text's tokens (in order, from the start again when
    /// they run out) instead of random ones: routing on real text, which
    /// is what the cache's reuse and the lookahead's recall depend on.
    #[arg(long, conflicts_with = "route_trace")]
    pub text: Option<PathBuf>,
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
    /// How many MoE layers ahead the lookahead guesses, each from the same
    /// input (guesses past the next layer are read only when the disk has
    /// nothing nearer to read). Several values run side by side like
    /// `--lookahead`'s. Default: the engine's.
    #[arg(long, value_delimiter = ',')]
    pub lookahead_layers: Option<Vec<usize>>,
    /// Time one prefill of this many tokens instead of `--tokens` decode
    /// steps (0 = decode).
    #[arg(long, default_value_t = 0)]
    pub prefill: usize,
    /// Measure N positions into the context: an untimed prefill of N random
    /// tokens first (not counted in any figure), then the timed decode
    /// steps or prefill.
    #[arg(long, default_value_t = 0)]
    pub depth: usize,
    /// Prefill chunk sizes (1 = token at a time); several (`1,64,2048`)
    /// run side by side in this process. Default: the memory plan's choice.
    #[arg(long, value_delimiter = ',')]
    pub chunk: Option<Vec<usize>>,
    /// KV cache types (f32, bf16, q8); several (`f32,bf16`) run side by
    /// side in this process. Default: bf16.
    #[arg(long, value_delimiter = ',', value_name = "TYPE")]
    pub kv_type: Option<Vec<waste_host::KvType>>,
    /// Read every use (no cache).
    #[arg(long)]
    pub no_cache: bool,
    /// Read each record only when it is needed (no read-ahead).
    #[arg(long)]
    pub no_read_ahead: bool,
    /// Read through the page cache.
    #[arg(long)]
    pub buffered: bool,
    #[command(flatten)]
    pub verify: crate::open::VerifyArgs,
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
    /// Run every configuration this many times, round by round in this
    /// process (each on a freshly opened model, so each starts cold), and
    /// report the median and spread: the machine is noisy, one run is not a figure.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeat: u32,
    #[arg(long)]
    pub json: bool,
}

/// One configuration of a bench run: budget, lookahead, threads, prefill
/// chunk (`None`: the engine's or the plan's choice) and KV cache type.
/// Budget, (lookahead experts, layers), threads, prefill chunk, KV type.
type RunConfig = (Option<u64>, (usize, usize), Option<usize>, Option<usize>, waste_host::KvType);

pub fn bench(a: BenchArgs) -> Result<()> {
    let policy = CachePolicy::parse(&a.policy)
        .ok_or_else(|| usage(format!("--policy {:?}: expected frequency or lru", a.policy)))?;
    let budgets: Vec<Option<u64>> = match &a.sweep {
        Some(list) => list.iter().map(|s| budget_arg(&Some(s.clone()))).collect::<Result<_>>()?,
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
    let text = match &a.text {
        Some(p) => Some(crate::input::read_text(p, MAX_TEXT_FILE_BYTES, "the text")?),
        None => None,
    };
    // Tokenized once, with the first model opened.
    let mut text_tokens: Option<Vec<u32>> = None;
    if a.tokens == 0 {
        bail!(usage("--tokens must be at least 1"));
    }
    // Regression: a fixed default of 512 refused models with a shorter context.
    let ctx = match a.ctx {
        Some(n) => n,
        None => waste_host::open_container(&a.model)
            .with_context(|| format!("opening {}", a.model.display()))?
            .config()
            .max_position_embeddings
            .min(512),
    };
    if a.depth > 0 && (trace.is_some() || a.depth >= ctx) {
        bail!(usage(format!(
            "--depth {}: needs a context longer than it (--ctx, now {ctx}) and no --route-trace",
            a.depth
        )));
    }
    // Replay runs no router, so the default lookahead would do nothing
    // there but appear in the rows.
    let lookaheads = match (&a.lookahead, &trace) {
        (Some(l), _) => l.clone(),
        (None, Some(_)) => vec![0],
        (None, None) => vec![OpenOptions::default().store.lookahead],
    };
    let depths = a.lookahead_layers.clone().unwrap_or_else(|| vec![OpenOptions::default().store.lookahead_layers]);
    if depths.contains(&0) {
        bail!(usage("--lookahead-layers must be at least 1 (--lookahead 0 turns lookahead off)"));
    }
    let lookaheads: Vec<(usize, usize)> =
        lookaheads.iter().flat_map(|&n| depths.iter().map(move |&d| (n, d))).collect();
    if a.threads.as_ref().is_some_and(|t| t.contains(&0)) {
        bail!(usage("--threads must be at least 1"));
    }
    let threads: Vec<Option<usize>> = match &a.threads {
        Some(t) => t.iter().map(|&n| Some(n)).collect(),
        None => vec![None],
    };
    let chunks: Vec<Option<usize>> = match &a.chunk {
        Some(c) => c.iter().map(|&n| Some(n)).collect(),
        None => vec![OpenOptions::default().prefill_chunk],
    };
    if let Some(bad) = chunks.iter().flatten().find(|&&c| waste_host::check_prefill_chunk(c).is_err()) {
        bail!(usage(format!("--chunk {bad}: expected 1 to {}", waste_host::MAX_PREFILL_CHUNK)));
    }
    let kv_types = a.kv_type.clone().unwrap_or_else(|| vec![OpenOptions::default().kv_type]);
    let mut configs: Vec<RunConfig> = Vec::new();
    for &b in &budgets {
        for &l in &lookaheads {
            for &t in &threads {
                for &c in &chunks {
                    configs.extend(kv_types.iter().map(|&kv| (b, l, t, c, kv)));
                }
            }
        }
    }
    // Round by round, so every configuration sees the machine's moods alike.
    let runs: Vec<_> = (0..a.repeat).flat_map(|_| configs.iter().copied()).collect();
    let mut rows = Vec::new();
    for (run, (budget, (lookahead, lookahead_layers), threads, chunk, kv_type)) in runs.into_iter().enumerate() {
        let options = OpenOptions {
            context: Some(ctx),
            budget,
            store: StoreOptions {
                keep: !a.no_cache,
                policy,
                readers: a.readers,
                read_ahead: !a.no_read_ahead,
                direct_io: !a.buffered,
                lookahead,
                lookahead_layers,
                ..StoreOptions::default()
            },
            preload: !a.no_preload,
            threads,
            cpus: None,
            prefill_chunk: chunk,
            verify: a.verify.level(),
            extra_states: 0,
            kv_type,
        };
        let model =
            crate::render::open_model(&a.model, &options).with_context(|| format!("opening {}", a.model.display()))?;
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
        if let (Some(text), None) = (&text, &text_tokens) {
            let ids = waste_host::Engine::new()?.session(model.clone())?.tokenize(text)?;
            if ids.is_empty() {
                bail!(usage("--text: the file holds no tokens"));
            }
            text_tokens = Some(ids);
        }
        let preloaded = model.store_stats().preloaded;
        warm_up(&model, trace.as_ref(), a.warmup.min(ctx))?;
        // The context so far: `--depth` tokens, evaluated before the clock
        // and the counters start.
        let mut state = model.new_state();
        if a.depth > 0 {
            let mut rng = 0xD1B5_4A32_D192_ED03u64;
            let vocab = model.info().vocab_size as u64;
            let filler: Vec<u32> = (0..a.depth).map(|_| random_token(&mut rng, vocab)).collect();
            model.forward(&mut state, &filler, false)?;
        }
        model.reset_store_stats();
        let cpu_before = waste_host::cpu_times(false);
        let process_read_before = waste_host::process_read_bytes();
        let started = Instant::now();
        let mut embedding_rows_read = 0u64;
        // The chunk the prefill ran: the plan's, or larger on lent cache.
        let mut chunk_run = 0usize;
        let steps = match &trace {
            Some(t) => {
                for i in 0..a.tokens {
                    model.replay_routing(&t.steps[i % t.steps.len()])?;
                }
                a.tokens
            }
            None => {
                let vocab = model.info().vocab_size as u64;
                let mut rng = 0x2545_F491_4F6C_DD1Du64;
                let mut fed = 0usize;
                let mut next_token = || match &text_tokens {
                    Some(ids) => {
                        fed += 1;
                        ids[(fed - 1) % ids.len()]
                    }
                    None => random_token(&mut rng, vocab),
                };
                let room = ctx - a.depth;
                let n = if a.prefill > 0 { 0 } else { a.tokens.min(room) };
                if a.prefill > 0 {
                    let prompt: Vec<u32> = (0..a.prefill.min(room)).map(|_| next_token()).collect();
                    let (_, step) = model.forward(&mut state, &prompt, false)?;
                    embedding_rows_read += step.embedding_rows_read as u64;
                    chunk_run = step.prefill_chunk;
                }
                for _ in 0..n {
                    let (_, step) = model.forward(&mut state, &[next_token()], false)?;
                    embedding_rows_read += step.embedding_rows_read as u64;
                }
                if a.prefill > 0 {
                    a.prefill.min(room)
                } else {
                    n
                }
            }
        };
        let secs = started.elapsed().as_secs_f64();
        let cpu = cpu_times_since(cpu_before);
        // What the kernel fetched for this process: the store's reads plus
        // anything it does not count (trunk pages faulted back, embedding
        // rows read from disk).
        let process_gb_read = process_read_before
            .zip(waste_host::process_read_bytes())
            .map(|(before, now)| now.saturating_sub(before) as f64 / 1e9);
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
            "tok_per_s": steps as f64 / secs,
            "gb_read": s.bytes_read as f64 / 1e9, "gb_per_token": s.bytes_read as f64 / 1e9 / steps as f64,
            "achieved_gb_per_s": s.bytes_read as f64 / 1e9 / secs, "io_wait_s": s.io_wait.as_secs_f64(),
            "read_time_s": s.read_time.as_secs_f64(), "direct_io": s.direct_io, "policy": policy.name(),
            "readers": a.readers, "lookahead": lookahead, "lookahead_layers": lookahead_layers, "threads": model.pool().threads(), "warmup": a.warmup, "embedding_rows_read": embedding_rows_read, "preloaded": preloaded, "raw_random_read_gb_per_s": raw,
            "record_bytes": s.record_bytes, "replay": trace.is_some(),
            "prefill": a.prefill, "depth": a.depth, "chunk": plan.prefill_chunk, "chunk_run": chunk_run, "kv_type": plan.kv_type.name(), "text": a.text.as_ref().map(|p| p.display().to_string()), "reads": s.reads,
            "peak_rss": waste_host::peak_rss(), "round": run / configs.len(),
        });
        // Speculative reads never used inflate `gb_read`: `useful_*` counts
        // only records a forward pass consumed.
        let more = json!({
            "raw_random_read_4k_gb_per_s": raw_4k, "raw_random_read_huge_gb_per_s": raw_huge,
            "huge_pages": s.huge_pages, "useful_gb_read": useful_gb, "useful_gb_per_s": useful_gb / secs,
            "achieved_over_raw": ratio(s.bytes_read as f64 / 1e9 / secs), "useful_over_raw": ratio(useful_gb / secs),
            "reader_sys_s": s.reader_sys_time.as_secs_f64(), "process_user_s": cpu.map(|c| c.0),
            "process_sys_s": cpu.map(|c| c.1),
            "hash_layer_picks": s.hash_picks.total(), "hash_layer_reused": s.hash_picks.reused,
            "process_gb_read": process_gb_read, "disk_idle_ms_per_token": s.disk_idle.as_secs_f64() * 1e3 / steps as f64,
            "disk_idle_between_tokens_ms_per_token": s.disk_idle_before_first_layer.as_secs_f64() * 1e3 / steps as f64,
            "process_gb_per_token": process_gb_read.map(|g| g / steps as f64),
        });
        for extra in [more, s.report_json()] {
            if let (Some(row), serde_json::Value::Object(extra)) = (row.as_object_mut(), extra) {
                row.extend(extra);
            }
        }
        rows.push(row);
    }
    let summary = if a.repeat > 1 { summarise(&rows, configs.len()) } else { Vec::new() };
    if a.json {
        let out = match (rows.len(), a.repeat) {
            (1, _) => rows.remove(0),
            (_, 1) => json!(rows),
            _ => json!({"rows": rows, "summary": summary}),
        };
        outln!("{out}");
    } else {
        for r in &rows {
            let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
            let raw = r["raw_random_read_gb_per_s"]
                .as_f64()
                .map(|v| format!(", raw random read {v:.2} GB/s"))
                .unwrap_or_default();
            let n = |k: &str| r[k].as_u64().unwrap_or(0);
            let picks = waste_host::Picks { reused: n("reused"), prefetched: n("prefetched"), missed: n("missed") };
            let later = r["lookahead_later_recall"]
                .as_f64()
                .map(|v| format!(" (of layers further ahead, {:.0}%)", 100.0 * v))
                .unwrap_or_default();
            let lookahead = r["lookahead_recall"]
                .as_f64()
                .map(|v| {
                    format!(
                        ", lookahead named {:.0}% of its layers' picks{later}, {} reads unused, {} taken back unread",
                        100.0 * v,
                        n("prefetch_wasted"),
                        n("prefetch_withdrawn")
                    )
                })
                .unwrap_or_default();
            let process =
                r["process_gb_read"].as_f64().map(|v| format!(" (the process: {v:.3} GB)")).unwrap_or_default();
            outln!(
                "budget {}, lookahead {}, threads {}, KV cache {}: {:.2} tok/s, experts {picks}{lookahead}, {:.3} GB read{process}, {:.3} GB/token, {:.2} GB/s achieved ({:.2} GB/s useful){raw}, disk idle {:.1} ms/token ({:.1} between tokens), direct_io {}",
                fmt_bytes(f("budget") as u64),
                lookahead_label(r),
                r["threads"],
                r["kv_type"].as_str().unwrap_or("?"),
                f("tok_per_s"),
                f("gb_read"),
                f("gb_per_token"),
                f("achieved_gb_per_s"),
                f("useful_gb_per_s"),
                f("disk_idle_ms_per_token"),
                f("disk_idle_between_tokens_ms_per_token"),
                r["direct_io"]
            );
            // Only a loan runs a chunk larger than the plan's; a smaller
            // one is a prompt shorter than it.
            if r["chunk_run"].as_u64() > r["chunk"].as_u64() {
                outln!(
                    "  prefill chunks of {} tokens on cache the experts lent (the plan's: {})",
                    r["chunk_run"],
                    r["chunk"]
                );
            }
            // DeepSeek-V4's hash layers pick by token id alone: their share
            // of the reuse says how much of it is the table's.
            if let (Some(picks), Some(reused)) = (r["hash_layer_picks"].as_u64(), r["hash_layer_reused"].as_u64()) {
                if picks > 0 {
                    outln!(
                        "  of which hash-routed layers (experts fixed by the token id): {picks} picks, {reused} reused = {:.1}%",
                        100.0 * reused as f64 / picks as f64
                    );
                }
            }
        }
        for m in &summary {
            let f = |k: &str| m[k].as_f64().unwrap_or(f64::NAN);
            outln!(
                "budget {}, lookahead {}, threads {}, KV cache {}: median {:.2} tok/s over {} rounds (min {:.2}, max {:.2}); achieved / raw median {:.2} (min {:.2}, max {:.2})",
                fmt_bytes(f("budget") as u64),
                lookahead_label(m),
                m["threads"],
                m["kv_type"].as_str().unwrap_or("?"),
                f("tok_per_s_median"),
                m["rounds"],
                f("tok_per_s_min"),
                f("tok_per_s_max"),
                f("achieved_over_raw_median"),
                f("achieved_over_raw_min"),
                f("achieved_over_raw_max"),
            );
        }
    }
    Ok(())
}

/// A row's lookahead as the text report names it: `6`, or `6 x 2 layers`.
fn lookahead_label(row: &serde_json::Value) -> String {
    match row["lookahead_layers"].as_u64() {
        Some(layers) if layers > 1 && row["lookahead"].as_u64().unwrap_or(0) > 0 => {
            format!("{} x {layers} layers", row["lookahead"])
        }
        _ => row["lookahead"].to_string(),
    }
}

/// The largest `--text` file taken: far past any context.
const MAX_TEXT_FILE_BYTES: u64 = 64 << 20;

/// Per configuration (rows `i`, `i + configs`, ...): the median, min and max
/// of tok/s and of achieved / raw bandwidth over the rounds.
fn summarise(rows: &[serde_json::Value], configs: usize) -> Vec<serde_json::Value> {
    let stats = |mut v: Vec<f64>| -> (Option<f64>, Option<f64>, Option<f64>) {
        v.retain(|x| x.is_finite());
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return (None, None, None);
        }
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        (Some(median), v.first().copied(), v.last().copied())
    };
    (0..configs)
        .map(|c| {
            let mine: Vec<&serde_json::Value> = rows.iter().skip(c).step_by(configs).collect();
            let of = |k: &str| mine.iter().filter_map(|r| r[k].as_f64()).collect::<Vec<f64>>();
            let (tm, tmin, tmax) = stats(of("tok_per_s"));
            let (rm, rmin, rmax) = stats(of("achieved_over_raw"));
            let first = mine[0];
            json!({
                "budget": first["budget"], "lookahead": first["lookahead"],
                "lookahead_layers": first["lookahead_layers"], "threads": first["threads"],
                "chunk": first["chunk"], "kv_type": first["kv_type"], "rounds": mine.len(),
                "tok_per_s_median": tm, "tok_per_s_min": tmin, "tok_per_s_max": tmax,
                "achieved_over_raw_median": rm, "achieved_over_raw_min": rmin, "achieved_over_raw_max": rmax,
                "raw_gb_per_s": of("raw_random_read_gb_per_s"),
            })
        })
        .collect()
}

/// Process (user, system) CPU seconds since `before` was taken.
fn cpu_times_since(before: Option<(std::time::Duration, std::time::Duration)>) -> Option<(f64, f64)> {
    let (b, n) = (before?, waste_host::cpu_times(false)?);
    Some(((n.0.saturating_sub(b.0)).as_secs_f64(), (n.1.saturating_sub(b.1)).as_secs_f64()))
}

/// Runs `steps` decode steps (replayed routing with a trace, else random
/// tokens on a state of their own, from a seed other than the measured
/// run's) so the measured steps start with the cache filled.
fn warm_up(model: &Model, trace: Option<&waste_host::RouteTrace>, steps: usize) -> Result<()> {
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
        model.forward(&mut state, &[random_token(&mut rng, vocab)], false)?;
    }
    Ok(())
}

/// The next token of a xorshift stream over a vocabulary of `vocab` ids.
fn random_token(rng: &mut u64, vocab: u64) -> u32 {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    (*rng % vocab) as u32
}
