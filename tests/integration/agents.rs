//! The coding agents themselves against `waste serve` (issue 37 item 6):
//! Claude Code, as a user runs it (`claude -p`), pointed at the server with
//! `ANTHROPIC_BASE_URL`; OpenCode (`opencode run`) with the server as an
//! OpenAI-compatible provider in its `opencode.json`; and Codex (`codex
//! exec`) with the server as a Responses API provider in its
//! `config.toml`. The clients are installed by the test under the target
//! directory from tests/agents/package.json (exact versions) and its lock,
//! and kept while the lock file is unchanged.
//!
//! The model is the tiny random-weight Qwen3-MoE fixture with Qwen3's real
//! chat template and a context raised to 131,072 tokens, large enough for
//! the agent's system prompt and tool schemas; examples/sampler-script
//! writes the answer, so what the client shows is known: a tool call, and
//! the answer to its result for a request that carries one.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::common::{copy_dir, fixture, report_skip, stderr, stdout, waste, TempDir};
use crate::server::{start, Server, KEY};

static INSTALLED: OnceLock<Result<PathBuf, String>> = OnceLock::new();

/// The directory the agents are installed in (its `node_modules/.bin`
/// holds their commands); why not, if npm cannot install them.
fn agents() -> Result<&'static Path, String> {
    INSTALLED.get_or_init(install).as_deref().map_err(Clone::clone)
}

/// [`agents`], or None after reporting why `test` skips.
fn agents_or_skip(test: &str) -> Option<&'static Path> {
    agents().map_err(|why| report_skip(&format!("SKIP {test}: {why}"))).ok()
}

fn install() -> Result<PathBuf, String> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("agents");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("agents");
    let lock = std::fs::read_to_string(source.join("package-lock.json")).map_err(|e| format!("the lock file: {e}"))?;
    let stamp = dir.join("lock.installed");
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == lock) {
        return Ok(dir);
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for file in ["package.json", "package-lock.json"] {
        std::fs::copy(source.join(file), dir.join(file)).map_err(|e| format!("copying {file}: {e}"))?;
    }
    // `npm install`, not `npm ci`: the lock lists every platform's build of
    // each agent as an optional dependency, and a registry mirror that lacks
    // the other platforms' makes `npm ci` refuse the lock, while `install`
    // skips a missing optional one. The versions are exact in package.json.
    let out = Command::new("npm")
        .current_dir(&dir)
        .args(["install", "--no-audit", "--no-fund"])
        .output()
        .map_err(|e| format!("npm is not available ({e})"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let why: Vec<&str> =
            err.lines().filter(|l| l.contains("error") && !l.contains("complete log")).take(4).collect();
        return Err(format!("npm install failed: {}", why.join(" / ")));
    }
    std::fs::write(&stamp, &lock).map_err(|e| format!("{}: {e}", stamp.display()))?;
    Ok(dir)
}

/// The tiny Qwen3-MoE fixture with Qwen3's template and a 131,072-token
/// context, converted into `tmp`.
fn agent_model(tmp: &TempDir) -> PathBuf {
    let src = tmp.path().join("tiny-qwen3-agent");
    copy_dir(&fixture("qwen3_moe"), &src);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |p: &Path| -> serde_json::Value { serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap() };
    let qwen3 = read(&root.join("fixtures/chat_templates/qwen3/tokenizer_config.json"));
    let mut cfg = read(&src.join("tokenizer_config.json"));
    cfg["chat_template"] = qwen3["chat_template"].clone();
    cfg["model_max_length"] = 131_072.into();
    std::fs::write(src.join("tokenizer_config.json"), cfg.to_string()).unwrap();
    let mut config = read(&src.join("config.json"));
    config["max_position_embeddings"] = 131_072.into();
    std::fs::write(src.join("config.json"), config.to_string()).unwrap();
    let model = tmp.path().join("agent.waste");
    let o = waste(&["convert", src.to_str().unwrap(), model.to_str().unwrap(), "--experts", "f32", "--trunk", "f32"]);
    assert!(o.status.success(), "convert: {}", stderr(&o));
    model
}

/// The token ids of `text` (markup: special tokens by name) in `model`.
fn token_ids(model: &Path, text: &str) -> Vec<u64> {
    let o = waste(&["tokenize", model.to_str().unwrap(), text, "--markup", "--json"]);
    assert!(o.status.success(), "tokenize: {}", stderr(&o));
    let ids: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    ids["tokens"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect()
}

/// What closes a tool's result in Qwen3's template, a few tokens before
/// the prompt's end: a request whose prompt ends with it is a tool turn's
/// second model call. (The plugin sees the last 64 tokens, the default
/// penalty window; a tool's output can be longer, so its opening tag may
/// be out of sight.)
const TOOL_RESULT_MARKER: &str = "</tool_response>";

/// `waste serve` on `model` writing `answer` (markup: `<|im_end|>` is the
/// end-of-turn token) for every request, or `after_tool` for a request
/// carrying a tool's result (its prompt ends with [`TOOL_RESULT_MARKER`]).
fn scripted_server(model: &Path, answer: &str, after_tool: Option<&str>) -> (Server, String) {
    let mut args = vec!["--ctx".to_string(), "131072".into(), "--sampler".into()];
    args.push(crate::plugins::plugin("script").to_str().unwrap().to_string());
    let mut script = vec![('t', answer)];
    if let Some(after) = after_tool {
        script.extend([('u', after), ('m', TOOL_RESULT_MARKER)]);
    }
    for (letter, text) in script {
        for (i, id) in token_ids(model, text).iter().enumerate() {
            args.push("--sampler-opt".into());
            args.push(format!("{letter}{i}={id}"));
        }
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    start(model, &args)
}

/// The scripted answer of the one-shot tests: reasoning, then the reply
/// the client must print.
const GREETING: &str = "<think>\nThe user greets me.\n</think>\n\nHello from WASTE.<|im_end|>";

/// A server on the agent model writing [`GREETING`], in a temporary
/// directory named after `tag`.
fn greeting_server(tag: &str) -> (TempDir, Server, String) {
    let tmp = TempDir::new(tag);
    let model = agent_model(&tmp);
    let (server, url) = scripted_server(&model, GREETING, None);
    (tmp, server, url)
}

/// The server's log lines of requests it did not answer 200.
fn refused(log: &[String]) -> Vec<&String> {
    log.iter()
        .filter(|l| (l.starts_with("POST ") || l.starts_with("GET ")) && l.split(' ').nth(2) != Some("200"))
        .collect()
}

/// Runs `claude ARGS` against `url` with a home of its own and no traffic
/// but to the server: (exit status, stdout, stderr).
fn claude(agents: &Path, home: &Path, url: &str, args: &[&str]) -> (Option<i32>, String, String) {
    claude_in(agents, home, home, url, args)
}

/// [`claude`] in the project directory `work` (`--continue` resumes that
/// directory's last conversation).
fn claude_in(agents: &Path, home: &Path, work: &Path, url: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let o = Command::new("timeout")
        .current_dir(work)
        .env("PWD", work)
        .arg("300")
        .arg(agents.join("node_modules/.bin/claude"))
        .args(args)
        .env("HOME", home)
        .env("ANTHROPIC_BASE_URL", url)
        .env("ANTHROPIC_API_KEY", KEY)
        .env_remove("ANTHROPIC_AUTH_TOKEN")
        .env_remove("ANTHROPIC_MODEL")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_TELEMETRY", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .output()
        .expect("run claude");
    (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// Claude Code's one-shot mode with its default extended thinking: the
/// request (its system prompt and twelve tool schemas) is answered, the
/// reasoning goes into a thinking block the client does not print, the
/// reply is printed, the client exits 0, and the server refused nothing.
#[test]
fn claude_code_answers_one_shot_with_thinking_through_waste_serve() {
    let Some(agents) = agents_or_skip("claude_code_answers_one_shot_with_thinking_through_waste_serve") else { return };
    let (tmp, server, url) = greeting_server("agent-claude");
    let home = tmp.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let (code, out, err) = claude(agents, &home, &url, &["-p", "Say hi", "--model", "agent"]);
    let log = server.log();
    drop(server);
    assert_eq!(code, Some(0), "claude -p failed:\n{out}\n{err}\n{log:?}");
    assert_eq!(out.trim(), "Hello from WASTE.", "{err}\n{log:?}");
    assert!(log.iter().any(|l| l.starts_with("POST /v1/messages 200 ")), "{log:?}");
    assert_eq!(refused(&log), Vec::<&String>::new(), "a request was refused: {log:?}");
}

/// A whole tool turn: after reasoning, the model calls Claude Code's Bash
/// tool in Qwen3's `<tool_call>` syntax; the server returns it as a
/// `tool_use` block, the client runs it and sends its result back, and the
/// model's answer to that result (the sampler's second script, played for
/// a prompt ending with the tool's result) is what the client prints.
#[test]
fn claude_code_runs_the_tool_the_model_calls() {
    let Some(agents) = agents_or_skip("claude_code_runs_the_tool_the_model_calls") else { return };
    let tmp = TempDir::new("agent-claude-tool");
    let model = agent_model(&tmp);
    let marker = tmp.path().join("touched-by-the-agent");
    let arguments = serde_json::json!({"command": format!("touch {}", marker.display()), "description": "Touch it"});
    let (server, url) = scripted_server(&model, &tool_call("Bash", &arguments), Some(TOUCHED));
    let home = tmp.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let args = ["-p", "Touch the marker file", "--allowedTools", "Bash", "--model", "agent"];
    let run = claude(agents, &home, &url, &args);
    let log = server.log();
    drop(server);
    assert_tool_turn(&marker, run, &log, "/v1/messages", 2);
}

/// What a whole tool turn leaves: the tool ran (`marker` exists), the
/// client exited 0 and printed the answer to the tool's result last, and
/// the server answered `turns` requests on `path` (at least, where the
/// client asks for more, as OpenCode's title) and refused none.
fn assert_tool_turn(marker: &Path, run: (Option<i32>, String, String), log: &[String], path: &str, turns: usize) {
    let (code, out, err) = run;
    assert!(marker.exists(), "the tool did not run ({code:?}):\n{out}\n{err}\n{log:?}");
    assert_eq!(code, Some(0), "the client failed:\n{out}\n{err}\n{log:?}");
    assert!(out.trim().ends_with("The file is touched."), "{out}\n{err}\n{log:?}");
    let answered = log.iter().filter(|l| l.starts_with(&format!("POST {path} 200 "))).count();
    assert!(answered >= turns, "the call and the answer to its result: {log:?}");
    assert_eq!(refused(log), Vec::<&String>::new(), "a request was refused: {log:?}");
}

/// A tool call in Qwen3's syntax, after reasoning, ending the turn.
fn tool_call(name: &str, arguments: &serde_json::Value) -> String {
    format!(
        "<think>\nI will run it.\n</think>\n\n<tool_call>\n{}\n</tool_call><|im_end|>",
        serde_json::json!({"name": name, "arguments": arguments})
    )
}

/// The scripted answer to a tool's result.
const TOUCHED: &str = "<think>\nThe command ran.\n</think>\n\nThe file is touched.<|im_end|>";

/// A second turn with thinking on: `claude -p --continue` sends the first
/// turn back, its thinking block (signed by the server) included, and the
/// server takes it: both turns are answered, nothing refused.
#[test]
fn claude_code_continues_a_conversation_with_thinking() {
    let Some(agents) = agents_or_skip("claude_code_continues_a_conversation_with_thinking") else { return };
    let (tmp, server, url) = greeting_server("agent-claude-continue");
    let home = tmp.path().join("home");
    let work = tmp.path().join("project");
    std::fs::create_dir(&home).unwrap();
    std::fs::create_dir(&work).unwrap();
    let mut outs = Vec::new();
    for args in [&["-p", "Say hi", "--model", "agent"][..], &["-p", "Say it again", "--continue", "--model", "agent"]] {
        let (code, out, err) = claude_in(agents, &home, &work, &url, args);
        assert_eq!(code, Some(0), "claude {args:?} failed:\n{out}\n{err}\n{:?}", server.log());
        outs.push(out.trim().to_string());
    }
    let log = server.log();
    drop(server);
    assert_eq!(outs, ["Hello from WASTE.", "Hello from WASTE."], "{log:?}");
    let turns = log.iter().filter(|l| l.starts_with("POST /v1/messages 200 ")).count();
    assert_eq!(turns, 2, "{log:?}");
    assert_eq!(refused(&log), Vec::<&String>::new(), "a request was refused: {log:?}");
}

/// Runs `opencode run ARGS` in `work` with the server as an
/// OpenAI-compatible provider (`@ai-sdk/openai-compatible`, which OpenCode
/// fetches from npm itself) in the project's `opencode.json`, its tools
/// allowed without asking: (exit status, stdout, stderr and OpenCode's own
/// log's end, which says why a run failed before any request).
fn opencode(agents: &Path, home: &Path, work: &Path, url: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let config = serde_json::json!({
        "$schema": "https://opencode.ai/config.json",
        "provider": {"waste": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "WASTE",
            "options": {"baseURL": format!("{url}/v1"), "apiKey": KEY},
            "models": {"agent": {"name": "agent"}},
        }},
        "model": "waste/agent",
        "permission": {"bash": "allow", "edit": "allow"},
    });
    std::fs::write(work.join("opencode.json"), config.to_string()).unwrap();
    let o = Command::new("timeout")
        .arg("300")
        .arg(agents.join("node_modules/.bin/opencode"))
        .arg("run")
        .args(args)
        .args(["-m", "waste/agent"])
        .current_dir(work)
        // OpenCode takes its project from $PWD, not from the working
        // directory: inherited, it would be the test's.
        .env("PWD", work)
        .env("HOME", home)
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .output()
        .expect("run opencode");
    let own_log = std::fs::read_dir(home.join(".local/share/opencode/log"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .collect::<String>();
    let err =
        format!("{}\nits log: {}", String::from_utf8_lossy(&o.stderr), &own_log[own_log.len().saturating_sub(3000)..]);
    (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned(), err)
}

/// OpenCode's one-shot mode: its title request and the turn (its system
/// prompt and tools) are answered on `/v1/chat/completions`, the reasoning
/// goes to `reasoning_content` and is not printed, the reply is, and it
/// exits 0. Then a second turn (`--continue`) with the first in its
/// history, answered the same way.
#[test]
fn opencode_answers_one_shot_through_waste_serve() {
    let Some(agents) = agents_or_skip("opencode_answers_one_shot_through_waste_serve") else { return };
    let (tmp, server, url) = greeting_server("agent-opencode");
    let (home, work) = home_and_project(&tmp);
    for args in [&["Say hi"][..], &["--continue", "Say it again"]] {
        let (code, out, err) = opencode(agents, &home, &work, &url, args);
        assert_eq!(code, Some(0), "opencode run {args:?} failed:\n{out}\n{err}\n{:?}", server.log());
        assert_eq!(out.trim(), "Hello from WASTE.", "{args:?}: {err}\n{:?}", server.log());
    }
    let log = server.log();
    drop(server);
    let turns = log.iter().filter(|l| l.starts_with("POST /v1/chat/completions 200 ")).count();
    assert!(turns >= 3, "a title and two turns: {log:?}");
    assert_eq!(refused(&log), Vec::<&String>::new(), "a request was refused: {log:?}");
}

/// A whole tool turn through OpenCode: the model calls its `bash` tool,
/// OpenCode runs it and sends the result back as a `tool` message, and the
/// answer to that result is printed.
#[test]
fn opencode_runs_the_tool_the_model_calls() {
    let Some(agents) = agents_or_skip("opencode_runs_the_tool_the_model_calls") else { return };
    let tmp = TempDir::new("agent-opencode-tool");
    let model = agent_model(&tmp);
    let (home, work) = home_and_project(&tmp);
    let marker = work.join("touched-by-opencode");
    let arguments = serde_json::json!({"command": format!("touch {}", marker.display()), "description": "Touch it"});
    let (server, url) = scripted_server(&model, &tool_call("bash", &arguments), Some(TOUCHED));
    let run = opencode(agents, &home, &work, &url, &["Touch the marker file"]);
    let log = server.log();
    drop(server);
    assert_tool_turn(&marker, run, &log, "/v1/chat/completions", 2);
}

/// Runs `codex exec ARGS` in `work` against `url` through the Responses
/// API, with a `CODEX_HOME` of its own naming the server as its provider
/// (`wire_api = "responses"`): (exit status, stdout, stderr).
fn codex(agents: &Path, home: &Path, work: &Path, url: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let config = format!(
        "model = \"agent\"\nmodel_provider = \"waste\"\n\n[model_providers.waste]\nname = \"WASTE\"\n\
         base_url = \"{url}/v1\"\nenv_key = \"WASTE_API_KEY\"\nwire_api = \"responses\"\n"
    );
    std::fs::write(home.join("config.toml"), config).unwrap();
    let o = Command::new("timeout")
        .arg("300")
        .arg(agents.join("node_modules/.bin/codex"))
        .args(["exec", "--skip-git-repo-check"])
        .args(args)
        .current_dir(work)
        .env("CODEX_HOME", home)
        .env("WASTE_API_KEY", KEY)
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .output()
        .expect("run codex");
    (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// A home and a project directory for an agent, in `tmp`.
fn home_and_project(tmp: &TempDir) -> (PathBuf, PathBuf) {
    let (home, work) = (tmp.path().join("home"), tmp.path().join("project"));
    std::fs::create_dir(&home).unwrap();
    std::fs::create_dir(&work).unwrap();
    (home, work)
}

/// Codex's one-shot mode through the Responses API: its request (its
/// instructions, developer messages and tools) is answered on
/// `/v1/responses` as a stream of typed events, the reasoning comes back
/// as a reasoning item Codex does not print, the reply is printed, and it
/// exits 0. Then a second turn (`exec resume --last`), which sends the
/// first turn's reasoning item back in its input.
#[test]
fn codex_answers_one_shot_through_the_responses_api() {
    let Some(agents) = agents_or_skip("codex_answers_one_shot_through_the_responses_api") else { return };
    let (tmp, server, url) = greeting_server("agent-codex");
    let (home, work) = home_and_project(&tmp);
    for args in [&["Say hi"][..], &["resume", "--last", "Say it again"]] {
        let (code, out, err) = codex(agents, &home, &work, &url, args);
        assert_eq!(code, Some(0), "codex exec {args:?} failed:\n{out}\n{err}\n{:?}", server.log());
        assert_eq!(out.trim(), "Hello from WASTE.", "{args:?}: {err}\n{:?}", server.log());
    }
    let log = server.log();
    drop(server);
    let turns = log.iter().filter(|l| l.starts_with("POST /v1/responses 200 stream ")).count();
    assert_eq!(turns, 2, "{log:?}");
    assert_eq!(refused(&log), Vec::<&String>::new(), "a request was refused: {log:?}");
}

/// A whole tool turn through Codex: the model calls Codex's
/// `exec_command` tool, which Codex runs (its sandbox off: the test machine
/// may not allow one) and whose output it sends back as a
/// `function_call_output` item; the answer to that result is printed.
#[test]
fn codex_runs_the_tool_the_model_calls() {
    let Some(agents) = agents_or_skip("codex_runs_the_tool_the_model_calls") else { return };
    let tmp = TempDir::new("agent-codex-tool");
    let model = agent_model(&tmp);
    let (home, work) = home_and_project(&tmp);
    let marker = work.join("touched-by-codex");
    let arguments = serde_json::json!({"cmd": format!("touch {}", marker.display())});
    let (server, url) = scripted_server(&model, &tool_call("exec_command", &arguments), Some(TOUCHED));
    let args = ["--dangerously-bypass-approvals-and-sandbox", "Touch the marker file"];
    let run = codex(agents, &home, &work, &url, &args);
    let log = server.log();
    drop(server);
    assert_tool_turn(&marker, run, &log, "/v1/responses", 2);
}
