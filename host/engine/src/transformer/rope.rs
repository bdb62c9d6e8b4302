//! Rotary embedding of the MLA rope parts (DeepSeek-V3 / Kimi-K2), with
//! YaRN frequency scaling, as `DeepseekV3RotaryEmbedding` and
//! `_compute_yarn_parameters` (transformers 5.24) compute it: the inverse
//! frequencies in f32, `cos/sin(inv_freq * pos) * attention_factor`.
//!
//! Layout: with `interleave` (DeepSeek's weights) the pair `(x[2i], x[2i+1])`
//! turns by angle i and the result is written de-interleaved, `[x'_even |
//! x'_odd]`, exactly as `apply_rotary_pos_emb_interleave`; otherwise the
//! pair is `(x[i], x[i + d/2])` (`rotate_half`). q and k go through the same
//! map, so their dot products match the reference's.

use crate::config::MlaRope;

#[derive(Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
    attention_factor: f32,
    interleave: bool,
}

impl Rope {
    pub fn new(cfg: &MlaRope) -> Rope {
        let dim = cfg.dim;
        let half = dim / 2;
        let base = cfg.theta;
        // `base ** (arange(0, dim, 2).float() / dim)` in f32.
        let pos_freqs: Vec<f32> = (0..half).map(|i| (base as f32).powf((2 * i) as f32 / dim as f32)).collect();
        let Some(y) = cfg.yarn else {
            return Rope {
                inv_freq: pos_freqs.iter().map(|p| 1.0 / p).collect(),
                attention_factor: 1.0,
                interleave: cfg.interleave,
            };
        };
        let correction_dim = |rot: f64| -> f64 {
            (dim as f64 * (y.original_max_position_embeddings as f64 / (rot * 2.0 * std::f64::consts::PI)).ln())
                / (2.0 * base.ln())
        };
        let (mut low, mut high) = (correction_dim(y.beta_fast), correction_dim(y.beta_slow));
        if y.truncate {
            low = low.floor();
            high = high.ceil();
        }
        let low = low.max(0.0);
        let mut high = high.min((dim - 1) as f64);
        if low == high {
            high += 0.001; // the reference's guard against a zero-width ramp
        }
        let (low, high) = (low as f32, high as f32);
        let factor = y.factor as f32;
        let inv_freq = pos_freqs
            .iter()
            .enumerate()
            .map(|(i, &p)| {
                let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                let extrapolation = 1.0 - ramp;
                let interp = 1.0 / (factor * p);
                let extra = 1.0 / p;
                interp * (1.0 - extrapolation) + extra * extrapolation
            })
            .collect();
        Rope { inv_freq, attention_factor: y.attention_factor as f32, interleave: cfg.interleave }
    }

    /// The same tables rotating the other pair layout: DeepSeek-V3.2's
    /// indexer shares MLA's cos/sin but pairs dims half-split.
    pub fn with_interleave(&self, interleave: bool) -> Rope {
        Rope { interleave, ..self.clone() }
    }

    /// The inverse frequencies (one per rotated pair).
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// `cos`, `sin` of every pair at `pos` (each of length dim / 2).
    pub fn angles(&self, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
        for ((c, s), &f) in cos.iter_mut().zip(sin.iter_mut()).zip(&self.inv_freq) {
            let a = f * pos as f32;
            *c = a.cos() * self.attention_factor;
            *s = a.sin() * self.attention_factor;
        }
    }

    /// Rotates `x` (length dim) in place with the tables of `angles`;
    /// `tmp`: scratch of length dim.
    pub fn apply(&self, x: &mut [f32], cos: &[f32], sin: &[f32], tmp: &mut [f32]) {
        let half = self.inv_freq.len();
        tmp.copy_from_slice(x);
        for i in 0..half {
            let (a, b) = if self.interleave { (tmp[2 * i], tmp[2 * i + 1]) } else { (tmp[i], tmp[i + half]) };
            x[i] = a * cos[i] - b * sin[i];
            x[i + half] = b * cos[i] + a * sin[i];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Rope;
    use crate::config::ModelConfig;
    use safetensors::SafeTensors;

    /// inv_freq, cos and sin against `DeepseekV3RotaryEmbedding` of the
    /// fixture (YaRN factor 4, tests/gen_deepseek_fixtures.py).
    #[test]
    fn yarn_tables_match_transformers() {
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-deepseek_v3");
        let bytes = std::fs::read(dir.join("mla_reference.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let get = |n: &str| -> Vec<f32> {
            st.tensor(n).unwrap().data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
        };
        let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
        let r = cfg.mla_rope.unwrap();
        assert!(r.yarn.is_some() && r.interleave);
        let rope = Rope::new(&r);
        let want = get("inv_freq");
        assert_eq!(rope.inv_freq().len(), want.len());
        for (a, b) in rope.inv_freq().iter().zip(&want) {
            assert!((a - b).abs() <= 1e-6 * b.abs(), "inv_freq {a} vs {b}");
        }
        let (cos_ref, sin_ref) = (get("cos"), get("sin"));
        let d = r.dim;
        let (mut c, mut s) = (vec![0.0; d / 2], vec![0.0; d / 2]);
        for pos in 0..cos_ref.len() / d {
            rope.angles(pos, &mut c, &mut s);
            for i in 0..d / 2 {
                // The reference table is cat(freqs, freqs).
                for (ours, theirs) in [(c[i], cos_ref[pos * d + i]), (s[i], sin_ref[pos * d + i])] {
                    assert!((ours - theirs).abs() < 1e-6, "pos {pos} pair {i}: {ours} vs {theirs}");
                }
            }
        }
        let scale = get("softmax_scale")[0];
        let ours = (r.softmax_scale_factor / (cfg.mla.unwrap().qk_head_dim() as f64).sqrt()) as f32;
        assert!((ours - scale).abs() < 1e-6 * scale, "softmax scale {ours} vs {scale}");
        assert!(r.softmax_scale_factor > 1.0, "the fixture's YaRN mscale must scale the softmax");
    }

    /// Layer 2 of the fixture (q-LoRA, YaRN RoPE, absorbed latent cache)
    /// against the reference module's expanded K/V at positions 0..T-1.
    #[test]
    fn deepseek_absorbed_mla_with_rope_equals_reference() {
        use crate::checkpoint::HfCheckpoint;
        use crate::transformer::mla::{Mla, MlaScratch};
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-deepseek_v3");
        let bytes = std::fs::read(dir.join("mla_reference.safetensors")).unwrap();
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
        let mut cache = crate::kv::KvRows::new(crate::kv::KvType::F32, t_len, cfg.mla.unwrap().cache_width());
        let mut s = MlaScratch::new(&cfg, t_len);
        let mut out = vec![0.0f32; h];
        let mut worst = 0.0f32;
        for t in 0..t_len {
            mla.forward(
                &x[t * h..(t + 1) * h],
                t,
                &mut cache,
                &mut s,
                &mut crate::transformer::dsa::Selection::default(),
                &mut out,
            )
            .unwrap();
            let w = &want[t * h..(t + 1) * h];
            let scale = w.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let diff = out.iter().zip(w).fold(0.0f32, |a, (p, q)| a.max((p - q).abs()));
            worst = worst.max(diff / scale);
        }
        println!("deepseek absorbed vs expanded: max relative diff {worst:e}");
        assert!(worst <= 1e-5, "DeepSeek MLA differs from the reference: {worst}");
    }
}
