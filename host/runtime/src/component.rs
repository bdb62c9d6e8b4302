//! The one wasmtime embedding of the control component: the compiled
//! component, the store data of a session, and the host side of the
//! `waste:engine/model` imports (the generated bindings and their
//! conversions are in `bindings.rs`).
//!
//! The guest runs with an empty WASI context (no preopened directory, no
//! environment, no network); only its stderr is captured, into memory, so a
//! guest panic reaches the caller as an error with the guest's own message.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::Store;

use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use crate::bindings::{engine::Engine as EngineBindings, wit_model as wit, wit_step_stats};
use crate::params::TokenEvent;
use std::collections::VecDeque;
use waste_engine::images::ImageRows;
use waste_engine::transformer::state_io::Transcript;
use waste_engine::transformer::{Splice, State};
use waste_engine::vision::expand_placeholders;
use waste_engine::{Error, Model, StepStats};

/// The guest's embedded bytes, built from guest/ by build.rs.
pub(crate) const GUEST_WASM: &[u8] = include_bytes!(env!("WASTE_GUEST_WASM"));

/// `GUEST_WASM` precompiled by build.rs for the build machine's CPU with
/// `engine_config::engine_config()`; empty when the build did not precompile
/// (cross-compilation, or WASTE_NO_PRECOMPILE set).
const GUEST_CWASM: &[u8] = include_bytes!(env!("WASTE_GUEST_CWASM"));

// The wasmtime `Config`, shared with build.rs so the precompiled code matches
// the engine that loads it.
use crate::engine_config;

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
    /// Images attached for the next evaluations, in prompt order: the
    /// placeholder tokens of `forward`'s `tokens` take them one each.
    pub images: VecDeque<Arc<ImageRows>>,
    /// The image placeholder token when the model has a vision tower,
    /// looked up once rather than on every evaluation.
    placeholder: Option<u32>,
}

impl ModelSlot {
    pub fn new(model: Arc<Model>, state: State) -> ModelSlot {
        let placeholder = model.vision().map(|v| v.placeholder);
        ModelSlot { model, state, transcript: Transcript::default(), images: VecDeque::new(), placeholder }
    }

    /// Evaluates the held token (if any) and `tokens`; returns the logits of
    /// the last position, or of each of `tokens` with `all_positions`. Each
    /// image placeholder among `tokens` is replaced by the next attached
    /// image's rows (and its logits by theirs): the state and transcript
    /// advance by the expanded length.
    pub fn forward(&mut self, tokens: &[u32], all_positions: bool) -> waste_engine::Result<(Vec<f32>, StepStats)> {
        let held = self.transcript.pending().is_some();
        let wanted = self.placeholder.map_or(0, |p| tokens.iter().filter(|&&t| t == p).count());
        let (fed, at, rows) = match self.placeholder {
            Some(p) if wanted > 0 => {
                if self.images.len() < wanted {
                    return Err(Error::Arg(format!(
                        "the prompt has {wanted} image placeholders but {} images are attached",
                        self.images.len()
                    )));
                }
                let counts: Vec<usize> = self.images.iter().take(wanted).map(|i| i.tokens).collect();
                let (expanded, at) = expand_placeholders(tokens, p, &counts)?;
                let fed = self.transcript.feed(&expanded);
                let rows: Vec<f32> = self.images.iter().take(wanted).flat_map(|i| i.rows.iter().copied()).collect();
                (fed, at.into_iter().map(|i| i + held as usize).collect(), rows)
            }
            _ => (self.transcript.feed(tokens), Vec::new(), Vec::new()),
        };
        let splice = Splice { at: &at, rows: &rows };
        let (mut logits, stats) = self.model.forward_spliced(&mut self.state, &fed, splice, all_positions)?;
        self.images.drain(..wanted);
        self.transcript.committed(&fed);
        if all_positions && held {
            // The held token's row is not one the caller asked for.
            logits.drain(..logits.len() / fed.len());
        }
        Ok((logits, stats))
    }

    pub fn reset(&mut self) {
        self.state.reset();
        self.transcript.clear();
        self.images.clear();
    }
}

/// Store data of one session.
pub(crate) struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    stderr: MemoryOutputPipe,
    /// The session's model; `None` only for an instance made to measure
    /// start-up, which calls no import.
    pub slot: Option<ModelSlot>,
    pub on_token: Option<TokenCallback>,
    pub sampler: Option<SamplerHook>,
    /// The native error behind the last failed `evaluate`, so the caller
    /// gets it as it was raised rather than as the guest's error string.
    pub native_error: Option<Error>,
    /// A chat template the caller chose over the model's own.
    pub chat_template: Option<String>,
}

impl HostState {
    pub fn new(slot: Option<ModelSlot>) -> Self {
        let stderr = MemoryOutputPipe::new(GUEST_STDERR_CAPACITY);
        let wasi = WasiCtxBuilder::new().stderr(stderr.clone()).build();
        HostState {
            wasi,
            table: ResourceTable::new(),
            stderr,
            slot,
            on_token: None,
            sampler: None,
            native_error: None,
            chat_template: None,
        }
    }

    /// A fresh store data for a new instance, taking over what belongs to
    /// the session rather than to the instance: the model and its state,
    /// the sampler plugin, the chosen chat template.
    pub fn carry_over(&mut self) -> HostState {
        let mut next = HostState::new(None);
        next.take_session_from(self);
        next
    }

    /// Takes over `other`'s session parts (see [`carry_over`](Self::carry_over)).
    /// The template conversations are rendered with: the one
    /// `Session::set_chat_template` gave, else `model`'s own (its tool-use
    /// variant with `with_tools`); the model's error if its template is
    /// malformed.
    pub(crate) fn chat_template_in_use<'a>(
        &'a self,
        model: &'a Model,
        with_tools: bool,
    ) -> std::result::Result<Option<&'a str>, String> {
        match &self.chat_template {
            Some(t) => Ok(Some(t)),
            None => model.chat_template(with_tools),
        }
    }

    pub fn take_session_from(&mut self, other: &mut HostState) {
        self.slot = other.slot.take();
        self.sampler = other.sampler.take();
        self.chat_template = other.chat_template.take();
    }

    /// What the guest wrote to stderr (a panic message), trimmed.
    pub fn guest_stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.contents()).trim().to_string()
    }

    fn slot(&mut self) -> wasmtime::Result<&mut ModelSlot> {
        self.slot.as_mut().ok_or_else(|| wasmtime::Error::msg("the component called the host without a model attached"))
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl wit::Host for HostState {
    fn info(&mut self) -> wasmtime::Result<wit::ModelInfo> {
        let slot = self.slot()?;
        let info = slot.model.info();
        Ok(wit::ModelInfo {
            family: info.family.clone(),
            vocab_size: info.vocab_size as u32,
            context_length: slot.state.context() as u32,
            bos_token: info.bos_token,
            eos_tokens: info.eos_tokens.clone(),
        })
    }

    fn tokenizer_files(&mut self) -> wasmtime::Result<Vec<(String, Vec<u8>)>> {
        Ok(self.slot()?.model.tokenizer_files().to_vec())
    }

    fn chat_template(&mut self, with_tools: bool) -> wasmtime::Result<Result<Option<String>, String>> {
        let model = Arc::clone(&self.slot()?.model);
        Ok(self.chat_template_in_use(&model, with_tools).map(|t| t.map(str::to_owned)))
    }

    fn evaluate(&mut self, tokens: Vec<u32>) -> wasmtime::Result<Result<wit::Evaluation, String>> {
        let slot = self.slot()?;
        let started = Instant::now();
        let (logits, stats) = match slot.forward(&tokens, false) {
            Ok(r) => r,
            Err(e) => {
                let message = e.to_string();
                self.native_error = Some(e);
                return Ok(Err(message));
            }
        };
        let ms_total = started.elapsed().as_secs_f32() * 1000.0;
        Ok(Ok(wit::Evaluation {
            logits,
            position: slot.state.position() as u32,
            stats: wit_step_stats(&stats, ms_total, slot.model.expert_store().direct_io()),
        }))
    }

    fn recent_tokens(&mut self, n: u32) -> wasmtime::Result<Vec<u32>> {
        Ok(self.slot()?.transcript.recent(n as usize))
    }

    fn sample_with_plugin(&mut self, logits: Vec<f32>, recent: Vec<u32>) -> wasmtime::Result<Result<u32, String>> {
        Ok(match self.sampler.as_mut() {
            Some(sample) => sample(&logits, &recent),
            None => Err("no sampler plugin is attached to this session".into()),
        })
    }

    fn emit_token(&mut self, event: wit::TokenEvent) -> wasmtime::Result<bool> {
        let Some(callback) = self.on_token.as_mut() else { return Ok(true) };
        Ok(callback(&TokenEvent::from(event)))
    }
}

/// A store with the component instantiated in it, and how long that took.
pub(crate) type Instance = (Store<HostState>, EngineBindings, Duration);

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

    /// A fresh instance of the component with `data` as its store's data; on
    /// failure the data comes back with the error (a session keeps its model).
    pub fn instantiate(&self, data: HostState) -> std::result::Result<Instance, (Box<HostState>, Error)> {
        let started = Instant::now();
        let mut store = Store::new(&self.engine, data);
        match EngineBindings::instantiate(&mut store, &self.component, &self.linker) {
            Ok(bindings) => Ok((store, bindings, started.elapsed())),
            Err(e) => {
                Err((Box::new(store.into_data()), Error::Guest(format!("instantiating the bundled component: {e:#}"))))
            }
        }
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
