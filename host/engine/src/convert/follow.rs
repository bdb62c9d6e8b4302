//! `convert --follow`: convert while the source is still being downloaded,
//! so that with `--reclaim` the disk holds the output plus the few shards
//! in flight instead of the whole release.
//!
//! The conversion starts from `config.json` and the weight index alone. It
//! runs in rounds: reopen the checkpoint (headers only), write every unit
//! whose tensors are all in complete shards (each trunk tensor is a unit of
//! its own here, a piece joined into trunk.bin at the end; each MoE layer's
//! bank is one), reclaim the shards nothing pending reads, and when nothing
//! is ready, poll for the next shard. A shard counts as arrived when a file
//! of its name exists and its safetensors header describes exactly the
//! file's size (`checkpoint::shard_complete`): a downloader that writes a
//! temp name and renames (huggingface_hub, `curl -o x.part && mv`) is
//! always right; one writing in place is right as long as it does not
//! preallocate the file to its full size before filling it.
//!
//! A downloader keeps at most `W` shards present, fetching the next in
//! index order when one is deleted; `W` must be at least the number of
//! shards one unit spans (a layer bank split across two shards needs 2),
//! else both sides wait and the run fails after `timeout`.
//!
//! Resumable like any conversion: finished pieces and banks have sidecars,
//! and shards whose units are all written are deleted on arrival unread.

use std::path::Path;
use std::time::{Duration, Instant};

use super::reclaim::bank_tensor_names;
use super::{bank, bank_event, reclaim_ready, trunk, write_banks, ConvertReport, ShardLedger, Tally, Unit, Work};
use crate::checkpoint::{shard_complete, HfCheckpoint, OpenCheckpoint};
use crate::config::ModelConfig;
use crate::container::manifest::{ExpertBankEntry, TensorEntry, TRUNK_FILE};
use crate::error::{Error, Result};

pub(super) const INDEX: &str = "model.safetensors.index.json";

/// How often the source directory is looked at while waiting.
const POLL: Duration = Duration::from_millis(100);

/// Writes the trunk and every bank as their shards arrive; returns the
/// trunk's tensor entries and the banks (any order).
pub(super) fn run(
    src: &Path,
    cfg: &ModelConfig,
    moe_layers: &[usize],
    work: &Work,
    timeout: Duration,
    tally: &mut Tally,
    report: &mut ConvertReport,
) -> Result<(Vec<TensorEntry>, Vec<ExpertBankEntry>)> {
    let opts = work.opts;
    let open = OpenCheckpoint { allow_missing_shards: true, incomplete_as_missing: true };
    let trunk_names = cfg.trunk_tensor_names();
    let trunk_path = work.dir.join(TRUNK_FILE);
    let mut trunk = trunk::reusable(&trunk_path, work.fingerprint);
    if trunk.is_some() {
        report.trunk_reused = true;
        tally.tick(trunk_names.len() as u64, "trunk (reused)".into());
    }
    let mut pieces: Vec<bool> = (0..trunk_names.len())
        .map(|i| trunk.is_some() || trunk::piece_done(work.dir, i, &trunk_names[i], work.fingerprint))
        .collect();
    let reused = pieces.iter().filter(|&&d| d).count() as u64;
    if trunk.is_none() && reused > 0 {
        tally.tick(reused, format!("{reused} trunk tensor(s) (reused)"));
    }
    // Banks an earlier run finished: their shards may be gone.
    let mut banks: Vec<ExpertBankEntry> = Vec::new();
    for &l in moe_layers {
        if let Some(entry) = bank::reusable(work.dir, l, cfg.num_experts, work.layout, work.fingerprint) {
            report.reused_banks.push(l);
            tally.tick(cfg.num_experts as u64, format!("layer {l} (reused)"));
            banks.push(entry);
        }
    }
    let mut seen = 0usize;
    let mut last_change = Instant::now();
    let paths = HfCheckpoint::open_with(src, &open)?.shard_paths();
    loop {
        // Taken before the headers are read, so a shard finishing while
        // this round runs shows as a change below.
        let snapshot = sizes(&paths);
        let ckpt = HfCheckpoint::open_with(src, &open)?;
        let shards = ckpt.shard_paths().len();
        let present: Vec<bool> = (0..shards).map(|s| ckpt.shard_present(s)).collect();
        let mut ledger = ShardLedger::with_trunk_tensors(&ckpt, moe_layers);
        ledger.set_present(&present);
        if trunk.is_some() {
            ledger.done(Unit::Trunk);
        }
        for (i, _) in pieces.iter().enumerate().filter(|(_, &d)| d) {
            ledger.done(Unit::TrunkTensor(i));
        }
        for b in &banks {
            ledger.done(Unit::Bank(b.layer as usize));
        }
        reclaim_ready(&mut ledger, opts, report)?;

        let mut progressed = false;
        for (i, name) in trunk_names.iter().enumerate() {
            if !pieces[i] && ckpt.tensor_shape(name).is_some() {
                trunk::write_piece(&ckpt, work.dir, i, name, opts.trunk, work.fingerprint)?;
                tally.tick(1, format!("trunk {name}"));
                pieces[i] = true;
                ledger.done(Unit::TrunkTensor(i));
                reclaim_ready(&mut ledger, opts, report)?;
                progressed = true;
            }
        }
        if trunk.is_none() && pieces.iter().all(|&d| d) {
            trunk = Some(trunk::assemble(work.dir, trunk_names.len(), &trunk_path, work.fingerprint)?);
        }
        let ready: Vec<usize> = moe_layers
            .iter()
            .copied()
            .filter(|&l| !banks.iter().any(|b| b.layer as usize == l))
            .filter(|&l| bank_tensor_names(cfg, l).iter().all(|n| ckpt.tensor_shape(n).is_some()))
            .collect();
        if !ready.is_empty() {
            write_banks(&ckpt, &ready, work, &mut |ev| {
                if let Some((entry, reused)) = bank_event(ev, cfg, tally) {
                    let layer = entry.layer as usize;
                    if reused {
                        report.reused_banks.push(layer);
                    }
                    banks.push(entry);
                    ledger.done(Unit::Bank(layer));
                    reclaim_ready(&mut ledger, opts, report)?;
                }
                Ok(())
            })?;
            progressed = true;
        }
        if let Some(tensors) = &trunk {
            if banks.len() == moe_layers.len() {
                return Ok((tensors.clone(), banks));
            }
        }

        let arrived = present.iter().filter(|&&p| p).count() + report.reclaimed_shards.len();
        if progressed || arrived != seen {
            seen = arrived;
            last_change = Instant::now();
            continue;
        }
        // Headers are read again only once a shard file changed: a stat
        // per shard per poll while a multi-GB shard downloads.
        while sizes(&paths) == snapshot {
            if last_change.elapsed() >= timeout {
                return Err(never_arrived(&ckpt, &ledger, &present, timeout));
            }
            std::thread::sleep(POLL);
        }
    }
}

/// The size of each shard file, `None` where there is none.
fn sizes(paths: &[std::path::PathBuf]) -> Vec<Option<u64>> {
    paths.iter().map(|p| std::fs::metadata(p).ok().map(|m| m.len())).collect()
}

/// The error when no shard arrived for `timeout`: the first shard a pending
/// unit waits for, why it does not count (absent, or incomplete), and who
/// needs it.
fn never_arrived(ckpt: &HfCheckpoint, ledger: &ShardLedger, present: &[bool], timeout: Duration) -> Error {
    let paths = ckpt.shard_paths();
    let waiting = (0..paths.len()).find(|&s| !present[s] && !ledger.needed_by(s).is_empty());
    let Some(s) = waiting else {
        return Error::Runtime(format!(
            "--follow: nothing left to write is waiting for a shard, yet the conversion made no progress in {} s",
            timeout.as_secs()
        ));
    };
    let path = &paths[s];
    let state = match shard_complete(path) {
        _ if !path.exists() => "does not exist".to_string(),
        Err(e) => format!("is incomplete ({e})"),
        Ok(()) => "is complete but was not read".to_string(),
    };
    let needed = ledger.needed_by(s);
    let mut who: Vec<String> = needed.iter().take(3).map(Unit::to_string).collect();
    if needed.len() > 3 {
        who.push(format!("{} more", needed.len() - 3));
    }
    Error::Runtime(format!(
        "--follow: gave up after {} s without a new source shard: {} {state}; it is needed by {}",
        timeout.as_secs(),
        path.display(),
        who.join(", ")
    ))
}
