//! Recorded routing traces (JSONL, one line per decode step:
//! `{"tok": n, "layers": [[expert ids, sorted], ...]}` over the MoE layers
//! only), replayed by benchmarks and the cache simulator.

use std::path::Path;

use crate::error::{Error, Result};

pub struct RouteTrace {
    /// Per step, per MoE layer, the routed experts.
    pub steps: Vec<Vec<Vec<u32>>>,
    pub layers: usize,
    /// Largest expert id seen, plus one.
    pub experts: usize,
    pub top_k: usize,
}

pub fn read_route_trace(path: &Path) -> Result<RouteTrace> {
    let bytes = crate::files::read_file(path, 1 << 30)?;
    let text = String::from_utf8(bytes).map_err(|_| Error::format(path, "not UTF-8"))?;
    let mut steps = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let bad = |msg: &str| Error::format(path, format!("line {}: {msg}", n + 1));
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| bad(&e.to_string()))?;
        let layers = v.get("layers").and_then(|l| l.as_array()).ok_or_else(|| bad("no \"layers\" array"))?;
        let mut step = Vec::with_capacity(layers.len());
        for l in layers {
            let ids = l.as_array().ok_or_else(|| bad("a layer is not an array"))?;
            let ids: Option<Vec<u32>> = ids.iter().map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok())).collect();
            step.push(ids.ok_or_else(|| bad("an expert id is not a small integer"))?);
        }
        steps.push(step);
    }
    let first = steps.first().ok_or_else(|| Error::format(path, "the trace has no steps"))?;
    let layers = first.len();
    let top_k = first.first().map_or(0, Vec::len);
    if layers == 0 || top_k == 0 || steps.iter().any(|s| s.len() != layers || s.iter().any(|l| l.len() != top_k)) {
        return Err(Error::format(path, "steps disagree on the number of layers or experts per layer"));
    }
    let experts = steps.iter().flatten().flatten().copied().max().map_or(0, |m| m as usize + 1);
    Ok(RouteTrace { steps, layers, experts, top_k })
}
