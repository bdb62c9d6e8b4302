//! The forward pass of the GQA + RoPE MoE families (Qwen3-MoE, OLMoE,
//! Mixtral), written against `TensorSource` (the trunk) and
//! `ExpertProvider` (the routed experts) so one code path serves the
//! unquantised oracle and converted containers.

pub mod attention;
pub mod moe;
pub mod ops;
pub mod source;

#[cfg(test)]
mod tests;

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::quant::QMatrix;
use crate::stats::StepStats;

use attention::{Attention, AttnScratch, Rope};
use moe::{Mlp, Router};
use ops::{add_in_place, rms_norm};
use source::{ExpertProvider, TensorSource};

/// A trunk matrix, its shape checked against the config.
pub(crate) fn load_matrix(
    cfg: &ModelConfig,
    src: &dyn TensorSource,
    name: &str,
) -> Result<QMatrix> {
    if !src.has(name) {
        return Err(Error::Runtime(format!(
            "weight `{name}` is missing from the model"
        )));
    }
    let m = src.matrix(name)?;
    if let Some(want) = cfg.trunk_tensor_shape(name) {
        if want != [m.rows(), m.cols()] {
            return Err(Error::Runtime(format!(
                "weight `{name}` has shape [{}, {}], the config implies {want:?}",
                m.rows(),
                m.cols()
            )));
        }
    }
    Ok(m)
}

pub(crate) fn load_vector(
    cfg: &ModelConfig,
    src: &dyn TensorSource,
    name: &str,
) -> Result<Vec<f32>> {
    if !src.has(name) {
        return Err(Error::Runtime(format!(
            "weight `{name}` is missing from the model"
        )));
    }
    let v = src.vector(name)?;
    if let Some(want) = cfg.trunk_tensor_shape(name) {
        if want != [v.len()] {
            return Err(Error::Runtime(format!(
                "weight `{name}` has length {}, the config implies {want:?}",
                v.len()
            )));
        }
    }
    Ok(v)
}

enum FeedForward {
    Dense(Mlp),
    /// The routed experts live in the `ExpertProvider`; only the router is trunk.
    Moe(Router),
}

/// `model.layers.L`.
struct DecoderLayer {
    input_layernorm: Vec<f32>, // [H]
    self_attn: Attention,
    post_attention_layernorm: Vec<f32>, // [H]
    mlp: FeedForward,
}

pub struct Model {
    cfg: ModelConfig,
    embed_tokens: QMatrix, // [V, H]
    layers: Vec<DecoderLayer>,
    norm: Vec<f32>, // [H]
    /// `None` when tied: the logits then come from `embed_tokens`.
    lm_head: Option<QMatrix>, // [V, H]
    rope: Rope,
}

/// The KV cache and position of one sequence.
pub struct State {
    /// Per layer `[context, kv_heads * head_dim]`.
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    kv_dim: usize,
    position: usize,
    context: usize,
}

impl State {
    pub fn new(cfg: &ModelConfig, context: usize) -> State {
        let kv_dim = cfg.kv_dim();
        let per_layer = context.saturating_mul(kv_dim);
        State {
            k: (0..cfg.num_layers).map(|_| vec![0.0; per_layer]).collect(),
            v: (0..cfg.num_layers).map(|_| vec![0.0; per_layer]).collect(),
            kv_dim,
            position: 0,
            context,
        }
    }

    pub fn position(&self) -> usize {
        self.position
    }

    pub fn context(&self) -> usize {
        self.context
    }

    /// Starts a new sequence; stale cache rows past the position are never read.
    pub fn reset(&mut self) {
        self.position = 0;
    }

    pub fn bytes(&self) -> usize {
        2 * self.k.len() * self.context * self.kv_dim * std::mem::size_of::<f32>()
    }
}

/// Buffers of one forward call, allocated once and reused by every layer.
struct Scratch {
    x: Vec<f32>,
    xn: Vec<f32>,
    y: Vec<f32>,
    attn: AttnScratch,
    gate: Vec<f32>,
    up: Vec<f32>,
    probs: Vec<f32>,
    picks: Vec<(usize, f32)>,
}

impl Model {
    pub fn load(cfg: &ModelConfig, src: &dyn TensorSource) -> Result<Model> {
        let embed_tokens = load_matrix(cfg, src, "model.embed_tokens.weight")?;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for l in 0..cfg.num_layers {
            let p = format!("model.layers.{l}");
            layers.push(DecoderLayer {
                input_layernorm: load_vector(cfg, src, &format!("{p}.input_layernorm.weight"))?,
                self_attn: Attention::load(cfg, src, l)?,
                post_attention_layernorm: load_vector(
                    cfg,
                    src,
                    &format!("{p}.post_attention_layernorm.weight"),
                )?,
                mlp: if cfg.is_moe_layer(l) {
                    FeedForward::Moe(Router::load(cfg, src, l)?)
                } else {
                    FeedForward::Dense(Mlp::load(cfg, src, l)?)
                },
            });
        }
        let norm = load_vector(cfg, src, "model.norm.weight")?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(load_matrix(cfg, src, "lm_head.weight")?)
        };
        Ok(Model {
            cfg: cfg.clone(),
            embed_tokens,
            layers,
            norm,
            lm_head,
            rope: Rope::new(cfg),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Appends `tokens` at `state.position()`; returns logits of the last
    /// token (`[V]`) or, with `all_positions`, of every token (`[T*V]`).
    /// On error the state's position is left where it was.
    pub fn forward(
        &self,
        state: &mut State,
        tokens: &[u32],
        experts: &dyn ExpertProvider,
        all_positions: bool,
        stats: &mut StepStats,
    ) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        if tokens.is_empty() {
            return Err(Error::Arg("forward needs at least one token".into()));
        }
        if state.k.len() != cfg.num_layers || state.kv_dim != cfg.kv_dim() {
            return Err(Error::Arg(
                "the state was created for a different model".into(),
            ));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= cfg.vocab_size) {
            return Err(Error::Arg(format!(
                "token id {bad} is outside the vocabulary of {}",
                cfg.vocab_size
            )));
        }
        let start = state.position;
        if start + tokens.len() > state.context {
            return Err(Error::Runtime(format!(
                "context full: {} tokens at position {start} exceed the context of {}",
                tokens.len(),
                state.context
            )));
        }
        let result = self.forward_tokens(state, tokens, experts, all_positions, stats);
        if result.is_err() {
            state.position = start;
        }
        result
    }

    fn forward_tokens(
        &self,
        state: &mut State,
        tokens: &[u32],
        experts: &dyn ExpertProvider,
        all_positions: bool,
        stats: &mut StepStats,
    ) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let h = cfg.hidden_size;
        let v = cfg.vocab_size;
        let mut s = Scratch {
            x: vec![0.0; h],
            xn: vec![0.0; h],
            y: vec![0.0; h],
            attn: AttnScratch::new(cfg, state.context),
            gate: vec![0.0; cfg.intermediate_size],
            up: vec![0.0; cfg.intermediate_size],
            probs: vec![0.0; cfg.num_experts],
            picks: Vec::with_capacity(cfg.top_k + 1),
        };
        let n_out = if all_positions { tokens.len() } else { 1 };
        let mut logits = vec![0.0f32; n_out * v];

        for (i, &tok) in tokens.iter().enumerate() {
            let pos = state.position;
            self.embed_tokens.row(tok as usize, &mut s.x);
            for (l, layer) in self.layers.iter().enumerate() {
                rms_norm(&s.x, &layer.input_layernorm, cfg.rms_norm_eps, &mut s.xn);
                layer.self_attn.forward(
                    cfg,
                    &self.rope,
                    &s.xn,
                    pos,
                    &mut state.k[l],
                    &mut state.v[l],
                    &mut s.attn,
                    &mut s.y,
                )?;
                add_in_place(&mut s.x, &s.y);

                rms_norm(
                    &s.x,
                    &layer.post_attention_layernorm,
                    cfg.rms_norm_eps,
                    &mut s.xn,
                );
                match &layer.mlp {
                    FeedForward::Dense(mlp) => mlp.forward(&s.xn, &mut s.gate, &mut s.up, &mut s.y),
                    FeedForward::Moe(router) => {
                        router.route(&s.xn, &mut s.probs, &mut s.picks);
                        experts.forward_experts(l, &s.xn, &s.picks, &mut s.y, stats)?;
                    }
                }
                add_in_place(&mut s.x, &s.y);
            }
            state.position = pos + 1;

            let last = i + 1 == tokens.len();
            if all_positions || last {
                let row = if all_positions { i } else { 0 };
                rms_norm(&s.x, &self.norm, cfg.rms_norm_eps, &mut s.xn);
                let head = self.lm_head.as_ref().unwrap_or(&self.embed_tokens);
                head.matvec(&s.xn, &mut logits[row * v..(row + 1) * v]);
            }
        }
        Ok(logits)
    }
}
