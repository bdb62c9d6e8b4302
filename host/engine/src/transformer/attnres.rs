//! Kimi K3's attention residuals (AttnRes, ../shared/design/K3.md §3).
//!
//! AttnRes replaces `h + f(h)`: each token carries `P`, the partial sum of
//! the current block, and a bank of snapshots taken at block boundaries.
//! Before attention, before the MLP and at the output, the layer input is a
//! softmax mix over `bank + [P]`, scored by `RMS(V_j) . (gamma * w)` and
//! summing the raw `V_j`. Nothing is mixed across positions, so the bank
//! lives only while one token runs through the layers: it is rebuilt from
//! the token's embedding every time and no later token ever reads it.

use crate::config::layout::{AttnResTensors, Tensor};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::source::TensorSource;

use super::load_vector;
use super::ops::dot;

/// One depth mix: `*_res_proj.weight` `[1, H]` read as a vector, times the
/// weight of the matching `*_res_norm` `[H]` (the norm is never applied as
/// a module, only its weight enters the score).
pub struct Mix {
    query: Vec<f32>, // [H] gamma * w
    eps: f32,
}

impl Mix {
    pub fn load(cfg: &ModelConfig, src: &dyn TensorSource, proj: &str, norm: &str) -> Result<Mix> {
        let w = load_vector(cfg, src, proj)?;
        let gamma = load_vector(cfg, src, norm)?;
        if w.len() != cfg.hidden_size || gamma.len() != cfg.hidden_size {
            return Err(Error::Runtime(format!(
                "`{proj}` / `{norm}` have lengths {} / {}, the hidden size is {}",
                w.len(),
                gamma.len(),
                cfg.hidden_size
            )));
        }
        Ok(Mix { query: w.iter().zip(&gamma).map(|(a, b)| a * b).collect(), eps: cfg.rms_norm_eps })
    }

    /// `out = sum_j softmax_j(s) V_j` over the bank entries, oldest first,
    /// then `p`.
    pub fn apply(&self, bank: &Bank, p: &[f32], out: &mut [f32]) {
        let h = p.len();
        let n = bank.n + 1;
        let cand = |j: usize| {
            if j < bank.n {
                &bank.entries[j * h..(j + 1) * h]
            } else {
                p
            }
        };
        let mut scores = [0.0f32; MAX_BANK + 1];
        for (j, s) in scores[..n].iter_mut().enumerate() {
            let v = cand(j);
            let ms = v.iter().map(|x| x * x).sum::<f32>() / h as f32;
            *s = dot(v, &self.query) / (ms + self.eps).sqrt();
        }
        let max = scores[..n].iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f32;
        for s in scores[..n].iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        out.fill(0.0);
        for (j, &s) in scores[..n].iter().enumerate() {
            let a = s / sum;
            for (o, &v) in out.iter_mut().zip(cand(j)) {
                *o += a * v;
            }
        }
    }
}

/// The most snapshots a bank holds: one per block boundary. The real model
/// (93 layers, block 12) needs 8.
pub const MAX_BANK: usize = 64;

/// The block snapshots of the token being computed, `[n, H]`.
pub struct Bank {
    entries: Vec<f32>,
    n: usize,
}

impl Bank {
    pub fn new(cfg: &ModelConfig) -> Bank {
        let n = bank_capacity(cfg);
        Bank { entries: vec![0.0; n * cfg.hidden_size], n: 0 }
    }

    pub fn clear(&mut self) {
        self.n = 0;
    }

    /// Floats held, for the memory plan (`plan::scratch_bytes`).
    pub fn floats(&self) -> usize {
        self.entries.len()
    }

    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    fn push(&mut self, p: &[f32]) {
        let h = p.len();
        self.entries[self.n * h..(self.n + 1) * h].copy_from_slice(p);
        self.n += 1;
    }
}

/// Snapshots a model takes per token: the boundaries `i % B == 0`.
pub fn bank_capacity(cfg: &ModelConfig) -> usize {
    match cfg.k3.and_then(|k| k.attn_res_block) {
        Some(b) => cfg.num_layers.div_ceil(b),
        None => 0,
    }
}

/// The two mixes of decoder layer `layer`.
pub struct LayerRes {
    boundary: bool,
    attn: Mix,
    mlp: Mix,
}

impl LayerRes {
    pub fn load(
        cfg: &ModelConfig,
        src: &dyn TensorSource,
        layer: usize,
        block: usize,
        t: &AttnResTensors,
    ) -> Result<LayerRes> {
        Ok(LayerRes {
            boundary: layer.is_multiple_of(block),
            attn: Mix::load(cfg, src, &t.self_attention_res_proj.name, &t.self_attention_res_norm.name)?,
            mlp: Mix::load(cfg, src, &t.mlp_res_proj.name, &t.mlp_res_norm.name)?,
        })
    }

    /// The attention input of this layer into `out` (`P` itself while the
    /// bank is empty: layer 0); at a boundary `P` is banked and reset to
    /// zero, so the attention output added to it becomes the new `P`.
    pub fn before_attention(&self, bank: &mut Bank, p: &mut [f32], out: &mut [f32]) {
        if bank.is_empty() {
            out.copy_from_slice(p);
        } else {
            self.attn.apply(bank, p, out);
        }
        if self.boundary {
            bank.push(p);
            p.fill(0.0);
        }
    }

    pub fn before_mlp(&self, bank: &Bank, p: &[f32], out: &mut [f32]) {
        self.mlp.apply(bank, p, out);
    }
}

/// The AttnRes mixes of decoder layer `layer` (`t`: its tensors, when
/// the model has AttnRes).
pub fn load_layer_res(
    cfg: &ModelConfig,
    src: &dyn TensorSource,
    layer: usize,
    t: Option<&AttnResTensors>,
) -> Result<Option<LayerRes>> {
    let (Some(block), Some(t)) = (cfg.k3.and_then(|k| k.attn_res_block), t) else { return Ok(None) };
    if bank_capacity(cfg) > MAX_BANK {
        return Err(Error::Unsupported(format!(
            "attn_res_block_size {:?} gives more than {MAX_BANK} AttnRes blocks",
            Some(block)
        )));
    }
    Ok(Some(LayerRes::load(cfg, src, layer, block, t)?))
}

/// The output mix before the final norm (`t`: its projection and norm,
/// when the model has AttnRes).
pub fn load_output_mix(cfg: &ModelConfig, src: &dyn TensorSource, t: Option<&(Tensor, Tensor)>) -> Result<Option<Mix>> {
    match t {
        Some((proj, norm)) => Ok(Some(Mix::load(cfg, src, &proj.name, &norm.name)?)),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mix against a direct f64 evaluation of K3.md §3, including the
    /// use of the raw (un-normalised) candidates in the sum.
    #[test]
    fn mix_matches_the_formula() {
        let h = 8;
        let query: Vec<f32> = (0..h).map(|i| (i as f32 - 3.0) * 0.3).collect();
        let m = Mix { query: query.clone(), eps: 1e-5 };
        let mut bank = Bank { entries: vec![0.0; 2 * h], n: 0 };
        let a: Vec<f32> = (0..h).map(|i| (i as f32).sin() * 3.0).collect();
        let b: Vec<f32> = (0..h).map(|i| (i as f32 * 0.7).cos() * 0.2).collect();
        let p: Vec<f32> = (0..h).map(|i| i as f32 * 0.1 - 0.4).collect();
        bank.push(&a);
        bank.push(&b);
        let mut out = vec![0.0; h];
        m.apply(&bank, &p, &mut out);
        let cands = [&a, &b, &p];
        let s: Vec<f64> = cands
            .iter()
            .map(|v| {
                let ms = v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / h as f64;
                v.iter().zip(&query).map(|(&x, &q)| x as f64 * q as f64).sum::<f64>() / (ms + 1e-5).sqrt()
            })
            .collect();
        let z: f64 = s.iter().map(|x| x.exp()).sum();
        for d in 0..h {
            let want: f64 = cands.iter().zip(&s).map(|(v, sj)| sj.exp() / z * v[d] as f64).sum();
            assert!((out[d] as f64 - want).abs() < 1e-5, "{d}: {} vs {want}", out[d]);
        }
    }

    /// Every expert format runs SiTU through `expert_forward_act`; with
    /// SiLU it is bit-identical to `expert_forward` (the path every other
    /// model takes). SiTU is checked against the decoded weights in f64.
    #[test]
    fn expert_kernels_take_the_activation_and_keep_silu_bit_identical() {
        use crate::config::Activation;
        use crate::quant::{self, ExpertF32, ExpertFormat, ExpertScratch, ExpertShape};
        let (h, i) = (64, 32);
        let shape = ExpertShape::new(h, i);
        let mk = |seed: u64, n: usize| -> Vec<f32> {
            (0..n as u64)
                .map(|k| ((k.wrapping_mul(2654435761) ^ seed.wrapping_mul(97)) % 1000) as f32 / 500.0 - 1.0)
                .collect()
        };
        let (gate, up, down) = (mk(1, i * h), mk(2, i * h), mk(3, h * i));
        let e = ExpertF32 { gate: &gate, up: &up, down: &down, biases: None };
        let x = mk(4, h);
        let situ = Activation::Situ { beta: 2.0, linear_beta: Some(3.0) };
        for fmt in ExpertFormat::ALL {
            let cb = if fmt.uses_codebooks() { quant::fit_layer_codebooks(fmt, shape, &[e], 7) } else { None };
            let payload = quant::encode_expert(fmt, shape, &e, cb.as_ref());
            let tables = quant::build_gate_up_tables(fmt, cb.as_ref(), &x);
            let mut s = ExpertScratch::new(fmt, shape);
            let (mut a, mut b, mut c) = (vec![0.0; h], vec![0.0; h], vec![0.0; h]);
            quant::expert_forward(fmt, shape, &payload, cb.as_ref(), &tables, &x, &mut a, &mut s);
            quant::expert_forward_act(fmt, shape, &payload, cb.as_ref(), &tables, &x, &mut b, &mut s, Activation::Silu);
            assert!(a == b, "{}: SiLU through expert_forward_act is not bit-identical", fmt.name());
            quant::expert_forward_act(fmt, shape, &payload, cb.as_ref(), &tables, &x, &mut c, &mut s, situ);
            let (g, u, d) = quant::decode_expert(fmt, shape, &payload, cb.as_ref());
            let act: Vec<f64> = (0..i)
                .map(|r| {
                    let gv: f64 = (0..h).map(|k| g[r * h + k] as f64 * x[k] as f64).sum();
                    let uv: f64 = (0..h).map(|k| u[r * h + k] as f64 * x[k] as f64).sum();
                    2.0 * (gv / 2.0).tanh() / (1.0 + (-gv).exp()) * 3.0 * (uv / 3.0).tanh()
                })
                .collect();
            let want: Vec<f64> = (0..h).map(|r| (0..i).map(|k| d[r * i + k] as f64 * act[k]).sum()).collect();
            let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let err = |y: &[f32]| y.iter().zip(&want).fold(0.0f64, |m, (p, q)| m.max((*p as f64 - q).abs())) / scale;
            // The table formats quantise x on the fly, hence their looser bound;
            // SiLU's output (a) is a different function, an order away.
            let bound = if fmt == ExpertFormat::F32 { 1e-5 } else { 0.05 };
            assert!(
                err(&c) < bound && err(&a) > 10.0 * err(&c),
                "{}: SiTU err {} (SiLU {})",
                fmt.name(),
                err(&c),
                err(&a)
            );
        }
    }

    #[test]
    fn boundary_banks_p_and_restarts_the_block() {
        let h = 4;
        let m = || Mix { query: vec![0.5; h], eps: 1e-5 };
        let res = LayerRes { boundary: true, attn: m(), mlp: m() };
        let mut bank = Bank { entries: vec![0.0; 2 * h], n: 0 };
        let mut p = vec![1.0, 2.0, 3.0, 4.0];
        let mut out = vec![0.0; h];
        res.before_attention(&mut bank, &mut p, &mut out);
        assert_eq!(out, [1.0, 2.0, 3.0, 4.0]);
        assert_eq!(bank.len(), 1);
        assert_eq!(p, [0.0; 4]);
    }
}
