//! Grouped-query attention with rotary embeddings (the HF `rotate_half`
//! convention, on all of each head or its first `rotary_dim` dims, plain or
//! YaRN-scaled), optional q/k RMSNorms (plain or zero-centred), biases, a
//! sliding window per layer held in a ring of that many rows, gpt-oss's
//! attention sinks and Qwen3-Next's sigmoid output gate.

use rayon::prelude::*;

use crate::config::layout::{GqaTensors, Tensor};
use crate::config::{AttnKind, MlaRope, ModelConfig, QkNorm};
use crate::error::{Error, Result};
use crate::kv::{KvRows, KEY_TILE};
use crate::quant::QMatrix;

use super::ops::rms_norm_in_place;
use super::{load_matrix, load_vector};
use crate::attend::{self, QueryColumns};
use crate::source::TensorSource;

/// Rotary tables of the GQA layers: `inv_freq[i] = theta^(-2i/rd)` for
/// i < rd/2 over the rotated dims `rd` of a head, or YaRN's blend of
/// interpolated and extrapolated frequencies (gpt-oss), whose
/// `attention_factor` scales cos and sin.
pub struct Rope {
    inv_freq: Vec<f32>,
    /// YaRN's `attention_scaling`; None (not 1.0) keeps the plain tables'
    /// arithmetic exactly as it was.
    attention_factor: Option<f32>,
}

impl Rope {
    pub fn new(cfg: &ModelConfig) -> Rope {
        let d = cfg.rotary_dim();
        if let Some(yarn) = cfg.add.rope_yarn {
            // The same `_compute_yarn_parameters` as the MLA rope's.
            let mla = MlaRope {
                theta: cfg.rope_theta,
                dim: d,
                interleave: false,
                yarn: Some(yarn),
                softmax_scale_factor: 1.0,
            };
            let r = super::rope::Rope::new(&mla);
            return Rope { inv_freq: r.inv_freq().to_vec(), attention_factor: Some(yarn.attention_factor as f32) };
        }
        // compute_default_rope_parameters: `1.0 / (base ** (torch.arange(0, dim, 2,
        // dtype=torch.float) / dim))`, i.e. an f32 exponent and an f32 result.
        let inv_freq = (0..d / 2)
            .map(|i| {
                let e = (2 * i) as f32 / d as f32;
                (1.0 / cfg.rope_theta.powf(e as f64)) as f32
            })
            .collect();
        Rope { inv_freq, attention_factor: None }
    }

    /// cos/sin for one position, each `[rd/2]` (the HF tables repeat them twice).
    pub fn tables(&self, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
        for ((f, c), s) in self.inv_freq.iter().zip(cos.iter_mut()).zip(sin.iter_mut()) {
            // `freqs = position_ids.float() * inv_freq` in f32, then cos/sin.
            let angle = (pos as f32 * f) as f64;
            *c = angle.cos() as f32;
            *s = angle.sin() as f32;
            if let Some(a) = self.attention_factor {
                // `cos = emb.cos() * self.attention_scaling`
                *c *= a;
                *s *= a;
            }
        }
    }

    /// `x * cos + rotate_half(x) * sin` on the first `2 * cos.len()` dims of
    /// every head of `x`; the rest of each head passes through
    /// (`torch.cat([q_embed, q_pass], dim=-1)`).
    pub fn apply(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
        let half = cos.len();
        for head in x.chunks_exact_mut(head_dim) {
            let (a, b) = head[..2 * half].split_at_mut(half);
            for i in 0..half {
                let (x1, x2) = (a[i], b[i]);
                a[i] = x1 * cos[i] - x2 * sin[i];
                b[i] = x2 * cos[i] + x1 * sin[i];
            }
        }
    }
}

/// `model.layers.L.self_attn`.
pub struct Attention {
    /// `[heads*d, H]`, or `[heads*2d, H]` with an output gate: per head the
    /// rows are `[query (d) | gate (d)]`.
    q_proj: QMatrix,
    k_proj: QMatrix, // [kv*d, H]
    v_proj: QMatrix, // [kv*d, H]
    o_proj: QMatrix, // [H, heads*d]
    q_proj_bias: Option<Vec<f32>>,
    k_proj_bias: Option<Vec<f32>>,
    v_proj_bias: Option<Vec<f32>>,
    o_proj_bias: Option<Vec<f32>>,
    /// `[d]` per head (Qwen3) or `[heads*d]` (OLMoE, MiniMax); stored as
    /// `1 + w` when the checkpoint's norms are zero-centred.
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>, // [d] or [kv*d]
    /// gpt-oss: one logit per head that joins each softmax, `[heads]`.
    sinks: Option<Vec<f32>>,
    /// Keys visible to a query, itself included; the KV rows are a ring of
    /// this many.
    window: Option<usize>,
    output_gate: bool,
    /// Decode work (`PARALLEL_DECODE_WORK`) from which the KV heads run on
    /// the pool; tests lower it to reach that path at short contexts.
    parallel_decode_work: usize,
}

/// Per-call buffers of the attention block.
pub struct AttnScratch {
    pub q: Vec<f32>,
    /// The gated q projection, `[heads * 2d]` (empty without an output gate).
    pub qg: Vec<f32>,
    pub gate: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub out: Vec<f32>,
    pub scores: Vec<f32>,
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
    /// Each KV head's keys or values of up to `KEY_TILE` positions,
    /// decoded from a bf16 or q8 cache (`KvRows::view`).
    pub tile: Vec<f32>,
    /// Each KV head's query heads as `attend::key_scores` reads them.
    pub columns: Vec<f32>,
}

impl AttnScratch {
    pub fn new(cfg: &ModelConfig, context: usize) -> AttnScratch {
        let gated = if cfg.add.attn_output_gate { cfg.q_dim() } else { 0 };
        AttnScratch {
            q: vec![0.0; cfg.q_dim()],
            qg: vec![0.0; 2 * gated],
            gate: vec![0.0; gated],
            k: vec![0.0; cfg.kv_dim()],
            v: vec![0.0; cfg.kv_dim()],
            out: vec![0.0; cfg.q_dim()],
            // Every KV head's: decode runs them in parallel at long contexts.
            scores: vec![0.0; context * cfg.num_heads],
            cos: vec![0.0; cfg.rotary_dim() / 2],
            sin: vec![0.0; cfg.rotary_dim() / 2],
            tile: vec![0.0; KEY_TILE * cfg.head_dim * cfg.num_kv_heads],
            columns: vec![
                0.0;
                QueryColumns::len(cfg.num_heads / cfg.num_kv_heads.max(1), cfg.head_dim) * cfg.num_kv_heads
            ],
        }
    }

    /// Floats held, for the memory plan (`plan::scratch_bytes`).
    pub fn floats(&self) -> usize {
        [
            &self.q,
            &self.qg,
            &self.gate,
            &self.k,
            &self.v,
            &self.out,
            &self.scores,
            &self.cos,
            &self.sin,
            &self.tile,
            &self.columns,
        ]
        .iter()
        .map(|b| b.len())
        .sum()
    }
}

impl Attention {
    pub fn load(cfg: &ModelConfig, src: &dyn TensorSource, layer: usize, t: &GqaTensors) -> Result<Attention> {
        let vector = |t: &Option<Tensor>| t.as_ref().map(|t| load_vector(cfg, src, &t.name)).transpose();
        let norm = |t: &Option<Tensor>| t.as_ref().map(|t| super::load_norm(cfg, src, &t.name)).transpose();
        Ok(Attention {
            q_proj: load_matrix(cfg, src, &t.q_proj.name)?,
            k_proj: load_matrix(cfg, src, &t.k_proj.name)?,
            v_proj: load_matrix(cfg, src, &t.v_proj.name)?,
            o_proj: load_matrix(cfg, src, &t.o_proj.name)?,
            q_proj_bias: vector(&t.q_proj_bias)?,
            k_proj_bias: vector(&t.k_proj_bias)?,
            v_proj_bias: vector(&t.v_proj_bias)?,
            o_proj_bias: vector(&t.o_proj_bias)?,
            q_norm: norm(&t.q_norm)?,
            k_norm: norm(&t.k_norm)?,
            sinks: vector(&t.sinks)?,
            window: cfg.layer_window(layer),
            output_gate: cfg.add.attn_output_gate,
            parallel_decode_work: PARALLEL_DECODE_WORK,
        })
    }

    /// The query projection into `s.q`; with an output gate, the gate into
    /// `s.gate` (`torch.chunk(q_proj(h).view(heads, 2d), 2, dim=-1)`).
    fn project_query(&self, d: usize, x: &[f32], s: &mut AttnScratch) {
        if !self.output_gate {
            self.q_proj.matvec(x, &mut s.q);
            return;
        }
        self.q_proj.matvec(x, &mut s.qg);
        split_query_gate(d, &s.qg, &mut s.q, &mut s.gate);
    }

    /// One token at `pos`: writes its k, v into the cache rows of this layer
    /// (row `pos % rows`: a windowed layer's rows are a ring) and `out =
    /// o_proj(attn)` ([H]).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        cfg: &ModelConfig,
        rope: &Rope,
        x: &[f32],
        pos: usize,
        k_cache: &mut KvRows,
        v_cache: &mut KvRows,
        s: &mut AttnScratch,
        out: &mut [f32],
    ) -> Result<()> {
        let d = cfg.head_dim;
        self.project_query(d, x, s);
        self.k_proj.matvec(x, &mut s.k);
        self.v_proj.matvec(x, &mut s.v);
        self.finish_qkv(cfg, rope, pos, (&mut s.q, &mut s.k, &mut s.v), (&mut s.cos, &mut s.sin));
        let (first, rows) = self.store_kv(pos, &s.k, &s.v, k_cache, v_cache)?;
        let kv_heads = cfg.num_kv_heads;
        let group_width = d * cfg.num_heads / kv_heads;
        // Each KV head's query heads attend with their own scores, tile and
        // query columns.
        let each = (s.scores.len() / kv_heads, s.tile.len() / kv_heads, s.columns.len() / kv_heads);
        let (k_cache, v_cache) = (&*k_cache, &*v_cache);
        let attend = |kvh: usize, ((qs, o), ((scores, tile), columns)): HeadJob| {
            let buffers = (scores, tile, columns);
            self.attend_kv_head(cfg, kvh, &[(first, pos)], rows, qs, (k_cache, v_cache), buffers, o)
        };
        let heads = s.q.chunks_exact(group_width).zip(s.out.chunks_exact_mut(group_width));
        let buffers = s.scores.chunks_exact_mut(each.0).zip(s.tile.chunks_exact_mut(each.1));
        let buffers = buffers.zip(s.columns.chunks_exact_mut(each.2));
        // The KV heads are independent: past a long context they run on the
        // pool, with the same bits as one after another.
        if kv_heads > 1 && cfg.num_heads * d * (pos + 1 - first) >= self.parallel_decode_work {
            let heads = s.q.par_chunks_exact(group_width).zip(s.out.par_chunks_exact_mut(group_width));
            let buffers = s.scores.par_chunks_exact_mut(each.0).zip(s.tile.par_chunks_exact_mut(each.1));
            let buffers = buffers.zip(s.columns.par_chunks_exact_mut(each.2));
            heads.zip(buffers).enumerate().for_each(|(kvh, job)| attend(kvh, job));
        } else {
            heads.zip(buffers).enumerate().for_each(|(kvh, job)| attend(kvh, job));
        }
        self.gate_output(&mut s.out, &s.gate);
        self.o_proj.matvec(&s.out, out);
        if let Some(b) = &self.o_proj_bias {
            super::ops::add_in_place(out, b);
        }
        Ok(())
    }

    /// `forward` for the `n` tokens of a prefill chunk at positions
    /// `start..start + n` (`xs`, `outs`: `[n, H]`): the projections over
    /// every token at once (`QMatrix::matvec_many`), each token's keys and
    /// values written, every (token, head) pair's attention on its own
    /// (in parallel when there is enough of it), then the output
    /// projection over every token. Each step is `forward`'s for that
    /// token, so every output is bit-identical to it. A windowed layer
    /// whose ring would wrap inside the chunk (a later token's row
    /// overwriting one an earlier token reads) runs token at a time.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_chunk(
        &self,
        cfg: &ModelConfig,
        rope: &Rope,
        xs: &[f32],
        start: usize,
        (k_cache, v_cache): (&mut KvRows, &mut KvRows),
        s: &mut AttnScratch,
        c: &mut GqaChunk,
        outs: &mut [f32],
    ) -> Result<()> {
        let (h, d, qd, kvd) = (cfg.hidden_size, cfg.head_dim, cfg.q_dim(), cfg.kv_dim());
        let n = xs.len() / h;
        let rows = k_cache.rows();
        if self.window.is_some() && start + n > rows {
            for (i, (x, out)) in xs.chunks_exact(h).zip(outs.chunks_exact_mut(h)).enumerate() {
                self.forward(cfg, rope, x, start + i, k_cache, v_cache, s, out)?;
            }
            return Ok(());
        }
        let (q, k, v) = (&mut c.q[..n * qd], &mut c.k[..n * kvd], &mut c.v[..n * kvd]);
        let gate = &mut c.gate[..if self.output_gate { n * qd } else { 0 }];
        // q, k and v quantise the chunk's inputs once between them.
        if self.output_gate {
            let qg = &mut c.qg[..2 * n * qd];
            QMatrix::matvec_many_each(
                &mut [(&self.q_proj, &mut *qg), (&self.k_proj, &mut *k), (&self.v_proj, &mut *v)],
                xs,
            );
            for ((both, qt), gt) in qg.chunks_exact(2 * qd).zip(q.chunks_exact_mut(qd)).zip(gate.chunks_exact_mut(qd)) {
                split_query_gate(d, both, qt, gt);
            }
        } else {
            QMatrix::matvec_many_each(
                &mut [(&self.q_proj, &mut *q), (&self.k_proj, &mut *k), (&self.v_proj, &mut *v)],
                xs,
            );
        }
        let mut firsts = Vec::with_capacity(n);
        for (i, ((qt, kt), vt)) in
            q.chunks_exact_mut(qd).zip(k.chunks_exact_mut(kvd)).zip(v.chunks_exact_mut(kvd)).enumerate()
        {
            self.finish_qkv(cfg, rope, start + i, (qt, kt, vt), (&mut s.cos, &mut s.sin));
            firsts.push(self.store_kv(start + i, kt, vt, k_cache, v_cache)?.0);
        }
        let att = &mut c.out[..n * qd];
        let spans: Vec<(usize, usize)> = firsts.iter().enumerate().map(|(i, &f)| (f, start + i)).collect();
        let (group, kv_heads) = (cfg.num_heads / cfg.num_kv_heads, cfg.num_kv_heads);
        let per_block = tokens_per_block(group, start + n);
        let (q, kv) = (&*q, (&*k_cache, &*v_cache));
        // One block: `per_block` tokens' query heads, KV head by KV head.
        let block = |b: usize, out: &mut [f32], buf: &mut BlockScratch| {
            let spans = &spans[b * per_block..][..out.len() / qd];
            let nq = spans.len() * group;
            let (qs, os) = (&mut buf.queries[..nq * d], &mut buf.outputs[..nq * d]);
            for kvh in 0..kv_heads {
                let heads = kvh * group * d..(kvh + 1) * group * d;
                let tokens = q[b * per_block * qd..].chunks_exact(qd);
                for (gathered, qt) in qs.chunks_exact_mut(group * d).zip(tokens) {
                    gathered.copy_from_slice(&qt[heads.clone()]);
                }
                let buffers = (&mut buf.scores[..], &mut buf.tile[..], &mut buf.columns[..]);
                self.attend_kv_head(cfg, kvh, spans, rows, qs, kv, buffers, os);
                for (o, ot) in os.chunks_exact(group * d).zip(out.chunks_exact_mut(qd)) {
                    ot[heads.clone()].copy_from_slice(o);
                }
            }
        };
        let scratch = || BlockScratch::new(per_block * group, d, start + n);
        // Multiply-adds of the chunk's attention, about.
        let work = n * cfg.num_heads * d * (start + n);
        if work >= 1 << 20 {
            att.par_chunks_mut(per_block * qd).enumerate().for_each_init(scratch, |buf, (b, o)| block(b, o, buf));
        } else {
            let mut buf = scratch();
            for (b, o) in att.chunks_mut(per_block * qd).enumerate() {
                block(b, o, &mut buf);
            }
        }
        if self.output_gate {
            for (ot, gt) in att.chunks_exact_mut(qd).zip(gate.chunks_exact(qd)) {
                self.gate_output(ot, gt);
            }
        }
        self.o_proj.matvec_many(att, outs);
        if let Some(b) = &self.o_proj_bias {
            for out in outs.chunks_exact_mut(h) {
                super::ops::add_in_place(out, b);
            }
        }
        Ok(())
    }

    /// One token's projections made ready: biases, q/k norms, the QKV
    /// clip, then rotary embeddings at `pos`.
    fn finish_qkv(
        &self,
        cfg: &ModelConfig,
        rope: &Rope,
        pos: usize,
        (q, k, v): (&mut [f32], &mut [f32], &mut [f32]),
        (cos, sin): (&mut [f32], &mut [f32]),
    ) {
        let d = cfg.head_dim;
        for (buf, b) in [(&mut *q, &self.q_proj_bias), (&mut *k, &self.k_proj_bias), (&mut *v, &self.v_proj_bias)] {
            if let Some(b) = b {
                super::ops::add_in_place(buf, b);
            }
        }
        match cfg.qk_norm {
            QkNorm::None => {}
            QkNorm::PerHead => {
                // Qwen3: `self.q_norm(self.q_proj(h).view(hidden_shape))`, over head_dim.
                if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
                    q.chunks_exact_mut(d).for_each(|h| rms_norm_in_place(h, qn, cfg.rms_norm_eps));
                    k.chunks_exact_mut(d).for_each(|h| rms_norm_in_place(h, kn, cfg.rms_norm_eps));
                }
            }
            QkNorm::Full => {
                // OLMoE: `self.q_norm(self.q_proj(h))`, over the whole projection.
                if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
                    rms_norm_in_place(q, qn, cfg.rms_norm_eps);
                    rms_norm_in_place(k, kn, cfg.rms_norm_eps);
                }
            }
        }
        if let Some(c) = cfg.clip_qkv {
            for v in q.iter_mut().chain(k.iter_mut()).chain(v.iter_mut()) {
                *v = v.clamp(-c, c);
            }
        }
        rope.tables(pos, cos, sin);
        Rope::apply(q, d, cos, sin);
        Rope::apply(k, d, cos, sin);
    }

    /// Writes the token at `pos`'s k, v into its cache row and returns
    /// `(first, rows)`: the first position it attends and the layer's rows.
    fn store_kv(
        &self,
        pos: usize,
        k: &[f32],
        v: &[f32],
        k_cache: &mut KvRows,
        v_cache: &mut KvRows,
    ) -> Result<(usize, usize)> {
        let rows = k_cache.rows();
        if rows == 0 || (self.window.is_none() && pos >= rows) {
            return Err(Error::Runtime(format!("position {pos} is past the KV cache")));
        }
        k_cache.write_row(pos % rows, k);
        v_cache.write_row(pos % rows, v);
        // masking_utils: causal `kv <= q`, sliding `kv > q - window`.
        let first = match self.window {
            Some(w) => (pos + 1).saturating_sub(w),
            None => 0,
        };
        if pos + 1 - first > rows {
            return Err(Error::Runtime(format!(
                "layer window of {} keys exceeds its {rows} cache rows",
                pos + 1 - first
            )));
        }
        Ok((first, rows))
    }

    /// The query heads of KV head `kvh` for `spans.len()` tokens, token `i`
    /// attending the cached positions `spans[i].0..=spans[i].1` (ring rows
    /// `position % rows`): `qs` holds each token's `group` heads in turn
    /// (`[tokens][group][d]`), `out` receives their outputs in the same
    /// layout. The block's scores run over the union of the spans; each
    /// query's softmax covers its own span and its weights outside it are
    /// zero, which add exact zeros (`waste_kernels::attend`), so every
    /// output is the one its token computes alone. `scores`: at least
    /// `queries x union` floats; `columns`: at least `QueryColumns::len` of
    /// the queries. Keys and values are read `KEY_TILE` positions at a time
    /// (decoded into `tile` from a bf16 or q8 cache); both kernels give the
    /// same bits over consecutive runs of keys as over all of them at once.
    #[allow(clippy::too_many_arguments)]
    fn attend_kv_head(
        &self,
        cfg: &ModelConfig,
        kvh: usize,
        spans: &[(usize, usize)],
        rows: usize,
        qs: &[f32],
        (k_cache, v_cache): (&KvRows, &KvRows),
        (scores, tile, columns): (&mut [f32], &mut [f32], &mut [f32]),
        out: &mut [f32],
    ) {
        let d = cfg.head_dim;
        let head = kvh * d..(kvh + 1) * d;
        let group = cfg.num_heads / cfg.num_kv_heads; // repeat_kv: query head h reads kv head h / n_rep
        let scale = 1.0 / (d as f32).sqrt();
        let lo = spans.iter().map(|s| s.0).min().unwrap_or(0);
        let hi = spans.iter().map(|s| s.1).max().unwrap_or(0);
        let width = hi + 1 - lo;
        let scores = &mut scores[..qs.len() / d * width];
        let runs = key_tiles(&ring_segments(lo, width, rows));
        let queries = QueryColumns::new(qs, d, columns);
        for &(offset, len, row) in &runs {
            let (keys, stride) = k_cache.view(row, len, head.clone(), tile);
            attend::key_scores(&queries, (keys, stride, len), &mut scores[offset..], width);
        }
        for (u, row) in scores.chunks_exact_mut(width).enumerate() {
            let (first, pos) = spans[u / group];
            let (before, rest) = row.split_at_mut(first - lo);
            let (live, after) = rest.split_at_mut(pos + 1 - first);
            for sc in live.iter_mut() {
                *sc *= scale;
            }
            attend::softmax(live, self.sinks.as_ref().map(|sinks| sinks[kvh * group + u % group]));
            before.fill(0.0);
            after.fill(0.0);
        }
        out.fill(0.0);
        for &(offset, len, row) in &runs {
            let (values, stride) = v_cache.view(row, len, head.clone(), tile);
            attend::weighted_rows((&scores[offset..], width), (values, stride, len), d, out);
        }
    }

    /// Qwen3-Next: `attn_output = attn_output * torch.sigmoid(gate)`.
    fn gate_output(&self, out: &mut [f32], gate: &[f32]) {
        if self.output_gate {
            for (o, g) in out.iter_mut().zip(gate) {
                *o *= 1.0 / (1.0 + (-g).exp());
            }
        }
    }
}

/// Splits one token's gated q projection (`[heads * 2d]`, per head
/// `[query | gate]`) into its query and gate (`[heads * d]` each).
fn split_query_gate(d: usize, both: &[f32], q: &mut [f32], gate: &mut [f32]) {
    for (h, pair) in both.chunks_exact(2 * d).enumerate() {
        q[h * d..(h + 1) * d].copy_from_slice(&pair[..d]);
        gate[h * d..(h + 1) * d].copy_from_slice(&pair[d..]);
    }
}

/// A prefill chunk's buffers for a GQA layer, `[n, width]` each (empty for
/// a model without GQA layers).
pub struct GqaChunk {
    q: Vec<f32>,
    /// The gated q projection, `[n, heads * 2d]` (empty without a gate).
    qg: Vec<f32>,
    gate: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    out: Vec<f32>,
}

impl GqaChunk {
    pub fn new(cfg: &ModelConfig, n: usize) -> GqaChunk {
        let any = (0..cfg.num_layers).any(|l| cfg.attn_kind(l) == AttnKind::Gqa);
        let n = if any { n } else { 0 };
        let gated = if cfg.add.attn_output_gate { n * cfg.q_dim() } else { 0 };
        GqaChunk {
            q: vec![0.0; n * cfg.q_dim()],
            qg: vec![0.0; 2 * gated],
            gate: vec![0.0; gated],
            k: vec![0.0; n * cfg.kv_dim()],
            v: vec![0.0; n * cfg.kv_dim()],
            out: vec![0.0; n * cfg.q_dim()],
        }
    }

    /// Floats held, for the memory plan (`plan::scratch_bytes`).
    pub fn floats(&self) -> usize {
        [&self.q, &self.qg, &self.gate, &self.k, &self.v, &self.out].iter().map(|b| b.len()).sum()
    }
}

/// The cache rows of positions `lo..lo + width` in a ring of `rows`, as at
/// most two runs `(offset from lo, length, first row)`.
fn ring_segments(lo: usize, width: usize, rows: usize) -> Vec<(usize, usize, usize)> {
    let first = lo % rows;
    if first + width <= rows {
        vec![(0, width, first)]
    } else {
        vec![(0, rows - first, first), (rows - first, width - (rows - first), 0)]
    }
}

/// One KV head's share of a decode token's attention: its query heads and
/// their outputs, its scores, its tile and its query columns.
type HeadJob<'a> = ((&'a [f32], &'a mut [f32]), ((&'a mut [f32], &'a mut [f32]), &'a mut [f32]));

/// Multiply-adds of one decode token's attention (query heads x head dim
/// x attended keys) from which its KV heads run on the pool: about a
/// millisecond of work, well above the cost of handing them out.
const PARALLEL_DECODE_WORK: usize = 1 << 20;

/// `segments` (`ring_segments`) cut into runs of at most `KEY_TILE` rows,
/// in order.
fn key_tiles(segments: &[(usize, usize, usize)]) -> Vec<(usize, usize, usize)> {
    let runs = segments.iter().flat_map(|&(offset, len, row)| {
        (0..len).step_by(KEY_TILE).map(move |t| (offset + t, KEY_TILE.min(len - t), row + t))
    });
    runs.collect()
}

/// Queries per attention block, and the most floats of scores a block may
/// hold. A block reads its span's keys and values once, decoding a bf16 or
/// q8 cache's rows each time, so the more queries a block the fewer times
/// the cache is read: at 32 (four tokens of the peer model's eight query
/// heads per KV head) decoding was 5.4% of a 2048-token prefill, at 128
/// 1.7%. A block's scores against 1024 keys are then 512 KB, in L2.
/// Past 4096 keys the score cap sets the block instead: at 2 MB a
/// 16K-token prompt's blocks were four tokens and re-read the whole cache
/// every four tokens; at 8 MB they are sixteen, and the peer model's 16K
/// prefill ran 1.16x faster by medians (docs/PERFORMANCE.md), although the
/// scores then leave L2.
const BLOCK_QUERIES: usize = 128;
const BLOCK_SCORE_FLOATS: usize = 1 << 21;

/// Tokens per attention block of a prefill chunk whose last token attends
/// `keys` positions: as many as make `BLOCK_QUERIES` query heads of one KV
/// head, fewer where their scores would pass `BLOCK_SCORE_FLOATS`.
fn tokens_per_block(group: usize, keys: usize) -> usize {
    let by_queries = (BLOCK_QUERIES / group.max(1)).max(1);
    let by_memory = (BLOCK_SCORE_FLOATS / (group.max(1) * keys.max(1))).max(1);
    by_queries.min(by_memory)
}

/// The most bytes one worker's attention blocks hold while a prefill chunk
/// of more than one token runs on a model of `context` tokens: what
/// [`BlockScratch::new`] allocates for any chunk, 0 where no layer is GQA.
/// The memory plan counts it once per compute thread.
///
/// A block's queries are at most `BLOCK_QUERIES` rounded down to whole
/// tokens (one token's group where that is wider). Its scores are bounded
/// twice: by those queries against every key, and by `BLOCK_SCORE_FLOATS`
/// except where one token's group against `keys` passes it, when a block is
/// that one token.
pub fn prefill_block_bytes(cfg: &ModelConfig, context: usize) -> usize {
    if !(0..cfg.num_layers).any(|l| cfg.attn_kind(l) == AttnKind::Gqa) {
        return 0;
    }
    let (group, d, keys) = (cfg.num_heads / cfg.num_kv_heads.max(1), cfg.head_dim, context.max(1));
    let queries = tokens_per_block(group, 1) * group;
    let scores = (queries * keys).min(BLOCK_SCORE_FLOATS.max(group * keys));
    4 * (2 * queries * d + scores + KEY_TILE * d + QueryColumns::len(queries, d))
}

/// One worker's buffers for attention blocks of a prefill chunk.
struct BlockScratch {
    queries: Vec<f32>,
    outputs: Vec<f32>,
    scores: Vec<f32>,
    tile: Vec<f32>,
    columns: Vec<f32>,
}

impl BlockScratch {
    fn new(queries: usize, d: usize, keys: usize) -> BlockScratch {
        BlockScratch {
            queries: vec![0.0; queries * d],
            outputs: vec![0.0; queries * d],
            scores: vec![0.0; queries * keys],
            tile: vec![0.0; KEY_TILE * d],
            columns: vec![0.0; QueryColumns::len(queries, d)],
        }
    }

    #[cfg(test)]
    fn bytes(&self) -> usize {
        4 * [&self.queries, &self.outputs, &self.scores, &self.tile, &self.columns]
            .iter()
            .map(|b| b.len())
            .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::HfCheckpoint;
    use crate::kv::KvType;
    use std::path::Path;

    /// The plan once counted none of the prefill attention blocks' buffers
    /// (up to 8 MB of scores a worker): the bound it now counts holds every
    /// block any chunk allocates, and is reached, for groups narrower and
    /// wider than a block and keys either side of where the score cap bites.
    #[test]
    fn the_plans_block_bound_holds_every_prefill_attention_block() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-qwen3_moe");
        let base = HfCheckpoint::open(&dir).unwrap().config().clone();
        for (heads, kv_heads, d) in [(8, 1, 128), (64, 4, 128), (32, 32, 64), (256, 1, 64), (6, 2, 80)] {
            let cfg = ModelConfig { num_heads: heads, num_kv_heads: kv_heads, head_dim: d, ..base.clone() };
            let group = heads / kv_heads;
            let context = 9000;
            let bound = prefill_block_bytes(&cfg, context);
            let mut most = 0;
            for keys in (1..=context).step_by(97).chain([context]) {
                let block = BlockScratch::new(tokens_per_block(group, keys) * group, d, keys).bytes();
                assert!(block <= bound, "{heads}/{kv_heads} heads, {keys} keys: a block of {block} B passes {bound}");
                most = most.max(block);
            }
            assert!(most * 10 >= bound * 9, "{heads}/{kv_heads} heads: the bound {bound} B is far above {most}");
        }
        let mla = ModelConfig { attn_kinds: vec![AttnKind::Mla; base.num_layers], ..base };
        assert_eq!(prefill_block_bytes(&mla, 4096), 0);
    }

    /// Decode's KV heads run on the pool past a long context: the same bits
    /// as one after another, for every cache type and across key tiles.
    #[test]
    fn decode_kv_heads_in_parallel_are_bit_identical_to_one_after_another() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-qwen3_moe");
        let ckpt = HfCheckpoint::open(&dir).unwrap();
        let cfg = ckpt.config().clone();
        assert!(cfg.num_kv_heads > 1, "the fixture has one KV head: nothing to run in parallel");
        let mut attn = Attention::load(&cfg, &ckpt, 0, &GqaTensors::of(&cfg, 0)).unwrap();
        let rope = Rope::new(&cfg);
        let pool = crate::pool::Pool::new(Some(2), None).unwrap();
        let (n, h) = (KEY_TILE + 45, cfg.hidden_size);
        let xs: Vec<f32> = (0..n * h).map(|i| (i * 7919 % 997) as f32 / 997.0 - 0.5).collect();
        let run = |attn: &Attention, ty: KvType| -> Vec<f32> {
            let (mut k, mut v) = (KvRows::new(ty, n, cfg.kv_dim()), KvRows::new(ty, n, cfg.kv_dim()));
            let mut s = AttnScratch::new(&cfg, n);
            let mut outs = vec![0.0; n * h];
            for (pos, (x, out)) in xs.chunks_exact(h).zip(outs.chunks_exact_mut(h)).enumerate() {
                pool.install(|| attn.forward(&cfg, &rope, x, pos, &mut k, &mut v, &mut s, out)).unwrap().unwrap();
            }
            outs
        };
        for ty in KvType::ALL {
            attn.parallel_decode_work = usize::MAX;
            let serial = run(&attn, ty);
            attn.parallel_decode_work = 0;
            let parallel = run(&attn, ty);
            let same = serial.iter().zip(&parallel).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{ty}: decode over the pool differs from one KV head after another");
        }
    }
}
