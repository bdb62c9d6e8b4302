//! Reader threads and their request queue. Demand reads (a layer's top-k
//! that the forward pass is about to use) go before speculative ones.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::Shared;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub layer: usize,
    pub expert: usize,
    pub slot: usize,
}

#[derive(Default)]
struct Queues {
    demand: VecDeque<Request>,
    speculative: VecDeque<Request>,
    shut_down: bool,
}

#[derive(Default)]
pub struct Queue {
    inner: Mutex<Queues>,
    wake: Condvar,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queues> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn push(&self, r: Request, speculative: bool) {
        let mut q = self.lock();
        if speculative {
            q.speculative.push_back(r);
        } else {
            q.demand.push_back(r);
        }
        drop(q);
        self.wake.notify_one();
    }

    /// Moves a queued speculative read of `slot` to the demand queue.
    pub fn promote(&self, slot: usize) {
        let mut q = self.lock();
        if let Some(i) = q.speculative.iter().position(|r| r.slot == slot) {
            if let Some(r) = q.speculative.remove(i) {
                q.demand.push_back(r);
            }
        }
    }

    pub fn shut_down(&self) {
        self.lock().shut_down = true;
        self.wake.notify_all();
    }

    /// The next request, or `None` once shut down.
    /// The next request, doing `idle` work (one unit per call, `true`
    /// while more remains) whenever none is waiting; `None` at shutdown.
    fn pop(&self, idle: &dyn Fn() -> bool) -> Option<Request> {
        let mut q = self.lock();
        loop {
            if q.shut_down {
                return None;
            }
            if let Some(r) = q.demand.pop_front().or_else(|| q.speculative.pop_front()) {
                return Some(r);
            }
            drop(q);
            let more = idle();
            q = self.lock();
            let waiting = !q.demand.is_empty() || !q.speculative.is_empty() || q.shut_down;
            if !more && !waiting {
                q = self.wake.wait(q).unwrap_or_else(|p| p.into_inner());
            }
        }
    }
}

pub fn spawn(shared: Arc<Shared>, index: usize) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(format!("waste-reader-{index}")).spawn(move || {
        let sys = || crate::stats::cpu_times(true).map_or(Duration::ZERO, |t| t.1);
        while let Some(r) = shared.queue.pop(&|| shared.fault_ahead()) {
            let before = sys();
            let result = shared.load(r.layer, r.expert, r.slot);
            shared.finish(r.slot, result, sys().saturating_sub(before));
        }
    })
}
