//! Expert kernel benchmark: time per routed expert (gate + up + down) and
//! GB/s of stored weights processed, per format, for the Kimi-Linear and
//! K3 expert shapes, with 1 and 2 compute threads, beside this machine's
//! memory read bandwidth and a plain f32 expert of the same shape measured
//! in the same run.
//!
//! `cargo bench -p waste-host --bench kernels` (or run the built
//! binary; `--quick` for a short smoke run). `-- layouts` instead compares
//! rvq3 lookup layouts matrix by matrix (module `layouts` below).
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

use std::hint::black_box;
use std::time::{Duration, Instant};

use half::f16;
use waste_host::pool::Pool;
use waste_host::quant::{
    build_gate_up_tables, expert_forward, expert_payload_len, force_isa, isa, Codebooks,
    ExpertFormat, ExpertScratch, ExpertShape, Isa, LayerCodebooks,
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
    for (rows, cols) in [
        (s.inter, s.hidden),
        (s.inter, s.hidden),
        (s.hidden, s.inter),
    ] {
        let (len, scales) = matrix_layout(fmt, rows, cols);
        let mut m = vec![0u8; len];
        if fmt == ExpertFormat::F32 {
            for c in m.chunks_exact_mut(4) {
                c.copy_from_slice(&(rng.unit() * 0.05).to_le_bytes());
            }
        } else {
            rng.fill(&mut m[scales..]);
            let sc = f16::from_f32(if fmt.uses_codebooks() { 0.02 } else { 0.002 })
                .to_bits()
                .to_le_bytes();
            for c in m[..scales].chunks_exact_mut(2) {
                c.copy_from_slice(&sc);
            }
        }
        out.extend_from_slice(&m);
    }
    assert_eq!(
        out.len(),
        expert_payload_len(fmt, s),
        "{}: layout",
        fmt.name()
    );
    out
}

fn codebooks(fmt: ExpertFormat, rng: &mut Rng) -> Option<LayerCodebooks> {
    let stages = fmt.stages()?;
    let mut book = || {
        let bytes: Vec<u8> = (0..stages * fmt.entries() * 8)
            .flat_map(|_| (rng.unit() * 0.5).to_le_bytes())
            .collect();
        Codebooks::from_bytes(stages, &bytes).expect("codebooks")
    };
    Some(LayerCodebooks {
        gate_up: book(),
        down: book(),
    })
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
    let mut pass = |n: usize| {
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
    // Warm-up: one visit of every expert, so page faults are not timed.
    pass(experts.len().div_ceil(TOP_K));
    let mut best = Duration::MAX;
    for _ in 0..REPEATS {
        let t0 = Instant::now();
        pass(tokens);
        best = best.min(t0.elapsed());
    }
    best.as_secs_f64() / (tokens * TOP_K) as f64
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
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    // Positional words filter shapes and formats (`kernels k3 rvq3`).
    let want = |name: &str, all: &[&str]| {
        let named: Vec<&String> = args.iter().filter(|a| all.contains(&a.as_str())).collect();
        named.is_empty() || named.iter().any(|a| *a == name)
    };
    #[cfg(target_arch = "x86_64")]
    if args.iter().any(|a| a == "layouts") {
        layouts::run();
        return;
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let tokens = if quick { 2 } else { 8 };
    let shapes = [
        (
            "kimi-linear",
            ExpertShape {
                hidden: 2304,
                inter: 1024,
            },
        ),
        (
            "k3",
            ExpertShape {
                hidden: 3584,
                inter: 3072,
            },
        ),
    ];
    let formats = [
        ExpertFormat::F32,
        ExpertFormat::Q8,
        ExpertFormat::Q4,
        ExpertFormat::Rvq3,
        ExpertFormat::Rvq4p,
    ];
    let best_isa = isa();
    println!(
        "kernel level: {} (supported: {:?})",
        best_isa.name(),
        Isa::supported()
    );
    let pools: Vec<Pool> = [1, 2]
        .iter()
        .map(|&n| Pool::new(Some(n), None).expect("pool"))
        .collect();
    for p in &pools {
        println!(
            "memory read bandwidth, {} thread(s): {:.1} GB/s",
            p.threads(),
            read_bandwidth(p) / 1e9
        );
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
        let xs: Vec<Vec<f32>> = (0..4)
            .map(|_| (0..s.hidden).map(|_| rng.unit()).collect())
            .collect();
        for fmt in formats {
            if !want(fmt.name(), &format_names) {
                continue;
            }
            let bytes = expert_payload_len(fmt, s);
            let n = WORKING_SET.div_ceil(bytes).max(2);
            let experts: Vec<Vec<u8>> = (0..n).map(|_| payload(fmt, s, &mut rng)).collect();
            let cb = codebooks(fmt, &mut rng);
            let mut levels = vec![best_isa];
            if matches!(
                fmt,
                ExpertFormat::Rvq3 | ExpertFormat::Rvq4p | ExpertFormat::Q4
            ) {
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
}

/// rvq3 lookup layouts side by side on the Kimi-Linear matrix shapes
/// (issue 5; docs/PERFORMANCE.md, "Expert kernels"):
/// `cargo bench -p waste-host --bench kernels -- layouts`. The kernel
/// before the rewrite (per row: 16-lane gathers over code positions, the
/// tables walked in L2-sized chunks) against the row-lane walk (lanes =
/// rows, 16-position L1-sized chunks) with hardware gathers or with scalar
/// loads, the last being what `quant::simd::rvq_rows` now does. Codes
/// rotate over `WORKING_SET` bytes of matrices (from RAM) unless "hot".
#[cfg(target_arch = "x86_64")]
// Parallel per-block arrays (codes, accumulators, masks) read clearest by index.
#[allow(clippy::needless_range_loop)]
mod layouts {
    use super::*;
    use std::arch::x86_64::*;

    const E: usize = 256;

    /// Today's kernel: per row, 16-lane gathers over code positions,
    /// table walked in chunks of 192 positions.
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn gather_row(table: &[f32], codes: &[u8]) -> f32 {
        let n = codes.len();
        let tp = table.as_ptr();
        let cp = codes.as_ptr();
        let lane = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(E as i32),
        );
        let step = _mm512_set1_epi32(16 * E as i32);
        let mut base = lane;
        let mut acc = [_mm512_setzero_ps(); 2];
        let mut j = 0;
        while j + 32 <= n {
            for a in acc.iter_mut() {
                let c = _mm512_cvtepu8_epi32(_mm_loadu_si128(cp.add(j) as *const __m128i));
                *a = _mm512_add_ps(*a, _mm512_i32gather_ps::<4>(_mm512_add_epi32(base, c), tp));
                base = _mm512_add_epi32(base, step);
                j += 16;
            }
        }
        while j + 16 <= n {
            let c = _mm512_cvtepu8_epi32(_mm_loadu_si128(cp.add(j) as *const __m128i));
            acc[0] = _mm512_add_ps(
                acc[0],
                _mm512_i32gather_ps::<4>(_mm512_add_epi32(base, c), tp),
            );
            base = _mm512_add_epi32(base, step);
            j += 16;
        }
        let mut s = _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));
        while j < n {
            s += table[j * E + codes[j] as usize];
            j += 1;
        }
        s
    }

    /// The kernel before issue 5's rewrite.
    fn old(table: &[f32], codes: &[u8], rows: usize, n: usize, y: &mut [f32]) {
        y.fill(0.0);
        for c0 in (0..n).step_by(192) {
            let c1 = (c0 + 192).min(n);
            let t = &table[c0 * E..c1 * E];
            for (r, yv) in y.iter_mut().enumerate().take(rows) {
                // SAFETY: `run` checked AVX-512F; the chunk's table holds 256 floats per code.
                *yv += unsafe { gather_row(t, &codes[r * n + c0..r * n + c1]) };
            }
        }
    }

    /// pshufb mask: dword m of each 128-bit lane takes byte 4m+k of its lane, zero-extended.
    #[target_feature(enable = "avx512f")]
    unsafe fn lane_mask512(k: i32) -> __m512i {
        let d = |m: i32| (0x8080_8000u32 as i32) | (4 * m + k);
        _mm512_setr_epi32(
            d(0),
            d(1),
            d(2),
            d(3),
            d(0),
            d(1),
            d(2),
            d(3),
            d(0),
            d(1),
            d(2),
            d(3),
            d(0),
            d(1),
            d(2),
            d(3),
        )
    }

    /// Hardware ceiling: 16-lane gathers from one L1-resident 1 KB table.
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn l1_gathers(t: &[f32], idx: &[i32], reps: usize) -> f32 {
        let mut a = [_mm512_setzero_ps(); 4];
        for _ in 0..reps {
            for c in idx.chunks_exact(64) {
                for (q, acc) in a.iter_mut().enumerate() {
                    let i = _mm512_loadu_si512(c.as_ptr().add(16 * q) as *const _);
                    *acc = _mm512_add_ps(*acc, _mm512_i32gather_ps::<4>(i, t.as_ptr()));
                }
            }
        }
        _mm512_reduce_add_ps(_mm512_add_ps(
            _mm512_add_ps(a[0], a[1]),
            _mm512_add_ps(a[2], a[3]),
        ))
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn l1_gathers8(t: &[f32], idx: &[i32], reps: usize) -> f32 {
        let mut a = [_mm256_setzero_ps(); 4];
        for _ in 0..reps {
            for c in idx.chunks_exact(32) {
                for (q, acc) in a.iter_mut().enumerate() {
                    let i = _mm256_loadu_si256(c.as_ptr().add(8 * q) as *const _);
                    *acc = _mm256_add_ps(*acc, _mm256_i32gather_ps::<4>(t.as_ptr(), i));
                }
            }
        }
        let s = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
        let mut o = [0f32; 8];
        _mm256_storeu_ps(o.as_mut_ptr(), s);
        o.iter().sum()
    }

    fn ceiling() {
        let mut rng = Rng(7);
        let t: Vec<f32> = (0..256).map(|_| rng.unit()).collect();
        let idx: Vec<i32> = (0..4096).map(|_| (rng.next() % 256) as i32).collect();
        let reps = 256;
        let lookups = (idx.len() * reps) as f64;
        let t0 = Instant::now();
        // SAFETY: `run` checked AVX-512F (AVX2 with it); indices are < 256 = t.len().
        black_box(unsafe { l1_gathers(&t, &idx, reps) });
        println!(
            "L1 16-lane gathers: {:.3} ns/lookup",
            t0.elapsed().as_secs_f64() * 1e9 / lookups
        );
        let t0 = Instant::now();
        // SAFETY: as above.
        black_box(unsafe { l1_gathers8(&t, &idx, reps) });
        println!(
            "L1 8-lane gathers:  {:.3} ns/lookup",
            t0.elapsed().as_secs_f64() * 1e9 / lookups
        );
        let t0 = Instant::now();
        let mut a = [0f32; 4];
        for _ in 0..reps {
            for c in idx.chunks_exact(4) {
                for k in 0..4 {
                    a[k] += t[c[k] as usize & 255];
                }
            }
        }
        black_box(a);
        println!(
            "L1 scalar loads:    {:.3} ns/lookup",
            t0.elapsed().as_secs_f64() * 1e9 / lookups
        );
    }

    /// Row lanes: B blocks of 16 rows, positions [c0, c1) (multiple of 4).
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
    unsafe fn rows16<const B: usize>(
        tp: *const f32,
        cp: *const u8,
        n: usize,
        c0: usize,
        c1: usize,
        acc: *mut f32,
    ) {
        let roff = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(n as i32),
        );
        let mk = [
            lane_mask512(0),
            lane_mask512(1),
            lane_mask512(2),
            lane_mask512(3),
        ];
        let mut a = [_mm512_setzero_ps(); B];
        for b in 0..B {
            a[b] = _mm512_loadu_ps(acc.add(16 * b));
        }
        let mut j = c0;
        while j < c1 {
            let mut v = [_mm512_setzero_si512(); B];
            for b in 0..B {
                v[b] = _mm512_i32gather_epi32::<1>(roff, cp.add(16 * b * n + j) as *const i32);
            }
            for k in 0..4 {
                let t = tp.add((j + k) * E);
                for b in 0..B {
                    let idx = _mm512_shuffle_epi8(v[b], mk[k]);
                    a[b] = _mm512_add_ps(a[b], _mm512_i32gather_ps::<4>(idx, t));
                }
            }
            j += 4;
        }
        for b in 0..B {
            _mm512_storeu_ps(acc.add(16 * b), a[b]);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn rows8<const B: usize>(
        tp: *const f32,
        cp: *const u8,
        n: usize,
        c0: usize,
        c1: usize,
        acc: *mut f32,
    ) {
        let ni = n as i32;
        let roff = _mm256_setr_epi32(0, ni, 2 * ni, 3 * ni, 4 * ni, 5 * ni, 6 * ni, 7 * ni);
        let mk = [
            _mm256_broadcastsi128_si256(_mm512_castsi512_si128(lane_mask512(0))),
            _mm256_broadcastsi128_si256(_mm512_castsi512_si128(lane_mask512(1))),
            _mm256_broadcastsi128_si256(_mm512_castsi512_si128(lane_mask512(2))),
            _mm256_broadcastsi128_si256(_mm512_castsi512_si128(lane_mask512(3))),
        ];
        let mut a = [_mm256_setzero_ps(); B];
        for b in 0..B {
            a[b] = _mm256_loadu_ps(acc.add(8 * b));
        }
        let mut j = c0;
        while j < c1 {
            let mut v = [_mm256_setzero_si256(); B];
            for b in 0..B {
                v[b] = _mm256_i32gather_epi32::<1>(cp.add(8 * b * n + j) as *const i32, roff);
            }
            for k in 0..4 {
                let t = tp.add((j + k) * E);
                for b in 0..B {
                    let idx = _mm256_shuffle_epi8(v[b], mk[k]);
                    a[b] = _mm256_add_ps(a[b], _mm256_i32gather_ps::<4>(t, idx));
                }
            }
            j += 4;
        }
        for b in 0..B {
            _mm256_storeu_ps(acc.add(8 * b), a[b]);
        }
    }

    /// A copy of `quant::simd::rvq_rows8` (crate-private), without its tail
    /// of < 8 positions, which these chunks never have.
    unsafe fn scalar_raw8(
        tp: *const f32,
        cp: *const u8,
        n: usize,
        c0: usize,
        c1: usize,
        acc: &mut [f32; 8],
    ) {
        const R: usize = 8;
        let mut s = *acc;
        let mut j = c0;
        while j + 8 <= c1 {
            let mut w = [0u64; R];
            for r in 0..R {
                w[r] = u64::from_le(std::ptr::read_unaligned(cp.add(r * n + j) as *const u64));
            }
            for k in 0..8 {
                let t = tp.add((j + k) * 256);
                for r in 0..R {
                    let c = (w[r] & 255) as usize;
                    w[r] >>= 8;
                    s[r] += *t.add(c);
                }
            }
            j += 8;
        }
        *acc = s;
    }

    #[derive(Clone, Copy)]
    enum Kind {
        Old,
        /// AVX-512 16-lane gathers, lanes = rows, 4 blocks interleaved.
        Z16,
        /// AVX2 8-lane gathers, lanes = rows, 4 blocks interleaved.
        Y8,
        /// Scalar loads, 8 rows interleaved (the kernel in `quant::simd`).
        Rows8,
    }

    /// Row-lane walk as `RvqRef::matvec_tables` does it: tasks of 128 rows,
    /// 16-position chunks, this task's codes prefetched at its start and
    /// the next task's a slice per chunk.
    fn new(kind: Kind, table: &[f32], codes: &[u8], rows: usize, n: usize, y: &mut [f32]) {
        const TASK: usize = 128;
        const CHUNK: usize = 16;
        let (tp, cp) = (table.as_ptr(), codes.as_ptr());
        for t0 in (0..rows).step_by(TASK) {
            let acc = &mut y[t0..t0 + TASK];
            acc.fill(0.0);
            let prefetch = |b: &[u8]| {
                for l in (0..b.len()).step_by(64) {
                    // SAFETY: a prefetch never faults; the address is inside `b`.
                    unsafe { _mm_prefetch::<_MM_HINT_T1>(b.as_ptr().add(l) as *const i8) };
                }
            };
            prefetch(&codes[t0 * n..(t0 + TASK) * n]);
            let next =
                &codes[((t0 + TASK) * n).min(codes.len())..((t0 + 2 * TASK) * n).min(codes.len())];
            let per_chunk = next.len().div_ceil(n.div_ceil(CHUNK)).next_multiple_of(64);
            for (k, c0) in (0..n).step_by(CHUNK).enumerate() {
                let c1 = (c0 + CHUNK).min(n);
                let p0 = (k * per_chunk).min(next.len());
                prefetch(&next[p0..(p0 + per_chunk).min(next.len())]);
                // SAFETY: `run` checked AVX-512F/BW (AVX2 with it); each block's
                // rows lie inside `codes` (TASK divides `rows`) and c1 <= n, so
                // every code read and every table index (< c1 * 256) is in bounds.
                unsafe {
                    match kind {
                        Kind::Z16 => {
                            for r in (0..TASK).step_by(64) {
                                rows16::<4>(
                                    tp,
                                    cp.add((t0 + r) * n),
                                    n,
                                    c0,
                                    c1,
                                    acc.as_mut_ptr().add(r),
                                );
                            }
                        }
                        Kind::Y8 => {
                            for r in (0..TASK).step_by(32) {
                                rows8::<4>(
                                    tp,
                                    cp.add((t0 + r) * n),
                                    n,
                                    c0,
                                    c1,
                                    acc.as_mut_ptr().add(r),
                                );
                            }
                        }
                        Kind::Rows8 => {
                            for r in (0..TASK).step_by(8) {
                                let a: &mut [f32; 8] = (&mut acc[r..r + 8]).try_into().unwrap();
                                scalar_raw8(tp, cp.add((t0 + r) * n), n, c0, c1, a);
                            }
                        }
                        Kind::Old => unreachable!(),
                    }
                }
            }
        }
    }

    pub fn run() {
        if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")) {
            println!("SKIP layouts: the comparison needs AVX-512 F/BW");
            return;
        }
        ceiling();
        let mut rng = Rng(0x1A70);
        for (name, rows, n) in [
            ("gate/up 1024x2304", 1024usize, 864usize),
            ("down 2304x1024", 2304, 384),
        ] {
            let table: Vec<f32> = (0..n * E).map(|_| rng.unit()).collect();
            let mats: Vec<Vec<u8>> = (0..(WORKING_SET / (rows * n)).max(2))
                .map(|_| {
                    let mut m = vec![0u8; rows * n];
                    rng.fill(&mut m);
                    m
                })
                .collect();
            let mut want = vec![0f32; rows];
            let mut y = vec![0f32; rows];
            let kinds: [(&str, Kind, bool); 7] = [
                ("old: per row, 192-position chunks", Kind::Old, false),
                ("rows: avx512 16-lane gathers", Kind::Z16, false),
                ("rows: avx2 8-lane gathers", Kind::Y8, false),
                ("rows: scalar loads x8 (kernel)", Kind::Rows8, false),
                ("old, one matrix (codes hot)", Kind::Old, true),
                ("rows: avx512 gathers, codes hot", Kind::Z16, true),
                ("rows: scalar x8, codes hot", Kind::Rows8, true),
            ];
            let mut best = vec![Duration::MAX; kinds.len()];
            let mut exact = vec![true; kinds.len()];
            let mut m = 0usize;
            // Rounds over all kinds, best per kind: a disturbance hits all alike.
            for _ in 0..2 * REPEATS {
                for (ki, (_, kind, hot)) in kinds.iter().enumerate() {
                    let t0 = Instant::now();
                    for _ in 0..16 {
                        let codes = &mats[if *hot { 0 } else { m % mats.len() }];
                        m += 1;
                        match *kind {
                            Kind::Old => old(&table, codes, rows, n, &mut y),
                            k => new(k, &table, codes, rows, n, &mut y),
                        }
                        black_box(&y);
                    }
                    best[ki] = best[ki].min(t0.elapsed());
                    // The row-lane kinds sum each row in order: exactly the plain sum.
                    let codes = &mats[if *hot { 0 } else { (m - 1) % mats.len() }];
                    for (r, w) in want.iter_mut().enumerate() {
                        *w = 0.0;
                        for j in 0..n {
                            *w += table[j * E + codes[r * n + j] as usize];
                        }
                    }
                    exact[ki] &= want == y;
                }
            }
            for (ki, (label, ..)) in kinds.iter().enumerate() {
                println!(
                    "{name:<18} {label:<36} {:>8.1} us/matrix  {}",
                    best[ki].as_secs_f64() / 16.0 * 1e6,
                    if exact[ki] {
                        "= in-order sum"
                    } else {
                        "(other order)"
                    }
                );
            }
        }
    }
}
