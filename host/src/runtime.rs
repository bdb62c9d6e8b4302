//! The one wasmtime embedding: the bindgen! site, the store data, and the
//! host side of the `waste:engine/model` imports.
//!
//! The guest runs with an empty WASI context (no preopened directory, no
//! environment, no network); only its stderr is captured, into memory, so a
//! guest panic reaches the caller as an error with the guest's own message.

use std::sync::Arc;
use std::time::Instant;

use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use crate::api::{Model, TokenEvent};
use crate::model::state_io::Transcript;
use crate::model::State;

mod bindings {
    wasmtime::component::bindgen!({ world: "engine", path: "../wit" });
}

pub(crate) use bindings::exports::waste::engine::control::{
    GenerateError as WitGenerateError, SamplingParams as WitSamplingParams, StopReason as WitStopReason,
};
pub(crate) use bindings::exports::waste::engine::control::ChatMessage as WitChatMessage;
pub(crate) use bindings::Engine as EngineBindings;
use bindings::waste::engine::model as wit;

/// The guest's embedded bytes, built from guest/ by build.rs.
pub(crate) const GUEST_WASM: &[u8] = include_bytes!(env!("WASTE_GUEST_WASM"));

/// `GUEST_WASM` precompiled by build.rs for the build machine's CPU with
/// `engine_config::engine_config()`; empty when the build did not precompile
/// (cross-compilation, or WASTE_NO_PRECOMPILE set).
const GUEST_CWASM: &[u8] = include_bytes!(env!("WASTE_GUEST_CWASM"));

// The wasmtime `Config`, shared with build.rs so the precompiled code matches
// the engine that loads it.
#[path = "engine_config.rs"]
mod engine_config;

/// Guest stderr kept for error messages; a panic message is far shorter.
const GUEST_STDERR_CAPACITY: usize = 64 * 1024;

pub(crate) type TokenCallback = Box<dyn FnMut(&TokenEvent) -> bool + Send>;

/// Draws a token from (logits, recent tokens): the attached sampler plugin.
pub(crate) type SamplerHook = Box<dyn FnMut(&[f32], &[u32]) -> Result<u32, String> + Send>;

/// A model as one session sees it: the shared weights and this session's
/// state, with the tokens behind that state.
pub(crate) struct ModelSlot {
    pub model: Arc<Model>,
    pub state: State,
    pub transcript: Transcript,
}

impl ModelSlot {
    /// Evaluates the held token (if any) and `tokens`; returns the logits of
    /// the last position, or of each of `tokens` with `all_positions`.
    pub fn forward(&mut self, tokens: &[u32], all_positions: bool) -> crate::Result<(Vec<f32>, crate::StepStats)> {
        let fed = self.transcript.feed(tokens);
        let (mut logits, stats) = self.model.forward(&mut self.state, &fed, all_positions)?;
        self.transcript.committed(&fed);
        if all_positions && fed.len() > tokens.len() {
            // The held token's row is not one the caller asked for.
            logits.drain(..logits.len() / fed.len());
        }
        Ok((logits, stats))
    }

    pub fn reset(&mut self) {
        self.state.reset();
        self.transcript.clear();
    }
}

/// Store data of one session.
pub(crate) struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    stderr: MemoryOutputPipe,
    pub slots: Vec<ModelSlot>,
    pub on_token: Option<TokenCallback>,
    pub sampler: Option<SamplerHook>,
}

impl HostState {
    pub fn new(slots: Vec<ModelSlot>) -> Self {
        let stderr = MemoryOutputPipe::new(GUEST_STDERR_CAPACITY);
        let wasi = WasiCtxBuilder::new().stderr(stderr.clone()).build();
        HostState { wasi, table: ResourceTable::new(), stderr, slots, on_token: None, sampler: None }
    }

    /// What the guest wrote to stderr (a panic message), trimmed.
    pub fn guest_stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.contents()).trim().to_string()
    }

    fn slot(&mut self, handle: u32) -> Result<&mut ModelSlot, String> {
        self.slots.get_mut(handle as usize).ok_or_else(|| format!("no model with handle {handle}"))
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl wit::Host for HostState {
    fn info(&mut self, handle: u32) -> Result<wit::ModelInfo, String> {
        let slot = self.slot(handle)?;
        let info = slot.model.info();
        Ok(wit::ModelInfo {
            family: info.family.clone(),
            vocab_size: info.vocab_size as u32,
            context_length: slot.state.context() as u32,
            bos_token: info.bos_token,
            eos_tokens: info.eos_tokens.clone(),
        })
    }

    fn tokenizer_files(&mut self, handle: u32) -> Vec<(String, Vec<u8>)> {
        match self.slot(handle) {
            Ok(slot) => slot.model.tokenizer_files().to_vec(),
            Err(_) => Vec::new(),
        }
    }

    fn chat_template(&mut self, handle: u32) -> Option<String> {
        let slot = self.slot(handle).ok()?;
        slot.model.chat_template().map(str::to_owned)
    }

    fn evaluate(&mut self, handle: u32, tokens: Vec<u32>) -> Result<wit::Evaluation, String> {
        let slot = self.slot(handle)?;
        let started = Instant::now();
        let (logits, stats) = slot.forward(&tokens, false).map_err(|e| e.to_string())?;
        Ok(wit::Evaluation {
            logits,
            position: slot.state.position() as u32,
            stats: wit::StepStats {
                experts_hit: stats.experts_hit,
                experts_missed: stats.experts_missed,
                bytes_read: stats.bytes_read,
                ms_total: started.elapsed().as_secs_f32() * 1000.0,
                ms_io: stats.io_time.as_secs_f32() * 1000.0,
                direct_io: slot.model.expert_store().direct_io(),
            },
        })
    }

    fn reset(&mut self, handle: u32) {
        if let Ok(slot) = self.slot(handle) {
            slot.reset();
        }
    }

    fn recent_tokens(&mut self, handle: u32, n: u32) -> Vec<u32> {
        self.slot(handle).map(|slot| slot.transcript.recent(n as usize)).unwrap_or_default()
    }

    fn sample_with_plugin(&mut self, logits: Vec<f32>, recent: Vec<u32>) -> Result<u32, String> {
        match self.sampler.as_mut() {
            Some(sample) => sample(&logits, &recent),
            None => Err("no sampler plugin is attached to this session".into()),
        }
    }

    fn emit_token(&mut self, event: wit::TokenEvent) -> bool {
        let Some(callback) = self.on_token.as_mut() else { return true };
        callback(&TokenEvent {
            token: event.token,
            text: event.text,
            logprob: event.logprob,
            top_logprobs: event.top_logprobs.iter().map(|t| (t.token, t.logprob)).collect(),
            experts_hit: event.stats.experts_hit,
            experts_missed: event.stats.experts_missed,
            bytes_read: event.stats.bytes_read,
            ms_total: event.stats.ms_total,
            ms_io: event.stats.ms_io,
            direct_io: event.stats.direct_io,
        })
    }
}

/// Compiled once per process and shared by every session.
pub(crate) struct CompiledGuest {
    pub engine: wasmtime::Engine,
    pub component: Component,
    pub linker: Linker<HostState>,
}

impl CompiledGuest {
    pub fn new() -> wasmtime::Result<Self> {
        let engine = wasmtime::Engine::new(&engine_config::engine_config())?;
        let component = match Self::load_precompiled(&engine) {
            Some(component) => component,
            None => Component::new(&engine, GUEST_WASM)?,
        };
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
        EngineBindings::add_to_linker::<_, HasSelf<_>>(&mut linker, |state| state)?;
        Ok(CompiledGuest { engine, component, linker })
    }

    /// The build's precompiled component, if there is one and this engine
    /// accepts it. wasmtime refuses (with an error, before touching the
    /// code) precompiled code whose wasmtime version, target, Cranelift
    /// flags, tunables or wasm features differ from the engine's, or that
    /// uses a CPU feature this machine lacks (a binary built on a newer CPU);
    /// the caller then compiles the wasm bytes instead.
    fn load_precompiled(engine: &wasmtime::Engine) -> Option<Component> {
        if GUEST_CWASM.is_empty() {
            return None;
        }
        // SAFETY: `Component::deserialize` is unsafe because it trusts its
        // input to be wasmtime's own output, not arbitrary bytes (it maps it
        // as executable code after checking only the header and the settings
        // it records). `GUEST_CWASM` is exactly that: produced by
        // `Engine::precompile_component` in this crate's build.rs, in the
        // same build, by the same locked wasmtime version, with the same
        // `engine_config()`, and embedded in the binary by `include_bytes!`;
        // it is never read from the file system or any other outside source
        // at run time. Compatibility with this engine and CPU is checked by
        // wasmtime itself; a mismatch is an `Err`, turned into `None` here.
        unsafe { Component::deserialize(engine, GUEST_CWASM) }.ok()
    }
}
