//! Sessions: tokenizer, generation with a per-token callback, eval, state.

use std::ffi::{c_char, c_void};
use std::path::Path;
use std::sync::Arc;

use waste_host::{ChatMessage, Constraint, GenerateParams, Session, StopReason};

use crate::waste_result::{self, *};
use crate::{copy_out, guard, host, null, slice_arg, str_arg, waste_ctx, waste_model, ErrorSlot};

/// A UTF-8 string with an explicit length; `ptr` NULL = absent.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct waste_str {
    pub ptr: *const c_char,
    pub len: usize,
}

/// One message of a conversation for [`waste_session_apply_chat_template`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct waste_chat_message {
    pub role: waste_str,
    /// `ptr` NULL = no content field.
    pub content: waste_str,
    /// Further fields as a JSON object text; `ptr` NULL = none.
    pub extra: waste_str,
    /// The markup of each image in the message (as `waste_session_attach_image`
    /// returns it), rendered before the content: `n_media` strings (NULL when 0).
    pub media: *const waste_str,
    pub n_media: usize,
}

/// Sampling and stopping; fill with [`waste_generate_params_default`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct waste_generate_params {
    /// 0 = greedy.
    pub temperature: f32,
    pub top_k: u32,
    pub top_p: f32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub penalty_last_n: u32,
    pub seed: u64,
    pub max_tokens: u32,
    pub stop_at_eos: bool,
    /// Token ids that end the generation (`n_stop_tokens` of them).
    pub stop_tokens: *const u32,
    pub n_stop_tokens: usize,
    /// Strings that end the generation.
    pub stop_strings: *const waste_str,
    pub n_stop_strings: usize,
    /// Additive logit bias: `n_logit_bias` token ids and their biases.
    pub logit_bias_tokens: *const u32,
    pub logit_bias_values: *const f32,
    pub n_logit_bias: usize,
    /// Alternatives reported per token in the event, 0..=20.
    pub top_logprobs: u32,
    /// Structured output: a [`waste_constraint_kind`] value (a plain
    /// integer, so that a value this library does not know is an error, not
    /// undefined behaviour); `WASTE_CONSTRAINT_NONE` = unconstrained.
    pub constraint_kind: u32,
    /// The constraint's text: the JSON schema, the Lark or GBNF grammar, the
    /// regular expression; unused for NONE and JSON_OBJECT.
    pub constraint: waste_str,
}

/// What a structured output follows (`waste_generate_params.constraint_kind`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum waste_constraint_kind {
    WASTE_CONSTRAINT_NONE = 0,
    /// Any JSON object.
    WASTE_CONSTRAINT_JSON_OBJECT = 1,
    /// JSON valid against the JSON schema in `constraint`.
    WASTE_CONSTRAINT_JSON_SCHEMA = 2,
    /// llguidance's Lark syntax.
    WASTE_CONSTRAINT_LARK = 3,
    /// llama.cpp's GBNF, start rule `root`.
    WASTE_CONSTRAINT_GBNF = 4,
    /// A regular expression the whole output matches.
    WASTE_CONSTRAINT_REGEX = 5,
}

/// One alternative token and its log-probability under the raw distribution.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct waste_top_logprob {
    pub token: u32,
    pub logprob: f32,
}

/// One generated token, as the callback sees it; `text` lives only during
/// the call.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct waste_token_event {
    pub token: u32,
    pub text: *const c_char,
    pub text_len: usize,
    pub logprob: f32,
    /// Routed-expert picks of this token served by a record already in
    /// RAM, by one a router lookahead read, and read on demand.
    pub experts_reused: u32,
    pub experts_prefetched: u32,
    pub experts_missed: u32,
    pub bytes_read: u64,
    pub ms_total: f32,
    pub ms_io: f32,
    /// The `top_logprobs` most likely tokens at this step, most likely
    /// first (`n_top` of them); lives only during the call.
    pub top: *const waste_top_logprob,
    pub n_top: usize,
    /// Expert reads bypass the page cache (false: the file system refused
    /// direct I/O and reads are buffered).
    pub direct_io: bool,
}

/// Called once per generated token; return false to cancel.
pub type waste_token_callback =
    Option<unsafe extern "C" fn(user: *mut c_void, event: *const waste_token_event) -> bool>;

/// Why a generation stopped.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum waste_stop_reason {
    WASTE_STOP_LENGTH = 0,
    WASTE_STOP_EOS = 1,
    WASTE_STOP_CANCELLED = 2,
    WASTE_STOP_CONTEXT_FULL = 3,
    WASTE_STOP_STRING = 4,
    WASTE_STOP_TOKEN = 5,
    /// The structured output's grammar is complete.
    WASTE_STOP_GRAMMAR = 6,
}

/// The summary of a generation (the tokens and text went to the callback).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct waste_completion {
    pub n_tokens: usize,
    pub stop_reason: waste_stop_reason,
}

impl From<&GenerateParams> for waste_generate_params {
    /// The scalar fields; the lists (stop tokens and strings, logit bias)
    /// are left empty.
    fn from(d: &GenerateParams) -> Self {
        waste_generate_params {
            temperature: d.temperature,
            top_k: d.top_k,
            top_p: d.top_p,
            min_p: d.min_p,
            repetition_penalty: d.repetition_penalty,
            presence_penalty: d.presence_penalty,
            frequency_penalty: d.frequency_penalty,
            penalty_last_n: d.penalty_last_n,
            seed: d.seed,
            max_tokens: d.max_tokens,
            stop_at_eos: d.stop_at_eos,
            stop_tokens: std::ptr::null(),
            n_stop_tokens: 0,
            stop_strings: std::ptr::null(),
            n_stop_strings: 0,
            logit_bias_tokens: std::ptr::null(),
            logit_bias_values: std::ptr::null(),
            n_logit_bias: 0,
            top_logprobs: d.top_logprobs,
            constraint_kind: waste_constraint_kind::WASTE_CONSTRAINT_NONE as u32,
            constraint: waste_str { ptr: std::ptr::null(), len: 0 },
        }
    }
}

/// The caller's constraint, its text read and checked.
///
/// # Safety
/// `c.constraint` points at `len` bytes when `len` is non-zero.
unsafe fn constraint(c: &waste_generate_params) -> Result<Option<Constraint>, (waste_result, String)> {
    use waste_constraint_kind::*;
    let text = || -> Result<String, (waste_result, String)> {
        // SAFETY: the caller's pointer and length, per this function's contract.
        unsafe { str_arg("constraint", c.constraint.ptr, c.constraint.len) }.map(str::to_string)
    };
    Ok(match c.constraint_kind {
        k if k == WASTE_CONSTRAINT_NONE as u32 => None,
        k if k == WASTE_CONSTRAINT_JSON_OBJECT as u32 => Some(Constraint::JsonObject),
        k if k == WASTE_CONSTRAINT_JSON_SCHEMA as u32 => Some(Constraint::JsonSchema(text()?)),
        k if k == WASTE_CONSTRAINT_LARK as u32 => Some(Constraint::Lark(text()?)),
        k if k == WASTE_CONSTRAINT_GBNF as u32 => Some(Constraint::Gbnf(text()?)),
        k if k == WASTE_CONSTRAINT_REGEX as u32 => Some(Constraint::Regex(text()?)),
        k => return Err((WASTE_ARG, format!("constraint_kind {k} is not a waste_constraint_kind"))),
    })
}

/// The caller's parameters as the Rust API's, their lists read and checked
/// (NULL with a non-zero count, a stop string that is not UTF-8).
///
/// # Safety
/// Every pointer of `c` with a non-zero count points at that many elements.
unsafe fn generate_params(c: &waste_generate_params) -> Result<GenerateParams, (waste_result, String)> {
    // SAFETY: the caller's pointers and counts, per this function's contract.
    unsafe {
        let stop_strings = slice_arg("stop_strings", c.stop_strings, c.n_stop_strings)?
            .iter()
            .map(|w| str_arg("stop string", w.ptr, w.len).map(str::to_string))
            .collect::<Result<_, _>>()?;
        let ids = slice_arg("logit_bias_tokens", c.logit_bias_tokens, c.n_logit_bias)?;
        let vals = slice_arg("logit_bias_values", c.logit_bias_values, c.n_logit_bias)?;
        Ok(GenerateParams {
            temperature: c.temperature,
            top_k: c.top_k,
            top_p: c.top_p,
            min_p: c.min_p,
            repetition_penalty: c.repetition_penalty,
            presence_penalty: c.presence_penalty,
            frequency_penalty: c.frequency_penalty,
            penalty_last_n: c.penalty_last_n,
            logit_bias: ids.iter().copied().zip(vals.iter().copied()).collect(),
            top_logprobs: c.top_logprobs,
            seed: c.seed,
            max_tokens: c.max_tokens,
            stop_at_eos: c.stop_at_eos,
            stop_strings,
            stop_tokens: slice_arg("stop_tokens", c.stop_tokens, c.n_stop_tokens)?.to_vec(),
            constraint: constraint(c)?,
        })
    }
}

impl waste_token_event {
    /// The event as the callback sees it; `text` and `top` point into `e`
    /// and `top` (the event's alternatives), which outlive the call.
    fn new(e: &waste_host::TokenEvent, top: &[waste_top_logprob]) -> Self {
        let s = &e.stats;
        waste_token_event {
            token: e.token,
            text: e.text.as_ptr() as *const c_char,
            text_len: e.text.len(),
            logprob: e.logprob,
            experts_reused: s.experts_reused,
            experts_prefetched: s.experts_prefetched,
            experts_missed: s.experts_missed,
            bytes_read: s.bytes_read,
            ms_total: s.ms_total,
            ms_io: s.ms_io,
            top: top.as_ptr(),
            n_top: top.len(),
            direct_io: s.direct_io,
        }
    }
}

impl From<StopReason> for waste_stop_reason {
    fn from(r: StopReason) -> Self {
        match r {
            StopReason::Length => waste_stop_reason::WASTE_STOP_LENGTH,
            StopReason::Eos => waste_stop_reason::WASTE_STOP_EOS,
            StopReason::Cancelled => waste_stop_reason::WASTE_STOP_CANCELLED,
            StopReason::ContextFull => waste_stop_reason::WASTE_STOP_CONTEXT_FULL,
            StopReason::StopString => waste_stop_reason::WASTE_STOP_STRING,
            StopReason::StopToken => waste_stop_reason::WASTE_STOP_TOKEN,
            StopReason::Grammar => waste_stop_reason::WASTE_STOP_GRAMMAR,
        }
    }
}

/// One conversation with one model.
pub struct waste_session {
    pub(crate) session: Session,
    pub(crate) error: Arc<ErrorSlot>,
}

#[no_mangle]
pub unsafe extern "C" fn waste_generate_params_default(out: *mut waste_generate_params) -> waste_result {
    if out.is_null() {
        return WASTE_NULL_ARG;
    }
    let p = waste_generate_params::from(&GenerateParams::default());
    // SAFETY: checked non-NULL.
    unsafe { *out = p };
    WASTE_OK
}

/// A session on `model` (its own component instance and state).
#[no_mangle]
pub unsafe extern "C" fn waste_session_open(
    ctx: *const waste_ctx,
    model: *const waste_model,
    out: *mut *mut waste_session,
) -> waste_result {
    if ctx.is_null() {
        return WASTE_NULL_ARG;
    }
    // SAFETY: a non-NULL ctx is a live handle.
    let ctx = unsafe { &*ctx };
    guard(&ctx.error, || {
        if out.is_null() {
            return Err(null("out"));
        }
        // SAFETY: checked non-NULL.
        unsafe { *out = std::ptr::null_mut() };
        if model.is_null() {
            return Err(null("model"));
        }
        // SAFETY: a non-NULL model is a live handle.
        let model = unsafe { &*model };
        let session = ctx.engine.session(model.model.clone()).map_err(host)?;
        let s = Box::new(waste_session { session, error: ctx.error.clone() });
        // SAFETY: checked non-NULL.
        unsafe { *out = Box::into_raw(s) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn waste_session_close(session: *mut waste_session) {
    if !session.is_null() {
        // SAFETY: `session` came from waste_session_open and is closed once.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(unsafe { Box::from_raw(session) })));
    }
}

pub(crate) unsafe fn with_session(
    session: *mut waste_session,
    f: impl FnOnce(&mut Session) -> Result<(), (waste_result, String)>,
) -> waste_result {
    if session.is_null() {
        return WASTE_NULL_ARG;
    }
    // SAFETY: a non-NULL session is a live handle, used by one thread at a time.
    let s = unsafe { &mut *session };
    let error = s.error.clone();
    guard(&error, || f(&mut s.session))
}

pub(crate) fn check_out(out_len: *mut usize) -> Result<(), (waste_result, String)> {
    if out_len.is_null() {
        return Err(null("out_len"));
    }
    Ok(())
}

/// [`with_session`] for the calls whose result goes to the caller's buffer:
/// `out_len` is checked before `f` runs, so a NULL one fails before any work.
pub(crate) unsafe fn with_session_out<T: Copy, R: AsRef<[T]>>(
    session: *mut waste_session,
    buf: *mut T,
    cap: usize,
    out_len: *mut usize,
    f: impl FnOnce(&mut Session) -> Result<R, (waste_result, String)>,
) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe {
        with_session(session, |s| {
            check_out(out_len)?;
            let r = f(s)?;
            copy_out(r.as_ref(), buf, cap, out_len)
        })
    }
}

/// Text as plain content -> token ids. `*out_len` receives the count; a
/// buffer shorter than it gets `WASTE_BUFFER_TOO_SMALL` and nothing else.
#[no_mangle]
pub unsafe extern "C" fn waste_session_tokenize(
    session: *mut waste_session,
    text: *const c_char,
    text_len: usize,
    tokens: *mut u32,
    cap: usize,
    out_len: *mut usize,
) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe {
        with_session_out(session, tokens, cap, out_len, |s| s.tokenize(str_arg("text", text, text_len)?).map_err(host))
    }
}

/// Text as template markup (special-token strings become their ids).
#[no_mangle]
pub unsafe extern "C" fn waste_session_tokenize_markup(
    session: *mut waste_session,
    text: *const c_char,
    text_len: usize,
    tokens: *mut u32,
    cap: usize,
    out_len: *mut usize,
) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe {
        with_session_out(session, tokens, cap, out_len, |s| {
            s.tokenize_markup(str_arg("text", text, text_len)?).map_err(host)
        })
    }
}

/// Token ids -> UTF-8 text (not NUL-terminated; `*out_len` bytes).
#[no_mangle]
pub unsafe extern "C" fn waste_session_detokenize(
    session: *mut waste_session,
    tokens: *const u32,
    n_tokens: usize,
    text: *mut c_char,
    cap: usize,
    out_len: *mut usize,
) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe {
        with_session_out(session, text as *mut u8, cap, out_len, |s| {
            s.detokenize(slice_arg("tokens", tokens, n_tokens)?).map_err(host)
        })
    }
}

pub(crate) unsafe fn opt_str(name: &str, s: waste_str) -> Result<Option<String>, (waste_result, String)> {
    if s.ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: pointer and length from the caller.
    Ok(Some(unsafe { str_arg(name, s.ptr, s.len) }?.to_string()))
}

/// Chat messages given as an array of `n` (NULL allowed when empty).
pub(crate) unsafe fn messages_arg(
    messages: *const waste_chat_message,
    n: usize,
) -> Result<Vec<ChatMessage>, (waste_result, String)> {
    let mut msgs = Vec::new();
    // SAFETY: pointer and length from the caller.
    for m in unsafe { slice_arg("messages", messages, n) }? {
        // SAFETY: each waste_str is pointer and length from the caller.
        let role = unsafe { opt_str("role", m.role) }?.ok_or_else(|| null("role"))?;
        // SAFETY: pointer and length from the caller.
        let media = unsafe { slice_arg("media", m.media, m.n_media) }?
            .iter()
            // SAFETY: each waste_str is pointer and length from the caller.
            .map(|t| unsafe { opt_str("media", *t) }?.ok_or_else(|| null("media")))
            .collect::<Result<Vec<_>, _>>()?;
        msgs.push(ChatMessage {
            role,
            // SAFETY: as above.
            content: unsafe { opt_str("content", m.content) }?,
            // SAFETY: as above.
            extra: unsafe { opt_str("extra", m.extra) }?,
            media,
        });
    }
    Ok(msgs)
}

/// The messages, `tools` and `vars` of a chat-template call.
pub(crate) type ChatArgs = (Vec<ChatMessage>, Option<String>, Option<String>);

/// The arguments every chat-template call converts: the messages, `tools`
/// and `vars` (`ptr` NULL = none).
pub(crate) unsafe fn chat_args(
    messages: *const waste_chat_message,
    n_messages: usize,
    tools: waste_str,
    vars: waste_str,
) -> Result<ChatArgs, (waste_result, String)> {
    // SAFETY: pointers and lengths from the caller.
    unsafe { Ok((messages_arg(messages, n_messages)?, opt_str("tools", tools)?, opt_str("vars", vars)?)) }
}

/// An absent optional string, for the calls without template variables.
const NO_STR: waste_str = waste_str { ptr: std::ptr::null(), len: 0 };

/// The conversation through the model's chat template, as prompt tokens.
/// `tools`: a JSON array of tool definitions, `ptr` NULL = none.
#[no_mangle]
pub unsafe extern "C" fn waste_session_apply_chat_template(
    session: *mut waste_session,
    messages: *const waste_chat_message,
    n_messages: usize,
    tools: waste_str,
    add_generation_prompt: bool,
    tokens: *mut u32,
    cap: usize,
    out_len: *mut usize,
) -> waste_result {
    // SAFETY: forwarded caller pointers; no variables is the same call.
    unsafe {
        waste_session_apply_chat_template_vars(
            session,
            messages,
            n_messages,
            tools,
            add_generation_prompt,
            NO_STR,
            tokens,
            cap,
            out_len,
        )
    }
}

/// [`waste_session_apply_chat_template`] with further template variables:
/// `vars` is a JSON object text such as `{"enable_thinking": false}`, `ptr`
/// NULL = none. Not an object, or one naming `messages`, `tools` or
/// `add_generation_prompt`, is `WASTE_ARG`. A separate function so that
/// callers of the one without variables keep working unchanged.
#[no_mangle]
pub unsafe extern "C" fn waste_session_apply_chat_template_vars(
    session: *mut waste_session,
    messages: *const waste_chat_message,
    n_messages: usize,
    tools: waste_str,
    add_generation_prompt: bool,
    vars: waste_str,
    tokens: *mut u32,
    cap: usize,
    out_len: *mut usize,
) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe {
        with_session_out(session, tokens, cap, out_len, |s| {
            let (msgs, tools, vars) = chat_args(messages, n_messages, tools, vars)?;
            s.apply_chat_template_with_vars(&msgs, tools.as_deref(), add_generation_prompt, vars.as_deref())
                .map_err(host)
        })
    }
}

/// The caller's callback and `user` pointer, moved into the engine's
/// `Send + 'static` token hook.
struct Callback {
    f: unsafe extern "C" fn(*mut c_void, *const waste_token_event) -> bool,
    user: *mut c_void,
}

// SAFETY: the hook runs on the thread that called waste_session_generate,
// during that call; the caller's `user` is used where it was given.
unsafe impl Send for Callback {}

/// Continues from the session's state with `prompt`; `params` NULL = the
/// defaults; `callback` (may be NULL) sees each token and returns false to
/// cancel, in which case the result is `WASTE_CANCELLED` and `out` (may be
/// NULL) still describes what was generated.
#[no_mangle]
pub unsafe extern "C" fn waste_session_generate(
    session: *mut waste_session,
    prompt: *const u32,
    n_prompt: usize,
    params: *const waste_generate_params,
    callback: waste_token_callback,
    user: *mut c_void,
    out: *mut waste_completion,
) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe {
        with_session(session, |s| {
            let prompt = slice_arg("prompt", prompt, n_prompt)?;
            let p = if params.is_null() { GenerateParams::default() } else { generate_params(&*params)? };
            let cb = callback.map(|f| Callback { f, user });
            let hook = move |e: &waste_host::TokenEvent| -> bool {
                let Some(cb) = &cb else { return true };
                let top: Vec<waste_top_logprob> =
                    e.top_logprobs.iter().map(|&(token, logprob)| waste_top_logprob { token, logprob }).collect();
                let ev = waste_token_event::new(e, &top);
                // The enclosing unsafe block covers this call: the caller's
                // function, given its own `user`; `ev` lives for the call.
                (cb.f)(cb.user, &ev)
            };
            let c = s.generate(prompt, &p, hook).map_err(host)?;
            let reason = waste_stop_reason::from(c.stop_reason);
            if !out.is_null() {
                *out = waste_completion { n_tokens: c.tokens.len(), stop_reason: reason };
            }
            if reason == waste_stop_reason::WASTE_STOP_CANCELLED {
                return Err((WASTE_CANCELLED, format!("cancelled by the callback after {} tokens", c.tokens.len())));
            }
            Ok(())
        })
    }
}

/// Evaluates `tokens` on top of the state and writes raw logits (the last
/// position's `vocab_size` floats, or every position's with
/// `all_positions`), for hosts that sample themselves.
#[no_mangle]
pub unsafe extern "C" fn waste_session_eval(
    session: *mut waste_session,
    tokens: *const u32,
    n_tokens: usize,
    all_positions: bool,
    logits: *mut f32,
    cap: usize,
    out_len: *mut usize,
) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe {
        with_session_out(session, logits, cap, out_len, |s| {
            let (l, _) = s.eval(slice_arg("tokens", tokens, n_tokens)?, all_positions).map_err(host)?;
            Ok(l)
        })
    }
}

/// Perplexity of `text` in windows of `window` tokens (0 = the context).
#[no_mangle]
pub unsafe extern "C" fn waste_session_perplexity(
    session: *mut waste_session,
    text: *const c_char,
    text_len: usize,
    window: usize,
    perplexity: *mut f64,
) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe {
        with_session(session, |s| {
            if perplexity.is_null() {
                return Err(null("perplexity"));
            }
            let r = s.perplexity(str_arg("text", text, text_len)?, (window != 0).then_some(window)).map_err(host)?;
            *perplexity = r.perplexity();
            Ok(())
        })
    }
}

/// Writes the whole conversation to the file at `path`.
#[no_mangle]
pub unsafe extern "C" fn waste_session_save_state(
    session: *mut waste_session,
    path: *const c_char,
    path_len: usize,
) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe { with_session(session, |s| s.save_state(Path::new(str_arg("path", path, path_len)?)).map_err(host)) }
}

/// Replaces the conversation with one saved for the same model.
#[no_mangle]
pub unsafe extern "C" fn waste_session_load_state(
    session: *mut waste_session,
    path: *const c_char,
    path_len: usize,
) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe { with_session(session, |s| s.load_state(Path::new(str_arg("path", path, path_len)?)).map_err(host)) }
}

/// Forgets the conversation (position 0).
#[no_mangle]
pub unsafe extern "C" fn waste_session_reset(session: *mut waste_session) -> waste_result {
    // SAFETY: forwarded caller pointer.
    unsafe {
        with_session(session, |s| {
            s.reset();
            Ok(())
        })
    }
}

/// Tokens held in the session's state.
#[no_mangle]
pub unsafe extern "C" fn waste_session_position(session: *mut waste_session, position: *mut usize) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe {
        with_session(session, |s| {
            if position.is_null() {
                return Err(null("position"));
            }
            *position = s.position();
            Ok(())
        })
    }
}

/// The conversation through the model's chat template, as UTF-8 text (not
/// NUL-terminated; `*out_len` bytes), as transformers'
/// `apply_chat_template(..., tokenize=False)` returns it.
#[no_mangle]
pub unsafe extern "C" fn waste_session_render_chat_template(
    session: *mut waste_session,
    messages: *const waste_chat_message,
    n_messages: usize,
    tools: waste_str,
    add_generation_prompt: bool,
    text: *mut c_char,
    cap: usize,
    out_len: *mut usize,
) -> waste_result {
    // SAFETY: forwarded caller pointers; no variables is the same call.
    unsafe {
        waste_session_render_chat_template_vars(
            session,
            messages,
            n_messages,
            tools,
            add_generation_prompt,
            NO_STR,
            text,
            cap,
            out_len,
        )
    }
}

/// [`waste_session_render_chat_template`] with further template variables
/// (see [`waste_session_apply_chat_template_vars`]).
#[no_mangle]
pub unsafe extern "C" fn waste_session_render_chat_template_vars(
    session: *mut waste_session,
    messages: *const waste_chat_message,
    n_messages: usize,
    tools: waste_str,
    add_generation_prompt: bool,
    vars: waste_str,
    text: *mut c_char,
    cap: usize,
    out_len: *mut usize,
) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe {
        with_session_out(session, text as *mut u8, cap, out_len, |s| {
            let (msgs, tools, vars) = chat_args(messages, n_messages, tools, vars)?;
            s.render_chat_template_with_vars(&msgs, tools.as_deref(), add_generation_prompt, vars.as_deref())
                .map_err(host)
        })
    }
}

/// Every token of the conversation so far, in order (the last generated
/// token included, though only the next call evaluates it): a chat host
/// compares it with a new rendering to send only what is new.
#[no_mangle]
pub unsafe extern "C" fn waste_session_tokens(
    session: *mut waste_session,
    tokens: *mut u32,
    cap: usize,
    out_len: *mut usize,
) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe { with_session_out(session, tokens, cap, out_len, |s| Ok(s.tokens())) }
}
