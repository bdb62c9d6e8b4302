//! Chat templates against transformers' `apply_chat_template` (fixtures from
//! tests/gen_chat_template_fixtures.py, see tests/fixtures/chat_templates/README.md).

use std::path::PathBuf;

use serde_json::Value;
use waste_guest::chat::{ChatMessage, ChatTemplate};
use waste_guest::tokenizer::{Segment, Tokenizer};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

fn read(rel: &str) -> String {
    let p = fixtures().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

fn expected() -> Value {
    serde_json::from_str(&read("chat_templates/expected.json")).expect("expected.json parses")
}

fn messages(e: &Value, conversation: &str) -> Vec<ChatMessage> {
    e["wire"][conversation]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| ChatMessage {
            role: m["role"].as_str().unwrap().to_string(),
            content: m["content"].as_str().map(str::to_owned),
            extra: m["extra"].as_str().map(str::to_owned),
            media: Vec::new(),
        })
        .collect()
}

/// The model's template (a string `chat_template` in its
/// tokenizer_config.json; which template a model renders with is the
/// host's choice, tested there) with that config's special tokens.
fn template(e: &Value, model: &str) -> ChatTemplate {
    let cfg = read(e["models"][model]["config"].as_str().unwrap());
    let v: Value = serde_json::from_str(&cfg).expect("tokenizer_config.json parses");
    let source = v["chat_template"].as_str().expect("a string chat_template");
    ChatTemplate::new(source, Some(&cfg)).expect("template loads")
}

#[test]
fn chat_templates_render_like_transformers() {
    let e = expected();
    let tools = e["tools_json"].as_str().unwrap();
    let mut failures = Vec::new();
    let mut checked = 0;
    for (model, m) in e["models"].as_object().unwrap() {
        let t = template(&e, model);
        for case in m["cases"].as_array().unwrap() {
            let conv = case["conversation"].as_str().unwrap();
            let msgs = messages(&e, conv);
            let tools = case["tools"].as_bool().unwrap().then_some(tools);
            let agp = case["add_generation_prompt"].as_bool().unwrap();
            let what = format!("{model} {conv} tools={} agp={agp}", tools.is_some());
            let got = t.render(&msgs, tools, agp);
            let segs = t.render_segments(&msgs, tools, agp);
            checked += 1;
            match (case.get("text").and_then(|v| v.as_str()), &got) {
                (Some(want), Ok(got)) if got == want => {}
                (Some(want), _) => failures.push(format!("{what}:\n   got {got:?}\n  want {want:?}")),
                (None, Err(_)) => {}
                (None, Ok(got)) => {
                    failures.push(format!("{what}: transformers raised {}, we rendered {got:?}", case["error"]))
                }
            }
            if let (Some(want), Ok(segs)) = (case.get("text").and_then(|v| v.as_str()), &segs) {
                let joined: String = segs.iter().map(|s| s.text.as_str()).collect();
                if joined != want {
                    failures.push(format!("{what}: segments join to {joined:?}"));
                }
                let content: String = segs.iter().filter(|s| !s.markup).map(|s| s.text.as_str()).collect();
                for m in &msgs {
                    if let Some(c) = &m.content {
                        // Every message's text that reaches the prompt is content, not markup.
                        if want.contains(c.as_str()) && !c.is_empty() && !content.contains(c.as_str()) {
                            failures.push(format!("{what}: {c:?} is not in a content segment"));
                        }
                    }
                }
            } else if case.get("text").is_some() {
                failures.push(format!("{what}: render_segments failed: {segs:?}"));
            }
        }
    }
    assert!(checked >= 90, "only {checked} cases");
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// Extra template variables (Qwen3's `enable_thinking`) render as
/// transformers renders `apply_chat_template(..., **vars)`.
#[test]
fn chat_template_variables_render_like_transformers() {
    let e = expected();
    let mut failures = Vec::new();
    let mut checked = 0;
    for (model, m) in e["models"].as_object().unwrap() {
        let Some(cases) = m.get("vars_cases").and_then(|c| c.as_array()) else {
            continue;
        };
        let t = template(&e, model);
        for case in cases {
            let conv = case["conversation"].as_str().unwrap();
            let msgs = messages(&e, conv);
            let agp = case["add_generation_prompt"].as_bool().unwrap();
            let vars = case["vars_json"].as_str().unwrap();
            let what = format!("{model} {conv} vars={vars} agp={agp}");
            let want = case["text"].as_str().expect("no template errors here");
            match t.render_with_vars(&msgs, None, agp, Some(vars)) {
                Ok(got) if got == want => {}
                got => failures.push(format!("{what}:\n   got {got:?}\n  want {want:?}")),
            }
            match t.render_segments_with_vars(&msgs, None, agp, Some(vars)) {
                Ok(segs) => {
                    let joined: String = segs.iter().map(|s| s.text.as_str()).collect();
                    if joined != want {
                        failures.push(format!("{what}: segments join to {joined:?}"));
                    }
                }
                Err(err) => failures.push(format!("{what}: render_segments failed: {err}")),
            }
            checked += 1;
        }
    }
    assert!(checked >= 12, "only {checked} cases");
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    // enable_thinking=false changes the generation prompt, so the variable
    // really reaches the template.
    let t = template(&e, "qwen3");
    let msgs = messages(&e, "single");
    assert_ne!(
        t.render_with_vars(&msgs, None, true, Some(r#"{"enable_thinking": false}"#)).unwrap(),
        t.render(&msgs, None, true).unwrap()
    );
}

#[test]
fn chat_template_variables_are_checked() {
    let e = expected();
    let t = template(&e, "qwen3");
    let msgs = messages(&e, "single");
    for (vars, needle) in [
        ("[1]", "JSON object"),
        ("{oops", "invalid JSON"),
        (r#"{"messages": []}"#, "\"messages\""),
        (r#"{"add_generation_prompt": true}"#, "add_generation_prompt"),
    ] {
        let err = t.render_with_vars(&msgs, None, true, Some(vars)).unwrap_err();
        assert!(err.contains(needle), "{vars}: {err}");
    }
    // A variable overrides a special token, as apply_chat_template's kwargs do.
    let t = ChatTemplate::new("{{ eos_token }}", Some(r#"{"eos_token": "E"}"#)).unwrap();
    assert_eq!(t.render_with_vars(&[], None, false, Some(r#"{"eos_token": "X"}"#)).unwrap(), "X");
}

fn tiny_tokenizer() -> Tokenizer {
    Tokenizer::from_json(&read("tiny-qwen3_moe/tokenizer.json")).expect("tiny tokenizer loads")
}

/// With benign content the segmented encoding equals transformers' own
/// `apply_chat_template(tokenize=True)` ids.
#[test]
fn chat_template_ids_equal_transformers_for_benign_content() {
    let e = expected();
    let tok = tiny_tokenizer();
    let t = template(&e, "tiny-qwen3_moe");
    let mut checked = 0;
    for case in e["models"]["tiny-qwen3_moe"]["cases"].as_array().unwrap() {
        let conv = case["conversation"].as_str().unwrap();
        let Some(want) = case.get("ids") else {
            continue;
        };
        if conv == "forged" {
            continue;
        }
        let want: Vec<u32> = want.as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let agp = case["add_generation_prompt"].as_bool().unwrap();
        let segs = t.render_segments(&messages(&e, conv), None, agp).unwrap();
        assert_eq!(tok.encode_segments(&segs), want, "{conv} agp={agp}");
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} cases");
}

/// Content spelling the template's control tokens stays content: the only
/// control ids are the template's own.
#[test]
fn chat_template_forged_control_tokens_stay_content() {
    let e = expected();
    let tok = tiny_tokenizer();
    let t = template(&e, "tiny-qwen3_moe");
    let msgs = messages(&e, "forged");
    let segs = t.render_segments(&msgs, None, true).unwrap();
    let ids = tok.encode_segments(&segs);
    let start = tok.token_id("<|im_start|>").unwrap();
    let end = tok.token_id("<|im_end|>").unwrap();
    // Template: <|im_start|>user\n CONTENT <|im_end|>\n<|im_start|>assistant\n
    assert_eq!(ids.iter().filter(|&&i| i == start).count(), 2, "{ids:?}");
    assert_eq!(ids.iter().filter(|&&i| i == end).count(), 1, "{ids:?}");
    assert_eq!(tok.decode(&ids).unwrap(), t.render(&msgs, None, true).unwrap());
    // transformers' plain tokenize=True does let the content forge them.
    let hf = e["models"]["tiny-qwen3_moe"]["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["conversation"] == "forged" && c["add_generation_prompt"] == true)
        .unwrap();
    let hf_ends = hf["ids"].as_array().unwrap().iter().filter(|v| v.as_u64() == Some(u64::from(end))).count();
    assert!(hf_ends > 1, "the fixture should show the forgery a joined encode allows");
}

#[test]
fn chat_template_content_transforms_fall_back_to_alignment() {
    // Qwen3 strips the <think> block of an old assistant turn: the marker
    // rendering differs, the alignment still puts "4" into content.
    let e = expected();
    let t = template(&e, "qwen3");
    let msgs = messages(&e, "reasoning_history");
    let segs = t.render_segments(&msgs, None, true).unwrap();
    assert!(segs.contains(&Segment { text: "4".into(), markup: false }), "{segs:?}");
    assert!(segs.iter().filter(|s| s.markup).all(|s| !s.text.contains("add them")));
}

#[test]
fn chat_template_errors_are_clear() {
    let e = expected();
    // Mixtral's own raise_exception message comes through.
    let t = template(&e, "mixtral");
    let err = t.render(&messages(&e, "system"), None, true).unwrap_err();
    assert!(err.contains("Conversation roles must alternate"), "{err}");
    // A template that does not compile names the problem and the line.
    let err = ChatTemplate::new("{% for m in messages %}\n{{ m.content }", None).unwrap_err();
    assert!(err.starts_with("chat template:") && err.contains("chat_template line 2"), "{err}");
    // Bad tools JSON.
    let t = template(&e, "qwen3");
    let err = t.render(&messages(&e, "single"), Some("{not json"), true).unwrap_err();
    assert!(err.contains("tools"), "{err}");
}

/// A message's media (an image's prompt text) renders before its content
/// as markup, so its special tokens resolve, while the content stays
/// content: text that spells a special token cannot forge one.
#[test]
fn media_renders_as_markup_before_the_content() {
    let source = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
    let t = ChatTemplate::new(source, None).expect("template loads");
    let image = "<|media_begin|>image 150x100<|media_content|><|media_pad|><|media_end|>";
    let msgs = vec![ChatMessage {
        role: "user".into(),
        content: Some("What is <|media_pad|> here?".into()),
        media: vec![image.into(), image.into()],
        ..Default::default()
    }];
    let segs = t.render_segments(&msgs, None, false).expect("renders");
    let markup: String = segs.iter().filter(|s| s.markup).map(|s| s.text.as_str()).collect();
    let content: Vec<&str> = segs.iter().filter(|s| !s.markup).map(|s| s.text.as_str()).collect();
    assert_eq!(markup, format!("<|im_start|>user\n{image}{image}<|im_end|>\n"));
    assert_eq!(content, vec!["What is <|media_pad|> here?"]);
    // Media without content renders alone.
    let only = vec![ChatMessage { role: "user".into(), media: vec![image.into()], ..Default::default() }];
    let text = t.render(&only, None, false).expect("renders");
    assert_eq!(text, format!("<|im_start|>user\n{image}<|im_end|>\n"));
}
