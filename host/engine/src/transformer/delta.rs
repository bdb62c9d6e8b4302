//! What Kimi Delta Attention (`kda`) and Gated DeltaNet (`gdn`) share: the
//! recurrent state, the causal depthwise convolution over a ring of the
//! last `K - 1` inputs, and one head's step of the gated delta rule. KDA
//! decays each key channel by its own gate, GDN a whole head by one; both
//! go through `delta_step` with a per-channel decay (GDN's repeated).

use crate::config::{GdnDims, KdaDims};

use super::ops::{dot, silu};

/// The recurrent part of one linear-attention layer's state.
#[derive(Debug, Clone)]
pub struct DeltaState {
    /// `[heads, d_k, d_v]`: row i of a head is key channel i.
    pub s: Vec<f32>,
    /// Ring of the last `K - 1` conv inputs, `[K - 1, channels]`; the row of
    /// position t sits at slot `t % (K - 1)`. Zero before the first token,
    /// which is the reference's zero left padding.
    pub conv: Vec<f32>,
}

impl DeltaState {
    pub fn for_kda(d: &KdaDims) -> DeltaState {
        DeltaState {
            s: vec![0.0; d.num_heads * d.head_dim * d.head_dim],
            conv: vec![0.0; (d.conv_kernel - 1) * 3 * d.qkv_dim()],
        }
    }

    pub fn for_gdn(d: &GdnDims) -> DeltaState {
        DeltaState {
            s: vec![0.0; d.value_heads * d.key_head_dim * d.value_head_dim],
            conv: vec![0.0; (d.conv_kernel - 1) * d.conv_dim()],
        }
    }

    pub fn clear(&mut self) {
        self.s.fill(0.0);
        self.conv.fill(0.0);
    }

    pub fn floats(&self) -> usize {
        self.s.len() + self.conv.len()
    }
}

/// Causal depthwise conv then SiLU, one token at `pos`: channel `ch` has
/// kernel `weights[ch * K..(ch + 1) * K]`, whose tap j multiplies the input
/// at `pos - (K - 1) + j`, so the last tap takes the current input `raw`
/// (`causal_conv1d_update` with SiLU, no bias). `raw` is the token's input
/// channels in parts laid end to end (KDA's q, k and v projections);
/// `ring` holds the previous `K - 1` inputs and `raw` replaces the oldest.
pub fn conv_step(weights: &[f32], kernel: usize, raw: &[&[f32]], ring: &mut [f32], pos: usize, out: &mut [f32]) {
    let channels: usize = raw.iter().map(|part| part.len()).sum();
    let slots = kernel - 1;
    let inputs = raw.iter().flat_map(|part| part.iter());
    for (ch, &input) in inputs.enumerate() {
        let w = &weights[ch * kernel..(ch + 1) * kernel];
        let mut acc = w[kernel - 1] * input;
        for back in 1..kernel {
            if back <= pos {
                let slot = (pos - back) % slots;
                acc += w[kernel - 1 - back] * ring[slot * channels + ch];
            }
        }
        out[ch] = silu(acc);
    }
    let slot = pos % slots;
    let mut at = slot * channels;
    for part in raw {
        ring[at..at + part.len()].copy_from_slice(part);
        at += part.len();
    }
}

/// The reference `l2norm`: `x / sqrt(sum(x^2) + 1e-6)` (eps under the root).
fn l2norm(x: &mut [f32]) {
    let inv = 1.0 / (dot(x, x) + 1e-6).sqrt();
    x.iter_mut().for_each(|v| *v *= inv);
}

/// One head, one token of the gated delta rule. `q`, `k` are raw
/// (normalised here, then q scaled by `d_k^-1/2`), `g` the log decay per
/// key channel, `st` the `[d_k, d_v]` state: `S = diag(exp g) S`,
/// `u = S^T k`, `S += k (beta (v - u))^T`, `o = S^T q` (decay, write, then
/// the read of the updated state, as `torch_recurrent_gated_delta_rule`).
#[allow(clippy::too_many_arguments)]
pub fn delta_step(
    q: &mut [f32],
    k: &mut [f32],
    v: &[f32],
    g: &[f32],
    beta: f32,
    st: &mut [f32],
    u: &mut [f32],
    o: &mut [f32],
) {
    let dk = k.len();
    let dv = v.len();
    l2norm(q);
    l2norm(k);
    let scale = 1.0 / (dk as f32).sqrt();
    q.iter_mut().for_each(|x| *x *= scale);
    u[..dv].fill(0.0);
    for i in 0..dk {
        let decay = g[i].exp();
        let row = &mut st[i * dv..(i + 1) * dv];
        for (j, sv) in row.iter_mut().enumerate() {
            *sv *= decay;
            u[j] += *sv * k[i];
        }
    }
    for j in 0..dv {
        u[j] = (v[j] - u[j]) * beta;
    }
    o.fill(0.0);
    for i in 0..dk {
        let row = &mut st[i * dv..(i + 1) * dv];
        for (j, sv) in row.iter_mut().enumerate() {
            *sv += k[i] * u[j];
            o[j] += *sv * q[i];
        }
    }
}
