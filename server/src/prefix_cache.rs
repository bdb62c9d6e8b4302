//! The prefix cache: the states of the last conversations, held in memory
//! (`--cache-sessions`) and, with `--prompt-cache-dir`, on disk, so that a
//! request whose prompt extends an earlier one evaluates only the rest,
//! also after a restart.
//!
//! Resuming only moves bytes: the logits are those of evaluating the whole
//! prompt (a prompt's evaluation does not depend on where it is split), and
//! a state read back from disk is the state that was written, bit for bit
//! (checksummed; a file that fails is not used).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::SystemTime;

use waste_host::{Model, SavedSnapshot, Snapshot};

/// Where saved states go, and how many bytes of them may stay.
#[derive(Debug, Clone)]
pub struct DiskOptions {
    pub dir: PathBuf,
    pub max_bytes: u64,
}

/// The file name ending of a saved state; other files in the directory are
/// not the cache's and are left alone.
const EXTENSION: &str = "waste-prompt";

/// What became of the disk side since start, for `/stats`.
#[derive(Debug, Default, Clone, Copy)]
pub struct DiskTally {
    /// Requests resumed from a state read back from disk.
    pub hits: u64,
    pub written: u64,
    /// Files passed over: another model's, damaged, unreadable.
    pub ignored: u64,
    pub evicted: u64,
}

/// Saved states of this model, least recently used first; the directory
/// may also hold other models' files, which are neither used nor evicted.
pub struct DiskCache {
    options: DiskOptions,
    /// The model whose states these are.
    model: Arc<Model>,
    saved: Vec<SavedSnapshot>,
    /// The file being written by a thread of its own, so the next request
    /// need not wait for it; at most one at a time.
    writing: Option<Writing>,
    pub tally: DiskTally,
}

struct Writing {
    path: PathBuf,
    /// The state being written, shared with the held one it copies.
    snapshot: Arc<Snapshot>,
    done: JoinHandle<waste_host::Result<()>>,
}

impl DiskCache {
    /// Creates `options.dir` if needed and reads the header of every saved
    /// state in it. A file that is not a usable state of `model` (another
    /// model's, damaged, from another context size) is passed over with
    /// one line on stderr.
    pub fn open(options: DiskOptions, model: &Arc<Model>) -> std::io::Result<DiskCache> {
        std::fs::create_dir_all(&options.dir)?;
        let mut found = Vec::new();
        let mut tally = DiskTally::default();
        for entry in std::fs::read_dir(&options.dir)? {
            let path = entry?.path();
            // A write cut short by a stop leaves its temporary file.
            if path.extension().is_some_and(|e| e == "tmp-save") && is_cache_name(&path) {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some(EXTENSION) {
                continue;
            }
            match Snapshot::peek(model, &path) {
                Ok(saved) => found.push((modified(&path), saved)),
                Err(e) => {
                    tally.ignored += 1;
                    eprintln!("waste serve: prompt cache: ignoring {}: {e}", path.display());
                }
            }
        }
        found.sort_by_key(|(when, _)| *when);
        let mut cache = DiskCache {
            options,
            model: Arc::clone(model),
            saved: found.into_iter().map(|(_, s)| s).collect(),
            writing: None,
            tally,
        };
        // A smaller --prompt-cache-max than the last run's applies at once.
        cache.evict_until(0);
        Ok(cache)
    }

    pub fn max_bytes(&self) -> u64 {
        self.options.max_bytes
    }

    pub fn files(&self) -> usize {
        self.saved.len()
    }

    pub fn bytes(&self) -> u64 {
        self.saved.iter().map(SavedSnapshot::file_bytes).sum()
    }

    /// The saved state that resumes the most of `prompt`: its index and
    /// how many tokens it covers.
    fn best(&self, prompt: &[u32], rewindable: bool) -> Option<(usize, usize)> {
        self.saved
            .iter()
            .enumerate()
            .map(|(i, s)| (i, s.usable_prefix(prompt, rewindable)))
            .max_by_key(|&(i, keep)| (keep, i))
            .filter(|&(_, keep)| keep > 0)
    }

    /// Reads saved state `i` back whole, checksum verified; it becomes the
    /// most recently used. A file that fails is dropped from the cache and
    /// removed (it is this model's and cannot be used), with a line on
    /// stderr.
    fn load(&mut self, i: usize, model: &Model) -> Option<Snapshot> {
        let saved = self.saved.remove(i);
        match saved.load(model) {
            Ok(snapshot) => {
                touch(saved.path());
                self.saved.push(saved);
                self.tally.hits += 1;
                Some(snapshot)
            }
            Err(e) => {
                self.tally.ignored += 1;
                eprintln!("waste serve: prompt cache: removing {}: {e}", saved.path().display());
                let _ = std::fs::remove_file(saved.path());
                None
            }
        }
    }

    /// Starts writing `snapshot` on a thread of its own unless a file
    /// already holds its tokens, evicting the least recently used files
    /// first so that the directory's files of this model stay within
    /// `max_bytes`; files whose tokens it extends are superseded and
    /// removed. A state larger than the bound is not written. A write still
    /// running is finished first.
    fn start_save(&mut self, snapshot: &Arc<Snapshot>) -> std::result::Result<(), String> {
        self.finish_write();
        let model = Arc::clone(&self.model);
        let tokens = snapshot.tokens();
        if tokens.is_empty() {
            return Ok(());
        }
        let path = self.options.dir.join(format!("{}.{EXTENSION}", name_of(&model, tokens)));
        if let Some(i) = self.saved.iter().position(|s| s.path() == path && s.tokens() == tokens) {
            let same = self.saved.remove(i);
            touch(same.path());
            self.saved.push(same);
            return Ok(());
        }
        let estimate = snapshot.file_bytes_estimate();
        if estimate > self.options.max_bytes {
            return Err(format!(
                "a state of {} tokens takes about {estimate} bytes, more than --prompt-cache-max ({})",
                tokens.len(),
                self.options.max_bytes
            ));
        }
        // Removed before the write so the bound holds while it runs: a
        // superseded file, then the least recently used.
        self.remove_where(|s| tokens.starts_with(s.tokens()) || s.path() == path);
        self.evict_until(estimate);
        let (state, owner, file) = (Arc::clone(snapshot), model, path.clone());
        let done = std::thread::Builder::new()
            .name("waste-prompt-cache".into())
            .spawn(move || state.save(&owner, &file))
            .map_err(|e| format!("starting the writer: {e}"))?;
        self.writing = Some(Writing { path, snapshot: Arc::clone(snapshot), done });
        Ok(())
    }

    /// Whether a write is running that holds `snapshot`.
    fn writes(&self, snapshot: &Arc<Snapshot>) -> bool {
        self.writing.as_ref().is_some_and(|w| Arc::ptr_eq(&w.snapshot, snapshot))
    }

    /// Whether the running write, if any, has ended.
    fn write_ended(&self) -> bool {
        self.writing.as_ref().is_none_or(|w| w.done.is_finished())
    }

    /// Waits for the running write, if any, and takes its file into the
    /// cache (or says on stderr why it is not there).
    fn finish_write(&mut self) {
        let Some(w) = self.writing.take() else { return };
        let written = match w.done.join() {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err("the writer panicked".to_string()),
        }
        .and_then(|()| Snapshot::peek(&self.model, &w.path).map_err(|e| e.to_string()));
        match written {
            Ok(saved) => {
                self.saved.push(saved);
                self.tally.written += 1;
                self.evict_until(0);
            }
            Err(e) => eprintln!("waste serve: prompt cache: not saved: {e}"),
        }
    }

    /// Removes the least recently used files until `room` more bytes fit.
    fn evict_until(&mut self, room: u64) {
        while !self.saved.is_empty() && self.bytes() + room > self.options.max_bytes {
            let gone = self.saved.remove(0);
            let _ = std::fs::remove_file(gone.path());
            self.tally.evicted += 1;
        }
    }

    fn remove_where(&mut self, superseded: impl Fn(&SavedSnapshot) -> bool) {
        self.saved.retain(|s| {
            let keep = !superseded(s);
            if !keep {
                let _ = std::fs::remove_file(s.path());
            }
            keep
        });
    }
}

/// A saved state's file name: the model and the tokens, hashed, so that the
/// same conversation saved twice lands on one file.
fn name_of(model: &Model, tokens: &[u32]) -> String {
    let mut h = waste_host::Fnv::new();
    h.update(model.identity().as_bytes());
    for t in tokens {
        h.update(&t.to_le_bytes());
    }
    h.hex()
}

/// Whether `path`'s stem is a name [`name_of`] gives.
fn is_cache_name(path: &Path) -> bool {
    path.file_stem().and_then(|s| s.to_str()).is_some_and(|s| s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn modified(path: &Path) -> SystemTime {
    std::fs::metadata(path).and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Marks a file used now: the order of use survives a restart through the
/// files' modification times.
fn touch(path: &Path) {
    if let Ok(f) = std::fs::File::options().write(true).open(path) {
        let _ = f.set_modified(SystemTime::now());
    }
}

/// The states of the last conversations, most recently used last. A request
/// whose prompt extends one resumes it and evaluates only the rest: the
/// longest common prefix when the model's state can be cut back (attention
/// caches), else a state taken at the end of an earlier prompt (a message
/// boundary) that this prompt extends.
pub struct PrefixCache {
    /// Shared with the disk writer while it writes one.
    pub held: Vec<Arc<Snapshot>>,
    pub capacity: usize,
    pub disk: Option<DiskCache>,
    /// The newest held state is not on disk yet.
    unsaved: bool,
}

/// Where a resumed state came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Memory,
    Disk,
}

impl PrefixCache {
    pub fn new(capacity: usize, disk: Option<DiskCache>) -> PrefixCache {
        PrefixCache { held: Vec::new(), capacity, disk, unsaved: false }
    }

    /// Takes out the state that saves the most of `prompt`, held or saved
    /// on disk, with the number of tokens it saves.
    pub fn take_best(&mut self, prompt: &[u32], model: &Model) -> Option<(Arc<Snapshot>, usize, Source)> {
        let rewindable = model.rewindable_state();
        let in_memory = |held: &[Arc<Snapshot>]| {
            held.iter()
                .enumerate()
                .map(|(i, s)| (i, s.usable_prefix(prompt, rewindable)))
                .max_by_key(|&(i, keep)| (keep, i))
                .filter(|&(_, keep)| keep > 0)
        };
        let memory = in_memory(&self.held);
        let on_disk = self.disk.as_ref().and_then(|d| d.best(prompt, rewindable));
        if let Some((j, keep)) = on_disk.filter(|&(_, keep)| keep > memory.map_or(0, |(_, k)| k)) {
            // The state read back is one more in memory until the session
            // takes it over: room is made for it as for a kept one.
            self.make_room();
            let disk = self.disk.as_mut()?;
            if let Some(snapshot) = disk.load(j, model) {
                return Some((Arc::new(snapshot), keep, Source::Disk));
            }
        }
        let (i, keep) = in_memory(&self.held)?;
        Some((self.held.remove(i), keep, Source::Memory))
    }

    /// Puts back a state `take_best` took out, unused.
    pub fn put_back(&mut self, snapshot: Arc<Snapshot>, source: Source) {
        if source == Source::Memory {
            self.held.push(snapshot);
        }
    }

    /// Evicts the least recently used states until one more fits. A state
    /// the disk writer still holds is freed only once its write ends, so
    /// that write is waited for: the budget never holds one more.
    pub fn make_room(&mut self) {
        while !self.held.is_empty() && self.held.len() >= self.capacity {
            let gone = self.held.remove(0);
            if let Some(disk) = self.disk.as_mut().filter(|d| d.writes(&gone)) {
                drop(gone);
                disk.finish_write();
            }
        }
    }

    /// Holds the state `take` snapshots, evicting the least recently used
    /// first: the budget has room for `capacity` held states besides the
    /// session's own, never one more, even for a moment.
    pub fn keep(&mut self, take: impl FnOnce() -> Snapshot) {
        if self.capacity == 0 {
            return;
        }
        self.make_room();
        let snapshot = take();
        if snapshot.tokens().is_empty() {
            return;
        }
        // A held state this one extends is superseded by it.
        self.held.retain(|h| !snapshot.tokens().starts_with(h.tokens()));
        self.held.push(Arc::new(snapshot));
        self.unsaved = true;
    }

    /// Starts writing the newest held state to disk if it is not there
    /// yet: called once the answer has gone out; the write runs beside the
    /// next requests.
    pub fn persist(&mut self) {
        let (Some(disk), Some(newest)) = (self.disk.as_mut(), self.held.last()) else { return };
        if !std::mem::take(&mut self.unsaved) {
            return;
        }
        if let Err(e) = disk.start_save(newest) {
            eprintln!("waste serve: prompt cache: not saved: {e}");
        }
    }

    /// Whether a state is being written to disk.
    pub fn writing(&self) -> bool {
        self.disk.as_ref().is_some_and(|d| d.writing.is_some())
    }

    /// Takes a write that has ended into the cache; with `wait`, waits for
    /// a running one. Whether one was taken in.
    pub fn reap(&mut self, wait: bool) -> bool {
        match self.disk.as_mut() {
            Some(disk) if disk.writing.is_some() && (wait || disk.write_ended()) => {
                disk.finish_write();
                true
            }
            _ => false,
        }
    }
}
