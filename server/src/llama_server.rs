//! llama-server's own routes, which clients set up for it call besides the
//! OpenAI API: `/tokenize`, `/detokenize`, `/apply-template` and `/props`,
//! in llama-server's shapes (tools/server/README.md of llama.cpp). Errors
//! are OpenAI's shape, as llama-server answers them.
//!
//! The first three use the engine thread's session (the tokenizer and the
//! template renderer live in the control component), so they queue behind
//! running generations as Anthropic's count_tokens does; `/props` reads
//! only what the server holds and answers at once.

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::neutral::fields::{bad, boolean, field, object};
use crate::neutral::Prompt;
use crate::openai::request;
use crate::state::{read_body, Shared};
use crate::worker::host_error;

/// `POST /tokenize {"content", "add_special"?, "parse_special"?,
/// "with_pieces"?}`: `{"tokens": [id, ...]}`, or with pieces
/// `{"tokens": [{"id", "piece"}, ...]}`. `add_special` (default false)
/// puts the model's BOS token first; `parse_special` (default true) reads
/// special-token text in `content` as those tokens, as llama-server does.
/// A piece is the token's text as the tokenizer decodes it alone (a token
/// that is part of a UTF-8 character decodes to U+FFFD, where llama-server
/// gives its bytes).
pub(crate) async fn tokenize(State(state): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    let run = async {
        let bytes = read_body(&state, &headers, body).await?;
        let o = object(&bytes)?;
        let content = match field(&o, "content") {
            Some(Value::String(s)) => s.clone(),
            _ => return Err(bad("content", "a string")),
        };
        let add_special = boolean(&o, "add_special")?;
        let parse_special = field(&o, "parse_special").is_none() || boolean(&o, "parse_special")?;
        let with_pieces = boolean(&o, "with_pieces")?;
        let bos = state.model.info().bos_token.filter(|_| add_special);
        state
            .worker
            .call(move |session| {
                let mut tokens: Vec<u32> = bos.into_iter().collect();
                let text = if parse_special { session.tokenize_markup(&content) } else { session.tokenize(&content) };
                tokens.extend(text.map_err(host_error)?);
                if !with_pieces {
                    return Ok(json!({"tokens": tokens}));
                }
                let pieces = tokens
                    .iter()
                    .map(|&id| Ok(json!({"id": id, "piece": session.detokenize(&[id]).map_err(host_error)?})))
                    .collect::<Result<Vec<Value>, ApiError>>()?;
                Ok(json!({"tokens": pieces}))
            })
            .await
    };
    answer(run.await)
}

/// `POST /detokenize {"tokens": [id, ...]}`: `{"content": text}`. An id
/// outside the vocabulary is a 400 naming it.
pub(crate) async fn detokenize(State(state): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    let run = async {
        let bytes = read_body(&state, &headers, body).await?;
        let o = object(&bytes)?;
        let Some(Value::Array(list)) = field(&o, "tokens") else { return Err(bad("tokens", "a list of token ids")) };
        let vocab = state.model.info().vocab_size;
        let tokens = list
            .iter()
            .enumerate()
            .map(|(i, t)| match t.as_u64() {
                Some(id) if id < vocab as u64 => Ok(id as u32),
                _ => Err(bad(&format!("tokens[{i}]"), &format!("a token id below the vocabulary's {vocab}"))),
            })
            .collect::<Result<Vec<u32>, ApiError>>()?;
        state.worker.call(move |session| Ok(json!({"content": session.detokenize(&tokens).map_err(host_error)?}))).await
    };
    answer(run.await)
}

/// `POST /apply-template` with a chat completion's body (`messages`,
/// `tools`, `chat_template_kwargs`): `{"prompt": text}`, the conversation
/// rendered through the chat template with the generation prompt, exactly
/// as `/v1/chat/completions` would evaluate it.
pub(crate) async fn apply_template(State(state): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    let run = async {
        let bytes = read_body(&state, &headers, body).await?;
        let Prompt::Chat { messages, tools, template_vars, .. } = request::parse(&bytes, true, state.context)?.prompt
        else {
            return Err(ApiError::internal("a chat request parsed to a text prompt"));
        };
        if state.chat_template(tools.is_some()).is_none() {
            return Err(ApiError::bad_request("this model has no chat template", Some("messages")));
        }
        state
            .worker
            .call(move |session| {
                let prompt = session
                    .render_chat_template_with_vars(&messages, tools.as_deref(), true, template_vars.as_deref())
                    .map_err(|e| match e {
                        e @ waste_host::Error::ChatTemplate(_) => {
                            ApiError::bad_request(e.to_string(), Some("messages"))
                        }
                        other => host_error(other),
                    })?;
                Ok(json!({"prompt": prompt}))
            })
            .await
    };
    answer(run.await)
}

/// `GET /props`: what a client set up for llama-server reads about the
/// model it talks to: the context (`default_generation_settings.n_ctx`),
/// the chat template and whether it takes tools, the model's path and
/// alias, one slot (requests run one at a time), whether images are
/// understood.
pub(crate) async fn props(State(state): State<Shared>) -> Response {
    let template = state.chat_template(false).unwrap_or_default();
    let mut v = json!({
        "default_generation_settings": {"n_ctx": state.context, "model": state.model_id},
        "total_slots": 1,
        "model_alias": state.model_id,
        "model_path": state.model_path.as_deref().unwrap_or(&state.model_id),
        "chat_template": template,
        "chat_template_caps": {"supports_tools": state.template_takes_tools()},
        "modalities": {"vision": state.model.info().vision.is_some(), "audio": false},
        "build_info": format!("waste {}", env!("CARGO_PKG_VERSION")),
    });
    if let Some(with_tools) = state.chat_template(true).filter(|t| *t != template) {
        v["chat_template_tool_use"] = json!(with_tools);
    }
    Json(v).into_response()
}

fn answer(result: Result<Value, ApiError>) -> Response {
    match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}
