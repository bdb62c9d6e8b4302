//! A GGUF file run in place (`waste run model.gguf`): no conversion, the
//! experts streamed from the file's own expert tensors. It must be the
//! model its conversion as stored (`waste convert model.gguf out.waste`)
//! is, bit for bit: the same bytes reach the same kernels, only where they
//! are read from differs.

use std::path::Path;

use waste_host::{Engine, Model, OpenOptions};

use crate::common::*;
use crate::gguf::{convert_gguf, gguf_dir, models, u32s};

/// Logits at every position of the fixture's prompt, and its greedy
/// continuation.
fn logits_and_greedy(engine: &Engine, model: &Path, prompt: &[u32]) -> (Vec<f32>, Vec<u32>) {
    let mut session = engine.session(Model::open(model, &exact()).unwrap()).unwrap();
    let (logits, _) = session.eval(prompt, true).unwrap();
    session.reset();
    let out = session.generate(prompt, &crate::oracle::greedy(), |_| true).unwrap();
    (logits, out.tokens)
}

fn open(model: &Path) -> std::sync::Arc<Model> {
    Model::open(model, &OpenOptions::default()).unwrap()
}

fn differing_bits(a: &[f32], b: &[f32]) -> usize {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count()
}

/// Every GGUF fixture (each family's llama.cpp conversion, K-quants, all
/// nine IQ file types): the file run in place gives the logits of its
/// conversion as stored, every bit at every position, and the same greedy
/// tokens; gpt-oss too, whose expert biases are tensors of their own that
/// a record's payload ends with.
#[test]
fn a_gguf_file_run_in_place_gives_the_bits_of_its_conversion_as_stored() {
    let tmp = TempDir::new("gguf-in-place");
    let engine = Engine::new().unwrap();
    let mut run = 0;
    let all = models();
    assert!(all.iter().any(|m| m["file"].as_str().unwrap().contains("gpt_oss")));
    for m in &all {
        let file = gguf_dir().join(m["file"].as_str().unwrap());
        let prompt = u32s(&m["prompt_ids"]);
        let container = convert_gguf(&file, "gguf", "gguf", tmp.path());
        let (want, want_tokens) = logits_and_greedy(&engine, &container, &prompt);
        let (got, got_tokens) = logits_and_greedy(&engine, &file, &prompt);
        let differ = differing_bits(&want, &got);
        assert_eq!(differ, 0, "{}: {differ} of {} logits differ from the conversion's", file.display(), want.len());
        assert_eq!(got_tokens, want_tokens, "{}: greedy continuation", file.display());
        assert_eq!(got_tokens, u32s(&m["greedy_ids"]), "{}: transformers' greedy continuation", file.display());
        // The budget counts what stays in RAM: in place, gpt-oss's expert
        // biases (a container's records carry them).
        let (kept, converted) = (open(&file), open(&container));
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(container.join("manifest.json")).unwrap()).unwrap();
        let e = &manifest["experts"];
        let biases = match e["biases"].as_bool() == Some(true) {
            true => {
                let per_expert = (2 * e["inter"].as_u64().unwrap() + e["hidden"].as_u64().unwrap()) * 4;
                kept.info().moe_layers as u64 * kept.info().num_experts as u64 * per_expert
            }
            false => 0,
        };
        assert_eq!(biases > 0, m["file"].as_str().unwrap().contains("gpt_oss"), "{}", file.display());
        assert_eq!(kept.memory_used().trunk, converted.memory_used().trunk + biases, "{}", file.display());
        assert_eq!(kept.memory_used().total(), kept.memory_plan().total(), "{}", file.display());
        run += 1;
    }
    assert_eq!(run, all.len());
}

/// A split file run in place from its first part: its unsplit twin's bits.
#[test]
fn a_split_gguf_run_in_place_equals_its_unsplit_twin() {
    let m = models().into_iter().find(|m| m["file"] == "models/wide-qwen3moe-q4_k_m.gguf").unwrap();
    let prompt = u32s(&m["prompt_ids"]);
    let engine = Engine::new().unwrap();
    let (whole, _) = logits_and_greedy(&engine, &gguf_dir().join("models/wide-qwen3moe-q4_k_m.gguf"), &prompt);
    let split = gguf_dir().join("split/wide-qwen3moe-q4_k_m-00001-of-00003.gguf");
    let (parts, _) = logits_and_greedy(&engine, &split, &prompt);
    let differ = differing_bits(&whole, &parts);
    assert_eq!(differ, 0, "{differ} of {} logits differ between the split file and its twin", whole.len());
}

/// The command line takes a GGUF file wherever it takes a container:
/// `run` generates, `info` describes it as its conversion would be, and
/// what a GGUF file cannot do (`--verify`: it has no checksums; a later
/// part of a split file) fails with one line saying what to do.
#[test]
fn waste_runs_a_gguf_file_in_place_from_the_command_line() {
    let tmp = TempDir::new("gguf-in-place-cli");
    let file = gguf_dir().join("models/wide-qwen3moe-q4_k_m.gguf");
    let f = file.to_str().unwrap();
    let o = waste(&["run", f, "hello", "-n", "6", "--ignore-eos", "--temp", "0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!o.stdout.is_empty(), "no text generated");

    let info = |model: &str| -> serde_json::Value {
        let o = waste(&["info", model, "--json"]);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let container = convert_gguf(&file, "gguf", "gguf", tmp.path());
    let (in_place, converted) = (info(f), info(container.to_str().unwrap()));
    for key in ["trunk_types", "expert_types", "trunk_bytes", "total_params", "active_params"] {
        assert_eq!(in_place[key], converted[key], "info {key}");
    }

    let o = waste(&["run", f, "hello", "-n", "2", "--verify"]);
    let err = stderr(&o);
    assert!(!o.status.success() && err.trim().lines().count() == 1, "{err}");
    assert!(err.contains("no checksums"), "{err}");

    let part2 = gguf_dir().join("split/wide-qwen3moe-q4_k_m-00002-of-00003.gguf");
    let o = waste(&["run", part2.to_str().unwrap(), "hello", "-n", "2"]);
    let err = stderr(&o);
    assert!(!o.status.success() && err.trim().lines().count() == 1, "{err}");
    assert!(err.contains("open the first part"), "{err}");
}

/// The memory plan counts a chunk's int16 inputs (2.25 bytes a value)
/// where a GGUF holds Q4_K or Q6_K matrices, and q4's int8 (1.06)
/// elsewhere, so such a GGUF's prefill stays inside the budget without
/// shrinking other models' chunks.
#[test]
fn the_plan_counts_int16_inputs_only_for_a_gguf_with_q4_k_or_q6_k() {
    use waste_engine::paths::open_container;
    use waste_engine::plan::ChunkInputs;
    let inputs = |file: &str| ChunkInputs::of(open_container(&gguf_dir().join(file)).unwrap().manifest());
    assert_eq!(inputs("models/wide-qwen3moe-q4_k_m.gguf"), ChunkInputs::Int16);
    // Its only int16 type is the Q6_K tied embedding.
    assert_eq!(inputs("models/wide-qwen3moe-iq4_nl.gguf"), ChunkInputs::Int16);
    assert_eq!(inputs("models/tiny-qwen3_moe-q8_0.gguf"), ChunkInputs::Int8);
}

/// `waste plan --threads N` plans what opening with `--threads N` does: a
/// GGUF's scratch grows with the threads by their kernel buffers (which
/// the plan once left out), and no thread at all is a usage error.
#[test]
fn waste_plan_counts_the_threads_it_is_given_for_a_gguf() {
    let file = gguf_dir().join("models/wide-qwen3moe-q4_k_m.gguf");
    let file = file.to_str().unwrap();
    let scratch = |threads: &str| {
        let o = waste(&["plan", file, "--budget", "1G", "--threads", threads, "--json"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let plan: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
        plan["scratch"].as_u64().unwrap()
    };
    let (one, three) = (scratch("1"), scratch("3"));
    assert!(three > one, "scratch {one} at 1 thread, {three} at 3");
    let o = waste(&["plan", file, "--threads", "0"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--threads"), "{}", stderr(&o));
}
