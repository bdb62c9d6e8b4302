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

/// How urgently a read is wanted: a record the forward pass is about to
/// use, a router lookahead's guess at the next MoE layer, or a guess at a
/// layer after that, read only when nothing nearer waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tier {
    Demand,
    Next,
    Later,
}

#[derive(Default)]
struct Queues {
    demand: VecDeque<Request>,
    next: VecDeque<Request>,
    later: VecDeque<Request>,
    shut_down: bool,
}

impl Queues {
    fn tier(&mut self, tier: Tier) -> &mut VecDeque<Request> {
        match tier {
            Tier::Demand => &mut self.demand,
            Tier::Next => &mut self.next,
            Tier::Later => &mut self.later,
        }
    }

    fn is_empty(&self) -> bool {
        self.demand.is_empty() && self.next.is_empty() && self.later.is_empty()
    }
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

    pub fn push(&self, r: Request, tier: Tier) {
        self.lock().tier(tier).push_back(r);
        self.wake.notify_one();
    }

    /// Moves a queued speculative read of `slot` up to `tier` (a record a
    /// nearer layer now needs); a read already there or above stays.
    pub fn promote(&self, slot: usize, tier: Tier) {
        let mut q = self.lock();
        for from in [Tier::Next, Tier::Later].into_iter().filter(|&t| t > tier) {
            let queue = q.tier(from);
            if let Some(r) = queue.iter().position(|r| r.slot == slot).and_then(|i| queue.remove(i)) {
                q.tier(tier).push_back(r);
                return;
            }
        }
    }

    /// Takes out the speculative reads of `layer` not yet started whose
    /// expert `wanted` rejects: that layer has routed, so they would only
    /// delay the reads after them.
    pub fn withdraw(&self, layer: usize, wanted: impl Fn(usize) -> bool) -> Vec<Request> {
        let mut q = self.lock();
        let mut out = Vec::new();
        for tier in [Tier::Next, Tier::Later] {
            q.tier(tier).retain(|r| {
                let stale = r.layer == layer && !wanted(r.expert);
                if stale {
                    out.push(*r);
                }
                !stale
            });
        }
        out
    }

    pub fn shut_down(&self) {
        self.lock().shut_down = true;
        self.wake.notify_all();
    }

    /// The next request, doing `idle` work (one unit per call, `true`
    /// while more remains) whenever none is waiting; `None` at shutdown.
    fn pop(&self, idle: &dyn Fn() -> bool) -> Option<Request> {
        let mut q = self.lock();
        loop {
            if q.shut_down {
                return None;
            }
            if let Some(r) = q.demand.pop_front().or_else(|| q.next.pop_front()).or_else(|| q.later.pop_front()) {
                return Some(r);
            }
            drop(q);
            let more = idle();
            q = self.lock();
            let waiting = !q.is_empty() || q.shut_down;
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

#[cfg(test)]
mod tests {
    use super::{Queue, Request, Tier};

    fn req(layer: usize, expert: usize, slot: usize) -> Request {
        Request { layer, expert, slot }
    }

    /// A queue holding `reads` (layer, expert, slot, tier), pushed in order.
    fn queue_of(reads: &[(usize, usize, usize, Tier)]) -> Queue {
        let q = Queue::default();
        for &(layer, expert, slot, tier) in reads {
            q.push(req(layer, expert, slot), tier);
        }
        q
    }

    fn drain(q: &Queue) -> Vec<usize> {
        let mut slots = Vec::new();
        while !q.lock().is_empty() {
            slots.push(q.pop(&|| false).unwrap().slot);
        }
        slots
    }

    #[test]
    fn demand_reads_go_first_then_the_next_layer_s_guesses_then_later_ones() {
        let q = queue_of(&[
            (3, 0, 30, Tier::Later),
            (2, 0, 20, Tier::Next),
            (1, 0, 10, Tier::Demand),
            (2, 1, 21, Tier::Next),
        ]);
        assert_eq!(drain(&q), [10, 20, 21, 30]);
    }

    #[test]
    fn a_promoted_read_moves_up_and_never_down() {
        let q = queue_of(&[(2, 0, 20, Tier::Next), (3, 0, 30, Tier::Later), (3, 1, 31, Tier::Later)]);
        q.promote(31, Tier::Next);
        q.promote(20, Tier::Later);
        assert_eq!(drain(&q), [20, 31, 30]);
        q.push(req(2, 0, 20), Tier::Next);
        q.push(req(1, 0, 10), Tier::Demand);
        q.promote(20, Tier::Demand);
        assert_eq!(drain(&q), [10, 20]);
    }

    #[test]
    fn withdraw_takes_only_the_unwanted_guesses_of_that_layer() {
        let q = queue_of(&[
            (2, 5, 25, Tier::Demand),
            (2, 6, 26, Tier::Next),
            (2, 7, 27, Tier::Next),
            (2, 8, 28, Tier::Later),
            (3, 6, 36, Tier::Later),
        ]);
        let taken: Vec<usize> = q.withdraw(2, |e| e == 7).iter().map(|r| r.slot).collect();
        assert_eq!(taken, [26, 28]);
        assert_eq!(drain(&q), [25, 27, 36]);
    }
}
