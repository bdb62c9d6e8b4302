//! The learned hotlist: per-expert demand counts saved inside the
//! container, so the next open can preload the hottest experts.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Name of the usage file inside a container directory.
pub const USAGE_FILE: &str = "usage.json";

#[derive(Serialize, Deserialize)]
struct UsageFile {
    format: String,
    moe_layers: usize,
    experts: usize,
    /// `[moe_layers * experts]`, MoE layers in ascending order.
    counts: Vec<u64>,
}

const FORMAT: &str = "waste-usage-0";

pub fn load(path: &Path, moe_layers: usize, experts: usize) -> Result<Vec<u64>> {
    let bytes = crate::files::read_file(path, 64 << 20)?;
    let f: UsageFile =
        serde_json::from_slice(&bytes).map_err(|e| Error::format(path, format!("malformed usage file: {e}")))?;
    if f.format != FORMAT
        || f.moe_layers != moe_layers
        || f.experts != experts
        || f.counts.len() != moe_layers * experts
    {
        return Err(Error::format(
            path,
            format!(
                "usage file is for {} layers x {} experts, the model has {moe_layers} x {experts}; delete it",
                f.moe_layers, f.experts
            ),
        ));
    }
    Ok(f.counts)
}

/// Adds `counts` to those already saved at `path` and writes the sum.
pub fn save(path: &Path, moe_layers: usize, experts: usize, counts: &[u64]) -> Result<()> {
    let mut total = if path.is_file() { load(path, moe_layers, experts)? } else { vec![0; moe_layers * experts] };
    for (t, c) in total.iter_mut().zip(counts) {
        *t += c;
    }
    let f = UsageFile { format: FORMAT.into(), moe_layers, experts, counts: total };
    let json = serde_json::to_vec(&f).map_err(|e| Error::Runtime(e.to_string()))?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, json).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}
