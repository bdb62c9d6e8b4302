//! The compiled control component, shared by every session of a process.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::component::{CompiledGuest, HostState, ModelSlot};
use crate::session::Session;
use waste_engine::{Error, Model, Result};

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
        let (_, _, took) = self.guest.instantiate(HostState::new(None)).map_err(|(_, e)| e)?;
        Ok(took)
    }

    /// A session on `model`: its own component instance and its own state.
    pub fn session(&self, model: Arc<Model>) -> Result<Session> {
        let state = model.new_state();
        let slot = ModelSlot::new(model, state);
        let (store, bindings, instantiate_time) =
            self.guest.instantiate(HostState::new(Some(slot))).map_err(|(_, e)| e)?;
        Ok(Session::new(self.guest.clone(), store, bindings, instantiate_time))
    }
}
