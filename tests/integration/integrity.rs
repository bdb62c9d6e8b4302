//! The checksums of a container (issue 16): a damaged byte of the trunk or
//! of the codebooks is refused at open naming its tensor, one of an expert
//! record under `--verify` naming its layer and expert; `convert` remakes
//! a unit whose bytes changed after an interrupted run instead of reusing
//! it; `convert --verify` fails past the format's error limit.

use std::path::{Path, PathBuf};

use crate::common::*;

fn manifest(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap()
}

/// Flips bit `bit` of byte `at` of `dir/file`.
fn flip(dir: &Path, file: &str, at: u64, bit: u8) {
    let path = dir.join(file);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[at as usize] ^= 1 << bit;
    std::fs::write(&path, bytes).unwrap();
}

fn tensor<'a>(m: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    m["trunk"]["tensors"].as_array().unwrap().iter().find(|t| t["name"] == name).expect(name)
}

fn fails_with(args: &[&str], needles: &[&str]) {
    let o = waste(args);
    let err = stderr(&o);
    assert!(!o.status.success(), "{args:?} succeeded despite the damage");
    assert_eq!(err.trim().lines().count(), 1, "{args:?}: one line expected: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: {n:?} not in {err}");
    }
}

/// A flipped bit in a norm weight of trunk.bin made every logit NaN: `eval`
/// printed NaN and exited 0, `run` printed nothing.
#[test]
fn a_flipped_bit_in_a_trunk_norm_weight_is_refused_at_open_naming_the_tensor() {
    let tmp = TempDir::new("flip-trunk");
    let m = convert("qwen3_moe", "q8", "q8", tmp.path());
    let name = "model.layers.1.post_attention_layernorm.weight";
    let offset = tensor(&manifest(&m), name)["offset"].as_u64().unwrap();
    flip(&m, "trunk.bin", offset + 5, 3);
    let dir = m.to_str().unwrap();
    for args in [
        &["eval", dir, "--tokens", "5,6,7", "--json"][..],
        &["run", dir, "Hello", "-n", "2"],
        &["serve", dir, "--port", "0"],
    ] {
        fails_with(args, &[name, "checksum mismatch", "trunk.bin"]);
    }
}

/// A flipped bit in the RVQ codebooks changed outputs silently.
#[test]
fn a_flipped_bit_in_a_codebook_is_refused_at_open_naming_the_layer() {
    let tmp = TempDir::new("flip-codebook");
    let m = convert("qwen3_moe", "rvq3", "q8", tmp.path());
    let bank = &manifest(&m)["experts"]["layers"][1];
    let cb = &bank["codebooks"];
    let (file, offset) = (cb["file"].as_str().unwrap(), cb["down_offset"].as_u64().unwrap());
    flip(&m, file, offset + 9, 6);
    let what = format!("layer {}'s down codebooks", bank["layer"]);
    fails_with(&["run", m.to_str().unwrap(), "Hello", "-n", "2"], &[&what, "checksum mismatch"]);
}

/// 36 of 42 flipped bits changed the output silently, those in expert
/// payloads among them; `run` had no way to check the records. Then only
/// `--verify` checked them (12 of 513 runs on damaged copies still changed
/// the output silently): records are now checked by default, and
/// `--no-verify` is the opt-out.
#[test]
fn a_flipped_bit_in_an_expert_record_is_refused_by_default_naming_layer_and_expert() {
    let tmp = TempDir::new("flip-record");
    let m = convert("qwen3_moe", "q4", "q8", tmp.path());
    let experts = &manifest(&m)["experts"];
    let record = experts["record_bytes"].as_u64().unwrap();
    let payload = experts["payload_offset"].as_u64().unwrap();
    let bank = &experts["layers"][0];
    let file = bank["file"].as_str().unwrap().to_string();
    let n = bank["experts"].as_u64().unwrap();
    // Every record of the layer, so whichever the router picks is damaged.
    for e in 0..n {
        flip(&m, &file, e * record + payload + 77, 2);
    }
    let dir = m.to_str().unwrap();
    let what = format!("layer {} expert", bank["layer"]);
    for flags in [&[][..], &["--verify"]] {
        let args: Vec<&str> = ["run", dir, "Hello", "-n", "2"].iter().chain(flags).copied().collect();
        fails_with(&args, &[&what, "checksum mismatch", &file]);
    }
    let o = waste(&["run", dir, "Hello", "-n", "2", "--no-verify"]);
    assert!(o.status.success(), "--no-verify runs the damaged copy: {}", stderr(&o));
    let both = waste(&["run", dir, "Hello", "-n", "2", "--verify", "--no-verify"]);
    assert!(!both.status.success(), "--verify with --no-verify was accepted");
    // The undamaged copy passes the same checks.
    let clean = convert("qwen3_moe", "q4", "f32", tmp.path());
    let o = waste(&["run", clean.to_str().unwrap(), "Hello", "-n", "2", "--verify"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// `--verify` on a container without checksums would check nothing: refused.
#[test]
fn verify_refuses_a_container_written_without_checksums() {
    let tmp = TempDir::new("no-checksums");
    let m = convert("qwen3_moe", "q8", "q8", tmp.path());
    let mut v = manifest(&m);
    for t in v["trunk"]["tensors"].as_array_mut().unwrap() {
        t.as_object_mut().unwrap().remove("crc32");
    }
    std::fs::write(m.join("manifest.json"), serde_json::to_vec(&v).unwrap()).unwrap();
    let dir = m.to_str().unwrap();
    fails_with(
        &["run", dir, "Hello", "-n", "1", "--verify"],
        &["has no checksum to verify", "convert the model again"],
    );
    let o = waste(&["run", dir, "Hello", "-n", "1"]);
    assert!(o.status.success(), "without --verify an older container still runs: {}", stderr(&o));
}

/// A container whose end-of-sequence id lies outside the vocabulary was
/// accepted: generation could never stop at it.
#[test]
fn an_eos_id_outside_the_vocabulary_is_refused_at_open() {
    let tmp = TempDir::new("eos-outside");
    let m = convert("qwen3_moe", "q8", "q8", tmp.path());
    let mut v = manifest(&m);
    let vocab = v["config"]["vocab_size"].as_u64().unwrap();
    v["config"]["eos_token_id"] = serde_json::json!(vocab + 7);
    std::fs::write(m.join("manifest.json"), serde_json::to_vec(&v).unwrap()).unwrap();
    let bad = (vocab + 7).to_string();
    fails_with(
        &["run", m.to_str().unwrap(), "Hello", "-n", "1"],
        &["end-of-sequence token id", &bad, "outside the vocabulary"],
    );
}

fn files_of(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "bin" || x == "json"))
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect();
    out.sort();
    out
}

/// An interrupted `convert` "reused the trunk" after a bit in it was
/// flipped: the sidecar's hash was never read.
#[test]
fn convert_resume_remakes_units_whose_bytes_changed_since_the_interrupted_run() {
    let tmp = TempDir::new("resume-damaged");
    let fresh = convert("qwen3_moe", "rvq3", "q8", tmp.path());
    let want = files_of(&fresh);
    let m = manifest(&fresh);
    let norm = tensor(&m, "model.norm.weight")["offset"].as_u64().unwrap();
    let bank = &m["experts"]["layers"][0];
    let cb = &bank["codebooks"];
    // A rerun over a finished container resumes it as it resumes an
    // interrupted run (whose manifest is not written yet).
    flip(&fresh, "trunk.bin", norm + 2, 7);
    flip(&fresh, bank["file"].as_str().unwrap(), m["experts"]["payload_offset"].as_u64().unwrap() + 3, 0);
    flip(&fresh, cb["file"].as_str().unwrap(), cb["gate_up_offset"].as_u64().unwrap(), 1);
    let again = convert("qwen3_moe", "rvq3", "q8", tmp.path());
    assert_eq!(again, fresh);
    let got = files_of(&again);
    assert_eq!(got.len(), want.len());
    for ((name, a), (_, b)) in got.iter().zip(&want) {
        assert!(a == b, "{name} differs from a fresh conversion: a damaged unit was reused");
    }
}

/// `convert --verify` printed per-matrix errors but flagged nothing (a
/// flipped expert moved from 0.110 to 0.126, exit 0).
#[test]
fn convert_verify_fails_past_the_error_limit_naming_the_records() {
    let tmp = TempDir::new("verify-limit");
    let src = fixture("qwen3_moe");
    let out = tmp.path().join("m.waste");
    let (s, o) = (src.to_str().unwrap(), out.to_str().unwrap());
    let ok = waste(&["convert", s, o, "--experts", "rvq3", "--verify"]);
    assert!(ok.status.success(), "{}", stderr(&ok));
    assert!(stdout(&ok).contains("(limit 0.3); checksums intact"), "{}", stdout(&ok));
    let tight = waste(&["convert", s, o, "--experts", "rvq3", "--verify", "--max-error", "0.05"]);
    assert_eq!(tight.status.code(), Some(1), "{}", stderr(&tight));
    let err = stderr(&tight);
    let last = err.trim().lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: ") && last.contains("exceed the relative error limit of 0.05: layer 1 expert 0 gate"),
        "{err}"
    );
}

/// A record damaged after conversion: the library's verify names it by its
/// checksum before decoding anything.
#[test]
fn convert_verify_names_a_record_whose_checksum_no_longer_holds() {
    let tmp = TempDir::new("verify-record");
    let m = convert("qwen3_moe", "q8", "q8", tmp.path());
    let experts = &manifest(&m)["experts"];
    let (record, payload) = (experts["record_bytes"].as_u64().unwrap(), experts["payload_offset"].as_u64().unwrap());
    let bank = &experts["layers"][1];
    flip(&m, bank["file"].as_str().unwrap(), 5 * record + payload + 1000, 4);
    let err = waste_engine::convert::verify(&fixture("qwen3_moe"), &m, &mut |_, _| {}).unwrap_err().to_string();
    assert!(err.contains(&format!("layer {} expert 5: checksum mismatch", bank["layer"])), "{err}");
}

/// Synthetic containers carry checksums too, so `--verify` runs on them.
#[test]
fn synthetic_containers_pass_verify() {
    let tmp = TempDir::new("synth-verify");
    let out: PathBuf = tmp.path().join("s.waste");
    let o = waste(&["synth", out.to_str().unwrap(), "--shape", "olmoe-trace"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = waste(&["bench", out.to_str().unwrap(), "--tokens", "3", "--ctx", "16", "--verify", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
}
