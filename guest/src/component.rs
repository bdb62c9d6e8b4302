//! The WIT glue: the only code that knows it runs inside a component. It
//! converts between the generated WIT types and the plain Rust logic.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use crate::chat::{ChatMessage, ChatTemplate};
use crate::generate::{self, GenerateParams, ModelHost};
use crate::sampling::SamplingParams;
use crate::tokenizer::Tokenizer;

wit_bindgen::generate!({ world: "engine", path: "../wit" });

use exports::waste::engine::control::{self, Completion, GenerateError, Guest, StopReason, TokenLogprobs};
use waste::engine::model;

thread_local! {
    /// Parsed tokenizers, one per model handle: parsing a 160k-entry
    /// tokenizer.json takes far longer than one token step.
    static TOKENIZERS: RefCell<HashMap<u32, Rc<Tokenizer>>> = RefCell::new(HashMap::new());
    static TEMPLATES: RefCell<HashMap<u32, Rc<ChatTemplate>>> = RefCell::new(HashMap::new());
}

/// The model's tokenizer; `Ok(None)` when the model ships none.
fn optional_tokenizer(handle: u32) -> Result<Option<Rc<Tokenizer>>, String> {
    if let Some(tok) = TOKENIZERS.with(|t| t.borrow().get(&handle).cloned()) {
        return Ok(Some(tok));
    }
    let files = model::tokenizer_files(handle);
    let Some(tok) = Tokenizer::from_files(&files).map_err(|e| e.to_string())? else { return Ok(None) };
    let tok = Rc::new(tok);
    TOKENIZERS.with(|t| t.borrow_mut().insert(handle, tok.clone()));
    Ok(Some(tok))
}

/// The model's chat template, parsed once per handle.
fn chat_template(handle: u32) -> Result<Rc<ChatTemplate>, String> {
    if let Some(t) = TEMPLATES.with(|t| t.borrow().get(&handle).cloned()) {
        return Ok(t);
    }
    let files = model::tokenizer_files(handle);
    let t = ChatTemplate::from_files(&files)?.ok_or_else(|| {
        "this model has no chat template (neither chat_template.jinja nor a chat_template in tokenizer_config.json); \
         encode the prompt yourself with tokenize / tokenize-markup"
            .to_string()
    })?;
    let t = Rc::new(t);
    TEMPLATES.with(|m| m.borrow_mut().insert(handle, t.clone()));
    Ok(t)
}

fn chat_messages(messages: Vec<control::ChatMessage>) -> Vec<ChatMessage> {
    messages.into_iter().map(|m| ChatMessage { role: m.role, content: m.content, extra: m.extra }).collect()
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
        direct_io: s.direct_io,
    }
}

fn stats_to_wit(s: generate::StepStats) -> model::StepStats {
    model::StepStats {
        experts_hit: s.experts_hit,
        experts_missed: s.experts_missed,
        bytes_read: s.bytes_read,
        ms_total: s.ms_total,
        ms_io: s.ms_io,
        direct_io: s.direct_io,
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
            top_logprobs: top_to_wit(&event.top_logprobs),
            stats: stats_to_wit(event.stats),
        })
    }

    fn recent_tokens(&mut self, n: u32) -> Vec<u32> {
        model::recent_tokens(self.handle, n)
    }

    fn plugin_sample(&mut self, logits: &[f32], recent: &[u32]) -> Result<u32, String> {
        model::sample_with_plugin(logits, recent)
    }
}

fn top_to_wit(top: &[(u32, f32)]) -> Vec<model::TopLogprob> {
    top.iter().map(|&(token, logprob)| model::TopLogprob { token, logprob }).collect()
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

    fn apply_chat_template(
        handle: u32,
        messages: Vec<control::ChatMessage>,
        tools: Option<String>,
        add_generation_prompt: bool,
        vars: Option<String>,
    ) -> Result<Vec<u32>, String> {
        let template = chat_template(handle)?;
        let tok = tokenizer(handle)?;
        let segments = template.render_segments_with_vars(
            &chat_messages(messages),
            tools.as_deref(),
            add_generation_prompt,
            vars.as_deref(),
        )?;
        Ok(tok.encode_segments(&segments))
    }

    fn render_chat_template(
        handle: u32,
        messages: Vec<control::ChatMessage>,
        tools: Option<String>,
        add_generation_prompt: bool,
        vars: Option<String>,
    ) -> Result<String, String> {
        chat_template(handle)?.render_with_vars(
            &chat_messages(messages),
            tools.as_deref(),
            add_generation_prompt,
            vars.as_deref(),
        )
    }

    fn generate(handle: u32, prompt: Vec<u32>, params: control::SamplingParams) -> Result<Completion, GenerateError> {
        let info = model::info(handle).map_err(GenerateError::Failed)?;
        // A model without tokenizer files can still generate token ids.
        let tok = optional_tokenizer(handle).map_err(GenerateError::Failed)?;
        let params = GenerateParams {
            sampling: SamplingParams {
                temperature: params.temperature,
                top_k: params.top_k,
                top_p: params.top_p,
                min_p: params.min_p,
                repetition_penalty: params.repetition_penalty,
                presence_penalty: params.presence_penalty,
                frequency_penalty: params.frequency_penalty,
                penalty_last_n: params.penalty_last_n,
                logit_bias: params.logit_bias,
                top_logprobs: params.top_logprobs,
                seed: params.seed,
            },
            max_tokens: params.max_tokens,
            stop_at_eos: params.stop_at_eos,
            stop_strings: params.stop_strings,
            stop_tokens: params.stop_tokens,
            use_plugin: params.plugin,
        };
        generate::validate(&params, info.vocab_size).map_err(GenerateError::InvalidArgument)?;
        let mut host = Imports { handle };
        let out = generate::generate(
            &mut host,
            tok.as_deref(),
            &info.eos_tokens,
            info.vocab_size,
            info.context_length,
            &prompt,
            &params,
        )
        .map_err(GenerateError::Failed)?;
        let logprobs = out
            .logprobs
            .iter()
            .zip(&out.top_logprobs)
            .map(|(&logprob, top)| TokenLogprobs { logprob, top: top_to_wit(top) })
            .collect();
        Ok(Completion {
            tokens: out.tokens,
            text: out.text,
            stop_reason: match out.stop_reason {
                generate::StopReason::Length => StopReason::Length,
                generate::StopReason::Eos => StopReason::Eos,
                generate::StopReason::Cancelled => StopReason::Cancelled,
                generate::StopReason::ContextFull => StopReason::ContextFull,
                generate::StopReason::StopString => StopReason::StopString,
                generate::StopReason::StopToken => StopReason::StopToken,
            },
            logprobs,
        })
    }
}

export!(Component);
