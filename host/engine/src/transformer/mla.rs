//! Multi-head latent attention with the absorbed latent cache: Kimi-Linear's
//! MLA layers (`KimiLinearAttention`, no positional encoding) and
//! DeepSeek-V3's (`DeepseekV3Attention`: optional low-rank query, RoPE on the
//! rope parts, YaRN mscale on the softmax scale; `k_rope` is cached roped).
//!
//! The reference expands the cached latent per head: `k = [W_kb_nope c | k_rope]`,
//! `v = W_kb_v c`. Here only `[c | k_rope]` is cached (kv_lora + rope floats
//! per token) and `W_kb` is folded into the query and the output:
//! `score_s = (W_kb_nope^T q_nope) . c_s + q_rope . k_rope_s`, times
//! `(nope + rope)^-1/2`; `o_h = W_kb_v (sum_s a_s c_s)`; then `W_o`.

use crate::attend::{self, QueryColumns};
use crate::config::layout::{MlaQuery, MlaTensors, Tensor};
use crate::config::{MlaDims, ModelConfig};
use crate::error::{Error, Result};
use crate::kv::{KvRows, KEY_TILE};
use crate::quant::{QMatrix, TrunkFormat};
use crate::source::TensorSource;

use rayon::prelude::*;

use super::dsa::{Indexer, IndexerScratch, Selection};
use super::ops::{add_in_place, dot, rms_norm};
use super::rope::Rope;
use super::{load_matrix, load_vector};

/// Name suffix of MLA's `kv_b_proj` (see [`kv_b_resident_bytes`]).
pub const KV_B_SUFFIX: &str = ".kv_b_proj.weight";

/// Bytes an MLA layer holds for a `kv_b_proj` of `[rows, cols]` stored as
/// `fmt`: its stored bytes, whatever the format (`KvB`). The memory planner
/// counts exactly this.
pub fn kv_b_resident_bytes(fmt: TrunkFormat, rows: usize, cols: usize) -> usize {
    fmt.byte_len(rows, cols)
}

/// `kv_b_proj` `[heads * (nope + v), lora]` as the absorbed product reads
/// it: the query side sums each head's nope rows weighted by `q_nope`
/// (`q_lat = W_nope^T q_nope`), the value side dots its v rows with the
/// attended latent.
enum KvB {
    /// Stored as f32: the rows, read on both sides by plain loops.
    F32(Vec<f32>),
    /// Stored as q8/q4 (or a GGUF type) and kept so: the query side adds dequantised rows
    /// (`QMatrix::add_scaled_row`, bit-identical to the same loop over the
    /// f32 expansion), the value side runs the SIMD row kernels.
    /// Dequantising the whole matrix at load cost 4 bytes per weight (about
    /// 4 GB on DeepSeek-V3); a q8 transposed copy for the query side was
    /// tried and dropped: it re-quantises weights and moved tiny K3's q4
    /// logits by 46% of their max.
    Quant(QMatrix),
}

impl KvB {
    fn load(w: QMatrix) -> KvB {
        match w.format() {
            TrunkFormat::F32 => KvB::F32(w.dequantize()),
            TrunkFormat::Q8 | TrunkFormat::Q4 | TrunkFormat::Ggml(_) => KvB::Quant(w),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            KvB::F32(w) => w.len() * 4,
            KvB::Quant(w) => w.byte_len(),
        }
    }
}

/// `model.layers.L.self_attn` of an MLA layer.
pub struct Mla {
    dims: MlaDims,
    q: QueryProj,
    kv_a_proj: QMatrix,          // [lora + rope, H]
    kv_a_bias: Option<Vec<f32>>, // [lora + rope]
    kv_a_layernorm: Vec<f32>,    // [lora]
    kv_b: KvB,
    o_proj: QMatrix, // [H, heads * v]
    o_bias: Option<Vec<f32>>,
    /// K3 `mla_use_output_gate`: `sigmoid(g_proj x)` on the attention
    /// output before `o_proj`; `[heads * v, H]`.
    g_proj: Option<QMatrix>,
    rope: Option<Rope>,
    scale: f32,
    /// DSA: the layer's own lightning indexer (its key cached after the
    /// latent row), or none on a GLM "shared" layer, which attends the
    /// positions the nearest earlier indexer chose.
    indexer: Option<Indexer>,
    /// DSA: attention runs over the selected positions only.
    sparse: bool,
    /// Floats per token in this layer's cache: `[c | k_rope | index key]`.
    stride: usize,
}

/// The query projection: full rank, or DeepSeek's
/// `q_b_proj(q_a_layernorm(q_a_proj x))`.
enum QueryProj {
    Full(QMatrix), // [heads * (nope + rope), H]
    LowRank {
        q_a: QMatrix, // [q_lora, H]
        q_a_bias: Option<Vec<f32>>,
        norm: Vec<f32>, // [q_lora]
        q_b: QMatrix,   // [heads * (nope + rope), q_lora]
    },
}

/// `KimiLinearRMSNorm(config.kv_lora_rank)` is built without an eps
/// argument, so the latent norm uses the class default 1e-6, not
/// `rms_norm_eps` (the absorbed-vs-expanded test caught the difference).
const KV_A_LAYERNORM_EPS: f32 = 1e-6;

/// Groups of heads the attention splits into, each run as one task with
/// its own [`HeadLane`]: up to this many threads work on a token's heads.
/// A fixed count keeps the planned scratch independent of the machine.
pub const MLA_LANES: usize = 8;

/// One head group's buffers, for a block of `block_heads` of its heads at
/// a time: each head's absorbed query `[q_lat | q_rope]` (a cache row's
/// width), its attended latent and a score per attended position.
struct HeadLane {
    queries: Vec<f32>,
    lat: Vec<f32>,
    scores: Vec<f32>,
    /// Up to `KEY_TILE` cache rows decoded from a bf16 or q8 cache.
    tile: Vec<f32>,
    /// The block's queries as `attend::key_scores` reads them.
    columns: Vec<f32>,
}

/// The most floats of scores one lane holds: its heads run in blocks of as
/// many as fit (`MlaScratch::block_heads`), each block reading every
/// cached row once for all its heads.
pub const LANE_SCORE_FLOATS: usize = 1 << 19;

/// An MLA layer's per-token projections, `[n, width]` each: one token's
/// in decode (`MlaScratch::rows`), a prefill chunk's in `prefill`, where
/// each projection runs over every token of the chunk per load of its
/// weights (`QMatrix::matvec_many`, bit-identical to a token alone).
pub struct MlaRows {
    q: Vec<f32>,        // [n, heads * (nope + rope)]
    q_a: Vec<f32>,      // [n, q_lora]
    q_a_norm: Vec<f32>, // [n, q_lora]
    ckv: Vec<f32>,      // [n, lora + rope]
    o: Vec<f32>,        // [n, heads * v]
    /// K3's output gate, `[n, heads * v]`; empty without it.
    gate: Vec<f32>,
}

impl MlaRows {
    /// Room for `n` tokens; empty for a model without MLA layers.
    pub fn new(cfg: &ModelConfig, n: usize) -> MlaRows {
        let Some(m) = cfg.mla else {
            return MlaRows { q: vec![], q_a: vec![], q_a_norm: vec![], ckv: vec![], o: vec![], gate: vec![] };
        };
        let (q_lora, o) = (m.q_lora_rank.unwrap_or(0), m.num_heads * m.v_head_dim);
        MlaRows {
            q: vec![0.0; n * m.num_heads * m.qk_head_dim()],
            q_a: vec![0.0; n * q_lora],
            q_a_norm: vec![0.0; n * q_lora],
            ckv: vec![0.0; n * m.cache_width()],
            o: vec![0.0; n * o],
            gate: vec![0.0; if cfg.k3.is_some_and(|k| k.mla_output_gate) { n * o } else { 0 }],
        }
    }

    /// Floats held, for the memory plan.
    pub fn floats(&self) -> usize {
        [&self.q, &self.q_a, &self.q_a_norm, &self.ckv, &self.o, &self.gate].iter().map(|b| b.len()).sum()
    }
}

/// Per-call buffers of an MLA layer.
pub struct MlaScratch {
    /// One token's projections (decode).
    rows: MlaRows,
    heads: HeadScratch,
}

/// The buffers of one token's attention over the latent cache.
struct HeadScratch {
    lanes: Vec<HeadLane>,
    /// Heads of a lane attending together.
    block_heads: usize,
    /// DSA: the selected positions' cache rows, gathered `[index_topk][width]`.
    gathered: Vec<f32>,
    /// The token's own cache row `[c | k_rope | index key]`, before it is
    /// stored in the cache's type.
    row: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    rot: Vec<f32>,
    index: IndexerScratch,
}

impl MlaScratch {
    pub fn new(cfg: &ModelConfig, context: usize) -> MlaScratch {
        let (heads, w, r) = cfg.mla.map_or((0, 0, 0), |m| (m.num_heads, m.cache_width(), m.kv_lora_rank));
        let per_lane = heads.div_ceil(MLA_LANES);
        let block_heads = (LANE_SCORE_FLOATS / context.max(1)).clamp(1, per_lane.max(1));
        let topk = cfg.add.dsa.as_ref().map_or(0, |d| d.topk.min(context));
        let rope = cfg.mla.map_or(0, |m| m.qk_rope_head_dim);
        MlaScratch {
            rows: MlaRows::new(cfg, 1),
            heads: HeadScratch {
                lanes: (0..if cfg.mla.is_some() { MLA_LANES } else { 0 })
                    .map(|_| HeadLane {
                        queries: vec![0.0; block_heads * w],
                        lat: vec![0.0; block_heads * r],
                        scores: vec![0.0; block_heads * context],
                        tile: vec![0.0; KEY_TILE * w],
                        columns: vec![0.0; QueryColumns::len(block_heads, w)],
                    })
                    .collect(),
                block_heads,
                gathered: vec![0.0; topk * w],
                row: vec![
                    0.0;
                    cfg.mla.map_or(0, |_| (0..cfg.num_layers)
                        .map(|l| cfg.state_floats_per_token(l))
                        .max()
                        .unwrap_or(0))
                ],
                cos: vec![0.0; rope / 2],
                sin: vec![0.0; rope / 2],
                rot: vec![0.0; rope],
                index: IndexerScratch::new(cfg, context),
            },
        }
    }

    /// Floats held, for the memory plan (`plan::scratch_bytes`).
    pub fn floats(&self) -> usize {
        let h = &self.heads;
        self.rows.floats()
            + [&h.gathered, &h.row, &h.cos, &h.sin, &h.rot].iter().map(|b| b.len()).sum::<usize>()
            + h.lanes
                .iter()
                .map(|l| l.queries.len() + l.lat.len() + l.scores.len() + l.tile.len() + l.columns.len())
                .sum::<usize>()
            + h.index.floats()
    }
}

/// The rows one token's heads attend: DSA's selection gathered as f32, or
/// the whole cache, read in place (f32) or decoded a tile at a time.
enum LatentKeys<'a> {
    /// `n` rows of `width` floats.
    Gathered { rows: &'a [f32], width: usize, n: usize },
    /// The cache's first `n` rows.
    Cache { cache: &'a KvRows, n: usize },
}

impl LatentKeys<'_> {
    /// Calls `f(first, (rows, stride, len))` over the attended rows in
    /// order, columns `cols` of each: one run of the gathered rows, or runs
    /// of at most `KEY_TILE` cached rows (both products give the same bits
    /// over consecutive runs as over all rows at once).
    fn each_run(
        &self,
        cols: std::ops::Range<usize>,
        tile: &mut [f32],
        mut f: impl FnMut(usize, (&[f32], usize, usize)),
    ) {
        match *self {
            LatentKeys::Gathered { rows, width, n } => f(0, (&rows[cols.start..], width, n)),
            LatentKeys::Cache { cache, n } => {
                for at in (0..n).step_by(KEY_TILE) {
                    let len = KEY_TILE.min(n - at);
                    let (rows, stride) = cache.view(at, len, cols.clone(), tile);
                    f(at, (rows, stride, len));
                }
            }
        }
    }
}

impl Mla {
    pub fn load(cfg: &ModelConfig, src: &dyn TensorSource, layer: usize, t: &MlaTensors) -> Result<Mla> {
        let dims =
            cfg.mla.ok_or_else(|| Error::Runtime(format!("layer {layer} is MLA but the config has no MLA shape")))?;
        let vector = |t: &Option<Tensor>| t.as_ref().map(|t| load_vector(cfg, src, &t.name)).transpose();
        let q = match &t.q {
            MlaQuery::Full { q_proj } => QueryProj::Full(load_matrix(cfg, src, &q_proj.name)?),
            MlaQuery::LowRank { q_a_proj, q_a_layernorm, q_b_proj, q_a_proj_bias } => QueryProj::LowRank {
                q_a: load_matrix(cfg, src, &q_a_proj.name)?,
                q_a_bias: vector(q_a_proj_bias)?,
                norm: load_vector(cfg, src, &q_a_layernorm.name)?,
                q_b: load_matrix(cfg, src, &q_b_proj.name)?,
            },
        };
        let scale = (cfg.mla_rope.map_or(1.0, |r| r.softmax_scale_factor) / (dims.qk_head_dim() as f64).sqrt()) as f32;
        let rope = cfg.mla_rope.as_ref().map(Rope::new);
        Ok(Mla {
            dims,
            q,
            indexer: match &t.indexer {
                Some(ix) => Some(Indexer::load(cfg, src, layer, rope.as_ref(), ix)?),
                None => None,
            },
            sparse: cfg.add.dsa.is_some(),
            stride: cfg.state_floats_per_token(layer),
            rope,
            scale,
            kv_a_proj: load_matrix(cfg, src, &t.kv_a_proj_with_mqa.name)?,
            kv_a_bias: vector(&t.kv_a_proj_with_mqa_bias)?,
            kv_a_layernorm: load_vector(cfg, src, &t.kv_a_layernorm.name)?,
            kv_b: KvB::load(load_matrix(cfg, src, &t.kv_b_proj.name)?),
            o_proj: load_matrix(cfg, src, &t.o_proj.name)?,
            o_bias: vector(&t.o_proj_bias)?,
            g_proj: match &t.g_proj {
                Some(g) => Some(load_matrix(cfg, src, &g.name)?),
                None => None,
            },
        })
    }

    /// Bytes held for `kv_b_proj` (equal to [`kv_b_resident_bytes`] for its
    /// stored shape and format).
    pub fn kv_b_bytes(&self) -> usize {
        self.kv_b.bytes()
    }

    /// One token at `pos`: writes its `[c | k_rope | index key]` row into
    /// `cache` (`[context, stride]`) and `out = o_proj(attn)`. With DSA,
    /// `selected` receives the positions this layer's indexer chose, or
    /// holds those an earlier layer's chose for this token (GLM "shared").
    pub fn forward(
        &self,
        x: &[f32],
        pos: usize,
        cache: &mut KvRows,
        s: &mut MlaScratch,
        selected: &mut Selection,
        out: &mut [f32],
    ) -> Result<()> {
        let MlaScratch { rows, heads } = s;
        self.forward_rows(x, pos, cache, (rows, heads), std::slice::from_mut(selected), out)
    }

    /// `forward` for the consecutive tokens of a prefill chunk, `xs`
    /// `[n, H]` from position `start`, `selections` one per token, `outs`
    /// `[n, H]`: the projections over every token at once, the latent rows
    /// and attention token by token in order, so each token's output is
    /// bit-identical to `forward`'s.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_chunk(
        &self,
        xs: &[f32],
        start: usize,
        cache: &mut KvRows,
        s: &mut MlaScratch,
        rows: &mut MlaRows,
        selections: &mut [Selection],
        outs: &mut [f32],
    ) -> Result<()> {
        self.forward_rows(xs, start, cache, (rows, &mut s.heads), selections, outs)
    }

    fn forward_rows(
        &self,
        xs: &[f32],
        start: usize,
        cache: &mut KvRows,
        (rows, heads): (&mut MlaRows, &mut HeadScratch),
        selections: &mut [Selection],
        outs: &mut [f32],
    ) -> Result<()> {
        let m = &self.dims;
        let n = selections.len();
        let (qd, w, od) = (m.num_heads * m.qk_head_dim(), m.cache_width(), m.num_heads * m.v_head_dim);
        let q_lora = m.q_lora_rank.unwrap_or(0);
        let (Some(q), Some(ckv), Some(o)) =
            (rows.q.get_mut(..n * qd), rows.ckv.get_mut(..n * w), rows.o.get_mut(..n * od))
        else {
            return Err(Error::Runtime(format!("an MLA chunk of {n} tokens exceeds its buffers")));
        };
        let h = xs.len() / n.max(1);
        let q_resid = &mut rows.q_a_norm[..n * q_lora];
        match &self.q {
            QueryProj::Full(q_proj) => q_proj.matvec_many(xs, q),
            QueryProj::LowRank { q_a, q_a_bias, norm, q_b } => {
                let q_a_out = &mut rows.q_a[..n * q_lora];
                q_a.matvec_many(xs, q_a_out);
                for (a, a_norm) in q_a_out.chunks_exact_mut(q_lora).zip(q_resid.chunks_exact_mut(q_lora)) {
                    if let Some(b) = q_a_bias {
                        add_in_place(a, b);
                    }
                    // `DeepseekV3RMSNorm(q_lora_rank)`: the class default eps.
                    rms_norm(a, norm, KV_A_LAYERNORM_EPS, a_norm);
                }
                q_b.matvec_many(q_resid, q);
            }
        }
        self.kv_a_proj.matvec_many(xs, ckv);
        for (i, selected) in selections.iter_mut().enumerate() {
            let ckv = &mut ckv[i * w..(i + 1) * w];
            if let Some(b) = &self.kv_a_bias {
                add_in_place(ckv, b);
            }
            let x = &xs[i * h..(i + 1) * h];
            let q_resid = &q_resid[i * q_lora..(i + 1) * q_lora];
            let (q, o) = (&mut q[i * qd..(i + 1) * qd], &mut o[i * od..(i + 1) * od]);
            self.attend_token(x, q_resid, q, ckv, start + i, cache, heads, selected, o)?;
        }
        if let Some(g) = &self.g_proj {
            let gate = &mut rows.gate[..n * od];
            g.matvec_many(xs, gate);
            for (o, &gv) in o.iter_mut().zip(gate.iter()) {
                *o *= 1.0 / (1.0 + (-gv).exp());
            }
        }
        self.o_proj.matvec_many(o, outs);
        if let Some(b) = &self.o_bias {
            for out in outs.chunks_exact_mut(h) {
                add_in_place(out, b);
            }
        }
        Ok(())
    }

    /// The token at `pos` given its projections: its latent row `ckv`
    /// normed and roped into `cache`, its query `q` roped, DSA's selection,
    /// and every head's attention into `o` (`[heads * v]`, before `o_proj`).
    #[allow(clippy::too_many_arguments)]
    fn attend_token(
        &self,
        x: &[f32],
        q_resid: &[f32],
        q: &mut [f32],
        ckv: &[f32],
        pos: usize,
        cache: &mut KvRows,
        s: &mut HeadScratch,
        selected: &mut Selection,
        o: &mut [f32],
    ) -> Result<()> {
        let m = &self.dims;
        let (r, dn, dr, dv) = (m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim);
        let (w, stride) = (m.cache_width(), self.stride);
        if pos >= cache.rows() {
            return Err(Error::Runtime(format!("position {pos} is past the latent cache")));
        }
        let row = &mut s.row[..stride];
        rms_norm(&ckv[..r], &self.kv_a_layernorm, KV_A_LAYERNORM_EPS, &mut row[..r]);
        row[r..w].copy_from_slice(&ckv[r..]);
        if let Some(rope) = &self.rope {
            rope.angles(pos, &mut s.cos, &mut s.sin);
            rope.apply(&mut row[r..w], &s.cos, &s.sin, &mut s.rot);
            for h in 0..m.num_heads {
                let q_rope = &mut q[h * (dn + dr) + dn..(h + 1) * (dn + dr)];
                rope.apply(q_rope, &s.cos, &s.sin, &mut s.rot);
            }
        }
        if let Some(ix) = &self.indexer {
            ix.key(x, &s.cos, &s.sin, &mut row[w..], &mut s.index);
        }
        // Stored in the cache's type: this token attends its own row as
        // every later token will read it.
        cache.write_row(pos, row);
        if let Some(ix) = &self.indexer {
            ix.select(x, q_resid, pos, &s.cos, &s.sin, (cache, w..stride), &mut s.index, selected);
        }
        // Attended positions: the selection (ascending), or all of them.
        let sparse = self.sparse;
        if sparse && selected.for_pos != Some(pos) {
            return Err(Error::Runtime(format!(
                "a shared-indexer layer at position {pos} has no selection from an earlier layer to reuse"
            )));
        }
        // The attended rows: the selection's gathered in ascending
        // position, or every cached position, read KEY_TILE rows at a time.
        let (keys, n): (LatentKeys, usize) = if sparse {
            let chosen = &selected.positions;
            let Some(gathered) = s.gathered.get_mut(..chosen.len() * w) else {
                return Err(Error::Runtime(format!("{} selected positions exceed the indexer's top-k", chosen.len())));
            };
            for (g, &t) in gathered.chunks_exact_mut(w).zip(chosen) {
                cache.read_row(t as usize, 0..w, g);
            }
            let n = chosen.len();
            (LatentKeys::Gathered { rows: &s.gathered[..n * w], width: w, n }, n)
        } else {
            (LatentKeys::Cache { cache, n: pos + 1 }, pos + 1)
        };

        let scale = self.scale;
        let (q_all, kv_b, block_heads, keys) = (&*q, &self.kv_b, s.block_heads, &keys);
        // Heads are independent: contiguous groups of them run on the pool,
        // each group with its own buffers, and every head's arithmetic is
        // the same whichever group, block or thread runs it.
        let per_lane = m.num_heads.div_ceil(MLA_LANES);
        o.par_chunks_mut(per_lane * dv).zip(s.lanes.par_iter_mut()).enumerate().for_each(|(g, (o_group, lane))| {
            let HeadLane { queries, lat, scores, tile, columns } = lane;
            for (b, o_block) in o_group.chunks_mut(block_heads * dv).enumerate() {
                let heads = o_block.len() / dv;
                let first = g * per_lane + b * block_heads;
                let (queries, lat) = (&mut queries[..heads * w], &mut lat[..heads * r]);
                let scores = &mut scores[..heads * n];
                for (j, query) in queries.chunks_exact_mut(w).enumerate() {
                    let h = first + j;
                    let q = &q_all[h * (dn + dr)..(h + 1) * (dn + dr)];
                    let (q_nope, q_rope) = q.split_at(dn);
                    let (q_lat, q_rot) = query.split_at_mut(r);
                    q_lat.fill(0.0);
                    match kv_b {
                        KvB::F32(kv_b) => {
                            let kb = &kv_b[h * (dn + dv) * r..(h + 1) * (dn + dv) * r];
                            // q_lat = W_kb_nope^T q_nope: a q-weighted sum of the nope rows.
                            for (i, &qi) in q_nope.iter().enumerate() {
                                for (l, &wv) in q_lat.iter_mut().zip(&kb[i * r..(i + 1) * r]) {
                                    *l += qi * wv;
                                }
                            }
                        }
                        KvB::Quant(kv_b) => {
                            for (i, &qi) in q_nope.iter().enumerate() {
                                kv_b.add_scaled_row(h * (dn + dv) + i, qi, q_lat);
                            }
                        }
                    }
                    q_rot.copy_from_slice(q_rope);
                }
                // score_s = [q_lat | q_rope] . [c_s | k_rope_s], one dot
                // product over the cache row's width.
                let queries = QueryColumns::new(queries, w, columns);
                keys.each_run(0..w, tile, |at, (k, stride, len)| {
                    attend::key_scores(&queries, (k, stride, len), &mut scores[at..], n)
                });
                for row in scores.chunks_exact_mut(n) {
                    row.iter_mut().for_each(|sc| *sc *= scale);
                    attend::softmax(row, None);
                }
                lat.fill(0.0);
                // The latent part of each row is its value.
                keys.each_run(0..r, tile, |at, values| attend::weighted_rows((&scores[at..], n), values, r, lat));
                for (j, (o, lat)) in o_block.chunks_exact_mut(dv).zip(lat.chunks_exact(r)).enumerate() {
                    let h = first + j;
                    match kv_b {
                        KvB::F32(kv_b) => {
                            let kb = &kv_b[h * (dn + dv) * r..(h + 1) * (dn + dv) * r];
                            for (j, oj) in o.iter_mut().enumerate() {
                                *oj = dot(&kb[(dn + j) * r..(dn + j + 1) * r], lat);
                            }
                        }
                        KvB::Quant(kv_b) => kv_b.matvec_rows(h * (dn + dv) + dn, lat, o),
                    }
                }
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{Mla, MlaScratch, Selection, KV_B_SUFFIX};
    use crate::checkpoint::HfCheckpoint;
    use crate::quant::{quantize_trunk, QMatrix, TrunkFormat};
    use crate::source::TensorSource;
    use crate::stats::StepStats;
    use crate::transformer::experts::DenseExperts;
    use crate::transformer::{State, Transformer};
    use safetensors::SafeTensors;

    fn fixture(family: &str) -> std::path::PathBuf {
        let dir =
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/fixtures/tiny-{family}"));
        assert!(dir.join("config.json").exists(), "fixture missing: {}", dir.display());
        dir
    }

    /// The checkpoint with every matrix stored as `fmt`, as a converted
    /// container holds it; with `f32_kv_b`, `kv_b_proj` is instead handed
    /// over as the f32 expansion of those stored values (what the layer kept
    /// before it learnt to keep the stored form).
    struct Stored<'a> {
        ckpt: &'a HfCheckpoint,
        fmt: TrunkFormat,
        f32_kv_b: bool,
    }

    impl TensorSource for Stored<'_> {
        fn matrix(&self, name: &str) -> crate::Result<QMatrix> {
            let m = self.ckpt.matrix(name)?;
            let (rows, cols) = (m.rows(), m.cols());
            if self.fmt == TrunkFormat::F32 {
                return Ok(m);
            }
            let q = QMatrix::from_byte_vec(self.fmt, rows, cols, quantize_trunk(self.fmt, &m.dequantize(), rows, cols))
                .unwrap();
            Ok(if self.f32_kv_b && name.ends_with(KV_B_SUFFIX) {
                QMatrix::from_f32(q.dequantize(), rows, cols)
            } else {
                q
            })
        }
        fn vector(&self, name: &str) -> crate::Result<Vec<f32>> {
            self.ckpt.vector(name)
        }
        fn has(&self, name: &str) -> bool {
            self.ckpt.has(name)
        }
    }

    /// The planner's resident bytes for `kv_b_proj` are exactly what a
    /// loaded MLA layer holds for it, for every stored format.
    #[test]
    fn planner_kv_b_bytes_equal_what_the_layer_holds() {
        for family in ["kimi_linear", "deepseek_v3", "kimi_k3"] {
            let ckpt = HfCheckpoint::open(&fixture(family)).unwrap();
            let cfg = ckpt.config().clone();
            let layer =
                (0..cfg.num_layers).find(|&l| cfg.attn_kind(l) == crate::config::AttnKind::Mla).expect("an MLA layer");
            for fmt in [TrunkFormat::F32, TrunkFormat::Q8, TrunkFormat::Q4] {
                let src = Stored { ckpt: &ckpt, fmt, f32_kv_b: false };
                let mla =
                    Mla::load(&cfg, &src, layer, &crate::config::layout::MlaTensors::of(&cfg, layer).unwrap()).unwrap();
                let name = format!("model.layers.{layer}.self_attn{KV_B_SUFFIX}");
                let w = src.matrix(&name).unwrap();
                let entry = crate::container::manifest::TensorEntry {
                    name,
                    shape: vec![w.rows() as u64, w.cols() as u64],
                    format: fmt.name().to_string(),
                    offset: 0,
                    bytes: w.byte_len() as u64,
                    crc32: None,
                };
                let planned = crate::plan::resident_tensor_bytes(&cfg, &entry);
                assert_eq!(planned, mla.kv_b_bytes() as u64, "{family} {fmt:?}");
                assert_eq!(planned, entry.bytes, "{family} {fmt:?}: held as stored");
            }
        }
    }

    /// Keeping a quantised `kv_b_proj` in its stored form changes the logits
    /// of an all-quantised tiny model against the f32 expansion of the same
    /// stored values only by the value side's summation order (the query
    /// side is bit-identical); both are printed against the unquantised
    /// model too, for scale.
    #[test]
    fn quantised_kv_b_logits_stay_near_the_f32_expansion() {
        for family in ["kimi_linear", "deepseek_v3", "kimi_k3"] {
            let dir = fixture(family);
            let ckpt = HfCheckpoint::open(&dir).unwrap();
            let cfg = ckpt.config().clone();
            let prompt: Vec<u32> = (0..24u32).map(|i| (i * 37 + 5) % cfg.vocab_size as u32).collect();
            for fmt in [TrunkFormat::Q8, TrunkFormat::Q4] {
                let run = |f32_kv_b: bool| {
                    let src = Stored { ckpt: &ckpt, fmt, f32_kv_b };
                    let model = Transformer::load(&cfg, &src).unwrap();
                    let mut st = State::new(&cfg, prompt.len());
                    model.forward(&mut st, &prompt, &DenseExperts(&ckpt), true, &mut StepStats::default()).unwrap()
                };
                let (before, after) = (run(true), run(false));
                let exact = {
                    let model = Transformer::load(&cfg, &ckpt).unwrap();
                    let mut st = State::new(&cfg, prompt.len());
                    model.forward(&mut st, &prompt, &DenseExperts(&ckpt), true, &mut StepStats::default()).unwrap()
                };
                let emax = exact.iter().fold(0f32, |m, v| m.max(v.abs()));
                let qerr = |l: &[f32]| exact.iter().zip(l).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / emax;
                println!(
                    "{family} {fmt:?}: vs unquantised model: f32 kv_b {:e}, quantised kv_b {:e}",
                    qerr(&before),
                    qerr(&after)
                );
                let max = before.iter().fold(0f32, |m, v| m.max(v.abs()));
                let diff = before.iter().zip(&after).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                let rel = diff / max;
                println!("{family} {fmt:?}: quantised kv_b vs f32 kv_b, max relative logit diff {rel:e}");
                match fmt {
                    // A kept q4 kv_b's products round their input to int8
                    // per group (`quant::int8`), which these tiny random
                    // models amplify (1.7e-2 on kimi_linear's fixture, 0.33
                    // on deepseek_v3's, where q4 itself moves the logits by
                    // 1.1 and 0.61): it must not take the model further from
                    // the unquantised one than the f32 expansion is
                    // (measured: 1.111 vs 1.117, 0.564 vs 0.612).
                    TrunkFormat::Q4 => {
                        let (kept, expanded) = (qerr(&after), qerr(&before));
                        assert!(kept <= 1.05 * expanded, "{family} q4: {kept} vs {expanded}");
                    }
                    // Only the SIMD row dots' summation order differs.
                    _ => assert!(rel <= 1e-4, "{family} {fmt:?}: {rel}"),
                }
            }
        }
    }

    /// The absorbed latent path equals the reference module's expanded
    /// K/V computation (tests/gen_kimi_fixtures.py, `mla_reference`).
    #[test]
    fn absorbed_mla_equals_expanded_reference() {
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-kimi_linear");
        let path = dir.join("mla_reference.safetensors");
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("fixture file missing: {}: {e}", path.display()));
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
        let layer: usize = meta.metadata().as_ref().unwrap()["layer"].parse().unwrap();
        let get = |n: &str| -> Vec<f32> {
            st.tensor(n).unwrap().data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
        };
        let (x, want) = (get("x"), get("expanded"));
        let ckpt = HfCheckpoint::open(&dir).unwrap();
        let cfg = ckpt.config().clone();
        let mla = Mla::load(&cfg, &ckpt, layer, &crate::config::layout::MlaTensors::of(&cfg, layer).unwrap()).unwrap();
        let h = cfg.hidden_size;
        let t_len = x.len() / h;
        let m = cfg.mla.unwrap();
        let mut cache = crate::kv::KvRows::new(crate::kv::KvType::F32, t_len, m.cache_width());
        let mut s = MlaScratch::new(&cfg, t_len);
        let mut out = vec![0.0f32; h];
        let mut worst = 0.0f32;
        for t in 0..t_len {
            mla.forward(&x[t * h..(t + 1) * h], t, &mut cache, &mut s, &mut Selection::default(), &mut out).unwrap();
            let w = &want[t * h..(t + 1) * h];
            let scale = w.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let diff = out.iter().zip(w).fold(0.0f32, |a, (p, q)| a.max((p - q).abs()));
            worst = worst.max(diff / scale);
        }
        println!("absorbed vs expanded: max relative diff {worst:e}");
        assert!(worst <= 1e-5, "absorbed MLA differs from the expanded reference: {worst}");
        // Only the latent row is cached: kv_lora + rope floats per token.
        assert_eq!(cfg.state_floats_per_token(layer), m.kv_lora_rank + m.qk_rope_head_dim);
    }
}
