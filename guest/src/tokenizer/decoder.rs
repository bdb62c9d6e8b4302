//! Decoders, run on byte strings so `decode_bytes` can hand back the exact
//! bytes (a streaming caller needs the partial UTF-8 that HF would replace).

use super::json::Node;
use super::pattern::Pattern;
use super::pretok::{byte_to_char_table, parse_replacement};
use super::TokenizerError;

#[derive(Debug)]
pub(crate) enum Decoder {
    ByteLevel,
    ByteFallback,
    Fuse,
    Strip { content: char, start: usize, stop: usize },
    Replace { pattern: Pattern, content: String },
    Metaspace { replacement: char, drop_first: bool },
    Bpe { suffix: String },
    Sequence(Vec<Decoder>),
}

/// Whether to reproduce HF's string output (invalid UTF-8 replaced the way
/// each decoder does it) or keep raw bytes.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Mode {
    Raw,
    Hf,
}

impl Decoder {
    pub fn parse(node: &Node) -> Result<Decoder, TokenizerError> {
        Ok(match node.type_tag()? {
            "ByteLevel" => Decoder::ByteLevel,
            "ByteFallback" => Decoder::ByteFallback,
            "Fuse" => Decoder::Fuse,
            "Strip" => {
                let c = node.req("content")?;
                let s = c.str()?;
                let mut chars = s.chars();
                let content = match (chars.next(), chars.next()) {
                    (Some(ch), None) => ch,
                    _ => return Err(c.error("expected exactly one character")),
                };
                let start = node.req("start")?.u64()? as usize;
                let stop = node.req("stop")?.u64()? as usize;
                Decoder::Strip { content, start, stop }
            }
            "Replace" => Decoder::Replace {
                pattern: Pattern::parse(&node.req("pattern")?)?,
                content: node.req("content")?.str()?.to_string(),
            },
            "Metaspace" => {
                let replacement = parse_replacement(node)?;
                let drop_first = match node.opt("prepend_scheme") {
                    Some(n) => n.str()? != "never",
                    None => node.opt_bool("add_prefix_space", true)?,
                };
                Decoder::Metaspace { replacement, drop_first }
            }
            "BPEDecoder" => Decoder::Bpe { suffix: node.opt_str("suffix")?.unwrap_or("</w>").to_string() },
            "Sequence" => {
                let items = node.req("decoders")?.items()?;
                let parsed: Result<Vec<_>, _> = items.iter().map(Decoder::parse).collect();
                Decoder::Sequence(parsed?)
            }
            other => return Err(node.error(format!("unsupported decoder type {other:?}"))),
        })
    }

    pub fn decode_chain(&self, tokens: Vec<Vec<u8>>, mode: Mode) -> Vec<Vec<u8>> {
        match self {
            Decoder::ByteLevel => {
                // The table's chars are all below U+0144, so a flat array inverts it.
                let mut rev = [None::<u8>; 0x144];
                for (b, c) in byte_to_char_table().iter().enumerate() {
                    if let Some(slot) = rev.get_mut(*c as usize) {
                        *slot = Some(b as u8);
                    }
                }
                let mut bytes = Vec::new();
                for t in &tokens {
                    let mapped: Option<Vec<u8>> = std::str::from_utf8(t)
                        .ok()
                        .and_then(|s| s.chars().map(|c| rev.get(c as usize).copied().flatten()).collect());
                    match mapped {
                        Some(m) => bytes.extend_from_slice(&m),
                        None => bytes.extend_from_slice(t),
                    }
                }
                if mode == Mode::Hf {
                    bytes = String::from_utf8_lossy(&bytes).into_owned().into_bytes();
                }
                vec![bytes]
            }
            Decoder::ByteFallback => {
                let mut out = Vec::with_capacity(tokens.len());
                let mut run: Vec<u8> = Vec::new();
                let flush = |run: &mut Vec<u8>, out: &mut Vec<Vec<u8>>| {
                    if run.is_empty() {
                        return;
                    }
                    if mode == Mode::Hf && std::str::from_utf8(run).is_err() {
                        // HF emits one replacement char per byte of an invalid run.
                        out.extend(run.iter().map(|_| "\u{fffd}".as_bytes().to_vec()));
                    } else {
                        out.push(run.clone());
                    }
                    run.clear();
                };
                for t in tokens {
                    match byte_token(&t) {
                        Some(b) => run.push(b),
                        None => {
                            flush(&mut run, &mut out);
                            out.push(t);
                        }
                    }
                }
                flush(&mut run, &mut out);
                out
            }
            Decoder::Fuse => vec![tokens.concat()],
            Decoder::Strip { content, start, stop } => {
                let mut buf = [0u8; 4];
                let c = content.encode_utf8(&mut buf).as_bytes();
                tokens
                    .into_iter()
                    .map(|t| {
                        let mut s: &[u8] = &t;
                        for _ in 0..*start {
                            match s.strip_prefix(c) {
                                Some(r) => s = r,
                                None => break,
                            }
                        }
                        for _ in 0..*stop {
                            match s.strip_suffix(c) {
                                Some(r) => s = r,
                                None => break,
                            }
                        }
                        s.to_vec()
                    })
                    .collect()
            }
            Decoder::Replace { pattern, content } => tokens
                .into_iter()
                .map(|t| match pattern.literal() {
                    Some(lit) if !lit.is_empty() => replace_bytes(&t, lit.as_bytes(), content.as_bytes()),
                    _ => match std::str::from_utf8(&t) {
                        Ok(s) => pattern.replace_all(s, content).into_bytes(),
                        Err(_) => t,
                    },
                })
                .collect(),
            Decoder::Metaspace { replacement, drop_first } => {
                let mut buf = [0u8; 4];
                let rep = replacement.encode_utf8(&mut buf).as_bytes();
                tokens
                    .into_iter()
                    .enumerate()
                    .map(|(i, t)| {
                        let with: &[u8] = if i == 0 && *drop_first { b"" } else { b" " };
                        replace_bytes(&t, rep, with)
                    })
                    .collect()
            }
            Decoder::Bpe { suffix } => {
                let n = tokens.len();
                tokens
                    .into_iter()
                    .enumerate()
                    .map(|(i, t)| {
                        let with: &[u8] = if i + 1 == n { b"" } else { b" " };
                        replace_bytes(&t, suffix.as_bytes(), with)
                    })
                    .collect()
            }
            Decoder::Sequence(items) => items.iter().fold(tokens, |acc, d| d.decode_chain(acc, mode)),
        }
    }
}

/// `<0xNN>` -> NN, exactly the 6-byte form HF recognises.
fn byte_token(t: &[u8]) -> Option<u8> {
    if t.len() == 6 && t.starts_with(b"<0x") && t[5] == b'>' {
        let hex = std::str::from_utf8(&t[3..5]).ok()?;
        u8::from_str_radix(hex, 16).ok()
    } else {
        None
    }
}

fn replace_bytes(hay: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    if from.is_empty() {
        return hay.to_vec();
    }
    let mut out = Vec::with_capacity(hay.len());
    let mut i = 0;
    while i < hay.len() {
        if hay[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(hay[i]);
            i += 1;
        }
    }
    out
}
