//! trunk.bin, streamed: each tensor is read, decoded and quantised a slice
//! of rows at a time, so a 2 GB embedding table never sits in memory whole.
//! q8/q4 store a scale block then a data block per tensor (quant module
//! docs); both are per-row, so a slice's bytes land at known offsets of the
//! two blocks and the file is identical to quantising the tensor at once.

use std::fs::File;
use std::path::Path;
use waste_platform::FileExt;

use super::files::{sidecar_path, tmp_path, valid_sidecar, write_sidecar, Sidecar};
use super::TrunkAs;
use crate::checkpoint::HfCheckpoint;
use crate::config::ModelConfig;
use crate::container::checksum::{self, Crc32};
use crate::container::manifest::{align_up, TensorEntry, TENSOR_ALIGN};
use crate::error::{Error, Result};
use crate::gguf::GgmlType;
use crate::quant::{self, TrunkFormat, GROUP};

/// f32 values decoded per slice (16 MB).
const SLICE_VALUES: usize = 4 << 20;

/// Writes (or reuses) trunk.bin; returns its tensor entries and whether the
/// file was reused.
pub(super) fn write_trunk(
    ckpt: &HfCheckpoint,
    cfg: &ModelConfig,
    path: &Path,
    trunk: TrunkAs,
    fingerprint: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<(Vec<TensorEntry>, bool)> {
    write_trunk_sliced(ckpt, cfg, path, trunk, fingerprint, SLICE_VALUES, progress)
}

fn write_trunk_sliced(
    ckpt: &HfCheckpoint,
    cfg: &ModelConfig,
    path: &Path,
    trunk: TrunkAs,
    fingerprint: &str,
    slice_values: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<(Vec<TensorEntry>, bool)> {
    if let Some(tensors) = reusable(path, fingerprint) {
        return Ok((tensors, true));
    }
    let tmp = tmp_path(path);
    let file = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let put = |offset: u64, bytes: &[u8]| file.write_all_at(bytes, offset).map_err(|e| Error::io(&tmp, e));
    let mut pos = 0u64;
    let mut tensors = Vec::new();
    for name in cfg.trunk_tensor_names() {
        let offset = align_up(pos, TENSOR_ALIGN);
        let mut entry = write_tensor(ckpt, cfg, &name, trunk, slice_values, &|o, b| put(offset + o, b))?;
        entry.offset = offset;
        // Alignment padding between tensors stays zero: write_all_at past
        // the end extends the file with zeros.
        pos = offset + entry.bytes;
        tensors.push(entry);
        progress(&format!("trunk {name}"));
    }
    file.set_len(pos).map_err(|e| Error::io(&tmp, e))?;
    file.sync_all().map_err(|e| Error::io(&tmp, e))?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
    let index = serde_json::to_value(&tensors).map_err(|e| Error::Runtime(e.to_string()))?;
    write_sidecar(path, &Sidecar { fingerprint: fingerprint.to_string(), bytes: pos, index })?;
    Ok((tensors, false))
}

/// Quantises one trunk tensor a slice of rows at a time through
/// `put(offset within the tensor, bytes)`; the entry's offset is 0.
fn write_tensor(
    ckpt: &HfCheckpoint,
    cfg: &ModelConfig,
    name: &str,
    trunk: TrunkAs,
    slice_values: usize,
    put: &dyn Fn(u64, &[u8]) -> Result<()>,
) -> Result<TensorEntry> {
    let stored = ckpt
        .tensor_shape(name)
        .ok_or_else(|| Error::format(ckpt.dir(), format!("tensor `{name}` not found in the checkpoint")))?
        .to_vec();
    let shape = cfg.canonical_shape(name, &stored);
    let (fmt, bytes, crc32) = match shape[..] {
        [_] => {
            let (data, _) = ckpt.tensor_f32(name)?;
            let bytes = quant::quantize_trunk(TrunkFormat::F32, &data, 1, data.len());
            put(0, &bytes)?;
            (TrunkFormat::F32, bytes.len() as u64, checksum::crc32(&bytes))
        }
        [rows, cols] => {
            let role = cfg.tensor_role(name);
            let fmt = match trunk {
                TrunkAs::Encoded(f) => role.trunk_format(f),
                TrunkAs::Stored => ckpt.stored_trunk_format(name, rows, cols)?,
            };
            if let TrunkFormat::Ggml(ty) = fmt {
                return copy_matrix(ckpt, name, ty, &shape, slice_values, put);
            }
            let (g, row_bytes) = match fmt {
                TrunkFormat::F32 => (0, 4 * cols),
                TrunkFormat::Q8 => (cols.div_ceil(GROUP), cols),
                TrunkFormat::Q4 => (cols.div_ceil(GROUP), cols.div_ceil(2)),
                TrunkFormat::Ggml(_) => unreachable!("copied above"),
            };
            let data_at = (rows * g * 2) as u64;
            let step = (slice_values / cols.max(1)).max(1);
            // A tensor stored with more dimensions than the matrix it is
            // read as (K3's conv kernel and position grid, tens of MB) is
            // decoded whole; rows_f32 slices stored matrices only.
            let whole = if stored.len() == 2 { None } else { Some(ckpt.tensor_f32(name)?.0) };
            // The scale block precedes the data block: each hashed in row
            // order, then joined.
            let (mut scales_crc, mut data_crc) = (Crc32::new(), Crc32::new());
            let mut r0 = 0;
            while r0 < rows {
                let n = step.min(rows - r0);
                let w = match &whole {
                    Some(all) => all[r0 * cols..(r0 + n) * cols].to_vec(),
                    None => ckpt.rows_f32(name, r0, n)?,
                };
                let q = quant::quantize_trunk(fmt, &w, n, cols);
                let (scales, data) = q.split_at(n * g * 2);
                put((r0 * g * 2) as u64, scales)?;
                put(data_at + (r0 * row_bytes) as u64, data)?;
                scales_crc.update(scales);
                data_crc.update(data);
                r0 += n;
            }
            scales_crc.append(&data_crc);
            (fmt, fmt.byte_len(rows, cols) as u64, scales_crc.finish())
        }
        _ => return Err(Error::format(ckpt.dir(), format!("tensor {name} has shape {shape:?}; expected 1-D or 2-D"))),
    };
    Ok(TensorEntry {
        name: name.to_string(),
        shape: shape.iter().map(|&d| d as u64).collect(),
        format: fmt.name().to_string(),
        offset: 0,
        bytes,
        crc32: Some(crc32),
    })
}

/// A GGUF matrix's rows copied as the file stores them (in HF row order),
/// a slice of rows at a time.
fn copy_matrix(
    ckpt: &HfCheckpoint,
    name: &str,
    ty: GgmlType,
    shape: &[usize],
    slice_values: usize,
    put: &dyn Fn(u64, &[u8]) -> Result<()>,
) -> Result<TensorEntry> {
    let (rows, cols) = (shape[0], shape[1]);
    let row_bytes = ty.row_bytes(cols).ok_or_else(|| {
        Error::format(ckpt.dir(), format!("tensor {name}: rows of {cols} are not whole {} blocks", ty.name()))
    })?;
    let step = (slice_values / cols.max(1)).max(1);
    let mut crc = Crc32::new();
    let mut r0 = 0;
    while r0 < rows {
        let n = step.min(rows - r0);
        let bytes = ckpt.gguf_matrix_rows(name, r0, n)?;
        put((r0 * row_bytes) as u64, &bytes)?;
        crc.update(&bytes);
        r0 += n;
    }
    let fmt = TrunkFormat::Ggml(ty);
    Ok(TensorEntry {
        name: name.to_string(),
        shape: shape.iter().map(|&d| d as u64).collect(),
        format: fmt.name().to_string(),
        offset: 0,
        bytes: (rows * row_bytes) as u64,
        crc32: Some(crc.finish()),
    })
}

/// `convert --follow` writes trunk tensor `i` on its own, as soon as its
/// shard is whole, so the shard can be reclaimed before the rest of the
/// trunk's shards exist; `assemble` joins the pieces into trunk.bin.
pub(super) fn piece_file(i: usize) -> String {
    format!("trunk-part-{i:04}.bin")
}

/// The finished trunk.bin of an earlier run, if its sidecar matches and
/// every tensor in it still has the checksum it was written with (a bit
/// flipped since is made again, not reused).
pub(super) fn reusable(path: &Path, fingerprint: &str) -> Option<Vec<TensorEntry>> {
    let tensors: Vec<TensorEntry> = serde_json::from_value(valid_sidecar(path, fingerprint)?.index).ok()?;
    let file = File::open(path).ok()?;
    tensors.iter().all(|t| intact(&file, path, t, t.offset)).then_some(tensors)
}

/// The bytes of `t` at `at` in `file` have the checksum `t` records.
fn intact(file: &File, path: &Path, t: &TensorEntry, at: u64) -> bool {
    t.crc32.is_some_and(|crc| checksum::crc32_of_range(file, path, at, t.bytes).is_ok_and(|c| c == crc))
}

/// Piece `i` (trunk tensor `name`) was finished by this or an earlier run
/// and is intact; its shard may be gone.
pub(super) fn piece_done(dir: &Path, i: usize, name: &str, fingerprint: &str) -> bool {
    let path = dir.join(piece_file(i));
    let Some(entry) =
        valid_sidecar(&path, fingerprint).and_then(|s| serde_json::from_value::<TensorEntry>(s.index).ok())
    else {
        return false;
    };
    entry.name == name && File::open(&path).is_ok_and(|f| intact(&f, &path, &entry, 0))
}

/// Writes (or reuses) piece `i`, trunk tensor `name`; true when reused.
pub(super) fn write_piece(
    ckpt: &HfCheckpoint,
    dir: &Path,
    i: usize,
    name: &str,
    trunk: TrunkAs,
    fingerprint: &str,
) -> Result<bool> {
    if piece_done(dir, i, name, fingerprint) {
        return Ok(true);
    }
    let path = dir.join(piece_file(i));
    let tmp = tmp_path(&path);
    let file = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let put = |offset: u64, bytes: &[u8]| file.write_all_at(bytes, offset).map_err(|e| Error::io(&tmp, e));
    let entry = write_tensor(ckpt, ckpt.config(), name, trunk, SLICE_VALUES, &put)?;
    file.set_len(entry.bytes).map_err(|e| Error::io(&tmp, e))?;
    file.sync_all().map_err(|e| Error::io(&tmp, e))?;
    drop(file);
    std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
    let index = serde_json::to_value(&entry).map_err(|e| Error::Runtime(e.to_string()))?;
    write_sidecar(&path, &Sidecar { fingerprint: fingerprint.to_string(), bytes: entry.bytes, index })?;
    Ok(false)
}

/// Joins pieces `0..n` into trunk.bin at the offsets `write_trunk` gives
/// them (byte-identical), then deletes the pieces. They go only once
/// trunk.bin is whole: their shards may already be reclaimed.
pub(super) fn assemble(dir: &Path, n: usize, path: &Path, fingerprint: &str) -> Result<Vec<TensorEntry>> {
    let tmp = tmp_path(path);
    let file = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let mut pos = 0u64;
    let mut tensors = Vec::with_capacity(n);
    let mut buf = vec![0u8; 1 << 20];
    for i in 0..n {
        let piece = dir.join(piece_file(i));
        let side = valid_sidecar(&piece, fingerprint)
            .ok_or_else(|| Error::Runtime(format!("trunk piece {} is missing or stale", piece.display())))?;
        let mut entry: TensorEntry =
            serde_json::from_value(side.index).map_err(|e| Error::format(&piece, e.to_string()))?;
        entry.offset = align_up(pos, TENSOR_ALIGN);
        let src = File::open(&piece).map_err(|e| Error::io(&piece, e))?;
        let mut done = 0u64;
        while done < entry.bytes {
            let k = buf.len().min((entry.bytes - done) as usize);
            src.read_exact_at(&mut buf[..k], done).map_err(|e| Error::io(&piece, e))?;
            file.write_all_at(&buf[..k], entry.offset + done).map_err(|e| Error::io(&tmp, e))?;
            done += k as u64;
        }
        pos = entry.offset + entry.bytes;
        tensors.push(entry);
    }
    file.set_len(pos).map_err(|e| Error::io(&tmp, e))?;
    file.sync_all().map_err(|e| Error::io(&tmp, e))?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
    let index = serde_json::to_value(&tensors).map_err(|e| Error::Runtime(e.to_string()))?;
    write_sidecar(path, &Sidecar { fingerprint: fingerprint.to_string(), bytes: pos, index })?;
    for i in 0..n {
        let piece = dir.join(piece_file(i));
        for p in [sidecar_path(&piece), piece] {
            std::fs::remove_file(&p).map_err(|e| Error::io(&p, e))?;
        }
    }
    Ok(tensors)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slicing only moves bytes: slices of one row (and of a partial fp8
    /// block) give the file quantising each tensor whole gives.
    #[test]
    fn trunk_row_slices_are_byte_identical_to_whole_tensors() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-deepseek_v3-mxfp4");
        let ckpt = HfCheckpoint::open(&src).unwrap();
        let dir = std::env::temp_dir().join(format!("waste-trunk-slices-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for fmt in [TrunkFormat::Q4, TrunkFormat::Q8, TrunkFormat::F32] {
            let mut files = Vec::new();
            for (i, slice) in [usize::MAX / 2, 1, 100].into_iter().enumerate() {
                let path = dir.join(format!("trunk-{}-{i}.bin", fmt.name()));
                let (entries, reused) =
                    write_trunk_sliced(&ckpt, ckpt.config(), &path, TrunkAs::Encoded(fmt), "t", slice, &mut |_| {})
                        .unwrap();
                assert!(!reused && !entries.is_empty());
                files.push(std::fs::read(&path).unwrap());
            }
            assert!(files[0] == files[1] && files[0] == files[2], "{}", fmt.name());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// `--follow` writes the trunk one piece per tensor, in any order, then
    /// joins them: the same trunk.bin and entries as writing it in one go,
    /// and no piece left behind.
    #[test]
    fn trunk_pieces_joined_are_byte_identical_to_the_trunk_in_one_go() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-deepseek_v3-mxfp4");
        let ckpt = HfCheckpoint::open(&src).unwrap();
        let dir = std::env::temp_dir().join(format!("waste-trunk-pieces-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let whole = dir.join("whole.bin");
        let (want, _) =
            write_trunk(&ckpt, ckpt.config(), &whole, TrunkAs::Encoded(TrunkFormat::Q4), "t", &mut |_| {}).unwrap();
        let names = ckpt.config().trunk_tensor_names();
        for (i, name) in names.iter().enumerate().rev() {
            assert!(!write_piece(&ckpt, &dir, i, name, TrunkAs::Encoded(TrunkFormat::Q4), "t").unwrap());
        }
        assert!(
            write_piece(&ckpt, &dir, 0, &names[0], TrunkAs::Encoded(TrunkFormat::Q4), "t").unwrap(),
            "a finished piece is reused"
        );
        let joined = dir.join("joined.bin");
        let got = assemble(&dir, names.len(), &joined, "t").unwrap();
        assert_eq!(serde_json::to_value(&got).unwrap(), serde_json::to_value(&want).unwrap());
        assert!(std::fs::read(&whole).unwrap() == std::fs::read(&joined).unwrap());
        assert!(!dir.join(piece_file(0)).exists() && !piece_done(&dir, 0, &names[0], "t"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
