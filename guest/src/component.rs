//! The WIT glue: the only code that knows it runs inside a component. It
//! converts between the generated WIT types and the plain Rust logic.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use crate::generate::{self, GenerateParams, ModelHost};
use crate::sampling::SamplingParams;
use crate::tokenizer::Tokenizer;

wit_bindgen::generate!({ world: "engine", path: "../wit" });

use exports::waste::engine::control::{self, Completion, Guest, StopReason};
use waste::engine::model;

thread_local! {
    /// Parsed tokenizers, one per model handle: parsing a 160k-entry
    /// tokenizer.json takes far longer than one token step.
    static TOKENIZERS: RefCell<HashMap<u32, Rc<Tokenizer>>> = RefCell::new(HashMap::new());
}

/// The model's tokenizer; `Ok(None)` when the model ships none.
fn optional_tokenizer(handle: u32) -> Result<Option<Rc<Tokenizer>>, String> {
    if let Some(tok) = TOKENIZERS.with(|t| t.borrow().get(&handle).cloned()) {
        return Ok(Some(tok));
    }
    let Some(json) = model::tokenizer_json(handle) else { return Ok(None) };
    let tok = Rc::new(Tokenizer::from_json(&json).map_err(|e| format!("tokenizer.json: {e}"))?);
    TOKENIZERS.with(|t| t.borrow_mut().insert(handle, tok.clone()));
    Ok(Some(tok))
}

fn tokenizer(handle: u32) -> Result<Rc<Tokenizer>, String> {
    optional_tokenizer(handle)?
        .ok_or_else(|| "this model has no tokenizer (the checkpoint had no tokenizer.json)".to_string())
}

fn stats_from_wit(s: model::StepStats) -> generate::StepStats {
    generate::StepStats {
        experts_hit: s.experts_hit,
        experts_missed: s.experts_missed,
        bytes_read: s.bytes_read,
        ms_total: s.ms_total,
        ms_io: s.ms_io,
    }
}

fn stats_to_wit(s: generate::StepStats) -> model::StepStats {
    model::StepStats {
        experts_hit: s.experts_hit,
        experts_missed: s.experts_missed,
        bytes_read: s.bytes_read,
        ms_total: s.ms_total,
        ms_io: s.ms_io,
    }
}

/// The imports, seen through the loop's trait.
struct Imports {
    handle: u32,
}

impl ModelHost for Imports {
    fn evaluate(&mut self, tokens: &[u32]) -> Result<generate::Evaluation, String> {
        let e = model::evaluate(self.handle, tokens)?;
        Ok(generate::Evaluation { logits: e.logits, position: e.position, stats: stats_from_wit(e.stats) })
    }

    fn emit(&mut self, event: generate::TokenEvent) -> bool {
        model::emit_token(&model::TokenEvent {
            token: event.token,
            text: event.text,
            logprob: event.logprob,
            stats: stats_to_wit(event.stats),
        })
    }
}

struct Component;

impl Guest for Component {
    fn tokenize(handle: u32, text: String) -> Result<Vec<u32>, String> {
        Ok(tokenizer(handle)?.encode(&text))
    }

    fn tokenize_markup(handle: u32, text: String) -> Result<Vec<u32>, String> {
        Ok(tokenizer(handle)?.encode_markup(&text))
    }

    fn detokenize(handle: u32, tokens: Vec<u32>) -> Result<String, String> {
        tokenizer(handle)?.decode(&tokens).map_err(|e| e.to_string())
    }

    fn generate(handle: u32, prompt: Vec<u32>, params: control::SamplingParams) -> Result<Completion, String> {
        let info = model::info(handle)?;
        // A model without tokenizer files can still generate token ids.
        let tok = optional_tokenizer(handle)?;
        let params = GenerateParams {
            sampling: SamplingParams {
                temperature: params.temperature,
                top_k: params.top_k,
                top_p: params.top_p,
                seed: params.seed,
            },
            max_tokens: params.max_tokens,
            stop_at_eos: params.stop_at_eos,
        };
        let mut host = Imports { handle };
        let out = generate::generate(&mut host, tok.as_deref(), &info.eos_tokens, info.context_length, &prompt, &params)?;
        Ok(Completion {
            tokens: out.tokens,
            text: out.text,
            stop_reason: match out.stop_reason {
                generate::StopReason::Length => StopReason::Length,
                generate::StopReason::Eos => StopReason::Eos,
                generate::StopReason::Cancelled => StopReason::Cancelled,
                generate::StopReason::ContextFull => StopReason::ContextFull,
            },
        })
    }
}

export!(Component);
