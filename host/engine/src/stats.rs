//! Counters the engine reports per evaluate call and in aggregate.

use std::time::Duration;

/// Where the routed-expert picks got their records, in the three ways a
/// pick can be served. Only `reused` is the cache's own work: a record a
/// router lookahead read a moment before is `prefetched`, however it then
/// sits in the cache, and is no evidence of reuse.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Picks {
    /// Served by a record in RAM before the step asked for it: kept from an
    /// earlier use, preloaded at open, or a resident bank.
    pub reused: u64,
    /// Served by a speculative (router lookahead) read, at the record's
    /// first use after that read.
    pub prefetched: u64,
    /// Read on demand: the step asked and the record was not there.
    pub missed: u64,
}

impl Picks {
    pub fn total(&self) -> u64 {
        self.reused + self.prefetched + self.missed
    }

    /// Fraction of the picks the cache served from what it already held;
    /// 0 with no picks.
    pub fn reuse_rate(&self) -> f64 {
        ratio(self.reused, self.total())
    }

    pub fn add(&mut self, other: &Picks) {
        self.reused += other.reused;
        self.prefetched += other.prefetched;
        self.missed += other.missed;
    }
}

/// `224 reused / 767 prefetched / 545 read = 15% reuse`: the one wording of
/// the three counts, for every report that prints them.
impl std::fmt::Display for Picks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} reused / {} prefetched / {} read = {:.0}% reuse",
            self.reused,
            self.prefetched,
            self.missed,
            100.0 * self.reuse_rate()
        )
    }
}

/// `part / whole`, 0 when `whole` is.
pub fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// What one forward pass (or an aggregate of them) cost.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct StepStats {
    /// Routed-expert picks served by a record already in RAM (`Picks::reused`).
    pub experts_reused: u32,
    /// Routed-expert picks served by a lookahead's read (`Picks::prefetched`).
    pub experts_prefetched: u32,
    /// Routed-expert picks read on demand.
    pub experts_missed: u32,
    /// Bytes read from expert banks, demand and speculative.
    pub bytes_read: u64,
    /// Time spent waiting for expert reads.
    pub io_time: Duration,
    /// Embedding rows read from disk (an untied table left in the container).
    pub embedding_rows_read: u32,
    /// The largest prefill chunk run, in tokens (0: none): the plan's, or
    /// a larger one on cache the experts lent a long prompt.
    pub prefill_chunk: usize,
}

impl StepStats {
    pub fn picks(&self) -> Picks {
        Picks {
            reused: self.experts_reused.into(),
            prefetched: self.experts_prefetched.into(),
            missed: self.experts_missed.into(),
        }
    }

    pub fn add(&mut self, other: &StepStats) {
        self.experts_reused += other.experts_reused;
        self.experts_prefetched += other.experts_prefetched;
        self.experts_missed += other.experts_missed;
        self.bytes_read += other.bytes_read;
        self.io_time += other.io_time;
        self.embedding_rows_read += other.embedding_rows_read;
        self.prefill_chunk = self.prefill_chunk.max(other.prefill_chunk);
    }
}

/// Bytes this process has had fetched from storage (Linux), for figures
/// that must count every read, the engine's own counters' blind spots
/// included; `None` elsewhere.
pub fn process_read_bytes() -> Option<u64> {
    waste_platform::process_read_bytes()
}

/// (user, system) CPU time of the calling thread (`thread`; not on macOS)
/// or of the whole process, as the OS accounts it; `None` where unavailable.
pub fn cpu_times(thread: bool) -> Option<(Duration, Duration)> {
    waste_platform::cpu_times(thread)
}
