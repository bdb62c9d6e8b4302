//! `waste convert --verify`: the per-matrix error table (or JSON).

use std::path::Path;

use anyhow::{Context, Result};

use crate::output;
use crate::output::outln;

/// Prints the table (or JSON), then fails past the format's error limit
/// (or `limit`) naming the matrices.
pub fn verify(src: &Path, out: &Path, json: bool, limit: Option<f64>) -> Result<()> {
    let mut bar: Option<indicatif::ProgressBar> = None;
    let rows = waste_host::verify_conversion(src, out, &mut |done, total| {
        let bar = bar.get_or_insert_with(|| output::progress_bar(total));
        bar.set_position(done);
    })
    .with_context(|| format!("verifying {} against {}", out.display(), src.display()))?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let judged = waste_host::check_limits(&rows, limit)
        .with_context(|| format!("verifying {} against {}", out.display(), src.display()));
    if json {
        outln!("{}", serde_json::to_string_pretty(&rows)?);
        return judged;
    }
    outln!("{:>5} {:>6} {:<5} {:>12} {:>12} {:>10}", "layer", "expert", "mat", "max_abs", "rms", "relative");
    for r in &rows {
        outln!(
            "{:>5} {:>6} {:<5} {:>12.4e} {:>12.4e} {:>10.4e}",
            r.layer,
            r.expert,
            r.matrix,
            r.max_abs,
            r.rms,
            r.relative
        );
    }
    let worst = rows.iter().map(|r| r.relative).fold(0f64, f64::max);
    let mean = rows.iter().map(|r| r.relative).sum::<f64>() / rows.len().max(1) as f64;
    let bound = limit.or(rows.first().map(|r| r.limit)).unwrap_or(0.0);
    outln!(
        "{} matrices: relative error mean {mean:.4e}, worst {worst:.4e} (limit {bound}); checksums intact",
        rows.len()
    );
    judged
}
