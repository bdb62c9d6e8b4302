//! The compute pool: a fixed number of threads, optionally bound to a CPU
//! set, that runs the engine's parallel work.
//!
//! Results never depend on the thread count. The kernels split work into
//! chunks whose boundaries are fixed by the data (rows, row blocks, table
//! blocks), every output element is computed whole by one task, and the
//! few reductions across chunks (`Pool::sum_chunks`, the k-means fit) add
//! the per-chunk partials in chunk order. The thread count only decides
//! which thread runs a chunk, never what a chunk computes.
//!
//! The pool is a rayon `ThreadPool`; [`Pool::install`] runs a closure in it,
//! so every rayon call the closure makes (the kernels use rayon) is served
//! by this pool's threads, and `threads = 1` runs the work on one thread.
//!
//! Binding (`cpus`) pins pool thread `i` to `cpus[i % len]` and the thread
//! that calls `install` to the whole set. It uses `sched_setaffinity` and
//! exists on Linux only; elsewhere asking for it is an
//! [`PoolError::Unsupported`], never a silent no-op.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;

/// Why a pool could not be started or a thread bound. The engine's error
/// type takes each variant over as its namesake, message unchanged.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// A thread count or CPU list outside what the machine allows.
    #[error("invalid argument: {0}")]
    Arg(String),
    /// Binding threads where the OS offers no way to.
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("{0}")]
    Runtime(String),
}

use PoolError as Error;
type Result<T, E = PoolError> = std::result::Result<T, E>;

/// A set of CPU ids, parsed from Linux cpu-list syntax (`0-2,6-8`, `3`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CpuSet {
    /// Sorted, distinct.
    cpus: Vec<usize>,
}

/// CPU ids at or above this are refused (the size of glibc's `cpu_set_t`).
pub const MAX_CPU: usize = 1024;

impl CpuSet {
    /// Parses a cpu list: comma-separated ids and inclusive ranges `a-b`
    /// (`a <= b`), no spaces, no empty items; duplicates are merged.
    pub fn parse(list: &str) -> Result<CpuSet> {
        let bad = |why: String| Error::Arg(format!("cpu list {list:?}: {why}"));
        if list.is_empty() {
            return Err(bad("empty".into()));
        }
        let id = |s: &str| -> Result<usize> {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad(format!("{s:?} is not a CPU number")));
            }
            let n: usize = s.parse().map_err(|_| bad(format!("{s:?} is out of range")))?;
            if n >= MAX_CPU {
                return Err(bad(format!("CPU {n} is out of range (at most {})", MAX_CPU - 1)));
            }
            Ok(n)
        };
        let mut cpus = Vec::new();
        for item in list.split(',') {
            match item.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (id(a)?, id(b)?);
                    if a > b {
                        return Err(bad(format!("range {item:?} runs backwards")));
                    }
                    cpus.extend(a..=b);
                }
                None => cpus.push(id(item)?),
            }
        }
        cpus.sort_unstable();
        cpus.dedup();
        Ok(CpuSet { cpus })
    }

    pub fn cpus(&self) -> &[usize] {
        &self.cpus
    }

    pub fn len(&self) -> usize {
        self.cpus.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cpus.is_empty()
    }
}

impl fmt::Display for CpuSet {
    /// The canonical cpu list (ranges merged), e.g. `0-2,6`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut i = 0;
        let mut first = true;
        while i < self.cpus.len() {
            let mut j = i;
            while j + 1 < self.cpus.len() && self.cpus[j + 1] == self.cpus[j] + 1 {
                j += 1;
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if j > i {
                write!(f, "{}-{}", self.cpus[i], self.cpus[j])?;
            } else {
                write!(f, "{}", self.cpus[i])?;
            }
            i = j + 1;
        }
        Ok(())
    }
}

/// Pins the calling thread to `cpus` (`waste_platform`: Linux
/// `sched_setaffinity`, Windows `SetThreadGroupAffinity` in group 0; macOS
/// refuses, as thread affinity cannot be set there).
pub fn bind_current_thread(cpus: &CpuSet) -> Result<()> {
    if cpus.is_empty() {
        return Err(Error::Arg("cannot bind a thread to an empty CPU set".into()));
    }
    waste_platform::bind_current_thread(cpus.cpus()).map_err(|e| match e.kind() {
        std::io::ErrorKind::Unsupported => Error::Unsupported(format!("--cpus {cpus}: {e}")),
        _ => Error::Arg(format!("binding a thread to CPUs {cpus}: {e}")),
    })
}

/// The CPUs the calling thread may run on, for tests and reports.
pub fn current_affinity() -> Result<CpuSet> {
    match waste_platform::current_affinity() {
        Ok(cpus) => Ok(CpuSet { cpus }),
        Err(e) if e.kind() == std::io::ErrorKind::Unsupported => Err(Error::Unsupported(e.to_string())),
        Err(e) => Err(Error::Runtime(format!("reading this thread's CPUs: {e}"))),
    }
}

/// The compute threads a pool starts without a thread count or CPU set:
/// one per CPU this process may use.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Distinguishes pools in the per-thread "already bound" marker.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// Id of the pool whose CPU set this thread was last bound to.
    static BOUND_TO: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// A fixed-size compute pool.
pub struct Pool {
    inner: rayon::ThreadPool,
    threads: usize,
    cpus: Option<CpuSet>,
    id: u64,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool").field("threads", &self.threads).field("cpus", &self.cpus).finish()
    }
}

impl Pool {
    /// `threads`: `None` = one per CPU of `cpus`, or of the machine.
    /// `cpus`: bind the pool (and `install` callers) to these CPUs; an
    /// error if a CPU cannot be used or the platform cannot bind.
    pub fn new(threads: Option<usize>, cpus: Option<&CpuSet>) -> Result<Pool> {
        let threads = match (threads, cpus) {
            (Some(0), _) => return Err(Error::Arg("the thread count must be at least 1".into())),
            (Some(n), _) => n,
            (None, Some(c)) => c.len(),
            (None, None) => default_threads(),
        };
        if let Some(c) = cpus {
            // Validates the set (and the platform) before any thread starts:
            // the probe thread fails exactly as a pool thread would.
            let c2 = c.clone();
            std::thread::spawn(move || bind_current_thread(&c2))
                .join()
                .map_err(|_| Error::Runtime("the CPU binding probe thread panicked".into()))??;
        }
        let inner = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("waste-compute-{i}"))
            .build()
            .map_err(|e| Error::Runtime(format!("starting {threads} compute threads: {e}")))?;
        if let Some(c) = cpus {
            let results: Vec<Result<()>> = inner.broadcast(|ctx| {
                let one = CpuSet { cpus: vec![c.cpus()[ctx.index() % c.len()]] };
                bind_current_thread(&one)
            });
            results.into_iter().collect::<Result<()>>()?;
        }
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        Ok(Pool { inner, threads, cpus: cpus.cloned(), id })
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    pub fn cpus(&self) -> Option<&CpuSet> {
        self.cpus.as_ref()
    }

    /// Runs `f` inside the pool: its rayon work uses this pool's threads.
    /// With a CPU set, the calling thread is bound to it first (once per
    /// thread and pool).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> Result<R> {
        if let Some(c) = &self.cpus {
            if BOUND_TO.with(|b| b.get()) != self.id {
                bind_current_thread(c)?;
                BOUND_TO.with(|b| b.set(self.id));
            }
        }
        Ok(self.inner.install(f))
    }

    /// `sum_i f(chunk_i)` over `0..len` cut into fixed chunks of `chunk`
    /// items: partial sums per chunk, added in chunk order, so the result
    /// is the same for every thread count.
    pub fn sum_chunks(&self, len: usize, chunk: usize, f: impl Fn(Range<usize>) -> f64 + Sync) -> f64 {
        let chunk = chunk.max(1);
        let parts: Vec<f64> = self.inner.install(|| {
            (0..len.div_ceil(chunk)).into_par_iter().map(|i| f(i * chunk..((i + 1) * chunk).min(len))).collect()
        });
        parts.into_iter().fold(0.0, |a, b| a + b)
    }

    /// `f(i, chunk_i)` for fixed chunks of `out`; each chunk is written by
    /// one call, so the result is the same for every thread count.
    pub fn for_chunks<T: Send>(&self, out: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync) {
        let chunk = chunk.max(1);
        self.inner.install(|| out.par_chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse() {
        let p = |s: &str| CpuSet::parse(s).map(|c| c.cpus().to_vec());
        assert_eq!(p("0").unwrap(), vec![0]);
        assert_eq!(p("0-2,6-8").unwrap(), vec![0, 1, 2, 6, 7, 8]);
        assert_eq!(p("3,1,1-2").unwrap(), vec![1, 2, 3]);
        assert_eq!(p("5-5").unwrap(), vec![5]);
        assert_eq!(CpuSet::parse("0-2,6-8,10").unwrap().to_string(), "0-2,6-8,10");
        for bad in [
            "",
            ",",
            "1,",
            ",1",
            "a",
            "1-",
            "-1",
            "3-1",
            "1 ,2",
            " 1",
            "1-2-3",
            "0x1",
            "+1",
            "1024",
            "99999999999999999999999",
        ] {
            let e = CpuSet::parse(bad).expect_err(bad);
            assert!(e.to_string().contains("cpu list"), "{bad}: {e}");
        }
    }

    #[test]
    fn sums_do_not_depend_on_thread_count() {
        let v: Vec<f64> = (0..10_001).map(|i| 1.0 / (1.0 + i as f64) * if i % 3 == 0 { -1e6 } else { 1.0 }).collect();
        let run = |n| Pool::new(Some(n), None).unwrap().sum_chunks(v.len(), 64, |r| v[r].iter().sum());
        let one = run(1);
        for n in [2, 3, 5] {
            assert_eq!(run(n).to_bits(), one.to_bits(), "{n} threads");
        }
    }

    #[test]
    fn one_thread_means_one_thread() {
        let pool = Pool::new(Some(1), None).unwrap();
        let ids = std::sync::Mutex::new(std::collections::HashSet::new());
        let mut out = vec![0u32; 1000];
        pool.for_chunks(&mut out, 7, |i, c| {
            ids.lock().unwrap().insert(std::thread::current().id());
            c.fill(i as u32);
        });
        assert_eq!(ids.lock().unwrap().len(), 1);
        assert!(out.iter().enumerate().all(|(k, &v)| v as usize == k / 7));
        assert!(Pool::new(Some(0), None).is_err());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn binding_covers_pool_threads_and_caller() {
        let mine = current_affinity().unwrap();
        let first = CpuSet { cpus: vec![mine.cpus()[0]] };
        // Bind from a fresh thread so the test harness thread stays free.
        std::thread::spawn(move || {
            let pool = Pool::new(Some(2), Some(&first)).unwrap();
            let inside: Vec<CpuSet> = pool.inner.broadcast(|_| current_affinity().unwrap());
            assert!(inside.iter().all(|c| *c == first), "{inside:?}");
            pool.install(|| ()).unwrap();
            assert_eq!(current_affinity().unwrap(), first);
        })
        .join()
        .unwrap();
        // A CPU this process may not use is an error, not a no-op.
        let outside = (0..MAX_CPU).find(|c| !mine.cpus().contains(c)).unwrap();
        let e = Pool::new(Some(1), Some(&CpuSet { cpus: vec![outside] })).unwrap_err();
        assert!(e.to_string().contains("binding"), "{e}");
    }

    /// macOS cannot set thread affinity: `--cpus` is refused, not ignored.
    #[cfg(target_os = "macos")]
    #[test]
    fn binding_is_unsupported_here() {
        let e = Pool::new(Some(1), Some(&CpuSet::parse("0").unwrap())).unwrap_err();
        assert!(matches!(e, Error::Unsupported(_)), "{e}");
    }
}
