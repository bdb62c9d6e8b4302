//! WASTE's weight formats and kernels: the bottom layer of the native side.
//!
//! [`quant`] holds every stored format (trunk f32/q8/q4, experts
//! f32/q8/q4/rvq2/rvq3/rvq4p), the quantisers, the RVQ codebook fit and the
//! kernels that compute straight from the stored bytes, chosen at run time
//! per ISA. [`attend`] holds attention's score and weighted-sum products
//! over blocks of queries read in place from a KV cache, [`kv`] how that
//! cache's rows are stored (f32, bf16, q8). [`pool`] is the
//! compute pool every parallel kernel runs in. No
//! file I/O, no model knowledge, no wasmtime: the engine crate builds on
//! this one.
//!
//! Layering inside the crate, each module using only those listed before
//! it (tests/integration/layering.rs holds it): `skip`, `pool`, `quant`,
//! `attend`, `kv`.

pub mod attend;
pub mod kv;
pub mod pool;
pub mod quant;
pub mod skip;
