//! A GGUF file seen as the Hugging Face checkpoint it was converted from:
//! a `config.json` built from the `ARCH.*` keys, every tensor under its HF
//! name with HF's layout, and the tokenizer files (tokenizer.rs).
//!
//! The rest of the engine knows one set of tensor names and one config
//! schema, the checkpoint's; presenting the GGUF that way keeps the
//! converter, the planner and the forward pass unaware of where the
//! weights came from. The mapping is llama.cpp's `convert_hf_to_gguf.py`
//! read backwards (GGUF_NOTES.md section 4, checked tensor by tensor by
//! `tests/gen_gguf_fixtures.py` on its own conversions). glm4moe,
//! deepseek2 (with deepseek32 and glm-dsa), gpt-oss, kimi-linear,
//! minimax-m2 and qwen3next (with qwen35moe) have their own files under
//! `hf/`.

mod deepseek;
mod glm;
mod gpt_oss;
mod kimi;
mod minimax;
mod qwen3next;

use serde_json::{json, Map, Value as Json};

use super::{GgufFile, TensorInfo, Value};
use crate::config::{family, Family};
use crate::error::{Error, Result};

/// Where an HF tensor's values are in the GGUF file.
#[derive(Debug, Clone, PartialEq)]
pub struct Slice {
    /// Index into `GgufFile::tensors`.
    pub tensor: usize,
    /// Rows of `ne[0]` elements: a routed expert is a run of rows of its
    /// layer's 3-D tensor (`ne = [in, out, n_expert]`, expert `e` the
    /// contiguous slab `e`).
    pub first_row: u64,
    pub rows: u64,
    /// The HF shape (row-major).
    pub shape: Vec<usize>,
    /// Where HF row `r` is stored when the rows are not the stored run
    /// `first_row..` in order.
    pub row_map: Option<RowMap>,
    /// How the converter changed the values of a 1-D tensor, undone on read.
    pub values: ValueMap,
    /// DeepSeek's `kv_b_proj`, which the converter splits in two
    /// (deepseek.rs): `tensor` is `attn_k_b`, this the rest.
    pub kv_b: Option<KvB>,
}

impl Slice {
    /// HF rows `[first_row, first_row + rows)` of tensor `tensor`, stored in
    /// order, values as stored; the fields below say otherwise.
    pub fn rows(tensor: usize, first_row: u64, rows: u64, shape: Vec<usize>) -> Slice {
        Slice { tensor, first_row, rows, shape, row_map: None, values: ValueMap::Stored, kv_b: None }
    }

    /// Tensor `i` whole, in its own shape.
    pub(super) fn whole(i: usize, t: &TensorInfo) -> Slice {
        Slice::rows(i, 0, t.ne[1..].iter().product::<u64>(), t.shape())
    }
}

/// The stored row of each HF row of a slice that the converter reordered.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RowMap {
    /// `convert_hf_to_gguf.py`'s `LlamaModel.permute` of q/k for llama's
    /// interleaved rope, undone on read: within each of this many heads,
    /// GGUF row `2i` is HF row `i` and row `2i + 1` is HF row `i + d/2`.
    RopePermuted { heads: usize },
    /// One part of a fusion grouped per head (Qwen3-Next's `in_proj_ba`,
    /// stored whole as `ssm_ba`): group `g` of `len` HF rows is stored at
    /// `g * period + offset`.
    Strided { period: usize, offset: usize, len: usize },
}

impl RowMap {
    /// The stored row (from the slice's `first_row`) of HF row `r` of `rows`.
    pub fn stored_row(self, r: usize, rows: usize) -> usize {
        match self {
            RowMap::RopePermuted { heads } => permuted_row(r, rows, heads),
            RowMap::Strided { period, offset, len } => (r / len) * period + offset + r % len,
        }
    }

    /// Whether a slice of `rows` HF rows can be read through this map.
    pub fn fits(self, rows: usize) -> bool {
        match self {
            RowMap::RopePermuted { heads } => {
                heads > 0 && rows.is_multiple_of(heads) && (rows / heads).is_multiple_of(2)
            }
            RowMap::Strided { period, offset, len } => len > 0 && rows.is_multiple_of(len) && offset + len <= period,
        }
    }
}

/// A value transform the converter applied to a 1-D tensor, and its inverse.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum ValueMap {
    #[default]
    Stored,
    /// Stored `x + 1` (Qwen3-Next's zero-centred RMSNorm weights, which
    /// llama.cpp multiplies by directly): read `x - 1`, exact for weights in
    /// [0.5, 2], so `1 + (x - 1)` gives back the stored value.
    PlusOne,
    /// Stored `-exp(x)` (Qwen3-Next's `A_log` as `ssm_a`): read `ln(-x)`.
    NegExp,
}

impl ValueMap {
    pub fn undo(self, v: f32) -> f32 {
        match self {
            ValueMap::Stored => v,
            ValueMap::PlusOne => v - 1.0,
            ValueMap::NegExp => (-v).ln(),
        }
    }
}

/// `kv_b_proj` `[heads * (nope + v), kv_lora]` as GGUF stores it:
/// `attn_k_b` `ne = [nope, kv_lora, heads]` (head `h`'s key rows
/// transposed) and `attn_v_b` `ne = [kv_lora, v, heads]` (its value rows).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvB {
    /// Index of `attn_v_b` in `GgufFile::tensors`.
    pub v_b: usize,
    pub heads: usize,
    pub nope: usize,
    pub v: usize,
    pub kv_lora: usize,
}

/// The view: HF config and tensors.
pub struct HfView {
    pub config: Json,
    pub tensors: Vec<(String, Slice)>,
}

struct Keys<'a> {
    g: &'a GgufFile,
    arch: &'a str,
}

impl Keys<'_> {
    fn err(&self, key: &str, msg: &str) -> Error {
        Error::format(self.g.path(), format!("GGUF key `{key}`: {msg}"))
    }

    fn get(&self, key: &str) -> Option<&Value> {
        self.g.get(&format!("{}.{key}", self.arch))
    }

    fn usize_opt(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| self.err(&format!("{}.{key}", self.arch), "expected a non-negative integer")),
        }
    }

    fn usize_req(&self, key: &str) -> Result<usize> {
        self.usize_opt(key)?.ok_or_else(|| self.err(&format!("{}.{key}", self.arch), "missing"))
    }

    /// A float key as the decimal its writer most likely started from.
    /// GGUF stores `rms_norm_eps` and `rope_theta` as f32, so 1e-6 reads
    /// back as 9.99999997e-07; the shortest decimal that rounds to the same
    /// f32 is the config.json value the converter read (the HF route and
    /// transformers use that f64, and so do we).
    fn f64_opt(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::F32(v)) => Ok(Some(v.to_string().parse().unwrap_or(f64::from(*v)))),
            Some(v) => {
                v.as_f64().map(Some).ok_or_else(|| self.err(&format!("{}.{key}", self.arch), "expected a number"))
            }
        }
    }
}

/// Which HF family an architecture becomes and how its names differ.
#[derive(Clone, Copy, PartialEq)]
enum Arch {
    Qwen3Moe,
    Qwen2Moe,
    Olmoe,
    Mixtral,
    Glm4Moe,
    /// deepseek2, deepseek32 and glm-dsa: MLA, the latter two with DSA.
    Mla(deepseek::Variant),
    GptOss,
    MinimaxM2,
    Qwen3Next(qwen3next::Variant),
    KimiLinear,
}

impl Arch {
    /// HF's name of the MoE block and of each expert projection.
    fn moe_names(self) -> (&'static str, [&'static str; 3]) {
        match self {
            Arch::Mixtral | Arch::MinimaxM2 | Arch::KimiLinear => ("block_sparse_moe", ["w1", "w3", "w2"]),
            _ => ("mlp", ["gate_proj", "up_proj", "down_proj"]),
        }
    }

    /// Whether the layers' attention is MLA with deepseek2's tensors.
    fn has_mla(self) -> bool {
        matches!(self, Arch::Mla(_) | Arch::KimiLinear)
    }

    /// HF's prefix of the shared expert, under `model.layers.L.`.
    fn shared_expert(self) -> &'static str {
        match self {
            Arch::Glm4Moe | Arch::Mla(_) => "mlp.shared_experts",
            Arch::KimiLinear => "block_sparse_moe.shared_experts",
            _ => "mlp.shared_expert",
        }
    }
}

pub fn view(g: &GgufFile) -> Result<HfView> {
    let name = g
        .get("general.architecture")
        .and_then(Value::as_str)
        .ok_or_else(|| Error::format(g.path(), "GGUF key `general.architecture`: missing or not a string"))?;
    let k = Keys { g, arch: name };
    let row = family::by_gguf_arch(name).ok_or_else(|| {
        let supported: Vec<String> = family::FAMILIES
            .iter()
            .filter_map(|row| Some(format!("{} ({})", row.gguf_arch?, row.model_type)))
            .collect();
        Error::Unsupported(format!(
            "{}: GGUF architecture `{name}` (supported: {}); convert from the Hugging Face checkpoint instead",
            g.path().display(),
            supported.join(", ")
        ))
    })?;
    let arch = match row.family {
        Family::Qwen3Moe => Arch::Qwen3Moe,
        Family::Qwen2Moe => Arch::Qwen2Moe,
        Family::Olmoe => Arch::Olmoe,
        Family::Glm4Moe => Arch::Glm4Moe,
        Family::DeepseekV3 => Arch::Mla(deepseek::Variant::of(row.model_type)),
        Family::GptOss => Arch::GptOss,
        Family::MinimaxM2 => Arch::MinimaxM2,
        Family::Qwen3Next if row.model_type == "qwen3_next" => Arch::Qwen3Next(qwen3next::Variant::Qwen3Next),
        Family::Qwen3Next if row.model_type == "qwen3_5_moe_text" => Arch::Qwen3Next(qwen3next::Variant::Qwen35),
        // llama.cpp writes every llama-shaped model as `llama`; only one
        // with experts is Mixtral.
        Family::Mixtral if k.usize_opt("expert_count")?.unwrap_or(0) > 0 => Arch::Mixtral,
        Family::Mixtral => {
            return Err(Error::Unsupported(format!(
                "{}: a dense llama GGUF (no experts); WASTE runs mixture-of-experts models",
                g.path().display()
            )))
        }
        // A row given a GGUF name before this reader learnt its tensors.
        Family::KimiLinear if row.model_type == "kimi_linear" => Arch::KimiLinear,
        Family::KimiLinear | Family::Qwen3Next | Family::DeepseekV4 => {
            return Err(Error::Unsupported(format!(
                "{}: GGUF architecture `{name}` ({}): its tensors are not read yet",
                g.path().display(),
                row.model_type
            )))
        }
    };
    let config = match arch {
        Arch::Glm4Moe => glm::config(&k)?,
        Arch::Mla(variant) => deepseek::config(&k, variant)?,
        Arch::GptOss => gpt_oss::config(&k)?,
        Arch::MinimaxM2 => minimax::config(&k)?,
        Arch::Qwen3Next(variant) => qwen3next::config(&k, variant)?,
        Arch::KimiLinear => kimi::config(&k)?,
        _ => config(&k, arch)?,
    };
    let tensors = tensors(g, arch, &config)?;
    Ok(HfView { config, tensors })
}

/// The keys every family's config.json has, from the `ARCH.*` keys and the
/// tensor list.
fn base(k: &Keys, architecture: &str, model_type: &str, layers: usize) -> Result<Map<String, Json>> {
    let g = k.g;
    let hidden = k.usize_req("embedding_length")?;
    let heads = k.usize_req("attention.head_count")?;
    let vocab = match g.tensor("token_embd.weight") {
        Some(t) if t.ne.len() == 2 => t.ne[1] as usize,
        _ => return Err(Error::format(g.path(), "tensor `token_embd.weight`: missing or not 2-D")),
    };
    let mut c = Map::new();
    c.insert("architectures".into(), json!([architecture]));
    c.insert("model_type".into(), json!(model_type));
    c.insert("vocab_size".into(), json!(vocab));
    c.insert("hidden_size".into(), json!(hidden));
    c.insert("num_hidden_layers".into(), json!(layers));
    c.insert("num_attention_heads".into(), json!(heads));
    // kimi-linear gives a count per layer (kimi.rs reads it).
    let kv_heads = match k.get("attention.head_count_kv") {
        Some(Value::Array(_)) => heads,
        _ => k.usize_opt("attention.head_count_kv")?.unwrap_or(heads),
    };
    c.insert("num_key_value_heads".into(), json!(kv_heads));
    c.insert("max_position_embeddings".into(), json!(k.usize_opt("context_length")?.unwrap_or(4096)));
    c.insert("hidden_act".into(), json!("silu"));
    if let Some(eps) = k.f64_opt("attention.layer_norm_rms_epsilon")? {
        c.insert("rms_norm_eps".into(), json!(eps));
    }
    c.insert("tie_word_embeddings".into(), json!(g.tensor("output.weight").is_none()));
    for (key, hf) in [("tokenizer.ggml.bos_token_id", "bos_token_id"), ("tokenizer.ggml.eos_token_id", "eos_token_id")]
    {
        if let Some(id) = g.get(key).and_then(Value::as_u64) {
            c.insert(hf.into(), json!(id));
        }
    }
    c.insert("torch_dtype".into(), json!("float32"));
    Ok(c)
}

/// The decoder layers the forward pass runs and the MTP layers stored after
/// them: `block_count` counts both, `nextn_predict_layers` the latter
/// (glm4moe, deepseek32, glm-dsa, qwen3next, qwen35moe).
fn decoder_layers(k: &Keys) -> Result<(usize, usize)> {
    let blocks = k.usize_req("block_count")?;
    let nextn = k.usize_opt("nextn_predict_layers")?.unwrap_or(0);
    let layers = blocks
        .checked_sub(nextn)
        .ok_or_else(|| k.err(&format!("{}.nextn_predict_layers", k.arch), "more MTP layers than blocks"))?;
    Ok((layers, nextn))
}

/// `head_dim` from `attention.key_length`, which must equal `value_length`.
fn head_dim(k: &Keys, c: &mut Map<String, Json>) -> Result<Option<usize>> {
    let Some(d) = k.usize_opt("attention.key_length")? else { return Ok(None) };
    if k.usize_opt("attention.value_length")?.is_some_and(|v| v != d) {
        return Err(Error::Unsupported(format!("{}: key and value head sizes differ", k.g.path().display())));
    }
    c.insert("head_dim".into(), json!(d));
    Ok(Some(d))
}

/// `rope.scaling.*` as a transformers rope dict (without `rope_theta`):
/// `None` without scaling, `{rope_type: yarn, ...}` for YaRN.
fn yarn(k: &Keys) -> Result<Option<Map<String, Json>>> {
    match k.g.get(&format!("{}.rope.scaling.type", k.arch)).and_then(Value::as_str) {
        None | Some("none") => Ok(None),
        Some("yarn") => {
            let factor = k.f64_opt("rope.scaling.factor")?.ok_or_else(|| k.err("rope.scaling.factor", "missing"))?;
            let mut s = Map::new();
            s.insert("rope_type".into(), json!("yarn"));
            s.insert("factor".into(), json!(factor));
            if let Some(o) = k.usize_opt("rope.scaling.original_context_length")? {
                s.insert("original_max_position_embeddings".into(), json!(o));
            }
            for (from, to) in
                [("rope.scaling.yarn_beta_fast", "beta_fast"), ("rope.scaling.yarn_beta_slow", "beta_slow")]
            {
                if let Some(v) = k.f64_opt(from)? {
                    s.insert(to.into(), json!(v));
                }
            }
            Ok(Some(s))
        }
        Some(other) => Err(Error::Unsupported(format!("{}: rope scaling `{other}`", k.g.path().display()))),
    }
}

/// The routing keys of the sigmoid-routed families (glm4moe, deepseek2):
/// experts, groups, shared experts, dense lead, scaling, renormalisation.
fn sigmoid_moe(k: &Keys, c: &mut Map<String, Json>, layers: usize) -> Result<()> {
    let experts = k.usize_req("expert_count")?;
    c.insert("n_routed_experts".into(), json!(experts));
    c.insert("num_experts_per_tok".into(), json!(k.usize_req("expert_used_count")?));
    c.insert("moe_intermediate_size".into(), json!(k.usize_req("expert_feed_forward_length")?));
    let dense = k.usize_opt("leading_dense_block_count")?.unwrap_or(0);
    c.insert("first_k_dense_replace".into(), json!(dense));
    if dense > 0 {
        c.insert("intermediate_size".into(), json!(k.usize_req("feed_forward_length")?));
    }
    c.insert("n_shared_experts".into(), json!(k.usize_opt("expert_shared_count")?.unwrap_or(0)));
    let groups = k.usize_opt("expert_group_count")?.unwrap_or(1);
    c.insert("n_group".into(), json!(groups));
    c.insert("topk_group".into(), json!(k.usize_opt("expert_group_used_count")?.unwrap_or(groups)));
    // llama.cpp's defaults when the keys are absent: no scaling, no renormalisation.
    c.insert("routed_scaling_factor".into(), json!(k.f64_opt("expert_weights_scale")?.unwrap_or(1.0)));
    let norm = match k.get("expert_weights_norm") {
        None => false,
        Some(v) => v.as_bool().ok_or_else(|| k.err(&format!("{}.expert_weights_norm", k.arch), "expected a bool"))?,
    };
    c.insert("norm_topk_prob".into(), json!(norm));
    for l in 0..layers {
        let moe = k.g.tensor(&format!("blk.{l}.ffn_gate_inp.weight")).is_some();
        if moe != (l >= dense) {
            return Err(Error::format(
                k.g.path(),
                format!(
                    "`{}.leading_dense_block_count` = {dense}, but layer {l} {} a router",
                    k.arch,
                    if moe { "has" } else { "has no" }
                ),
            ));
        }
    }
    Ok(())
}

fn config(k: &Keys, arch: Arch) -> Result<Json> {
    let g = k.g;
    let has = |n: &str| g.tensor(n).is_some();
    let layers = k.usize_req("block_count")?;
    let hidden = k.usize_req("embedding_length")?;
    let heads = k.usize_req("attention.head_count")?;
    let (arch_name, model_type) = match arch {
        Arch::Qwen3Moe => ("Qwen3MoeForCausalLM", "qwen3_moe"),
        Arch::Qwen2Moe => ("Qwen2MoeForCausalLM", "qwen2_moe"),
        Arch::Olmoe => ("OlmoeForCausalLM", "olmoe"),
        _ => ("MixtralForCausalLM", "mixtral"),
    };
    let mut c = base(k, arch_name, model_type, layers)?;
    head_dim(k, &mut c)?;
    let theta = k.f64_opt("rope.freq_base")?.unwrap_or(10_000.0);
    c.insert("rope_theta".into(), json!(theta));
    if let Some(dims) = k.usize_opt("rope.dimension_count")? {
        let head_dim = k.usize_opt("attention.key_length")?.unwrap_or(hidden / heads.max(1));
        if dims != head_dim {
            return Err(Error::Unsupported(format!(
                "{}: partial rotary ({dims} of {head_dim} dims) on {}",
                g.path().display(),
                k.arch
            )));
        }
    }
    if let Some(mut s) = yarn(k)? {
        s.insert("rope_theta".into(), json!(theta));
        c.insert("rope_scaling".into(), Json::Object(s));
    }
    let experts = k.usize_req("expert_count")?;
    c.insert("num_experts_per_tok".into(), json!(k.usize_req("expert_used_count")?));
    c.insert("attention_bias".into(), json!(has("blk.0.attn_q.bias")));
    let dense_width = k.usize_opt("feed_forward_length")?;
    match arch {
        Arch::Qwen3Moe | Arch::Qwen2Moe => {
            c.insert("num_experts".into(), json!(experts));
            let moe = k.usize_opt("expert_feed_forward_length")?.or(dense_width);
            c.insert(
                "moe_intermediate_size".into(),
                json!(moe.ok_or_else(|| k.err("expert_feed_forward_length", "missing"))?),
            );
            // llama.cpp cannot say `mlp_only_layers`; a layer with a dense
            // FFN and no router is one (GGUF_NOTES.md 4.2).
            let dense: Vec<usize> = (0..layers).filter(|l| !has(&format!("blk.{l}.ffn_gate_inp.weight"))).collect();
            if let (false, Some(w)) = (dense.is_empty(), dense_width) {
                c.insert("intermediate_size".into(), json!(w));
            }
            c.insert("mlp_only_layers".into(), json!(dense));
            c.insert("decoder_sparse_step".into(), json!(1));
            // qwen3moe.cpp always renormalises the top-k; qwen2moe.cpp never does.
            c.insert("norm_topk_prob".into(), json!(arch == Arch::Qwen3Moe));
            if arch == Arch::Qwen2Moe {
                c.insert("qkv_bias".into(), json!(has("blk.0.attn_q.bias")));
                let shared = k.usize_opt("expert_shared_feed_forward_length")?.unwrap_or(0);
                c.insert("shared_expert_intermediate_size".into(), json!(shared));
            }
        }
        Arch::Olmoe => {
            c.insert("num_experts".into(), json!(experts));
            c.insert(
                "intermediate_size".into(),
                json!(dense_width.ok_or_else(|| k.err("feed_forward_length", "missing"))?),
            );
            c.insert("norm_topk_prob".into(), json!(false));
        }
        _ => {
            c.insert("num_local_experts".into(), json!(experts));
            c.insert(
                "intermediate_size".into(),
                json!(dense_width.ok_or_else(|| k.err("feed_forward_length", "missing"))?),
            );
        }
    }
    Ok(Json::Object(c))
}

fn tensors(g: &GgufFile, arch: Arch, config: &Json) -> Result<Vec<(String, Slice)>> {
    let layers = config["num_hidden_layers"].as_u64().unwrap_or(0) as usize;
    let heads = config["num_attention_heads"].as_u64().unwrap_or(1) as usize;
    let kv_heads = config["num_key_value_heads"].as_u64().unwrap_or(1) as usize;
    // glm4moe's MTP layers come after the last decoder layer.
    let blocks = layers + config["num_nextn_predict_layers"].as_u64().unwrap_or(0) as usize;
    let (moe, [gate, up, down]) = arch.moe_names();
    let shared = arch.shared_expert();
    let mut out = Vec::new();
    let mut unmapped = Vec::new();
    for (i, t) in g.tensors.iter().enumerate() {
        let whole = |hf: String, row_map: Option<RowMap>| (hf, whole_slice(i, t, row_map));
        let name = t.name.as_str();
        let mapped = match name {
            "token_embd.weight" => Some(whole("model.embed_tokens.weight".into(), None)),
            "output_norm.weight" => Some(whole("model.norm.weight".into(), None)),
            "output.weight" => Some(whole("lm_head.weight".into(), None)),
            _ => None,
        };
        if let Some(m) = mapped {
            out.push(m);
            continue;
        }
        let Some((layer, rest)) = name
            .strip_prefix("blk.")
            .and_then(|r| r.split_once('.'))
            .and_then(|(l, rest)| Some((l.parse::<usize>().ok().filter(|&l| l < blocks)?, rest)))
        else {
            unmapped.push(name.to_string());
            continue;
        };
        if layer >= layers {
            // The MTP layer (`nextn_predict_layers`): not part of the forward pass.
            continue;
        }
        let p = format!("model.layers.{layer}");
        // llama's q/k rows are permuted for its interleaved rope.
        let permute = |heads: usize| (arch == Arch::Mixtral).then_some(RowMap::RopePermuted { heads });
        let router = if arch == Arch::GptOss { "router" } else { "gate" };
        if arch == Arch::KimiLinear {
            if let Some(slice) = kimi::kda(g, i, t, &p, rest)? {
                out.push(slice);
                continue;
            }
        }
        if matches!(arch, Arch::Qwen3Next(_)) {
            if let Some(slices) = qwen3next::linear_attention(g, i, t, &p, rest, config)? {
                out.extend(slices);
                continue;
            }
        }
        let hf = match rest {
            "attn_norm.weight" => format!("{p}.input_layernorm.weight"),
            "ffn_norm.weight" if !matches!(arch, Arch::Glm4Moe | Arch::GptOss) => {
                format!("{p}.post_attention_layernorm.weight")
            }
            "post_attention_norm.weight" if matches!(arch, Arch::Glm4Moe | Arch::GptOss | Arch::Qwen3Next(_)) => {
                format!("{p}.post_attention_layernorm.weight")
            }
            "attn_q_norm.weight" => format!("{p}.self_attn.q_norm.weight"),
            "attn_k_norm.weight" => format!("{p}.self_attn.k_norm.weight"),
            "attn_sinks.weight" if arch == Arch::GptOss => format!("{p}.self_attn.sinks"),
            "ffn_gate_inp.weight" => format!("{p}.{moe}.{router}.weight"),
            "ffn_gate_inp.bias" if arch == Arch::GptOss => format!("{p}.mlp.router.bias"),
            "exp_probs_b.bias" if matches!(arch, Arch::Glm4Moe | Arch::Mla(_)) => {
                format!("{p}.mlp.gate.e_score_correction_bias")
            }
            "exp_probs_b.bias" if arch == Arch::MinimaxM2 => format!("{p}.{moe}.e_score_correction_bias"),
            "exp_probs_b.bias" if arch == Arch::KimiLinear => format!("{p}.{moe}.gate.e_score_correction_bias"),
            "ffn_gate.weight" => format!("{p}.mlp.gate_proj.weight"),
            "ffn_up.weight" => format!("{p}.mlp.up_proj.weight"),
            "ffn_down.weight" => format!("{p}.mlp.down_proj.weight"),
            "ffn_gate_shexp.weight" => format!("{p}.{shared}.gate_proj.weight"),
            "ffn_up_shexp.weight" => format!("{p}.{shared}.up_proj.weight"),
            "ffn_down_shexp.weight" => format!("{p}.{shared}.down_proj.weight"),
            "ffn_gate_inp_shexp.weight" if matches!(arch, Arch::Qwen2Moe | Arch::Qwen3Next(_)) => {
                format!("{p}.mlp.shared_expert_gate.weight")
            }
            "attn_v_b.weight" if arch.has_mla() => continue, // read with attn_k_b
            "attn_k_b.weight" if arch.has_mla() => {
                out.push((format!("{p}.self_attn.kv_b_proj.weight"), deepseek::kv_b(g, i, layer)?));
                continue;
            }
            _ if arch.has_mla() && deepseek::attention(rest).is_some() => {
                let hf = deepseek::attention(rest).unwrap_or_default();
                format!("{p}.self_attn.{hf}")
            }
            _ if matches!(arch, Arch::Mla(v) if v != deepseek::Variant::V3) && deepseek::indexer(rest).is_some() => {
                let hf = deepseek::indexer(rest).unwrap_or_default();
                format!("{p}.self_attn.{hf}")
            }
            "ffn_gate_exps.weight" | "ffn_up_exps.weight" | "ffn_down_exps.weight" => {
                let proj = match rest {
                    "ffn_gate_exps.weight" => gate,
                    "ffn_up_exps.weight" => up,
                    _ => down,
                };
                let [cols, rows, n] = t.ne[..] else {
                    return Err(Error::format(
                        g.path(),
                        format!("tensor `{name}`: expected 3 dimensions, has {:?}", t.ne),
                    ));
                };
                for e in 0..n {
                    out.push((
                        format!("{p}.{moe}.experts.{e}.{proj}.weight"),
                        Slice::rows(i, e * rows, rows, vec![rows as usize, cols as usize]),
                    ));
                }
                continue;
            }
            "ffn_gate_exps.bias" | "ffn_up_exps.bias" | "ffn_down_exps.bias" if arch == Arch::GptOss => {
                // gpt-oss's expert biases, `ne = [width, n_expert]`: expert e is row e.
                let proj = &rest[4..rest.len() - "_exps.bias".len()];
                out.extend(gpt_oss::expert_biases(g, i, &p, proj)?);
                continue;
            }
            _ => {
                let proj = rest.split_once('.').and_then(|(base, kind)| {
                    let hf = match base {
                        "attn_q" => ("q_proj", permute(heads)),
                        "attn_k" => ("k_proj", permute(kv_heads)),
                        "attn_v" => ("v_proj", None),
                        "attn_output" => ("o_proj", None),
                        _ => return None,
                    };
                    matches!(kind, "weight" | "bias").then_some((hf, kind))
                });
                match proj {
                    Some(((hf, row_map), kind)) => {
                        out.push(whole(format!("{p}.self_attn.{hf}.{kind}"), row_map));
                        continue;
                    }
                    None => {
                        unmapped.push(name.to_string());
                        continue;
                    }
                }
            }
        };
        out.push(whole(hf, None));
    }
    if matches!(arch, Arch::Qwen3Next(_)) {
        qwen3next::undo_norm_shift(&mut out);
    }
    if !unmapped.is_empty() {
        // A tensor we cannot place may change the output (a norm, a bias
        // of a variant we do not know): refuse rather than drop it.
        return Err(Error::Unsupported(format!(
            "{}: GGUF tensors with no Hugging Face counterpart for `{}`: {}",
            g.path().display(),
            g.get("general.architecture").and_then(Value::as_str).unwrap_or("?"),
            unmapped.join(", ")
        )));
    }
    Ok(out)
}

fn whole_slice(i: usize, t: &TensorInfo, row_map: Option<RowMap>) -> Slice {
    Slice { row_map, ..Slice::whole(i, t) }
}

/// The GGUF row holding HF row `r` of a q/k projection permuted over
/// `heads` heads of `rows / heads` rows.
pub fn permuted_row(r: usize, rows: usize, heads: usize) -> usize {
    let d = rows / heads;
    let (head, j) = (r / d, r % d);
    head * d + if j < d / 2 { 2 * j } else { 2 * (j - d / 2) + 1 }
}
