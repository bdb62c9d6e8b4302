//! The Rust API every front end uses (the CLI, and later the server and the
//! C ABI): open a container, start a session, tokenize, generate, eval.
//!
//! Tokenizer and sampling are reached only through the control component;
//! the forward pass is native.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::Store;

use crate::container::{Container, ExpertBanks};
use crate::error::{Error, Result};
use crate::model::{Model as Transformer, State};
use crate::runtime::{CompiledGuest, EngineBindings, HostState, ModelSlot, WitSamplingParams, WitStopReason};
use crate::stats::StepStats;

/// Default context when the caller does not choose one: the model's own
/// maximum, capped so a small machine can hold the KV cache.
pub const DEFAULT_CONTEXT: usize = 4096;

/// Options for [`Model::open`].
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// Tokens of context to allocate state for; `None` = min(model maximum, 4096).
    pub context: Option<usize>,
}

/// What a caller may want to know about an open model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    /// `model_type` of the source checkpoint.
    pub family: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub moe_layers: usize,
    pub num_experts: usize,
    pub top_k: usize,
    pub max_position_embeddings: usize,
    pub bos_token: Option<u32>,
    pub eos_tokens: Vec<u32>,
    pub trunk_format: String,
    pub expert_format: String,
    /// Bytes of one expert record on disk.
    pub expert_record_bytes: u64,
    /// Bytes of the resident trunk.
    pub trunk_bytes: u64,
    pub has_tokenizer: bool,
    pub has_chat_template: bool,
}

/// A converted container, opened: the trunk resident, the experts on disk.
/// Shared by any number of sessions.
pub struct Model {
    container: Container,
    transformer: Transformer,
    experts: ExpertBanks,
    info: ModelInfo,
    context: usize,
}

impl Model {
    pub fn open(path: &Path, options: &OpenOptions) -> Result<Arc<Model>> {
        let container = Container::open(path)?;
        let transformer = Transformer::load(container.config(), &container)?;
        let experts = container.expert_banks()?;
        let cfg = container.config();
        let context = match options.context {
            Some(0) => return Err(Error::Arg("the context must be at least 1 token".into())),
            Some(n) if n > cfg.max_position_embeddings => {
                return Err(Error::Arg(format!(
                    "a context of {n} tokens exceeds the model's maximum of {}",
                    cfg.max_position_embeddings
                )))
            }
            Some(n) => n,
            None => cfg.max_position_embeddings.min(DEFAULT_CONTEXT),
        };
        let info = container.info();
        Ok(Arc::new(Model { container, transformer, experts, info, context }))
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// The tokens of context each session allocates state for.
    pub fn context(&self) -> usize {
        self.context
    }

    pub fn tokenizer_json(&self) -> Option<&str> {
        self.container.tokenizer_json()
    }

    pub fn chat_template(&self) -> Option<&str> {
        self.container.chat_template()
    }

    /// A fresh state (KV cache) sized for this model's context.
    pub fn new_state(&self) -> State {
        State::new(self.container.config(), self.context)
    }

    /// Appends `tokens` to `state` and returns the logits of the last one, or
    /// of every one (`[tokens.len() * vocab]`) with `all_positions`.
    pub fn forward(&self, state: &mut State, tokens: &[u32], all_positions: bool) -> Result<(Vec<f32>, StepStats)> {
        if tokens.is_empty() {
            return Err(Error::Arg("no tokens to evaluate".into()));
        }
        let mut stats = StepStats::default();
        let logits = self.transformer.forward(state, tokens, &self.experts, all_positions, &mut stats)?;
        Ok((logits, stats))
    }
}

/// Sampling and stopping for [`Session::generate`].
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: u32,
    /// 1.0 = off.
    pub top_p: f32,
    pub seed: u64,
    pub max_tokens: u32,
    pub stop_at_eos: bool,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams { temperature: 0.8, top_k: 40, top_p: 0.95, seed: 0, max_tokens: 128, stop_at_eos: true }
    }
}

/// One generated token, as streamed to the caller's callback.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    pub token: u32,
    /// Text completed by this token (empty while a character is split).
    pub text: String,
    pub logprob: f32,
    pub experts_hit: u32,
    pub experts_missed: u32,
    pub bytes_read: u64,
    pub ms_total: f32,
    pub ms_io: f32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Length,
    Eos,
    Cancelled,
    ContextFull,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Length => "length",
            StopReason::Eos => "eos",
            StopReason::Cancelled => "cancelled",
            StopReason::ContextFull => "context-full",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub tokens: Vec<u32>,
    pub text: String,
    pub stop_reason: StopReason,
}

/// The compiled control component. Create one per process and start any
/// number of sessions from it.
pub struct Engine {
    guest: Arc<CompiledGuest>,
    compile_time: Duration,
}

impl Engine {
    pub fn new() -> Result<Engine> {
        let started = Instant::now();
        let guest = CompiledGuest::new().map_err(|e| Error::Guest(format!("loading the bundled component: {e:#}")))?;
        Ok(Engine { guest: Arc::new(guest), compile_time: started.elapsed() })
    }

    /// How long compiling the bundled component took.
    pub fn compile_time(&self) -> Duration {
        self.compile_time
    }

    /// Instantiates the component once with no model attached and returns
    /// how long that took: the other half of the start-up cost.
    pub fn measure_instantiate(&self) -> Result<Duration> {
        let (_, _, took) = instantiate(&self.guest, HostState::new(Vec::new()))?;
        Ok(took)
    }

    /// A session on `model`: its own component instance and its own state.
    pub fn session(&self, model: Arc<Model>) -> Result<Session> {
        let state = model.new_state();
        let slots = vec![ModelSlot { model, state }];
        let (store, bindings, instantiate_time) = instantiate(&self.guest, HostState::new(slots))?;
        Ok(Session { guest: self.guest.clone(), store, bindings, instantiate_time })
    }
}

fn instantiate(guest: &CompiledGuest, data: HostState) -> Result<(Store<HostState>, EngineBindings, Duration)> {
    let started = Instant::now();
    let mut store = Store::new(&guest.engine, data);
    let bindings = EngineBindings::instantiate(&mut store, &guest.component, &guest.linker)
        .map_err(|e| Error::Guest(format!("instantiating the bundled component: {e:#}")))?;
    Ok((store, bindings, started.elapsed()))
}

/// One conversation with one model: a component instance plus the model's
/// state (KV cache and position).
pub struct Session {
    guest: Arc<CompiledGuest>,
    store: Store<HostState>,
    bindings: EngineBindings,
    instantiate_time: Duration,
}

/// The handle of the session's model inside its store.
const MODEL: u32 = 0;

impl Session {
    pub fn instantiate_time(&self) -> Duration {
        self.instantiate_time
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.store.data().slots[MODEL as usize].model
    }

    /// Tokens held in the state.
    pub fn position(&self) -> usize {
        self.store.data().slots[MODEL as usize].state.position()
    }

    /// Forgets the conversation (position 0).
    pub fn reset(&mut self) {
        self.store.data_mut().slots[MODEL as usize].state.reset();
    }

    /// Text as plain content: special-token strings stay text.
    pub fn tokenize(&mut self, text: &str) -> Result<Vec<u32>> {
        self.call(|b, s| b.waste_engine_control().call_tokenize(s, MODEL, text))
    }

    /// Text as template markup: special-token strings become their ids.
    pub fn tokenize_markup(&mut self, text: &str) -> Result<Vec<u32>> {
        self.call(|b, s| b.waste_engine_control().call_tokenize_markup(s, MODEL, text))
    }

    pub fn detokenize(&mut self, tokens: &[u32]) -> Result<String> {
        self.call(|b, s| b.waste_engine_control().call_detokenize(s, MODEL, tokens))
    }

    /// Continues from the current state with `prompt`, sampling up to
    /// `params.max_tokens` tokens; `on_token` sees each one and returns false
    /// to cancel.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        on_token: impl FnMut(&TokenEvent) -> bool + Send + 'static,
    ) -> Result<Completion> {
        let wit_params = WitSamplingParams {
            temperature: params.temperature,
            top_k: params.top_k,
            top_p: params.top_p,
            seed: params.seed,
            max_tokens: params.max_tokens,
            stop_at_eos: params.stop_at_eos,
        };
        self.store.data_mut().on_token = Some(Box::new(on_token));
        let result = self.call(|b, s| b.waste_engine_control().call_generate(s, MODEL, prompt, wit_params));
        self.store.data_mut().on_token = None;
        let completion = result?;
        Ok(Completion {
            tokens: completion.tokens,
            text: completion.text,
            stop_reason: match completion.stop_reason {
                WitStopReason::Length => StopReason::Length,
                WitStopReason::Eos => StopReason::Eos,
                WitStopReason::Cancelled => StopReason::Cancelled,
                WitStopReason::ContextFull => StopReason::ContextFull,
            },
        })
    }

    /// Evaluates `tokens` on top of the state and returns raw logits (last
    /// position, or every position), for hosts that sample themselves.
    pub fn eval(&mut self, tokens: &[u32], all_positions: bool) -> Result<(Vec<f32>, StepStats)> {
        let slot = &mut self.store.data_mut().slots[MODEL as usize];
        slot.model.clone().forward(&mut slot.state, tokens, all_positions)
    }

    /// Runs one export call. A guest error string becomes `Error::Guest`; a
    /// trap (a guest panic) becomes `Error::Guest` carrying the guest's own
    /// message, and the instance is replaced, since a trapped instance cannot
    /// be entered again. The model state survives.
    fn call<R>(
        &mut self,
        f: impl FnOnce(&EngineBindings, &mut Store<HostState>) -> wasmtime::Result<Result<R, String>>,
    ) -> Result<R> {
        match f(&self.bindings, &mut self.store) {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(message)) => Err(Error::Guest(message)),
            Err(trap) => {
                let stderr = self.store.data().guest_stderr();
                let slots = std::mem::take(&mut self.store.data_mut().slots);
                let (store, bindings, _) = instantiate(&self.guest, HostState::new(slots))?;
                self.store = store;
                self.bindings = bindings;
                let detail = if stderr.is_empty() { String::new() } else { format!(": {stderr}") };
                Err(Error::Guest(format!("{trap:#}{detail}")))
            }
        }
    }
}
