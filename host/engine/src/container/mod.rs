//! A converted model: the directory `NAME.waste/` written by `convert`.
//!
//! ```text
//! manifest.json        index (format version, source config, tensors, banks)
//! trunk.bin            dense tensors, each 64-byte aligned
//! experts-LLL.bin      one bank per MoE layer: fixed-size 4 KiB-aligned records
//! codebooks.bin        per-layer RVQ codebooks
//! tokenizer.json ...   tokenizer and template files copied from the source
//! ```

pub mod checksum;
mod experts;
pub mod manifest;
mod rows;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use waste_platform::FileExt;

use crate::files::read_file;

pub use checksum::Verify;
pub use experts::{ExpertBanks, FileLayer, SlabRun};
use manifest::{Manifest, TensorEntry, FORMAT_NAME, FORMAT_VERSION, MANIFEST_FILE, TENSOR_ALIGN};
pub use rows::TrunkRows;

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::quant::{ExpertFormat, QMatrix, TrunkFormat};
use crate::source::{StoredRows, TensorSource};

/// A manifest larger than this is not one of ours.
const MAX_MANIFEST_BYTES: u64 = 256 << 20;
/// A tokenizer file: the largest real tokenizer.json (a 256k vocabulary with
/// its merges) is ~20 MB.
const MAX_TOKENIZER_FILE_BYTES: u64 = 256 << 20;

pub struct Container {
    dir: PathBuf,
    manifest: Manifest,
    config: ModelConfig,
    trunk_path: PathBuf,
    /// Read with positional reads into each tensor's own buffer, not mapped:
    /// mapped pages that were copied out stay in the process's resident set
    /// until the kernel reclaims them, which doubled the trunk's share of the
    /// peak RSS against the budget (regression test
    /// `peak_rss_counts_the_trunk_once`).
    trunk: File,
    tensors: HashMap<String, TensorEntry>,
    eos_tokens: Vec<u32>,
    chat_templates: ChatTemplates,
    /// Every tokenizer / template file as (name, bytes), handed to the guest.
    tokenizer_files: Vec<(String, Vec<u8>)>,
    /// `--verify`: every checksum is required and checked, including those
    /// of tensors read a row at a time and of each expert record as it
    /// lands. Without it, whatever is read whole (trunk tensors,
    /// codebooks) is still checked when it has a checksum.
    verify: Verify,
    /// A GGUF file opened in place (the `in_place` module): the trunk is read
    /// from it, the experts streamed from its expert tensors.
    in_place: Option<InPlace>,
}

/// What a model file read in place (a GGUF file: the `in_place` module) gives a
/// container in place of its trunk file and banks.
pub struct InPlace {
    /// The trunk, read from the file as a conversion would store it.
    pub trunk: Box<dyn TensorSource + Send + Sync>,
    /// The banks made at open, handed to the first `expert_banks` call
    /// (making them again would read every expert's biases again).
    pub banks: std::sync::Mutex<Option<ExpertBanks>>,
    /// What the banks hold in RAM (gpt-oss's expert biases).
    pub resident_bank_bytes: u64,
}

/// What `Container::assemble` builds a container from.
pub(crate) struct Parts {
    pub dir: PathBuf,
    pub manifest: Manifest,
    pub config: ModelConfig,
    pub trunk_path: PathBuf,
    pub trunk: File,
    pub tensors: HashMap<String, TensorEntry>,
    pub files: Vec<(String, Vec<u8>)>,
    pub in_place: Option<InPlace>,
}

/// Rejects names that could reach outside the container directory.
fn plain_file_name(dir: &Path, name: &str, manifest: &Path) -> Result<PathBuf> {
    let ok = !name.is_empty() && !name.contains(['/', '\\']) && name != "." && name != "..";
    if !ok {
        return Err(Error::format(manifest, format!("file name {name:?} is not a plain file name")));
    }
    Ok(dir.join(name))
}

impl Container {
    /// Opens a container directory (`paths::open_container` also takes a
    /// GGUF file, run in place).
    pub fn open(dir: &Path) -> Result<Container> {
        if !dir.is_dir() {
            let what = if dir.exists() {
                "is not a directory (a container is a NAME.waste/ directory)"
            } else {
                "does not exist"
            };
            return Err(Error::format(dir, what));
        }
        let manifest_path = dir.join(MANIFEST_FILE);
        if !manifest_path.is_file() {
            return Err(Error::format(dir, "no manifest.json: not a waste container (make one with `waste convert`)"));
        }
        let bytes = read_file(&manifest_path, MAX_MANIFEST_BYTES)?;
        let manifest: Manifest = serde_json::from_slice(&bytes)
            .map_err(|e| Error::format(&manifest_path, format!("malformed manifest: {e}")))?;
        if manifest.format != FORMAT_NAME {
            return Err(Error::format(&manifest_path, format!("format is {:?}, not {FORMAT_NAME:?}", manifest.format)));
        }
        if manifest.format_version != FORMAT_VERSION {
            return Err(Error::format(
                &manifest_path,
                format!(
                    "container format version {} is not supported by this waste (it reads version {FORMAT_VERSION}); convert the model again",
                    manifest.format_version
                ),
            ));
        }
        let config_json =
            serde_json::to_string(&manifest.config).map_err(|e| Error::format(&manifest_path, e.to_string()))?;
        let mut config = ModelConfig::from_json_str(&config_json, &manifest_path)?;
        // The router's stored name tells which MoE block naming the source used.
        config.adapt_to_tensor_names(manifest.trunk.tensors.iter().map(|t| t.name.as_str()));

        let trunk_path = plain_file_name(dir, &manifest.trunk.file, &manifest_path)?;
        let trunk_len = crate::files::regular_file(&trunk_path)?.len();
        let trunk = File::open(&trunk_path).map_err(|e| Error::io(&trunk_path, e))?;
        let mut tensors = HashMap::new();
        for (i, t) in manifest.trunk.tensors.iter().enumerate() {
            validate_tensor(t, trunk_len, &trunk_path)?;
            if tensors.insert(t.name.clone(), t.clone()).is_some() {
                return Err(Error::format(
                    &manifest_path,
                    format!("trunk.tensors[{i}]: tensor {} appears twice", t.name),
                ));
            }
        }
        check_disjoint(&manifest.trunk.tensors, &manifest_path)?;
        if let Some(missing) = config.trunk_tensor_names().into_iter().find(|n| !tensors.contains_key(n)) {
            return Err(Error::format(&manifest_path, format!("trunk.tensors: tensor {missing} is missing")));
        }

        let mut files = Vec::with_capacity(manifest.tokenizer_files.len());
        for name in &manifest.tokenizer_files {
            let path = plain_file_name(dir, name, &manifest_path)?;
            files.push((name.clone(), read_file(&path, MAX_TOKENIZER_FILE_BYTES)?));
        }
        Container::assemble(Parts {
            dir: dir.to_path_buf(),
            manifest,
            config,
            trunk_path,
            trunk,
            tensors,
            files,
            in_place: None,
        })
    }

    /// The checks and readings every container shares, whatever it was
    /// opened from: the end-of-sequence ids, the tokenizer and templates.
    pub(crate) fn assemble(parts: Parts) -> Result<Container> {
        let Parts { dir, manifest, config, trunk_path, trunk, tensors, files, in_place } = parts;
        let manifest_path = dir.join(MANIFEST_FILE);
        let mut eos_tokens = config.eos_token_ids.clone();
        if let Some(gen) = &manifest.generation_config {
            for id in json_ids(gen.get("eos_token_id")) {
                if !eos_tokens.contains(&id) {
                    eos_tokens.push(id);
                }
            }
        }
        // Generation could never stop at an id the model cannot produce.
        if let Some(&bad) = eos_tokens.iter().find(|&&id| id as usize >= config.vocab_size) {
            return Err(Error::format(
                &manifest_path,
                format!(
                    "end-of-sequence token id {bad} is outside the vocabulary of {} ids, so generation could never stop at it; fix eos_token_id in the checkpoint's config or generation config and convert again",
                    config.vocab_size
                ),
            ));
        }

        let mut chat_templates = ChatTemplates::None;
        for (name, bytes) in &files {
            let path = dir.join(name);
            match name.as_str() {
                "tokenizer.json" => {
                    std::str::from_utf8(bytes).map_err(|_| Error::format(&path, "not UTF-8"))?;
                }
                "chat_template.jinja" => {
                    let text = std::str::from_utf8(bytes).map_err(|_| Error::format(&path, "not UTF-8"))?;
                    chat_templates = ChatTemplates::Single(text.to_string());
                }
                "tokenizer_config.json" if !matches!(chat_templates, ChatTemplates::Single(_)) => {
                    let v: serde_json::Value = serde_json::from_slice(bytes)
                        .map_err(|e| Error::format(&path, format!("malformed JSON: {e}")))?;
                    chat_templates = ChatTemplates::from_tokenizer_config(&v);
                }
                _ => {}
            }
        }

        Ok(Container {
            dir,
            manifest,
            config,
            trunk_path,
            trunk,
            tensors,
            eos_tokens,
            chat_templates,
            tokenizer_files: files,
            verify: Verify::default(),
            in_place,
        })
    }

    /// Which checksums to check (see [`Verify`]); [`Verify::All`] is
    /// refused at once when the manifest lacks a checksum for a trunk
    /// tensor or a codebook.
    pub fn set_verify(&mut self, verify: Verify) -> Result<()> {
        if verify != Verify::All {
            self.verify = verify;
            return Ok(());
        }
        if self.in_place.is_some() {
            return Err(Error::Arg(format!(
                "{}: a GGUF file carries no checksums to verify; convert it (`waste convert FILE.gguf OUT.waste`) to have every record checked",
                self.dir.display()
            )));
        }
        for t in &self.manifest.trunk.tensors {
            if t.crc32.is_none() {
                return Err(checksum::missing(&self.trunk_path, &format!("tensor {}", t.name)));
            }
        }
        for bank in &self.manifest.experts.layers {
            if let Some(cb) = &bank.codebooks {
                if cb.gate_up_crc32.is_none() || cb.down_crc32.is_none() {
                    return Err(checksum::missing(
                        &self.dir.join(&cb.file),
                        &format!("layer {}'s codebooks", bank.layer),
                    ));
                }
            }
        }
        self.verify = Verify::All;
        Ok(())
    }

    pub fn verify(&self) -> Verify {
        self.verify
    }

    /// Reads every trunk tensor and checks its checksum, without keeping
    /// it (`convert --verify`; a model opened with `--verify` checks each
    /// as it loads).
    pub fn check_trunk(&self) -> Result<()> {
        if self.in_place.is_some() {
            return Err(Error::Arg(format!("{}: a GGUF file carries no checksums to verify", self.dir.display())));
        }
        for t in &self.manifest.trunk.tensors {
            let crc = checksum::crc32_of_range(&self.trunk, &self.trunk_path, t.offset, t.bytes)?;
            self.check_tensor_value(t, crc)?;
        }
        Ok(())
    }

    /// The container's directory; for a GGUF file read in place, the file.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether this is a GGUF file read in place.
    pub fn in_place(&self) -> bool {
        self.in_place.is_some()
    }

    /// Bytes the expert banks hold in RAM beside the trunk's tensors (a
    /// GGUF file's expert biases read in place; 0 for a container, whose
    /// records carry them).
    pub fn resident_bank_bytes(&self) -> u64 {
        self.in_place.as_ref().map_or(0, |p| p.resident_bank_bytes)
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    pub fn tokenizer_json(&self) -> Option<&str> {
        // Checked to be UTF-8 when the container was opened.
        let (_, bytes) = self.tokenizer_files.iter().find(|(n, _)| n == "tokenizer.json")?;
        std::str::from_utf8(bytes).ok()
    }

    /// End-of-sequence ids: config.json's, then generation_config.json's.
    pub fn eos_tokens(&self) -> &[u32] {
        &self.eos_tokens
    }

    /// The chat template a conversation renders with (see
    /// [`ChatTemplates::choose`]).
    pub fn chat_template(&self, with_tools: bool) -> std::result::Result<Option<&str>, String> {
        self.chat_templates.choose(with_tools)
    }

    /// The tokenizer and template files as (file name, bytes).
    pub fn tokenizer_files(&self) -> &[(String, Vec<u8>)] {
        &self.tokenizer_files
    }

    pub fn expert_banks(&self) -> Result<ExpertBanks> {
        if let Some(p) = &self.in_place {
            if let Some(banks) = p.banks.lock().unwrap_or_else(|p| p.into_inner()).take() {
                return Ok(banks);
            }
            return Err(Error::Runtime("the expert banks of a file read in place were already taken".into()));
        }
        ExpertBanks::open(&self.dir, &self.manifest, &self.config, self.verify)
    }

    fn entry(&self, name: &str) -> Result<&TensorEntry> {
        self.tensors.get(name).ok_or_else(|| {
            Error::format(self.dir.join(MANIFEST_FILE), format!("tensor {name} is missing from the trunk"))
        })
    }

    /// The stored bytes of `t`, read into a buffer the caller keeps (a
    /// quantised matrix holds it as is: no second copy at any moment).
    fn read_bytes(&self, t: &TensorEntry) -> Result<Vec<u8>> {
        // Bounds were validated against the file's length at open.
        let mut buf = vec![0u8; t.bytes as usize];
        self.trunk.read_exact_at(&mut buf, t.offset).map_err(|e| Error::io(&self.trunk_path, e))?;
        self.check_tensor(t, &buf)?;
        Ok(buf)
    }

    fn check_tensor_value(&self, t: &TensorEntry, computed: u32) -> Result<()> {
        let what = format!("tensor {}", t.name);
        match t.crc32 {
            Some(crc) => checksum::check_value(&self.trunk_path, &what, crc, computed),
            None => Err(checksum::missing(&self.trunk_path, &what)),
        }
    }

    /// Checks the bytes of `t` just read whole (see the `verify` field).
    fn check_tensor(&self, t: &TensorEntry, bytes: &[u8]) -> Result<()> {
        match t.crc32 {
            Some(crc) => checksum::check(&self.trunk_path, &format!("tensor {}", t.name), crc, bytes),
            None if self.verify == Verify::All => {
                Err(checksum::missing(&self.trunk_path, &format!("tensor {}", t.name)))
            }
            None => Ok(()),
        }
    }

    /// The stored little-endian f32 values of `t`, read straight into the
    /// `Vec<f32>` the model keeps.
    fn read_f32(&self, t: &TensorEntry) -> Result<Vec<f32>> {
        let mut values = vec![0f32; t.bytes as usize / 4];
        // SAFETY: the byte view covers exactly the vector's initialised
        // elements (len * 4 bytes, alignment of u8 is 1), and every bit
        // pattern written through it is a valid f32.
        let bytes = unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast::<u8>(), values.len() * 4) };
        self.trunk.read_exact_at(bytes, t.offset).map_err(|e| Error::io(&self.trunk_path, e))?;
        self.check_tensor(t, bytes)?;
        if cfg!(target_endian = "big") {
            for v in &mut values {
                *v = f32::from_bits(u32::from_le(v.to_bits()));
            }
        }
        Ok(values)
    }
}

/// No two trunk tensors share a byte (a damaged manifest could point two
/// names at one range, and the planner would count both).
fn check_disjoint(entries: &[TensorEntry], manifest: &Path) -> Result<()> {
    let mut by_offset: Vec<&TensorEntry> = entries.iter().collect();
    by_offset.sort_by_key(|t| (t.offset, t.bytes));
    for pair in by_offset.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if a.offset + a.bytes > b.offset {
            return Err(Error::format(
                manifest,
                format!(
                    "trunk.tensors: {} (bytes {}..{}) overlaps {} (from byte {})",
                    a.name,
                    a.offset,
                    a.offset + a.bytes,
                    b.name,
                    b.offset
                ),
            ));
        }
    }
    Ok(())
}

fn validate_tensor(t: &TensorEntry, file_len: u64, path: &Path) -> Result<()> {
    let bad = |msg: String| Error::format(path, format!("tensor {}: {msg}", t.name));
    // The kernels read rows with aligned loads; the converter writes every
    // tensor at a multiple of TENSOR_ALIGN.
    if !t.offset.is_multiple_of(TENSOR_ALIGN) {
        return Err(bad(format!("offset {} is not a multiple of {TENSOR_ALIGN}", t.offset)));
    }
    let fmt = TrunkFormat::parse(&t.format).ok_or_else(|| bad(format!("unknown format {:?}", t.format)))?;
    let (rows, cols) = match t.shape.as_slice() {
        [n] => (1, *n),
        [r, c] => (*r, *c),
        _ => return Err(bad(format!("shape {:?} is neither 1-D nor 2-D", t.shape))),
    };
    const MAX_DIM: u64 = 1 << 24;
    if rows == 0 || cols == 0 || rows > MAX_DIM || cols > MAX_DIM {
        return Err(bad(format!("shape {:?} out of bounds", t.shape)));
    }
    let expected = fmt.byte_len(rows as usize, cols as usize) as u64;
    if t.bytes != expected {
        return Err(bad(format!("{} bytes recorded, {expected} expected for {:?} {}", t.bytes, t.shape, t.format)));
    }
    match t.offset.checked_add(t.bytes) {
        Some(end) if end <= file_len => Ok(()),
        _ => Err(bad(format!(
            "bytes {}..{} lie beyond the end of the file ({file_len} bytes): truncated container?",
            t.offset,
            t.offset.saturating_add(t.bytes)
        ))),
    }
}

impl TensorSource for Container {
    fn matrix(&self, name: &str) -> Result<QMatrix> {
        let t = self.entry(name)?;
        if let Some(p) = &self.in_place {
            return p.trunk.matrix(&t.name);
        }
        let [rows, cols] = t.shape[..] else {
            return Err(Error::format(
                &self.trunk_path,
                format!("tensor {name} is not a matrix (shape {:?})", t.shape),
            ));
        };
        let fmt = TrunkFormat::parse(&t.format)
            .ok_or_else(|| Error::format(&self.trunk_path, format!("tensor {name}: unknown format {:?}", t.format)))?;
        let (rows, cols) = (rows as usize, cols as usize);
        let matrix = match fmt {
            // The length matches the shape (checked at open).
            TrunkFormat::F32 => Ok(QMatrix::from_f32(self.read_f32(t)?, rows, cols)),
            _ => QMatrix::from_byte_vec(fmt, rows, cols, self.read_bytes(t)?),
        };
        matrix.map_err(|e| Error::format(&self.trunk_path, format!("tensor {name}: {e}")))
    }

    fn vector(&self, name: &str) -> Result<Vec<f32>> {
        let t = self.entry(name)?;
        if t.shape.len() != 1 || t.format != "f32" {
            return Err(Error::format(&self.trunk_path, format!("tensor {name} is not an f32 vector")));
        }
        if let Some(p) = &self.in_place {
            return p.trunk.vector(name);
        }
        self.read_f32(t)
    }

    fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    fn stored_rows(&self, name: &str) -> Option<Result<Box<dyn StoredRows>>> {
        let t = self.tensors.get(name)?;
        if let Some(p) = &self.in_place {
            return p.trunk.stored_rows(&t.name);
        }
        let [rows, cols] = t.shape[..] else { return None };
        let format = TrunkFormat::parse(&t.format)?;
        // Read a row at a time later, so checked here, whole, only when asked.
        let checked = if self.verify == Verify::All {
            checksum::crc32_of_range(&self.trunk, &self.trunk_path, t.offset, t.bytes)
                .and_then(|crc| self.check_tensor_value(t, crc))
        } else {
            Ok(())
        };
        // An owned handle for the model to keep (reads are positional).
        let rows = checked
            .and_then(|()| self.trunk.try_clone().map_err(|e| Error::io(&self.trunk_path, e)))
            .and_then(|file| TrunkRows::new(file, &self.trunk_path, t.offset, format, rows as usize, cols as usize));
        Some(rows.map(|r| Box::new(r) as Box<dyn StoredRows>))
    }
}

/// `eos_token_id` may be an integer or a list of integers.
pub(crate) fn json_ids(v: Option<&serde_json::Value>) -> Vec<u32> {
    match v {
        Some(serde_json::Value::Number(n)) => n.as_u64().and_then(|n| u32::try_from(n).ok()).into_iter().collect(),
        Some(serde_json::Value::Array(a)) => {
            a.iter().filter_map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok())).collect()
        }
        _ => Vec::new(),
    }
}

/// The chat templates a model's files carry. One definition of which one a
/// conversation renders with, used by the host (`has_chat_template`) and,
/// through the `chat-template` import, by the control component.
#[derive(Debug, Clone, PartialEq)]
pub enum ChatTemplates {
    None,
    /// `chat_template.jinja`, or a string `chat_template` in
    /// tokenizer_config.json.
    Single(String),
    /// A list of `{"name", "template"}` in tokenizer_config.json.
    Named(Vec<(String, String)>),
    /// A `chat_template` of another type: why it cannot be used.
    Invalid(String),
}

impl ChatTemplates {
    /// `chat_template` of tokenizer_config.json.
    pub fn from_tokenizer_config(v: &serde_json::Value) -> ChatTemplates {
        match v.get("chat_template") {
            None | Some(serde_json::Value::Null) => ChatTemplates::None,
            Some(serde_json::Value::String(s)) => ChatTemplates::Single(s.clone()),
            Some(serde_json::Value::Array(list)) => ChatTemplates::Named(
                list.iter()
                    .filter_map(|t| {
                        Some((t.get("name")?.as_str()?.to_owned(), t.get("template")?.as_str()?.to_owned()))
                    })
                    .collect(),
            ),
            Some(_) => {
                ChatTemplates::Invalid("tokenizer_config.json: $.chat_template: expected a string or a list".into())
            }
        }
    }

    /// The template a conversation renders with, as transformers'
    /// `get_chat_template` chooses: the single one; of named ones, `tool_use`
    /// when the conversation has tools and there is one, else `default`,
    /// else none applies (an error, as transformers raises). `Ok(None)`:
    /// the model has no template.
    pub fn choose(&self, with_tools: bool) -> std::result::Result<Option<&str>, String> {
        match self {
            ChatTemplates::None => Ok(None),
            ChatTemplates::Single(t) => Ok(Some(t)),
            ChatTemplates::Named(list) => {
                let named = |name: &str| list.iter().find(|(n, _)| n == name).map(|(_, t)| t.as_str());
                with_tools.then(|| named("tool_use")).flatten().or_else(|| named("default")).map(Some).ok_or_else(
                    || "tokenizer_config.json: $.chat_template: a list without a \"default\" template".into(),
                )
            }
            ChatTemplates::Invalid(why) => Err(why.clone()),
        }
    }
}

/// Parses a format name recorded in the manifest.
pub(crate) fn expert_format(name: &str, manifest: &Path) -> Result<ExpertFormat> {
    ExpertFormat::parse(name).ok_or_else(|| Error::format(manifest, format!("unknown expert format {name:?}")))
}

#[cfg(test)]
mod tests;
