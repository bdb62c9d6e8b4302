//! Sampler plugins: components of the `waste:engine/sampler-plugin` world
//! (wit/sampler.wit), each in its own store with a fuel budget per call and
//! a memory cap, so a plugin that traps, loops or hoards memory ends the
//! generation with an error naming it and the limit, and nothing else.
//!
//! Plugins get their own wasmtime engine: fuel metering must be compiled
//! into the code, and the bundled control component should not pay for it.

use std::path::{Path, PathBuf};

use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Config, Store, StoreLimits, StoreLimitsBuilder, Trap};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use crate::bindings::sampler::exports::waste::engine::sampler::SamplerParams;
use crate::bindings::sampler::SamplerPlugin as Bindings;
use waste_engine::{Error, Result};

/// Limits of one plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PluginLimits {
    /// Fuel (roughly, wasm instructions) per call.
    pub fuel_per_call: u64,
    /// Bytes of linear memory the plugin may hold.
    pub memory_bytes: usize,
}

impl Default for PluginLimits {
    fn default() -> Self {
        // A sort of a 160k-entry vocabulary costs a few tens of millions of
        // instructions; a thousand times the cost of a plain softmax.
        PluginLimits { fuel_per_call: 2_000_000_000, memory_bytes: 256 << 20 }
    }
}

struct PluginState {
    wasi: WasiCtx,
    table: ResourceTable,
    limits: StoreLimits,
}

impl WasiView for PluginState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

/// A loaded plugin: compiled once, instantiated afresh for every generation
/// (so a trap in one generation leaves the next one a clean instance).
pub struct SamplerPlugin {
    path: PathBuf,
    limits: PluginLimits,
    options: Vec<(String, f32)>,
    engine: wasmtime::Engine,
    component: Component,
    linker: Linker<PluginState>,
    live: Option<(Store<PluginState>, Bindings)>,
}

/// The largest sampler component loaded.
const MAX_PLUGIN_BYTES: u64 = 64 << 20;

impl SamplerPlugin {
    /// Compiles the component at `path`. `options` reach the plugin's
    /// `begin` with every generation.
    pub fn load(path: &Path, options: Vec<(String, f32)>, limits: PluginLimits) -> Result<SamplerPlugin> {
        // Real plugins are a few hundred kB.
        let bytes = waste_engine::files::read_file(path, MAX_PLUGIN_BYTES)?;
        let mut config = Config::new();
        config.consume_fuel(true);
        let engine =
            wasmtime::Engine::new(&config).map_err(|e| Error::format(path, format!("sampler plugin engine: {e:#}")))?;
        let component = Component::new(&engine, &bytes)
            .map_err(|e| Error::format(path, format!("not a loadable sampler plugin component: {e:#}")))?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(|e| Error::Runtime(format!("{e:#}")))?;
        let plugin = SamplerPlugin { path: path.to_path_buf(), limits, options, engine, component, linker, live: None };
        // Instantiate once now so a component of the wrong world fails here.
        let mut p = plugin;
        p.instantiate().map_err(|e| Error::format(path, e))?;
        p.live = None;
        Ok(p)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn instantiate(&mut self) -> std::result::Result<(), String> {
        let state = PluginState {
            wasi: WasiCtxBuilder::new().build(),
            table: ResourceTable::new(),
            limits: StoreLimitsBuilder::new().memory_size(self.limits.memory_bytes).trap_on_grow_failure(true).build(),
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limits);
        store.set_fuel(self.limits.fuel_per_call).map_err(|e| e.to_string())?;
        let b = Bindings::instantiate(&mut store, &self.component, &self.linker).map_err(|e| self.explain(&e))?;
        self.live = Some((store, b));
        Ok(())
    }

    /// A clear message for a trap: which plugin, and which limit if any.
    fn explain(&self, e: &wasmtime::Error) -> String {
        let name = self.path.display();
        // StoreLimits' `trap_on_grow_failure` reports no typed trap code,
        // only this message.
        let memory_hit = format!("{e:?}").contains("forcing trap when growing memory");
        match e.downcast_ref::<Trap>() {
            Some(Trap::OutOfFuel) => {
                format!("sampler plugin {name} ran out of its fuel limit of {} per call", self.limits.fuel_per_call)
            }
            _ if memory_hit => {
                format!("sampler plugin {name} exceeded its memory limit of {} bytes", self.limits.memory_bytes)
            }
            _ => format!("sampler plugin {name} trapped: {e:#}"),
        }
    }

    /// Starts a generation on a fresh instance.
    pub(crate) fn begin(&mut self, temperature: f32, seed: u64) -> std::result::Result<(), String> {
        self.instantiate()?;
        let params = SamplerParams { temperature, seed, options: self.options.clone() };
        self.call(|b, s| b.waste_engine_sampler().call_begin(s, &params))
    }

    /// Draws one token.
    pub(crate) fn sample(&mut self, logits: &[f32], recent: &[u32]) -> std::result::Result<u32, String> {
        let token = self.call(|b, s| b.waste_engine_sampler().call_sample(s, logits, recent))?;
        if token as usize >= logits.len() {
            return Err(format!(
                "sampler plugin {} chose token {token}, outside the vocabulary of {}",
                self.path.display(),
                logits.len()
            ));
        }
        Ok(token)
    }

    fn call<R>(
        &mut self,
        f: impl FnOnce(&Bindings, &mut Store<PluginState>) -> wasmtime::Result<std::result::Result<R, String>>,
    ) -> std::result::Result<R, String> {
        let name = self.path.display().to_string();
        let Some((store, b)) = self.live.as_mut() else {
            return Err(format!("sampler plugin {name} is not running (an earlier call failed)"));
        };
        store.set_fuel(self.limits.fuel_per_call).map_err(|e| e.to_string())?;
        match f(b, store) {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(msg)) => Err(format!("sampler plugin {name}: {msg}")),
            Err(trap) => {
                // A trapped instance cannot be entered again.
                let msg = self.explain(&trap);
                self.live = None;
                Err(msg)
            }
        }
    }
}
