//! What a conversion leaves out of the container, described by part: a
//! release ships tensors no forward pass here reads (Qwen3.5's vision
//! tower, the multi-token-prediction heads of Qwen3.5, Qwen3-Next and GLM,
//! stale rotary buffers). The notes go into the manifest, so `waste info`
//! says what the container is not.

use crate::config::ModelConfig;

/// One line per skipped part, in a fixed order; `names` are the source
/// tensors the container does not hold.
pub fn describe(cfg: &ModelConfig, names: &[String]) -> Vec<String> {
    let mut vision = 0;
    let mut mtp = 0;
    let mut extra_layers = std::collections::BTreeSet::new();
    let mut other = Vec::new();
    for n in names {
        if n.starts_with("model.visual.") || n.starts_with("visual.") {
            vision += 1;
        } else if n.starts_with("mtp.") {
            mtp += 1;
        } else if let Some(l) = extra_layer(cfg, n) {
            extra_layers.insert(l);
        } else {
            other.push(n.as_str());
        }
    }
    let mut notes = Vec::new();
    if vision > 0 {
        notes.push(format!("the vision tower (model.visual.*, {vision} tensors): text input only"));
    }
    if mtp > 0 {
        notes.push(format!("the multi-token-prediction head (mtp.*, {mtp} tensors)"));
    }
    if !extra_layers.is_empty() {
        let layers: Vec<String> = extra_layers.iter().map(|l| format!("model.layers.{l}.*")).collect();
        notes.push(format!(
            "the multi-token-prediction layer{} after the {} decoder layers ({})",
            if layers.len() == 1 { "" } else { "s" },
            cfg.num_layers,
            layers.join(", ")
        ));
    }
    if !other.is_empty() {
        let shown: Vec<&str> = other.iter().take(4).copied().collect();
        let more =
            if other.len() > shown.len() { format!(", and {} more", other.len() - shown.len()) } else { String::new() };
        notes.push(format!("{} unused tensor(s): {}{more}", other.len(), shown.join(", ")));
    }
    notes
}

/// The layer index of a tensor of a decoder layer past the last one the
/// forward pass runs (GLM's `num_nextn_predict_layers`).
fn extra_layer(cfg: &ModelConfig, name: &str) -> Option<usize> {
    let (layer, _) = name.strip_prefix("model.layers.")?.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    (layer >= cfg.num_layers).then_some(layer)
}
