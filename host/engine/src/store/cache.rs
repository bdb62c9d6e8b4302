//! The bookkeeping of the expert cache, without any I/O: which record sits
//! in which slot, what is pinned, what to evict. The store drives it under
//! its lock, and the trace simulator drives the very same code, so a
//! simulated hit rate is the engine's hit rate.

use std::collections::HashMap;

/// How a victim is chosen when the cache is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CachePolicy {
    /// Fewest hits, then least recently used, among a random sample of
    /// [`SAMPLE`] slots (the earlier engine's policy).
    Frequency,
    /// Least recently used over all slots. The default: it beat
    /// `Frequency` at every cache size on both recorded traces
    /// (docs/PERFORMANCE.md).
    #[default]
    Lru,
}

impl CachePolicy {
    pub fn parse(s: &str) -> Option<CachePolicy> {
        match s {
            "frequency" | "freq" => Some(CachePolicy::Frequency),
            "lru" | "default" => Some(CachePolicy::Lru),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            CachePolicy::Frequency => "frequency",
            CachePolicy::Lru => "lru",
        }
    }
}

/// Candidates examined per eviction under [`CachePolicy::Frequency`].
pub const SAMPLE: usize = 16;

/// A record's identity: (decoder layer, expert).
pub type Key = (u32, u32);

#[derive(Debug, Clone, Default)]
struct Slot {
    key: Option<Key>,
    /// Uses since it was loaded (the load counts as one).
    uses: u64,
    last: u64,
    pins: u32,
}

pub struct CacheCore {
    policy: CachePolicy,
    slots: Vec<Slot>,
    map: HashMap<Key, usize>,
    /// Slots with no key and no pin.
    free: Vec<usize>,
    clock: u64,
    rng: u64,
    /// One past the highest slot ever handed out: free slots are taken in
    /// index order, so the slots from here on have never held a record.
    high_water: usize,
}

impl CacheCore {
    pub fn new(slots: usize, policy: CachePolicy, seed: u64) -> CacheCore {
        CacheCore {
            policy,
            slots: vec![Slot::default(); slots],
            map: HashMap::with_capacity(slots),
            free: (0..slots).rev().collect(),
            clock: 0,
            rng: seed | 1,
            high_water: 0,
        }
    }

    /// One past the highest slot ever handed out (see the field).
    pub fn high_water(&self) -> usize {
        self.high_water
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn policy(&self) -> CachePolicy {
        self.policy
    }

    /// The slot holding `key`, counted as a use and pinned.
    pub fn lookup(&mut self, key: Key) -> Option<usize> {
        let slot = *self.map.get(&key)?;
        self.clock += 1;
        let s = &mut self.slots[slot];
        s.uses += 1;
        s.last = self.clock;
        s.pins += 1;
        Some(slot)
    }

    /// The slot holding `key`, with no use counted and no pin.
    pub fn slot_of(&self, key: Key) -> Option<usize> {
        self.map.get(&key).copied()
    }

    /// The record `slot` holds, if any.
    #[cfg(test)]
    pub fn slots_key(&self, slot: usize) -> Option<Key> {
        self.slots[slot].key
    }

    /// Whether `key` is cached (no use counted).
    pub fn contains(&self, key: Key) -> bool {
        self.map.contains_key(&key)
    }

    /// A slot for `key` (which must not be cached), evicting an unpinned
    /// record if none is free; the slot comes back pinned. `None` when every
    /// slot is pinned.
    pub fn insert(&mut self, key: Key) -> Option<usize> {
        debug_assert!(!self.map.contains_key(&key));
        let slot = match self.free.pop() {
            Some(s) => s,
            None => self.victim()?,
        };
        self.high_water = self.high_water.max(slot + 1);
        if let Some(old) = self.slots[slot].key.take() {
            self.map.remove(&old);
        }
        self.clock += 1;
        self.slots[slot] = Slot { key: Some(key), uses: 1, last: self.clock, pins: 1 };
        self.map.insert(key, slot);
        Some(slot)
    }

    /// A slot taken out of use with no record (lent to a prefill's
    /// buffers): a free one, else an unpinned record evicted. It stays
    /// pinned, so neither an insert nor an eviction takes it, until `unpin`
    /// frees it. `None` when every slot is pinned.
    pub fn take_empty(&mut self) -> Option<usize> {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => self.victim()?,
        };
        if let Some(old) = self.slots[slot].key.take() {
            self.map.remove(&old);
        }
        self.slots[slot] = Slot { key: None, uses: 0, last: 0, pins: 1 };
        Some(slot)
    }

    pub fn pin(&mut self, slot: usize) {
        self.slots[slot].pins += 1;
    }

    pub fn unpin(&mut self, slot: usize) {
        let s = &mut self.slots[slot];
        debug_assert!(s.pins > 0, "unpin of an unpinned slot");
        s.pins = s.pins.saturating_sub(1);
        if s.pins == 0 && s.key.is_none() {
            self.free.push(slot);
        }
    }

    /// Drops the record of `slot` (a failed read, or a cache that keeps
    /// nothing); the slot becomes free once its pins are released.
    pub fn forget(&mut self, slot: usize) {
        if let Some(key) = self.slots[slot].key.take() {
            self.map.remove(&key);
            if self.slots[slot].pins == 0 {
                self.free.push(slot);
            }
        }
    }

    /// Unpinned slots: what an insert could still take.
    pub fn evictable(&self) -> usize {
        self.slots.iter().filter(|s| s.pins == 0).count()
    }

    fn next_rand(&mut self) -> u64 {
        // xorshift64*: deterministic for a given seed, so runs replay.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn victim(&mut self) -> Option<usize> {
        let better = |a: &Slot, b: &Slot, policy: CachePolicy| match policy {
            CachePolicy::Frequency => (a.uses, a.last) < (b.uses, b.last),
            CachePolicy::Lru => a.last < b.last,
        };
        let n = self.slots.len();
        if self.policy == CachePolicy::Frequency && n > SAMPLE {
            let mut best: Option<usize> = None;
            for _ in 0..SAMPLE {
                let i = (self.next_rand() % n as u64) as usize;
                if self.slots[i].pins == 0 && best.is_none_or(|b| better(&self.slots[i], &self.slots[b], self.policy)) {
                    best = Some(i);
                }
            }
            if best.is_some() {
                return best;
            }
        }
        let mut best: Option<usize> = None;
        for i in 0..n {
            if self.slots[i].pins == 0 && best.is_none_or(|b| better(&self.slots[i], &self.slots[b], self.policy)) {
                best = Some(i);
            }
        }
        best
    }
}

/// Hits and misses of a replayed routing trace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimResult {
    pub hits: u64,
    pub misses: u64,
}

impl SimResult {
    pub fn hit_rate(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 {
            0.0
        } else {
            self.hits as f64 / total as f64
        }
    }
}

/// Replays `steps` (per decode step, per MoE layer, the routed experts) on
/// a cache of `slots` records, exactly as the store uses its cache: a
/// layer's records are looked up in router order and stay pinned until the
/// layer is done. `layer_ids` maps a trace layer to its decoder layer.
pub fn simulate(steps: &[Vec<Vec<u32>>], layer_ids: &[u32], slots: usize, policy: CachePolicy, seed: u64) -> SimResult {
    let mut core = CacheCore::new(slots, policy, seed);
    let mut r = SimResult::default();
    let mut pinned = Vec::new();
    for step in steps {
        for (i, experts) in step.iter().enumerate() {
            let layer = layer_ids.get(i).copied().unwrap_or(i as u32);
            for &e in experts {
                match core.lookup((layer, e)) {
                    Some(s) => {
                        r.hits += 1;
                        pinned.push(s);
                    }
                    None => {
                        r.misses += 1;
                        if let Some(s) = core.insert((layer, e)) {
                            pinned.push(s);
                        }
                    }
                }
            }
            for s in pinned.drain(..) {
                core.unpin(s);
            }
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_slots_are_never_evicted() {
        let mut c = CacheCore::new(2, CachePolicy::Lru, 1);
        let a = c.insert((0, 1)).unwrap();
        let b = c.insert((0, 2)).unwrap();
        assert!(c.insert((0, 3)).is_none(), "both slots pinned");
        c.unpin(b);
        assert_eq!(c.insert((0, 3)), Some(b));
        assert!(c.contains((0, 1)) && !c.contains((0, 2)));
        c.unpin(a);
    }

    #[test]
    fn lru_evicts_least_recent_and_frequency_keeps_hot() {
        for (policy, survivor) in [(CachePolicy::Lru, (0, 2)), (CachePolicy::Frequency, (0, 1))] {
            let mut c = CacheCore::new(2, policy, 7);
            for key in [(0, 1), (0, 2)] {
                let s = c.insert(key).unwrap();
                c.unpin(s);
            }
            for _ in 0..3 {
                let s = c.lookup((0, 1)).unwrap();
                c.unpin(s);
            }
            let s = c.lookup((0, 2)).unwrap();
            c.unpin(s);
            // (0,1): 4 uses, older; (0,2): 2 uses, newest.
            let s = c.insert((0, 9)).unwrap();
            c.unpin(s);
            assert!(c.contains(survivor), "{policy:?} evicted the wrong record");
        }
    }

    #[test]
    fn forgotten_slot_is_reused_after_unpin() {
        let mut c = CacheCore::new(1, CachePolicy::Frequency, 3);
        let s = c.insert((1, 1)).unwrap();
        c.forget(s);
        assert!(c.insert((1, 2)).is_none(), "still pinned");
        c.unpin(s);
        assert_eq!(c.insert((1, 2)), Some(s));
    }

    #[test]
    fn simulator_hit_rate_is_cache_fraction_bound() {
        // Two layers alternating the same 4 experts: a cache of 8 holds all.
        let steps: Vec<Vec<Vec<u32>>> = (0..10).map(|_| vec![vec![0, 1, 2, 3], vec![0, 1, 2, 3]]).collect();
        let r = simulate(&steps, &[0, 1], 8, CachePolicy::Frequency, 1);
        assert_eq!((r.hits, r.misses), (72, 8));
        let r = simulate(&steps, &[0, 1], 4, CachePolicy::Lru, 1);
        assert_eq!(r.hits, 0, "LRU thrashes when the cycle exceeds the cache");
    }
}
