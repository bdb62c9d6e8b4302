//! `glm4moe` (GLM-4.5 / 4.6, `conversion/glm.py`, `src/models/glm4-moe.cpp`)
//! as transformers' `glm4_moe` (GGUF_NOTES.md 4.7): q/k/v biases, per-head
//! q/k norms, partial NEOX rotary (`rope.dimension_count` of the head),
//! leading dense layers, shared experts, a sigmoid router with
//! `exp_probs_b` as its selection bias, groups, routed scaling. The MTP
//! layer is one more block (`block_count` counts it,
//! `nextn_predict_layers`); hf.rs skips its tensors.

use serde_json::{json, Value as Json};

use super::{base, decoder_layers, head_dim, sigmoid_moe, yarn, Keys};
use crate::error::{Error, Result};

pub(super) fn config(k: &Keys) -> Result<Json> {
    let g = k.g;
    let path = g.path().display();
    let (layers, nextn) = decoder_layers(k)?;
    let mut c = base(k, "Glm4MoeForCausalLM", "glm4_moe", layers)?;
    c.insert("num_nextn_predict_layers".into(), json!(nextn));
    let head = head_dim(k, &mut c)?.unwrap_or(k.usize_req("embedding_length")? / k.usize_req("attention.head_count")?);
    // llama.cpp: a missing `expert_gating_func` is sigmoid for glm4moe (glm4-moe.cpp:15-18).
    match k.usize_opt("expert_gating_func")? {
        None | Some(2) => {}
        Some(f) => {
            return Err(Error::Unsupported(format!("{path}: glm4moe with expert_gating_func {f} (sigmoid, 2, only)")))
        }
    }
    if k.get("rope.dimension_sections").is_some() {
        return Err(Error::Unsupported(format!("{path}: glm4moe with multi-section rope (a vision model)")));
    }
    let dims = k.usize_opt("rope.dimension_count")?.unwrap_or(head);
    // transformers takes `int(head_dim * partial_rotary_factor)`; the
    // factor must give back exactly the rotated width.
    let partial = dims as f64 / head as f64;
    if (head as f64 * partial) as usize != dims {
        return Err(Error::Unsupported(format!("{path}: rotary width {dims} of {head} is not a representable factor")));
    }
    let theta = k.f64_opt("rope.freq_base")?.unwrap_or(10_000.0);
    let mut rope = yarn(k)?.unwrap_or_default();
    rope.entry("rope_type").or_insert(json!("default"));
    rope.insert("rope_theta".into(), json!(theta));
    rope.insert("partial_rotary_factor".into(), json!(partial));
    c.insert("partial_rotary_factor".into(), json!(partial));
    c.insert("rope_parameters".into(), Json::Object(rope));
    c.insert("attention_bias".into(), json!(g.tensor("blk.0.attn_q.bias").is_some()));
    c.insert("use_qk_norm".into(), json!(g.tensor("blk.0.attn_q_norm.weight").is_some()));
    sigmoid_moe(k, &mut c, layers)?;
    Ok(Json::Object(c))
}
