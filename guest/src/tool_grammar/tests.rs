use super::*;
use crate::constraint::{Constraint, Vocabulary};

fn fixtures() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

fn tokenizer(fixture: &str) -> Tokenizer {
    Tokenizer::from_json(&std::fs::read_to_string(fixtures().join(fixture).join("tokenizer.json")).unwrap()).unwrap()
}

fn template_of_config(dir: &str) -> ChatTemplate {
    let cfg =
        std::fs::read_to_string(fixtures().join("chat_templates").join(dir).join("tokenizer_config.json")).unwrap();
    let v: Value = serde_json::from_str(&cfg).unwrap();
    ChatTemplate::new(v["chat_template"].as_str().unwrap(), Some(&cfg)).unwrap()
}

fn template_file(file: &str) -> ChatTemplate {
    ChatTemplate::new(std::fs::read_to_string(fixtures().join("chat_templates/llamacpp").join(file)).unwrap(), None)
        .unwrap()
}

const TOOLS: &str = r#"[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": false}}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}}]"#;

/// Whether `text` is accepted whole by the grammar (fed token by token as
/// the tokenizer encodes it).
fn accepts(vocab: &Vocabulary, lark: &str, tok: &Tokenizer, text: &str) -> bool {
    let mut guide = vocab.compile(&Constraint::Lark(lark.to_string())).unwrap();
    for id in tok.encode_markup(text) {
        let mut logits = vec![0.0; tok.vocab_size()];
        if !guide.mask(&mut logits, false).unwrap() || logits[id as usize] == f32::NEG_INFINITY {
            return false;
        }
        guide.advance(id).unwrap();
    }
    guide.is_finished()
}

/// A case of tests/server/tool_call_expected.json: the call text
/// transformers renders for the fixture with the family's template.
fn expected(case: &str) -> (String, String) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/server/tool_call_expected.json");
    let all: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let c = &all["cases"][case];
    (c["tools"].to_string(), c["call_text"].as_str().unwrap().to_string())
}

#[test]
fn hermes_calls_are_a_name_and_arguments_wrapper_in_tool_call_tags() {
    let tok = tokenizer("tiny-qwen3_moe");
    let eos = [tok.token_id("<|im_end|>").unwrap()];
    let template = template_of_config("qwen3");
    let grammar = lark(&template, &tok, &eos, TOOLS, Some("get_weather"), None).unwrap();
    let vocab = Vocabulary::new(&tok, tok.vocab_size() as u32, &eos).unwrap();
    let good =
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>";
    assert!(accepts(&vocab, &grammar, &tok, good), "{grammar}");
    let thought = format!("<think>\nThe user wants the weather.\n</think>\n\n{good}");
    assert!(accepts(&vocab, &grammar, &tok, &thought), "a reasoning block may come first: {grammar}");
    for bad in [
        good.replace("get_weather", "noop"),
        good.replace("3}", "9}"),
        good.replace(", \"days\": 3", ""),
        good.replace("</tool_call>", ""),
    ] {
        assert!(!accepts(&vocab, &grammar, &tok, &bad), "accepted {bad:?}");
    }
    // Any declared tool when none is named.
    let any = lark(&template, &tok, &eos, TOOLS, None, None).unwrap();
    assert!(accepts(&vocab, &any, &tok, "<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>"), "{any}");
    // What transformers renders for the fixture is a call the grammar takes.
    let (tools, call) = expected("qwen3");
    assert!(accepts(&vocab, &lark(&template, &tok, &eos, &tools, None, None).unwrap(), &tok, &call), "{call:?}");
}

#[test]
fn harmony_calls_name_the_function_in_the_header_after_the_analysis() {
    let tok = tokenizer("tiny-gpt_oss");
    let eos = [tok.token_id("<|im_end|>").unwrap()];
    let template = template_file("openai-gpt-oss-120b.jinja");
    let vocab = Vocabulary::new(&tok, tok.vocab_size() as u32, &eos).unwrap();
    let (tools, call) = expected("gpt_oss");
    let grammar = lark(&template, &tok, &eos, &tools, Some("get_weather"), None).unwrap();
    assert!(accepts(&vocab, &grammar, &tok, &call), "{call:?}\n{grammar}");
    let other = call.replace("functions.get_weather", "functions.get_time");
    assert!(!accepts(&vocab, &grammar, &tok, &other), "another function's header");
}

#[test]
fn templates_writing_arguments_as_text_are_unsupported_and_unknown_tools_invalid() {
    let tok = tokenizer("tiny-minimax_m2");
    let t = template_file("MiniMax-M2.jinja");
    assert!(matches!(lark(&t, &tok, &[], TOOLS, None, None), Err(ToolGrammarError::Unsupported(_))));
    let tok = tokenizer("tiny-qwen3_moe");
    let q = template_of_config("qwen3");
    assert!(matches!(lark(&q, &tok, &[], TOOLS, Some("nope"), None), Err(ToolGrammarError::Invalid(_))));
    assert!(matches!(lark(&q, &tok, &[], "{}", None, None), Err(ToolGrammarError::Invalid(_))));
}

#[test]
fn without_reasoning_in_the_template_the_call_comes_first() {
    let tok = tokenizer("tiny-qwen3_moe");
    let eos = [tok.token_id("<|im_end|>").unwrap()];
    let grammar = lark(&template_file("Qwen-Qwen2.5-7B-Instruct.jinja"), &tok, &eos, TOOLS, None, None).unwrap();
    let vocab = Vocabulary::new(&tok, tok.vocab_size() as u32, &eos).unwrap();
    let call = "<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>";
    assert!(accepts(&vocab, &grammar, &tok, call), "{grammar}");
    assert!(!accepts(&vocab, &grammar, &tok, &format!("Sure. {call}")), "{grammar}");
}
