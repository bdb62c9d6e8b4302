//! The WIT glue: the only code that knows it runs inside a component. It
//! converts between the generated WIT types and the plain Rust logic.

use std::cell::OnceCell;
use std::rc::Rc;

use crate::chat::{self, ChatMessage, ChatTemplate};
use crate::constraint::{Constraint, Guide, Vocabulary};
use crate::generate::{self, GenerateParams, ModelHost};
use crate::sampling::SamplingParams;
use crate::tokenizer::Tokenizer;
use crate::tool_grammar::{self, ToolGrammarError};

wit_bindgen::generate!({ world: "engine", path: "../wit" });

use exports::waste::engine::control::{self, Completion, Error, Guest, StopReason, TokenLogprobs};
use waste::engine::model;

thread_local! {
    /// The parsed tokenizer (`None`: the model ships none): parsing a
    /// 160k-entry tokenizer.json takes far longer than one token step.
    static TOKENIZER: OnceCell<Option<Rc<Tokenizer>>> = const { OnceCell::new() };
    /// The chat templates the host chose, parsed once each: without tools
    /// (index 0) and with (index 1).
    static TEMPLATES: [OnceCell<Rc<ChatTemplate>>; 2] = const { [OnceCell::new(), OnceCell::new()] };
    /// The vocabulary as structured output's grammars see it, built by the
    /// first constrained generation (every token decoded and indexed).
    static VOCABULARY: OnceCell<Rc<Vocabulary>> = const { OnceCell::new() };
}

/// The compiled constraint of `params`, if it has one; a malformed or
/// unsatisfiable grammar is `invalid-argument`.
fn guide(params: &control::SamplingParams, info: &model::ModelInfo) -> Result<Option<Guide>, Error> {
    let Some(constraint) = &params.constraint else { return Ok(None) };
    let vocabulary = match VOCABULARY.with(|v| v.get().cloned()) {
        Some(v) => v,
        None => {
            let tok = optional_tokenizer()?.ok_or_else(|| {
                Error::Unsupported("structured output needs the model's tokenizer, and this model has none".into())
            })?;
            let v = Rc::new(Vocabulary::new(&tok, info.vocab_size, &info.eos_tokens).map_err(Error::Failed)?);
            VOCABULARY.with(|cell| cell.get_or_init(|| v.clone()).clone())
        }
    };
    let constraint = match constraint {
        control::Constraint::JsonObject => Constraint::JsonObject,
        control::Constraint::JsonSchema(s) => Constraint::JsonSchema(s.clone()),
        control::Constraint::Lark(s) => Constraint::Lark(s.clone()),
        control::Constraint::Gbnf(s) => Constraint::Gbnf(s.clone()),
        control::Constraint::Regex(s) => Constraint::Regex(s.clone()),
        control::Constraint::ToolCall(t) => {
            let template = chat_template(true)?;
            let tok = tokenizer()?;
            let lark =
                tool_grammar::lark(&template, &tok, &info.eos_tokens, &t.tools, t.name.as_deref(), t.vars.as_deref())
                    .map_err(|e| match e {
                    ToolGrammarError::Invalid(m) => Error::InvalidArgument(m),
                    ToolGrammarError::Unsupported(m) => Error::Unsupported(m),
                })?;
            Constraint::Lark(lark)
        }
    };
    vocabulary.compile(&constraint).map(Some).map_err(Error::InvalidArgument)
}

/// The model's tokenizer; `Ok(None)` when the model ships none.
fn optional_tokenizer() -> Result<Option<Rc<Tokenizer>>, Error> {
    if let Some(tok) = TOKENIZER.with(|t| t.get().cloned()) {
        return Ok(tok);
    }
    let files = model::tokenizer_files();
    let tok = Tokenizer::from_files(&files).map_err(|e| Error::Failed(e.to_string()))?.map(Rc::new);
    TOKENIZER.with(|t| t.get_or_init(|| tok.clone()).clone());
    Ok(tok)
}

/// The chat template the host chose for a conversation with or without
/// tools, parsed once.
fn chat_template(with_tools: bool) -> Result<Rc<ChatTemplate>, Error> {
    let i = usize::from(with_tools);
    if let Some(t) = TEMPLATES.with(|t| t[i].get().cloned()) {
        return Ok(t);
    }
    let source = model::chat_template(with_tools).map_err(Error::ChatTemplate)?.ok_or_else(|| {
        Error::ChatTemplate(
            "this model has no chat template (neither chat_template.jinja nor a chat_template in tokenizer_config.json); \
             encode the prompt yourself with tokenize / tokenize-markup"
                .to_string(),
        )
    })?;
    let files = model::tokenizer_files();
    let config = files.iter().find(|(n, _)| n == "tokenizer_config.json").map(|(_, b)| b.as_slice());
    let config = config
        .map(std::str::from_utf8)
        .transpose()
        .map_err(|_| Error::ChatTemplate("tokenizer_config.json: not UTF-8".into()))?;
    let t = Rc::new(ChatTemplate::new(source, config).map_err(Error::ChatTemplate)?);
    TEMPLATES.with(|m| m[i].get_or_init(|| t.clone()).clone());
    Ok(t)
}

fn chat_messages(messages: Vec<control::ChatMessage>) -> Vec<ChatMessage> {
    messages
        .into_iter()
        .map(|m| ChatMessage { role: m.role, content: m.content, extra: m.extra, media: m.media })
        .collect()
}

fn tokenizer() -> Result<Rc<Tokenizer>, Error> {
    optional_tokenizer()?.ok_or_else(|| {
        Error::Unsupported("this model has no tokenizer (the checkpoint had no tokenizer.json)".to_string())
    })
}

impl From<model::StepStats> for generate::StepStats {
    fn from(s: model::StepStats) -> Self {
        let model::StepStats {
            experts_reused,
            experts_prefetched,
            experts_missed,
            bytes_read,
            ms_total,
            ms_io,
            direct_io,
        } = s;
        generate::StepStats {
            experts_reused,
            experts_prefetched,
            experts_missed,
            bytes_read,
            ms_total,
            ms_io,
            direct_io,
        }
    }
}

impl From<generate::StepStats> for model::StepStats {
    fn from(s: generate::StepStats) -> Self {
        let generate::StepStats {
            experts_reused,
            experts_prefetched,
            experts_missed,
            bytes_read,
            ms_total,
            ms_io,
            direct_io,
        } = s;
        model::StepStats { experts_reused, experts_prefetched, experts_missed, bytes_read, ms_total, ms_io, direct_io }
    }
}

impl From<generate::TokenEvent> for model::TokenEvent {
    fn from(e: generate::TokenEvent) -> Self {
        model::TokenEvent {
            token: e.token,
            text: e.text,
            logprob: e.logprob,
            top_logprobs: top_to_wit(&e.top_logprobs),
            stats: e.stats.into(),
        }
    }
}

impl From<control::SamplingParams> for GenerateParams {
    fn from(p: control::SamplingParams) -> Self {
        GenerateParams {
            sampling: SamplingParams {
                temperature: p.temperature,
                top_k: p.top_k,
                top_p: p.top_p,
                min_p: p.min_p,
                repetition_penalty: p.repetition_penalty,
                presence_penalty: p.presence_penalty,
                frequency_penalty: p.frequency_penalty,
                penalty_last_n: p.penalty_last_n,
                logit_bias: p.logit_bias,
                top_logprobs: p.top_logprobs,
                seed: p.seed,
            },
            max_tokens: p.max_tokens,
            stop_at_eos: p.stop_at_eos,
            stop_strings: p.stop_strings,
            stop_tokens: p.stop_tokens,
            use_plugin: p.plugin,
        }
    }
}

impl From<generate::StopReason> for StopReason {
    fn from(r: generate::StopReason) -> Self {
        match r {
            generate::StopReason::Length => StopReason::Length,
            generate::StopReason::Eos => StopReason::Eos,
            generate::StopReason::Cancelled => StopReason::Cancelled,
            generate::StopReason::ContextFull => StopReason::ContextFull,
            generate::StopReason::StopString => StopReason::StopString,
            generate::StopReason::StopToken => StopReason::StopToken,
            generate::StopReason::Grammar => StopReason::Grammar,
        }
    }
}

/// The imports, seen through the loop's trait.
struct Imports;

impl ModelHost for Imports {
    fn evaluate(&mut self, tokens: &[u32]) -> Result<generate::Evaluation, String> {
        let e = model::evaluate(tokens)?;
        Ok(generate::Evaluation { logits: e.logits, position: e.position, stats: e.stats.into() })
    }

    fn emit(&mut self, event: generate::TokenEvent) -> bool {
        model::emit_token(&event.into())
    }

    fn recent_tokens(&mut self, n: u32) -> Vec<u32> {
        model::recent_tokens(n)
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
    fn tokenize(text: String) -> Result<Vec<u32>, Error> {
        Ok(tokenizer()?.encode(&text))
    }

    fn tokenize_markup(text: String) -> Result<Vec<u32>, Error> {
        Ok(tokenizer()?.encode_markup(&text))
    }

    /// An id is refused only when neither side has it: the model's padding
    /// rows (past the tokenizer) decode to nothing, and a tokenizer wider
    /// than the model (a test container's) still decodes its own ids.
    fn detokenize(tokens: Vec<u32>) -> Result<String, Error> {
        let tk = tokenizer()?;
        let vocab_size = model::info().vocab_size;
        if let Some(&bad) = tokens.iter().find(|&&t| t >= vocab_size && !tk.knows(t)) {
            return Err(Error::InvalidArgument(format!(
                "token id {bad} is outside the vocabulary of {vocab_size} and not one of the tokenizer's"
            )));
        }
        tk.decode(&tokens).map_err(|e| Error::Failed(e.to_string()))
    }

    fn apply_chat_template(
        messages: Vec<control::ChatMessage>,
        tools: Option<String>,
        add_generation_prompt: bool,
        vars: Option<String>,
    ) -> Result<Vec<u32>, Error> {
        chat::check_vars(vars.as_deref()).map_err(Error::InvalidArgument)?;
        let template = chat_template(tools.is_some())?;
        let tok = tokenizer()?;
        let segments = template
            .render_segments_with_vars(
                &chat_messages(messages),
                tools.as_deref(),
                add_generation_prompt,
                vars.as_deref(),
            )
            .map_err(Error::ChatTemplate)?;
        Ok(tok.encode_segments(&segments))
    }

    fn render_chat_template(
        messages: Vec<control::ChatMessage>,
        tools: Option<String>,
        add_generation_prompt: bool,
        vars: Option<String>,
    ) -> Result<String, Error> {
        chat::check_vars(vars.as_deref()).map_err(Error::InvalidArgument)?;
        chat_template(tools.is_some())?
            .render_with_vars(&chat_messages(messages), tools.as_deref(), add_generation_prompt, vars.as_deref())
            .map_err(Error::ChatTemplate)
    }

    fn check_params(params: control::SamplingParams) -> Result<(), Error> {
        let info = model::info();
        guide(&params, &info)?;
        generate::validate(&GenerateParams::from(params), info.vocab_size).map_err(Error::InvalidArgument)
    }

    fn generate(prompt: Vec<u32>, params: control::SamplingParams) -> Result<Completion, Error> {
        let info = model::info();
        // A model without tokenizer files can still generate token ids.
        let tok = optional_tokenizer()?;
        let mut guide = guide(&params, &info)?;
        let params = GenerateParams::from(params);
        generate::validate(&params, info.vocab_size).map_err(Error::InvalidArgument)?;
        let out = generate::generate(
            &mut Imports,
            tok.as_deref(),
            &info.eos_tokens,
            info.vocab_size,
            info.context_length,
            &prompt,
            &params,
            guide.as_mut(),
        )
        .map_err(Error::Failed)?;
        let logprobs = out
            .logprobs
            .iter()
            .zip(&out.top_logprobs)
            .map(|(&logprob, top)| TokenLogprobs { logprob, top: top_to_wit(top) })
            .collect();
        Ok(Completion { tokens: out.tokens, text: out.text, stop_reason: out.stop_reason.into(), logprobs })
    }
}

export!(Component);
