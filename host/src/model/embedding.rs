//! The token embedding table. A decode step needs one row of it, so an
//! untied table is left in the container and the row is read with
//! positional reads (LESSONS.md: 1.1 GB of RAM saved on K3). A tied table is
//! also the LM head, which touches every row per token: it stays resident.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use super::source::TensorSource;
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::quant::{QMatrix, TrunkFormat, GROUP};

/// Where a trunk matrix lies in a file: what an on-disk table needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMatrix {
    pub path: PathBuf,
    pub offset: u64,
    pub format: TrunkFormat,
    pub rows: usize,
    pub cols: usize,
}

/// An embedding table whose rows are read from disk on demand.
pub struct DiskRows {
    file: File,
    at: StoredMatrix,
    /// Rows read since open.
    reads: AtomicU64,
}

impl DiskRows {
    pub fn open(at: StoredMatrix) -> Result<DiskRows> {
        let file = File::open(&at.path).map_err(|e| Error::io(&at.path, e))?;
        let len = file.metadata().map_err(|e| Error::io(&at.path, e))?.len();
        let bytes = at.format.byte_len(at.rows, at.cols) as u64;
        if at.offset.checked_add(bytes).is_none_or(|end| end > len) {
            return Err(Error::format(
                &at.path,
                format!(
                    "embedding table at {}+{bytes} lies beyond the end of the file ({len} bytes)",
                    at.offset
                ),
            ));
        }
        Ok(DiskRows {
            file,
            at,
            reads: AtomicU64::new(0),
        })
    }

    /// Byte ranges (offset, length) of row `r` in the file. q8/q4 matrices
    /// store every row's f16 group scales first, then every row's codes
    /// (quant module docs), so a row is two spans; f32 is one.
    fn spans(&self, r: usize) -> [(u64, usize); 2] {
        let m = &self.at;
        match m.format {
            TrunkFormat::F32 => [(m.offset + (r * m.cols * 4) as u64, m.cols * 4), (0, 0)],
            fmt => {
                let scales = m.cols.div_ceil(GROUP) * 2;
                let codes = if fmt == TrunkFormat::Q8 {
                    m.cols
                } else {
                    m.cols.div_ceil(2)
                };
                [
                    (m.offset + (r * scales) as u64, scales),
                    (m.offset + (m.rows * scales + r * codes) as u64, codes),
                ]
            }
        }
    }

    fn read_row(&self, r: usize, out: &mut [f32]) -> Result<()> {
        let m = &self.at;
        // One row in the same layout as the whole table: scales, then codes.
        let mut buf = vec![0u8; m.format.byte_len(1, m.cols)];
        let mut at = 0;
        for (offset, len) in self.spans(r) {
            self.file
                .read_exact_at(&mut buf[at..at + len], offset)
                .map_err(|e| Error::io(&m.path, e))?;
            at += len;
        }
        let row = QMatrix::from_bytes(m.format, 1, m.cols, &buf)
            .map_err(|e| Error::format(&m.path, format!("embedding row {r}: {e}")))?;
        row.row(0, out);
        self.reads.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
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
            Embedding::OnDisk(d) => d.at.rows,
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            Embedding::Resident(m) => m.cols(),
            Embedding::OnDisk(d) => d.at.cols,
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
            Embedding::OnDisk(d) => d.read_row(r, out),
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

/// The checkpoint name of the table.
pub const EMBED_TOKENS: &str = "model.embed_tokens.weight";

/// The model's embedding table: left on disk when the embeddings are untied
/// and the source can say where the table lies, else resident.
pub(crate) fn load(cfg: &ModelConfig, src: &dyn TensorSource) -> Result<Embedding> {
    if !cfg.tie_word_embeddings {
        if let Some(at) = src.stored_matrix(EMBED_TOKENS) {
            if let Some(want) = cfg.trunk_tensor_shape(EMBED_TOKENS) {
                if want != [at.rows, at.cols] {
                    return Err(Error::Runtime(format!(
                        "weight `{EMBED_TOKENS}` has shape [{}, {}], the config implies {want:?}",
                        at.rows, at.cols
                    )));
                }
            }
            return Ok(Embedding::OnDisk(DiskRows::open(at)?));
        }
    }
    Ok(Embedding::Resident(super::load_matrix(
        cfg,
        src,
        EMBED_TOKENS,
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::quantize_trunk;

    fn table(fmt: TrunkFormat, rows: usize, cols: usize) -> (Vec<u8>, QMatrix) {
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 0.3)
            .collect();
        let bytes = match fmt {
            TrunkFormat::F32 => w.iter().flat_map(|v| v.to_le_bytes()).collect(),
            _ => quantize_trunk(fmt, &w, rows, cols),
        };
        let m = QMatrix::from_bytes(fmt, rows, cols, &bytes).unwrap();
        (bytes, m)
    }

    /// Every format, a column count that is not a multiple of the group (a
    /// partial last group, an odd q4 nibble) and a table at an offset: each
    /// row read from disk equals the resident row bit for bit.
    #[test]
    fn disk_rows_equal_resident_rows_in_every_trunk_format() {
        let dir = std::env::temp_dir().join(format!("waste-embed-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for fmt in [TrunkFormat::F32, TrunkFormat::Q8, TrunkFormat::Q4] {
            let (rows, cols) = (37, 301);
            let (bytes, resident) = table(fmt, rows, cols);
            let path = dir.join(format!("trunk-{}.bin", fmt.name()));
            let mut file = vec![0xA5u8; 192];
            file.extend_from_slice(&bytes);
            file.extend_from_slice(&[0x5A; 64]);
            std::fs::write(&path, &file).unwrap();
            let disk = Embedding::OnDisk(
                DiskRows::open(StoredMatrix {
                    path: path.clone(),
                    offset: 192,
                    format: fmt,
                    rows,
                    cols,
                })
                .unwrap(),
            );
            let resident = Embedding::Resident(resident);
            let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
            for r in [0, 1, 17, rows - 1] {
                resident.row(r, &mut a).unwrap();
                disk.row(r, &mut b).unwrap();
                assert_eq!(
                    a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{} row {r}",
                    fmt.name()
                );
            }
            assert_eq!(disk.disk_reads(), 4);
            assert_eq!(disk.resident_bytes(), 0);
            assert!(
                disk.row(rows, &mut b).is_err(),
                "a row past the table is an error, not a panic"
            );
            // A table that does not fit the file is refused at open.
            let short = StoredMatrix {
                path: path.clone(),
                offset: 256 + 64,
                format: fmt,
                rows,
                cols,
            };
            assert!(DiskRows::open(short).is_err());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

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
        use crate::model::{Model, State};
        use crate::stats::StepStats;
        use crate::store::{ExpertStore, StoreOptions};

        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
        let dir = std::env::temp_dir().join(format!("waste-embed-model-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (family, tied) in [("kimi_linear", false), ("olmoe", true)] {
            let src = fixtures.join(format!("tiny-{family}"));
            assert!(
                src.join("config.json").exists(),
                "fixture missing: {}",
                src.display()
            );
            let out = dir.join(format!("{family}.waste"));
            convert(&src, &out, &ConvertOptions::default(), &mut |_| {}).unwrap();
            let c = crate::container::Container::open(&out).unwrap();
            let cfg = c.config().clone();
            assert_eq!(cfg.tie_word_embeddings, tied);
            let on_disk = Model::load(&cfg, &c).unwrap();
            let resident = Model::load(&cfg, &ResidentOnly(&c)).unwrap();
            assert_eq!(on_disk.embed_tokens.resident().is_none(), !tied, "{family}");
            assert!(resident.embed_tokens.resident().is_some());
            let store = |keep| {
                let options = StoreOptions {
                    cache_slots: 4 * cfg.top_k,
                    keep,
                    readers: 0,
                    ..StoreOptions::default()
                };
                ExpertStore::open(c.expert_banks().unwrap(), cfg.top_k, options).unwrap()
            };
            let run = |m: &Model, stats: &mut StepStats| {
                let experts = store(false);
                let mut state = State::new(&cfg, 16);
                let mut out = m
                    .forward(&mut state, &[5, 17, 300, 42], &experts, true, stats)
                    .unwrap();
                for t in [7u32, 99, 1] {
                    out.extend(m.forward(&mut state, &[t], &experts, false, stats).unwrap());
                }
                out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            };
            let (mut a, mut b) = (StepStats::default(), StepStats::default());
            assert_eq!(run(&on_disk, &mut a), run(&resident, &mut b), "{family}");
            assert_eq!(
                a.embedding_rows_read,
                if tied { 0 } else { 7 },
                "{family}: one row read per token"
            );
            assert_eq!(b.embedding_rows_read, 0);
            assert_eq!(
                on_disk.embed_tokens.disk_reads(),
                a.embedding_rows_read as u64
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
