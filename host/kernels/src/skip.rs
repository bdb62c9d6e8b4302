//! How a test that cannot run says so. A skip is never a silent pass: the
//! line goes to the real stderr (cargo's test harness captures only the
//! `print!` family, so a direct write shows even for a passing test) and,
//! when `WASTE_SKIP_LOG` names a file (`.ci/run` sets it), is appended
//! there, where CI fails on any skip not listed in `.ci/allowed-skips`.

use std::io::Write;

/// Reports a test that could not run, with its reason. Test support: every
/// crate's tests call this one definition.
pub fn report_skip(message: &str) {
    // Straight to file descriptor 2, past the harness's capture.
    let _ = writeln!(std::io::stderr().lock(), "{message}");
    if let Some(path) = std::env::var_os("WASTE_SKIP_LOG") {
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{message}");
        }
    }
}
