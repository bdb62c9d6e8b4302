//! Pinning records for a computation: the store's side of a routed-expert
//! step. [`ExpertStore::pin`] acquires a slot for each expert (a hit, or a
//! miss whose read it issues), and the [`Pinned`] it returns hands each
//! record's payload to the caller once it is in RAM — in landing order when
//! reader threads read ahead, else in the given order — and unpins them all
//! when dropped. The arithmetic lives with the router, in
//! `model::experts`; nothing here looks inside a payload.

use std::ops::Deref;
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use super::io::AlignedBuf;
use super::readers::{self, Tier};
use super::{ExpertStore, Ledger, Status};
use crate::error::{Error, Result};
use crate::stats::StepStats;

/// The records of one computation's experts, pinned in the cache until
/// dropped (whatever happened in between).
pub struct Pinned<'s> {
    store: &'s ExpertStore,
    layer: usize,
    experts: Vec<usize>,
    /// Per expert: its slot, and whether its read is still to be issued
    /// (no read-ahead) or done here (no reader threads).
    slots: Vec<usize>,
    pending: Vec<bool>,
}

/// A record's payload, in RAM, held while the caller computes from it.
pub struct Payload<'p> {
    buf: MutexGuard<'p, AlignedBuf>,
    range: std::ops::Range<usize>,
}

impl Deref for Payload<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.buf.as_slice()[self.range.clone()]
    }
}

impl ExpertStore {
    /// Pins the records of `experts` (distinct) of decoder layer `layer`,
    /// issuing the reads of those not cached; `uses[i]` is how many tokens
    /// will use `experts[i]` (the learned hotlist counts each), empty for
    /// one each. With reader threads and read-ahead, every read is queued
    /// before this returns, so the caller's own work (building lookup
    /// tables) overlaps the disk.
    pub fn pin(&self, layer: usize, experts: &[usize], uses: &[u64], stats: &mut StepStats) -> Result<Pinned<'_>> {
        let bank =
            self.shared.banks.bank(layer).ok_or_else(|| Error::Runtime(format!("layer {layer} has no experts")))?;
        if let Some(&bad) = experts.iter().find(|&&e| e >= bank.experts) {
            return Err(Error::Runtime(format!("layer {layer}: expert {bad} out of range")));
        }
        if experts.len() > self.shared.bufs.len() {
            return Err(Error::Runtime(format!(
                "{} experts routed, the cache holds {}",
                experts.len(),
                self.shared.bufs.len()
            )));
        }
        let mut pinned = Pinned {
            store: self,
            layer,
            experts: Vec::with_capacity(experts.len()),
            slots: Vec::with_capacity(experts.len()),
            pending: Vec::with_capacity(experts.len()),
        };
        let mut failure = None;
        {
            let mut st = self.shared.lock();
            let named = |predicted: &[u32]| experts.iter().filter(|&&e| predicted.contains(&(e as u32))).count() as u64;
            let predicted = std::mem::take(&mut st.predicted[layer]);
            if !predicted.is_empty() {
                st.stats.lookahead_picks += experts.len() as u64;
                st.stats.lookahead_named += named(&predicted);
            }
            let predicted = std::mem::take(&mut st.predicted_later[layer]);
            if !predicted.is_empty() {
                st.stats.lookahead_later_picks += experts.len() as u64;
                st.stats.lookahead_later_named += named(&predicted);
            }
            if experts.len() == self.top_k && uses.iter().all(|&n| n <= 1) {
                if let (Some(log), Some(index)) = (st.routes.as_mut(), self.shared.moe_index[layer]) {
                    let mut ids: Vec<u32> = experts.iter().map(|&e| e as u32).collect();
                    ids.sort_unstable();
                    log.push((index, ids));
                }
            }
            for (i, &e) in experts.iter().enumerate() {
                let (guard, r) = self.acquire(st, layer, e, stats);
                st = guard;
                match r {
                    Ok((slot, must_read)) => {
                        // One acquire counts one use; the hotlist counts
                        // every token's.
                        if let (Some(&n), Some(k)) = (uses.get(i), self.key_index(layer, e)) {
                            st.usage[k] += n.saturating_sub(1);
                        }
                        pinned.experts.push(e);
                        pinned.slots.push(slot);
                        pinned.pending.push(must_read);
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
            // Every read is in the queue before the first record is used.
            for i in 0..pinned.slots.len() {
                if std::mem::take(&mut pinned.pending[i]) {
                    self.enqueue(layer, pinned.experts[i], pinned.slots[i], Tier::Demand);
                }
            }
        }
        if threaded {
            // A speculative read of a record now needed moves to the front;
            // one of this layer that it did not pick is taken back.
            for &slot in &pinned.slots {
                self.shared.queue.promote(slot, Tier::Demand);
            }
            if failure.is_none() {
                self.withdraw_unpicked(layer, experts, stats);
            }
        }
        self.shared.flush_pending();
        match failure {
            // Dropping `pinned` releases what was acquired.
            Some(e) => Err(e),
            None => Ok(pinned),
        }
    }

    /// Pins a slot holding (`layer`, `expert`), inserting it (the `bool`
    /// is then `true`: it must be read) on a miss; waits for a pin to drop
    /// when every slot is pinned.
    fn acquire<'a>(
        &'a self,
        mut st: MutexGuard<'a, Ledger>,
        layer: usize,
        expert: usize,
        step: &mut StepStats,
    ) -> (MutexGuard<'a, Ledger>, Result<(usize, bool)>) {
        let key = (layer as u32, expert as u32);
        let hash_layer = self.options.hash_layers.get(layer).copied().unwrap_or(false);
        loop {
            if let Some(i) = self.key_index(layer, expert) {
                st.usage[i] += 1;
            }
            if self.options.keep {
                if let Some(slot) = st.core.lookup(key) {
                    if st.status[slot] == Status::Empty {
                        // A guess taken back before its read: the record
                        // kept its place, its bytes must be read now.
                        st.status[slot] = Status::Loading;
                        self.count_miss(&mut st, hash_layer, step);
                        return (st, Ok((slot, true)));
                    }
                    let prefetched = std::mem::take(&mut st.speculative[slot]);
                    let picks = if prefetched {
                        step.experts_prefetched += 1;
                        &mut st.stats.picks.prefetched
                    } else {
                        step.experts_reused += 1;
                        &mut st.stats.picks.reused
                    };
                    *picks += 1;
                    if hash_layer {
                        let hash = &mut st.stats.hash_picks;
                        *(if prefetched { &mut hash.prefetched } else { &mut hash.reused }) += 1;
                    }
                    return (st, Ok((slot, false)));
                }
            }
            if let Some(slot) = st.core.insert(key) {
                st.status[slot] = Status::Loading;
                st.speculative[slot] = false;
                self.count_miss(&mut st, hash_layer, step);
                return (st, Ok((slot, true)));
            }
            if st.in_flight == 0 {
                let n = st.core.len();
                return (
                    st,
                    Err(Error::Runtime(format!(
                        "every one of the {n} expert cache slots is in use: too small a cache for this many concurrent sessions"
                    ))),
                );
            }
            if let Some(i) = self.key_index(layer, expert) {
                st.usage[i] -= 1;
            }
            // Held-back speculative reads hold pins: let them run.
            self.shared.flush_pending();
            st = self.shared.ready.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Counts a pick whose record must be read on demand.
    fn count_miss(&self, st: &mut Ledger, hash_layer: bool, step: &mut StepStats) {
        st.stats.picks.missed += 1;
        if hash_layer {
            st.stats.hash_picks.missed += 1;
        }
        st.stats.reads += 1;
        st.stats.bytes_read += self.record_bytes() as u64;
        step.experts_missed += 1;
        step.bytes_read += self.record_bytes() as u64;
    }

    /// Waits until `slot` has been read; the error of a failed read.
    fn wait_ready(&self, slot: usize, io_wait: &mut Duration) -> Result<()> {
        let started = Instant::now();
        let mut st = self.shared.lock();
        while st.status[slot] == Status::Loading {
            st = self.shared.ready.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        let waited = started.elapsed();
        *io_wait += waited;
        st.stats.io_wait += waited;
        match &st.status[slot] {
            Status::Ready => Ok(()),
            Status::Failed(msg) => Err(Error::Runtime(msg.clone())),
            other => Err(Error::Runtime(format!("expert slot {slot} is {other:?} after its read"))),
        }
    }

    /// Index into `left` of the first pick (in router order) whose record
    /// is in RAM, waiting for the next read to land when none is; the error
    /// of a failed read.
    fn next_ready(&self, left: &[usize], slots: &[usize], io_wait: &mut Duration) -> Result<usize> {
        let mut st = self.shared.lock();
        let mut waited = None;
        let found = loop {
            let ready = left.iter().position(|&j| st.status[slots[j]] != Status::Loading);
            if let Some(i) = ready {
                break i;
            }
            waited.get_or_insert_with(Instant::now);
            st = self.shared.ready.wait(st).unwrap_or_else(|p| p.into_inner());
        };
        if let Some(started) = waited {
            let w = started.elapsed();
            *io_wait += w;
            st.stats.io_wait += w;
        }
        let slot = slots[left[found]];
        match &st.status[slot] {
            Status::Ready => Ok(found),
            Status::Failed(msg) => Err(Error::Runtime(msg.clone())),
            other => Err(Error::Runtime(format!("expert slot {slot} is {other:?} after its read"))),
        }
    }

    /// Unpins the records one call acquired, whatever happened to it.
    fn release(&self, slots: impl IntoIterator<Item = usize>) {
        let mut st = self.shared.lock();
        for slot in slots {
            if st.status[slot] == Status::Loading && !st.reading[slot] {
                // An error came before this record's read was issued.
                st.status[slot] = Status::Empty;
                st.core.forget(slot);
            }
            st.core.unpin(slot);
            if !self.options.keep {
                st.core.forget(slot);
            }
        }
        drop(st);
        self.shared.ready.notify_all();
    }

    /// Takes back the speculative reads of `layer` not yet started whose
    /// record `experts` (the layer's routing, now known) does not use. Each
    /// record keeps its place in the cache, unread (`Status::Empty`), so the
    /// cache holds the same records however far the readers had got: only
    /// whether those bytes were read depends on timing, never what is
    /// reused. A later pick or guess reads it. A record some pick has
    /// meanwhile taken from its slot goes back to be read.
    fn withdraw_unpicked(&self, layer: usize, experts: &[usize], stats: &mut StepStats) {
        let wanted = |e: usize| experts.contains(&e);
        let mut stale = self.shared.queue.withdraw(layer, wanted);
        self.shared.pending.lock().unwrap_or_else(|p| p.into_inner()).retain(|(r, _)| {
            let unpicked = r.layer == layer && !wanted(r.expert);
            if unpicked {
                stale.push(*r);
            }
            !unpicked
        });
        if stale.is_empty() {
            return;
        }
        let record = self.record_bytes() as u64;
        let mut st = self.shared.lock();
        let mut still_wanted = Vec::new();
        for r in stale {
            if !std::mem::take(&mut st.speculative[r.slot]) {
                still_wanted.push(r);
                continue;
            }
            st.status[r.slot] = Status::Empty;
            st.reading[r.slot] = false;
            st.in_flight -= 1;
            st.core.unpin(r.slot);
            // Saturating: the counters may have been reset since the issue.
            let s = &mut st.stats;
            s.prefetch_issued = s.prefetch_issued.saturating_sub(1);
            s.prefetch_withdrawn += 1;
            s.reads = s.reads.saturating_sub(1);
            s.bytes_read = s.bytes_read.saturating_sub(record);
            stats.bytes_read = stats.bytes_read.saturating_sub(record);
        }
        drop(st);
        for r in still_wanted {
            self.shared.queue.push(r, Tier::Demand);
        }
        self.shared.ready.notify_all();
    }

    /// Hands a read of `slot` to the readers (which then own one pin).
    fn enqueue(&self, layer: usize, expert: usize, slot: usize, tier: Tier) {
        {
            let mut st = self.shared.lock();
            st.core.pin(slot);
            st.in_flight += 1;
            st.reading[slot] = true;
        }
        self.shared.queue.push(readers::Request { layer, expert, slot }, tier);
    }

    /// Reads on the calling thread (no reader threads).
    fn read_here(&self, layer: usize, expert: usize, slot: usize, io_wait: &mut Duration) -> Result<()> {
        {
            let mut st = self.shared.lock();
            st.core.pin(slot);
            st.in_flight += 1;
            st.reading[slot] = true;
        }
        let started = Instant::now();
        let result = self.shared.load(layer, expert, slot);
        self.shared.finish(slot, result, Duration::ZERO);
        let took = started.elapsed();
        *io_wait += took;
        self.shared.lock().stats.io_wait += took;
        self.wait_ready(slot, &mut Duration::default())
    }

    /// Experts of the next MoE layer to read speculatively in decode
    /// (router lookahead); 0 = none (no cache to keep them, or no readers
    /// to read them ahead).
    pub fn lookahead(&self) -> usize {
        if self.options.keep && self.options.readers > 0 {
            self.options.lookahead
        } else {
            0
        }
    }

    /// How many MoE layers ahead the lookahead guesses (at least 1).
    pub fn lookahead_layers(&self) -> usize {
        self.options.lookahead_layers.max(1)
    }

    /// Starts speculative reads of `experts` of `layer`, `ahead` MoE layers
    /// after the one running (a hint: records already cached, out of range,
    /// or for which no slot can be spared are skipped). They reach the
    /// readers after the current layer's demand reads; a guess at a layer
    /// beyond the next is read only when no nearer read waits, and a guess
    /// at the next layer moves such a read of the same record up. Only
    /// which bytes move may change, never a result.
    pub fn prefetch(&self, layer: usize, experts: &[usize], ahead: usize, stats: &mut StepStats) {
        let Some(bank) = self.shared.banks.bank(layer) else {
            return;
        };
        let tier = if ahead <= 1 { Tier::Next } else { Tier::Later };
        let mut issued = Vec::new();
        let mut nearer = Vec::new();
        {
            let mut st = self.shared.lock();
            let named = experts.iter().map(|&e| e as u32).collect();
            match tier {
                Tier::Later => st.predicted_later[layer] = named,
                _ => st.predicted[layer] = named,
            }
            for &expert in experts {
                let key = (layer as u32, expert as u32);
                let held = st.core.slot_of(key);
                if let Some(slot) = held {
                    if tier == Tier::Next && st.reading[slot] && st.speculative[slot] {
                        nearer.push(slot);
                    }
                    let taken_back = st.status[slot] == Status::Empty && !st.reading[slot];
                    if !taken_back {
                        continue;
                    }
                }
                // Room for a whole demand top-k always stays unpinned.
                if expert >= bank.experts || st.core.evictable() <= 2 * self.top_k {
                    continue;
                }
                let slot = match held {
                    // A guess taken back earlier, guessed again: it kept its slot.
                    Some(slot) => {
                        st.core.pin(slot);
                        slot
                    }
                    None => match st.core.insert(key) {
                        Some(slot) => slot,
                        None => break,
                    },
                };
                self.issue_guess(&mut st, slot, stats);
                issued.push((readers::Request { layer, expert, slot }, tier));
            }
        }
        for slot in nearer {
            self.shared.queue.promote(slot, Tier::Next);
        }
        // The insert's pin is the reader's; the reads are queued once this
        // layer's demand reads are (`flush_pending`).
        self.shared.pending.lock().unwrap_or_else(|p| p.into_inner()).extend(issued);
    }

    /// Marks pinned `slot` as read by a guess, and counts the read.
    fn issue_guess(&self, st: &mut Ledger, slot: usize, stats: &mut StepStats) {
        st.status[slot] = Status::Loading;
        st.speculative[slot] = true;
        st.reading[slot] = true;
        st.in_flight += 1;
        st.stats.prefetch_issued += 1;
        st.stats.reads += 1;
        st.stats.bytes_read += self.record_bytes() as u64;
        stats.bytes_read += self.record_bytes() as u64;
    }
}

impl<'s> Pinned<'s> {
    /// Whether records are handed out as their reads land (reader threads
    /// reading ahead) rather than in the order they were pinned.
    pub fn lands_in_any_order(&self) -> bool {
        self.store.options.readers > 0 && self.store.options.read_ahead
    }

    /// Index into `left` (indices into the pinned experts) of the first one,
    /// in that order, whose record is in RAM, waiting for the next read to
    /// land when none is; the error of a failed read. Only when
    /// [`lands_in_any_order`](Self::lands_in_any_order).
    pub fn next_landed(&self, left: &[usize], io_wait: &mut Duration) -> Result<usize> {
        self.store.next_ready(left, &self.slots, io_wait)
    }

    /// Makes sure pinned expert `i`'s record is in RAM: issues its read if
    /// that was left for now (or reads it here, without reader threads)
    /// and waits for it.
    pub fn wait(&mut self, i: usize, io_wait: &mut Duration) -> Result<()> {
        let store = self.store;
        let (expert, slot) = (self.experts[i], self.slots[i]);
        let threaded = store.options.readers > 0;
        if std::mem::take(&mut self.pending[i]) {
            if !threaded {
                return store.read_here(self.layer, expert, slot, io_wait);
            }
            store.enqueue(self.layer, expert, slot, Tier::Demand);
        }
        // Also for a hit: another session may still be reading that slot.
        store.wait_ready(slot, io_wait)
    }

    /// The store the records are pinned in.
    pub fn store(&self) -> &'s ExpertStore {
        self.store
    }

    /// The payload of pinned expert `i`, which [`wait`](Self::wait) or
    /// [`next_landed`](Self::next_landed) has seen land.
    pub fn payload(&self, i: usize) -> Payload<'s> {
        let buf = self.store.shared.bufs[self.slots[i]].lock().unwrap_or_else(|p| p.into_inner());
        Payload { buf, range: self.store.shared.banks.payload_range(self.layer) }
    }
}

impl Drop for Pinned<'_> {
    fn drop(&mut self) {
        self.store.release(self.slots.iter().copied());
    }
}
