//! Shared helpers: fixture paths, temporary directories, running `waste`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The three plain-GQA model types that the CLI-level quantised-format and
/// thread-count tests convert four formats each of: a sample of the family
/// table (`waste_engine::config::FAMILIES`), chosen for CI time, whose error
/// bounds were measured on these. Every row of the table has its exact f32
/// oracle and chunked-prefill test in the engine's own tests.
pub const SAMPLED_FAMILIES: &[&str] = &["qwen3_moe", "olmoe", "mixtral"];

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

/// A fixture directory, which must exist: a missing fixture fails the test.
pub fn fixture(family: &str) -> PathBuf {
    let dir = fixtures().join(format!("tiny-{family}"));
    assert!(
        dir.join("reference.json").is_file(),
        "fixture {} is missing: regenerate it with `python3 tests/gen_fixtures.py`",
        dir.display()
    );
    dir
}

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("waste-test-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The target directory this test binary was built into (its path is
/// `TARGET/release/deps/integration-HASH`), wherever `CARGO_TARGET_DIR`
/// put it: builds the tests start themselves (sampler plugins) go below
/// it, never into the source tree.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors().nth(3).expect("TARGET/release/deps/binary").to_path_buf()
}

/// The `waste` binary under test (tests/bin/waste.rs: the CLI library's
/// `main`, as cli/src/bin/waste.rs).
pub fn waste_bin() -> &'static str {
    env!("CARGO_BIN_EXE_waste-under-test")
}

pub fn waste(args: &[&str]) -> Output {
    waste_with_stdin(args, None)
}

pub fn waste_with_stdin(args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new(waste_bin());
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    let mut child = cmd.spawn().expect("spawn waste");
    if let Some(text) = stdin {
        use std::io::Write;
        // A command refusing its arguments exits before it reads its input;
        // the pipe is then closed under us, which is not the test's failure.
        // (Regression: chat_template_file_overrides_the_models_template failed
        // on "write stdin: Broken pipe" when the refusal won the race.)
        if let Err(e) = child.stdin.take().expect("stdin").write_all(text.as_bytes()) {
            assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "write stdin: {e}");
        }
    }
    child.wait_with_output().expect("wait for waste")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A copy of a flat directory (a container, a checkpoint) at `to`.
/// An edit of a container's manifest.json.
pub type ManifestEdit = fn(&mut serde_json::Value);

/// For each (name, edit, needle): a copy of the container `base` under
/// `tmp` with its manifest edited must be refused at open (`waste eval`)
/// with one line containing `needle`.
pub fn refused_after_manifest_edits(base: &Path, tmp: &Path, cases: &[(&str, ManifestEdit, &str)]) {
    for &(name, edit, needle) in cases {
        let dir = tmp.join(format!("{name}.waste"));
        copy_dir(base, &dir);
        let path = dir.join("manifest.json");
        let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        edit(&mut m);
        std::fs::write(&path, m.to_string()).unwrap();
        let o = waste(&["eval", dir.to_str().unwrap(), "Hello"]);
        let err = stderr(&o);
        assert!(!o.status.success(), "{name}: accepted");
        assert!(err.contains(needle) && err.trim().lines().count() == 1, "{name}: {err}");
    }
}

pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// Converts a fixture with the given formats into `dir/NAME.waste`.
pub fn convert(family: &str, experts: &str, trunk: &str, dir: &Path) -> PathBuf {
    let out = dir.join(format!("{family}-{experts}-{trunk}.waste"));
    let src = fixture(family);
    let o = waste(&["convert", src.to_str().unwrap(), out.to_str().unwrap(), "--experts", experts, "--trunk", trunk]);
    assert!(o.status.success(), "convert {family} failed: {}", stderr(&o));
    out
}

pub struct Reference {
    pub prompt_text: String,
    pub prompt_ids: Vec<u32>,
    pub greedy_ids: Vec<u32>,
    pub vocab: usize,
    /// [T * V]
    pub logits: Vec<f32>,
}

pub fn reference(family: &str) -> Reference {
    let dir = fixture(family);
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    let ids =
        |key: &str| -> Vec<u32> { json[key].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect() };
    let shape = ids("logits_shape");
    let bytes = std::fs::read(dir.join("reference_logits.f32")).unwrap();
    let logits: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    assert_eq!(logits.len(), (shape[0] * shape[1]) as usize);
    Reference {
        prompt_text: json["prompt_text"].as_str().unwrap().to_string(),
        prompt_ids: ids("prompt_ids"),
        greedy_ids: ids("greedy_ids"),
        vocab: shape[1] as usize,
        logits,
    }
}

/// A test that could not run says so: the one definition, which writes
/// past cargo's output capture and to `WASTE_SKIP_LOG`.
pub use waste_engine::skip::report_skip;

/// Regression (chat_template_file_overrides_the_models_template failed on
/// "write stdin: Broken pipe"): a command that refuses its arguments before
/// reading stdin leaves the helper's write to a closed pipe, which is not
/// the test's failure. 1 MB is past any pipe buffer, so the write always
/// meets the closed end.
#[test]
fn waste_with_stdin_survives_a_command_that_exits_before_reading_it() {
    let input = "x".repeat(1 << 20);
    let o = waste_with_stdin(&["tokenize", "/nonexistent.waste", "-"], Some(&input));
    assert_ne!(o.status.code(), Some(0));
    assert!(stderr(&o).contains("does not exist"), "{}", stderr(&o));
}

/// Regression (skips went only to `WASTE_SKIP_LOG`, so outside `.ci/run`
/// a test that returned early looked like a pass): a skipped test's line
/// reaches the terminal through cargo's capture of a passing test.
#[test]
fn a_skip_is_visible_in_cargo_test_output() {
    let exe = std::env::current_exe().expect("the test binary's path");
    let o = Command::new(exe)
        .args(["--exact", "common::skip_probe", "--ignored", "--test-threads", "1"])
        .env("WASTE_SKIP_PROBE", "1")
        .env_remove("WASTE_SKIP_LOG")
        .output()
        .expect("run the probe");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("1 passed"), "the probe did not run: {}", stdout(&o));
    assert!(stderr(&o).contains("SKIP skip_probe: printed past the capture"), "stderr: {}", stderr(&o));
}

/// Run by [`a_skip_is_visible_in_cargo_test_output`] in a child test run.
#[test]
#[ignore = "a probe for a_skip_is_visible_in_cargo_test_output, run by it"]
fn skip_probe() {
    if std::env::var_os("WASTE_SKIP_PROBE").is_some() {
        report_skip("SKIP skip_probe: printed past the capture");
    }
}

/// Index of the largest value, the first of equal ones.
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

/// The greedy next token as the bit-identity tests pick it: the largest
/// logit by `total_cmp`, the last of equal ones.
pub fn greedy_next(logits: &[f32]) -> u32 {
    logits.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i as u32).unwrap()
}

/// Per position of `reference`'s prompt, max |ours - reference| / max
/// |reference|; returns the worst of those and the share of positions with
/// the same top-1.
pub fn compare_positions(logits: &[f32], reference: &Reference) -> (f32, f32) {
    let v = reference.vocab;
    let n = reference.prompt_ids.len();
    let (mut worst, mut agree) = (0.0f32, 0usize);
    for p in 0..n {
        let (ours, theirs) = (&logits[p * v..(p + 1) * v], &reference.logits[p * v..(p + 1) * v]);
        let scale = theirs.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let diff = ours.iter().zip(theirs).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        worst = worst.max(diff / scale);
        agree += usize::from(argmax(ours) == argmax(theirs));
    }
    (worst, agree as f32 / n as f32)
}

/// `waste info --json`'s layer pattern as `attention/ffn` strings.
pub fn layer_pattern(info: &serde_json::Value) -> Vec<String> {
    info["layer_pattern"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| format!("{}/{}", l["attention"].as_str().unwrap(), l["ffn"].as_str().unwrap()))
        .collect()
}

/// Evaluates `head` in a session, saves its state to `file`, evaluates
/// `tail`; then a fresh session loads the file and evaluates `tail`: the
/// two `tail` logits must be the same bits (`what` names the case).
pub fn assert_saved_state_continues(
    engine: &waste_host::Engine,
    container: &Path,
    file: &Path,
    (head, tail): (&[u32], &[u32]),
    what: &str,
) {
    let mut a = open_session(engine, container);
    a.eval(head, false).unwrap();
    a.save_state(file).unwrap();
    let (want, _) = a.eval(tail, true).unwrap();
    let mut b = open_session(engine, container);
    b.load_state(file).unwrap();
    let (got, _) = b.eval(tail, true).unwrap();
    assert!(got == want, "{what}: the restored state diverges");
}

/// The default options with an f32 KV cache: the exact model, as the
/// references compute it (the default bf16 cache rounds keys and values;
/// `kv_type.rs` holds its bound).
pub fn exact() -> waste_host::OpenOptions {
    waste_host::OpenOptions { kv_type: waste_host::KvType::F32, ..waste_host::OpenOptions::default() }
}

/// A session on `container` opened with [`exact`] options.
pub fn open_exact_session(engine: &waste_host::Engine, container: &Path) -> waste_host::Session {
    engine.session(waste_host::Model::open(container, &exact()).unwrap()).unwrap()
}

/// A session on `container` opened with the default options.
pub fn open_session(engine: &waste_host::Engine, container: &Path) -> waste_host::Session {
    engine.session(waste_host::Model::open(container, &waste_host::OpenOptions::default()).unwrap()).unwrap()
}

/// A copy of the shipped bible-moe model with Qwen3's real chat template
/// (which reads `enable_thinking`) in place of its own ChatML one.
pub fn bible_moe_with_qwen3_template(tmp: &TempDir) -> PathBuf {
    let dir = tmp.path().join("m.waste");
    std::fs::create_dir(&dir).unwrap();
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/bible-moe.waste");
    for e in std::fs::read_dir(shipped).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    let qwen3: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixtures().join("chat_templates/qwen3/tokenizer_config.json")).unwrap())
            .unwrap();
    let cfg = dir.join("tokenizer_config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    v["chat_template"] = qwen3["chat_template"].clone();
    std::fs::write(&cfg, v.to_string()).unwrap();
    dir
}

/// `base` with its expert-store options changed by `change`.
pub fn with_store(
    base: waste_host::OpenOptions,
    change: impl FnOnce(&mut waste_engine::store::StoreOptions),
) -> waste_host::OpenOptions {
    let mut options = base;
    change(&mut options.store);
    options
}
