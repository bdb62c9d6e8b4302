//! What a client sends a chat template: messages, tools and template
//! variables as JSON, rendered by real releases' templates.
#![no_main]
use libfuzzer_sys::fuzz_target;
use waste_guest::chat::{ChatMessage, ChatTemplate};

fn templates() -> &'static [ChatTemplate] {
    static T: std::sync::OnceLock<Vec<ChatTemplate>> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        ["qwen3", "deepseek_v3", "kimi", "mixtral", "olmoe"]
            .iter()
            .filter_map(|name| {
                let p = waste_fuzz::repo().join(format!("tests/fixtures/chat_templates/{name}/tokenizer_config.json"));
                let cfg = std::fs::read_to_string(p).ok()?;
                let v: serde_json::Value = serde_json::from_str(&cfg).ok()?;
                ChatTemplate::new(v["chat_template"].as_str()?.to_string(), Some(&cfg)).ok()
            })
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    let Ok(serde_json::Value::Object(req)) = serde_json::from_str::<serde_json::Value>(text) else { return };
    let messages: Vec<ChatMessage> = req
        .get("messages")
        .and_then(|m| m.as_array())
        .map(|list| {
            list.iter()
                .map(|m| ChatMessage {
                    role: m.get("role").and_then(|r| r.as_str()).unwrap_or("user").to_string(),
                    content: m.get("content").and_then(|c| c.as_str()).map(str::to_string),
                    extra: m.get("extra").map(|e| e.to_string()),
                    media: Vec::new(),
                })
                .collect()
        })
        .unwrap_or_default();
    let tools = req.get("tools").map(|t| t.to_string());
    let vars = req.get("vars").map(|v| v.to_string());
    let t = &templates()[pick as usize % templates().len()];
    let _ = t.render_with_vars(&messages, tools.as_deref(), pick & 0x80 != 0, vars.as_deref());
});
