//! DeepSeek-V4's attention (`DeepseekV4Attention`): shared-KV multi-query
//! attention over the sliding window, plus the layer's compressed entries
//! (all of them on HCA layers, the indexer's top `index_topk` on CSA).
//!
//! Per token at `pos`, with `x` the normed block input:
//! `q_resid = q_a_norm(q_a_proj x)`, `q = rms(q_b_proj q_resid)` per head
//! (unweighted), `kv = kv_norm(kv_proj x)`, both rotated on their trailing
//! `qk_rope_head_dim` channels; keys and values are the same rows. The
//! softmax over `q . k / sqrt(head_dim)` includes a learned sink per head,
//! the output's rope channels are rotated back by `pos` ("so the
//! contribution of each KV entry stays a function of the relative
//! distance"), and the heads go through the grouped output projection:
//! `o_b_proj(concat_g o_a_proj[g] heads_g)`.

use crate::config::layout::V4AttnTensors;
use crate::config::{ModelConfig, V4Attn, V4Params};
use crate::error::{Error, Result};
use crate::quant::QMatrix;
use crate::source::TensorSource;

use rayon::prelude::*;
use waste_kernels::quant::dot_f32;

use super::super::ops::rms_norm_in_place;
use super::super::{load_matrix, load_norm, load_vector};
use super::compressor::{Compressor, Indexer, IndexerScratch};
use super::{V4Rope, V4State};

/// `model.layers.L.self_attn`.
pub struct V4Attention {
    q_a_proj: QMatrix,  // [q_lora, H]
    q_a_norm: Vec<f32>, // [q_lora]
    q_b_proj: QMatrix,  // [n_heads * head_dim, q_lora]
    kv_proj: QMatrix,   // [head_dim, H]
    kv_norm: Vec<f32>,  // [head_dim]
    o_a_proj: QMatrix,  // [o_groups * o_lora_rank, n_heads * head_dim / o_groups]
    o_b_proj: QMatrix,  // [H, o_groups * o_lora_rank]
    sinks: Vec<f32>,    // [n_heads]
    compressor: Option<Compressor>,
    indexer: Option<Indexer>,
    /// `main` on sliding-only layers, `compress` on the others (their
    /// compressors and indexer use it too).
    rope: V4Rope,
    kind: V4Attn,
    n_heads: usize,
    head_dim: usize,
    window: usize,
    o_groups: usize,
    o_lora_rank: usize,
    eps: f32,
}

/// Per-call buffers of the V4 attention: one token's projections (decode)
/// and the heads' buffers every token uses.
pub struct V4Scratch {
    q_resid: Vec<f32>, // [q_lora]
    q: Vec<f32>,       // [n_heads * head_dim]
    mid: Vec<f32>,     // [o_groups * o_lora_rank]
    heads: HeadScratch,
}

/// The buffers of one token's attention over its keys.
struct HeadScratch {
    out: Vec<f32>, // [n_heads * head_dim]
    /// Each head's softmax over its keys, `[n_heads, max_keys]`.
    scores: Vec<f32>,
    max_keys: usize,
    /// The compressed entries attended (CSA: the indexer's picks), ascending.
    picks: Vec<usize>,
    index: IndexerScratch,
}

impl V4Scratch {
    pub fn new(cfg: &ModelConfig, context: usize) -> V4Scratch {
        let Some(v) = &cfg.add.v4 else {
            return V4Scratch {
                q_resid: vec![],
                q: vec![],
                mid: vec![],
                heads: HeadScratch {
                    out: vec![],
                    scores: vec![],
                    max_keys: 0,
                    picks: vec![],
                    index: IndexerScratch::new(None, 0),
                },
            };
        };
        let q = cfg.num_heads * v.head_dim;
        // A CSA layer attends at most index_topk entries, an HCA layer all of its.
        let attended = (v.index_topk.min(context / v.csa_rate)).max(context / v.hca_rate);
        let max_keys = v.sliding_window + attended;
        V4Scratch {
            q_resid: vec![0.0; v.q_lora_rank],
            q: vec![0.0; q],
            mid: vec![0.0; v.o_groups * v.o_lora_rank],
            heads: HeadScratch {
                out: vec![0.0; q],
                scores: vec![0.0; cfg.num_heads * max_keys],
                max_keys,
                picks: Vec::with_capacity(attended),
                index: IndexerScratch::new(Some(v), context / v.csa_rate),
            },
        }
    }

    pub fn floats(&self) -> usize {
        let h = &self.heads;
        [&self.q_resid, &self.q, &h.out, &self.mid, &h.scores].iter().map(|b| b.len()).sum::<usize>()
            + h.picks.capacity() * std::mem::size_of::<usize>() / 4
            + h.index.floats()
    }
}

/// A V4 layer's projections over a prefill chunk's tokens, `[n, width]`
/// each: every token's query, its K=V row before its norm and rotation,
/// and its grouped output projection's input to `o_b_proj`.
pub struct V4Rows {
    q_resid: Vec<f32>, // [n, q_lora]
    q: Vec<f32>,       // [n, n_heads * head_dim]
    kv: Vec<f32>,      // [n, head_dim]
    mid: Vec<f32>,     // [n, o_groups * o_lora_rank]
}

impl V4Rows {
    /// Room for `n` tokens; empty for a model without V4 layers.
    pub fn new(cfg: &ModelConfig, n: usize) -> V4Rows {
        let Some(v) = &cfg.add.v4 else {
            return V4Rows { q_resid: vec![], q: vec![], kv: vec![], mid: vec![] };
        };
        V4Rows {
            q_resid: vec![0.0; n * v.q_lora_rank],
            q: vec![0.0; n * cfg.num_heads * v.head_dim],
            kv: vec![0.0; n * v.head_dim],
            mid: vec![0.0; n * v.o_groups * v.o_lora_rank],
        }
    }

    /// Floats held, for the memory plan.
    pub fn floats(&self) -> usize {
        [&self.q_resid, &self.q, &self.kv, &self.mid].iter().map(|b| b.len()).sum()
    }
}

impl V4Attention {
    pub fn load(
        cfg: &ModelConfig,
        v4: &V4Params,
        src: &dyn TensorSource,
        layer: usize,
        t: &V4AttnTensors,
    ) -> Result<V4Attention> {
        let kind = v4.layers[layer];
        let rope = V4Rope::new(if kind == V4Attn::Sliding { &v4.main_rope } else { &v4.compress_rope });
        let sinks = load_vector(cfg, src, &t.sinks.name)?;
        if sinks.len() != cfg.num_heads {
            return Err(Error::Runtime(format!(
                "weight `{}` has {} values for {} heads",
                t.sinks.name,
                sinks.len(),
                cfg.num_heads
            )));
        }
        let d = v4.head_dim;
        let compressor = match (kind, &t.compressor) {
            (V4Attn::Csa, Some(c)) => Some(Compressor::load(cfg, src, c, d, v4.csa_rate, true)?),
            (V4Attn::Hca, Some(c)) => Some(Compressor::load(cfg, src, c, d, v4.hca_rate, false)?),
            _ => None,
        };
        let indexer = match &t.indexer {
            Some(ix) => Some(Indexer::load(cfg, v4, src, ix)?),
            None => None,
        };
        Ok(V4Attention {
            q_a_proj: load_matrix(cfg, src, &t.q_a_proj.name)?,
            q_a_norm: load_norm(cfg, src, &t.q_a_norm.name)?,
            q_b_proj: load_matrix(cfg, src, &t.q_b_proj.name)?,
            kv_proj: load_matrix(cfg, src, &t.kv_proj.name)?,
            kv_norm: load_norm(cfg, src, &t.kv_norm.name)?,
            o_a_proj: load_matrix(cfg, src, &t.o_a_proj.name)?,
            o_b_proj: load_matrix(cfg, src, &t.o_b_proj.name)?,
            sinks,
            compressor,
            indexer,
            rope,
            kind,
            n_heads: cfg.num_heads,
            head_dim: d,
            window: v4.sliding_window,
            o_groups: v4.o_groups,
            o_lora_rank: v4.o_lora_rank,
            eps: cfg.rms_norm_eps,
        })
    }

    /// The attention output of the token at `pos` (block input `x`) into
    /// `y`, appending it to `st`.
    pub fn forward(&self, x: &[f32], pos: usize, st: &mut V4State, s: &mut V4Scratch, y: &mut [f32]) -> Result<()> {
        let d = self.head_dim;
        self.q_a_proj.matvec(x, &mut s.q_resid);
        rms_norm_in_place(&mut s.q_resid, &self.q_a_norm, self.eps);
        self.q_b_proj.matvec(&s.q_resid, &mut s.q);
        let row = pos % self.window;
        self.kv_proj.matvec(x, &mut st.window[row * d..(row + 1) * d]);
        self.attend_token(x, pos, st, &s.q_resid, &mut s.q, &mut s.heads, &mut s.mid)?;
        self.o_b_proj.matvec(&s.mid, y);
        Ok(())
    }

    /// `forward` for the `n` tokens of `xs` (`[n, H]`) at positions
    /// `start..start + n`, outputs into `ys` (`[n, H]`): the projections of
    /// every token at once (`matvec_many`: each token's bits as `forward`
    /// gives them), then each token's attention in order, as it updates
    /// the window and the compressors.
    pub fn forward_chunk(
        &self,
        xs: &[f32],
        start: usize,
        st: &mut V4State,
        s: &mut V4Scratch,
        rows: &mut V4Rows,
        ys: &mut [f32],
    ) -> Result<()> {
        let d = self.head_dim;
        let h = self.q_a_proj.cols();
        let n = xs.len() / h.max(1);
        let (ql, qd, md) = (self.q_a_proj.rows(), self.n_heads * d, self.o_groups * self.o_lora_rank);
        let (Some(q_resid), Some(q), Some(kv), Some(mid)) = (
            rows.q_resid.get_mut(..n * ql),
            rows.q.get_mut(..n * qd),
            rows.kv.get_mut(..n * d),
            rows.mid.get_mut(..n * md),
        ) else {
            return Err(Error::Runtime(format!("a V4 chunk of {n} tokens exceeds its buffers")));
        };
        self.q_a_proj.matvec_many(xs, q_resid);
        for r in q_resid.chunks_exact_mut(ql) {
            rms_norm_in_place(r, &self.q_a_norm, self.eps);
        }
        self.q_b_proj.matvec_many(q_resid, q);
        self.kv_proj.matvec_many(xs, kv);
        for i in 0..n {
            let pos = start + i;
            let row = pos % self.window;
            st.window[row * d..(row + 1) * d].copy_from_slice(&kv[i * d..(i + 1) * d]);
            let (x, qr) = (&xs[i * h..(i + 1) * h], &q_resid[i * ql..(i + 1) * ql]);
            self.attend_token(
                x,
                pos,
                st,
                qr,
                &mut q[i * qd..(i + 1) * qd],
                &mut s.heads,
                &mut mid[i * md..(i + 1) * md],
            )?;
        }
        self.o_b_proj.matvec_many(mid, ys);
        Ok(())
    }

    /// One token's attention, from its projections to the input of
    /// `o_b_proj` (`mid`): its query `q` normed and rotated per head, its
    /// K=V row (the raw projection, already in the window's row for `pos`)
    /// normed and rotated, the compressors fed, then every head over the
    /// window and the attended entries, and the grouped `o_a_proj`.
    #[allow(clippy::too_many_arguments)]
    fn attend_token(
        &self,
        x: &[f32],
        pos: usize,
        st: &mut V4State,
        q_resid: &[f32],
        q: &mut [f32],
        s: &mut HeadScratch,
        mid: &mut [f32],
    ) -> Result<()> {
        let d = self.head_dim;
        for head in q.chunks_exact_mut(d) {
            // `DeepseekV4UnweightedRMSNorm` per head.
            let ms = head.iter().map(|v| v * v).sum::<f32>() / d as f32;
            let inv = 1.0 / (ms + self.eps).sqrt();
            head.iter_mut().for_each(|v| *v *= inv);
            self.rope.rotate(head, pos, false);
        }
        let row = pos % self.window;
        {
            let kv = &mut st.window[row * d..(row + 1) * d];
            rms_norm_in_place(kv, &self.kv_norm, self.eps);
            self.rope.rotate(kv, pos, false);
        }

        // The compressors, then the entries this token may attend.
        let n_entries = self.push_compressors(x, pos, st)?;
        s.picks.clear();
        if let Some(ix) = &self.indexer {
            let ef = self.entry_floats();
            let entries = &st.entries;
            ix.select(
                x,
                q_resid,
                pos,
                n_entries,
                |t| &entries[t * ef + d..(t + 1) * ef],
                &self.rope,
                &mut s.index,
                &mut s.picks,
            );
        } else if self.kind == V4Attn::Hca {
            s.picks.extend(0..n_entries);
        }

        // Keys: the window's rows (positions pos+1-W..=pos), then the picked
        // entries; K = V.
        let first = (pos + 1).saturating_sub(self.window);
        let n_window = pos + 1 - first;
        let ef = self.entry_floats().max(1);
        let (window, entries, picks) = (&st.window, &st.entries, &s.picks);
        let key = |i: usize| -> &[f32] {
            if i < n_window {
                let r = (first + i) % self.window;
                &window[r * d..(r + 1) * d]
            } else {
                let t = picks[i - n_window];
                &entries[t * ef..t * ef + d]
            }
        };
        let n_keys = n_window + picks.len();
        if n_keys > s.max_keys {
            return Err(Error::Runtime(format!("{n_keys} keys exceed the scratch's {}", s.max_keys)));
        }
        let scale = (d as f32).powf(-0.5);
        // Heads are independent: in parallel, the same bits at any thread count.
        q.par_chunks_exact(d)
            .zip(s.out.par_chunks_exact_mut(d))
            .zip(s.scores.par_chunks_exact_mut(s.max_keys))
            .zip(self.sinks.par_iter())
            .for_each(|(((q, out), scores), &sink)| {
                let scores = &mut scores[..n_keys];
                let mut max = sink;
                for (i, sc) in scores.iter_mut().enumerate() {
                    *sc = dot_f32(q, key(i)) * scale;
                    max = max.max(*sc);
                }
                // The sink joins the softmax's denominator only.
                let mut den = (sink - max).exp();
                for sc in scores.iter_mut() {
                    *sc = (*sc - max).exp();
                    den += *sc;
                }
                out.fill(0.0);
                for (i, &p) in scores.iter().enumerate() {
                    let w = p / den;
                    for (o, &k) in out.iter_mut().zip(key(i)) {
                        *o += w * k;
                    }
                }
                self.rope.rotate(out, pos, true);
            });
        let group = self.n_heads * d / self.o_groups;
        let r = self.o_lora_rank;
        for (g, input) in s.out.chunks_exact(group).enumerate() {
            self.o_a_proj.matvec_rows(g * r, input, &mut mid[g * r..(g + 1) * r]);
        }
        Ok(())
    }

    /// Floats of one entry row: the main entry, and the indexer's.
    fn entry_floats(&self) -> usize {
        self.head_dim + self.indexer.as_ref().map_or(0, |_| self.indexer_width())
    }

    fn indexer_width(&self) -> usize {
        self.indexer.as_ref().map_or(0, |ix| ix.compressor.width())
    }

    /// Feeds `x` to the compressors; returns how many entries exist now.
    fn push_compressors(&self, x: &[f32], pos: usize, st: &mut V4State) -> Result<usize> {
        let Some(c) = &self.compressor else { return Ok(0) };
        let rate = c.rate();
        let (ef, d) = (self.entry_floats(), self.head_dim);
        let (main_open, index_open) = st.open.split_at_mut(c.open_floats());
        // A token that does not close its window writes no entry.
        let closes = (pos + 1).is_multiple_of(rate);
        let w = pos / rate;
        let row: &mut [f32] = match closes {
            true => st
                .entries
                .get_mut(w * ef..(w + 1) * ef)
                .ok_or_else(|| Error::Runtime(format!("compressed entry {w} is past the state's capacity")))?,
            false => &mut [],
        };
        let (main, index) = row.split_at_mut(if closes { d } else { 0 });
        c.push(x, pos, c.window(main_open), &self.rope, main);
        if let Some(ix) = &self.indexer {
            ix.compressor.push(x, pos, ix.compressor.window(index_open), &self.rope, index);
        }
        Ok((pos + 1) / rate)
    }
}
