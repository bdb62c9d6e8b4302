//! Chunked prefill: a prompt runs in chunks of up to `prefill_chunk`
//! tokens (the memory plan picks thousands when the budget allows),
//! layer-major inside a chunk. For each layer the token mixer runs over the
//! chunk's tokens in order (each token's math and state update exactly as
//! token at a time), then the router routes every token and the expert
//! provider gets the whole chunk at once: a streaming store reads each
//! distinct expert once per chunk and runs it over all its tokens, each
//! weight row loaded once per tile of tokens. Every token mixer projects
//! every token of the chunk at once (then attends token by token in
//! order, GQA's tokens in blocks; KDA and Gated DeltaNet run their
//! recurrences in order; DeepSeek-V4 feeds its compressors and indexer
//! token by token); dense MLPs, shared experts and K3's latent
//! projections run over the chunk the same way (`QMatrix::matvec_many`).
//!
//! Nothing is mixed across tokens except through the layer state, which is
//! written in token order; every batched product is the row kernel of
//! token at a time, per token, and the expert provider's batch entry point
//! keeps each token's accumulation order: the logits are bit-identical to
//! the token-at-a-time path (tests/integration/prefill.rs). But for rvq3
//! and rvq2 experts: a chunk computes their rows as values
//! (`quant::rvq_dense`), token at a time walks decode's tables, the same
//! products summed in another order, so their logits agree within the
//! bound that test states, and are bit-identical across chunk sizes.

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::stats::StepStats;

use super::attention::GqaChunk;
use super::attnres::Bank;
use super::dsa::Selection;
use super::experts::ExpertProvider;
use super::gdn::GdnRows;
use super::kda::KdaRows;
use super::mla::MlaRows;
use super::ops::add_in_place;
use super::v4::attention::V4Rows;
use super::v4::hyper::Coef;
use super::{FeedForward, LayerState, Mixer, Scratch, Splice, State, Transformer};

/// Tokens per prefill chunk of a `Transformer` loaded without a memory plan
/// (oracles, tests); a model opened from a container uses the plan's.
pub const DEFAULT_PREFILL_CHUNK: usize = 64;

/// Tokens a token mixer projects at once inside a chunk: enough that each
/// weight row serves many tokens per load, few enough that the mixers'
/// per-token buffers stay small beside the chunk's own (the planner gives
/// a chunk's buffers a share of the budget, and a smaller chunk re-reads
/// experts). The bits do not depend on it: each token's products are its own.
pub const MIXER_TOKENS: usize = 256;

/// The largest chunk a caller may name; the memory plan counts the
/// buffers of the chunk in use (`plan::scratch_bytes`) and picks one when
/// the caller does not (`plan::choose_prefill_chunk`).
pub const MAX_PREFILL_CHUNK: usize = 8192;

/// A chunk size must be 1..=`MAX_PREFILL_CHUNK`.
pub fn check_chunk(tokens: usize) -> Result<()> {
    if (1..=MAX_PREFILL_CHUNK).contains(&tokens) {
        Ok(())
    } else {
        Err(Error::Arg(format!("prefill chunk of {tokens} tokens: expected 1 to {MAX_PREFILL_CHUNK}")))
    }
}

/// The per-token buffers of a chunk, `[n, width]` each.
struct Chunk {
    x: Vec<f32>,
    xn: Vec<f32>,
    y: Vec<f32>,
    /// AttnRes mixes (empty without AttnRes).
    mixed: Vec<f32>,
    banks: Vec<Bank>,
    /// DSA: each token's attended positions, across the layers.
    selections: Vec<Selection>,
    /// V4: each token's feed-forward hyper-connection coefficients.
    coefs: Vec<Coef>,
    picks: Vec<Vec<(usize, f32)>>,
    /// K3's latent MoE: the latent input and output of each token.
    z: Vec<f32>,
    zy: Vec<f32>,
    /// A dense MLP's or the shared experts' gate and up products, `[n, I]`
    /// (I the larger of the two), and the shared experts' output `[n, H]`.
    gate: Vec<f32>,
    up: Vec<f32>,
    shared_y: Vec<f32>,
    /// A GQA layer's projections and attention outputs.
    gqa: GqaChunk,
    /// An MLA layer's projections and attention outputs.
    mla: MlaRows,
    /// A KDA or Gated DeltaNet layer's projections and outputs.
    kda: KdaRows,
    gdn: GdnRows,
    /// A DeepSeek-V4 layer's projections.
    v4: V4Rows,
}

impl Chunk {
    fn new(cfg: &ModelConfig, n: usize, attn_res: bool) -> Chunk {
        let h = cfg.hidden_size;
        let latent = cfg.k3.and_then(|k| k.latent).unwrap_or(0);
        let streams = cfg.add.v4.as_ref().map_or(0, |v| v.hc_mult);
        // Only a model with dense layers runs its dense MLP's products.
        let dense = (0..cfg.num_layers).any(|l| !cfg.is_moe_layer(l));
        let products = if dense { cfg.intermediate_size } else { 0 }.max(cfg.shared_intermediate_size);
        Chunk {
            x: vec![0.0; n * cfg.residual_width()],
            xn: vec![0.0; n * h],
            y: vec![0.0; n * h],
            mixed: vec![0.0; if attn_res || streams > 0 { n * h } else { 0 }],
            banks: (0..n).map(|_| Bank::new(cfg)).collect(),
            selections: (0..n).map(|_| Selection::for_config(cfg)).collect(),
            coefs: (0..n).map(|_| Coef::new(streams)).collect(),
            picks: (0..n).map(|_| Vec::with_capacity(cfg.top_k + 1)).collect(),
            z: vec![0.0; n * latent],
            zy: vec![0.0; n * latent],
            gate: vec![0.0; n * products],
            up: vec![0.0; n * products],
            shared_y: vec![0.0; if cfg.shared_intermediate_size > 0 { n * h } else { 0 }],
            gqa: GqaChunk::new(cfg, n.min(MIXER_TOKENS)),
            mla: MlaRows::new(cfg, n.min(MIXER_TOKENS)),
            kda: KdaRows::new(cfg, n.min(MIXER_TOKENS)),
            gdn: GdnRows::new(cfg, n.min(MIXER_TOKENS)),
            v4: V4Rows::new(cfg, n.min(MIXER_TOKENS)),
        }
    }

    /// Floats held; a pick `(usize, f32)` counts as 16 bytes.
    fn floats(&self) -> usize {
        let pick = std::mem::size_of::<(usize, f32)>() / 4;
        [&self.x, &self.xn, &self.y, &self.mixed, &self.z, &self.zy, &self.gate, &self.up, &self.shared_y]
            .iter()
            .map(|b| b.len())
            .sum::<usize>()
            + self.banks.iter().map(Bank::floats).sum::<usize>()
            + self.selections.iter().map(Selection::floats).sum::<usize>()
            + self.coefs.iter().map(Coef::floats).sum::<usize>()
            + self.picks.iter().map(|p| p.capacity() * pick).sum::<usize>()
            + self.gqa.floats()
            + self.mla.floats()
            + self.kda.floats()
            + self.gdn.floats()
            + self.v4.floats()
    }
}

/// The floats of the buffers the model itself allocates for one forward
/// call over `tokens` tokens (decode: 1) with `context` tokens of state and
/// logits for the last position: the token scratch, the mixers' scratch,
/// a prefill chunk's per-token buffers (more than one token), the logits.
/// Built from the very constructors the forward pass uses, so the memory
/// plan (`plan::scratch_bytes`) cannot drift from them. The expert
/// provider's own buffers are not included.
pub fn forward_buffer_floats(cfg: &ModelConfig, context: usize, tokens: usize) -> usize {
    let attn_res = cfg.k3.and_then(|k| k.attn_res_block).is_some();
    let chunk = if tokens > 1 { Chunk::new(cfg, tokens.min(MAX_PREFILL_CHUNK), attn_res).floats() } else { 0 };
    Scratch::new(cfg, context, attn_res).floats() + chunk + cfg.vocab_size
}

impl Transformer {
    /// `forward_tokens` for a prompt of more than one token, in chunks.
    pub(super) fn forward_chunked(
        &self,
        state: &mut State,
        tokens: &[u32],
        splice: Splice<'_>,
        experts: &dyn ExpertProvider,
        all_positions: bool,
        stats: &mut StepStats,
    ) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let (rw, v) = (cfg.residual_width(), cfg.vocab_size);
        let (size, _loan) = self.chunk_for(tokens.len(), state.context, experts);
        stats.prefill_chunk = stats.prefill_chunk.max(size);
        let mut s = Scratch::new(cfg, state.context, self.output_mix.is_some());
        let mut c = Chunk::new(cfg, size, self.output_mix.is_some());
        let n_out = if all_positions { tokens.len() } else { 1 };
        let mut logits = vec![0.0f32; n_out * v];
        for (ci, toks) in tokens.chunks(size).enumerate() {
            self.forward_chunk(state, toks, (splice, ci * size), experts, &mut s, &mut c, stats)?;
            for i in 0..toks.len() {
                let g = ci * size + i;
                if all_positions || g + 1 == tokens.len() {
                    let row = if all_positions { g } else { 0 };
                    self.head_row(
                        &c.banks[i],
                        &c.x[i * rw..(i + 1) * rw],
                        &mut s.mixed,
                        &mut s.xn,
                        &mut s.mix.hc,
                        &mut logits[row * v..(row + 1) * v],
                    )?;
                    super::check_finite(&logits[row * v..(row + 1) * v], || "the LM head".into(), g)?;
                }
            }
        }
        Ok(logits)
    }

    /// The chunk a prompt of `tokens` runs in, and the cache lent for it:
    /// the plan's chunk, or, for a longer prompt where the experts lend
    /// cache (they cannot all be cached, so every chunk re-reads most of
    /// them), the larger chunk the plan allows in what they lend
    /// (`plan::larger_chunk`, through `Transformer::larger_chunk`). The
    /// budget holds: the lent slots' pages leave the process before the
    /// larger buffers are made. The bits do not depend on the chunk.
    fn chunk_for<'a>(
        &self,
        tokens: usize,
        context: usize,
        experts: &'a dyn ExpertProvider,
    ) -> (usize, super::experts::CacheLoan<'a>) {
        let planned = self.prefill_chunk.clamp(1, tokens);
        let none = super::experts::CacheLoan::none;
        let Some(larger) = self.larger_chunk.as_ref().filter(|_| tokens > planned) else { return (planned, none()) };
        let lendable = experts.lendable_cache();
        if lendable == 0 {
            return (planned, none());
        }
        let Some((chunk, extra)) = larger(context, (planned, tokens), lendable) else { return (planned, none()) };
        let loan = experts.lend_cache(extra);
        if loan.bytes() >= extra {
            (chunk, loan)
        } else {
            (planned, none())
        }
    }

    /// Runs `toks` through every layer and advances the state past them;
    /// each token's final hidden state is left in `c.x`. `splice` indexes
    /// the whole call's tokens, of which `toks` start at `first`.
    #[allow(clippy::too_many_arguments)]
    fn forward_chunk(
        &self,
        state: &mut State,
        toks: &[u32],
        (splice, first): (Splice<'_>, usize),
        experts: &dyn ExpertProvider,
        s: &mut Scratch,
        c: &mut Chunk,
        stats: &mut StepStats,
    ) -> Result<()> {
        let (h, rw) = (self.cfg.hidden_size, self.cfg.residual_width());
        let n = toks.len();
        let start = state.position;
        let Chunk {
            x,
            xn,
            y,
            mixed,
            banks,
            selections,
            coefs,
            picks,
            z,
            zy,
            gate,
            up,
            shared_y,
            gqa,
            mla,
            kda,
            gdn,
            v4,
        } = c;
        let (x, xn, y) = (&mut x[..n * rw], &mut xn[..n * h], &mut y[..n * h]);
        let (banks, picks, selections) = (&mut banks[..n], &mut picks[..n], &mut selections[..n]);
        let coefs = &mut coefs[..n];
        for (i, &tok) in toks.iter().enumerate() {
            self.embed(tok, splice.row(first + i, h), &mut x[i * rw..(i + 1) * rw], stats)?;
            banks[i].clear();
        }
        for (l, layer) in self.layers.iter().enumerate() {
            // `mixer_step` for every token: each token's input, the mixer
            // over the chunk, each token's feed-forward input.
            let mixed_rows = |mixed: &mut [f32], i: usize| -> std::ops::Range<usize> {
                if mixed.is_empty() {
                    0..0
                } else {
                    i * h..(i + 1) * h
                }
            };
            for (i, (bank, coef)) in banks.iter_mut().zip(coefs.iter_mut()).enumerate() {
                let (xr, m) = (&mut x[i * rw..(i + 1) * rw], mixed_rows(mixed, i));
                self.mixer_input(l, xr, bank, coef, &mut mixed[m], &mut xn[i * h..(i + 1) * h], &mut s.mix.hc);
            }
            for b0 in (0..n).step_by(MIXER_TOKENS) {
                let b = b0..(b0 + MIXER_TOKENS).min(n);
                let (xs, ys, at) = (&xn[b.start * h..b.end * h], &mut y[b.start * h..b.end * h], start + b0);
                match (&layer.self_attn, &mut state.layers[l]) {
                    (Mixer::Gqa(a), LayerState::Kv { k, v }) => {
                        a.forward_chunk(&self.cfg, &self.rope, xs, at, (k, v), &mut s.mix.attn, gqa, ys)?
                    }
                    (Mixer::Mla(a), LayerState::Latent(cache)) => {
                        a.forward_chunk(xs, at, cache, &mut s.mix.mla, mla, &mut selections[b], ys)?
                    }
                    (Mixer::Kda(a), LayerState::Kda(st)) => a.forward_chunk(xs, at, st, &mut s.mix.kda, kda, ys),
                    (Mixer::Gdn(a), LayerState::Gdn(st)) => a.forward_chunk(xs, at, st, &mut s.mix.gdn, gdn, ys),
                    (Mixer::V4(a), LayerState::V4(st)) => a.forward_chunk(xs, at, st, &mut s.mix.v4, v4, ys)?,
                    _ => return Err(Error::Arg(format!("layer {l}: the state was created for a different model"))),
                }
            }
            for (i, (bank, coef)) in banks.iter().zip(coefs.iter_mut()).enumerate() {
                let (xr, m) = (&mut x[i * rw..(i + 1) * rw], mixed_rows(mixed, i));
                let (yr, xnr) = (&y[i * h..(i + 1) * h], &mut xn[i * h..(i + 1) * h]);
                self.feed_forward_input(l, xr, yr, bank, coef, &mut mixed[m], xnr, &mut s.mix.hc);
            }
            match &layer.mlp {
                FeedForward::Dense(mlp) => {
                    let w = n * self.cfg.intermediate_size;
                    mlp.forward_batch(xn, &mut gate[..w], &mut up[..w], y);
                }
                FeedForward::Moe(router) => {
                    for (i, (p, &tok)) in picks.iter_mut().zip(toks).enumerate() {
                        router.route(&xn[i * h..(i + 1) * h], tok, &mut s.probs, p);
                    }
                    match &layer.latent_moe {
                        Some(lat) => {
                            let w = n * self.cfg.k3.and_then(|k| k.latent).unwrap_or(0);
                            lat.forward_batch(l, xn, picks, experts, &mut z[..w], &mut zy[..w], y, stats)?
                        }
                        None => experts.forward_experts_batch(l, xn, picks, y, stats)?,
                    }
                }
            }
            if let Some(shared) = &layer.shared_experts {
                let (w, shared_y) = (n * self.cfg.shared_intermediate_size, &mut shared_y[..n * h]);
                shared.forward_batch(xn, &mut gate[..w], &mut up[..w], shared_y);
                for i in 0..n {
                    let r = i * h..(i + 1) * h;
                    layer.gate_shared(&xn[r.clone()], &mut shared_y[r.clone()]);
                    add_in_place(&mut y[r.clone()], &shared_y[r]);
                }
            }
            for (i, coef) in coefs.iter().enumerate() {
                let xr = &mut x[i * rw..(i + 1) * rw];
                self.residual_add(l, xr, &y[i * h..(i + 1) * h], coef, &mut s.mix.hc);
                super::check_finite(xr, || format!("layer {l}"), start + i)?;
            }
        }
        state.position = start + n;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use crate::checkpoint::HfCheckpoint;
    use crate::stats::StepStats;
    use crate::transformer::experts::DenseExperts;
    use crate::transformer::{State, Transformer};

    /// `family`'s f32 checkpoint (`DenseExperts`) run over a prompt of
    /// `len` tokens in chunks of each of `chunks`: the bits of its
    /// all-position logits per chunk size. Each run ends with the state at
    /// the prompt's end.
    fn logit_bits_per_chunk(family: &str, len: usize, chunks: &[usize]) -> Vec<Vec<u32>> {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(format!("tiny-{family}"));
        assert!(dir.join("config.json").is_file(), "fixture missing: {}", dir.display());
        let ckpt = HfCheckpoint::open(&dir).unwrap();
        let cfg = ckpt.config().clone();
        let mut model = Transformer::load(&cfg, &ckpt).unwrap();
        let experts = DenseExperts(&ckpt);
        let prompt: Vec<u32> = (0..len as u32).map(|i| (i * 37 + 5) % cfg.vocab_size as u32).collect();
        let mut run = |chunk: usize| {
            model.set_prefill_chunk(chunk).unwrap();
            let mut state = State::new(&cfg, len + 10);
            let logits = model.forward(&mut state, &prompt, &experts, true, &mut StepStats::default()).unwrap();
            assert_eq!(state.position(), prompt.len());
            logits.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
        };
        chunks.iter().map(|&c| run(c)).collect()
    }

    /// Regression guard for the mixers' blocks inside a chunk: a chunk of
    /// more than `MIXER_TOKENS` tokens runs each token mixer over two
    /// blocks, and its logits equal token at a time bit for bit, for every
    /// mixer kind that projects a chunk at once (GQA, MLA with and without
    /// DSA's selection, KDA, Gated DeltaNet).
    #[test]
    fn a_chunk_longer_than_a_mixer_block_is_bit_identical() {
        let len = super::MIXER_TOKENS + 20;
        for family in ["qwen3_moe", "kimi_linear", "qwen3_next", "deepseek_v32"] {
            let runs = logit_bits_per_chunk(family, len, &[1, len]);
            assert!(runs[1] == runs[0], "{family}: a chunk of {len} tokens differs from token at a time");
        }
    }

    /// The exact f32 oracle path (`DenseExperts`, whose batch entry point is
    /// the trait's token-by-token default; dense MLPs and shared experts
    /// batched) through chunks of 1, 3 and 64:
    /// all-position logits equal bit for bit, and the state ends at the
    /// same position, on every family's checkpoint.
    #[test]
    fn chunked_prefill_on_the_f32_checkpoints_is_bit_identical() {
        // Every row of the family table (an alias is read as its row), and
        // a quantised release layout whose experts the checkpoint reader
        // decodes (MXFP4).
        let model_types = crate::config::FAMILIES.iter().map(|row| row.model_type);
        for family in model_types.chain(["gpt_oss-mxfp4"]) {
            let runs = logit_bits_per_chunk(family, 70, &[1, 3, 64]);
            for (chunk, run) in [3, 64].iter().zip(&runs[1..]) {
                assert!(*run == runs[0], "{family}: chunk {chunk} differs");
            }
        }
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-olmoe");
        let ckpt = HfCheckpoint::open(&dir).unwrap();
        let mut m = Transformer::load(ckpt.config(), &ckpt).unwrap();
        assert!(m.set_prefill_chunk(0).is_err() && m.set_prefill_chunk(super::MAX_PREFILL_CHUNK + 1).is_err());
        assert_eq!(m.prefill_chunk(), super::DEFAULT_PREFILL_CHUNK);
    }
}
