//! DeepSeek-V4 (`modeling_deepseek_v4.py`, transformers 5.24): its
//! attention with compressors and the lightning indexer (`attention`,
//! `compressor`), and the hyper-connections that replace the residual
//! (`hyper`). The MoE block is the common one with a `sqrtsoftplus` router,
//! hash layers and a clamped SwiGLU (model/moe.rs, config.rs).

pub mod attention;
pub mod compressor;
pub mod hyper;

use crate::config::{MlaRope, ModelConfig};

use super::rope::Rope;

/// The rotation V4 applies to the trailing `dim` channels of a vector:
/// the pair `(x[2i], x[2i+1])` turns by angle i in place
/// (`apply_rotary_pos_emb` with `rotate_half` on `x[..., 0::2]`,
/// `x[..., 1::2]` and `repeat_interleave(2)` of cos and sin).
pub struct V4Rope {
    rope: Rope,
    dim: usize,
}

/// Rotated pairs a head may have (half of `MAX_HEAD_DIM`).
const MAX_PAIRS: usize = 512;

impl V4Rope {
    pub fn new(cfg: &MlaRope) -> V4Rope {
        V4Rope { rope: Rope::new(cfg), dim: cfg.dim }
    }

    /// Rotates the last `dim` channels of `x` to position `pos`, or back
    /// from it (`inverse`: the conjugate, `-sin`).
    pub fn rotate(&self, x: &mut [f32], pos: usize, inverse: bool) {
        let half = (self.dim / 2).min(MAX_PAIRS);
        let (mut cos, mut sin) = ([0.0f32; MAX_PAIRS], [0.0f32; MAX_PAIRS]);
        self.rope.angles(pos, &mut cos[..half], &mut sin[..half]);
        let off = x.len() - 2 * half;
        for i in 0..half {
            let (c, s) = (cos[i], if inverse { -sin[i] } else { sin[i] });
            let (a, b) = (x[off + 2 * i], x[off + 2 * i + 1]);
            x[off + 2 * i] = a * c - b * s;
            x[off + 2 * i + 1] = b * c + a * s;
        }
    }
}

/// One V4 layer's state.
#[derive(Clone)]
pub struct V4State {
    /// The sliding window's K=V rows, a ring: position t in row
    /// `t % sliding_window`. `[sliding_window, head_dim]`.
    pub window: Vec<f32>,
    /// The compressors' open windows (compressor::OpenWindows lays it out).
    pub open: Vec<f32>,
    /// One row per compressed entry, `[main entry | indexer entry]`.
    pub entries: Vec<f32>,
    /// Source tokens per entry (0: a sliding-only layer).
    pub rate: usize,
}

impl V4State {
    pub fn new(cfg: &ModelConfig, layer: usize, context: usize) -> V4State {
        let Some(v) = &cfg.add.v4 else {
            return V4State { window: vec![], open: vec![], entries: vec![], rate: 0 };
        };
        let ring = v.sliding_window * v.head_dim;
        V4State {
            window: vec![0.0; ring],
            open: vec![0.0; v.fixed_floats(layer) - ring],
            entries: vec![0.0; cfg.state_rows(layer, context) * v.entry_floats(layer)],
            rate: v.rate(layer).unwrap_or(0),
        }
    }

    pub fn floats(&self) -> usize {
        self.window.len() + self.open.len() + self.entries.len()
    }
}
