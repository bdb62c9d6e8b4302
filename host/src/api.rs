//! The Rust API every front end uses (the CLI, and later the server and the
//! C ABI): open a container, start a session, tokenize, generate, eval.
//!
//! Tokenizer and sampling are reached only through the control component;
//! the forward pass is native.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::Store;

use crate::container::Container;
use crate::error::{Error, Result};
use crate::model::state_io::{self, SessionShape, Transcript};
use crate::plugin::SamplerPlugin;
use crate::model::{Model as Transformer, State};
use crate::runtime::{
    CompiledGuest, EngineBindings, HostState, ModelSlot, WitChatMessage, WitGenerateError, WitSamplingParams,
    WitStopReason,
};
use crate::open_progress::CountingSource;
pub use crate::open_progress::OpenProgress;
use crate::plan::MemoryPlan;
use crate::stats::StepStats;
use crate::store::{CachePolicy, ExpertStore, StoreOptions, StoreStats, USAGE_FILE};

/// Default context when the caller does not choose one: the model's own
/// maximum, capped so a small machine can hold the KV cache.
pub const DEFAULT_CONTEXT: usize = 4096;

/// Options for [`Model::open`].
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Tokens of context to allocate state for; `None` = min(model maximum, 4096).
    pub context: Option<usize>,
    /// Hard RAM budget in bytes for everything the model allocates (trunk,
    /// one session's state, scratch, expert cache); `None` = chosen from
    /// usable RAM (see [`crate::plan`]). Under the floor, open fails.
    pub budget: Option<u64>,
    /// Keep expert records in the cache; `false` reads every use.
    pub cache: bool,
    pub cache_policy: CachePolicy,
    /// Reader threads (0 = read on the calling thread).
    pub readers: usize,
    /// Request a layer's whole top-k before using the first record.
    pub read_ahead: bool,
    /// Bypass the page cache for expert reads when the file system allows.
    pub direct_io: bool,
    /// Router lookahead in decode: experts of the next MoE layer read
    /// speculatively; 0 = off.
    pub lookahead: usize,
    /// Preload the hottest experts recorded in the container's usage file.
    pub preload: bool,
    /// Compute threads; `None` = one per CPU of `cpus`, or of the machine.
    /// Logits do not depend on it (see [`crate::pool`]).
    pub threads: Option<usize>,
    /// Bind the compute threads and the calling thread to these CPUs
    /// (Linux; elsewhere opening fails with `Error::Unsupported`).
    pub cpus: Option<crate::pool::CpuSet>,
    /// Tokens per prefill chunk (1 to 64): a prompt runs layer-major in
    /// chunks, each distinct expert read once per chunk; 1 = token at a
    /// time. Logits do not depend on it.
    pub prefill_chunk: usize,
}

impl Default for OpenOptions {
    fn default() -> Self {
        let s = StoreOptions::default();
        OpenOptions {
            context: None,
            budget: None,
            cache: s.keep,
            cache_policy: s.policy,
            readers: s.readers,
            read_ahead: s.read_ahead,
            direct_io: s.direct_io,
            lookahead: s.lookahead,
            preload: true,
            threads: None,
            cpus: None,
            prefill_chunk: crate::model::prefill::DEFAULT_PREFILL_CHUNK,
        }
    }
}

/// What an open model holds, by part, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryUse {
    pub trunk: u64,
    /// One session's state.
    pub state: u64,
    pub scratch: u64,
    /// Record buffers actually allocated by the expert store.
    pub cache: u64,
}

impl MemoryUse {
    pub fn total(&self) -> u64 {
        self.trunk + self.state + self.scratch + self.cache
    }
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
    /// Per decoder layer: mixer, feed-forward kind and state sizes.
    pub layers: Vec<LayerInfo>,
    /// `softmax` or `sigmoid+bias`.
    pub router: String,
    /// Width of the shared expert MLP of each MoE layer (0 = none).
    pub shared_expert_width: usize,
    /// Parameters of the whole model and those one token touches.
    pub total_params: u64,
    pub active_params: u64,
}

/// One decoder layer as `ModelInfo` describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerInfo {
    /// `GQA`, `MLA` or `KDA`.
    pub attention: String,
    /// A routed MoE block (else a dense MLP).
    pub moe: bool,
    /// State bytes that do not grow with the context (KDA).
    pub state_bytes_fixed: u64,
    /// State bytes per token of context (K/V rows, MLA latent rows).
    pub state_bytes_per_token: u64,
}

/// A converted container, opened: the trunk resident, the experts on disk.
/// Shared by any number of sessions.
pub struct Model {
    container: Container,
    transformer: Transformer,
    experts: ExpertStore,
    info: ModelInfo,
    context: usize,
    plan: MemoryPlan,
    pool: crate::pool::Pool,
}

impl Model {
    pub fn open(path: &Path, options: &OpenOptions) -> Result<Arc<Model>> {
        Model::open_with_progress(path, options, &mut |_| {})
    }

    /// [`Model::open`], reporting its progress to `progress` as it goes
    /// (trunk bytes loaded, then the hotlist preload): see [`OpenProgress`].
    pub fn open_with_progress(
        path: &Path,
        options: &OpenOptions,
        progress: &mut dyn FnMut(&OpenProgress),
    ) -> Result<Arc<Model>> {
        // Thread options are checked (and CPUs bound) before any file work.
        let pool = crate::pool::Pool::new(options.threads, options.cpus.as_ref())?;
        crate::model::prefill::check_chunk(options.prefill_chunk)?;
        let container = Container::open(path)?;
        // The budget is checked before anything large is allocated.
        let plan = crate::plan::plan(&container, options.context, options.budget)?;
        let context = plan.context;
        let tensors = container
            .manifest()
            .trunk
            .tensors
            .iter()
            .map(|t| (t.name.clone(), crate::plan::resident_tensor_bytes(container.config(), t)));
        let resident = crate::plan::resident_trunk_bytes(container.config(), container.manifest());
        let source = CountingSource::new(&container, tensors, resident, &mut *progress);
        let mut transformer = Transformer::load(container.config(), &source)?;
        transformer.set_prefill_chunk(options.prefill_chunk)?;
        source.finish();
        let store_options = StoreOptions {
            cache_slots: plan.cache_slots,
            keep: options.cache,
            policy: options.cache_policy,
            readers: options.readers,
            read_ahead: options.read_ahead,
            direct_io: options.direct_io,
            lookahead: options.lookahead,
            ..StoreOptions::default()
        };
        let experts = ExpertStore::open(container.expert_banks()?, container.config().top_k, store_options)?;
        let usage = container.dir().join(USAGE_FILE);
        if options.preload && options.cache && usage.is_file() {
            progress(&OpenProgress::PreloadStarted);
            let before = experts.stats().preloaded;
            experts.preload_usage(&usage)?;
            let records = experts.stats().preloaded - before;
            progress(&OpenProgress::Preloaded { records: records as usize, bytes: records * experts.record_bytes() as u64 });
        }
        let info = container.info();
        Ok(Arc::new(Model { container, transformer, experts, info, context, plan, pool }))
    }

    /// The compute pool every forward pass runs in.
    pub fn pool(&self) -> &crate::pool::Pool {
        &self.pool
    }

    /// The memory plan the model was opened with.
    pub fn memory_plan(&self) -> &MemoryPlan {
        &self.plan
    }

    /// What the model holds now, by part; `total()` equals the plan's.
    pub fn memory_used(&self) -> MemoryUse {
        MemoryUse {
            trunk: crate::plan::resident_trunk_bytes(self.container.config(), self.container.manifest()),
            state: crate::plan::state_bytes(self.container.config(), self.context),
            scratch: crate::plan::scratch_bytes(self.container.config(), self.context),
            cache: self.experts.allocated_bytes(),
        }
    }

    /// Expert-store counters since open (or the last reset).
    pub fn store_stats(&self) -> StoreStats {
        self.experts.stats()
    }

    pub fn reset_store_stats(&self) {
        self.experts.reset_stats()
    }

    /// The expert store (for benchmarks and diagnostics).
    pub fn expert_store(&self) -> &ExpertStore {
        &self.experts
    }

    /// Adds this model's expert-use counts to the container's usage file
    /// (the learned hotlist preloaded by the next open); returns its path.
    pub fn save_usage(&self) -> Result<std::path::PathBuf> {
        let path = self.container.dir().join(USAGE_FILE);
        self.experts.save_usage(&path)?;
        Ok(path)
    }

    /// Runs the routed experts of one decode step with recorded routing
    /// instead of the router (`routing[i]`: the experts of the i-th MoE
    /// layer, equal weights) on a fixed input: the I/O and expert compute of
    /// a token at true scale, for benchmarks.
    pub fn replay_routing(&self, routing: &[Vec<u32>]) -> Result<StepStats> {
        let layers = self.experts.banks().moe_layers();
        if routing.len() != layers.len() {
            return Err(Error::Arg(format!(
                "the routing has {} MoE layers, the model {}",
                routing.len(),
                layers.len()
            )));
        }
        // The experts' width: the latent on K3's latent MoE.
        let h = self.experts.banks().shape().hidden;
        let x: Vec<f32> = (0..h).map(|i| ((i * 37 % 101) as f32 / 101.0 - 0.5) * 0.1).collect();
        let mut out = vec![0.0f32; h];
        let mut stats = StepStats::default();
        for (&layer, ids) in layers.iter().zip(routing) {
            let w = 1.0 / ids.len().max(1) as f32;
            let picks: Vec<(usize, f32)> = ids.iter().map(|&e| (e as usize, w)).collect();
            let experts = &self.experts;
            let (x, out, stats) = (&x, &mut out, &mut stats);
            self.pool.install(|| {
                crate::model::source::ExpertProvider::forward_experts(experts, layer, x, &picks, out, stats)
            })??;
        }
        Ok(stats)
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// A digest of the model's config, tensor index and expert layout: what
    /// a saved session must have been made with.
    pub fn identity(&self) -> String {
        state_io::model_identity(self.container.manifest())
    }

    /// The tokens of context each session allocates state for.
    pub fn context(&self) -> usize {
        self.context
    }

    pub fn tokenizer_json(&self) -> Option<&str> {
        self.container.tokenizer_json()
    }

    /// The tokenizer and template files the container carries, as
    /// (file name, bytes).
    pub fn tokenizer_files(&self) -> &[(String, Vec<u8>)] {
        self.container.tokenizer_files()
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
        let (transformer, experts, st) = (&self.transformer, &self.experts, &mut stats);
        let logits = self.pool.install(|| transformer.forward(state, tokens, experts, all_positions, st))??;
        Ok((logits, stats))
    }

    /// Scores `tokens` as a text: window k is `tokens[k*(window-1) ..][..window]`
    /// on a fresh state, so consecutive windows share one token and every
    /// token after the first is predicted once, from the ones before it in
    /// its window (the scheme of tests/train_bible_moe.py). Each window is
    /// prefilled `chunk` tokens at a time, which bounds the logits held to
    /// `chunk * vocab` floats.
    pub fn perplexity(&self, tokens: &[u32], window: usize, chunk: usize) -> Result<Perplexity> {
        if tokens.len() < 2 {
            return Err(Error::Arg(format!("perplexity needs at least 2 tokens, got {}", tokens.len())));
        }
        if window < 2 || window > self.context {
            return Err(Error::Arg(format!("window {window}: expected 2..={} (the context)", self.context)));
        }
        if chunk == 0 {
            return Err(Error::Arg("chunk 0: expected at least 1 token".into()));
        }
        let vocab = self.info.vocab_size;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::Arg(format!("token id {bad} is outside the vocabulary (size {vocab})")));
        }
        let mut result = Perplexity { tokens: tokens.len(), window, ..Perplexity::default() };
        let mut start = 0;
        while start + 1 < tokens.len() {
            let ids = &tokens[start..(start + window).min(tokens.len())];
            let mut state = self.new_state();
            for (c, piece) in ids.chunks(chunk).enumerate() {
                let (logits, _) = self.forward(&mut state, piece, true)?;
                for (i, row) in logits.chunks_exact(vocab).enumerate() {
                    // Row i predicts the token after position c*chunk + i of the window.
                    if let Some(&next) = ids.get(c * chunk + i + 1) {
                        result.nll_sum += negative_log_prob(row, next as usize);
                        result.scored += 1;
                    }
                }
            }
            result.windows += 1;
            start += window - 1;
        }
        Ok(result)
    }
}

/// `-ln softmax(row)[target]`, accumulated in f64.
fn negative_log_prob(row: &[f32], target: usize) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = row.iter().map(|&l| (l as f64 - max).exp()).sum();
    sum.ln() + max - row[target] as f64
}

/// The result of [`Model::perplexity`]: natural-log units.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Perplexity {
    /// Tokens of the text.
    pub tokens: usize,
    /// Tokens predicted (every token but the first).
    pub scored: usize,
    /// Windows evaluated, each on a fresh state.
    pub windows: usize,
    /// Tokens per window.
    pub window: usize,
    /// Sum over the scored tokens of -ln p(token | its window's earlier tokens).
    pub nll_sum: f64,
}

impl Perplexity {
    /// Mean negative log-likelihood per scored token (nats).
    pub fn mean_nll(&self) -> f64 {
        self.nll_sum / self.scored.max(1) as f64
    }

    /// `exp(mean_nll)`.
    pub fn perplexity(&self) -> f64 {
        self.mean_nll().exp()
    }
}

/// Tokens per prefill call in [`Session::perplexity`].
pub const PERPLEXITY_CHUNK: usize = 64;

/// Sampling and stopping for [`Session::generate`]. Every value is
/// range-checked by the control component; nonsense is an error. The order
/// and definitions follow llama.cpp's sampler chain (see
/// guest/src/sampling.rs): logit bias, penalties, top-k, temperature,
/// top-p, min-p.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: u32,
    /// 1.0 = off; in (0, 1].
    pub top_p: f32,
    /// 0 = off; in [0, 1].
    pub min_p: f32,
    /// 1.0 = off; > 0.
    pub repetition_penalty: f32,
    /// 0 = off; in [-2, 2].
    pub presence_penalty: f32,
    /// 0 = off; in [-2, 2].
    pub frequency_penalty: f32,
    /// Recent tokens (prompt and earlier turns included) the penalties see.
    pub penalty_last_n: u32,
    /// (token, bias) added to the raw logits; bias in [-100, 100].
    pub logit_bias: Vec<(u32, f32)>,
    /// Alternatives reported per token, 0..=20.
    pub top_logprobs: u32,
    pub seed: u64,
    pub max_tokens: u32,
    pub stop_at_eos: bool,
    /// Text that ends the generation; it is never emitted.
    pub stop_strings: Vec<String>,
    /// Token ids that end the generation.
    pub stop_tokens: Vec<u32>,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            logit_bias: Vec::new(),
            top_logprobs: 0,
            seed: 0,
            max_tokens: 128,
            stop_at_eos: true,
            stop_strings: Vec::new(),
            stop_tokens: Vec::new(),
        }
    }
}

/// One message of a conversation for [`Session::apply_chat_template`].
#[derive(Debug, Clone, PartialEq)]
pub struct ChatMessage {
    /// "system", "user", "assistant", "tool", ...
    pub role: String,
    /// None: no `content` field (an assistant turn with only tool calls).
    pub content: Option<String>,
    /// Further fields as a JSON object text (`tool_calls`, `name`,
    /// `tool_call_id`, `reasoning_content`, ...), key order kept.
    pub extra: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage { role: role.into(), content: Some(content.into()), extra: None }
    }
}

fn wit_messages(messages: &[ChatMessage]) -> Vec<WitChatMessage> {
    messages
        .iter()
        .map(|m| WitChatMessage { role: m.role.clone(), content: m.content.clone(), extra: m.extra.clone() })
        .collect()
}

/// Names the chat template renderer sets itself; a template variable may not
/// shadow them.
pub const RESERVED_TEMPLATE_VARS: [&str; 3] = ["messages", "tools", "add_generation_prompt"];

/// Checks template variables (a JSON object text, see
/// [`Session::apply_chat_template_with_vars`]) before they reach the guest,
/// so a caller's mistake is [`Error::Arg`] rather than a component error.
pub fn check_template_vars(vars: &str) -> Result<()> {
    let value: serde_json::Value = serde_json::from_str(vars)
        .map_err(|e| Error::Arg(format!("template variables: invalid JSON: {e}")))?;
    let serde_json::Value::Object(map) = value else {
        return Err(Error::Arg(format!("template variables: expected a JSON object, got {vars}")));
    };
    if let Some(name) = map.keys().find(|k| RESERVED_TEMPLATE_VARS.contains(&k.as_str())) {
        return Err(Error::Arg(format!("template variables: {name:?} is set by the renderer itself")));
    }
    Ok(())
}

/// One generated token, as streamed to the caller's callback.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    pub token: u32,
    /// Text completed by this token (empty while a character is split).
    pub text: String,
    pub logprob: f32,
    /// The most likely tokens at this step with their log-probabilities
    /// under the raw distribution, most likely first.
    pub top_logprobs: Vec<(u32, f32)>,
    pub experts_hit: u32,
    pub experts_missed: u32,
    pub bytes_read: u64,
    pub ms_total: f32,
    pub ms_io: f32,
    /// Expert reads bypass the page cache; false when the file system
    /// refused O_DIRECT / F_NOCACHE and reads are buffered.
    pub direct_io: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Length,
    Eos,
    Cancelled,
    ContextFull,
    StopString,
    StopToken,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Length => "length",
            StopReason::Eos => "eos",
            StopReason::Cancelled => "cancelled",
            StopReason::ContextFull => "context-full",
            StopReason::StopString => "stop-string",
            StopReason::StopToken => "stop-token",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub tokens: Vec<u32>,
    pub text: String,
    pub stop_reason: StopReason,
    /// Per token: its log-probability under the raw distribution.
    pub logprobs: Vec<f32>,
    /// Per token: the `top_logprobs` most likely alternatives.
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
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
        let slots = vec![ModelSlot { model, state, transcript: Transcript::default() }];
        let (store, bindings, instantiate_time) = instantiate(&self.guest, HostState::new(slots))?;
        Ok(Session { guest: self.guest.clone(), store, bindings, instantiate_time, plugin: None })
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
    /// The attached sampler plugin; the store's sampler hook holds a clone.
    plugin: Option<Arc<std::sync::Mutex<SamplerPlugin>>>,
}

/// The handle of the session's model inside its store.
const MODEL: u32 = 0;

impl Session {
    /// Routes every draw of later generations to `plugin` (None: back to
    /// the built-in sampler). Bias and penalties still apply before it.
    pub fn set_sampler(&mut self, plugin: Option<SamplerPlugin>) {
        self.plugin = plugin.map(|p| Arc::new(std::sync::Mutex::new(p)));
        self.store.data_mut().sampler = self.plugin.clone().map(|p| {
            Box::new(move |logits: &[f32], recent: &[u32]| match p.lock() {
                Ok(mut p) => p.sample(logits, recent),
                Err(_) => Err("the sampler plugin's lock is poisoned".to_string()),
            }) as crate::runtime::SamplerHook
        });
    }

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
        self.store.data_mut().slots[MODEL as usize].reset();
    }

    /// Every token of the conversation so far, in order (the last sampled
    /// token included, though it is evaluated only by the next call).
    pub fn tokens(&self) -> Vec<u32> {
        let t = &self.store.data().slots[MODEL as usize].transcript;
        t.evaluated().iter().copied().chain(t.pending()).collect()
    }

    /// Writes the whole conversation (the model's state, its position and
    /// its tokens) to `path`. The file records the model's identity and
    /// every shape it depends on.
    pub fn save_state(&self, path: &Path) -> Result<()> {
        let slot = &self.store.data().slots[MODEL as usize];
        let identity = slot.model.identity();
        let shape = SessionShape { model_identity: &identity, family: &slot.model.info.family, vocab_size: slot.model.info.vocab_size };
        state_io::save_session(path, &shape, &slot.state, &slot.transcript)
    }

    /// Replaces the conversation with one saved by [`Session::save_state`]
    /// for the same model. A file from another model, or one whose shapes
    /// do not fit this session, is an error and leaves the session as it was.
    pub fn load_state(&mut self, path: &Path) -> Result<()> {
        let slot = &mut self.store.data_mut().slots[MODEL as usize];
        let identity = slot.model.identity();
        let shape = SessionShape { model_identity: &identity, family: &slot.model.info.family, vocab_size: slot.model.info.vocab_size };
        let mut state = slot.model.new_state();
        let transcript = state_io::load_session(path, &shape, &mut state)?;
        slot.state = state;
        slot.transcript = transcript;
        Ok(())
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

    /// The conversation through the model's own chat template, as prompt
    /// tokens: template markup with special tokens resolved, message content
    /// as plain content, so no message can forge a control token. `tools` is
    /// a JSON array of tool definitions. A model without a template is an
    /// error.
    pub fn apply_chat_template(
        &mut self,
        messages: &[ChatMessage],
        tools: Option<&str>,
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>> {
        self.apply_chat_template_with_vars(messages, tools, add_generation_prompt, None)
    }

    /// [`apply_chat_template`](Self::apply_chat_template) with further
    /// template variables: `vars` is a JSON object text such as
    /// `{"enable_thinking": false}` (transformers' extra keyword arguments to
    /// `apply_chat_template`). Not an object, or one naming `messages`,
    /// `tools` or `add_generation_prompt`, is [`Error::Arg`].
    pub fn apply_chat_template_with_vars(
        &mut self,
        messages: &[ChatMessage],
        tools: Option<&str>,
        add_generation_prompt: bool,
        vars: Option<&str>,
    ) -> Result<Vec<u32>> {
        if let Some(v) = vars {
            check_template_vars(v)?;
        }
        let msgs = wit_messages(messages);
        self.call(|b, s| {
            b.waste_engine_control().call_apply_chat_template(s, MODEL, &msgs, tools, add_generation_prompt, vars)
        })
    }

    /// The same rendering as text, as transformers'
    /// `apply_chat_template(..., tokenize=False)` returns it.
    pub fn render_chat_template(
        &mut self,
        messages: &[ChatMessage],
        tools: Option<&str>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render_chat_template_with_vars(messages, tools, add_generation_prompt, None)
    }

    /// [`render_chat_template`](Self::render_chat_template) with further
    /// template variables (see
    /// [`apply_chat_template_with_vars`](Self::apply_chat_template_with_vars)).
    pub fn render_chat_template_with_vars(
        &mut self,
        messages: &[ChatMessage],
        tools: Option<&str>,
        add_generation_prompt: bool,
        vars: Option<&str>,
    ) -> Result<String> {
        if let Some(v) = vars {
            check_template_vars(v)?;
        }
        let msgs = wit_messages(messages);
        self.call(|b, s| {
            b.waste_engine_control().call_render_chat_template(s, MODEL, &msgs, tools, add_generation_prompt, vars)
        })
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
            min_p: params.min_p,
            repetition_penalty: params.repetition_penalty,
            presence_penalty: params.presence_penalty,
            frequency_penalty: params.frequency_penalty,
            penalty_last_n: params.penalty_last_n,
            logit_bias: params.logit_bias.clone(),
            top_logprobs: params.top_logprobs,
            seed: params.seed,
            max_tokens: params.max_tokens,
            stop_at_eos: params.stop_at_eos,
            stop_strings: params.stop_strings.clone(),
            stop_tokens: params.stop_tokens.clone(),
            plugin: self.store.data().sampler.is_some(),
        };
        if let Some(plugin) = &self.plugin {
            let mut p = plugin.lock().map_err(|_| Error::Runtime("the sampler plugin's lock is poisoned".into()))?;
            p.begin(params.temperature, params.seed).map_err(Error::Runtime)?;
        }
        self.store.data_mut().on_token = Some(Box::new(on_token));
        // An out-of-range parameter is the caller's mistake (Error::Arg);
        // any other failure is the component's (Error::Guest).
        let result = self.call(|b, s| {
            b.waste_engine_control().call_generate(s, MODEL, prompt, &wit_params).map(|r| match r {
                Ok(c) => Ok(Ok(c)),
                Err(WitGenerateError::InvalidArgument(m)) => Ok(Err(m)),
                Err(WitGenerateError::Failed(m)) => Err(m),
            })
        });
        self.store.data_mut().on_token = None;
        let completion = result?.map_err(Error::Arg)?;
        // The guest never evaluates the last token it sampled; the next
        // evaluation puts it in front (see `evaluate` in wit/engine.wit).
        if let Some(&last) = completion.tokens.last() {
            self.store.data_mut().slots[MODEL as usize].transcript.hold(last);
        }
        let (logprobs, top_logprobs) = completion
            .logprobs
            .into_iter()
            .map(|l| (l.logprob, l.top.into_iter().map(|t| (t.token, t.logprob)).collect()))
            .unzip();
        Ok(Completion {
            tokens: completion.tokens,
            text: completion.text,
            stop_reason: match completion.stop_reason {
                WitStopReason::Length => StopReason::Length,
                WitStopReason::Eos => StopReason::Eos,
                WitStopReason::Cancelled => StopReason::Cancelled,
                WitStopReason::ContextFull => StopReason::ContextFull,
                WitStopReason::StopString => StopReason::StopString,
                WitStopReason::StopToken => StopReason::StopToken,
            },
            logprobs,
            top_logprobs,
        })
    }

    /// Evaluates `tokens` on top of the state and returns raw logits (last
    /// position, or every position of `tokens`), for hosts that sample
    /// themselves. A token held from the last generation is evaluated first.
    pub fn eval(&mut self, tokens: &[u32], all_positions: bool) -> Result<(Vec<f32>, StepStats)> {
        if tokens.is_empty() {
            return Err(Error::Arg("no tokens to evaluate".into()));
        }
        self.store.data_mut().slots[MODEL as usize].forward(tokens, all_positions)
    }

    /// Perplexity of `text` (tokenized as content) in windows of `window`
    /// tokens (default: the model's context); see [`Model::perplexity`].
    /// Uses fresh states: the conversation is left as it was.
    pub fn perplexity(&mut self, text: &str, window: Option<usize>) -> Result<Perplexity> {
        let tokens = self.tokenize(text)?;
        let model = Arc::clone(self.model());
        model.perplexity(&tokens, window.unwrap_or(model.context()), PERPLEXITY_CHUNK)
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
