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
fn unknown_tools_are_invalid() {
    let tok = tokenizer("tiny-qwen3_moe");
    let q = template_of_config("qwen3");
    assert!(matches!(lark(&q, &tok, &[], TOOLS, Some("nope"), None), Err(ToolGrammarError::Invalid(_))));
    assert!(matches!(lark(&q, &tok, &[], "{}", None, None), Err(ToolGrammarError::Invalid(_))));
}

/// A family whose template writes each argument as tagged text: its
/// fixture's tokenizer and its template. The fixtures share one 512-entry
/// tokenizer whose end of turn is `<|im_end|>`, a token none of these
/// templates writes: the grammar ends with the call either way.
struct TextFamily {
    fixture: &'static str,
    template: &'static str,
}

const TEXT_FAMILIES: [TextFamily; 5] = [
    TextFamily { fixture: "tiny-qwen3_5_moe_text", template: "Qwen3.5-4B.jinja" },
    TextFamily { fixture: "tiny-glm4_moe", template: "GLM-4.6.jinja" },
    TextFamily { fixture: "tiny-minimax_m2", template: "MiniMax-M2.jinja" },
    TextFamily { fixture: "tiny-deepseek_v32", template: "deepseek-ai-DeepSeek-V3.2.jinja" },
    TextFamily { fixture: "tiny-deepseek_v4", template: "deepseek-ai-DeepSeek-V4.jinja" },
];

impl TextFamily {
    /// The forced call's grammar (to `name`, or any tool) and its vocabulary.
    fn grammar(&self, tools: &str, name: Option<&str>) -> (Tokenizer, Vocabulary, String) {
        let tok = tokenizer(self.fixture);
        let eos = [tok.token_id("<|im_end|>").unwrap()];
        let grammar = lark(&template_file(self.template), &tok, &eos, tools, name, None)
            .unwrap_or_else(|e| panic!("{}: {e:?}", self.template));
        let vocab = Vocabulary::new(&tok, tok.vocab_size() as u32, &eos).unwrap();
        (tok, vocab, grammar)
    }

    /// A call in the family's syntax, as the server's parser reads it.
    fn call(&self, name: &str, args: &[(&str, &str, bool)]) -> String {
        let (open, close) = match self.template {
            t if t.starts_with("Qwen") => (format!("<tool_call>\n<function={name}>\n"), "</function>\n</tool_call>"),
            t if t.starts_with("GLM") => (format!("<tool_call>{name}\n"), "</tool_call>"),
            t if t.starts_with("MiniMax") => {
                (format!("<minimax:tool_call>\n<invoke name=\"{name}\">\n"), "</invoke>\n</minimax:tool_call>")
            }
            t if t.contains("V3.2") => (
                format!("<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"{name}\">\n"),
                "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
            ),
            _ => (
                format!("<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"{name}\">\n"),
                "</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
            ),
        };
        let mut text = open;
        if args.is_empty() && self.template.contains("V4") {
            text.push('\n'); // V4's template leaves a blank line in a call without arguments.
        }
        for (k, v, is_text) in args {
            text.push_str(&match self.template {
                t if t.starts_with("Qwen") => format!("<parameter={k}>\n{v}\n</parameter>\n"),
                t if t.starts_with("GLM") => format!("<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n"),
                t if t.starts_with("MiniMax") => format!("<parameter name=\"{k}\">{v}</parameter>\n"),
                _ => format!("<｜DSML｜parameter name=\"{k}\" string=\"{is_text}\">{v}</｜DSML｜parameter>\n"),
            });
        }
        text + close
    }

    /// The answer as the model writes it: reasoning closed first where the
    /// template opens it in the generation prompt (MiniMax-M2; Qwen3.5's
    /// opens it too, but its empty past block shows in the call's turn).
    fn answer(&self, call: &str) -> String {
        match self.template {
            t if t.starts_with("MiniMax") || t.starts_with("Qwen") => format!("The weather, then.\n</think>\n\n{call}"),
            t if t.starts_with("GLM") => format!("\n<think>The weather, then.</think>\n{call}"),
            _ => call.to_string(),
        }
    }
}

#[test]
fn text_syntaxes_constrain_each_argument_to_its_schema() {
    for family in &TEXT_FAMILIES {
        let (tok, vocab, grammar) = family.grammar(TOOLS, Some("get_weather"));
        let what = family.template;
        let good = family.answer(&family.call("get_weather", &[("city", "Paris", true), ("days", "3", false)]));
        assert!(accepts(&vocab, &grammar, &tok, &good), "{what}: refused {good:?}\n{grammar}");
        for bad in [
            family.call("noop", &[]),
            family.call("get_weather", &[("city", "Paris", true), ("days", "9", false)]),
            family.call("get_weather", &[("city", "Paris", true), ("days", "three", false)]),
            family.call("get_weather", &[("city", "Parisparisparis", true), ("days", "3", false)]),
            family.call("get_weather", &[("city", "Paris", true)]),
            family.call("get_weather", &[("days", "3", false), ("city", "Paris", true)]),
        ] {
            assert!(!accepts(&vocab, &grammar, &tok, &family.answer(&bad)), "{what}: accepted {bad:?}\n{grammar}");
        }
        // Any declared tool when none is named; one without parameters.
        let (_, _, any) = family.grammar(TOOLS, None);
        let noop = family.answer(&family.call("noop", &[]));
        assert!(accepts(&vocab, &any, &tok, &noop), "{what}: refused {noop:?}\n{any}");
    }
}

#[test]
fn text_values_follow_enums_patterns_and_optional_parameters() {
    let tools = r##"[{"type": "function", "function": {"name": "set_alarm", "parameters": {"type": "object",
        "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23},
        "label": {"type": "string", "pattern": "^[a-z]{1,8}$"}, "unit": {"enum": ["C", "F"]},
        "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}}},
        "required": ["hour"], "$defs": {"tag": {"type": "string", "maxLength": 3}}}}}]"##;
    for family in &TEXT_FAMILIES {
        let (tok, vocab, grammar) = family.grammar(tools, None);
        let what = family.template;
        for good in [
            family.call("set_alarm", &[("hour", "7", false)]),
            family.call("set_alarm", &[("hour", "7", false), ("label", "wake", true), ("unit", "F", true)]),
            family.call("set_alarm", &[("hour", "0", false), ("tags", r#"["ab","c"]"#, false)]),
        ] {
            let good = family.answer(&good);
            assert!(accepts(&vocab, &grammar, &tok, &good), "{what}: refused {good:?}\n{grammar}");
        }
        for bad in [
            family.call("set_alarm", &[("label", "wake", true)]),
            family.call("set_alarm", &[("hour", "7", false), ("label", "Wake", true)]),
            family.call("set_alarm", &[("hour", "7", false), ("unit", "K", true)]),
            family.call("set_alarm", &[("hour", "7", false), ("tags", r#"["abcd"]"#, false)]),
        ] {
            assert!(!accepts(&vocab, &grammar, &tok, &family.answer(&bad)), "{what}: accepted {bad:?}\n{grammar}");
        }
    }
}

/// What transformers renders for each fixture's call (the server's tool
/// round-trip cases) is a call the grammar takes, after its reasoning.
#[test]
fn transformers_calls_in_text_syntaxes_are_accepted() {
    for (case, family) in
        [("qwen3_5", &TEXT_FAMILIES[0]), ("glm4_moe", &TEXT_FAMILIES[1]), ("minimax_m2", &TEXT_FAMILIES[2])]
    {
        let (tools, call) = expected(case);
        let (tok, vocab, grammar) = family.grammar(&tools, None);
        let answer = family.answer(&call);
        assert!(accepts(&vocab, &grammar, &tok, &answer), "{case}: {answer:?}\n{grammar}");
    }
}

/// Regression: a template whose generation prompt opens a think block
/// that its past turns leave out (MiniMax-M2, DeepSeek-V3.2) was refused as
/// "does not continue its generation prompt"; the call then follows the
/// model's own `</think>`, or comes first after an empty block.
#[test]
fn a_generation_prompt_opening_reasoning_was_not_a_call_syntax() {
    let minimax = &TEXT_FAMILIES[2];
    let (tok, vocab, grammar) = minimax.grammar(TOOLS, Some("noop"));
    let call = minimax.call("noop", &[]);
    assert!(accepts(&vocab, &grammar, &tok, &minimax.answer(&call)), "{grammar}");
    assert!(accepts(&vocab, &grammar, &tok, &format!("</think>\n{call}")), "the reasoning may be empty: {grammar}");
    assert!(!accepts(&vocab, &grammar, &tok, &call), "the think block the prompt opened must close: {grammar}");
    let deepseek = &TEXT_FAMILIES[3];
    let (tok, vocab, grammar) = deepseek.grammar(TOOLS, Some("noop"));
    let call = deepseek.call("noop", &[]);
    assert!(accepts(&vocab, &grammar, &tok, &call), "{grammar}");
    assert!(!accepts(&vocab, &grammar, &tok, &format!("Sure.{call}")), "thinking off: the call comes first");
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

/// Regression: the grammar asked for the template's end of turn as text
/// where the tokenizer has no token for it (MiniMax-M2's `[e~[` with the
/// fixture's tokenizer), so a model ending its turn with its own
/// end-of-turn token after the call broke the grammar ("the sampler plugin
/// chose token 2, which the grammar does not allow").
#[test]
fn the_templates_end_of_turn_text_was_part_of_the_call() {
    let minimax = &TEXT_FAMILIES[2];
    let (tok, vocab, grammar) = minimax.grammar(TOOLS, Some("noop"));
    let call = minimax.answer(&minimax.call("noop", &[]));
    assert!(accepts(&vocab, &grammar, &tok, &call), "{grammar}");
    assert!(!accepts(&vocab, &grammar, &tok, &format!("{call}[e~[\n")), "{grammar}");
}
