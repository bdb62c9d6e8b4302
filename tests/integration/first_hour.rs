//! What a new user coming from llama.cpp or Ollama meets first (issue 17):
//! a closed stdout, the seed, llama.cpp's flags, a full chat context, a
//! template of one's own, the docs' commands, and `waste` installed
//! outside the repository.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::common::*;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn bible() -> String {
    root().join("examples/bible-moe.waste").to_string_lossy().into_owned()
}

/// `waste ARGS` with stdout a pipe whose reader is already gone (as under
/// `| head` once head has exited): every write to it fails with EPIPE.
fn with_closed_stdout(args: &[&str], stdin: &str) -> Output {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let mut child = Command::new(waste_bin())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn waste");
    {
        use std::io::Write;
        let _ = child.stdin.take().expect("stdin").write_all(stdin.as_bytes());
    }
    child.wait_with_output().expect("wait for waste")
}

/// Regression (`waste run M "..." | head` panicked with "failed printing
/// to stdout: Broken pipe", exit 101): every command that prints ends
/// quietly with status 0 when its reader has gone away.
#[test]
fn a_closed_stdout_ends_every_printing_command_quietly() {
    let m = bible();
    let sample = root().join("models/bible-moe/heldout-sample.txt").to_string_lossy().into_owned();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["run", &m, "And God said", "-n", "8", "--seed", "1"], ""),
        (vec!["eval", &m, "And God said"], ""),
        (vec!["eval", &m, "And God said", "--json"], ""),
        (vec!["tokenize", &m, "In the beginning"], ""),
        (vec!["detokenize", &m, "5,6,7"], ""),
        (vec!["info", &m], ""),
        (vec!["info", &m, "--json"], ""),
        (vec!["plan", &m], ""),
        (vec!["version"], ""),
        (vec!["version", "--json"], ""),
        (vec!["perplexity", &m, sample.as_str(), "--window", "64"], ""),
        (vec!["bench", &m, "--tokens", "2", "--ctx", "16"], ""),
        (vec!["chat", &m, "-n", "4", "--temp", "0"], "Hello\n/stats\n/help\n"),
    ];
    for (args, stdin) in &cases {
        let o = with_closed_stdout(args, stdin);
        let err = stderr(&o);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(o.status.code(), Some(0), "{args:?}: {err}");
    }
}

/// The seed of the last `(stop: ..., seed N)` stats line.
fn printed_seed(o: &Output) -> Option<u64> {
    let err = stderr(o);
    let at = err.rfind(", seed ")? + ", seed ".len();
    err[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// Regression (the default seed was fixed, so `waste run` at temperature
/// 0.8 printed the same text every time): a random seed per run unless
/// `--seed`, printed at the end, and that seed repeats the run.
#[test]
fn run_picks_a_random_seed_and_prints_it_for_repeating() {
    let m = bible();
    let run = |extra: &[&str]| {
        let mut args = vec!["run", m.as_str(), "And God said", "-n", "24", "--temp", "1.2", "--top-k", "0"];
        args.extend_from_slice(extra);
        let o = waste(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        o
    };
    let (a, b) = (run(&[]), run(&[]));
    let (sa, sb) = (printed_seed(&a).expect("a random seed is printed"), printed_seed(&b).expect("seed"));
    assert_ne!(sa, sb, "two runs drew the same seed");
    assert_ne!(stdout(&a), stdout(&b), "two runs without --seed gave the same text");
    let again = run(&["--seed", &sa.to_string()]);
    assert_eq!(stdout(&again), stdout(&a), "--seed {sa} did not repeat the run");
    assert_eq!(printed_seed(&again), None, "a seed the user gave is not printed back");
    let verbose = run(&["--verbose", "--seed", "5"]);
    assert!(stderr(&verbose).contains("seed 5;"), "{}", stderr(&verbose));
}

/// llama.cpp's spellings where the meaning is the same, and `-ngl`
/// explained instead of read as `-n gl`.
#[test]
fn llama_cpp_flags_are_accepted() {
    let m = bible();
    let ours =
        waste(&["run", &m, "And God said", "--ctx", "64", "--threads", "1", "--seed", "3", "-n", "6", "--stop", "zz"]);
    assert!(ours.status.success(), "{}", stderr(&ours));
    let theirs = waste(&[
        "run",
        "-m",
        &m,
        "-p",
        "And God said",
        "-c",
        "64",
        "-t",
        "1",
        "-s",
        "3",
        "--n-predict",
        "6",
        "-r",
        "zz",
    ]);
    assert!(theirs.status.success(), "{}", stderr(&theirs));
    assert_eq!(stdout(&theirs), stdout(&ours));
    let long = waste(&["run", "--model", &m, "--prompt", "And God said", "--ctx-size", "64", "-s", "3", "-n", "6"]);
    assert_eq!(stdout(&long), stdout(&ours), "{}", stderr(&long));
    let tmp = TempDir::new("llama-flags");
    let prompt = tmp.path().join("p.txt");
    std::fs::write(&prompt, "And God said").unwrap();
    let file = waste(&["run", &m, "-f", prompt.to_str().unwrap(), "-s", "3", "-n", "6", "-c", "64"]);
    assert_eq!(stdout(&file), stdout(&ours), "{}", stderr(&file));
    for ngl in [vec!["run", &m, "x", "-ngl", "99"], vec!["chat", "-m", &m, "--n-gpu-layers", "35"]] {
        let o = waste(&ngl);
        assert_eq!(o.status.code(), Some(2), "{ngl:?}");
        let err = stderr(&o);
        assert!(err.contains("CPU only") && err.lines().count() == 1, "{ngl:?}: {err}");
    }
}

fn chat(args: &[&str], script: &str) -> Output {
    let m = bible();
    let mut all = vec!["chat", m.as_str()];
    all.extend_from_slice(args);
    let o = waste_with_stdin(&all, Some(script));
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    o
}

/// Regression (a full context failed every later turn with "context full:
/// 277 tokens at position 0 exceed the context of 256" until /reset): the
/// oldest turns are dropped (the system message stays) and the chat goes
/// on; with --no-context-shift the turn fails in plain words naming
/// /reset and --ctx, and the REPL goes on.
#[test]
fn chat_drops_the_oldest_turns_when_the_context_is_full() {
    let turns: String = (0..8).map(|i| format!("Tell me of the {i}th day of the creation of the world\n")).collect();
    let o =
        chat(&["--ctx", "96", "-n", "12", "--temp", "0", "--system", "Thou art wise."], &format!("{turns}/stats\n"));
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("oldest messages (the system message stays)"), "{err}");
    assert!(!err.contains("error:"), "{err}");
    assert_eq!(err.matches(" tokens, ").count(), 8, "every turn answered: {err}");
    let o = chat(&["--ctx", "96", "-n", "12", "--temp", "0", "--no-context-shift"], &turns);
    let err = stderr(&o);
    assert!(o.status.success(), "the REPL goes on: {err}");
    let line = err.lines().find(|l| l.contains("context full")).unwrap_or_else(|| panic!("{err}"));
    assert!(line.contains("/reset") && line.contains("--ctx"), "{line}");
}

/// `"""` opens and closes a message of several lines, `/bye` leaves (as in
/// `ollama run`), and chat takes run's sampling flags.
#[test]
fn chat_takes_multiline_messages_bye_and_the_sampling_flags() {
    let o = chat(
        &["-n", "6", "--temp", "0.7", "--min-p", "0.05", "--repeat-penalty", "1.1", "--stop", "zzz", "-s", "1"],
        "\"\"\"In the beginning\nGod created\nthe heaven\"\"\"\n/stats\n/bye\nnot read\n",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("turns 1 |"), "the three lines were one turn: {out}");
    assert_eq!(stderr(&o).matches(" tokens, ").count(), 1, "{}", stderr(&o));
}

/// `--chat-template FILE` renders with the caller's template instead of
/// the model's (llama.cpp's `--chat-template-file`); a file that is not a
/// template is refused in one line.
#[test]
fn chat_template_file_overrides_the_models_template() {
    let tmp = TempDir::new("chat-template");
    let t = tmp.path().join("t.jinja");
    std::fs::write(
        &t,
        "{% for m in messages %}<|im_start|>{{ m.role }}\nSAID: {{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )
    .unwrap();
    let with = chat(&["-n", "4", "--temp", "0", "--chat-template", t.to_str().unwrap()], "Hello\n/stats\n");
    let without = chat(&["-n", "4", "--temp", "0"], "Hello\n/stats\n");
    assert!(with.status.success(), "{}", stderr(&with));
    let prompt = |o: &Output| -> u64 {
        let out = stdout(o);
        let line = out.lines().find(|l| l.starts_with("turns ")).unwrap().to_string();
        let at = line.find("last prompt ").unwrap() + "last prompt ".len();
        line[at..].split(' ').next().unwrap().parse().unwrap()
    };
    assert!(prompt(&with) > prompt(&without), "the template's extra text is in the prompt");
    let o = waste_with_stdin(&["chat", &bible(), "--chat-template", "/nonexistent.jinja"], Some("hi\n"));
    assert_ne!(o.status.code(), Some(0));
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
}

/// The README and the embedding guide tell a new user commands that work
/// wherever cargo builds: no `target/release` path that ignores
/// `CARGO_TARGET_DIR`, the Python binding's `WASTE_LIB` said, the test
/// prerequisites and the install command stated.
#[test]
fn docs_give_commands_that_work_on_a_fresh_machine() {
    for doc in ["README.md", "docs/EMBEDDING.md", "docs/MODEL_CARD.md"] {
        let text = std::fs::read_to_string(root().join(doc)).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.contains("target/release") {
                assert!(line.contains("CARGO_TARGET_DIR:-target"), "{doc}:{}: {line}", n + 1);
            }
        }
    }
    let embedding = std::fs::read_to_string(root().join("docs/EMBEDDING.md")).unwrap();
    assert!(embedding.contains("WASTE_LIB"), "the Python binding's library variable is explained");
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    for needed in ["cargo install --locked --path cli", "openai", "SKIP"] {
        assert!(readme.contains(needed), "README does not mention {needed:?}");
    }
}

/// `cargo install --locked --path cli` (as the README says) gives a
/// `waste` that runs from anywhere: the component is inside the binary, and
/// nothing of the repository is read at run time.
#[test]
fn cargo_install_gives_a_waste_that_runs_without_the_repository() {
    let tmp = TempDir::new("install");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let o = Command::new(cargo)
        .args(["install", "--locked", "--offline", "--path"])
        .arg(root().join("cli"))
        .arg("--root")
        .arg(tmp.path())
        // The tests' own build: only what differs is compiled again.
        .env("CARGO_TARGET_DIR", target_dir())
        .output()
        .expect("run cargo install");
    assert!(o.status.success(), "cargo install failed:\n{}", stderr(&o));
    let installed = tmp.path().join("bin/waste");
    let away = tmp.path().join("elsewhere");
    std::fs::create_dir_all(&away).unwrap();
    let model = away.join("m.waste");
    std::fs::create_dir(&model).unwrap();
    for e in std::fs::read_dir(bible()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), model.join(e.file_name())).unwrap();
    }
    let args = ["run", model.to_str().unwrap(), "And God said", "-n", "6", "--seed", "2"];
    let o = Command::new(&installed)
        .args(args)
        .current_dir(&away)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .output()
        .expect("run the installed waste");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), stdout(&waste(&args)), "the installed binary answers as the one under test");
}
