//! Output files written as temp + rename, with a `.done` sidecar that lets
//! a rerun trust (and skip) what an earlier run finished.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::container::manifest::align_up;
use crate::error::{Error, Result};

/// A buffered writer into `<final>.tmp` that knows its position; `finish`
/// syncs and renames it into place, so a file under its final name is whole.
pub(super) struct Writer {
    path: PathBuf,
    tmp: PathBuf,
    out: BufWriter<File>,
    pos: u64,
}

pub(super) fn tmp_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".tmp");
    PathBuf::from(s)
}

impl Writer {
    pub(super) fn create(path: &Path) -> Result<Writer> {
        let tmp = tmp_path(path);
        let file = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
        Ok(Writer { path: path.to_path_buf(), tmp, out: BufWriter::with_capacity(1 << 20, file), pos: 0 })
    }

    pub(super) fn position(&self) -> u64 {
        self.pos
    }

    pub(super) fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes).map_err(|e| Error::io(&self.tmp, e))?;
        self.pos += bytes.len() as u64;
        Ok(())
    }

    /// Zero-pads to a multiple of `align`; returns the new position.
    pub(super) fn pad_to(&mut self, align: u64) -> Result<u64> {
        let target = align_up(self.pos, align);
        let zeros = vec![0u8; (target - self.pos) as usize];
        self.write(&zeros)?;
        Ok(self.pos)
    }

    pub(super) fn finish(self) -> Result<()> {
        let Writer { path, tmp, out, .. } = self;
        let file = out.into_inner().map_err(|e| Error::io(&tmp, e.into_error()))?;
        file.sync_all().map_err(|e| Error::io(&tmp, e))?;
        fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))
    }
}

/// Writes a whole small file atomically.
pub(super) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut w = Writer::create(path)?;
    w.write(bytes)?;
    w.finish()
}

/// What a finished output file records beside it (`<file>.done`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(super) struct Sidecar {
    /// Source and options the file was made from (`fingerprint`).
    pub fingerprint: String,
    pub bytes: u64,
    /// What the manifest needs from this file (tensor entries, bank entry).
    pub index: serde_json::Value,
}

pub(super) fn sidecar_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".done");
    PathBuf::from(s)
}

pub(super) fn write_sidecar(path: &Path, sidecar: &Sidecar) -> Result<()> {
    let json = serde_json::to_vec_pretty(sidecar).map_err(|e| Error::Runtime(e.to_string()))?;
    write_atomic(&sidecar_path(path), &json)
}

/// A sidecar holds at most a trunk's tensor index.
const MAX_SIDECAR_BYTES: u64 = 64 << 20;

/// The sidecar of `path` when it matches `fingerprint` and the file's size;
/// `None` means "make the file again". Whether the bytes are still the
/// ones written is the caller's check: the checksums in the index (trunk
/// tensors, codebooks) or in each record's header (banks).
pub(super) fn valid_sidecar(path: &Path, fingerprint: &str) -> Option<Sidecar> {
    let bytes = crate::files::read_file(&sidecar_path(path), MAX_SIDECAR_BYTES).ok()?;
    let s: Sidecar = serde_json::from_slice(&bytes).ok()?;
    let len = fs::metadata(path).ok()?.len();
    (s.fingerprint == fingerprint && s.bytes == len).then_some(s)
}
