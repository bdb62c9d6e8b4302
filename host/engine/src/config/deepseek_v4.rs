//! DeepSeek-V4 (`model_type: deepseek_v4`): the config keys of transformers
//! 5.24's `DeepseekV4Config`, including the legacy ones its `__post_init__`
//! folds in (`compress_ratios`, `compress_rate_csa` / `_hca`,
//! `num_hash_layers`, `qk_rope_head_dim`), and the tensor names, shapes and
//! parameter counts of its decoder layers. The math is in model/v4/.

use serde_json::Value;

use super::{
    AttnKind, Common, Family, MlaRope, ModelConfig, Reader, RouterKind, MAX_EXPERTS, MAX_HEADS, MAX_HEAD_DIM,
    MAX_INTER, MAX_POSITIONS,
};
use crate::error::Result;

/// The attention of one V4 layer (`layer_types`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum V4Attn {
    /// `sliding_attention`: the sliding window only.
    Sliding,
    /// `compressed_sparse_attention`: the window plus the indexer's top
    /// entries of a compressor with two overlapping series.
    Csa,
    /// `heavily_compressed_attention`: the window plus every entry of a
    /// non-overlapping compressor.
    Hca,
}

impl V4Attn {
    pub fn name(self) -> &'static str {
        match self {
            V4Attn::Sliding => "SWA",
            V4Attn::Csa => "CSA",
            V4Attn::Hca => "HCA",
        }
    }
}

/// Everything DeepSeek-V4 adds to the common config.
#[derive(Debug, Clone, PartialEq)]
pub struct V4Params {
    pub layers: Vec<V4Attn>,
    /// Per layer: routed by `tid2eid[token]` (`hash_moe`) rather than by
    /// the router's top-k.
    pub hash_layers: Vec<bool>,
    /// Width of the one K=V head and of every query head.
    pub head_dim: usize,
    /// Trailing channels of each head that rotate (`qk_rope_head_dim`).
    pub rope_dim: usize,
    pub q_lora_rank: usize,
    pub o_groups: usize,
    pub o_lora_rank: usize,
    pub sliding_window: usize,
    pub csa_rate: usize,
    pub hca_rate: usize,
    pub index_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    pub hc_mult: usize,
    pub hc_sinkhorn_iters: usize,
    pub hc_eps: f32,
    pub swiglu_limit: f32,
    /// RoPE of the sliding-only layers (`rope_parameters.main`).
    pub main_rope: MlaRope,
    /// RoPE of the compressed layers, their compressors and indexers
    /// (`rope_parameters.compress`, YaRN in the release).
    pub compress_rope: MlaRope,
}

impl V4Params {
    /// Source tokens per compressed entry of layer `layer` (None: sliding).
    pub fn rate(&self, layer: usize) -> Option<usize> {
        match self.layers.get(layer)? {
            V4Attn::Sliding => None,
            V4Attn::Csa => Some(self.csa_rate),
            V4Attn::Hca => Some(self.hca_rate),
        }
    }

    /// Floats of one compressed entry of layer `layer`: the main entry, and
    /// the indexer's on a CSA layer.
    pub fn entry_floats(&self, layer: usize) -> usize {
        match self.layers.get(layer) {
            Some(V4Attn::Csa) => self.head_dim + self.index_head_dim,
            Some(V4Attn::Hca) => self.head_dim,
            _ => 0,
        }
    }

    /// Floats of layer `layer`'s state that do not grow with the context:
    /// the window ring and the compressors' open windows (projected kv and
    /// gate of up to `rate` tokens, plus the previous window's first series
    /// where the series overlap).
    pub fn fixed_floats(&self, layer: usize) -> usize {
        let ring = self.sliding_window * self.head_dim;
        let (d, di) = (self.head_dim, self.index_head_dim);
        ring + match self.layers.get(layer) {
            Some(V4Attn::Csa) => self.csa_rate * (2 * (2 * d) + 2 * d) + self.csa_rate * (2 * (2 * di) + 2 * di),
            Some(V4Attn::Hca) => self.hca_rate * 2 * d,
            _ => 0,
        }
    }
}

/// A rope object (`rope_parameters.main` / `.compress`, or the flat one)
/// read as V4 does: default or YaRN, YaRN with attention factor 1 unless
/// given ("the V4 reference does NOT multiply cos/sin by YaRN's mscale").
fn read_v4_rope(
    r: &Reader<'_>,
    obj: Option<&Value>,
    key: &str,
    theta: f64,
    dim: usize,
    max_pos: usize,
) -> Result<MlaRope> {
    let mut rope = MlaRope { theta, dim, interleave: true, yarn: None, softmax_scale_factor: 1.0 };
    let Some(obj) = obj else { return Ok(rope) };
    let Value::Object(map) = obj else { return Err(r.err(key, "expected an object")) };
    let sub = Reader { obj: map, path: r.path };
    if let Some(t) = sub.f64_opt("rope_theta")? {
        rope.theta = t;
    }
    let kind = sub.rope_type()?.unwrap_or("default");
    match kind {
        "default" => {}
        "yarn" => {
            let (mut y, _) = super::deepseek::read_yarn(r, &sub, key, max_pos)?;
            if sub.get("attention_factor").is_none() {
                y.attention_factor = 1.0;
            }
            rope.yarn = Some(y);
        }
        other => return Err(r.unsupported(key, format!("rope_type `{other}` (default and yarn only)"))),
    }
    if rope.theta <= 1.0 {
        return Err(r.err(key, format!("rope_theta {} must be > 1", rope.theta)));
    }
    Ok(rope)
}

fn layer_kinds(r: &Reader<'_>, n: usize) -> Result<Vec<V4Attn>> {
    let labels = [
        ("sliding_attention", V4Attn::Sliding),
        ("compressed_sparse_attention", V4Attn::Csa),
        ("heavily_compressed_attention", V4Attn::Hca),
    ];
    if let Some(kinds) = r.label_list("layer_types", n, true, &labels)? {
        return Ok(kinds);
    }
    if r.get("compress_ratios").is_some() {
        // `_COMPRESS_RATIO_TO_LAYER_TYPE`: 0, 4 and 128 only.
        let ratios = r.usize_list("compress_ratios")?;
        if ratios.len() < n {
            return Err(r.err("compress_ratios", format!("{} entries for {n} layers", ratios.len())));
        }
        return ratios[..n]
            .iter()
            .map(|&c| match c {
                0 => Ok(V4Attn::Sliding),
                4 => Ok(V4Attn::Csa),
                128 => Ok(V4Attn::Hca),
                other => Err(r.err("compress_ratios", format!("{other} is not 0, 4 or 128"))),
            })
            .collect();
    }
    // V4-Pro's default: two HCA layers, then CSA and HCA alternating.
    Ok((0..n).map(|l| if l < 2 || (l - 2) % 2 == 0 { V4Attn::Hca } else { V4Attn::Csa }).collect())
}

fn hash_layers(r: &Reader<'_>, n: usize) -> Result<Vec<bool>> {
    if let Some(kinds) = r.label_list("mlp_layer_types", n, true, &[("hash_moe", true), ("moe", false)])? {
        return Ok(kinds);
    }
    let n_hash = r.usize_opt("num_hash_layers")?.unwrap_or(3);
    Ok((0..n).map(|l| l < n_hash).collect())
}

fn compress_rate(r: &Reader<'_>, kind: &str, legacy: &str, default: usize) -> Result<usize> {
    let rate = match r.get("compress_rates") {
        Some(Value::Object(map)) => {
            let sub = Reader { obj: map, path: r.path };
            sub.usize_opt(kind)?
        }
        Some(_) => return Err(r.err("compress_rates", "expected an object")),
        None => None,
    };
    let rate = match r.usize_opt(legacy)? {
        Some(v) => v,
        None => rate.unwrap_or(default),
    };
    r.bounded(&format!("compress_rates.{kind}"), rate, 1 << 16)
}

/// The table's parser (`family::FAMILIES`): the common dimensions, then
/// this family's own keys.
pub(super) fn parse_config(r: &Reader<'_>, _family: Family, _model_type: &str) -> Result<ModelConfig> {
    r.require_silu()?;
    parse(r, Common::read(r)?)
}

pub(super) fn parse(r: &Reader<'_>, common: Common) -> Result<ModelConfig> {
    let num_layers = common.num_layers;
    let num_heads = r.bounded("num_attention_heads", r.usize_req("num_attention_heads")?, MAX_HEADS)?;
    if let Some(kv) = r.usize_opt("num_key_value_heads")? {
        if kv != 1 {
            return Err(r.unsupported("num_key_value_heads", format!("{kv} (DeepSeek-V4 shares one K=V head)")));
        }
    }
    let head_dim = r.bounded("head_dim", r.usize_opt("head_dim")?.unwrap_or(512), MAX_HEAD_DIM)?;
    let rope_dim = match (r.usize_opt("qk_rope_head_dim")?, r.f64_opt("partial_rotary_factor")?) {
        (Some(d), _) => d,
        (None, Some(f)) if f > 0.0 && f <= 1.0 => (head_dim as f64 * f) as usize,
        (None, Some(f)) => return Err(r.err("partial_rotary_factor", format!("{f} is outside (0, 1]"))),
        (None, None) => head_dim * 64 / 512,
    };
    if rope_dim == 0 || !rope_dim.is_multiple_of(2) || rope_dim > head_dim {
        return Err(r.err("qk_rope_head_dim", format!("{rope_dim} must be even and within head_dim {head_dim}")));
    }
    let q_lora_rank = r.bounded("q_lora_rank", r.usize_opt("q_lora_rank")?.unwrap_or(1024), MAX_INTER)?;
    let o_groups = r.bounded("o_groups", r.usize_opt("o_groups")?.unwrap_or(8), MAX_HEADS)?;
    if !num_heads.is_multiple_of(o_groups) {
        return Err(r.err("o_groups", format!("{o_groups} groups do not divide {num_heads} heads")));
    }
    let o_lora_rank = r.bounded("o_lora_rank", r.usize_opt("o_lora_rank")?.unwrap_or(1024), MAX_INTER)?;
    let sliding_window = r.bounded("sliding_window", r.usize_opt("sliding_window")?.unwrap_or(128), 1 << 20)?;
    let index_heads = r.bounded("index_n_heads", r.usize_opt("index_n_heads")?.unwrap_or(64), MAX_HEADS)?;
    let index_head_dim = r.bounded("index_head_dim", r.usize_opt("index_head_dim")?.unwrap_or(128), MAX_HEAD_DIM)?;
    if index_head_dim < rope_dim {
        return Err(r.err("index_head_dim", format!("{index_head_dim} is narrower than the rope width {rope_dim}")));
    }
    let index_topk = r.bounded("index_topk", r.usize_opt("index_topk")?.unwrap_or(512), 1 << 20)?;
    let hc_mult = r.bounded("hc_mult", r.usize_opt("hc_mult")?.unwrap_or(4), 16)?;
    let hc_sinkhorn_iters = r.bounded("hc_sinkhorn_iters", r.usize_opt("hc_sinkhorn_iters")?.unwrap_or(20), 1000)?;
    let hc_eps = r.f64_opt("hc_eps")?.unwrap_or(1e-6);
    if !(0.0..1.0).contains(&hc_eps) {
        return Err(r.err("hc_eps", format!("{hc_eps} is outside [0, 1)")));
    }
    let swiglu_limit = r.f64_opt("swiglu_limit")?.unwrap_or(10.0);
    if swiglu_limit.is_nan() || swiglu_limit <= 0.0 {
        return Err(r.err("swiglu_limit", format!("{swiglu_limit} is not positive")));
    }
    if r.bool_opt("attention_bias")?.unwrap_or(false) {
        return Err(r.unsupported("attention_bias", "true (DeepSeek-V4 has no attention biases)"));
    }

    let max_position_embeddings = r.bounded(
        "max_position_embeddings",
        r.usize_opt("max_position_embeddings")?.unwrap_or(1 << 20),
        MAX_POSITIONS,
    )?;
    let main_theta = r.f64_opt("rope_theta")?.unwrap_or(1e4);
    let compress_theta = r.f64_opt("compress_rope_theta")?.unwrap_or(160000.0);
    let rope_key = ["rope_parameters", "rope_scaling"].into_iter().find(|k| r.get(k).is_some());
    let rope_obj = rope_key.and_then(|k| r.get(k));
    let nested = |label: &str| match rope_obj {
        Some(Value::Object(m)) => m.get(label).filter(|v| v.is_object()),
        _ => None,
    };
    let (main_rope, compress_rope) = match (nested("main"), nested("compress")) {
        (Some(main), Some(compress)) => (
            read_v4_rope(r, Some(main), "rope_parameters.main", main_theta, rope_dim, max_position_embeddings)?,
            read_v4_rope(
                r,
                Some(compress),
                "rope_parameters.compress",
                compress_theta,
                rope_dim,
                max_position_embeddings,
            )?,
        ),
        // A flat object describes the compressed layers' scaling; the main
        // rope is plain `rope_theta`.
        _ => {
            let key = rope_key.unwrap_or("rope_parameters");
            let mut compress = read_v4_rope(r, rope_obj, key, compress_theta, rope_dim, max_position_embeddings)?;
            compress.theta = compress_theta;
            (read_v4_rope(r, None, key, main_theta, rope_dim, max_position_embeddings)?, compress)
        }
    };
    if main_rope.yarn.is_some() {
        return Err(r.unsupported("rope_parameters.main", "YaRN on the sliding-only layers"));
    }

    let num_experts = r.bounded("n_routed_experts", r.usize_req("n_routed_experts")?, MAX_EXPERTS)?;
    let top_k = r.usize_opt("num_experts_per_tok")?.unwrap_or(6);
    if top_k == 0 || top_k > num_experts {
        return Err(r.err("num_experts_per_tok", format!("{top_k} is outside 1..={num_experts}")));
    }
    if let Some(f) = r.str_opt("scoring_func")? {
        if f != "sqrtsoftplus" {
            return Err(r.unsupported("scoring_func", format!("`{f}` (only sqrtsoftplus)")));
        }
    }
    let moe_intermediate_size = r.bounded("moe_intermediate_size", r.usize_req("moe_intermediate_size")?, MAX_INTER)?;
    let n_shared = r.usize_opt("n_shared_experts")?.unwrap_or(1);
    if n_shared > 64 {
        return Err(r.err("n_shared_experts", format!("{n_shared} exceeds 64")));
    }
    let scale = r.f64_opt("routed_scaling_factor")?.unwrap_or(1.5);
    if !(scale > 0.0 && scale < 1e6) {
        return Err(r.err("routed_scaling_factor", format!("{scale} is not a positive factor")));
    }
    let rms_norm_eps = r.rms_norm_eps(1e-6)?;
    let v4 = V4Params {
        layers: layer_kinds(r, num_layers)?,
        hash_layers: hash_layers(r, num_layers)?,
        head_dim,
        rope_dim,
        q_lora_rank,
        o_groups,
        o_lora_rank,
        sliding_window,
        csa_rate: compress_rate(r, "compressed_sparse_attention", "compress_rate_csa", 4)?,
        hca_rate: compress_rate(r, "heavily_compressed_attention", "compress_rate_hca", 128)?,
        index_heads,
        index_head_dim,
        index_topk,
        hc_mult,
        hc_sinkhorn_iters,
        hc_eps: hc_eps as f32,
        swiglu_limit: swiglu_limit as f32,
        main_rope,
        compress_rope,
    };
    Ok(ModelConfig {
        num_heads,
        num_kv_heads: 1,
        head_dim,
        rope_theta: main_theta,
        rms_norm_eps,
        num_experts,
        top_k,
        moe_intermediate_size,
        // DeepseekV4TopKRouter / HashRouter always divide by the sum.
        norm_topk_prob: true,
        max_position_embeddings,
        sliding_window: Some(sliding_window),
        attn_kinds: vec![AttnKind::V4; num_layers],
        router: RouterKind::SqrtSoftplusBias { routed_scaling_factor: scale as f32 },
        shared_intermediate_size: moe_intermediate_size * n_shared,
        add: super::Switches { v4: Some(v4), ..super::Switches::default() },
        ..ModelConfig::plain(Family::DeepseekV4, "deepseek_v4", common)
    })
}

/// The release's tensor names (DeepSeek's own, as `save_pretrained` also
/// writes them, with or without `model.`) mapped to the names this engine
/// reads, which are transformers' module paths with the experts per
/// expert: the renames of transformers' `conversion_mapping.py`
/// `"deepseek_v4"`, in its order. Names already in that form pass through.
pub fn canonical_name(stored: &str) -> String {
    let name = stored.strip_prefix("model.").unwrap_or(stored);
    let top = match name {
        "embed.weight" | "embed_tokens.weight" => Some("model.embed_tokens.weight"),
        "head.weight" | "lm_head.weight" => Some("lm_head.weight"),
        "norm.weight" => Some("model.norm.weight"),
        "hc_head_fn" | "hc_head.hc_fn" => Some("model.hc_head.hc_fn"),
        "hc_head_base" | "hc_head.hc_base" => Some("model.hc_head.hc_base"),
        "hc_head_scale" | "hc_head.hc_scale" => Some("model.hc_head.hc_scale"),
        _ => None,
    };
    if let Some(t) = top {
        return t.to_string();
    }
    if name.starts_with("mtp.") {
        return name.to_string();
    }
    let Some(rest) = name.strip_prefix("layers.") else { return stored.to_string() };
    let Some((layer, rest)) = rest.split_once('.') else { return stored.to_string() };
    // Matched on `.rest` so each pattern can anchor on a leading dot.
    let mut s = format!(".{rest}");
    const RENAMES: &[(&str, &str)] = &[
        (".attn.", ".self_attn."),
        (".ffn.", ".mlp."),
        (".indexer.compressor.", ".compressor.indexer."),
        (".attn_norm.", ".input_layernorm."),
        (".ffn_norm.", ".post_attention_layernorm."),
        (".hc_attn_fn", ".attn_hc.fn"),
        (".hc_attn_base", ".attn_hc.base"),
        (".hc_attn_scale", ".attn_hc.scale"),
        (".hc_ffn_fn", ".ffn_hc.fn"),
        (".hc_ffn_base", ".ffn_hc.base"),
        (".hc_ffn_scale", ".ffn_hc.scale"),
        (".attn_sink", ".sinks"),
        (".indexer.weights_proj.", ".compressor.indexer.scorer.weights_proj."),
        (".indexer.wq_b.", ".compressor.indexer.q_b_proj."),
        (".norm.", ".kv_norm."),
        (".ape", ".position_bias"),
        (".wq_a.", ".q_a_proj."),
        (".self_attn.wq_b.", ".self_attn.q_b_proj."),
        (".wkv.", ".kv_proj."),
        (".wgate.", ".gate_proj."),
        (".wo_a.", ".o_a_proj."),
        (".wo_b.", ".o_b_proj."),
        (".q_norm.", ".q_a_norm."),
        (".gate.bias", ".gate.e_score_correction_bias"),
        (".shared_experts.w1.", ".shared_experts.gate_proj."),
        (".shared_experts.w2.", ".shared_experts.down_proj."),
        (".shared_experts.w3.", ".shared_experts.up_proj."),
    ];
    for (from, to) in RENAMES {
        s = s.replace(from, to);
    }
    // `experts.E.w1` (gate), `w3` (up), `w2` (down).
    if let Some((head, tail)) = s.split_once(".experts.") {
        if let Some((e, leaf)) = tail.split_once('.') {
            let leaf = match leaf.split_once('.') {
                Some(("w1", r)) => format!("gate_proj.{r}"),
                Some(("w3", r)) => format!("up_proj.{r}"),
                Some(("w2", r)) => format!("down_proj.{r}"),
                _ => leaf.to_string(),
            };
            s = format!("{head}.experts.{e}.{leaf}");
        }
    }
    format!("model.layers.{layer}{s}")
}

/// A `layer_types` / `mlp_layer_types` entry that disagrees with the
/// tensors fails naming the layer, not later as a missing weight.
pub(super) fn check_layer_tensors(
    v4: &V4Params,
    names: &std::collections::HashSet<&str>,
    file: &std::path::Path,
) -> Result<()> {
    for (l, kind) in v4.layers.iter().enumerate() {
        let p = format!("model.layers.{l}.self_attn.compressor");
        let holds = |t: &str| names.contains(format!("{p}.{t}").as_str());
        let found = match (holds("kv_proj.weight"), holds("indexer.kv_proj.weight")) {
            (false, _) => V4Attn::Sliding,
            (true, true) => V4Attn::Csa,
            (true, false) => V4Attn::Hca,
        };
        if found != *kind {
            return Err(crate::error::Error::format(
                file,
                format!(
                    "config.json (`layer_types` / `compress_ratios`) makes layer {l} {}, but its tensors are those of a {} layer",
                    kind.name(),
                    found.name()
                ),
            ));
        }
        let table = names.contains(format!("model.layers.{l}.mlp.gate.tid2eid").as_str());
        if table != v4.hash_layers[l] {
            return Err(crate::error::Error::format(
                file,
                format!(
                    "config.json (`mlp_layer_types` / `num_hash_layers`) makes layer {l} {}, but the checkpoint {} `tid2eid` for it",
                    if v4.hash_layers[l] { "hash-routed" } else { "router-routed" },
                    if table { "holds" } else { "has no" }
                ),
            ));
        }
    }
    Ok(())
}
