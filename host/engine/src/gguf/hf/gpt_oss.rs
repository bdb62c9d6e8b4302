//! `gpt-oss` (`conversion/gpt_oss.py`, `src/models/openai-moe.cpp`) as
//! transformers' `gpt_oss` (GGUF_NOTES.md 4.8). The converter splits HF's
//! `experts.gate_up_proj` `[E, H, 2I]` (input-major, gate and up
//! interleaved) into `ffn_gate_exps` / `ffn_up_exps` `ne = [H, I, E]` and
//! transposes `down_proj` to `ne = [I, H, E]`: per expert that is
//! nn.Linear's layout, so the view offers the experts per expert
//! (`mlp.experts.E.{gate,up,down}_proj.{weight,bias}`) and the checkpoint
//! reads them with the per-expert layout (checkpoint/gguf.rs), instead of
//! re-interleaving them into the fused tensors.
//!
//! What the format does not say and llama.cpp hard-codes: the sliding /
//! full alternation (even layers slide, `load_swa_pattern(ml, 2)`), the
//! clamped SwiGLU (alpha 1.702, limit 7), softmax over the chosen top-k.
//! YaRN's `truncate`: every gpt-oss release config says `false`
//! (transformers then keeps the correction range unrounded; ggml always
//! rounds it, `ggml_rope_yarn_corr_dims`), and so does the view.

use serde_json::{json, Value as Json};

use super::{base, head_dim, yarn, GgufFile, Keys, Slice};
use crate::error::{Error, Result};

pub(super) fn config(k: &Keys) -> Result<Json> {
    let g = k.g;
    let path = g.path().display();
    let layers = k.usize_req("block_count")?;
    let mut c = base(k, "GptOssForCausalLM", "gpt_oss", layers)?;
    head_dim(k, &mut c)?;
    let experts = k.usize_req("expert_count")?;
    c.insert("num_local_experts".into(), json!(experts));
    c.insert("num_experts_per_tok".into(), json!(k.usize_req("expert_used_count")?));
    let width = match k.usize_opt("expert_feed_forward_length")? {
        Some(w) => w,
        None => k.usize_req("feed_forward_length")?,
    };
    c.insert("intermediate_size".into(), json!(width));
    let window = k.usize_req("attention.sliding_window")?;
    c.insert("sliding_window".into(), json!(window));
    let kinds: Vec<&str> =
        (0..layers).map(|l| if l % 2 == 0 { "sliding_attention" } else { "full_attention" }).collect();
    c.insert("layer_types".into(), json!(kinds));
    let theta = k.f64_opt("rope.freq_base")?.unwrap_or(150_000.0);
    if k.f64_opt("rope.freq_base_swa")?.is_some_and(|t| t != theta) {
        return Err(Error::Unsupported(format!("{path}: gpt-oss with a separate sliding-window rope base")));
    }
    let mut rope = yarn(k)?.unwrap_or_default();
    if rope.is_empty() {
        rope.insert("rope_type".into(), json!("default"));
    } else {
        rope.insert("truncate".into(), json!(false));
    }
    rope.insert("rope_theta".into(), json!(theta));
    c.insert("rope_parameters".into(), Json::Object(rope));
    c.insert("attention_bias".into(), json!(g.tensor("blk.0.attn_q.bias").is_some()));
    c.insert("swiglu_alpha".into(), json!(1.702));
    c.insert("swiglu_limit".into(), json!(7.0));
    Ok(Json::Object(c))
}

/// `ffn_{proj}_exps.bias` (`ne = [width, n_expert]`) of layer prefix `p`
/// as one bias per expert.
pub(super) fn expert_biases(g: &GgufFile, i: usize, p: &str, proj: &str) -> Result<Vec<(String, Slice)>> {
    let t = &g.tensors[i];
    let [width, n] = t.ne[..] else {
        return Err(Error::format(g.path(), format!("tensor `{}`: expected 2 dimensions, has {:?}", t.name, t.ne)));
    };
    Ok((0..n)
        .map(|e| (format!("{p}.mlp.experts.{e}.{proj}_proj.bias"), Slice::rows(i, e, 1, vec![width as usize])))
        .collect())
}
