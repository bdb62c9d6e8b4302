//! Saving a session's model state to a file and back.
//!
//! A `State` is seen here as a list of named f32 buffers of two kinds: a
//! *sequence* buffer holds one row per token (a KV or latent-KV cache; only
//! the rows below the position are written), a *fixed* buffer is written
//! whole (a linear-attention state, a convolution ring). `State::buffers` and
//! `State::buffers_mut` are the only code that knows the fields of `State`;
//! a new kind of layer state only has to be listed there.
//!
//! File layout (little-endian):
//! `MAGIC` (8 bytes), format version (u32), header length (u32), the JSON
//! header, then every buffer's data in header order, then a checksum (u64) of
//! everything before it: version 2 writes CRC-32 (the containers' checksum,
//! ~17 GB/s), version 1 files, still read, carry FNV-1a 64, whose byte at a
//! time cost a 16K-token state more than a second to write and again to
//! read.
//! checksum (u64) of everything before it. The header records the model
//! identity and every shape the data depends on, so a file from another
//! model, another layout or another shape is refused before anything is
//! copied.

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{LayerState, State};
use crate::config::AttnKind;
use crate::container::checksum::Crc32;
use crate::error::{Error, Result};
use crate::files::Fnv;
use crate::kv::{self, KvType};

pub const MAGIC: &[u8; 8] = b"WASTESES";
pub const FORMAT_VERSION: u32 = 2;
/// A header larger than this is not one of ours.
const MAX_HEADER_BYTES: u32 = 64 << 20;
/// A session file's bytes beyond its state's: magic, version, header
/// length, the largest header, checksum.
pub const MAX_SESSION_OVERHEAD: u64 = 8 + 4 + 4 + MAX_HEADER_BYTES as u64 + 8;

/// How a buffer grows with the sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BufferKind {
    /// `row_len` floats per token; rows `[0, position)` are live.
    Sequence,
    /// Written whole, whatever the position.
    Fixed,
    /// `row_len` floats per `rate` tokens (DeepSeek-V4's compressed
    /// entries); rows `[0, position / rate)` are live.
    Compressed { rate: usize },
}

/// One buffer of a `State`, borrowed.
pub struct StateBuffer<'a> {
    pub name: String,
    pub kind: BufferKind,
    /// Floats per row (`Sequence`) or in total (`Fixed`).
    pub row_len: usize,
    pub data: &'a [f32],
}

pub struct StateBufferMut<'a> {
    pub name: String,
    pub kind: BufferKind,
    pub row_len: usize,
    pub data: &'a mut [f32],
    /// A KV cache's rows: their type and values per row (`row_len` is
    /// then words, `KvType::words`); `None` for f32 buffers.
    pub kv: Option<(KvType, usize)>,
}

impl State {
    /// Every buffer of the state, in a fixed order.
    pub fn buffers(&self) -> Vec<StateBuffer<'_>> {
        let mut out = Vec::with_capacity(2 * self.layers.len());
        for (l, layer) in self.layers.iter().enumerate() {
            for (name, kind, row_len, data) in layer_buffers(l, layer, &self.shape[l]) {
                out.push(StateBuffer { name, kind, row_len, data });
            }
        }
        out
    }

    /// `buffers`, writable, in the same order.
    pub fn buffers_mut(&mut self) -> Vec<StateBufferMut<'_>> {
        let kv_dim = self.kv_dim;
        let mut out = Vec::with_capacity(2 * self.layers.len());
        for (l, layer) in self.layers.iter_mut().enumerate() {
            let width = self.shape[l].1;
            match layer {
                LayerState::Kv { k, v } => {
                    for (name, rows) in [("k", k), ("v", v)] {
                        out.push(StateBufferMut {
                            name: format!("layers.{l}.{name}"),
                            kind: BufferKind::Sequence,
                            row_len: rows.row_words(),
                            kv: Some((rows.kv_type(), kv_dim)),
                            data: rows.words_mut(),
                        });
                    }
                }
                LayerState::Latent(c) => {
                    out.push(StateBufferMut {
                        name: format!("layers.{l}.latent"),
                        kind: BufferKind::Sequence,
                        row_len: c.row_words(),
                        kv: Some((c.kv_type(), width)),
                        data: c.words_mut(),
                    });
                }
                LayerState::V4(st) => {
                    for (name, kind, row_len, data) in v4_buffers_mut(l, st, width) {
                        out.push(StateBufferMut { name, kind, row_len, data, kv: None });
                    }
                }
                LayerState::Kda(st) | LayerState::Gdn(st) => {
                    let (n_s, n_c) = (st.s.len(), st.conv.len());
                    let kind = recurrent_name(&self.shape[l].0);
                    out.push(StateBufferMut {
                        name: format!("layers.{l}.{kind}_state"),
                        kind: BufferKind::Fixed,
                        row_len: n_s,
                        data: &mut st.s,
                        kv: None,
                    });
                    out.push(StateBufferMut {
                        name: format!("layers.{l}.{kind}_conv"),
                        kind: BufferKind::Fixed,
                        row_len: n_c,
                        data: &mut st.conv,
                        kv: None,
                    });
                }
            }
        }
        out
    }

    fn set_position(&mut self, position: usize) {
        self.position = position;
    }
}

type Buf<'a> = (String, BufferKind, usize, &'a [f32]);

/// The buffers of one layer's state: GQA k and v, MLA latent rows, KDA
/// recurrent matrices and conv ring.
fn layer_buffers<'a>(l: usize, layer: &'a LayerState, shape: &(AttnKind, usize, usize)) -> Vec<Buf<'a>> {
    match layer {
        LayerState::Kv { k, v } => vec![
            (format!("layers.{l}.k"), BufferKind::Sequence, k.row_words(), k.words()),
            (format!("layers.{l}.v"), BufferKind::Sequence, v.row_words(), v.words()),
        ],
        LayerState::Latent(c) => vec![(format!("layers.{l}.latent"), BufferKind::Sequence, c.row_words(), c.words())],
        LayerState::V4(st) => vec![
            (format!("layers.{l}.window"), BufferKind::Fixed, st.window.len(), st.window.as_slice()),
            (format!("layers.{l}.compressor_windows"), BufferKind::Fixed, st.open.len(), st.open.as_slice()),
            (format!("layers.{l}.entries"), BufferKind::Compressed { rate: st.rate }, shape.1, st.entries.as_slice()),
        ],
        LayerState::Kda(st) | LayerState::Gdn(st) => {
            let kind = recurrent_name(&shape.0);
            vec![
                (format!("layers.{l}.{kind}_state"), BufferKind::Fixed, st.s.len(), st.s.as_slice()),
                (format!("layers.{l}.{kind}_conv"), BufferKind::Fixed, st.conv.len(), st.conv.as_slice()),
            ]
        }
    }
}

type BufMut<'a> = (String, BufferKind, usize, &'a mut [f32]);

/// `layer_buffers` of a V4 layer, writable; `row` is its entry width.
fn v4_buffers_mut(l: usize, st: &mut super::V4State, row: usize) -> Vec<BufMut<'_>> {
    let (w, o, rate) = (st.window.len(), st.open.len(), st.rate);
    vec![
        (format!("layers.{l}.window"), BufferKind::Fixed, w, st.window.as_mut_slice()),
        (format!("layers.{l}.compressor_windows"), BufferKind::Fixed, o, st.open.as_mut_slice()),
        (format!("layers.{l}.entries"), BufferKind::Compressed { rate }, row, st.entries.as_mut_slice()),
    ]
}

/// The buffer-name stem of a recurrent layer's state.
fn recurrent_name(kind: &AttnKind) -> &'static str {
    match kind {
        AttnKind::Gdn => "gdn",
        _ => "kda",
    }
}

/// Rows of a `Sequence` buffer that hold live data at `position`: every
/// row below it, or all of a sliding-window layer's ring once it has
/// wrapped.
fn live_rows(kind: BufferKind, position: usize, row_len: usize, capacity: usize) -> usize {
    match kind {
        BufferKind::Sequence => position.min(capacity / row_len.max(1)),
        BufferKind::Compressed { rate } => (position / rate.max(1)).min(capacity / row_len.max(1)),
        BufferKind::Fixed => 1,
    }
}

/// The tokens behind a `State`: every token evaluated into it, plus the last
/// sampled token of a generation, held until the next evaluation (it was
/// never evaluated, and its logits would be read by no one).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transcript {
    tokens: Vec<u32>,
    pending: Option<u32>,
}

impl Transcript {
    /// What to evaluate to append `tokens`: the held token first.
    pub fn feed(&self, tokens: &[u32]) -> Vec<u32> {
        self.pending.iter().copied().chain(tokens.iter().copied()).collect()
    }

    /// Records that `fed` (a `feed` result) is now in the state.
    pub fn committed(&mut self, fed: &[u32]) {
        self.pending = None;
        self.tokens.extend_from_slice(fed);
    }

    /// Holds `token` for the next evaluation.
    pub fn hold(&mut self, token: u32) {
        self.pending = Some(token);
    }

    pub fn pending(&self) -> Option<u32> {
        self.pending
    }

    /// Tokens in the state (the held one excluded).
    pub fn evaluated(&self) -> &[u32] {
        &self.tokens
    }

    /// The last `n` tokens of the sequence, the held one included.
    pub fn recent(&self, n: usize) -> Vec<u32> {
        let all = self.tokens.len() + self.pending.is_some() as usize;
        let skip = all.saturating_sub(n);
        self.tokens.iter().copied().chain(self.pending).skip(skip).collect()
    }

    pub fn clear(&mut self) {
        self.tokens.clear();
        self.pending = None;
    }

    /// Keeps the first `n` evaluated tokens and drops the held one.
    pub fn truncate(&mut self, n: usize) {
        self.tokens.truncate(n);
        self.pending = None;
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct BufferHeader {
    name: String,
    kind: BufferKind,
    row_len: usize,
    /// Rows written (`Sequence`: the position; `Fixed`: 1).
    rows: usize,
}

#[derive(Debug, Serialize, Deserialize)]
struct Header {
    model_identity: String,
    family: String,
    vocab_size: usize,
    position: usize,
    context: usize,
    /// How the GQA layers' `k` and `v` rows and the MLA layers' latent rows
    /// are stored (`KvType::name`);
    /// files written before the KV cache had a type hold f32.
    #[serde(default = "f32_name")]
    kv_type: String,
    transcript: Transcript,
    buffers: Vec<BufferHeader>,
}

fn f32_name() -> String {
    KvType::F32.name().to_string()
}

/// What a session file must match to be loaded.
pub struct SessionShape<'a> {
    pub model_identity: &'a str,
    pub family: &'a str,
    pub vocab_size: usize,
}

/// Writes `state` and `transcript` to `path` (through a temporary file in
/// the same directory, renamed into place, so a failed save never leaves a
/// half-written file under the name). The state streams to the file through
/// a small buffer: saving a long conversation costs no second copy of it.
pub fn save_session(path: &Path, shape: &SessionShape, state: &State, transcript: &Transcript) -> Result<()> {
    if transcript.tokens.len() != state.position() {
        return Err(Error::Runtime(format!(
            "session inconsistent: {} tokens recorded for a state at position {}",
            transcript.tokens.len(),
            state.position()
        )));
    }
    let buffers = state.buffers();
    let header = Header {
        model_identity: shape.model_identity.to_string(),
        family: shape.family.to_string(),
        vocab_size: shape.vocab_size,
        position: state.position(),
        context: state.context(),
        kv_type: state.kv_type().name().to_string(),
        transcript: transcript.clone(),
        buffers: buffers
            .iter()
            .map(|b| BufferHeader {
                name: b.name.clone(),
                kind: b.kind,
                row_len: b.row_len,
                rows: live_rows(b.kind, state.position(), b.row_len, b.data.len()),
            })
            .collect(),
    };
    let json = serde_json::to_vec(&header).map_err(|e| Error::Runtime(format!("encoding the session header: {e}")))?;
    let tmp = path.with_extension("tmp-save");
    let write = || -> std::io::Result<()> {
        let file = std::fs::File::create(&tmp)?;
        let mut out = Summing {
            inner: std::io::BufWriter::with_capacity(STREAM_BYTES, file),
            sum: Sum::of_version(FORMAT_VERSION),
        };
        out.write_all(MAGIC)?;
        out.write_all(&FORMAT_VERSION.to_le_bytes())?;
        out.write_all(&(json.len() as u32).to_le_bytes())?;
        out.write_all(&json)?;
        let mut bytes = Vec::new();
        for (b, h) in buffers.iter().zip(&header.buffers) {
            for floats in b.data[..h.rows * h.row_len].chunks(STREAM_BYTES / 4) {
                out.write_all(le_bytes(floats, &mut bytes))?;
            }
        }
        let sum = out.sum.finish();
        let mut inner = out.inner;
        inner.write_all(&sum.to_le_bytes())?;
        inner.into_inner().map_err(|e| e.into_error())?.sync_all()
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io(&tmp, e));
    }
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(path, e)
    })
}

/// An upper bound on the size of the file [`save_session`] writes for
/// `state` with `tokens` tokens: the live rows exactly, the header at its
/// widest (every token id at ten digits and a comma, every buffer's entry
/// at 256 bytes).
pub fn file_bytes_estimate(state: &State, tokens: usize) -> u64 {
    let buffers = state.buffers();
    let data: u64 = buffers
        .iter()
        .map(|b| (live_rows(b.kind, state.position(), b.row_len, b.data.len()) * b.row_len * 4) as u64)
        .sum();
    let header = 1024 + 11 * tokens as u64 + 256 * buffers.len() as u64;
    16 + header + data + 8
}

/// Bytes moved per read or write while streaming a state.
const STREAM_BYTES: usize = 1 << 20;

/// The little-endian bytes of `floats`: a view of them where the CPU is
/// little-endian, else converted into `scratch`.
fn le_bytes<'a>(floats: &'a [f32], scratch: &'a mut Vec<u8>) -> &'a [u8] {
    if cfg!(target_endian = "little") {
        // SAFETY: the view covers exactly the slice's initialised elements
        // (len * 4 bytes, u8's alignment is 1) and lives no longer than it.
        unsafe { std::slice::from_raw_parts(floats.as_ptr().cast::<u8>(), std::mem::size_of_val(floats)) }
    } else {
        scratch.clear();
        scratch.extend(floats.iter().flat_map(|f| f.to_le_bytes()));
        scratch
    }
}

/// The checksum a file of one format version carries.
enum Sum {
    Fnv(Fnv),
    Crc(Crc32),
}

impl Sum {
    fn of_version(version: u32) -> Sum {
        match version {
            1 => Sum::Fnv(Fnv::new()),
            _ => Sum::Crc(Crc32::new()),
        }
    }

    fn update(&mut self, bytes: &[u8]) {
        match self {
            Sum::Fnv(f) => f.update(bytes),
            Sum::Crc(c) => c.update(bytes),
        }
    }

    fn finish(self) -> u64 {
        match self {
            Sum::Fnv(f) => f.finish(),
            Sum::Crc(c) => u64::from(c.finish()),
        }
    }
}

/// A writer that sums what passes through it.
struct Summing<W> {
    inner: W,
    sum: Sum,
}

impl<W: Write> Write for Summing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.sum.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// What a session file says of itself before its data is read: enough to
/// choose among saved conversations without loading one.
#[derive(Debug, Clone)]
pub struct SessionSummary {
    /// The evaluated tokens.
    pub tokens: Vec<u32>,
    /// The file's size in bytes.
    pub file_bytes: u64,
}

/// An open session file whose header has been read and checked against
/// `shape` (and against `context`, the tokens a state of the reader holds);
/// the data that follows is not yet read or summed.
struct Opened {
    file: std::io::BufReader<std::fs::File>,
    sum: Sum,
    header: Header,
    header_len: usize,
    file_bytes: u64,
}

/// Opens `path` and reads its header, refusing a file that is not a session
/// of the model `shape` describes or cannot fit `max_bytes`.
fn open_session(path: &Path, shape: &SessionShape, context: usize, max_bytes: u64) -> Result<Opened> {
    use std::io::Read;
    let bad = |msg: String| Error::format(path, msg);
    let file_bytes = crate::files::regular_file(path)?.len();
    if file_bytes > max_bytes {
        return Err(bad(format!(
            "{file_bytes} bytes, more than a session of this model can hold ({max_bytes}): not its session file"
        )));
    }
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut file = std::io::BufReader::with_capacity(STREAM_BYTES, file);
    let mut front = [0u8; 16];
    if file_bytes < 16 + 8 || file.read_exact(&mut front).is_err() || &front[..8] != MAGIC {
        return Err(bad("not a waste session file".into()));
    }
    let u32_at = |at: usize| u32::from_le_bytes(front[at..at + 4].try_into().unwrap_or([0; 4]));
    let version = u32_at(8);
    if !(1..=FORMAT_VERSION).contains(&version) {
        return Err(bad(format!("session format version {version}; this waste reads versions 1 to {FORMAT_VERSION}")));
    }
    let mut sum = Sum::of_version(version);
    sum.update(&front);
    let header_len = u32_at(12);
    if header_len > MAX_HEADER_BYTES || 16 + u64::from(header_len) + 8 > file_bytes {
        return Err(bad("the header length is out of range: the file is truncated or damaged".into()));
    }
    let mut json = vec![0u8; header_len as usize];
    file.read_exact(&mut json).map_err(|e| Error::io(path, e))?;
    sum.update(&json);
    let header: Header = serde_json::from_slice(&json).map_err(|e| bad(format!("malformed header: {e}")))?;
    if header.model_identity != shape.model_identity {
        return Err(bad(format!(
            "saved from another model ({} {}, this session's model is {} {})",
            header.family, header.model_identity, shape.family, shape.model_identity
        )));
    }
    if header.vocab_size != shape.vocab_size {
        return Err(bad(format!("vocabulary of {} entries, the model has {}", header.vocab_size, shape.vocab_size)));
    }
    if header.position > context {
        return Err(bad(format!("holds {} tokens, more than this session's context of {context}", header.position)));
    }
    if header.transcript.tokens.len() != header.position {
        return Err(bad(format!(
            "{} tokens recorded for a position of {}",
            header.transcript.tokens.len(),
            header.position
        )));
    }
    if let Some(&t) =
        header.transcript.tokens.iter().chain(&header.transcript.pending).find(|&&t| t as usize >= shape.vocab_size)
    {
        return Err(bad(format!("token {t} is outside the vocabulary of {}", shape.vocab_size)));
    }
    Ok(Opened { file, sum, header, header_len: header_len as usize, file_bytes })
}

/// Reads the header of the session file at `path` (a few bytes and the
/// token list, not the state), checked against the model `shape` describes
/// and a state of `context` tokens. The data's checksum is verified only by
/// [`load_session`].
pub fn peek_session(path: &Path, shape: &SessionShape, context: usize, max_bytes: u64) -> Result<SessionSummary> {
    let opened = open_session(path, shape, context, max_bytes)?;
    Ok(SessionSummary { tokens: opened.header.transcript.tokens, file_bytes: opened.file_bytes })
}

/// Reads a session file into `state`, which must be a fresh state of the
/// session's model, and returns its transcript. The data streams into the
/// state (no second copy of it): after an error `state` holds part of the
/// file and is to be dropped. A file whose KV cache has another type than
/// `state`'s (one saved before the cache had a type holds f32) is
/// converted row by row as it streams in: decoded exactly, then rounded to
/// `state`'s type as a freshly computed row would be.
pub fn load_session(path: &Path, shape: &SessionShape, state: &mut State) -> Result<Transcript> {
    use std::io::Read;
    let bad = |msg: String| Error::format(path, msg);
    // No session of this model is larger than its header limit plus its
    // whole state with an f32 KV cache (the widest): a bigger file is
    // refused before it is read.
    let limit = MAX_SESSION_OVERHEAD + f32_state_bytes(state);
    let Opened { mut file, mut sum, header, header_len, file_bytes } =
        open_session(path, shape, state.context(), limit)?;
    let file_kv: KvType = header.kv_type.parse().map_err(bad)?;
    // Check every shape before copying anything.
    let mut buffers = state.buffers_mut();
    if buffers.len() != header.buffers.len() {
        return Err(bad(format!("{} state buffers, this model has {}", header.buffers.len(), buffers.len())));
    }
    let mut expected = 16 + header_len as u64 + 8;
    for (b, h) in buffers.iter().zip(&header.buffers) {
        let rows = live_rows(b.kind, header.position, b.row_len, b.data.len());
        let file_row = b.kv.map_or(b.row_len, |(_, width)| file_kv.words(width));
        if b.name != h.name || b.kind != h.kind || file_row != h.row_len || h.rows != rows {
            return Err(bad(format!(
                "buffer {} ({:?}, {} x {}) does not fit this model's {} ({:?}, {} x {})",
                h.name, h.kind, h.rows, h.row_len, b.name, b.kind, rows, file_row
            )));
        }
        if rows * b.row_len > b.data.len() {
            return Err(bad(format!("buffer {} is larger than this session's state", h.name)));
        }
        expected += (rows * h.row_len * 4) as u64;
    }
    if expected != file_bytes {
        return Err(bad(format!(
            "{file_bytes} bytes, the header describes {expected}: the file is truncated or damaged"
        )));
    }
    let mut scratch = vec![0u8; STREAM_BYTES];
    let damaged =
        |e: std::io::Error| Error::format(path, format!("reading the state: {e}: the file is truncated or damaged"));
    for (b, h) in buffers.iter_mut().zip(&header.buffers) {
        match b.kv {
            Some((ty, width)) if ty != file_kv => {
                let mut words = vec![0.0f32; h.row_len];
                let mut values = vec![0.0f32; width];
                for row in b.data[..h.rows * b.row_len].chunks_exact_mut(b.row_len) {
                    read_words(&mut file, &mut sum, &mut words, &mut scratch).map_err(damaged)?;
                    kv::decode_row(file_kv, width, &words, 0..width, &mut values);
                    kv::encode_row(ty, &values, row);
                }
            }
            _ => {
                for floats in b.data[..h.rows * h.row_len].chunks_mut(STREAM_BYTES / 4) {
                    read_words(&mut file, &mut sum, floats, &mut scratch).map_err(damaged)?;
                }
            }
        }
    }
    let mut tail = [0u8; 8];
    file.read_exact(&mut tail).map_err(damaged)?;
    if sum.finish().to_le_bytes() != tail {
        return Err(bad("checksum mismatch: the file is truncated or damaged".into()));
    }
    drop(buffers);
    state.set_position(header.position);
    Ok(header.transcript)
}

/// Fills `floats` from the next `4 * floats.len()` bytes of `file` (at most
/// `scratch.len()` of them), summing them.
fn read_words(
    file: &mut impl std::io::Read,
    sum: &mut Sum,
    floats: &mut [f32],
    scratch: &mut [u8],
) -> std::io::Result<()> {
    if cfg!(target_endian = "little") {
        // SAFETY: the view covers exactly the chunk's initialised elements
        // (len * 4 bytes, u8's alignment is 1), every bit pattern written
        // through it is a valid f32, and the chunk is not touched otherwise
        // while the view lives.
        let view =
            unsafe { std::slice::from_raw_parts_mut(floats.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(floats)) };
        file.read_exact(view)?;
        sum.update(view);
    } else {
        let chunk = &mut scratch[..floats.len() * 4];
        file.read_exact(chunk)?;
        sum.update(chunk);
        for (dst, src) in floats.iter_mut().zip(chunk.chunks_exact(4)) {
            *dst = f32::from_le_bytes([src[0], src[1], src[2], src[3]]);
        }
    }
    Ok(())
}

/// Bytes of `state`, its KV cache counted at f32 where that is wider than
/// its own type: the largest state a session file of this model holds.
fn f32_state_bytes(state: &State) -> u64 {
    let widening: usize = state
        .layers()
        .iter()
        .map(|l| match l {
            LayerState::Kv { k, v } => {
                [k, v].iter().map(|c| (c.rows() * c.width()).saturating_sub(c.words().len())).sum()
            }
            LayerState::Latent(c) => (c.rows() * c.width()).saturating_sub(c.words().len()),
            _ => 0,
        })
        .sum();
    (state.bytes() + 4 * widening) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;

    fn qwen3_moe() -> ModelConfig {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-qwen3_moe/config.json");
        ModelConfig::from_file(&path).unwrap()
    }

    /// Row `r` of layer `l`'s keys (`v`: values) as first written.
    fn row(l: usize, r: usize, v: bool, width: usize) -> Vec<f32> {
        (0..width).map(|c| ((l * 131 + r * 17 + c * 7 + v as usize * 5) % 23) as f32 * 0.37 - 4.1).collect()
    }

    fn kv_rows(state: &State) -> Vec<(&crate::kv::KvRows, &crate::kv::KvRows)> {
        state
            .layers()
            .iter()
            .filter_map(|l| match l {
                LayerState::Kv { k, v } => Some((k, v)),
                _ => None,
            })
            .collect()
    }

    /// A session file's KV rows land in a state of any KV type as that
    /// type stores them: an f32 file's rows rounded once (as a freshly
    /// computed row), a bf16 file's rows decoded exactly into f32.
    #[test]
    fn a_session_file_converts_between_kv_types_as_it_loads() {
        let cfg = qwen3_moe();
        let (context, position, width) = (6, 4, cfg.kv_dim());
        let shape = SessionShape { model_identity: "m", family: "qwen3_moe", vocab_size: cfg.vocab_size };
        let transcript = Transcript { tokens: vec![1, 2, 3, 4], pending: None };
        let dir = std::env::temp_dir().join(format!("waste-kv-convert-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut exact = State::new(&cfg, context);
        for (l, layer) in exact.layers_mut().iter_mut().enumerate() {
            if let LayerState::Kv { k, v } = layer {
                for r in 0..position {
                    k.write_row(r, &row(l, r, false, width));
                    v.write_row(r, &row(l, r, true, width));
                }
            }
        }
        exact.set_position(position);
        let f32_file = dir.join("f32.state");
        save_session(&f32_file, &shape, &exact, &transcript).unwrap();
        for ty in KvType::ALL {
            let mut s = State::with_kv(&cfg, context, ty);
            assert_eq!(load_session(&f32_file, &shape, &mut s).unwrap(), transcript);
            assert_eq!(s.position(), position);
            let mut want = vec![0.0; ty.words(width)];
            for (l, (k, v)) in kv_rows(&s).into_iter().enumerate() {
                for r in 0..position {
                    for (rows, is_v) in [(k, false), (v, true)] {
                        kv::encode_row(ty, &row(l, r, is_v, width), &mut want);
                        let got = &rows.words()[r * rows.row_words()..][..rows.row_words()];
                        let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "{ty}: layer {l} row {r} {}", if is_v { "v" } else { "k" });
                    }
                }
            }
        }
        // bf16 back to f32: the values the bf16 cache held, exactly.
        let mut half = State::with_kv(&cfg, context, KvType::Bf16);
        load_session(&f32_file, &shape, &mut half).unwrap();
        let bf16_file = dir.join("bf16.state");
        save_session(&bf16_file, &shape, &half, &transcript).unwrap();
        let mut back = State::new(&cfg, context);
        load_session(&bf16_file, &shape, &mut back).unwrap();
        for ((hk, _), (bk, _)) in kv_rows(&half).into_iter().zip(kv_rows(&back)) {
            let mut want = vec![0.0; width];
            for r in 0..position {
                kv::decode_row(
                    KvType::Bf16,
                    width,
                    &hk.words()[r * hk.row_words()..][..hk.row_words()],
                    0..width,
                    &mut want,
                );
                assert_eq!(&bk.words()[r * width..][..width], want.as_slice());
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Session files written before the KV cache had a type carry no
    /// `kv_type`: their rows are f32.
    #[test]
    fn a_session_header_without_a_kv_type_is_read_as_f32() {
        let json = r#"{"model_identity":"m","family":"f","vocab_size":8,"position":0,"context":4,
            "transcript":{"tokens":[],"pending":null},"buffers":[]}"#;
        let header: Header = serde_json::from_str(json).unwrap();
        assert_eq!(header.kv_type, "f32");
    }

    #[test]
    fn transcript_holds_the_pending_token_in_front() {
        let mut t = Transcript::default();
        let fed = t.feed(&[1, 2]);
        t.committed(&fed);
        t.hold(3);
        assert_eq!(t.feed(&[4]), vec![3, 4]);
        assert_eq!(t.recent(2), vec![2, 3]);
        assert_eq!(t.recent(10), vec![1, 2, 3]);
        let fed = t.feed(&[]);
        t.committed(&fed);
        assert_eq!(t.evaluated(), &[1, 2, 3]);
        assert_eq!(t.pending(), None);
    }
}
