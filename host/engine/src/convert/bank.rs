//! One MoE layer's expert bank: `experts-LLL.bin`, one record per expert,
//! and its RVQ codebooks in `codebooks-LLL.bin`. Everything a bank depends
//! on is its layer's source tensors and the options, so banks are written
//! in any order, on any number of threads, with identical bytes.

use std::fs::File;
use std::path::Path;
use waste_platform::FileExt;

use super::files::{valid_sidecar, write_sidecar, Sidecar, Writer};
use super::{ConvertOptions, ExpertsAs};
use crate::checkpoint::HfCheckpoint;
use crate::container::checksum;
use crate::container::manifest::{
    align_up, record, CodebookEntry, ExpertBankEntry, GgmlTypeNames, RECORD_ALIGN, TENSOR_ALIGN,
};
use crate::error::{Error, Result};
use crate::quant::{self, ExpertF32, ExpertFormat, ExpertShape, GgmlExpert};

/// At most this many experts of a layer feed its codebook fit...
const CODEBOOK_SAMPLE_EXPERTS: usize = 16;
/// ...and at most this many bytes of their f32 weights, so the fit sample
/// of a release with 130 MB experts (K3) stays in the hundreds of MB.
const CODEBOOK_SAMPLE_BYTES: usize = 256 << 20;

/// Where each layer's records put their payload: one record size for the
/// container (its longest payload, aligned), one expert format per layer.
pub(super) struct Layout {
    pub shape: ExpertShape,
    pub record_bytes: u64,
    /// Indexed by decoder layer; `None` for dense layers.
    formats: Vec<Option<ExpertFormat>>,
}

impl Layout {
    /// The layout of `layers`' banks: the encoded format everywhere, or each
    /// layer's ggml types as the GGUF file has them.
    pub fn new(ckpt: &HfCheckpoint, layers: &[usize], experts: ExpertsAs) -> Result<Layout> {
        let cfg = ckpt.config();
        let shape = cfg.expert_shape();
        let mut formats = vec![None; cfg.num_layers];
        for &l in layers {
            formats[l] = Some(match experts {
                ExpertsAs::Encoded(f) => f,
                ExpertsAs::Stored => ExpertFormat::Ggml(ckpt.gguf_expert_types(l)?),
            });
        }
        let mut layout = Layout { shape, record_bytes: 0, formats };
        for &l in layers {
            let f = layout.format(l);
            quant::check_expert_payload(f, shape, &vec![0u8; layout.payload_bytes(l) as usize], None)
                .or_else(|e| if f.uses_codebooks() { Ok(()) } else { Err(e) })
                .map_err(|e| Error::Arg(format!("layer {l}'s experts as {}: {e}", f.name())))?;
        }
        layout.record_bytes = align_up(record::HEADER_BYTES + layout.longest_payload(), RECORD_ALIGN);
        Ok(layout)
    }

    /// Layer `layer`'s expert format (panics for a dense layer).
    pub fn format(&self, layer: usize) -> ExpertFormat {
        self.formats[layer].unwrap_or_else(|| panic!("layer {layer} has no experts"))
    }

    pub fn payload_bytes(&self, layer: usize) -> u64 {
        quant::expert_payload_len(self.format(layer), self.shape) as u64
    }

    /// The manifest's `payload_bytes`: the longest of any layer.
    pub fn longest_payload(&self) -> u64 {
        (0..self.formats.len()).filter(|&l| self.formats[l].is_some()).map(|l| self.payload_bytes(l)).max().unwrap_or(0)
    }
}

pub(super) fn bank_file(layer: usize) -> String {
    format!("experts-{layer:03}.bin")
}

pub(super) fn codebook_file(layer: usize) -> String {
    format!("codebooks-{layer:03}.bin")
}

/// Experts sampled for a layer's codebooks.
pub(super) fn sample_experts(num_experts: usize, shape: ExpertShape) -> Vec<usize> {
    let per_expert = 3 * 4 * shape.hidden * shape.inter;
    let n = (CODEBOOK_SAMPLE_BYTES / per_expert.max(1)).clamp(1, CODEBOOK_SAMPLE_EXPERTS);
    let step = (num_experts / n).max(1);
    (0..num_experts).step_by(step).take(n).collect()
}

/// A finished bank from an earlier run, if its sidecar matches, its size is
/// right, every record header names the right layer, expert and layout and
/// every payload and codebook range still has the checksum it was written
/// with.
pub(super) fn reusable(
    dir: &Path,
    layer: usize,
    experts: usize,
    layout: &Layout,
    fingerprint: &str,
) -> Option<ExpertBankEntry> {
    let path = dir.join(bank_file(layer));
    let side = valid_sidecar(&path, fingerprint)?;
    let entry: ExpertBankEntry = serde_json::from_value(side.index).ok()?;
    if side.bytes != experts as u64 * layout.record_bytes || entry.experts != experts as u64 {
        return None;
    }
    if let Some(cb) = &entry.codebooks {
        let cb_path = dir.join(&cb.file);
        valid_sidecar(&cb_path, fingerprint)?;
        let file = File::open(&cb_path).ok()?;
        for (offset, len, crc) in
            [(cb.gate_up_offset, cb.gate_up_bytes, cb.gate_up_crc32), (cb.down_offset, cb.down_bytes, cb.down_crc32)]
        {
            if checksum::crc32_of_range(&file, &cb_path, offset, len).ok() != Some(crc?) {
                return None;
            }
        }
    }
    let file = File::open(&path).ok()?;
    let mut buf = vec![0u8; layout.record_bytes as usize];
    let payload = record::HEADER_BYTES as usize..(record::HEADER_BYTES + layout.payload_bytes(layer)) as usize;
    for e in 0..experts {
        file.read_exact_at(&mut buf, e as u64 * layout.record_bytes).ok()?;
        let head = record::Header::parse(&buf)?;
        if !head.same_place(&header(layer, e, layout, None))
            || head.payload_crc32? != checksum::crc32(&buf[payload.clone()])
        {
            return None;
        }
    }
    Some(entry)
}

fn header(layer: usize, expert: usize, layout: &Layout, crc: Option<u32>) -> record::Header {
    record::Header {
        layer: layer as u32,
        expert: expert as u32,
        format: layout.format(layer).code(),
        hidden: layout.shape.hidden as u32,
        inter: layout.shape.inter as u32,
        payload_offset: record::HEADER_BYTES,
        payload_bytes: layout.payload_bytes(layer),
        payload_crc32: crc,
    }
}

/// A GGUF expert's payload: its three slabs as the file stores them, then
/// its f32 biases (gpt-oss), the layout of `quant`'s module docs.
fn stored_payload(ckpt: &HfCheckpoint, layer: usize, expert: usize, types: GgmlExpert) -> Result<Vec<u8>> {
    let (found, slabs) = ckpt.gguf_expert_slabs(layer, expert)?;
    if found != types {
        return Err(Error::format(
            ckpt.dir(),
            format!(
                "layer {layer} expert {expert} is {}, its layer's first expert {}",
                found.describe(),
                types.describe()
            ),
        ));
    }
    let mut payload = slabs.concat();
    if let Some(biases) = ckpt.expert_biases_f32(layer, expert)? {
        payload.extend(biases.iter().flatten().flat_map(|b| b.to_le_bytes()));
    }
    Ok(payload)
}

/// Writes layer `layer`'s bank (or reuses it); `tick` is called once per
/// expert. Returns the manifest entry and whether the bank was reused.
pub(super) fn write_bank(
    ckpt: &HfCheckpoint,
    dir: &Path,
    layer: usize,
    opts: &ConvertOptions,
    layout: &Layout,
    fingerprint: &str,
    tick: &dyn Fn(usize),
) -> Result<(ExpertBankEntry, bool)> {
    let experts = ckpt.config().num_experts;
    if let Some(entry) = reusable(dir, layer, experts, layout, fingerprint) {
        return Ok((entry, true));
    }
    let shape = layout.shape;
    let format = layout.format(layer);
    let codebooks = if format.uses_codebooks() {
        let sample: Vec<[Vec<f32>; 3]> =
            sample_experts(experts, shape).into_iter().map(|e| ckpt.expert_f32(layer, e)).collect::<Result<_>>()?;
        let views: Vec<ExpertF32> =
            sample.iter().map(|[g, u, d]| ExpertF32 { gate: g, up: u, down: d, biases: None }).collect();
        let seed = opts.seed ^ (layer as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let cb = quant::fit_layer_codebooks(format, shape, &views, seed)
            .ok_or_else(|| Error::Runtime(format!("no codebooks were fitted for format {}", format.name())))?;
        drop(sample);
        let file = codebook_file(layer);
        let path = dir.join(&file);
        let mut w = Writer::create(&path)?;
        let gate_up = cb.gate_up.to_bytes();
        let down = cb.down.to_bytes();
        let gate_up_offset = w.pad_to(TENSOR_ALIGN)?;
        w.write(&gate_up)?;
        let down_offset = w.pad_to(TENSOR_ALIGN)?;
        w.write(&down)?;
        let bytes = w.position();
        w.finish()?;
        let entry = CodebookEntry {
            file,
            stages: format.stages().unwrap_or(0) as u64,
            gate_up_offset,
            gate_up_bytes: gate_up.len() as u64,
            down_offset,
            down_bytes: down.len() as u64,
            gate_up_crc32: Some(checksum::crc32(&gate_up)),
            down_crc32: Some(checksum::crc32(&down)),
        };
        let side = Sidecar { fingerprint: fingerprint.to_string(), bytes, index: serde_json::Value::Null };
        write_sidecar(&path, &side)?;
        Some((cb, entry))
    } else {
        None
    };

    let file = bank_file(layer);
    let path = dir.join(&file);
    let mut bank = Writer::create(&path)?;
    for expert in 0..experts {
        let payload = match format {
            ExpertFormat::Ggml(types) => stored_payload(ckpt, layer, expert, types)?,
            _ => {
                let [gate, up, down] = ckpt.expert_f32(layer, expert)?;
                let biases = ckpt.expert_biases_f32(layer, expert)?;
                let biases = biases.as_ref().map(|[g, u, d]| [g.as_slice(), u.as_slice(), d.as_slice()]);
                let view = ExpertF32 { gate: &gate, up: &up, down: &down, biases };
                quant::encode_expert(format, shape, &view, codebooks.as_ref().map(|(cb, _)| cb))
            }
        };
        let start = bank.position();
        bank.write(&header(layer, expert, layout, Some(checksum::crc32(&payload))).to_bytes())?;
        bank.write(&payload)?;
        bank.pad_to(RECORD_ALIGN)?;
        debug_assert_eq!(bank.position() - start, layout.record_bytes);
        tick(expert);
    }
    let bytes = bank.position();
    bank.finish()?;
    let entry = ExpertBankEntry {
        layer: layer as u64,
        file,
        experts: experts as u64,
        codebooks: codebooks.map(|(_, e)| e),
        ggml: match format {
            ExpertFormat::Ggml(types) => Some(GgmlTypeNames::of(types)),
            _ => None,
        },
    };
    let index = serde_json::to_value(&entry).map_err(|e| Error::Runtime(e.to_string()))?;
    write_sidecar(&path, &Sidecar { fingerprint: fingerprint.to_string(), bytes, index })?;
    Ok((entry, false))
}
