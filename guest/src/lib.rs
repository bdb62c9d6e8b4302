//! WASTE control component.
//!
//! Plain Rust logic (tokenizer, sampling, the token loop) compiled natively
//! for its unit tests and for `wasm32-wasip2` as the component the host
//! embeds. The WIT glue (`component`) is only compiled for wasm.
//!
//! Layering inside the crate, each module using only those listed before
//! it (tests/integration/layering.rs holds it): `tokenizer`, `chat`,
//! `stop`, `stream`, `sampling`, `gbnf`, `constraint`, `tool_grammar`,
//! `generate`, `component`.

pub mod chat;
pub mod constraint;
mod gbnf;
pub mod generate;
pub mod sampling;
pub mod stop;
pub mod stream;
pub mod tokenizer;
pub mod tool_grammar;

#[cfg(target_arch = "wasm32")]
mod component;
