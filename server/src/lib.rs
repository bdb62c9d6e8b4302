//! `waste serve`: an HTTP server over the WASTE Rust API speaking OpenAI's
//! chat, completions and Responses APIs, Anthropic's Messages API and Ollama's API,
//! each a folder that parses its requests and shapes its answers around
//! one request driver (see [`driver`]). One engine thread per model
//! generates (see [`worker`]); tokio + axum carry the HTTP side and never
//! run the engine themselves.
//!
//! Layering inside the crate, each module using only those listed before
//! it (tests/integration/layering.rs holds it): `error`, `ordered`,
//! `tools`, `neutral`, `structured`, `prefix_cache`, `worker`, `state`, `driver`, `openai`,
//! `responses`, `anthropic`, `ollama`, `llama_server`, `http`.

mod anthropic;
mod driver;
mod error;
mod http;
mod llama_server;
mod neutral;
mod ollama;
mod openai;
mod ordered;
mod prefix_cache;
mod responses;
mod state;
mod structured;
mod tools;
mod worker;

use std::net::SocketAddr;

use axum::response::IntoResponse;
use std::sync::Arc;

pub use error::{Error, Result};
pub use prefix_cache::DiskOptions as PromptCacheOptions;
use waste_host::{Engine, Model};

pub struct ServeOptions {
    pub host: String,
    pub port: u16,
    /// When set, every /v1 request must carry `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
    /// Requests queued or running at most; past it the answer is 503.
    pub queue_limit: usize,
    /// Largest request body accepted, in bytes; past it the answer is 413.
    pub body_limit: usize,
    /// The name clients use in `model` and that /v1/models lists.
    pub model_id: String,
    /// A sampler plugin every request's generation draws its tokens from
    /// (the request's own sampling fields still reach it as parameters).
    pub sampler: Option<waste_host::plugin::SamplerPlugin>,
    /// A Jinja chat template to render conversations with instead of the
    /// model's own.
    pub chat_template: Option<String>,
    /// The model file as given (reported by `/props`).
    pub model_path: Option<String>,
    /// Answer 404 to a request naming another model, instead of answering
    /// it with this one and a warning header.
    pub strict_model_name: bool,
    /// Origins a browser may call from (`*` for any); none: no CORS.
    pub cors_origins: Vec<String>,
    /// No log line per request on stderr.
    pub quiet: bool,
    /// A client must send a request's headers within this, and an idle
    /// keep-alive connection is closed after it.
    pub header_timeout: std::time::Duration,
    /// A request body must arrive within this (408 past it).
    pub body_timeout: std::time::Duration,
    /// Connections open at once; past it new ones are closed at accept.
    pub max_connections: usize,
    /// Requests one connection may send per second; past it 429.
    pub max_request_rate: u32,
    /// Where finished requests' states are saved, so a conversation resumes
    /// after a restart (`--prompt-cache-dir`); none: memory only.
    pub prompt_cache: Option<PromptCacheOptions>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            host: "127.0.0.1".into(),
            port: 8080,
            api_key: None,
            queue_limit: 64,
            body_limit: 4 << 20,
            model_id: "model".into(),
            sampler: None,
            chat_template: None,
            model_path: None,
            strict_model_name: false,
            cors_origins: Vec::new(),
            quiet: false,
            header_timeout: std::time::Duration::from_secs(10),
            body_timeout: std::time::Duration::from_secs(30),
            max_connections: 256,
            max_request_rate: 100,
            prompt_cache: None,
        }
    }
}

/// Serves `model` until Ctrl-C. `on_listening` receives the bound address
/// (useful with port 0) once connections are accepted.
pub fn serve(
    engine: Engine,
    model: Arc<Model>,
    options: ServeOptions,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<()> {
    let context = model.context();
    let system_fingerprint = fingerprint(&model);
    let worker = worker::Worker::start(
        engine,
        Arc::clone(&model),
        options.queue_limit.max(1),
        options.sampler,
        options.chat_template.clone(),
        options.prompt_cache,
    )?;
    let state = Arc::new(state::AppState {
        worker,
        model,
        model_id: options.model_id,
        api_key: options.api_key,
        body_limit: options.body_limit,
        context,
        created: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        system_fingerprint,
        strict_model_name: options.strict_model_name,
        cors_origins: options.cors_origins,
        quiet: options.quiet,
        body_timeout: options.body_timeout,
        metrics: state::Metrics::default(),
        chat_template: options.chat_template,
        model_path: options.model_path,
    });
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async move {
        let addr = format!("{}:{}", options.host, options.port);
        let listener = tokio::net::TcpListener::bind((options.host.as_str(), options.port))
            .await
            .map_err(|source| Error::Bind { addr, source })?;
        on_listening(listener.local_addr()?);
        let limits = ConnectionLimits {
            header_timeout: options.header_timeout,
            max_connections: options.max_connections,
            max_request_rate: options.max_request_rate,
        };
        accept_loop(listener, http::router(state), limits).await
    })
}

struct ConnectionLimits {
    header_timeout: std::time::Duration,
    max_connections: usize,
    max_request_rate: u32,
}

/// Serves connections until Ctrl-C: hyper's HTTP/1 with a header read
/// timeout (which also closes idle keep-alive connections), at most
/// `max_connections` at once, and at most `max_request_rate` requests a
/// second on one connection, so slow, idle or flooding clients cannot hold
/// the server (1,500 idle connections stopped /health).
async fn accept_loop(listener: tokio::net::TcpListener, router: axum::Router, limits: ConnectionLimits) -> Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use tower::ServiceExt;
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let shutdown = tokio::signal::ctrl_c();
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                // Out of descriptors or a connection reset before accept: the
                // listener itself is fine; wait a moment and go on.
                Err(_) => {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    continue;
                }
            },
            _ = &mut shutdown => return Ok(()),
        };
        // Closed at once when full: the client sees a reset, not a hang.
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let (router, rate) = (router.clone(), limits.max_request_rate);
        let window = Arc::new(std::sync::Mutex::new(RateWindow::default()));
        let service = tower::service_fn(move |request: axum::http::Request<hyper::body::Incoming>| {
            let (router, window) = (router.clone(), Arc::clone(&window));
            async move {
                let over = window.lock().map(|mut w| w.over(rate)).unwrap_or(false);
                if over {
                    return Ok(error::ApiError::rate_limited(rate).into_response());
                }
                router.oneshot(request).await
            }
        });
        let header_timeout = limits.header_timeout;
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(TokioIo::new(stream), hyper_util::service::TowerToHyperService::new(service))
                .await;
            drop(slot);
        });
    }
}

/// Requests of one connection in the current second.
#[derive(Default)]
struct RateWindow {
    started: Option<std::time::Instant>,
    count: u32,
}

impl RateWindow {
    /// Counts a request; whether it is past `rate` in its second.
    fn over(&mut self, rate: u32) -> bool {
        let now = std::time::Instant::now();
        match self.started {
            Some(t) if now.duration_since(t) < std::time::Duration::from_secs(1) => self.count += 1,
            _ => (self.started, self.count) = (Some(now), 1),
        }
        self.count > rate
    }
}

/// OpenAI's `system_fingerprint`: changes when the engine or the model does.
fn fingerprint(model: &Model) -> String {
    let mut h = waste_host::Fnv::new();
    h.update(waste_host::VERSION.as_bytes());
    h.update(model.identity().as_bytes());
    format!("fp_{}", &h.hex()[..12])
}
