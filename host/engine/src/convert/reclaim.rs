//! `convert --reclaim`: which output unit (the trunk, a layer's bank) needs
//! which source shard, so a shard is deleted only once everything read from
//! it has been written and recorded.

use std::collections::BTreeSet;
use std::path::PathBuf;

use crate::checkpoint::HfCheckpoint;
use crate::config::{ExpertLayout, ModelConfig};
use crate::error::{Error, Result};

/// A piece of output that reads source tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Unit {
    Trunk,
    /// One trunk tensor (index into `trunk_tensor_names`), written as a
    /// piece of its own under `convert --follow`; `done(Unit::Trunk)`
    /// covers every one.
    TrunkTensor(usize),
    Bank(usize),
}

impl std::fmt::Display for Unit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unit::Trunk => f.write_str("the trunk"),
            Unit::TrunkTensor(i) => write!(f, "trunk tensor {i}"),
            Unit::Bank(l) => write!(f, "the expert bank of layer {l}"),
        }
    }
}

/// The source tensors layer `layer`'s expert bank reads.
pub fn bank_tensor_names(cfg: &ModelConfig, layer: usize) -> Vec<String> {
    match cfg.expert_layout {
        ExpertLayout::PerExpert => (0..cfg.num_experts).flat_map(|e| cfg.expert_tensor_names(layer, e)).collect(),
        ExpertLayout::Fused => cfg.fused_expert_names(layer).into_iter().collect(),
        ExpertLayout::GptOss => cfg.gpt_oss_expert_names(layer),
    }
}

pub struct ShardLedger {
    paths: Vec<PathBuf>,
    /// Per shard: units not yet written that read it, each with one tensor
    /// as the example an error names.
    pending: Vec<Vec<(Unit, String)>>,
    deleted: Vec<bool>,
}

impl ShardLedger {
    pub fn new(ckpt: &HfCheckpoint, moe_layers: &[usize]) -> ShardLedger {
        Self::build(ckpt, moe_layers, false)
    }

    /// As `new`, with one unit per trunk tensor (`Unit::TrunkTensor`), so a
    /// shard is free once its own trunk tensors are written.
    pub fn with_trunk_tensors(ckpt: &HfCheckpoint, moe_layers: &[usize]) -> ShardLedger {
        Self::build(ckpt, moe_layers, true)
    }

    fn build(ckpt: &HfCheckpoint, moe_layers: &[usize], per_tensor: bool) -> ShardLedger {
        let paths = ckpt.shard_paths();
        let mut pending: Vec<Vec<(Unit, String)>> = vec![Vec::new(); paths.len()];
        let mut add = |unit: Unit, name: &str| {
            for s in ckpt.shards_of(name) {
                if !pending[s].iter().any(|(u, _)| *u == unit) {
                    pending[s].push((unit, name.to_string()));
                }
            }
        };
        let cfg = ckpt.config();
        for (i, name) in cfg.trunk_tensor_names().iter().enumerate() {
            add(if per_tensor { Unit::TrunkTensor(i) } else { Unit::Trunk }, name);
        }
        for &l in moe_layers {
            for name in bank_tensor_names(cfg, l) {
                add(Unit::Bank(l), &name);
            }
        }
        let deleted = paths.iter().map(|p| !p.is_file()).collect();
        ShardLedger { paths, pending, deleted }
    }

    /// Marks `unit` written.
    pub fn done(&mut self, unit: Unit) {
        for p in &mut self.pending {
            p.retain(|(u, _)| *u != unit && !(unit == Unit::Trunk && matches!(u, Unit::TrunkTensor(_))));
        }
    }

    /// Takes `present[s]` as whether shard `s` exists (complete) now, in
    /// place of the file test `new` made: a shard still downloading is not
    /// deleted, and one that arrives after its units were written is.
    pub fn set_present(&mut self, present: &[bool]) {
        for (d, p) in self.deleted.iter_mut().zip(present) {
            *d = !p;
        }
    }

    /// Shards nothing pending reads and that still exist.
    pub fn reclaimable(&self) -> Vec<usize> {
        (0..self.paths.len()).filter(|&s| !self.deleted[s] && self.pending[s].is_empty()).collect()
    }

    /// Units still waiting for shard `shard`.
    pub fn needed_by(&self, shard: usize) -> BTreeSet<Unit> {
        self.pending[shard].iter().map(|(u, _)| *u).collect()
    }

    /// Deletes shard `shard`, or refuses, naming what still needs it.
    pub fn reclaim(&mut self, shard: usize) -> Result<PathBuf> {
        let path = self.paths.get(shard).cloned().ok_or_else(|| Error::Arg(format!("no shard {shard}")))?;
        if let Some((unit, name)) = self.pending[shard].first() {
            return Err(Error::Runtime(format!(
                "refusing to reclaim {}: it still holds `{name}`, needed by {unit}, which is not written yet",
                path.display()
            )));
        }
        if !self.deleted[shard] {
            std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
            self.deleted[shard] = true;
        }
        Ok(path)
    }
}
