//! The checksums of a container's bytes: CRC-32 (the IEEE polynomial, as
//! zlib and PNG use), computed with the carry-less multiply instructions
//! where the CPU has them. On this project's machines it runs at ~17 GB/s
//! on one core against ~11 GB/s for CRC-32C and ~17 GB/s for XXH3-64
//! (docs/PERFORMANCE.md, "Checksums"), several times the disk's rate, and
//! it is already in the dependency tree.
//!
//! Each trunk tensor and codebook range carries one in the manifest, each
//! expert record one of its payload in its header. A checksum guards bytes
//! against the disk and against copies; it is not a signature.

use std::fs::File;
use std::path::Path;
use waste_platform::FileExt;

use crate::error::{Error, Result};

/// Which checksums an open model checks, beyond those of the bytes it reads
/// whole (the trunk tensors loaded at open and the codebooks), which are
/// checked whenever the container carries them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Verify {
    /// Nothing more: a damaged expert record changes the output silently.
    /// For users who accept that risk for the last percent of speed.
    Off,
    /// Each expert record's payload as it lands, where the record carries
    /// a checksum (every container since checksums were introduced).
    #[default]
    Records,
    /// Also the trunk tensors read a row at a time (whole, once, at open);
    /// a container lacking any checksum is refused.
    All,
}

pub fn crc32(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// A running CRC-32 over pieces written in order (or combined from pieces
/// hashed apart, in order: [`Crc32::append`]).
#[derive(Clone, Default)]
pub struct Crc32(crc32fast::Hasher);

impl Crc32 {
    pub fn new() -> Crc32 {
        Crc32::default()
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// Extends this checksum by that of the bytes `next` covered, which
    /// follow these.
    pub fn append(&mut self, next: &Crc32) {
        self.0.combine(&next.0);
    }

    pub fn finish(self) -> u32 {
        self.0.finalize()
    }
}

/// The CRC-32 of `len` bytes of `file` from `offset`, read 8 MiB at a time.
pub fn crc32_of_range(file: &File, path: &Path, offset: u64, len: u64) -> Result<u32> {
    let mut buf = vec![0u8; (8usize << 20).min(len as usize)];
    let mut crc = Crc32::new();
    let mut done = 0u64;
    while done < len {
        let n = buf.len().min((len - done) as usize);
        file.read_exact_at(&mut buf[..n], offset + done).map_err(|e| Error::io(path, e))?;
        crc.update(&buf[..n]);
        done += n as u64;
    }
    Ok(crc.finish())
}

/// Checks bytes read for `what` against the checksum stored for them.
pub fn check(path: &Path, what: &str, stored: u32, bytes: &[u8]) -> Result<()> {
    check_value(path, what, stored, crc32(bytes))
}

pub fn check_value(path: &Path, what: &str, stored: u32, computed: u32) -> Result<()> {
    if stored == computed {
        return Ok(());
    }
    Err(Error::format(
        path,
        format!(
            "{what}: checksum mismatch (stored {stored:08x}, read {computed:08x}): the file is damaged; convert the model again"
        ),
    ))
}

/// The error for `--verify` on bytes that were written without a checksum.
pub fn missing(path: &Path, what: &str) -> Error {
    Error::format(
        path,
        format!("{what} has no checksum to verify (written by a waste before checksums, or by synth --manifest-only); convert the model again"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check value of the CRC-32/ISO-HDLC catalogue entry: the
    /// polynomial and reflection are the ones zlib uses.
    #[test]
    fn crc32_is_the_zlib_crc() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    }

    /// Pieces hashed apart and appended in order give the whole's CRC (the
    /// converter hashes a tensor's scale block and data block apart).
    #[test]
    fn appended_pieces_give_the_checksum_of_the_whole() {
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for cut in [0, 1, 63, 4096, 9_999, 10_000] {
            let (a, b) = bytes.split_at(cut);
            let mut first = Crc32::new();
            first.update(a);
            let mut second = Crc32::new();
            second.update(b);
            first.append(&second);
            assert_eq!(first.finish(), crc32(&bytes), "cut at {cut}");
        }
    }
}
