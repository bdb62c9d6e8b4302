//! `waste serve` against the official `openai` Python client and raw HTTP
//! (tests/server/test_openai.py): chat, completions, models, stop, seeds,
//! usage, logprobs, every error path, and a bounded load test.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::common::report_skip;

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

#[test]
fn server_answers_the_openai_client() {
    if let Err(why) = python_has_openai() {
        report_skip(&format!("SKIP server_answers_the_openai_client: {why}"));
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let model = root.join("examples/bible-moe.waste");
    let key = "test-key-123";
    let body_limit = "65536";
    let mut child = Command::new(env!("CARGO_BIN_EXE_waste"))
        .args([
            "serve",
            model.to_str().unwrap(),
            "--port",
            "0",
            "--api-key",
            key,
            "--max-body",
            body_limit,
            "--queue",
            "64",
        ])
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
    let out = Command::new("python3")
        .arg(root.join("tests/server/test_openai.py"))
        .args([url.as_str(), key, "bible-moe", body_limit])
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
