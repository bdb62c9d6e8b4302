//! Regression tests for the defects a hostile-user pass found (issue 16),
//! each named after what broke.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::common::*;

fn bible() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/bible-moe.waste").to_string_lossy().into_owned()
}

fn one_line_failure(args: &[&str], needle: &str) {
    let o = waste(args);
    let err = stderr(&o);
    assert!(!o.status.success(), "{args:?} succeeded");
    assert!(err.contains(needle) && err.trim().lines().count() == 1, "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// `--max-body abc` named `--budget` in its error.
#[test]
fn a_bad_max_body_is_named_as_max_body_not_budget() {
    let m = bible();
    one_line_failure(&["serve", &m, "--port", "0", "--max-body", "abc"], "--max-body \"abc\"");
    let err = stderr(&waste(&["serve", &m, "--port", "0", "--max-body", "abc"]));
    assert!(!err.contains("--budget"), "{err}");
}

/// `--max-body 0` and `--api-key ""` started a server that refused every request.
#[test]
fn serve_refuses_a_zero_max_body_and_an_empty_api_key_before_listening() {
    let m = bible();
    one_line_failure(&["serve", &m, "--port", "0", "--max-body", "0"], "--max-body 0");
    one_line_failure(&["serve", &m, "--port", "0", "--api-key", ""], "--api-key is empty");
}

/// `--threads 3000` was accepted (35-60 s for 4 tokens).
#[test]
fn threads_beyond_the_available_cpus_are_refused() {
    let cpus = std::thread::available_parallelism().unwrap().get();
    let too_many = (cpus + 1).to_string();
    one_line_failure(&["run", &bible(), "Hello", "-n", "1", "--threads", &too_many], "CPUs available");
    let o = waste(&["run", &bible(), "Hello", "-n", "1", "--threads", &cpus.to_string()]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// `chat` exited on the first invalid-UTF-8 line of piped input.
#[test]
fn chat_skips_an_invalid_utf8_line_of_piped_input_and_goes_on() {
    let tmp = TempDir::new("chat-utf8");
    let m = bible_moe_with_qwen3_template(&tmp);
    let mut child = Command::new(waste_bin())
        .args(["chat", m.to_str().unwrap(), "-n", "4", "--temp", "0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"Hello\n\xff\xfe broken\n/stats\n").unwrap();
    let o = child.wait_with_output().unwrap();
    let (out, err) = (stdout(&o), stderr(&o));
    assert!(o.status.success(), "{err}");
    assert!(err.contains("line 2 of the input is not UTF-8; skipped"), "{err}");
    // The line after the bad one still ran.
    assert!(out.contains("turns 1"), "{out}");
}

/// 8 of 340 inconsistent manifests were accepted (a misaligned trunk
/// tensor gave NaN with exit 0; duplicates made `info` count a 3 GB trunk):
/// each is now refused at open with one line naming what is wrong.
#[test]
fn inconsistent_manifests_are_refused_with_one_line_naming_the_field() {
    let tmp = TempDir::new("manifests");
    let base = convert("qwen3_moe", "rvq3", "q4", tmp.path());
    let cases: [(&str, ManifestEdit, &str); 6] = [
        ("misaligned", |m| m["trunk"]["tensors"][0]["offset"] = 4.into(), "is not a multiple of 64"),
        (
            "overlap",
            |m| {
                let at = m["trunk"]["tensors"][0]["offset"].clone();
                m["trunk"]["tensors"][1]["offset"] = at;
            },
            "overlaps",
        ),
        (
            "duplicate",
            |m| {
                let t = m["trunk"]["tensors"][0].clone();
                m["trunk"]["tensors"].as_array_mut().unwrap().push(t);
            },
            "appears twice",
        ),
        (
            "missing",
            |m| {
                let t = m["trunk"]["tensors"].as_array_mut().unwrap();
                let i = t.iter().position(|t| t["name"] == "model.norm.weight").unwrap();
                t.remove(i);
            },
            "model.norm.weight is missing",
        ),
        (
            "duplicate-layer",
            |m| {
                let l = m["experts"]["layers"][0].clone();
                m["experts"]["layers"].as_array_mut().unwrap().push(l);
            },
            "two expert banks for layer",
        ),
        (
            "codebooks",
            |m| {
                let cb = &mut m["experts"]["layers"][0]["codebooks"];
                cb["down_offset"] = cb["gate_up_offset"].clone();
            },
            "overlap",
        ),
    ];
    refused_after_manifest_edits(&base, tmp.path(), &cases);
}

/// `--load-state`, `--file`, `tokenize --file` and `--sampler` read their
/// file whole before any check (`/dev/zero` grew ~1 GB/s until OOM), and a
/// container member that is a FIFO hung `info`: each is refused at once.
#[test]
fn files_that_are_not_regular_or_too_large_are_refused_before_reading() {
    let tmp = TempDir::new("bounded");
    let m = bible();
    let zero = "/dev/zero";
    let started = std::time::Instant::now();
    one_line_failure(&["run", &m, "Hi", "-n", "1", "--load-state", zero], "not a regular file");
    one_line_failure(&["run", &m, "-n", "1", "--file", zero], "not a regular file");
    one_line_failure(&["tokenize", &m, "--file", zero], "not a regular file");
    one_line_failure(&["run", &m, "Hi", "-n", "1", "--sampler", zero], "not a regular file");
    // A sparse 3 GB "session": larger than any session of this model.
    let big = tmp.path().join("big.state");
    std::fs::File::create(&big).unwrap().set_len(3 << 30).unwrap();
    one_line_failure(&["run", &m, "Hi", "-n", "1", "--load-state", big.to_str().unwrap()], "more than a session");
    assert!(started.elapsed().as_secs() < 60, "a refusal read its file: {:?}", started.elapsed());

    let dir = tmp.path().join("fifo.waste");
    copy_dir(std::path::Path::new(&m), &dir);
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    let fifo = std::ffi::CString::new(dir.join("tokenizer.json").to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
    assert_eq!(unsafe { libc_mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let mut child = Command::new(waste_bin())
        .args(["info", dir.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("waste info hung on a FIFO in the container");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let o = child.wait_with_output().unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("not a regular file"), "{}", stderr(&o));
}

extern "C" {
    #[link_name = "mkfifo"]
    fn libc_mkfifo(path: *const std::ffi::c_char, mode: u32) -> i32;
}

/// One flipped bit in a norm weight of trunk.bin made every logit NaN:
/// `eval` printed NaN and exited 0, `run` printed nothing and reported
/// `(stop: eos)`. The forward pass now stops at the layer where the NaN
/// first appears and says so.
#[test]
fn a_nan_in_the_weights_is_an_error_naming_the_layer() {
    use std::io::{Seek, SeekFrom};
    let tmp = TempDir::new("nan");
    let base = convert("qwen3_moe", "q8", "q8", tmp.path());
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(base.join("manifest.json")).unwrap()).unwrap();
    let norm = manifest["trunk"]["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "model.layers.2.input_layernorm.weight")
        .unwrap()
        .clone();
    assert_eq!(norm["format"], "f32", "{norm}");
    let mut trunk = std::fs::OpenOptions::new().write(true).open(base.join("trunk.bin")).unwrap();
    trunk.seek(SeekFrom::Start(norm["offset"].as_u64().unwrap())).unwrap();
    trunk.write_all(&f32::NAN.to_le_bytes()).unwrap();
    drop(trunk);
    // The tensor's checksum would name the damage first (tests/integration/
    // integrity.rs); without one (a container written before checksums, or
    // a NaN the source itself holds) the forward pass must still catch it.
    let mut manifest = manifest;
    for t in manifest["trunk"]["tensors"].as_array_mut().unwrap() {
        if t["name"] == "model.layers.2.input_layernorm.weight" {
            t.as_object_mut().unwrap().remove("crc32");
        }
    }
    std::fs::write(base.join("manifest.json"), serde_json::to_vec(&manifest).unwrap()).unwrap();
    let c = base.to_str().unwrap();
    for args in [vec!["eval", c, "Hello there"], vec!["run", c, "Hello there", "-n", "4", "--temp", "0"]] {
        let o = waste(&args);
        let err = stderr(&o);
        assert!(!o.status.success(), "{args:?} succeeded: {err}");
        assert!(err.contains("layer 2 produced a NaN or infinity"), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}

/// Mutated request bodies (tests/server/fuzz_http.py, a fixed seed so the
/// run replays): every answer a documented status with OpenAI's error
/// shape, no dropped connection, /health up, the greedy probe unchanged.
#[test]
fn mutated_request_bodies_get_documented_answers_and_leave_the_server_as_it_was() {
    let m = PathBuf::from(bible());
    let (server, url) = crate::server::start_under(&[], &m, &["--api-key", crate::server::KEY]);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("server/fuzz_http.py");
    let o = Command::new("python3")
        .arg(&script)
        .args([url.as_str(), crate::server::KEY, "--requests", "600", "--max-body", "4000000"])
        .output()
        .expect("run python3");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}{}: {:?}", String::from_utf8_lossy(&o.stderr), server.log());
    assert!(out.contains("http fuzz: 600 requests") && out.contains("failures 0"), "{out}");
    assert!(!server.log().iter().any(|l| l.contains("panicked")), "{:?}", server.log());
}
