//! The routed experts' arithmetic, beside the router that picks them.
//!
//! [`ExpertProvider`] is what the forward pass asks for a MoE block's
//! routed output. Two providers: the expert store of a container (its
//! records pinned in the cache by `ExpertStore::pin`, computed here from
//! their stored bytes by the quant kernels as they land), and the exact f32
//! experts of a Hugging Face checkpoint (the oracle path).
//!
//! Placement never changes a bit: each pick's output is computed into its
//! own row from the same bytes and the same per-token gate/up tables, and
//! the rows are summed in router order, whatever order the records landed
//! in, whether they came from the cache, a read-ahead, a speculative
//! lookahead read or a synchronous read, one token at a time or a prefill
//! chunk at once.

use crate::checkpoint::HfCheckpoint;
use crate::error::{Error, Result};
use crate::quant::{self, ExpertScratch};
use crate::stats::StepStats;
use crate::store::ExpertStore;

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
            return Err(Error::Arg(format!(
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

impl ExpertProvider for ExpertStore {
    fn forward_experts(
        &self,
        layer: usize,
        x: &[f32],
        picks: &[(usize, f32)],
        out: &mut [f32],
        stats: &mut StepStats,
    ) -> Result<()> {
        let ids: Vec<usize> = picks.iter().map(|p| p.0).collect();
        let mut pinned = self.pin(layer, &ids, &[], stats)?;
        let banks = self.banks();
        let (format, shape) = (banks.format(), banks.shape());
        let cb = banks.bank(layer).and_then(|b| b.codebooks.as_ref());
        // Gate/up tables depend only on x and the layer's codebooks: built
        // once here, while the reads run, and shared by every routed expert
        // of this token.
        let tables = quant::build_gate_up_tables(format, cb, x);
        let mut scratch = ExpertScratch::new(format, shape);
        let hidden = shape.hidden;
        let k = picks.len();
        // Each pick's output lands in its own row and the rows are summed in
        // router order at the end, so the order in which records are
        // computed (as they land) never changes a bit of `out`.
        let mut ys = vec![0.0f32; k * hidden];
        let mut left: Vec<usize> = (0..k).collect();
        while !left.is_empty() {
            let j = if pinned.lands_in_any_order() {
                left.remove(pinned.next_landed(&left, &mut stats.io_time)?)
            } else {
                let j = left.remove(0);
                pinned.wait(j, &mut stats.io_time)?;
                j
            };
            quant::expert_forward_act(
                format,
                shape,
                &pinned.payload(j),
                cb,
                &tables,
                x,
                &mut ys[j * hidden..(j + 1) * hidden],
                &mut scratch,
                banks.activation(),
            );
        }
        drop(pinned);
        sum_in_router_order(picks, &ys, hidden, out);
        Ok(())
    }

    /// Each distinct expert of the chunk is pinned (and, on a miss, read)
    /// once, held while every token routed to it uses it, and released.
    /// Bit-identity with the token-at-a-time path: each (token, pick)
    /// output is computed by the same kernel from the same bytes and the
    /// same per-token gate/up tables into its own row, and each token then
    /// sums its rows in its own router order, exactly as `forward_experts`.
    fn forward_experts_batch(
        &self,
        layer: usize,
        xs: &[f32],
        picks: &[Vec<(usize, f32)>],
        outs: &mut [f32],
        stats: &mut StepStats,
    ) -> Result<()> {
        let n = picks.len();
        if n == 0 {
            return Ok(());
        }
        let banks = self.banks();
        let bank = banks.bank(layer).ok_or_else(|| Error::Runtime(format!("layer {layer} has no experts")))?;
        let width = banks.shape().hidden;
        if xs.len() != n * width || outs.len() != n * width {
            return Err(Error::Arg(format!(
                "expert batch of {n} tokens: input/output lengths {}/{} != {n} x {width}",
                xs.len(),
                outs.len()
            )));
        }
        let slots_total = self.options().cache_slots;
        let mut k_max = 0;
        for p in picks {
            if let Some(&(bad, _)) = p.iter().find(|p| p.0 >= bank.experts) {
                return Err(Error::Runtime(format!("layer {layer}: expert {bad} out of range")));
            }
            if p.len() > slots_total {
                return Err(Error::Runtime(format!("{} experts routed, the cache holds {slots_total}", p.len())));
            }
            k_max = k_max.max(p.len());
        }
        // Distinct experts in first-use order, and how many tokens use each.
        let mut uses = vec![0u64; bank.experts];
        let mut distinct = Vec::new();
        for p in picks {
            for &(e, _) in p {
                if uses[e] == 0 {
                    distinct.push(e);
                }
                uses[e] += 1;
            }
        }
        // Half the cache at most per group, so that another session's
        // token still finds slots to pin; never less than one token's picks.
        let group = (slots_total / 2).max(k_max).max(1);
        let mut ys = vec![0.0f32; n * k_max * width];
        // Expert -> its index among the current group's pinned experts.
        let mut member: Vec<Option<usize>> = vec![None; bank.experts];
        for members in distinct.chunks(group) {
            let counts: Vec<u64> = members.iter().map(|&e| uses[e]).collect();
            let result = self.pin(layer, members, &counts, stats).and_then(|mut pinned| {
                for (i, &e) in members.iter().enumerate() {
                    member[e] = Some(i);
                }
                compute_group(&mut pinned, layer, xs, picks, &member, &mut ys, k_max, stats)
            });
            for &e in members {
                member[e] = None;
            }
            result?;
        }
        for (t, p) in picks.iter().enumerate() {
            let y = &ys[t * k_max * width..(t + 1) * k_max * width];
            sum_in_router_order(p, y, width, &mut outs[t * width..(t + 1) * width]);
        }
        Ok(())
    }

    fn lookahead(&self) -> usize {
        ExpertStore::lookahead(self)
    }

    fn prefetch(&self, layer: usize, experts: &[usize], stats: &mut StepStats) {
        ExpertStore::prefetch(self, layer, experts, stats)
    }
}

/// Token by token (its gate/up tables built once for the group), each pick
/// of a pinned expert computed into its own row of `ys`.
#[allow(clippy::too_many_arguments)]
fn compute_group(
    pinned: &mut crate::store::Pinned<'_>,
    layer: usize,
    xs: &[f32],
    picks: &[Vec<(usize, f32)>],
    member: &[Option<usize>],
    ys: &mut [f32],
    k_max: usize,
    stats: &mut StepStats,
) -> Result<()> {
    let banks = pinned.store().banks();
    let (format, shape) = (banks.format(), banks.shape());
    let width = shape.hidden;
    let cb = banks.bank(layer).and_then(|b| b.codebooks.as_ref());
    let mut scratch = ExpertScratch::new(format, shape);
    for (t, p) in picks.iter().enumerate() {
        if !p.iter().any(|&(e, _)| member[e].is_some()) {
            continue;
        }
        let x = &xs[t * width..(t + 1) * width];
        let tables = quant::build_gate_up_tables(format, cb, x);
        for (j, &(e, _)) in p.iter().enumerate() {
            let Some(i) = member[e] else { continue };
            pinned.wait(i, &mut stats.io_time)?;
            quant::expert_forward_act(
                format,
                shape,
                &pinned.payload(i),
                cb,
                &tables,
                x,
                &mut ys[(t * k_max + j) * width..][..width],
                &mut scratch,
                banks.activation(),
            );
        }
    }
    Ok(())
}

/// `out = sum_j weight_j * y_j` over the picks in router order (`ys`: one
/// row of `width` per pick).
fn sum_in_router_order(picks: &[(usize, f32)], ys: &[f32], width: usize, out: &mut [f32]) {
    out.fill(0.0);
    for (&(_, weight), y) in picks.iter().zip(ys.chunks_exact(width)) {
        for (o, v) in out.iter_mut().zip(y) {
            *o += weight * v;
        }
    }
}

/// Exact f32 experts straight from the checkpoint: the reference the
/// quantised expert stores are measured against.
pub struct DenseExperts<'a>(pub &'a HfCheckpoint);

impl ExpertProvider for DenseExperts<'_> {
    fn forward_experts(
        &self,
        layer: usize,
        x: &[f32],
        picks: &[(usize, f32)],
        out: &mut [f32],
        stats: &mut StepStats,
    ) -> Result<()> {
        let cfg = self.0.config();
        let (h, inter) = (cfg.expert_hidden(), cfg.moe_intermediate_size);
        let activation = cfg.activation();
        if x.len() != h || out.len() != h {
            return Err(Error::Arg(format!("expert input/output length {}/{} != hidden {h}", x.len(), out.len())));
        }
        out.fill(0.0);
        let mut act = vec![0.0f32; inter];
        for &(e, weight) in picks {
            let [gate, up, down] = self.0.expert_f32(layer, e)?;
            let biases = self.0.expert_biases_f32(layer, e)?;
            let bias = |which: usize, r: usize| biases.as_ref().map_or(0.0, |b| b[which][r]);
            for (r, a) in act.iter_mut().enumerate() {
                let g = dot(&gate[r * h..(r + 1) * h], x) + bias(0, r);
                let u = dot(&up[r * h..(r + 1) * h], x) + bias(1, r);
                *a = activation.apply(g, u);
            }
            for (r, o) in out.iter_mut().enumerate() {
                *o += weight * (dot(&down[r * inter..(r + 1) * inter], &act) + bias(2, r));
            }
            stats.experts_hit += 1;
        }
        Ok(())
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}
