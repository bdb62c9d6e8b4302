//! A session: one conversation with one model, through its own instance of
//! the control component. Tokenizer, chat template and sampling are reached
//! only through the component; the forward pass is native.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use wasmtime::Store;

use crate::bindings::engine::Engine as EngineBindings;
use crate::bindings::wit_control;
use crate::component::{CompiledGuest, HostState, ModelSlot};
use crate::params::{check_template_vars, ChatMessage, Completion, GenerateParams, TokenEvent};
use crate::plugin::SamplerPlugin;
use waste_engine::transformer::state_io::{self, SessionShape};
use waste_engine::{Error, Model, Perplexity, Result, StepStats, PERPLEXITY_CHUNK};

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

impl Session {
    pub(crate) fn new(
        guest: Arc<CompiledGuest>,
        store: Store<HostState>,
        bindings: EngineBindings,
        instantiate_time: Duration,
    ) -> Session {
        Session { guest, store, bindings, instantiate_time, plugin: None }
    }

    /// The session's model and state. A session's store holds them from
    /// `Engine::session` to drop: `call` moves them into a replacement
    /// store, or back, never leaving the store without them.
    fn slot(&self) -> &ModelSlot {
        self.store.data().slot.as_ref().expect("a session's store always holds its model")
    }

    fn slot_mut(&mut self) -> &mut ModelSlot {
        self.store.data_mut().slot.as_mut().expect("a session's store always holds its model")
    }

    /// Routes every draw of later generations to `plugin` (None: back to
    /// the built-in sampler). Bias and penalties still apply before it.
    pub fn set_sampler(&mut self, plugin: Option<SamplerPlugin>) {
        self.plugin = plugin.map(|p| Arc::new(std::sync::Mutex::new(p)));
        self.store.data_mut().sampler = self.plugin.clone().map(|p| {
            Box::new(move |logits: &[f32], recent: &[u32]| match p.lock() {
                Ok(mut p) => p.sample(logits, recent),
                Err(_) => Err("the sampler plugin's lock is poisoned".to_string()),
            }) as crate::component::SamplerHook
        });
    }

    pub fn instantiate_time(&self) -> Duration {
        self.instantiate_time
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.slot().model
    }

    /// Tokens held in the state.
    pub fn position(&self) -> usize {
        self.slot().state.position()
    }

    /// Forgets the conversation (position 0) and any attached image.
    pub fn reset(&mut self) {
        self.slot_mut().reset();
    }

    /// An image file's bytes (PNG, JPEG, WebP, GIF), decoded, preprocessed
    /// and run through the model's vision tower: a handle to attach to
    /// this session's prompts (once per prompt that holds it).
    pub fn encode_image(&self, bytes: &[u8]) -> Result<Image> {
        Ok(Image(Arc::new(self.slot().model.encode_image(bytes)?)))
    }

    /// Queues `image` for the next evaluations: the next image placeholder
    /// token of an evaluated prompt takes it (in attachment order). Put
    /// [`Image::markup`] in the prompt where the image belongs.
    pub fn attach(&mut self, image: &Image) {
        self.slot_mut().images.push_back(Arc::clone(&image.0));
    }

    /// Drops the images attached and not yet taken by a placeholder.
    pub fn detach_images(&mut self) {
        self.slot_mut().images.clear();
    }

    /// [`encode_image`](Self::encode_image), then [`attach`](Self::attach).
    pub fn attach_image(&mut self, bytes: &[u8]) -> Result<Image> {
        let image = self.encode_image(bytes)?;
        self.attach(&image);
        Ok(image)
    }

    /// Images attached and not yet taken by a placeholder.
    pub fn pending_images(&self) -> usize {
        self.slot().images.len()
    }

    /// The conversation's state and tokens as they are now, to resume from
    /// later ([`Session::resume`]); the token sampled last and not yet
    /// evaluated is not part of it.
    pub fn snapshot(&self) -> Snapshot {
        let slot = self.slot();
        let mut transcript = slot.transcript.clone();
        transcript.truncate(slot.state.position());
        let placeholder = slot.model.vision().map(|v| v.placeholder);
        Snapshot { state: slot.state.clone(), transcript, placeholder }
    }

    /// Continues from `snapshot` cut back to its first `keep` tokens (cut
    /// only where the model's state can be rewound: see
    /// [`Snapshot::usable_prefix`]). The snapshot must come from a session of
    /// this model.
    pub fn resume(&mut self, snapshot: &Snapshot, keep: usize) -> Result<()> {
        let rewindable = self.slot().model.rewindable_state();
        let slot = self.slot_mut();
        let mut state = snapshot.state.clone();
        state.rewind(keep, rewindable)?;
        let mut transcript = snapshot.transcript.clone();
        transcript.truncate(keep);
        slot.state = state;
        slot.transcript = transcript;
        Ok(())
    }

    /// Every token of the conversation so far, in order (the last sampled
    /// token included, though it is evaluated only by the next call).
    pub fn tokens(&self) -> Vec<u32> {
        let t = &self.slot().transcript;
        t.evaluated().iter().copied().chain(t.pending()).collect()
    }

    /// Writes the whole conversation (the model's state, its position and
    /// its tokens) to `path`. The file records the model's identity and
    /// every shape it depends on.
    pub fn save_state(&self, path: &Path) -> Result<()> {
        let slot = self.slot();
        let (identity, info) = (slot.model.identity(), slot.model.info());
        let shape = SessionShape { model_identity: &identity, family: &info.family, vocab_size: info.vocab_size };
        state_io::save_session(path, &shape, &slot.state, &slot.transcript)
    }

    /// Replaces the conversation with one saved by [`Session::save_state`]
    /// for the same model. A file from another model, or one whose shapes
    /// do not fit this session, is an error and leaves the session as it was.
    pub fn load_state(&mut self, path: &Path) -> Result<()> {
        let slot = self.slot_mut();
        let (identity, info) = (slot.model.identity(), slot.model.info());
        let shape = SessionShape { model_identity: &identity, family: &info.family, vocab_size: info.vocab_size };
        let mut state = slot.model.new_state();
        let transcript = state_io::load_session(path, &shape, &mut state)?;
        slot.state = state;
        slot.transcript = transcript;
        Ok(())
    }

    /// Text as plain content: special-token strings stay text.
    pub fn tokenize(&mut self, text: &str) -> Result<Vec<u32>> {
        self.call(|b, s| b.waste_engine_control().call_tokenize(s, text))
    }

    /// Text as template markup: special-token strings become their ids.
    pub fn tokenize_markup(&mut self, text: &str) -> Result<Vec<u32>> {
        self.call(|b, s| b.waste_engine_control().call_tokenize_markup(s, text))
    }

    pub fn detokenize(&mut self, tokens: &[u32]) -> Result<String> {
        self.call(|b, s| b.waste_engine_control().call_detokenize(s, tokens))
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
        let msgs: Vec<_> = messages.iter().map(wit_control::ChatMessage::from).collect();
        self.call(|b, s| {
            b.waste_engine_control().call_apply_chat_template(s, &msgs, tools, add_generation_prompt, vars)
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
        let msgs: Vec<_> = messages.iter().map(wit_control::ChatMessage::from).collect();
        self.call(|b, s| {
            b.waste_engine_control().call_render_chat_template(s, &msgs, tools, add_generation_prompt, vars)
        })
    }

    /// Checks `params` as [`generate`](Self::generate) would before
    /// evaluating anything (ranges, stop strings, the constraint compiled),
    /// so a front end can refuse a malformed request before it answers:
    /// [`Error::Arg`] names what is wrong.
    pub fn check_params(&mut self, params: &GenerateParams) -> Result<()> {
        let wit_params = wit_control::SamplingParams::from(params);
        self.call(|b, s| b.waste_engine_control().call_check_params(s, &wit_params))
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
        let wit_params = wit_control::SamplingParams {
            plugin: self.store.data().sampler.is_some(),
            ..wit_control::SamplingParams::from(params)
        };
        if let Some(plugin) = &self.plugin {
            let mut p = plugin.lock().map_err(|_| Error::Runtime("the sampler plugin's lock is poisoned".into()))?;
            p.begin(params.temperature, params.seed).map_err(Error::Runtime)?;
        }
        self.store.data_mut().on_token = Some(Box::new(on_token));
        let result = self.call(|b, s| b.waste_engine_control().call_generate(s, prompt, &wit_params));
        self.store.data_mut().on_token = None;
        let completion = Completion::from(result?);
        // The guest never evaluates the last token it sampled; the next
        // evaluation puts it in front (see `evaluate` in wit/engine.wit).
        if let Some(&last) = completion.tokens.last() {
            self.slot_mut().transcript.hold(last);
        }
        Ok(completion)
    }

    /// Evaluates `tokens` on top of the state and returns raw logits (last
    /// position, or every position of `tokens`), for hosts that sample
    /// themselves. A token held from the last generation is evaluated first.
    pub fn eval(&mut self, tokens: &[u32], all_positions: bool) -> Result<(Vec<f32>, StepStats)> {
        if tokens.is_empty() {
            return Err(Error::Arg("no tokens to evaluate".into()));
        }
        self.slot_mut().forward(tokens, all_positions)
    }

    /// Perplexity of `text` (tokenized as content) in windows of `window`
    /// tokens (default: the model's context); see [`Model::perplexity`].
    /// Uses fresh states: the conversation is left as it was.
    pub fn perplexity(&mut self, text: &str, window: Option<usize>) -> Result<Perplexity> {
        let tokens = self.tokenize(text)?;
        let model = Arc::clone(self.model());
        model.perplexity(&tokens, window.unwrap_or(model.context()), PERPLEXITY_CHUNK)
    }

    /// Runs one export call. The component's error becomes the `Error` of
    /// its kind, except that a failure caused by a native error (an
    /// expert read, a full context) is that native error as raised. A
    /// trap (a guest panic) becomes `Error::Guest` carrying the guest's own
    /// message, and the instance is replaced, since a trapped instance
    /// cannot be entered again; the model state survives.
    fn call<R>(
        &mut self,
        f: impl FnOnce(&EngineBindings, &mut Store<HostState>) -> wasmtime::Result<Result<R, wit_control::Error>>,
    ) -> Result<R> {
        self.store.data_mut().native_error = None;
        match f(&self.bindings, &mut self.store) {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => match (e, self.store.data_mut().native_error.take()) {
                (wit_control::Error::Failed(_), Some(native)) => Err(native),
                (e, _) => Err(Error::from(e)),
            },
            Err(trap) => {
                let stderr = self.store.data().guest_stderr();
                self.reinstantiate()?;
                let detail = if stderr.is_empty() { String::new() } else { format!(": {stderr}") };
                Err(Error::Guest(format!("{trap:#}{detail}")))
            }
        }
    }

    /// Replaces the component instance with a fresh one, the session's
    /// model, state, plugin and chosen template carried over (a trapped
    /// instance cannot be entered again; a new template must be parsed
    /// anew). When instantiating fails, they go back to the old store, so
    /// the next call fails (and tries) again rather than losing them.
    fn reinstantiate(&mut self) -> Result<()> {
        let data = self.store.data_mut().carry_over();
        match self.guest.instantiate(data) {
            Ok((store, bindings, _)) => {
                self.store = store;
                self.bindings = bindings;
                Ok(())
            }
            Err((mut data, e)) => {
                self.store.data_mut().take_session_from(&mut data);
                Err(e)
            }
        }
    }

    /// Renders later conversations with `template` (Jinja source, rendered
    /// as the model's own would be) instead of the model's; `None` goes back
    /// to the model's. A template that does not compile is an error when a
    /// conversation is first rendered with it.
    /// The template conversations are rendered with: the one
    /// [`set_chat_template`](Self::set_chat_template) gave, else the model's
    /// own (its tool-use variant with `with_tools`); None: the model has
    /// none; an error: the model's template is malformed.
    pub fn chat_template(&self, with_tools: bool) -> std::result::Result<Option<&str>, String> {
        self.store.data().chat_template_in_use(&self.slot().model, with_tools)
    }

    pub fn set_chat_template(&mut self, template: Option<String>) -> Result<()> {
        self.store.data_mut().chat_template = template;
        // The component parses the template once per instance.
        self.reinstantiate()
    }
}

/// A conversation's state and tokens at one moment ([`Session::snapshot`]).
#[derive(Clone)]
pub struct Snapshot {
    state: waste_engine::transformer::State,
    transcript: waste_engine::transformer::state_io::Transcript,
    /// The image placeholder token: positions from the first one on hold
    /// an image's rows, which equal tokens do not identify.
    placeholder: Option<u32>,
}

/// A snapshot on disk whose header has been read ([`Snapshot::peek`]).
#[derive(Debug, Clone)]
pub struct SavedSnapshot {
    path: std::path::PathBuf,
    summary: state_io::SessionSummary,
    placeholder: Option<u32>,
}

impl SavedSnapshot {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The evaluated tokens its header lists.
    pub fn tokens(&self) -> &[u32] {
        &self.summary.tokens
    }

    pub fn file_bytes(&self) -> u64 {
        self.summary.file_bytes
    }

    /// [`Snapshot::usable_prefix`], from the header alone.
    pub fn usable_prefix(&self, prompt: &[u32], rewindable: bool) -> usize {
        usable_prefix(self.tokens(), self.placeholder, prompt, rewindable)
    }

    /// Reads the whole file, its checksum verified, as a snapshot of
    /// `model`. A file that changed since it was peeked (other tokens) is
    /// an error, as is any damage.
    pub fn load(&self, model: &Model) -> Result<Snapshot> {
        let (identity, info) = (model.identity(), model.info());
        let shape = SessionShape { model_identity: &identity, family: &info.family, vocab_size: info.vocab_size };
        let mut state = model.new_state();
        let transcript = state_io::load_session(&self.path, &shape, &mut state)?;
        if transcript.evaluated() != self.tokens() {
            return Err(Error::format(&self.path, "the file changed since its header was read"));
        }
        Ok(Snapshot { state, transcript, placeholder: self.placeholder })
    }
}

/// The tokens of `prompt` a state holding `held` can resume: see
/// [`Snapshot::usable_prefix`].
fn usable_prefix(held: &[u32], placeholder: Option<u32>, prompt: &[u32], rewindable: bool) -> usize {
    let common = held.iter().zip(prompt).take_while(|(a, b)| a == b && Some(**a) != placeholder).count();
    let common = common.min(prompt.len().saturating_sub(1));
    if rewindable || common == held.len() {
        common
    } else {
        0
    }
}

/// An image run through the model's vision tower ([`Session::encode_image`]):
/// its rows, shared by every prompt that attaches it.
#[derive(Debug, Clone)]
pub struct Image(Arc<waste_engine::images::ImageRows>);

impl Image {
    /// The size the file declares.
    pub fn width(&self) -> usize {
        self.0.width
    }
    pub fn height(&self) -> usize {
        self.0.height
    }
    /// Prompt positions its rows take.
    pub fn tokens(&self) -> usize {
        self.0.tokens
    }
    /// The prompt text that stands for the image (special tokens): in a
    /// prompt's markup, or a chat message's `media`.
    pub fn markup(&self) -> String {
        waste_engine::vision::image_markup(self.0.width, self.0.height)
    }
}

impl Snapshot {
    /// The evaluated tokens.
    pub fn tokens(&self) -> &[u32] {
        self.transcript.evaluated()
    }

    /// How many of `prompt`'s first tokens can be resumed from this
    /// snapshot, leaving at least one to evaluate (its logits start the
    /// answer): the common prefix when the state can be rewound
    /// (`rewindable`), else all of the snapshot when it is a prefix of
    /// `prompt`, else none. Never past an image placeholder: the rows an
    /// image left in the state are not named by its tokens.
    pub fn usable_prefix(&self, prompt: &[u32], rewindable: bool) -> usize {
        usable_prefix(self.tokens(), self.placeholder, prompt, rewindable)
    }

    /// Writes the snapshot to `path` in [`Session::save_state`]'s format
    /// (checksummed, stamped with `model`'s identity, written to a temporary
    /// name and renamed into place). `model` is the one it was taken from.
    pub fn save(&self, model: &Model, path: &Path) -> Result<()> {
        let (identity, info) = (model.identity(), model.info());
        let shape = SessionShape { model_identity: &identity, family: &info.family, vocab_size: info.vocab_size };
        state_io::save_session(path, &shape, &self.state, &self.transcript)
    }

    /// Reads the header of a file [`Snapshot::save`] (or
    /// [`Session::save_state`]) wrote for `model`: its tokens, not its
    /// state. A file of another model, or one that cannot fit a state of
    /// `model`, is an error.
    pub fn peek(model: &Model, path: &Path) -> Result<SavedSnapshot> {
        let (identity, info) = (model.identity(), model.info());
        let shape = SessionShape { model_identity: &identity, family: &info.family, vocab_size: info.vocab_size };
        let limit = state_io::MAX_SESSION_OVERHEAD + model.memory_used().state;
        let summary = state_io::peek_session(path, &shape, model.context(), limit)?;
        let placeholder = model.vision().map(|v| v.placeholder);
        Ok(SavedSnapshot { path: path.to_path_buf(), summary, placeholder })
    }

    /// An upper bound on the bytes [`Snapshot::save`] writes.
    pub fn file_bytes_estimate(&self) -> u64 {
        state_io::file_bytes_estimate(&self.state, self.tokens().len())
    }

    pub fn bytes(&self) -> usize {
        self.state.bytes()
    }
}
