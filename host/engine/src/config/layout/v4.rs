//! DeepSeek-V4's own tensors: the hyper-connection mixes, the attention
//! over a sliding window and compressed entries, the compressors and the
//! CSA indexer. Names are transformers' (deepseek_v4.rs maps the release's
//! onto them).

use super::Tensor;
use crate::config::{ModelConfig, V4Attn, V4Params};

/// One hyper-connection mix: a layer's `attn_hc` / `ffn_hc` (`fn`
/// `[(2 + n) n, n H]`, `base` `[(2 + n) n]`, `scale` `[3]`), or the head's
/// `model.hc_head.hc_*` (`[n, n H]`, `[n]`, `[1]`), n = `hc_mult`.
#[derive(Debug, Clone)]
pub struct HcTensors {
    pub fn_: Tensor,
    pub base: Tensor,
    pub scale: Tensor,
}

impl HcTensors {
    /// `p.attn_hc` or `p.ffn_hc` of a decoder layer.
    pub fn block(cfg: &ModelConfig, v4: &V4Params, p: &str) -> HcTensors {
        let (h, n) = (cfg.hidden_size, v4.hc_mult);
        let mix = (2 + n) * n;
        HcTensors {
            fn_: Tensor::at(p, "fn", vec![mix, n * h]),
            base: Tensor::at(p, "base", vec![mix]),
            scale: Tensor::at(p, "scale", vec![3]),
        }
    }

    /// `model.hc_head`, which collapses the streams before the final norm.
    pub fn head(cfg: &ModelConfig, v4: &V4Params) -> HcTensors {
        let (h, n) = (cfg.hidden_size, v4.hc_mult);
        let p = "model.hc_head";
        HcTensors {
            fn_: Tensor::at(p, "hc_fn", vec![n, n * h]),
            base: Tensor::at(p, "hc_base", vec![n]),
            scale: Tensor::at(p, "hc_scale", vec![1]),
        }
    }

    pub(super) fn list(&self) -> [&Tensor; 3] {
        [&self.fn_, &self.base, &self.scale]
    }
}

/// A compressor: `self_attn.compressor`, or the CSA indexer's own. With
/// `series` 2 (CSA) it carries two overlapping series of width `d`.
#[derive(Debug, Clone)]
pub struct CompressorTensors {
    pub kv_proj: Tensor,   // [series * d, H]
    pub gate_proj: Tensor, // [series * d, H]
    /// `[rate, series * d]`, read flat: `[rate * series * d]`.
    pub position_bias: Tensor,
    pub kv_norm: Tensor, // [d]
}

impl CompressorTensors {
    fn at(p: &str, h: usize, width: usize, series: usize, rate: usize) -> CompressorTensors {
        CompressorTensors {
            kv_proj: Tensor::at(p, "kv_proj.weight", vec![series * width, h]),
            gate_proj: Tensor::at(p, "gate_proj.weight", vec![series * width, h]),
            position_bias: Tensor::at(p, "position_bias", vec![rate * series * width]),
            kv_norm: Tensor::at(p, "kv_norm.weight", vec![width]),
        }
    }

    fn list(&self) -> [&Tensor; 4] {
        [&self.kv_proj, &self.gate_proj, &self.position_bias, &self.kv_norm]
    }
}

/// `self_attn.compressor.indexer` of a CSA layer.
#[derive(Debug, Clone)]
pub struct V4IndexerTensors {
    /// Its own two-series compressor of width `index_head_dim`.
    pub compressor: CompressorTensors,
    pub q_b_proj: Tensor, // [index_heads * index_head_dim, q_lora]
    /// `scorer.weights_proj`: `[index_heads, H]`.
    pub weights_proj: Tensor,
}

/// `model.layers.L.self_attn` of a DeepSeek-V4 layer.
#[derive(Debug, Clone)]
pub struct V4AttnTensors {
    pub q_a_proj: Tensor, // [q_lora, H]
    pub q_a_norm: Tensor, // [q_lora]
    pub q_b_proj: Tensor, // [heads * d, q_lora]
    pub kv_proj: Tensor,  // [d, H]: the one K=V head
    pub kv_norm: Tensor,  // [d]
    pub o_a_proj: Tensor, // [o_groups * o_lora, heads * d / o_groups]
    pub o_b_proj: Tensor, // [H, o_groups * o_lora]
    pub sinks: Tensor,    // [heads]
    /// CSA and HCA layers.
    pub compressor: Option<CompressorTensors>,
    /// CSA layers.
    pub indexer: Option<V4IndexerTensors>,
}

impl V4AttnTensors {
    pub fn of(cfg: &ModelConfig, v4: &V4Params, layer: usize) -> V4AttnTensors {
        let p = format!("model.layers.{layer}.self_attn");
        let t = |local: &str, shape: Vec<usize>| Tensor::at(&p, local, shape);
        let (h, d, nh, q) = (cfg.hidden_size, v4.head_dim, cfg.num_heads, v4.q_lora_rank);
        let kind = v4.layers[layer];
        let csa = kind == V4Attn::Csa;
        let rate = v4.rate(layer).unwrap_or(0);
        let c = format!("{p}.compressor");
        let ix = format!("{c}.indexer");
        let (di, ni) = (v4.index_head_dim, v4.index_heads);
        V4AttnTensors {
            q_a_proj: t("q_a_proj.weight", vec![q, h]),
            q_a_norm: t("q_a_norm.weight", vec![q]),
            q_b_proj: t("q_b_proj.weight", vec![nh * d, q]),
            kv_proj: t("kv_proj.weight", vec![d, h]),
            kv_norm: t("kv_norm.weight", vec![d]),
            o_a_proj: t("o_a_proj.weight", vec![v4.o_groups * v4.o_lora_rank, nh * d / v4.o_groups]),
            o_b_proj: t("o_b_proj.weight", vec![h, v4.o_groups * v4.o_lora_rank]),
            sinks: t("sinks", vec![nh]),
            compressor: (kind != V4Attn::Sliding)
                .then(|| CompressorTensors::at(&c, h, d, if csa { 2 } else { 1 }, rate)),
            indexer: csa.then(|| V4IndexerTensors {
                compressor: CompressorTensors::at(&ix, h, di, 2, rate),
                q_b_proj: Tensor::at(&ix, "q_b_proj.weight", vec![ni * di, q]),
                weights_proj: Tensor::at(&ix, "scorer.weights_proj.weight", vec![ni, h]),
            }),
        }
    }

    pub(super) fn list<'a>(&'a self, out: &mut Vec<&'a Tensor>) {
        out.extend([&self.q_a_proj, &self.q_a_norm, &self.q_b_proj, &self.kv_proj, &self.kv_norm]);
        out.extend([&self.o_a_proj, &self.o_b_proj, &self.sinks]);
        if let Some(c) = &self.compressor {
            out.extend(c.list());
        }
        if let Some(ix) = &self.indexer {
            out.extend(ix.compressor.list());
            out.extend([&ix.q_b_proj, &ix.weights_proj]);
        }
    }
}
