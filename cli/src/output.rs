//! What the CLI writes: stdout through `outln!` and `write_stdout` (a closed stdout
//! ends a command quietly instead of panicking), one-line errors, the final
//! stats line, progress bars.

use std::io::{IsTerminal, Write};
use std::sync::OnceLock;

/// The first failed write to stdout: `BrokenPipe` is a reader that went away
/// (`waste run ... | head`), after which a command drops what it would
/// print and ends with status 0; any other error is reported at the end.
static STDOUT_FAILED: OnceLock<std::io::Error> = OnceLock::new();

/// Writes to stdout (flushing with `flush`, for streamed text); false once
/// stdout has failed, from then on without trying again.
pub fn write_stdout(args: std::fmt::Arguments<'_>, flush: bool) -> bool {
    if STDOUT_FAILED.get().is_some() {
        return false;
    }
    let mut out = std::io::stdout().lock();
    match out.write_fmt(args).and_then(|_| if flush { out.flush() } else { Ok(()) }) {
        Ok(()) => true,
        Err(e) => {
            let _ = STDOUT_FAILED.set(e);
            false
        }
    }
}

/// A write to stdout that failed other than by the reader going away.
pub fn stdout_error() -> Option<&'static std::io::Error> {
    STDOUT_FAILED.get().filter(|e| e.kind() != std::io::ErrorKind::BrokenPipe)
}

/// `println!` that never panics: see [`write_stdout`].
macro_rules! outln {
    () => {{
        $crate::output::write_stdout(format_args!("\n"), false);
    }};
    ($($arg:tt)*) => {{
        $crate::output::write_stdout(format_args!("{}\n", format_args!($($arg)*)), false);
    }};
}

pub(crate) use outln;

/// One readable line with the cause chain: `error: open x: y: z`.
pub fn error_line(e: &anyhow::Error) {
    let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
    // A cause whose text the previous message already contains adds nothing.
    let mut parts: Vec<&str> = Vec::new();
    for c in &chain {
        if !parts.iter().any(|p| p.contains(c.as_str())) {
            parts.push(c);
        }
    }
    eprintln!("error: {}", parts.join(": ").replace('\n', " "));
}

/// Totals of a generation, for the final stats line.
#[derive(Debug, Default, Clone, Copy)]
pub struct RunTotals {
    pub tokens: u64,
    pub picks: waste_host::Picks,
    pub bytes_read: u64,
    /// Whether the last token's expert reads bypassed the page cache
    /// (`None` before the first token).
    pub direct_io: Option<bool>,
}

pub fn stats_line(t: &RunTotals, seconds: f64) -> String {
    format!(
        "[{} tokens, {:.2} s, {:.2} tok/s | experts {} | {:.1} MB read{}]",
        t.tokens,
        seconds,
        if seconds > 0.0 { t.tokens as f64 / seconds } else { 0.0 },
        t.picks,
        t.bytes_read as f64 / 1e6,
        match t.direct_io {
            Some(true) => ", direct_io on",
            Some(false) => ", direct_io off",
            None => "",
        }
    )
}

/// A progress bar on stderr, hidden when stderr is not a terminal.
pub fn progress_bar(total: u64) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    let style = indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} {msg}")
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}
