//! The server's HTTP layer over raw sockets, as clients that are not the
//! official SDKs meet it: the key check, the routes with and without `/v1`,
//! slow or endless requests, connection and request-rate limits, and what a
//! server without a key answers.

use super::server::*;

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
