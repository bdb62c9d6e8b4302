//! `Model::open_with_progress` through the Rust API: trunk bytes rise
//! monotonically to the trunk's size, and the learned-hotlist preload is
//! reported when the container carries a usage file. Also the `direct_io`
//! flag of the per-token event, which must agree with the store's own.

use std::path::{Path, PathBuf};

use waste_host::{Engine, GenerateParams, Model, OpenOptions, OpenProgress};

use crate::common::*;

fn bible() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/bible-moe.waste")
}

fn open_recording(path: &Path) -> (std::sync::Arc<Model>, Vec<OpenProgress>) {
    let mut events = Vec::new();
    let model = Model::open_with_progress(path, &OpenOptions::default(), &mut |p| events.push(*p)).unwrap();
    (model, events)
}

#[test]
fn open_progress_trunk_bytes_rise_monotonically_to_the_trunk_size() {
    let tmp = TempDir::new("open-progress");
    for path in [bible(), convert("qwen3_moe", "q4", "q8", tmp.path())] {
        let (model, events) = open_recording(&path);
        let trunk: Vec<(u64, u64)> = events
            .iter()
            .filter_map(|e| match *e {
                OpenProgress::Trunk { loaded, total } => Some((loaded, total)),
                _ => None,
            })
            .collect();
        let total = model.memory_used().trunk;
        assert!(total > 0);
        assert_eq!(trunk.first(), Some(&(0, total)), "{}: starts at 0", path.display());
        assert_eq!(trunk.last(), Some(&(total, total)), "{}: ends at the total", path.display());
        assert!(trunk.iter().all(|&(_, t)| t == total), "one total throughout");
        assert!(trunk.windows(2).all(|w| w[0].0 < w[1].0), "strictly rising: {trunk:?}");
        // One event per tensor: a bar that moves, not a jump at the end.
        let tensors = model.info().num_layers;
        assert!(trunk.len() > tensors, "{} events for {tensors} layers", trunk.len());
        // Every trunk event comes before any preload event.
        let last_trunk = events.iter().rposition(|e| matches!(e, OpenProgress::Trunk { .. })).unwrap();
        assert_eq!(last_trunk, trunk.len() - 1);
        // Without a usage file there is no preload to report.
        assert_eq!(events.len(), trunk.len(), "{events:?}");
    }
}

#[test]
fn open_progress_reports_the_hotlist_preload() {
    let tmp = TempDir::new("open-progress-preload");
    let dir = tmp.path().join("bible.waste");
    copy_dir(&bible(), &dir);
    {
        let model = Model::open(&dir, &OpenOptions::default()).unwrap();
        let mut session = Engine::new().unwrap().session(model.clone()).unwrap();
        let prompt = session.tokenize("In the beginning").unwrap();
        let params = GenerateParams { temperature: 0.0, max_tokens: 8, ..GenerateParams::default() };
        session.generate(&prompt, &params, |_| true).unwrap();
        model.save_usage().unwrap();
    }
    let (model, events) = open_recording(&dir);
    let n = events.len();
    let record = model.info().expert_record_bytes;
    // PreloadStarted names what will be read, a Preloading per record
    // counts up to it (the bar is honest), Preloaded says what landed.
    let started = events.iter().position(|e| matches!(e, OpenProgress::PreloadStarted { .. })).expect("PreloadStarted");
    let OpenProgress::PreloadStarted { records: planned, bytes: planned_bytes } = events[started] else {
        unreachable!()
    };
    assert_eq!(planned_bytes, planned as u64 * record);
    let steps: Vec<usize> = events[started + 1..n - 1]
        .iter()
        .map(|e| match *e {
            OpenProgress::Preloading { records, bytes } => {
                assert_eq!(bytes, records as u64 * record);
                records
            }
            other => panic!("{other:?} between PreloadStarted and Preloaded: {events:?}"),
        })
        .collect();
    assert_eq!(steps, (1..=planned).collect::<Vec<_>>(), "{events:?}");
    let OpenProgress::Preloaded { records, bytes } = events[n - 1] else {
        panic!("the last event is not Preloaded: {events:?}");
    };
    assert!(records > 0, "the usage file names experts used by the run");
    assert_eq!(records, planned);
    assert_eq!(records as u64, model.store_stats().preloaded);
    assert_eq!(bytes, records as u64 * record);
    // With the cache off nothing is preloaded, and nothing is reported.
    let mut off = Vec::new();
    Model::open_with_progress(&dir, &with_store(OpenOptions::default(), |s| s.keep = false), &mut |p| off.push(*p))
        .unwrap();
    assert!(off.iter().all(|e| matches!(e, OpenProgress::Trunk { .. })), "{off:?}");
}

#[test]
fn token_event_direct_io_agrees_with_the_store() {
    for direct in [true, false] {
        let model = Model::open(&bible(), &with_store(OpenOptions::default(), |s| s.direct_io = direct)).unwrap();
        let expected = model.expert_store().direct_io();
        if !direct {
            assert!(!expected, "direct I/O off was asked for");
        }
        let mut session = Engine::new().unwrap().session(model).unwrap();
        let prompt = session.tokenize("In the beginning").unwrap();
        let params = GenerateParams { temperature: 0.0, max_tokens: 4, ..GenerateParams::default() };
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = seen.clone();
        session
            .generate(&prompt, &params, move |e| {
                sink.lock().unwrap().push(e.stats.direct_io);
                true
            })
            .unwrap();
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 4);
        assert!(seen.iter().all(|&d| d == expected), "asked {direct}, store {expected}, events {seen:?}");
    }
}

/// The CLI draws the open progress bar on a terminal only: run under
/// `script` (a pseudo-terminal) it appears, piped it does not.
#[test]
fn open_progress_bar_is_drawn_on_a_tty_only() {
    let model = bible();
    let waste = waste_bin();
    let piped = waste_with_stdin(&["run", model.to_str().unwrap(), "In the beginning", "-n", "2"], None);
    assert!(piped.status.success(), "{}", stderr(&piped));
    assert!(!stderr(&piped).contains("opening"), "a bar on a pipe: {:?}", stderr(&piped));
    assert!(!stderr(&piped).contains('\r'), "{:?}", stderr(&piped));
    let tmp = TempDir::new("open-progress-tty");
    let log = tmp.path().join("tty.log");
    let command = format!("{waste} run {} 'In the beginning' -n 2 > /dev/null", model.display());
    let ran = std::process::Command::new("script")
        .args(["-q", "-e", "-c", &command, log.to_str().unwrap()])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .status();
    match ran {
        Err(e) => {
            report_skip(&format!(
                "SKIP open_progress_bar_is_drawn_on_a_tty_only: `script` (util-linux) is not available: {e}"
            ));
            return;
        }
        Ok(s) => assert!(s.success(), "script {s:?}: {}", std::fs::read_to_string(&log).unwrap_or_default()),
    }
    let tty = String::from_utf8_lossy(&std::fs::read(&log).unwrap()).into_owned();
    assert!(tty.contains("opening trunk"), "no bar on the terminal: {tty:?}");
    assert!(tty.contains("MiB"), "the bar counts bytes: {tty:?}");
}
