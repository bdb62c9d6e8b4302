//! The prompt cache on disk (`waste serve --prompt-cache-dir`, issue 37
//! item 3): a conversation's state survives a restart, answers equal an
//! uncached server's, the directory stays within its bound, and damaged or
//! foreign files are passed over.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{convert, TempDir};
use crate::server::{bible, get_json, post_json, start, Server};

/// The conversation's first turn and the next one, which extends it.
const TURN_1: &str = "In the beginning God created the heaven and the earth. And the earth was without form";
const TURN_2: &str = "In the beginning God created the heaven and the earth. And the earth was without form, \
                      and void; and darkness was upon the face of the deep.";

fn complete(url: &str, prompt: &str) -> Value {
    let body = json!({"prompt": prompt, "max_tokens": 5, "temperature": 0, "logprobs": 2});
    let (status, answer) = post_json(url, "/v1/completions", &body);
    assert_eq!(status, 200, "{answer}");
    answer
}

fn disk_stats(url: &str) -> Value {
    get_json(url, "/stats").1["prefix_cache"]["disk"].clone()
}

/// Waits until the server has written `n` states (the write follows the
/// answer, so a test that kills the server must wait for it).
fn wait_written(url: &str, n: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let disk = disk_stats(url);
        if disk["written"].as_u64() >= Some(n) {
            return disk;
        }
        assert!(Instant::now() < deadline, "no state written: {disk}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn saved_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "waste-prompt"))
        .collect();
    files.sort();
    files
}

fn with_cache(dir: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> =
        ["--cache-sessions", "2", "--prompt-cache-dir", dir.to_str().unwrap()].iter().map(|s| s.to_string()).collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn start_cached(model: &Path, dir: &Path, extra: &[&str]) -> (Server, String) {
    let args = with_cache(dir, extra);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    start(model, &refs)
}

/// Both kinds of state: attention caches that can be cut back (bible-moe)
/// and a recurrent state saved where the prompt ended (Kimi-Linear's KDA
/// layers). After a restart the next turn resumes the saved state and its
/// answer, text and log-probabilities, equals an uncached server's.
#[test]
fn server_prompt_cache_on_disk_resumes_a_conversation_after_a_restart() {
    let tmp = TempDir::new("prompt-cache");
    let kimi = convert("kimi_linear", "f32", "f32", tmp.path());
    for (name, model) in [("bible-moe", bible()), ("kimi_linear", kimi)] {
        let dir = tmp.path().join(format!("cache-{name}"));
        let (plain, plain_url) = start(&model, &["--cache-sessions", "0"]);
        let expected = complete(&plain_url, TURN_2);
        drop(plain);

        let (first, url) = start_cached(&model, &dir, &[]);
        complete(&url, TURN_1);
        let disk = wait_written(&url, 1);
        assert_eq!(disk["files"], 1, "{name}: {disk}");
        drop(first);
        assert_eq!(saved_files(&dir).len(), 1, "{name}");

        let (second, url) = start_cached(&model, &dir, &[]);
        assert_eq!(disk_stats(&url)["files"], 1, "{name}: the saved state is found at start");
        let got = complete(&url, TURN_2);
        assert_eq!(got["choices"][0]["text"], expected["choices"][0]["text"], "{name}");
        assert_eq!(
            got["choices"][0]["logprobs"], expected["choices"][0]["logprobs"],
            "{name}: log-probabilities differ"
        );
        let stats = get_json(&url, "/stats").1["prefix_cache"].clone();
        assert_eq!(stats["disk"]["hits"], 1, "{name}: {stats}");
        let reused = stats["tokens_reused"].as_u64().unwrap();
        let prompt = got["usage"]["prompt_tokens"].as_u64().unwrap();
        assert!(reused > 0 && reused < prompt, "{name}: {reused} of {prompt} prompt tokens reused");
        assert_eq!(got["usage"]["prompt_tokens_details"]["cached_tokens"], reused, "{name}");
        drop(second);
    }
}

/// A damaged file of this model (its data changed), a file that is no
/// state at all and another model's state: the server starts, says once per
/// file that it passes it over, answers as an uncached server, removes the
/// damaged file and a cut-short write's temporary file, and leaves the
/// other model's alone.
#[test]
fn server_prompt_cache_passes_over_damaged_and_foreign_files() {
    let tmp = TempDir::new("prompt-cache-bad");
    let dir = tmp.path().join("cache");
    let (plain, plain_url) = start(&bible(), &["--cache-sessions", "0"]);
    let expected = complete(&plain_url, TURN_2);
    drop(plain);

    let (first, url) = start_cached(&bible(), &dir, &[]);
    complete(&url, TURN_1);
    wait_written(&url, 1);
    drop(first);
    let damaged = saved_files(&dir).remove(0);
    let mut bytes = std::fs::read(&damaged).unwrap();
    let at = bytes.len() - 100;
    bytes[at] ^= 0x40;
    std::fs::write(&damaged, &bytes).unwrap();
    let junk = dir.join("junk.waste-prompt");
    std::fs::write(&junk, b"not a state file at all, clearly").unwrap();
    // What a write cut short by a stop leaves.
    let cut_short = dir.join("0123456789abcdef.tmp-save");
    std::fs::write(&cut_short, b"half a state").unwrap();

    let other = convert("qwen3_moe", "f32", "f32", tmp.path());
    let other_dir = tmp.path().join("other");
    let (o, other_url) = start_cached(&other, &other_dir, &[]);
    complete(&other_url, "And God said");
    wait_written(&other_url, 1);
    drop(o);
    let foreign = dir.join("foreign.waste-prompt");
    std::fs::copy(saved_files(&other_dir).remove(0), &foreign).unwrap();

    let (second, url) = start_cached(&bible(), &dir, &[]);
    let disk = disk_stats(&url);
    assert_eq!((disk["files"].as_u64(), disk["ignored"].as_u64()), (Some(1), Some(2)), "{disk}");
    let got = complete(&url, TURN_2);
    assert_eq!(got["choices"][0]["text"], expected["choices"][0]["text"]);
    assert_eq!(got["choices"][0]["logprobs"], expected["choices"][0]["logprobs"]);
    assert_eq!(got["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "a damaged state was used");
    let disk = wait_written(&url, 1);
    assert_eq!((disk["hits"].as_u64(), disk["ignored"].as_u64()), (Some(0), Some(3)), "{disk}");
    let log = second.log().join("\n");
    drop(second);
    for (file, says) in [(&junk, "ignoring"), (&foreign, "ignoring"), (&damaged, "removing")] {
        let name = file.file_name().unwrap().to_str().unwrap();
        let lines = log.lines().filter(|l| l.contains(name) && l.contains(says)).count();
        assert_eq!(lines, 1, "one line {says} {name}:\n{log}");
    }
    assert!(!damaged.exists(), "the damaged file stayed");
    assert!(foreign.exists() && junk.exists(), "files that are not this model's states are left alone");
    assert!(!cut_short.exists(), "a cut-short write's temporary file stayed");
}

/// `--prompt-cache-max` bounds this model's files: a second conversation
/// that does not fit beside the first evicts it, and a smaller bound at the
/// next start evicts at once.
#[test]
fn server_prompt_cache_stays_within_its_bound() {
    let tmp = TempDir::new("prompt-cache-max");
    let dir = tmp.path().join("cache");
    let (first, url) = start_cached(&bible(), &dir, &[]);
    complete(&url, TURN_1);
    let one = wait_written(&url, 1)["bytes"].as_u64().unwrap();
    drop(first);

    // Room for one state and most of another.
    let max = (one * 19 / 10).to_string();
    let (second, url) = start_cached(&bible(), &dir, &["--prompt-cache-max", &max]);
    // Longer than the first, from its first token on another text.
    complete(&url, &format!("And {TURN_1}"));
    let disk = wait_written(&url, 1);
    assert_eq!((disk["files"].as_u64(), disk["evicted"].as_u64()), (Some(1), Some(1)), "{disk}");
    assert!(disk["bytes"].as_u64().unwrap() <= disk["max_bytes"].as_u64().unwrap(), "{disk}");
    drop(second);
    assert_eq!(saved_files(&dir).len(), 1);

    let (third, url) = start_cached(&bible(), &dir, &["--prompt-cache-max", &(one / 2).to_string()]);
    let disk = disk_stats(&url);
    assert_eq!((disk["files"].as_u64(), disk["evicted"].as_u64()), (Some(0), Some(1)), "{disk}");
    drop(third);
    assert!(saved_files(&dir).is_empty());
}
