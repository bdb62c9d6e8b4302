//! Chat templates for releases that ship none. DeepSeek-V3.2's release
//! has no Jinja template (its chat format is Python, `encoding_dsv32.py`);
//! llama.cpp's `models/templates/deepseek-ai-DeepSeek-V3.2.jinja` ports it,
//! and a container converted without a template could not chat at all.
//!
//! The one copy of that template is the chat-template corpus's
//! (tests/fixtures/chat_templates/llamacpp, byte for byte from the
//! llama.cpp release SOURCES.md names), whose rendering the corpus test
//! holds to transformers'.
//!
//! DeepSeek-V4's release has none either (`encoding/encoding_dsv4.py`) and
//! no one had ported it: templates/deepseek_v4.jinja is ours, held to that
//! encoder by tests/gen_deepseek_v4_template.py.

/// The template carried into a container of `model_type` whose source has
/// none, and where it comes from.
pub fn bundled_template(model_type: &str) -> Option<(&'static str, &'static str)> {
    match model_type {
        "deepseek_v32" => Some((
            include_str!("../../../../tests/fixtures/chat_templates/llamacpp/deepseek-ai-DeepSeek-V3.2.jinja"),
            "llama.cpp's DeepSeek-V3.2 template (models/templates/deepseek-ai-DeepSeek-V3.2.jinja)",
        )),
        "deepseek_v4" => Some((
            include_str!("templates/deepseek_v4.jinja"),
            "WASTE's port of DeepSeek-V4's encoding_dsv4.py (convert/templates/deepseek_v4.jinja)",
        )),
        _ => None,
    }
}

/// Whether a source's `tokenizer_config.json` (its bytes) names a template.
pub fn config_has_template(tokenizer_config: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(tokenizer_config)
        .ok()
        .and_then(|v| v.get("chat_template").map(|t| !t.is_null()))
        .unwrap_or(false)
}
