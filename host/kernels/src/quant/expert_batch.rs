//! One routed expert over the many tokens a prefill chunk sends it.
//!
//! Decode computes an expert for one token as three matrix-vector products
//! on the stored format (`expert::expert_forward_act`). A long prompt sends
//! each expert tens to hundreds of tokens per chunk; for q8, q4 and f32
//! experts every weight row is then loaded and decoded once per tile of
//! tokens and run against all of them (`MatRef::matvec_many`), instead of
//! once per token. rvq3 and rvq2 experts run as products over their rows'
//! values (`rvq_dense`); rvq4p keeps its per-token walk on int8 tables.
//!
//! Arithmetic: for q8, q4, f32, GGUF and rvq4p each token's gate, up and
//! down values come from the very row-dot kernels decode uses, in the same
//! order, so every token's output is bit-identical to `expert_forward_act`
//! for that token alone. rvq3 and rvq2 follow `rvq_dense`'s definition,
//! within f32 rounding of decode's table walk. Either way a token's output
//! depends on neither the batch, the thread count nor the tile it ran in.

use super::activation::Activation;
use super::expert::{
    add_down_biases, add_gate_up_biases, build_gate_up_tables, expert_forward_act, gate_activation, split_payload,
    ExpertScratch,
};
use super::ggml::expert::Slabs;
use super::ggml::int16_input_bytes;
use super::int8::int8_input_bytes;
use super::rvq::LayerCodebooks;
use super::rvq_dense::{self, DenseRvq};
use super::trunk::{f32_from_le, MatRef};
use super::{ExpertFormat, ExpertShape, TrunkFormat};

/// Reusable buffers of [`expert_forward_batch`], grown to the largest batch
/// seen.
#[derive(Debug, Clone)]
pub struct ExpertBatchScratch {
    /// `[m, inter]` each.
    gate: Vec<f32>,
    up: Vec<f32>,
    /// The per-token kernel's buffers, for the formats that walk tables
    /// token by token (rvq4p); `None` for the others, which never use it.
    one: Option<ExpertScratch>,
}

impl ExpertBatchScratch {
    pub fn new(fmt: ExpertFormat, shape: ExpertShape) -> Self {
        let one = (!batch_shares_weights(fmt)).then(|| ExpertScratch::new(fmt, shape));
        ExpertBatchScratch { gate: Vec::new(), up: Vec::new(), one }
    }

    /// The most bytes this scratch holds for batches of up to `tokens`
    /// tokens (the memory plan counts it), from the lengths it allocates.
    pub fn peak_bytes(fmt: ExpertFormat, shape: ExpertShape, tokens: usize) -> usize {
        let matrices = if batch_shares_weights(fmt) { 2 * 4 * tokens * shape.inter } else { 0 };
        let dense = if runs_dense(fmt) {
            let (h, i) = (shape.hidden, shape.inter);
            rvq_dense::matmul_peak_bytes(i, h, tokens).max(rvq_dense::matmul_peak_bytes(h, i, tokens))
        } else {
            0
        };
        // q4's int8 inputs, or a GGUF expert's int16 ones for its Q4_K
        // and Q6_K slabs: gate/up's, then down's.
        let widest = shape.hidden.max(shape.inter);
        let inputs = match fmt {
            ExpertFormat::Q4 => int8_input_bytes(tokens, widest),
            ExpertFormat::Ggml(t) if [t.gate, t.up, t.down].iter().any(|t| t.takes_int16_inputs()) => {
                int16_input_bytes(tokens, widest)
            }
            _ => 0,
        };
        let one = if batch_shares_weights(fmt) { 0 } else { ExpertScratch::new(fmt, shape).bytes() };
        matrices + dense + inputs + one
    }
}

/// Whether `fmt`'s batch loads each weight row once for many tokens (q8,
/// q4, f32, GGUF, rvq3, rvq2) rather than running token by token (rvq4p).
pub fn batch_shares_weights(fmt: ExpertFormat) -> bool {
    fmt != ExpertFormat::Rvq4p
}

/// rvq3 and rvq2: products over the rows' values (`rvq_dense`).
fn runs_dense(fmt: ExpertFormat) -> bool {
    matches!(fmt, ExpertFormat::Rvq3 | ExpertFormat::Rvq2)
}

/// `outs[t] = down(act(gate xs[t], up xs[t]))` for the `m = xs.len() /
/// hidden` tokens routed to one expert (`xs`, `outs`: `[m, hidden]`),
/// computed on the stored format. Panics on lengths that do not match
/// `shape` (validate payloads with `check_expert_payload`).
#[allow(clippy::too_many_arguments)]
pub fn expert_forward_batch(
    fmt: ExpertFormat,
    shape: ExpertShape,
    payload: &[u8],
    cb: Option<&LayerCodebooks>,
    xs: &[f32],
    outs: &mut [f32],
    scratch: &mut ExpertBatchScratch,
    act: Activation,
) {
    let (h, i) = (shape.hidden, shape.inter);
    assert!(
        h > 0 && xs.len().is_multiple_of(h) && outs.len() == xs.len(),
        "expert_forward_batch: xs/outs are not whole rows of hidden {h}"
    );
    let m = xs.len() / h;
    if !batch_shares_weights(fmt) {
        let one = scratch.one.get_or_insert_with(|| ExpertScratch::new(fmt, shape));
        for (x, out) in xs.chunks_exact(h).zip(outs.chunks_exact_mut(h)) {
            let tables = build_gate_up_tables(fmt, cb, x);
            expert_forward_act(fmt, shape, payload, cb, &tables, x, out, one, act);
        }
        return;
    }
    let ([gb, ub, db], bias_bytes) = split_payload(fmt, shape, payload);
    let matrix = |bytes: &[u8], rows: usize, cols: usize, f: &mut dyn FnMut(MatRef<'_>)| match fmt {
        ExpertFormat::Q8 => f(MatRef::quant(TrunkFormat::Q8, bytes, rows, cols)),
        ExpertFormat::Q4 => f(MatRef::quant(TrunkFormat::Q4, bytes, rows, cols)),
        _ => f(MatRef::f32(&f32_from_le(bytes), rows, cols)),
    };
    scratch.gate.resize(m * i, 0.0);
    scratch.up.resize(m * i, 0.0);
    let (gate, up) = (&mut scratch.gate[..m * i], &mut scratch.up[..m * i]);
    // GGUF slabs: `GgmlMatrix::matmul`, each row decoded once per block of
    // tokens; its outputs are its matvec's bits, as decode computes them.
    let ggml = match fmt {
        ExpertFormat::Ggml(t) => Some(Slabs::new(t, shape, [gb, ub, db])),
        _ => None,
    };
    let books = if runs_dense(fmt) { super::expert::codebooks_for(fmt, cb) } else { None };
    match (&ggml, books) {
        (Some(slabs), _) => slabs.gate_up_many(xs, gate, up),
        (None, Some(books)) => {
            DenseRvq::new(gb, i, h, &books.gate_up).matmul(xs, gate);
            DenseRvq::new(ub, i, h, &books.gate_up).matmul(xs, up);
        }
        (None, None) => {
            // q4's int8 inputs, quantised once for both.
            let mut inputs = None;
            matrix(gb, i, h, &mut |w| {
                inputs = w.int8_inputs(xs);
                w.matvec_many_with(xs, inputs.as_ref(), gate)
            });
            matrix(ub, i, h, &mut |w| w.matvec_many_with(xs, inputs.as_ref(), up));
        }
    }
    let biases = (!bias_bytes.is_empty()).then(|| f32_from_le(bias_bytes));
    for (g, u) in gate.chunks_exact_mut(i).zip(up.chunks_exact_mut(i)) {
        add_gate_up_biases(biases.as_deref(), g, u);
    }
    gate_activation(act, gate, up);
    match (&ggml, books) {
        (Some(slabs), _) => slabs.down_many(gate, outs),
        (None, Some(books)) => DenseRvq::new(db, h, i, &books.down).matmul(gate, outs),
        (None, None) => matrix(db, h, i, &mut |w| w.matvec_many(gate, outs)),
    }
    for out in outs.chunks_exact_mut(h) {
        add_down_biases(biases.as_deref(), i, out);
    }
}
