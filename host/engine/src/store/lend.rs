//! Cache slots lent to a long prompt's prefill. A prompt longer than the
//! plan's chunk re-reads nearly every expert once per chunk when the cache
//! cannot hold the model's experts (a 16K-token prompt in 512-token chunks
//! read 240 GB of a 7.5 GB model), while those records gain it little: a
//! chunk touches every expert of a layer, far more than the cache holds.
//! So for the prompt's length the cache lends slots to larger chunk
//! buffers: each lent slot leaves the cache with no record, its pages go
//! back to the OS, and the prefill's buffers take their place inside the
//! same budget. The slots return, empty, when the loan drops.

use super::ExpertStore;

/// Slots this store lent, given back (empty and free) on drop.
pub struct SlotLoan<'a> {
    store: &'a ExpertStore,
    slots: Vec<usize>,
}

impl SlotLoan<'_> {
    /// Bytes the loan holds: what the plan counted for its slots.
    pub fn bytes(&self) -> u64 {
        (self.slots.len() * self.store.record_bytes()) as u64
    }
}

impl Drop for SlotLoan<'_> {
    fn drop(&mut self) {
        if self.slots.is_empty() {
            return;
        }
        let mut st = self.store.shared.lock();
        for &slot in &self.slots {
            st.lent[slot] = false;
            st.core.unpin(slot);
        }
        st.lent_count -= self.slots.len();
        drop(st);
        self.store.shared.ready.notify_all();
    }
}

impl ExpertStore {
    /// Slots the cache keeps for records while it lends the rest: a
    /// quarter of them, and never fewer than two tokens' picks of a layer
    /// (the plan's least cache), so that a prefill's groups of experts
    /// still overlap their reads and another session's token still pins.
    fn kept_slots(&self) -> usize {
        (self.shared.bufs.len() / 4).max(2 * self.top_k)
    }

    /// Slots usable for records now: the cache's, less those lent.
    pub fn usable_slots(&self) -> usize {
        self.shared.bufs.len() - self.shared.lock().lent_count
    }

    /// Whether lending pays here: only where the cache cannot hold every
    /// expert of the model. Where it can, a larger chunk computes no
    /// faster by much and lending would evict records decode then
    /// re-reads.
    fn lending_pays(&self) -> bool {
        let records = self.shared.banks.moe_layers().len() * self.shared.experts;
        self.shared.bufs.len() < records
    }

    /// Bytes `lend` could hand out now (0 where lending does not pay).
    pub fn lendable_bytes(&self) -> u64 {
        let lent = self.shared.lock().lent_count;
        (self.spare_slots(lent) * self.record_bytes()) as u64
    }

    /// Slots a loan could take with `lent` already out: those past the
    /// kept ones, or none where lending does not pay.
    fn spare_slots(&self, lent: usize) -> usize {
        if !self.lending_pays() {
            return 0;
        }
        (self.shared.bufs.len() - lent).saturating_sub(self.kept_slots())
    }

    /// Lends at least `bytes` of the cache, in whole slots, or nothing
    /// (an empty loan) where it cannot: not so much spare, or an OS that
    /// does not give pages back (`waste_platform::release_pages`). Free
    /// slots go first, then the least recently used records.
    pub fn lend(&self, bytes: u64) -> SlotLoan<'_> {
        let mut loan = SlotLoan { store: self, slots: Vec::new() };
        let record = self.record_bytes() as u64;
        let want = bytes.div_ceil(record.max(1)) as usize;
        {
            let mut st = self.shared.lock();
            if want == 0 || want > self.spare_slots(st.lent_count) {
                return loan;
            }
            while loan.slots.len() < want {
                let Some(slot) = st.core.take_empty() else { break };
                st.lent[slot] = true;
                st.lent_count += 1;
                st.status[slot] = super::Status::Empty;
                st.speculative[slot] = false;
                loan.slots.push(slot);
            }
        }
        // Outside the ledger: a slot's buffer is locked before the ledger
        // wherever both are (`Shared::load`, `fault_ahead`).
        for i in 0..loan.slots.len() {
            let released = self.shared.bufs[loan.slots[i]].lock().unwrap_or_else(|p| p.into_inner()).release();
            if !released {
                return loan.into_empty();
            }
        }
        if loan.slots.len() < want {
            return loan.into_empty();
        }
        loan
    }
}

impl<'a> SlotLoan<'a> {
    /// Gives every slot back now and leaves an empty loan.
    fn into_empty(self) -> SlotLoan<'a> {
        let store = self.store;
        drop(self);
        SlotLoan { store, slots: Vec::new() }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use crate::model::{Model, OpenOptions};
    use crate::plan::{plan, PlanRequest};
    use crate::quant::ExpertFormat;
    use crate::synth::{preset, synth, SynthSpec};

    struct Dir(PathBuf);

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const CONTEXT: usize = 1600;

    /// A synthetic model of 48 q8 records of 1.5 MB, and the least budget
    /// whose plan caches 44 of them: too few to hold the model, so every
    /// chunk of a long prompt re-reads most of them.
    fn model_the_cache_cannot_hold(tag: &str) -> (Dir, PathBuf, u64) {
        let dir = Dir(std::env::temp_dir().join(format!("waste-lend-{tag}-{}", std::process::id())));
        let _ = std::fs::remove_dir_all(&dir.0);
        std::fs::create_dir_all(&dir.0).unwrap();
        let path = dir.0.join("m.waste");
        let spec = SynthSpec {
            hidden: 512,
            inter: 1024,
            experts: 16,
            top_k: 4,
            layers: 3,
            format: ExpertFormat::Q8,
            ..preset("olmoe-trace").unwrap()
        };
        synth(&path, &spec, &mut |_, _| {}).unwrap();
        let container = crate::container::Container::open(&path).unwrap();
        let record = container.manifest().experts.record_bytes;
        let mut budget = 64 << 20;
        let slots = |budget: u64| {
            let request = PlanRequest { context: Some(CONTEXT), budget: Some(budget), ..PlanRequest::default() };
            plan(&container, &request).map_or(0, |p| p.cache_slots)
        };
        while slots(budget) < 44 {
            budget += record;
        }
        assert!(slots(budget) < 48, "the cache holds every record at {budget} B");
        (dir, path, budget)
    }

    /// A prompt longer than the plan's chunk, on experts the cache cannot
    /// all hold, runs in larger chunks on slots the cache lends: fewer
    /// records read, the logits of the plan's chunk bit for bit (the chunk
    /// never changes a bit), and the slots back in the cache afterwards.
    #[test]
    fn a_long_prompt_runs_larger_chunks_on_lent_slots_with_the_same_bits() {
        let (_dir, path, budget) = model_the_cache_cannot_hold("bits");
        let options =
            OpenOptions { context: Some(CONTEXT), budget: Some(budget), preload: false, ..Default::default() };
        let lending = Model::open(&path, &options).unwrap();
        let planned = lending.memory_plan().prefill_chunk;
        let prompt: Vec<u32> = (0..1500u32).map(|i| (i * 37 + 11) % 256).collect();
        assert!(planned < prompt.len(), "the plan's chunk {planned} holds the whole prompt");
        let fixed = Model::open(&path, &OpenOptions { prefill_chunk: Some(planned), ..options.clone() }).unwrap();
        let run = |m: &Model| {
            let mut state = m.new_state();
            let (logits, step) = m.forward(&mut state, &prompt, true).unwrap();
            (logits.iter().map(|v| v.to_bits()).collect::<Vec<u32>>(), step, m.store_stats().reads)
        };
        let (want, fixed_step, fixed_reads) = run(&fixed);
        let (got, step, reads) = run(&lending);
        assert_eq!(fixed_step.prefill_chunk, planned);
        assert!(step.prefill_chunk > planned, "no larger chunk than the plan's {planned}");
        assert!(reads < fixed_reads, "{reads} reads on lent slots, {fixed_reads} in the plan's chunks");
        assert!(got == want, "chunks of {} on lent slots changed the logits", step.prefill_chunk);
        let store = lending.expert_store();
        assert_eq!(store.usable_slots(), lending.memory_plan().cache_slots, "lent slots not given back");
        // Decode after the loan uses every slot again.
        let mut state = lending.new_state();
        lending.forward(&mut state, &prompt[..1], false).unwrap();
    }

    /// What a loan may take: never the kept quarter, never on a cache that
    /// holds the whole model, and nothing it cannot hold in whole slots; a
    /// lent slot takes no record until the loan drops.
    #[test]
    fn a_loan_keeps_a_quarter_of_the_cache_and_its_slots_take_no_record() {
        let (_dir, path, budget) = model_the_cache_cannot_hold("limits");
        let options =
            OpenOptions { context: Some(CONTEXT), budget: Some(budget), preload: false, ..Default::default() };
        let model = Model::open(&path, &options).unwrap();
        let store = model.expert_store();
        let (slots, record) = (store.usable_slots(), store.record_bytes() as u64);
        let kept = (slots / 4).max(2 * 4);
        assert_eq!(store.lendable_bytes(), (slots - kept) as u64 * record);
        assert_eq!(store.lend(store.lendable_bytes() + 1).bytes(), 0, "lent past the kept slots");
        let loan = store.lend(3 * record - 1);
        assert_eq!((loan.bytes(), store.usable_slots()), (3 * record, slots - 3));
        assert_eq!(store.lendable_bytes(), (slots - 3 - kept) as u64 * record);
        // Every layer's experts, more than the usable slots: records cycle
        // through the usable slots, never a lent one.
        let mut state = model.new_state();
        let prompt: Vec<u32> = (0..200u32).map(|i| (i * 101 + 7) % 256).collect();
        model.forward(&mut state, &prompt, false).unwrap();
        {
            let st = store.shared.lock();
            for &slot in &loan.slots {
                assert!(st.lent[slot] && st.core.slots_key(slot).is_none(), "lent slot {slot} took a record");
            }
        }
        drop(loan);
        assert_eq!(store.usable_slots(), slots);
        let whole = Model::open(&path, &OpenOptions { budget: Some(budget + (64 << 20)), ..options }).unwrap();
        assert_eq!(whole.expert_store().lendable_bytes(), 0, "lending on a cache that holds every record");
    }
}
