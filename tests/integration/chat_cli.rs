//! `waste chat` driven through a piped stdin (plain line reading) on the
//! shipped bible-moe model, whose chat template is ChatML.

use std::path::PathBuf;

use crate::common::*;

fn model() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/bible-moe.waste").to_string_lossy().into_owned()
}

fn chat(script: &str, extra: &[&str]) -> std::process::Output {
    let m = model();
    let mut args = vec!["chat", m.as_str(), "-n", "8", "--temp", "0"];
    args.extend_from_slice(extra);
    waste_with_stdin(&args, Some(script))
}

/// (turns, position, last prompt, replays) from each `/stats` line.
fn stats_lines(out: &str) -> Vec<(u64, u64, u64, u64)> {
    let num = |line: &str, key: &str| -> u64 {
        let at = line.find(key).unwrap_or_else(|| panic!("{key:?} missing in {line:?}")) + key.len();
        line[at..].trim_start().split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
    };
    out.lines()
        .filter(|l| l.starts_with("turns "))
        .map(|l| (num(l, "turns"), num(l, "position"), num(l, "last prompt"), num(l, "replays")))
        .collect()
}

fn assert_ok(o: &std::process::Output) {
    let err = stderr(o);
    assert!(o.status.success(), "exit {:?}: {err}", o.status.code());
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn chat_two_turns_evaluate_only_the_new_tokens() {
    let o = chat("Hello\n/stats\nAnd again\n/stats\n", &[]);
    assert_ok(&o);
    let s = stats_lines(&stdout(&o));
    assert_eq!(s.len(), 2, "{}", stdout(&o));
    let ((t1, p1, _, r1), (t2, p2, prompt2, r2)) = (s[0], s[1]);
    assert_eq!((t1, t2), (1, 2));
    assert_eq!((r1, r2), (0, 0), "the session should continue, not replay");
    // The second turn evaluated its own tokens only, on top of the first.
    assert!(prompt2 < p1, "second prompt {prompt2} tokens, first turn ended at {p1}");
    assert!(p2 > p1 + prompt2, "position {p2} after {p1} + {prompt2} + a reply");
    assert_eq!(stderr(&o).matches(" tokens, ").count(), 2, "one stats line per turn: {}", stderr(&o));
}

#[test]
fn chat_reset_forgets_the_conversation() {
    let o = chat("Hello\n/reset\n/stats\n", &[]);
    assert_ok(&o);
    assert!(stdout(&o).contains("conversation reset"));
    let s = stats_lines(&stdout(&o));
    assert_eq!(s[0].1, 0, "position after /reset");
}

#[test]
fn chat_save_and_load_continue_the_same_conversation() {
    let tmp = TempDir::new("chat-save");
    let file = tmp.path().join("conv.bin");
    let f = file.to_str().unwrap();
    let plain = chat("Hello\nAnd again\n", &[]);
    let restored = chat(&format!("Hello\n/save {f}\n/reset\n/load {f}\nAnd again\n"), &[]);
    assert_ok(&plain);
    assert_ok(&restored);
    let out = stdout(&restored);
    assert!(out.contains("saved ") && out.contains("loaded "), "{out}");
    let replies: String = out
        .lines()
        .filter(|l| !(l.starts_with("saved ") || l.starts_with("loaded ") || l == &"conversation reset"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(replies, stdout(&plain), "a restored conversation goes on as the original");
}

#[test]
fn chat_help_unknown_command_and_bad_files_keep_the_repl_going() {
    let tmp = TempDir::new("chat-errors");
    let missing = tmp.path().join("nope.bin");
    let script = format!("/help\n/bogus\n/save\n/load {}\nHello\n/stats\n", missing.display());
    let o = chat(&script, &[]);
    assert_ok(&o);
    let (out, err) = (stdout(&o), stderr(&o));
    for cmd in ["/reset", "/stats", "/save FILE", "/load FILE", "/help"] {
        assert!(out.contains(cmd), "/help lacks {cmd}: {out}");
    }
    assert!(err.contains("error: unknown command /bogus"), "{err}");
    assert!(err.contains("/save needs a file"), "{err}");
    assert!(err.contains("nope.bin"), "{err}");
    // The turn after the errors still ran.
    assert_eq!(stats_lines(&out)[0].0, 1, "{out}");
}

#[test]
fn chat_system_message_is_part_of_the_prompt() {
    let o = chat("Hello\n/stats\n", &["--system", "You are terse."]);
    let plain = chat("Hello\n/stats\n", &[]);
    assert_ok(&o);
    assert!(stats_lines(&stdout(&o))[0].2 > stats_lines(&stdout(&plain))[0].2, "the system turn adds tokens");
}

#[test]
fn chat_without_a_template_is_a_clear_error() {
    let tmp = TempDir::new("chat-no-template");
    let dir = tmp.path().join("m.waste");
    std::fs::create_dir(&dir).unwrap();
    for e in std::fs::read_dir(model()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    let cfg = dir.join("tokenizer_config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    v.as_object_mut().unwrap().remove("chat_template");
    std::fs::write(&cfg, v.to_string()).unwrap();
    let o = waste_with_stdin(&["chat", dir.to_str().unwrap()], Some("Hello\n"));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("has no chat template"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn chat_usage_errors_exit_2() {
    for bad in [&["--temp", "-1"][..], &["--top-p", "0"], &["-n", "0"], &["--system"]] {
        // Usage errors come before stdin is read: give it none.
        let m = model();
        let mut args = vec!["chat", m.as_str()];
        args.extend_from_slice(bad);
        let o = waste(&args);
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains("panicked"));
    }
}

#[test]
fn chat_bad_template_var_exits_2() {
    let m = model();
    for (flag, needle) in [
        ("enable_thinking", "expected NAME=JSON"),
        ("=false", "expected NAME=JSON"),
        ("enable_thinking=nope", "the value is not JSON"),
        ("messages=[]", "\"messages\" is set by the renderer itself"),
        ("add_generation_prompt=false", "is set by the renderer itself"),
    ] {
        let o = waste(&["chat", m.as_str(), "--template-var", flag]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{flag}: {err}");
        assert!(err.contains(needle), "{flag}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    let o = waste(&["chat", m.as_str(), "--template-var", "a=1", "--template-var", "a=2"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("given twice"), "{}", stderr(&o));
}

/// `--template-var enable_thinking=false` reaches Qwen3's template: the
/// prompt gains the empty think block transformers renders for it.
#[test]
fn chat_template_var_reaches_the_template() {
    let tmp = TempDir::new("chat-template-var");
    let dir = bible_moe_with_qwen3_template(&tmp);
    let d = dir.to_str().unwrap();
    let last_prompt = |extra: &[&str]| {
        let mut args = vec!["chat", d, "-n", "1", "--temp", "0"];
        args.extend_from_slice(extra);
        let o = waste_with_stdin(&args, Some("Hello\n/stats\n"));
        assert_ok(&o);
        let s = stats_lines(&stdout(&o));
        assert_eq!(s.len(), 1, "{}", stdout(&o));
        s[0].2
    };
    let plain = last_prompt(&[]);
    assert_eq!(last_prompt(&["--template-var", "enable_thinking=true"]), plain);
    let off = last_prompt(&["--template-var", "enable_thinking=false"]);
    assert!(off > plain, "enable_thinking=false: {off} prompt tokens, plain {plain}");
}

/// Regression: `/save` kept the messages but not `--template-var`, so a
/// conversation loaded in a new `waste chat` went on rendering its prompts
/// without the variables it was started with.
#[test]
fn chat_load_restores_the_template_variables_of_the_saved_conversation() {
    let tmp = TempDir::new("chat-save-vars");
    let dir = bible_moe_with_qwen3_template(&tmp);
    let d = dir.to_str().unwrap();
    let file = tmp.path().join("conv.bin");
    let f = file.to_str().unwrap();
    let run = |script: &str, extra: &[&str]| {
        let mut args = vec!["chat", d, "-n", "2", "--temp", "0"];
        args.extend_from_slice(extra);
        let o = waste_with_stdin(&args, Some(script));
        assert_ok(&o);
        stdout(&o)
    };
    let vars = ["--template-var", "enable_thinking=false"];
    let continuous = run("Hello\nAnd again\n/stats\n", &vars);
    let saved = run(&format!("Hello\n/save {f}\n"), &vars);
    assert!(saved.contains("saved "), "{saved}");
    // No flag this time: the variables must come from the saved file.
    let restored = run(&format!("/load {f}\nAnd again\n/stats\n"), &[]);
    assert!(restored.contains(r#"(template variables {"enable_thinking":false})"#), "{restored}");
    let (c, r) = (stats_lines(&continuous), stats_lines(&restored));
    assert_eq!(c.len(), 1, "{continuous}");
    assert_eq!(r.len(), 1, "{restored}");
    assert_eq!(r[0].1, c[0].1, "position after the second turn");
    assert_eq!(r[0].2, c[0].2, "prompt tokens of the second turn");
}

/// `kill -SIG pid` (the test binary has no libc binding of its own).
fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .expect("run kill")
        .success();
    assert!(ok, "kill -{sig} {pid} failed");
}

/// Ctrl-C during a reply cancels that reply only: the REPL answers the
/// next line and exits 0 at the end of input. The reply is caught mid-way by
/// stopping the process as soon as its first text arrives; SIGINT is
/// delivered on SIGCONT, with most of the 200 tokens still to come.
#[test]
fn chat_ctrl_c_cancels_the_reply_and_the_repl_goes_on() {
    use std::io::{Read, Write};
    use std::process::{Command, Stdio};
    let m = model();
    let mut child = Command::new(waste_bin())
        .args(["chat", m.as_str(), "-n", "200", "--temp", "0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn waste chat");
    let pid = child.id();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    stdin.write_all(b"In the beginning\n").unwrap();
    stdin.flush().unwrap();
    let mut first = [0u8; 1];
    stdout.read_exact(&mut first).expect("the first reply's text");
    signal(pid, "STOP");
    signal(pid, "INT");
    signal(pid, "CONT");
    stdin.write_all(b"And God said\n").unwrap();
    drop(stdin);
    let mut out = String::from_utf8_lossy(&first).into_owned();
    stdout.read_to_string(&mut out).unwrap();
    let status = child.wait().unwrap();
    let err = err_reader.join().unwrap();
    assert!(status.success(), "exit {:?}: {err}", status.code());
    assert!(!err.contains("panicked") && !err.contains("error"), "{err}");
    let stats: Vec<&str> = err.lines().filter(|l| l.contains(" tokens, ")).collect();
    assert_eq!(stats.len(), 2, "one stats line per turn: {err}");
    assert!(stats[0].ends_with("(stop: cancelled)"), "first turn: {}", stats[0]);
    let tokens: u32 = stats[0].trim_start_matches('[').split(' ').next().unwrap().parse().unwrap();
    assert!(tokens < 200, "the cancelled reply ran to the end: {}", stats[0]);
    assert!(!stats[1].contains("cancelled"), "second turn: {}", stats[1]);
    // Two replies, each ended by its own newline, the second not empty.
    let replies: Vec<&str> = out.split_terminator('\n').collect();
    assert!(replies.len() >= 2, "{out:?}");
    assert!(!replies.last().unwrap().trim().is_empty(), "{out:?}");
}
