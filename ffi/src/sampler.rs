//! Sampler plugins: a wasm32-wasip2 component of the `sampler-plugin` world
//! (wit/sampler.wit) attached to a session, as `waste run --sampler` does.

use std::path::Path;

use waste_host::plugin::{PluginLimits, SamplerPlugin};

use crate::waste_result::{self, *};
use crate::{host, null, slice_arg, str_arg, waste_session, waste_str, with_session};

/// One option handed to the plugin's `begin` with every generation.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct waste_sampler_option {
    pub name: waste_str,
    pub value: f32,
}

/// Limits of one plugin; a 0 field takes the engine's default.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct waste_sampler_limits {
    /// Fuel (roughly, wasm instructions) per call.
    pub fuel_per_call: u64,
    /// Bytes of linear memory the plugin may hold.
    pub memory_bytes: usize,
}

/// Loads the plugin component at `path` and routes every draw of the
/// session's later generations to it (logit bias and penalties still apply
/// before it). `options` may be NULL when `n_options` is 0; `limits` NULL =
/// the defaults. A missing file is `WASTE_IO`, a file that is not a plugin
/// of the right world `WASTE_FORMAT`; a plugin that traps, runs out of fuel
/// or memory during a generation fails that generation with `WASTE_GUEST`
/// and a detail naming it and the limit. Replaces any plugin attached before.
#[no_mangle]
pub unsafe extern "C" fn waste_session_set_sampler(
    session: *mut waste_session,
    path: *const std::ffi::c_char,
    path_len: usize,
    options: *const waste_sampler_option,
    n_options: usize,
    limits: *const waste_sampler_limits,
) -> waste_result {
    // SAFETY: forwarded caller pointers.
    unsafe {
        with_session(session, |s| {
            if path.is_null() {
                return Err(null("path"));
            }
            let path = Path::new(str_arg("path", path, path_len)?);
            let mut opts = Vec::new();
            for o in slice_arg("options", options, n_options)? {
                if o.name.ptr.is_null() {
                    return Err(null("option name"));
                }
                let name = str_arg("option name", o.name.ptr, o.name.len)?;
                if !o.value.is_finite() {
                    return Err((WASTE_ARG, format!("sampler option {name:?}: {} is not a finite number", o.value)));
                }
                opts.push((name.to_string(), o.value));
            }
            let mut l = PluginLimits::default();
            if !limits.is_null() {
                let c = &*limits;
                if c.fuel_per_call != 0 {
                    l.fuel_per_call = c.fuel_per_call;
                }
                if c.memory_bytes != 0 {
                    l.memory_bytes = c.memory_bytes;
                }
            }
            let plugin = SamplerPlugin::load(path, opts, l).map_err(host)?;
            s.set_sampler(Some(plugin));
            Ok(())
        })
    }
}

/// Detaches the session's sampler plugin: later generations use the
/// built-in sampler again. A session without one is left as it is.
#[no_mangle]
pub unsafe extern "C" fn waste_session_clear_sampler(session: *mut waste_session) -> waste_result {
    // SAFETY: forwarded caller pointer.
    unsafe {
        with_session(session, |s| {
            s.set_sampler(None);
            Ok(())
        })
    }
}
