//! `waste serve`: an OpenAI-compatible HTTP server over the WASTE Rust API.
//! One engine thread per model generates (see [`worker`]); tokio + axum
//! carry the HTTP side and never run the engine themselves.

mod error;
mod http;
mod request;
mod tools;
mod worker;

use std::net::SocketAddr;
use std::sync::Arc;

pub use error::{Error, Result};
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
    let worker = worker::Worker::start(engine, model, options.queue_limit.max(1), options.sampler)?;
    let state = Arc::new(http::AppState {
        worker,
        model_id: options.model_id,
        api_key: options.api_key,
        body_limit: options.body_limit,
        context,
        created: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async move {
        let addr = format!("{}:{}", options.host, options.port);
        let listener = tokio::net::TcpListener::bind((options.host.as_str(), options.port))
            .await
            .map_err(|source| Error::Bind { addr, source })?;
        on_listening(listener.local_addr()?);
        axum::serve(listener, http::router(state))
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await?;
        Ok(())
    })
}
