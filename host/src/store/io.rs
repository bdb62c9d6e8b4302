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
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::ptr::NonNull;

use crate::error::{Error, Result};

/// Alignment of every I/O buffer; also the record alignment in the container.
pub const IO_ALIGN: usize = 4096;

/// A zero-initialised heap buffer whose start and length are multiples of
/// 4 KiB, as direct I/O requires. Its pages are not touched until used, so
/// an allocated but never-filled cache slot costs address space, not RAM.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
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
        Ok(AlignedBuf { ptr, len })
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

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout (checked there).
        unsafe { alloc::dealloc(self.ptr.as_ptr(), Layout::from_size_align_unchecked(self.len, IO_ALIGN)) }
    }
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
}

#[cfg(target_os = "linux")]
fn open_direct(path: &Path) -> Option<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .ok()
}

#[cfg(target_os = "macos")]
fn open_direct(path: &Path) -> Option<File> {
    let file = File::open(path).ok()?;
    // SAFETY: fcntl on a descriptor we own, with an integer argument.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_NOCACHE, 1) };
    (rc != -1).then_some(file)
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn open_direct(_path: &Path) -> Option<File> {
    None
}

#[cfg(target_os = "linux")]
fn advise_random(file: &File) {
    // SAFETY: posix_fadvise on a descriptor we own; advice only, so a
    // failure (reported by the return value) changes nothing but speed.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM);
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_random(_file: &File) {}

/// Whether the open file description of `file` carries `O_DIRECT`, as the
/// kernel sees it (for tests and diagnostics).
#[cfg(target_os = "linux")]
pub fn fd_is_direct(file: &File) -> bool {
    // SAFETY: F_GETFL on a descriptor we own takes no argument.
    let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    flags != -1 && flags & libc::O_DIRECT != 0
}

#[cfg(not(target_os = "linux"))]
pub fn fd_is_direct(_file: &File) -> bool {
    false
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
        let fs_type = std::process::Command::new("stat")
            .args(["-f", "-c", "%T"])
            .arg(&dir)
            .output();
        let fs_type = fs_type
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        std::fs::remove_dir_all(&dir).unwrap();
        if fs_type == "tmpfs" {
            crate::report_skip(&format!(
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
