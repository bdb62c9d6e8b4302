//! DeepSeek-V4's manifold-constrained hyper-connections
//! (`DeepseekV4HyperConnection`, `DeepseekV4HyperHead`, transformers 5.24).
//!
//! A token carries `hc_mult` residual streams `X [N, H]` instead of one
//! residual. Before each attention and MoE block the streams are scored by
//! one linear map of their flattened RMS-normalised concatenation, giving
//! `pre [N]` (collapse the streams into the block input), `post [N]`
//! (expand the block output back) and `comb [N, N]`, made doubly
//! stochastic by Sinkhorn-Knopp, which mixes the streams:
//!
//! `X'_k = post_k * block(sum_j pre_j X_j) + sum_j comb[j, k] X_j`.
//!
//! Nothing crosses positions, so the coefficients live only while one
//! token passes a layer.

use crate::config::layout::HcTensors;
use crate::config::{ModelConfig, V4Params};
use crate::error::Result;
use crate::quant::QMatrix;
use crate::source::TensorSource;

use super::super::{load_matrix, load_vector};

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `x * rsqrt(mean(x^2) + eps)` (`DeepseekV4UnweightedRMSNorm`) into `out`.
fn unweighted_rms_norm(x: &[f32], eps: f32, out: &mut [f32]) {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ms + eps).sqrt();
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v * inv;
    }
}

/// `sum_j w_j X_j` of the streams `x` `[N, H]` into `out` `[H]`.
fn collapse(x: &[f32], w: &[f32], out: &mut [f32]) {
    let h = out.len();
    out.fill(0.0);
    for (stream, &wj) in x.chunks_exact(h).zip(w) {
        for (o, &v) in out.iter_mut().zip(stream) {
            *o += wj * v;
        }
    }
}

/// What one hyper-connection hands from before its block to after it.
#[derive(Clone)]
pub struct Coef {
    post: Vec<f32>, // [N]
    comb: Vec<f32>, // [N, N], comb[j * N + k]
}

impl Coef {
    pub fn new(n: usize) -> Coef {
        Coef { post: vec![0.0; n], comb: vec![0.0; n * n] }
    }

    pub fn floats(&self) -> usize {
        self.post.len() + self.comb.len()
    }
}

/// Per-call buffers of the hyper-connections.
pub struct HcScratch {
    normed: Vec<f32>, // [N * H]
    mixes: Vec<f32>,  // [(2 + N) * N]
    pre: Vec<f32>,    // [N]
    mixed: Vec<f32>,  // [N * H]
}

impl HcScratch {
    pub fn new(cfg: &ModelConfig) -> HcScratch {
        let Some(v) = &cfg.add.v4 else {
            return HcScratch { normed: vec![], mixes: vec![], pre: vec![], mixed: vec![] };
        };
        let n = v.hc_mult;
        HcScratch {
            normed: vec![0.0; n * cfg.hidden_size],
            mixes: vec![0.0; (2 + n) * n],
            pre: vec![0.0; n],
            mixed: vec![0.0; n * cfg.hidden_size],
        }
    }

    pub fn floats(&self) -> usize {
        self.normed.len() + self.mixes.len() + self.pre.len() + self.mixed.len()
    }
}

/// `model.layers.L.{attn_hc,ffn_hc}`.
pub struct HyperConnection {
    fn_: QMatrix,    // [(2 + N) * N, N * H], f32
    base: Vec<f32>,  // [(2 + N) * N]
    scale: Vec<f32>, // [3]: pre, post, comb
    n: usize,
    sinkhorn_iters: usize,
    hc_eps: f32,
    norm_eps: f32,
}

impl HyperConnection {
    pub fn load(cfg: &ModelConfig, v4: &V4Params, src: &dyn TensorSource, t: &HcTensors) -> Result<HyperConnection> {
        Ok(HyperConnection {
            fn_: load_matrix(cfg, src, &t.fn_.name)?,
            base: load_vector(cfg, src, &t.base.name)?,
            scale: load_vector(cfg, src, &t.scale.name)?,
            n: v4.hc_mult,
            sinkhorn_iters: v4.hc_sinkhorn_iters,
            hc_eps: v4.hc_eps,
            norm_eps: cfg.rms_norm_eps,
        })
    }

    /// The block input `sum_j pre_j X_j` of the streams `x` `[N, H]` into
    /// `out` `[H]`, and the coefficients `expand` will need.
    pub fn before(&self, x: &[f32], coef: &mut Coef, s: &mut HcScratch, out: &mut [f32]) {
        let n = self.n;
        unweighted_rms_norm(x, self.norm_eps, &mut s.normed);
        self.fn_.matvec(&s.normed, &mut s.mixes);
        let (pre_w, rest) = s.mixes.split_at(n);
        let (post_w, comb_w) = rest.split_at(n);
        let (pre_b, rest) = self.base.split_at(n);
        let (post_b, comb_b) = rest.split_at(n);
        for (p, (&w, &b)) in s.pre.iter_mut().zip(pre_w.iter().zip(pre_b)) {
            *p = sigmoid(w * self.scale[0] + b) + self.hc_eps;
        }
        for (p, (&w, &b)) in coef.post.iter_mut().zip(post_w.iter().zip(post_b)) {
            *p = 2.0 * sigmoid(w * self.scale[1] + b);
        }
        // `softmax(comb_w * comb_scale + comb_b, dim=-1) + hc_eps`, row j
        // over k.
        let comb = &mut coef.comb;
        for j in 0..n {
            let row = &mut comb[j * n..(j + 1) * n];
            for (k, c) in row.iter_mut().enumerate() {
                *c = comb_w[j * n + k] * self.scale[2] + comb_b[j * n + k];
            }
            super::super::ops::softmax(row);
            row.iter_mut().for_each(|c| *c += self.hc_eps);
        }
        // `comb / (comb.sum(dim=-2) + eps)` (columns), then rows and
        // columns alternately for the remaining iterations.
        let normalize_columns = |comb: &mut [f32]| {
            for k in 0..n {
                let sum: f32 = (0..n).map(|j| comb[j * n + k]).sum();
                (0..n).for_each(|j| comb[j * n + k] /= sum + self.hc_eps);
            }
        };
        normalize_columns(comb);
        for _ in 1..self.sinkhorn_iters {
            for row in comb.chunks_exact_mut(n) {
                let sum: f32 = row.iter().sum();
                row.iter_mut().for_each(|c| *c /= sum + self.hc_eps);
            }
            normalize_columns(comb);
        }
        collapse(x, &s.pre, out);
    }

    /// `X'_k = post_k * y + sum_j comb[j, k] X_j` in place, for the block
    /// output `y` `[H]`.
    pub fn after(x: &mut [f32], y: &[f32], coef: &Coef, s: &mut HcScratch) {
        let h = y.len();
        let n = coef.post.len();
        for k in 0..n {
            let out = &mut s.mixed[k * h..(k + 1) * h];
            for (o, &v) in out.iter_mut().zip(y) {
                *o = coef.post[k] * v;
            }
            for j in 0..n {
                let c = coef.comb[j * n + k];
                for (o, &v) in out.iter_mut().zip(&x[j * h..(j + 1) * h]) {
                    *o += c * v;
                }
            }
        }
        x.copy_from_slice(&s.mixed[..n * h]);
    }
}

/// `model.hc_head`: the final collapse of the streams before `norm`.
pub struct HyperHead {
    hc_fn: QMatrix,    // [N, N * H], f32
    hc_base: Vec<f32>, // [N]
    hc_scale: f32,
    hc_eps: f32,
    norm_eps: f32,
}

impl HyperHead {
    pub fn load(cfg: &ModelConfig, v4: &V4Params, src: &dyn TensorSource, t: &HcTensors) -> Result<HyperHead> {
        let scale = load_vector(cfg, src, &t.scale.name)?;
        Ok(HyperHead {
            hc_fn: load_matrix(cfg, src, &t.fn_.name)?,
            hc_base: load_vector(cfg, src, &t.base.name)?,
            hc_scale: scale.first().copied().unwrap_or(1.0),
            hc_eps: v4.hc_eps,
            norm_eps: cfg.rms_norm_eps,
        })
    }

    /// `sum_j (sigmoid(mix_j * scale + base_j) + eps) X_j` into `out` `[H]`.
    pub fn apply(&self, x: &[f32], s: &mut HcScratch, out: &mut [f32]) {
        let n = self.hc_base.len();
        unweighted_rms_norm(x, self.norm_eps, &mut s.normed);
        self.hc_fn.matvec(&s.normed, &mut s.mixes[..n]);
        for (p, (&w, &b)) in s.pre.iter_mut().zip(s.mixes.iter().zip(&self.hc_base)) {
            *p = sigmoid(w * self.hc_scale + b) + self.hc_eps;
        }
        collapse(x, &s.pre, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 20 Sinkhorn iterations leave every row and column summing to 1
    /// (to the eps floor), which is what keeps the mixed streams bounded.
    #[test]
    fn sinkhorn_makes_the_mix_doubly_stochastic() {
        let (n, h) = (4, 8);
        let mix = (2 + n) * n;
        let w: Vec<f32> = (0..mix * n * h).map(|i| ((i * 37 % 101) as f32 / 50.0 - 1.0) * 0.3).collect();
        let hc = HyperConnection {
            fn_: QMatrix::from_f32(w, mix, n * h),
            base: (0..mix).map(|i| (i as f32 * 0.7).sin()).collect(),
            scale: vec![1.0, 0.8, 1.3],
            n,
            sinkhorn_iters: 20,
            hc_eps: 1e-6,
            norm_eps: 1e-6,
        };
        let mut s =
            HcScratch { normed: vec![0.0; n * h], mixes: vec![0.0; mix], pre: vec![0.0; n], mixed: vec![0.0; n * h] };
        let x: Vec<f32> = (0..n * h).map(|i| (i as f32 * 0.3).cos() * 2.0).collect();
        let mut coef = Coef::new(n);
        let mut out = vec![0.0; h];
        hc.before(&x, &mut coef, &mut s, &mut out);
        for j in 0..n {
            let row: f32 = (0..n).map(|k| coef.comb[j * n + k]).sum();
            let col: f32 = (0..n).map(|k| coef.comb[k * n + j]).sum();
            assert!((row - 1.0).abs() < 1e-3 && (col - 1.0).abs() < 1e-5, "row {row} col {col}");
        }
        assert!(coef.post.iter().all(|&p| p > 0.0 && p < 2.0));
    }
}
