//! Counters the engine reports per evaluate call and in aggregate.

use std::time::Duration;

/// What one forward pass (or an aggregate of them) cost.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct StepStats {
    /// Routed-expert uses served from RAM (the cache or a resident bank).
    pub experts_hit: u32,
    /// Routed-expert uses that needed a read from disk.
    pub experts_missed: u32,
    /// Bytes read from expert banks.
    pub bytes_read: u64,
    /// Time spent waiting for expert reads.
    pub io_time: Duration,
    /// Embedding rows read from disk (an untied table left in the container).
    pub embedding_rows_read: u32,
}

impl StepStats {
    pub fn add(&mut self, other: &StepStats) {
        self.experts_hit += other.experts_hit;
        self.experts_missed += other.experts_missed;
        self.bytes_read += other.bytes_read;
        self.io_time += other.io_time;
        self.embedding_rows_read += other.embedding_rows_read;
    }
}

/// (user, system) CPU time of the calling thread (`thread`; not on macOS)
/// or of the whole process, as the OS accounts it; `None` where unavailable.
pub fn cpu_times(thread: bool) -> Option<(Duration, Duration)> {
    waste_platform::cpu_times(thread)
}
