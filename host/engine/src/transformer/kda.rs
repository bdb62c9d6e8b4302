//! Kimi Delta Attention, token at a time, as
//! `KimiLinearDeltaAttention.forward` of transformers 5.24 computes it:
//!
//! 1. `q, k, v = W_q h, W_k h, W_v h`, each through a depthwise causal
//!    convolution over the current and the `K - 1` previous inputs, then SiLU;
//! 2. decay per channel `g = -exp(A_log[head]) * softplus(W_fb W_fa h + dt_bias)`
//!    (softplus is the identity above 20, as in `KimiLinearForgetGate`);
//! 3. `beta = sigmoid(W_b h)` per head;
//! 4. `q = q / sqrt(|q|^2 + 1e-6) * d^-1/2`, `k = k / sqrt(|k|^2 + 1e-6)`
//!    (the reference `l2norm`: eps added under the root, not clamped);
//! 5. delta rule on the decayed state: `S = diag(exp g) S`, `u = S^T k`,
//!    `S += k (beta (v - u))^T`, `o = S^T q`;
//! 6. `o = RMSNorm(o, o_norm) * sigmoid(W_gb W_ga h)` per head, then `W_o`.
//!
//! Kimi K3 (../shared/design/K3.md §6) bounds the decay,
//! `g = lb * sigmoid(exp(A_log) * (f + dt_bias))` with `lb = gate_lower_bound`,
//! and gates the output with a full-rank `g_proj`; its `A_log` is stored
//! padded beyond the head count.
//!
//! The reference prefill uses the chunked form (`chunk_kimi_delta_attention`);
//! it is the same recurrence regrouped, and the tests hold this one to both.

use crate::config::layout::{KdaGate, KdaTensors, Tensor};
use crate::config::{KdaDims, ModelConfig};
use crate::error::{Error, Result};
use crate::quant::QMatrix;
use crate::source::TensorSource;

use super::delta::{conv_step, delta_step, DeltaState};
use super::{load_matrix, load_vector};

/// `model.layers.L.self_attn` of a KDA layer.
pub struct Kda {
    dims: KdaDims,
    q_proj: QMatrix,
    k_proj: QMatrix,
    v_proj: QMatrix,
    /// q|k|v kernels, `[3C, K]` (`[C, 1, K]` each, flattened and stacked).
    conv: Vec<f32>,
    /// `-exp(A_log)` per head.
    neg_a: Vec<f32>,
    /// K3's `gate_lower_bound`: the bounded sigmoid decay.
    lower_bound: Option<f32>,
    dt_bias: Vec<f32>,
    f_a_proj: QMatrix,
    f_b_proj: QMatrix,
    b_proj: QMatrix,
    gate: OutputGate,
    o_norm: Vec<f32>,
    o_proj: QMatrix,
    eps: f32,
}

/// The output gate's projection.
enum OutputGate {
    /// Kimi-Linear: `g_b_proj(g_a_proj x)`, `[C, d]` after `[d, H]`.
    LowRank { g_a_proj: QMatrix, g_b_proj: QMatrix },
    /// K3 `use_full_rank_gate`: `g_proj` `[C, H]`.
    Full(QMatrix),
}

/// The first `heads` values of a stored `A_log`; K3's release pads it
/// (`[128]` for 96 heads) and the padding must be zero, or the file is not
/// what we think it is.
fn a_log_heads(name: &str, stored: Vec<f32>, heads: usize) -> Result<Vec<f32>> {
    if stored.len() < heads {
        return Err(Error::Runtime(format!("`{name}` has {} values for {heads} KDA heads", stored.len())));
    }
    if let Some(i) = stored[heads..].iter().position(|&v| v != 0.0) {
        return Err(Error::Runtime(format!(
            "`{name}` is stored with {} values for {heads} KDA heads and its padding is not zero (value {} at index {}); refusing to guess which values belong to the heads",
            stored.len(),
            stored[heads + i],
            heads + i
        )));
    }
    let mut v = stored;
    v.truncate(heads);
    Ok(v)
}

/// A KDA layer's per-token projections, `[n, width]` each: one token's in
/// decode (`KdaScratch::rows`), a prefill chunk's in `prefill`, where each
/// projection runs over the chunk's tokens per load of its weights
/// (`QMatrix::matvec_many`, bit-identical to a token alone).
pub struct KdaRows {
    q: Vec<f32>, // [n, C]
    k: Vec<f32>, // [n, C]
    v: Vec<f32>, // [n, C]
    /// `[n, d]`: f_a's outputs, then g_a's (low-rank gate only) once
    /// f_b has read them.
    low: Vec<f32>,
    g: Vec<f32>,    // [n, C]
    gate: Vec<f32>, // [n, C]
    beta: Vec<f32>, // [n, heads]
    o: Vec<f32>,    // [n, C]
}

impl KdaRows {
    /// Room for `n` tokens; empty for a model without KDA layers.
    pub fn new(cfg: &ModelConfig, n: usize) -> KdaRows {
        let (c, d, h) = cfg.kda.map_or((0, 0, 0), |k| (k.qkv_dim(), k.head_dim, k.num_heads));
        KdaRows {
            q: vec![0.0; n * c],
            k: vec![0.0; n * c],
            v: vec![0.0; n * c],
            low: vec![0.0; n * d],
            g: vec![0.0; n * c],
            gate: vec![0.0; n * c],
            beta: vec![0.0; n * h],
            o: vec![0.0; n * c],
        }
    }

    /// Floats held, for the memory plan.
    pub fn floats(&self) -> usize {
        [&self.q, &self.k, &self.v, &self.low, &self.g, &self.gate, &self.beta, &self.o].iter().map(|b| b.len()).sum()
    }
}

/// Per-call buffers of a KDA layer.
pub struct KdaScratch {
    /// One token's projections (decode).
    rows: KdaRows,
    steps: StepScratch,
}

/// One token's recurrence buffers.
struct StepScratch {
    qkv: Vec<f32>, // [3C] after conv + SiLU
    u: Vec<f32>,   // [d]
}

impl KdaScratch {
    pub fn new(cfg: &ModelConfig) -> KdaScratch {
        let (c, d) = cfg.kda.map_or((0, 0), |k| (k.qkv_dim(), k.head_dim));
        KdaScratch { rows: KdaRows::new(cfg, 1), steps: StepScratch { qkv: vec![0.0; 3 * c], u: vec![0.0; d] } }
    }

    /// Floats held, for the memory plan (`plan::scratch_bytes`).
    pub fn floats(&self) -> usize {
        self.rows.floats() + self.steps.qkv.len() + self.steps.u.len()
    }
}

impl Kda {
    pub fn load(cfg: &ModelConfig, src: &dyn TensorSource, layer: usize, t: &KdaTensors) -> Result<Kda> {
        let dims =
            cfg.kda.ok_or_else(|| Error::Runtime(format!("layer {layer} is KDA but the config has no KDA shape")))?;
        let m = |t: &Tensor| load_matrix(cfg, src, &t.name);
        let mut conv = Vec::with_capacity(3 * dims.qkv_dim() * dims.conv_kernel);
        for which in [&t.q_conv1d, &t.k_conv1d, &t.v_conv1d] {
            conv.extend(load_vector(cfg, src, &which.name)?);
        }
        let a_log = &t.a_log.name;
        let neg_a =
            a_log_heads(a_log, load_vector(cfg, src, a_log)?, dims.num_heads)?.iter().map(|a| -a.exp()).collect();
        let gate = match &t.gate {
            KdaGate::Full { g_proj } => OutputGate::Full(m(g_proj)?),
            KdaGate::LowRank { g_a_proj, g_b_proj } => {
                OutputGate::LowRank { g_a_proj: m(g_a_proj)?, g_b_proj: m(g_b_proj)? }
            }
        };
        Ok(Kda {
            dims,
            q_proj: m(&t.q_proj)?,
            k_proj: m(&t.k_proj)?,
            v_proj: m(&t.v_proj)?,
            conv,
            neg_a,
            lower_bound: cfg.k3.as_ref().and_then(|k| k.kda_gate_lower_bound),
            dt_bias: load_vector(cfg, src, &t.dt_bias.name)?,
            f_a_proj: m(&t.f_a_proj)?,
            f_b_proj: m(&t.f_b_proj)?,
            b_proj: m(&t.b_proj)?,
            gate,
            o_norm: load_vector(cfg, src, &t.o_norm.name)?,
            o_proj: m(&t.o_proj)?,
            eps: cfg.rms_norm_eps,
        })
    }

    /// One token at `pos` (which selects the conv ring slot).
    pub fn forward(&self, x: &[f32], pos: usize, state: &mut DeltaState, s: &mut KdaScratch, out: &mut [f32]) {
        let KdaScratch { rows, steps } = s;
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
        s: &mut KdaScratch,
        rows: &mut KdaRows,
        outs: &mut [f32],
    ) {
        self.forward_rows(xs, start, state, (rows, &mut s.steps), outs);
    }

    fn forward_rows(
        &self,
        xs: &[f32],
        start: usize,
        state: &mut DeltaState,
        (rows, s): (&mut KdaRows, &mut StepScratch),
        outs: &mut [f32],
    ) {
        let (c, d, heads) = (self.dims.qkv_dim(), self.dims.head_dim, self.dims.num_heads);
        let kk = self.dims.conv_kernel;
        let n = xs.len() / self.q_proj.cols();
        let (q, k, v) = (&mut rows.q[..n * c], &mut rows.k[..n * c], &mut rows.v[..n * c]);
        self.q_proj.matvec_many(xs, q);
        self.k_proj.matvec_many(xs, k);
        self.v_proj.matvec_many(xs, v);
        let (low, g) = (&mut rows.low[..n * d], &mut rows.g[..n * c]);
        self.f_a_proj.matvec_many(xs, low);
        self.f_b_proj.matvec_many(low, g);
        for gt in g.chunks_exact_mut(c) {
            match self.lower_bound {
                None => {
                    for (i, g) in gt.iter_mut().enumerate() {
                        let z = *g + self.dt_bias[i];
                        let sp = if z > 20.0 { z } else { (1.0 + z.exp()).ln() };
                        *g = self.neg_a[i / d] * sp;
                    }
                }
                Some(lb) => {
                    for (i, g) in gt.iter_mut().enumerate() {
                        let z = -self.neg_a[i / d] * (*g + self.dt_bias[i]);
                        *g = lb / (1.0 + (-z).exp());
                    }
                }
            }
        }
        let beta = &mut rows.beta[..n * heads];
        self.b_proj.matvec_many(xs, beta);
        for b in beta.iter_mut() {
            *b = 1.0 / (1.0 + (-*b).exp());
        }
        let gate = &mut rows.gate[..n * c];
        match &self.gate {
            OutputGate::LowRank { g_a_proj, g_b_proj } => {
                g_a_proj.matvec_many(xs, low);
                g_b_proj.matvec_many(low, gate);
            }
            OutputGate::Full(g_proj) => g_proj.matvec_many(xs, gate),
        }

        let o = &mut rows.o[..n * c];
        for i in 0..n {
            let t = i * c..(i + 1) * c;
            let raw: [&[f32]; 3] = [&q[t.clone()], &k[t.clone()], &v[t.clone()]];
            conv_step(&self.conv, kk, &raw, &mut state.conv, start + i, &mut s.qkv);
            let (q, rest) = s.qkv.split_at_mut(c);
            let (k, v) = rest.split_at_mut(c);
            let (g, gate, o) = (&g[t.clone()], &gate[t.clone()], &mut o[t]);
            for h in 0..heads {
                let r = h * d..(h + 1) * d;
                delta_step(
                    &mut q[r.clone()],
                    &mut k[r.clone()],
                    &v[r.clone()],
                    &g[r.clone()],
                    beta[i * heads + h],
                    &mut state.s[h * d * d..(h + 1) * d * d],
                    &mut s.u,
                    &mut o[r.clone()],
                );
                // KimiLinearRMSNormGated: weight * x / rms(x), times sigmoid(gate).
                let o = &mut o[r.clone()];
                let ms = o.iter().map(|v| v * v).sum::<f32>() / d as f32;
                let inv = 1.0 / (ms + self.eps).sqrt();
                for (j, ov) in o.iter_mut().enumerate() {
                    let gate = gate[h * d + j];
                    *ov = self.o_norm[j] * (*ov * inv) * (1.0 / (1.0 + (-gate).exp()));
                }
            }
        }
        self.o_proj.matvec_many(o, outs);
    }
}

#[cfg(test)]
mod tests {
    use crate::transformer::delta::delta_step;
    use safetensors::SafeTensors;

    /// The recurrence against transformers' `recurrent_kimi_delta_attention`
    /// and `chunk_kimi_delta_attention` (tests/gen_kimi_fixtures.py), outputs
    /// at every step and the final state.
    #[test]
    fn kda_recurrence_matches_reference_recurrent_and_chunked() {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/tiny-kimi_linear/kda_reference.safetensors");
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("fixture file missing: {}: {e}", path.display()));
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let get = |n: &str| -> (Vec<f32>, Vec<usize>) {
            let t = st.tensor(n).unwrap();
            let v = t.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            (v, t.shape().to_vec())
        };
        let (q, shape) = get("q");
        let (k, _) = get("k");
        let (v, _) = get("v");
        let (g, _) = get("g");
        let (beta, _) = get("beta");
        let (mut state, _) = get("initial_state");
        let [t_len, heads, d] = shape[..] else { panic!("q shape {shape:?}") };
        let mut out = vec![0.0f32; t_len * heads * d];
        let mut u = vec![0.0f32; d];
        for t in 0..t_len {
            for h in 0..heads {
                let r = (t * heads + h) * d..(t * heads + h + 1) * d;
                let (mut qh, mut kh) = (q[r.clone()].to_vec(), k[r.clone()].to_vec());
                delta_step(
                    &mut qh,
                    &mut kh,
                    &v[r.clone()],
                    &g[r.clone()],
                    beta[t * heads + h],
                    &mut state[h * d * d..(h + 1) * d * d],
                    &mut u,
                    &mut out[r],
                );
            }
        }
        for (o_name, s_name) in [("out_recurrent", "state_recurrent"), ("out_chunk", "state_chunk")] {
            let (want_o, _) = get(o_name);
            let (want_s, _) = get(s_name);
            let max_o = want_o.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let max_s = want_s.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let diff_o = out.iter().zip(&want_o).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            let diff_s = state.iter().zip(&want_s).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            println!("{o_name}: max |diff| {diff_o:e} (max {max_o}); {s_name}: {diff_s:e} (max {max_s})");
            assert!(diff_o <= 1e-5 * max_o.max(1.0), "{o_name}: {diff_o}");
            assert!(diff_s <= 1e-5 * max_s.max(1.0), "{s_name}: {diff_s}");
        }
    }
}
