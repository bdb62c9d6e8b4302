//! Option parsing, `--json` and error paths of every command, on the shipped
//! bible-moe container (no conversion needed).

use std::path::PathBuf;

use crate::common::*;

fn model() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/bible-moe.waste").to_string_lossy().into_owned()
}

fn fails_cleanly(args: &[&str], code: i32, needle: &str) {
    let o = waste(args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
    assert!(err.to_lowercase().contains(&needle.to_lowercase()), "{args:?}: stderr lacks {needle:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
}

fn json_of(args: &[&str]) -> serde_json::Value {
    let o = waste(args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    serde_json::from_str(stdout(&o).trim()).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {}", stdout(&o)))
}

#[test]
fn every_reporting_command_speaks_json() {
    let m = model();
    let m = m.as_str();
    assert!(json_of(&["version", "--json"])["version"].is_string());
    assert!(json_of(&["info", m, "--json"])["vocab_size"].as_u64().unwrap() > 0);
    assert!(json_of(&["plan", m, "--json"])["budget"].as_u64().unwrap() > 0);
    assert!(!json_of(&["tokenize", m, "In the beginning", "--json"])["tokens"].as_array().unwrap().is_empty());
    assert_eq!(json_of(&["eval", m, "--tokens", "5,6,7", "--json", "--top", "3"])["top"].as_array().unwrap().len(), 3);
    assert_eq!(json_of(&["detokenize", m, "5", "6", "--json"])["tokens"], serde_json::json!([5, 6]));
    let bench = waste(&["bench", m, "--tokens", "4", "--ctx", "128", "--json"]);
    assert!(bench.status.success(), "{}", stderr(&bench));
    let last = stdout(&bench).lines().last().unwrap_or_default().to_string();
    serde_json::from_str::<serde_json::Value>(&last)
        .unwrap_or_else(|e| panic!("bench --json: {e}: {}", stdout(&bench)));
}

/// `bench --depth N` measures N positions into the context: the rows say
/// so, each KV cache type asked for runs, and a depth the context cannot
/// hold (or replayed routing, which keeps no context) is a usage error.
#[test]
fn bench_depth_measures_into_the_context_and_refuses_what_cannot_fit() {
    let m = model();
    let o = waste(&["bench", &m, "--tokens", "3", "--ctx", "128", "--depth", "100", "--kv-type", "f32,q8", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .flat_map(|v| v.as_array().cloned().unwrap_or_else(|| vec![v]))
        .collect();
    let runs: Vec<&serde_json::Value> = rows.iter().filter(|r| r["tok_per_s"].is_number()).collect();
    assert_eq!(runs.len(), 2, "{}", stdout(&o));
    for (r, kv) in runs.iter().zip(["f32", "q8"]) {
        assert_eq!((r["depth"].as_u64(), r["tokens"].as_u64(), r["kv_type"].as_str()), (Some(100), Some(3), Some(kv)));
    }
    fails_cleanly(&["bench", &m, "--ctx", "128", "--depth", "128"], 2, "--depth 128");
}

#[test]
fn sizes_accept_suffixes_and_reject_nonsense() {
    let m = model();
    assert_eq!(json_of(&["plan", &m, "--budget", "1.5G", "--json"])["budget"], 1_500_000_000u64);
    assert_eq!(json_of(&["plan", &m, "--budget", "512M", "--json"])["budget"], 512_000_000u64);
    assert_eq!(json_of(&["plan", &m, "--budget", "4G", "--json"])["budget"], 4_000_000_000u64);
    fails_cleanly(&["plan", &m, "--budget", "lots"], 2, "--budget");
    fails_cleanly(&["run", &m, "hi", "--budget", "-1G"], 2, "");
}

#[test]
fn positionals_are_collected_wherever_they_stand() {
    let m = model();
    let before = waste(&["tokenize", "--json", &m, "In the beginning"]);
    let after = waste(&["tokenize", &m, "In the beginning", "--json"]);
    assert!(before.status.success(), "{}", stderr(&before));
    assert_eq!(stdout(&before), stdout(&after));
    let run = waste(&["run", "-n", "3", "--temp", "0", &m, "In the beginning"]);
    assert!(run.status.success(), "{}", stderr(&run));
}

#[test]
fn an_unexpected_positional_is_a_usage_error() {
    let m = model();
    fails_cleanly(&["info", &m, "extra"], 2, "unexpected argument");
    fails_cleanly(&["version", "extra"], 2, "unexpected argument");
    fails_cleanly(&["run", &m, "hi", "again"], 2, "unexpected argument");
}

#[test]
fn a_value_that_looks_like_an_option_is_a_missing_value() {
    let m = model();
    fails_cleanly(&["plan", &m, "--budget", "--json"], 2, "value is required");
    fails_cleanly(&["run", &m, "hi", "--seed", "--temp"], 2, "value is required");
    fails_cleanly(&["run", &m, "hi", "--file", "--json"], 2, "");
    fails_cleanly(&["chat", &m, "--system", "--temp"], 2, "value is required");
}

#[test]
fn numeric_options_are_range_checked() {
    let m = model();
    fails_cleanly(&["run", &m, "hi", "-n", "0"], 2, "--tokens");
    fails_cleanly(&["run", &m, "hi", "--threads", "0"], 2, "--threads");
    fails_cleanly(&["run", &m, "hi", "--seed", "-3"], 2, "-3");
    fails_cleanly(&["run", &m, "hi", "--top-p", "1.5"], 2, "top-p");
    fails_cleanly(&["run", &m, "hi", "--cpus", "zz"], 2, "--cpus");
    fails_cleanly(&["eval", &m, "--tokens", "1,x"], 2, "");
}

#[test]
fn tokenize_and_eval_read_the_text_from_file_argument_or_stdin() {
    let m = model();
    let tmp = TempDir::new("cli-more-file");
    let file = tmp.path().join("t.txt");
    std::fs::write(&file, "In the beginning").unwrap();
    let f = file.to_str().unwrap();
    let direct = stdout(&waste(&["tokenize", &m, "In the beginning", "--json"]));
    assert_eq!(stdout(&waste(&["tokenize", &m, "--file", f, "--json"])), direct);
    assert_eq!(stdout(&waste_with_stdin(&["tokenize", &m, "--json"], Some("In the beginning"))), direct);
    assert_eq!(stdout(&waste_with_stdin(&["tokenize", &m, "-", "--json"], Some("In the beginning"))), direct);
    let e_direct = stdout(&waste(&["eval", &m, "In the beginning", "--json"]));
    assert_eq!(stdout(&waste(&["eval", &m, "--file", f, "--json"])), e_direct);
    assert_eq!(stdout(&waste_with_stdin(&["eval", &m, "--json"], Some("In the beginning"))), e_direct);
    fails_cleanly(&["eval", &m, "--file", f, "--tokens", "1"], 2, "cannot be used with");
    fails_cleanly(&["tokenize", &m, "x", "--file", f], 2, "cannot be used with");
    fails_cleanly(&["tokenize", &m, "--file", "/nonexistent/t.txt"], 1, "/nonexistent/t.txt");
    fails_cleanly(&["eval", &m], 2, "no prompt");
}

#[test]
fn runtime_errors_are_one_line_with_exit_1() {
    for args in [
        &["info", "/nonexistent/m.waste"][..],
        &["plan", "/nonexistent/m.waste"],
        &["run", "/nonexistent/m.waste", "hi"],
        &["chat", "/nonexistent/m.waste"],
        &["eval", "/nonexistent/m.waste", "--tokens", "1"],
        &["tokenize", "/nonexistent/m.waste", "hi"],
        &["detokenize", "/nonexistent/m.waste", "1"],
        &["bench", "/nonexistent/m.waste"],
    ] {
        let o = waste(args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.starts_with("error: ") && err.contains("/nonexistent/m.waste"), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
}

/// Regression: `bench` defaulted to a 512-token context and so refused every
/// model whose maximum is shorter (bible-moe's is 256).
#[test]
fn bench_default_context_fits_a_model_with_a_short_context() {
    let m = model();
    let o = waste(&["bench", &m, "--tokens", "2", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// `waste run --route-log` writes the trace `waste bench --route-trace`
/// replays: one line per decode step, every MoE layer's top-k, sorted.
#[test]
fn run_route_log_is_a_trace_that_bench_replays() {
    let tmp = TempDir::new("route-log");
    let container = convert("qwen3_moe", "q8", "q8", tmp.path());
    let (c, log) = (container.to_str().unwrap(), tmp.path().join("routes.jsonl"));
    let o = waste(&["run", c, "Hello there", "-n", "6", "--temp", "0", "--route-log", log.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&log).unwrap();
    let steps: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    // The first token comes from the prompt's prefill; each later one is a decode step.
    assert_eq!(steps.len(), 5, "{text}");
    // tiny-qwen3_moe: layer 0 dense, 3 MoE layers of 8 experts, top-2.
    for (i, s) in steps.iter().enumerate() {
        assert_eq!(s["tok"], i);
        let layers = s["layers"].as_array().unwrap();
        assert_eq!(layers.len(), 3, "{s}");
        for l in layers {
            let ids: Vec<u64> = l.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
            assert!(ids.len() == 2 && ids[0] < ids[1] && ids[1] < 8, "{s}");
        }
    }
    let o = waste(&["bench", c, "--route-trace", log.to_str().unwrap(), "--tokens", "5", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// `waste bench --repeat N` runs each configuration N times round by round
/// and summarises them: median inside [min, max], one entry per configuration.
#[test]
fn bench_repeat_reports_the_median_and_spread_of_its_rounds() {
    let tmp = TempDir::new("bench-repeat");
    let container = convert("qwen3_moe", "q8", "q8", tmp.path());
    let c = container.to_str().unwrap();
    let j = json_of(&["bench", c, "--tokens", "4", "--repeat", "3", "--threads", "1,2", "--raw-reads", "8", "--json"]);
    let (rows, summary) = (j["rows"].as_array().unwrap(), j["summary"].as_array().unwrap());
    assert_eq!(rows.len(), 6);
    assert_eq!(rows.iter().map(|r| r["round"].as_u64().unwrap()).collect::<Vec<_>>(), [0, 0, 1, 1, 2, 2]);
    assert_eq!(summary.len(), 2);
    for (m, threads) in summary.iter().zip([1, 2]) {
        assert_eq!((m["rounds"].as_u64(), m["threads"].as_u64()), (Some(3), Some(threads)), "{m}");
        let f = |k: &str| m[k].as_f64().unwrap();
        assert!(f("tok_per_s_min") <= f("tok_per_s_median") && f("tok_per_s_median") <= f("tok_per_s_max"), "{m}");
        assert_eq!(m["raw_gb_per_s"].as_array().unwrap().len(), 3, "{m}");
    }
}
