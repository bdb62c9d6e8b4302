//! Weight formats and their kernels.
//!
//! Trunk matrices (`TrunkFormat`): f32, or 8/4-bit symmetric groups of 128
//! along the input dimension with an f16 scale per group.
//! Routed experts (`ExpertFormat`): f32, q8, q4, or residual VQ over 8-dim
//! vectors (`rvq3` = 3 stages x 256 entries, `rvq2` = 2 stages, `rvq4p` =
//! 4 stages x 64 entries with int8 lookup tables) with per-row f16 scales
//! and per-layer codebooks. RVQ experts are never dequantised on
//! the hot path: lookup tables built from the activation are gathered by the
//! stored codes (LESSONS.md, "Kernels").
//!
//! # Byte layouts (all little endian, no padding between blocks)
//!
//! A matrix `[rows, cols]` (nn.Linear layout: one row per output) is stored
//! as follows. `g = ceil(cols / 128)` groups per row; the last group of a row
//! is shorter when `cols % 128 != 0`; rows never share a group.
//!
//! * `f32`: `rows * cols` f32, row-major.
//! * `q8`: scale block `[rows][g]` f16, then data block `[rows][cols]` i8.
//!   `w = scale * q`, `q` in `[-127, 127]`, `scale = max|w| / 127` rounded
//!   to f16 (quantisation uses the rounded scale).
//! * `q4`: scale block `[rows][g]` f16, then data block `[rows][ceil(cols/2)]`
//!   bytes: two values per byte, low nibble first (even column in the low
//!   nibble); a row with odd `cols` ends with a half-used byte, so every row
//!   starts on a byte. A nibble `n` holds `q = n - 8`, `q` in `[-8, 7]`,
//!   `w = scale * q`. The scale is not simply `max|w| / 7`: the encoder tries
//!   scales `max|w| / d` for `d` in 7..=8.5 (both signs, so the extreme value
//!   can land on -8) and keeps the one with the least squared error; on
//!   Gaussian groups of 128 this cuts the relative error from 11.7% to 9.9%,
//!   at no cost at decode time.
//! * `rvqN` (experts only): per-row f16 scale block `[rows]`, then code block
//!   `[rows][ceil(cols/8)][N]` u8 (vector-major, stages inner, so one row's
//!   codes are contiguous and walk the table linearly). The last vector of a
//!   row is zero-padded when `cols % 8 != 0`. Row `r` decodes as
//!   `w[r][8v+d] = scale[r] * sum_s codebook_s[code[r][v][s]][d]`.
//! * `rvq4p` (experts only): per-row f16 scale block `[rows]`, then the
//!   codes of 4 stages x 6 bits (3 bits per weight) in blocks of 32 rows:
//!   `[ceil(rows/32)][ceil(cols/8)][3][32]` bytes; byte `k` of plane `j`
//!   belongs to row `32*block + k` (rows past the end are zero). With
//!   planes `b0, b1, b2`: `c0 = b0 & 63`, `c1 = b1 & 63`, `c2 = b2 & 63`,
//!   `c3 = b0 >> 6 | (b1 >> 6) << 2 | (b2 >> 6) << 4`. Row-blocked so one
//!   byte shuffle looks up 32 rows at once (see `rvq4p.rs` for the kernel
//!   and its exact arithmetic).
//!
//! `TrunkFormat::byte_len` / `expert_payload_len` are pure functions of the
//! shape. An expert payload is gate `[inter, hidden]`, up `[inter, hidden]`,
//! down `[hidden, inter]`, each a complete matrix in the layout above,
//! concatenated in that order; an expert with biases (`ExpertShape::biases`,
//! gpt-oss) ends with them in f32, whatever the format: gate `[inter]`, up
//! `[inter]`, down `[hidden]`.
//!
//! Codebooks (`Codebooks::to_bytes`): `stages x entries x 8` f32,
//! stage-major (`entries` = 256, or 64 for `rvq4p`).
//!
//! # Determinism
//!
//! Every output row of every kernel is computed by one thread with one fixed
//! summation order, so results never depend on the rayon thread count. The
//! AVX2+FMA kernels sum in a different order from the scalar ones (float
//! noise apart, they agree; the tests check both). The `rvq4p` kernels sum
//! integers and convert at fixed points, and the rvq3/rvq2 AVX-512 row
//! kernel performs each row's f32 additions in the scalar order (lanes are
//! rows), so every ISA path of those is bit-identical to the portable one.
//!
//! # Errors and preconditions
//!
//! Bytes from disk enter through `QMatrix::from_bytes`, `Codebooks::from_bytes`
//! and `check_expert_payload`, which return `QuantError`. The functions whose
//! signatures carry no `Result` (matvec, `expert_forward`, `decode_expert`, ..)
//! take lengths the caller has already validated with those; a mismatched
//! slice length there is a caller bug and panics with a message.

mod activation;
mod decoded;
mod expert;
mod expert_batch;
pub mod ggml;
mod int8;
mod kmeans;
mod rvq;
mod rvq4p;
mod rvq_dense;
pub(crate) mod simd;
mod trunk;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_kernels;

pub use activation::Activation;
pub use expert::{
    build_gate_up_tables, check_expert_payload, decode_expert, decode_expert_biases, encode_expert, expert_forward,
    expert_forward_act, expert_payload_len, gate_up_tables_peak_bytes, ExpertScratch, GateUpTables,
};
pub use expert_batch::{batch_shares_weights, expert_forward_batch, ExpertBatchScratch};
pub use ggml::{GgmlMatrix, GgmlType};
pub use int8::int8_input_bytes;
pub use rvq::{fit_layer_codebooks, Codebooks, LayerCodebooks};
pub use simd::{dot_f32, force_isa, isa, matmul_block, Isa};
pub use trunk::{quantize_trunk, QMatrix};

/// Values per quantisation group along a row (q8/q4).
pub const GROUP: usize = 128;
/// Dimensions of one RVQ vector.
pub const VDIM: usize = 8;
/// Entries per RVQ codebook stage (codes are u8).
pub const CODEBOOK_ENTRIES: usize = 256;

/// Errors for malformed bytes and unsupported shapes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    #[error("{what}: expected {expected} bytes, got {got}")]
    Length { what: &'static str, expected: usize, got: usize },
    #[error("{what}: invalid shape {rows}x{cols}")]
    Shape { what: &'static str, rows: usize, cols: usize },
    #[error("codebooks: {0}")]
    Codebooks(String),
    #[error("this CPU cannot run the {0} kernels")]
    Isa(&'static str),
}

/// Storage format of a resident (trunk) matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TrunkFormat {
    F32,
    Q8,
    Q4,
    /// A GGUF tensor's rows as the file stores them (`ggml` module docs;
    /// never `GgmlType::F32`, which is `F32`): the trunk of a GGUF file
    /// kept without a second rounding.
    Ggml(ggml::GgmlType),
}

impl TrunkFormat {
    /// Our formats' lower-case names; a ggml type's own (`Q6_K`, `BF16`).
    pub fn name(self) -> &'static str {
        match self {
            TrunkFormat::F32 => "f32",
            TrunkFormat::Q8 => "q8",
            TrunkFormat::Q4 => "q4",
            TrunkFormat::Ggml(t) => t.name(),
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "f32" => Some(TrunkFormat::F32),
            "q8" => Some(TrunkFormat::Q8),
            "q4" => Some(TrunkFormat::Q4),
            _ => ggml::GgmlType::parse(s).filter(|&t| t != ggml::GgmlType::F32).map(TrunkFormat::Ggml),
        }
    }

    /// Bytes of a `[rows, cols]` matrix in this format (saturating, so an
    /// absurd untrusted shape yields a huge length that fails the length
    /// check instead of wrapping; a ggml shape whose rows are not whole
    /// blocks is `usize::MAX`).
    pub fn byte_len(self, rows: usize, cols: usize) -> usize {
        match self {
            TrunkFormat::F32 => rows.saturating_mul(cols).saturating_mul(4),
            TrunkFormat::Q8 => scale_bytes(rows, cols).saturating_add(rows.saturating_mul(cols)),
            TrunkFormat::Q4 => scale_bytes(rows, cols).saturating_add(rows.saturating_mul(cols.div_ceil(2))),
            TrunkFormat::Ggml(t) => t.matrix_bytes(rows, cols).unwrap_or(usize::MAX),
        }
    }

    /// Where row `r` of a `[rows, cols]` matrix lies in its bytes, as
    /// (offset, length) spans: one for f32; for q8/q4 the row's scales,
    /// then its codes (each block holds every row's, see the module docs).
    /// The spans concatenated are row `r` as a `[1, cols]` matrix of this
    /// format, so a table left on disk reads a row without knowing the
    /// layout.
    pub fn row_spans(self, rows: usize, cols: usize, r: usize) -> [(usize, usize); 2] {
        match self {
            TrunkFormat::F32 => [(r * cols * 4, cols * 4), (0, 0)],
            TrunkFormat::Ggml(t) => {
                let rb = t.row_bytes(cols).unwrap_or(0);
                [(r * rb, rb), (0, 0)]
            }
            TrunkFormat::Q8 | TrunkFormat::Q4 => {
                let scales = cols.div_ceil(GROUP) * 2;
                let codes = if self == TrunkFormat::Q8 { cols } else { cols.div_ceil(2) };
                [(r * scales, scales), (rows * scales + r * codes, codes)]
            }
        }
    }
}

/// Bytes of the f16 group-scale block of a q8/q4 matrix.
fn scale_bytes(rows: usize, cols: usize) -> usize {
    rows.saturating_mul(cols.div_ceil(GROUP)).saturating_mul(2)
}

/// Storage format of a routed expert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExpertFormat {
    F32,
    Q8,
    Q4,
    Rvq3,
    Rvq2,
    Rvq4p,
    /// A GGUF expert's three slabs, each in the ggml type the file has it
    /// in (`ggml` module docs): gate and up `[inter, hidden]`, down
    /// `[hidden, inter]`, rows of whole blocks.
    Ggml(GgmlExpert),
}

/// The ggml types of a GGUF expert's gate, up and down slabs (a Q4_K_M
/// file has Q4_K gate/up and Q6_K or Q4_K down, varying by layer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GgmlExpert {
    pub gate: ggml::GgmlType,
    pub up: ggml::GgmlType,
    pub down: ggml::GgmlType,
}

impl GgmlExpert {
    /// `gate/up/down` type names, as a manifest and `waste info` show them.
    pub fn describe(self) -> String {
        format!("{}/{}/{}", self.gate.name(), self.up.name(), self.down.name())
    }
}

impl ExpertFormat {
    pub const ALL: [ExpertFormat; 6] = [
        ExpertFormat::F32,
        ExpertFormat::Q8,
        ExpertFormat::Q4,
        ExpertFormat::Rvq3,
        ExpertFormat::Rvq2,
        ExpertFormat::Rvq4p,
    ];

    /// The name a manifest and the CLI use: one per format of our own,
    /// `gguf` for every combination of ggml types (a container names the
    /// types per layer).
    pub fn name(self) -> &'static str {
        match self {
            ExpertFormat::F32 => "f32",
            ExpertFormat::Q8 => "q8",
            ExpertFormat::Q4 => "q4",
            ExpertFormat::Rvq3 => "rvq3",
            ExpertFormat::Rvq2 => "rvq2",
            ExpertFormat::Rvq4p => "rvq4p",
            ExpertFormat::Ggml(_) => Self::GGUF_NAME,
        }
    }

    /// `name()` of the GGUF formats.
    pub const GGUF_NAME: &'static str = "gguf";

    /// One of our own formats by name (`gguf` names no single format).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.name() == s)
    }

    /// On-disk record header code. Stable: never renumber. A GGUF
    /// expert's code holds its three `ggml_type` codes (all below 256):
    /// `1 << 24 | gate << 16 | up << 8 | down`.
    pub fn code(self) -> u32 {
        match self {
            ExpertFormat::F32 => 0,
            ExpertFormat::Q8 => 1,
            ExpertFormat::Q4 => 2,
            ExpertFormat::Rvq3 => 3,
            ExpertFormat::Rvq2 => 4,
            ExpertFormat::Rvq4p => 5,
            ExpertFormat::Ggml(t) => 1 << 24 | t.gate.code() << 16 | t.up.code() << 8 | t.down.code(),
        }
    }

    pub fn from_code(code: u32) -> Option<Self> {
        if code >> 24 == 1 {
            let ty = |shift: u32| ggml::GgmlType::from_code(code >> shift & 0xff);
            return Some(ExpertFormat::Ggml(GgmlExpert { gate: ty(16)?, up: ty(8)?, down: ty(0)? }));
        }
        Self::ALL.into_iter().find(|f| f.code() == code)
    }

    pub fn uses_codebooks(self) -> bool {
        self.stages().is_some()
    }

    /// RVQ stages, `None` for the non-codebook formats.
    pub fn stages(self) -> Option<usize> {
        match self {
            ExpertFormat::Rvq3 => Some(3),
            ExpertFormat::Rvq2 => Some(2),
            ExpertFormat::Rvq4p => Some(4),
            _ => None,
        }
    }

    /// Entries per codebook stage (meaningful for the RVQ formats).
    pub fn entries(self) -> usize {
        match self {
            ExpertFormat::Rvq4p => kmeans::K64,
            _ => CODEBOOK_ENTRIES,
        }
    }

    /// The group format q8/q4 experts share with the trunk.
    fn group_format(self) -> Option<TrunkFormat> {
        match self {
            ExpertFormat::Q8 => Some(TrunkFormat::Q8),
            ExpertFormat::Q4 => Some(TrunkFormat::Q4),
            _ => None,
        }
    }
}

/// Dimensions of one SwiGLU expert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExpertShape {
    pub hidden: usize,
    pub inter: usize,
    /// Gate, up and down carry biases (gpt-oss), stored in f32 after the
    /// matrices.
    pub biases: bool,
}

impl ExpertShape {
    /// An expert without biases.
    pub fn new(hidden: usize, inter: usize) -> ExpertShape {
        ExpertShape { hidden, inter, biases: false }
    }
}

/// One expert's f32 weights in nn.Linear layout:
/// gate, up: `[inter, hidden]`; down: `[hidden, inter]`; the biases
/// `[gate [inter], up [inter], down [hidden]]` when the shape has them.
#[derive(Debug, Clone, Copy)]
pub struct ExpertF32<'a> {
    pub gate: &'a [f32],
    pub up: &'a [f32],
    pub down: &'a [f32],
    pub biases: Option<[&'a [f32]; 3]>,
}
