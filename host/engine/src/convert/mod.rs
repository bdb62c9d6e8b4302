//! `waste convert`: a Hugging Face checkpoint directory -> a container.
//!
//! Built for releases far larger than RAM or spare disk (Kimi K3: 1.42 TB,
//! MXFP4 experts):
//!
//! * Streaming. The trunk is quantised a slice of rows at a time
//!   (trunk.rs); each MoE layer's experts are decoded one by one from the
//!   source dtype (bf16, fp8 block-scaled, MXFP4: checkpoint/decode.rs) and
//!   encoded into fixed-size records of the layer's bank (bank.rs). Peak
//!   memory is a codebook sample (capped in bytes) plus one expert per job.
//! * Resumable. Every output file is written as `<file>.tmp` and renamed;
//!   a `<file>.done` sidecar records the fingerprint of source + options and
//!   the manifest entry. A rerun reuses a file whose sidecar matches, whose
//!   size is right and whose checksums all still hold (each trunk tensor's
//!   and codebook range's in the sidecar's index; each record's header and
//!   payload checksum in a bank), and makes everything else again. `manifest.json` is written last and removed
//!   first, so a directory holding one is a complete container.
//! * `jobs` layer banks in parallel; a bank's bytes depend only on its layer
//!   and the options, so the output is identical for any `jobs`.
//! * `reclaim` deletes a source shard once every unit that reads it is
//!   written (reclaim.rs); a resumed run accepts the shards already gone.
//! * `follow` converts while the shards are still downloading, each unit
//!   once its shards are complete (follow.rs), so with `reclaim` the disk
//!   holds the output and the shards in flight, not the whole release.

mod bank;
mod files;
mod follow;
pub mod reclaim;
mod skipped;
mod templates;
mod trunk;
pub mod verify;

use std::collections::VecDeque;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use crate::checkpoint::{HfCheckpoint, OpenCheckpoint};
use crate::config::ModelConfig;
use crate::container::manifest::{
    record, ExpertBankEntry, ExpertIndex, Manifest, TrunkIndex, FORMAT_NAME, FORMAT_VERSION, MANIFEST_FILE, TRUNK_FILE,
};
use crate::error::{Error, Result};
use crate::files::Fnv;
use crate::quant::{ExpertFormat, TrunkFormat};
use files::write_atomic;
pub use reclaim::{ShardLedger, Unit};
pub use verify::{check_limits, max_relative_error, verify, MatrixError};

/// Files copied verbatim so a container is self-contained (with Kimi K3's
/// image processor settings).
const TOKENIZER_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "tokenizer.model",
    "tiktoken.model",
    crate::vision::preprocess::PREPROCESSOR_FILE,
];

/// Marks a directory as a conversion in progress (removed at the end).
const IN_PROGRESS: &str = ".waste-convert";

/// Test hook: fail after this many banks were written in this run, as a
/// kill would (integration test of resumption).
const FAIL_AFTER_ENV: &str = "WASTE_CONVERT_FAIL_AFTER_BANKS";

/// How a conversion stores the routed experts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ExpertsAs {
    /// Re-encoded from f32 into one of our formats.
    Encoded(ExpertFormat),
    /// A GGUF file's gate/up/down slabs copied in their ggml types (`gguf`):
    /// no second rounding, no codebook fit; each layer keeps the types the
    /// file gives it (a Q4_K_M file's down slabs are Q6_K in some layers).
    Stored,
}

impl ExpertsAs {
    /// `gguf`, or the encoded format's name.
    pub fn name(self) -> &'static str {
        match self {
            ExpertsAs::Encoded(f) => f.name(),
            ExpertsAs::Stored => ExpertFormat::GGUF_NAME,
        }
    }

    /// The choice when the caller makes none: a GGUF file (a source that
    /// is a file) keeps its experts as stored, a checkpoint directory gets
    /// rvq3.
    pub fn default_for(src: &Path) -> ExpertsAs {
        if src.is_file() {
            ExpertsAs::Stored
        } else {
            ExpertsAs::Encoded(ExpertFormat::Rvq3)
        }
    }

    /// `gguf` or one of our formats' names.
    pub fn parse(s: &str) -> Option<ExpertsAs> {
        if s == ExpertFormat::GGUF_NAME {
            return Some(ExpertsAs::Stored);
        }
        ExpertFormat::parse(s).map(ExpertsAs::Encoded)
    }
}

/// How a conversion stores the trunk's matrices.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TrunkAs {
    /// Decoded and stored in one of our formats (`TensorRole::trunk_format`
    /// picks each tensor's from it).
    Encoded(TrunkFormat),
    /// A GGUF file's matrices copied in their ggml types (`gguf`), rows
    /// reordered where llama.cpp's converter permuted them; a matrix whose
    /// blocks cannot be kept (DeepSeek's `kv_b_proj`, rebuilt from two
    /// tensors) and every F32 tensor become f32, exactly their values.
    Stored,
}

impl TrunkAs {
    pub fn name(self) -> &'static str {
        match self {
            TrunkAs::Encoded(f) => f.name(),
            TrunkAs::Stored => ExpertFormat::GGUF_NAME,
        }
    }

    /// The choice when the caller makes none: a GGUF file keeps its trunk
    /// as stored, a checkpoint directory gets q4.
    pub fn default_for(src: &Path) -> TrunkAs {
        if src.is_file() {
            TrunkAs::Stored
        } else {
            TrunkAs::Encoded(TrunkFormat::Q4)
        }
    }

    /// `gguf` or one of our trunk formats' names (f32, q8, q4).
    pub fn parse(s: &str) -> Option<TrunkAs> {
        match s {
            "f32" | "q8" | "q4" => TrunkFormat::parse(s).map(TrunkAs::Encoded),
            _ if s == ExpertFormat::GGUF_NAME => Some(TrunkAs::Stored),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConvertOptions {
    pub experts: ExpertsAs,
    pub trunk: TrunkAs,
    /// Seed of the codebook fit.
    pub seed: u64,
    /// Layer banks written in parallel (>= 1); the output does not depend on it.
    pub jobs: usize,
    /// Delete each source shard once everything it holds is written.
    pub reclaim: bool,
    /// Source shards may still be arriving (downloaded while converting):
    /// wait for each, failing after this long without a new one (follow.rs).
    pub follow: Option<Duration>,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            experts: ExpertsAs::Encoded(ExpertFormat::Rvq3),
            trunk: TrunkAs::Encoded(TrunkFormat::Q4),
            seed: 0x5EED,
            jobs: 1,
            reclaim: false,
            follow: None,
        }
    }
}

/// Reported to the caller's progress callback.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvertProgress {
    /// Units of work done and in all: one per trunk tensor and one per expert.
    pub done: u64,
    pub total: u64,
    pub what: String,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConvertReport {
    pub trunk_bytes: u64,
    pub expert_bytes: u64,
    pub expert_record_bytes: u64,
    pub moe_layers: usize,
    /// Checkpoint tensors the engine does not use (e.g. stale rotary buffers).
    pub ignored_tensors: Vec<String>,
    /// `ignored_tensors` by part, one line each (also in the manifest).
    pub skipped: Vec<String>,
    /// The release ships no chat template and the container got this
    /// bundled one (`templates::bundled_template`).
    pub bundled_template: Option<&'static str>,
    /// trunk.bin was reused from an earlier, interrupted run.
    pub trunk_reused: bool,
    /// Layers whose bank was reused from an earlier run.
    pub reused_banks: Vec<usize>,
    /// Source shards deleted by `reclaim`.
    pub reclaimed_shards: Vec<PathBuf>,
}

pub fn convert(
    src: &Path,
    out: &Path,
    opts: &ConvertOptions,
    progress: &mut dyn FnMut(&ConvertProgress),
) -> Result<ConvertReport> {
    if opts.jobs == 0 {
        return Err(Error::Arg("jobs must be at least 1".into()));
    }
    // Shards an earlier `reclaim` run deleted are fine when resuming into
    // the same output; their tensors are only ever needed by finished units.
    let resuming = out.join(IN_PROGRESS).is_file();
    if opts.follow.is_some() && !src.join(follow::INDEX).is_file() {
        return Err(Error::Arg(format!("following a download needs {} in {}", follow::INDEX, src.display())));
    }
    // A file is a GGUF (open_gguf checks its magic); a directory a checkpoint.
    let ckpt = if src.is_file() {
        if opts.follow.is_some() {
            return Err(Error::Arg(
                "following a download needs a Hugging Face checkpoint directory, not a GGUF file".into(),
            ));
        }
        HfCheckpoint::open_gguf(src)?
    } else {
        HfCheckpoint::open_with(
            src,
            &OpenCheckpoint {
                allow_missing_shards: resuming || opts.follow.is_some(),
                incomplete_as_missing: opts.follow.is_some(),
            },
        )?
    };
    let cfg = ckpt.config().clone();
    if opts.experts == ExpertsAs::Stored && ckpt.gguf_file().is_none() {
        return Err(Error::Arg(format!(
            "{}: --experts gguf keeps a GGUF file's experts as stored; a Hugging Face checkpoint needs f32, q8, q4, rvq3, rvq2 or rvq4p",
            src.display()
        )));
    }
    if opts.trunk == TrunkAs::Stored && ckpt.gguf_file().is_none() {
        return Err(Error::Arg(format!(
            "{}: --trunk gguf keeps a GGUF file's trunk as stored; a Hugging Face checkpoint needs f32, q8 or q4",
            src.display()
        )));
    }
    prepare_destination(out)?;
    let fingerprint = fingerprint(&ckpt, src, opts)?;
    write_atomic(&out.join(IN_PROGRESS), fingerprint.as_bytes())?;
    let report = write_container(&ckpt, &cfg, out, opts, &fingerprint, progress)?;
    fs::remove_file(out.join(IN_PROGRESS)).map_err(|e| Error::io(out, e))?;
    Ok(report)
}

/// Creates `out`, or accepts a previous container or an interrupted
/// conversion there; anything else is not ours to overwrite.
fn prepare_destination(out: &Path) -> Result<()> {
    if !out.exists() {
        let parent = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if !parent.is_dir() {
            return Err(Error::Arg(format!("the directory {} does not exist", parent.display())));
        }
        return fs::create_dir(out).map_err(|e| Error::io(out, e));
    }
    if out.is_dir() {
        let empty = fs::read_dir(out).map_err(|e| Error::io(out, e))?.next().is_none();
        if empty || out.join(IN_PROGRESS).is_file() {
            return Ok(());
        }
        if out.join(MANIFEST_FILE).is_file() {
            // The old container stops being one before anything changes.
            return fs::remove_file(out.join(MANIFEST_FILE)).map_err(|e| Error::io(out, e));
        }
    }
    Err(Error::Arg(format!("{} exists and is not a waste container; refusing to overwrite it", out.display())))
}

/// Identity of what the output is made from: the source's config and
/// weight index (or single file's size; a GGUF file's size and generated
/// config) and every option but `jobs` and `reclaim`, which do not change
/// the bytes.
fn fingerprint(ckpt: &HfCheckpoint, src: &Path, opts: &ConvertOptions) -> Result<String> {
    let mut h = Fnv::new();
    h.update(format!("v{FORMAT_VERSION} {} {} {}\n", opts.experts.name(), opts.trunk.name(), opts.seed).as_bytes());
    let config = ckpt.side_file("config.json")?.ok_or_else(|| Error::format(src, "no config.json"))?;
    h.update(&config);
    let index = src.join("model.safetensors.index.json");
    if let Some(g) = ckpt.gguf_file() {
        for len in &g.part_lens {
            h.update(&len.to_le_bytes());
        }
    } else if index.is_file() {
        h.update(&fs::read(&index).map_err(|e| Error::io(&index, e))?);
    } else {
        let single = src.join("model.safetensors");
        let len = fs::metadata(&single).map_err(|e| Error::io(&single, e))?.len();
        h.update(&len.to_le_bytes());
    }
    Ok(h.hex())
}

enum Msg {
    Expert { layer: usize, expert: usize },
    Bank { layer: usize, result: Result<(ExpertBankEntry, bool)> },
}

/// What a bank worker reports to the thread that owns the ledger.
enum BankEvent {
    Expert { layer: usize, expert: usize },
    Bank { entry: ExpertBankEntry, reused: bool },
}

/// The progress count and the caller's callback.
struct Tally<'a> {
    done: u64,
    total: u64,
    progress: &'a mut dyn FnMut(&ConvertProgress),
}

impl Tally<'_> {
    fn tick(&mut self, n: u64, what: String) {
        self.done += n;
        (self.progress)(&ConvertProgress { done: self.done, total: self.total, what });
    }
}

/// The `FAIL_AFTER_ENV` test hook, counted over the whole run.
struct FailHook {
    after: Option<usize>,
    written: AtomicUsize,
    injected: AtomicBool,
}

/// What every unit of one conversion shares.
struct Work<'a> {
    dir: &'a Path,
    opts: &'a ConvertOptions,
    layout: &'a bank::Layout,
    fingerprint: &'a str,
    hook: &'a FailHook,
}

/// Counts a bank event; returns a finished bank.
fn bank_event(ev: BankEvent, cfg: &ModelConfig, tally: &mut Tally) -> Option<(ExpertBankEntry, bool)> {
    match ev {
        BankEvent::Expert { layer, expert } => {
            tally.tick(1, format!("layer {layer} expert {expert}"));
            None
        }
        BankEvent::Bank { entry, reused } => {
            if reused {
                tally.tick(cfg.num_experts as u64, format!("layer {} (reused)", entry.layer));
            }
            Some((entry, reused))
        }
    }
}

/// Writes the banks of `layers`, `work.opts.jobs` at a time, calling `on`
/// (on this thread) for each expert and bank; an error from `on` stops the
/// workers like a bank's own error does.
fn write_banks(
    ckpt: &HfCheckpoint,
    layers: &[usize],
    work: &Work,
    on: &mut dyn FnMut(BankEvent) -> Result<()>,
) -> Result<()> {
    let Work { dir, opts, layout, fingerprint, hook } = *work;
    let queue = Mutex::new(layers.iter().copied().collect::<VecDeque<usize>>());
    let stop = AtomicBool::new(hook.injected.load(Ordering::SeqCst));
    let mut first_error: Option<(usize, Error)> = None;
    std::thread::scope(|s| {
        let (tx, rx) = mpsc::channel::<Msg>();
        for _ in 0..opts.jobs.min(layers.len().max(1)) {
            let tx = tx.clone();
            let (queue, stop) = (&queue, &stop);
            s.spawn(move || loop {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let Some(layer) = queue.lock().ok().and_then(|mut q| q.pop_front()) else {
                    return;
                };
                let tick = |expert: usize| {
                    let _ = tx.send(Msg::Expert { layer, expert });
                };
                let result = bank::write_bank(ckpt, dir, layer, opts, layout, fingerprint, &tick);
                // The test hook stops the worker that wrote the N-th bank
                // before it takes another, as a kill at that point would.
                if matches!(result, Ok((_, false)))
                    && hook.after.is_some_and(|n| hook.written.fetch_add(1, Ordering::SeqCst) + 1 >= n)
                {
                    hook.injected.store(true, Ordering::SeqCst);
                    stop.store(true, Ordering::SeqCst);
                }
                let _ = tx.send(Msg::Bank { layer, result });
            });
        }
        drop(tx);
        for msg in rx {
            let (layer, result) = match msg {
                Msg::Expert { layer, expert } => (layer, on(BankEvent::Expert { layer, expert })),
                Msg::Bank { layer, result: Ok((entry, reused)) } => {
                    if first_error.is_some() {
                        continue;
                    }
                    (layer, on(BankEvent::Bank { entry, reused }))
                }
                Msg::Bank { layer, result: Err(e) } => (layer, Err(e)),
            };
            if let Err(e) = result {
                stop.store(true, Ordering::SeqCst);
                // The lowest layer's error, whatever the thread timing.
                if first_error.as_ref().is_none_or(|(l, _)| layer < *l) {
                    first_error = Some((layer, e));
                }
            }
        }
    });
    if let Some((_, e)) = first_error {
        return Err(e);
    }
    if hook.injected.load(Ordering::SeqCst) {
        let n = hook.written.load(Ordering::SeqCst);
        return Err(Error::Runtime(format!("{FAIL_AFTER_ENV}: stopped after {n} bank(s)")));
    }
    Ok(())
}

fn write_container(
    ckpt: &HfCheckpoint,
    cfg: &ModelConfig,
    dir: &Path,
    opts: &ConvertOptions,
    fingerprint: &str,
    progress: &mut dyn FnMut(&ConvertProgress),
) -> Result<ConvertReport> {
    let trunk_names = cfg.trunk_tensor_names();
    let moe_layers: Vec<usize> = (0..cfg.num_layers).filter(|&l| cfg.is_moe_layer(l)).collect();
    let total = (trunk_names.len() + moe_layers.len() * cfg.num_experts) as u64;
    let mut report = ConvertReport { moe_layers: moe_layers.len(), ..Default::default() };
    report.ignored_tensors = ignored_tensors(ckpt, cfg);
    report.skipped = skipped::describe(cfg, &report.ignored_tensors);
    // Small files first: a reclaimed source must not lose them.
    let SmallFiles { files, bundled_template, config, generation_config } = small_files(ckpt, cfg)?;
    let mut tokenizer_files = Vec::with_capacity(files.len());
    for (name, bytes) in files {
        write_atomic(&dir.join(&name), &bytes)?;
        tokenizer_files.push(name);
    }
    report.bundled_template = bundled_template;

    let layout = bank::Layout::new(ckpt, &moe_layers, opts.experts)?;
    let (shape, payload_bytes, record_bytes) = (layout.shape, layout.longest_payload(), layout.record_bytes);
    let hook = FailHook {
        after: std::env::var(FAIL_AFTER_ENV).ok().and_then(|v| v.parse().ok()),
        written: AtomicUsize::new(0),
        injected: AtomicBool::new(false),
    };
    let mut tally = Tally { done: 0, total, progress };
    let work = Work { dir, opts, layout: &layout, fingerprint, hook: &hook };

    let mut ledger = None;
    let (tensors, mut banks) = if let Some(timeout) = opts.follow {
        follow::run(ckpt.dir(), cfg, &moe_layers, &work, timeout, &mut tally, &mut report)?
    } else {
        let (tensors, reused) =
            trunk::write_trunk(ckpt, cfg, &dir.join(TRUNK_FILE), opts.trunk, fingerprint, &mut |what| {
                tally.tick(1, what.to_string())
            })?;
        if reused {
            tally.tick(trunk_names.len() as u64, "trunk (reused)".into());
        }
        report.trunk_reused = reused;
        let mut led = ShardLedger::new(ckpt, &moe_layers);
        led.done(Unit::Trunk);
        reclaim_ready(&mut led, opts, &mut report)?;
        let mut banks = Vec::with_capacity(moe_layers.len());
        write_banks(ckpt, &moe_layers, &work, &mut |ev| {
            if let Some((entry, reused)) = bank_event(ev, cfg, &mut tally) {
                let layer = entry.layer as usize;
                banks.push(entry);
                if reused {
                    report.reused_banks.push(layer);
                }
                led.done(Unit::Bank(layer));
                reclaim_ready(&mut led, opts, &mut report)?;
            }
            Ok(())
        })?;
        ledger = Some(led);
        (tensors, banks)
    };
    report.trunk_bytes = tensors.iter().map(|t| t.bytes).sum();
    banks.sort_by_key(|b| b.layer);
    report.reused_banks.sort_unstable();
    report.expert_bytes = banks.len() as u64 * cfg.num_experts as u64 * record_bytes;
    report.expert_record_bytes = record_bytes;
    remove_stale(dir, &banks)?;

    // The manifest last: a directory without one is not a container.
    let manifest = Manifest {
        format: FORMAT_NAME.to_string(),
        format_version: FORMAT_VERSION,
        writer: format!("waste {}", env!("CARGO_PKG_VERSION")),
        config,
        generation_config,
        trunk: TrunkIndex { file: TRUNK_FILE.to_string(), format: opts.trunk.name().to_string(), tensors },
        experts: ExpertIndex {
            format: opts.experts.name().to_string(),
            hidden: shape.hidden as u64,
            inter: shape.inter as u64,
            biases: shape.biases,
            record_bytes,
            payload_offset: record::HEADER_BYTES,
            payload_bytes,
            layers: banks,
        },
        tokenizer_files,
        skipped: report.skipped.clone(),
    };
    let json = serde_json::to_vec_pretty(&manifest).map_err(|e| Error::Runtime(e.to_string()))?;
    write_atomic(&dir.join(MANIFEST_FILE), &json)?;
    // A single-file source is one shard: reclaimed now that all is written.
    if let Some(ledger) = &mut ledger {
        reclaim_ready(ledger, opts, &mut report)?;
    }
    Ok(report)
}

fn reclaim_ready(ledger: &mut ShardLedger, opts: &ConvertOptions, report: &mut ConvertReport) -> Result<()> {
    if !opts.reclaim {
        return Ok(());
    }
    for shard in ledger.reclaimable() {
        report.reclaimed_shards.push(ledger.reclaim(shard)?);
    }
    Ok(())
}

/// Bank, codebook and temp files of an earlier conversion that this one
/// did not produce (another layer count, the old shared codebooks.bin).
fn remove_stale(dir: &Path, banks: &[ExpertBankEntry]) -> Result<()> {
    let mut keep: Vec<String> = Vec::new();
    for b in banks {
        keep.push(b.file.clone());
        if let Some(cb) = &b.codebooks {
            keep.push(cb.file.clone());
        }
    }
    for entry in fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().to_string();
        let base = name.strip_suffix(".done").unwrap_or(&name);
        let ours = (base.starts_with("experts-") || base.starts_with("codebooks") || base.starts_with("trunk-part-"))
            && base.ends_with(".bin");
        if (ours && !keep.iter().any(|k| k == base)) || name.ends_with(".tmp") {
            fs::remove_file(entry.path()).map_err(|e| Error::io(entry.path(), e))?;
        }
    }
    Ok(())
}

/// Checkpoint tensors the engine does not use: neither trunk nor expert.
fn ignored_tensors(ckpt: &HfCheckpoint, cfg: &ModelConfig) -> Vec<String> {
    let trunk_names = cfg.trunk_tensor_names();
    let known: std::collections::HashSet<&str> = trunk_names.iter().map(String::as_str).collect();
    ckpt.tensor_names().into_iter().filter(|n| !known.contains(n.as_str()) && !cfg.is_expert_tensor(n)).collect()
}

/// The manifest's `skipped` lines for `ckpt`: the parts a container of it
/// leaves out.
pub(crate) fn skipped_parts(ckpt: &HfCheckpoint, cfg: &ModelConfig) -> Vec<String> {
    skipped::describe(cfg, &ignored_tensors(ckpt, cfg))
}

/// What a container carries besides its weights, read from a checkpoint.
pub(crate) struct SmallFiles {
    /// Tokenizer and template files by name, in `TOKENIZER_FILES` order
    /// (the bundled template last, when the release has none).
    pub files: Vec<(String, Vec<u8>)>,
    /// Where the bundled template came from, when one was added.
    pub bundled_template: Option<&'static str>,
    pub config: serde_json::Value,
    pub generation_config: Option<serde_json::Value>,
}

/// The tokenizer, template and config files a container of `ckpt` holds:
/// the files a conversion writes, and what a GGUF file opened in place
/// carries in memory.
pub(crate) fn small_files(ckpt: &HfCheckpoint, cfg: &ModelConfig) -> Result<SmallFiles> {
    let mut files = Vec::new();
    for name in TOKENIZER_FILES {
        if let Some(bytes) = ckpt.side_file(name)? {
            files.push((name.to_string(), bytes));
        }
    }
    let has_template = files.iter().any(|(n, _)| n == "chat_template.jinja")
        || ckpt.side_file("tokenizer_config.json")?.is_some_and(|b| templates::config_has_template(&b));
    let mut bundled_template = None;
    if let (false, Some((template, source))) = (has_template, templates::bundled_template(&cfg.model_type)) {
        files.push(("chat_template.jinja".to_string(), template.as_bytes().to_vec()));
        bundled_template = Some(source);
    }
    let config = side_json(ckpt, "config.json")?.ok_or_else(|| Error::format(ckpt.dir(), "no config.json"))?;
    let generation_config = side_json(ckpt, "generation_config.json")?;
    Ok(SmallFiles { files, bundled_template, config, generation_config })
}

fn side_json(ckpt: &HfCheckpoint, name: &str) -> Result<Option<serde_json::Value>> {
    let Some(bytes) = ckpt.side_file(name)? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| Error::format(ckpt.dir().join(name), format!("malformed JSON: {e}")))
}
