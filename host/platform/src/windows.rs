//! Windows: `FILE_FLAG_NO_BUFFERING` (sector-aligned buffers, offsets and
//! lengths: the store's 4 KiB alignment covers every sector size in use),
//! `GlobalMemoryStatusEx`, the job object's memory limit (the counterpart
//! of a cgroup), `SetThreadGroupAffinity` within processor group 0.

use std::fs::File;
use std::io;
use std::os::windows::fs::{FileExt as _, OpenOptionsExt};
use std::path::Path;
use std::time::Duration;

use windows_sys::Win32::Foundation::FILETIME;
use windows_sys::Win32::Storage::FileSystem::FILE_FLAG_NO_BUFFERING;
use windows_sys::Win32::System::JobObjects::{
    JobObjectExtendedLimitInformation, QueryInformationJobObject, JOBOBJECT_EXTENDED_LIMIT_INFORMATION,
    JOB_OBJECT_LIMIT_JOB_MEMORY, JOB_OBJECT_LIMIT_PROCESS_MEMORY,
};
use windows_sys::Win32::System::ProcessStatus::{K32GetProcessMemoryInfo, PROCESS_MEMORY_COUNTERS};
use windows_sys::Win32::System::SystemInformation::{GlobalMemoryStatusEx, GROUP_AFFINITY, MEMORYSTATUSEX};
use windows_sys::Win32::System::Threading::{
    GetCurrentProcess, GetCurrentThread, GetProcessTimes, GetThreadGroupAffinity, GetThreadTimes,
    SetThreadGroupAffinity,
};

/// CPUs of one processor group: what a `GROUP_AFFINITY` mask can name.
const GROUP_CPUS: usize = usize::BITS as usize;

impl crate::FileExt for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.seek_read(buf, offset)
    }

    fn read_exact_at(&self, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.seek_read(buf, offset) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "failed to fill whole buffer")),
                Ok(n) => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn write_all_at(&self, mut buf: &[u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.seek_write(buf, offset) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "failed to write whole buffer")),
                Ok(n) => {
                    buf = &buf[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

pub(crate) fn open_direct(path: &Path) -> Option<File> {
    std::fs::OpenOptions::new().read(true).custom_flags(FILE_FLAG_NO_BUFFERING).open(path).ok()
}

pub(crate) fn advise_random(_file: &File) {}

/// The flag cannot be read back from a handle.
pub(crate) fn is_direct(_file: &File) -> bool {
    false
}

pub(crate) fn physical_ram() -> Option<u64> {
    // SAFETY: MEMORYSTATUSEX is plain data; zeroed with its length set is
    // the documented way to call GlobalMemoryStatusEx, which fills it.
    let mut status: MEMORYSTATUSEX = unsafe { std::mem::zeroed() };
    status.dwLength = std::mem::size_of::<MEMORYSTATUSEX>() as u32;
    // SAFETY: a valid, sized MEMORYSTATUSEX we own.
    let ok = unsafe { GlobalMemoryStatusEx(&mut status) } != 0;
    ok.then_some(status.ullTotalPhys)
}

pub(crate) fn memory_limit() -> Option<u64> {
    // SAFETY: plain data, filled by the call below.
    let mut info: JOBOBJECT_EXTENDED_LIMIT_INFORMATION = unsafe { std::mem::zeroed() };
    // SAFETY: a null job handle queries the job of the calling process; the
    // buffer is the struct of that information class, with its size. A
    // process in no job gets zero limit flags.
    let ok = unsafe {
        QueryInformationJobObject(
            std::ptr::null_mut(),
            JobObjectExtendedLimitInformation,
            (&mut info as *mut JOBOBJECT_EXTENDED_LIMIT_INFORMATION).cast(),
            std::mem::size_of::<JOBOBJECT_EXTENDED_LIMIT_INFORMATION>() as u32,
            std::ptr::null_mut(),
        )
    } != 0;
    if !ok {
        return None;
    }
    let flags = info.BasicLimitInformation.LimitFlags;
    let process = (flags & JOB_OBJECT_LIMIT_PROCESS_MEMORY != 0).then_some(info.ProcessMemoryLimit as u64);
    let job = (flags & JOB_OBJECT_LIMIT_JOB_MEMORY != 0).then_some(info.JobMemoryLimit as u64);
    match (process, job) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

pub(crate) fn bind_current_thread(cpus: &[usize]) -> io::Result<()> {
    if let Some(&c) = cpus.iter().find(|&&c| c >= GROUP_CPUS) {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("CPU {c} is outside processor group 0 (CPUs 0-{}): one group only", GROUP_CPUS - 1),
        ));
    }
    let mask = cpus.iter().fold(0usize, |m, &c| m | 1 << c);
    let affinity = GROUP_AFFINITY { Mask: mask, Group: 0, Reserved: [0; 3] };
    // SAFETY: the pseudo-handle of the calling thread; a valid
    // GROUP_AFFINITY we own; the previous affinity is not asked for.
    let ok = unsafe { SetThreadGroupAffinity(GetCurrentThread(), &affinity, std::ptr::null_mut()) } != 0;
    if ok {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

pub(crate) fn current_affinity() -> io::Result<Vec<usize>> {
    // SAFETY: plain data, filled by the call.
    let mut affinity: GROUP_AFFINITY = unsafe { std::mem::zeroed() };
    // SAFETY: the calling thread's pseudo-handle and a struct we own.
    if unsafe { GetThreadGroupAffinity(GetCurrentThread(), &mut affinity) } == 0 {
        return Err(io::Error::last_os_error());
    }
    let base = affinity.Group as usize * GROUP_CPUS;
    Ok((0..GROUP_CPUS).filter(|&c| affinity.Mask & (1 << c) != 0).map(|c| base + c).collect())
}

/// A FILETIME of 100 ns ticks.
fn ticks(t: FILETIME) -> Duration {
    let n = (t.dwHighDateTime as u64) << 32 | t.dwLowDateTime as u64;
    Duration::from_nanos(n.saturating_mul(100))
}

pub(crate) fn cpu_times(thread: bool) -> Option<(Duration, Duration)> {
    let zero = FILETIME { dwLowDateTime: 0, dwHighDateTime: 0 };
    let (mut created, mut exited, mut kernel, mut user) = (zero, zero, zero, zero);
    // SAFETY: pseudo-handles of the calling thread / process and four
    // FILETIMEs we own.
    let ok = unsafe {
        if thread {
            GetThreadTimes(GetCurrentThread(), &mut created, &mut exited, &mut kernel, &mut user)
        } else {
            GetProcessTimes(GetCurrentProcess(), &mut created, &mut exited, &mut kernel, &mut user)
        }
    } != 0;
    ok.then(|| (ticks(user), ticks(kernel)))
}

/// Not read here (see `process_read_bytes` in lib.rs).
pub(crate) fn process_read_bytes() -> Option<u64> {
    None
}

pub(crate) fn peak_rss() -> Option<u64> {
    // SAFETY: plain data, filled by the call.
    let mut counters: PROCESS_MEMORY_COUNTERS = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<PROCESS_MEMORY_COUNTERS>() as u32;
    counters.cb = size;
    // SAFETY: the calling process's pseudo-handle and a sized struct we own.
    let ok = unsafe { K32GetProcessMemoryInfo(GetCurrentProcess(), &mut counters, size) } != 0;
    ok.then_some(counters.PeakWorkingSetSize as u64)
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
