//! WASTE native engine.
//!
//! Containers, expert streaming, quantised kernels and the forward pass live
//! here, together with the one wasmtime embedding of the control component
//! (tokenizer, sampling, the token loop) that every front end goes through.
//!
//! ```no_run
//! use waste_host::{Engine, GenerateParams, Model, OpenOptions};
//! # fn main() -> waste_host::Result<()> {
//! let engine = Engine::new()?;
//! let model = Model::open("model.waste".as_ref(), &OpenOptions::default())?;
//! let mut session = engine.session(model)?;
//! let prompt = session.tokenize("And God said")?;
//! let out = session.generate(&prompt, &GenerateParams::default(), |event| {
//!     print!("{}", event.text);
//!     true // keep going
//! })?;
//! println!("\n{} tokens, stopped by {}", out.tokens.len(), out.stop_reason.as_str());
//! # Ok(()) }
//! ```

mod api;
pub mod checkpoint;
pub mod config;
pub mod container;
pub mod convert;
pub mod error;
pub mod model;
mod open_progress;
pub mod plan;
pub mod pool;
pub mod quant;
pub mod plugin;
mod runtime;
pub mod stats;
pub mod store;
pub mod synth;

pub use api::{
    ChatMessage, Completion, Engine, GenerateParams, MemoryUse, Model, ModelInfo, OpenOptions, OpenProgress, Perplexity, Session, StopReason,
    TokenEvent, PERPLEXITY_CHUNK,
    DEFAULT_CONTEXT,
};
pub use api::{check_template_vars, RESERVED_TEMPLATE_VARS};
pub use convert::{convert, ConvertOptions, ConvertProgress, ConvertReport};
pub use error::{Error, Result};
pub use stats::StepStats;

/// The bundled control component (a wasm32-wasip2 component), for hosts
/// that load it with their own wasmtime binding.
pub fn component_bytes() -> &'static [u8] {
    runtime::GUEST_WASM
}

/// The engine's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Reports a test that could not run. cargo captures a passing test's
/// output, so the line is also appended to the file named by `WASTE_SKIP_LOG`
/// (set by .ci/run), where CI checks it against .ci/allowed-skips.
#[cfg(test)]
pub(crate) fn report_skip(message: &str) {
    eprintln!("{message}");
    if let Some(path) = std::env::var_os("WASTE_SKIP_LOG") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{message}");
        }
    }
}
