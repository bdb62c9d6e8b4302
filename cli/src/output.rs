//! What the CLI writes besides the generated text: one-line errors, the
//! final stats line, progress bars.

use std::io::IsTerminal;

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
    pub experts_hit: u64,
    pub experts_missed: u64,
    pub bytes_read: u64,
    /// Whether the last token's expert reads bypassed the page cache
    /// (`None` before the first token).
    pub direct_io: Option<bool>,
}

pub fn stats_line(t: &RunTotals, seconds: f64) -> String {
    let uses = t.experts_hit + t.experts_missed;
    let rate = if uses == 0 { 0.0 } else { 100.0 * t.experts_hit as f64 / uses as f64 };
    format!(
        "[{} tokens, {:.2} s, {:.2} tok/s | experts {} hit / {} miss = {:.0}% | {:.1} MB read{}]",
        t.tokens,
        seconds,
        if seconds > 0.0 { t.tokens as f64 / seconds } else { 0.0 },
        t.experts_hit,
        t.experts_missed,
        rate,
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
