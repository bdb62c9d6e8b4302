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

impl super::ModelConfig {
    /// Floats of the DSA indexer's key that layer `layer` caches per token
    /// after its MLA row (0 without an indexer of its own).
    pub fn index_key_width(&self, layer: usize) -> usize {
        match &self.add.dsa {
            Some(d) if d.has_indexer(layer) => d.head_dim,
            _ => 0,
        }
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::ModelConfig;
    use crate::error::{Error, Result};

    fn fixture_json(family: &str) -> serde_json::Value {
        let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(format!("../../tests/fixtures/tiny-{family}/config.json"));
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    }

    fn parse(v: &serde_json::Value) -> Result<ModelConfig> {
        ModelConfig::from_json_str(&v.to_string(), Path::new("/x/config.json"))
    }

    fn own(v: &serde_json::Value) -> Vec<bool> {
        parse(v).unwrap().add.dsa.unwrap().own_indexer
    }

    #[test]
    fn fixtures_parse_with_their_indexer_layouts() {
        let v32 = parse(&fixture_json("deepseek_v32")).unwrap();
        let d = v32.add.dsa.clone().unwrap();
        assert_eq!((d.n_heads, d.head_dim, d.topk, d.interleaved_rope), (16, 16, 8, false));
        assert_eq!(d.own_indexer, vec![true; 4]);
        assert!(v32.mla_rope.unwrap().interleave);
        let glm = parse(&fixture_json("glm_moe_dsa")).unwrap();
        let d = glm.add.dsa.clone().unwrap();
        assert!(d.interleaved_rope);
        assert_eq!(d.own_indexer, vec![true, true, false, false]);
        // The index key rides in the latent row of indexing layers only.
        assert_eq!((glm.state_floats_per_token(1), glm.state_floats_per_token(2)), (16 + 8 + 16, 16 + 8));
        // DeepSeek-V3 itself has none.
        let mut v3 = fixture_json("deepseek_v32");
        v3["model_type"] = "deepseek_v3".into();
        assert!(parse(&v3).unwrap().add.dsa.is_none());
    }

    /// `GlmMoeDsaConfig.__post_init__`'s three spellings of the pattern.
    #[test]
    fn glm_indexer_patterns_follow_transformers() {
        let mut v = fixture_json("glm_moe_dsa");
        v.as_object_mut().unwrap().remove("indexer_types");
        v["num_hidden_layers"] = 8.into();
        v.as_object_mut().unwrap().remove("mlp_layer_types");
        v.as_object_mut().unwrap().remove("layer_types");
        // Defaults: freq 1, so every layer indexes.
        assert_eq!(own(&v), vec![true; 8]);
        // freq 3, offset 2: full where max(i - 1, 0) % 3 == 0.
        v["index_topk_freq"] = 3.into();
        assert_eq!(own(&v), vec![true, true, false, false, true, false, false, true]);
        v["index_skip_topk_offset"] = 0.into();
        // offset 0 makes layer 0 shared, which transformers' forward refuses.
        assert!(parse(&v).unwrap_err().to_string().contains("layer 0"));
        v["index_topk_pattern"] = "FFSFSSFS".into();
        assert_eq!(own(&v), vec![true, true, false, true, false, false, true, false]);
        v["index_topk_pattern"] =
            serde_json::json!(["full", "shared", "full", "shared", "full", "shared", "full", "shared"]);
        assert_eq!(own(&v), vec![true, false, true, false, true, false, true, false]);
    }

    #[test]
    fn bad_indexer_configs_are_named() {
        let mut v = fixture_json("glm_moe_dsa");
        v["indexer_types"] = serde_json::json!(["shared", "full", "full", "full"]);
        let e = parse(&v).unwrap_err().to_string();
        assert!(e.contains("indexer_types") && e.contains("layer 0"), "{e}");
        v["indexer_types"] = serde_json::json!(["full", "full"]);
        assert!(parse(&v).unwrap_err().to_string().contains("2 entries for 4 layers"));
        v["indexer_types"] = serde_json::json!(["full", "full", "dense", "full"]);
        assert!(parse(&v).unwrap_err().to_string().contains("`dense`"));
        let mut v = fixture_json("deepseek_v32");
        v["index_head_dim"] = 4.into();
        assert!(parse(&v).unwrap_err().to_string().contains("narrower than the 8 rope dims"));
        let mut v = fixture_json("deepseek_v32");
        v["index_topk"] = 0.into();
        assert!(parse(&v).unwrap_err().to_string().contains("index_topk"));
        let mut v = fixture_json("deepseek_v32");
        v["q_lora_rank"] = serde_json::Value::Null;
        assert!(parse(&v).unwrap_err().to_string().contains("q_lora_rank"));
        let mut v = fixture_json("deepseek_v32");
        v["layer_types"] = serde_json::json!(vec!["full_attention"; 4]);
        assert!(matches!(parse(&v), Err(Error::Unsupported(_))));
    }
}
