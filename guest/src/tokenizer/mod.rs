//! The model's tokenizer: a Hugging Face `tokenizer.json` (hf.rs) or a
//! tiktoken rank file with Kimi's special-token layout (tiktoken.rs).
//!
//! Both offer the same two encodings: `encode` treats everything as content
//! (special-token strings stay ordinary text, so a user cannot forge control
//! tokens) and `encode_markup` resolves special tokens (template markup).

mod added;
mod bpe;
mod decoder;
mod hf;
mod json;
mod normalizer;
mod pattern;
mod pretok;
pub mod tiktoken;

pub use hf::HfTokenizer;
pub use tiktoken::TiktokenTokenizer;

/// What went wrong, with the file and path for a malformed tokenizer file.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenizerError(pub String);

impl std::fmt::Display for TokenizerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TokenizerError {}

/// A piece of a prompt: template markup (special tokens resolved) or
/// content (special-token strings are plain text).
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    pub text: String,
    pub markup: bool,
}

#[derive(Debug)]
pub enum Tokenizer {
    // Both boxed: each is hundreds of bytes and they differ a lot in size.
    Hf(Box<HfTokenizer>),
    Tiktoken(Box<TiktokenTokenizer>),
}

/// Dispatches a method to whichever tokenizer this is.
macro_rules! both {
    ($self:ident, $t:ident => $e:expr) => {
        match $self {
            Tokenizer::Hf($t) => $e,
            Tokenizer::Tiktoken($t) => $e,
        }
    };
}

impl Tokenizer {
    /// Parses a `tokenizer.json`. Errors name what is wrong and where.
    pub fn from_json(json: &str) -> Result<Tokenizer, TokenizerError> {
        HfTokenizer::from_json(json).map(|t| Tokenizer::Hf(Box::new(t)))
    }

    /// Builds the tokenizer from a model's tokenizer files (name, bytes):
    /// `tokenizer.json` when present, else `tiktoken.model` with the special
    /// tokens of `tokenizer_config.json` and Kimi's pre-tokenizer pattern.
    /// `Ok(None)` when neither file is there.
    pub fn from_files(files: &[(String, Vec<u8>)]) -> Result<Option<Tokenizer>, TokenizerError> {
        let get = |name: &str| files.iter().find(|(n, _)| n == name).map(|(_, b)| b.as_slice());
        if let Some(bytes) = get("tokenizer.json") {
            let json =
                std::str::from_utf8(bytes).map_err(|e| TokenizerError(format!("tokenizer.json: not UTF-8: {e}")))?;
            return Tokenizer::from_json(json).map(Some);
        }
        let Some(ranks) = get("tiktoken.model") else {
            return Ok(None);
        };
        let config = get("tokenizer_config.json")
            .map(|b| {
                std::str::from_utf8(b).map_err(|e| TokenizerError(format!("tokenizer_config.json: not UTF-8: {e}")))
            })
            .transpose()?;
        TiktokenTokenizer::from_kimi_files(ranks, config, tiktoken::KIMI_PATTERN)
            .map(|t| Some(Tokenizer::Tiktoken(Box::new(t))))
    }

    /// Text as plain content: special-token strings are ordinary text.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        both!(self, t => t.encode(text))
    }

    /// Text as template markup: special-token strings become their ids.
    pub fn encode_markup(&self, text: &str) -> Vec<u32> {
        both!(self, t => t.encode_markup(text))
    }

    /// Encodes consecutive segments as one text, resolving special tokens
    /// only where they lie wholly inside a markup segment. With no special-
    /// token strings in the content this gives exactly the ids of
    /// `encode_markup` on the joined text (what HF does with a rendered chat
    /// prompt), yet content can never produce a control token.
    pub fn encode_segments(&self, segments: &[Segment]) -> Vec<u32> {
        let mut text = String::new();
        let mut markup: Vec<(usize, usize)> = Vec::new();
        for seg in segments {
            let start = text.len();
            text.push_str(&seg.text);
            if seg.markup && !seg.text.is_empty() {
                markup.push((start, text.len()));
            }
        }
        let allow = |s: usize, e: usize| {
            let i = markup.partition_point(|&(_, me)| me <= s);
            markup.get(i).is_some_and(|&(ms, me)| ms <= s && e <= me)
        };
        both!(self, t => t.encode_allowing(&text, &allow))
    }

    /// Raw bytes of the concatenated tokens, with no UTF-8 repair, so a
    /// streaming caller can hold back partial characters.
    pub fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>, TokenizerError> {
        both!(self, t => t.decode_bytes(ids))
    }

    /// Text of the tokens, invalid UTF-8 replaced as the reference does.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        both!(self, t => t.decode(ids))
    }

    /// Whether `id` is one of the tokenizer's tokens. An embedding is often
    /// wider than its tokenizer (Qwen's 151,936 rows for 151,669 tokens;
    /// llama.cpp's converter names the extra rows `[PAD{id}]`): those ids
    /// are never sampled and decode to nothing.
    pub fn knows(&self, id: u32) -> bool {
        both!(self, t => t.knows(id))
    }

    /// Max id + 1 over the vocabulary and the special/added tokens.
    pub fn vocab_size(&self) -> usize {
        both!(self, t => t.vocab_size())
    }

    pub fn token_id(&self, token: &str) -> Option<u32> {
        both!(self, t => t.token_id(token))
    }

    /// Whether `id` is a special (control) token.
    pub fn is_special(&self, id: u32) -> bool {
        both!(self, t => t.is_special(id))
    }
}
