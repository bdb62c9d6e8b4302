//! Expert kernel benchmark: time per routed expert (gate + up + down) and
//! GB/s of stored weights processed, per format, for the Kimi-Linear and
//! K3 expert shapes, with 1 and 2 compute threads, beside this machine's
//! memory read bandwidth and a plain f32 expert of the same shape measured
//! in the same run.
//!
//! `cargo bench -p waste-kernels --bench kernels` (or run the built
//! binary; `--quick` for a short smoke run). Compare with an earlier
//! revision by building this bench in a worktree of it and running both
//! binaries alternately (docs/PERFORMANCE.md, "Comparing revisions").
//!
//! Method: the experts of one format are distinct buffers totalling at
//! least `WORKING_SET` bytes (8x the L3 here) and are visited in rotation,
//! so weights come from RAM, as for experts cached in memory. Each "token"
//! builds the gate/up tables once and runs `TOP_K` experts with them, as
//! the engine does; the table build is included in the per-expert time.
//! Weights are random codes / values with realistic scales: the kernels'
//! speed does not depend on the values. Each figure is the best of
//! `REPEATS` timed passes (the machine is shared; the best pass is the
//! least disturbed one).
//!
//! GGUF's block types follow in the same run (word `gguf`, or a type's
//! name such as `q4_k`): gate and up by `GgmlMatrix::matvec`, SiLU(gate) *
//! up, down by `matvec`, on random blocks with f16 scales of weight size,
//! as a GGUF expert would run from its own slabs.

use std::hint::black_box;
use std::time::{Duration, Instant};

use half::f16;
use waste_kernels::pool::Pool;
use waste_kernels::quant::ggml::{GgmlMatrix, GgmlType};
use waste_kernels::quant::{
    build_gate_up_tables, expert_forward, expert_payload_len, force_isa, isa, Codebooks, ExpertFormat, ExpertScratch,
    ExpertShape, Isa, LayerCodebooks,
};

const WORKING_SET: usize = 256 << 20;
const TOP_K: usize = 8;
const REPEATS: usize = 5;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

/// Bytes of one `[rows, cols]` matrix and of its leading f16 scale block,
/// per the layouts in `quant`'s module docs.
fn matrix_layout(fmt: ExpertFormat, rows: usize, cols: usize) -> (usize, usize) {
    let g = cols.div_ceil(128);
    let nvec = cols.div_ceil(8);
    match fmt {
        ExpertFormat::F32 => (rows * cols * 4, 0),
        ExpertFormat::Q8 => (rows * g * 2 + rows * cols, rows * g * 2),
        ExpertFormat::Q4 => (rows * g * 2 + rows * cols.div_ceil(2), rows * g * 2),
        ExpertFormat::Rvq4p => (rows * 2 + rows.div_ceil(32) * nvec * 96, rows * 2),
        f => (rows * 2 + rows * nvec * f.stages().unwrap(), rows * 2),
    }
}

fn payload(fmt: ExpertFormat, s: ExpertShape, rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::with_capacity(expert_payload_len(fmt, s));
    for (rows, cols) in [(s.inter, s.hidden), (s.inter, s.hidden), (s.hidden, s.inter)] {
        let (len, scales) = matrix_layout(fmt, rows, cols);
        let mut m = vec![0u8; len];
        if fmt == ExpertFormat::F32 {
            for c in m.chunks_exact_mut(4) {
                c.copy_from_slice(&(rng.unit() * 0.05).to_le_bytes());
            }
        } else {
            rng.fill(&mut m[scales..]);
            let sc = f16::from_f32(if fmt.uses_codebooks() { 0.02 } else { 0.002 }).to_bits().to_le_bytes();
            for c in m[..scales].chunks_exact_mut(2) {
                c.copy_from_slice(&sc);
            }
        }
        out.extend_from_slice(&m);
    }
    assert_eq!(out.len(), expert_payload_len(fmt, s), "{}: layout", fmt.name());
    out
}

fn codebooks(fmt: ExpertFormat, rng: &mut Rng) -> Option<LayerCodebooks> {
    let stages = fmt.stages()?;
    let mut book = || {
        let bytes: Vec<u8> = (0..stages * fmt.entries() * 8).flat_map(|_| (rng.unit() * 0.5).to_le_bytes()).collect();
        Codebooks::from_bytes(stages, &bytes).expect("codebooks")
    };
    Some(LayerCodebooks { gate_up: book(), down: book() })
}

/// Best seconds per expert over `REPEATS` passes of `tokens` tokens.
fn time_experts(
    pool: &Pool,
    fmt: ExpertFormat,
    s: ExpertShape,
    experts: &[Vec<u8>],
    cb: Option<&LayerCodebooks>,
    xs: &[Vec<f32>],
    tokens: usize,
) -> f64 {
    let mut scratch = ExpertScratch::new(fmt, s);
    let mut out = vec![0f32; s.hidden];
    let mut next = 0usize;
    let pass = |n: usize| {
        pool.install(|| {
            for t in 0..n {
                let x = &xs[t % xs.len()];
                let tables = build_gate_up_tables(fmt, cb, x);
                for _ in 0..TOP_K {
                    let p = &experts[next % experts.len()];
                    next += 1;
                    expert_forward(fmt, s, p, cb, &tables, x, &mut out, &mut scratch);
                    black_box(&out);
                }
            }
        })
        .expect("pool");
    };
    best_per_expert(experts.len(), tokens, pass)
}

/// Seconds per expert: a warm-up visit of every one of `experts` (so page
/// faults are not timed), then the best of `REPEATS` passes of `tokens`
/// tokens, `TOP_K` experts each.
fn best_per_expert(experts: usize, tokens: usize, mut pass: impl FnMut(usize)) -> f64 {
    pass(experts.div_ceil(TOP_K));
    let mut best = Duration::MAX;
    for _ in 0..REPEATS {
        let t0 = Instant::now();
        pass(tokens);
        best = best.min(t0.elapsed());
    }
    best.as_secs_f64() / (tokens * TOP_K) as f64
}

/// GGUF block types the bench times: the experts of the files users hold.
const GGUF_TYPES: [GgmlType; 7] =
    [GgmlType::Q8_0, GgmlType::Q6K, GgmlType::Q4K, GgmlType::Q2K, GgmlType::Iq4Xs, GgmlType::Iq3Xxs, GgmlType::Iq2Xxs];

/// Byte offsets of each block's f16 scales (ggml-common.h), set to a
/// weight-sized value so the random blocks decode to finite weights.
fn f16_offsets(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q2K => &[80, 82],
        GgmlType::Q6K => &[208],
        GgmlType::Q4K => &[0, 2],
        _ => &[0],
    }
}

/// One GGUF expert: gate, up `[inter, hidden]` and down `[hidden, inter]`
/// slabs of `ty`, concatenated.
fn gguf_payload(ty: GgmlType, s: ExpertShape, rng: &mut Rng) -> Vec<u8> {
    let gate = ty.matrix_bytes(s.inter, s.hidden).expect("whole blocks");
    let mut out = vec![0u8; 2 * gate + ty.matrix_bytes(s.hidden, s.inter).expect("whole blocks")];
    rng.fill(&mut out);
    let d = f16::from_f32(0.002).to_bits().to_le_bytes();
    for block in out.chunks_exact_mut(ty.block_bytes()) {
        for &at in f16_offsets(ty) {
            block[at..at + 2].copy_from_slice(&d);
        }
    }
    out
}

/// `time_experts` for a GGUF expert run by `GgmlMatrix`.
fn time_gguf(pool: &Pool, ty: GgmlType, s: ExpertShape, experts: &[Vec<u8>], xs: &[Vec<f32>], tokens: usize) -> f64 {
    let gate_len = ty.matrix_bytes(s.inter, s.hidden).expect("whole blocks");
    let (mut g, mut u, mut out) = (vec![0f32; s.inter], vec![0f32; s.inter], vec![0f32; s.hidden]);
    let mut next = 0usize;
    let pass = |n: usize| {
        pool.install(|| {
            for t in 0..n {
                let x = &xs[t % xs.len()];
                for _ in 0..TOP_K {
                    let p = &experts[next % experts.len()];
                    next += 1;
                    let m = |what, rows, cols, bytes| GgmlMatrix::new(what, ty, rows, cols, bytes).expect("slab");
                    m("gate", s.inter, s.hidden, &p[..gate_len]).matvec(x, &mut g);
                    m("up", s.inter, s.hidden, &p[gate_len..2 * gate_len]).matvec(x, &mut u);
                    for (a, b) in g.iter_mut().zip(&u) {
                        *a = *a / (1.0 + (-*a).exp()) * b;
                    }
                    m("down", s.hidden, s.inter, &p[2 * gate_len..]).matvec(&g, &mut out);
                    black_box(&out);
                }
            }
        })
        .expect("pool");
    };
    best_per_expert(experts.len(), tokens, pass)
}

/// Best read bandwidth (bytes/s) summing a `WORKING_SET * 2` buffer.
fn read_bandwidth(pool: &Pool) -> f64 {
    let words = WORKING_SET * 2 / 8;
    let buf: Vec<u64> = (0..words as u64).collect();
    let mut best = Duration::MAX;
    for _ in 0..REPEATS {
        let t0 = Instant::now();
        // Fixed 1 MiB chunks; the integer sum is exact in any order.
        let s: u64 = pool
            .install(|| {
                use rayon::prelude::*;
                buf.par_chunks(1 << 17)
                    .map(|c| c.iter().fold(0u64, |a, &b| a.wrapping_add(b)))
                    .reduce(|| 0, u64::wrapping_add)
            })
            .expect("pool");
        best = best.min(t0.elapsed());
        black_box(s);
    }
    (words * 8) as f64 / best.as_secs_f64()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    // Positional words filter shapes and formats (`kernels k3 rvq3`).
    let want = |name: &str, all: &[&str]| {
        let named: Vec<&String> = args.iter().filter(|a| all.contains(&a.as_str())).collect();
        named.is_empty() || named.iter().any(|a| *a == name)
    };
    let quick = std::env::args().any(|a| a == "--quick");
    let tokens = if quick { 2 } else { 8 };
    let shapes = [("kimi-linear", ExpertShape::new(2304, 1024)), ("k3", ExpertShape::new(3584, 3072))];
    let formats = [ExpertFormat::F32, ExpertFormat::Q8, ExpertFormat::Q4, ExpertFormat::Rvq3, ExpertFormat::Rvq4p];
    let best_isa = isa();
    println!("kernel level: {} (supported: {:?})", best_isa.name(), Isa::supported());
    let pools: Vec<Pool> = [1, 2].iter().map(|&n| Pool::new(Some(n), None).expect("pool")).collect();
    for p in &pools {
        println!("memory read bandwidth, {} thread(s): {:.1} GB/s", p.threads(), read_bandwidth(p) / 1e9);
    }
    println!();
    println!(
        "{:<12} {:<6} {:<7} {:>7} {:>11} {:>11} {:>8}",
        "shape", "format", "isa", "threads", "MB/expert", "us/expert", "GB/s"
    );
    let mut rng = Rng(0x5EED);
    let shape_names = ["kimi-linear", "k3"];
    let format_names = ["f32", "q8", "q4", "rvq3", "rvq4p"];
    for (name, s) in shapes {
        if !want(name, &shape_names) {
            continue;
        }
        let xs: Vec<Vec<f32>> = (0..4).map(|_| (0..s.hidden).map(|_| rng.unit()).collect()).collect();
        for fmt in formats {
            if !want(fmt.name(), &format_names) {
                continue;
            }
            let bytes = expert_payload_len(fmt, s);
            let n = WORKING_SET.div_ceil(bytes).max(2);
            let experts: Vec<Vec<u8>> = (0..n).map(|_| payload(fmt, s, &mut rng)).collect();
            let cb = codebooks(fmt, &mut rng);
            let mut levels = vec![best_isa];
            if matches!(fmt, ExpertFormat::Rvq3 | ExpertFormat::Rvq4p | ExpertFormat::Q4) {
                levels.push(Isa::Scalar);
            }
            if matches!(fmt, ExpertFormat::Rvq3 | ExpertFormat::Rvq4p) && best_isa == Isa::Avx512 {
                levels.push(Isa::Avx2);
            }
            for level in levels {
                force_isa(level).expect("supported level");
                for p in &pools {
                    if level != best_isa && p.threads() > 1 {
                        continue;
                    }
                    let sec = time_experts(p, fmt, s, &experts, cb.as_ref(), &xs, tokens);
                    println!(
                        "{:<12} {:<6} {:<7} {:>7} {:>11.2} {:>11.1} {:>8.2}",
                        name,
                        fmt.name(),
                        level.name(),
                        p.threads(),
                        bytes as f64 / 1e6,
                        sec * 1e6,
                        bytes as f64 / sec / 1e9
                    );
                }
            }
            force_isa(best_isa).expect("supported level");
        }
    }
    let type_names: Vec<String> = GGUF_TYPES.iter().map(|t| t.name().to_lowercase()).collect();
    let gguf_words: Vec<&str> = type_names.iter().map(String::as_str).chain(["gguf"]).collect();
    for (name, s) in shapes {
        if !want(name, &shape_names) {
            continue;
        }
        let xs: Vec<Vec<f32>> = (0..4).map(|_| (0..s.hidden).map(|_| rng.unit()).collect()).collect();
        for ty in GGUF_TYPES {
            let word = ty.name().to_lowercase();
            if !(want(&word, &gguf_words) || want("gguf", &gguf_words)) {
                continue;
            }
            let bytes = gguf_payload(ty, s, &mut rng).len();
            let n = WORKING_SET.div_ceil(bytes).max(2);
            let experts: Vec<Vec<u8>> = (0..n).map(|_| gguf_payload(ty, s, &mut rng)).collect();
            for p in &pools {
                let sec = time_gguf(p, ty, s, &experts, &xs, tokens);
                println!(
                    "{:<12} {:<6} {:<7} {:>7} {:>11.2} {:>11.1} {:>8.2}",
                    name,
                    word,
                    best_isa.name(),
                    p.threads(),
                    bytes as f64 / 1e6,
                    sec * 1e6,
                    bytes as f64 / sec / 1e9
                );
            }
        }
    }
}
