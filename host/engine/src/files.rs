//! Reading files the engine did not write: every one is bounded before it
//! is read. And the one cheap content hash (FNV-1a 64) the engine uses for
//! identities and resume fingerprints.

use std::path::Path;

use crate::error::{Error, Result};

/// The whole of `path`, refused when it is not a regular file (a FIFO would
/// hang the read, a device never end it) or is larger than `limit` bytes.
pub fn read_file(path: &Path, limit: u64) -> Result<Vec<u8>> {
    let meta = regular_file(path)?;
    if meta.len() > limit {
        return Err(Error::format(path, format!("file is {} bytes, more than the {limit} allowed", meta.len())));
    }
    std::fs::read(path).map_err(|e| Error::io(path, e))
}

/// The metadata of `path`, refused unless it is a regular file: checked
/// before anything opens it, since opening a FIFO blocks.
pub fn regular_file(path: &Path) -> Result<std::fs::Metadata> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(Error::format(path, "not a regular file (a directory, FIFO or device)"));
    }
    Ok(meta)
}

/// FNV-1a, 64 bit: a cheap identity for files and sources, not a MAC.
#[derive(Clone, Copy)]
pub struct Fnv(pub u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv::new()
    }
}

impl Fnv {
    pub fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    pub fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    pub fn finish(self) -> u64 {
        self.0
    }

    pub fn hex(self) -> String {
        format!("{:016x}", self.0)
    }
}
