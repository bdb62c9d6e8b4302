//! What every API dialect shares, in no dialect's shape: a request body
//! read field by field (`fields`), the prompt the engine thread renders
//! (`Prompt`, with its inline `images`), the seed of a request that gives
//! none, the reading of a finished answer for reasoning and tool calls
//! (`answer`), and the error of an engine thread that went away. A
//! dialect's folder words and shapes these; it does not redo them.

pub(crate) mod answer;
pub(crate) mod fields;
pub(crate) mod images;

use waste_host::ChatMessage;

use crate::error::ApiError;
use images::Images;

/// What the engine thread turns into prompt tokens, whichever API asked.
pub enum Prompt {
    Chat {
        messages: Vec<ChatMessage>,
        tools: Option<String>,
        /// `chat_template_kwargs` (as vLLM and llama.cpp's server accept it):
        /// further template variables as a JSON object text.
        template_vars: Option<String>,
        /// The images of the messages, in order (their markup is in the
        /// messages' `media`).
        images: Images,
    },
    Text(String),
}

/// A seed for a request that gives none: different per request, as
/// OpenAI's sampling is.
pub(crate) fn fresh_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    nanos ^ COUNTER.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The engine thread ended a request without a last event (it stopped or
/// panicked): every dialect answers it as this one 500.
pub(crate) fn engine_dropped() -> ApiError {
    ApiError::internal("the engine thread dropped the request")
}
