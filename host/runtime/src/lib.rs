//! WASTE host: the native engine (`waste-engine`) with the control
//! component embedded. Tokenizer, chat templates, sampling and the token
//! loop run in the bundled WebAssembly component (guest/, built and
//! precompiled by build.rs); every front end (the CLI, the server, the C
//! ABI) reaches them only through an [`Engine`] and its [`Session`]s. This
//! crate is the one place that knows wasmtime; it re-exports what the front
//! ends use of the engine below it.
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
//!
//! Layering inside the crate, each module using only those listed before
//! it (tests/integration/layering.rs holds it): `params`, `bindings`,
//! `engine_config`, `component`, `plugin`, `session`, `engine`.

mod bindings;
mod component;
mod engine;
mod engine_config;
mod params;
pub mod plugin;
mod session;

pub use engine::Engine;
pub use params::{
    check_template_vars, ChatMessage, Completion, Constraint, GenerateParams, StopReason, TokenEvent, TokenStats,
    MAX_CONSTRAINT_BYTES, RESERVED_TEMPLATE_VARS,
};
pub use session::{Image, Session, Snapshot};

// The engine below, as the front ends use it.
pub use waste_engine::{
    checkpoint, config, container, convert, error, files, gguf, info, plan, pool, quant, skip, stats, store, synth,
    transformer, vision,
};
pub use waste_engine::{
    ConvertOptions, ConvertProgress, ConvertReport, Error, LayerInfo, MemoryUse, Model, ModelInfo, OpenOptions,
    OpenProgress, Perplexity, Result, StepStats, DEFAULT_CONTEXT, PERPLEXITY_CHUNK,
};

/// The bundled control component (a wasm32-wasip2 component), for hosts
/// that load it with their own wasmtime binding.
pub fn component_bytes() -> &'static [u8] {
    component::GUEST_WASM
}

/// The WIT package of the bundled component's contract (wit/engine.wit).
pub const WIT_PACKAGE: &str = "waste:engine@0.5.0";

/// The engine's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

#[cfg(test)]
mod tests {
    /// One statement of the contract's version: the constant is the package
    /// wit/engine.wit declares.
    #[test]
    fn wit_package_is_the_one_the_wit_declares() {
        let wit = include_str!("../../../wit/engine.wit");
        assert!(wit.contains(&format!("package {};", super::WIT_PACKAGE)), "wit/engine.wit declares another package");
    }
}
