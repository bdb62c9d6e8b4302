//! macOS: `F_NOCACHE` (a later `F_RDADVISE` read-ahead hint is only worth
//! adding if it measures better on a Mac: none was available to measure),
//! `sysctl hw.memsize`, no cgroups, and no thread affinity: Mach's affinity
//! tags are hints the scheduler may ignore, so `--cpus` is refused.

use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::Duration;

pub(crate) fn open_direct(path: &Path) -> Option<File> {
    let file = File::open(path).ok()?;
    // SAFETY: fcntl on a descriptor we own, with an integer argument.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_NOCACHE, 1) };
    (rc != -1).then_some(file)
}

pub(crate) fn advise_random(_file: &File) {}

/// `F_NOCACHE` cannot be read back.
pub(crate) fn is_direct(_file: &File) -> bool {
    false
}

pub(crate) fn physical_ram() -> Option<u64> {
    let mut bytes: u64 = 0;
    let mut len = std::mem::size_of::<u64>();
    // SAFETY: the name is NUL-terminated; `bytes` and `len` are a u64 and
    // its size, which sysctl fills (no new value is set).
    let rc = unsafe {
        libc::sysctlbyname(c"hw.memsize".as_ptr(), (&mut bytes as *mut u64).cast(), &mut len, std::ptr::null_mut(), 0)
    };
    (rc == 0 && len == std::mem::size_of::<u64>()).then_some(bytes)
}

pub(crate) fn memory_limit() -> Option<u64> {
    None
}

pub(crate) fn bind_current_thread(_cpus: &[usize]) -> io::Result<()> {
    Err(crate::unsupported("binding threads to CPUs (--cpus)"))
}

pub(crate) fn current_affinity() -> io::Result<Vec<usize>> {
    Err(crate::unsupported("reading thread affinity"))
}

pub(crate) fn cpu_times(thread: bool) -> Option<(Duration, Duration)> {
    if thread {
        return None;
    }
    crate::unix::rusage(libc::RUSAGE_SELF).map(|(u, s, _)| (u, s))
}

/// `ru_maxrss` is in bytes on macOS (kilobytes on Linux).
/// Not read here (see `process_read_bytes` in lib.rs).
pub(crate) fn process_read_bytes() -> Option<u64> {
    None
}

pub(crate) fn peak_rss() -> Option<u64> {
    crate::unix::rusage(libc::RUSAGE_SELF).and_then(|(_, _, rss)| u64::try_from(rss).ok())
}

/// Not done here (see `release_pages` in lib.rs): the pages stay.
///
/// # Safety
/// As `crate::release_pages`.
pub(crate) unsafe fn release_pages(_ptr: *mut u8, _len: usize) -> bool {
    false
}

/// No huge-page mapping here: the caller allocates from the heap.
pub(crate) fn map_huge(_len: usize, _huge_page: usize) -> Option<(std::ptr::NonNull<u8>, bool)> {
    None
}

/// Never called: `map_huge` maps nothing.
pub(crate) fn unmap(_ptr: std::ptr::NonNull<u8>, _len: usize) {}
