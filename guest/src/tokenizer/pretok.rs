//! Pre-tokenizers: cut a normalized piece of text into the words the model
//! tokenizes independently, with HF's exact split semantics.

use super::json::Node;
use super::pattern::Pattern;
use super::TokenizerError;

/// GPT-2's pattern, used by `ByteLevel { use_regex: true }`.
pub(crate) const GPT2_PATTERN: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// A piece of text on its way to the model.
#[derive(Debug, Clone)]
pub(crate) struct Piece {
    pub text: String,
    /// Whether the piece starts at offset 0 of the caller's text (Metaspace
    /// `prepend_scheme: "first"` only prepends there).
    pub at_start: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Behavior {
    Removed,
    Isolated,
    MergedWithPrevious,
    MergedWithNext,
    Contiguous,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Prepend {
    Always,
    First,
    Never,
}

#[derive(Debug)]
pub(crate) enum PreTokenizer {
    ByteLevel { add_prefix_space: bool, regex: Option<Pattern> },
    Split { pattern: Pattern, behavior: Behavior, invert: bool },
    Digits { individual: bool },
    Metaspace { replacement: char, prepend: Prepend, split: bool },
    Whitespace(Pattern),
    WhitespaceSplit,
    Sequence(Vec<PreTokenizer>),
}

impl PreTokenizer {
    pub fn parse(node: &Node) -> Result<PreTokenizer, TokenizerError> {
        let tag = node.type_tag()?;
        Ok(match tag {
            "ByteLevel" => {
                let add_prefix_space = node.opt_bool("add_prefix_space", true)?;
                let regex =
                    if node.opt_bool("use_regex", true)? { Some(Pattern::regex(GPT2_PATTERN, node)?) } else { None };
                PreTokenizer::ByteLevel { add_prefix_space, regex }
            }
            "Split" => {
                let pattern = Pattern::parse(&node.req("pattern")?)?;
                let behavior = parse_behavior(&node.req("behavior")?)?;
                let invert = node.opt_bool("invert", false)?;
                PreTokenizer::Split { pattern, behavior, invert }
            }
            "Digits" => PreTokenizer::Digits { individual: node.opt_bool("individual_digits", false)? },
            "Metaspace" => {
                let replacement = parse_replacement(node)?;
                let prepend = match node.opt("prepend_scheme") {
                    Some(n) => match n.str()? {
                        "always" => Prepend::Always,
                        "first" => Prepend::First,
                        "never" => Prepend::Never,
                        other => return Err(n.error(format!("unknown prepend_scheme {other:?}"))),
                    },
                    None if node.opt_bool("add_prefix_space", true)? => Prepend::Always,
                    None => Prepend::Never,
                };
                let split = node.opt_bool("split", true)?;
                PreTokenizer::Metaspace { replacement, prepend, split }
            }
            "Whitespace" => PreTokenizer::Whitespace(Pattern::regex(r"\w+|[^\w\s]+", node)?),
            "WhitespaceSplit" => PreTokenizer::WhitespaceSplit,
            "Sequence" => {
                let items = node.req("pretokenizers")?.items()?;
                let parsed: Result<Vec<_>, _> = items.iter().map(PreTokenizer::parse).collect();
                PreTokenizer::Sequence(parsed?)
            }
            other => {
                return Err(node.error(format!("unsupported pre_tokenizer type {other:?}")));
            }
        })
    }

    pub fn apply(&self, pieces: Vec<Piece>) -> Vec<Piece> {
        match self {
            PreTokenizer::ByteLevel { add_prefix_space, regex } => {
                let mut out = Vec::with_capacity(pieces.len());
                for mut p in pieces {
                    if *add_prefix_space && !p.text.starts_with(' ') {
                        p.text.insert(0, ' ');
                    }
                    match regex {
                        Some(re) => {
                            let spans = re.find_matches(&p.text);
                            split_piece(&p, spans, Behavior::Isolated, &mut out);
                        }
                        None => out.push(p),
                    }
                }
                for p in &mut out {
                    p.text = byte_level_encode(&p.text);
                }
                out
            }
            PreTokenizer::Split { pattern, behavior, invert } => {
                let mut out = Vec::with_capacity(pieces.len());
                for p in pieces {
                    let mut spans = pattern.find_matches(&p.text);
                    if *invert {
                        spans.iter_mut().for_each(|s| s.2 = !s.2);
                    }
                    split_piece(&p, spans, *behavior, &mut out);
                }
                out
            }
            PreTokenizer::Digits { individual } => {
                let behavior = if *individual { Behavior::Isolated } else { Behavior::Contiguous };
                let mut out = Vec::with_capacity(pieces.len());
                for p in pieces {
                    let spans = char_matches(&p.text, char::is_numeric);
                    split_piece(&p, spans, behavior, &mut out);
                }
                out
            }
            PreTokenizer::Metaspace { replacement, prepend, split } => {
                let mut out = Vec::with_capacity(pieces.len());
                let mut rep_buf = [0u8; 4];
                let rep: &str = replacement.encode_utf8(&mut rep_buf);
                for mut p in pieces {
                    p.text = p.text.replace(' ', rep);
                    let add = match prepend {
                        Prepend::Always => true,
                        Prepend::First => p.at_start,
                        Prepend::Never => false,
                    };
                    if add && !p.text.starts_with(*replacement) {
                        p.text.insert(0, *replacement);
                    }
                    if *split {
                        let r = *replacement;
                        let spans = char_matches(&p.text, |c| c == r);
                        split_piece(&p, spans, Behavior::MergedWithNext, &mut out);
                    } else {
                        out.push(p);
                    }
                }
                out
            }
            PreTokenizer::Whitespace(re) => {
                let mut out = Vec::with_capacity(pieces.len());
                for p in pieces {
                    let mut spans = re.find_matches(&p.text);
                    spans.iter_mut().for_each(|s| s.2 = !s.2);
                    split_piece(&p, spans, Behavior::Removed, &mut out);
                }
                out
            }
            PreTokenizer::WhitespaceSplit => {
                let mut out = Vec::with_capacity(pieces.len());
                for p in pieces {
                    let spans = char_matches(&p.text, char::is_whitespace);
                    split_piece(&p, spans, Behavior::Removed, &mut out);
                }
                out
            }
            PreTokenizer::Sequence(items) => items.iter().fold(pieces, |acc, pt| pt.apply(acc)),
        }
    }
}

pub(crate) fn parse_replacement(node: &Node) -> Result<char, TokenizerError> {
    let n = node.req("replacement")?;
    let s = n.str()?;
    let mut chars = s.chars();
    match (chars.next(), chars.next()) {
        (Some(c), None) => Ok(c),
        _ => Err(n.error(format!("replacement must be exactly one character, found {s:?}"))),
    }
}

fn parse_behavior(node: &Node) -> Result<Behavior, TokenizerError> {
    Ok(match node.str()? {
        "Removed" => Behavior::Removed,
        "Isolated" => Behavior::Isolated,
        "MergedWithPrevious" => Behavior::MergedWithPrevious,
        "MergedWithNext" => Behavior::MergedWithNext,
        "Contiguous" => Behavior::Contiguous,
        other => return Err(node.error(format!("unknown split behavior {other:?}"))),
    })
}

/// HF's `Fn(char) -> bool` pattern: every matching char is its own match.
fn char_matches(text: &str, f: impl Fn(char) -> bool) -> Vec<(usize, usize, bool)> {
    if text.is_empty() {
        return vec![(0, 0, false)];
    }
    let mut out = Vec::new();
    let mut last = 0;
    for (b, c) in text.char_indices() {
        if f(c) {
            if last < b {
                out.push((last, b, false));
            }
            let e = b + c.len_utf8();
            out.push((b, e, true));
            last = e;
        }
    }
    if last < text.len() {
        out.push((last, text.len(), false));
    }
    out
}

/// `NormalizedString::split` followed by the removal of empty pieces.
fn split_piece(piece: &Piece, spans: Vec<(usize, usize, bool)>, behavior: Behavior, out: &mut Vec<Piece>) {
    // (start, end, remove)
    let mut cuts: Vec<(usize, usize, bool)> = Vec::with_capacity(spans.len());
    match behavior {
        Behavior::Isolated => cuts.extend(spans.iter().map(|&(s, e, _)| (s, e, false))),
        Behavior::Removed => cuts = spans,
        Behavior::Contiguous => {
            let mut prev_match = false;
            for (s, e, m) in spans {
                match cuts.last_mut() {
                    Some(last) if m == prev_match => last.1 = e,
                    _ => cuts.push((s, e, false)),
                }
                prev_match = m;
            }
        }
        Behavior::MergedWithPrevious => {
            let mut prev_match = false;
            for (s, e, m) in spans {
                match cuts.last_mut() {
                    Some(last) if m && !prev_match => last.1 = e,
                    _ => cuts.push((s, e, false)),
                }
                prev_match = m;
            }
        }
        Behavior::MergedWithNext => {
            let mut prev_match = false;
            for (s, e, m) in spans.into_iter().rev() {
                match cuts.last_mut() {
                    Some(last) if m && !prev_match => last.0 = s,
                    _ => cuts.push((s, e, false)),
                }
                prev_match = m;
            }
            cuts.reverse();
        }
    }
    for (s, e, remove) in cuts {
        if remove || s == e {
            continue;
        }
        out.push(Piece { text: piece.text[s..e].to_string(), at_start: piece.at_start && s == 0 });
    }
}

/// GPT-2's reversible byte -> printable char table.
pub(crate) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable = (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
        let cp = if printable {
            b
        } else {
            n += 1;
            255 + n
        };
        // Every code point here is below 0x200, far from the surrogates.
        table[b as usize] = char::from_u32(cp).unwrap_or('\u{fffd}');
    }
    table
}

fn byte_level_encode(text: &str) -> String {
    thread_local! {
        static TABLE: [char; 256] = byte_to_char_table();
    }
    TABLE.with(|t| text.bytes().map(|b| t[b as usize]).collect())
}
