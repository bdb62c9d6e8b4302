//! Normalizers, applied to each piece of text between added tokens.

use unicode_normalization::UnicodeNormalization;

use super::json::Node;
use super::pattern::Pattern;
use super::TokenizerError;

#[derive(Debug)]
pub(crate) enum Normalizer {
    Nfc,
    Nfd,
    Nfkc,
    Nfkd,
    Lowercase,
    Prepend(String),
    Append(String),
    Replace { pattern: Pattern, content: String },
    Strip { left: bool, right: bool },
    Sequence(Vec<Normalizer>),
}

impl Normalizer {
    pub fn parse(node: &Node) -> Result<Normalizer, TokenizerError> {
        Ok(match node.type_tag()? {
            "NFC" => Normalizer::Nfc,
            "NFD" => Normalizer::Nfd,
            "NFKC" => Normalizer::Nfkc,
            "NFKD" => Normalizer::Nfkd,
            "Lowercase" => Normalizer::Lowercase,
            "Prepend" => Normalizer::Prepend(node.req("prepend")?.str()?.to_string()),
            "Append" => Normalizer::Append(node.req("append")?.str()?.to_string()),
            "Replace" => Normalizer::Replace {
                pattern: Pattern::parse(&node.req("pattern")?)?,
                content: node.req("content")?.str()?.to_string(),
            },
            "Strip" => Normalizer::Strip {
                left: node.opt_bool("strip_left", true)?,
                right: node.opt_bool("strip_right", true)?,
            },
            "Sequence" => {
                let items = node.req("normalizers")?.items()?;
                let parsed: Result<Vec<_>, _> = items.iter().map(Normalizer::parse).collect();
                Normalizer::Sequence(parsed?)
            }
            other => return Err(node.error(format!("unsupported normalizer type {other:?}"))),
        })
    }

    pub fn apply(&self, text: String) -> String {
        match self {
            Normalizer::Nfc => text.nfc().collect(),
            Normalizer::Nfd => text.nfd().collect(),
            Normalizer::Nfkc => text.nfkc().collect(),
            Normalizer::Nfkd => text.nfkd().collect(),
            Normalizer::Lowercase => text.to_lowercase(),
            Normalizer::Prepend(p) => {
                if text.is_empty() {
                    text
                } else {
                    let mut s = String::with_capacity(p.len() + text.len());
                    s.push_str(p);
                    s.push_str(&text);
                    s
                }
            }
            Normalizer::Append(a) => {
                if text.is_empty() {
                    text
                } else {
                    text + a
                }
            }
            Normalizer::Replace { pattern, content } => pattern.replace_all(&text, content),
            Normalizer::Strip { left, right } => {
                let mut s: &str = &text;
                if *left {
                    s = s.trim_start();
                }
                if *right {
                    s = s.trim_end();
                }
                s.to_string()
            }
            Normalizer::Sequence(items) => items.iter().fold(text, |acc, n| n.apply(acc)),
        }
    }
}
