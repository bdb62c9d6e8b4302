//! A trunk matrix read row by row from `trunk.bin` instead of held in RAM:
//! an untied embedding table, of which a decode step needs one row
//! (LESSONS.md: 1.1 GB of RAM saved on K3). The row's bytes are found with
//! the format's own layout (`TrunkFormat::row_spans`) and decoded by the
//! same dequantisation as the resident matrix, so the values are the same.

use std::fs::File;
use std::path::{Path, PathBuf};
use waste_platform::FileExt;

use crate::error::{Error, Result};
use crate::quant::{QMatrix, TrunkFormat};
use crate::source::StoredRows;

/// Rows of a `[rows, cols]` matrix stored at `offset` of a file.
pub struct TrunkRows {
    file: File,
    path: PathBuf,
    offset: u64,
    format: TrunkFormat,
    rows: usize,
    cols: usize,
}

impl TrunkRows {
    /// `file` is `path` opened for reading; a matrix that does not lie
    /// inside it is refused.
    pub fn new(
        file: File,
        path: &Path,
        offset: u64,
        format: TrunkFormat,
        rows: usize,
        cols: usize,
    ) -> Result<TrunkRows> {
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        let bytes = format.byte_len(rows, cols) as u64;
        if offset.checked_add(bytes).is_none_or(|end| end > len) {
            return Err(Error::format(
                path,
                format!("embedding table at {offset}+{bytes} lies beyond the end of the file ({len} bytes)"),
            ));
        }
        Ok(TrunkRows { file, path: path.to_path_buf(), offset, format, rows, cols })
    }
}

impl StoredRows for TrunkRows {
    fn rows(&self) -> usize {
        self.rows
    }

    fn cols(&self) -> usize {
        self.cols
    }

    fn read_row(&self, r: usize, out: &mut [f32]) -> Result<()> {
        // The spans concatenated are the row as a [1, cols] matrix.
        let mut buf = vec![0u8; self.format.byte_len(1, self.cols)];
        let mut at = 0;
        for (offset, len) in self.format.row_spans(self.rows, self.cols, r) {
            self.file
                .read_exact_at(&mut buf[at..at + len], self.offset + offset as u64)
                .map_err(|e| Error::io(&self.path, e))?;
            at += len;
        }
        let row = QMatrix::from_bytes(self.format, 1, self.cols, &buf)
            .map_err(|e| Error::format(&self.path, format!("embedding row {r}: {e}")))?;
        row.row(0, out);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::quantize_trunk;

    fn table(fmt: TrunkFormat, rows: usize, cols: usize) -> (Vec<u8>, QMatrix) {
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 0.3).collect();
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
            let open = |offset| TrunkRows::new(File::open(&path).unwrap(), &path, offset, fmt, rows, cols);
            let disk = open(192).unwrap();
            let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
            for r in [0, 1, 17, rows - 1] {
                resident.row(r, &mut a);
                disk.read_row(r, &mut b).unwrap();
                assert_eq!(
                    a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{} row {r}",
                    fmt.name()
                );
            }
            // A table that does not fit the file is refused at open.
            assert!(open(256 + 64).is_err());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
