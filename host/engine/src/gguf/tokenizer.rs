//! The tokenizer of a GGUF file rebuilt as the Hugging Face files it came
//! from: `tokenizer.json` (byte-level BPE from `tokenizer.ggml.tokens`,
//! `token_type` and `merges`; or a SentencePiece BPE vocabulary, below)
//! and `tokenizer_config.json` (the chat template and special tokens).
//!
//! A `llama` vocabulary (Llama 2, Mistral and Mixtral GGUFs: SentencePiece
//! BPE with byte fallback and `▁` for spaces) has no merges in the file;
//! they are made from the vocabulary as transformers makes them when it
//! converts the release's tokenizer.model (`generate_merges` in
//! tokenization_utils_base.py: for each piece in id order, each split into
//! two pieces of the vocabulary, the left one shortest first), with
//! transformers' Metaspace pre-tokenizer and decoders
//! (tests/fixtures/tokenizer_families/llama_spm holds such a model, the
//! vocabulary llama.cpp's converter writes for it, and transformers' ids).
//!
//! GGUF keeps the vocabulary but not the pre-tokenizer: it names it
//! (`tokenizer.ggml.pre`, chosen by llama.cpp's converter from a hash of
//! the release's output on a test string). Each name we accept maps to the
//! normalizer and pre-tokenizer of the releases that produce it, as their
//! tokenizer.json spells them (tests/fixtures/tokenizer_families holds one
//! of each; the test rebuilds each from its GGUF vocabulary and checks the
//! reference ids).

use serde_json::{json, Map, Value as Json};

use super::{GgufFile, Value};
use crate::error::{Error, Result};

/// `llama_token_type` of llama.cpp (`tokenizer.ggml.token_type`).
const NORMAL: i64 = 1;
const UNKNOWN: i64 = 2;
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;
const UNUSED: i64 = 5;

/// The vocabulary keys of a GGUF file.
pub struct Vocab {
    pub model: String,
    pub pre: String,
    pub tokens: Vec<String>,
    pub types: Vec<i64>,
    pub merges: Vec<String>,
    /// `tokenizer.ggml.add_space_prefix` of a `llama` vocabulary (llama.cpp
    /// reads it as true when absent).
    pub add_space_prefix: bool,
    pub bos: Option<u64>,
    pub eos: Option<u64>,
    pub add_bos: bool,
    pub chat_template: Option<String>,
}

impl Vocab {
    pub fn read(g: &GgufFile) -> Result<Vocab> {
        let bad = |key: &str, msg: &str| Error::format(g.path(), format!("GGUF key `{key}`: {msg}"));
        let strings = |key: &str| -> Result<Vec<String>> {
            match g.get(key) {
                None => Ok(Vec::new()),
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|v| v.as_str().map(str::to_string).ok_or_else(|| bad(key, "expected strings")))
                    .collect(),
                Some(_) => Err(bad(key, "expected an array of strings")),
            }
        };
        let model = g
            .get("tokenizer.ggml.model")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("tokenizer.ggml.model", "missing; the file has no tokenizer"))?
            .to_string();
        let tokens = strings("tokenizer.ggml.tokens")?;
        let types = match g.get("tokenizer.ggml.token_type") {
            None => vec![NORMAL; tokens.len()],
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| match v {
                    Value::I32(t) => Ok(i64::from(*t)),
                    other => other
                        .as_u64()
                        .map(|t| t as i64)
                        .ok_or_else(|| bad("tokenizer.ggml.token_type", "expected integers")),
                })
                .collect::<Result<_>>()?,
            Some(_) => return Err(bad("tokenizer.ggml.token_type", "expected an array")),
        };
        if types.len() != tokens.len() {
            return Err(bad(
                "tokenizer.ggml.token_type",
                &format!("{} entries for {} tokens", types.len(), tokens.len()),
            ));
        }
        let id = |key: &str| g.get(key).and_then(Value::as_u64).filter(|&i| (i as usize) < tokens.len());
        Ok(Vocab {
            pre: g.get("tokenizer.ggml.pre").and_then(Value::as_str).unwrap_or("default").to_string(),
            merges: strings("tokenizer.ggml.merges")?,
            bos: id("tokenizer.ggml.bos_token_id"),
            eos: id("tokenizer.ggml.eos_token_id"),
            add_space_prefix: g.get("tokenizer.ggml.add_space_prefix").and_then(Value::as_bool).unwrap_or(true),
            // llama.cpp adds BOS by default for SentencePiece vocabularies only.
            add_bos: g.get("tokenizer.ggml.add_bos_token").and_then(Value::as_bool).unwrap_or(model == "llama"),
            chat_template: g.get("tokenizer.chat_template").and_then(Value::as_str).map(str::to_string),
            model,
            tokens,
            types,
        })
    }
}

const BYTE_LEVEL: &str =
    r#"{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}"#;

/// (normalizer, pre-tokenizer, ignore_merges) of the releases behind each
/// `tokenizer.ggml.pre` name we accept.
fn pre_tokenizer(pre: &str) -> Option<(Json, Json, bool)> {
    let split = |regexes: &[&str]| -> Json {
        let mut seq: Vec<Json> = regexes
            .iter()
            .map(|r| json!({"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": false}))
            .collect();
        seq.push(serde_json::from_str(BYTE_LEVEL).expect("constant JSON"));
        json!({"type": "Sequence", "pretokenizers": seq})
    };
    let nfc = json!({"type": "NFC"});
    Some(match pre {
        // GPT-2's own regex inside ByteLevel (OLMoE's tokenizer.json too).
        "gpt-2" | "olmo" => (
            Json::Null,
            json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}),
            false,
        ),
        "qwen2" | "deepseek-r1-qwen" => (
            nfc,
            split(&[r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"]),
            false,
        ),
        "qwen35" => (
            nfc,
            split(&[r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"]),
            false,
        ),
        "llama-bpe" | "llama3" | "llama-v3" => (
            Json::Null,
            split(&[r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"]),
            true,
        ),
        "glm4" => (
            Json::Null,
            split(&[r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"]),
            true,
        ),
        "deepseek-v3" => (
            json!({"type": "Sequence", "normalizers": []}),
            split(&[
                r"\p{N}{1,3}",
                "[\u{4e00}-\u{9fa5}\u{3040}-\u{309f}\u{30a0}-\u{30ff}]+",
                "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
            ]),
            false,
        ),
        "gpt-4o" | "minimax-m2" => (
            Json::Null,
            split(&[r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"]),
            pre == "gpt-4o",
        ),
        _ => return None,
    })
}

/// The names `pre_tokenizer` accepts, for the error message.
pub const SUPPORTED_PRE: &[&str] =
    &["gpt-2", "olmo", "qwen2", "qwen35", "llama-bpe", "glm4", "deepseek-v3", "gpt-4o", "minimax-m2"];

/// `tokenizer.json` and `tokenizer_config.json` for `v`.
pub fn files(v: &Vocab) -> std::result::Result<Vec<(&'static str, Vec<u8>)>, String> {
    let tokenizer = match v.model.as_str() {
        "gpt2" => byte_level_bpe(v)?,
        "llama" => sentencepiece_bpe(v)?,
        other => {
            return Err(format!(
                "tokenizer.ggml.model `{other}`: only byte-level BPE (`gpt2`) and SentencePiece BPE (`llama`) vocabularies are rebuilt; convert from the Hugging Face checkpoint instead"
            ))
        }
    };
    let token = |id: Option<u64>| id.map(|i| json!(v.tokens[i as usize])).unwrap_or(Json::Null);
    let mut config = json!({
        "add_bos_token": v.add_bos,
        "bos_token": token(v.bos),
        "eos_token": token(v.eos),
        "tokenizer_class": "PreTrainedTokenizerFast",
    });
    if let Some(t) = &v.chat_template {
        config["chat_template"] = json!(t);
    }
    let bytes = |j: &Json| serde_json::to_vec_pretty(j).expect("JSON values serialise");
    Ok(vec![("tokenizer.json", bytes(&tokenizer)), ("tokenizer_config.json", bytes(&config))])
}

/// The model vocabulary (every id but convert_hf_to_gguf's `[PAD{id}]`
/// fillers, which the release's tokenizer does not have) and the added
/// tokens (`special_types` special, USER_DEFINED not).
fn vocab_and_added(
    v: &Vocab,
    special_types: &[i64],
    in_vocab: impl Fn(i64) -> bool,
) -> std::result::Result<(Map<String, Json>, Vec<Json>), String> {
    let mut vocab = Map::new();
    let mut added = Vec::new();
    for (id, (tok, &ty)) in v.tokens.iter().zip(&v.types).enumerate() {
        if ty == UNUSED {
            continue;
        }
        let special = special_types.contains(&ty);
        if special || ty == USER_DEFINED {
            added.push(json!({
                "id": id, "content": tok, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": special,
            }));
        }
        if in_vocab(ty) && vocab.insert(tok.clone(), json!(id)).is_some() {
            return Err(format!("tokenizer.ggml.tokens: token {tok:?} appears twice"));
        }
    }
    Ok((vocab, added))
}

/// A `gpt2` vocabulary: byte-level BPE with the file's merges and the
/// pre-tokenizer its `tokenizer.ggml.pre` names.
fn byte_level_bpe(v: &Vocab) -> std::result::Result<Json, String> {
    let (normalizer, pre_tokenizer, ignore_merges) = pre_tokenizer(&v.pre).ok_or_else(|| {
        format!("tokenizer.ggml.pre `{}` is not one we rebuild (supported: {})", v.pre, SUPPORTED_PRE.join(", "))
    })?;
    let (vocab, added) = vocab_and_added(v, &[CONTROL], |ty| ty != CONTROL && ty != USER_DEFINED)?;
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": ignore_merges, "vocab": vocab, "merges": v.merges,
        },
    }))
}

/// A `llama` vocabulary: SentencePiece BPE as transformers converts a
/// tokenizer.model (`LlamaTokenizer`): every piece in the model's
/// vocabulary (`<unk>`, `<s>`, `</s>` and the `<0xNN>` bytes too), the
/// control and unknown pieces also special added tokens, merges from the
/// vocabulary (module doc), Metaspace, byte fallback.
fn sentencepiece_bpe(v: &Vocab) -> std::result::Result<Json, String> {
    let (vocab, added) = vocab_and_added(v, &[CONTROL, UNKNOWN], |_| true)?;
    let merges = sentencepiece_merges(v);
    let prepend = if v.add_space_prefix { "always" } else { "never" };
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": prepend, "split": false},
        "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        ]},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
            "ignore_merges": false, "vocab": vocab, "merges": merges,
        },
    }))
}

/// transformers' `generate_merges(vocab)`: for each piece in id order,
/// every split into two pieces of the vocabulary, shortest left part first
/// (its sort by (merged id, left length, right length) keeps that order).
fn sentencepiece_merges(v: &Vocab) -> Vec<[String; 2]> {
    let pieces: std::collections::HashSet<&str> =
        v.tokens.iter().zip(&v.types).filter(|(_, &ty)| ty != UNUSED).map(|(t, _)| t.as_str()).collect();
    let mut merges = Vec::new();
    for (tok, _) in v.tokens.iter().zip(&v.types).filter(|(_, &ty)| ty != UNUSED) {
        for (at, _) in tok.char_indices().skip(1) {
            let (l, r) = tok.split_at(at);
            if pieces.contains(l) && pieces.contains(r) {
                merges.push([l.to_string(), r.to_string()]);
            }
        }
    }
    merges
}
