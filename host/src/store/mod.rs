//! The expert store: routed experts read from their banks with one direct
//! positional read per record, by reader threads serving a request queue,
//! into the slots of a bounded cache carved out of the RAM budget.
//!
//! Placement never changes the result: each of a layer's experts is
//! computed from the same bytes into its own row, whether they came from the
//! cache, a read-ahead, a speculative lookahead read or a synchronous read,
//! and the rows are summed in router order, whatever order they landed in.

mod batch;
pub mod cache;
pub mod io;
mod readers;
pub mod trace;
mod usage;
#[cfg(test)]
mod tests;

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use cache::{simulate, CacheCore, CachePolicy, SimResult};
use io::{slot_buffers, AlignedBuf, BankFile};
pub use usage::USAGE_FILE;

use crate::container::ExpertBanks;
use crate::error::{Error, Result};
use crate::model::source::ExpertProvider;
use crate::quant::{self, ExpertScratch};
use crate::stats::StepStats;

/// How the store moves bytes. None of it changes a logit.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreOptions {
    /// Records the cache holds (also the I/O buffers: reads land in slots).
    pub cache_slots: usize,
    /// Keep records after use; `false` reads every use (the plain path).
    pub keep: bool,
    pub policy: CachePolicy,
    /// Reader threads; 0 reads on the calling thread.
    pub readers: usize,
    /// Request a layer's whole top-k before consuming the first record.
    pub read_ahead: bool,
    /// Bypass the page cache when the file system allows it.
    pub direct_io: bool,
    /// Experts of the next MoE layer read speculatively in decode; 0 = off.
    pub lookahead: usize,
    /// Back the slots with transparent huge pages where the kernel allows
    /// (see [`io::slot_buffers`]).
    pub huge_pages: bool,
    /// Seed of the eviction sampler.
    pub seed: u64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            cache_slots: 0,
            keep: true,
            policy: CachePolicy::default(),
            readers: 2,
            read_ahead: true,
            direct_io: true,
            // On: 1.12-1.24x decode tok/s at a cold budget, 0.96-1.12x at
            // warmer ones (docs/PERFORMANCE.md, "Router lookahead").
            lookahead: 6,
            huge_pages: true,
            seed: 0x5EED,
        }
    }
}

/// Aggregate counters of a store since open (or the last reset).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StoreStats {
    pub hits: u64,
    pub misses: u64,
    /// Records read (demand, speculative and preload).
    pub reads: u64,
    pub bytes_read: u64,
    /// Time the forward pass waited for records.
    pub io_wait: Duration,
    /// Sum over reads of the time each `pread` took.
    pub read_time: Duration,
    /// System CPU time the reader threads spent in their reads (Linux).
    pub reader_sys_time: Duration,
    pub prefetch_issued: u64,
    /// Speculative reads that a later demand used.
    pub prefetch_used: u64,
    pub preloaded: u64,
    pub direct_io: bool,
    /// The cache slots are advised to use transparent huge pages.
    pub huge_pages: bool,
    pub cache_slots: usize,
    pub cache_bytes: u64,
    pub record_bytes: u64,
}

impl StoreStats {
    /// Bytes of the records a forward pass actually used after reading
    /// them: demand reads, and speculative reads that a demand then hit.
    /// `bytes_read` less this is speculation that never paid (or has not
    /// yet).
    pub fn useful_bytes(&self) -> u64 {
        (self.misses + self.prefetch_used) * self.record_bytes
    }

    pub fn hit_rate(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 {
            0.0
        } else {
            self.hits as f64 / total as f64
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Status {
    Empty,
    Loading,
    Ready,
    Failed(String),
}

struct State {
    core: CacheCore,
    status: Vec<Status>,
    /// Loaded by a speculative read and not yet used by a demand.
    speculative: Vec<bool>,
    in_flight: usize,
    /// A read of the slot is queued or running.
    reading: Vec<bool>,
    stats: StoreStats,
    /// Demand uses per (MoE layer index, expert), for the learned hotlist.
    usage: Vec<u64>,
}

pub(crate) struct Shared {
    banks: ExpertBanks,
    files: Vec<Option<BankFile>>,
    bufs: Vec<Mutex<AlignedBuf>>,
    state: Mutex<State>,
    ready: Condvar,
    queue: readers::Queue,
    /// Speculative reads issued by `prefetch` and not yet queued: they go to
    /// the readers only after the current layer's demand reads, so that a
    /// guess at the next layer never delays a record needed now.
    pending: Mutex<Vec<readers::Request>>,
    /// Decoder layer -> index among MoE layers.
    moe_index: Vec<Option<usize>>,
    experts: usize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the bookkeeping half
        // updated in a way that matters more than losing the model would.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads record (`layer`, `expert`) into slot `slot` and checks it.
    fn load(&self, layer: usize, expert: usize, slot: usize) -> Result<Duration> {
        let file = self.files[layer]
            .as_ref()
            .ok_or_else(|| Error::Runtime(format!("layer {layer} has no experts")))?;
        let record = self.banks.record_bytes();
        let mut buf = self.bufs[slot].lock().unwrap_or_else(|p| p.into_inner());
        let started = Instant::now();
        let bytes = &mut buf.as_mut_slice()[..record];
        let path = &self.banks.bank(layer).map(|b| b.path.clone()).unwrap_or_default();
        file.read_at(bytes, (expert * record) as u64)
            .map_err(|e| Error::io(path, e))?;
        let took = started.elapsed();
        self.banks.check_header(layer, expert, bytes)?;
        Ok(took)
    }

    /// Records the outcome of a read of `slot` (and the system time it
    /// cost the reading thread) and drops the reader's pin.
    fn finish(&self, slot: usize, result: Result<Duration>, sys: Duration) {
        let mut st = self.lock();
        st.stats.reader_sys_time += sys;
        match result {
            Ok(took) => {
                st.status[slot] = Status::Ready;
                st.stats.read_time += took;
            }
            Err(e) => {
                st.status[slot] = Status::Failed(e.to_string());
                st.core.forget(slot);
            }
        }
        st.in_flight -= 1;
        st.reading[slot] = false;
        st.core.unpin(slot);
        drop(st);
        self.ready.notify_all();
    }

    /// Queues the speculative reads `prefetch` held back.
    fn flush_pending(&self) {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        for r in pending {
            self.queue.push(r, true);
        }
    }
}

pub struct ExpertStore {
    shared: Arc<Shared>,
    options: StoreOptions,
    threads: Vec<JoinHandle<()>>,
    direct_io: bool,
    top_k: usize,
}

impl ExpertStore {
    /// Opens every bank and allocates `options.cache_slots` record buffers
    /// (at least `top_k`: reads land in slots).
    pub fn open(banks: ExpertBanks, top_k: usize, options: StoreOptions) -> Result<ExpertStore> {
        let record = banks.record_bytes();
        let layers = banks.moe_layers();
        let slots = options.cache_slots;
        if slots < top_k.max(1) {
            return Err(Error::Arg(format!(
                "an expert cache of {slots} records cannot hold one layer's top-{top_k}"
            )));
        }
        let n_layers = layers.last().map_or(0, |l| l + 1);
        let mut files: Vec<Option<BankFile>> = (0..n_layers).map(|_| None).collect();
        let mut moe_index = vec![None; n_layers];
        let mut direct_io = options.direct_io && !layers.is_empty();
        let mut experts = 0;
        for (i, &l) in layers.iter().enumerate() {
            let bank = banks
                .bank(l)
                .ok_or_else(|| Error::Runtime(format!("layer {l} has no bank")))?;
            let file = BankFile::open(&bank.path, options.direct_io, record)?;
            direct_io &= file.direct();
            files[l] = Some(file);
            moe_index[l] = Some(i);
            experts = bank.experts;
        }
        let bufs: Vec<_> = slot_buffers(slots, record, options.huge_pages)?
            .into_iter()
            .map(Mutex::new)
            .collect();
        let huge_pages = bufs.first().is_some_and(|b| b.lock().unwrap_or_else(|p| p.into_inner()).huge());
        let stats = StoreStats {
            direct_io,
            huge_pages,
            cache_slots: slots,
            cache_bytes: (slots * record) as u64,
            record_bytes: record as u64,
            ..StoreStats::default()
        };
        let state = State {
            core: CacheCore::new(slots, options.policy, options.seed),
            status: vec![Status::Empty; slots],
            speculative: vec![false; slots],
            in_flight: 0,
            reading: vec![false; slots],
            stats,
            usage: vec![0; layers.len() * experts],
        };
        let shared = Arc::new(Shared {
            banks,
            files,
            bufs,
            state: Mutex::new(state),
            ready: Condvar::new(),
            queue: readers::Queue::default(),
            pending: Mutex::new(Vec::new()),
            moe_index,
            experts,
        });
        let threads = (0..options.readers)
            .map(|i| readers::spawn(shared.clone(), i))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| Error::Runtime(format!("starting a reader thread: {e}")))?;
        Ok(ExpertStore {
            shared,
            options,
            threads,
            direct_io,
            top_k,
        })
    }

    pub fn options(&self) -> &StoreOptions {
        &self.options
    }

    /// Whether every bank is read with the page cache bypassed.
    pub fn direct_io(&self) -> bool {
        self.direct_io
    }

    pub fn record_bytes(&self) -> usize {
        self.shared.banks.record_bytes()
    }

    /// Bytes of record buffers allocated (the cache).
    pub fn allocated_bytes(&self) -> u64 {
        self.shared
            .bufs
            .iter()
            .map(|b| b.lock().unwrap_or_else(|p| p.into_inner()).len() as u64)
            .sum()
    }

    pub fn stats(&self) -> StoreStats {
        self.shared.lock().stats
    }

    pub fn reset_stats(&self) {
        let mut st = self.shared.lock();
        let keep = st.stats;
        st.stats = StoreStats {
            direct_io: keep.direct_io,
            huge_pages: keep.huge_pages,
            cache_slots: keep.cache_slots,
            cache_bytes: keep.cache_bytes,
            record_bytes: keep.record_bytes,
            ..StoreStats::default()
        };
    }

    /// The bank files' descriptors, for checks of how they were opened.
    pub fn bank_files(&self) -> impl Iterator<Item = &std::fs::File> {
        self.shared.files.iter().flatten().map(BankFile::file)
    }

    pub fn banks(&self) -> &ExpertBanks {
        &self.shared.banks
    }

    fn key_index(&self, layer: usize, expert: usize) -> Option<usize> {
        let i = (*self.shared.moe_index.get(layer)?)?;
        Some(i * self.shared.experts + expert)
    }

    /// Demand uses per MoE layer and expert since open.
    pub fn usage(&self) -> Vec<u64> {
        self.shared.lock().usage.clone()
    }

    /// Saves the demand-use counts, added to those already in `path`.
    pub fn save_usage(&self, path: &std::path::Path) -> Result<()> {
        let counts = self.usage();
        let layers = self.shared.banks.moe_layers().len();
        usage::save(path, layers, self.shared.experts, &counts)
    }

    /// Reads the hottest experts of the usage file at `path` into the
    /// cache, as many as fit; returns how many. No file: nothing to do.
    pub fn preload_usage(&self, path: &std::path::Path) -> Result<usize> {
        if !path.is_file() || !self.options.keep {
            return Ok(0);
        }
        let layers = self.shared.banks.moe_layers();
        let counts = usage::load(path, layers.len(), self.shared.experts)?;
        let mut order: Vec<usize> = (0..counts.len()).filter(|&i| counts[i] > 0).collect();
        order.sort_by(|&a, &b| counts[b].cmp(&counts[a]).then(a.cmp(&b)));
        order.truncate(self.shared.bufs.len());
        for &i in &order {
            let (layer, expert) = (layers[i / self.shared.experts], i % self.shared.experts);
            let slot = {
                let mut st = self.shared.lock();
                let Some(slot) = st.core.insert((layer as u32, expert as u32)) else {
                    break;
                };
                st.status[slot] = Status::Loading;
                st.reading[slot] = true;
                st.in_flight += 1;
                slot
            };
            let result = self.shared.load(layer, expert, slot);
            let ok = result.is_ok();
            self.shared.finish(slot, result, Duration::ZERO);
            let mut st = self.shared.lock();
            if ok {
                st.stats.preloaded += 1;
                st.stats.reads += 1;
                st.stats.bytes_read += self.record_bytes() as u64;
            }
        }
        Ok(order.len())
    }

    /// Measures raw random-read bandwidth of whole records with this
    /// store's I/O mode and buffers: `reads` records at pseudo-random
    /// (layer, expert) positions, spread over `threads` threads. Returns
    /// (bytes, seconds).
    pub fn measure_random_reads(&self, reads: usize, threads: usize, seed: u64) -> Result<(u64, f64)> {
        let huge = self.stats().huge_pages;
        self.measure_random_reads_with(reads, threads, seed, huge)
    }

    /// [`Self::measure_random_reads`] into buffers backed by huge pages
    /// (`huge`, where the kernel allows) or by ordinary 4 KiB pages.
    pub fn measure_random_reads_with(&self, reads: usize, threads: usize, seed: u64, huge: bool) -> Result<(u64, f64)> {
        let layers = self.shared.banks.moe_layers();
        let record = self.record_bytes();
        let threads = threads.max(1);
        let started = Instant::now();
        let results: Vec<Result<u64>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let layers = &layers;
                    let shared = &self.shared;
                    s.spawn(move || -> Result<u64> {
                        let mut buf = slot_buffers(1, record, huge)?.pop().ok_or_else(|| Error::Runtime("no buffer".into()))?;
                        let mut rng = seed ^ ((t as u64 + 1) * 0x9E37_79B9_7F4A_7C15) | 1;
                        let mut bytes = 0;
                        for _ in (t..reads).step_by(threads) {
                            rng ^= rng << 13;
                            rng ^= rng >> 7;
                            rng ^= rng << 17;
                            let layer = layers[(rng % layers.len() as u64) as usize];
                            let expert = ((rng >> 20) % shared.experts as u64) as usize;
                            let file = shared.files[layer]
                                .as_ref()
                                .ok_or_else(|| Error::Runtime("no bank".into()))?;
                            file.read_at(&mut buf.as_mut_slice()[..record], (expert * record) as u64)
                                .map_err(|e| Error::Runtime(format!("random read: {e}")))?;
                            bytes += record as u64;
                        }
                        Ok(bytes)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::Runtime("reader panicked".into())))
                })
                .collect()
        });
        let seconds = started.elapsed().as_secs_f64();
        let mut total = 0;
        for r in results {
            total += r?;
        }
        Ok((total, seconds))
    }

    /// Pins a slot holding (`layer`, `expert`), inserting it (the `bool`
    /// is then `true`: it must be read) on a miss; waits for a pin to drop
    /// when every slot is pinned.
    fn acquire<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        layer: usize,
        expert: usize,
        step: &mut StepStats,
    ) -> (MutexGuard<'a, State>, Result<(usize, bool)>) {
        let key = (layer as u32, expert as u32);
        loop {
            if let Some(i) = self.key_index(layer, expert) {
                st.usage[i] += 1;
            }
            if self.options.keep {
                if let Some(slot) = st.core.lookup(key) {
                    if std::mem::take(&mut st.speculative[slot]) {
                        st.stats.prefetch_used += 1;
                    }
                    st.stats.hits += 1;
                    step.experts_hit += 1;
                    return (st, Ok((slot, false)));
                }
            }
            if let Some(slot) = st.core.insert(key) {
                st.status[slot] = Status::Loading;
                st.speculative[slot] = false;
                st.stats.misses += 1;
                st.stats.reads += 1;
                st.stats.bytes_read += self.record_bytes() as u64;
                step.experts_missed += 1;
                step.bytes_read += self.record_bytes() as u64;
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
            other => Err(Error::Runtime(format!(
                "expert slot {slot} is {other:?} after its read"
            ))),
        }
    }

    /// Index into `left` of the first pick (in router order) whose record
    /// is in RAM, waiting for the next read to land when none is; the error
    /// of a failed read.
    fn next_ready(&self, left: &[usize], slots: &[(usize, bool)], io_wait: &mut Duration) -> Result<usize> {
        let mut st = self.shared.lock();
        let mut waited = None;
        let found = loop {
            let ready = left
                .iter()
                .position(|&j| st.status[slots[j].0] != Status::Loading);
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
        let slot = slots[left[found]].0;
        match &st.status[slot] {
            Status::Ready => Ok(found),
            Status::Failed(msg) => Err(Error::Runtime(msg.clone())),
            other => Err(Error::Runtime(format!(
                "expert slot {slot} is {other:?} after its read"
            ))),
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

    /// Hands a read of `slot` to the readers (which then own one pin).
    fn enqueue(&self, layer: usize, expert: usize, slot: usize, speculative: bool) {
        {
            let mut st = self.shared.lock();
            st.core.pin(slot);
            st.in_flight += 1;
            st.reading[slot] = true;
        }
        self.shared
            .queue
            .push(readers::Request { layer, expert, slot }, speculative);
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
}

impl Drop for ExpertStore {
    fn drop(&mut self) {
        self.shared.queue.shut_down();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
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
        let banks = &self.shared.banks;
        let bank = banks
            .bank(layer)
            .ok_or_else(|| Error::Runtime(format!("layer {layer} has no experts")))?;
        if let Some(&(bad, _)) = picks.iter().find(|p| p.0 >= bank.experts) {
            return Err(Error::Runtime(format!("layer {layer}: expert {bad} out of range")));
        }
        if picks.len() > self.shared.bufs.len() {
            return Err(Error::Runtime(format!(
                "{} experts routed, the cache holds {}",
                picks.len(),
                self.shared.bufs.len()
            )));
        }
        let mut slots: Vec<(usize, bool)> = Vec::with_capacity(picks.len());
        let mut failure = None;
        {
            let mut st = self.shared.lock();
            for &(expert, _) in picks {
                let (guard, r) = self.acquire(st, layer, expert, stats);
                st = guard;
                match r {
                    Ok(s) => slots.push(s),
                    Err(e) => {
                        failure = Some(e);
                        break;
                    }
                }
            }
        }
        let threaded = self.options.readers > 0;
        if failure.is_none() && threaded && self.options.read_ahead {
            // The whole top-k is in the queue before the first record is used.
            for (&(expert, _), &(slot, must_read)) in picks.iter().zip(&slots) {
                if must_read {
                    self.enqueue(layer, expert, slot, false);
                }
            }
        }
        self.shared.flush_pending();
        if threaded && !(failure.is_none() && self.options.read_ahead) {
            // A speculative read of a record now needed moves to the front.
            for &(slot, _) in &slots {
                self.shared.queue.promote(slot);
            }
        }
        let result = match failure {
            Some(e) => Err(e),
            None => self.compute(layer, x, picks, &slots, out, stats),
        };
        self.release(slots.iter().map(|&(slot, _)| slot));
        result
    }

    fn forward_experts_batch(
        &self,
        layer: usize,
        xs: &[f32],
        picks: &[Vec<(usize, f32)>],
        outs: &mut [f32],
        stats: &mut StepStats,
    ) -> Result<()> {
        self.forward_batch(layer, xs, picks, outs, stats)
    }

    fn lookahead(&self) -> usize {
        if self.options.keep && self.options.readers > 0 {
            self.options.lookahead
        } else {
            0
        }
    }

    fn prefetch(&self, layer: usize, experts: &[usize], stats: &mut StepStats) {
        let Some(bank) = self.shared.banks.bank(layer) else {
            return;
        };
        let mut issued = Vec::new();
        {
            let mut st = self.shared.lock();
            for &expert in experts {
                let key = (layer as u32, expert as u32);
                // Room for a whole demand top-k always stays unpinned.
                if expert >= bank.experts || st.core.contains(key) || st.core.evictable() <= 2 * self.top_k {
                    continue;
                }
                let Some(slot) = st.core.insert(key) else { break };
                st.status[slot] = Status::Loading;
                st.speculative[slot] = true;
                st.reading[slot] = true;
                st.in_flight += 1;
                st.stats.prefetch_issued += 1;
                st.stats.reads += 1;
                st.stats.bytes_read += self.record_bytes() as u64;
                stats.bytes_read += self.record_bytes() as u64;
                issued.push(readers::Request { layer, expert, slot });
            }
        }
        // The insert's pin is the reader's; the reads are queued once this
        // layer's demand reads are (`flush_pending`).
        self.shared
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(issued);
    }
}

impl ExpertStore {
    fn compute(
        &self,
        layer: usize,
        x: &[f32],
        picks: &[(usize, f32)],
        slots: &[(usize, bool)],
        out: &mut [f32],
        stats: &mut StepStats,
    ) -> Result<()> {
        let banks = &self.shared.banks;
        let (format, shape) = (banks.format(), banks.shape());
        let cb = banks.bank(layer).and_then(|b| b.codebooks.as_ref());
        // Gate/up tables depend only on x and the layer's codebooks: built
        // once here and shared by every routed expert of this token.
        let tables = quant::build_gate_up_tables(format, cb, x);
        let mut scratch = ExpertScratch::new(format, shape);
        let range = banks.payload_range();
        let hidden = shape.hidden;
        let k = picks.len();
        // Each pick's output lands in its own row and the rows are summed in
        // router order at the end, so the order in which records are
        // computed (as they land) never changes a bit of `out`.
        let mut ys = vec![0.0f32; k * hidden];
        let threaded = self.options.readers > 0;
        let as_they_land = threaded && self.options.read_ahead;
        let mut left: Vec<usize> = (0..k).collect();
        while !left.is_empty() {
            let j = if as_they_land {
                left.remove(self.next_ready(&left, slots, &mut stats.io_time)?)
            } else {
                left.remove(0)
            };
            let (expert, (slot, must_read)) = (picks[j].0, slots[j]);
            if must_read && !threaded {
                self.read_here(layer, expert, slot, &mut stats.io_time)?;
            } else if !as_they_land {
                if must_read {
                    self.enqueue(layer, expert, slot, false);
                }
                self.wait_ready(slot, &mut stats.io_time)?;
            }
            let buf = self.shared.bufs[slot].lock().unwrap_or_else(|p| p.into_inner());
            quant::expert_forward_act(
                format,
                shape,
                &buf.as_slice()[range.clone()],
                cb,
                &tables,
                x,
                &mut ys[j * hidden..(j + 1) * hidden],
                &mut scratch,
                banks.activation(),
            );
        }
        out.fill(0.0);
        for (&(_, weight), y) in picks.iter().zip(ys.chunks_exact(hidden)) {
            for (o, v) in out.iter_mut().zip(y) {
                *o += weight * v;
            }
        }
        Ok(())
    }
}
