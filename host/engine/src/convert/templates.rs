//! Chat templates for releases that ship none (DeepSeek-V3.2's and
//! DeepSeek-V4's chat formats are Python encoders): each is its model
//! type's `bundled_template` in the family table (`config::family`).

/// The template carried into a container of `model_type` whose source has
/// none, and where it comes from.
pub fn bundled_template(model_type: &str) -> Option<(&'static str, &'static str)> {
    let template = crate::config::family::by_model_type(model_type)?.bundled_template.as_ref()?;
    Some((template.text, template.source))
}

/// Whether a source's `tokenizer_config.json` (its bytes) names a template.
pub fn config_has_template(tokenizer_config: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(tokenizer_config)
        .ok()
        .and_then(|v| v.get("chat_template").map(|t| !t.is_null()))
        .unwrap_or(false)
}
