//! DeepSeek Sparse Attention's lightning indexer (`DeepseekV32Indexer`,
//! `GlmMoeDsaIndexer`, transformers 5.24): for the token at `pos` it scores
//! every position `t <= pos` as
//!
//! `index[t] = sum_h w_h * relu(q_h . k_t / sqrt(head_dim))`, with
//! `q = wq_b(q_resid)` `[n_heads, head_dim]` from MLA's normed q-LoRA latent,
//! `k_t = LayerNorm(wk x_t)` `[head_dim]` (cached per token after the MLA
//! row), RoPE on the first `qk_rope_head_dim` dims of both, and
//! `w = weights_proj(x) / sqrt(n_heads)`,
//!
//! and MLA then attends only to the `index_topk` best. With `pos + 1 <=
//! index_topk` every position is selected, which is plain MLA.
//!
//! The reference omits DeepSeek's Hadamard rotation and fp8 scoring ("since
//! the Hadamard transform is orthogonal ... we skip both"); so do we.
//! Ties: torch's CPU top-k orders exactly equal scores by its partial sort,
//! which no other engine reproduces; we take the higher score, then the
//! earlier position (fixtures keep a 1e-4 gap at the boundary).

use crate::config::layout::IndexerTensors;
use crate::config::{Dsa, MlaDims, ModelConfig};
use crate::error::{Error, Result};
use crate::kv::KvRows;
use crate::quant::QMatrix;
use crate::source::TensorSource;

use super::rope::Rope;
use super::{load_matrix, load_vector};
use rayon::prelude::*;
use waste_kernels::quant::dot_f32;

/// Positions scored per parallel task (the V4 indexer's too): 512 keys of
/// 64 x 128 are ~4 M multiply-adds, well above a task's overhead.
pub(crate) const SCORE_BLOCK: usize = 512;
/// Lanes the index scores split into, each with its own tile of decoded
/// keys: a fixed count keeps the planned scratch independent of the
/// machine, as `mla::MLA_LANES` does.
pub(crate) const SCORE_LANES: usize = 8;

/// `nn.LayerNorm(index_head_dim, eps=1e-6)` of the indexer's key.
const K_NORM_EPS: f32 = 1e-6;

/// `model.layers.L.self_attn.indexer`.
pub struct Indexer {
    wq_b: QMatrix,           // [n_heads * head_dim, q_lora]
    wk: QMatrix,             // [head_dim, H]
    k_norm_weight: Vec<f32>, // [head_dim]
    k_norm_bias: Vec<f32>,   // [head_dim]
    weights_proj: QMatrix,   // [n_heads, H], kept f32
    /// MLA's cos/sin tables in the indexer's pair layout.
    rope: Rope,
    n_heads: usize,
    head_dim: usize,
    rope_dim: usize,
    topk: usize,
}

/// Per-call buffers of an indexer.
pub struct IndexerScratch {
    q: Vec<f32>,       // [n_heads * head_dim]
    weights: Vec<f32>, // [n_heads]
    rot: Vec<f32>,     // [rope_dim]
    /// Index score of every position so far.
    scores: Vec<f32>, // [context]
    order: Vec<u32>,   // [context]
    /// Each lane's block of keys decoded from a bf16 or q8 cache,
    /// `[SCORE_LANES][SCORE_BLOCK][head_dim]`.
    tiles: Vec<f32>,
}

impl IndexerScratch {
    pub fn new(cfg: &ModelConfig, context: usize) -> IndexerScratch {
        let (d, rope) = match (&cfg.add.dsa, &cfg.mla) {
            (Some(d), Some(m)) => (d, m.qk_rope_head_dim),
            _ => {
                return IndexerScratch {
                    q: vec![],
                    weights: vec![],
                    rot: vec![],
                    scores: vec![],
                    order: vec![],
                    tiles: vec![],
                }
            }
        };
        IndexerScratch {
            q: vec![0.0; d.n_heads * d.head_dim],
            weights: vec![0.0; d.n_heads],
            rot: vec![0.0; rope],
            scores: vec![0.0; context],
            order: vec![0; context],
            tiles: vec![0.0; SCORE_LANES * SCORE_BLOCK * d.head_dim],
        }
    }

    /// Floats held (a u32 counts as one), for the memory plan.
    pub fn floats(&self) -> usize {
        self.q.len() + self.weights.len() + self.rot.len() + self.scores.len() + self.order.len() + self.tiles.len()
    }
}

/// The positions one token attends, chosen by an indexer.
#[derive(Default, Clone)]
pub struct Selection {
    /// The position of the token they were chosen for.
    pub for_pos: Option<usize>,
    /// Ascending; at most `index_topk`.
    pub positions: Vec<u32>,
}

impl Selection {
    /// Room for `index_topk` positions.
    pub fn for_config(cfg: &ModelConfig) -> Selection {
        Selection { for_pos: None, positions: Vec::with_capacity(cfg.add.dsa.as_ref().map_or(0, |d| d.topk)) }
    }

    /// Floats held on the heap (a u32 counts as one), for the memory plan.
    pub fn floats(&self) -> usize {
        self.positions.capacity()
    }
}

impl Indexer {
    pub fn load(
        cfg: &ModelConfig,
        src: &dyn TensorSource,
        layer: usize,
        mla_rope: Option<&Rope>,
        t: &IndexerTensors,
    ) -> Result<Indexer> {
        let (d, m): (&Dsa, &MlaDims) = match (&cfg.add.dsa, &cfg.mla) {
            (Some(d), Some(m)) => (d, m),
            _ => return Err(Error::Runtime(format!("layer {layer} has an indexer but the config no DSA shape"))),
        };
        let rope = mla_rope
            .ok_or_else(|| Error::Runtime(format!("layer {layer}: the DSA indexer needs MLA's rotary tables")))?;
        Ok(Indexer {
            wq_b: load_matrix(cfg, src, &t.wq_b.name)?,
            wk: load_matrix(cfg, src, &t.wk.name)?,
            k_norm_weight: load_vector(cfg, src, &t.k_norm.name)?,
            k_norm_bias: load_vector(cfg, src, &t.k_norm_bias.name)?,
            weights_proj: load_matrix(cfg, src, &t.weights_proj.name)?,
            rope: rope.with_interleave(d.interleaved_rope),
            n_heads: d.n_heads,
            head_dim: d.head_dim,
            rope_dim: m.qk_rope_head_dim,
            topk: d.topk,
        })
    }

    /// The key of the token at `pos` (input `x`, the attention input) into
    /// `key` (`[head_dim]`): `LayerNorm(wk x)`, roped. `cos`/`sin` are MLA's
    /// tables at `pos`.
    pub fn key(&self, x: &[f32], cos: &[f32], sin: &[f32], key: &mut [f32], s: &mut IndexerScratch) {
        self.wk.matvec(x, key);
        let n = key.len() as f32;
        let mean = key.iter().sum::<f32>() / n;
        let var = key.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
        let inv = 1.0 / (var + K_NORM_EPS).sqrt();
        for ((k, &w), &b) in key.iter_mut().zip(&self.k_norm_weight).zip(&self.k_norm_bias) {
            *k = (*k - mean) * inv * w + b;
        }
        self.rope.apply(&mut key[..self.rope_dim], cos, sin, &mut s.rot);
    }

    /// Chooses the positions the token at `pos` attends into `selected`.
    /// `q_resid` is MLA's normed q-LoRA latent; columns `cols` of the
    /// cache's row `t` hold position `t`'s key (the current token's
    /// already written).
    #[allow(clippy::too_many_arguments)]
    pub fn select(
        &self,
        x: &[f32],
        q_resid: &[f32],
        pos: usize,
        cos: &[f32],
        sin: &[f32],
        (cache, cols): (&KvRows, std::ops::Range<usize>),
        s: &mut IndexerScratch,
        selected: &mut Selection,
    ) {
        selected.for_pos = Some(pos);
        let selected = &mut selected.positions;
        selected.clear();
        let n = pos + 1;
        if n <= self.topk {
            // Every causal position is within the top k: no scoring needed.
            selected.extend(0..n as u32);
            return;
        }
        let (nh, hd) = (self.n_heads, self.head_dim);
        self.wq_b.matvec(q_resid, &mut s.q);
        for h in 0..nh {
            self.rope.apply(&mut s.q[h * hd..h * hd + self.rope_dim], cos, sin, &mut s.rot);
        }
        self.weights_proj.matvec(x, &mut s.weights);
        let head_scale = (nh as f32).powf(-0.5);
        s.weights.iter_mut().for_each(|w| *w *= head_scale);
        let softmax_scale = (hd as f32).powf(-0.5);
        let (q, weights) = (&s.q, &s.weights);
        // Each position's score depends on nothing else: lanes of whole
        // blocks run in parallel and give the same bits at any thread count;
        // each lane decodes a bf16 or q8 cache's keys a block at a time into
        // its own tile.
        let per_lane = n.div_ceil(SCORE_BLOCK).div_ceil(SCORE_LANES) * SCORE_BLOCK;
        let lanes = s.scores[..n].par_chunks_mut(per_lane).zip(s.tiles.par_chunks_mut(SCORE_BLOCK * hd));
        lanes.enumerate().for_each(|(l, (lane, tile))| {
            for (b, block) in lane.chunks_mut(SCORE_BLOCK).enumerate() {
                let first = l * per_lane + b * SCORE_BLOCK;
                let (keys, stride) = cache.view(first, block.len(), cols.clone(), tile);
                for (i, score) in block.iter_mut().enumerate() {
                    let k = &keys[i * stride..][..hd];
                    let mut acc = 0.0f32;
                    for (h, &w) in weights.iter().enumerate() {
                        let d = dot_f32(&q[h * hd..(h + 1) * hd], k) * softmax_scale;
                        acc += w * d.max(0.0);
                    }
                    *score = acc;
                }
            }
        });
        let scores = &s.scores[..n];
        let order = &mut s.order[..n];
        for (i, o) in order.iter_mut().enumerate() {
            *o = i as u32;
        }
        let better = |a: &u32, b: &u32| scores[*b as usize].total_cmp(&scores[*a as usize]).then(a.cmp(b));
        order.select_nth_unstable_by(self.topk - 1, better);
        selected.extend_from_slice(&order[..self.topk]);
        selected.sort_unstable();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::HfCheckpoint;
    use crate::config::layout::MlaTensors;
    use crate::kv::KvType;

    /// Every position's index score, over a bf16 and a q8 cache long enough
    /// for several score lanes of several blocks, is the definition's on
    /// that position's stored key (decoded): no lane reads another's rows.
    #[test]
    fn index_scores_over_lanes_of_decoded_keys_are_each_positions_own() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-deepseek_v32");
        let ckpt = HfCheckpoint::open(&dir).unwrap();
        let cfg = ckpt.config().clone();
        let (d, m) = (cfg.add.dsa.clone().unwrap(), cfg.mla.unwrap());
        let layer = (0..cfg.num_layers).find(|&l| d.has_indexer(l)).unwrap();
        let tensors = MlaTensors::of(&cfg, layer).unwrap();
        let rope = cfg.mla_rope.as_ref().map(Rope::new);
        let ix = Indexer::load(&cfg, &ckpt, layer, rope.as_ref(), tensors.indexer.as_ref().unwrap()).unwrap();
        let (w, stride) = (m.cache_width(), cfg.state_floats_per_token(layer));
        let n = 3 * SCORE_LANES * SCORE_BLOCK / 2 + 37;
        let unit = |i: usize| ((i * 2654435761) % 1999) as f32 / 1999.0 - 0.5;
        let x: Vec<f32> = (0..cfg.hidden_size).map(unit).collect();
        let q_resid: Vec<f32> = (0..m.q_lora_rank.unwrap()).map(|i| unit(i + 7)).collect();
        let (cos, sin) = (vec![0.6f32; m.qk_rope_head_dim / 2], vec![0.8f32; m.qk_rope_head_dim / 2]);
        for ty in [KvType::Bf16, KvType::Q8] {
            let mut cache = KvRows::new(ty, n, stride);
            for t in 0..n {
                let row: Vec<f32> = (0..stride).map(|c| unit(t * stride + c)).collect();
                cache.write_row(t, &row);
            }
            let mut s = IndexerScratch::new(&cfg, n);
            let mut selected = Selection::for_config(&cfg);
            ix.select(&x, &q_resid, n - 1, &cos, &sin, (&cache, w..stride), &mut s, &mut selected);
            let (hd, scale) = (ix.head_dim, (ix.head_dim as f32).powf(-0.5));
            let mut key = vec![0.0; stride - w];
            for t in 0..n {
                cache.read_row(t, w..stride, &mut key);
                let mut want = 0.0f32;
                for (h, &wt) in s.weights.iter().enumerate() {
                    want += wt * (dot_f32(&s.q[h * hd..(h + 1) * hd], &key) * scale).max(0.0);
                }
                assert_eq!(s.scores[t].to_bits(), want.to_bits(), "{ty}: position {t}");
            }
            assert_eq!(selected.positions.len(), d.topk);
        }
    }
}
