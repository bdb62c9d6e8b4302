//! Split GGUF models, as `llama-gguf-split` and `convert_hf_to_gguf.py
//! --split-max-size` write them: `NAME-00001-of-00003.gguf` and its
//! siblings, each a complete GGUF file holding some of the tensors. The
//! first part carries the metadata and `split.count`; every part carries
//! `split.no` (from 0) and `split.count`, the first also
//! `split.tensors.count`. llama.cpp's loader (`llama_split_prefix`,
//! `llama_split_path`) finds the parts by name from the first one, and so
//! does this; a part from another split, a missing part or a tensor count
//! that disagrees is refused with one line naming the file.

use std::path::{Path, PathBuf};

use super::{Part, Value};
use crate::error::{Error, Result};

pub(super) const NO: &str = "split.no";
pub(super) const COUNT: &str = "split.count";
pub(super) const TENSORS_COUNT: &str = "split.tensors.count";

/// `split.count` is a u16 in every writer.
const MAX_PARTS: u64 = u16::MAX as u64;

fn integer(path: &Path, part: &Part, key: &str) -> Result<Option<u64>> {
    match part.get(key) {
        None => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            Error::format(path, format!("not a valid GGUF file: `{key}` is {v:?}, not a non-negative integer"))
        }),
    }
}

/// The number of parts of the model whose first file `path` should be:
/// `None` for an unsplit file. Opening a later part is refused, naming
/// the first.
pub(super) fn count(path: &Path, first: &Part) -> Result<Option<usize>> {
    let Some(count) = integer(path, first, COUNT)? else { return Ok(None) };
    if count == 0 || count > MAX_PARTS {
        return Err(Error::format(path, format!("not a valid GGUF file: `{COUNT}` is {count}")));
    }
    let no = integer(path, first, NO)?.unwrap_or(0);
    if no != 0 {
        let first_name = part_suffix(no as usize, count as usize)
            .and_then(|suffix| name_prefix(path, &suffix))
            .map_or_else(|| "its first part".to_string(), |prefix| part_name(&prefix, 0, count as usize));
        return Err(Error::Arg(format!(
            "{}: this is part {} of {count} of a split GGUF model; open the first part, {first_name}",
            path.display(),
            no + 1
        )));
    }
    Ok((count > 1).then_some(count as usize))
}

/// `-00002-of-00003.gguf` for part index 1 of 3: `llama_split_path`'s
/// `"%s-%05d-of-%05d.gguf"`.
fn part_suffix(index: usize, count: usize) -> Option<String> {
    (index < count).then(|| format!("-{:05}-of-{:05}.gguf", index + 1, count))
}

fn part_name(prefix: &str, index: usize, count: usize) -> String {
    format!("{prefix}{}", part_suffix(index, count).unwrap_or_default())
}

/// The file name of `path` less `suffix`, if it ends with it.
fn name_prefix(path: &Path, suffix: &str) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    name.strip_suffix(suffix).filter(|p| !p.is_empty()).map(str::to_string)
}

/// Every part's path, in order, from the first part's; each must exist.
pub(super) fn sibling_paths(first: &Path, count: usize) -> Result<Vec<PathBuf>> {
    let suffix = part_suffix(0, count).expect("count > 1");
    let prefix = name_prefix(first, &suffix).ok_or_else(|| {
        Error::Arg(format!(
            "{}: a split GGUF model of {count} parts, but the file name does not end in {suffix}, so its other parts cannot be found (llama.cpp names them NAME{suffix} ...)",
            first.display()
        ))
    })?;
    let dir = first.parent().unwrap_or(Path::new(""));
    let mut paths = vec![first.to_path_buf()];
    for i in 1..count {
        let p = dir.join(part_name(&prefix, i, count));
        if !p.is_file() {
            return Err(Error::Arg(format!(
                "{}: part {} of {count} of this split GGUF model is missing: {}",
                first.display(),
                i + 1,
                p.display()
            )));
        }
        paths.push(p);
    }
    Ok(paths)
}

/// A later part must say it is part `index` of the same `count`, so that
/// parts of two downloads are never read as one model.
pub(super) fn check_part(path: &Path, part: &Part, index: usize, count: usize) -> Result<()> {
    let (no, cnt) = (integer(path, part, NO)?, integer(path, part, COUNT)?);
    if no != Some(index as u64) || cnt != Some(count as u64) {
        let said = match (no, cnt) {
            (Some(n), Some(c)) => format!("says it is part {} of {c}", n + 1),
            _ => format!("has no `{NO}` / `{COUNT}`"),
        };
        return Err(Error::format(
            path,
            format!("not part {} of {count} of the split GGUF model it is named after: it {said}", index + 1),
        ));
    }
    Ok(())
}

/// `split.tensors.count`, where the first part has it, against the
/// tensors all parts hold: a part that lost tensors is refused.
pub(super) fn check_tensor_count(path: &Path, stated: Option<&Value>, found: usize) -> Result<()> {
    let Some(v) = stated else { return Ok(()) };
    match v.as_u64() {
        Some(n) if n == found as u64 => Ok(()),
        _ => Err(Error::format(
            path,
            format!("not a valid GGUF file: `{TENSORS_COUNT}` is {v:?}, but the parts hold {found} tensors"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_names_are_llama_cpps() {
        assert_eq!(part_name("m", 0, 3), "m-00001-of-00003.gguf");
        assert_eq!(part_name("Kimi-K2-UD-IQ1_S", 11, 12), "Kimi-K2-UD-IQ1_S-00012-of-00012.gguf");
        assert_eq!(name_prefix(Path::new("/d/m-00001-of-00003.gguf"), "-00001-of-00003.gguf").as_deref(), Some("m"));
        assert_eq!(name_prefix(Path::new("/d/m.gguf"), "-00001-of-00003.gguf"), None);
        assert_eq!(name_prefix(Path::new("/d/-00001-of-00003.gguf"), "-00001-of-00003.gguf"), None);
    }
}
