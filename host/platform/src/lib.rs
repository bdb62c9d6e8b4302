//! What the engine asks of the operating system, behind one interface with
//! one module per OS, so the store, the planner and the pool hold no
//! `cfg` of their own:
//!
//! | | Linux | macOS | Windows |
//! |---|---|---|---|
//! | expert reads bypass the page cache | `O_DIRECT` | `F_NOCACHE` | `FILE_FLAG_NO_BUFFERING` |
//! | positional reads and writes | `pread` / `pwrite` | `pread` / `pwrite` | `ReadFile` / `WriteFile` at an offset |
//! | physical RAM | `/proc/meminfo` | `sysctl hw.memsize` | `GlobalMemoryStatusEx` |
//! | the limit on this process | cgroup v1 / v2 | none | the job object's memory limit |
//! | `--cpus` | `sched_setaffinity` | refused: not supported | `SetThreadGroupAffinity` (group 0) |
//! | CPU time, per thread | `getrusage` (`RUSAGE_THREAD`) | `getrusage`, process only | `GetThreadTimes` / `GetProcessTimes` |
//! | peak RSS | `VmHWM` | `ru_maxrss` | `PeakWorkingSetSize` |
//! | give a buffer's pages back, keep the range | `MADV_DONTNEED` | refused | refused |
//!
//! Every direct read must be aligned: offsets, lengths and buffers at 4 KiB
//! (a multiple of every sector size in use), which the store guarantees.

use std::fs::File;
use std::io;
use std::path::Path;
use std::time::Duration;

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
use linux as os;
#[cfg(target_os = "linux")]
pub use linux::cgroup_limit;

#[cfg(target_os = "macos")]
mod macos;
#[cfg(target_os = "macos")]
use macos as os;

#[cfg(windows)]
mod windows;
#[cfg(windows)]
use windows as os;

#[cfg(not(any(target_os = "linux", target_os = "macos", windows)))]
mod other;
#[cfg(not(any(target_os = "linux", target_os = "macos", windows)))]
use other as os;

#[cfg(unix)]
mod unix;

/// Positional reads and writes of a whole buffer, as
/// `std::os::unix::fs::FileExt` has them, on every OS.
pub trait FileExt {
    /// One positional read: the bytes read, fewer than asked at the end of
    /// the file (0 past it).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
}

/// `path` opened for reads that bypass the page cache; `None` where the OS
/// or the file system does not offer it (the caller then reads buffered).
pub fn open_direct(path: &Path) -> Option<File> {
    os::open_direct(path)
}

/// Tells the OS a buffered file is read at random (no read-ahead); advice
/// only, a no-op where there is none.
pub fn advise_random(file: &File) {
    os::advise_random(file)
}

/// Whether `file`'s reads bypass the page cache as the OS sees it (Linux:
/// `O_DIRECT` on the open file description); `false` where it cannot tell.
pub fn is_direct(file: &File) -> bool {
    os::is_direct(file)
}

/// The machine's physical RAM in bytes.
pub fn physical_ram() -> Option<u64> {
    os::physical_ram()
}

/// The smallest memory limit the OS puts on this process (Linux: its
/// cgroups; Windows: its job object), `None` without one.
pub fn memory_limit() -> Option<u64> {
    os::memory_limit()
}

/// Pins the calling thread to these CPUs (indices as the OS numbers them).
/// macOS cannot (thread affinity is only a hint there): an `Unsupported`
/// error, never a silent no-op.
pub fn bind_current_thread(cpus: &[usize]) -> io::Result<()> {
    if cpus.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "an empty CPU set"));
    }
    os::bind_current_thread(cpus)
}

/// The CPUs the calling thread may run on, ascending.
pub fn current_affinity() -> io::Result<Vec<usize>> {
    os::current_affinity()
}

/// (user, system) CPU time of the calling thread (`thread`) or of the
/// whole process; `None` where the OS does not account it.
pub fn cpu_times(thread: bool) -> Option<(Duration, Duration)> {
    os::cpu_times(thread)
}

/// Peak resident set size of this process in bytes.
pub fn peak_rss() -> Option<u64> {
    os::peak_rss()
}

/// Bytes this process has caused to be fetched from storage so far, as the
/// kernel counts them (Linux's `read_bytes` in `/proc/self/io`, which also
/// counts direct reads and not page-cache hits); `None` where the OS keeps
/// no such counter for us.
pub fn process_read_bytes() -> Option<u64> {
    os::process_read_bytes()
}

/// Gives the pages of `len` bytes at `ptr` back to the OS while keeping
/// the range mapped: they read as zeros and are faulted in afresh by their
/// next use, so until then they count toward no resident set. `false`
/// where the OS does not do this promptly (macOS's `MADV_DONTNEED` only
/// marks pages; Windows would need the range decommitted): the pages are
/// then untouched and the caller must go on counting them.
///
/// # Safety
/// `ptr..ptr + len` is a 4 KiB-aligned range of anonymous private memory
/// the caller owns, with no live reference into it: its contents are lost.
pub unsafe fn release_pages(ptr: *mut u8, len: usize) -> bool {
    // SAFETY: the caller's.
    unsafe { os::release_pages(ptr, len) }
}

/// Memory for I/O buffers on huge pages: an anonymous private mapping
/// (zero-filled by the kernel) of exactly the length asked for, starting on
/// a `huge_page` boundary and advised huge, unmapped on drop. Linux only
/// (`None` elsewhere: the caller then allocates from the heap).
pub struct HugePages {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    advised: bool,
}

// SAFETY: the mapping is owned by this value alone and never aliased by it;
// what callers carve out of it carries its own Send/Sync reasoning.
unsafe impl Send for HugePages {}
// SAFETY: as above; HugePages itself is never written through.
unsafe impl Sync for HugePages {}

impl HugePages {
    /// `len` bytes (a multiple of the 4 KiB base page) on a `huge_page`
    /// boundary; `None` where no such mapping can be made. Pages are
    /// faulted in by their first use, not here.
    pub fn new(len: usize, huge_page: usize) -> Option<HugePages> {
        let (ptr, advised) = os::map_huge(len, huge_page)?;
        Some(HugePages { ptr, len, advised })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The OS accepted the huge-page advice (else ordinary pages, slower only).
    pub fn advised(&self) -> bool {
        self.advised
    }
}

impl Drop for HugePages {
    fn drop(&mut self) {
        os::unmap(self.ptr, self.len);
    }
}

/// The error of an operation this OS does not offer.
#[cfg(not(any(target_os = "linux", windows)))]
pub(crate) fn unsupported(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, format!("{what} is not supported on {}", std::env::consts::OS))
}

/// Run on every OS CI executes (Linux natively, Windows under wine).
#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file(tag: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("waste-platform-{}-{tag}", std::process::id()))
    }

    #[test]
    fn positional_writes_and_reads_round_trip() {
        let path = temp_file("rw");
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        file.write_all_at(b"world", 6).unwrap();
        file.write_all_at(b"hello ", 0).unwrap();
        let mut buf = [0u8; 11];
        file.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"hello world");
        let mut past = [0u8; 4];
        assert_eq!(file.read_exact_at(&mut past, 9).unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
        drop(file);
        std::fs::remove_file(&path).unwrap();
    }

    /// An aligned read through the page-cache bypass, where the OS and the
    /// file system offer one, returns the file's bytes.
    #[test]
    fn direct_reads_of_aligned_blocks_return_the_bytes() {
        let path = temp_file("direct");
        let data: Vec<u8> = (0..3 * 4096).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        if let Some(file) = open_direct(&path) {
            let pages = HugePages::new(2 << 20, 2 << 20);
            let mut heap = vec![0u8; 3 * 4096 + 4096];
            let off = heap.as_ptr().align_offset(4096);
            let buf: &mut [u8] = match &pages {
                // SAFETY: the mapping is 2 MiB, zeroed, owned by `pages` and
                // not otherwise borrowed while `buf` lives.
                Some(p) => unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), 2 * 4096) },
                None => &mut heap[off..off + 2 * 4096],
            };
            file.read_exact_at(buf, 4096).unwrap();
            assert!(buf[..] == data[4096..3 * 4096]);
        }
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn ram_time_and_rss_are_reported() {
        let ram = physical_ram().expect("physical RAM");
        assert!(ram > 1 << 28, "{ram}");
        if let Some(limit) = memory_limit() {
            assert!(limit > 0);
        }
        let (user, system) = cpu_times(false).expect("process CPU time");
        assert!(user + system > Duration::ZERO);
        assert!(peak_rss().expect("peak RSS") > 1 << 20);
    }

    #[cfg(any(target_os = "linux", windows))]
    #[test]
    fn a_thread_binds_to_one_of_its_cpus() {
        std::thread::spawn(|| {
            let mine = current_affinity().unwrap();
            bind_current_thread(&mine[..1]).unwrap();
            assert_eq!(current_affinity().unwrap(), mine[..1]);
        })
        .join()
        .unwrap();
        assert_eq!(bind_current_thread(&[]).unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }

    #[cfg(target_os = "macos")]
    #[test]
    fn binding_is_refused_not_ignored() {
        assert_eq!(bind_current_thread(&[0]).unwrap_err().kind(), io::ErrorKind::Unsupported);
    }
}
