//! Structured output (issue 18 item 3): from a model with random weights,
//! which knows nothing of JSON, every constrained answer must parse and
//! validate, because the token mask alone shapes it; a malformed or
//! unsatisfiable schema or grammar is a 400 / exit 2 with the reason.

use std::path::{Path, PathBuf};

use waste_host::{Constraint, Engine, GenerateParams, StopReason};

use crate::common::{convert, open_session, report_skip, stderr, stdout, waste, TempDir};
use crate::server::{post_json, python_has, run_client_script, start, tool_model};

fn tiny_qwen3(tmp: &TempDir) -> PathBuf {
    convert("qwen3_moe", "q8", "q8", tmp.path())
}

/// tests/server/test_structured.py against the tiny Qwen3-MoE fixture (512
/// positions, a 512-token byte-level vocabulary): hundreds of generations
/// through OpenAI's `response_format` (strict and not, sampled, greedy,
/// streamed, chat and completions), Ollama's `format`, the `grammar` field
/// (Lark, GBNF, regex), JSON mode, all checked with `jsonschema`; and the
/// malformed and unsatisfiable cases answered 400 on the right field.
#[test]
fn server_structured_output_always_parses_and_validates() {
    if let Err(why) = python_has("jsonschema", "jsonschema") {
        report_skip(&format!("SKIP server_structured_output_always_parses_and_validates: {why}"));
        return;
    }
    let tmp = TempDir::new("structured-server");
    let model = tiny_qwen3(&tmp);
    let (server, url) = start(&model, &["--cache-sessions", "0"]);
    let id = model.file_name().unwrap().to_string_lossy().trim_end_matches(".waste").to_string();
    run_client_script("test_structured.py", "all structured checks passed", "structured", &url, &[&id, "512", "3"]);
    drop(server);
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

/// `waste run --json-schema / --grammar / --json-object`: every seed's
/// answer is in the language, and once the grammar is complete the model's
/// end of turn ends it.
#[test]
fn cli_run_follows_json_schema_and_grammar_files() {
    let tmp = TempDir::new("structured-cli");
    let model = tiny_qwen3(&tmp);
    let m = model.to_str().unwrap();
    let schema = write(
        tmp.path(),
        "person.json",
        r#"{"type": "object", "properties": {"name": {"type": "string", "pattern": "^[A-Z][a-z]{1,6}$"},
            "age": {"type": "integer", "minimum": 0, "maximum": 120}},
            "required": ["name", "age"], "additionalProperties": false}"#,
    );
    let gbnf = write(tmp.path(), "list.gbnf", "root ::= \"[\" item (\",\" item){0,2} \"]\"\nitem ::= [0-9]{1,3}\n");
    let lark = write(tmp.path(), "answer.lark", "start: \"answer: \" (\"yes\" | \"no\")\n");
    for seed in 0..8 {
        let seed = seed.to_string();
        let o = waste(&["run", m, "JSON:", "--json-schema", &schema, "--seed", &seed, "-n", "80"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value =
            serde_json::from_str(&stdout(&o)).unwrap_or_else(|e| panic!("seed {seed}: {e}: {:?}", stdout(&o)));
        let name = v["name"].as_str().unwrap();
        assert!(name.len() >= 2 && name.chars().next().unwrap().is_ascii_uppercase(), "{v}");
        assert!((0..=120).contains(&v["age"].as_i64().unwrap()), "{v}");
        assert!(stderr(&o).contains("(stop: eos)"), "{}", stderr(&o));

        let o = waste(&["run", m, "x", "--grammar", &gbnf, "--seed", &seed, "-n", "40"]);
        assert!(o.status.success(), "{}", stderr(&o));
        // The CLI ends its output with a newline.
        let text = stdout(&o).trim_end_matches('\n').to_string();
        let inner = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')).unwrap_or_else(|| panic!("{text:?}"));
        assert!(
            inner.split(',').all(|n| (1..=3).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_digit())),
            "{text:?}"
        );

        let o = waste(&["run", m, "x", "--grammar", &lark, "--seed", &seed, "-n", "40"]);
        assert!(["answer: yes", "answer: no"].contains(&stdout(&o).trim_end_matches('\n')), "{:?}", stdout(&o));
    }
}

/// A malformed or unsatisfiable schema or grammar is exit 2 with one line
/// naming the reason, before anything is evaluated.
#[test]
fn cli_refuses_malformed_and_unsatisfiable_constraints_with_exit_2() {
    let tmp = TempDir::new("structured-cli-bad");
    let model = tiny_qwen3(&tmp);
    let m = model.to_str().unwrap();
    for (flag, name, text, why) in [
        ("--json-schema", "notjson.json", "{\"type\": ", "not JSON"),
        ("--json-schema", "range.json", r#"{"type": "integer", "minimum": 5, "maximum": 1}"#, "grammar"),
        ("--grammar", "bad.gbnf", "root ::= missing\n", "undefined rule `missing`"),
        ("--grammar", "bad.lark", "start: (\"a\"\n", "grammar"),
    ] {
        let path = write(tmp.path(), name, text);
        let o = waste(&["run", m, "x", flag, &path, "-n", "4"]);
        assert_eq!(o.status.code(), Some(2), "{name}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(err.contains(why), "{name}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{name}: {err}");
        assert!(stdout(&o).is_empty(), "{name}: printed {:?}", stdout(&o));
    }
    let o = waste(&["run", m, "x", "--json-schema", "/nonexistent/schema.json"]);
    assert_ne!(o.status.code(), Some(0));
}

/// The Rust API: the same seed gives the same constrained answer, a
/// complete grammar leaves only the end of turn (or, with `stop_at_eos`
/// off, ends the generation itself), and `check_params` refuses a bad
/// grammar as an argument error. The host's bound on grammar text is the
/// component's.
#[test]
fn api_constrained_generation_is_deterministic_and_checked() {
    assert_eq!(waste_host::MAX_CONSTRAINT_BYTES, waste_guest::constraint::MAX_GRAMMAR_BYTES);
    let tmp = TempDir::new("structured-api");
    let model = tiny_qwen3(&tmp);
    let engine = Engine::new().unwrap();
    let params = GenerateParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        seed: 11,
        max_tokens: 60,
        constraint: Some(Constraint::Regex(r"[a-f]{3}-[0-9]{2}".into())),
        ..GenerateParams::default()
    };
    let mut answers = Vec::new();
    for (stop_at_eos, reason) in [(true, StopReason::Eos), (false, StopReason::Grammar)] {
        let params = GenerateParams { stop_at_eos, ..params.clone() };
        let mut s = open_session(&engine, &model);
        let prompt = s.tokenize("x").unwrap();
        s.check_params(&params).unwrap();
        let c = s.generate(&prompt, &params, |_| true).unwrap();
        assert_eq!(c.stop_reason, reason, "{c:?}");
        let t = c.text.as_bytes();
        assert!(t.len() == 6 && t[3] == b'-' && t[..3].iter().all(|b| (b'a'..=b'f').contains(b)), "{:?}", c.text);
        answers.push(c.text);
    }
    assert_eq!(answers[0], answers[1]);
    let mut s = open_session(&engine, &model);
    let bad = GenerateParams { constraint: Some(Constraint::Regex("(".into())), ..params };
    assert!(matches!(s.check_params(&bad), Err(waste_host::Error::Arg(_))), "{:?}", s.check_params(&bad));
}

/// Whether test_forced_tool.py's clients are there; false after
/// reporting why `test` skips.
fn forced_tool_clients_or_skip(test: &str) -> bool {
    python_has("anthropic, openai, jsonschema", "anthropic openai jsonschema")
        .map_err(|why| report_skip(&format!("SKIP {test}: {why}")))
        .is_ok()
}

/// A forced tool call (Anthropic `any` / `tool`, OpenAI "required" / a
/// named function) from the random-weight fixture with Qwen2.5's template:
/// every answer is one call of an allowed tool, its input valid against
/// the tool's schema (tests/server/test_forced_tool.py, jsonschema).
#[test]
fn server_forced_tool_calls_follow_the_tools_schema() {
    if !forced_tool_clients_or_skip("server_forced_tool_calls_follow_the_tools_schema") {
        return;
    }
    let tmp = TempDir::new("structured-forced-tool");
    let src = tmp.path().join("qwen3-hermes");
    std::fs::create_dir(&src).unwrap();
    for e in std::fs::read_dir(crate::common::fixture("qwen3_moe")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), src.join(e.file_name())).unwrap();
    }
    let template = crate::common::fixtures().join("chat_templates/llamacpp/Qwen-Qwen2.5-7B-Instruct.jinja");
    let cfg_path = src.join("tokenizer_config.json");
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["chat_template"] = std::fs::read_to_string(template).unwrap().into();
    // The tools' descriptions take more than the fixture's 512 positions.
    cfg["model_max_length"] = 2048.into();
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let config_path = src.join("config.json");
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["max_position_embeddings"] = 2048.into();
    std::fs::write(&config_path, config.to_string()).unwrap();
    let model = tmp.path().join("qwen3-hermes.waste");
    let o = waste(&["convert", src.to_str().unwrap(), model.to_str().unwrap(), "--experts", "q8", "--trunk", "q8"]);
    assert!(o.status.success(), "convert: {}", stderr(&o));
    let (server, url) = start(&model, &[]);
    run_client_script(
        "test_forced_tool.py",
        "all forced tool checks passed",
        "forced tool",
        &url,
        &["qwen3-hermes", "6"],
    );
    drop(server);
}

/// Forced tool calls in each family's own syntax: Qwen3's Hermes JSON
/// after its think block, and the syntaxes that
/// write arguments as tagged text (Qwen3.5's XML, GLM-4.6's key/value
/// pairs, DeepSeek-V3.2's and V4's DSML), from the random-weight fixtures
/// with thinking off so the call comes first: every answer, as the
/// server's parser reads it back, is one call of an allowed tool whose
/// arguments satisfy its schema (tests/server/test_forced_tool.py,
/// jsonschema). MiniMax-M2, which always reasons first, and gpt-oss have
/// their own test.
#[test]
fn server_forced_tool_calls_in_each_familys_syntax() {
    if !forced_tool_clients_or_skip("server_forced_tool_calls_in_each_familys_syntax") {
        return;
    }
    for (name, fixture, template) in [
        ("qwen3", "tiny-qwen3_moe", "qwen3"),
        ("qwen3_5", "tiny-qwen3_5_moe_text", "Qwen3.5-4B.jinja"),
        ("glm4_moe", "tiny-glm4_moe", "GLM-4.6.jinja"),
        ("deepseek_v32", "tiny-deepseek_v32", "deepseek-ai-DeepSeek-V3.2.jinja"),
        ("deepseek_v4", "tiny-deepseek_v4", "deepseek-ai-DeepSeek-V4.jinja"),
    ] {
        let tmp = TempDir::new(&format!("structured-forced-{name}"));
        let model = tool_model(&tmp, name, fixture, template);
        let (server, url) = start(&model, &[]);
        let served = format!("{name}-tools");
        run_client_script(
            "test_forced_tool.py",
            "all forced tool checks passed",
            &format!("forced tool, {name}"),
            &url,
            &[served.as_str(), "3", "thinking-off"],
        );
        drop(server);
    }
}

/// MiniMax-M2 always reasons first (its generation prompt opens the think
/// block), and so does gpt-oss in its analysis channel, whose markers the
/// fixture's tokenizer spells as text, so its call's header cannot end the
/// reasoning as a special token does; a random-weight model never ends
/// that reasoning by itself, so examples/sampler-script writes it and the
/// call's opening up to its arguments; the token mask alone chooses the
/// rest (the script falls back to greedy choice among what the mask
/// allows). The answer must be the named tool's call, its reasoning apart,
/// its arguments within the schema.
#[test]
fn server_forced_tool_call_after_scripted_reasoning() {
    forced_call_after_reasoning(
        "minimax_m2",
        "tiny-minimax_m2",
        "MiniMax-M2.jinja",
        "Checking.\n</think>\n\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<",
    );
    forced_call_after_reasoning(
        "gpt_oss",
        "tiny-gpt_oss",
        "openai-gpt-oss-120b.jinja",
        "<|channel|>analysis<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary \
         to=functions.get_weather <|constrain|>json<|message|>",
    );
}

fn forced_call_after_reasoning(name: &str, fixture: &str, template: &str, opening: &str) {
    let tmp = TempDir::new(&format!("structured-forced-{name}"));
    let model = tool_model(&tmp, name, fixture, template);
    let o = waste(&["tokenize", model.to_str().unwrap(), opening, "--json"]);
    assert!(o.status.success(), "tokenize: {}", stderr(&o));
    let ids: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let ids = ids.get("tokens").unwrap_or(&ids).as_array().unwrap().clone();
    let mut args = vec!["--sampler".to_string(), crate::plugins::plugin("script").to_str().unwrap().to_string()];
    for (i, id) in ids.iter().enumerate() {
        args.extend(["--sampler-opt".to_string(), format!("t{i}={id}")]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (server, url) = start(&model, &args);
    let weather = serde_json::json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 10}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "unit": {"enum": ["C", "F"]}}, "required": ["city", "days", "unit"], "additionalProperties": false});
    let body = serde_json::json!({"model": name, "max_tokens": 200,
        "messages": [{"role": "user", "content": "Call a tool."}],
        // gpt-oss's template writes each tool's description, and fails without one.
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": weather}},
                  {"type": "function", "function": {"name": "set_alarm", "description": "Alarm", "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}});
    let (status, answer) = post_json(&url, "/v1/chat/completions", &body);
    drop(server);
    assert_eq!(status, 200, "{name}: {answer}");
    let choice = &answer["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{answer}");
    assert_eq!(choice["message"]["reasoning_content"], "Checking.", "{answer}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{answer}");
    assert_eq!(calls[0]["function"]["name"], "get_weather", "{answer}");
    let a: serde_json::Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("{name}: {e}: {answer}"));
    let city = a["city"].as_str().unwrap_or_else(|| panic!("city: {a}"));
    assert!(city.chars().count() <= 10, "{a}");
    assert!(a["days"].as_u64().is_some_and(|d| (1..=7).contains(&d)), "{a}");
    assert!(a["unit"] == "C" || a["unit"] == "F", "{a}");
    assert_eq!(a.as_object().unwrap().len(), 3, "{a}");
}
