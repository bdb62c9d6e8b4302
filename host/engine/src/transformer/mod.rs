//! The forward pass of the MoE families (GQA with RoPE: Qwen3-MoE, OLMoE,
//! Mixtral, Qwen2-MoE, GLM-4.5, MiniMax-M2, gpt-oss; MLA: DeepSeek-V3 /
//! Kimi-K2; KDA and MLA: Kimi-Linear, Kimi K3; Gated DeltaNet and gated
//! attention: Qwen3-Next, Qwen3.5), written against `TensorSource` (the trunk) and
//! `ExpertProvider` (the routed experts) so one code path serves the
//! unquantised oracle and converted containers.

pub mod attention;
pub mod attnres;
pub mod delta;
pub mod dsa;
pub mod embedding;
pub mod experts;
pub mod gdn;
pub mod kda;
pub mod mla;
pub mod moe;
pub mod ops;
pub mod prefill;
pub mod rope;
pub mod state_io;
mod step;
pub mod v4;

#[cfg(test)]
mod tests;

use crate::config::layout::{EdgeTensors, FfnTensors, LayerTensors, MixerTensors};
use crate::config::{AttnKind, ModelConfig};
use crate::error::{Error, Result};
use crate::kv::{KvRows, KvType};
use crate::quant::QMatrix;
use crate::stats::StepStats;

use crate::source::TensorSource;
use attention::{Attention, AttnScratch, Rope};
use delta::DeltaState;
use experts::ExpertProvider;
use gdn::{Gdn, GdnScratch};
use kda::{Kda, KdaScratch};
use mla::{Mla, MlaScratch};
use moe::{Mlp, Router};
use ops::{add_in_place, rms_norm};
use v4::attention::{V4Attention, V4Scratch};
use v4::hyper::{Coef, HcScratch, HyperConnection, HyperHead};
use v4::V4State;

/// A trunk matrix, its shape checked against the config.
pub(crate) fn load_matrix(cfg: &ModelConfig, src: &dyn TensorSource, name: &str) -> Result<QMatrix> {
    if !src.has(name) {
        return Err(Error::Runtime(format!("weight `{name}` is missing from the model")));
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

/// An RMSNorm weight as the forward pass applies it: `1 + w` for the
/// zero-centred norms of Qwen3-Next and Qwen3.5 (`output * (1.0 +
/// self.weight.float())`), else as stored.
pub(crate) fn load_norm(cfg: &ModelConfig, src: &dyn TensorSource, name: &str) -> Result<Vec<f32>> {
    let mut w = load_vector(cfg, src, name)?;
    if cfg.add.zero_centred_norms {
        w.iter_mut().for_each(|v| *v += 1.0);
    }
    Ok(w)
}

pub(crate) fn load_vector(cfg: &ModelConfig, src: &dyn TensorSource, name: &str) -> Result<Vec<f32>> {
    if !src.has(name) {
        return Err(Error::Runtime(format!("weight `{name}` is missing from the model")));
    }
    let v = src.vector(name)?;
    if let Some(want) = cfg.trunk_tensor_shape(name) {
        if want != [v.len()] {
            return Err(Error::Runtime(format!("weight `{name}` has length {}, the config implies {want:?}", v.len())));
        }
    }
    Ok(v)
}

enum FeedForward {
    Dense(Mlp),
    /// The routed experts live in the `ExpertProvider`; only the router is trunk.
    Moe(Router),
}

/// The token mixer of a layer (`self_attn`). One per layer, built once and
/// never moved on the hot path, so the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Mixer {
    Gqa(Attention),
    Mla(Mla),
    Kda(Kda),
    Gdn(Gdn),
    V4(V4Attention),
}

/// DeepSeek-V4's hyper-connections around a layer's two blocks.
struct LayerHc {
    attn_hc: HyperConnection,
    ffn_hc: HyperConnection,
}

/// `model.layers.L`.
struct DecoderLayer {
    input_layernorm: Vec<f32>, // [H]
    self_attn: Mixer,
    post_attention_layernorm: Vec<f32>, // [H]
    mlp: FeedForward,
    /// The MoE block's shared experts (Kimi), added to the routed output.
    shared_experts: Option<Mlp>,
    /// `shared_expert_gate.weight` `[1, H]` (Qwen2-MoE, Qwen3-Next): the
    /// shared output is scaled by `sigmoid(gate x)`.
    shared_expert_gate: Option<QMatrix>,
    /// Kimi K3's AttnRes mixes of this layer.
    attn_res: Option<attnres::LayerRes>,
    /// Kimi K3's latent projections around the routed experts.
    latent_moe: Option<moe::LatentMoe>,
    /// DeepSeek-V4's hyper-connections (the residual is `hc_mult` streams).
    hc: Option<LayerHc>,
}

impl DecoderLayer {
    /// Qwen2-MoE / Qwen3-Next: `F.sigmoid(self.shared_expert_gate(hidden_states)) * shared_expert_output`.
    fn gate_shared(&self, x: &[f32], shared_y: &mut [f32]) {
        if let Some(g) = &self.shared_expert_gate {
            let mut logit = [0.0f32];
            g.matvec(x, &mut logit);
            let gate = 1.0 / (1.0 + (-logit[0]).exp());
            shared_y.iter_mut().for_each(|v| *v *= gate);
        }
    }
}

/// The forward pass of one model: its resident trunk (the checkpoint's
/// tensor names as fields) and the code that runs it over a [`State`].
pub struct Transformer {
    cfg: ModelConfig,
    /// On disk when untied (one row read per token), else resident.
    embed_tokens: embedding::Embedding, // [V, H]
    layers: Vec<DecoderLayer>,
    norm: Vec<f32>, // [H]
    /// `None` when tied: the logits then come from `embed_tokens`.
    lm_head: Option<QMatrix>, // [V, H]
    rope: Rope,
    /// Kimi K3's output AttnRes mix, before `norm`.
    output_mix: Option<attnres::Mix>,
    /// DeepSeek-V4's final collapse of the streams, before `norm`.
    hc_head: Option<HyperHead>,
    /// Tokens per prefill chunk (1 = token at a time); see [`prefill`].
    prefill_chunk: usize,
    /// Where a plan sized the chunk's buffers (a model opened from a
    /// container): the larger chunk it allows a longer prompt on cache the
    /// experts lend (`prefill::chunk_for`).
    larger_chunk: Option<LargerChunk>,
}

/// `(context, (planned chunk, prompt tokens), lendable bytes)` -> the
/// larger chunk and its extra bytes (`plan::larger_chunk`), handed in by
/// whoever planned, so that the forward pass needs nothing of the planner.
pub type LargerChunk = Box<dyn Fn(usize, (usize, usize), u64) -> Option<(usize, u64)> + Send + Sync>;

/// The state one layer keeps for a sequence.
#[derive(Clone)]
pub enum LayerState {
    /// GQA: keys and values, `[rows, kv_heads * head_dim]` each in the
    /// state's [`KvType`], where rows is the context, or a sliding-window
    /// layer's window (a ring: position t in row `t % rows`).
    Kv { k: KvRows, v: KvRows },
    /// MLA: the absorbed cache, `[context, kv_lora + rope (+ index key)]`
    /// in the state's [`KvType`].
    Latent(KvRows),
    /// KDA: O(1) in the context.
    Kda(DeltaState),
    /// Gated DeltaNet: O(1) in the context.
    Gdn(DeltaState),
    /// DeepSeek-V4: the window ring, the open compressor windows, the
    /// compressed entries.
    V4(V4State),
}

/// The per-layer state (KV cache, latent cache, KDA state) and position of
/// one sequence. A clone is a snapshot (the server's prefix cache).
#[derive(Clone)]
pub struct State {
    layers: Vec<LayerState>,
    /// `kv_heads * head_dim` of the GQA layers.
    kv_dim: usize,
    kv: KvType,
    /// Per layer: (kind, floats per token, fixed floats), to refuse a state
    /// made for another model.
    shape: Vec<(AttnKind, usize, usize)>,
    position: usize,
    context: usize,
    /// A forward pass failed after a recurrent layer (KDA, GDN) had
    /// advanced its state, or a windowed layer had overwritten ring rows:
    /// neither can be rolled back, so the state must be reset.
    poisoned: bool,
}

fn state_shape(cfg: &ModelConfig) -> Vec<(AttnKind, usize, usize)> {
    (0..cfg.num_layers).map(|l| (cfg.attn_kind(l), cfg.state_floats_per_token(l), cfg.state_floats_fixed(l))).collect()
}

impl State {
    /// A state whose KV cache holds f32: exactly what the model computes
    /// (the oracle tests' state).
    pub fn new(cfg: &ModelConfig, context: usize) -> State {
        State::with_kv(cfg, context, KvType::F32)
    }

    /// A state whose GQA layers store keys and values, and MLA layers
    /// their latent rows, as `kv`.
    pub fn with_kv(cfg: &ModelConfig, context: usize, kv: KvType) -> State {
        let kv_dim = cfg.kv_dim();
        let layers = (0..cfg.num_layers)
            .map(|l| {
                let rows = cfg.state_rows(l, context);
                match (cfg.attn_kind(l), &cfg.kda, &cfg.add.gdn) {
                    (AttnKind::Gqa, _, _) => {
                        LayerState::Kv { k: KvRows::new(kv, rows, kv_dim), v: KvRows::new(kv, rows, kv_dim) }
                    }
                    (AttnKind::V4, _, _) => LayerState::V4(V4State::new(cfg, l, context)),
                    (AttnKind::Kda, Some(d), _) => LayerState::Kda(DeltaState::for_kda(d)),
                    (AttnKind::Gdn, _, Some(d)) => LayerState::Gdn(DeltaState::for_gdn(d)),
                    _ => LayerState::Latent(KvRows::new(kv, rows, cfg.state_floats_per_token(l))),
                }
            })
            .collect();
        State { layers, kv_dim, kv, shape: state_shape(cfg), position: 0, context, poisoned: false }
    }

    /// How the GQA layers store keys and values.
    pub fn kv_type(&self) -> KvType {
        self.kv
    }

    /// The per-layer states, in layer order.
    pub fn layers(&self) -> &[LayerState] {
        &self.layers
    }

    pub fn layers_mut(&mut self) -> &mut [LayerState] {
        &mut self.layers
    }

    pub fn position(&self) -> usize {
        self.position
    }

    pub fn context(&self) -> usize {
        self.context
    }

    /// Cuts the sequence back to its first `position` tokens. Only a state
    /// of full-context caches can be cut (rows past the position are never
    /// read and are written again); a recurrent (KDA, GDN) or windowed
    /// layer has no way back, which `rewindable` tells.
    pub fn rewind(&mut self, position: usize, rewindable: bool) -> Result<()> {
        if position > self.position {
            return Err(Error::Arg(format!("cannot rewind a state at {} to {position}", self.position)));
        }
        if position < self.position && !rewindable {
            return Err(Error::Arg("this model's state (recurrent or windowed layers) cannot be rewound".into()));
        }
        self.position = position;
        Ok(())
    }

    /// Starts a new sequence; stale cache rows past the position are never
    /// read (a windowed layer's ring included: its rows are written before
    /// they are read), recurrent (KDA, GDN) state is cleared.
    pub fn reset(&mut self) {
        self.position = 0;
        self.poisoned = false;
        for l in &mut self.layers {
            if let LayerState::Kda(d) | LayerState::Gdn(d) = l {
                d.clear();
            }
        }
    }

    pub fn bytes(&self) -> usize {
        let floats: usize = self
            .layers
            .iter()
            .map(|l| match l {
                LayerState::Kv { k, v } => k.words().len() + v.words().len(),
                LayerState::Latent(c) => c.words().len(),
                LayerState::Kda(d) | LayerState::Gdn(d) => d.floats(),
                LayerState::V4(st) => st.floats(),
            })
            .sum();
        floats * std::mem::size_of::<f32>()
    }
}

/// The token mixers' buffers.
struct MixerScratch {
    attn: AttnScratch,
    mla: MlaScratch,
    kda: KdaScratch,
    gdn: GdnScratch,
    v4: V4Scratch,
    hc: HcScratch,
}

/// Buffers of one forward call, allocated once and reused by every layer.
struct Scratch {
    x: Vec<f32>,
    xn: Vec<f32>,
    y: Vec<f32>,
    mix: MixerScratch,
    gate: Vec<f32>,
    up: Vec<f32>,
    probs: Vec<f32>,
    picks: Vec<(usize, f32)>,
    shared_gate: Vec<f32>,
    shared_up: Vec<f32>,
    shared_y: Vec<f32>,
    /// AttnRes: the mixed layer input and the token's block snapshots.
    mixed: Vec<f32>,
    bank: attnres::Bank,
    latent: moe::LatentScratch,
    /// DSA: the positions this token attends, for the layers after the
    /// indexer that chose them.
    selection: dsa::Selection,
    /// V4: the feed-forward hyper-connection's coefficients.
    coef: Coef,
}

impl Scratch {
    fn new(cfg: &ModelConfig, context: usize, attn_res: bool) -> Scratch {
        let h = cfg.hidden_size;
        Scratch {
            x: vec![0.0; cfg.residual_width()],
            xn: vec![0.0; h],
            y: vec![0.0; h],
            mix: MixerScratch {
                attn: AttnScratch::new(cfg, context),
                mla: MlaScratch::new(cfg, context),
                kda: KdaScratch::new(cfg),
                gdn: GdnScratch::new(cfg),
                v4: V4Scratch::new(cfg, context),
                hc: HcScratch::new(cfg),
            },
            gate: vec![0.0; cfg.intermediate_size],
            up: vec![0.0; cfg.intermediate_size],
            probs: vec![0.0; cfg.num_experts],
            picks: Vec::with_capacity(cfg.top_k + 1),
            shared_gate: vec![0.0; cfg.shared_intermediate_size],
            shared_up: vec![0.0; cfg.shared_intermediate_size],
            shared_y: vec![0.0; if cfg.shared_intermediate_size > 0 { h } else { 0 }],
            mixed: vec![0.0; if attn_res || cfg.add.v4.is_some() { h } else { 0 }],
            bank: attnres::Bank::new(cfg),
            latent: moe::LatentScratch::new(cfg),
            selection: dsa::Selection::for_config(cfg),
            coef: Coef::new(cfg.add.v4.as_ref().map_or(0, |v| v.hc_mult)),
        }
    }

    /// Floats held; a pick `(usize, f32)` counts as 16 bytes.
    fn floats(&self) -> usize {
        let m = &self.mix;
        [
            &self.x,
            &self.xn,
            &self.y,
            &self.gate,
            &self.up,
            &self.probs,
            &self.shared_gate,
            &self.shared_up,
            &self.shared_y,
            &self.mixed,
        ]
        .iter()
        .map(|b| b.len())
        .sum::<usize>()
            + m.attn.floats()
            + m.mla.floats()
            + m.kda.floats()
            + m.gdn.floats()
            + m.v4.floats()
            + m.hc.floats()
            + self.coef.floats()
            + self.picks.capacity() * std::mem::size_of::<(usize, f32)>() / 4
            + self.bank.floats()
            + self.latent.floats()
            + self.selection.floats()
    }
}

impl Transformer {
    pub fn load(cfg: &ModelConfig, src: &dyn TensorSource) -> Result<Transformer> {
        let embed_tokens = embedding::load(cfg, src)?;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for l in 0..cfg.num_layers {
            let t = LayerTensors::of(cfg, l);
            let moe = match &t.ffn {
                FfnTensors::Moe(m) => Some(m),
                FfnTensors::Dense(_) => None,
            };
            layers.push(DecoderLayer {
                input_layernorm: load_norm(cfg, src, &t.input_layernorm.name)?,
                self_attn: match (&t.mixer, cfg.attn_kind(l)) {
                    (MixerTensors::Gqa(g), _) => Mixer::Gqa(Attention::load(cfg, src, l, g)?),
                    (MixerTensors::Gdn(g), _) => Mixer::Gdn(Gdn::load(cfg, src, g)?),
                    (MixerTensors::Mla(m), _) => Mixer::Mla(Mla::load(cfg, src, l, m)?),
                    (MixerTensors::Kda(k), _) => Mixer::Kda(Kda::load(cfg, src, l, k)?),
                    (MixerTensors::V4(a), _) => match &cfg.add.v4 {
                        Some(v) => Mixer::V4(V4Attention::load(cfg, v, src, l, a)?),
                        None => return Err(Error::Runtime("a V4 layer in a config without V4 settings".into())),
                    },
                    (_, kind) => {
                        return Err(Error::Runtime(format!(
                            "layer {l} is {} but the config has no {} shape",
                            kind.name(),
                            kind.name()
                        )))
                    }
                },
                post_attention_layernorm: load_norm(cfg, src, &t.post_attention_layernorm.name)?,
                mlp: match &t.ffn {
                    FfnTensors::Moe(m) => FeedForward::Moe(Router::load(cfg, src, m)?),
                    FfnTensors::Dense(d) => FeedForward::Dense(Mlp::load(cfg, src, d)?),
                },
                shared_experts: match moe.and_then(|m| m.shared_experts.as_ref()) {
                    Some(s) => Some(Mlp::load(cfg, src, s)?),
                    None => None,
                },
                shared_expert_gate: match moe.and_then(|m| m.shared_expert_gate.as_ref()) {
                    Some(g) => Some(load_matrix(cfg, src, &g.name)?),
                    None => None,
                },
                attn_res: attnres::load_layer_res(cfg, src, l, t.attn_res.as_ref())?,
                latent_moe: match moe.and_then(|m| m.latent.as_ref()) {
                    Some(lt) => Some(moe::LatentMoe::load(cfg, src, lt)?),
                    None => None,
                },
                hc: match (&cfg.add.v4, &t.hyper) {
                    (Some(v), Some((attn_hc, ffn_hc))) => Some(LayerHc {
                        attn_hc: HyperConnection::load(cfg, v, src, attn_hc)?,
                        ffn_hc: HyperConnection::load(cfg, v, src, ffn_hc)?,
                    }),
                    _ => None,
                },
            });
        }
        let edges = EdgeTensors::of(cfg);
        let norm = load_norm(cfg, src, &edges.norm.name)?;
        let lm_head = match &edges.lm_head {
            Some(t) => Some(load_matrix(cfg, src, &t.name)?),
            None => None,
        };
        Ok(Transformer {
            cfg: cfg.clone(),
            embed_tokens,
            layers,
            norm,
            lm_head,
            rope: Rope::new(cfg),
            output_mix: attnres::load_output_mix(cfg, src, edges.output_attn_res.as_ref())?,
            hc_head: match (&cfg.add.v4, &edges.hc_head) {
                (Some(v), Some(t)) => Some(HyperHead::load(cfg, v, src, t)?),
                _ => None,
            },
            prefill_chunk: prefill::DEFAULT_PREFILL_CHUNK,
            larger_chunk: None,
        })
    }

    /// Tokens per prefill chunk, 1..=`MAX_PREFILL_CHUNK`; 1 runs a prompt
    /// token at a time. The logits do not depend on it, only how often
    /// experts are read.
    pub fn set_prefill_chunk(&mut self, tokens: usize) -> Result<()> {
        prefill::check_chunk(tokens)?;
        self.prefill_chunk = tokens;
        Ok(())
    }

    pub fn prefill_chunk(&self) -> usize {
        self.prefill_chunk
    }

    /// The plan's chunk and the larger chunks it allows a longer prompt
    /// in cache the experts lend (the bits do not depend on the chunk).
    pub fn set_prefill_plan(&mut self, tokens: usize, larger: LargerChunk) -> Result<()> {
        self.set_prefill_chunk(tokens)?;
        self.larger_chunk = Some(larger);
        Ok(())
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
        self.forward_spliced(state, tokens, Splice::default(), experts, all_positions, stats)
    }

    /// `forward` with the input rows of some tokens given instead of their
    /// embeddings (Kimi K3's image rows at its placeholder tokens).
    pub fn forward_spliced(
        &self,
        state: &mut State,
        tokens: &[u32],
        splice: Splice<'_>,
        experts: &dyn ExpertProvider,
        all_positions: bool,
        stats: &mut StepStats,
    ) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        if tokens.is_empty() {
            return Err(Error::Arg("forward needs at least one token".into()));
        }
        splice.check(tokens.len(), cfg.hidden_size)?;
        if state.shape != state_shape(cfg) || state.kv_dim != cfg.kv_dim() {
            return Err(Error::Arg("the state was created for a different model".into()));
        }
        if state.poisoned {
            return Err(Error::Runtime(
                "an earlier forward pass failed midway through a layer whose state cannot be rolled back (recurrent or sliding-window); reset the state".into(),
            ));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= cfg.vocab_size) {
            return Err(Error::Arg(format!("token id {bad} is outside the vocabulary of {}", cfg.vocab_size)));
        }
        let start = state.position;
        if start + tokens.len() > state.context {
            return Err(Error::ContextFull { tokens: tokens.len(), position: start, context: state.context });
        }
        let result = self.forward_tokens(state, tokens, splice, experts, all_positions, stats);
        if result.is_err() {
            state.position = start;
            state.poisoned = self.cfg.has_unrewindable_state();
        }
        result
    }

    /// The embedding row of `tok`, or the spliced row given for it, into
    /// the residual `x`: into each of V4's streams
    /// (`inputs_embeds.unsqueeze(2).expand(.., hc_mult, ..)`).
    fn embed(&self, tok: u32, spliced: Option<&[f32]>, x: &mut [f32], stats: &mut StepStats) -> Result<()> {
        let h = self.cfg.hidden_size;
        let (first, rest) = x.split_at_mut(h);
        match spliced {
            Some(row) => first.copy_from_slice(row),
            None => {
                self.embed_tokens.row(tok as usize, first)?;
                check_finite(first, || format!("the embedding row of token {tok}"), usize::MAX)?;
                if self.embed_tokens.resident().is_none() {
                    stats.embedding_rows_read += 1;
                }
            }
        }
        for stream in rest.chunks_exact_mut(h) {
            stream.copy_from_slice(first);
        }
        Ok(())
    }

    /// The logits of a token whose final hidden state is `x` (and AttnRes
    /// bank `bank`) into `out`.
    fn head_row(
        &self,
        bank: &attnres::Bank,
        x: &[f32],
        mixed: &mut [f32],
        xn: &mut [f32],
        hc: &mut HcScratch,
        out: &mut [f32],
    ) -> Result<()> {
        let cfg = &self.cfg;
        match (&self.output_mix, &self.hc_head) {
            (Some(m), _) => {
                m.apply(bank, x, mixed);
                rms_norm(mixed, &self.norm, cfg.rms_norm_eps, xn);
            }
            (None, Some(head)) => {
                head.apply(x, hc, mixed);
                rms_norm(mixed, &self.norm, cfg.rms_norm_eps, xn);
            }
            (None, None) => rms_norm(x, &self.norm, cfg.rms_norm_eps, xn),
        }
        // Tied embeddings are always resident (`embedding::load`).
        let head = match (&self.lm_head, self.embed_tokens.resident()) {
            (Some(h), _) | (None, Some(h)) => h,
            (None, None) => return Err(Error::Runtime("no LM head: tied embeddings are not resident".into())),
        };
        head.matvec(xn, out);
        Ok(())
    }

    /// Runs the routers of the MoE layers after `layer` (as many as the
    /// provider's `lookahead_layers`) on this layer's MoE input and asks for
    /// each one's top `n` to be read speculatively.
    #[allow(clippy::too_many_arguments)]
    fn lookahead(
        &self,
        layer: usize,
        x: &[f32],
        tok: u32,
        n: usize,
        probs: &mut [f32],
        spec: &mut Vec<(usize, f32)>,
        experts: &dyn ExpertProvider,
        stats: &mut StepStats,
    ) {
        let ahead = self.layers.iter().enumerate().skip(layer + 1).filter_map(|(l, d)| match &d.mlp {
            FeedForward::Moe(r) => Some((l, r)),
            _ => None,
        });
        for (depth, (l, router)) in ahead.take(experts.lookahead_layers()).enumerate() {
            router.predict(x, tok, probs, n, spec);
            let ids: Vec<usize> = spec.iter().map(|p| p.0).collect();
            experts.prefetch(l, &ids, depth + 1, stats);
        }
    }

    fn forward_tokens(
        &self,
        state: &mut State,
        tokens: &[u32],
        splice: Splice<'_>,
        experts: &dyn ExpertProvider,
        all_positions: bool,
        stats: &mut StepStats,
    ) -> Result<Vec<f32>> {
        if tokens.len() > 1 && self.prefill_chunk > 1 {
            return self.forward_chunked(state, tokens, splice, experts, all_positions, stats);
        }
        let cfg = &self.cfg;
        let v = cfg.vocab_size;
        let mut s = Scratch::new(cfg, state.context, self.output_mix.is_some());
        // Router lookahead runs in decode only: in prefill it moved bytes
        // that the next token's own routing reads anyway.
        let lookahead = if tokens.len() == 1 { experts.lookahead() } else { 0 };
        let mut spec = Vec::new();
        let n_out = if all_positions { tokens.len() } else { 1 };
        let mut logits = vec![0.0f32; n_out * v];

        for (i, &tok) in tokens.iter().enumerate() {
            let pos = state.position;
            self.embed(tok, splice.row(i, cfg.hidden_size), &mut s.x, stats)?;
            s.bank.clear();
            for (l, layer) in self.layers.iter().enumerate() {
                self.mixer_step(
                    l,
                    pos,
                    &mut state.layers[l],
                    &mut s.x,
                    &mut s.bank,
                    &mut s.selection,
                    &mut s.coef,
                    &mut s.mixed,
                    &mut s.xn,
                    &mut s.mix,
                    &mut s.y,
                )?;
                match &layer.mlp {
                    FeedForward::Dense(mlp) => mlp.forward(&s.xn, &mut s.gate, &mut s.up, &mut s.y),
                    FeedForward::Moe(router) => {
                        router.route(&s.xn, tok, &mut s.probs, &mut s.picks);
                        if lookahead > 0 {
                            self.lookahead(l, &s.xn, tok, lookahead, &mut s.probs, &mut spec, experts, stats);
                        }
                        match &layer.latent_moe {
                            Some(lat) => lat.forward(l, &s.xn, &s.picks, experts, &mut s.latent, &mut s.y, stats)?,
                            None => experts.forward_experts(l, &s.xn, &s.picks, &mut s.y, stats)?,
                        }
                    }
                }
                if let Some(shared) = &layer.shared_experts {
                    shared.forward(&s.xn, &mut s.shared_gate, &mut s.shared_up, &mut s.shared_y);
                    layer.gate_shared(&s.xn, &mut s.shared_y);
                    add_in_place(&mut s.y, &s.shared_y);
                }
                self.residual_add(l, &mut s.x, &s.y, &s.coef, &mut s.mix.hc);
                check_finite(&s.x, || format!("layer {l}"), pos)?;
            }
            state.position = pos + 1;

            let last = i + 1 == tokens.len();
            if all_positions || last {
                let row = if all_positions { i } else { 0 };
                self.head_row(
                    &s.bank,
                    &s.x,
                    &mut s.mixed,
                    &mut s.xn,
                    &mut s.mix.hc,
                    &mut logits[row * v..(row + 1) * v],
                )?;
                check_finite(&logits[row * v..(row + 1) * v], || "the LM head".into(), pos)?;
            }
        }
        Ok(logits)
    }
}

/// Input rows that replace the embeddings of some of a forward call's
/// tokens: Kimi K3's image rows at its placeholder tokens
/// (`vision::expand_placeholders` gives both).
#[derive(Debug, Clone, Copy, Default)]
pub struct Splice<'a> {
    /// Indices into the call's tokens, strictly ascending.
    pub at: &'a [usize],
    /// `[at.len(), hidden]`, in the order of `at`.
    pub rows: &'a [f32],
}

impl Splice<'_> {
    fn check(&self, tokens: usize, hidden: usize) -> Result<()> {
        if self.rows.len() != self.at.len() * hidden {
            return Err(Error::Arg(format!(
                "{} spliced values for {} rows of width {hidden}",
                self.rows.len(),
                self.at.len()
            )));
        }
        if self.at.windows(2).any(|w| w[0] >= w[1]) || self.at.last().is_some_and(|&i| i >= tokens) {
            return Err(Error::Arg(format!("spliced rows must go to ascending positions among the {tokens} tokens")));
        }
        check_finite(self.rows, || "a spliced input row".into(), usize::MAX)
    }

    fn row(&self, i: usize, hidden: usize) -> Option<&[f32]> {
        self.at.binary_search(&i).ok().map(|k| &self.rows[k * hidden..(k + 1) * hidden])
    }
}

/// A NaN or infinity stops the forward pass where it first appears: a
/// damaged weight (one flipped bit in a norm made every logit NaN) must be
/// an error naming its place, never a run that prints nothing and exits 0.
/// `pos` is usize::MAX where there is no position yet (the embedding).
pub(crate) fn check_finite(values: &[f32], place: impl Fn() -> String, pos: usize) -> Result<()> {
    if values.iter().all(|v| v.is_finite()) {
        return Ok(());
    }
    let at = if pos == usize::MAX { String::new() } else { format!(" at position {pos}") };
    Err(Error::Runtime(format!(
        "{} produced a NaN or infinity{at}: the model's weights are damaged (convert it again) or overflow",
        place()
    )))
}
