//! Where a model's weights come from. The forward pass is written against
//! these two traits, so the same code runs on an unquantised Hugging Face
//! checkpoint (the oracle tests) and on a converted container.

use crate::error::Result;
use crate::quant::QMatrix;
use crate::stats::StepStats;

/// The dense trunk, looked up by the checkpoint's own tensor names.
pub trait TensorSource {
    /// A 2-D weight `[rows = out_features, cols = in_features]` (the layout of
    /// `nn.Linear.weight`), in whatever trunk format the source stores.
    fn matrix(&self, name: &str) -> Result<QMatrix>;
    /// A 1-D f32 tensor (norm weights, biases, router bias).
    fn vector(&self, name: &str) -> Result<Vec<f32>>;
    fn has(&self, name: &str) -> bool;
    /// Where a stored matrix lies on disk, for a source whose tensors are in
    /// a file (a container): lets the embedding table stay there.
    fn stored_matrix(&self, _name: &str) -> Option<super::embedding::StoredMatrix> {
        None
    }
}

/// The routed experts of every MoE layer.
pub trait ExpertProvider: Send + Sync {
    /// `out = sum_j weight_j * expert_{id_j}(x)` for the MoE block of decoder
    /// layer `layer`, where `expert(x) = down(silu(gate x) * up x)`.
    /// `out` is overwritten. Picks are in router order.
    fn forward_experts(
        &self,
        layer: usize,
        x: &[f32],
        picks: &[(usize, f32)],
        out: &mut [f32],
        stats: &mut StepStats,
    ) -> Result<()>;

    /// The MoE block for the tokens of a prefill chunk: token `t`'s input
    /// is `xs[t * w..(t + 1) * w]` (`w = xs.len() / picks.len()`), its
    /// output the same rows of `outs`, and each must equal what
    /// `forward_experts` gives for that token alone, bit for bit. A
    /// provider that reads experts reads each distinct one once per call.
    fn forward_experts_batch(
        &self,
        layer: usize,
        xs: &[f32],
        picks: &[Vec<(usize, f32)>],
        outs: &mut [f32],
        stats: &mut StepStats,
    ) -> Result<()> {
        let n = picks.len().max(1);
        let w = xs.len() / n;
        if xs.len() != w * picks.len() || outs.len() != xs.len() {
            return Err(crate::error::Error::Arg(format!(
                "expert batch of {} tokens: input/output lengths {}/{}",
                picks.len(),
                xs.len(),
                outs.len()
            )));
        }
        for (t, p) in picks.iter().enumerate() {
            let r = t * w..(t + 1) * w;
            self.forward_experts(layer, &xs[r.clone()], p, &mut outs[r], stats)?;
        }
        Ok(())
    }

    /// Experts of the next MoE layer to read speculatively in decode
    /// (router lookahead); 0 = none.
    fn lookahead(&self) -> usize {
        0
    }

    /// A hint that `experts` of `layer` will probably be used soon: start
    /// reading them. Only when bytes move may change, never a result.
    fn prefetch(&self, _layer: usize, _experts: &[usize], _stats: &mut StepStats) {}
}
