//! `waste synth --like kimi-linear-48b`: the real Kimi-Linear trunk (KDA +
//! MLA) with random weights, fewer experts per layer on request; and the
//! bench options the all-cached decode figures use (`--threads 1,2`,
//! `--warmup`).

use crate::common::{stderr, stdout, waste, TempDir};

fn json_of(args: &[&str]) -> serde_json::Value {
    let o = waste(args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    serde_json::from_str(&stdout(&o)).unwrap_or_else(|e| panic!("{args:?}: {e}: {}", stdout(&o)))
}

/// Manifest only at full size (sparse files): `info` reports the released
/// model's layer pattern and expert count; `--num-experts` changes only the
/// count.
#[test]
fn synth_like_kimi_linear_has_the_real_trunk_and_expert_count_option() {
    let tmp = TempDir::new("synth-like-kl");
    let full = tmp.path().join("full.waste");
    let f = full.to_str().unwrap();
    let o = waste(&["synth", f, "--like", "kimi-linear-48b", "--manifest-only"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let i = json_of(&["info", f, "--json"]);
    assert_eq!(i["family"], "kimi_linear");
    let text = stdout(&waste(&["info", f]));
    assert!(text.contains("256 per MoE layer, top-8"), "{text}");
    assert!(text.contains("KDA/dense KDA/MoE KDA/MoE MLA/MoE"), "{text}");

    let few = tmp.path().join("few.waste");
    let o =
        waste(&["synth", few.to_str().unwrap(), "--like", "kimi-linear-48b", "--num-experts", "16", "--manifest-only"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&waste(&["info", few.to_str().unwrap()]));
    assert!(text.contains("16 per MoE layer, top-8"), "{text}");

    // Usage errors: no experts, --num-experts without --like.
    let bad = tmp.path().join("bad.waste");
    let o = waste(&["synth", bad.to_str().unwrap(), "--like", "kimi-linear-48b", "--num-experts", "0"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = waste(&["synth", bad.to_str().unwrap(), "--num-experts", "16"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(!bad.exists());
}

/// `--threads 1,2` runs both in one process, one row each; with the same
/// warm-up and tokens the expert uses (hits + misses) are the same at both
/// thread counts, and the warm-up leaves its reads out of the measured row.
#[test]
fn bench_runs_thread_counts_side_by_side_after_a_warmup() {
    let tmp = TempDir::new("bench-threads");
    let out = tmp.path().join("o.waste");
    let o = waste(&["synth", out.to_str().unwrap(), "--shape", "olmoe-trace"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let m = out.to_str().unwrap();
    let args = |warmup: &'static str| {
        vec![
            "bench",
            m,
            "--tokens",
            "3",
            "--ctx",
            "32",
            "--threads",
            "1,2",
            "--warmup",
            warmup,
            "--no-preload",
            "--json",
        ]
    };
    let rows = json_of(&args("4"));
    let rows = rows.as_array().expect("one row per thread count");
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["threads"], 1);
    assert_eq!(rows[1]["threads"], 2);
    let uses = |r: &serde_json::Value| r["hits"].as_u64().unwrap() + r["misses"].as_u64().unwrap();
    assert_eq!(uses(&rows[0]), uses(&rows[1]));
    assert_eq!(rows[0]["hits"], rows[1]["hits"]);
    // 3 measured tokens x 16 layers x top-8, whatever the warm-up.
    assert_eq!(uses(&rows[0]), 3 * 16 * 8);
    let cold = json_of(&args("0"));
    let warm_misses = rows[0]["misses"].as_u64().unwrap();
    assert!(
        warm_misses < cold[0]["misses"].as_u64().unwrap(),
        "warm-up did not fill the cache: {warm_misses} misses vs {}",
        cold[0]["misses"]
    );
    let o = waste(&["bench", m, "--threads", "0", "--tokens", "1"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}
