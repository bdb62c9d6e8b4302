//! Reading GGUF v3 files (llama.cpp's model format) as untrusted input.
//!
//! The layout is ggml's `gguf.h`; tests/fixtures/gguf/GGUF_NOTES.md
//! describes it with the line numbers of llama.cpp's own reader, whose
//! rules this one enforces: v2 or v3 little-endian, keys non-empty and
//! unique, no nested arrays, at most 2^30 array elements, strings inside
//! the file, tensor names of at most 63 bytes, unique, at most 4
//! dimensions, rows a whole number of blocks, and the tensors laid out
//! back to back in info order at the file's alignment. Every count and
//! length is checked against the bytes left in the file before anything
//! is allocated for it, so a hostile header cannot make us allocate more
//! than the file is long.
//!
//! `hf.rs` presents a file as the Hugging Face checkpoint it was converted
//! from (config, tensor names, layouts); `tokenizer.rs` rebuilds the
//! tokenizer. The tensor types and their decoding, exactly as ggml's, are
//! waste-kernels' (`quant::ggml`).

pub mod hf;
mod split;
#[cfg(test)]
mod tests;
pub mod tokenizer;

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
pub use waste_kernels::quant::ggml::GgmlType;

pub const MAGIC: &[u8; 4] = b"GGUF";
/// `GGUF_DEFAULT_ALIGNMENT`.
const DEFAULT_ALIGNMENT: u64 = 32;
/// `GGUF_MAX_ARRAY_ELEMENTS` / `GGUF_MAX_STRING_LENGTH` of llama.cpp.
const MAX_ARRAY: u64 = 1 << 30;
const MAX_STRING: u64 = 1 << 30;
/// `GGML_MAX_NAME` less its NUL.
const MAX_NAME: u64 = 63;
const MAX_DIMS: u32 = 4;
/// Metadata held in memory at most: a 256k vocabulary with its merges is
/// ~20 MB; more than this is not a model header.
const MAX_METADATA_BYTES: u64 = 1 << 30;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    /// An integer of any width, if it is one and not negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// A float, widened exactly (an f32 `1e-6` stays 9.99999997e-07).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One tensor's header entry.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `ne[0]` varies fastest (the columns of a matrix).
    pub ne: Vec<u64>,
    pub ty: GgmlType,
    /// Which file of a split model holds it (0 for an unsplit file).
    pub part: usize,
    /// Absolute byte range of the data in its file.
    pub start: u64,
    pub end: u64,
}

impl TensorInfo {
    /// The row-major (numpy / torch) shape: `ne` reversed.
    pub fn shape(&self) -> Vec<usize> {
        self.ne.iter().rev().map(|&d| d as usize).collect()
    }

    /// Bytes of one row of `ne[0]` elements.
    pub fn row_bytes(&self) -> u64 {
        self.ne[0] / self.ty.block_elems() as u64 * self.ty.block_bytes() as u64
    }
}

/// A GGUF model: one file, or the parts of a split one
/// (`NAME-00001-of-00003.gguf` …) read as one, as llama.cpp loads them.
pub struct GgufFile {
    /// The file opened: the only one, or the first part.
    path: PathBuf,
    /// Every file in part order; `[path]` for an unsplit model.
    parts: Vec<PathBuf>,
    /// The first file's header.
    pub version: u32,
    pub alignment: u64,
    pub data_start: u64,
    /// Bytes of each file, in part order.
    pub part_lens: Vec<u64>,
    /// The metadata: the first file's (later parts hold only `split.*`).
    kv: Vec<(String, Value)>,
    index: HashMap<String, usize>,
    /// Every part's tensors, in part order then info order.
    pub tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
}

/// One file's header, as read.
struct Part {
    version: u32,
    alignment: u64,
    data_start: u64,
    len: u64,
    kv: Vec<(String, Value)>,
    index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
}

impl Part {
    fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.kv[i].1)
    }
}

/// A bounded little-endian reader over the header.
struct Header<'a> {
    r: BufReader<File>,
    pos: u64,
    len: u64,
    path: &'a Path,
    held: u64,
}

impl Header<'_> {
    fn err(&self, msg: impl Into<String>) -> Error {
        Error::format(self.path, format!("not a valid GGUF file: {}", msg.into()))
    }

    fn left(&self) -> u64 {
        self.len - self.pos
    }

    fn bytes<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        if self.left() < N as u64 {
            return Err(self.err(format!("truncated: the file ends inside {what} at byte {}", self.pos)));
        }
        self.r.read_exact(&mut b).map_err(|e| Error::io(self.path, e))?;
        self.pos += N as u64;
        Ok(b)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes(what)?))
    }

    /// A count stored as u64 that llama.cpp reads as i64: at most `max`
    /// and at most the bytes left divided by the smallest encoding of one.
    fn count(&mut self, what: &str, max: u64, min_each: u64) -> Result<u64> {
        let n = self.u64(what)?;
        if n > max || n.saturating_mul(min_each) > self.left() {
            return Err(self.err(format!("{what} {n} is larger than the file can hold")));
        }
        Ok(n)
    }

    fn hold(&mut self, n: u64) -> Result<()> {
        self.held += n;
        if self.held > MAX_METADATA_BYTES {
            return Err(self.err(format!("more than {MAX_METADATA_BYTES} bytes of metadata")));
        }
        Ok(())
    }

    fn string(&mut self, what: &str, max: u64) -> Result<String> {
        let n = self.u64(what)?;
        if n > max.min(MAX_STRING) {
            return Err(self.err(format!("{what} has length {n}, over the limit of {}", max.min(MAX_STRING))));
        }
        if n > self.left() {
            return Err(self.err(format!("truncated: {what} of {n} bytes runs past the end of the file")));
        }
        self.hold(n)?;
        let mut buf = vec![0u8; n as usize];
        self.r.read_exact(&mut buf).map_err(|e| Error::io(self.path, e))?;
        self.pos += n;
        String::from_utf8(buf).map_err(|_| self.err(format!("{what} is not UTF-8")))
    }

    fn value(&mut self, ty: u32, key: &str, in_array: bool) -> Result<Value> {
        Ok(match ty {
            0 => Value::U8(self.bytes::<1>(key)?[0]),
            1 => Value::I8(self.bytes::<1>(key)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.bytes(key)?)),
            3 => Value::I16(i16::from_le_bytes(self.bytes(key)?)),
            4 => Value::U32(self.u32(key)?),
            5 => Value::I32(self.u32(key)? as i32),
            6 => Value::F32(f32::from_le_bytes(self.bytes(key)?)),
            // gguf.cpp reads an int8; any non-zero byte is true.
            7 => Value::Bool(self.bytes::<1>(key)?[0] != 0),
            8 => Value::Str(self.string(&format!("the string value of `{key}`"), MAX_STRING)?),
            9 if in_array => return Err(self.err(format!("key `{key}`: nested arrays are not allowed"))),
            9 => {
                let elem = self.u32(key)?;
                if elem > 12 {
                    return Err(self.err(format!("key `{key}`: array element type {elem} is not a GGUF type")));
                }
                let min_each = match elem {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    _ => 8,
                };
                let n = self.count(&format!("the length of array `{key}`"), MAX_ARRAY, min_each)?;
                self.hold(n * 16)?;
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(elem, key, true)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(key)?),
            11 => Value::I64(self.u64(key)? as i64),
            12 => Value::F64(f64::from_le_bytes(self.bytes(key)?)),
            other => return Err(self.err(format!("key `{key}`: value type {other} is not a GGUF type"))),
        })
    }
}

impl GgufFile {
    /// Reads and validates the header, and for the first part of a split
    /// model every part's (split.rs); the tensor data is read on demand.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let first = read_part(path, 0)?;
        let mut parts = vec![path.to_path_buf()];
        let mut headers = vec![first];
        if let Some(count) = split::count(path, &headers[0])? {
            for (i, p) in split::sibling_paths(path, count)?.into_iter().enumerate().skip(1) {
                let part = read_part(&p, i)?;
                split::check_part(&p, &part, i, count)?;
                parts.push(p);
                headers.push(part);
            }
        }
        let part_lens = headers.iter().map(|h| h.len).collect();
        let mut headers = headers.into_iter();
        let first = headers.next().expect("the first part");
        let stated_tensors = first.get(split::TENSORS_COUNT).cloned();
        let mut tensors = first.tensors;
        for part in headers {
            tensors.extend(part.tensors);
        }
        let mut by_name = HashMap::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            if let Some(earlier) = by_name.insert(t.name.clone(), i) {
                let e = &tensors[earlier];
                return Err(Error::format(
                    &parts[t.part],
                    format!(
                        "not a valid GGUF file: tensor `{}` is also in {}",
                        t.name,
                        parts[e.part].file_name().unwrap_or_default().to_string_lossy()
                    ),
                ));
            }
        }
        split::check_tensor_count(path, stated_tensors.as_ref(), tensors.len())?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            parts,
            version: first.version,
            alignment: first.alignment,
            data_start: first.data_start,
            part_lens,
            kv: first.kv,
            index: first.index,
            tensors,
            by_name,
        })
    }
}

/// Reads and validates one file's header; its tensors are marked as part
/// `part`.
fn read_part(path: &Path, part: usize) -> Result<Part> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(Error::format(path, "not a regular file"));
    }
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let mut h = Header { r: BufReader::with_capacity(1 << 20, file), pos: 0, len: meta.len(), path, held: 0 };
    if h.bytes::<4>("the magic").map_err(|_| h.err("shorter than its 4-byte magic"))? != *MAGIC {
        return Err(h.err("the magic is not `GGUF`"));
    }
    let version = h.u32("the version")?;
    if version != 0 && version & 0xFFFF == 0 {
        return Err(
            h.err(format!("version {:#x} reads as a big-endian file; only little-endian GGUF is supported", version))
        );
    }
    match version {
        1 => return Err(h.err("version 1 (32-bit counts) is not supported; re-convert with a current llama.cpp")),
        2 | 3 => {}
        v => return Err(h.err(format!("version {v} is not supported (2 and 3 are)"))),
    }
    // A tensor info takes at least 8 + 4 + 8 + 4 + 8 bytes, a KV pair 8 + 4 + 1.
    let tensor_count = h.count("tensor_count", i64::MAX as u64, 32)?;
    let kv_count = h.count("kv_count", i64::MAX as u64, 13)?;

    let mut kv = Vec::with_capacity(kv_count as usize);
    let mut index = HashMap::new();
    for i in 0..kv_count {
        let key = h.string(&format!("key {i}"), MAX_STRING)?;
        if key.is_empty() {
            return Err(h.err(format!("key {i} is empty")));
        }
        let ty = h.u32(&key)?;
        let value = h.value(ty, &key, false)?;
        if index.insert(key.clone(), kv.len()).is_some() {
            return Err(h.err(format!("key `{key}` appears twice")));
        }
        kv.push((key, value));
    }
    let alignment = match kv.iter().find(|(k, _)| k == "general.alignment").map(|(_, v)| v) {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) if *a > 0 && a.is_power_of_two() => u64::from(*a),
        Some(Value::U32(a)) => return Err(h.err(format!("general.alignment {a} is not a power of two"))),
        Some(_) => return Err(h.err("general.alignment must be a UINT32")),
    };

    struct Pending {
        name: String,
        ne: Vec<u64>,
        ty: GgmlType,
        offset: u64,
        nbytes: u64,
    }
    let mut pending = Vec::with_capacity(tensor_count as usize);
    let mut by_name = std::collections::HashSet::new();
    for i in 0..tensor_count {
        let name = h.string(&format!("the name of tensor {i}"), MAX_NAME)?;
        let bad = |h: &Header, msg: String| h.err(format!("tensor `{name}`: {msg}"));
        let n_dims = h.u32(&name)?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(bad(&h, format!("{n_dims} dimensions (1 to {MAX_DIMS} are allowed)")));
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            let d = h.u64(&name)? as i64;
            if d < 0 {
                return Err(bad(&h, format!("negative dimension {d}")));
            }
            ne.push(d as u64);
        }
        let code = h.u32(&name)?;
        let ty = GgmlType::from_code(code).ok_or_else(|| bad(&h, format!("ggml type {code} is not supported")))?;
        let offset = h.u64(&name)?;
        let elems = ne.iter().try_fold(1u64, |n, &d| n.checked_mul(d)).filter(|&n| n <= i64::MAX as u64);
        let Some(_) = elems else {
            return Err(bad(&h, format!("shape {ne:?} overflows")));
        };
        let (block_elems, block_bytes) = (ty.block_elems() as u64, ty.block_bytes() as u64);
        if ne[0] % block_elems != 0 {
            return Err(bad(
                &h,
                format!("rows of {} elements are not whole {} blocks of {block_elems}", ne[0], ty.name()),
            ));
        }
        // Elements fit in an i64, bytes need not (2^62 f32 values).
        let nbytes = (ne[0] / block_elems)
            .checked_mul(block_bytes)
            .and_then(|row| ne[1..].iter().try_fold(row, |n, &d| n.checked_mul(d)))
            .ok_or_else(|| bad(&h, format!("shape {ne:?} overflows")))?;
        if !by_name.insert(name.clone()) {
            return Err(h.err(format!("tensor {i} (`{name}`) has the name of an earlier tensor")));
        }
        pending.push(Pending { name, ne, ty, offset, nbytes });
    }
    let data_start = h.pos.div_ceil(alignment) * alignment;
    // gguf.cpp: the tensors are consecutive in info order, each at the
    // aligned end of the one before; that rules out overlaps and gaps.
    let mut expected = 0u64;
    let mut tensors = Vec::with_capacity(pending.len());
    for p in pending {
        if p.offset != expected {
            return Err(h.err(format!("tensor `{}` has offset {}, expected {expected}", p.name, p.offset)));
        }
        let start = data_start.checked_add(p.offset);
        let end = start.and_then(|s| s.checked_add(p.nbytes));
        match (start, end) {
            (Some(start), Some(end)) if end <= h.len => {
                expected = (p.offset + p.nbytes).div_ceil(alignment) * alignment;
                tensors.push(TensorInfo { name: p.name, ne: p.ne, ty: p.ty, part, start, end });
            }
            _ => {
                return Err(h.err(format!(
                    "truncated: tensor `{}` ({} bytes at {}) runs past the end of the file ({} bytes)",
                    p.name,
                    p.nbytes,
                    data_start.saturating_add(p.offset),
                    h.len
                )))
            }
        }
    }
    Ok(Part { version, alignment, data_start, len: h.len, kv, index, tensors })
}

impl GgufFile {
    /// The file opened: the model's only file or its first part.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every file of the model in part order (one for an unsplit file).
    pub fn parts(&self) -> &[PathBuf] {
        &self.parts
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.kv[i].1)
    }

    /// Every key and value in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.kv
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The stored bytes of rows `[r0, r0 + n)` of a tensor viewed as
    /// `[elements / ne[0], ne[0]]`: whole blocks of its type.
    pub fn rows_bytes(&self, t: &TensorInfo, r0: u64, n: u64) -> Result<Vec<u8>> {
        let row = t.row_bytes();
        let lo = t.start + r0 * row;
        let hi = lo + n * row;
        if hi > t.end {
            return Err(Error::Arg(format!("rows {r0}..{} of tensor `{}` are past its end", r0 + n, t.name)));
        }
        let mut buf = vec![0u8; (hi - lo) as usize];
        let path = &self.parts[t.part];
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        waste_platform::FileExt::read_exact_at(&file, &mut buf, lo).map_err(|e| Error::io(path, e))?;
        Ok(buf)
    }

    /// Rows `[r0, r0 + n)` of a tensor viewed as `[elements / ne[0], ne[0]]`,
    /// dequantised to f32.
    pub fn rows_f32(&self, t: &TensorInfo, r0: u64, n: u64) -> Result<Vec<f32>> {
        let buf = self.rows_bytes(t, r0, n)?;
        let mut out = vec![0f32; (n * t.ne[0]) as usize];
        waste_kernels::quant::ggml::dequantize_row(t.ty, &buf, &mut out);
        Ok(out)
    }

    /// A whole tensor, dequantised, in row-major order.
    pub fn tensor_f32(&self, t: &TensorInfo) -> Result<Vec<f32>> {
        let rows = t.ne[1..].iter().product::<u64>();
        self.rows_f32(t, 0, rows)
    }
}
