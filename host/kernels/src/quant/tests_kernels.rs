//! Kernel-level tests of `rvq4p`: every ISA path this CPU supports against
//! the portable reference (bit for bit), and against dequantise-then-f64
//! within the bound the int8 table rounding allows.

use super::expert::{build_gate_up_tables_on, expert_forward_on};
use super::kmeans::Rng;
use super::rvq4p::{self, QTables, ROWS, STAGES, TBLK};
use super::simd::{self, Isa};
use super::tests::{gauss, pool, ref_matvec, rel_err};
use super::*;

fn shape() -> ExpertShape {
    // 520 = 65 vectors: two full table blocks and a 1-vector tail; 72 rows
    // = two full row blocks and a short one.
    ExpertShape::new(520, 72)
}

fn layer(s: ExpertShape, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut rng = Rng::new(seed);
    let n = s.hidden * s.inter;
    (gauss(&mut rng, n, 0.05), gauss(&mut rng, n, 0.05), gauss(&mut rng, n, 0.05))
}

#[test]
fn rvq4p_codes_pack_and_unpack() {
    let mut rng = Rng::new(20);
    for (rows, nvec) in [(1, 1), (31, 3), (32, 2), (33, 5), (70, 4)] {
        let codes: Vec<u8> = (0..rows * nvec * STAGES).map(|_| rng.below(64) as u8).collect();
        let mut planes = vec![0xAAu8; rows.div_ceil(ROWS) * nvec * 3 * ROWS];
        rvq4p::pack_codes(&codes, rows, nvec, &mut planes);
        for r in 0..rows.div_ceil(ROWS) * ROWS {
            for v in 0..nvec {
                let got = rvq4p::row_codes(&planes, nvec, r, v);
                let want: [u8; 4] =
                    if r < rows { codes[(r * nvec + v) * STAGES..][..STAGES].try_into().unwrap() } else { [0; 4] };
                assert_eq!(got, want, "rows {rows} nvec {nvec} r {r} v {v}");
            }
        }
        let cols = nvec * 8;
        assert_eq!(rvq4p::mat_len(rows, cols), 2 * rows + planes.len());
    }
    // 3 bits per weight plus the row scale.
    assert_eq!(rvq4p::mat_len(1024, 2304), 1024 * 2 + 1024 * 2304 * 3 / 8);
}

/// Random planes and tables (extremes included), every supported level
/// against the scalar kernel, for 1-3 row blocks (the AVX-512 kernel pairs
/// blocks, so odd counts take its tail path).
#[test]
fn rvq4p_every_isa_is_bit_identical_to_scalar() {
    let levels = Isa::supported();
    eprintln!("rvq4p levels exercised: {:?}", levels);
    if levels.len() == 1 {
        crate::skip::report_skip("SKIP rvq4p SIMD comparison: this CPU runs only the scalar kernel");
    }
    let mut rng = Rng::new(21);
    for nvec in [1, 2, 31, 32, 33, 64, 65, 288] {
        for extreme in [None, Some(127i8), Some(-127i8)] {
            let mut t = QTables::with_len(nvec);
            for q in t.q.iter_mut() {
                *q = extreme.unwrap_or_else(|| (rng.below(255) as i32 - 127) as i8);
            }
            for (b, s) in t.scales.iter_mut().enumerate() {
                *s = if b == 1 { 0.0 } else { (rng.unit() as f32 + 0.01) * 0.03 };
            }
            for nb in 1..=3 {
                let planes: Vec<u8> = (0..nb * nvec * 3 * ROWS).map(|_| rng.below(256) as u8).collect();
                let mut want = vec![0f32; nb * ROWS];
                rvq4p::blocks(Isa::Scalar, &planes, &t, nvec, &mut want);
                for &isa in &levels {
                    let mut got = vec![f32::NAN; nb * ROWS];
                    rvq4p::blocks(isa, &planes, &t, nvec, &mut got);
                    let (gb, wb): (Vec<u32>, Vec<u32>) =
                        (got.iter().map(|v| v.to_bits()).collect(), want.iter().map(|v| v.to_bits()).collect());
                    assert_eq!(gb, wb, "{} nvec {nvec} blocks {nb} extreme {extreme:?}", isa.name());
                }
            }
        }
    }
}

/// The scalar kernel against a plain i64 sum of the decoded codes.
#[test]
fn rvq4p_scalar_kernel_matches_its_definition() {
    let mut rng = Rng::new(22);
    let nvec = 70;
    let mut t = QTables::with_len(nvec);
    for q in t.q.iter_mut() {
        *q = (rng.below(255) as i32 - 127) as i8;
    }
    for s in t.scales.iter_mut() {
        *s = rng.unit() as f32;
    }
    let planes: Vec<u8> = (0..nvec * 3 * ROWS).map(|_| rng.below(256) as u8).collect();
    let mut got = [0f32; ROWS];
    rvq4p::block_scalar(&planes, &t.q, &t.scales, nvec, &mut got);
    for (k, &g) in got.iter().enumerate() {
        let mut acc = 0f32;
        for (b, &ts) in t.scales.iter().enumerate() {
            let mut isum = 0i64;
            for v in b * TBLK..((b + 1) * TBLK).min(nvec) {
                for (s, &c) in rvq4p::row_codes(&planes, nvec, k, v).iter().enumerate() {
                    isum += t.q[v * 256 + s * 64 + c as usize] as i64;
                }
            }
            acc += isum as f32 * ts;
        }
        assert_eq!(g.to_bits(), acc.to_bits(), "row {k}");
    }
}

/// A real rvq4p matrix: the kernel's output differs from the decoded
/// weights times x by no more than the int8 table rounding allows, half a
/// table step per lookup: `|scale_r| * sum_b ts_b / 2 * 4 * vectors_b`.
#[test]
fn rvq4p_matvec_within_table_rounding_bound() {
    let s = shape();
    let (g, u, d) = layer(s, 23);
    let views = [ExpertF32 { gate: &g, up: &u, down: &d, biases: None }];
    let fmt = ExpertFormat::Rvq4p;
    let cb = fit_layer_codebooks(fmt, s, &views, 24).unwrap();
    assert_eq!((cb.gate_up.stages(), cb.gate_up.entries()), (4, 64));
    let payload = encode_expert(fmt, s, &views[0], Some(&cb));
    check_expert_payload(fmt, s, &payload, Some(&cb)).unwrap();
    let (gd, _, _) = decode_expert(fmt, s, &payload, Some(&cb));
    let gb = &payload[..rvq4p::mat_len(s.inter, s.hidden)];
    let mut rng = Rng::new(25);
    let x = gauss(&mut rng, s.hidden, 1.0);
    let mut ft = vec![0f32; s.hidden.div_ceil(8) * 4 * 64];
    simd::build_tables_generic(&x, cb.gate_up.cbt(), 4, 64, &mut ft);
    let mut t = QTables::with_len(s.hidden.div_ceil(8));
    t.quantize_from(&ft);
    let (want, mag) = ref_matvec(&gd, s.inter, s.hidden, &x);
    let nvec = s.hidden.div_ceil(8);
    let step: f64 = t
        .scales
        .iter()
        .enumerate()
        .map(|(b, &ts)| ts as f64 / 2.0 * 4.0 * (((b + 1) * TBLK).min(nvec) - b * TBLK) as f64)
        .sum();
    let mut worst = 0f64;
    for &isa in &Isa::supported() {
        let mut y = vec![0f32; s.inter];
        rvq4p::matvec(isa, gb, s.inter, s.hidden, &t, &mut y);
        for r in 0..s.inter {
            let sc = simd::f16_at(gb, r).abs() as f64;
            let bound = sc * step * 1.001 + 1e-5 * mag[r];
            let err = (y[r] as f64 - want[r]).abs();
            worst = worst.max(err / bound);
            assert!(err <= bound, "{} row {r}: {} vs {} (bound {bound})", isa.name(), y[r], want[r]);
        }
    }
    eprintln!("rvq4p matvec: worst error / rounding bound = {worst:.3}");
}

#[test]
fn rvq4p_expert_forward_is_bit_identical_on_every_isa_and_thread_count() {
    let s = shape();
    let (g, u, d) = layer(s, 26);
    let views = [ExpertF32 { gate: &g, up: &u, down: &d, biases: None }];
    let fmt = ExpertFormat::Rvq4p;
    let cb = fit_layer_codebooks(fmt, s, &views, 27).unwrap();
    let payload = encode_expert(fmt, s, &views[0], Some(&cb));
    let mut rng = Rng::new(28);
    let x = gauss(&mut rng, s.hidden, 1.0);
    let run = |isa: Isa, threads: usize| expert_output_bits(isa, threads, fmt, s, &payload, &cb, &x);
    let want = run(Isa::Scalar, 1);
    for &isa in &Isa::supported() {
        for threads in [1, 2, 3] {
            assert_eq!(run(isa, threads), want, "{} with {threads} threads", isa.name());
        }
    }
}

/// A NaN activation must not vanish in the int8 tables (it would silently
/// give finite logits).
#[test]
fn rvq4p_nan_activation_stays_nan() {
    let s = shape();
    let (g, u, d) = layer(s, 29);
    let views = [ExpertF32 { gate: &g, up: &u, down: &d, biases: None }];
    let fmt = ExpertFormat::Rvq4p;
    let cb = fit_layer_codebooks(fmt, s, &views, 30).unwrap();
    let payload = encode_expert(fmt, s, &views[0], Some(&cb));
    let mut x = vec![0.5f32; s.hidden];
    x[3] = f32::NAN;
    let tables = build_gate_up_tables(fmt, Some(&cb), &x);
    let mut scratch = ExpertScratch::new(fmt, s);
    let mut out = vec![0f32; s.hidden];
    expert_forward(fmt, s, &payload, Some(&cb), &tables, &x, &mut out, &mut scratch);
    assert!(out.iter().all(|v| v.is_nan()));
}

/// rvq4p weights decode like rvq3 does (same codebook search), with the
/// quality the table records: 4 x 64 sits between rvq2 and rvq3.
#[test]
fn rvq4p_codebooks_round_trip_through_bytes() {
    let s = shape();
    let (g, u, d) = layer(s, 31);
    let views = [ExpertF32 { gate: &g, up: &u, down: &d, biases: None }];
    let cb = fit_layer_codebooks(ExpertFormat::Rvq4p, s, &views, 32).unwrap();
    let bytes = cb.gate_up.to_bytes();
    assert_eq!(bytes.len(), 4 * 64 * 8 * 4);
    let back = Codebooks::from_bytes(4, &bytes).unwrap();
    assert_eq!(back.entries(), 64);
    assert_eq!(back.to_bytes(), bytes);
    // A 256-entry codebook set is refused for rvq4p payloads.
    let wide = fit_layer_codebooks(ExpertFormat::Rvq3, s, &views, 33).unwrap();
    let four =
        Codebooks::from_bytes(4, &[wide.gate_up.to_bytes(), wide.gate_up.to_bytes()[..256 * 32].to_vec()].concat())
            .unwrap();
    let layer = LayerCodebooks { gate_up: four.clone(), down: four };
    let n = expert_payload_len(ExpertFormat::Rvq4p, s);
    assert!(check_expert_payload(ExpertFormat::Rvq4p, s, &vec![0u8; n], Some(&layer)).is_err());
    let payload = encode_expert(ExpertFormat::Rvq4p, s, &views[0], Some(&cb));
    let (gd, _, _) = decode_expert(ExpertFormat::Rvq4p, s, &payload, Some(&cb));
    assert!(rel_err(&gd, &g) < 0.3);
}

/// The RVQ row kernel, over any chunk split of the positions, is
/// bit-identical to the plain in-order sum (`rvq_row_scalar`), also for row
/// counts that leave a partial group of 8 and position counts that leave a
/// partial word of 8.
#[test]
fn rvq_rows_any_chunking_is_bit_identical_to_the_sequential_sum() {
    let mut rng = Rng::new(34);
    for (rows, n) in [(1, 1), (3, 7), (8, 8), (9, 17), (16, 96), (21, 200), (64, 864), (17, 384)] {
        let table = gauss(&mut rng, n * 256, 1.0);
        let codes: Vec<u8> = (0..rows * n).map(|_| rng.below(256) as u8).collect();
        let want: Vec<u32> =
            (0..rows).map(|r| simd::rvq_row_scalar(&table, &codes[r * n..(r + 1) * n]).to_bits()).collect();
        for chunk in [1, 5, 16, 24, n] {
            let mut acc = vec![0f32; rows];
            for c0 in (0..n).step_by(chunk) {
                simd::rvq_rows(&table, &codes, n, c0, (c0 + chunk).min(n), &mut acc);
            }
            let got: Vec<u32> = acc.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "rows {rows} n {n} chunk {chunk}");
        }
    }
}

/// Table entries for the row-kernel tests: Gaussian, or (`edge`) mixed with
/// the values where float addition is delicate: signed zeros, subnormals,
/// the largest finite values (sums overflow to infinity), infinities of both
/// signs (their sum is NaN) and NaN.
fn kernel_table(rng: &mut Rng, len: usize, edge: bool) -> Vec<f32> {
    let mut t = gauss(rng, len, 1.0);
    if edge {
        const EDGE: [f32; 10] =
            [0.0, -0.0, 1e-45, -1e-45, 1.1e-38, f32::MAX, -f32::MAX, f32::INFINITY, f32::NEG_INFINITY, f32::NAN];
        for v in t.iter_mut() {
            if rng.below(4) == 0 {
                *v = EDGE[rng.below(EDGE.len())];
            }
        }
    }
    t
}

/// The plane-layout row kernel (AVX-512 where this CPU has it, and its
/// portable twin) against the scalar definition `rvq_row_scalar`, bit for
/// bit (a NaN only has to be a NaN: Rust leaves the sign and payload of a
/// NaN result unspecified, and two builds of the scalar loop here already
/// differ in it, since LLVM may swap an addition's operands): row counts around the 64-row lane groups and
/// 128-row blocks, position counts around the 16-position transpose, any
/// chunking, Gaussian and edge-value tables. The AVX2 level runs the
/// portable `rvq_rows` (no faster AVX2 formulation; docs/PERFORMANCE.md),
/// checked here too.
#[test]
fn rvq_rows_planes_every_isa_is_bit_identical_to_scalar() {
    let avx512 = simd::rvq_planes(Isa::Avx512);
    eprintln!("rvq3 plane kernel: AVX-512 {}", if avx512 { "exercised" } else { "absent" });
    // Only an x86-64 CPU without VBMI misses a comparison it could have
    // had; elsewhere (ARM under qemu in CI) there is no such kernel.
    if !avx512 && cfg!(target_arch = "x86_64") {
        crate::skip::report_skip("SKIP rvq3 AVX-512 comparison: this CPU lacks AVX-512 VBMI");
    }
    let mut rng = Rng::new(41);
    for (rows, n) in
        [(1, 1), (3, 7), (64, 16), (65, 17), (63, 15), (128, 33), (129, 96), (200, 50), (257, 40), (70, 864)]
    {
        for edge in [false, true] {
            let table = kernel_table(&mut rng, n * 256, edge);
            let codes: Vec<u8> = (0..rows * n).map(|_| rng.below(256) as u8).collect();
            let want: Vec<u32> =
                (0..rows).map(|r| nan_bits(simd::rvq_row_scalar(&table, &codes[r * n..(r + 1) * n]))).collect();
            let mut planes = table.clone();
            simd::tables_to_planes(&mut planes);
            let mut planes_ref = table.clone();
            simd::tables_to_planes_scalar(&mut planes_ref);
            assert_eq!(simd::table_bytes(&planes), simd::table_bytes(&planes_ref), "plane conversion, n {n}");
            for chunk in [1, 5, 16, 24, n] {
                let run = |f: &dyn Fn(usize, usize, &mut [f32])| -> Vec<u32> {
                    let mut acc = vec![0f32; rows];
                    for c0 in (0..n).step_by(chunk) {
                        f(c0, (c0 + chunk).min(n), &mut acc);
                    }
                    acc.iter().map(|v| nan_bits(*v)).collect()
                };
                let portable = run(&|c0, c1, a| simd::rvq_rows(&table, &codes, n, c0, c1, a));
                let twin = run(&|c0, c1, a| {
                    simd::rvq_rows_planes_scalar(simd::table_bytes(&planes_ref), &codes, n, c0, c1, a)
                });
                let best = run(&|c0, c1, a| simd::rvq_rows_planes(&planes, &codes, n, c0, c1, a));
                let ctx = format!("rows {rows} n {n} chunk {chunk} edge {edge}");
                assert_eq!(portable, want, "scalar/avx2 rvq_rows, {ctx}");
                assert_eq!(twin, want, "portable plane kernel, {ctx}");
                assert_eq!(best, want, "plane kernel (avx512 {avx512}), {ctx}");
            }
        }
    }
}

/// The bits of `v`, every NaN as the canonical quiet NaN.
fn nan_bits(v: f32) -> u32 {
    if v.is_nan() {
        f32::NAN.to_bits()
    } else {
        v.to_bits()
    }
}

/// rvq3 experts (and rvq2, the same kernel) at every forced level and
/// thread count: bit-identical, on a shape large enough for the matvec to
/// split into tasks (1024 rows of 2304 in gate/up, 2304 rows in down).
#[test]
fn rvq3_expert_forward_is_bit_identical_on_every_isa_and_thread_count() {
    let s = ExpertShape::new(2304, 1024);
    let (g, u, d) = layer(s, 35);
    let views = [ExpertF32 { gate: &g, up: &u, down: &d, biases: None }];
    for fmt in [ExpertFormat::Rvq3, ExpertFormat::Rvq2] {
        let cb = fit_layer_codebooks(fmt, s, &views, 36).unwrap();
        let payload = encode_expert(fmt, s, &views[0], Some(&cb));
        let mut rng = Rng::new(37);
        let x = gauss(&mut rng, s.hidden, 1.0);
        let run = |isa: Isa, threads: usize| expert_output_bits(isa, threads, fmt, s, &payload, &cb, &x);
        let want = run(Isa::Scalar, 1);
        assert!(want.iter().all(|&b| f32::from_bits(b).is_finite()));
        for &isa in &Isa::supported() {
            for threads in [1, 2, 3] {
                assert_eq!(run(isa, threads), want, "{} {} with {threads} threads", fmt.name(), isa.name());
            }
        }
    }
}

/// The rvq3 matvec (gate of a real encoded expert, 200 rows: one full task
/// of 128 and a partial one, with 1 and 2 threads) equals its definition:
/// per row, the in-order sum of the table entries its codes pick, times the
/// row's f16 scale.
#[test]
fn rvq3_matvec_is_the_in_order_table_sum() {
    let s = ExpertShape::new(264, 200);
    let (g, u, d) = layer(s, 38);
    let views = [ExpertF32 { gate: &g, up: &u, down: &d, biases: None }];
    let fmt = ExpertFormat::Rvq3;
    let cb = fit_layer_codebooks(fmt, s, &views, 39).unwrap();
    let payload = encode_expert(fmt, s, &views[0], Some(&cb));
    let mut rng = Rng::new(40);
    let x = gauss(&mut rng, s.hidden, 1.0);
    let tables = build_gate_up_tables_on(Isa::Scalar, fmt, Some(&cb), &x);
    let n = s.hidden.div_ceil(VDIM) * 3;
    let (scales, codes) = payload.split_at(2 * s.inter);
    for threads in [1, 2] {
        let mut y = vec![f32::NAN; s.inter];
        let gate = &payload[..2 * s.inter + s.inter * n];
        pool(threads)
            .install(|| super::expert::rvq_matvec_for_tests(gate, s.inter, s.hidden, 3, tables.data(), &mut y));
        for (r, &got) in y.iter().enumerate() {
            let want = simd::rvq_row_scalar(tables.data(), &codes[r * n..(r + 1) * n]) * simd::f16_at(scales, r);
            assert_eq!(got.to_bits(), want.to_bits(), "{threads} threads, row {r}");
        }
    }
}

/// One expert's output on ISA level `isa` in a pool of `threads`, as bits
/// (gate/up tables built inside the pool, as the store does).
fn expert_output_bits(
    isa: Isa,
    threads: usize,
    fmt: ExpertFormat,
    s: ExpertShape,
    payload: &[u8],
    cb: &LayerCodebooks,
    x: &[f32],
) -> Vec<u32> {
    pool(threads).install(|| {
        let tables = build_gate_up_tables_on(isa, fmt, Some(cb), x);
        let mut scratch = ExpertScratch::new(fmt, s);
        let mut out = vec![f32::NAN; s.hidden];
        expert_forward_on(isa, fmt, s, payload, Some(cb), &tables, x, &mut out, &mut scratch);
        out.iter().map(|v| v.to_bits()).collect()
    })
}

/// The portable fused multiply-add is the FMA instruction, bit for bit,
/// where this CPU has one to compare with: random operands of every
/// exponent, sums that cancel to a few bits (where a sum rounded twice
/// goes wrong), subnormal results, infinities and signed zeros. MinGW's
/// `fmaf` (what `mul_add` was on Windows) failed this by 12 ulps.
#[test]
fn fused_mul_add_is_the_fma_instruction() {
    #[cfg(target_arch = "x86_64")]
    let fma = if simd::has_avx2() {
        Some(|a: f32, b: f32, c: f32| {
            use std::arch::x86_64::*;
            // SAFETY: FMA was detected (with AVX2) on this CPU.
            unsafe { _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c))) }
        })
    } else {
        None
    };
    #[cfg(target_arch = "aarch64")]
    let fma = Some(|a: f32, b: f32, c: f32| a.mul_add(b, c));
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let fma: Option<fn(f32, f32, f32) -> f32> = None;
    let Some(fma) = fma else {
        crate::skip::report_skip("SKIP fused_mul_add comparison: this CPU has no FMA instruction");
        return;
    };
    let mut rng = Rng::new(77);
    let mut any = |scale: i32| {
        let m = (rng.unit() * 2.0 - 1.0) as f32;
        m * 2f32.powi(scale)
    };
    let mut cases: Vec<(f32, f32, f32)> = vec![
        (0.0, -1.0, 0.0),
        (-0.0, 1.0, -0.0),
        (f32::INFINITY, 1.0, -1.0),
        (f32::MAX, 2.0, -f32::MAX),
        (1e-30, 1e-15, 0.0),
        (f32::MIN_POSITIVE, 0.5, f32::MIN_POSITIVE * 0.25),
        (1.0 + f32::EPSILON, 1.0 - f32::EPSILON, -1.0),
    ];
    for k in 0..20_000 {
        let (ea, eb) = (k % 61 - 30, k % 37 - 18);
        let (a, b) = (any(ea), any(eb));
        let c = match k % 3 {
            0 => any(ea + eb),
            // A sum that cancels all but a few bits of the product.
            1 => -(a * b) * (1.0 + any(-20)),
            _ => any(ea + eb - 30),
        };
        cases.push((a, b, c));
    }
    for (a, b, c) in cases {
        let (got, want) = (simd::fused_mul_add(a, b, c), fma(a, b, c));
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "fma({a:e}, {b:e}, {c:e}): {got:e} != {want:e}"
        );
    }
}

/// `matmul_block` (its AVX2 kernel where the CPU has one) and
/// `BlockInputs::matmul_block` (its AVX-512 F kernel on paired inputs where
/// the CPU has one) give `dot8`'s bits for every pair on every tile shape:
/// partial tiles of rows and of inputs, an odd last input, columns past
/// whole vectors, one row against many inputs (a GGUF trunk matrix's
/// prefill before it ran in blocks of rows) and many rows against one.
#[test]
fn matmul_block_gives_the_bits_of_dot8_on_every_tile_shape() {
    let mut rng = Rng::new(91);
    for (nr, nt, cols) in
        [(9, 5, 7), (8, 3, 256), (8, 50, 511), (1, 100, 512), (5, 49, 1029), (4, 7, 2051), (13, 1, 4096), (6, 6, 16)]
    {
        let w = gauss(&mut rng, nr * cols, 0.05);
        let x = gauss(&mut rng, nt * cols, 1.0);
        let mut want = vec![0f32; nr * nt];
        simd::matmul_block_scalar(&w, &x, cols, &mut want);
        let mut got = vec![f32::NAN; nr * nt];
        simd::matmul_block(&w, &x, cols, &mut got);
        let mut prepared = vec![f32::NAN; nr * nt];
        simd::BlockInputs::new(&x, cols).matmul_block(&w, &mut prepared);
        for (what, got) in [("matmul_block", got), ("BlockInputs", prepared)] {
            for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    e.to_bits(),
                    "{what} {} {nr}x{nt}x{cols}: row {} input {}",
                    simd::isa().name(),
                    i / nt,
                    i % nt
                );
            }
        }
    }
}
