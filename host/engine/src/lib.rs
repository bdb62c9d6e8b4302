//! WASTE's native engine: everything heavy below the control component.
//!
//! A Hugging Face checkpoint becomes a container ([`convert`]); an opened
//! container ([`Model`]) keeps its dense trunk resident, leaves the routed
//! experts on disk behind the [`store`] (direct reads into a bounded cache
//! carved out of the RAM budget the [`plan`] sets) and runs the forward
//! pass of [`transformer`]. The model types it reads are the rows of
//! [`config::FAMILIES`]. Built on the weight formats and kernels of
//! `waste-kernels`, re-exported here as [`quant`] and [`pool`]; no wasmtime
//! (the host crate embeds the component on top of this one).
//!
//! Layering inside the crate, each module using only those listed before
//! it (tests/integration/layering.rs holds the crate to this order): `size`,
//! `error`, `stats`, `files`, `config`, `source`, `container`, `gguf`,
//! `checkpoint`, `store`, `transformer`, `plan`, `info`, `vision`, `synth`,
//! `convert`, `in_place`, `paths`, `open_progress`, `model`, `images`,
//! `perplexity`.

pub mod checkpoint;
pub mod config;
pub mod container;
pub mod convert;
pub mod error;
pub mod files;
pub mod gguf;
pub mod images;
pub mod in_place;
pub mod info;
mod model;
mod open_progress;
pub mod paths;
mod perplexity;
pub mod plan;
pub mod size;
pub mod source;
pub mod stats;
pub mod store;
pub mod synth;
pub mod transformer;
pub mod vision;

pub use waste_kernels::{attend, kv, pool, quant, skip};

pub use convert::{convert, ConvertOptions, ConvertProgress, ConvertReport, ExpertsAs, TrunkAs};
pub use error::{Error, Result};
pub use info::{LayerInfo, ModelInfo};
pub use model::{MemoryUse, Model, OpenOptions, OpenProgress};
pub use perplexity::{Perplexity, PERPLEXITY_CHUNK};
pub use plan::DEFAULT_CONTEXT;
pub use stats::StepStats;
