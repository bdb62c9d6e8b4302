//! The server's HTTP layer over raw sockets, as clients that are not the
//! official SDKs meet it: the key check, the routes with and without `/v1`,
//! slow or endless requests, connection and request-rate limits, and what a
//! server without a key answers.

use super::server::*;
use crate::common::TempDir;
use serde_json::json;

/// Sends one request with a raw `Authorization` header; returns the status.
fn status_with_auth(url: &str, auth: &str) -> u16 {
    get_status(url, "/v1/models", auth)
}

fn get_status(url: &str, path: &str, auth: &str) -> u16 {
    use std::io::{Read, Write};
    let host = url.trim_start_matches("http://").split('/').next().unwrap();
    let mut conn = std::net::TcpStream::connect(host).unwrap();
    write!(conn, "GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: {auth}\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{answer}"))
}

/// A lowercase `bearer` scheme was answered 401 (RFC 9110: schemes are
/// case-insensitive); a wrong key still is.
#[test]
fn server_accepts_any_case_of_the_bearer_scheme() {
    let (_server, url) = start(&bible(), &[]);
    for scheme in ["Bearer", "bearer", "BEARER"] {
        assert_eq!(status_with_auth(&url, &format!("{scheme} {KEY}")), 200, "{scheme}");
    }
    assert_eq!(status_with_auth(&url, "bearer wrong"), 401);
    assert_eq!(status_with_auth(&url, &format!("Basic {KEY}")), 401);
}

/// Clients set up for llama-server call the OpenAI routes without `/v1`
/// (`/chat/completions`, `/completions`, `/models`): they were 404s. Each
/// answers as its `/v1` twin does, key checked alike.
#[test]
fn server_answers_the_openai_routes_without_v1() {
    let (_server, url) = start(&bible(), &[]);
    let chat = serde_json::json!({"model": "bible-moe", "messages": [{"role": "user", "content": "And God said"}],
                      "max_tokens": 6, "temperature": 0});
    let text = serde_json::json!({"model": "bible-moe", "prompt": "And God said", "max_tokens": 6, "temperature": 0});
    for (path, body, field) in
        [("/chat/completions", &chat, "/choices/0/message/content"), ("/completions", &text, "/choices/0/text")]
    {
        let (with, a) = post_json(&url, &format!("/v1{path}"), body);
        let (without, b) = post_json(&url, path, body);
        assert_eq!((with, without), (200, 200), "{path}: {a} / {b}");
        assert_eq!(a.pointer(field), b.pointer(field), "{path}");
        assert!(a.pointer(field).and_then(|v| v.as_str()).is_some_and(|t| !t.is_empty()), "{a}");
    }
    for path in ["/models", "/models/bible-moe"] {
        assert_eq!(get_status(&url, path, &format!("Bearer {KEY}")), 200, "{path}");
        assert_eq!(get_status(&url, path, "Bearer wrong"), 401, "{path}");
    }
}

/// Writes `request` on a new connection and reads until the server closes
/// it or `wait` passes; returns what came back and how long it took.
fn raw_exchange(url: &str, request: &[u8], wait: std::time::Duration) -> (String, std::time::Duration) {
    use std::io::{Read, Write};
    let host = url.trim_start_matches("http://").split('/').next().unwrap();
    let mut conn = std::net::TcpStream::connect(host).unwrap();
    conn.set_read_timeout(Some(wait)).unwrap();
    let started = std::time::Instant::now();
    let _ = conn.write_all(request);
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
    (String::from_utf8_lossy(&answer).into_owned(), started.elapsed())
}

/// Partial headers, a short body and a chunk size of FFFFFFFFFFFFFFFF were
/// held open forever: each now ends within its timeout.
#[test]
fn server_times_out_slow_headers_and_bodies() {
    let (_server, url) = start(&bible(), &["--header-timeout", "1", "--body-timeout", "1"]);
    let host = url.trim_start_matches("http://");
    let wait = std::time::Duration::from_secs(20);
    let (_, took) = raw_exchange(&url, format!("GET /health HTTP/1.1\r\nHost: {host}\r\nX-Slow: ").as_bytes(), wait);
    assert!(took < std::time::Duration::from_secs(8), "partial headers held for {took:?}");
    let short = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"prompt\""
    );
    let (answer, took) = raw_exchange(&url, short.as_bytes(), wait);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(took < std::time::Duration::from_secs(8), "a short body held for {took:?}");
    let chunked = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFF\r\n"
    );
    let (answer, took) = raw_exchange(&url, chunked.as_bytes(), wait);
    assert!(!answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(took < std::time::Duration::from_secs(8), "a huge chunk size held for {took:?}");
}

/// 1,500 idle connections exhausted the server's file descriptors and
/// /health stopped answering: past --max-connections new ones are closed,
/// idle ones time out, and /health answers again.
#[test]
fn server_limits_connections_and_recovers_from_idle_ones() {
    let (_server, url) = start(&bible(), &["--max-connections", "4", "--header-timeout", "1"]);
    let host = url.trim_start_matches("http://").to_string();
    let idle: Vec<std::net::TcpStream> = (0..4).map(|_| std::net::TcpStream::connect(&host).unwrap()).collect();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let health = format!("GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    let (answer, _) = raw_exchange(&url, health.as_bytes(), std::time::Duration::from_secs(5));
    assert!(!answer.contains("200 OK"), "a fifth connection was served past --max-connections 4: {answer}");
    // The idle four are closed after the header timeout.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let (answer, _) = raw_exchange(&url, health.as_bytes(), std::time::Duration::from_secs(5));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    drop(idle);
}

/// Without an API key, a `text/plain` body from any origin started a
/// generation (a web page could): bodies must be JSON, and without a key
/// only this machine's names and origins are answered.
#[test]
fn server_without_a_key_answers_this_machine_only_and_json_only() {
    let (_server, url) = start_with(&bible(), &["--cors-origin", "http://allowed.example"]);
    let host = url.trim_start_matches("http://").to_string();
    let wait = std::time::Duration::from_secs(20);
    let post = |host_header: &str, extra: &str, content_type: &str| {
        let body = r#"{"prompt": "And God said", "max_tokens": 1}"#;
        let req = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: {host_header}\r\n{extra}Content-Type: {content_type}\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        raw_exchange(&url, req.as_bytes(), wait).0
    };
    assert!(post(&host, "", "application/json").starts_with("HTTP/1.1 200"));
    assert!(post(&host, "", "application/json; charset=utf-8").starts_with("HTTP/1.1 200"));
    assert!(post(&host, "", "text/plain").starts_with("HTTP/1.1 415"));
    assert!(post("evil.example", "", "application/json").starts_with("HTTP/1.1 403"));
    assert!(post(&host, "Origin: http://evil.example\r\n", "application/json").starts_with("HTTP/1.1 403"));
    assert!(post(&host, "Origin: http://localhost:3000\r\n", "application/json").starts_with("HTTP/1.1 200"));
    assert!(post(&host, "Origin: http://allowed.example\r\n", "application/json").starts_with("HTTP/1.1 200"));
}

/// One connection could send requests as fast as it liked: past
/// --max-request-rate a second it is answered 429 with Retry-After, and
/// other connections are served.
#[test]
fn server_caps_the_request_rate_of_one_connection() {
    let (_server, url) = start(&bible(), &["--max-request-rate", "5"]);
    let host = url.trim_start_matches("http://").to_string();
    let one = format!("GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n");
    let mut burst = one.repeat(11);
    burst.push_str(&format!("GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"));
    let (answer, _) = raw_exchange(&url, burst.as_bytes(), std::time::Duration::from_secs(10));
    let ok = answer.matches("HTTP/1.1 200").count();
    let limited = answer.matches("HTTP/1.1 429").count();
    assert_eq!(ok + limited, 12, "{answer}");
    assert!((5..=10).contains(&ok) && limited >= 2, "{ok} answered, {limited} limited");
    assert!(answer.contains("retry-after: 1"), "{answer}");
    let close = format!("GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    let (answer, _) = raw_exchange(&url, close.as_bytes(), std::time::Duration::from_secs(5));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// Tools set up for llama-server read `/tokenize`, `/detokenize`,
/// `/apply-template` and `/props`; they were 404s. Each answers in
/// llama-server's shape and agrees with what generation does: the
/// rendered template, tokenized with its special tokens, is exactly the
/// prompt a chat completion of the same body counts; `/props` reports the
/// context and the container's own template; bad input is a 400 naming its
/// field, and the key is checked.
#[test]
fn server_answers_llama_servers_tokenize_detokenize_apply_template_and_props() {
    let (_server, url) = start(&bible(), &[]);

    let text = "And God said, Let there be light: and there was light.";
    let (status, t) = post_json(&url, "/tokenize", &json!({"content": text}));
    assert_eq!(status, 200, "{t}");
    let ids: Vec<u64> = t["tokens"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert!(ids.len() > 5, "{t}");
    let (status, d) = post_json(&url, "/detokenize", &json!({"tokens": ids}));
    assert_eq!((status, d["content"].as_str()), (200, Some(text)), "{d}");
    // The pieces, in order, spell the text; each names its id.
    let (_, p) = post_json(&url, "/tokenize", &json!({"content": text, "with_pieces": true}));
    let pieces = p["tokens"].as_array().unwrap();
    assert_eq!(pieces.iter().map(|x| x["id"].as_u64().unwrap()).collect::<Vec<_>>(), ids, "{p}");
    assert_eq!(pieces.iter().map(|x| x["piece"].as_str().unwrap()).collect::<String>(), text, "{p}");
    // A completion's prompt is BOS (when the model has one) and the text.
    let (_, c) = post_json(&url, "/v1/completions", &json!({"prompt": text, "max_tokens": 1}));
    let (_, with_bos) = post_json(&url, "/tokenize", &json!({"content": text, "add_special": true}));
    assert_eq!(with_bos["tokens"].as_array().unwrap().len() as u64, c["usage"]["prompt_tokens"].as_u64().unwrap());

    let chat = json!({"messages": [{"role": "system", "content": "Answer briefly."},
                                    {"role": "user", "content": "Who made the light?"}], "max_tokens": 1});
    let (status, a) = post_json(&url, "/apply-template", &chat);
    assert_eq!(status, 200, "{a}");
    let prompt = a["prompt"].as_str().unwrap();
    assert!(
        prompt.starts_with("<|im_start|>system\nAnswer briefly.<|im_end|>\n")
            && prompt.ends_with("<|im_start|>assistant\n"),
        "{prompt}"
    );
    let (_, rendered) = post_json(&url, "/tokenize", &json!({"content": prompt}));
    let (_, answered) = post_json(&url, "/v1/chat/completions", &chat);
    assert_eq!(
        rendered["tokens"].as_array().unwrap().len() as u64,
        answered["usage"]["prompt_tokens"].as_u64().unwrap(),
        "{prompt}"
    );
    // Without parsing specials the markers are text: more tokens.
    let (_, literal) = post_json(&url, "/tokenize", &json!({"content": prompt, "parse_special": false}));
    assert!(literal["tokens"].as_array().unwrap().len() > rendered["tokens"].as_array().unwrap().len());

    let (status, props) = get_json(&url, "/props");
    assert_eq!(status, 200, "{props}");
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(std::path::Path::new(&bible()).join("tokenizer_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(props["chat_template"], config["chat_template"]);
    let (_, models) = get_json(&url, "/v1/models");
    assert!(props["default_generation_settings"]["n_ctx"].as_u64().is_some_and(|n| n > 0), "{props}");
    assert_eq!(props["model_alias"], models["data"][0]["id"], "{props}");
    assert_eq!(props["total_slots"], 1);
    assert_eq!(props["modalities"]["vision"], false);
    assert!(props["model_path"].as_str().is_some_and(|p| p.ends_with("bible-moe.waste")), "{props}");

    for (path, body, param) in [
        ("/tokenize", json!({"text": "x"}), "content"),
        ("/tokenize", json!({"content": "x", "with_pieces": "yes"}), "with_pieces"),
        ("/detokenize", json!({"tokens": [5, 99999999]}), "tokens[1]"),
        ("/detokenize", json!({"tokens": "5"}), "tokens"),
    ] {
        let (status, e) = post_json(&url, path, &body);
        assert_eq!((status, e["error"]["param"].as_str()), (400, Some(param)), "{path} {body}: {e}");
    }
    assert_eq!(get_status(&url, "/props", "Bearer wrong"), 401);
}

/// An Anthropic conversation with extended thinking sends each earlier
/// turn's `thinking` block back; that was a 400. Through Qwen3's real
/// template (which renders reasoning of the turns after the last user
/// query) the block now lengthens the prompt it belongs to, and a message
/// with it is answered.
#[test]
fn server_takes_anthropic_thinking_blocks_back_in_history() {
    let tmp = TempDir::new("server-thinking");
    let (_server, url) = start(&crate::common::bible_moe_with_qwen3_template(&tmp), &[]);
    let body = |assistant: serde_json::Value| {
        // No tools declared: their preamble would not fit the 256-token
        // context; the template renders the calls all the same.
        serde_json::json!({"model": "m", "max_tokens": 4,
            "messages": [{"role": "user", "content": "Who made the light?"},
                         {"role": "assistant", "content": assistant},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "God"}]}]})
    };
    let call = serde_json::json!({"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}});
    let thinking =
        serde_json::json!({"type": "thinking", "thinking": "The first chapter says.", "signature": "waste-00"});
    let (s1, plain) = post_json(&url, "/v1/messages/count_tokens", &body(serde_json::json!([call.clone()])));
    let (s2, with) =
        post_json(&url, "/v1/messages/count_tokens", &body(serde_json::json!([thinking.clone(), call.clone()])));
    assert_eq!((s1, s2), (200, 200), "{plain} {with}");
    assert!(with["input_tokens"].as_u64() > plain["input_tokens"].as_u64(), "{plain} {with}");
    let (status, answer) = post_json(&url, "/v1/messages", &body(serde_json::json!([thinking, call])));
    assert_eq!(status, 200, "{answer}");
}

/// Each API's own switch for reasoning reaches the template (it was
/// ignored: only `chat_template_kwargs` did): through Qwen3's real
/// template, off (OpenAI `reasoning_effort: "none"`, Anthropic `thinking:
/// {"type": "disabled"}`, Ollama `think: false`) adds the empty think block
/// transformers renders for `enable_thinking=False`, so the prompt grows;
/// on leaves the template's default; a malformed switch is a 400.
#[test]
fn server_maps_each_apis_thinking_switch_onto_the_template() {
    let tmp = TempDir::new("server-thinking-switch");
    let (_server, url) = start(&crate::common::bible_moe_with_qwen3_template(&tmp), &[]);
    let ask = json!([{"role": "user", "content": "And God said"}]);
    let openai = |extra: serde_json::Value| {
        let mut body = json!({"messages": ask, "max_tokens": 1, "temperature": 0});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (status, v) = post_json(&url, "/v1/chat/completions", &body);
        assert_eq!(status, 200, "{v}");
        v["usage"]["prompt_tokens"].as_u64().unwrap()
    };
    let plain = openai(json!({}));
    assert_eq!(openai(json!({"reasoning_effort": "high"})), plain);
    let off = openai(json!({"reasoning_effort": "none"}));
    assert!(off > plain, "reasoning_effort none: {off}, plain {plain}");
    // The client's own template variable wins.
    assert_eq!(openai(json!({"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": true}})), plain);

    let anthropic = |extra: serde_json::Value| {
        let mut body = json!({"model": "m", "messages": ask, "max_tokens": 1});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (status, v) = post_json(&url, "/v1/messages/count_tokens", &body);
        assert_eq!(status, 200, "{v}");
        v["input_tokens"].as_u64().unwrap()
    };
    assert_eq!(anthropic(json!({})), plain);
    assert_eq!(anthropic(json!({"thinking": {"type": "enabled", "budget_tokens": 1024}})), plain);
    assert_eq!(anthropic(json!({"thinking": {"type": "disabled"}})), off);

    let ollama = |think: serde_json::Value| {
        let body = json!({"model": "m", "messages": ask, "stream": false, "think": think,
                          "options": {"num_predict": 1, "temperature": 0}});
        let (status, v) = post_json(&url, "/api/chat", &body);
        assert_eq!(status, 200, "{v}");
        v["prompt_eval_count"].as_u64().unwrap()
    };
    assert_eq!(ollama(json!(true)), plain);
    assert_eq!(ollama(json!(false)), off);

    for (path, body) in [
        ("/v1/chat/completions", json!({"messages": ask, "reasoning_effort": "very"})),
        ("/v1/messages", json!({"model": "m", "messages": ask, "max_tokens": 1, "thinking": {"type": "sometimes"}})),
        ("/api/chat", json!({"model": "m", "messages": ask, "think": "very"})),
    ] {
        let (status, v) = post_json(&url, path, &body);
        assert_eq!(status, 400, "{path}: {v}");
    }
}

/// `waste serve --chat-template FILE` on a model that carries no template
/// answered every chat request "this model has no chat template": the
/// check looked at the model's template, not the one the server was given.
#[test]
fn chat_template_file_was_refused_for_a_model_without_a_template() {
    let tmp = TempDir::new("server-no-template");
    let dir = tmp.path().join("bible-no-template.waste");
    crate::common::copy_dir(&bible(), &dir);
    let cfg_path = dir.join("tokenizer_config.json");
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg.as_object_mut().unwrap().remove("chat_template");
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let template = tmp.path().join("chatml.jinja");
    std::fs::write(
        &template,
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
         {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )
    .unwrap();
    let chat = json!({"messages": [{"role": "user", "content": "And God said"}], "max_tokens": 2, "temperature": 0});

    let (without, url) = start(&dir, &[]);
    let (status, body) = post_json(&url, "/v1/chat/completions", &chat);
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("no chat template"), "{body}");
    drop(without);

    let (_with, url) = start(&dir, &["--chat-template", template.to_str().unwrap()]);
    let (status, body) = post_json(&url, "/v1/chat/completions", &chat);
    assert_eq!(status, 200, "{body}");
    let (status, rendered) = post_json(&url, "/apply-template", &chat);
    assert_eq!(status, 200, "{rendered}");
    assert_eq!(rendered["prompt"], "<|im_start|>user\nAnd God said<|im_end|>\n<|im_start|>assistant\n", "{rendered}");
}

/// A streamed request's NDJSON lines. HTTP/1.0, so the stream comes
/// without chunked framing and ends when the server closes.
fn post_ndjson(url: &str, path: &str, body: &serde_json::Value) -> Vec<serde_json::Value> {
    use std::io::{Read, Write};
    let host = url.trim_start_matches("http://").split('/').next().unwrap();
    let mut conn = std::net::TcpStream::connect(host).unwrap();
    let body = body.to_string();
    write!(
        conn,
        "POST {path} HTTP/1.0\r\nHost: {host}\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    let (head, lines) = answer.split_once("\r\n\r\n").unwrap_or_else(|| panic!("{answer}"));
    assert!(head.contains(" 200 "), "{answer}");
    lines.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

/// `/api/generate` with a templated prompt left the model's reasoning in
/// `response` (only `/api/chat` split it): now it goes to `thinking`, whole
/// and streamed, as `/api/chat` splits the same answer, for each family's
/// markers (`<think>` blocks, those the prompt opens, harmony's analysis).
#[test]
fn ollama_generate_left_the_reasoning_in_the_response() {
    let expected: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("server/tool_call_expected.json"),
        )
        .unwrap(),
    )
    .unwrap();
    each_scripted_tool_server(|name, url, served| {
        // gpt-oss's scripted answer ends in a tool call, and without tools a
        // call stays text, the whole answer with it (`Reading::split`).
        let reasoning = match name {
            "gpt_oss" => serde_json::Value::Null,
            _ => expected["cases"][name]["reasoning"].clone(),
        };
        let question = "What is the weather in Paris?";
        let chat = json!({"model": served, "messages": [{"role": "user", "content": question}], "stream": false});
        let (status, chat) = post_json(url, "/api/chat", &chat);
        assert_eq!(status, 200, "{name}: {chat}");
        assert_eq!(chat["message"]["thinking"], reasoning, "{name}: {chat}");
        let generate = json!({"model": served, "prompt": question, "stream": false});
        let (status, whole) = post_json(url, "/api/generate", &generate);
        assert_eq!(status, 200, "{name}: {whole}");
        assert_eq!(whole["thinking"], reasoning, "{name}: {whole}");
        assert_eq!(whole["response"], chat["message"]["content"], "{name}: {whole}");

        let lines = post_ndjson(url, "/api/generate", &json!({"model": served, "prompt": question}));
        let joined = |field: &str| lines.iter().filter_map(|l| l[field].as_str()).collect::<String>();
        assert_eq!(joined("thinking"), reasoning.as_str().unwrap_or(""), "{name}: {lines:?}");
        assert_eq!(joined("response"), whole["response"].as_str().unwrap(), "{name}: {lines:?}");
        assert_eq!(lines.last().unwrap()["done"], true, "{name}");
    });
}
