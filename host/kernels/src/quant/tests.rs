use super::kmeans::Rng;
#[cfg(target_arch = "x86_64")]
use super::simd;
use super::*;

pub(super) fn gauss(rng: &mut Rng, n: usize, std: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let u1 = rng.unit().max(1e-300);
            let u2 = rng.unit();
            ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32 * std
        })
        .collect()
}

/// Reference `W x` in f64 plus the per-row scale `sum |w x|` that bounds
/// the float error of any summation order.
pub(super) fn ref_matvec(w: &[f32], rows: usize, cols: usize, x: &[f32]) -> (Vec<f64>, Vec<f64>) {
    (0..rows)
        .map(|r| {
            let row = &w[r * cols..(r + 1) * cols];
            let dot = row.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>();
            let mag = row.iter().zip(x).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum::<f64>();
            (dot, mag)
        })
        .unzip()
}

fn assert_close(y: &[f32], want: &[f64], mag: &[f64], tol: f64, what: &str) {
    for (r, ((&a, &b), &m)) in y.iter().zip(want).zip(mag).enumerate() {
        let err = (a as f64 - b).abs();
        assert!(err <= tol * m + 1e-12, "{what}: row {r}: {a} vs {b} (|wx| {m})");
    }
}

/// rvq4p bounds of `quantisation_error_table`. Measured 0.1938 weight,
/// 0.3341 output (the output includes the int8 table rounding).
const RVQ4P_WEIGHT_ERR: f64 = 0.22;
const RVQ4P_OUTPUT_ERR: f64 = 0.38;

pub(super) fn pool(n: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new().num_threads(n).build().expect("thread pool")
}

const SHAPES: [(usize, usize); 6] = [(1, 1), (3, 128), (5, 300), (7, 17), (2, 129), (600, 256)];
const TRUNK: [TrunkFormat; 3] = [TrunkFormat::F32, TrunkFormat::Q8, TrunkFormat::Q4];

#[test]
fn format_names_and_codes_round_trip() {
    for f in TRUNK {
        assert_eq!(TrunkFormat::parse(f.name()), Some(f));
    }
    for f in ExpertFormat::ALL {
        assert_eq!(ExpertFormat::parse(f.name()), Some(f));
        assert_eq!(ExpertFormat::from_code(f.code()), Some(f));
    }
    assert_eq!(ExpertFormat::parse("q3"), None);
    assert_eq!(ExpertFormat::from_code(99), None);
    assert_eq!(TrunkFormat::Q4.byte_len(2, 129), 2 * 2 * 2 + 2 * 65);
    assert_eq!(TrunkFormat::Q8.byte_len(2, 129), 2 * 2 * 2 + 2 * 129);
    let s = ExpertShape::new(20, 12);
    assert_eq!(expert_payload_len(ExpertFormat::Rvq3, s), 2 * (12 * 2 + 12 * 3 * 3) + 20 * 2 + 20 * 2 * 3);
}

#[test]
fn trunk_matvec_matches_dequantised_reference() {
    let mut rng = Rng::new(1);
    for fmt in TRUNK {
        for (rows, cols) in SHAPES {
            let w = gauss(&mut rng, rows * cols, 0.05);
            let x = gauss(&mut rng, cols, 1.0);
            let bytes = quantize_trunk(fmt, &w, rows, cols);
            assert_eq!(bytes.len(), fmt.byte_len(rows, cols));
            let m = QMatrix::from_bytes(fmt, rows, cols, &bytes).unwrap();
            assert_eq!(m.byte_len(), bytes.len());
            let deq = m.dequantize();
            if fmt == TrunkFormat::F32 {
                assert_eq!(deq, w);
            }
            let mut y = vec![0f32; rows];
            m.matvec(&x, &mut y);
            // q4 products see the input rounded to int8 per group.
            let seen = if fmt == TrunkFormat::Q4 { crate::quant::int8::rounded(&x, cols) } else { x.clone() };
            let (want, mag) = ref_matvec(&deq, rows, cols, &seen);
            assert_close(&y, &want, &mag, 1e-5, fmt.name());
            let mut row = vec![0f32; cols];
            for r in 0..rows {
                m.row(r, &mut row);
                assert_eq!(row, deq[r * cols..(r + 1) * cols]);
            }
        }
    }
}

#[test]
fn trunk_quantisation_error_is_small() {
    let mut rng = Rng::new(2);
    let (rows, cols) = (64, 300);
    let w = gauss(&mut rng, rows * cols, 0.05);
    for (fmt, limit) in [(TrunkFormat::Q8, 0.01), (TrunkFormat::Q4, 0.12)] {
        let m = QMatrix::from_bytes(fmt, rows, cols, &quantize_trunk(fmt, &w, rows, cols)).unwrap();
        let e = rel_err(&m.dequantize(), &w);
        assert!(e < limit, "{}: {e}", fmt.name());
    }
}

#[test]
fn malformed_lengths_are_errors() {
    for fmt in TRUNK {
        let n = fmt.byte_len(3, 130);
        for len in [0, n - 1, n + 1] {
            assert!(QMatrix::from_bytes(fmt, 3, 130, &vec![0u8; len]).is_err());
        }
        assert!(QMatrix::from_bytes(fmt, 3, 130, &vec![0u8; n]).is_ok());
        assert!(QMatrix::from_bytes(fmt, usize::MAX, 3, &[0u8; 16]).is_err());
    }
    let per = 256 * 8 * 4;
    assert!(Codebooks::from_bytes(0, &[]).is_err());
    assert!(Codebooks::from_bytes(3, &vec![0u8; 3 * per - 1]).is_err());
    assert!(Codebooks::from_bytes(1000, &vec![0u8; 1000 * per]).is_err());
    let mut nan = vec![0u8; per];
    nan[..4].copy_from_slice(&f32::NAN.to_le_bytes());
    assert!(Codebooks::from_bytes(1, &nan).is_err());
    let cb = Codebooks::from_bytes(2, &vec![0u8; 2 * per]).unwrap();
    assert_eq!(cb.to_bytes().len(), 2 * per);
    let layer = LayerCodebooks { gate_up: cb.clone(), down: cb };
    let s = ExpertShape::new(16, 8);
    for fmt in ExpertFormat::ALL {
        let n = expert_payload_len(fmt, s);
        let cbo = fmt.uses_codebooks().then_some(&layer);
        assert!(check_expert_payload(fmt, s, &vec![0u8; n + 1], cbo).is_err());
        assert!(check_expert_payload(fmt, s, &vec![0u8; n - 1], cbo).is_err());
        let ok = check_expert_payload(fmt, s, &vec![0u8; n], cbo);
        // The layer above has 2 stages of 256 entries: only rvq2 fits.
        assert_eq!(ok.is_ok(), !matches!(fmt, ExpertFormat::Rvq3 | ExpertFormat::Rvq4p), "{}", fmt.name());
        if fmt.uses_codebooks() {
            assert!(check_expert_payload(fmt, s, &vec![0u8; n], None).is_err());
        }
    }
    let huge = ExpertShape::new(usize::MAX / 2, 3);
    assert!(check_expert_payload(ExpertFormat::Q8, huge, &[0u8; 8], None).is_err());
}

/// The SIMD kernels of this machine's ISA against their scalar twins: the
/// dot products to rounding (they fuse and reorder), the table build bit
/// for bit.
#[test]
fn simd_matches_scalar() {
    #[cfg(target_arch = "x86_64")]
    if !simd::has_avx2() {
        crate::skip::report_skip("SKIP simd_matches_scalar: no AVX2+FMA on this CPU");
        return;
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        crate::skip::report_skip("SKIP simd_matches_scalar: no SIMD kernels for this architecture");
        return;
    }
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    simd_against_scalar();
}

/// The multi-input q8/q4 row dots give every input the single-input
/// kernel's bits, on the AVX2 tiles of 4 and on the AVX-512VL tiles of 8
/// (called directly, so both run on one CPU), whole and partial tiles,
/// odd widths, partial groups and tails.
#[cfg(target_arch = "x86_64")]
#[test]
fn multi_input_dots_equal_the_single_input_kernel_on_every_level() {
    use crate::quant::simd::avx2;
    if !simd::has_avx2() {
        crate::skip::report_skip("SKIP multi-input dots: no AVX2+FMA on this CPU");
        return;
    }
    let wide = is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vl");
    if !wide {
        crate::skip::report_skip("SKIP multi-input dots, tiles of 8: this CPU lacks AVX-512VL");
    }
    let mut rng = Rng::new(47);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    for cols in [7, 16, 128, 129, 300] {
        let w = gauss(&mut rng, cols, 0.1);
        let bytes = quantize_trunk(TrunkFormat::Q8, &w, 1, cols);
        let (scales, q) = bytes.split_at(2 * cols.div_ceil(GROUP));
        for n in [1, 3, 4, 5, 8, 9, 17] {
            let x = gauss(&mut rng, n * cols, 1.0);
            // SAFETY (all calls): AVX2 and FMA detected above (AVX-512F
            // and VL for the wide kernel); `q` and `scales` are one row
            // of `cols`, `x` holds n rows and the outputs n floats.
            let want: Vec<f32> = x.chunks_exact(cols).map(|xt| unsafe { avx2::dot_q8(scales, q, xt) }).collect();
            let mut got = vec![f32::NAN; n];
            unsafe { avx2::dot_q8_rows(scales, q, cols, &x, &mut got) }
            assert_eq!(bits(&got), bits(&want), "cols {cols} n {n}: tiles of 4");
            if wide {
                let mut got = vec![f32::NAN; n];
                unsafe { avx2::dot_q8_rows_wide(scales, q, cols, &x, &mut got) }
                assert_eq!(bits(&got), bits(&want), "cols {cols} n {n}: tiles of 8");
            }
        }
    }
}

/// A q8 matvec's rows several at a time (`dot_q8_many_rows`) give each row the one-row kernel's bits: whole and
/// partial passes, odd widths, partial groups and tails.
#[cfg(target_arch = "x86_64")]
#[test]
fn q8_rows_several_at_a_time_equal_the_one_row_kernel() {
    use crate::quant::simd::avx2;
    if !simd::has_avx2() {
        crate::skip::report_skip("SKIP q8 rows several at a time: no AVX2+FMA on this CPU");
        return;
    }
    let mut rng = Rng::new(53);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    for cols in [7, 16, 24, 128, 129, 300, 2304] {
        for rows in [1, 3, 4, 5, 8, 9, 17] {
            let w = gauss(&mut rng, rows * cols, 0.1);
            let bytes = quantize_trunk(TrunkFormat::Q8, &w, rows, cols);
            let (scales, q) = bytes.split_at(rows * 2 * cols.div_ceil(GROUP));
            let g2 = 2 * cols.div_ceil(GROUP);
            let x = gauss(&mut rng, cols, 1.0);
            // SAFETY (all calls): AVX2 and FMA detected above; `q` and
            // `scales` hold `rows` rows
            // of `cols`, `x` one input and the outputs `rows` floats.
            let want: Vec<f32> = (0..rows)
                .map(|r| unsafe { avx2::dot_q8(&scales[r * g2..(r + 1) * g2], &q[r * cols..(r + 1) * cols], &x) })
                .collect();
            let mut got = vec![f32::NAN; rows];
            unsafe { avx2::dot_q8_many_rows(scales, q, cols, &x, &mut got) }
            assert_eq!(bits(&got), bits(&want), "cols {cols} rows {rows}");
            let mut got = vec![f32::NAN; rows];
            simd::dot_q8_many_rows(scales, q, &x, &mut got);
            let one: Vec<f32> = (0..rows)
                .map(|r| simd::dot_q8(&scales[r * g2..(r + 1) * g2], &q[r * cols..(r + 1) * cols], &x))
                .collect();
            assert_eq!(bits(&got), bits(&one), "cols {cols} rows {rows}: dispatched");
        }
    }
}

/// The kernels `simd_matches_scalar` holds to their scalar twins.
#[cfg(target_arch = "x86_64")]
mod level {
    pub(super) use crate::quant::simd::avx2::{build_tables, dot_f32, dot_q8};
}
#[cfg(target_arch = "aarch64")]
mod level {
    pub(super) use crate::quant::simd::neon::{build_tables, dot_f32, dot_q8};
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn simd_against_scalar() {
    let mut rng = Rng::new(3);
    let close = |a: f32, b: f32, mag: f32| (a - b).abs() <= 1e-5 * mag + 1e-6;
    for cols in [1, 7, 8, 15, 16, 17, 31, 127, 128, 129, 255, 300, 1000] {
        let w = gauss(&mut rng, cols, 1.0);
        let x = gauss(&mut rng, cols, 1.0);
        let mag: f32 = w.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum();
        // SAFETY: the level's ISA was detected (AVX2+FMA checked by the
        // caller; NEON is the aarch64 baseline); lengths are equal.
        let (a, b) = (simd::dot_f32_scalar(&w, &x), unsafe { level::dot_f32(&w, &x) });
        assert!(close(a, b, mag), "f32 {cols}: {a} {b}");
        let bytes = quantize_trunk(TrunkFormat::Q8, &w, 1, cols);
        let (sc, q) = bytes.split_at(2 * cols.div_ceil(GROUP));
        // SAFETY: as above; lengths from the layout.
        let (a, b) = (simd::dot_q8_scalar(sc, q, &x), unsafe { level::dot_q8(sc, q, &x) });
        assert!(close(a, b, mag * 2.0), "q8 {cols}: {a} {b}");
    }
    for (stages, len, e) in [(3, 20, 256), (2, 64, 256), (4, 72, 64)] {
        let cbt = gauss(&mut rng, stages * 8 * e, 1.0);
        let x = gauss(&mut rng, len, 1.0);
        let mut a = vec![0f32; len.div_ceil(8) * stages * e];
        let mut b = a.clone();
        simd::build_tables_generic(&x, &cbt, stages, e, &mut a);
        // SAFETY: as above; lengths as build_tables requires.
        unsafe { level::build_tables(&x, &cbt, stages, e, &mut b) };
        assert_eq!(a, b);
    }
}

pub(super) fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(&x, &y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|&y| (y as f64).powi(2)).sum();
    (num / den.max(1e-300)).sqrt()
}

fn silu64(v: f64) -> f64 {
    v / (1.0 + (-v).exp())
}

/// f64 SwiGLU on f32 weights, plus the magnitude bound of each output row.
/// The expert in f64 on its decoded weights; `seen` rounds each product's
/// input as the format's kernels see it (q4: int8 per group).
fn ref_expert(g: &[f32], u: &[f32], d: &[f32], s: ExpertShape, x: &[f32], fmt: ExpertFormat) -> (Vec<f64>, Vec<f64>) {
    let seen = |v: &[f32]| if fmt == ExpertFormat::Q4 { crate::quant::int8::rounded(v, v.len()) } else { v.to_vec() };
    let x = seen(x);
    let (gx, _) = ref_matvec(g, s.inter, s.hidden, &x);
    let (ux, _) = ref_matvec(u, s.inter, s.hidden, &x);
    let h: Vec<f32> = gx.iter().zip(&ux).map(|(&a, &b)| (silu64(a) * b) as f32).collect();
    ref_matvec(d, s.hidden, s.inter, &seen(&h))
}

struct Layer {
    w: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)>,
}

impl Layer {
    fn gaussian(shape: ExpertShape, experts: usize, seed: u64) -> Layer {
        let mut rng = Rng::new(seed);
        let n = shape.hidden * shape.inter;
        let w = (0..experts)
            .map(|_| (gauss(&mut rng, n, 0.05), gauss(&mut rng, n, 0.05), gauss(&mut rng, n, 0.05)))
            .collect();
        Layer { w }
    }
    fn views(&self) -> Vec<ExpertF32<'_>> {
        self.w.iter().map(|(g, u, d)| ExpertF32 { gate: g, up: u, down: d, biases: None }).collect()
    }
}

fn forward(fmt: ExpertFormat, s: ExpertShape, payload: &[u8], cb: Option<&LayerCodebooks>, x: &[f32]) -> Vec<f32> {
    let tables = build_gate_up_tables(fmt, cb, x);
    let mut scratch = ExpertScratch::new(fmt, s);
    let mut out = vec![f32::NAN; s.hidden];
    expert_forward(fmt, s, payload, cb, &tables, x, &mut out, &mut scratch);
    out
}

#[test]
fn expert_forward_matches_decoded_reference() {
    for (shape, experts) in [
        (ExpertShape::new(20, 12), 1),
        (ExpertShape::new(16, 8), 2),
        (ExpertShape::new(130, 72), 3),
        (ExpertShape::new(512, 256), 1),
    ] {
        let layer = Layer::gaussian(shape, experts, 4);
        let views = layer.views();
        let mut rng = Rng::new(5);
        for fmt in ExpertFormat::ALL {
            let cb = fit_layer_codebooks(fmt, shape, &views, 7);
            assert_eq!(cb.is_some(), fmt.uses_codebooks());
            let payload = encode_expert(fmt, shape, &views[0], cb.as_ref());
            check_expert_payload(fmt, shape, &payload, cb.as_ref()).unwrap();
            let (g, u, d) = decode_expert(fmt, shape, &payload, cb.as_ref());
            if fmt == ExpertFormat::F32 {
                assert_eq!((&g, &u, &d), (&layer.w[0].0, &layer.w[0].1, &layer.w[0].2));
            }
            let x = gauss(&mut rng, shape.hidden, 1.0);
            let out = forward(fmt, shape, &payload, cb.as_ref(), &x);
            let (want, mag) = ref_expert(&g, &u, &d, shape, &x, fmt);
            // The activation carries the gate/up rounding into down, hence
            // a bound a little above the single-matvec one; for q4 a last-bit
            // difference there can move one code of down's input by a step.
            // rvq4p also rounds its lookup tables to int8 (bounded in
            // tests_kernels.rs).
            let tol = match fmt {
                ExpertFormat::Rvq4p => 0.03,
                ExpertFormat::Q4 => 3e-4,
                _ => 3e-5,
            };
            assert_close(&out, &want, &mag, tol, fmt.name());
            // Misaligned payloads (f32 view falls back to a copy) agree.
            let mut shifted = vec![0u8; payload.len() + 1];
            shifted[1..].copy_from_slice(&payload);
            assert_eq!(forward(fmt, shape, &shifted[1..], cb.as_ref(), &x), out);
        }
    }
}

/// gpt-oss's experts: biases stored after the matrices in every format
/// (exact, whatever the format), added before the clamped SwiGLU and after
/// down, against an f64 reference on the decoded weights; inputs large
/// enough that both clamps fire.
#[test]
fn biased_clamped_swiglu_expert_matches_decoded_reference() {
    let act = Activation::ClampedSwiglu { alpha: 1.702, limit: 7.0 };
    let shape = ExpertShape { biases: true, ..ExpertShape::new(130, 72) };
    let plain = ExpertShape::new(130, 72);
    let mut rng = Rng::new(31);
    let n = shape.hidden * shape.inter;
    let (g, u, d) = (gauss(&mut rng, n, 0.7), gauss(&mut rng, n, 0.7), gauss(&mut rng, n, 0.05));
    let (bg, bu, bd) =
        (gauss(&mut rng, shape.inter, 0.5), gauss(&mut rng, shape.inter, 0.5), gauss(&mut rng, shape.hidden, 0.5));
    let view = ExpertF32 { gate: &g, up: &u, down: &d, biases: Some([&bg, &bu, &bd]) };
    let x = gauss(&mut rng, shape.hidden, 1.0);
    let mut clamped = (0, 0);
    for fmt in ExpertFormat::ALL {
        let cb = fit_layer_codebooks(fmt, shape, &[view], 7);
        let payload = encode_expert(fmt, shape, &view, cb.as_ref());
        assert_eq!(payload.len(), expert_payload_len(fmt, plain) + 4 * (2 * shape.inter + shape.hidden));
        check_expert_payload(fmt, shape, &payload, cb.as_ref()).unwrap();
        assert_eq!(decode_expert_biases(fmt, shape, &payload), Some([bg.clone(), bu.clone(), bd.clone()]));
        let (gd, ud, dd) = decode_expert(fmt, shape, &payload, cb.as_ref());
        // q4 products see their inputs rounded to int8 per group.
        let seen =
            |v: &[f32]| if fmt == ExpertFormat::Q4 { crate::quant::int8::rounded(v, v.len()) } else { v.to_vec() };
        let (gx, _) = ref_matvec(&gd, shape.inter, shape.hidden, &seen(&x));
        let (ux, _) = ref_matvec(&ud, shape.inter, shape.hidden, &seen(&x));
        let h: Vec<f32> = (0..shape.inter)
            .map(|r| {
                let (gate, up) = (gx[r] + bg[r] as f64, ux[r] + bu[r] as f64);
                clamped.0 += (gate > 7.0) as usize;
                clamped.1 += (up.abs() > 7.0) as usize;
                let (g, u) = (gate.min(7.0), up.clamp(-7.0, 7.0));
                ((u + 1.0) * g / (1.0 + (-1.702 * g).exp())) as f32
            })
            .collect();
        let (want, mag) = ref_matvec(&dd, shape.hidden, shape.inter, &seen(&h));
        let want: Vec<f64> = want.iter().zip(&bd).map(|(w, b)| w + *b as f64).collect();
        let tables = build_gate_up_tables(fmt, cb.as_ref(), &x);
        let mut scratch = ExpertScratch::new(fmt, shape);
        let mut out = vec![f32::NAN; shape.hidden];
        expert_forward_act(fmt, shape, &payload, cb.as_ref(), &tables, &x, &mut out, &mut scratch, act);
        let tol = if fmt == ExpertFormat::Rvq4p { 0.05 } else { 1e-4 };
        assert_close(&out, &want, &mag, tol, fmt.name());
    }
    assert!(clamped.0 > 0 && clamped.1 > 0, "the inputs must reach both clamps: {clamped:?}");
}

/// A chunk's tokens through one expert at once (`expert_forward_batch`)
/// give, token by token, the bits of that token's batch alone, and those of
/// `expert_forward_act` in every format but rvq3 and rvq2, whose batch
/// (`rvq_dense`) is within f32 rounding of the walk: 100 tokens (both of
/// `matvec_many`'s task splits, whole and partial tiles), 5 tokens, one
/// token; with biases and a clamped activation too; odd widths with
/// partial groups and tails.
#[test]
fn expert_batch_is_bit_identical_to_each_token_alone() {
    let clamped = Activation::ClampedSwiglu { alpha: 1.702, limit: 7.0 };
    let biased = ExpertShape { biases: true, ..ExpertShape::new(130, 72) };
    let mut rng = Rng::new(41);
    for (shape, act) in [
        (ExpertShape::new(130, 72), Activation::Silu),
        (biased, clamped),
        (ExpertShape::new(301, 45), Activation::Silu),
    ] {
        let n = shape.hidden * shape.inter;
        let (g, u, d) = (gauss(&mut rng, n, 0.05), gauss(&mut rng, n, 0.05), gauss(&mut rng, n, 0.05));
        let b =
            [gauss(&mut rng, shape.inter, 0.5), gauss(&mut rng, shape.inter, 0.5), gauss(&mut rng, shape.hidden, 0.5)];
        let biases = shape.biases.then(|| [&b[0][..], &b[1][..], &b[2][..]]);
        let view = ExpertF32 { gate: &g, up: &u, down: &d, biases };
        for fmt in ExpertFormat::ALL {
            let cb = fit_layer_codebooks(fmt, shape, &[view], 7);
            let payload = encode_expert(fmt, shape, &view, cb.as_ref());
            let mut scratch = ExpertBatchScratch::new(fmt, shape);
            let mut one = ExpertScratch::new(fmt, shape);
            for tokens in [100, 5, 1] {
                let xs = gauss(&mut rng, tokens * shape.hidden, 1.0);
                let mut batch = vec![f32::NAN; xs.len()];
                expert_forward_batch(fmt, shape, &payload, cb.as_ref(), &xs, &mut batch, &mut scratch, act);
                for (t, (x, row)) in xs.chunks_exact(shape.hidden).zip(batch.chunks_exact(shape.hidden)).enumerate() {
                    let mut single = vec![f32::NAN; shape.hidden];
                    expert_forward_batch(fmt, shape, &payload, cb.as_ref(), x, &mut single, &mut scratch, act);
                    assert_eq!(
                        bits(&single),
                        bits(row),
                        "{} of {tokens} tokens: token {t}'s batch differs",
                        fmt.name()
                    );
                    let tables = build_gate_up_tables(fmt, cb.as_ref(), x);
                    let mut alone = vec![f32::NAN; shape.hidden];
                    expert_forward_act(fmt, shape, &payload, cb.as_ref(), &tables, x, &mut alone, &mut one, act);
                    if matches!(fmt, ExpertFormat::Rvq3 | ExpertFormat::Rvq2) {
                        let top = alone.iter().fold(0f32, |m, v| m.max(v.abs()));
                        let worst = alone.iter().zip(row).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                        assert!(worst <= 1e-5 * top, "{} token {t}: |batch - walk| {worst} of {top}", fmt.name());
                    } else {
                        assert_eq!(bits(&alone), bits(row), "{} of {tokens} tokens: token {t} differs", fmt.name());
                    }
                }
            }
        }
    }
}

/// `matvec_many` is `matvec` per input, bit for bit, in every trunk
/// format, on both task splits, whole and partial tiles, odd widths.
#[test]
fn matvec_many_is_bit_identical_to_matvec_per_input() {
    let mut rng = Rng::new(43);
    for (rows, cols, n) in [(3, 300, 1), (20, 129, 5), (17, 64, 70), (40, 257, 100), (6, 23, 7), (300, 128, 3)] {
        let w = gauss(&mut rng, rows * cols, 0.1);
        let x = gauss(&mut rng, n * cols, 1.0);
        for fmt in TRUNK {
            let m = if fmt == TrunkFormat::F32 {
                QMatrix::from_f32(w.clone(), rows, cols)
            } else {
                QMatrix::from_byte_vec(fmt, rows, cols, quantize_trunk(fmt, &w, rows, cols)).unwrap()
            };
            let mut many = vec![f32::NAN; n * rows];
            m.matvec_many(&x, &mut many);
            let mut one = vec![f32::NAN; rows];
            for (t, xt) in x.chunks_exact(cols).enumerate() {
                m.matvec(xt, &mut one);
                assert_eq!(bits(&one), bits(&many[t * rows..(t + 1) * rows]), "{fmt:?} {rows}x{cols} n={n} input {t}");
            }
        }
    }
}

/// Matrices sharing their inputs (`matvec_many_each`: q, k and v) give each
/// output the bits of its own `matvec_many`: q4 sharing int8 inputs, GGUF
/// Q4_K, Q5_K, Q6_K and IQ4_XS sharing int16 ones, and mixed formats or widths each on
/// its own.
#[test]
fn matvec_many_each_gives_each_matrix_its_own_bits() {
    let mut rng = Rng::new(44);
    let cols = 512;
    let random_blocks = |ty: GgmlType, rows: usize, rng: &mut Rng| {
        let mut b: Vec<u8> = (0..ty.matrix_bytes(rows, cols).unwrap()).map(|_| rng.below(256) as u8).collect();
        let d = half::f16::from_f32(1e-3).to_le_bytes();
        let at: &[usize] = if ty == GgmlType::Q6K { &[208] } else { &[0, 2] };
        for block in b.chunks_exact_mut(ty.block_bytes()) {
            for &i in at {
                block[i..i + 2].copy_from_slice(&d);
            }
        }
        QMatrix::from_byte_vec(TrunkFormat::Ggml(ty), rows, cols, b).unwrap()
    };
    let quantised = |fmt: TrunkFormat, rows: usize, cols: usize, rng: &mut Rng| {
        let w = gauss(rng, rows * cols, 0.1);
        QMatrix::from_byte_vec(fmt, rows, cols, quantize_trunk(fmt, &w, rows, cols)).unwrap()
    };
    let sets: Vec<Vec<QMatrix>> = vec![
        vec![quantised(TrunkFormat::Q4, 70, cols, &mut rng), quantised(TrunkFormat::Q4, 16, cols, &mut rng)],
        vec![random_blocks(GgmlType::Q4K, 40, &mut rng), random_blocks(GgmlType::Q6K, 24, &mut rng)],
        vec![quantised(TrunkFormat::Q8, 30, cols, &mut rng), quantised(TrunkFormat::Q4, 30, cols, &mut rng)],
    ];
    for n in [1, 3, 9] {
        let x = gauss(&mut rng, n * cols, 1.0);
        for set in &sets {
            let mut outs: Vec<Vec<f32>> = set.iter().map(|m| vec![f32::NAN; n * m.rows()]).collect();
            let mut each: Vec<(&QMatrix, &mut [f32])> =
                set.iter().zip(outs.iter_mut()).map(|(m, y)| (m, y.as_mut_slice())).collect();
            QMatrix::matvec_many_each(&mut each, &x);
            for (m, got) in set.iter().zip(&outs) {
                let mut want = vec![f32::NAN; n * m.rows()];
                m.matvec_many(&x, &mut want);
                assert_eq!(bits(got), bits(&want), "{} {}x{cols}, {n} inputs", m.format().name(), m.rows());
            }
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn results_do_not_depend_on_thread_count() {
    let mut rng = Rng::new(6);
    let (rows, cols) = (700, 300);
    let w = gauss(&mut rng, rows * cols, 0.05);
    let x = gauss(&mut rng, cols, 1.0);
    for fmt in TRUNK {
        let run = |n| {
            pool(n).install(|| {
                let bytes = quantize_trunk(fmt, &w, rows, cols);
                let m = QMatrix::from_bytes(fmt, rows, cols, &bytes).unwrap();
                let mut y = vec![0f32; rows];
                m.matvec(&x, &mut y);
                (bytes, y)
            })
        };
        assert_eq!(run(1), run(2), "{}", fmt.name());
    }
    let shape = ExpertShape::new(512, 256);
    let layer = Layer::gaussian(shape, 2, 8);
    let views = layer.views();
    let x = gauss(&mut rng, shape.hidden, 1.0);
    for fmt in [ExpertFormat::Rvq3, ExpertFormat::Rvq4p, ExpertFormat::Q4, ExpertFormat::F32] {
        let run = |n| {
            pool(n).install(|| {
                let cb = fit_layer_codebooks(fmt, shape, &views, 9);
                let payload = encode_expert(fmt, shape, &views[1], cb.as_ref());
                let out = forward(fmt, shape, &payload, cb.as_ref(), &x);
                let cbb = cb.map(|c| (c.gate_up.to_bytes(), c.down.to_bytes()));
                (cbb, payload, out)
            })
        };
        assert!(run(1) == run(2), "{}", fmt.name());
    }
}

#[test]
fn fit_handles_fewer_vectors_than_entries() {
    let shape = ExpertShape::new(16, 8);
    let layer = Layer::gaussian(shape, 1, 10);
    let views = layer.views();
    let cb = fit_layer_codebooks(ExpertFormat::Rvq2, shape, &views, 1).unwrap();
    let p = encode_expert(ExpertFormat::Rvq2, shape, &views[0], Some(&cb));
    let (g, u, d) = decode_expert(ExpertFormat::Rvq2, shape, &p, Some(&cb));
    // 32 gate/up and 16 down vectors each get an entry of their own: only
    // the f16 scale rounding is left.
    assert!(rel_err(&g, &layer.w[0].0) < 2e-3);
    assert!(rel_err(&u, &layer.w[0].1) < 2e-3);
    assert!(rel_err(&d, &layer.w[0].2) < 2e-3);
    let zero = vec![0f32; 16 * 8];
    let z = ExpertF32 { gate: &zero, up: &zero, down: &zero, biases: None };
    let p = encode_expert(ExpertFormat::Rvq2, shape, &z, Some(&cb));
    let out = forward(ExpertFormat::Rvq2, shape, &p, Some(&cb), &[1.0; 16]);
    assert!(out.iter().all(|&v| v == 0.0));
}

/// Measured quantisation error on Gaussian weights (hidden 256, inter 128,
/// 4 experts fitted together, expert 0 measured). Thresholds sit a margin
/// above the measurement; run with `--nocapture` for the table.
#[test]
fn quantisation_error_table() {
    let shape = ExpertShape::new(256, 128);
    let layer = Layer::gaussian(shape, 4, 11);
    let views = layer.views();
    let mut rng = Rng::new(12);
    let xs: Vec<Vec<f32>> = (0..8).map(|_| gauss(&mut rng, shape.hidden, 1.0)).collect();
    let f32p = encode_expert(ExpertFormat::F32, shape, &views[0], None);
    let refs: Vec<Vec<f32>> = xs.iter().map(|x| forward(ExpertFormat::F32, shape, &f32p, None, x)).collect();
    eprintln!("format  weight_rel_err  output_rel_err");
    for (fmt, wmax, omax) in [
        (ExpertFormat::F32, 0.0, 0.0),
        // Measured: q8 0.0064/0.0101, q4 0.0986/0.1691, rvq3 0.1709/0.2930,
        // rvq2 0.3048/0.5074 (weight/output).
        (ExpertFormat::Q8, 0.008, 0.013),
        (ExpertFormat::Q4, 0.115, 0.20),
        (ExpertFormat::Rvq3, 0.20, 0.34),
        (ExpertFormat::Rvq2, 0.35, 0.58),
        (ExpertFormat::Rvq4p, RVQ4P_WEIGHT_ERR, RVQ4P_OUTPUT_ERR),
    ] {
        let cb = fit_layer_codebooks(fmt, shape, &views, 13);
        let p = encode_expert(fmt, shape, &views[0], cb.as_ref());
        let (g, u, d) = decode_expert(fmt, shape, &p, cb.as_ref());
        let orig: Vec<f32> = [&layer.w[0].0[..], &layer.w[0].1[..], &layer.w[0].2[..]].concat();
        let we = rel_err(&[g, u, d].concat(), &orig);
        let out: Vec<f32> = xs.iter().flat_map(|x| forward(fmt, shape, &p, cb.as_ref(), x)).collect();
        let oe = rel_err(&out, &refs.concat());
        eprintln!("{:6}  {:14.4}  {:14.4}", fmt.name(), we, oe);
        assert!(we <= wmax && oe <= omax, "{}: weight {we} output {oe}", fmt.name());
    }
}
