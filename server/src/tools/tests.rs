//! Each syntax against what the model's real template renders for the
//! same calls (transformers' rendering of an assistant turn with
//! `tool_calls`, tests/fixtures/chat_templates/llamacpp): parsing that text
//! must give back the calls it was rendered from.

use serde_json::Value;

use super::*;

fn corpus(rel: &str) -> Value {
    let p =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/chat_templates/llamacpp").join(rel);
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))).unwrap()
}

/// The calls of the `tool_round_trip` conversation's assistant turn, with
/// arguments as JSON objects.
fn rendered_calls() -> Vec<(String, Value)> {
    let e = corpus("expected.json");
    let turn = &e["conversations"]["tool_round_trip"][2];
    turn["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["function"]["name"].as_str().unwrap().to_string(), c["function"]["arguments"].clone()))
        .collect()
}

/// `template`'s rendering of that turn, from the first `from` after the
/// user's question to the end of the last `to` (the model's output: what it
/// wrote after the generation prompt; the system prompt's own examples of
/// the syntax come before the question).
fn rendered(template: &str, from: &str, to: &str) -> String {
    let cases = corpus(&format!("expected/{template}.json"));
    let case = cases["cases"].as_array().unwrap().iter().find(|c| c["name"] == "tool_round_trip").unwrap();
    let text = case["text"].as_str().unwrap();
    let question = text.find("the time in Paris?").unwrap_or_else(|| panic!("{template}: no question"));
    let start = text[question..].find(from).unwrap_or_else(|| panic!("{template}: no {from:?}")) + question;
    let end = text[start..].rfind(to).unwrap_or_else(|| panic!("{template}: no {to:?}")) + start + to.len();
    text[start..end].to_string()
}

fn schema() -> Schema {
    Schema::from_tools(corpus("expected.json")["tools_json"].as_str().unwrap())
}

fn check(template: &str, output: &str, raw: &str, want: &[(String, Value)]) {
    let p = parse(output, raw, &schema()).unwrap_or_else(|| panic!("{template}: no calls in {output:?}"));
    let got: Vec<(String, Value)> =
        p.calls.iter().map(|c| (c.name.clone(), serde_json::from_str(&c.arguments).unwrap())).collect();
    assert_eq!(got, want, "{template}: {output:?}");
}

#[test]
fn qwen3_5_xml_calls_parse_back_to_what_its_template_rendered() {
    let out = rendered("Qwen3.5-4B", "<tool_call>", "</tool_call>");
    check("Qwen3.5-4B", &out, &out, &rendered_calls());
}

#[test]
fn glm_4_6_key_value_calls_parse_back_to_what_its_template_rendered() {
    let out = rendered("GLM-4.6", "<tool_call>", "</tool_call>");
    check("GLM-4.6", &out, &out, &rendered_calls());
}

#[test]
fn minimax_m2_invocations_parse_back_to_what_its_template_rendered() {
    let out = rendered("MiniMax-M2", "<minimax:tool_call>", "</minimax:tool_call>");
    check("MiniMax-M2", &out, &out, &rendered_calls());
}

#[test]
fn deepseek_v3_2_dsml_invocations_parse_back_to_what_its_template_rendered() {
    let (open, close) = ("<｜DSML｜function_calls>", "</｜DSML｜function_calls>");
    let out = rendered("deepseek-ai-DeepSeek-V3.2", open, close);
    check("deepseek-ai-DeepSeek-V3.2", &out, &out, &rendered_calls());
    // `string="false"` values are JSON whatever the schema says.
    let out = format!("{open}\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"n\" string=\"false\">[1, 2]</｜DSML｜parameter>\n</｜DSML｜invoke>\n{close}");
    let p = parse(&out, &out, &Schema::default()).unwrap();
    assert_eq!(p.calls[0].arguments, "{\"n\":[1,2]}");
}

/// DeepSeek-V4's `<｜DSML｜tool_calls>`: the assistant turn of our port's
/// rendering (held to the release's encoder, tests/gen_deepseek_v4_template.py).
#[test]
fn deepseek_v4_dsml_tool_calls_parse_back_to_what_its_encoder_renders() {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/chat_templates/deepseek_v4/expected.json");
    let e: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    let case = e["cases"].as_array().unwrap().iter().find(|c| c["name"] == "tool_round_trip").unwrap();
    let text = case["text"].as_str().unwrap();
    let (open, close) = ("<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>");
    // The system prompt's example block comes first; the turn's is the last.
    let start = text.rfind(open).unwrap();
    let end = text.rfind(close).unwrap() + close.len();
    let p = parse(&text[start..end], &text[start..end], &Schema::default()).unwrap();
    let got: Vec<(String, Value)> =
        p.calls.iter().map(|c| (c.name.clone(), serde_json::from_str(&c.arguments).unwrap())).collect();
    let want = vec![
        ("get_weather".to_string(), serde_json::json!({"city": "北京", "days": 3})),
        ("time_in".to_string(), serde_json::json!({"zone": "Asia/Shanghai"})),
    ];
    assert_eq!(got, want);
}

#[test]
fn qwen3_hermes_calls_parse_back_to_what_its_template_rendered() {
    let out = rendered("Qwen-Qwen3-0.6B", "<tool_call>", "</tool_call>");
    check("Qwen-Qwen3-0.6B", &out, &out, &rendered_calls());
}

/// gpt-oss renders the first call of a turn (its template's choice); the
/// model's output starts after the generation prompt `<|start|>assistant`,
/// and the channels are special tokens the visible text leaves out.
#[test]
fn gpt_oss_harmony_call_parses_back_to_what_its_template_rendered() {
    let full = rendered("openai-gpt-oss-120b", "<|start|>assistant to=functions", "<|call|>");
    let raw = full.strip_prefix("<|start|>assistant").unwrap();
    let visible = "{\"city\": \"Paris\", \"unit\": \"celsius\"}";
    check("openai-gpt-oss-120b", visible, raw, &rendered_calls()[..1]);
}

#[test]
fn harmony_channels_split_reasoning_from_content() {
    let raw =
        "<|channel|>analysis<|message|>17 x 3 is 51.<|end|><|start|>assistant<|channel|>final<|message|>51.<|return|>";
    let p = parse("17 x 3 is 51.51.", raw, &Schema::default()).unwrap();
    assert_eq!(p.reasoning.as_deref(), Some("17 x 3 is 51."));
    assert_eq!(p.content.as_deref(), Some("51."));
    assert!(p.calls.is_empty());
    // The recipient may also follow the channel.
    let raw = "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{\"timezone\":\"UTC\"}<|call|>";
    let p = parse("", raw, &Schema::default()).unwrap();
    assert_eq!(p.calls, vec![Call { name: "get_time".into(), arguments: "{\"timezone\":\"UTC\"}".into() }]);
}

/// Values the XML syntaxes write as text take their schema's type: a
/// declared string stays a string even when it reads as a number; other
/// types are the JSON the text spells.
#[test]
fn xml_values_follow_the_tool_schema() {
    let tools = r#"[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{
        "zip":{"type":"string"},"n":{"type":"integer"},"on":{"type":"boolean"},"tags":{"type":"array"}}}}}]"#;
    let s = Schema::from_tools(tools);
    let out = "<tool_call>\n<function=f>\n<parameter=zip>\n01234\n</parameter>\n<parameter=n>\n42\n</parameter>\n\
               <parameter=on>\ntrue\n</parameter>\n<parameter=tags>\n[\"a\"]\n</parameter>\n<parameter=free>\nhi\n</parameter>\n</function>\n</tool_call>";
    let p = parse(out, out, &s).unwrap();
    let args: Value = serde_json::from_str(&p.calls[0].arguments).unwrap();
    assert_eq!(args, serde_json::json!({"zip": "01234", "n": 42, "on": true, "tags": ["a"], "free": "hi"}));
}

#[test]
fn hermes_tool_call_is_parsed_with_leading_text() {
    let out = "Let me check.\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    let p = parse(out, out, &Schema::default()).unwrap();
    assert_eq!(p.content.as_deref(), Some("Let me check."));
    assert_eq!(p.calls[0].name, "weather");
    assert_eq!(p.calls[0].arguments, "{\"city\":\"Paris\"}");
}

#[test]
fn malformed_tool_calls_stay_text() {
    let s = Schema::default();
    for out in [
        "<tool_call>{not json</tool_call>",
        "no calls here",
        "<tool_call>\n<function=f>\n<parameter=a>\nunclosed\n</tool_call>",
        "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>unclosed</tool_call>",
        "<minimax:tool_call>\n<invoke name=\"f\">\n<parameter name=\"a\">x\n</minimax:tool_call>",
        "<｜DSML｜function_calls><｜DSML｜invoke name=\"f\"><｜DSML｜parameter name=\"a\" string=\"false\">{no</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜function_calls>",
    ] {
        assert!(parse(out, out, &s).is_none(), "{out:?}");
    }
}

#[test]
fn two_hermes_calls_are_both_returned() {
    let out = "<tool_call>{\"name\":\"a\"}</tool_call><tool_call>{\"name\":\"b\",\"arguments\":\"{}\"}</tool_call>";
    let p = parse(out, out, &Schema::default()).unwrap();
    assert!(p.content.is_none());
    assert_eq!(p.calls.len(), 2);
    assert_eq!(p.calls[1].name, "b");
}
