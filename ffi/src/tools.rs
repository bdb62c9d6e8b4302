//! The rest of what the CLI does: the benchmark's routing replay, raw reads
//! and memory figures, model details (every EOS token, the layer pattern)
//! and the start-up timings of `waste version`.

use std::ffi::c_char;
use std::path::Path;

use crate::waste_result::{self, *};
use crate::{copy_out, guard, host, null, slice_arg, str_arg, waste_ctx, waste_layer_info, waste_model, with_model};

/// Counters of one forward step (see [`waste_model_replay_routing`]).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct waste_step_stats {
    /// As in `waste_token_event`.
    pub experts_reused: u32,
    pub experts_prefetched: u32,
    pub experts_missed: u32,
    pub bytes_read: u64,
    pub ms_io: f64,
}

/// What an open model holds now, by part, in bytes; `total` equals the
/// plan's total.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct waste_memory_use {
    pub trunk: u64,
    pub state: u64,
    pub scratch: u64,
    pub cache: u64,
    pub total: u64,
}

/// Runs `f` with a context's error slot, as every context-level call does.
pub(crate) unsafe fn with_ctx(
    ctx: *const waste_ctx,
    f: impl FnOnce(&waste_ctx) -> Result<(), (waste_result, String)>,
) -> waste_result {
    if ctx.is_null() {
        return WASTE_NULL_ARG;
    }
    // SAFETY: a non-NULL ctx is a live handle.
    let c = unsafe { &*ctx };
    guard(&c.error, || f(c))
}

/// Every end-of-sequence token of the model (`*out_len` of them).
#[no_mangle]
pub unsafe extern "C" fn waste_model_eos_tokens(
    model: *const waste_model,
    tokens: *mut u32,
    cap: usize,
    out_len: *mut usize,
) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe {
        with_model(model, |m| {
            crate::check_out(out_len)?;
            copy_out(&m.model.info().eos_tokens, tokens, cap, out_len)
        })
    }
}

/// Decoder layer `index` (0 .. `num_layers`) as `waste info` lists it.
#[no_mangle]
pub unsafe extern "C" fn waste_model_get_layer(
    model: *const waste_model,
    index: usize,
    out: *mut waste_layer_info,
) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe {
        with_model(model, |m| {
            if out.is_null() {
                return Err(null("out"));
            }
            let layers = &m.model.info().layers;
            let l = layers
                .get(index)
                .ok_or_else(|| (WASTE_ARG, format!("layer {index}: the model has {} layers", layers.len())))?;
            *out = waste_layer_info {
                attention: m.layer_attention[index].as_ptr(),
                moe: l.moe,
                state_bytes_fixed: l.state_bytes_fixed,
                state_bytes_per_token: l.state_bytes_per_token,
            };
            Ok(())
        })
    }
}

/// What the model holds now, by part (`waste bench` prints it).
#[no_mangle]
pub unsafe extern "C" fn waste_model_memory_used(
    model: *const waste_model,
    out: *mut waste_memory_use,
) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe {
        with_model(model, |m| {
            if out.is_null() {
                return Err(null("out"));
            }
            let u = m.model.memory_used();
            *out = waste_memory_use {
                trunk: u.trunk,
                state: u.state,
                scratch: u.scratch,
                cache: u.cache,
                total: u.total(),
            };
            Ok(())
        })
    }
}

/// Runs the routed experts of one decode step with recorded routing instead
/// of the router (`waste bench --trace`): `experts` holds `n_layers` rows of
/// `per_layer` expert ids, one row per MoE layer in order. The I/O and
/// expert compute of a token at true scale, for benchmarks.
#[no_mangle]
pub unsafe extern "C" fn waste_model_replay_routing(
    model: *const waste_model,
    experts: *const u32,
    n_layers: usize,
    per_layer: usize,
    out: *mut waste_step_stats,
) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe {
        with_model(model, |m| {
            let n = n_layers
                .checked_mul(per_layer)
                .ok_or_else(|| (WASTE_ARG, format!("{n_layers} x {per_layer} expert ids overflow")))?;
            let ids = slice_arg("experts", experts, n)?;
            let routing: Vec<Vec<u32>> = if per_layer == 0 {
                vec![Vec::new(); n_layers]
            } else {
                ids.chunks(per_layer).map(<[u32]>::to_vec).collect()
            };
            let num_experts = m.model.info().num_experts;
            if let Some(&bad) = ids.iter().find(|&&e| e as usize >= num_experts) {
                return Err((WASTE_ARG, format!("expert id {bad}: the model has {num_experts} experts per layer")));
            }
            let s = m.model.replay_routing(&routing).map_err(host)?;
            if !out.is_null() {
                *out = waste_step_stats {
                    experts_reused: s.experts_reused,
                    experts_prefetched: s.experts_prefetched,
                    experts_missed: s.experts_missed,
                    bytes_read: s.bytes_read,
                    ms_io: s.io_time.as_secs_f64() * 1e3,
                };
            }
            Ok(())
        })
    }
}

/// The process's peak resident memory in bytes (`waste bench`'s
/// `peak_rss`); `WASTE_UNSUPPORTED` where the system does not tell.
#[no_mangle]
pub unsafe extern "C" fn waste_peak_rss(out: *mut u64) -> waste_result {
    if out.is_null() {
        return WASTE_NULL_ARG;
    }
    match std::panic::catch_unwind(waste_host::peak_rss) {
        Ok(Some(b)) => {
            // SAFETY: checked non-NULL.
            unsafe { *out = b };
            WASTE_OK
        }
        Ok(None) => WASTE_UNSUPPORTED,
        Err(_) => WASTE_PANIC,
    }
}

/// Start-up costs (`waste version --json`): how long compiling the bundled
/// component took when the context opened, and one instantiation now.
#[no_mangle]
pub unsafe extern "C" fn waste_ctx_timings(
    ctx: *const waste_ctx,
    compile_ms: *mut f64,
    instantiate_ms: *mut f64,
) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe {
        with_ctx(ctx, |c| {
            if compile_ms.is_null() {
                return Err(null("compile_ms"));
            }
            if instantiate_ms.is_null() {
                return Err(null("instantiate_ms"));
            }
            let took = c.engine.measure_instantiate().map_err(host)?;
            *compile_ms = c.engine.compile_time().as_secs_f64() * 1e3;
            *instantiate_ms = took.as_secs_f64() * 1e3;
            Ok(())
        })
    }
}

/// Raw random-read bandwidth of expert records (`waste bench
/// --raw-reads`): `reads` records read by `readers` threads (0 = 1), at
/// positions drawn from `seed`; writes the bytes read and the seconds taken.
#[no_mangle]
pub unsafe extern "C" fn waste_model_measure_random_reads(
    model: *const waste_model,
    reads: usize,
    readers: usize,
    seed: u64,
    bytes: *mut u64,
    seconds: *mut f64,
) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe {
        with_model(model, |m| {
            if bytes.is_null() {
                return Err(null("bytes"));
            }
            if seconds.is_null() {
                return Err(null("seconds"));
            }
            if reads == 0 {
                return Err((WASTE_ARG, "reads 0: expected at least 1".into()));
            }
            let (b, s) = m.model.expert_store().measure_random_reads(reads, readers.max(1), seed).map_err(host)?;
            *bytes = b;
            *seconds = s;
            Ok(())
        })
    }
}

/// Replays `steps` decode steps of a recorded routing trace (`waste bench
/// --route-trace FILE --tokens N`: JSON lines `{"layers": [[ids], ...]}`,
/// cycled when shorter than `steps`) and writes the summed counters.
#[no_mangle]
pub unsafe extern "C" fn waste_model_replay_trace(
    model: *const waste_model,
    path: *const c_char,
    path_len: usize,
    steps: usize,
    out: *mut waste_step_stats,
) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe {
        with_model(model, |m| {
            if path.is_null() {
                return Err(null("path"));
            }
            let path = Path::new(str_arg("path", path, path_len)?);
            if steps == 0 {
                return Err((WASTE_ARG, "steps 0: expected at least 1".into()));
            }
            let trace = waste_host::read_route_trace(path).map_err(host)?;
            let num_experts = m.model.info().num_experts;
            if trace.experts > num_experts {
                return Err((
                    WASTE_ARG,
                    format!(
                        "{}: expert id {} in the trace, the model has {num_experts} experts per layer",
                        path.display(),
                        trace.experts - 1
                    ),
                ));
            }
            let mut total = waste_host::StepStats::default();
            for i in 0..steps {
                let s = m.model.replay_routing(&trace.steps[i % trace.steps.len()]).map_err(host)?;
                total.add(&s);
            }
            if !out.is_null() {
                *out = waste_step_stats {
                    experts_reused: total.experts_reused,
                    experts_prefetched: total.experts_prefetched,
                    experts_missed: total.experts_missed,
                    bytes_read: total.bytes_read,
                    ms_io: total.io_time.as_secs_f64() * 1e3,
                };
            }
            Ok(())
        })
    }
}
