//! A converted container, opened: the native model every front end runs.
//! Its trunk is resident, its routed experts stay on disk behind the expert
//! store, its memory is planned against the budget before anything large
//! is allocated. Sessions (the host crate) share one `Model`.

use std::path::Path;
use std::sync::Arc;

use crate::container::Container;
use crate::error::{Error, Result};
use crate::info::ModelInfo;
use crate::kv::KvType;
use crate::open_progress::CountingSource;
pub use crate::open_progress::OpenProgress;
use crate::plan::MemoryPlan;
use crate::stats::StepStats;
use crate::store::{ExpertStore, StoreOptions, StoreStats, USAGE_FILE};
use crate::transformer::{Splice, State, Transformer};

/// Options for [`Model::open`].
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Tokens of context to allocate state for; `None` = min(model maximum, 4096).
    pub context: Option<usize>,
    /// Hard RAM budget in bytes for everything the model allocates (trunk,
    /// one session's state, scratch, expert cache); `None` = chosen from
    /// usable RAM (see [`crate::plan`]). Under the floor, open fails.
    pub budget: Option<u64>,
    /// How expert records are read and kept: whether the cache keeps them
    /// (`keep`), its policy, reader threads, read-ahead, direct I/O and
    /// router lookahead. `cache_slots` and `hash_layers` are set at open,
    /// from the memory plan and the model.
    pub store: StoreOptions,
    /// Preload the hottest experts recorded in the container's usage file.
    pub preload: bool,
    /// Compute threads; `None` = one per CPU of `cpus`, or of the machine.
    /// Logits do not depend on it (see [`crate::pool`]).
    pub threads: Option<usize>,
    /// Bind the compute threads and the calling thread to these CPUs
    /// (Linux; elsewhere opening fails with `Error::Unsupported`).
    pub cpus: Option<crate::pool::CpuSet>,
    /// Tokens per prefill chunk (1 to `MAX_PREFILL_CHUNK`): a prompt runs
    /// layer-major in chunks, each distinct expert read once per chunk and
    /// computed over its tokens as matrix products; 1 = token at a time.
    /// `None`: the memory plan picks the largest that fits
    /// (`plan::choose_prefill_chunk`). Logits differ from token at a time
    /// by float rounding only (docs/PERFORMANCE.md states the bound).
    pub prefill_chunk: Option<usize>,
    /// Which checksums to check beyond those of what is read whole: by
    /// default each expert record as it lands (`Verify::Records`).
    pub verify: crate::container::Verify,
    /// Session states held besides the first (a server's prefix cache),
    /// counted inside the budget.
    pub extra_states: usize,
    /// How the KV cache stores keys and values (GQA layers; MLA latents
    /// and V4 entries stay f32). bf16 by default: half of f32's bytes,
    /// logits within the bound `tests/integration/kv_type.rs` holds per
    /// family.
    pub kv_type: KvType,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            context: None,
            budget: None,
            store: StoreOptions::default(),
            preload: true,
            threads: None,
            cpus: None,
            prefill_chunk: None,
            verify: crate::container::Verify::default(),
            extra_states: 0,
            kv_type: KvType::default(),
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

/// Where the learned hotlist of a model is kept: `usage.json` in a
/// container's directory, `FILE.gguf.usage.json` beside a GGUF file run in
/// place.
fn usage_path(container: &Container) -> std::path::PathBuf {
    if container.in_place() {
        let mut name = container.dir().as_os_str().to_owned();
        name.push(".usage.json");
        return name.into();
    }
    container.dir().join(USAGE_FILE)
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
    /// `OpenOptions::extra_states`: states the budget holds beside the first.
    extra_states: usize,
    /// Kimi K3's vision tower, read from the container at the first image.
    pub(crate) vision: std::sync::Mutex<Option<Arc<crate::vision::tower::VisionTower>>>,
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
        if let Some(chunk) = options.prefill_chunk {
            crate::transformer::prefill::check_chunk(chunk)?;
        }
        let mut container = crate::paths::open_container(path)?;
        container.set_verify(options.verify)?;
        // The budget is checked before anything large is allocated.
        let request = crate::plan::PlanRequest {
            context: options.context,
            budget: options.budget,
            extra_states: options.extra_states,
            prefill_chunk: options.prefill_chunk,
            kv_type: options.kv_type,
            threads: Some(pool.threads()),
            ..Default::default()
        };
        let plan = crate::plan::plan(&container, &request)?;
        let context = plan.context;
        let tensors = container
            .manifest()
            .trunk
            .tensors
            .iter()
            .map(|t| (t.name.clone(), crate::plan::resident_tensor_bytes(container.config(), t)));
        // The bytes the trunk's tensors load (a GGUF's expert biases are
        // read with its banks).
        let resident = crate::plan::resident_trunk_bytes(container.config(), container.manifest());
        let source = CountingSource::new(&container, tensors, resident, &mut *progress);
        let mut transformer = Transformer::load(container.config(), &source)?;
        // A chunk the caller named is the chunk; the plan's may grow for a
        // long prompt on cache the experts lend.
        match options.prefill_chunk {
            Some(chunk) => transformer.set_prefill_chunk(chunk)?,
            None => {
                let (cfg, inputs) = (container.config().clone(), crate::plan::ChunkInputs::of(container.manifest()));
                let larger =
                    move |context, sizes, lendable| crate::plan::larger_chunk(&cfg, inputs, context, sizes, lendable);
                transformer.set_prefill_plan(plan.prefill_chunk, Box::new(larger))?
            }
        }
        source.finish();
        let store_options = StoreOptions {
            cache_slots: plan.cache_slots,
            hash_layers: container.config().add.v4.as_ref().map_or(Vec::new(), |v| v.hash_layers.clone()),
            ..options.store.clone()
        };
        let experts = ExpertStore::open(container.expert_banks()?, container.config().top_k, store_options)?;
        let usage = usage_path(&container);
        if options.preload && options.store.keep && usage.is_file() {
            let before = experts.stats().preloaded;
            let record = experts.record_bytes() as u64;
            experts.preload_usage(&usage, &mut |done, total| {
                progress(&if done == 0 {
                    OpenProgress::PreloadStarted { records: total, bytes: total as u64 * record }
                } else {
                    OpenProgress::Preloading { records: done, bytes: done as u64 * record }
                })
            })?;
            let records = experts.stats().preloaded - before;
            progress(&OpenProgress::Preloaded {
                records: records as usize,
                bytes: records * experts.record_bytes() as u64,
            });
        }
        let info = ModelInfo::of(&container);
        Ok(Arc::new(Model {
            container,
            transformer,
            experts,
            info,
            context,
            plan,
            pool,
            extra_states: options.extra_states,
            vision: Default::default(),
        }))
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
            trunk: crate::plan::resident_bytes(&self.container),
            state: crate::plan::state_bytes(self.container.config(), self.context, self.plan.kv_type),
            scratch: crate::plan::model_scratch_bytes(
                &self.container,
                self.context,
                self.plan.prefill_chunk,
                self.pool.threads(),
            ),
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
        let path = usage_path(&self.container);
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
                crate::transformer::experts::ExpertProvider::forward_experts(experts, layer, x, &picks, out, stats)
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
        self.container.manifest().identity()
    }

    /// The tokens of context each session allocates state for.
    pub fn context(&self) -> usize {
        self.context
    }

    /// Session states the budget holds room for beside the first
    /// ([`OpenOptions::extra_states`]): a server's prefix cache keeps this many.
    pub fn extra_states(&self) -> usize {
        self.extra_states
    }

    pub fn tokenizer_json(&self) -> Option<&str> {
        self.container.tokenizer_json()
    }

    /// The tokenizer and template files the container carries, as
    /// (file name, bytes).
    pub fn tokenizer_files(&self) -> &[(String, Vec<u8>)] {
        self.container.tokenizer_files()
    }

    /// The chat template a conversation with or without tools renders with
    /// (see `container::ChatTemplates::choose`); `Ok(None)`: none.
    pub fn chat_template(&self, with_tools: bool) -> std::result::Result<Option<&str>, String> {
        self.container.chat_template(with_tools)
    }

    /// Whether a state can be cut back to an earlier position (full-context
    /// caches only: no recurrent or windowed layer).
    pub fn rewindable_state(&self) -> bool {
        !self.container.config().has_unrewindable_state()
    }

    /// A fresh state (KV cache) sized for this model's context.
    pub fn new_state(&self) -> State {
        State::with_kv(self.container.config(), self.context, self.plan.kv_type)
    }

    /// Appends `tokens` to `state` and returns the logits of the last one, or
    /// of every one (`[tokens.len() * vocab]`) with `all_positions`.
    pub fn forward(&self, state: &mut State, tokens: &[u32], all_positions: bool) -> Result<(Vec<f32>, StepStats)> {
        self.forward_spliced(state, tokens, Splice::default(), all_positions)
    }

    /// `forward` with some tokens' input rows given (`Transformer::forward_spliced`).
    pub fn forward_spliced(
        &self,
        state: &mut State,
        tokens: &[u32],
        splice: Splice<'_>,
        all_positions: bool,
    ) -> Result<(Vec<f32>, StepStats)> {
        if tokens.is_empty() {
            return Err(Error::Arg("no tokens to evaluate".into()));
        }
        let mut stats = StepStats::default();
        let (transformer, experts, st) = (&self.transformer, &self.experts, &mut stats);
        let logits =
            self.pool.install(|| transformer.forward_spliced(state, tokens, splice, experts, all_positions, st))??;
        Ok((logits, stats))
    }

    pub(crate) fn container(&self) -> &Container {
        &self.container
    }
}
