use super::request::parse as parse_request;
use super::*;

fn messages_of(body: &str) -> Vec<(String, Option<String>, Option<String>)> {
    let p = parse_request(body.as_bytes(), 256).unwrap_or_else(|e| panic!("{}", e.message));
    let crate::neutral::Prompt::Chat { messages, .. } = p.request.prompt else { panic!("a chat") };
    messages.into_iter().map(|m| (m.role, m.content, m.extra)).collect()
}

/// Codex's first request: developer messages and the user's, function
/// tools beside a namespace and a hosted tool.
#[test]
fn codex_items_become_the_chat_messages_they_amount_to() {
    let body = r#"{"model": "m", "instructions": "Be brief.", "stream": true, "store": false,
        "input": [
          {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
          {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List files."}]},
          {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Use ls."}], "encrypted_content": null},
          {"type": "function_call", "call_id": "call_1", "name": "exec_command", "arguments": "{\"cmd\":\"ls\"}"},
          {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"},
          {"role": "assistant", "content": [{"type": "output_text", "text": "One file."}]}],
        "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
                  {"type": "namespace", "name": "agents", "tools": [{"type": "function", "name": "close_agent"}]},
                  {"type": "web_search", "external_web_access": false}],
        "tool_choice": "auto", "reasoning": {"effort": "high", "summary": "auto"}}"#;
    let m = messages_of(body);
    assert_eq!(m[0], ("system".into(), Some("Be brief.\n\nYou are Codex.".into()), None));
    assert_eq!(m[1].0, "user");
    assert_eq!(m[2].0, "assistant");
    let extra: Value = serde_json::from_str(m[2].2.as_deref().unwrap()).unwrap();
    assert_eq!(extra["reasoning_content"], "Use ls.");
    assert_eq!(extra["tool_calls"][0]["function"]["name"], "exec_command");
    assert_eq!(m[3].0, "tool");
    assert_eq!(m[3].1.as_deref(), Some("a.txt"));
    assert_eq!(m[4], ("assistant".into(), Some("One file.".into()), None));
    let p = parse_request(body.as_bytes(), 256).unwrap();
    let tools: Value = serde_json::from_str(p.request.prompt.tools().unwrap()).unwrap();
    let names: Vec<&str> = tools.as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["exec_command", "close_agent"], "the hosted tool is left out");
    assert!(p.request.stream);
}

#[test]
fn stored_state_and_unknown_items_are_400s_naming_the_field() {
    for (body, param) in [
        (r#"{"input": "hi", "previous_response_id": "resp_1"}"#, "previous_response_id"),
        (r#"{"input": [{"type": "item_reference", "id": "msg_1"}]}"#, "input[0]"),
        (r#"{"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}"#, "input[0].call_id"),
        (r#"{"input": [{"type": "shell_call"}]}"#, "input[0].type"),
        (r#"{"input": "hi", "tools": [{"type": "custom", "name": "x"}]}"#, "tools[0].type"),
        (r#"{"input": "hi", "max_output_tokens": 0}"#, "max_output_tokens"),
        (
            r#"{"input": [{"type": "function_call", "call_id": "c", "name": "view_image", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c",
                 "output": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]}"#,
            "input[1].output",
        ),
        (r#"{}"#, "input"),
    ] {
        let e = parse_request(body.as_bytes(), 256).err().unwrap_or_else(|| panic!("{body} was accepted"));
        assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
    }
}
