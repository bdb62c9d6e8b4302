//! The token embedding table. A decode step needs one row of it, so an
//! untied table is left in the container and the row is read with
//! positional reads (LESSONS.md: 1.1 GB of RAM saved on K3). A tied table is
//! also the LM head, which touches every row per token: it stays resident.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::layout::EdgeTensors;
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::quant::QMatrix;
use crate::source::{StoredRows, TensorSource};

/// A table whose rows are read on demand, and how many were.
pub struct DiskRows {
    rows: Box<dyn StoredRows>,
    /// Rows read since open.
    reads: AtomicU64,
}

/// `model.embed_tokens`: resident, or rows read from the container.
pub enum Embedding {
    Resident(QMatrix),
    OnDisk(DiskRows),
}

impl Embedding {
    pub fn rows(&self) -> usize {
        match self {
            Embedding::Resident(m) => m.rows(),
            Embedding::OnDisk(d) => d.rows.rows(),
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            Embedding::Resident(m) => m.cols(),
            Embedding::OnDisk(d) => d.rows.cols(),
        }
    }

    /// Dequantised row `r` into `out`; the same values whichever the
    /// placement (the on-disk row goes through the same dequantisation).
    pub fn row(&self, r: usize, out: &mut [f32]) -> Result<()> {
        if r >= self.rows() || out.len() != self.cols() {
            return Err(Error::Arg(format!(
                "embedding row {r} of {} into {} floats (want {})",
                self.rows(),
                out.len(),
                self.cols()
            )));
        }
        match self {
            Embedding::Resident(m) => {
                m.row(r, out);
                Ok(())
            }
            Embedding::OnDisk(d) => {
                d.rows.read_row(r, out)?;
                d.reads.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
        }
    }

    /// The resident matrix (a tied LM head), if the table is in RAM.
    pub fn resident(&self) -> Option<&QMatrix> {
        match self {
            Embedding::Resident(m) => Some(m),
            Embedding::OnDisk(_) => None,
        }
    }

    /// Rows read from disk since open (0 when resident).
    pub fn disk_reads(&self) -> u64 {
        match self {
            Embedding::Resident(_) => 0,
            Embedding::OnDisk(d) => d.reads.load(Ordering::Relaxed),
        }
    }

    /// RAM the table holds.
    pub fn resident_bytes(&self) -> u64 {
        self.resident().map_or(0, |m| m.byte_len() as u64)
    }
}

/// The model's embedding table: left on disk when the embeddings are untied
/// and the source can say where the table lies, else resident.
pub(crate) fn load(cfg: &ModelConfig, src: &dyn TensorSource) -> Result<Embedding> {
    let table = EdgeTensors::of(cfg).embed_tokens;
    if !cfg.tie_word_embeddings {
        if let Some(rows) = src.stored_rows(&table.name) {
            let rows = rows?;
            if table.shape != [rows.rows(), rows.cols()] {
                return Err(Error::Runtime(format!(
                    "weight `{}` has shape [{}, {}], the config implies {:?}",
                    table.name,
                    rows.rows(),
                    rows.cols(),
                    table.shape
                )));
            }
            return Ok(Embedding::OnDisk(DiskRows { rows, reads: AtomicU64::new(0) }));
        }
    }
    Ok(Embedding::Resident(super::load_matrix(cfg, src, &table.name)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same container as a source that cannot say where its tensors
    /// lie: the model then keeps the table resident (the in-RAM path).
    struct ResidentOnly<'a>(&'a crate::container::Container);

    impl TensorSource for ResidentOnly<'_> {
        fn matrix(&self, name: &str) -> Result<QMatrix> {
            self.0.matrix(name)
        }
        fn vector(&self, name: &str) -> Result<Vec<f32>> {
            self.0.vector(name)
        }
        fn has(&self, name: &str) -> bool {
            self.0.has(name)
        }
    }

    /// An untied model (Kimi-Linear: KDA, MLA, shared experts) converted to
    /// a container: the table left on disk gives the logits of the resident
    /// table bit for bit, prefill and decode, one row read per token; a
    /// tied model (OLMoE) keeps its table resident.
    #[test]
    fn embedding_on_disk_logits_are_bit_identical_to_resident() {
        use crate::convert::{convert, ConvertOptions};
        use crate::stats::StepStats;
        use crate::store::{ExpertStore, StoreOptions};
        use crate::transformer::{State, Transformer};

        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
        let dir = std::env::temp_dir().join(format!("waste-embed-model-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (family, tied) in [("kimi_linear", false), ("olmoe", true)] {
            let src = fixtures.join(format!("tiny-{family}"));
            assert!(src.join("config.json").exists(), "fixture missing: {}", src.display());
            let out = dir.join(format!("{family}.waste"));
            convert(&src, &out, &ConvertOptions::default(), &mut |_| {}).unwrap();
            let c = crate::container::Container::open(&out).unwrap();
            let cfg = c.config().clone();
            assert_eq!(cfg.tie_word_embeddings, tied);
            let on_disk = Transformer::load(&cfg, &c).unwrap();
            let resident = Transformer::load(&cfg, &ResidentOnly(&c)).unwrap();
            assert_eq!(on_disk.embed_tokens.resident().is_none(), !tied, "{family}");
            assert!(resident.embed_tokens.resident().is_some());
            let store = |keep| {
                let options = StoreOptions { cache_slots: 4 * cfg.top_k, keep, readers: 0, ..StoreOptions::default() };
                ExpertStore::open(c.expert_banks().unwrap(), cfg.top_k, options).unwrap()
            };
            let run = |m: &Transformer, stats: &mut StepStats| {
                let experts = store(false);
                let mut state = State::new(&cfg, 16);
                let mut out = m.forward(&mut state, &[5, 17, 300, 42], &experts, true, stats).unwrap();
                for t in [7u32, 99, 1] {
                    out.extend(m.forward(&mut state, &[t], &experts, false, stats).unwrap());
                }
                out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            };
            let (mut a, mut b) = (StepStats::default(), StepStats::default());
            assert_eq!(run(&on_disk, &mut a), run(&resident, &mut b), "{family}");
            assert_eq!(a.embedding_rows_read, if tied { 0 } else { 7 }, "{family}: one row read per token");
            assert_eq!(b.embedding_rows_read, 0);
            assert_eq!(on_disk.embed_tokens.disk_reads(), a.embedding_rows_read as u64);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
