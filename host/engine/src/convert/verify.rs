//! `waste convert --verify`: every expert record decoded back and compared
//! with the source matrix it was made from.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use serde::Serialize;

use crate::checkpoint::HfCheckpoint;
use crate::container::Container;
use crate::error::{Error, Result};
use crate::quant;

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

/// Decodes every record of the container `out` and measures it against the
/// checkpoint `src`; `tick(done, total)` reports progress.
pub fn verify(src: &Path, out: &Path, tick: &mut dyn FnMut(u64, u64)) -> Result<Vec<MatrixError>> {
    let ckpt = HfCheckpoint::open(src)?;
    let container = Container::open(out)?;
    let banks = container.expert_banks()?;
    let (fmt, shape, record) = (banks.format(), banks.shape(), banks.record_bytes());
    let layers = banks.moe_layers();
    let total: u64 = layers.iter().map(|&l| banks.bank(l).map_or(0, |b| b.experts) as u64).sum();
    let mut done = 0u64;
    let mut out_rows = Vec::new();
    let mut buf = vec![0u8; record];
    for layer in layers {
        let Some(bank) = banks.bank(layer) else { continue };
        let file = File::open(&bank.path).map_err(|e| Error::io(&bank.path, e))?;
        for expert in 0..bank.experts {
            file.read_exact_at(&mut buf, (expert * record) as u64).map_err(|e| Error::io(&bank.path, e))?;
            banks.check_header(layer, expert, &buf)?;
            let payload = &buf[banks.payload_range()];
            quant::check_expert_payload(fmt, shape, payload, bank.codebooks.as_ref())
                .map_err(|e| Error::format(&bank.path, format!("record of expert {expert}: {e}")))?;
            let (g, u, d) = quant::decode_expert(fmt, shape, payload, bank.codebooks.as_ref());
            let source = ckpt.expert_f32(layer, expert)?;
            for ((name, got), want) in [("gate", g), ("up", u), ("down", d)].into_iter().zip(source.iter()) {
                let (max_abs, rms, relative) = error_stats(&got, want);
                out_rows.push(MatrixError { layer, expert, matrix: name.to_string(), max_abs, rms, relative });
            }
            done += 1;
            tick(done, total);
        }
    }
    Ok(out_rows)
}
