//! `manifest.json`: the index of a container. Treated as untrusted input:
//! every dimension is bounded and every offset checked against the file that
//! holds it before anything is read.

use serde::{Deserialize, Serialize};

use crate::files::Fnv;

/// Bumped on any incompatible change of the layout below.
pub const FORMAT_VERSION: u32 = 0;
pub const FORMAT_NAME: &str = "waste-container";
pub const MANIFEST_FILE: &str = "manifest.json";
pub const TRUNK_FILE: &str = "trunk.bin";
pub const CODEBOOK_FILE: &str = "codebooks.bin";

/// Trunk tensors start on this boundary so their kernels see aligned data.
pub const TENSOR_ALIGN: u64 = 64;
/// Expert records are whole multiples of this, at offsets that are too, so
/// one direct read fetches one expert.
pub const RECORD_ALIGN: u64 = 4096;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub format_version: u32,
    /// Version of the waste that wrote it, for diagnostics only.
    pub writer: String,
    /// The source checkpoint's config.json, verbatim.
    pub config: serde_json::Value,
    /// The source's generation_config.json, when it had one.
    #[serde(default)]
    pub generation_config: Option<serde_json::Value>,
    pub trunk: TrunkIndex,
    pub experts: ExpertIndex,
    /// Tokenizer and template files copied from the source, by name.
    #[serde(default)]
    pub tokenizer_files: Vec<String>,
    /// Parts of the source the conversion left out (a vision tower, MTP
    /// layers), one line each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
}

impl Manifest {
    /// A model's identity for state files: FNV-1a 64 of its config, its trunk
    /// tensor index (names, shapes, formats, sizes) and its expert layout.
    /// Identical conversions of one checkpoint share it; anything that changes
    /// what the state means changes it.
    pub fn identity(&self) -> String {
        let mut h = Fnv::new();
        h.update(serde_json::to_string(&self.config).unwrap_or_default().as_bytes());
        h.update(self.trunk.format.as_bytes());
        for t in &self.trunk.tensors {
            h.update(t.name.as_bytes());
            h.update(&[0]);
            for d in &t.shape {
                h.update(&d.to_le_bytes());
            }
            h.update(t.format.as_bytes());
            h.update(&t.bytes.to_le_bytes());
        }
        let e = &self.experts;
        h.update(e.format.as_bytes());
        for v in [e.hidden, e.inter, e.record_bytes, e.layers.len() as u64] {
            h.update(&v.to_le_bytes());
        }
        for l in &e.layers {
            h.update(&l.layer.to_le_bytes());
            h.update(&l.experts.to_le_bytes());
        }
        h.hex()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrunkIndex {
    pub file: String,
    /// Format of the big matrices (`--trunk`); embeddings, norms and routers
    /// may use another, recorded per tensor.
    pub format: String,
    pub tensors: Vec<TensorEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TensorEntry {
    pub name: String,
    /// `[rows, cols]` for matrices, `[n]` for vectors.
    pub shape: Vec<u64>,
    /// `f32`, `q8` or `q4`.
    pub format: String,
    pub offset: u64,
    pub bytes: u64,
    /// CRC-32 of the tensor's `bytes` (see [`super::checksum`]); absent in
    /// containers written before checksums, and in `synth --manifest-only`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc32: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExpertIndex {
    /// `f32`, `q8`, `q4`, `rvq3`, `rvq2`, `rvq4p`, or `gguf` (per-layer
    /// ggml types in each bank entry).
    pub format: String,
    pub hidden: u64,
    pub inter: u64,
    /// Each payload ends with the expert's f32 biases (gpt-oss).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub biases: bool,
    pub record_bytes: u64,
    pub payload_offset: u64,
    pub payload_bytes: u64,
    pub layers: Vec<ExpertBankEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExpertBankEntry {
    /// Decoder layer index (0-based).
    pub layer: u64,
    pub file: String,
    pub experts: u64,
    /// RVQ codebooks of this layer inside `codebooks.bin`.
    #[serde(default)]
    pub codebooks: Option<CodebookEntry>,
    /// The ggml types of this layer's gate, up and down slabs (format
    /// `gguf`: a GGUF file's experts kept as stored; the types may differ
    /// from layer to layer, so each layer's payload has its own length,
    /// and `ExpertIndex::payload_bytes` is the longest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ggml: Option<GgmlTypeNames>,
}

/// `GgmlType::name`s of a GGUF expert's slabs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GgmlTypeNames {
    pub gate: String,
    pub up: String,
    pub down: String,
}

impl GgmlTypeNames {
    pub fn of(t: crate::quant::GgmlExpert) -> GgmlTypeNames {
        GgmlTypeNames { gate: t.gate.name().into(), up: t.up.name().into(), down: t.down.name().into() }
    }

    /// `None` when a name is no type we compute on.
    pub fn parse(&self) -> Option<crate::quant::GgmlExpert> {
        use crate::quant::GgmlType;
        Some(crate::quant::GgmlExpert {
            gate: GgmlType::parse(&self.gate)?,
            up: GgmlType::parse(&self.up)?,
            down: GgmlType::parse(&self.down)?,
        })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CodebookEntry {
    pub file: String,
    pub stages: u64,
    pub gate_up_offset: u64,
    pub gate_up_bytes: u64,
    pub down_offset: u64,
    pub down_bytes: u64,
    /// CRC-32 of each range, as for trunk tensors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate_up_crc32: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub down_crc32: Option<u32>,
}

/// The header at the start of every expert record.
///
/// ```text
/// 0..8    magic "WASTEXP0"
/// 8..28   layer, expert, format code, hidden, inter (u32 LE each)
/// 28..32  flags: bit 0 = bytes 48..52 hold the payload's CRC-32
/// 32..48  payload offset, payload bytes (u64 LE)
/// 48..52  CRC-32 of the payload (see `checksum`)
/// 52..64  zero
/// ```
pub mod record {
    pub const MAGIC: &[u8; 8] = b"WASTEXP0";
    pub const HEADER_BYTES: u64 = 64;
    const FLAG_PAYLOAD_CRC: u32 = 1;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Header {
        pub layer: u32,
        pub expert: u32,
        pub format: u32,
        pub hidden: u32,
        pub inter: u32,
        pub payload_offset: u64,
        pub payload_bytes: u64,
        /// Absent in records written before checksums.
        pub payload_crc32: Option<u32>,
    }

    impl Header {
        pub fn to_bytes(&self) -> [u8; HEADER_BYTES as usize] {
            let mut b = [0u8; HEADER_BYTES as usize];
            b[0..8].copy_from_slice(MAGIC);
            b[8..12].copy_from_slice(&self.layer.to_le_bytes());
            b[12..16].copy_from_slice(&self.expert.to_le_bytes());
            b[16..20].copy_from_slice(&self.format.to_le_bytes());
            b[20..24].copy_from_slice(&self.hidden.to_le_bytes());
            b[24..28].copy_from_slice(&self.inter.to_le_bytes());
            b[32..40].copy_from_slice(&self.payload_offset.to_le_bytes());
            b[40..48].copy_from_slice(&self.payload_bytes.to_le_bytes());
            if let Some(crc) = self.payload_crc32 {
                b[28..32].copy_from_slice(&FLAG_PAYLOAD_CRC.to_le_bytes());
                b[48..52].copy_from_slice(&crc.to_le_bytes());
            }
            b
        }

        /// `None` when the magic is wrong, the buffer is short or a flag
        /// this version does not know is set.
        pub fn parse(b: &[u8]) -> Option<Header> {
            if b.len() < HEADER_BYTES as usize || &b[0..8] != MAGIC {
                return None;
            }
            let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or_default());
            let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
            let flags = u32_at(28);
            if flags & !FLAG_PAYLOAD_CRC != 0 {
                return None;
            }
            Some(Header {
                layer: u32_at(8),
                expert: u32_at(12),
                format: u32_at(16),
                hidden: u32_at(20),
                inter: u32_at(24),
                payload_offset: u64_at(32),
                payload_bytes: u64_at(40),
                payload_crc32: (flags & FLAG_PAYLOAD_CRC != 0).then(|| u32_at(48)),
            })
        }

        /// The same record of the same layout, whatever its checksum.
        pub fn same_place(&self, other: &Header) -> bool {
            Header { payload_crc32: None, ..*self } == Header { payload_crc32: None, ..*other }
        }
    }
}

/// Rounds up to a multiple of `align` (a power of two).
pub fn align_up(n: u64, align: u64) -> u64 {
    n.div_ceil(align) * align
}
