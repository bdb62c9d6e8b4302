//! Gated DeltaNet (Qwen3-Next, Qwen3.5), token at a time, as
//! `Qwen3NextGatedDeltaNet.forward` of transformers 5.24 computes it
//! (tests/fixtures/FAMILIES_MATH.md §5b, §6):
//!
//! 1. projections: the conv input `mixed = [q | k | v]` (all key heads' q,
//!    all key heads' k, all value heads' v), the output gate `z` `[nv, dv]`
//!    and `b`, `a` `[nv]`. Qwen3-Next fuses them as `in_proj_qkvz` and
//!    `in_proj_ba`, grouped per key head (`fix_query_key_value_ordering`);
//!    Qwen3.5 stores `in_proj_qkv` (already in conv order), `in_proj_z`,
//!    `in_proj_b`, `in_proj_a`;
//! 2. causal depthwise conv over `mixed`, then SiLU (shared with KDA);
//! 3. `beta = sigmoid(b)`, one log decay per value head
//!    `g = -exp(A_log) * softplus(a + dt_bias)`;
//! 4. the delta rule per value head h on key head `h / (nv / nk)`
//!    (`repeat_interleave`), shared with KDA;
//! 5. `o = w * rmsnorm(o) * silu(z)` per value head (a plain weight, not
//!    zero-centred like the model's other norms), then `out_proj`.
//!
//! The reference prefill runs the chunked form
//! (`torch_chunk_gated_delta_rule`); it is the same recurrence regrouped.

use crate::config::layout::{GdnProjections, GdnTensors, Tensor};
use crate::config::{GdnDims, ModelConfig};
use crate::error::{Error, Result};
use crate::quant::QMatrix;
use crate::source::TensorSource;

use super::delta::{conv_step, delta_step, DeltaState};
use super::ops::silu;
use super::{load_matrix, load_vector};

/// How the input projections are stored.
enum Projections {
    /// Qwen3-Next: `in_proj_qkvz` `[2Ck + 2Cv, H]`, `in_proj_ba` `[2nv, H]`,
    /// rows grouped per key head: `[q_g | k_g | v_g (r dv) | z_g (r dv)]`
    /// and `[b_g (r) | a_g (r)]`.
    Fused { in_proj_qkvz: QMatrix, in_proj_ba: QMatrix },
    /// Qwen3.5: `in_proj_qkv` `[2Ck + Cv, H]` in conv order, `in_proj_z`
    /// `[Cv, H]`, `in_proj_b` and `in_proj_a` `[nv, H]`.
    Separate { in_proj_qkv: QMatrix, in_proj_z: QMatrix, in_proj_b: QMatrix, in_proj_a: QMatrix },
}

/// `model.layers.L.linear_attn`.
pub struct Gdn {
    dims: GdnDims,
    projections: Projections,
    /// `conv1d.weight` `[C, 1, K]`, flattened to `[C, K]`.
    conv1d: Vec<f32>,
    /// `-exp(A_log)` per value head.
    neg_a: Vec<f32>,
    dt_bias: Vec<f32>, // [nv]
    norm: Vec<f32>,    // [dv], plain weight
    out_proj: QMatrix, // [H, Cv]
    eps: f32,
}

/// A GDN layer's per-token projections, `[n, width]` each: one token's in
/// decode (`GdnScratch::rows`), a prefill chunk's in `prefill`, where each
/// projection runs over the chunk's tokens per load of its weights
/// (`QMatrix::matvec_many`, bit-identical to a token alone).
pub struct GdnRows {
    fused: Vec<f32>, // [n, 2Ck + 2Cv] (Qwen3-Next's qkvz, as projected)
    ba: Vec<f32>,    // [n, 2nv]
    mixed: Vec<f32>, // [n, C] conv input
    z: Vec<f32>,     // [n, Cv]
    b: Vec<f32>,     // [n, nv]
    a: Vec<f32>,     // [n, nv]
    o: Vec<f32>,     // [n, Cv]
}

impl GdnRows {
    /// Room for `n` tokens; empty for a model without GDN layers.
    pub fn new(cfg: &ModelConfig, n: usize) -> GdnRows {
        let (fused, c, cv, nv) = match cfg.add.gdn {
            Some(d) => {
                let fused = if cfg.add.gdn_fused { 2 * d.key_dim() + 2 * d.value_dim() } else { 0 };
                (fused, d.conv_dim(), d.value_dim(), d.value_heads)
            }
            None => (0, 0, 0, 0),
        };
        GdnRows {
            fused: vec![0.0; n * fused],
            ba: vec![0.0; if fused > 0 { n * 2 * nv } else { 0 }],
            mixed: vec![0.0; n * c],
            z: vec![0.0; n * cv],
            b: vec![0.0; n * nv],
            a: vec![0.0; n * nv],
            o: vec![0.0; n * cv],
        }
    }

    /// Floats held, for the memory plan.
    pub fn floats(&self) -> usize {
        [&self.fused, &self.ba, &self.mixed, &self.z, &self.b, &self.a, &self.o].iter().map(|b| b.len()).sum()
    }
}

/// Per-call buffers of a GDN layer.
pub struct GdnScratch {
    /// One token's projections (decode).
    rows: GdnRows,
    steps: StepScratch,
}

/// One token's recurrence buffers.
struct StepScratch {
    qkv: Vec<f32>, // [C] after conv + SiLU
    g: Vec<f32>,   // [dk] one head's decay, repeated per key channel
    q: Vec<f32>,   // [dk] a key head's q, normalised per value head
    k: Vec<f32>,   // [dk]
    u: Vec<f32>,   // [dv]
}

impl GdnScratch {
    pub fn new(cfg: &ModelConfig) -> GdnScratch {
        let (c, dk, dv) = cfg.add.gdn.map_or((0, 0, 0), |d| (d.conv_dim(), d.key_head_dim, d.value_head_dim));
        GdnScratch {
            rows: GdnRows::new(cfg, 1),
            steps: StepScratch {
                qkv: vec![0.0; c],
                g: vec![0.0; dk],
                q: vec![0.0; dk],
                k: vec![0.0; dk],
                u: vec![0.0; dv],
            },
        }
    }

    /// Floats held, for the memory plan (`plan::scratch_bytes`).
    pub fn floats(&self) -> usize {
        let s = &self.steps;
        self.rows.floats() + [&s.qkv, &s.g, &s.q, &s.k, &s.u].iter().map(|b| b.len()).sum::<usize>()
    }
}

impl Gdn {
    pub fn load(cfg: &ModelConfig, src: &dyn TensorSource, t: &GdnTensors) -> Result<Gdn> {
        let Some(dims) = cfg.add.gdn else {
            return Err(Error::Runtime("Gated DeltaNet tensors in a config without a GDN shape".into()));
        };
        let m = |t: &Tensor| load_matrix(cfg, src, &t.name);
        let projections = match &t.projections {
            GdnProjections::Fused { in_proj_qkvz, in_proj_ba } => {
                Projections::Fused { in_proj_qkvz: m(in_proj_qkvz)?, in_proj_ba: m(in_proj_ba)? }
            }
            GdnProjections::Separate { in_proj_qkv, in_proj_z, in_proj_b, in_proj_a } => Projections::Separate {
                in_proj_qkv: m(in_proj_qkv)?,
                in_proj_z: m(in_proj_z)?,
                in_proj_b: m(in_proj_b)?,
                in_proj_a: m(in_proj_a)?,
            },
        };
        let neg_a = load_vector(cfg, src, &t.a_log.name)?.iter().map(|a| -a.exp()).collect();
        Ok(Gdn {
            dims,
            projections,
            conv1d: load_vector(cfg, src, &t.conv1d.name)?,
            neg_a,
            dt_bias: load_vector(cfg, src, &t.dt_bias.name)?,
            norm: load_vector(cfg, src, &t.norm.name)?,
            out_proj: m(&t.out_proj)?,
            eps: cfg.rms_norm_eps,
        })
    }

    /// `mixed`, `z`, `b`, `a` of each of the `n` tokens of `xs`.
    fn project(&self, xs: &[f32], n: usize, rows: &mut GdnRows) {
        let d = &self.dims;
        let (c, cv, nv) = (d.conv_dim(), d.value_dim(), d.value_heads);
        let (mixed, z) = (&mut rows.mixed[..n * c], &mut rows.z[..n * cv]);
        let (b, a) = (&mut rows.b[..n * nv], &mut rows.a[..n * nv]);
        match &self.projections {
            Projections::Separate { in_proj_qkv, in_proj_z, in_proj_b, in_proj_a } => {
                in_proj_qkv.matvec_many(xs, mixed);
                in_proj_z.matvec_many(xs, z);
                in_proj_b.matvec_many(xs, b);
                in_proj_a.matvec_many(xs, a);
            }
            Projections::Fused { in_proj_qkvz, in_proj_ba } => {
                let (fused, ba) = (&mut rows.fused[..n * in_proj_qkvz.rows()], &mut rows.ba[..n * 2 * nv]);
                in_proj_qkvz.matvec_many(xs, fused);
                in_proj_ba.matvec_many(xs, ba);
                let (dk, r) = (d.key_head_dim, d.value_heads / d.key_heads);
                let rv = r * d.value_head_dim;
                let (ck, block) = (d.key_dim(), 2 * dk + 2 * rv);
                let per_token = fused.chunks_exact(in_proj_qkvz.rows()).zip(ba.chunks_exact(2 * nv));
                let outs = mixed.chunks_exact_mut(c).zip(z.chunks_exact_mut(cv)).zip(b.chunks_exact_mut(nv));
                for (((fused, ba), ((mixed, z), b)), a) in per_token.zip(outs).zip(a.chunks_exact_mut(nv)) {
                    for (g, grp) in fused.chunks_exact(block).enumerate() {
                        mixed[g * dk..(g + 1) * dk].copy_from_slice(&grp[..dk]);
                        mixed[ck + g * dk..ck + (g + 1) * dk].copy_from_slice(&grp[dk..2 * dk]);
                        mixed[2 * ck + g * rv..2 * ck + (g + 1) * rv].copy_from_slice(&grp[2 * dk..2 * dk + rv]);
                        z[g * rv..(g + 1) * rv].copy_from_slice(&grp[2 * dk + rv..]);
                    }
                    for (g, grp) in ba.chunks_exact(2 * r).enumerate() {
                        b[g * r..(g + 1) * r].copy_from_slice(&grp[..r]);
                        a[g * r..(g + 1) * r].copy_from_slice(&grp[r..]);
                    }
                }
            }
        }
    }

    /// One token at `pos` (which selects the conv ring slot).
    pub fn forward(&self, x: &[f32], pos: usize, state: &mut DeltaState, s: &mut GdnScratch, out: &mut [f32]) {
        let GdnScratch { rows, steps } = s;
        self.forward_rows(x, pos, state, (rows, steps), out);
    }

    /// `forward` for the consecutive tokens of a prefill chunk, `xs`
    /// `[n, H]` from position `start` into `outs` `[n, H]`: the
    /// projections over every token at once, the convolution and the
    /// recurrence token by token in order, so each token's output is
    /// bit-identical to `forward`'s.
    pub fn forward_chunk(
        &self,
        xs: &[f32],
        start: usize,
        state: &mut DeltaState,
        s: &mut GdnScratch,
        rows: &mut GdnRows,
        outs: &mut [f32],
    ) {
        self.forward_rows(xs, start, state, (rows, &mut s.steps), outs);
    }

    fn forward_rows(
        &self,
        xs: &[f32],
        start: usize,
        state: &mut DeltaState,
        (rows, s): (&mut GdnRows, &mut StepScratch),
        outs: &mut [f32],
    ) {
        let d = self.dims;
        let n = xs.len() / self.out_proj.rows();
        self.project(xs, n, rows);
        let (dk, dv) = (d.key_head_dim, d.value_head_dim);
        let (c, cv, nv) = (d.conv_dim(), d.value_dim(), d.value_heads);
        let ck = d.key_dim();
        let o_all = &mut rows.o[..n * cv];
        for i in 0..n {
            let mixed = &rows.mixed[i * c..(i + 1) * c];
            conv_step(&self.conv1d, d.conv_kernel, &[mixed], &mut state.conv, start + i, &mut s.qkv);
            let (b, a, z) = (&rows.b[i * nv..(i + 1) * nv], &rows.a[i * nv..(i + 1) * nv], &rows.z[i * cv..]);
            let (q_all, rest) = s.qkv.split_at(ck);
            let (k_all, v_all) = rest.split_at(ck);
            for h in 0..nv {
                let beta = 1.0 / (1.0 + (-b[h]).exp());
                // `softplus(a + dt_bias)`, the identity above 20 (F.softplus's threshold).
                let zh = a[h] + self.dt_bias[h];
                let sp = if zh > 20.0 { zh } else { (1.0 + zh.exp()).ln() };
                s.g.fill(self.neg_a[h] * sp);
                let kh = d.key_head_of(h);
                s.q.copy_from_slice(&q_all[kh * dk..(kh + 1) * dk]);
                s.k.copy_from_slice(&k_all[kh * dk..(kh + 1) * dk]);
                let o = &mut o_all[i * cv + h * dv..i * cv + (h + 1) * dv];
                delta_step(
                    &mut s.q,
                    &mut s.k,
                    &v_all[h * dv..(h + 1) * dv],
                    &s.g,
                    beta,
                    &mut state.s[h * dk * dv..(h + 1) * dk * dv],
                    &mut s.u,
                    o,
                );
                // Qwen3NextRMSNormGated: `weight * (x * rsqrt(mean(x^2) + eps))`, then `* silu(gate)`.
                let ms = o.iter().map(|v| v * v).sum::<f32>() / dv as f32;
                let inv = 1.0 / (ms + self.eps).sqrt();
                for (j, ov) in o.iter_mut().enumerate() {
                    *ov = self.norm[j] * (*ov * inv) * silu(z[h * dv + j]);
                }
            }
        }
        self.out_proj.matvec_many(o_all, outs);
    }
}
