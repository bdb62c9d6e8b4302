//! Positional reads of whole expert records, bypassing the page cache.
//!
//! Direct I/O needs the buffer, the offset and the length to be multiples of
//! the logical block size; records are 4 KiB multiples at 4 KiB offsets and
//! [`AlignedBuf`] starts on a 4 KiB boundary, so one `pread` fetches one
//! expert. Where the file system refuses `O_DIRECT` (tmpfs, some network
//! file systems), the bank is opened buffered with `POSIX_FADV_RANDOM` so the
//! kernel at least does not read ahead, and the store reports
//! `direct_io: false`.

use std::alloc::{self, Layout};
use std::fs::File;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;

use waste_platform::{advise_random, open_direct, FileExt, HugePages};

use crate::container::SlabRun;
use crate::error::{Error, Result};

/// Alignment of every I/O buffer; also the record alignment in the container.
pub const IO_ALIGN: usize = 4096;

/// Size of a transparent huge page on the machines we run on (x86-64 and
/// aarch64 with 4 KiB base pages).
pub const HUGE_PAGE: usize = 2 << 20;

/// A zero-initialised buffer whose start and length are multiples of
/// 4 KiB, as direct I/O requires: its own heap allocation, or a slice of a
/// [`slot_buffers`] arena. An arena slice's pages are faulted in by the
/// first read into it (a heap buffer's by the allocator's zeroing): the
/// budget counts every buffer from the start, RSS grows as they are used.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// The arena this buffer is a slice of; `None`: its own allocation.
    arena: Option<Arc<HugePages>>,
    /// Its pages have been touched (see [`as_mut_slice`](Self::as_mut_slice)).
    faulted: bool,
}

// SAFETY: AlignedBuf owns its allocation exclusively (like a Box<[u8]>);
// nothing in it is tied to a thread.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// `len` is rounded up to a multiple of 4 KiB.
    pub fn new(len: usize) -> Result<AlignedBuf> {
        let len = len.max(1).div_ceil(IO_ALIGN) * IO_ALIGN;
        let layout = Layout::from_size_align(len, IO_ALIGN)
            .map_err(|_| Error::Runtime(format!("an I/O buffer of {len} bytes is too large")))?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| Error::Runtime(format!("out of memory allocating {len} bytes")))?;
        // An aligned zeroed allocation is written by the allocator: its
        // pages are in already.
        Ok(AlignedBuf { ptr, len, arena: None, faulted: true })
    }

    /// Whether this buffer is a slice of an arena backed by huge pages.
    pub fn huge(&self) -> bool {
        self.arena.as_ref().is_some_and(|a| a.advised())
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr points to `len` initialised (zeroed at allocation) bytes
        // owned by self; the borrow of self bounds the slice's life.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The buffer to read a record into. The first call faults every page
    /// in with a store to each (a first touch inside a direct read, the
    /// kernel pinning the pages, cost a reader 9.4 s of system time filling
    /// an 8 GB cache); doing it here rather than when the cache is made
    /// keeps opening with a large budget from stalling while gigabytes are
    /// zeroed (issue 17: 15-20 s at an 18 GB budget), and RSS grows only as
    /// the cache fills.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.fault_in();
        // SAFETY: as in as_slice, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Faults every page of the buffer in (once), with a store to each: the
    /// first read into it does, and idle reader threads do it ahead of the
    /// slots the cache will use next (`Shared::fault_ahead`).
    pub fn fault_in(&mut self) {
        if self.faulted {
            return;
        }
        for offset in (0..self.len).step_by(IO_ALIGN) {
            // SAFETY: offset < len, inside the buffer we own exclusively
            // (`&mut self`); volatile so that the store of a zero the page
            // already holds stays.
            unsafe { std::ptr::write_volatile(self.ptr.as_ptr().add(offset), 0) };
        }
        self.faulted = true;
    }
}

impl AlignedBuf {
    /// Gives the buffer's pages back to the OS, the range kept (the cache
    /// lends the slot's memory to a prefill's buffers); its next
    /// `as_mut_slice` faults them in again. `false` where this OS keeps
    /// them (`waste_platform::release_pages`).
    pub fn release(&mut self) -> bool {
        // SAFETY: the buffer is ours alone (`&mut self`), 4 KiB-aligned
        // anonymous memory of `len` bytes (its own allocation or its slice
        // of the arena), and no slice of it outlives the borrow.
        let released = unsafe { waste_platform::release_pages(self.ptr.as_ptr(), self.len) };
        if released {
            self.faulted = false;
        }
        released
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.arena.is_some() {
            // The arena unmaps with its last slice.
            return;
        }
        // SAFETY: allocated in `new` with exactly this layout (checked there).
        unsafe { alloc::dealloc(self.ptr.as_ptr(), Layout::from_size_align_unchecked(self.len, IO_ALIGN)) }
    }
}

/// `count` buffers of `len` bytes (rounded up to 4 KiB). With `huge`, on
/// Linux, they are consecutive slices of one anonymous mapping that starts
/// on a 2 MiB boundary and is advised `MADV_HUGEPAGE`: a direct read of a
/// record then pins a few huge pages instead of hundreds of 4 KiB pages and
/// reaches the device in one request instead of several (on virtio the
/// queue takes 254 segments; a 2.6 MB record in 4 KiB pages is 651).
/// The mapping is exactly `count` x `len` bytes long: the kernel uses a huge
/// page only where one fits entirely inside it, so RSS never exceeds what
/// the budget counts. Where the mapping or the advice fails, the buffers are
/// plain heap allocations (the result says which, per buffer).
pub fn slot_buffers(count: usize, len: usize, huge: bool) -> Result<Vec<AlignedBuf>> {
    let len = len.max(1).div_ceil(IO_ALIGN) * IO_ALIGN;
    if huge && count > 0 {
        if let Some(arena) = HugePages::new(count * len, HUGE_PAGE) {
            let arena = Arc::new(arena);
            return Ok((0..count)
                .map(|i| AlignedBuf {
                    // SAFETY: i * len + len <= count * len, the mapping's length.
                    ptr: unsafe { NonNull::new_unchecked(arena.as_ptr().add(i * len)) },
                    len,
                    arena: Some(arena.clone()),
                    faulted: false,
                })
                .collect());
        }
    }
    (0..count).map(|_| AlignedBuf::new(len)).collect()
}

/// An expert bank opened for record reads.
pub struct BankFile {
    file: File,
    direct: bool,
}

impl BankFile {
    /// Opens `path` with the page cache bypassed when `want_direct` and the
    /// file system allows it, else buffered with random-access advice.
    /// `probe_len` (a 4 KiB multiple no larger than the file) is read once
    /// to confirm the bypass really works: some file systems accept the flag
    /// at open and fail the first read.
    pub fn open(path: &Path, want_direct: bool, probe_len: usize) -> Result<BankFile> {
        if want_direct {
            if let Some(file) = open_direct(path) {
                let ok = AlignedBuf::new(probe_len).map(|mut b| file.read_exact_at(b.as_mut_slice(), 0).is_ok());
                if ok.unwrap_or(false) {
                    return Ok(BankFile { file, direct: true });
                }
            }
        }
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        advise_random(&file);
        Ok(BankFile { file, direct: false })
    }

    /// Whether reads bypass the page cache.
    pub fn direct(&self) -> bool {
        self.direct
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    /// One positional read of `buf.len()` bytes at `offset`.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    /// Reads `buf.len()` bytes at `offset`, or as many as the file has
    /// there, at least `need`: an aligned span that reaches past a file's
    /// unaligned end (the last tensor of a GGUF file) reads short.
    pub fn read_at_least(&self, buf: &mut [u8], offset: u64, need: usize) -> std::io::Result<()> {
        let mut got = 0;
        while got < need {
            match self.file.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!("the file ends {got} bytes after offset {offset}, {need} needed"),
                    ))
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Reads expert `expert`'s gate, up and down slabs from a GGUF file read
/// in place (`files`: its parts) into `buf` with one aligned read of each
/// slab's enclosing span, then moves the slabs together to the start of
/// `buf`: the payload a container's record holds, the same bytes.
/// `buf` holds the three spans (`container::slab_span_bound` each).
pub fn read_slabs(files: &[BankFile], slabs: &[SlabRun; 3], expert: usize, buf: &mut [u8]) -> std::io::Result<()> {
    let align = IO_ALIGN as u64;
    let mut at = 0;
    let mut landed = [(0usize, 0usize); 3];
    for (run, landed) in slabs.iter().zip(&mut landed) {
        let start = run.start + expert as u64 * run.bytes;
        let (lo, hi) = (start / align * align, (start + run.bytes).div_ceil(align) * align);
        let span = (hi - lo) as usize;
        let file = files.get(run.part).ok_or_else(|| std::io::Error::other(format!("no part {}", run.part)))?;
        let end = at + span;
        if end > buf.len() {
            return Err(std::io::Error::other(format!("a slab span of {span} bytes overruns the slot")));
        }
        file.read_at_least(&mut buf[at..end], lo, (start + run.bytes - lo) as usize)?;
        *landed = (at + (start - lo) as usize, run.bytes as usize);
        at = end;
    }
    // Each slab moves towards the start and never onto a later span, so
    // moving them in order loses nothing.
    let mut to = 0;
    for (from, len) in landed {
        buf.copy_within(from..from + len, to);
        to += len;
    }
    Ok(())
}

/// Whether the open file description of `file` carries `O_DIRECT`, as the
/// kernel sees it (for tests and diagnostics; `false` off Linux).
pub fn fd_is_direct(file: &File) -> bool {
    waste_platform::is_direct(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buf_is_aligned_and_rounded() {
        let mut b = AlignedBuf::new(5000).unwrap();
        assert_eq!(b.len(), 8192);
        assert_eq!(b.as_slice().as_ptr() as usize % IO_ALIGN, 0);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        b.as_mut_slice()[8191] = 7;
        assert_eq!(b.as_slice()[8191], 7);
    }

    #[test]
    fn slot_buffers_are_disjoint_aligned_and_zeroed() {
        for huge in [false, true] {
            let mut bufs = slot_buffers(3, 5000, huge).unwrap();
            assert_eq!(bufs.len(), 3);
            for (i, b) in bufs.iter_mut().enumerate() {
                assert_eq!(b.len(), 8192);
                assert_eq!(b.as_slice().as_ptr() as usize % IO_ALIGN, 0);
                assert!(b.as_slice().iter().all(|&x| x == 0));
                b.as_mut_slice().fill(i as u8 + 1);
            }
            for (i, b) in bufs.iter().enumerate() {
                assert!(b.as_slice().iter().all(|&x| x == i as u8 + 1), "slot {i} overwritten");
            }
            if huge && cfg!(target_os = "linux") {
                assert_eq!(bufs[0].as_slice().as_ptr() as usize % HUGE_PAGE, 0);
            }
            // Slices outlive a dropped sibling (the arena is shared).
            let last = bufs.pop().unwrap();
            drop(bufs);
            assert!(last.as_slice().iter().all(|&x| x == 3));
        }
    }

    /// Pages of `buf` resident in RAM, by `mincore`.
    #[cfg(target_os = "linux")]
    fn resident_pages(buf: &AlignedBuf) -> usize {
        let pages = buf.len().div_ceil(4096);
        let mut vec = vec![0u8; pages];
        // SAFETY: the range is the buffer's own (4 KiB aligned, inside its
        // mapping or allocation); `vec` has one byte per page of it.
        let r = unsafe { libc::mincore(buf.ptr.as_ptr().cast(), buf.len(), vec.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
        vec.iter().filter(|&&b| b & 1 == 1).count()
    }

    /// Regression (opening with a budget far above use stalled while the
    /// whole slot arena was zeroed, 15-20 s at 18 GB): making the slots
    /// faults none of their pages; the first read into a slot (or the idle
    /// readers' fault-ahead) faults that slot alone.
    #[cfg(target_os = "linux")]
    #[test]
    fn slots_fault_their_pages_on_first_use_not_when_made() {
        // The slot arena (heap buffers are written by the allocator).
        let huge = true;
        let len = 2_666_496;
        let mut bufs = slot_buffers(64, len, huge).unwrap();
        let resident: usize = bufs.iter().map(resident_pages).sum();
        assert_eq!(resident, 0, "huge {huge}: {resident} pages resident before any use");
        bufs[3].as_mut_slice()[0] = 1;
        bufs[10].fault_in();
        for (i, b) in bufs.iter().enumerate() {
            let r = resident_pages(b);
            if i == 3 || i == 10 {
                assert_eq!(r, b.len() / 4096, "huge {huge}: slot {i} not wholly resident");
            } else if [2, 4, 9, 11].contains(&i) {
                // A huge page of a used neighbour may reach into it.
                assert!(r <= 1024, "huge {huge}: slot {i} has {r} pages resident");
            } else {
                assert_eq!(r, 0, "huge {huge}: slot {i}, never used, has {r} pages resident");
            }
        }
    }

    /// Regression guard for GGUF files read in place: the aligned span
    /// around a slab near a file's unaligned end reaches past it, and a
    /// direct read there returns short; that is enough when the slab's
    /// bytes are in, an error when they are not.
    #[test]
    fn an_aligned_span_past_the_end_of_a_file_reads_what_is_there() {
        let dir = std::env::temp_dir().join(format!("waste-io-short-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tail.bin");
        let bytes: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        for direct in [true, false] {
            let file = BankFile::open(&path, direct, IO_ALIGN).unwrap();
            let mut buf = AlignedBuf::new(2 * IO_ALIGN).unwrap();
            file.read_at_least(buf.as_mut_slice(), IO_ALIGN as u64, 5000 - IO_ALIGN).unwrap();
            assert!(buf.as_slice()[..5000 - IO_ALIGN] == bytes[IO_ALIGN..], "direct {direct}");
            // Buffered: the end of the file; direct: that, or the kernel
            // refusing the unaligned read after the short one.
            let err = file.read_at_least(buf.as_mut_slice(), IO_ALIGN as u64, 5001 - IO_ALIGN).unwrap_err();
            assert!(file.direct() || err.kind() == std::io::ErrorKind::UnexpectedEof, "direct {direct}: {err}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn direct_open_on_this_file_system_sets_o_direct() {
        let dir = std::env::temp_dir().join(format!("waste-io-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bank.bin");
        std::fs::write(&path, vec![3u8; 3 * IO_ALIGN]).unwrap();
        let bank = BankFile::open(&path, true, IO_ALIGN).unwrap();
        let mut buf = AlignedBuf::new(2 * IO_ALIGN).unwrap();
        bank.read_at(buf.as_mut_slice(), IO_ALIGN as u64).unwrap();
        assert!(buf.as_slice().iter().all(|&x| x == 3));
        let buffered = BankFile::open(&path, false, IO_ALIGN).unwrap();
        assert!(!buffered.direct() && !fd_is_direct(buffered.file()));
        let fs_type = std::process::Command::new("stat").args(["-f", "-c", "%T"]).arg(&dir).output();
        let fs_type = fs_type.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default();
        std::fs::remove_dir_all(&dir).unwrap();
        if fs_type == "tmpfs" {
            crate::skip::report_skip(&format!(
                "SKIP direct I/O check: {} is tmpfs, which refuses O_DIRECT",
                dir.display()
            ));
            assert!(!bank.direct());
            return;
        }
        assert!(bank.direct(), "direct I/O refused on {fs_type}");
        assert!(fd_is_direct(bank.file()), "O_DIRECT not set on the descriptor");
    }
}
