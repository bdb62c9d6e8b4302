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
#[derive(Clone)]
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

/// Reasoning switched on or off by a request's own field (Anthropic's
/// `thinking`, OpenAI's `reasoning_effort`, Ollama's `think`), added to its
/// template variables as the reasoning templates read it: `enable_thinking`
/// (Qwen3, Qwen3.5, GLM, llama.cpp's DeepSeek copies), `thinking`
/// (DeepSeek-V3.1+'s own templates) and, when an effort is named,
/// `reasoning_effort` (gpt-oss, DeepSeek-V4). A variable the request set
/// itself (`chat_template_kwargs`) is left as it is; a template that reads
/// none of them is unchanged.
pub(crate) fn with_thinking(vars: Option<String>, on: bool, effort: Option<&str>) -> Option<String> {
    let mut map = match &vars {
        None => serde_json::Map::new(),
        Some(text) => match serde_json::from_str::<serde_json::Value>(text) {
            Ok(serde_json::Value::Object(map)) => map,
            // Checked as an object when it was read: kept as it came.
            _ => return vars,
        },
    };
    for key in ["enable_thinking", "thinking"] {
        map.entry(key).or_insert(on.into());
    }
    if let Some(effort) = effort {
        map.entry("reasoning_effort").or_insert(effort.into());
    }
    Some(serde_json::Value::Object(map).to_string())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_requests_thinking_switch_becomes_the_templates_variables_unless_set() {
        assert_eq!(with_thinking(None, false, None).as_deref(), Some(r#"{"enable_thinking":false,"thinking":false}"#));
        assert_eq!(
            with_thinking(None, true, Some("high")).as_deref(),
            Some(r#"{"enable_thinking":true,"thinking":true,"reasoning_effort":"high"}"#)
        );
        // chat_template_kwargs win, in the client's order.
        assert_eq!(
            with_thinking(Some(r#"{"x":1,"enable_thinking":true}"#.into()), false, None).as_deref(),
            Some(r#"{"x":1,"enable_thinking":true,"thinking":false}"#)
        );
    }
}
