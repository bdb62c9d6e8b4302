//! The compute pool through the API and the CLI: logits bit-identical for
//! any thread count, `--threads` / `--cpus` parsing and errors, and the
//! `rvq4p` expert format end to end against transformers.

use waste_engine::pool::CpuSet;
use waste_engine::quant::{ExpertFormat, TrunkFormat};
use waste_engine::synth::{synth, SynthSpec};
use waste_host::{Engine, Model, OpenOptions};

use crate::common::*;

fn logits(container: &std::path::Path, threads: usize, tokens: &[u32]) -> Vec<u32> {
    let options = OpenOptions { threads: Some(threads), ..OpenOptions::default() };
    let model = Model::open(container, &options).unwrap();
    assert_eq!(model.pool().threads(), threads);
    let engine = Engine::new().unwrap();
    let mut session = engine.session(model).unwrap();
    let (logits, _) = session.eval(tokens, true).unwrap();
    logits.iter().map(|v| v.to_bits()).collect()
}

/// The tiny fixtures, every family, the stored formats whose kernels differ.
#[test]
fn fixture_logits_do_not_depend_on_thread_count() {
    let tmp = TempDir::new("threads-fixture");
    for family in SAMPLED_FAMILIES {
        let reference = reference(family);
        for (experts, trunk) in [("rvq3", "q4"), ("rvq4p", "q8"), ("f32", "f32")] {
            let container = convert(family, experts, trunk, tmp.path());
            let one = logits(&container, 1, &reference.prompt_ids);
            for threads in [2, 3] {
                assert!(
                    logits(&container, threads, &reference.prompt_ids) == one,
                    "{family} {experts}/{trunk}: logits differ between 1 and {threads} threads"
                );
            }
        }
    }
}

/// The tiny fixtures are below the size at which the kernels split rows
/// across threads; this synthetic container (256 x 256 matrices) is above
/// it, so the split itself is what is compared.
#[test]
fn large_matrix_logits_do_not_depend_on_thread_count() {
    let tmp = TempDir::new("threads-synth");
    let spec = SynthSpec {
        hidden: 256,
        inter: 256,
        experts: 8,
        top_k: 2,
        layers: 2,
        dense_layers: 0,
        dense_inter: 256,
        heads: 4,
        kv_heads: 2,
        head_dim: 64,
        vocab: 1024,
        max_context: 64,
        format: ExpertFormat::Rvq3,
        trunk: TrunkFormat::Q4,
        seed: 7,
    };
    let out = tmp.path().join("synth.waste");
    synth(&out, &spec, &mut |_, _| {}).unwrap();
    let tokens = [1u32, 5, 9, 200, 17];
    let one = logits(&out, 1, &tokens);
    assert!(one.iter().any(|&b| f32::from_bits(b).is_finite() && f32::from_bits(b) != 0.0));
    assert!(logits(&out, 2, &tokens) == one, "logits differ between 1 and 2 threads");
}

/// Measured on the fixtures (random weights, the worst case for
/// quantisation): see the table this prints. rvq4p sits with rvq3.
#[test]
fn rvq4p_containers_stay_within_stated_error() {
    let tmp = TempDir::new("rvq4p");
    let mut table = String::new();
    for family in SAMPLED_FAMILIES {
        let reference = reference(family);
        let container = convert(family, "rvq4p", "q4", tmp.path());
        let model = Model::open(&container, &OpenOptions::default()).unwrap();
        assert_eq!(model.info().expert_format, "rvq4p");
        let engine = Engine::new().unwrap();
        let mut session = engine.session(model).unwrap();
        let (got, _) = session.eval(&reference.prompt_ids, true).unwrap();
        let v = reference.vocab;
        let (mut worst, mut agree) = (0f32, 0usize);
        let positions = reference.logits.len() / v;
        for p in 0..positions {
            let (g, r) = (&got[p * v..(p + 1) * v], &reference.logits[p * v..(p + 1) * v]);
            let scale = r.iter().fold(0f32, |m, x| m.max(x.abs()));
            let diff = g.iter().zip(r).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            worst = worst.max(diff / scale);
            let am = |x: &[f32]| (0..v).max_by(|&i, &j| x[i].total_cmp(&x[j])).unwrap();
            agree += usize::from(am(g) == am(r));
        }
        let top1 = agree as f32 / positions as f32;
        table.push_str(&format!("{family:<10} rvq4p/q4  max rel err {worst:.4}  top-1 {top1:.3}\n"));
        // The rvq3/q4 bounds of oracle.rs: a broken layout or kernel gives
        // errors of order 1 and top-1 near 1/vocab.
        assert!(worst <= 0.6 && top1 >= 0.4, "{family}: {worst} {top1}");
    }
    eprintln!("{table}");
}

#[test]
fn cpu_lists_are_checked() {
    assert_eq!(CpuSet::parse("0-2,6-8").unwrap().cpus(), &[0, 1, 2, 6, 7, 8]);
    assert!(CpuSet::parse("2-1").is_err());
    let tmp = TempDir::new("threads-cli");
    let m = convert("qwen3_moe", "rvq4p", "q8", tmp.path());
    let m = m.to_str().unwrap();
    for (args, what) in [
        (vec!["eval", m, "--tokens", "1,2", "--cpus", "1-0"], "runs backwards"),
        (vec!["eval", m, "--tokens", "1,2", "--cpus", "0,,1"], "not a CPU number"),
        (vec!["run", m, "hi", "--cpus", "x"], "not a CPU number"),
        (vec!["eval", m, "--tokens", "1,2", "--threads", "0"], "--threads"),
    ] {
        let o = waste(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(err.contains(what), "{args:?}: {err}");
    }
    // Bound to the first CPU this process may use, one and two threads:
    // the same logits file.
    let first = first_allowed_cpu();
    let a = tmp.path().join("a.f32");
    let b = tmp.path().join("b.f32");
    for (path, threads) in [(&a, "1"), (&b, "2")] {
        let mut args = vec!["eval", m, "--tokens", "1,2,3", "--threads", threads, "--logits", path.to_str().unwrap()];
        let cpus = first.to_string();
        if cfg!(target_os = "linux") {
            args.extend(["--cpus", &cpus]);
        }
        let o = waste(&args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    }
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
}

#[cfg(target_os = "linux")]
fn first_allowed_cpu() -> usize {
    waste_engine::pool::current_affinity().unwrap().cpus()[0]
}

#[cfg(not(target_os = "linux"))]
fn first_allowed_cpu() -> usize {
    0
}
