//! Feed-forward blocks: the dense SwiGLU MLP and the softmax top-k router
//! of the sparse MoE block (the routed experts themselves are behind
//! `ExpertProvider`).

use crate::config::ModelConfig;
use crate::error::Result;
use crate::model::source::TensorSource;
use crate::quant::QMatrix;

use super::load_matrix;
use super::ops::{silu, softmax};

/// `model.layers.L.mlp` of a dense layer: `down(silu(gate x) * up x)`.
pub struct Mlp {
    gate_proj: QMatrix, // [I, H]
    up_proj: QMatrix,   // [I, H]
    down_proj: QMatrix, // [H, I]
}

impl Mlp {
    pub fn load(cfg: &ModelConfig, src: &dyn TensorSource, layer: usize) -> Result<Mlp> {
        let p = format!("model.layers.{layer}.mlp");
        Ok(Mlp {
            gate_proj: load_matrix(cfg, src, &format!("{p}.gate_proj.weight"))?,
            up_proj: load_matrix(cfg, src, &format!("{p}.up_proj.weight"))?,
            down_proj: load_matrix(cfg, src, &format!("{p}.down_proj.weight"))?,
        })
    }

    /// `gate`, `up`: scratch of length I.
    pub fn forward(&self, x: &[f32], gate: &mut [f32], up: &mut [f32], out: &mut [f32]) {
        self.gate_proj.matvec(x, gate);
        self.up_proj.matvec(x, up);
        for (g, u) in gate.iter_mut().zip(up.iter()) {
            *g = silu(*g) * u;
        }
        self.down_proj.matvec(gate, out);
    }
}

/// The router of `model.layers.L.{mlp|block_sparse_moe}.gate`.
pub struct Router {
    weight: QMatrix, // [E, H]
    top_k: usize,
    norm_topk_prob: bool,
}

impl Router {
    pub fn load(cfg: &ModelConfig, src: &dyn TensorSource, layer: usize) -> Result<Router> {
        Ok(Router {
            weight: load_matrix(cfg, src, &cfg.router_name(layer))?,
            top_k: cfg.top_k,
            norm_topk_prob: cfg.norm_topk_prob,
        })
    }

    /// Fills `picks` with (expert, weight) in descending probability.
    /// `probs`: scratch of length E.
    pub fn route(&self, x: &[f32], probs: &mut [f32], picks: &mut Vec<(usize, f32)>) {
        // `softmax(router_logits, dtype=torch.float)`, then `torch.topk`.
        self.weight.matvec(x, probs);
        softmax(probs);
        top_k(probs, self.top_k, picks);
        if self.norm_topk_prob {
            // `router_top_value /= router_top_value.sum(dim=-1, keepdim=True)`
            let sum: f32 = picks.iter().map(|p| p.1).sum();
            for p in picks.iter_mut() {
                p.1 /= sum;
            }
        }
    }
}

/// The k largest values, descending; among equal values the lower index
/// first. NaNs (a broken router) sort last rather than panicking.
pub fn top_k(values: &[f32], k: usize, picks: &mut Vec<(usize, f32)>) {
    picks.clear();
    for (i, &v) in values.iter().enumerate() {
        let better = |p: &(usize, f32)| v > p.1 || (p.1.is_nan() && !v.is_nan());
        if picks.len() < k {
            let at = picks.iter().position(better).unwrap_or(picks.len());
            picks.insert(at, (i, v));
        } else if let Some(at) = picks.iter().position(better) {
            picks.insert(at, (i, v));
            picks.truncate(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::top_k;

    #[test]
    fn top_k_orders_and_breaks_ties_by_index() {
        let mut p = Vec::new();
        top_k(&[0.1, 0.4, 0.2, 0.4, f32::NAN, 0.3], 3, &mut p);
        assert_eq!(p.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 3, 5]);
        top_k(&[1.0, 2.0], 2, &mut p);
        assert_eq!(p.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 0]);
    }
}
