//! `waste serve` against the official `openai` Python client and raw HTTP
//! (tests/server/test_openai.py): chat, completions, models, stop, seeds,
//! usage, logprobs, every error path, and a bounded load test; then
//! (tests/server/test_server_more.py) the queue limit, cancellation on
//! disconnect, stream finish reasons and usage, and tools; then
//! (tests/server/test_tool_calls.py) a tool call the model writes.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::common::{convert, fixture, report_skip, stderr, stdout, waste, waste_bin, TempDir};

/// Kills the server however the test ends; holds what it wrote to stderr.
pub(crate) struct Server(Child, std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Server {
    /// The server's stderr lines so far.
    pub(crate) fn log(&self) -> Vec<String> {
        self.1.lock().unwrap().clone()
    }
}

/// A wrapper (strace) does not take its child down when it is killed, so
/// the server runs in a process group of its own and the whole group goes.
impl Drop for Server {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Ok(group) = i32::try_from(self.0.id()) {
            // SAFETY: killpg only sends a signal; the group is the one
            // `start_under` made for this child, led by its pid.
            unsafe { libc::killpg(group, libc::SIGKILL) };
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether the provisioned Python (`clients::python`) can import
/// `modules`; if not, why, naming the `packages`.
pub(crate) fn python_has(modules: &str, packages: &str) -> Result<(), String> {
    let python =
        crate::clients::python().map_err(|why| format!("the Python clients could not be provisioned: {why}"))?;
    match Command::new(python).args(["-c", &format!("import {modules}")]).output() {
        Err(e) => Err(format!("{} does not run ({e})", python.display())),
        Ok(o) if !o.status.success() => {
            Err(format!("the {packages} Python packages are missing from tests/server/requirements.txt"))
        }
        Ok(_) => Ok(()),
    }
}

/// A command running the provisioned Python; call after [`python_has`].
pub(crate) fn python_command() -> Command {
    Command::new(crate::clients::python().map(Path::to_path_buf).unwrap_or_else(|_| "python3".into()))
}

fn python_has_openai() -> Result<(), String> {
    python_has("openai", "openai")
}

/// Starts `waste serve MODEL --port 0 --api-key KEY ARGS...` and waits for
/// its listening address.
pub(crate) fn start(model: &Path, args: &[&str]) -> (Server, String) {
    let mut all = vec!["--api-key", KEY];
    all.extend_from_slice(args);
    start_with(model, &all)
}

/// Starts `waste serve MODEL --port 0 ARGS...` (no key unless ARGS give one).
pub(crate) fn start_with(model: &Path, args: &[&str]) -> (Server, String) {
    start_under(&[], model, args)
}

/// As [`start`], the server run by `wrapper` (e.g. `strace -f -e
/// inject=...`) when it is not empty.
pub(crate) fn start_under(wrapper: &[&str], model: &Path, args: &[&str]) -> (Server, String) {
    let mut cmd = match wrapper.split_first() {
        None => Command::new(waste_bin()),
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(waste_bin());
            c
        }
    };
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd
        .args(["serve", model.to_str().unwrap(), "--port", "0"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn waste serve");
    let stderr = child.stderr.take().unwrap();
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let server = Server(child, log.clone());
    let mut lines = BufReader::new(stderr).lines();
    let mut url = None;
    for line in lines.by_ref() {
        let line = line.expect("read the server's stderr");
        if let Some(at) = line.find("http://") {
            url = Some(line[at..].split_whitespace().next().unwrap().to_string());
            break;
        }
        // What it says while starting belongs to its log too.
        log.lock().unwrap().push(line);
    }
    let url = url.expect("waste serve printed no listening address");
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            log.lock().unwrap().push(line);
        }
    });
    (server, url)
}

pub(crate) const KEY: &str = "test-key-123";

/// The fault test's strace-wrapped servers ran on, orphaned, after the
/// suite: killing the wrapper left its child. A server started under a
/// wrapper that does not exec it must be gone once the test drops it.
#[cfg(target_os = "linux")]
#[test]
fn a_wrapped_server_leaves_no_process_behind() {
    let marker = format!("orphan-check-{}-{:?}", std::process::id(), std::time::Instant::now());
    // Two commands, so the shell cannot exec the server in its own place.
    let wrapper = ["sh", "-c", "\"$@\"; exit $?", "sh"];
    let (server, _url) = start_under(&wrapper, &bible(), &["--api-key", &marker, "--quiet"]);
    drop(server);
    let left = |marker: &str| -> Vec<String> {
        let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
        dir.flatten()
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .filter(|c| c.contains(marker))
            .collect()
    };
    // SIGKILL is asynchronous: give the kernel a moment to reap.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !left(&marker).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(left(&marker), Vec::<String>::new(), "a server outlived its test");
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub(crate) fn bible() -> PathBuf {
    root().join("examples/bible-moe.waste")
}

#[test]
fn server_answers_the_openai_client() {
    if let Err(why) = python_has_openai() {
        report_skip(&format!("SKIP server_answers_the_openai_client: {why}"));
        return;
    }
    let body_limit = "65536";
    let (server, url) =
        start(&bible(), &["--max-body", body_limit, "--queue", "64", "--cors-origin", "http://app.test"]);
    let out = python_command()
        .arg(root().join("tests/server/test_openai.py"))
        .args([url.as_str(), KEY, "bible-moe", body_limit])
        .output()
        .expect("run test_openai.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // One log line per request: method, path, status, tokens, ms.
    let log = server.log();
    drop(server);
    assert!(out.status.success(), "test_openai.py failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("all server checks passed"), "{stdout}");
    let line = log.iter().find(|l| l.starts_with("POST /v1/chat/completions 200 ") && l.contains(" tokens "));
    let line = line.unwrap_or_else(|| panic!("no request log line: {:?}", &log[..log.len().min(20)]));
    assert!(line.ends_with(" ms"), "{line}");
    assert!(log.iter().any(|l| l.starts_with("POST /v1/chat/completions 200 stream ")), "no streamed request line");
    assert!(log.iter().any(|l| l.starts_with("POST /v1/chat/completions 401 ")), "no 401 line");
}

/// `--strict-model-name` answers another model's name with a 404, and
/// `--quiet` writes no line per request.
#[test]
fn server_strict_model_name_refuses_and_quiet_logs_nothing() {
    let (server, url) = start(&bible(), &["--strict-model-name", "--quiet"]);
    let msgs = serde_json::json!([{"role": "user", "content": "hi"}]);
    let (status, body) =
        post_json(&url, "/v1/chat/completions", &serde_json::json!({"model": "nope", "messages": msgs}));
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "model_not_found", "{body}");
    let (status, body) = post_json(
        &url,
        "/v1/chat/completions",
        &serde_json::json!({"model": "bible-moe", "messages": msgs, "max_tokens": 2}),
    );
    assert_eq!(status, 200, "{body}");
    std::thread::sleep(std::time::Duration::from_millis(200));
    let log = server.log();
    assert!(log.iter().all(|l| !l.starts_with("POST ")), "--quiet logged: {log:?}");
}

/// Runs one mode of tests/server/test_server_more.py against a server on
/// `model` started with `args`.
fn more(test: &str, mode: &str, model: &Path, args: &[&str]) {
    if let Err(why) = python_has_openai() {
        report_skip(&format!("SKIP {test}: {why}"));
        return;
    }
    let id = model.file_name().unwrap().to_string_lossy().trim_end_matches(".waste").to_string();
    let (server, url) = start(model, args);
    let out = python_command()
        .arg(root().join("tests/server/test_server_more.py"))
        .args([mode, url.as_str(), KEY, id.as_str()])
        .output()
        .expect("run test_server_more.py");
    drop(server);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "test_server_more.py {mode} failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains(&format!("all {mode} checks passed")), "{stdout}");
}

#[test]
fn server_queue_limit_answers_503_with_retry_after() {
    more("server_queue_limit_answers_503_with_retry_after", "queue", &bible(), &["--queue", "1"]);
}

#[test]
fn server_client_disconnect_stops_the_generation_within_one_token() {
    more("server_client_disconnect_stops_the_generation_within_one_token", "cancel", &bible(), &[]);
}

#[test]
fn server_stream_finish_reason_and_usage() {
    more("server_stream_finish_reason_and_usage", "stream", &bible(), &[]);
}

/// bible-moe with Kimi's chat template, which renders `tools` (and is short
/// enough for bible-moe's 256-token context, unlike Qwen3's): the prompt
/// must have as many tokens as transformers' rendering
/// (tests/server/tools_expected.json, from gen_tools_expected.py).
#[test]
fn server_tools_are_rendered_by_the_models_template() {
    let tmp = TempDir::new("server-tools");
    let dir = tmp.path().join("bible-tools.waste");
    crate::common::copy_dir(&bible(), &dir);
    let kimi: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/fixtures/chat_templates/kimi/tokenizer_config.json")).unwrap(),
    )
    .unwrap();
    let cfg_path = dir.join("tokenizer_config.json");
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["chat_template"] = kimi["chat_template"].clone();
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    more("server_tools_are_rendered_by_the_models_template", "tools", &dir, &[]);
}

/// A tool call end to end (tests/server/test_tool_calls.py), once per
/// family syntax: a tiny fixture with its family's real chat template
/// (Qwen3's; llama.cpp's Qwen3.5, GLM-4.6 and MiniMax-M2 copies), made to
/// write the tool call that template asks for by examples/sampler-script
/// (every draw scripted; the model still runs each step), served by `waste
/// serve --sampler` and driven by the official openai client; a thinking
/// template's answer reasons in its `<think>` block first, which must come
/// back as `reasoning_content` (gpt-oss's analysis channel too). The
/// fixtures' context (512) cannot hold a tool preamble and a round trip,
/// so each copy declares 2048 positions; their weights are random either
/// way and the output is scripted.
#[test]
fn server_parses_each_familys_tool_call() {
    if let Err(why) = python_has_openai() {
        report_skip(&format!("SKIP server_parses_each_familys_tool_call: {why}"));
        return;
    }
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("tests/server/tool_call_expected.json")).unwrap())
            .unwrap();
    let cases = expected["cases"].as_object().unwrap();
    assert_eq!(cases.len(), 5, "Hermes JSON, Qwen3.5 XML, GLM, MiniMax, gpt-oss harmony");
    for (name, case) in cases {
        tool_call_round_trip(name, case);
    }
}

fn tool_call_round_trip(name: &str, expected: &serde_json::Value) {
    let (_tmp, server, url, served) = scripted_tool_server(name, expected);
    let out = python_command()
        .arg(root().join("tests/server/test_tool_calls.py"))
        .args([url.as_str(), KEY, served.as_str(), name])
        .output()
        .expect("run test_tool_calls.py");
    drop(server);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{name}: test_tool_calls.py failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("all tool-call checks passed"), "{name}: {stdout}");
}

/// `fixture` converted (f32) as `NAME-tools.waste` in `tmp`, with the chat
/// template `template` ("qwen3" for Qwen3's own, else a file of
/// tests/fixtures/chat_templates/llamacpp) and its context raised to 2048:
/// a tool preamble and a round trip do not fit the fixtures' 512.
pub(crate) fn tool_model(tmp: &TempDir, name: &str, fixture: &str, template: &str) -> PathBuf {
    let src = tmp.path().join(fixture);
    std::fs::create_dir(&src).unwrap();
    for e in std::fs::read_dir(crate::common::fixtures().join(fixture)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), src.join(e.file_name())).unwrap();
    }
    let edit = |file: &str, f: &dyn Fn(&mut serde_json::Value)| {
        let path = src.join(file);
        let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        f(&mut v);
        std::fs::write(&path, v.to_string()).unwrap();
    };
    let template = match template {
        "qwen3" => {
            let qwen3: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(root().join("tests/fixtures/chat_templates/qwen3/tokenizer_config.json"))
                    .unwrap(),
            )
            .unwrap();
            qwen3["chat_template"].as_str().unwrap().to_string()
        }
        file => std::fs::read_to_string(root().join("tests/fixtures/chat_templates/llamacpp").join(file)).unwrap(),
    };
    // Regression (the gpt-oss counts failed on 2026-12-02: its template
    // writes today's date, one token shorter than the day the counts were
    // taken): the date transformers rendered with is written in instead.
    let all: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("tests/server/tool_call_expected.json")).unwrap())
            .unwrap();
    let date = serde_json::Value::from(all["template_date"].as_str().unwrap()).to_string();
    let template = template.replace(r#"strftime_now("%Y-%m-%d")"#, &date);
    edit("tokenizer_config.json", &|v| {
        v["chat_template"] = template.clone().into();
        v["model_max_length"] = 2048.into();
    });
    edit("config.json", &|v| match v.get_mut("text_config") {
        Some(t) => t["max_position_embeddings"] = 2048.into(),
        None => v["max_position_embeddings"] = 2048.into(),
    });
    let model = tmp.path().join(format!("{name}-tools.waste"));
    let o = waste(&["convert", src.to_str().unwrap(), model.to_str().unwrap(), "--experts", "f32", "--trunk", "f32"]);
    assert!(o.status.success(), "{name}: convert failed: {}", stderr(&o));
    model
}

/// A server on case `name`'s fixture with its chat template, the context
/// raised to 2048 and examples/sampler-script writing the case's call then
/// its end of turn: (the directory, the server, its URL, the served name).
fn scripted_tool_server(name: &str, expected: &serde_json::Value) -> (TempDir, Server, String, String) {
    let tmp = TempDir::new(&format!("server-tool-call-{name}"));
    let model = tool_model(&tmp, name, expected["fixture"].as_str().unwrap(), expected["template"].as_str().unwrap());
    // Our tokenizer must agree with transformers' on the answer's text (its
    // reasoning and the call), or the script would not spell what the test
    // expects.
    let answer_text = expected["answer_text"].as_str().unwrap();
    let answer_ids: Vec<u64> = expected["answer_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    let o = waste(&["tokenize", model.to_str().unwrap(), answer_text, "--json"]);
    assert!(o.status.success(), "{name}: tokenize failed: {}", stderr(&o));
    let ours: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let ours: Vec<u64> = ours
        .get("tokens")
        .unwrap_or(&ours)
        .as_array()
        .unwrap_or_else(|| panic!("tokenize --json: {ours}"))
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(ours, answer_ids, "{name}: tokenize --json disagrees with transformers");

    let end = expected["end_of_turn_id"].as_u64().unwrap();
    let opts: Vec<String> =
        answer_ids.iter().chain(std::iter::once(&end)).enumerate().map(|(i, id)| format!("t{i}={id}")).collect();
    let wasm = crate::plugins::plugin("script");
    let mut args = vec!["--sampler".to_string(), wasm.to_str().unwrap().to_string()];
    for o in &opts {
        args.push("--sampler-opt".into());
        args.push(o.clone());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (server, url) = start(&model, &args);
    (tmp, server, url, format!("{name}-tools"))
}

/// `run(case, url, served name)` against a scripted tool server for each
/// of tool_call_expected.json's five families.
pub(crate) fn each_scripted_tool_server(run: impl Fn(&str, &str, &str)) {
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("tests/server/tool_call_expected.json")).unwrap())
            .unwrap();
    for name in ["qwen3", "qwen3_5", "glm4_moe", "minimax_m2", "gpt_oss"] {
        let (_tmp, server, url, served) = scripted_tool_server(name, &expected["cases"][name]);
        run(name, &url, &served);
        drop(server);
    }
}

fn python_has_anthropic() -> Result<(), String> {
    python_has("anthropic", "anthropic")
}

/// Runs a client script of tests/server/ that prints `passed` when every
/// check held.
pub(crate) fn run_client_script(script: &str, passed: &str, what: &str, url: &str, args: &[&str]) {
    let out = python_command()
        .arg(root().join("tests/server").join(script))
        .args([url, KEY])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {script}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what}: {script} failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains(passed), "{what}: {stdout}");
}

fn run_anthropic_script(what: &str, url: &str, args: &[&str]) {
    run_client_script("test_anthropic.py", "all anthropic checks passed", what, url, args);
}

/// Anthropic's Messages API with the official `anthropic` client: plain,
/// streamed (the exact event order), stop sequences, both ways of sending
/// the key, Anthropic's error shape, count_tokens equal to the tokens run.
#[test]
fn server_answers_the_anthropic_client() {
    if let Err(why) = python_has_anthropic() {
        report_skip(&format!("SKIP server_answers_the_anthropic_client: {why}"));
        return;
    }
    let (server, url) = start(&bible(), &[]);
    run_anthropic_script("basic", &url, &["bible-moe"]);
    assert!(server.log().iter().any(|l| l.starts_with("POST /v1/messages 200 stream ")), "{:?}", server.log());
}

/// A tool call written by the model as a `tool_use` block (streamed as
/// input_json_delta), left as text with tool_choice none, and the
/// tool_result sent back, with prompt counts equal to transformers'.
#[test]
fn server_anthropic_tool_use_round_trip() {
    if let Err(why) = python_has_anthropic() {
        report_skip(&format!("SKIP server_anthropic_tool_use_round_trip: {why}"));
        return;
    }
    each_scripted_tool_server(|name, url, served| run_anthropic_script(name, url, &[served, "tools", name]));
}

/// `waste serve --sampler`: a missing or non-plugin file is a runtime error
/// naming it (exit 1), a malformed or orphan `--sampler-opt` a usage error
/// (exit 2); each before anything listens.
#[test]
fn server_sampler_errors_exit_before_listening() {
    let model = bible();
    let model = model.to_str().unwrap();
    let toml = root().join("Cargo.toml");
    let cases: [(&[&str], i32, &str); 4] = [
        (&["--sampler-opt", "t0=1"], 2, "--sampler"),
        (&["--sampler", "/nonexistent/p.wasm"], 1, "/nonexistent/p.wasm"),
        (&["--sampler", "/nonexistent/p.wasm", "--sampler-opt", "t0"], 2, "NAME=NUMBER"),
        (&["--sampler", toml.to_str().unwrap()], 1, "not a loadable sampler plugin"),
    ];
    for (args, code, says) in cases {
        let mut all = vec!["serve", model, "--port", "0"];
        all.extend_from_slice(args);
        let o = waste(&all);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("listening"), "{args:?}: {err}");
    }
}

/// One request over raw HTTP/1.1: (status, JSON body).
pub(crate) fn post_json(url: &str, path: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
    use std::io::{Read, Write};
    let host = url.trim_start_matches("http://").split('/').next().unwrap();
    let mut conn = std::net::TcpStream::connect(host).expect("connect to waste serve");
    let body = body.to_string();
    write!(
        conn,
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    let status: u16 = answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{answer}"));
    let (_, json) = answer.split_once("\r\n\r\n").unwrap_or_else(|| panic!("{answer}"));
    (status, serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {answer}")))
}

/// `chat_template_kwargs` (as vLLM and llama.cpp's server take it) reaches
/// Qwen3's template: `enable_thinking: false` adds the empty think block
/// transformers renders, so the prompt grows; a reserved name is a 400.
#[test]
fn server_chat_template_kwargs_reach_the_template() {
    let tmp = TempDir::new("server-kwargs");
    let dir = tmp.path().join("bible-qwen3.waste");
    crate::common::copy_dir(&bible(), &dir);
    let qwen3: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/fixtures/chat_templates/qwen3/tokenizer_config.json")).unwrap(),
    )
    .unwrap();
    let cfg_path = dir.join("tokenizer_config.json");
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["chat_template"] = qwen3["chat_template"].clone();
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let (_server, url) = start(&dir, &[]);
    let prompt_tokens = |kwargs: serde_json::Value| {
        let req = serde_json::json!({
            "messages": [{"role": "user", "content": "And God said"}],
            "max_tokens": 1,
            "temperature": 0,
            "chat_template_kwargs": kwargs,
        });
        let (status, body) = post_json(&url, "/v1/chat/completions", &req);
        assert_eq!(status, 200, "{body}");
        body["usage"]["prompt_tokens"].as_u64().unwrap()
    };
    let plain = prompt_tokens(serde_json::Value::Null);
    assert_eq!(prompt_tokens(serde_json::json!({"enable_thinking": true})), plain);
    let off = prompt_tokens(serde_json::json!({"enable_thinking": false}));
    assert!(off > plain, "enable_thinking=false: {off} prompt tokens, plain {plain}");
    let (status, body) = post_json(
        &url,
        "/v1/chat/completions",
        &serde_json::json!({
            "messages": [{"role": "user", "content": "hi"}],
            "chat_template_kwargs": {"add_generation_prompt": false},
        }),
    );
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "chat_template_kwargs", "{body}");
}

/// `logit_bias` was neither applied nor validated by the server, and
/// `best_of` was silently ignored.
#[test]
fn server_applies_and_validates_logit_bias_and_refuses_best_of() {
    let (_server, url) = start(&bible(), &[]);
    // Token 261 is " the" in bible-moe's vocabulary (`waste tokenize`).
    let body = |extra: serde_json::Value| {
        let mut b = serde_json::json!({"prompt": "And God said", "max_tokens": 4, "temperature": 0});
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        b
    };
    let (status, j) = post_json(&url, "/v1/completions", &body(serde_json::json!({"logit_bias": {"261": 100}})));
    assert_eq!(status, 200, "{j}");
    assert_eq!(j["choices"][0]["text"], " the the the the", "{j}");
    for (extra, field) in [
        (serde_json::json!({"logit_bias": {"99999999": 1}}), "logit_bias"),
        (serde_json::json!({"logit_bias": {"261": 101}}), "logit_bias"),
        (serde_json::json!({"logit_bias": {"x": 1}}), "logit_bias"),
        (serde_json::json!({"best_of": 2}), "best_of"),
    ] {
        let (status, j) = post_json(&url, "/v1/completions", &body(extra.clone()));
        assert_eq!((status, j["error"]["param"].as_str()), (400, Some(field)), "{extra}: {j}");
    }
}

/// A ten-turn conversation through the openai client evaluates only each
/// turn's new tokens on a server with the prefix cache, with answers and
/// usage equal to a server without it, greedy and seeded; the usage of
/// both the openai and the anthropic client states the reused tokens.
#[test]
fn server_prefix_cache_evaluates_only_each_turns_new_tokens() {
    if let Err(why) = python_has("openai, anthropic", "openai anthropic") {
        report_skip(&format!("SKIP server_prefix_cache_evaluates_only_each_turns_new_tokens: {why}"));
        return;
    }
    let (cached, cached_url) = start(&bible(), &["--cache-sessions", "2"]);
    let (plain, plain_url) = start(&bible(), &["--cache-sessions", "0"]);
    let out = python_command()
        .arg(root().join("tests/server/test_prefix_cache.py"))
        .args([cached_url.as_str(), plain_url.as_str(), KEY, "bible-moe"])
        .output()
        .expect("run test_prefix_cache.py");
    drop((cached, plain));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "test_prefix_cache.py failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("all prefix-cache checks passed"), "{stdout}");
}

/// OpenAI's Responses API through the official client (Codex's API):
/// answers equal to the chat API's, the SDK's stream helper fed our
/// events, `incomplete` at max_output_tokens, stored-state fields refused
/// (tests/server/test_responses.py basic).
#[test]
fn server_answers_the_responses_api() {
    if let Err(why) = python_has_openai() {
        report_skip(&format!("SKIP server_answers_the_responses_api: {why}"));
        return;
    }
    let (server, url) = start(&bible(), &[]);
    run_client_script("test_responses.py", "all responses checks passed", "responses", &url, &["basic", "bible-moe"]);
    let log = server.log();
    assert!(log.iter().any(|l| l.starts_with("POST /v1/responses 200 stream ")), "{log:?}");
}

/// Each family's tool call through the Responses API: a `function_call`
/// item (and a `reasoning` item), whole and streamed, and the call's
/// output sent back rendering transformers' prompt
/// (tests/server/test_responses.py tools).
#[test]
fn server_responses_api_returns_each_familys_tool_call() {
    if let Err(why) = python_has_openai() {
        report_skip(&format!("SKIP server_responses_api_returns_each_familys_tool_call: {why}"));
        return;
    }
    each_scripted_tool_server(|name, url, served| {
        let what = format!("responses tools, {name}");
        let out = python_command()
            .arg(root().join("tests/server/test_responses.py"))
            .args([url, KEY, "tools", served, name])
            .output()
            .expect("run test_responses.py");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{what}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains("all responses checks passed"), "{what}: {stdout}");
    });
}

/// `n` choices through the openai client, chat and legacy completions,
/// whole and streamed: choice i equals a one-choice request seeded S + i
/// on a server without the prefix cache (text and log-probabilities), the
/// prompt evaluated once and resumed for the other choices
/// (tests/server/test_choices.py).
#[test]
fn server_answers_n_choices_each_equal_to_its_seeds_single_answer() {
    if let Err(why) = python_has_openai() {
        report_skip(&format!("SKIP server_answers_n_choices_each_equal_to_its_seeds_single_answer: {why}"));
        return;
    }
    let (cached, cached_url) = start(&bible(), &["--cache-sessions", "2"]);
    let (plain, plain_url) = start(&bible(), &["--cache-sessions", "0"]);
    let out = python_command()
        .arg(root().join("tests/server/test_choices.py"))
        .args([cached_url.as_str(), plain_url.as_str(), KEY, "bible-moe"])
        .output()
        .expect("run test_choices.py");
    drop((cached, plain));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "test_choices.py failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("all choice checks passed"), "{stdout}");
}

/// A model whose state cannot be cut back (Kimi-Linear's KDA layers)
/// resumes only from a state taken where an earlier prompt ended: prompts
/// that extend each other hit, one that diverges does not, and every
/// answer (text and log-probabilities) equals the uncached server's.
#[test]
fn server_prefix_cache_resumes_a_recurrent_state_only_at_a_prompt_boundary() {
    let tmp = TempDir::new("prefix-kda");
    let m = crate::common::convert("kimi_linear", "f32", "f32", tmp.path());
    let (cached, cached_url) = start(&m, &["--cache-sessions", "2"]);
    let (plain, plain_url) = start(&m, &["--cache-sessions", "0"]);
    let prompts = [
        "The quick brown fox",
        "The quick brown fox jumps over",
        "The quick brown fox jumps over the lazy dog",
        "A different start",
    ];
    let mut hits = Vec::new();
    for p in prompts {
        let body = serde_json::json!({"prompt": p, "max_tokens": 5, "temperature": 0, "logprobs": 2});
        let (s1, a) = post_json(&cached_url, "/v1/completions", &body);
        let (s2, b) = post_json(&plain_url, "/v1/completions", &body);
        assert_eq!((s1, s2), (200, 200), "{a} {b}");
        assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"], "{p}");
        assert_eq!(a["choices"][0]["logprobs"], b["choices"][0]["logprobs"], "{p}: log-probabilities differ");
        hits.push(stats_of(&cached_url)["prefix_cache"]["hits"].as_u64().unwrap());
    }
    assert_eq!(hits, [0, 1, 2, 2], "hits after each prompt");
    drop((cached, plain));
}

fn stats_of(url: &str) -> serde_json::Value {
    get_json(url, "/stats").1
}

/// `GET path` with the key; the status and the JSON answer.
pub(crate) fn get_json(url: &str, path: &str) -> (u16, serde_json::Value) {
    use std::io::{Read, Write};
    let host = url.trim_start_matches("http://").split('/').next().unwrap();
    let mut conn = std::net::TcpStream::connect(host).unwrap();
    write!(conn, "GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    let status = answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{answer}"));
    (status, serde_json::from_str(answer.split_once("\r\n\r\n").unwrap().1).unwrap_or_else(|e| panic!("{e}: {answer}")))
}

fn python_has_ollama() -> Result<(), String> {
    python_has("ollama, jsonschema", "ollama jsonschema")
}

fn run_ollama_script(what: &str, url: &str, args: &[&str]) {
    run_client_script("test_ollama.py", "all ollama checks passed", what, url, args);
}

/// Ollama's API with the official `ollama` client: chat and generate
/// (NDJSON by default), options, the final statistics, the metadata
/// routes, errors as {"error"}; the same text and counts as the OpenAI
/// routes; a malformed or unsatisfiable `format` is a 400.
#[test]
fn server_answers_the_ollama_client() {
    if let Err(why) = python_has_ollama() {
        report_skip(&format!("SKIP server_answers_the_ollama_client: {why}"));
        return;
    }
    let (_server, url) = start(&bible(), &[]);
    run_ollama_script("basic", &url, &["bible-moe"]);
}

/// `format` through the ollama client on bible-moe (which has never seen
/// JSON): every answer to a schema validates, every "json" answer is an
/// object or, cut by num_predict, a prefix of one.
#[test]
fn server_ollama_format_constrains_the_answer() {
    if let Err(why) = python_has_ollama() {
        report_skip(&format!("SKIP server_ollama_format_constrains_the_answer: {why}"));
        return;
    }
    let (_server, url) = start(&bible(), &[]);
    run_ollama_script("format", &url, &["bible-moe", "format"]);
}

/// A tool call through /api/chat: arguments as a JSON object, the prompt
/// count equal to transformers', the result sent back.
#[test]
fn server_ollama_tool_calls() {
    if let Err(why) = python_has_ollama() {
        report_skip(&format!("SKIP server_ollama_tool_calls: {why}"));
        return;
    }
    each_scripted_tool_server(|name, url, served| run_ollama_script(name, url, &[served, "tools", name]));
}

/// Images through the OpenAI, Anthropic and Ollama clients
/// (tests/server/test_images.py): base64 `image_url` parts, `image` blocks
/// and Ollama `images` answer as the pure-torch
/// reference does on the tiny K3 with a vision tower; remote URLs are
/// refused, never fetched. Run with the prefix cache, where K3's recurrent
/// layers make the worker evaluate the prompt up to its last token before
/// generating (the images must be attached by then: they once were not), and
/// without it, where the whole prompt goes to generation.
#[test]
fn server_answers_image_prompts_from_every_client() {
    if let Err(why) = python_has("openai, anthropic, ollama", "openai anthropic ollama") {
        report_skip(&format!("SKIP server_answers_image_prompts_from_every_client: {why}"));
        return;
    }
    let tmp = TempDir::new("server-images");
    let c = convert("kimi_k3-vision", "f32", "f32", tmp.path());
    let id = c.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
    let fixture = fixture("kimi_k3-vision");
    for (name, args) in [("images", &[][..]), ("images, no prefix cache", &["--cache-sessions", "0"][..])] {
        let (_server, url) = start(&c, args);
        run_client_script("test_images.py", "all image checks passed", name, &url, &[id, fixture.to_str().unwrap()]);
    }
}
