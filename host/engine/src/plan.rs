//! The memory planner: what a model needs in RAM before it is opened, and
//! how a budget is split between the fixed parts and the expert cache.
//!
//! Everything the engine allocates is counted: the resident trunk, the
//! state of one session's context, the scratch of one forward pass, and the
//! expert cache (whose slots are also the I/O buffers: records are read
//! straight into them). Sizes are in bytes.

use crate::config::layout::EdgeTensors;
use crate::config::ModelConfig;
use crate::container::manifest::{Manifest, TensorEntry};
use crate::container::Container;
use crate::error::{Error, Result};
use crate::kv::KvType;
pub use crate::size::{fmt_bytes, parse_size};

/// How the budget of a plan was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetSource {
    /// Given by the caller.
    Given,
    /// Chosen automatically: the floor plus this many working sets (0 = the
    /// floor alone, when not even one working set fits under 7/8 of usable RAM).
    Auto { working_sets: u32 },
}

/// Default context when the caller does not choose one: the model's own
/// maximum, capped so a small machine can hold the KV cache.
pub const DEFAULT_CONTEXT: usize = 4096;

#[derive(Debug, Clone, PartialEq)]
pub struct MemoryPlan {
    pub context: usize,
    /// How the state's KV cache is stored (`state` counts it so).
    pub kv_type: KvType,
    /// The resident trunk: every trunk tensor but an untied embedding table.
    pub trunk: u64,
    /// The untied embedding table, left on disk (one row read per token);
    /// not part of any total.
    pub embedding_on_disk: u64,
    /// One session's state: GQA keys and values, MLA latent rows, KDA
    /// recurrent state and conv rings.
    pub state: u64,
    /// Buffers of one forward pass (an upper estimate), a prefill chunk's
    /// included, and what each compute thread keeps ([`per_thread_bytes`]).
    pub scratch: u64,
    /// Tokens per prefill chunk: given, or the largest whose buffers take
    /// at most an eighth of what the budget leaves beside the trunk and
    /// states ([`choose_prefill_chunk`]).
    pub prefill_chunk: usize,
    /// Kimi K3's vision tower when planned for images (`waste plan
    /// --vision`): its weights, its buffers and the rows of the largest
    /// image the processor lets through; 0 otherwise.
    pub vision: u64,
    pub record_bytes: u64,
    pub top_k: usize,
    pub moe_layers: usize,
    pub experts_per_layer: usize,
    /// top_k x record x 2: the least cache the store can run with.
    pub min_cache: u64,
    /// trunk + state + vision + min_cache + the scratch of the chunk the
    /// caller named, or of the smallest the plan picks
    /// ([`SMALLEST_CHUNK`]): a budget the model opens in.
    pub floor: u64,
    /// top_k x record x MoE layers: what one token reads when nothing is cached.
    pub working_set: u64,
    /// floor + 3 working sets.
    pub recommended: u64,
    /// Every expert record of the model.
    pub all_experts: u64,
    pub usable_ram: u64,
    pub budget: u64,
    pub budget_source: BudgetSource,
    /// The cache the budget buys.
    pub cache_slots: usize,
    pub cache_bytes: u64,
}

impl MemoryPlan {
    /// Everything planned: trunk + state + scratch + vision + cache.
    pub fn total(&self) -> u64 {
        self.trunk + self.state + self.scratch + self.vision + self.cache_bytes
    }
}

/// Bytes of one session's state for `context` tokens, each layer as what
/// it keeps: GQA keys and values per token, the MLA latent row per token,
/// the KDA state and conv rings once (what `model::State::new` allocates).
pub fn state_bytes(cfg: &ModelConfig, context: usize, kv: KvType) -> u64 {
    cfg.state_bytes(context, kv)
}

/// Whether trunk tensor `name` stays on disk rather than in RAM: the
/// embedding table of a model whose LM head is not tied to it (the rule of
/// `model::embedding::load`).
fn stays_on_disk(cfg: &ModelConfig, t: &TensorEntry) -> bool {
    !cfg.tie_word_embeddings && t.name == EdgeTensors::of(cfg).embed_tokens.name && t.shape.len() == 2
}

/// Bytes trunk tensor `t` holds in RAM once open: none for an untied
/// embedding table, for MLA's `kv_b_proj` what the layer keeps
/// (`model::mla::kv_b_resident_bytes`: its stored form since it stopped
/// expanding a quantised one to f32), its stored bytes otherwise.
pub fn resident_tensor_bytes(cfg: &ModelConfig, t: &TensorEntry) -> u64 {
    // K3's vision tower is read only when an image is given
    // (`vision_tower_bytes`, `waste plan --vision`).
    if stays_on_disk(cfg, t) || crate::config::is_vision_tensor(&t.name) {
        return 0;
    }
    let fmt = crate::quant::TrunkFormat::parse(&t.format);
    match (&t.shape[..], fmt) {
        ([rows, cols], Some(fmt)) if t.name.ends_with(crate::transformer::mla::KV_B_SUFFIX) => {
            crate::transformer::mla::kv_b_resident_bytes(fmt, *rows as usize, *cols as usize) as u64
        }
        _ => t.bytes,
    }
}

/// Bytes of the trunk held in RAM once open (sum of
/// [`resident_tensor_bytes`]).
pub fn resident_trunk_bytes(cfg: &ModelConfig, manifest: &Manifest) -> u64 {
    manifest.trunk.tensors.iter().map(|t| resident_tensor_bytes(cfg, t)).sum()
}

/// Bytes of Kimi K3's vision tower and projector in the container (what
/// an image loads; 0 without a tower).
pub fn vision_tower_bytes(manifest: &Manifest) -> u64 {
    manifest.trunk.tensors.iter().filter(|t| crate::config::is_vision_tensor(&t.name)).map(|t| t.bytes).sum()
}

/// Bytes of the trunk left on disk (the untied embedding table).
pub fn on_disk_trunk_bytes(cfg: &ModelConfig, manifest: &Manifest) -> u64 {
    manifest.trunk.tensors.iter().filter(|t| stays_on_disk(cfg, t)).map(|t| t.bytes).sum()
}

/// The buffers of one forward pass, sized by the constructors that allocate
/// them: the model's own for a prefill chunk of `chunk` tokens (token
/// scratch, GQA / MLA / KDA scratch, the chunk's per-token buffers, logits:
/// [`crate::transformer::prefill::forward_buffer_floats`]), and the expert
/// provider's for the largest expert format: one token's gate/up tables
/// and the kernel scratch (decode), the batch kernel's `[tokens, inter]`
/// products, the gathered inputs and outputs of one expert's tokens and a
/// token's per-pick outputs (`transformer::experts`), and the routing
/// turned around plus per-expert bookkeeping (`store::pin`). Rounded up to
/// a MiB, plus a MiB for the small per-call lists (picks, slots).
pub fn scratch_bytes(cfg: &ModelConfig, inputs: ChunkInputs, context: usize, chunk: usize) -> u64 {
    use crate::quant::{gate_up_tables_peak_bytes, ExpertBatchScratch, ExpertFormat};
    let chunk = chunk.max(1);
    let model = 4 * crate::transformer::prefill::forward_buffer_floats(cfg, context, chunk);
    let shape = cfg.expert_shape();
    // Our formats, and where the container holds GGUF matrices that take
    // int16 inputs (Q4_K, Q6_K), a Q4_K expert's: the inputs are the same
    // bytes whichever of them an expert's slabs are.
    let q4k = crate::quant::ggml::GgmlType::Q4K;
    debug_assert!(q4k.takes_int16_inputs());
    let gguf = ExpertFormat::Ggml(crate::quant::GgmlExpert { gate: q4k, up: q4k, down: q4k });
    let kernels = ExpertFormat::ALL
        .into_iter()
        .chain((inputs == ChunkInputs::Int16).then_some(gguf))
        .map(|f| gate_up_tables_peak_bytes(f, shape.hidden) + ExpertBatchScratch::peak_bytes(f, shape, chunk))
        .max()
        .unwrap_or(0);
    // A trunk product's quantised inputs over the chunk, the widest it takes.
    let int8 = inputs.bytes(chunk, widest_trunk_input(cfg));
    let outputs = 4 * (cfg.top_k + 2 * chunk) * shape.hidden;
    // experts::Routed: a (token, weight) per pick and an index per expert;
    // store::pin: a use count and a held slot per expert of the layer.
    let routing = 16 * chunk * cfg.top_k + 8 * cfg.num_experts;
    let per_expert = 32 * cfg.num_experts;
    let bytes = (model + kernels + int8 + outputs + routing + per_expert) as u64;
    bytes.div_ceil(1 << 20) * (1 << 20) + (1 << 20)
}

/// The scratch a model of `container` holds with `context` tokens of
/// state, prefill chunks of `chunk` tokens and `threads` compute threads:
/// one forward pass's buffers ([`scratch_bytes`]), each thread's kernel
/// buffers ([`per_thread_bytes`]) and, for a chunk of more than one token,
/// each thread's prefill attention blocks
/// ([`crate::transformer::attention::prefill_block_bytes`]). What a plan
/// counts and an open model reports.
pub fn model_scratch_bytes(container: &Container, context: usize, chunk: usize, threads: usize) -> u64 {
    let (cfg, m) = (container.config(), container.manifest());
    let blocks = if chunk > 1 { crate::transformer::attention::prefill_block_bytes(cfg, context) } else { 0 };
    scratch_bytes(cfg, ChunkInputs::of(m), context, chunk)
        + per_thread_bytes(cfg, m, threads)
        + (threads * blocks) as u64
}

/// The GGUF block types of `m`'s matrices, trunk and experts (with
/// repeats): what decides which GGUF kernels, and their buffers, it runs.
fn ggml_types(m: &Manifest) -> impl Iterator<Item = crate::quant::ggml::GgmlType> + '_ {
    use crate::quant::ggml::GgmlType;
    let trunk = m.trunk.tensors.iter().map(|t| t.format.as_str());
    let experts = m
        .experts
        .layers
        .iter()
        .filter_map(|l| l.ggml.as_ref())
        .flat_map(|g| [&g.gate, &g.up, &g.down])
        .map(|n| n.as_str());
    trunk.chain(experts).filter_map(GgmlType::parse)
}

/// Bytes the compute threads keep between calls where `m` holds GGUF
/// matrices, trunk or experts: each thread's row and block buffers
/// (`quant::ggml::per_thread_bytes`) for the widest such matrix, for
/// `threads` pool threads and the thread that calls into the pool. 0 for
/// our own formats, whose kernels keep nothing per thread.
pub fn per_thread_bytes(cfg: &ModelConfig, m: &Manifest, threads: usize) -> u64 {
    if ggml_types(m).next().is_none() {
        return 0;
    }
    let shape = cfg.expert_shape();
    let cols = widest_trunk_input(cfg).max(shape.hidden).max(shape.inter);
    ((threads + 1) * crate::quant::ggml::per_thread_bytes(cols)) as u64
}

/// The quantised inputs a container's products take over a chunk: q4's
/// int8 (`quant::int8`, 1.06 bytes a value), or int16 (`quant::ggml`, 2.25)
/// where it holds GGUF matrices that take them (Q4_K, Q6_K), trunk or
/// experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkInputs {
    Int8,
    Int16,
}

impl ChunkInputs {
    pub fn of(m: &crate::container::manifest::Manifest) -> ChunkInputs {
        if ggml_types(m).any(|t| t.takes_int16_inputs()) {
            ChunkInputs::Int16
        } else {
            ChunkInputs::Int8
        }
    }

    /// Bytes of `inputs` inputs of `cols` values so quantised.
    fn bytes(self, inputs: usize, cols: usize) -> usize {
        match self {
            ChunkInputs::Int8 => crate::quant::int8_input_bytes(inputs, cols),
            ChunkInputs::Int16 => crate::quant::ggml::int16_input_bytes(inputs, cols),
        }
    }
}

/// The widest input of a trunk matrix product: the hidden state, the
/// attention output, a dense or shared MLP's activation, an MLA layer's
/// attended heads, a KDA layer's projections.
fn widest_trunk_input(cfg: &ModelConfig) -> usize {
    let mla = cfg.mla.map_or(0, |m| m.num_heads * m.v_head_dim);
    let kda = cfg.kda.map_or(0, |k| k.qkv_dim());
    [cfg.hidden_size, cfg.q_dim(), cfg.intermediate_size, cfg.shared_intermediate_size, mla, kda]
        .into_iter()
        .max()
        .unwrap_or(0)
}

/// The prefill chunk a plan picks when the caller does not name one: the
/// largest of [`CHUNK_CHOICES`] whose buffers beyond a decode step's take
/// at most an eighth of `room` (what the budget leaves for scratch and
/// expert cache once the trunk, states, vision and the least cache are
/// counted), so the expert cache keeps the rest; the smallest choice when
/// none does.
///
/// `scratch_of(c)` is all the scratch a chunk of `c` tokens holds
/// ([`model_scratch_bytes`]: with each thread's buffers, which a chunk of
/// more than one token adds its attention blocks to). Comparing less once
/// let an automatic budget pick a chunk whose threads' blocks no longer
/// fit it, and the model failed to open at a long context.
pub fn choose_prefill_chunk(scratch_of: impl Fn(usize) -> u64, room: u64) -> usize {
    let decode = scratch_of(1);
    CHUNK_CHOICES
        .into_iter()
        .find(|&c| {
            let s = scratch_of(c);
            s.saturating_sub(decode) <= room / 8 && s <= room
        })
        .unwrap_or(SMALLEST_CHUNK)
}

/// The larger chunk a prompt of `tokens` may run in where the plan chose
/// `planned` and `lendable` bytes of expert cache could be lent: the
/// largest of [`CHUNK_CHOICES`] (or the whole prompt, if smaller) above
/// `planned` whose buffers beyond the planned chunk's fit in them, with
/// those extra bytes; `None` where none does.
pub fn larger_chunk(
    cfg: &ModelConfig,
    inputs: ChunkInputs,
    context: usize,
    (planned, tokens): (usize, usize),
    lendable: u64,
) -> Option<(usize, u64)> {
    let base = scratch_bytes(cfg, inputs, context, planned);
    let extra = |c: usize| scratch_bytes(cfg, inputs, context, c).saturating_sub(base);
    let larger = CHUNK_CHOICES.into_iter().map(|c| c.min(tokens)).filter(|&c| c > planned);
    larger.filter(|&c| extra(c) <= lendable).max().map(|c| (c, extra(c)))
}

/// The smallest chunk the plan picks, whose buffers the floor counts.
pub const SMALLEST_CHUNK: usize = CHUNK_CHOICES[CHUNK_CHOICES.len() - 1];

/// The chunk sizes [`choose_prefill_chunk`] picks from, largest first.
pub const CHUNK_CHOICES: [usize; 7] = [4096, 2048, 1024, 512, 256, 128, 64];

/// What a plan is asked for. `PlanRequest::default()` is one session on
/// this machine, with the planner's context, budget and prefill chunk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlanRequest {
    /// Tokens of state (`None`: min(model maximum, [`DEFAULT_CONTEXT`])).
    pub context: Option<usize>,
    /// The budget (`None`: chosen from the usable RAM).
    pub budget: Option<u64>,
    /// Usable RAM of the machine planned for (`None`: this one's, see
    /// [`usable_ram`]): what the automatic budget would be there.
    pub usable_ram: Option<u64>,
    /// Session states held besides the first (a server's prefix cache).
    pub extra_states: usize,
    /// Bytes images add (`vision::plan::vision_bytes`); 0 without images.
    pub vision: u64,
    /// Tokens per prefill chunk (`None`: [`choose_prefill_chunk`]).
    pub prefill_chunk: Option<usize>,
    /// How the state's KV cache is stored.
    pub kv_type: KvType,
    /// Compute threads (`None`: one per CPU of this machine, as the
    /// pool starts): each keeps its own kernel buffers.
    pub threads: Option<usize>,
}

/// Bytes of the model held in RAM as its trunk: the resident trunk
/// tensors, and what a GGUF file read in place keeps beside them (its
/// expert biases, which a container's records carry). The one figure the
/// plan, the model's memory use and `info` count.
pub fn resident_bytes(container: &Container) -> u64 {
    resident_trunk_bytes(container.config(), container.manifest()) + container.resident_bank_bytes()
}

pub(crate) fn resolve_context(cfg: &ModelConfig, context: Option<usize>) -> Result<usize> {
    match context {
        Some(0) => Err(Error::Arg("the context must be at least 1 token".into())),
        Some(n) if n > cfg.max_position_embeddings => Err(Error::Arg(format!(
            "a context of {n} tokens exceeds the model's maximum of {}",
            cfg.max_position_embeddings
        ))),
        Some(n) => Ok(n),
        None => Ok(cfg.max_position_embeddings.min(DEFAULT_CONTEXT)),
    }
}

/// The memory plan of `container` for `request`: the one entry point every
/// caller (opening a model, `waste plan`, the C ABI) plans through.
pub fn plan(container: &Container, request: &PlanRequest) -> Result<MemoryPlan> {
    let PlanRequest { context, budget, usable_ram, extra_states, vision, prefill_chunk, kv_type, threads } = *request;
    let cfg = container.config();
    let context = resolve_context(cfg, context)?;
    let m = container.manifest();
    let threads = threads.unwrap_or_else(crate::pool::default_threads);
    let scratch_of = |chunk: usize| model_scratch_bytes(container, context, chunk, threads);
    let record = m.experts.record_bytes;
    let moe_layers = m.experts.layers.len();
    let experts = cfg.num_experts;
    let usable = usable_ram.unwrap_or_else(self::usable_ram);
    let (trunk, state) = (resident_bytes(container), state_bytes(cfg, context, kv_type) * (1 + extra_states) as u64);
    if let Some(c) = prefill_chunk {
        crate::transformer::prefill::check_chunk(c)?;
    }
    // The floor and an automatic budget are planned with the given chunk or
    // the smallest; a larger chunk then takes its buffers from the cache.
    let least = prefill_chunk.unwrap_or(SMALLEST_CHUNK);
    let input = PlanInput {
        context,
        kv_type,
        trunk,
        embedding_on_disk: on_disk_trunk_bytes(cfg, m),
        state,
        scratch: scratch_of(least),
        prefill_chunk: least,
        vision,
        record_bytes: record,
        top_k: cfg.top_k,
        moe_layers,
        experts,
        usable_ram: usable,
        budget,
    };
    let first = plan_from(input)?;
    if prefill_chunk.is_some() {
        return Ok(first);
    }
    let room = first.budget.saturating_sub(trunk + state + vision + first.min_cache);
    let chunk = choose_prefill_chunk(scratch_of, room);
    if chunk == least {
        return Ok(first);
    }
    let scratch = scratch_of(chunk);
    let plan = plan_from(PlanInput { scratch, prefill_chunk: chunk, budget: Some(first.budget), ..input })?;
    Ok(MemoryPlan { floor: first.floor, recommended: first.recommended, budget_source: first.budget_source, ..plan })
}

/// The sizes a plan is made of.
#[derive(Debug, Clone, Copy)]
pub struct PlanInput {
    pub context: usize,
    /// How the state's KV cache is stored (`state` counts it so).
    pub kv_type: KvType,
    pub trunk: u64,
    pub embedding_on_disk: u64,
    /// Every session state held (one, or more with a prefix cache).
    pub state: u64,
    pub scratch: u64,
    /// Tokens per prefill chunk, whose buffers `scratch` counts.
    pub prefill_chunk: usize,
    pub vision: u64,
    pub record_bytes: u64,
    pub top_k: usize,
    pub moe_layers: usize,
    pub experts: usize,
    pub usable_ram: u64,
    pub budget: Option<u64>,
}

pub fn plan_from(i: PlanInput) -> Result<MemoryPlan> {
    let record = i.record_bytes.max(1);
    let fixed = i.trunk + i.state + i.scratch + i.vision;
    let min_cache = 2 * i.top_k as u64 * record;
    let floor = fixed + min_cache;
    let working_set = i.top_k as u64 * record * i.moe_layers as u64;
    let all_experts = i.moe_layers as u64 * i.experts as u64 * record;
    let (budget, source) = match i.budget {
        Some(b) => {
            if b < floor {
                return Err(Error::Budget {
                    budget: b,
                    floor,
                    detail: format!(
                        "trunk {}, state {}, scratch {}, {}minimum expert cache {}",
                        fmt_bytes(i.trunk),
                        fmt_bytes(i.state),
                        fmt_bytes(i.scratch),
                        if i.vision > 0 { format!("vision tower {}, ", fmt_bytes(i.vision)) } else { String::new() },
                        fmt_bytes(min_cache)
                    ),
                });
            }
            (b, BudgetSource::Given)
        }
        None => {
            let cap = i.usable_ram / 8 * 7;
            let pick = [3u32, 2, 1].into_iter().find(|&n| floor + n as u64 * working_set <= cap);
            match pick {
                Some(n) => (floor + n as u64 * working_set, BudgetSource::Auto { working_sets: n }),
                None => (floor, BudgetSource::Auto { working_sets: 0 }),
            }
        }
    };
    // More slots than records would never be filled.
    let max_slots = (i.moe_layers * i.experts).max(2 * i.top_k);
    let cache_slots = (((budget - fixed) / record) as usize).min(max_slots);
    Ok(MemoryPlan {
        context: i.context,
        kv_type: i.kv_type,
        trunk: i.trunk,
        embedding_on_disk: i.embedding_on_disk,
        state: i.state,
        scratch: i.scratch,
        prefill_chunk: i.prefill_chunk,
        vision: i.vision,
        record_bytes: i.record_bytes,
        top_k: i.top_k,
        moe_layers: i.moe_layers,
        experts_per_layer: i.experts,
        min_cache,
        floor,
        working_set,
        recommended: floor + 3 * working_set,
        all_experts,
        usable_ram: i.usable_ram,
        budget,
        budget_source: source,
        cache_slots,
        cache_bytes: cache_slots as u64 * record,
    })
}

/// RAM this process may use: physical RAM capped by the smallest memory
/// limit the OS puts on it (Linux: its cgroups; Windows: its job object;
/// macOS: none), `waste_platform`'s two answers.
pub fn usable_ram() -> u64 {
    let physical = waste_platform::physical_ram().unwrap_or(u64::MAX);
    physical.min(waste_platform::memory_limit().unwrap_or(u64::MAX))
}

/// Peak resident set size of this process, when the OS reports it.
pub fn peak_rss() -> Option<u64> {
    waste_platform::peak_rss()
}

#[cfg(test)]
mod tests;
