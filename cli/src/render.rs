//! The terminal renderer of the per-token event: the text goes to stdout as
//! it arrives; a live status line (tokens, tok/s, cache hit rate, disk MB/s)
//! goes to stderr while stderr is a terminal that stdout does not share.
//!
//! The status line is redrawn in place with `\r` + erase-line. When stdout is
//! the same terminal the text and the status line would fight over one
//! cursor, so the status line is only drawn when stdout is redirected (a
//! file or a pipe) and stderr is still a terminal; the final stats line is
//! printed either way.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use waste_host::TokenEvent;

use crate::output::RunTotals;

/// How often the status line is redrawn at most: often enough to look live,
/// rarely enough that drawing costs nothing next to a token.
const REDRAW: Duration = Duration::from_millis(200);

pub struct Renderer {
    pub totals: RunTotals,
    started: Instant,
    last_draw: Option<Instant>,
    live: bool,
    drawn: bool,
    /// Whether the last token's expert reads bypassed the page cache.
    direct_io: bool,
}

impl Renderer {
    pub fn new() -> Renderer {
        let live = std::io::stderr().is_terminal() && !std::io::stdout().is_terminal();
        Renderer {
            totals: RunTotals::default(),
            started: Instant::now(),
            last_draw: None,
            live,
            drawn: false,
            direct_io: false,
        }
    }

    /// Writes the token's text to stdout and updates the totals and the
    /// status line; false when stdout is closed (a pipe to `head`).
    pub fn token(&mut self, event: &TokenEvent) -> bool {
        let written = crate::output::write_stdout(format_args!("{}", event.text), true);
        self.totals.tokens += 1;
        self.totals.picks.add(&event.stats.picks());
        self.totals.bytes_read += event.stats.bytes_read;
        self.direct_io = event.stats.direct_io;
        self.totals.direct_io = Some(event.stats.direct_io);
        if self.live && self.last_draw.is_none_or(|t| t.elapsed() >= REDRAW) {
            self.last_draw = Some(Instant::now());
            eprint!("\r\x1b[K{}", status_text(&self.totals, self.seconds(), self.direct_io));
            self.drawn = true;
        }
        written
    }

    pub fn seconds(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Erases the status line, leaving stderr as if it had never been drawn.
    pub fn clear(&mut self) {
        if self.drawn {
            eprint!("\r\x1b[K");
            self.drawn = false;
        }
    }
}

impl Drop for Renderer {
    fn drop(&mut self) {
        self.clear();
    }
}

/// `12 tokens | 8.1 tok/s | reuse 41% | disk 35.2 MB/s direct` (reuse: the
/// picks the cache served from what it held, `Picks::reuse_rate`); `buffered`
/// instead of `direct` when the file system refused to bypass the page
/// cache, where disk MB/s may be partly page-cache hits.
pub fn status_text(t: &RunTotals, seconds: f64, direct_io: bool) -> String {
    let per_s = |v: f64| if seconds > 0.0 { v / seconds } else { 0.0 };
    format!(
        "{} tokens | {:.1} tok/s | reuse {:.0}% | disk {:.1} MB/s {}",
        t.tokens,
        per_s(t.tokens as f64),
        100.0 * t.picks.reuse_rate(),
        per_s(t.bytes_read as f64 / 1e6),
        if direct_io { "direct" } else { "buffered" }
    )
}

/// Opens a model with a progress bar on stderr (trunk bytes, then the
/// hotlist preload) while stderr is a terminal; nothing is drawn when it is
/// piped, and the bar is erased once the model is open.
pub fn open_model(
    path: &std::path::Path,
    options: &waste_host::OpenOptions,
) -> waste_host::Result<std::sync::Arc<waste_host::Model>> {
    use waste_host::OpenProgress;
    if !std::io::stderr().is_terminal() {
        return waste_host::Model::open(path, options);
    }
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} opening {msg} {bar:30} {bytes}/{total_bytes} ({bytes_per_sec})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message("trunk");
    let result = waste_host::Model::open_with_progress(path, options, &mut |p| match *p {
        OpenProgress::Trunk { loaded, total } => {
            bar.set_length(total);
            bar.set_position(loaded);
        }
        // The hotlist preload is reads of its own, shown as such: the bar
        // starts over for the bytes it reads.
        OpenProgress::PreloadStarted { bytes, .. } => {
            bar.set_message("preloading hot experts");
            bar.set_length(bytes);
            bar.set_position(0);
            bar.reset_eta();
        }
        OpenProgress::Preloading { bytes, .. } => bar.set_position(bytes),
        OpenProgress::Preloaded { .. } => {}
    });
    bar.finish_and_clear();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_text_reports_rates_and_survives_zero_time() {
        let picks = waste_host::Picks { reused: 6, prefetched: 3, missed: 1 };
        let t = RunTotals { tokens: 10, picks, bytes_read: 20_000_000, direct_io: Some(true) };
        assert_eq!(status_text(&t, 2.0, true), "10 tokens | 5.0 tok/s | reuse 60% | disk 10.0 MB/s direct");
        assert_eq!(
            crate::output::stats_line(&t, 2.0),
            "[10 tokens, 2.00 s, 5.00 tok/s | experts 6 reused / 3 prefetched / 1 read = 60% reuse | 20.0 MB read, direct_io on]"
        );
        let buffered = RunTotals { direct_io: Some(false), ..t };
        assert!(crate::output::stats_line(&buffered, 2.0).ends_with("MB read, direct_io off]"));
        assert!(crate::output::stats_line(&RunTotals::default(), 0.0).ends_with("0.0 MB read]"));
        assert_eq!(
            status_text(&RunTotals::default(), 0.0, false),
            "0 tokens | 0.0 tok/s | reuse 0% | disk 0.0 MB/s buffered"
        );
    }
}
