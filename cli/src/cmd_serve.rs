//! `waste serve`: the HTTP server speaking OpenAI's, Anthropic's and Ollama's APIs (crate waste-server).

use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use waste_host::{Engine, Model};

use crate::errors::usage;
use crate::open::ModelArgs;

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on (127.0.0.1: this machine only).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on; 0 picks a free one (printed at start).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on /v1 requests.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Requests queued or running at most; more are answered 503.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub queue: u32,
    /// Largest request body in bytes (e.g. 4M); larger ones are answered 413.
    #[arg(long, default_value = "4M")]
    pub max_body: String,
    /// Model name in the API (default: the container's directory name without .waste).
    #[arg(long)]
    pub model_id: Option<String>,
    /// Route every request's draws to a sampler plugin (a wasm32-wasip2
    /// component of the `sampler-plugin` world, e.g. examples/sampler-mirostat).
    #[arg(long, value_name = "PLUGIN.wasm")]
    pub sampler: Option<std::path::PathBuf>,
    /// An option for the sampler plugin: NAME=VALUE (repeatable), e.g. tau=5.
    #[arg(long = "sampler-opt", value_name = "NAME=VALUE", requires = "sampler", allow_negative_numbers = true)]
    pub sampler_opt: Vec<String>,
    /// Render conversations with this Jinja template instead of the model's own.
    #[arg(long, value_name = "FILE", visible_alias = "chat-template-file")]
    pub chat_template: Option<std::path::PathBuf>,
    /// Answer 404 to a request that names another model; by default it is
    /// answered by this one with an `x-waste-warning` header.
    #[arg(long)]
    pub strict_model_name: bool,
    /// Let browsers call from this origin, e.g. http://localhost:3000
    /// (repeatable; `*` for any): preflights are answered, answers carry
    /// Access-Control-Allow-Origin.
    #[arg(long = "cors-origin", value_name = "ORIGIN", visible_alias = "allow-origin")]
    pub cors_origins: Vec<String>,
    /// No log line per request on stderr.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Seconds a client has to send a request's headers; an idle keep-alive
    /// connection is closed after as long.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub header_timeout: u64,
    /// Seconds a request body may take to arrive (408 past it).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub body_timeout: u64,
    /// Connections open at once; more are closed at accept.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub max_connections: u32,
    /// Requests one connection may send per second; more are answered 429.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_request_rate: u32,
    /// Conversation states kept so a request extending an earlier one evaluates only its new tokens (0 = off); each is one state of --ctx tokens, counted inside --budget.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=64))]
    pub cache_sessions: u32,
    /// Also save each finished request's conversation state in DIR, so a
    /// conversation resumes without its prompt evaluated again after a
    /// restart (checksummed files, one per conversation; other models' files
    /// in DIR are left alone).
    #[arg(long, value_name = "DIR")]
    pub prompt_cache_dir: Option<std::path::PathBuf>,
    /// Bytes of saved states kept in --prompt-cache-dir (e.g. 20G); the
    /// least recently used go first.
    #[arg(long, value_name = "SIZE", default_value = "8G", requires = "prompt_cache_dir")]
    pub prompt_cache_max: String,
}

pub fn serve(a: ServeArgs) -> Result<()> {
    let body_limit = crate::open::size_arg("--max-body", &Some(a.max_body.clone()))?.unwrap_or(4 << 20);
    // Either would start a server that refuses every request.
    if body_limit == 0 {
        return Err(usage("--max-body 0: no request would fit; give a size such as 4M"));
    }
    if a.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        return Err(usage("--api-key is empty: no request could match it; give a key or leave the option out"));
    }
    let prompt_cache = match &a.prompt_cache_dir {
        None => None,
        Some(_) if a.cache_sessions == 0 => {
            return Err(usage(
                "--prompt-cache-dir saves the states --cache-sessions holds: give --cache-sessions 1 or more",
            ))
        }
        Some(dir) => {
            let max_bytes =
                crate::open::size_arg("--prompt-cache-max", &Some(a.prompt_cache_max.clone()))?.unwrap_or(8 << 30);
            if max_bytes == 0 {
                return Err(usage("--prompt-cache-max 0: nothing could be saved; give a size such as 8G"));
            }
            Some(waste_server::PromptCacheOptions { dir: dir.clone(), max_bytes })
        }
    };
    let sampler = match &a.sampler {
        Some(path) => Some(crate::open::sampler_plugin(path, &a.sampler_opt)?),
        None => None,
    };
    let open_options = waste_host::OpenOptions { extra_states: a.cache_sessions as usize, ..a.model.open_options()? };
    let model_id = match a.model_id {
        Some(id) => id,
        None => {
            let path = std::fs::canonicalize(&a.model.model).unwrap_or_else(|_| a.model.model.clone());
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
            name.strip_suffix(".waste").unwrap_or(&name).to_string()
        }
    };
    let model: Arc<Model> = crate::render::open_model(&a.model.model, &open_options)
        .with_context(|| format!("opening {}", a.model.model.display()))?;
    let chat_template = match &a.chat_template {
        Some(path) => Some(crate::input::read_template(path)?),
        None => None,
    };
    let engine = Engine::new()?;
    let options = waste_server::ServeOptions {
        host: a.host,
        port: a.port,
        api_key: a.api_key,
        queue_limit: a.queue as usize,
        body_limit: body_limit as usize,
        model_id: model_id.clone(),
        sampler,
        chat_template,
        model_path: Some(a.model.model.display().to_string()),
        strict_model_name: a.strict_model_name,
        cors_origins: a.cors_origins,
        quiet: a.quiet,
        header_timeout: std::time::Duration::from_secs(a.header_timeout),
        body_timeout: std::time::Duration::from_secs(a.body_timeout),
        max_connections: a.max_connections as usize,
        max_request_rate: a.max_request_rate,
        prompt_cache,
    };
    let local_only = options.api_key.is_none();
    waste_server::serve(engine, model, options, |addr| {
        let who =
            if local_only { " (no --api-key: answering this machine only; browsers need --cors-origin)" } else { "" };
        eprintln!("waste serve: model {model_id:?} listening on http://{addr}{who}");
    })
    .context("serving")?;
    Ok(())
}
