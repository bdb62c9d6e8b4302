//! The streaming engine: expert store, cache, readers, lookahead, budget,
//! learned hotlist, trace replay. Synthetic containers stand in for models
//! too large to ship.

use std::path::PathBuf;

use waste_engine::paths::plan_path;
use waste_engine::plan::PlanRequest;
use waste_engine::store::io::fd_is_direct;
use waste_engine::store::trace::read_route_trace;
use waste_engine::store::{simulate, CachePolicy, StoreOptions};
use waste_engine::synth::{preset, synth};
use waste_host::{Model, OpenOptions};

use crate::common::{greedy_next, report_skip, stderr, stdout, waste, with_store, TempDir};

fn synthetic(dir: &TempDir, shape: &str) -> PathBuf {
    let out = dir.path().join(format!("{shape}.waste"));
    let spec = preset(shape).expect("preset");
    synth(&out, &spec, &mut |_, _| {}).expect("synth");
    out
}

fn options(budget: u64) -> OpenOptions {
    OpenOptions { context: Some(64), budget: Some(budget), preload: false, ..OpenOptions::default() }
}

/// Greedy decode: every step's logits, bit for bit.
fn decode(model: &Model, prompt: &[u32], steps: usize) -> (Vec<u32>, Vec<Vec<u32>>) {
    let mut state = model.new_state();
    let (mut logits, _) = model.forward(&mut state, prompt, false).expect("prefill");
    let mut tokens = Vec::new();
    let mut all = vec![logits.iter().map(|v| v.to_bits()).collect::<Vec<_>>()];
    for _ in 0..steps {
        let next = greedy_next(&logits);
        tokens.push(next);
        logits = model.forward(&mut state, &[next], false).expect("decode").0;
        all.push(logits.iter().map(|v| v.to_bits()).collect());
    }
    (tokens, all)
}

#[test]
fn cache_readers_read_ahead_and_lookahead_are_bit_identical_to_the_plain_path() {
    let dir = TempDir::new("stream-ident");
    let path = synthetic(&dir, "olmoe-trace");
    let plan = plan_path(&path, &PlanRequest { context: Some(64), ..PlanRequest::default() }).unwrap();
    // A cache of 1.5 working sets: records are evicted all the time, yet
    // some survive (below one working set nothing would).
    let small = plan.floor + plan.working_set * 3 / 2;
    let plain = with_store(options(plan.floor), |s| {
        s.keep = false;
        s.readers = 0;
        s.read_ahead = false;
        s.lookahead = 0;
    });
    let prompt = [3, 17, 42, 5, 99];
    let (want_tokens, want_logits) = decode(&Model::open(&path, &plain).unwrap(), &prompt, 10);
    let variants: Vec<(&str, OpenOptions)> = vec![
        ("cache, 2 readers, read-ahead", options(small)),
        ("cache, synchronous reads", with_store(options(small), |s| s.readers = 0)),
        ("cache, no read-ahead", with_store(options(small), |s| s.read_ahead = false)),
        ("cache, 1 reader", with_store(options(small), |s| s.readers = 1)),
        ("no cache, 2 readers", with_store(options(small), |s| s.keep = false)),
        ("lru", with_store(options(small), |s| s.policy = CachePolicy::Lru)),
        ("lookahead 6", with_store(options(small), |s| s.lookahead = 6)),
        (
            "lookahead 6, three layers ahead",
            with_store(options(small), |s| {
                s.lookahead = 6;
                s.lookahead_layers = 3;
            }),
        ),
        ("lookahead 8, big cache", with_store(options(plan.floor + 3 * plan.working_set), |s| s.lookahead = 8)),
    ];
    for (name, opts) in variants {
        let model = Model::open(&path, &opts).unwrap();
        let (tokens, logits) = decode(&model, &prompt, 10);
        assert_eq!(tokens, want_tokens, "{name}: tokens differ");
        assert!(logits == want_logits, "{name}: logits differ bitwise");
        let s = model.store_stats();
        // Lookahead (on by default) runs only with a cache and readers.
        if opts.store.lookahead > 0 && opts.store.keep && opts.store.readers > 0 {
            assert!(s.prefetch_issued > 0, "{name}: lookahead issued no reads");
        }
        // A lookahead into a cache this small may evict every record
        // before its reuse.
        if opts.store.keep && !name.starts_with("lookahead 6") {
            assert!(s.picks.reused > 0 && s.picks.missed > 0, "{name}: cache unused ({s:?})");
        }
    }
}

#[test]
fn direct_io_is_on_for_a_container_on_this_machine() {
    let dir = TempDir::new("stream-direct");
    let fs = std::process::Command::new("stat").args(["-f", "-c", "%T"]).arg(dir.path()).output();
    let fs = fs.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default();
    if fs == "tmpfs" {
        report_skip(&format!("SKIP direct_io_is_on: {} is tmpfs, which refuses O_DIRECT", dir.path().display()));
        return;
    }
    let path = synthetic(&dir, "olmoe-trace");
    let plan = plan_path(&path, &PlanRequest { context: Some(64), ..PlanRequest::default() }).unwrap();
    let model = Model::open(&path, &options(plan.floor)).unwrap();
    assert!(model.store_stats().direct_io, "direct I/O fell back on {fs}");
    let mut n = 0;
    for f in model.expert_store().bank_files() {
        assert!(fd_is_direct(f), "a bank descriptor lacks O_DIRECT");
        n += 1;
    }
    assert_eq!(n, 16);
    let buffered = Model::open(&path, &with_store(options(plan.floor), |s| s.direct_io = false)).unwrap();
    assert!(!buffered.store_stats().direct_io);
    assert!(buffered.expert_store().bank_files().all(|f| !fd_is_direct(f)));
}

#[test]
fn budget_under_the_floor_is_refused_naming_the_floor_and_waste_plan() {
    let dir = TempDir::new("stream-floor");
    let path = synthetic(&dir, "olmoe-trace");
    let p = path.to_str().unwrap();
    let o = waste(&["bench", p, "--budget", "1M", "--tokens", "1", "--ctx", "64"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("floor of") && e.contains("waste plan"), "{e}");
    assert_eq!(e.trim().lines().count(), 1, "one line: {e}");
    let o = waste(&["eval", p, "--tokens", "1,2", "--budget", "1M", "--ctx", "64"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

#[test]
fn planned_equals_used_after_open() {
    let dir = TempDir::new("stream-plan");
    let path = synthetic(&dir, "olmoe-trace");
    for budget in [None, Some(4_000_000), Some(6_500_000)] {
        let plan = plan_path(&path, &PlanRequest { context: Some(64), budget, ..PlanRequest::default() }).unwrap();
        let model = Model::open(&path, &OpenOptions { context: Some(64), budget, ..OpenOptions::default() }).unwrap();
        assert_eq!(model.memory_plan(), &plan);
        assert_eq!(model.memory_used().total(), plan.total(), "budget {budget:?}");
        assert!(plan.total() <= plan.budget);
    }
    let o = waste(&["plan", path.to_str().unwrap(), "--budget", "4M", "--ctx", "64", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(
        v["total"].as_u64(),
        Some(
            plan_path(&path, &PlanRequest { context: Some(64), budget: Some(4_000_000), ..PlanRequest::default() })
                .unwrap()
                .total()
        )
    );
}

/// Runtime memory outside the budget: the binary, thread stacks, the
/// allocator's slack, and the trunk's file mapping (read once at open).
const RSS_OVERHEAD: u64 = 24 << 20;

#[test]
fn peak_rss_stays_under_budget_plus_overhead_on_a_container_six_times_larger() {
    let dir = TempDir::new("stream-rss");
    let path = synthetic(&dir, "small");
    let budget: u64 = 48_000_000;
    let size: u64 = std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum();
    assert!(size > 6 * budget, "container {size} bytes");
    let o = waste(&["bench", path.to_str().unwrap(), "--budget", "48M", "--tokens", "24", "--ctx", "256", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let peak = v["peak_rss"].as_u64().expect("VmHWM reported");
    println!("peak RSS {peak} with budget {budget} (+{} MB)", (peak as i64 - budget as i64) / 1_000_000);
    assert!(v["missed"].as_u64().unwrap() > v["cache_slots"].as_u64().unwrap(), "every slot was filled");
    assert!(peak <= budget + RSS_OVERHEAD, "peak RSS {peak} > budget {budget} + {RSS_OVERHEAD}");
}

/// Regression: the trunk file was memory-mapped and its tensors copied out,
/// so every trunk byte was resident twice (the copy, counted by the planner,
/// and the mapped page cache, not counted): peak RSS 2.44 GB under a 1.3 GB
/// budget on the Kimi-Linear-shaped container. The small container above
/// hides it (its trunk is ~1 MB); here the trunk is a 164 MB f32 LM head.
#[test]
fn peak_rss_counts_the_trunk_once() {
    let dir = TempDir::new("stream-rss-trunk");
    let path = dir.path().join("big-head.waste");
    let mut spec = preset("small").expect("preset");
    spec.hidden = 256;
    spec.vocab = 160_000;
    spec.trunk = waste_engine::quant::TrunkFormat::F32;
    synth(&path, &spec, &mut |_, _| {}).expect("synth");
    let plan = plan_path(&path, &PlanRequest { context: Some(64), ..PlanRequest::default() }).unwrap();
    assert!(plan.trunk > 150_000_000, "trunk {} bytes", plan.trunk);
    let budget = plan.floor + plan.working_set;
    let o = waste(&[
        "bench",
        path.to_str().unwrap(),
        "--budget",
        &budget.to_string(),
        "--tokens",
        "4",
        "--ctx",
        "64",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let peak = v["peak_rss"].as_u64().expect("VmHWM reported");
    println!("peak RSS {peak} with budget {budget}, trunk {}", plan.trunk);
    assert!(
        peak <= budget + RSS_OVERHEAD,
        "peak RSS {peak} > budget {budget} + {RSS_OVERHEAD} (trunk {} bytes)",
        plan.trunk
    );
}

/// A real routing trace, committed under tests/fixtures/traces/ (a
/// missing one fails the test: it is part of the repository).
fn committed_trace(name: &str) -> PathBuf {
    let p = crate::common::fixtures().join("traces").join(name);
    assert!(p.is_file(), "routing trace {} is missing from the repository", p.display());
    p
}

#[test]
fn second_run_after_learn_has_fewer_misses() {
    let trace = committed_trace("trace_olmoe_299.jsonl");
    let dir = TempDir::new("stream-learn");
    let path = synthetic(&dir, "olmoe-trace");
    let plan = plan_path(&path, &PlanRequest { context: Some(64), ..PlanRequest::default() }).unwrap();
    let budget = (plan.floor + 2 * plan.working_set).to_string();
    let run = || {
        let o = waste(&[
            "bench",
            path.to_str().unwrap(),
            "--budget",
            &budget,
            "--ctx",
            "64",
            "--tokens",
            "60",
            "--route-trace",
            trace.to_str().unwrap(),
            "--learn",
            "--json",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_str::<serde_json::Value>(&stdout(&o)).unwrap()
    };
    let first = run();
    assert!(path.join("usage.json").is_file());
    let second = run();
    assert!(second["preloaded"].as_u64().unwrap() > 0);
    let (m1, m2) = (first["missed"].as_u64().unwrap(), second["missed"].as_u64().unwrap());
    println!("misses {m1} -> {m2} after --learn");
    assert!(m2 < m1, "misses {m1} -> {m2}");
}

#[test]
fn trace_simulator_agrees_with_the_engine_cache_on_the_shared_traces() {
    for (file, shape) in [("trace_olmoe_299.jsonl", "olmoe-trace"), ("trace_kimi_linear_300.jsonl", "kimi-trace")] {
        let trace_path = committed_trace(file);
        let trace = read_route_trace(&trace_path).unwrap();
        let dir = TempDir::new("stream-sim");
        let path = synthetic(&dir, shape);
        let plan = plan_path(&path, &PlanRequest { context: Some(64), ..PlanRequest::default() }).unwrap();
        for (policy, sets) in [(CachePolicy::Frequency, 1), (CachePolicy::Lru, 1), (CachePolicy::Frequency, 3)] {
            let budget = plan.floor + sets * plan.working_set;
            let model = Model::open(&path, &with_store(options(budget), |s| s.policy = policy)).unwrap();
            for step in &trace.steps {
                model.replay_routing(step).unwrap();
            }
            let s = model.store_stats();
            let layers: Vec<u32> = model.expert_store().banks().moe_layers().iter().map(|&l| l as u32).collect();
            let sim = simulate(&trace.steps, &layers, s.cache_slots, policy, StoreOptions::default().seed);
            println!(
                "{file} {policy:?} {} slots: engine {}/{} sim {}/{}",
                s.cache_slots, s.picks.reused, s.picks.missed, sim.hits, sim.misses
            );
            // A replay runs no lookahead: every pick is reused or read.
            assert_eq!(
                (s.picks.reused, s.picks.prefetched, s.picks.missed),
                (sim.hits, 0, sim.misses),
                "{file} {policy:?}"
            );
            assert!(s.picks.reused > 0);
        }
    }
}
