//! A GGUF expert computed from its three slabs as stored: gate and up
//! `[inter, hidden]`, down `[hidden, inter]`, each a `GgmlMatrix` of its
//! own type. The activation and biases are `expert.rs`'s, shared with
//! every other format.

use super::GgmlMatrix;
use crate::quant::{ExpertShape, GgmlExpert};

/// The slabs of one expert's payload, lengths already checked
/// (`check_expert_payload`).
pub(crate) struct Slabs<'a> {
    gate: GgmlMatrix<'a>,
    up: GgmlMatrix<'a>,
    down: GgmlMatrix<'a>,
}

impl<'a> Slabs<'a> {
    /// Panics on slab lengths that do not match the types and shape: the
    /// payload was validated when its bank was opened.
    pub(crate) fn new(t: GgmlExpert, shape: ExpertShape, [g, u, d]: [&'a [u8]; 3]) -> Slabs<'a> {
        let (h, i) = (shape.hidden, shape.inter);
        let m = |what, ty, rows, cols, bytes| {
            GgmlMatrix::new(what, ty, rows, cols, bytes).unwrap_or_else(|e| panic!("GGUF expert: {e}"))
        };
        Slabs { gate: m("gate", t.gate, i, h, g), up: m("up", t.up, i, h, u), down: m("down", t.down, h, i, d) }
    }

    /// Gate and up share their input: quantised once where both take int16
    /// inputs (`GgmlMatrix::matmul_each`).
    pub(crate) fn gate_up(&self, x: &[f32], gate: &mut [f32], up: &mut [f32]) {
        GgmlMatrix::matmul_each(&mut [(self.gate, gate), (self.up, up)], x);
    }

    pub(crate) fn down(&self, act: &[f32], out: &mut [f32]) {
        self.down.matvec(act, out);
    }

    /// `gate_up` for `[m, hidden]` tokens at once: the same bits per token.
    pub(crate) fn gate_up_many(&self, xs: &[f32], gate: &mut [f32], up: &mut [f32]) {
        GgmlMatrix::matmul_each(&mut [(self.gate, gate), (self.up, up)], xs);
    }

    pub(crate) fn down_many(&self, acts: &[f32], outs: &mut [f32]) {
        self.down.matmul(acts, outs);
    }
}

/// The expert's f32 `(gate, up, down)`, as ggml decodes it (tests,
/// `convert --verify`).
pub(crate) fn decode(t: GgmlExpert, shape: ExpertShape, slabs: [&[u8]; 3]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let s = Slabs::new(t, shape, slabs);
    (s.gate.dequantize(), s.up.dequantize(), s.down.dequantize())
}
