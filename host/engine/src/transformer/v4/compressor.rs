//! DeepSeek-V4's compressors and lightning indexer
//! (`DeepseekV4HCACompressor`, `DeepseekV4CSACompressor`,
//! `DeepseekV4Indexer`).
//!
//! Every `rate` source tokens close a window and emit one entry:
//! per channel, the softmax over the window's slots of `gate + bias` weighs
//! the slots' `kv`; the sum is RMS-normed and rotated to the window's first
//! position. HCA has one series (`rate` slots). CSA and its indexer
//! project two series per token, `[Ca | Cb]`: entry w pools window w's Cb
//! with window w-1's Ca (`2 * rate` slots, the Ca slots of window 0 weigh
//! nothing), so a closed window's Ca is kept for the next.
//!
//! Entry w is visible to the token at position t iff `w < (t + 1) / rate`,
//! which holds exactly for the entries emitted by the time t is processed.

use crate::config::layout::{CompressorTensors, V4IndexerTensors};
use crate::config::{ModelConfig, V4Params};
use crate::error::{Error, Result};
use crate::quant::QMatrix;
use crate::source::TensorSource;

use rayon::prelude::*;
use waste_kernels::quant::dot_f32;

use super::super::dsa::SCORE_BLOCK;
use super::super::ops::rms_norm_in_place;
use super::super::{load_matrix, load_norm, load_vector};
use super::V4Rope;

/// `self_attn.compressor` or `self_attn.compressor.indexer`'s own.
pub struct Compressor {
    kv_proj: QMatrix,        // [series * width, H]
    gate_proj: QMatrix,      // [series * width, H]
    position_bias: Vec<f32>, // [rate, series * width]
    kv_norm: Vec<f32>,       // [width]
    width: usize,
    rate: usize,
    /// CSA's two overlapping series.
    overlap: bool,
    eps: f32,
}

/// A compressor's slice of `V4State::open`: the open window's projected
/// kv and biased gate `[rate, series * width]`, and with overlapping
/// series the previous window's Ca `[rate, width]` (kv, gate).
pub struct OpenWindow<'a> {
    kv: &'a mut [f32],
    gate: &'a mut [f32],
    prev_kv: &'a mut [f32],
    prev_gate: &'a mut [f32],
}

impl Compressor {
    pub fn load(
        cfg: &ModelConfig,
        src: &dyn TensorSource,
        t: &CompressorTensors,
        width: usize,
        rate: usize,
        overlap: bool,
    ) -> Result<Compressor> {
        let position_bias = load_vector(cfg, src, &t.position_bias.name)?;
        let series = if overlap { 2 } else { 1 };
        if position_bias.len() != rate * series * width {
            return Err(Error::Runtime(format!(
                "weight `{}` has {} values, the config implies {rate} x {}",
                t.position_bias.name,
                position_bias.len(),
                series * width
            )));
        }
        Ok(Compressor {
            kv_proj: load_matrix(cfg, src, &t.kv_proj.name)?,
            gate_proj: load_matrix(cfg, src, &t.gate_proj.name)?,
            position_bias,
            kv_norm: load_norm(cfg, src, &t.kv_norm.name)?,
            width,
            rate,
            overlap,
            eps: cfg.rms_norm_eps,
        })
    }

    pub fn rate(&self) -> usize {
        self.rate
    }

    pub fn width(&self) -> usize {
        self.width
    }

    /// Floats of this compressor's open window in `V4State::open`.
    pub fn open_floats(&self) -> usize {
        let series = if self.overlap { 2 } else { 1 };
        2 * self.rate * series * self.width + if self.overlap { 2 * self.rate * self.width } else { 0 }
    }

    /// Splits `open` (exactly `open_floats` long) into its parts.
    pub fn window<'a>(&self, open: &'a mut [f32]) -> OpenWindow<'a> {
        let series = if self.overlap { 2 } else { 1 };
        let n = self.rate * series * self.width;
        let (kv, rest) = open.split_at_mut(n);
        let (gate, rest) = rest.split_at_mut(n);
        let (prev_kv, prev_gate) = rest.split_at_mut(rest.len() / 2);
        OpenWindow { kv, gate, prev_kv, prev_gate }
    }

    /// Adds the token at `pos` (attention input `x`); when it closes its
    /// window, writes the window's entry into `entry` (`[width]`) and
    /// returns true.
    pub fn push(&self, x: &[f32], pos: usize, w: OpenWindow<'_>, rope: &V4Rope, entry: &mut [f32]) -> bool {
        let (rate, width) = (self.rate, self.width);
        let sw = if self.overlap { 2 * width } else { width };
        let j = pos % rate;
        self.kv_proj.matvec(x, &mut w.kv[j * sw..(j + 1) * sw]);
        self.gate_proj.matvec(x, &mut w.gate[j * sw..(j + 1) * sw]);
        for (g, &b) in w.gate[j * sw..(j + 1) * sw].iter_mut().zip(&self.position_bias[j * sw..(j + 1) * sw]) {
            *g += b;
        }
        if j + 1 < rate {
            return false;
        }
        let first_window = pos < rate;
        // Cb (the current window's series) sits at `[width..]` of each slot
        // when the series overlap; the Ca slots of window 0 are -inf gates.
        let cur = if self.overlap { width } else { 0 };
        for (c, e) in entry.iter_mut().enumerate() {
            let mut max = f32::NEG_INFINITY;
            if self.overlap && !first_window {
                for i in 0..rate {
                    max = max.max(w.prev_gate[i * width + c]);
                }
            }
            for i in 0..rate {
                max = max.max(w.gate[i * sw + cur + c]);
            }
            let (mut num, mut den) = (0.0f32, 0.0f32);
            if self.overlap && !first_window {
                for i in 0..rate {
                    let p = (w.prev_gate[i * width + c] - max).exp();
                    den += p;
                    num += p * w.prev_kv[i * width + c];
                }
            }
            for i in 0..rate {
                let p = (w.gate[i * sw + cur + c] - max).exp();
                den += p;
                num += p * w.kv[i * sw + cur + c];
            }
            *e = num / den;
        }
        rms_norm_in_place(entry, &self.kv_norm, self.eps);
        rope.rotate(entry, pos + 1 - rate, false);
        if self.overlap {
            for i in 0..rate {
                w.prev_kv[i * width..(i + 1) * width].copy_from_slice(&w.kv[i * sw..i * sw + width]);
                w.prev_gate[i * width..(i + 1) * width].copy_from_slice(&w.gate[i * sw..i * sw + width]);
            }
        }
        true
    }
}

/// `self_attn.compressor.indexer`: its compressor at `index_head_dim` and
/// the scorer `sum_h w_h relu(q_h . K_s) / sqrt(index_head_dim)`.
pub struct Indexer {
    pub compressor: Compressor,
    q_b_proj: QMatrix,     // [n_heads * head_dim, q_lora]
    weights_proj: QMatrix, // [n_heads, H], f32
    n_heads: usize,
    head_dim: usize,
    topk: usize,
}

/// An indexer's per-call buffers.
pub struct IndexerScratch {
    q: Vec<f32>,       // [n_heads * head_dim]
    weights: Vec<f32>, // [n_heads]
    scores: Vec<f32>,  // [entries]
    order: Vec<u32>,   // [entries]
}

impl IndexerScratch {
    pub fn new(v4: Option<&V4Params>, max_entries: usize) -> IndexerScratch {
        match v4 {
            Some(v) if v.layers.contains(&crate::config::V4Attn::Csa) => IndexerScratch {
                q: vec![0.0; v.index_heads * v.index_head_dim],
                weights: vec![0.0; v.index_heads],
                scores: vec![0.0; max_entries],
                order: vec![0; max_entries],
            },
            _ => IndexerScratch { q: vec![], weights: vec![], scores: vec![], order: vec![] },
        }
    }

    /// Floats held (a u32 counts as one), for the memory plan.
    pub fn floats(&self) -> usize {
        self.q.len() + self.weights.len() + self.scores.len() + self.order.len()
    }
}

impl Indexer {
    pub fn load(cfg: &ModelConfig, v4: &V4Params, src: &dyn TensorSource, t: &V4IndexerTensors) -> Result<Indexer> {
        Ok(Indexer {
            compressor: Compressor::load(cfg, src, &t.compressor, v4.index_head_dim, v4.csa_rate, true)?,
            q_b_proj: load_matrix(cfg, src, &t.q_b_proj.name)?,
            weights_proj: load_matrix(cfg, src, &t.weights_proj.name)?,
            n_heads: v4.index_heads,
            head_dim: v4.index_head_dim,
            topk: v4.index_topk,
        })
    }

    /// The entries (of the `keys(s)` for `s < n`) the token at `pos`
    /// attends, into `picks` in ascending order: the `index_topk` best
    /// scores, ties to the earlier entry (fixtures keep a 1e-4 gap at the
    /// boundary, where torch's order of exact ties is its partial sort's).
    #[allow(clippy::too_many_arguments)]
    pub fn select<'k>(
        &self,
        x: &[f32],
        q_resid: &[f32],
        pos: usize,
        n: usize,
        keys: impl Fn(usize) -> &'k [f32] + Sync,
        rope: &V4Rope,
        s: &mut IndexerScratch,
        picks: &mut Vec<usize>,
    ) {
        let (nh, d) = (self.n_heads, self.head_dim);
        self.q_b_proj.matvec(q_resid, &mut s.q);
        for head in s.q.chunks_exact_mut(d) {
            rope.rotate(head, pos, false);
        }
        self.weights_proj.matvec(x, &mut s.weights);
        let weights_scaling = (nh as f32).powf(-0.5);
        s.weights.iter_mut().for_each(|w| *w *= weights_scaling);
        let softmax_scale = (d as f32).powf(-0.5);
        let (q, weights) = (&s.q, &s.weights);
        // `relu(q . k) * softmax_scale * weight`, summed over heads. Each
        // entry's score depends on nothing else: blocks of entries run in
        // parallel and give the same bits at any thread count.
        s.scores[..n].par_chunks_mut(SCORE_BLOCK).enumerate().for_each(|(b, block)| {
            for (i, score) in block.iter_mut().enumerate() {
                let k = keys(b * SCORE_BLOCK + i);
                *score =
                    q.chunks_exact(d).zip(weights).map(|(qh, &w)| (dot_f32(qh, k).max(0.0) * softmax_scale) * w).sum();
            }
        });
        let k = self.topk.min(n);
        picks.clear();
        if k == 0 {
            return;
        }
        let scores = &s.scores[..n];
        let order = &mut s.order[..n];
        for (i, o) in order.iter_mut().enumerate() {
            *o = i as u32;
        }
        let better = |a: &u32, b: &u32| scores[*b as usize].total_cmp(&scores[*a as usize]).then(a.cmp(b));
        if k < n {
            order.select_nth_unstable_by(k - 1, better);
        }
        picks.extend(order[..k].iter().map(|&i| i as usize));
        picks.sort_unstable();
    }
}
