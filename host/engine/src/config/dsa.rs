//! DeepSeek Sparse Attention (DSA) on top of DeepSeek-V3's MLA:
//! DeepSeek-V3.2 (`deepseek_v32`) and GLM-5 (`glm_moe_dsa`). A lightning
//! indexer scores every earlier token for the current query and attention
//! runs over the top `index_topk` of them (transformers 5.24,
//! `DeepseekV32Indexer`, `GlmMoeDsaIndexer`).
//!
//! Config keys follow transformers' `DeepseekV32Config` / `GlmMoeDsaConfig`,
//! including GLM's ways of naming which layers run their own indexer
//! (`indexer_types`, `index_topk_pattern`, `index_topk_freq` with
//! `index_skip_topk_offset`).

use serde_json::Value;

use super::{Reader, MAX_HEADS, MAX_HEAD_DIM, MAX_POSITIONS};
use crate::error::Result;

/// The indexer's shape and where it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dsa {
    /// `index_n_heads`, `index_head_dim`.
    pub n_heads: usize,
    pub head_dim: usize,
    /// Positions attended per query once the context is longer.
    pub topk: usize,
    /// The indexer's rope dims turn as interleaved pairs (GLM-5) rather
    /// than half-split (DeepSeek-V3.2: "the indexer uses NON-interleaved
    /// RoPE, unlike the main MLA attention").
    pub interleaved_rope: bool,
    /// Per layer: it runs its own indexer (`"full"`), or reuses the
    /// selection of the nearest earlier layer that does (`"shared"`).
    pub own_indexer: Vec<bool>,
}

impl Dsa {
    /// Whether layer `layer` runs (and caches keys for) its own indexer.
    pub fn has_indexer(&self, layer: usize) -> bool {
        self.own_indexer.get(layer).copied().unwrap_or(false)
    }
}

/// The model types that carry DSA.
pub fn is_dsa_model_type(model_type: &str) -> bool {
    matches!(model_type, "deepseek_v32" | "glm_moe_dsa")
}

/// The indexer settings of a `deepseek_v32` / `glm_moe_dsa` config whose
/// MLA has rope width `rope_dim`.
pub(super) fn parse(r: &Reader<'_>, model_type: &str, num_layers: usize, rope_dim: usize) -> Result<Dsa> {
    let glm = model_type == "glm_moe_dsa";
    let default_heads = if glm { 32 } else { 64 };
    let n_heads = r.bounded("index_n_heads", r.usize_opt("index_n_heads")?.unwrap_or(default_heads), MAX_HEADS)?;
    let head_dim = r.bounded("index_head_dim", r.usize_opt("index_head_dim")?.unwrap_or(128), MAX_HEAD_DIM)?;
    let topk = r.bounded("index_topk", r.usize_opt("index_topk")?.unwrap_or(2048), MAX_POSITIONS)?;
    if n_heads == 0 || topk == 0 {
        return Err(r.err(if n_heads == 0 { "index_n_heads" } else { "index_topk" }, "must be at least 1"));
    }
    if head_dim < rope_dim {
        return Err(r.err(
            "index_head_dim",
            format!("{head_dim} is narrower than the {rope_dim} rope dims the indexer rotates"),
        ));
    }
    if let Some(Value::Array(kinds)) = r.get("layer_types") {
        if let Some(k) = kinds.iter().find(|k| k.as_str() != Some("indexed_attention")) {
            return Err(r.unsupported("layer_types", format!("{k} (only \"indexed_attention\")")));
        }
    }
    let own_indexer = if glm { glm_indexer_layers(r, num_layers)? } else { vec![true; num_layers] };
    if own_indexer.first() == Some(&false) {
        return Err(r.err("indexer_types", "layer 0 is \"shared\" but no earlier layer runs an indexer"));
    }
    Ok(Dsa { n_heads, head_dim, topk, interleaved_rope: glm, own_indexer })
}

/// `GlmMoeDsaConfig.__post_init__`: `indexer_types`, else
/// `index_topk_pattern` (a string of F/S or a list), else layer `i` is full
/// when `max(i - offset + 1, 0) % freq == 0` (freq `index_topk_freq`,
/// default 1; offset `index_skip_topk_offset`, default 2).
fn glm_indexer_layers(r: &Reader<'_>, num_layers: usize) -> Result<Vec<bool>> {
    let kinds: Vec<String> = match (r.get("indexer_types"), r.get("index_topk_pattern")) {
        (Some(v), _) if !v.is_null() => string_list(r, "indexer_types", v)?,
        (_, Some(Value::String(p))) => p
            .chars()
            .map(|c| match c {
                'F' => Ok("full".to_string()),
                'S' => Ok("shared".to_string()),
                other => Err(r.err("index_topk_pattern", format!("`{other}` is neither F nor S"))),
            })
            .collect::<Result<_>>()?,
        (_, Some(v)) if !v.is_null() => string_list(r, "index_topk_pattern", v)?,
        _ => {
            let freq = r.usize_opt("index_topk_freq")?.unwrap_or(1).max(1);
            let offset = r.usize_opt("index_skip_topk_offset")?.unwrap_or(2);
            return Ok((0..num_layers).map(|i| (i + 1).saturating_sub(offset) % freq == 0).collect());
        }
    };
    if kinds.len() != num_layers {
        return Err(r.err("indexer_types", format!("{} entries for {num_layers} layers", kinds.len())));
    }
    kinds
        .iter()
        .map(|k| match k.as_str() {
            "full" => Ok(true),
            "shared" => Ok(false),
            other => Err(r.err("indexer_types", format!("`{other}` is neither \"full\" nor \"shared\""))),
        })
        .collect()
}

fn string_list(r: &Reader<'_>, key: &str, v: &Value) -> Result<Vec<String>> {
    let Value::Array(items) = v else {
        return Err(r.err(key, "expected a list of strings"));
    };
    items
        .iter()
        .map(|i| i.as_str().map(str::to_string).ok_or_else(|| r.err(key, "expected a list of strings")))
        .collect()
}
