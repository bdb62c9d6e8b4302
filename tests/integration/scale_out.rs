//! docs/DEPLOY.md's scale-out shape on loopback: nginx (Debian's package)
//! in front of two `waste serve` replicas reading one container, and a
//! bounded mixed load through it (OpenAI, Anthropic and Ollama routes,
//! streamed and not) answered with zero 5xx by both replicas.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::common::{report_skip, TempDir};
use crate::server::{start_under, KEY};

/// A port nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// One request through `port`: (status, body).
fn request(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to nginx");
    conn.set_read_timeout(Some(std::time::Duration::from_secs(120))).unwrap();
    write!(
        conn,
        "{method} {path} HTTP/1.1\r\nHost: waste.test\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    let _ = conn.read_to_string(&mut answer);
    let status = answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, answer)
}

#[test]
fn nginx_in_front_of_two_replicas_serves_a_mixed_load_without_a_5xx() {
    let nginx = ["/usr/sbin/nginx", "/usr/bin/nginx"].into_iter().map(PathBuf::from).find(|p| p.is_file());
    let Some(nginx) = nginx else {
        report_skip("SKIP nginx_in_front_of_two_replicas_serves_a_mixed_load_without_a_5xx: nginx is not installed (apt-get install nginx-light)");
        return;
    };
    let model = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/bible-moe.waste");
    let (a, url_a) = start_under(&[], &model, &["--api-key", KEY]);
    let (b, url_b) = start_under(&[], &model, &["--api-key", KEY]);
    let upstream = |url: &str| url.trim_start_matches("http://").trim_end_matches('/').to_string();
    let tmp = TempDir::new("scale-out");
    let port = free_port();
    let conf = tmp.path().join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nuser root;\nworker_processes 1;\npid {dir}/nginx.pid;\nerror_log {dir}/error.log;\n\
             events {{ worker_connections 256; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {dir}/body;\n  proxy_temp_path {dir}/proxy;\n\
               upstream waste {{ server {a}; server {b}; }}\n\
               server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      proxy_pass http://waste;\n\
                 proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      proxy_buffering off;\n\
                 proxy_read_timeout 300s;\n    }}\n  }}\n}}\n",
            dir = tmp.path().display(),
            a = upstream(&url_a),
            b = upstream(&url_b),
        ),
    )
    .unwrap();
    let mut proxy = Command::new(&nginx)
        .args(["-p", tmp.path().to_str().unwrap(), "-c", conf.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start nginx");
    // nginx listens within moments; wait for the port.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "nginx did not listen on {port}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let chat = r#"{"messages":[{"role":"user","content":"And God said"}],"max_tokens":6,"temperature":0}"#;
    let kinds: [(&str, &str, &str); 7] = [
        ("POST", "/v1/chat/completions", chat),
        (
            "POST",
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"Who?"}],"max_tokens":6,"stream":true}"#,
        ),
        ("POST", "/v1/completions", r#"{"prompt":"In the beginning","max_tokens":6}"#),
        ("POST", "/v1/messages", r#"{"model":"m","max_tokens":6,"messages":[{"role":"user","content":"Light?"}]}"#),
        (
            "POST",
            "/api/chat",
            r#"{"model":"bible-moe","messages":[{"role":"user","content":"Hi"}],"options":{"num_predict":6}}"#,
        ),
        ("GET", "/health", ""),
        ("GET", "/v1/models", ""),
    ];
    let results: Vec<(u16, String)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..6)
            .map(|w| {
                s.spawn(move || {
                    (0..10)
                        .map(|i| {
                            let (method, path, body) = kinds[(w + i) % kinds.len()];
                            let (status, _) = request(port, method, path, body);
                            (status, path.to_string())
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().unwrap()).collect()
    });
    let _ = proxy.kill();
    let mut err = String::new();
    if let Some(mut e) = proxy.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let _ = proxy.wait();
    let bad: Vec<_> = results.iter().filter(|(s, _)| *s != 200).collect();
    assert_eq!(results.len(), 60);
    assert!(bad.is_empty(), "answers other than 200 through nginx: {bad:?}; nginx: {err}");
    // Both replicas took part.
    std::thread::sleep(std::time::Duration::from_millis(200));
    for (name, server) in [("first", &a), ("second", &b)] {
        let served = server.log().iter().filter(|l| l.starts_with("POST ") || l.starts_with("GET ")).count();
        assert!(served > 5, "the {name} replica answered {served} requests");
    }
}
