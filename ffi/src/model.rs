//! Planning, opening and describing models.

use std::ffi::{c_char, CString};
use std::path::Path;
use std::sync::Arc;

use waste_host::CachePolicy;
use waste_host::{plan_path, MemoryPlan, PlanRequest};
use waste_host::{KvType, Verify};
use waste_host::{Model, OpenOptions, OpenProgress};

use crate::waste_result::{self, *};
use crate::{guard, host, null, str_arg, waste_ctx, ErrorSlot};

/// Options of [`waste_model_open`]; fill with [`waste_open_options_default`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct waste_open_options {
    /// Tokens of context; 0 = min(model maximum, 4096).
    pub context: usize,
    /// Hard RAM budget in bytes; 0 = chosen from usable RAM.
    pub budget: u64,
    /// Compute threads; 0 = one per CPU (of `cpus` when given).
    pub threads: usize,
    /// CPUs to bind the compute threads to (`n_cpus` entries); NULL = none.
    pub cpus: *const u32,
    pub n_cpus: usize,
    /// Keep expert records in the cache.
    pub cache: bool,
    /// 0 = LRU, 1 = frequency.
    pub cache_policy: u32,
    /// Reader threads (0 = read on the calling thread).
    pub readers: usize,
    pub read_ahead: bool,
    pub direct_io: bool,
    /// Router lookahead in decode; 0 = off.
    pub lookahead: usize,
    /// Preload the hottest experts of the container's usage file.
    pub preload: bool,
    /// Which checksums to check: `WASTE_VERIFY_RECORDS` (the default: each
    /// expert record as it lands), `WASTE_VERIFY_ALL` (also the whole trunk
    /// at open; a container without checksums is refused) or
    /// `WASTE_VERIFY_OFF` (a damaged record changes the output silently).
    pub verify: u32,
    /// How the KV cache stores keys and values (and MLA latent rows):
    /// `WASTE_KV_BF16` (0, the default), `WASTE_KV_F32` (the exact model)
    /// or `WASTE_KV_Q8`.
    pub kv_type: u32,
}

/// `waste_open_options.verify`: each expert record's checksum as it lands
/// (the default).
pub const WASTE_VERIFY_RECORDS: u32 = 0;
/// `waste_open_options.verify`: every checksum, the whole trunk's at open too.
pub const WASTE_VERIFY_ALL: u32 = 1;
/// `waste_open_options.verify`: no record checksums.
pub const WASTE_VERIFY_OFF: u32 = 2;

/// `waste_open_options.kv_type`: bf16 keys and values, half of f32's
/// memory (the default).
pub const WASTE_KV_BF16: u32 = 0;
/// `waste_open_options.kv_type`: f32, exactly what the model computes.
pub const WASTE_KV_F32: u32 = 1;
/// `waste_open_options.kv_type`: 8-bit codes with a scale per 32 values.
pub const WASTE_KV_Q8: u32 = 2;

fn kv_code(t: KvType) -> u32 {
    match t {
        KvType::Bf16 => WASTE_KV_BF16,
        KvType::F32 => WASTE_KV_F32,
        KvType::Q8 => WASTE_KV_Q8,
    }
}

fn verify_code(v: Verify) -> u32 {
    match v {
        Verify::Records => WASTE_VERIFY_RECORDS,
        Verify::All => WASTE_VERIFY_ALL,
        Verify::Off => WASTE_VERIFY_OFF,
    }
}

/// A memory plan, in bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct waste_memory_plan {
    pub context: usize,
    pub trunk: u64,
    pub state: u64,
    pub scratch: u64,
    pub record_bytes: u64,
    pub min_cache: u64,
    /// trunk + state + scratch + min_cache: the least budget that opens.
    pub floor: u64,
    /// What one token reads when nothing is cached.
    pub working_set: u64,
    pub recommended: u64,
    pub all_experts: u64,
    pub usable_ram: u64,
    pub budget: u64,
    pub cache_slots: usize,
    pub cache_bytes: u64,
    /// trunk + state + scratch + cache_bytes.
    pub total: u64,
}

/// What a caller may want to know about an open model. The strings belong
/// to the model and live until [`waste_model_close`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct waste_model_info {
    pub family: *const c_char,
    pub trunk_format: *const c_char,
    pub expert_format: *const c_char,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub moe_layers: usize,
    pub num_experts: usize,
    pub top_k: usize,
    pub max_position_embeddings: usize,
    /// The context sessions of this model allocate.
    pub context: usize,
    /// -1 when the model has none.
    pub bos_token: i64,
    /// The first end-of-sequence token, -1 when none.
    pub eos_token: i64,
    pub expert_record_bytes: u64,
    pub trunk_bytes: u64,
    pub total_params: u64,
    pub active_params: u64,
    pub has_tokenizer: bool,
    pub has_chat_template: bool,
    /// `softmax` or `sigmoid+bias`.
    pub router: *const c_char,
    /// Width of the shared expert MLP of each MoE layer (0 = none).
    pub shared_expert_width: usize,
    /// End-of-sequence tokens; all of them with [`waste_model_eos_tokens`].
    pub n_eos_tokens: usize,
    /// State bytes of one session that do not grow with the context, and
    /// those per token of context, over all layers.
    pub state_bytes_fixed: u64,
    pub state_bytes_per_token: u64,
}

/// One decoder layer; all of them with [`waste_model_get_layer`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct waste_layer_info {
    /// `GQA`, `MLA` or `KDA`; lives until [`waste_model_close`].
    pub attention: *const c_char,
    /// A routed MoE block (else a dense MLP).
    pub moe: bool,
    pub state_bytes_fixed: u64,
    pub state_bytes_per_token: u64,
}

/// Expert-store counters since open or the last reset.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct waste_store_stats {
    /// Routed-expert picks served by a record in RAM before the step asked
    /// for it (the cache's own work), by a record a router lookahead read
    /// (its first use), and read on demand.
    pub reused: u64,
    pub prefetched: u64,
    pub missed: u64,
    pub reads: u64,
    pub bytes_read: u64,
    pub ms_io_wait: f64,
    pub ms_read: f64,
    /// Wall time with no expert read in flight: the disk left idle.
    pub ms_disk_idle: f64,
    /// Speculative reads issued, and those no pick has used.
    pub prefetch_issued: u64,
    pub prefetch_wasted: u64,
    /// Picks of layers a lookahead predicted, and of those the ones it named.
    pub lookahead_picks: u64,
    pub lookahead_named: u64,
    pub preloaded: u64,
    pub cache_slots: usize,
    pub cache_bytes: u64,
    pub record_bytes: u64,
    pub direct_io: bool,
}

/// An open model; share it between sessions, close it after they are closed.
pub struct waste_model {
    pub(crate) model: Arc<Model>,
    pub(crate) error: Arc<ErrorSlot>,
    family: CString,
    trunk_format: CString,
    expert_format: CString,
    router: CString,
    pub(crate) layer_attention: Vec<CString>,
}

/// The defaults of the Rust API's `OpenOptions`.
#[no_mangle]
pub unsafe extern "C" fn waste_open_options_default(out: *mut waste_open_options) -> waste_result {
    if out.is_null() {
        return WASTE_NULL_ARG;
    }
    let d = OpenOptions::default();
    let o = waste_open_options {
        context: 0,
        budget: 0,
        threads: 0,
        cpus: std::ptr::null(),
        n_cpus: 0,
        cache: d.store.keep,
        cache_policy: if d.store.policy == CachePolicy::Frequency { 1 } else { 0 },
        readers: d.store.readers,
        read_ahead: d.store.read_ahead,
        direct_io: d.store.direct_io,
        lookahead: d.store.lookahead,
        preload: d.preload,
        verify: verify_code(d.verify),
        kv_type: kv_code(d.kv_type),
    };
    // SAFETY: checked non-NULL.
    unsafe { *out = o };
    WASTE_OK
}

fn plan_out(p: &MemoryPlan) -> waste_memory_plan {
    waste_memory_plan {
        context: p.context,
        trunk: p.trunk,
        state: p.state,
        scratch: p.scratch,
        record_bytes: p.record_bytes,
        min_cache: p.min_cache,
        floor: p.floor,
        working_set: p.working_set,
        recommended: p.recommended,
        all_experts: p.all_experts,
        usable_ram: p.usable_ram,
        budget: p.budget,
        cache_slots: p.cache_slots,
        cache_bytes: p.cache_bytes,
        total: p.total(),
    }
}

fn opt(n: usize) -> Option<usize> {
    (n != 0).then_some(n)
}

/// Plans the memory of the container (or GGUF file) at `path` without
/// loading it.
/// `context` 0 = default; `budget` 0 = chosen from usable RAM.
#[no_mangle]
pub unsafe extern "C" fn waste_plan(
    ctx: *const waste_ctx,
    path: *const c_char,
    path_len: usize,
    context: usize,
    budget: u64,
    out: *mut waste_memory_plan,
) -> waste_result {
    if ctx.is_null() {
        return WASTE_NULL_ARG;
    }
    // SAFETY: a non-NULL ctx is a live handle.
    let ctx = unsafe { &*ctx };
    guard(&ctx.error, || {
        if out.is_null() {
            return Err(null("out"));
        }
        // SAFETY: pointer and length from the caller.
        let path = Path::new(unsafe { str_arg("path", path, path_len) }?);
        let budget = (budget != 0).then_some(budget);
        let plan =
            plan_path(path, &PlanRequest { context: opt(context), budget, ..PlanRequest::default() }).map_err(host)?;
        // SAFETY: checked non-NULL.
        unsafe { *out = plan_out(&plan) };
        Ok(())
    })
}

/// Opens the container at `path`, or a GGUF file run in place (a split
/// file from its first part). `options` NULL = the defaults.
#[no_mangle]
pub unsafe extern "C" fn waste_model_open(
    ctx: *const waste_ctx,
    path: *const c_char,
    path_len: usize,
    options: *const waste_open_options,
    out: *mut *mut waste_model,
) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe { open_model(ctx, path, path_len, options, None, std::ptr::null_mut(), out) }
}

/// The stage a [`waste_open_progress`] reports.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum waste_open_stage {
    /// `loaded` of `total` trunk bytes are resident; the last such event
    /// has `loaded == total`.
    WASTE_OPEN_TRUNK = 0,
    /// The hottest experts of the usage file, `records` of them (`bytes`),
    /// are being read into the cache.
    WASTE_OPEN_PRELOAD_STARTED = 1,
    /// The preload is done: `records` expert records, `bytes` bytes.
    WASTE_OPEN_PRELOADED = 2,
    /// `records` (`bytes`) of the preload read so far.
    WASTE_OPEN_PRELOADING = 3,
}

/// Progress of [`waste_model_open_with_progress`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct waste_open_progress {
    pub stage: waste_open_stage,
    pub loaded: u64,
    pub total: u64,
    pub records: usize,
    pub bytes: u64,
}

/// Called on the opening thread as the open goes.
pub type waste_open_callback =
    Option<unsafe extern "C" fn(user: *mut std::ffi::c_void, progress: *const waste_open_progress)>;

/// [`waste_model_open`], reporting its progress (trunk bytes loaded, then
/// the hotlist preload) to `callback` (may be NULL), as the CLI's progress
/// bar draws it.
#[no_mangle]
pub unsafe extern "C" fn waste_model_open_with_progress(
    ctx: *const waste_ctx,
    path: *const c_char,
    path_len: usize,
    options: *const waste_open_options,
    callback: waste_open_callback,
    user: *mut std::ffi::c_void,
    out: *mut *mut waste_model,
) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe { open_model(ctx, path, path_len, options, callback, user, out) }
}

unsafe fn open_model(
    ctx: *const waste_ctx,
    path: *const c_char,
    path_len: usize,
    options: *const waste_open_options,
    callback: waste_open_callback,
    user: *mut std::ffi::c_void,
    out: *mut *mut waste_model,
) -> waste_result {
    if ctx.is_null() {
        return WASTE_NULL_ARG;
    }
    // SAFETY: a non-NULL ctx is a live handle.
    let ctx = unsafe { &*ctx };
    guard(&ctx.error, || {
        if out.is_null() {
            return Err(null("out"));
        }
        // SAFETY: checked non-NULL.
        unsafe { *out = std::ptr::null_mut() };
        // SAFETY: pointer and length from the caller.
        let path = Path::new(unsafe { str_arg("path", path, path_len) }?);
        let mut o = OpenOptions::default();
        if !options.is_null() {
            // SAFETY: a non-NULL options points at a filled struct.
            let c = unsafe { &*options };
            o.context = opt(c.context);
            o.budget = (c.budget != 0).then_some(c.budget);
            o.threads = opt(c.threads);
            // SAFETY: pointer and length from the caller.
            let cpus = unsafe { crate::slice_arg("options.cpus", c.cpus, c.n_cpus) }?;
            if !cpus.is_empty() {
                let list: Vec<String> = cpus.iter().map(|c| c.to_string()).collect();
                o.cpus = Some(waste_host::CpuSet::parse(&list.join(",")).map_err(|e| host(e.into()))?);
            }
            o.store.keep = c.cache;
            o.store.policy = match c.cache_policy {
                0 => CachePolicy::Lru,
                1 => CachePolicy::Frequency,
                n => return Err((WASTE_ARG, format!("cache_policy {n}: expected 0 (LRU) or 1 (frequency)"))),
            };
            o.store.readers = c.readers;
            o.store.read_ahead = c.read_ahead;
            o.store.direct_io = c.direct_io;
            o.store.lookahead = c.lookahead;
            o.preload = c.preload;
            o.verify = match c.verify {
                WASTE_VERIFY_RECORDS => Verify::Records,
                WASTE_VERIFY_ALL => Verify::All,
                WASTE_VERIFY_OFF => Verify::Off,
                n => return Err((WASTE_ARG, format!("verify {n}: expected 0 (records), 1 (all) or 2 (off)"))),
            };
            o.kv_type = match c.kv_type {
                WASTE_KV_BF16 => KvType::Bf16,
                WASTE_KV_F32 => KvType::F32,
                WASTE_KV_Q8 => KvType::Q8,
                n => return Err((WASTE_ARG, format!("kv_type {n}: expected 0 (bf16), 1 (f32) or 2 (q8)"))),
            };
        }
        let mut report = |p: &OpenProgress| {
            let Some(f) = callback else { return };
            let mut e = waste_open_progress {
                stage: waste_open_stage::WASTE_OPEN_TRUNK,
                loaded: 0,
                total: 0,
                records: 0,
                bytes: 0,
            };
            match *p {
                OpenProgress::Trunk { loaded, total } => (e.loaded, e.total) = (loaded, total),
                OpenProgress::PreloadStarted { records, bytes } => {
                    e.stage = waste_open_stage::WASTE_OPEN_PRELOAD_STARTED;
                    (e.records, e.bytes) = (records, bytes);
                }
                OpenProgress::Preloading { records, bytes } => {
                    e.stage = waste_open_stage::WASTE_OPEN_PRELOADING;
                    (e.records, e.bytes) = (records, bytes);
                }
                OpenProgress::Preloaded { records, bytes } => {
                    e.stage = waste_open_stage::WASTE_OPEN_PRELOADED;
                    (e.records, e.bytes) = (records, bytes);
                }
                // A stage added to the engine later is not reported until
                // it has a code here.
                #[allow(unreachable_patterns)]
                _ => return,
            }
            // SAFETY: the caller's function with its own `user`, on this
            // thread; `e` lives for the call.
            unsafe { f(user, &e) }
        };
        let model = Model::open_with_progress(path, &o, &mut report).map_err(host)?;
        let info = model.info();
        let cs = |s: &str| CString::new(s.replace('\0', "")).unwrap_or_default();
        let handle = Box::new(waste_model {
            family: cs(&info.family),
            trunk_format: cs(&info.trunk_format),
            expert_format: cs(&info.expert_format),
            router: cs(&info.router),
            layer_attention: info.layers.iter().map(|l| cs(&l.attention)).collect(),
            model,
            error: ctx.error.clone(),
        });
        // SAFETY: checked non-NULL.
        unsafe { *out = Box::into_raw(handle) };
        Ok(())
    })
}

/// Frees a model handle; sessions still open on it keep the model alive.
#[no_mangle]
pub unsafe extern "C" fn waste_model_close(model: *mut waste_model) {
    if !model.is_null() {
        // SAFETY: `model` came from waste_model_open and is closed once.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(unsafe { Box::from_raw(model) })));
    }
}

/// Runs `f` on a live model handle, recording failures in its context.
pub(crate) unsafe fn with_model(
    model: *const waste_model,
    f: impl FnOnce(&waste_model) -> Result<(), (waste_result, String)>,
) -> waste_result {
    if model.is_null() {
        return WASTE_NULL_ARG;
    }
    // SAFETY: a non-NULL model is a live handle.
    let m = unsafe { &*model };
    guard(&m.error, || f(m))
}

#[no_mangle]
pub unsafe extern "C" fn waste_model_get_info(model: *const waste_model, out: *mut waste_model_info) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe {
        with_model(model, |m| {
            if out.is_null() {
                return Err(null("out"));
            }
            let i = m.model.info();
            let info = waste_model_info {
                family: m.family.as_ptr(),
                trunk_format: m.trunk_format.as_ptr(),
                expert_format: m.expert_format.as_ptr(),
                vocab_size: i.vocab_size,
                hidden_size: i.hidden_size,
                num_layers: i.num_layers,
                moe_layers: i.moe_layers,
                num_experts: i.num_experts,
                top_k: i.top_k,
                max_position_embeddings: i.max_position_embeddings,
                context: m.model.context(),
                bos_token: i.bos_token.map_or(-1, i64::from),
                eos_token: i.eos_tokens.first().map_or(-1, |&t| i64::from(t)),
                expert_record_bytes: i.expert_record_bytes,
                trunk_bytes: i.trunk_bytes,
                total_params: i.total_params,
                active_params: i.active_params,
                has_tokenizer: i.has_tokenizer,
                has_chat_template: i.has_chat_template,
                router: m.router.as_ptr(),
                shared_expert_width: i.shared_expert_width,
                n_eos_tokens: i.eos_tokens.len(),
                state_bytes_fixed: i.layers.iter().map(|l| l.state_bytes_fixed).sum(),
                state_bytes_per_token: i.layers.iter().map(|l| l.state_bytes_per_token).sum(),
            };
            *out = info;
            Ok(())
        })
    }
}

/// The plan the model was opened with.
#[no_mangle]
pub unsafe extern "C" fn waste_model_memory_plan(
    model: *const waste_model,
    out: *mut waste_memory_plan,
) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe {
        with_model(model, |m| {
            if out.is_null() {
                return Err(null("out"));
            }
            *out = plan_out(m.model.memory_plan());
            Ok(())
        })
    }
}

/// Expert-store counters, aggregated over every session of the model.
#[no_mangle]
pub unsafe extern "C" fn waste_model_store_stats(
    model: *const waste_model,
    out: *mut waste_store_stats,
) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe {
        with_model(model, |m| {
            if out.is_null() {
                return Err(null("out"));
            }
            let s = m.model.store_stats();
            *out = waste_store_stats {
                reused: s.picks.reused,
                prefetched: s.picks.prefetched,
                missed: s.picks.missed,
                reads: s.reads,
                bytes_read: s.bytes_read,
                ms_io_wait: s.io_wait.as_secs_f64() * 1e3,
                ms_read: s.read_time.as_secs_f64() * 1e3,
                ms_disk_idle: s.disk_idle.as_secs_f64() * 1e3,
                prefetch_issued: s.prefetch_issued,
                prefetch_wasted: s.prefetch_wasted(),
                lookahead_picks: s.lookahead_picks,
                lookahead_named: s.lookahead_named,
                preloaded: s.preloaded,
                cache_slots: s.cache_slots,
                cache_bytes: s.cache_bytes,
                record_bytes: s.record_bytes,
                direct_io: s.direct_io,
            };
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn waste_model_reset_store_stats(model: *const waste_model) -> waste_result {
    // SAFETY: forwarded caller pointer.
    unsafe {
        with_model(model, |m| {
            m.model.reset_store_stats();
            Ok(())
        })
    }
}

/// Adds the model's expert-use counts to the container's usage file (the
/// hotlist the next open preloads).
#[no_mangle]
pub unsafe extern "C" fn waste_model_save_usage(model: *const waste_model) -> waste_result {
    // SAFETY: forwarded caller pointer.
    unsafe { with_model(model, |m| m.model.save_usage().map(|_| ()).map_err(host)) }
}
