//! Feed-forward blocks: the dense SwiGLU MLP and the softmax top-k router
//! of the sparse MoE block (the routed experts themselves are behind
//! `ExpertProvider`).

use crate::config::{ModelConfig, RouterKind};
use crate::error::Result;
use crate::model::source::TensorSource;
use crate::quant::QMatrix;

use super::{load_matrix, load_vector};
use super::ops::{silu, softmax};

/// `model.layers.L.mlp` of a dense layer: `down(silu(gate x) * up x)`.
pub struct Mlp {
    gate_proj: QMatrix, // [I, H]
    up_proj: QMatrix,   // [I, H]
    down_proj: QMatrix, // [H, I]
}

impl Mlp {
    pub fn load(cfg: &ModelConfig, src: &dyn TensorSource, layer: usize) -> Result<Mlp> {
        Self::load_at(cfg, src, &format!("model.layers.{layer}.mlp"))
    }

    /// The SwiGLU MLP under `p` (also a MoE block's shared experts).
    pub fn load_at(cfg: &ModelConfig, src: &dyn TensorSource, p: &str) -> Result<Mlp> {
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
    kind: RouterKind,
    /// `e_score_correction_bias` of a sigmoid router: selection only.
    bias: Option<Vec<f32>>,
}

impl Router {
    pub fn load(cfg: &ModelConfig, src: &dyn TensorSource, layer: usize) -> Result<Router> {
        let bias = match cfg.router {
            RouterKind::SigmoidBias { .. } => Some(load_vector(cfg, src, &cfg.router_bias_name(layer))?),
            RouterKind::Softmax => None,
        };
        Ok(Router {
            weight: load_matrix(cfg, src, &cfg.router_name(layer))?,
            top_k: cfg.top_k,
            norm_topk_prob: cfg.norm_topk_prob,
            kind: cfg.router,
            bias,
        })
    }

    /// Fills `picks` with (expert, weight) in descending probability.
    /// `probs`: scratch of length E.
    pub fn route(&self, x: &[f32], probs: &mut [f32], picks: &mut Vec<(usize, f32)>) {
        if let (RouterKind::SigmoidBias { routed_scaling_factor }, Some(bias)) = (self.kind, &self.bias) {
            // KimiLinearTopkRouter: scores = sigmoid(logits); pick top_k of
            // scores + bias; weights are the unbiased scores.
            self.weight.matvec(x, probs);
            for p in probs.iter_mut() {
                *p = 1.0 / (1.0 + (-*p).exp());
            }
            top_k_by(probs.len(), |i| probs[i] + bias[i], self.top_k, picks);
            for p in picks.iter_mut() {
                p.1 = probs[p.0];
            }
            if self.norm_topk_prob {
                let denominator = picks.iter().map(|p| p.1).sum::<f32>() + 1e-20;
                for p in picks.iter_mut() {
                    p.1 /= denominator;
                }
            }
            for p in picks.iter_mut() {
                p.1 *= routed_scaling_factor;
            }
            return;
        }
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

    /// The `n` experts this router would rank first for `x` (lookahead:
    /// a guess at a later layer's choice, used only to start reads).
    pub fn predict(&self, x: &[f32], probs: &mut [f32], n: usize, picks: &mut Vec<(usize, f32)>) {
        self.weight.matvec(x, probs);
        top_k(probs, n, picks);
    }
}

/// The k largest values, descending; among equal values the lower index
/// first. NaNs (a broken router) sort last rather than panicking.
pub fn top_k(values: &[f32], k: usize, picks: &mut Vec<(usize, f32)>) {
    top_k_by(values.len(), |i| values[i], k, picks)
}

/// `top_k` over `value(i)` for i < n; picks hold (index, value).
pub fn top_k_by(n: usize, value: impl Fn(usize) -> f32, k: usize, picks: &mut Vec<(usize, f32)>) {
    picks.clear();
    for (i, v) in (0..n).map(|i| (i, value(i))) {
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
