//! The MoE block for the tokens of a prefill chunk: each distinct expert of
//! the chunk is acquired (and, on a miss, read) once, pinned while every
//! token routed to it uses it, and released.
//!
//! Bit-identity with the token-at-a-time path: each (token, pick) output is
//! computed by the same kernel from the same bytes and the same per-token
//! gate/up tables into its own slot, and each token then sums its slots in
//! its own router order, exactly as `forward_experts` accumulates.

use super::ExpertStore;
use crate::error::{Error, Result};
use crate::quant::{self, ExpertScratch};
use crate::stats::StepStats;

/// A distinct expert of the current group: its slot and whether its read
/// has still to be issued (no read-ahead) or done (no reader threads).
#[derive(Clone, Copy)]
struct Held {
    slot: usize,
    pending: bool,
}

impl ExpertStore {
    pub(super) fn forward_batch(
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
        let banks = &self.shared.banks;
        let bank = banks
            .bank(layer)
            .ok_or_else(|| Error::Runtime(format!("layer {layer} has no experts")))?;
        let width = banks.shape().hidden;
        if xs.len() != n * width || outs.len() != n * width {
            return Err(Error::Arg(format!(
                "expert batch of {n} tokens: input/output lengths {}/{} != {n} x {width}",
                xs.len(),
                outs.len()
            )));
        }
        let slots_total = self.shared.bufs.len();
        let mut k_max = 0;
        for p in picks {
            if let Some(&(bad, _)) = p.iter().find(|p| p.0 >= bank.experts) {
                return Err(Error::Runtime(format!(
                    "layer {layer}: expert {bad} out of range"
                )));
            }
            if p.len() > slots_total {
                return Err(Error::Runtime(format!(
                    "{} experts routed, the cache holds {slots_total}",
                    p.len()
                )));
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
        let mut held: Vec<Option<Held>> = vec![None; bank.experts];
        for members in distinct.chunks(group) {
            let result = self.run_group(
                layer, xs, picks, members, &uses, &mut held, &mut ys, k_max, stats,
            );
            for &e in members {
                held[e] = None;
            }
            result?;
        }
        for (t, p) in picks.iter().enumerate() {
            let out = &mut outs[t * width..(t + 1) * width];
            out.fill(0.0);
            for (j, &(_, weight)) in p.iter().enumerate() {
                let y = &ys[(t * k_max + j) * width..][..width];
                for (o, v) in out.iter_mut().zip(y) {
                    *o += weight * v;
                }
            }
        }
        Ok(())
    }

    /// Acquires `members`, computes every (token, pick) of them into `ys`
    /// and releases them, whatever happened.
    #[allow(clippy::too_many_arguments)]
    fn run_group(
        &self,
        layer: usize,
        xs: &[f32],
        picks: &[Vec<(usize, f32)>],
        members: &[usize],
        uses: &[u64],
        held: &mut [Option<Held>],
        ys: &mut [f32],
        k_max: usize,
        stats: &mut StepStats,
    ) -> Result<()> {
        let mut acquired: Vec<usize> = Vec::with_capacity(members.len());
        let mut failure = None;
        {
            let mut st = self.shared.lock();
            for &e in members {
                let (guard, r) = self.acquire(st, layer, e, stats);
                st = guard;
                match r {
                    Ok((slot, must_read)) => {
                        // One acquire counts one use; the hotlist counts
                        // every token's.
                        if let Some(i) = self.key_index(layer, e) {
                            st.usage[i] += uses[e] - 1;
                        }
                        held[e] = Some(Held {
                            slot,
                            pending: must_read,
                        });
                        acquired.push(slot);
                    }
                    Err(err) => {
                        failure = Some(err);
                        break;
                    }
                }
            }
        }
        let threaded = self.options.readers > 0;
        if failure.is_none() && threaded && self.options.read_ahead {
            // The group's reads are all queued before the first is used.
            for &e in members {
                if let Some(h) = held[e].as_mut() {
                    if std::mem::take(&mut h.pending) {
                        self.enqueue(layer, e, h.slot, false);
                    }
                }
            }
        }
        self.shared.flush_pending();
        if threaded && !(failure.is_none() && self.options.read_ahead) {
            for &slot in &acquired {
                self.shared.queue.promote(slot);
            }
        }
        let result = match failure {
            Some(e) => Err(e),
            None => self.compute_group(layer, xs, picks, held, ys, k_max, stats),
        };
        self.release(acquired.iter().copied());
        result
    }

    /// Token by token (its gate/up tables built once for the group), each
    /// pick held by the group into its own slot of `ys`.
    #[allow(clippy::too_many_arguments)]
    fn compute_group(
        &self,
        layer: usize,
        xs: &[f32],
        picks: &[Vec<(usize, f32)>],
        held: &mut [Option<Held>],
        ys: &mut [f32],
        k_max: usize,
        stats: &mut StepStats,
    ) -> Result<()> {
        let banks = &self.shared.banks;
        let (format, shape) = (banks.format(), banks.shape());
        let width = shape.hidden;
        let cb = banks.bank(layer).and_then(|b| b.codebooks.as_ref());
        let mut scratch = ExpertScratch::new(format, shape);
        let range = banks.payload_range();
        let threaded = self.options.readers > 0;
        for (t, p) in picks.iter().enumerate() {
            if !p.iter().any(|&(e, _)| held[e].is_some()) {
                continue;
            }
            let x = &xs[t * width..(t + 1) * width];
            let tables = quant::build_gate_up_tables(format, cb, x);
            for (j, &(e, _)) in p.iter().enumerate() {
                let Some(h) = held[e].as_mut() else { continue };
                let slot = h.slot;
                if std::mem::take(&mut h.pending) {
                    if threaded {
                        self.enqueue(layer, e, slot, false);
                    } else {
                        self.read_here(layer, e, slot, &mut stats.io_time)?;
                    }
                }
                if threaded {
                    self.wait_ready(slot, &mut stats.io_time)?;
                }
                let buf = self.shared.bufs[slot]
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                quant::expert_forward_act(
                    format,
                    shape,
                    &buf.as_slice()[range.clone()],
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
}
