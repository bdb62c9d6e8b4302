//! `minimax-m2` (`conversion/minimax.py`, `src/models/minimax-m2.cpp`) as
//! transformers' `minimax_m2`: GQA with q/k RMSNorms over the whole
//! projection (`attn_q_norm` `ne = [heads * head_dim]`), partial NEOX
//! rotary (`rope.dimension_count` is HF's `rotary_dim`), a sigmoid router
//! whose `exp_probs_b` biases the selection only, the chosen weights
//! renormalised (`build_moe_ffn(..., norm_w = true, ...)`), no shared
//! expert. The converter copies every tensor unchanged (stacking the
//! experts): HF's names are `block_sparse_moe.{gate,experts.E.w1|w3|w2}`
//! and `block_sparse_moe.e_score_correction_bias`.

use serde_json::{json, Value as Json};

use super::{base, head_dim, yarn, Keys};
use crate::error::{Error, Result};

pub(super) fn config(k: &Keys) -> Result<Json> {
    let g = k.g;
    let path = g.path().display();
    let layers = k.usize_req("block_count")?;
    let mut c = base(k, "MiniMaxM2ForCausalLM", "minimax_m2", layers)?;
    let head = head_dim(k, &mut c)?.unwrap_or(k.usize_req("embedding_length")? / k.usize_req("attention.head_count")?);
    // llama.cpp's gating: 2 is sigmoid, the only one the release uses.
    match k.usize_opt("expert_gating_func")? {
        None | Some(2) => {}
        Some(f) => {
            return Err(Error::Unsupported(format!(
                "{path}: minimax-m2 with expert_gating_func {f} (sigmoid, 2, only)"
            )))
        }
    }
    // minimax-m2.cpp scales the weights only when this key is set; the
    // release does not set it, and transformers has no such factor.
    if let Some(s) = k.f64_opt("expert_weights_scale")?.filter(|&s| s != 0.0 && s != 1.0) {
        return Err(Error::Unsupported(format!("{path}: minimax-m2 with expert_weights_scale {s}")));
    }
    for l in 0..layers {
        for t in ["ffn_gate_inp.weight", "exp_probs_b.bias"] {
            if g.tensor(&format!("blk.{l}.{t}")).is_none() {
                return Err(Error::format(g.path(), format!("minimax-m2 layer {l} has no `blk.{l}.{t}`")));
            }
        }
    }
    let rotary = k.usize_opt("rope.dimension_count")?.unwrap_or(head);
    let theta = k.f64_opt("rope.freq_base")?.unwrap_or(10_000.0);
    let mut rope = yarn(k)?.unwrap_or_default();
    rope.entry("rope_type").or_insert(json!("default"));
    rope.insert("rope_theta".into(), json!(theta));
    c.insert("rope_parameters".into(), Json::Object(rope));
    c.insert("rotary_dim".into(), json!(rotary));
    c.insert("num_local_experts".into(), json!(k.usize_req("expert_count")?));
    c.insert("num_experts_per_tok".into(), json!(k.usize_req("expert_used_count")?));
    let width = match k.usize_opt("expert_feed_forward_length")? {
        Some(w) => w,
        None => k.usize_req("feed_forward_length")?,
    };
    c.insert("intermediate_size".into(), json!(width));
    c.insert("scoring_func".into(), json!("sigmoid"));
    c.insert("use_routing_bias".into(), json!(true));
    c.insert("use_qk_norm".into(), json!(g.tensor("blk.0.attn_q_norm.weight").is_some()));
    c.insert("qk_norm_type".into(), json!("per_layer"));
    c.insert("shared_intermediate_size".into(), json!(0));
    Ok(Json::Object(c))
}
