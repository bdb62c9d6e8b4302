//! Grouped-query attention with rotary embeddings (the HF `rotate_half`
//! convention), optional q/k RMSNorms, biases and sliding window.

use crate::config::{ModelConfig, QkNorm};
use crate::error::{Error, Result};
use crate::quant::QMatrix;

use super::ops::{dot, rms_norm_in_place, softmax};
use super::{load_matrix, load_vector};
use crate::source::TensorSource;

/// Rotary tables: `inv_freq[i] = theta^(-2i/d)` for i < d/2.
pub struct Rope {
    inv_freq: Vec<f32>,
}

impl Rope {
    pub fn new(cfg: &ModelConfig) -> Rope {
        let d = cfg.head_dim;
        // compute_default_rope_parameters: `1.0 / (base ** (torch.arange(0, dim, 2,
        // dtype=torch.float) / dim))`, i.e. an f32 exponent and an f32 result.
        let inv_freq = (0..d / 2)
            .map(|i| {
                let e = (2 * i) as f32 / d as f32;
                (1.0 / cfg.rope_theta.powf(e as f64)) as f32
            })
            .collect();
        Rope { inv_freq }
    }

    /// cos/sin for one position, each `[d/2]` (the HF tables repeat them twice).
    pub fn tables(&self, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
        for ((f, c), s) in self.inv_freq.iter().zip(cos.iter_mut()).zip(sin.iter_mut()) {
            // `freqs = position_ids.float() * inv_freq` in f32, then cos/sin.
            let angle = (pos as f32 * f) as f64;
            *c = angle.cos() as f32;
            *s = angle.sin() as f32;
        }
    }

    /// `x * cos + rotate_half(x) * sin` on every head of `x`.
    pub fn apply(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
        let half = head_dim / 2;
        for head in x.chunks_exact_mut(head_dim) {
            let (a, b) = head.split_at_mut(half);
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
    q_proj: QMatrix, // [heads*d, H]
    k_proj: QMatrix, // [kv*d, H]
    v_proj: QMatrix, // [kv*d, H]
    o_proj: QMatrix, // [H, heads*d]
    q_proj_bias: Option<Vec<f32>>,
    k_proj_bias: Option<Vec<f32>>,
    v_proj_bias: Option<Vec<f32>>,
    o_proj_bias: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>, // [d] per head (Qwen3) or [heads*d] (OLMoE)
    k_norm: Option<Vec<f32>>, // [d] or [kv*d]
}

/// Per-call buffers of the attention block.
pub struct AttnScratch {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub out: Vec<f32>,
    pub scores: Vec<f32>,
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
}

impl AttnScratch {
    pub fn new(cfg: &ModelConfig, context: usize) -> AttnScratch {
        AttnScratch {
            q: vec![0.0; cfg.q_dim()],
            k: vec![0.0; cfg.kv_dim()],
            v: vec![0.0; cfg.kv_dim()],
            out: vec![0.0; cfg.q_dim()],
            scores: vec![0.0; context],
            cos: vec![0.0; cfg.head_dim / 2],
            sin: vec![0.0; cfg.head_dim / 2],
        }
    }

    /// Floats held, for the memory plan (`plan::scratch_bytes`).
    pub fn floats(&self) -> usize {
        [&self.q, &self.k, &self.v, &self.out, &self.scores, &self.cos, &self.sin].iter().map(|b| b.len()).sum()
    }
}

impl Attention {
    pub fn load(cfg: &ModelConfig, src: &dyn TensorSource, layer: usize) -> Result<Attention> {
        let p = format!("model.layers.{layer}.self_attn");
        let bias = |proj: &str| -> Result<Option<Vec<f32>>> {
            if cfg.attention_bias {
                Ok(Some(load_vector(cfg, src, &format!("{p}.{proj}.bias"))?))
            } else {
                Ok(None)
            }
        };
        let norm = |which: &str| -> Result<Option<Vec<f32>>> {
            match cfg.qk_norm {
                QkNorm::None => Ok(None),
                _ => Ok(Some(load_vector(cfg, src, &format!("{p}.{which}.weight"))?)),
            }
        };
        Ok(Attention {
            q_proj: load_matrix(cfg, src, &format!("{p}.q_proj.weight"))?,
            k_proj: load_matrix(cfg, src, &format!("{p}.k_proj.weight"))?,
            v_proj: load_matrix(cfg, src, &format!("{p}.v_proj.weight"))?,
            o_proj: load_matrix(cfg, src, &format!("{p}.o_proj.weight"))?,
            q_proj_bias: bias("q_proj")?,
            k_proj_bias: bias("k_proj")?,
            v_proj_bias: bias("v_proj")?,
            o_proj_bias: bias("o_proj")?,
            q_norm: norm("q_norm")?,
            k_norm: norm("k_norm")?,
        })
    }

    /// One token at `pos`: writes its k, v into the cache rows of this layer
    /// and `out = o_proj(attn)` ([H]).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        cfg: &ModelConfig,
        rope: &Rope,
        x: &[f32],
        pos: usize,
        k_cache: &mut [f32],
        v_cache: &mut [f32],
        s: &mut AttnScratch,
        out: &mut [f32],
    ) -> Result<()> {
        let d = cfg.head_dim;
        let kv_dim = cfg.kv_dim();
        self.q_proj.matvec(x, &mut s.q);
        self.k_proj.matvec(x, &mut s.k);
        self.v_proj.matvec(x, &mut s.v);
        for (buf, b) in [(&mut s.q, &self.q_proj_bias), (&mut s.k, &self.k_proj_bias), (&mut s.v, &self.v_proj_bias)] {
            if let Some(b) = b {
                super::ops::add_in_place(buf, b);
            }
        }
        match cfg.qk_norm {
            QkNorm::None => {}
            QkNorm::PerHead => {
                // Qwen3: `self.q_norm(self.q_proj(h).view(hidden_shape))`, over head_dim.
                if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
                    s.q.chunks_exact_mut(d).for_each(|h| rms_norm_in_place(h, qn, cfg.rms_norm_eps));
                    s.k.chunks_exact_mut(d).for_each(|h| rms_norm_in_place(h, kn, cfg.rms_norm_eps));
                }
            }
            QkNorm::Full => {
                // OLMoE: `self.q_norm(self.q_proj(h))`, over the whole projection.
                if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
                    rms_norm_in_place(&mut s.q, qn, cfg.rms_norm_eps);
                    rms_norm_in_place(&mut s.k, kn, cfg.rms_norm_eps);
                }
            }
        }
        if let Some(c) = cfg.clip_qkv {
            for v in s.q.iter_mut().chain(s.k.iter_mut()).chain(s.v.iter_mut()) {
                *v = v.clamp(-c, c);
            }
        }
        rope.tables(pos, &mut s.cos, &mut s.sin);
        Rope::apply(&mut s.q, d, &s.cos, &s.sin);
        Rope::apply(&mut s.k, d, &s.cos, &s.sin);

        let row = pos * kv_dim;
        let (Some(kc), Some(vc)) = (k_cache.get_mut(row..row + kv_dim), v_cache.get_mut(row..row + kv_dim)) else {
            return Err(Error::Runtime(format!("position {pos} is past the KV cache")));
        };
        kc.copy_from_slice(&s.k);
        vc.copy_from_slice(&s.v);

        // masking_utils: causal `kv <= q`, sliding `kv > q - window`.
        let first = match cfg.sliding_window {
            Some(w) => (pos + 1).saturating_sub(w),
            None => 0,
        };
        let group = cfg.num_heads / cfg.num_kv_heads;
        let scale = 1.0 / (d as f32).sqrt();
        let scores = &mut s.scores[..pos + 1 - first];
        for h in 0..cfg.num_heads {
            let q = &s.q[h * d..(h + 1) * d];
            let kvh = h / group; // repeat_kv: query head h reads kv head h / n_rep
            for (t, sc) in (first..=pos).zip(scores.iter_mut()) {
                let k = &k_cache[t * kv_dim + kvh * d..][..d];
                *sc = dot(q, k) * scale;
            }
            softmax(scores);
            let o = &mut s.out[h * d..(h + 1) * d];
            o.fill(0.0);
            for (t, &a) in (first..=pos).zip(scores.iter()) {
                let v = &v_cache[t * kv_dim + kvh * d..][..d];
                for (oi, vi) in o.iter_mut().zip(v) {
                    *oi += a * vi;
                }
            }
        }
        self.o_proj.matvec(&s.out, out);
        if let Some(b) = &self.o_proj_bias {
            super::ops::add_in_place(out, b);
        }
        Ok(())
    }
}
