//! Linux: `O_DIRECT`, `posix_fadvise`, `/proc`, cgroups v1 and v2,
//! `sched_setaffinity`.

use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::ptr::NonNull;
use std::time::Duration;

/// `CPU_SETSIZE`: the CPUs a `cpu_set_t` can name.
const MAX_CPU: usize = 1024;

pub(crate) fn open_direct(path: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path).ok()
}

pub(crate) fn advise_random(file: &File) {
    // SAFETY: posix_fadvise on a descriptor we own; advice only, so a
    // failure (reported by the return value) changes nothing but speed.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM);
    }
}

pub(crate) fn is_direct(file: &File) -> bool {
    // SAFETY: F_GETFL on a descriptor we own takes no argument.
    let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    flags != -1 && flags & libc::O_DIRECT != 0
}

pub(crate) fn physical_ram() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

pub(crate) fn memory_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroup_limit(Path::new("/sys/fs/cgroup"), &text)
}

/// The smallest finite memory limit on the cgroup path of a process whose
/// `/proc/PID/cgroup` reads `proc_cgroup`, with the cgroup file systems
/// mounted under `root`: cgroup v2 `memory.max` and `memory.high` (and v1
/// `memory.limit_in_bytes` under `root/memory`), walked from the process's
/// group up to the root. A path that does not exist under `root` (a cgroup
/// namespace shows the process at `/`) is walked as far as it exists.
pub fn cgroup_limit(root: &Path, proc_cgroup: &str) -> Option<u64> {
    let mut best: Option<u64> = None;
    let mut take = |v: Option<u64>| {
        if let Some(v) = v {
            best = Some(best.map_or(v, |b| b.min(v)));
        }
    };
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let rel = path.trim_start_matches('/');
        if id == "0" && controllers.is_empty() {
            for dir in ancestors(&root.join(rel), root) {
                take(read_limit(&dir.join("memory.max")));
                take(read_limit(&dir.join("memory.high")));
            }
        } else if controllers.split(',').any(|c| c == "memory") {
            let base = root.join("memory");
            for dir in ancestors(&base.join(rel), &base) {
                take(read_limit(&dir.join("memory.limit_in_bytes")));
            }
        }
    }
    best
}

/// `dir` and its parents down to `stop` inclusive.
fn ancestors(dir: &Path, stop: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut d = Some(dir);
    while let Some(p) = d {
        if !p.starts_with(stop) {
            break;
        }
        out.push(p.to_path_buf());
        if p == stop {
            break;
        }
        d = p.parent();
    }
    out
}

/// A limit file's value; `max` and v1's "unlimited" (a huge page-rounded
/// number) read as no limit.
fn read_limit(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let v: u64 = text.trim().parse().ok()?;
    (v < 1 << 60).then_some(v)
}

pub(crate) fn bind_current_thread(cpus: &[usize]) -> io::Result<()> {
    if let Some(&c) = cpus.iter().find(|&&c| c >= MAX_CPU) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("CPU {c} is past the {MAX_CPU} a set can name"),
        ));
    }
    // SAFETY: cpu_set_t is plain bits; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        // SAFETY: c < MAX_CPU = CPU_SETSIZE (checked above), inside the set's bits.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: pid 0 is the calling thread; `set` is a valid cpu_set_t of
    // the size passed.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub(crate) fn current_affinity() -> io::Result<Vec<usize>> {
    // SAFETY: zeroed cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is the calling thread; `set` has the size passed.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: c < CPU_SETSIZE.
    Ok((0..MAX_CPU).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect())
}

pub(crate) fn cpu_times(thread: bool) -> Option<(Duration, Duration)> {
    let who = if thread { libc::RUSAGE_THREAD } else { libc::RUSAGE_SELF };
    crate::unix::rusage(who).map(|(u, s, _)| (u, s))
}

pub(crate) fn process_read_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/io").ok()?;
    text.lines().find_map(|l| l.strip_prefix("read_bytes:"))?.trim().parse().ok()
}

pub(crate) fn peak_rss() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// An anonymous mapping of `len` bytes starting on a `huge_page` boundary,
/// advised `MADV_HUGEPAGE`: (start, advice accepted).
pub(crate) fn map_huge(len: usize, huge_page: usize) -> Option<(NonNull<u8>, bool)> {
    let span = len.checked_add(huge_page)?;
    // SAFETY: a fresh anonymous private mapping; no address hint, no fd.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return None;
    }
    let base = raw as usize;
    let start = base.div_ceil(huge_page) * huge_page;
    let (head, tail) = (start - base, base + span - (start + len));
    // SAFETY: head and tail are page-aligned (mmap returns page-aligned
    // addresses, start and len are 4 KiB multiples) sub-ranges of the
    // mapping just made, outside [start, start + len); unmapping them
    // leaves exactly the aligned range.
    unsafe {
        if head > 0 {
            libc::munmap(raw, head);
        }
        if tail > 0 {
            libc::munmap((start + len) as *mut libc::c_void, tail);
        }
    }
    // SAFETY: advice on a range we own; failure (THP disabled: EINVAL)
    // leaves ordinary pages, which is only slower.
    let advised = unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE) } == 0;
    Some((NonNull::new(start as *mut u8)?, advised))
}

/// # Safety
/// As `crate::release_pages`.
pub(crate) unsafe fn release_pages(ptr: *mut u8, len: usize) -> bool {
    // SAFETY: the caller owns the aligned anonymous range and holds no
    // reference into it; MADV_DONTNEED frees its pages and leaves it
    // mapped, reading as zeros (private anonymous memory).
    unsafe { libc::madvise(ptr as *mut libc::c_void, len, libc::MADV_DONTNEED) == 0 }
}

pub(crate) fn unmap(ptr: NonNull<u8>, len: usize) {
    // SAFETY: exactly the range `map_huge` kept mapped, owned by the
    // HugePages being dropped; nothing borrowed from it outlives that.
    unsafe {
        libc::munmap(ptr.as_ptr() as *mut libc::c_void, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    fn fixture(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("waste-cg-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn cgroup_v2_takes_the_smallest_of_max_and_high_up_the_path() {
        let root = fixture("v2");
        write(&root, "memory.max", "max\n");
        write(&root, "user.slice/memory.max", "8000000000\n");
        write(&root, "user.slice/memory.high", "max\n");
        write(&root, "user.slice/app.scope/memory.max", "max\n");
        write(&root, "user.slice/app.scope/memory.high", "6000000000\n");
        assert_eq!(cgroup_limit(&root, "0::/user.slice/app.scope\n"), Some(6_000_000_000));
        write(&root, "user.slice/memory.max", "5000000000\n");
        assert_eq!(cgroup_limit(&root, "0::/user.slice/app.scope\n"), Some(5_000_000_000));
        assert_eq!(cgroup_limit(&root, "0::/\n"), None, "root says max");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn cgroup_v1_reads_limit_in_bytes_of_the_memory_controller() {
        let root = fixture("v1");
        // This machine's layout: cgroup v1 with a memory controller path.
        write(&root, "memory/memory.limit_in_bytes", "9223372036854771712\n");
        write(&root, "memory/process_api/memory.limit_in_bytes", "9223372036854771712\n");
        write(&root, "memory/process_api/job1/memory.limit_in_bytes", "4294967296\n");
        let proc = "9:name=systemd:/\n4:memory:/process_api/job1\n1:cpu:/\n0::/\n";
        assert_eq!(cgroup_limit(&root, proc), Some(4_294_967_296));
        assert_eq!(cgroup_limit(&root, "4:memory:/process_api\n"), None, "unlimited is no limit");
        // A namespaced view (the path is missing) still finds the root limit.
        write(&root, "memory/memory.limit_in_bytes", "3000000000\n");
        assert_eq!(cgroup_limit(&root, "4:cpu,memory:/not/here\n"), Some(3_000_000_000));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
