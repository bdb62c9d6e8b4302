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

/// (user, system) CPU time of the calling thread (`thread`, Linux only) or
/// of the whole process, as the kernel accounts it; `None` where
/// unavailable.
pub fn cpu_times(thread: bool) -> Option<(Duration, Duration)> {
    #[cfg(target_os = "linux")]
    let who = if thread { libc::RUSAGE_THREAD } else { libc::RUSAGE_SELF };
    #[cfg(not(target_os = "linux"))]
    let who = if thread { return None } else { libc::RUSAGE_SELF };
    // SAFETY: getrusage fills the zeroed struct we own; no other effect.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        if libc::getrusage(who, &mut u) != 0 {
            return None;
        }
        u
    };
    let d = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    Some((d(usage.ru_utime), d(usage.ru_stime)))
}
