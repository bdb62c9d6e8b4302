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
