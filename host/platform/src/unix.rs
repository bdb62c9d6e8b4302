//! What Linux and macOS share: `pread`/`pwrite` through std, `getrusage`.

use std::fs::File;
use std::io;
use std::time::Duration;

impl crate::FileExt for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        std::os::unix::fs::FileExt::read_at(self, buf, offset)
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(self, buf, offset)
    }
}

/// `getrusage(who)`: (user, system, peak RSS as the kernel reports it).
pub(crate) fn rusage(who: libc::c_int) -> Option<(Duration, Duration, i64)> {
    // SAFETY: getrusage fills the zeroed struct we own; no other effect.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        if libc::getrusage(who, &mut u) != 0 {
            return None;
        }
        u
    };
    let d = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    Some((d(usage.ru_utime), d(usage.ru_stime), usage.ru_maxrss as i64))
}
