//! Store-level bit-identity of the mechanisms that only move bytes: huge-page
//! slots, records computed as they land, speculative reads held back until
//! a layer's demand reads are queued. Each variant must give exactly the
//! plain path's outputs (no cache, no reader threads, 4 KiB-page buffers,
//! records computed in router order).

use std::path::PathBuf;

use super::{ExpertStore, StoreOptions};
use crate::container::Container;
use crate::stats::Picks;
use crate::stats::StepStats;
use crate::synth::{preset, synth};
use crate::transformer::experts::ExpertProvider;

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn next(rng: &mut u64) -> u64 {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    *rng
}

/// `steps` decode-like passes over every MoE layer with pseudo-random
/// inputs and routing; each layer first asks for reads of some of the
/// experts of each of the `ahead` layers after it (half of them right), as
/// lookahead does. Returns every output, bit for bit.
fn run(store: &ExpertStore, layers: &[usize], experts: usize, top_k: usize, hidden: usize, ahead: usize) -> Vec<u32> {
    let mut rng = 0x1234_5678_9ABC_DEF1u64;
    // The wrong guesses draw from their own sequence: `rng` must give every
    // variant the same inputs.
    let mut wrong = 0x0F1E_2D3C_4B5A_6978u64;
    let mut bits = Vec::new();
    let mut stats = StepStats::default();
    let steps = 6;
    let mut routes = Vec::new();
    for _ in 0..steps * layers.len() {
        let mut picks: Vec<(usize, f32)> = Vec::new();
        while picks.len() < top_k {
            // A hot subset, so that a cache of one working set both hits
            // and evicts.
            let e = (next(&mut rng) % experts.min(top_k + 4) as u64) as usize;
            if picks.iter().all(|p| p.0 != e) {
                picks.push((e, (next(&mut rng) % 1000) as f32 / 1000.0));
            }
        }
        routes.push(picks);
    }
    for (i, picks) in routes.iter().enumerate() {
        let layer = layers[i % layers.len()];
        let x: Vec<f32> = (0..hidden).map(|_| (next(&mut rng) % 2001) as f32 / 1000.0 - 1.0).collect();
        for depth in 1..=ahead {
            if let Some(following) = routes.get(i + depth) {
                let later_layer = layers[(i + depth) % layers.len()];
                let mut ids: Vec<usize> = following.iter().take(top_k / 2).map(|p| p.0).collect();
                ids.extend((0..top_k / 2).map(|_| (next(&mut wrong) % experts as u64) as usize));
                store.prefetch(later_layer, &ids, depth, &mut stats);
            }
        }
        let mut out = vec![0.0f32; hidden];
        store.forward_experts(layer, &x, picks, &mut out, &mut stats).unwrap();
        bits.extend(out.iter().map(|v| v.to_bits()));
    }
    bits
}

/// A synthetic OLMoE container in its own folder, removed when dropped.
fn olmoe_container(tag: &str) -> (Dir, Container) {
    let dir = Dir(std::env::temp_dir().join(format!("waste-store-{tag}-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    std::fs::create_dir_all(&dir.0).unwrap();
    let path = dir.0.join("olmoe.waste");
    synth(&path, &preset("olmoe-trace").unwrap(), &mut |_, _| {}).unwrap();
    let container = Container::open(&path).unwrap();
    (dir, container)
}

/// A store with eight top-k's worth of slots over a synthetic OLMoE
/// container, stepping one layer's experts at a time.
struct Stepper {
    _dir: Dir,
    store: ExpertStore,
    layers: Vec<usize>,
    hidden: usize,
}

impl Stepper {
    fn new(tag: &str) -> Stepper {
        let (dir, container) = olmoe_container(tag);
        let banks = container.expert_banks().unwrap();
        let (layers, hidden, top_k) = (banks.moe_layers(), banks.shape().hidden, container.config().top_k);
        let options = StoreOptions { cache_slots: 8 * top_k, keep: true, ..StoreOptions::default() };
        let store = ExpertStore::open(banks, top_k, options).unwrap();
        Stepper { _dir: dir, store, layers, hidden }
    }

    /// Runs `experts` (weight 1 each) of decoder layer `layer`; where this
    /// step's picks came from.
    fn step(&self, layer: usize, experts: &[usize]) -> Picks {
        let picks: Vec<(usize, f32)> = experts.iter().map(|&e| (e, 1.0)).collect();
        let (x, mut out) = (vec![0.5f32; self.hidden], vec![0.0f32; self.hidden]);
        let mut stats = StepStats::default();
        self.store.forward_experts(layer, &x, &picks, &mut out, &mut stats).unwrap();
        stats.picks()
    }

    fn guess(&self, layer: usize, experts: &[usize], ahead: usize) {
        self.store.prefetch(layer, experts, ahead, &mut StepStats::default());
    }
}

fn picks(reused: u64, prefetched: u64, missed: u64) -> Picks {
    Picks { reused, prefetched, missed }
}

/// Regression: a record a lookahead read, then used, was counted as a cache
/// hit, so `hit_rate` reported lookahead's work as the cache's.
#[test]
fn a_prefetched_record_is_counted_as_prefetched_not_as_reused() {
    let t = Stepper::new("picks");
    let (first, second) = (t.layers[0], t.layers[1]);
    assert_eq!(t.step(first, &[0, 1]), picks(0, 0, 2));
    // The lookahead names 2 and 3; the layer then picks 2 and 4, and the
    // read of 3, not yet started, is taken back.
    t.guess(second, &[2, 3], 1);
    assert_eq!(t.step(second, &[2, 4]), picks(0, 1, 1));
    assert_eq!(t.step(first, &[0, 1]), picks(2, 0, 0));
    // Used once, the prefetched record is the cache's own from then on.
    assert_eq!(t.step(second, &[2]), picks(1, 0, 0));
    let s = t.store.stats();
    assert_eq!(s.picks, picks(3, 1, 3));
    assert_eq!((s.prefetch_issued, s.prefetch_withdrawn, s.prefetch_wasted()), (1, 1, 0));
    assert_eq!((s.lookahead_picks, s.lookahead_named, s.lookahead_recall()), (2, 1, Some(0.5)));
    assert_eq!(s.reads, 4);
    assert_eq!(s.useful_bytes(), s.bytes_of(4));
    assert_eq!(s.bytes_read, s.bytes_of(4));
}

/// Regression: a guess taken back freed its slot, so which records stayed
/// cached (and so `reused`) depended on whether a reader had started the
/// read in time, and `bench --threads 1,2` reported different reuse for the
/// same tokens. Taken back, it keeps its place unread: a later pick reads
/// it on demand, a later guess reads it again, and from then on it is reused.
#[test]
fn a_guess_taken_back_keeps_its_place_so_reuse_does_not_depend_on_timing() {
    let t = Stepper::new("withdrawn");
    let layer = t.layers[1];
    // Held back until the layer's pin, the guesses at 3 and 5 are taken back.
    t.guess(layer, &[2, 3, 5], 1);
    assert_eq!(t.step(layer, &[2]), picks(0, 1, 0));
    let held = |e: u32| t.store.shared.lock().core.contains((layer as u32, e));
    assert!(held(3) && held(5), "a guess taken back lost its place in the cache");
    assert_eq!(t.step(layer, &[3]), picks(0, 0, 1));
    assert_eq!(t.step(layer, &[3]), picks(1, 0, 0));
    t.guess(layer, &[5], 1);
    assert_eq!(t.step(layer, &[5]), picks(0, 1, 0));
    let s = t.store.stats();
    assert_eq!((s.prefetch_issued, s.prefetch_withdrawn, s.reads), (2, 2, 3), "{s:?}");
}

/// A guess at a layer beyond the next is counted apart from the next
/// layer's, so the bench can say how well each predicts.
#[test]
fn guesses_further_ahead_have_their_own_recall() {
    let t = Stepper::new("later");
    t.guess(t.layers[2], &[1, 2, 3], 2);
    assert_eq!(t.step(t.layers[2], &[1, 5]), picks(0, 1, 1));
    let s = t.store.stats();
    assert_eq!((s.lookahead_picks, s.lookahead_recall()), (0, None));
    assert_eq!((s.lookahead_later_picks, s.lookahead_later_named), (2, 1));
    assert_eq!(s.prefetch_withdrawn, 2);
}

/// The disk's idle time is wall time with no read inside its `pread`: all
/// of it before the first read, none counted from before a reset, and never
/// more than the time that passed. A stretch a read for the first MoE
/// layer ends is the gap between tokens; one a later layer's ends is not.
#[test]
fn disk_idle_counts_the_time_no_read_runs() {
    let (_dir, container) = olmoe_container("idle");
    let banks = container.expert_banks().unwrap();
    let (layer, hidden) = (banks.moe_layers()[0], banks.shape().hidden);
    let second = banks.moe_layers()[1];
    let top_k = container.config().top_k;
    let opened = std::time::Instant::now();
    let options = StoreOptions { cache_slots: 4 * top_k, keep: true, ..StoreOptions::default() };
    let store = ExpertStore::open(container.expert_banks().unwrap(), top_k, options).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(30));
    let idle = store.stats().disk_idle;
    assert!(idle >= std::time::Duration::from_millis(30) && idle <= opened.elapsed(), "{idle:?}");
    let mut out = vec![0.0f32; hidden];
    store
        .forward_experts(layer, &vec![0.5; hidden], &[(0, 1.0), (1, 1.0)], &mut out, &mut StepStats::default())
        .unwrap();
    let s = store.stats();
    assert!(s.disk_idle + s.read_time >= idle && s.disk_idle <= opened.elapsed(), "{s:?}");
    assert!(s.disk_idle_before_first_layer >= idle, "{s:?}");
    std::thread::sleep(std::time::Duration::from_millis(20));
    store
        .forward_experts(second, &vec![0.5; hidden], &[(0, 1.0), (1, 1.0)], &mut out, &mut StepStats::default())
        .unwrap();
    let later = store.stats();
    assert!(later.disk_idle >= s.disk_idle + std::time::Duration::from_millis(20), "{later:?}");
    assert_eq!(later.disk_idle_before_first_layer, s.disk_idle_before_first_layer, "{later:?}");
    let reset = std::time::Instant::now();
    store.reset_stats();
    assert!(store.stats().disk_idle <= reset.elapsed());
}

#[test]
fn huge_pages_landing_order_and_held_back_prefetch_are_bit_identical_to_the_plain_path() {
    let (_dir, container) = olmoe_container("ident");
    let cfg = container.config().clone();
    let banks = container.expert_banks().unwrap();
    let (layers, hidden) = (banks.moe_layers(), banks.shape().hidden);
    let experts = banks.bank(layers[0]).unwrap().experts;
    let top_k = cfg.top_k;
    let open = |o: StoreOptions| ExpertStore::open(container.expert_banks().unwrap(), top_k, o).unwrap();
    let plain = StoreOptions {
        cache_slots: top_k,
        keep: false,
        readers: 0,
        read_ahead: false,
        huge_pages: false,
        ..StoreOptions::default()
    };
    let want = run(&open(plain.clone()), &layers, experts, top_k, hidden, 0);
    // One working set: evictions all the time, some hits.
    let small = StoreOptions { cache_slots: layers.len() * top_k, keep: true, ..StoreOptions::default() };
    let variants = [
        ("huge pages, no cache, no readers", StoreOptions { huge_pages: true, ..plain.clone() }, 0),
        ("huge pages, cache, 2 readers, as they land", small.clone(), 0),
        ("4 KiB pages, cache, 2 readers, as they land", StoreOptions { huge_pages: false, ..small.clone() }, 0),
        ("1 reader, held-back prefetch", StoreOptions { readers: 1, ..small.clone() }, 1),
        ("2 readers, held-back prefetch", small.clone(), 1),
        ("2 readers, prefetch two and three layers ahead", small.clone(), 3),
        ("no read-ahead, prefetch", StoreOptions { read_ahead: false, ..small.clone() }, 1),
        ("big cache, held-back prefetch", StoreOptions { cache_slots: 4 * layers.len() * top_k, ..small.clone() }, 1),
        (
            "big cache, prefetch two layers ahead",
            StoreOptions { cache_slots: 4 * layers.len() * top_k, ..small.clone() },
            2,
        ),
    ];
    for (name, options, ahead) in variants {
        let guess = ahead > 0;
        let store = open(options.clone());
        let got = run(&store, &layers, experts, top_k, hidden, ahead);
        assert!(got == want, "{name}: outputs differ bitwise from the plain path");
        let s = store.stats();
        if guess {
            assert!(s.prefetch_issued > 0 && s.picks.prefetched > 0, "{name}: prefetch never paid ({s:?})");
            assert!(s.useful_bytes() <= s.bytes_read, "{name}: useful bytes above bytes read");
        }
        // With a one-working-set cache, the wrong half of the guesses can
        // evict every record before its reuse: then nothing is reused.
        if options.keep && !guess {
            assert!(s.picks.reused > 0 && s.picks.missed > 0, "{name}: cache unused ({s:?})");
        }
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
        if options.huge_pages && cfg!(target_os = "linux") && !thp.contains("[never]") && !thp.is_empty() {
            assert!(s.huge_pages, "{name}: huge-page advice refused though THP is {}", thp.trim());
        } else if !options.huge_pages {
            assert!(!s.huge_pages, "{name}: huge pages reported without being asked for");
        }
    }
}

/// A GGUF file read in place: every expert of every layer, read with its
/// three slabs' aligned spans (direct I/O where the file system allows)
/// and moved together, is byte for byte the slabs the file stores (what a
/// conversion copies into a record). The fixtures' tensors start on
/// 32-byte boundaries, so spans start mid-block; the last slab of a file
/// reaches its unaligned end; a split file's layers lie in several parts.
#[test]
fn gguf_experts_read_in_place_are_the_files_own_slabs() {
    let models = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/gguf");
    for file in [
        "models/tiny-qwen3_moe-q8_0.gguf",
        "models/wide-qwen3moe-q4_k_m.gguf",
        "split/wide-qwen3moe-q4_k_m-00001-of-00003.gguf",
    ] {
        let path = models.join(file);
        let container = crate::paths::open_container(&path).unwrap();
        let ckpt = crate::checkpoint::HfCheckpoint::open_gguf(&path).unwrap();
        let cfg = container.config().clone();
        let options = StoreOptions { cache_slots: cfg.top_k, readers: 0, ..StoreOptions::default() };
        let store = ExpertStore::open(container.expert_banks().unwrap(), cfg.top_k, options).unwrap();
        let mut buf = super::io::AlignedBuf::new(store.record_bytes()).unwrap();
        let mut checked = 0;
        for layer in store.banks().moe_layers() {
            let payload = store.banks().payload_range(layer);
            for expert in 0..cfg.num_experts {
                let record = &mut buf.as_mut_slice()[..store.record_bytes()];
                store.shared.read_record(layer, expert, record).unwrap();
                let (_, slabs) = ckpt.gguf_expert_slabs(layer, expert).unwrap();
                assert!(record[payload.clone()] == slabs.concat()[..], "{file}: layer {layer} expert {expert}");
                checked += 1;
            }
        }
        assert!(checked > 0, "{file}: no experts");
    }
}
