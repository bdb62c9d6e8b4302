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
pub use session::{Image, SavedSnapshot, Session, Snapshot};

// The engine below, as front ends and embedders use it: running a model,
// planning its memory, and the offline tools. Everything else of
// `waste-engine` is its own business; a front end that needs more names it
// here first.

// Opening and running a model.
pub use waste_engine::container::manifest::FORMAT_VERSION;
pub use waste_engine::container::{Container, Verify};
pub use waste_engine::kv::KvType;
pub use waste_engine::pool::CpuSet;
pub use waste_engine::quant::{ExpertFormat, TrunkFormat};
pub use waste_engine::stats::{cpu_times, process_read_bytes, Picks};
pub use waste_engine::store::{CachePolicy, StoreOptions};
pub use waste_engine::transformer::prefill::{check_chunk as check_prefill_chunk, MAX_PREFILL_CHUNK};
pub use waste_engine::{
    Error, LayerInfo, MemoryUse, Model, ModelInfo, OpenOptions, OpenProgress, Perplexity, Result, StepStats,
    DEFAULT_CONTEXT, PERPLEXITY_CHUNK,
};

// Memory planning and sizes.
pub use waste_engine::paths::{open_container, plan_path, plan_path_for_images};
pub use waste_engine::plan::{fmt_bytes, parse_size, peak_rss, BudgetSource, MemoryPlan, PlanRequest};

// Images: their prompt markup and the size of an encoded image.
pub use waste_engine::vision::decode::dimensions as image_dimensions;
pub use waste_engine::vision::image_markup;

// Bounded file reads and the hash front ends key caches with.
pub use waste_engine::files::{read_file, Fnv};

// The offline tools: conversion and its check, synthetic containers,
// routing traces.
pub use waste_engine::config::family::release as release_like;
pub use waste_engine::convert::{check_limits, verify as verify_conversion};
pub use waste_engine::store::trace::{read_route_trace, RouteTrace};
pub use waste_engine::synth::{like_names, preset, synth, synth_like, LikeOptions, SynthSpec, PRESETS};
pub use waste_engine::{convert, ConvertOptions, ConvertProgress, ConvertReport, ExpertsAs, TrunkAs};

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
