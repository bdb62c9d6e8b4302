//! The expert store: routed experts read from their banks with one direct
//! positional read per record, by reader threads serving a request queue,
//! into the slots of a bounded cache carved out of the RAM budget.
//!
//! Placement never changes the result: each of a layer's experts is
//! computed from the same bytes into its own row, whether they came from the
//! cache, a read-ahead, a speculative lookahead read or a synchronous read,
//! and the rows are summed in router order, whatever order they landed in.

pub mod cache;
pub mod io;
mod lend;
mod pin;
mod readers;
#[cfg(test)]
mod tests;
pub mod trace;
pub mod usage;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use cache::{simulate, CacheCore, CachePolicy, SimResult};
use io::{slot_buffers, AlignedBuf, BankFile};
pub use lend::SlotLoan;
pub use pin::{Payload, Pinned};
pub use usage::USAGE_FILE;

use crate::container::ExpertBanks;
use crate::error::{Error, Result};
use crate::stats::{ratio, Picks};

/// How the store moves bytes. None of it changes a logit.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreOptions {
    /// Records the cache holds (also the I/O buffers: reads land in slots).
    pub cache_slots: usize,
    /// Keep records after use; `false` reads every use (the plain path).
    pub keep: bool,
    pub policy: CachePolicy,
    /// Reader threads (twice as many for a GGUF file read in place, three
    /// reads a record); 0 reads on the calling thread.
    pub readers: usize,
    /// Request a layer's whole top-k before consuming the first record.
    pub read_ahead: bool,
    /// Bypass the page cache when the file system allows it.
    pub direct_io: bool,
    /// Experts of the next MoE layer read speculatively in decode; 0 = off.
    pub lookahead: usize,
    /// How many MoE layers ahead the lookahead guesses (each from the same
    /// input); guesses beyond the next layer are read only when no nearer
    /// read waits (`readers::Tier::Later`).
    pub lookahead_layers: usize,
    /// Back the slots with transparent huge pages where the kernel allows
    /// (see [`io::slot_buffers`]).
    pub huge_pages: bool,
    /// Seed of the eviction sampler.
    pub seed: u64,
    /// Per decoder layer: its experts are a fixed function of the token
    /// (DeepSeek-V4's hash layers), counted apart in [`StoreStats`].
    pub hash_layers: Vec<bool>,
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
            // One: guessing further ahead read fewer records on demand but
            // did not speed decode up, and cost reuse in a small cache
            // (docs/PERFORMANCE.md, "Lookahead across layers").
            lookahead_layers: 1,
            huge_pages: true,
            seed: 0x5EED,
            hash_layers: Vec::new(),
        }
    }
}

/// Aggregate counters of a store since open (or the last reset).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StoreStats {
    /// Where each routed-expert pick's record came from.
    pub picks: Picks,
    /// Records read (demand, speculative and preload).
    pub reads: u64,
    pub bytes_read: u64,
    /// Time the forward pass waited for records.
    pub io_wait: Duration,
    /// Sum over reads of the time each `pread` took.
    pub read_time: Duration,
    /// System CPU time the reader threads spent in their reads (Linux).
    pub reader_sys_time: Duration,
    /// Wall time during which no expert read was running (none inside its
    /// `pread`): what keeping the disk busy can still win.
    pub disk_idle: Duration,
    /// Of `disk_idle`: stretches a read for the first MoE layer ended. In
    /// decode that is the gap between tokens (the last layers' compute, the
    /// LM head, sampling, the first layer's attention and routing), when
    /// no record of the next token is known yet.
    pub disk_idle_before_first_layer: Duration,
    /// Speculative reads issued; `picks.prefetched` of them were used.
    pub prefetch_issued: u64,
    /// Speculative reads taken back before they started, because their
    /// layer routed elsewhere (not in `prefetch_issued` or `reads`).
    pub prefetch_withdrawn: u64,
    pub preloaded: u64,
    /// Of the picks of layers a router lookahead had predicted: how many
    /// there were, and how many the prediction named (whether or not the
    /// record still had to be read: one already cached is not read again).
    pub lookahead_picks: u64,
    pub lookahead_named: u64,
    /// The same for layers further ahead than the next MoE layer, which a
    /// lookahead deeper than one layer guessed from an earlier input.
    pub lookahead_later_picks: u64,
    pub lookahead_later_named: u64,
    pub direct_io: bool,
    /// The cache slots are advised to use transparent huge pages.
    pub huge_pages: bool,
    pub cache_slots: usize,
    pub cache_bytes: u64,
    pub record_bytes: u64,
    /// Of `picks`: those of hash-routed layers, whose picks depend on the
    /// token alone (the same token always reads the same records there),
    /// so they are told apart from routed layers'.
    pub hash_picks: Picks,
}

impl StoreStats {
    /// Speculative reads no demand has used (yet: a record still cached
    /// may be). At the end of a run, the lookahead's wasted reads.
    pub fn prefetch_wasted(&self) -> u64 {
        self.prefetch_issued.saturating_sub(self.picks.prefetched)
    }

    /// Bytes of `records` records.
    pub fn bytes_of(&self, records: u64) -> u64 {
        records * self.record_bytes
    }

    /// Bytes of the records a forward pass actually used after reading
    /// them: demand reads, and speculative reads that a demand then used.
    /// `bytes_read` less this is speculation that never paid (or has not
    /// yet) and the preload.
    pub fn useful_bytes(&self) -> u64 {
        self.bytes_of(self.picks.missed + self.picks.prefetched)
    }

    /// Fraction of the predicted layers' picks the lookahead named; `None`
    /// when no lookahead ran.
    pub fn lookahead_recall(&self) -> Option<f64> {
        (self.lookahead_picks > 0).then(|| ratio(self.lookahead_named, self.lookahead_picks))
    }

    /// [`lookahead_recall`](Self::lookahead_recall) of the guesses at
    /// layers beyond the next MoE layer.
    pub fn lookahead_later_recall(&self) -> Option<f64> {
        (self.lookahead_later_picks > 0).then(|| ratio(self.lookahead_later_named, self.lookahead_later_picks))
    }

    /// Where the picks' records came from, with the bytes of each, and how
    /// long the forward pass waited and the disk idled, as every JSON report
    /// (`waste bench`, the server's `/stats`) states it.
    pub fn report_json(&self) -> serde_json::Value {
        let p = &self.picks;
        serde_json::json!({
            "reused": p.reused, "prefetched": p.prefetched, "missed": p.missed, "reuse_rate": p.reuse_rate(),
            "bytes_reused": self.bytes_of(p.reused), "bytes_prefetched": self.bytes_of(p.prefetched),
            "bytes_missed": self.bytes_of(p.missed),
            "prefetch_issued": self.prefetch_issued, "prefetch_wasted": self.prefetch_wasted(),
            "bytes_prefetch_wasted": self.bytes_of(self.prefetch_wasted()),
            "prefetch_withdrawn": self.prefetch_withdrawn,
            "lookahead_recall": self.lookahead_recall(), "lookahead_picks": self.lookahead_picks,
            "lookahead_later_recall": self.lookahead_later_recall(), "lookahead_later_picks": self.lookahead_later_picks,
            "reads": self.reads, "bytes_read": self.bytes_read,
            "io_wait_s": self.io_wait.as_secs_f64(), "disk_idle_s": self.disk_idle.as_secs_f64(),
            "disk_idle_before_first_layer_s": self.disk_idle_before_first_layer.as_secs_f64(),
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Status {
    Empty,
    Loading,
    Ready,
    Failed(String),
}

/// The store's bookkeeping of slots, reads and counters, under one lock.
struct Ledger {
    core: CacheCore,
    status: Vec<Status>,
    /// Loaded by a speculative read and not yet used by a demand.
    speculative: Vec<bool>,
    in_flight: usize,
    /// Reads inside their `pread` right now, and since when none has been
    /// (`StoreStats::disk_idle`).
    reading_now: usize,
    idle_since: Option<Instant>,
    /// A read of the slot is queued or running.
    reading: Vec<bool>,
    stats: StoreStats,
    /// Demand uses per (MoE layer index, expert), for the learned hotlist.
    usage: Vec<u64>,
    /// Per decoder layer: the experts a router lookahead last named for it,
    /// until that layer's next pin counts how many of its picks they were;
    /// and the same for guesses made further ahead (`Tier::Later`).
    predicted: Vec<Vec<u32>>,
    predicted_later: Vec<Vec<u32>>,
    /// Slots lent to a prefill's buffers (`lend`), and how many.
    lent: Vec<bool>,
    lent_count: usize,
    /// With `log_routes`: each single token's routing as (MoE layer index,
    /// sorted experts), in the order the layers ran.
    routes: Option<Vec<(usize, Vec<u32>)>>,
}

impl Ledger {
    /// A read enters its `pread`; ends a stretch of disk idle time, which
    /// a read for the first MoE layer says was spent between tokens.
    fn disk_busy(&mut self, first_layer: bool) {
        if let Some(since) = self.idle_since.take() {
            let idle = since.elapsed();
            self.stats.disk_idle += idle;
            if first_layer {
                self.stats.disk_idle_before_first_layer += idle;
            }
        }
        self.reading_now += 1;
    }

    /// A read left its `pread`; the last one out starts a stretch of idle.
    fn disk_done(&mut self) {
        self.reading_now -= 1;
        if self.reading_now == 0 {
            self.idle_since = Some(Instant::now());
        }
    }

    /// The counters, the disk's current idle stretch included.
    fn stats_now(&self) -> StoreStats {
        let mut s = self.stats;
        if let Some(since) = self.idle_since {
            s.disk_idle += since.elapsed();
        }
        s
    }
}

pub(crate) struct Shared {
    banks: ExpertBanks,
    /// Per decoder layer, its bank file (a container's).
    files: Vec<Option<BankFile>>,
    /// A GGUF file read in place: its parts, which hold every layer's slabs.
    parts: Vec<BankFile>,
    bufs: Vec<Mutex<AlignedBuf>>,
    state: Mutex<Ledger>,
    ready: Condvar,
    queue: readers::Queue,
    /// Speculative reads issued by `prefetch` and not yet queued: they go to
    /// the readers only after the current layer's demand reads, so that a
    /// guess at the next layer never delays a record needed now.
    pending: Mutex<Vec<(readers::Request, readers::Tier)>>,
    /// Decoder layer -> index among MoE layers.
    moe_index: Vec<Option<usize>>,
    experts: usize,
    /// The next slot an idle reader faults in ahead of use, and how far
    /// ahead of the slots used so far it goes (see `fault_ahead`).
    next_fault: AtomicUsize,
    fault_window: usize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Ledger> {
        // A panic while holding the lock cannot leave the bookkeeping half
        // updated in a way that matters more than losing the model would.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads record (`layer`, `expert`) into slot `slot` and checks it.
    fn load(&self, layer: usize, expert: usize, slot: usize) -> Result<Duration> {
        let record = self.banks.record_bytes();
        let mut buf = self.bufs[slot].lock().unwrap_or_else(|p| p.into_inner());
        let bytes = &mut buf.as_mut_slice()[..record];
        self.lock().disk_busy(self.moe_index.get(layer) == Some(&Some(0)));
        let started = Instant::now();
        let read = self.read_record(layer, expert, bytes);
        let took = started.elapsed();
        self.lock().disk_done();
        read?;
        self.banks.check_record(layer, expert, bytes)?;
        Ok(took)
    }

    /// Reads record (`layer`, `expert`) into `buf` (`record_bytes` long):
    /// one read of a container's record, or a GGUF file's three slabs.
    fn read_record(&self, layer: usize, expert: usize, buf: &mut [u8]) -> Result<()> {
        let bank = self.banks.bank(layer).ok_or_else(|| Error::Runtime(format!("layer {layer} has no experts")))?;
        let read = match &bank.slabs {
            Some(slabs) => io::read_slabs(&self.parts, slabs, expert, buf).map(|()| {
                // The payload ends with the expert's biases, held in RAM.
                if let Some(biases) = &bank.biases {
                    let len = biases.len() / bank.experts;
                    let at = bank.payload_bytes - len;
                    buf[at..at + len].copy_from_slice(&biases[expert * len..(expert + 1) * len]);
                }
            }),
            None => {
                let file = self.files[layer]
                    .as_ref()
                    .ok_or_else(|| Error::Runtime(format!("layer {layer} has no experts")))?;
                file.read_at(buf, (expert * buf.len()) as u64)
            }
        };
        read.map_err(|e| {
            Error::io(&bank.path, std::io::Error::new(e.kind(), format!("layer {layer} expert {expert}: {e}")))
        })
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

    /// Faults in one slot the cache has not used yet but will next (free
    /// slots are taken in index order), at most `fault_window` past the
    /// last one used; `true` while there may be more to do. Readers do
    /// this when they have no read to do, so a first read into a slot
    /// rarely pays for its page faults, without faulting the whole cache
    /// at open (which stalled opening at a large budget) or slots that
    /// are never used.
    fn fault_ahead(&self) -> bool {
        let target = (self.lock().core.high_water() + self.fault_window).min(self.bufs.len());
        let i = self.next_fault.load(Ordering::Relaxed);
        if i >= target {
            return false;
        }
        if self.next_fault.compare_exchange(i, i + 1, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            // A slot being read is faulted by its read; a lent slot's pages
            // stay out (its buffer is locked first, so a loan that starts
            // now releases the pages after this).
            if let Ok(mut buf) = self.bufs[i].try_lock() {
                if !self.lock().lent[i] {
                    buf.fault_in();
                }
            }
        }
        true
    }

    /// Queues the speculative reads `prefetch` held back.
    fn flush_pending(&self) {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        for (r, tier) in pending {
            self.queue.push(r, tier);
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
            return Err(Error::Arg(format!("an expert cache of {slots} records cannot hold one layer's top-{top_k}")));
        }
        let n_layers = layers.last().map_or(0, |l| l + 1);
        let mut files: Vec<Option<BankFile>> = (0..n_layers).map(|_| None).collect();
        let mut moe_index = vec![None; n_layers];
        let mut direct_io = options.direct_io && !layers.is_empty();
        let mut experts = 0;
        for (i, &l) in layers.iter().enumerate() {
            let bank = banks.bank(l).ok_or_else(|| Error::Runtime(format!("layer {l} has no bank")))?;
            if bank.slabs.is_none() {
                let file = BankFile::open(&bank.path, options.direct_io, record)?;
                direct_io &= file.direct();
                files[l] = Some(file);
            }
            moe_index[l] = Some(i);
            experts = bank.experts;
        }
        let mut parts = Vec::with_capacity(banks.parts().len());
        for path in banks.parts() {
            // The probe reads the file's first block, which every GGUF file has.
            let file = BankFile::open(path, options.direct_io, io::IO_ALIGN)?;
            direct_io &= file.direct();
            parts.push(file);
        }
        let bufs: Vec<_> = slot_buffers(slots, record, options.huge_pages)?.into_iter().map(Mutex::new).collect();
        let huge_pages = bufs.first().is_some_and(|b| b.lock().unwrap_or_else(|p| p.into_inner()).huge());
        let stats = StoreStats {
            direct_io,
            huge_pages,
            cache_slots: slots,
            cache_bytes: (slots * record) as u64,
            record_bytes: record as u64,
            ..StoreStats::default()
        };
        let state = Ledger {
            core: CacheCore::new(slots, options.policy, options.seed),
            status: vec![Status::Empty; slots],
            speculative: vec![false; slots],
            in_flight: 0,
            reading_now: 0,
            idle_since: Some(Instant::now()),
            reading: vec![false; slots],
            stats,
            usage: vec![0; layers.len() * experts],
            predicted: vec![Vec::new(); moe_index.len()],
            predicted_later: vec![Vec::new(); moe_index.len()],
            routes: None,
            lent: vec![false; slots],
            lent_count: 0,
        };
        let shared = Arc::new(Shared {
            banks,
            files,
            parts,
            bufs,
            state: Mutex::new(state),
            ready: Condvar::new(),
            queue: readers::Queue::default(),
            pending: Mutex::new(Vec::new()),
            moe_index,
            experts,
            next_fault: AtomicUsize::new(0),
            // Two tokens' worth of records: enough to keep ahead of the
            // misses of decode, little to fault for nothing.
            fault_window: 2 * top_k.max(1) * layers.len().max(1),
        });
        // A GGUF file read in place costs three reads a record, one per
        // slab: twice the threads keep about as many bytes in flight as a
        // container's one read a record (docs/PERFORMANCE.md, "A GGUF file
        // run in place": 0.88x a container's decode with as many threads,
        // 0.94x with twice).
        let per_reader = if shared.parts.is_empty() { 1 } else { 2 };
        let threads = (0..options.readers * per_reader)
            .map(|i| readers::spawn(shared.clone(), i))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| Error::Runtime(format!("starting a reader thread: {e}")))?;
        Ok(ExpertStore { shared, options, threads, direct_io, top_k })
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
        self.shared.bufs.iter().map(|b| b.lock().unwrap_or_else(|p| p.into_inner()).len() as u64).sum()
    }

    pub fn stats(&self) -> StoreStats {
        self.shared.lock().stats_now()
    }

    pub fn reset_stats(&self) {
        let mut st = self.shared.lock();
        let keep = st.stats;
        if st.reading_now == 0 {
            st.idle_since = Some(Instant::now());
        }
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
        self.shared.files.iter().flatten().chain(&self.shared.parts).map(BankFile::file)
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

    /// Starts (`true`) or stops logging the routing of each token the model
    /// runs alone (decode, and prompts read a token at a time); a chunk of
    /// several tokens routes as one union and is not logged.
    pub fn log_routes(&self, on: bool) {
        self.shared.lock().routes = on.then(Vec::new);
    }

    /// The routing logged so far, taken: per token, per MoE layer, the
    /// experts, sorted (store/trace.rs's trace format, which `waste bench
    /// --route-trace` replays). A token whose layers did not all run is left out.
    pub fn take_routes(&self) -> Vec<Vec<Vec<u32>>> {
        let layers = self.shared.banks.moe_layers().len();
        let log = self.shared.lock().routes.as_mut().map(std::mem::take).unwrap_or_default();
        let mut steps: Vec<Vec<Vec<u32>>> = Vec::new();
        let mut last = None;
        for (index, experts) in log {
            if last.is_none_or(|l| index <= l) {
                steps.push(Vec::with_capacity(layers));
            }
            last = Some(index);
            if let Some(step) = steps.last_mut() {
                step.push(experts);
            }
        }
        steps.retain(|s| s.len() == layers);
        steps
    }

    /// Saves the demand-use counts, added to those already in `path`.
    pub fn save_usage(&self, path: &std::path::Path) -> Result<()> {
        let counts = self.usage();
        let layers = self.shared.banks.moe_layers().len();
        usage::save(path, layers, self.shared.experts, &counts)
    }

    /// Reads the hottest experts of the usage file at `path` into the
    /// cache (as many as it holds), through the reader threads when there
    /// are any; `progress(done, total)` is called with `done == 0` before the
    /// first read and after every one. Returns the records asked for.
    pub fn preload_usage(&self, path: &std::path::Path, progress: &mut dyn FnMut(usize, usize)) -> Result<usize> {
        if !path.is_file() || !self.options.keep {
            return Ok(0);
        }
        let layers = self.shared.banks.moe_layers();
        let counts = usage::load(path, layers.len(), self.shared.experts)?;
        let mut order: Vec<usize> = (0..counts.len()).filter(|&i| counts[i] > 0).collect();
        order.sort_by(|&a, &b| counts[b].cmp(&counts[a]).then(a.cmp(&b)));
        order.truncate(self.shared.bufs.len());
        let total = order.len();
        progress(0, total);
        let threaded = self.options.readers > 0;
        // A few reads in flight per reader keep the device busy.
        let window = (4 * self.options.readers).max(1);
        let mut done = 0;
        for batch in order.chunks(window) {
            let mut issued = Vec::with_capacity(batch.len());
            for &i in batch {
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
                // The insert's pin is the read's; `finish` drops it.
                if threaded {
                    self.shared.queue.push(readers::Request { layer, expert, slot }, readers::Tier::Demand);
                } else {
                    let result = self.shared.load(layer, expert, slot);
                    self.shared.finish(slot, result, Duration::ZERO);
                }
                issued.push(slot);
            }
            let stop = issued.len() < batch.len();
            for slot in issued {
                let mut st = self.shared.lock();
                while st.status[slot] == Status::Loading {
                    st = self.shared.ready.wait(st).unwrap_or_else(|p| p.into_inner());
                }
                if st.status[slot] == Status::Ready {
                    st.stats.preloaded += 1;
                    st.stats.reads += 1;
                    st.stats.bytes_read += self.record_bytes() as u64;
                }
                drop(st);
                done += 1;
                progress(done, total);
            }
            if stop {
                break;
            }
        }
        Ok(total)
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
                        let mut buf =
                            slot_buffers(1, record, huge)?.pop().ok_or_else(|| Error::Runtime("no buffer".into()))?;
                        let mut rng = seed ^ ((t as u64 + 1) * 0x9E37_79B9_7F4A_7C15) | 1;
                        let mut bytes = 0;
                        for _ in (t..reads).step_by(threads) {
                            rng ^= rng << 13;
                            rng ^= rng >> 7;
                            rng ^= rng << 17;
                            let layer = layers[(rng % layers.len() as u64) as usize];
                            let expert = ((rng >> 20) % shared.experts as u64) as usize;
                            shared.read_record(layer, expert, &mut buf.as_mut_slice()[..record])?;
                            bytes += record as u64;
                        }
                        Ok(bytes)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(Error::Runtime("reader panicked".into()))))
                .collect()
        });
        let seconds = started.elapsed().as_secs_f64();
        let mut total = 0;
        for r in results {
            total += r?;
        }
        Ok((total, seconds))
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
