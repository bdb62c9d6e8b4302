//! Structured output: the grammar a generation must follow (a JSON schema,
//! any JSON object, a Lark or GBNF grammar, a regular expression), compiled
//! by llguidance, masks every step's logits to the tokens the grammar
//! allows, so the text always parses. It runs here, in the control
//! component, because which tokens may come next is control logic; the host
//! only ever sees the sampled tokens.
//!
//! llguidance needs the bytes of every token: they are the tokenizer's own
//! per-token decode, the same bytes the token loop streams, so the text the
//! grammar accepted is exactly the text the caller receives. Special tokens
//! (the chat markers) are marked as such and never match grammar text; the
//! model's end-of-sequence tokens are allowed once the grammar can end.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

use crate::gbnf;
use crate::tokenizer::Tokenizer;

/// Bound on a grammar's or schema's text, checked before it is parsed.
pub const MAX_GRAMMAR_BYTES: usize = 1 << 20;

/// JSON is written compact (`{"a":1,"b":[2,3]}`): llguidance's default
/// lets any whitespace run between tokens, which a model that knows no JSON
/// can pad forever, and compact text bounds an answer's length by its
/// schema. A schema with its own `x-guidance` options keeps them.
fn compact_json() -> Value {
    serde_json::json!({"whitespace_flexible": false, "item_separator": ",", "key_separator": ":"})
}

/// What a generation must follow.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// Any JSON object (OpenAI `json_object`, Ollama `format: "json"`).
    JsonObject,
    /// The JSON text of a JSON schema (draft 2020-12 as llguidance reads it).
    JsonSchema(String),
    /// A grammar in llguidance's Lark syntax.
    Lark(String),
    /// A grammar in llama.cpp's GBNF, start rule `root`.
    Gbnf(String),
    /// A regular expression (Rust `regex` syntax) the whole output matches.
    Regex(String),
}

impl Constraint {
    /// The grammar llguidance compiles, or why this one is malformed.
    fn grammar(&self) -> Result<TopLevelGrammar, String> {
        let text = match self {
            Constraint::JsonObject => "",
            Constraint::JsonSchema(s) | Constraint::Lark(s) | Constraint::Gbnf(s) | Constraint::Regex(s) => s,
        };
        if text.len() > MAX_GRAMMAR_BYTES {
            return Err(format!("the grammar is {} bytes; at most {MAX_GRAMMAR_BYTES} are accepted", text.len()));
        }
        Ok(match self {
            Constraint::JsonObject => TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"}))),
            Constraint::JsonSchema(s) => {
                let schema: Value = serde_json::from_str(s).map_err(|e| format!("the JSON schema is not JSON: {e}"))?;
                if !(schema.is_object() || schema.is_boolean()) {
                    return Err("a JSON schema is an object (or true / false)".into());
                }
                TopLevelGrammar::from_json_schema(compact(schema))
            }
            Constraint::Lark(s) => TopLevelGrammar::from_lark(s.clone()),
            Constraint::Gbnf(s) => TopLevelGrammar::from_lark(gbnf::to_lark(s)?),
            Constraint::Regex(s) => TopLevelGrammar::from_regex(s),
        })
    }
}

/// The schema with compact JSON, unless it sets its own llguidance options.
fn compact(schema: Value) -> Value {
    // `true` (anything) as the empty schema, which can carry the options.
    let mut schema = if schema == Value::Bool(true) { serde_json::json!({}) } else { schema };
    if let Value::Object(map) = &mut schema {
        map.entry("x-guidance").or_insert_with(compact_json);
    }
    schema
}

/// The tokenizer's vocabulary as llguidance sees it, built once per model
/// (a 160k vocabulary takes a while: every token is decoded and indexed).
pub struct Vocabulary {
    factory: ParserFactory,
    /// Logits per step: the model's vocabulary. The trie has one more
    /// entry, a stand-in end-of-sequence that only says "the grammar may end
    /// here" for a model without EOS tokens.
    vocab_size: usize,
    eos_tokens: Vec<u32>,
}

impl Vocabulary {
    pub fn new(tokenizer: &Tokenizer, vocab_size: u32, eos_tokens: &[u32]) -> Result<Vocabulary, String> {
        let n = vocab_size as usize;
        let stand_in = vocab_size;
        let mut words: Vec<Vec<u8>> = Vec::with_capacity(n + 1);
        for id in 0..vocab_size {
            let special = tokenizer.is_special(id) || eos_tokens.contains(&id);
            // An id the tokenizer does not know (padding rows of the
            // embedding) gets no bytes: llguidance never allows it.
            let bytes = tokenizer.decode_bytes(&[id]).unwrap_or_default();
            words.push(if special {
                let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                w.extend_from_slice(&bytes);
                w
            } else {
                bytes
            });
        }
        words.push([TokTrie::SPECIAL_TOKEN_MARKER].iter().chain(b"<|waste:end|>").copied().collect());
        let mut ends = vec![stand_in];
        ends.extend(eos_tokens.iter().copied().filter(|&t| t < vocab_size));
        let trie = TokTrie::from(&TokRxInfo::new(vocab_size + 1, stand_in), &words).with_eos_tokens(&ends);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| format!("structured output: {e}"))?;
        // A library never prints: errors come back as values.
        factory.quiet();
        Ok(Vocabulary { factory, vocab_size: n, eos_tokens: eos_tokens.to_vec() })
    }

    /// Compiles `constraint`; a malformed or unsatisfiable grammar is an
    /// error naming the reason.
    pub fn compile(&self, constraint: &Constraint) -> Result<Guide, String> {
        let parser = self.factory.create_parser(constraint.grammar()?).map_err(|e| format!("the grammar: {e}"))?;
        let mut matcher = Matcher::new(Ok(parser));
        // An unsatisfiable schema compiles, yet allows nothing at all.
        let first = matcher.compute_mask().map_err(|e| format!("the grammar: {e}"))?;
        if first.is_zero() {
            return Err("the grammar: no text satisfies it".into());
        }
        Ok(Guide { matcher, vocab_size: self.vocab_size, eos_tokens: self.eos_tokens.clone() })
    }
}

/// One generation's grammar state.
pub struct Guide {
    matcher: Matcher,
    vocab_size: usize,
    eos_tokens: Vec<u32>,
}

impl Guide {
    /// Sets every logit the grammar forbids to -inf. `allow_eos`: the
    /// model's end-of-sequence tokens may end the text where the grammar
    /// can end (once it is complete they are all that is left). Returns
    /// whether any token is left.
    pub fn mask(&mut self, logits: &mut [f32], allow_eos: bool) -> Result<bool, String> {
        let mut allowed: SimpleVob =
            self.matcher.compute_mask_or_eos().map_err(|e| format!("structured output: {e}"))?;
        if !allow_eos {
            for &t in &self.eos_tokens {
                allowed.disallow_token(t);
            }
        }
        let mut any = false;
        for (i, &word) in allowed.as_slice().iter().enumerate() {
            let base = i * 32;
            if base >= self.vocab_size {
                break;
            }
            let end = (base + 32).min(self.vocab_size).min(logits.len());
            // Most words are all one way: most tokens are forbidden at most
            // steps, and inside a string almost all are allowed.
            if word == 0 {
                logits[base..end].fill(f32::NEG_INFINITY);
                continue;
            }
            if word == u32::MAX && end - base == 32 {
                any = true;
                continue;
            }
            for (bit, logit) in logits[base..end].iter_mut().enumerate() {
                if word & (1 << bit) == 0 {
                    *logit = f32::NEG_INFINITY;
                } else {
                    any = true;
                }
            }
        }
        Ok(any)
    }

    /// Whether the grammar allows `token` now (a plugin's draw is checked).
    pub fn allows(&mut self, token: u32) -> Result<bool, String> {
        let allowed = self.matcher.compute_mask_or_eos().map_err(|e| format!("structured output: {e}"))?;
        Ok(allowed.is_allowed(token))
    }

    /// Moves the grammar past the sampled token.
    pub fn advance(&mut self, token: u32) -> Result<(), String> {
        self.matcher.consume_token(token).map_err(|e| format!("structured output: {e}"))
    }

    /// The grammar is complete and allows no further text: only an
    /// end-of-sequence token may follow.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// The model has end-of-sequence tokens to end a complete text with.
    pub fn has_eos(&self) -> bool {
        !self.eos_tokens.is_empty()
    }

    pub fn is_eos(&self, token: u32) -> bool {
        self.eos_tokens.contains(&token)
    }
}

#[cfg(test)]
mod tests;
