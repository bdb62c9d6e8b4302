//! `waste serve` against the official `openai` Python client and raw HTTP
//! (tests/server/test_openai.py): chat, completions, models, stop, seeds,
//! usage, logprobs, every error path, and a bounded load test; then
//! (tests/server/test_server_more.py) the queue limit, cancellation on
//! disconnect, stream finish reasons and usage, and tools.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::common::{report_skip, TempDir};

/// Kills the server however the test ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn python_has_openai() -> Result<(), String> {
    match Command::new("python3")
        .args(["-c", "import openai"])
        .output()
    {
        Err(e) => Err(format!("python3 is not available ({e})")),
        Ok(o) if !o.status.success() => {
            Err("the openai Python package is not installed (pip install openai)".into())
        }
        Ok(_) => Ok(()),
    }
}

/// Starts `waste serve MODEL --port 0 --api-key KEY ARGS...` and waits for
/// its listening address.
fn start(model: &Path, args: &[&str]) -> (Server, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_waste"))
        .args([
            "serve",
            model.to_str().unwrap(),
            "--port",
            "0",
            "--api-key",
            KEY,
        ])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn waste serve");
    let stderr = child.stderr.take().unwrap();
    let server = Server(child);
    let mut lines = BufReader::new(stderr).lines();
    let mut url = None;
    for line in lines.by_ref() {
        let line = line.expect("read the server's stderr");
        if let Some(at) = line.find("http://") {
            url = Some(line[at..].trim().to_string());
            break;
        }
    }
    let url = url.expect("waste serve printed no listening address");
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (server, url)
}

const KEY: &str = "test-key-123";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn bible() -> PathBuf {
    root().join("examples/bible-moe.waste")
}

#[test]
fn server_answers_the_openai_client() {
    if let Err(why) = python_has_openai() {
        report_skip(&format!("SKIP server_answers_the_openai_client: {why}"));
        return;
    }
    let body_limit = "65536";
    let (server, url) = start(&bible(), &["--max-body", body_limit, "--queue", "64"]);
    let out = Command::new("python3")
        .arg(root().join("tests/server/test_openai.py"))
        .args([url.as_str(), KEY, "bible-moe", body_limit])
        .output()
        .expect("run test_openai.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    drop(server);
    assert!(
        out.status.success(),
        "test_openai.py failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("all server checks passed"), "{stdout}");
}

/// Runs one mode of tests/server/test_server_more.py against a server on
/// `model` started with `args`.
fn more(test: &str, mode: &str, model: &Path, args: &[&str]) {
    if let Err(why) = python_has_openai() {
        report_skip(&format!("SKIP {test}: {why}"));
        return;
    }
    let id = model
        .file_name()
        .unwrap()
        .to_string_lossy()
        .trim_end_matches(".waste")
        .to_string();
    let (server, url) = start(model, args);
    let out = Command::new("python3")
        .arg(root().join("tests/server/test_server_more.py"))
        .args([mode, url.as_str(), KEY, id.as_str()])
        .output()
        .expect("run test_server_more.py");
    drop(server);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "test_server_more.py {mode} failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains(&format!("all {mode} checks passed")),
        "{stdout}"
    );
}

#[test]
fn server_queue_limit_answers_503_with_retry_after() {
    more(
        "server_queue_limit_answers_503_with_retry_after",
        "queue",
        &bible(),
        &["--queue", "1"],
    );
}

#[test]
fn server_client_disconnect_stops_the_generation_within_one_token() {
    more(
        "server_client_disconnect_stops_the_generation_within_one_token",
        "cancel",
        &bible(),
        &[],
    );
}

#[test]
fn server_stream_finish_reason_and_usage() {
    more(
        "server_stream_finish_reason_and_usage",
        "stream",
        &bible(),
        &[],
    );
}

/// bible-moe with Kimi's chat template, which renders `tools` (and is short
/// enough for bible-moe's 256-token context, unlike Qwen3's): the prompt
/// must have as many tokens as transformers' rendering
/// (tests/server/tools_expected.json, from gen_tools_expected.py).
#[test]
fn server_tools_are_rendered_by_the_models_template() {
    let tmp = TempDir::new("server-tools");
    let dir = tmp.path().join("bible-tools.waste");
    std::fs::create_dir(&dir).unwrap();
    for e in std::fs::read_dir(bible()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    let kimi: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            root().join("tests/fixtures/chat_templates/kimi/tokenizer_config.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let cfg_path = dir.join("tokenizer_config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["chat_template"] = kimi["chat_template"].clone();
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    more(
        "server_tools_are_rendered_by_the_models_template",
        "tools",
        &dir,
        &[],
    );
}
