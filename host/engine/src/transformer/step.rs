//! A decoder layer's steps around its token mixer for one token: the
//! mixer's input (a norm, AttnRes's depth mix or V4's hyper-connection),
//! the mixer, the residual update and the feed-forward's input. Decode runs
//! them per token (`mixer_step`); a prefill chunk runs the two ends per
//! token around a mixer over the whole chunk (`prefill`).

use crate::error::{Error, Result};

use super::ops::{add_in_place, rms_norm};
use super::v4::hyper::{Coef, HcScratch, HyperConnection};
use super::{attnres, dsa, LayerState, Mixer, MixerScratch, Transformer};

impl Transformer {
    /// The residual update after layer `l`'s feed-forward output `y`:
    /// `x += y`, or V4's hyper-connection expansion.
    pub(super) fn residual_add(&self, l: usize, x: &mut [f32], y: &[f32], coef: &Coef, hc: &mut HcScratch) {
        match &self.layers[l].hc {
            Some(_) => HyperConnection::after(x, y, coef, hc),
            None => add_in_place(x, y),
        }
    }

    /// The token mixer of layer `l` for one token at `pos`, `x += attn(norm(
    /// in))`, then the feed-forward input `xn = norm(in')`; with AttnRes
    /// (K3) `x` is the block's partial sum P and each input a depth mix of
    /// the bank and P.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mixer_step(
        &self,
        l: usize,
        pos: usize,
        layer_state: &mut LayerState,
        x: &mut [f32],
        bank: &mut attnres::Bank,
        selection: &mut dsa::Selection,
        coef: &mut Coef,
        mixed: &mut [f32],
        xn: &mut [f32],
        mix: &mut MixerScratch,
        y: &mut [f32],
    ) -> Result<()> {
        let cfg = &self.cfg;
        self.mixer_input(l, x, bank, coef, mixed, xn, &mut mix.hc);
        match (&self.layers[l].self_attn, layer_state) {
            (Mixer::Gqa(a), LayerState::Kv { k, v }) => a.forward(cfg, &self.rope, xn, pos, k, v, &mut mix.attn, y)?,
            (Mixer::Mla(a), LayerState::Latent(c)) => a.forward(xn, pos, c, &mut mix.mla, selection, y)?,
            (Mixer::Kda(a), LayerState::Kda(st)) => a.forward(xn, pos, st, &mut mix.kda, y),
            (Mixer::Gdn(a), LayerState::Gdn(st)) => a.forward(xn, pos, st, &mut mix.gdn, y),
            (Mixer::V4(a), LayerState::V4(st)) => a.forward(xn, pos, st, &mut mix.v4, y)?,
            _ => return Err(Error::Arg(format!("layer {l}: the state was created for a different model"))),
        }
        self.feed_forward_input(l, x, y, bank, coef, mixed, xn, &mut mix.hc);
        Ok(())
    }

    /// Layer `l`'s token-mixer input `xn` for one token of residual `x`:
    /// its norm, or that of AttnRes's depth mix or V4's hyper-connection
    /// mix (in `mixed`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mixer_input(
        &self,
        l: usize,
        x: &mut [f32],
        bank: &mut attnres::Bank,
        coef: &mut Coef,
        mixed: &mut [f32],
        xn: &mut [f32],
        hc_scratch: &mut HcScratch,
    ) {
        let layer = &self.layers[l];
        let eps = self.cfg.rms_norm_eps;
        match (&layer.attn_res, &layer.hc) {
            (Some(r), _) => {
                r.before_attention(bank, x, mixed);
                rms_norm(mixed, &layer.input_layernorm, eps, xn);
            }
            (None, Some(hc)) => {
                hc.attn_hc.before(x, coef, hc_scratch, mixed);
                rms_norm(mixed, &layer.input_layernorm, eps, xn);
            }
            (None, None) => rms_norm(x, &layer.input_layernorm, eps, xn),
        }
    }

    /// The mixer's output `y` added to one token's residual `x`, then
    /// layer `l`'s feed-forward input `xn` (as `mixer_input`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn feed_forward_input(
        &self,
        l: usize,
        x: &mut [f32],
        y: &[f32],
        bank: &attnres::Bank,
        coef: &mut Coef,
        mixed: &mut [f32],
        xn: &mut [f32],
        hc_scratch: &mut HcScratch,
    ) {
        let layer = &self.layers[l];
        let eps = self.cfg.rms_norm_eps;
        match &layer.hc {
            Some(_) => HyperConnection::after(x, y, coef, hc_scratch),
            None => add_in_place(x, y),
        }
        match (&layer.attn_res, &layer.hc) {
            (Some(r), _) => {
                r.before_mlp(bank, x, mixed);
                rms_norm(mixed, &layer.post_attention_layernorm, eps, xn);
            }
            (None, Some(hc)) => {
                hc.ffn_hc.before(x, coef, hc_scratch, mixed);
                rms_norm(mixed, &layer.post_attention_layernorm, eps, xn);
            }
            (None, None) => rms_norm(x, &layer.post_attention_layernorm, eps, xn),
        }
    }
}
