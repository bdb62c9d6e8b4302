//! Feed-forward blocks: the dense SwiGLU MLP, the routers of the sparse MoE
//! block (softmax top-k, sigmoid with a correction bias, grouped), and
//! K3's latent MoE around the routed experts (whose arithmetic is in
//! `experts`).

use crate::config::layout::{LatentTensors, MlpTensors, MoeTensors, Tensor};
use crate::config::{Activation, ModelConfig, RouterKind};
use crate::error::Result;
use crate::quant::QMatrix;
use crate::source::TensorSource;
use crate::stats::StepStats;
use crate::transformer::experts::ExpertProvider;

use super::ops::{rms_norm_in_place, silu, softmax};
use super::{load_matrix, load_vector};

/// `model.layers.L.mlp` of a dense layer: `down(silu(gate x) * up x)`.
pub struct Mlp {
    gate_proj: QMatrix, // [I, H]
    up_proj: QMatrix,   // [I, H]
    down_proj: QMatrix, // [H, I]
    /// SiLU, or K3's SiTU.
    act: Activation,
}

impl Mlp {
    /// A dense layer's `mlp`, or a MoE block's shared experts.
    pub fn load(cfg: &ModelConfig, src: &dyn TensorSource, t: &MlpTensors) -> Result<Mlp> {
        Ok(Mlp {
            gate_proj: load_matrix(cfg, src, &t.gate_proj.name)?,
            up_proj: load_matrix(cfg, src, &t.up_proj.name)?,
            down_proj: load_matrix(cfg, src, &t.down_proj.name)?,
            act: cfg.activation(),
        })
    }

    /// `gate`, `up`: scratch of length I.
    pub fn forward(&self, x: &[f32], gate: &mut [f32], up: &mut [f32], out: &mut [f32]) {
        self.gate_proj.matvec(x, gate);
        self.up_proj.matvec(x, up);
        match self.act {
            Activation::Silu => {
                for (g, u) in gate.iter_mut().zip(up.iter()) {
                    *g = silu(*g) * u;
                }
            }
            act => {
                for (g, u) in gate.iter_mut().zip(up.iter()) {
                    *g = act.apply(*g, *u);
                }
            }
        }
        self.down_proj.matvec(gate, out);
    }

    /// `forward` for the tokens of a prefill chunk (`xs`, `outs`: `[n, H]`;
    /// `gate`, `up`: `[n, I]` scratch), each weight row loaded once per
    /// tile of tokens (`QMatrix::matvec_many`): every token's output is
    /// bit-identical to `forward`'s for that token.
    pub fn forward_batch(&self, xs: &[f32], gate: &mut [f32], up: &mut [f32], outs: &mut [f32]) {
        QMatrix::matvec_many_each(&mut [(&self.gate_proj, &mut *gate), (&self.up_proj, &mut *up)], xs);
        for (g, u) in gate.iter_mut().zip(up.iter()) {
            *g = match self.act {
                Activation::Silu => silu(*g) * u,
                act => act.apply(*g, *u),
            };
        }
        self.down_proj.matvec_many(gate, outs);
    }
}

/// The router of `model.layers.L.{mlp|block_sparse_moe}.gate`.
pub struct Router {
    weight: QMatrix, // [E, H]
    top_k: usize,
    norm_topk_prob: bool,
    kind: RouterKind,
    /// `e_score_correction_bias` of a sigmoid router (selection only), or
    /// gpt-oss's `router.bias` (added to the logits).
    bias: Option<Vec<f32>>,
    /// `(n_group, topk_group)`: DeepSeek-V3's group-limited selection.
    groups: Option<(usize, usize)>,
    /// DeepSeek-V4's hash layers: `tid2eid` `[V, top_k]`, the experts of
    /// each token id (the router's scores still weigh them).
    hash: Option<Vec<u32>>,
}

impl Router {
    pub fn load(cfg: &ModelConfig, src: &dyn TensorSource, t: &MoeTensors) -> Result<Router> {
        let hash = match &t.tid2eid {
            Some(table) => Some(load_hash_table(cfg, src, table)?),
            None => None,
        };
        let bias = match &t.router_bias {
            Some(b) => Some(load_vector(cfg, src, &b.name)?),
            None => None,
        };
        Ok(Router {
            weight: load_matrix(cfg, src, &t.router.name)?,
            top_k: cfg.top_k,
            norm_topk_prob: cfg.norm_topk_prob,
            kind: cfg.router,
            bias,
            groups: cfg.expert_groups,
            hash,
        })
    }

    /// Fills `picks` with (expert, weight) for the token `tok` whose MoE
    /// input is `x`, in descending probability (a hash layer: in table
    /// order). `probs`: scratch of length E.
    pub fn route(&self, x: &[f32], tok: u32, probs: &mut [f32], picks: &mut Vec<(usize, f32)>) {
        let scored = match self.kind {
            RouterKind::SigmoidBias { routed_scaling_factor } => Some((routed_scaling_factor, false)),
            RouterKind::SqrtSoftplusBias { routed_scaling_factor } => Some((routed_scaling_factor, true)),
            _ => None,
        };
        if let Some((routed_scaling_factor, sqrt_softplus)) = scored {
            // KimiLinearTopkRouter: scores = sigmoid(logits); pick top_k of
            // scores + bias; weights are the unbiased scores. DeepSeek-V4:
            // `sqrt(softplus(logits))`, and a hash layer's picks are
            // `tid2eid[input_ids]`.
            self.weight.matvec(x, probs);
            for p in probs.iter_mut() {
                *p = if sqrt_softplus { softplus(*p).sqrt() } else { 1.0 / (1.0 + (-*p).exp()) };
            }
            match (&self.hash, &self.bias, self.groups) {
                (Some(table), _, _) => {
                    picks.clear();
                    let row = tok as usize * self.top_k;
                    picks.extend(table[row..row + self.top_k].iter().map(|&e| (e as usize, 0.0)));
                }
                (None, Some(bias), Some((n_group, topk_group))) => {
                    grouped_top_k(|i| probs[i] + bias[i], probs.len(), n_group, topk_group, self.top_k, picks)
                }
                (None, Some(bias), None) => top_k_by(probs.len(), |i| probs[i] + bias[i], self.top_k, picks),
                (None, None, _) => top_k(probs, self.top_k, picks),
            }
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
        if let (RouterKind::BiasedTopKSoftmax, Some(bias)) = (self.kind, &self.bias) {
            // GptOssTopKRouter: `router_logits = F.linear(h, weight, bias)`,
            // `top_value, top_index = torch.topk(router_logits, top_k)`,
            // `router_scores = softmax(top_value, dim=1)`.
            self.weight.matvec(x, probs);
            super::ops::add_in_place(probs, bias);
            top_k(probs, self.top_k, picks);
            let max = picks.first().map_or(0.0, |p| p.1);
            let mut sum = 0.0f32;
            for p in picks.iter_mut() {
                p.1 = (p.1 - max).exp();
                sum += p.1;
            }
            for p in picks.iter_mut() {
                p.1 /= sum;
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
    /// A hash layer's guess is its table row: exact.
    pub fn predict(&self, x: &[f32], tok: u32, probs: &mut [f32], n: usize, picks: &mut Vec<(usize, f32)>) {
        if let Some(table) = &self.hash {
            picks.clear();
            let row = tok as usize * self.top_k;
            picks.extend(table[row..row + self.top_k.min(n)].iter().map(|&e| (e as usize, 0.0)));
            return;
        }
        self.weight.matvec(x, probs);
        top_k(probs, n, picks);
    }
}

/// `F.softplus` (beta 1, threshold 20: linear above it).
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// `mlp.gate.tid2eid` of a hash layer, every id checked to be an expert
/// (the table is read from an untrusted file and indexes the experts).
fn load_hash_table(cfg: &ModelConfig, src: &dyn TensorSource, table: &Tensor) -> Result<Vec<u32>> {
    let name = &table.name;
    let raw = load_vector(cfg, src, name)?;
    if raw.len() != cfg.vocab_size * cfg.top_k {
        return Err(crate::error::Error::Runtime(format!(
            "weight `{name}` has {} entries, the config implies {} x {}",
            raw.len(),
            cfg.vocab_size,
            cfg.top_k
        )));
    }
    raw.iter()
        .map(|&v| {
            if v >= 0.0 && v.fract() == 0.0 && (v as usize) < cfg.num_experts {
                Ok(v as u32)
            } else {
                Err(crate::error::Error::Runtime(format!(
                    "weight `{name}` names expert {v}; the model has {}",
                    cfg.num_experts
                )))
            }
        })
        .collect()
}

/// `DeepseekV3TopkRouter.get_topk_indices`: a group scores the sum of its
/// two best `value`s; only the `topk_group` best groups stay eligible, and
/// the top `k` of their experts are picked. `n` must be a multiple of
/// `n_group` with at least 2 experts per group (checked by the config).
pub fn grouped_top_k(
    value: impl Fn(usize) -> f32,
    n: usize,
    n_group: usize,
    topk_group: usize,
    k: usize,
    picks: &mut Vec<(usize, f32)>,
) {
    let size = n / n_group;
    let mut best2 = Vec::with_capacity(2);
    let group_score: Vec<f32> = (0..n_group)
        .map(|g| {
            top_k_by(size, |i| value(g * size + i), 2, &mut best2);
            best2.iter().map(|p| p.1).sum()
        })
        .collect();
    let mut groups = Vec::with_capacity(topk_group);
    top_k(&group_score, topk_group, &mut groups);
    let mut kept = vec![false; n_group];
    for (g, _) in &groups {
        kept[*g] = true;
    }
    top_k_by(n, |i| if kept[i / size] { value(i) } else { f32::NEG_INFINITY }, k, picks);
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

/// `block_sparse_moe` of K3: routed experts on a latent of width L between
/// a down- and an up-projection, with an RMSNorm on the weighted sum.
pub struct LatentMoe {
    down: QMatrix,          // routed_expert_down_proj [L, H]
    norm: Option<Vec<f32>>, // routed_expert_norm [L]
    up: QMatrix,            // routed_expert_up_proj [H, L]
    eps: f32,
}

/// Buffers of the latent MoE, `[L]` each.
pub struct LatentScratch {
    z: Vec<f32>,
    y: Vec<f32>,
}

impl LatentScratch {
    pub fn new(cfg: &ModelConfig) -> LatentScratch {
        let l = cfg.k3.and_then(|k| k.latent).unwrap_or(0);
        LatentScratch { z: vec![0.0; l], y: vec![0.0; l] }
    }

    /// Floats held, for the memory plan (`plan::scratch_bytes`).
    pub fn floats(&self) -> usize {
        self.z.len() + self.y.len()
    }
}

impl LatentMoe {
    /// The latent projections of a MoE layer whose experts run on a latent
    /// (K3's `routed_expert_hidden_size`).
    pub fn load(cfg: &ModelConfig, src: &dyn TensorSource, t: &LatentTensors) -> Result<LatentMoe> {
        Ok(LatentMoe {
            down: load_matrix(cfg, src, &t.routed_expert_down_proj.name)?,
            norm: match &t.routed_expert_norm {
                Some(n) => Some(load_vector(cfg, src, &n.name)?),
                None => None,
            },
            up: load_matrix(cfg, src, &t.routed_expert_up_proj.name)?,
            eps: cfg.rms_norm_eps,
        })
    }

    /// `out = up(norm(sum_j w_j expert_j(down x)))`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        layer: usize,
        x: &[f32],
        picks: &[(usize, f32)],
        experts: &dyn ExpertProvider,
        s: &mut LatentScratch,
        out: &mut [f32],
        stats: &mut StepStats,
    ) -> Result<()> {
        self.down.matvec(x, &mut s.z);
        experts.forward_experts(layer, &s.z, picks, &mut s.y, stats)?;
        if let Some(w) = &self.norm {
            rms_norm_in_place(&mut s.y, w, self.eps);
        }
        self.up.matvec(&s.y, out);
        Ok(())
    }
}

impl LatentMoe {
    /// `forward` for the tokens of a prefill chunk (`xs`, `outs`: `[n, H]`;
    /// `z`, `zy`: `[n, L]` scratch): the projections over every token at
    /// once (`QMatrix::matvec_many`), the experts as one batch.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_batch(
        &self,
        layer: usize,
        xs: &[f32],
        picks: &[Vec<(usize, f32)>],
        experts: &dyn ExpertProvider,
        z: &mut [f32],
        zy: &mut [f32],
        outs: &mut [f32],
        stats: &mut StepStats,
    ) -> Result<()> {
        let l = z.len() / picks.len().max(1);
        self.down.matvec_many(xs, z);
        experts.forward_experts_batch(layer, z, picks, zy, stats)?;
        if let Some(w) = &self.norm {
            for yt in zy.chunks_exact_mut(l) {
                rms_norm_in_place(yt, w, self.eps);
            }
        }
        self.up.matvec_many(zy, outs);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{grouped_top_k, top_k};

    /// The best single expert sits in a group whose second best is weak:
    /// group-limited routing must skip it, plain top-k would take it.
    #[test]
    fn grouped_top_k_keeps_only_the_best_groups() {
        // 4 groups of 2; group sums: 1.0, 1.3, 1.5, 0.3 -> keep groups 2 and 1.
        let v = [0.95, 0.05, 0.7, 0.6, 0.8, 0.7, 0.2, 0.1];
        let mut p = Vec::new();
        grouped_top_k(|i| v[i], 8, 4, 2, 3, &mut p);
        assert_eq!(p.iter().map(|x| x.0).collect::<Vec<_>>(), vec![4, 2, 5]);
        top_k(&v, 3, &mut p);
        assert_eq!(p[0].0, 0);
        // Every group kept: the plain top-k.
        grouped_top_k(|i| v[i], 8, 4, 4, 3, &mut p);
        assert_eq!(p.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 4, 2]);
    }

    #[test]
    fn top_k_orders_and_breaks_ties_by_index() {
        let mut p = Vec::new();
        top_k(&[0.1, 0.4, 0.2, 0.4, f32::NAN, 0.3], 3, &mut p);
        assert_eq!(p.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 3, 5]);
        top_k(&[1.0, 2.0], 2, &mut p);
        assert_eq!(p.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 0]);
    }
}
