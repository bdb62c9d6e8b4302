//! Ollama's routes about the served model rather than generations:
//! /api/tags, /api/show, /api/ps, /api/version and `GET /`, in the shapes
//! Ollama's clients read (docs/api.md at v0.33.0).

use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::{error_response, rfc3339};
use crate::error::ApiError;
use crate::state::{read_body, AppState, Shared};

/// The Ollama API version these routes follow (clients compare it against
/// the minimum they need; WASTE's own version would read as too old).
const API_VERSION: &str = "0.33.0";

/// `MODEL` and `MODEL:latest` are this model.
pub(super) fn is_ours(state: &AppState, name: &str) -> bool {
    name == state.model_id || name.strip_suffix(":latest") == Some(state.model_id.as_str())
}

fn tag(state: &AppState) -> String {
    format!("{}:latest", state.model_id)
}

fn details(state: &AppState) -> Value {
    let info = state.model.info();
    let params = info.total_params as f64;
    let size = if params >= 1e9 { format!("{:.1}B", params / 1e9) } else { format!("{:.1}M", params / 1e6) };
    json!({"parent_model": "", "format": "waste", "family": info.family, "families": [info.family],
           "parameter_size": size, "quantization_level": info.expert_format})
}

fn container_bytes(state: &AppState) -> u64 {
    let info = state.model.info();
    info.trunk_bytes + (info.moe_layers * info.num_experts) as u64 * info.expert_record_bytes
}

fn digest(state: &AppState) -> String {
    state.system_fingerprint.trim_start_matches("fp_").to_string()
}

fn modified_at(state: &AppState) -> String {
    rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(state.created))
}

pub async fn root() -> Response {
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], "Ollama is running").into_response()
}

pub async fn version() -> Response {
    axum::Json(json!({"version": API_VERSION})).into_response()
}

pub async fn tags(State(state): State<Shared>) -> Response {
    let name = tag(&state);
    axum::Json(json!({"models": [{"name": name, "model": name, "modified_at": modified_at(&state),
        "size": container_bytes(&state), "digest": digest(&state), "details": details(&state)}]}))
    .into_response()
}

pub async fn ps(State(state): State<Shared>) -> Response {
    let name = tag(&state);
    // Loaded for as long as the server runs.
    let expires = rfc3339(SystemTime::now() + Duration::from_secs(10 * 365 * 86_400));
    axum::Json(json!({"models": [{"name": name, "model": name, "size": state.model.memory_plan().budget,
        "digest": digest(&state), "details": details(&state), "expires_at": expires, "size_vram": 0,
        "context_length": state.context}]}))
    .into_response()
}

pub async fn show(State(state): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    let answer = async {
        let bytes = read_body(&state, &headers, body).await?;
        let v: Value =
            serde_json::from_slice(&bytes).map_err(|e| ApiError::bad_request(format!("invalid JSON: {e}"), None))?;
        let name = v.get("model").or_else(|| v.get("name")).and_then(Value::as_str).filter(|s| !s.is_empty());
        let name = name.ok_or_else(|| ApiError::bad_request("model is required", None))?;
        if !is_ours(&state, name) {
            return Err(ApiError::not_found(format!("model '{name}' not found"), "model_not_found"));
        }
        let info = state.model.info();
        let template = state.chat_template(false).unwrap_or("{{ .Prompt }}").to_string();
        let mut capabilities = vec!["completion"];
        if state.template_takes_tools() {
            capabilities.push("tools");
        }
        let arch = info.family.clone();
        let mut model_info = serde_json::Map::new();
        model_info.insert("general.architecture".into(), json!(arch));
        model_info.insert("general.parameter_count".into(), json!(info.total_params));
        model_info.insert(format!("{arch}.context_length"), json!(state.context));
        model_info.insert(format!("{arch}.embedding_length"), json!(info.hidden_size));
        model_info.insert(format!("{arch}.block_count"), json!(info.num_layers));
        model_info.insert(format!("{arch}.expert_count"), json!(info.num_experts));
        model_info.insert(format!("{arch}.expert_used_count"), json!(info.top_k));
        Ok(axum::Json(json!({
            "modelfile": format!("# a waste container served by waste serve\nFROM {}\n", state.model_id),
            "parameters": "", "template": template, "details": details(&state),
            "model_info": model_info, "capabilities": capabilities, "modified_at": modified_at(&state),
        }))
        .into_response())
    };
    answer.await.unwrap_or_else(error_response)
}
