//! The `waste` binary: every command, and every error path the foundation
//! promises (clear message, non-zero exit, no panic).

use std::sync::OnceLock;

use crate::common::*;

/// One default-format container shared by the read-only command tests.
fn shared_container() -> &'static std::path::Path {
    static DIR: OnceLock<(TempDir, std::path::PathBuf)> = OnceLock::new();
    &DIR.get_or_init(|| {
        let tmp = TempDir::new("cli-shared");
        let path = convert("qwen3_moe", "rvq3", "q4", tmp.path());
        (tmp, path)
    })
    .1
}

fn assert_clean_failure(o: &std::process::Output, code: i32, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "exit code; stderr: {err}");
    assert!(err.contains(needle), "stderr lacks {needle:?}: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    assert_eq!(err.trim().lines().count(), 1, "error should be one line: {err}");
}

#[test]
fn run_streams_tokens_and_ends_with_a_stats_line() {
    let m = shared_container().to_str().unwrap();
    let o = waste(&["run", m, "And God said", "-n", "12", "--ignore-eos", "--seed", "3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("[12 tokens,"), "{err}");
    assert!(err.contains("tok/s | experts"), "{err}");
    assert!(err.contains("MB read, direct_io on]") || err.contains("MB read, direct_io off]"), "{err}");
    // Same seed, same text.
    let again = waste(&["run", m, "And God said", "-n", "12", "--ignore-eos", "--seed", "3"]);
    assert_eq!(stdout(&o), stdout(&again));
}

#[test]
fn run_reads_the_prompt_from_stdin_and_files() {
    let m = shared_container().to_str().unwrap();
    let piped = waste_with_stdin(&["run", m, "-n", "4", "--temp", "0"], Some("hello world"));
    let dashed = waste_with_stdin(&["run", m, "-", "-n", "4", "--temp", "0"], Some("hello world"));
    let tmp = TempDir::new("prompt-file");
    let file = tmp.path().join("p.txt");
    std::fs::write(&file, "hello world").unwrap();
    let from_file = waste(&["run", m, "--file", file.to_str().unwrap(), "-n", "4", "--temp", "0"]);
    let direct = waste(&["run", m, "hello world", "-n", "4", "--temp", "0"]);
    for o in [&piped, &dashed, &from_file, &direct] {
        assert!(o.status.success(), "{}", stderr(o));
    }
    assert_eq!(stdout(&piped), stdout(&direct));
    assert_eq!(stdout(&dashed), stdout(&direct));
    assert_eq!(stdout(&from_file), stdout(&direct));
}

#[test]
fn eval_json_and_raw_logits() {
    let m = shared_container().to_str().unwrap();
    let tmp = TempDir::new("eval");
    let last = tmp.path().join("last.f32");
    let all = tmp.path().join("all.f32");
    let o = waste(&["eval", m, "--tokens", "5,6,7", "--json", "--logits", last.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["positions"], 3);
    assert_eq!(v["top"].as_array().unwrap().len(), 10);
    assert_eq!(std::fs::metadata(&last).unwrap().len(), 512 * 4);
    let o = waste(&["eval", m, "--tokens", "5,6,7", "--logits", all.to_str().unwrap(), "--all-positions"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let all_bytes = std::fs::read(&all).unwrap();
    assert_eq!(all_bytes.len(), 3 * 512 * 4);
    // The last row of --all-positions is the --logits of the last position.
    assert_eq!(&all_bytes[2 * 512 * 4..], &std::fs::read(&last).unwrap()[..]);
}

#[test]
fn tokenize_detokenize_round_trip_and_modes() {
    let m = shared_container().to_str().unwrap();
    let text = "Ciao, mondo! <|im_end|> naïve";
    let o = waste(&["tokenize", m, text, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["mode"], "content");
    let ids: Vec<String> = v["tokens"].as_array().unwrap().iter().map(|x| x.to_string()).collect();
    // Content mode never yields the control token (<|im_end|> is id 2).
    assert!(!ids.contains(&"2".to_string()), "{ids:?}");
    let o = waste(&["detokenize", m, &ids.join(",")]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim_end_matches('\n'), text);
    // Neither the model's nor the tokenizer's: one line, nothing printed.
    let o = waste(&["detokenize", m, "999999"]);
    let err = stderr(&o);
    assert!(!o.status.success() && o.stdout.is_empty(), "{err}");
    assert!(err.contains("outside the vocabulary") && err.trim().lines().count() == 1, "{err}");
    let o = waste(&["tokenize", m, text, "--markup", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["mode"], "markup");
    assert!(v["tokens"].as_array().unwrap().contains(&serde_json::json!(2)));
}

#[test]
fn info_and_version() {
    let m = shared_container().to_str().unwrap();
    let o = waste(&["info", m, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["family"], "qwen3_moe");
    assert_eq!(v["experts"], 8);
    assert_eq!(v["top_k"], 2);
    assert_eq!(v["moe_layers"], 3);
    assert_eq!(v["expert_format"], "rvq3");
    assert_eq!(v["expert_record_bytes"].as_u64().unwrap() % 4096, 0);
    let o = waste(&["version", "--json"]);
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["container_format"], 0);
}

#[test]
fn missing_model_is_a_clear_runtime_error() {
    let o = waste(&["info", "/nonexistent/model.waste"]);
    assert_clean_failure(&o, 1, "/nonexistent/model.waste");
}

#[test]
fn a_directory_without_manifest_is_not_a_container() {
    let tmp = TempDir::new("not-container");
    let o = waste(&["info", tmp.path().to_str().unwrap()]);
    assert_clean_failure(&o, 1, "not a waste container");
}

#[test]
fn truncated_expert_bank_names_the_file() {
    let tmp = TempDir::new("truncated");
    let c = convert("olmoe", "q8", "q8", tmp.path());
    let bank = c.join("experts-001.bin");
    let len = std::fs::metadata(&bank).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&bank).unwrap().set_len(len - 4096).unwrap();
    let o = waste(&["run", c.to_str().unwrap(), "hi", "-n", "2"]);
    assert_clean_failure(&o, 1, "experts-001.bin");
}

#[test]
fn foreign_manifest_version_is_rejected() {
    let tmp = TempDir::new("version");
    let c = convert("olmoe", "q8", "q8", tmp.path());
    let mpath = c.join("manifest.json");
    let text = std::fs::read_to_string(&mpath).unwrap().replace("\"format_version\": 0", "\"format_version\": 99");
    std::fs::write(&mpath, text).unwrap();
    let o = waste(&["info", c.to_str().unwrap()]);
    assert_clean_failure(&o, 1, "format version 99");
}

#[test]
fn garbage_manifest_is_rejected() {
    let tmp = TempDir::new("garbage");
    let c = convert("olmoe", "q8", "q8", tmp.path());
    std::fs::write(c.join("manifest.json"), b"{ not json").unwrap();
    let o = waste(&["info", c.to_str().unwrap()]);
    assert_clean_failure(&o, 1, "manifest.json");
}

/// A copy of a fixture whose config.json a test may damage.
fn damaged_checkpoint(tmp: &TempDir, edit: impl FnOnce(&std::path::Path)) -> std::path::PathBuf {
    let src = fixture("olmoe");
    let dst = tmp.path().join("ckpt");
    std::fs::create_dir_all(&dst).unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dst.join(entry.file_name())).unwrap();
    }
    edit(&dst);
    dst
}

#[test]
fn convert_rejects_an_unsupported_model_type() {
    let tmp = TempDir::new("unsupported");
    let ckpt = damaged_checkpoint(&tmp, |d| {
        let cfg = std::fs::read_to_string(d.join("config.json")).unwrap();
        std::fs::write(d.join("config.json"), cfg.replace("\"olmoe\"", "\"llama4_text\"")).unwrap();
    });
    let out = tmp.path().join("out.waste");
    let o = waste(&["convert", ckpt.to_str().unwrap(), out.to_str().unwrap()]);
    assert_clean_failure(&o, 1, "llama4_text");
    assert!(!out.exists(), "a failed conversion must leave nothing behind");
}

#[test]
fn convert_rejects_a_malformed_config() {
    let tmp = TempDir::new("malformed-config");
    let ckpt = damaged_checkpoint(&tmp, |d| std::fs::write(d.join("config.json"), b"{\"model_type\": ").unwrap());
    let out = tmp.path().join("out.waste");
    let o = waste(&["convert", ckpt.to_str().unwrap(), out.to_str().unwrap()]);
    assert_clean_failure(&o, 1, "config.json");
}

#[test]
fn convert_rejects_a_missing_config() {
    let tmp = TempDir::new("missing-config");
    let ckpt = damaged_checkpoint(&tmp, |d| std::fs::remove_file(d.join("config.json")).unwrap());
    let out = tmp.path().join("out.waste");
    let o = waste(&["convert", ckpt.to_str().unwrap(), out.to_str().unwrap()]);
    assert_clean_failure(&o, 1, "config.json");
}

#[test]
fn convert_rejects_a_truncated_safetensors_file() {
    let tmp = TempDir::new("truncated-st");
    let ckpt = damaged_checkpoint(&tmp, |d| {
        let f = d.join("model.safetensors");
        let len = std::fs::metadata(&f).unwrap().len();
        std::fs::OpenOptions::new().write(true).open(&f).unwrap().set_len(len / 2).unwrap();
    });
    let out = tmp.path().join("out.waste");
    let o = waste(&["convert", ckpt.to_str().unwrap(), out.to_str().unwrap()]);
    assert_clean_failure(&o, 1, "model.safetensors");
}

#[test]
fn a_checkpoint_without_tokenizer_converts_and_tokenize_says_why_not() {
    let tmp = TempDir::new("no-tokenizer");
    let ckpt = damaged_checkpoint(&tmp, |d| {
        std::fs::remove_file(d.join("tokenizer.json")).unwrap();
        std::fs::remove_file(d.join("tokenizer_config.json")).unwrap();
    });
    let out = tmp.path().join("out.waste");
    let o = waste(&["convert", ckpt.to_str().unwrap(), out.to_str().unwrap(), "--experts", "q8"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = waste(&["tokenize", out.to_str().unwrap(), "hello"]);
    assert_clean_failure(&o, 1, "no tokenizer");
    // Token ids still work without a tokenizer.
    let o = waste(&["eval", out.to_str().unwrap(), "--tokens", "1,2,3", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn usage_errors_exit_with_code_2() {
    let m = shared_container().to_str().unwrap();
    assert_eq!(waste(&["run"]).status.code(), Some(2));
    assert_eq!(waste(&["frobnicate"]).status.code(), Some(2));
    assert_eq!(waste(&["run", m, "hi", "-n", "0"]).status.code(), Some(2));
    assert_eq!(waste(&["run", m, "hi", "-n", "lots"]).status.code(), Some(2));
    assert_clean_failure(&waste(&["run", m]), 2, "no prompt");
    assert_clean_failure(&waste(&["convert", "a", "b", "--experts", "rvq9"]), 2, "rvq9");
    assert_clean_failure(&waste(&["eval", m, "--tokens", "999999"]), 2, "outside the vocabulary");
    assert_clean_failure(&waste(&["run", m, "hi", "--temp", "-1"]), 2, "temperature");
    assert_clean_failure(&waste(&["run", m, "hi", "--top-p", "0"]), 2, "top-p");
}
