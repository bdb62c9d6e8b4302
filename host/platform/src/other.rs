//! Any other OS: buffered reads, no RAM figure, no thread placement.

use std::fs::File;
use std::io;
use std::path::Path;
use std::time::Duration;

pub(crate) fn open_direct(_path: &Path) -> Option<File> {
    None
}
pub(crate) fn advise_random(_file: &File) {}
pub(crate) fn is_direct(_file: &File) -> bool {
    false
}
pub(crate) fn physical_ram() -> Option<u64> {
    None
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
pub(crate) fn cpu_times(_thread: bool) -> Option<(Duration, Duration)> {
    None
}
/// Not read here (see `process_read_bytes` in lib.rs).
pub(crate) fn process_read_bytes() -> Option<u64> {
    None
}

pub(crate) fn peak_rss() -> Option<u64> {
    None
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
