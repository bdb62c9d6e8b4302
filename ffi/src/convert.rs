//! Writing containers: `waste convert` (and its `--verify`) and `waste synth`.

use std::ffi::{c_char, c_void};
use std::path::Path;

use waste_host::{ConvertOptions, ConvertProgress};
use waste_host::{ExpertFormat, ExpertsAs, TrunkAs};

use crate::waste_result::{self, *};
use crate::{host, null, str_arg, waste_ctx, waste_str};

/// Options of [`waste_convert`]; fill with [`waste_convert_options_default`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct waste_convert_options {
    /// Routed-expert format: f32, q8, q4, rvq3, rvq2, rvq4p, or gguf (a GGUF
    /// file's experts kept in their own types); `ptr` NULL = gguf for a GGUF
    /// file, rvq3 for a checkpoint directory.
    pub experts: waste_str,
    /// Trunk format: f32, q8, q4, or gguf (a GGUF file's matrices in their
    /// own types); `ptr` NULL = gguf for a GGUF file, q4 for a checkpoint
    /// directory.
    pub trunk: waste_str,
    /// Seed of the codebook fit.
    pub seed: u64,
    /// Layer banks converted in parallel (`--jobs`); 0 = 1. The output does
    /// not depend on it.
    pub jobs: usize,
    /// Delete each source shard once everything it holds is written
    /// (`--reclaim`).
    pub reclaim: bool,
}

/// What [`waste_convert`] and [`waste_synth`] wrote, in bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct waste_convert_report {
    pub trunk_bytes: u64,
    pub expert_bytes: u64,
    pub expert_record_bytes: u64,
    pub moe_layers: usize,
    /// Checkpoint tensors the engine does not use (convert only).
    pub ignored_tensors: usize,
    /// trunk.bin was reused from an earlier, interrupted run (convert only).
    pub trunk_reused: bool,
    /// Layer banks reused from an earlier run (convert only).
    pub reused_banks: usize,
    /// Source shards deleted by `reclaim` (convert only).
    pub reclaimed_shards: usize,
}

/// Progress of a conversion: units done and in all (one per trunk tensor
/// and one per expert); `what` (`what_len` bytes, not NUL-terminated) lives
/// for the call only.
pub type waste_progress_callback =
    Option<unsafe extern "C" fn(user: *mut c_void, done: u64, total: u64, what: *const c_char, what_len: usize)>;

#[no_mangle]
pub unsafe extern "C" fn waste_convert_options_default(out: *mut waste_convert_options) -> waste_result {
    if out.is_null() {
        return WASTE_NULL_ARG;
    }
    let d = ConvertOptions::default();
    let none = waste_str { ptr: std::ptr::null(), len: 0 };
    // SAFETY: checked non-NULL.
    unsafe {
        *out = waste_convert_options { experts: none, trunk: none, seed: d.seed, jobs: d.jobs, reclaim: d.reclaim }
    };
    WASTE_OK
}

/// The caller's progress callback and `user`, called on the calling thread.
struct Progress {
    f: waste_progress_callback,
    user: *mut c_void,
}

impl Progress {
    fn report(&self, done: u64, total: u64, what: &str) {
        if let Some(f) = self.f {
            // SAFETY: the caller's function with its own `user`, on the
            // thread that called us; `what` lives for the call.
            unsafe { f(self.user, done, total, what.as_ptr() as *const c_char, what.len()) }
        }
    }
}

/// Converts the Hugging Face checkpoint directory `src` into a container at
/// `out` (`waste convert`). `options` NULL = the defaults; `progress` and
/// `report` may be NULL.
#[no_mangle]
pub unsafe extern "C" fn waste_convert(
    ctx: *const waste_ctx,
    src: *const c_char,
    src_len: usize,
    out: *const c_char,
    out_len: usize,
    options: *const waste_convert_options,
    progress: waste_progress_callback,
    user: *mut c_void,
    report: *mut waste_convert_report,
) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe {
        crate::with_ctx(ctx, |_| {
            if src.is_null() {
                return Err(null("src"));
            }
            if out.is_null() {
                return Err(null("out"));
            }
            let src = Path::new(str_arg("src", src, src_len)?);
            let dst = Path::new(str_arg("out", out, out_len)?);
            let mut o = ConvertOptions {
                experts: ExpertsAs::default_for(src),
                trunk: TrunkAs::default_for(src),
                ..ConvertOptions::default()
            };
            if !options.is_null() {
                let c = &*options;
                if let Some(name) = crate::opt_str("experts", c.experts)? {
                    o.experts = ExpertsAs::parse(&name).ok_or_else(|| {
                        (WASTE_ARG, format!("experts {name:?}: expected f32, q8, q4, rvq3, rvq2, rvq4p or gguf"))
                    })?;
                }
                if let Some(name) = crate::opt_str("trunk", c.trunk)? {
                    o.trunk = TrunkAs::parse(&name)
                        .ok_or_else(|| (WASTE_ARG, format!("trunk {name:?}: expected f32, q8, q4 or gguf")))?;
                }
                o.seed = c.seed;
                o.jobs = c.jobs.max(1);
                o.reclaim = c.reclaim;
            }
            let p = Progress { f: progress, user };
            let r = waste_host::convert(src, dst, &o, &mut |e: &ConvertProgress| p.report(e.done, e.total, &e.what))
                .map_err(host)?;
            if !report.is_null() {
                *report = waste_convert_report {
                    trunk_bytes: r.trunk_bytes,
                    expert_bytes: r.expert_bytes,
                    expert_record_bytes: r.expert_record_bytes,
                    moe_layers: r.moe_layers,
                    ignored_tensors: r.ignored_tensors.len(),
                    trunk_reused: r.trunk_reused,
                    reused_banks: r.reused_banks.len(),
                    reclaimed_shards: r.reclaimed_shards.len(),
                };
            }
            Ok(())
        })
    }
}

/// Writes a synthetic container with a real model's shapes and random
/// codes at `out` (`waste synth`): `shape` one of kimi-linear-48b,
/// olmoe-trace, kimi-trace, small; `experts` rvq3, rvq2, q8 or q4 (`ptr`
/// NULL = rvq3). `progress` (its `what` empty) and `report` may be NULL.
#[no_mangle]
pub unsafe extern "C" fn waste_synth(
    ctx: *const waste_ctx,
    out: *const c_char,
    out_len: usize,
    shape: waste_str,
    experts: waste_str,
    seed: u64,
    progress: waste_progress_callback,
    user: *mut c_void,
    report: *mut waste_convert_report,
) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe {
        crate::with_ctx(ctx, |_| {
            if out.is_null() {
                return Err(null("out"));
            }
            let dst = Path::new(str_arg("out", out, out_len)?);
            let name = crate::opt_str("shape", shape)?.ok_or_else(|| null("shape"))?;
            let mut spec = waste_host::preset(&name).ok_or_else(|| {
                (WASTE_ARG, format!("shape {name:?}: expected one of {}", waste_host::PRESETS.join(", ")))
            })?;
            if let Some(f) = crate::opt_str("experts", experts)? {
                spec.format = ExpertFormat::parse(&f)
                    .ok_or_else(|| (WASTE_ARG, format!("experts {f:?}: expected rvq3, rvq2, q8 or q4")))?;
            }
            spec.seed = seed;
            let p = Progress { f: progress, user };
            let r = waste_host::synth(dst, &spec, &mut |done, total| p.report(done, total, "")).map_err(host)?;
            if !report.is_null() {
                *report = waste_convert_report {
                    trunk_bytes: r.trunk_bytes,
                    expert_bytes: r.expert_bytes,
                    expert_record_bytes: r.record_bytes,
                    moe_layers: r.moe_layers,
                    ..waste_convert_report::default()
                };
            }
            Ok(())
        })
    }
}

/// One expert matrix decoded back from a container, against its source.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct waste_matrix_error {
    pub layer: usize,
    pub expert: usize,
    /// `gate`, `up` or `down`, NUL-terminated.
    pub matrix: [c_char; 8],
    pub max_abs: f64,
    /// Root mean square of the error.
    pub rms: f64,
    /// `rms / rms(source)`; 0 for an all-zero source matrix.
    pub relative: f64,
    /// The most `relative` the container's expert format accepts.
    pub limit: f64,
}

/// Receives one [`waste_matrix_error`] per expert matrix; it lives for the call.
pub type waste_matrix_callback = Option<unsafe extern "C" fn(user: *mut c_void, row: *const waste_matrix_error)>;

/// Checks every checksum of the container at `out`, decodes every expert
/// record back and reports its error against the checkpoint at `src`
/// (`waste convert --verify`): `row` (may be NULL) sees each matrix,
/// `progress` (may be NULL; `what` empty) the records done; `*n_rows` (may
/// be NULL) receives the count. Rows past their `limit` make it fail
/// (`WASTE_RUNTIME`, the message naming them) after every row was seen.
#[no_mangle]
pub unsafe extern "C" fn waste_convert_verify(
    ctx: *const waste_ctx,
    src: *const c_char,
    src_len: usize,
    out: *const c_char,
    out_len: usize,
    progress: waste_progress_callback,
    row: waste_matrix_callback,
    user: *mut c_void,
    n_rows: *mut usize,
) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe {
        crate::with_ctx(ctx, |_| {
            if src.is_null() {
                return Err(null("src"));
            }
            if out.is_null() {
                return Err(null("out"));
            }
            let src = Path::new(str_arg("src", src, src_len)?);
            let dst = Path::new(str_arg("out", out, out_len)?);
            let p = Progress { f: progress, user };
            let rows =
                waste_host::verify_conversion(src, dst, &mut |done, total| p.report(done, total, "")).map_err(host)?;
            if let Some(f) = row {
                for r in &rows {
                    let mut matrix = [0 as c_char; 8];
                    for (d, &b) in matrix.iter_mut().zip(r.matrix.as_bytes().iter().take(7)) {
                        *d = b as c_char;
                    }
                    let e = waste_matrix_error {
                        layer: r.layer,
                        expert: r.expert,
                        matrix,
                        max_abs: r.max_abs,
                        rms: r.rms,
                        relative: r.relative,
                        limit: r.limit,
                    };
                    // The caller's function with its own `user`; `e` lives
                    // for the call.
                    f(user, &e);
                }
            }
            if !n_rows.is_null() {
                *n_rows = rows.len();
            }
            waste_host::check_limits(&rows, None).map_err(host)
        })
    }
}
