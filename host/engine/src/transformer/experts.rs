//! The routed experts' arithmetic, beside the router that picks them.
//!
//! [`ExpertProvider`] is what the forward pass asks for a MoE block's
//! routed output. Two providers: the expert store of a container (its
//! records pinned in the cache by `ExpertStore::pin`, computed here from
//! their stored bytes by the quant kernels as they land), and the exact f32
//! experts of a Hugging Face checkpoint (the oracle path).
//!
//! Placement never changes a bit: each pick's output is computed from the
//! same bytes by the same row kernels, and a token's picks are summed in
//! ascending expert id (the order of transformers' `index_add_` loop over
//! the experts), whatever order the records landed in, whether they came
//! from the cache, a read-ahead, a speculative lookahead read or a
//! synchronous read, one token at a time or a prefill chunk at once.

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

    /// How many MoE layers ahead the lookahead guesses.
    fn lookahead_layers(&self) -> usize {
        1
    }

    /// A hint that `experts` of `layer`, `ahead` MoE layers after the one
    /// running, will probably be used soon: start reading them. Only which
    /// bytes move may change, never a result.
    fn prefetch(&self, _layer: usize, _experts: &[usize], _ahead: usize, _stats: &mut StepStats) {}

    /// Bytes of expert cache this provider could lend a prefill's buffers
    /// now; 0 where it lends none (it holds no cache, or lending would not
    /// save reads).
    fn lendable_cache(&self) -> u64 {
        0
    }

    /// Lends at least `bytes` of its cache to a prefill's buffers until
    /// the loan drops, or nothing (an empty loan). Only which bytes move
    /// may change, never a result.
    fn lend_cache(&self, _bytes: u64) -> CacheLoan<'_> {
        CacheLoan::none()
    }
}

/// Expert-cache memory lent to a prefill's buffers; given back on drop.
pub struct CacheLoan<'a> {
    bytes: u64,
    _give_back: Option<Box<dyn Send + 'a>>,
}

impl<'a> CacheLoan<'a> {
    pub fn none() -> CacheLoan<'a> {
        CacheLoan { bytes: 0, _give_back: None }
    }

    /// A loan of `bytes`, given back when `give_back` drops.
    pub fn new(bytes: u64, give_back: Box<dyn Send + 'a>) -> CacheLoan<'a> {
        CacheLoan { bytes, _give_back: Some(give_back) }
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }
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
        let bank = banks.bank(layer).ok_or_else(|| Error::Runtime(format!("layer {layer} has no experts")))?;
        let (format, shape, cb) = (bank.format, banks.shape(), bank.codebooks.as_ref());
        // Gate/up tables depend only on x and the layer's codebooks: built
        // once here, while the reads run, and shared by every routed expert
        // of this token.
        let tables = quant::build_gate_up_tables(format, cb, x);
        let mut scratch = ExpertScratch::new(format, shape);
        let hidden = shape.hidden;
        let k = picks.len();
        // Each pick's output lands in its own row and the rows are summed in
        // expert order at the end, so the order in which records are
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
        sum_in_expert_order(picks, &ys, hidden, out);
        Ok(())
    }

    /// Each distinct expert of the chunk is pinned (and, on a miss, read)
    /// once, in ascending id, computed over every token routed to it at
    /// once (`quant::expert_forward_batch`: each weight row loaded once per
    /// tile of tokens for q8/q4/f32), and released. Bit-identity with the
    /// token-at-a-time path: every (token, pick) output is that token's
    /// own kernel result, and each token adds its picks' weighted outputs
    /// in ascending expert id, exactly as `forward_experts` sums them.
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
        let (format, shape) = (bank.format, banks.shape());
        let width = shape.hidden;
        if xs.len() != n * width || outs.len() != n * width {
            return Err(Error::Arg(format!(
                "expert batch of {n} tokens: input/output lengths {}/{} != {n} x {width}",
                xs.len(),
                outs.len()
            )));
        }
        // Less any slots lent to this or another session's prefill.
        let slots_total = self.usable_slots();
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
        let routed = Routed::of(picks, bank.experts);
        let cb = bank.codebooks.as_ref();
        // Half the cache at most per group, so that another session's
        // token still finds slots to pin; never less than one token's picks.
        let group = (slots_total / 2).max(k_max).max(1);
        let most = routed.tokens.iter().map(Vec::len).max().unwrap_or(0);
        let mut gathered = vec![0.0f32; most * width];
        let mut ys = vec![0.0f32; most * width];
        let mut scratch = quant::ExpertBatchScratch::new(format, shape);
        outs.fill(0.0);
        for (g, members) in routed.experts.chunks(group).enumerate() {
            let tokens = &routed.tokens[g * group..g * group + members.len()];
            let counts: Vec<u64> = tokens.iter().map(|t| t.len() as u64).collect();
            let mut pinned = self.pin(layer, members, &counts, stats)?;
            for (i, tokens) in tokens.iter().enumerate() {
                let m = tokens.len();
                let (xe, ye) = (&mut gathered[..m * width], &mut ys[..m * width]);
                for (row, &(t, _)) in xe.chunks_exact_mut(width).zip(tokens) {
                    row.copy_from_slice(&xs[t * width..(t + 1) * width]);
                }
                pinned.wait(i, &mut stats.io_time)?;
                quant::expert_forward_batch(
                    format,
                    shape,
                    &pinned.payload(i),
                    cb,
                    xe,
                    ye,
                    &mut scratch,
                    banks.activation(),
                );
                for (y, &(t, weight)) in ye.chunks_exact(width).zip(tokens) {
                    for (o, v) in outs[t * width..(t + 1) * width].iter_mut().zip(y) {
                        *o += weight * v;
                    }
                }
            }
        }
        Ok(())
    }

    fn lookahead(&self) -> usize {
        ExpertStore::lookahead(self)
    }

    fn lookahead_layers(&self) -> usize {
        ExpertStore::lookahead_layers(self)
    }

    fn prefetch(&self, layer: usize, experts: &[usize], ahead: usize, stats: &mut StepStats) {
        ExpertStore::prefetch(self, layer, experts, ahead, stats)
    }

    fn lendable_cache(&self) -> u64 {
        self.lendable_bytes()
    }

    fn lend_cache(&self, bytes: u64) -> CacheLoan<'_> {
        let loan = self.lend(bytes);
        match loan.bytes() {
            0 => CacheLoan::none(),
            lent => CacheLoan::new(lent, Box::new(loan)),
        }
    }
}

/// A chunk's routing turned around: the distinct experts in ascending id,
/// and for each the tokens routed to it (ascending, a token's repeated
/// picks of one expert in router order) with their weights.
struct Routed {
    experts: Vec<usize>,
    tokens: Vec<Vec<(usize, f32)>>,
}

impl Routed {
    /// `picks[t]`: token t's (expert, weight), every expert below `experts`.
    fn of(picks: &[Vec<(usize, f32)>], experts: usize) -> Routed {
        let mut index = vec![usize::MAX; experts];
        for p in picks {
            for &(e, _) in p {
                index[e] = 0;
            }
        }
        let mut routed = Routed { experts: Vec::new(), tokens: Vec::new() };
        for (e, i) in index.iter_mut().enumerate().filter(|(_, i)| **i == 0) {
            *i = routed.experts.len();
            routed.experts.push(e);
            routed.tokens.push(Vec::new());
        }
        for (t, p) in picks.iter().enumerate() {
            for &(e, weight) in p {
                routed.tokens[index[e]].push((t, weight));
            }
        }
        routed
    }
}

/// `out = sum_j weight_j * y_j` over the picks in ascending expert id, a
/// repeated expert's picks in router order (`ys`: one row of `width` per
/// pick, in router order): the order a prefill chunk's batch adds them in.
fn sum_in_expert_order(picks: &[(usize, f32)], ys: &[f32], width: usize, out: &mut [f32]) {
    let mut order: Vec<usize> = (0..picks.len()).collect();
    order.sort_by_key(|&j| picks[j].0);
    out.fill(0.0);
    for j in order {
        let weight = picks[j].1;
        for (o, v) in out.iter_mut().zip(&ys[j * width..(j + 1) * width]) {
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
            stats.experts_reused += 1;
        }
        Ok(())
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}
