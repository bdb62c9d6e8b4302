//! `waste convert --verify`: every checksum of the new container checked,
//! every expert record decoded back and compared with the source matrix it
//! was made from, and the errors held to a limit per format.

use std::fs::File;
use std::path::Path;
use waste_platform::FileExt;

use serde::Serialize;

use crate::checkpoint::HfCheckpoint;
use crate::container::Container;
use crate::error::{Error, Result};
use crate::quant::{self, ExpertFormat};

/// The error of one stored matrix against its source.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MatrixError {
    pub layer: usize,
    pub expert: usize,
    /// `gate`, `up` or `down`.
    pub matrix: String,
    pub max_abs: f64,
    /// Root mean square of the error.
    pub rms: f64,
    /// `rms / rms(source)`; 0 for an all-zero source matrix.
    pub relative: f64,
    /// The most `relative` this matrix's format is allowed
    /// ([`max_relative_error`]).
    pub limit: f64,
}

/// The largest relative RMS error `convert --verify` accepts for an expert
/// matrix stored in `format`: about twice what the format gives on
/// Gaussian weights (the worst matrix of the tiny Qwen3-MoE fixture: f32
/// 0, q8 0.0063, q4 0.095, rvq3 0.138, rvq4p 0.177, rvq2 0.269;
/// docs/RELIABILITY.md). Past it the
/// quantiser, the decoder or the bytes went wrong, not the format's
/// rounding.
pub fn max_relative_error(format: ExpertFormat) -> f64 {
    match format {
        ExpertFormat::F32 => 1e-6,
        ExpertFormat::Q8 => 0.02,
        ExpertFormat::Q4 => 0.2,
        ExpertFormat::Rvq3 => 0.3,
        ExpertFormat::Rvq2 => 0.5,
        ExpertFormat::Rvq4p => 0.35,
        // The file's own blocks, copied: decoded they are the source's
        // values exactly.
        ExpertFormat::Ggml(_) => 1e-6,
    }
}

/// Refuses rows past their limit (`limit` overrides every row's), naming
/// the first few.
pub fn check_limits(rows: &[MatrixError], limit: Option<f64>) -> Result<()> {
    // A NaN error (a decoder gone wrong) is past any limit.
    let over: Vec<&MatrixError> =
        rows.iter().filter(|r| r.relative.is_nan() || r.relative > limit.unwrap_or(r.limit)).collect();
    if over.is_empty() {
        return Ok(());
    }
    let named: Vec<String> = over
        .iter()
        .take(5)
        .map(|r| format!("layer {} expert {} {} {:.4}", r.layer, r.expert, r.matrix, r.relative))
        .collect();
    Err(Error::Runtime(format!(
        "{} of {} expert matrices exceed the relative error limit of {}: {}{}",
        over.len(),
        rows.len(),
        limit.unwrap_or(over[0].limit),
        named.join(", "),
        if over.len() > named.len() { ", ..." } else { "" }
    )))
}

pub fn error_stats(got: &[f32], want: &[f32]) -> (f64, f64, f64) {
    let (mut max, mut se, mut ss) = (0f64, 0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        let d = (g as f64 - w as f64).abs();
        max = max.max(d);
        se += d * d;
        ss += (w as f64) * (w as f64);
    }
    let n = want.len().max(1) as f64;
    let rms = (se / n).sqrt();
    let src = (ss / n).sqrt();
    (max, rms, if src > 0.0 { rms / src } else { 0.0 })
}

/// Checks every checksum of the container `out` (a damaged byte is an
/// error naming its tensor or record), then decodes every record and
/// measures it against the checkpoint `src`; `tick(done, total)` reports
/// progress. The rows are returned whatever their error: [`check_limits`]
/// judges them.
pub fn verify(src: &Path, out: &Path, tick: &mut dyn FnMut(u64, u64)) -> Result<Vec<MatrixError>> {
    let ckpt = HfCheckpoint::open(src)?;
    let mut container = Container::open(out)?;
    container.set_verify(crate::container::Verify::All)?;
    container.check_trunk()?;
    let banks = container.expert_banks()?;
    let (shape, record) = (banks.shape(), banks.record_bytes());
    let layers = banks.moe_layers();
    let total: u64 = layers.iter().map(|&l| banks.bank(l).map_or(0, |b| b.experts) as u64).sum();
    let mut done = 0u64;
    let mut out_rows = Vec::new();
    let mut buf = vec![0u8; record];
    for layer in layers {
        let Some(bank) = banks.bank(layer) else { continue };
        let (fmt, limit) = (bank.format, max_relative_error(bank.format));
        let file = File::open(&bank.path).map_err(|e| Error::io(&bank.path, e))?;
        for expert in 0..bank.experts {
            file.read_exact_at(&mut buf, (expert * record) as u64).map_err(|e| Error::io(&bank.path, e))?;
            banks.check_record(layer, expert, &buf)?;
            let payload = &buf[banks.payload_range(layer)];
            quant::check_expert_payload(fmt, shape, payload, bank.codebooks.as_ref())
                .map_err(|e| Error::format(&bank.path, format!("record of expert {expert}: {e}")))?;
            let (g, u, d) = quant::decode_expert(fmt, shape, payload, bank.codebooks.as_ref());
            let source = ckpt.expert_f32(layer, expert)?;
            for ((name, got), want) in [("gate", g), ("up", u), ("down", d)].into_iter().zip(source.iter()) {
                let (max_abs, rms, relative) = error_stats(&got, want);
                out_rows.push(MatrixError { layer, expert, matrix: name.to_string(), max_abs, rms, relative, limit });
            }
            done += 1;
            tick(done, total);
        }
    }
    Ok(out_rows)
}
