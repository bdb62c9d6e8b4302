use std::path::PathBuf;

use super::*;
use crate::quant::simd::dot8_scalar;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/ggml_blocks")
}

struct Fixture {
    ty: GgmlType,
    blocks: Vec<u8>,
    values: Vec<f32>,
}

/// Every type of tests/fixtures/ggml_blocks/manifest.json, its table entry
/// checked against gguf-py's `GGML_QUANT_SIZES` on the way.
fn fixtures() -> Vec<Fixture> {
    let text = std::fs::read_to_string(dir().join("manifest.json")).unwrap();
    let mut out = Vec::new();
    // The manifest is flat JSON written by tests/gen_ggml_blocks.py; the
    // kernels crate has no JSON parser, so read the few fields by hand.
    for entry in text.split("\"name\": \"").skip(1) {
        let name = &entry[..entry.find('"').unwrap()];
        let field = |key: &str| -> usize {
            let at = entry.find(&format!("\"{key}\": ")).unwrap() + key.len() + 4;
            entry[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
        };
        let ty = GgmlType::ALL.into_iter().find(|t| t.name() == name).unwrap_or_else(|| panic!("no type {name}"));
        assert_eq!(ty.code() as usize, field("code"), "{name}: code");
        assert_eq!(ty.block_elems(), field("block_elems"), "{name}: block_elems");
        assert_eq!(ty.block_bytes(), field("block_bytes"), "{name}: block_bytes");
        let stem = name.to_lowercase();
        let blocks = std::fs::read(dir().join(format!("{stem}.blocks"))).unwrap();
        let values = std::fs::read(dir().join(format!("{stem}.f32")))
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        out.push(Fixture { ty, blocks, values });
    }
    assert_eq!(out.len(), GgmlType::ALL.len(), "types in {}", dir().join("manifest.json").display());
    out
}

#[test]
fn every_block_type_decodes_to_gguf_pys_bits() {
    let all = fixtures();
    for t in GgmlType::ALL {
        assert!(all.iter().any(|f| f.ty == t), "{} has no fixture", t.name());
        assert_eq!(GgmlType::from_code(t.code()), Some(t));
    }
    for f in &all {
        let mut got = vec![f32::NAN; f.values.len()];
        dequantize_row(f.ty, &f.blocks, &mut got);
        let differ: Vec<usize> = (0..got.len()).filter(|&i| got[i].to_bits() != f.values[i].to_bits()).collect();
        assert!(
            differ.is_empty(),
            "{}: {} of {} values differ from gguf-py, first at {} ({} vs {})",
            f.ty.name(),
            differ.len(),
            got.len(),
            differ[0],
            got[differ[0]],
            f.values[differ[0]]
        );
    }
}

/// A matrix of the fixture's blocks: 4 rows of 2 blocks (1 row for the
/// float types' 8 values... any shape whose rows are whole blocks).
fn matrix(f: &Fixture) -> (usize, usize) {
    let n = f.values.len();
    let rows = if f.ty.block_elems() == 1 { 2 } else { 4 };
    (rows, n / rows)
}

fn inputs(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32) * 2.0 - 1.0
        })
        .collect()
}

/// matvec is `dot8` of each decoded row and x (Q4_K: its int16 products);
/// matmul gives matvec's bits
/// for every input of the batch (so a prefill run as a product is the
/// plain path exactly).
#[test]
fn matvec_and_matmul_are_dot8_of_the_decoded_rows() {
    for f in fixtures() {
        let (rows, cols) = matrix(&f);
        let m = GgmlMatrix::new("w", f.ty, rows, cols, &f.blocks).unwrap();
        assert_eq!(m.dequantize(), f.values, "{}", f.ty.name());
        let n = 5;
        let x = inputs(n * cols, 7);
        let mut batch = vec![0f32; n * rows];
        m.matmul(&x, &mut batch);
        for t in 0..n {
            let xt = &x[t * cols..(t + 1) * cols];
            let mut y = vec![0f32; rows];
            m.matvec(xt, &mut y);
            let rb = f.ty.row_bytes(cols).unwrap();
            for r in 0..rows {
                let want = product_of(f.ty, &f.blocks[r * rb..(r + 1) * rb], &f.values[r * cols..(r + 1) * cols], xt);
                assert_eq!(y[r].to_bits(), want.to_bits(), "{} matvec row {r}", f.ty.name());
                assert_eq!(batch[t * rows + r].to_bits(), want.to_bits(), "{} matmul input {t} row {r}", f.ty.name());
            }
        }
    }
}

/// A large matrix takes the parallel path; its rows are still each one
/// call's `dot8`.
#[test]
fn a_matrix_large_enough_for_threads_gives_the_same_bits() {
    let f = fixtures().into_iter().find(|f| f.ty == GgmlType::Q4K).unwrap();
    let (rows, cols) = (256, 2048);
    let row = &f.blocks[..GgmlType::Q4K.row_bytes(cols).unwrap()];
    let data: Vec<u8> = (0..rows).flat_map(|_| row.iter().copied()).collect();
    let m = GgmlMatrix::new("w", GgmlType::Q4K, rows, cols, &data).unwrap();
    let x = inputs(cols, 3);
    let mut y = vec![0f32; rows];
    m.matvec(&x, &mut y);
    let mut decoded = vec![0f32; cols];
    dequantize_row(GgmlType::Q4K, row, &mut decoded);
    let want = product_of(GgmlType::Q4K, row, &decoded, &x);
    assert!(y.iter().all(|v| v.to_bits() == want.to_bits()));
}

#[test]
fn a_slab_of_the_wrong_length_or_shape_is_refused_naming_the_tensor() {
    let bytes = vec![0u8; 144 * 3];
    let short = GgmlMatrix::new("blk.3.ffn_down_exps", GgmlType::Q4K, 2, 512, &bytes[..144 * 3]).unwrap_err();
    assert_eq!(short, QuantError::Length { what: "blk.3.ffn_down_exps", expected: 576, got: 432 });
    assert!(short.to_string().starts_with("blk.3.ffn_down_exps: expected 576 bytes"), "{short}");
    let ragged = GgmlMatrix::new("blk.0.ffn_up_exps", GgmlType::Q4K, 1, 300, &bytes).unwrap_err();
    assert_eq!(ragged, QuantError::Shape { what: "blk.0.ffn_up_exps", rows: 1, cols: 300 });
    assert_eq!(GgmlType::Q4K.matrix_bytes(usize::MAX, 256), None);
}

/// The AVX2 build of the twins (the same source, vectorised by the
/// compiler) against the baseline build, bit for bit, on every fixture and
/// on its bytes rotated (new quants, signs and grid indices).
#[cfg(target_arch = "x86_64")]
#[test]
fn the_avx2_build_of_the_twins_gives_their_bits() {
    if !(crate::quant::simd::has_avx2() && has_f16c()) {
        crate::skip::report_skip("SKIP ggml AVX2 twin comparison: this CPU runs only the baseline build");
        return;
    }
    for f in fixtures() {
        let mut blocks = f.blocks.clone();
        // More blocks: every byte of the fixture rotated through each position.
        for shift in 1..4 {
            blocks.extend(f.blocks.iter().map(|b| b.rotate_left(shift)));
        }
        let n = blocks.len() / f.ty.block_bytes() * f.ty.block_elems();
        let (mut portable, mut avx2) = (vec![0f32; n], vec![0f32; n]);
        dequantize_row_portable(f.ty, &blocks, &mut portable);
        // SAFETY: AVX2 and FMA were detected above.
        unsafe { dequantize_row_avx2(f.ty, &blocks, &mut avx2) };
        let differ = portable.iter().zip(&avx2).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(differ, 0, "{}: {differ} of {n} values differ", f.ty.name());
    }
}

/// Random blocks of `ty` with weight-sized f16 scales (the byte offsets of
/// ggml-common.h's scale fields), `n` of them.
/// What a GGUF matrix computes for one row and input: the int16 products
/// of the types that take them (`int16::Format::of`), every other type's
/// `dot8` of the decoded row.
fn product_of(ty: GgmlType, row: &[u8], values: &[f32], x: &[f32]) -> f32 {
    if let Some(fmt) = int16::Format::of(ty) {
        return int16::row_scalar(fmt, row, &int16::Int16Inputs::new(x, x.len()), 0);
    }
    dot8_scalar(values, x)
}

fn random_blocks(ty: GgmlType, n: usize, seed: u32) -> Vec<u8> {
    let bytes: Vec<u8> = inputs(n * ty.block_bytes(), seed).iter().map(|v| ((v + 1.0) * 127.5) as u8).collect();
    let mut bytes = bytes;
    let scale_at: &[usize] = match ty {
        GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q6K => &[208],
        GgmlType::Q2K => &[80, 82],
        GgmlType::Q3K => &[108],
        _ => &[0],
    };
    let d = half::f16::from_f32(0.01).to_bits().to_le_bytes();
    for b in bytes.chunks_exact_mut(ty.block_bytes()) {
        for &at in scale_at {
            b[at..at + 2].copy_from_slice(&d);
        }
    }
    bytes
}

fn mixed_expert() -> (crate::quant::ExpertFormat, crate::quant::ExpertShape, Vec<u8>) {
    use crate::quant::{ExpertFormat, ExpertShape, GgmlExpert};
    // An up slab of a type still computed in f32 (Q4_0) beside the int16
    // ones.
    let t = GgmlExpert { gate: GgmlType::Q4K, up: GgmlType::Q4_0, down: GgmlType::Q6K };
    let shape = ExpertShape { hidden: 256, inter: 512, biases: true };
    let mut payload = random_blocks(t.gate, 512, 1);
    payload.extend(random_blocks(t.up, 512 * 8, 2));
    payload.extend(random_blocks(t.down, 2 * 256, 3));
    payload.extend(inputs(2 * 512 + 256, 4).iter().flat_map(|b| (b * 0.1).to_le_bytes()));
    (ExpertFormat::Ggml(t), shape, payload)
}

/// A GGUF expert (mixed types, gpt-oss biases) is dot8 of its decoded
/// slabs (the Q4_K gate and Q6_K down: their int16 products; the Q4_0 up
/// in f32), the biases and the activation: exactly, bit for bit.
#[test]
fn a_gguf_expert_computes_its_decoded_slabs_exactly() {
    use crate::quant::{
        build_gate_up_tables, check_expert_payload, decode_expert, expert_forward_act, Activation, ExpertScratch,
    };
    let (fmt, shape, payload) = mixed_expert();
    check_expert_payload(fmt, shape, &payload, None).unwrap();
    let (h, i) = (shape.hidden, shape.inter);
    let (g, u, d) = decode_expert(fmt, shape, &payload, None);
    let biases: Vec<f32> = inputs(2 * 512 + 256, 4).iter().map(|b| b * 0.1).collect();
    let act = Activation::ClampedSwiglu { alpha: 1.702, limit: 7.0 };
    let x = inputs(h, 9);
    let mut want = vec![0f32; h];
    let mut a = vec![0f32; i];
    let grb = GgmlType::Q4K.row_bytes(h).unwrap();
    for r in 0..i {
        let gv = product_of(GgmlType::Q4K, &payload[r * grb..(r + 1) * grb], &g[r * h..(r + 1) * h], &x) + biases[r];
        let uv = dot8_scalar(&u[r * h..(r + 1) * h], &x) + biases[i + r];
        a[r] = act.apply(gv, uv);
    }
    let down = &payload[(grb + GgmlType::Q4_0.row_bytes(h).unwrap()) * i..];
    let drb = GgmlType::Q6K.row_bytes(i).unwrap();
    for r in 0..h {
        want[r] =
            product_of(GgmlType::Q6K, &down[r * drb..(r + 1) * drb], &d[r * i..(r + 1) * i], &a) + biases[2 * i + r];
    }
    let mut out = vec![0f32; h];
    let tables = build_gate_up_tables(fmt, None, &x);
    expert_forward_act(fmt, shape, &payload, None, &tables, &x, &mut out, &mut ExpertScratch::new(fmt, shape), act);
    assert!(out.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
}

/// A chunk's batch over a GGUF expert gives each token its decode bits.
#[test]
fn a_gguf_expert_batch_gives_each_token_its_own_bits() {
    use crate::quant::{
        build_gate_up_tables, expert_forward_act, expert_forward_batch, Activation, ExpertBatchScratch, ExpertScratch,
    };
    let (fmt, shape, payload) = mixed_expert();
    let h = shape.hidden;
    let m = 7;
    let xs = inputs(m * h, 11);
    let mut outs = vec![0f32; m * h];
    let act = Activation::Silu;
    expert_forward_batch(fmt, shape, &payload, None, &xs, &mut outs, &mut ExpertBatchScratch::new(fmt, shape), act);
    for t in 0..m {
        let x = &xs[t * h..(t + 1) * h];
        let mut out = vec![0f32; h];
        let tables = build_gate_up_tables(fmt, None, x);
        expert_forward_act(fmt, shape, &payload, None, &tables, x, &mut out, &mut ExpertScratch::new(fmt, shape), act);
        assert!(out.iter().zip(&outs[t * h..]).all(|(a, b)| a.to_bits() == b.to_bits()), "token {t}");
    }
}

#[test]
fn a_gguf_expert_format_round_trips_its_record_code_and_refuses_bad_payloads() {
    use crate::quant::{check_expert_payload, ExpertFormat, ExpertShape};
    let (fmt, shape, payload) = mixed_expert();
    assert_eq!(ExpertFormat::from_code(fmt.code()), Some(fmt));
    assert_eq!(fmt.name(), "gguf");
    for f in ExpertFormat::ALL {
        assert_eq!(ExpertFormat::from_code(f.code()), Some(f));
    }
    assert_eq!(ExpertFormat::from_code(1 << 24 | 4 << 16), None, "Q4_2 is no type");
    let short = check_expert_payload(fmt, shape, &payload[1..], None).unwrap_err();
    assert!(matches!(short, QuantError::Length { .. }), "{short}");
    let ragged = check_expert_payload(fmt, ExpertShape { hidden: 300, ..shape }, &payload, None).unwrap_err();
    assert!(matches!(ragged, QuantError::Shape { what: "gate", .. }), "{ragged}");
}

/// A GGUF matrix kept in the trunk (`TrunkFormat::Ggml`): matvec, a
/// prefill chunk's matvec_many, matmul and one row's dot all give the bits
/// of `product_of` (dot8 of its decoded rows, or Q6_K's int16 products),
/// and MLA's add_scaled_row the loop over its decoded rows.
#[test]
fn a_gguf_trunk_matrix_gives_the_same_bits_on_every_path() {
    use crate::quant::{QMatrix, TrunkFormat};
    for ty in [GgmlType::Q6K, GgmlType::Iq2Xxs, GgmlType::Q8_0] {
        let (rows, cols) = (40, 512);
        let bytes = random_blocks(ty, rows * cols / ty.block_elems(), 5);
        let m = QMatrix::from_bytes(TrunkFormat::Ggml(ty), rows, cols, &bytes).unwrap();
        assert_eq!(TrunkFormat::parse(TrunkFormat::Ggml(ty).name()), Some(TrunkFormat::Ggml(ty)));
        let w = m.dequantize();
        let rb = ty.row_bytes(cols).unwrap();
        let n = 5;
        let x = inputs(n * cols, 8);
        let (mut many, mut prod) = (vec![0f32; n * rows], vec![0f32; n * rows]);
        m.matvec_many(&x, &mut many);
        m.matmul(&x, &mut prod);
        for t in 0..n {
            let xt = &x[t * cols..(t + 1) * cols];
            let mut y = vec![0f32; rows];
            m.matvec(xt, &mut y);
            for r in 0..rows {
                let want = product_of(ty, &bytes[r * rb..(r + 1) * rb], &w[r * cols..(r + 1) * cols], xt).to_bits();
                let got = [y[r], many[t * rows + r], prod[t * rows + r]].map(f32::to_bits);
                assert_eq!(got, [want; 3], "{} input {t} row {r}", ty.name());
            }
        }
        let mut one = [0f32; 3];
        m.matvec_rows(7, &x[..cols], &mut one);
        let want = product_of(ty, &bytes[7 * rb..8 * rb], &w[7 * cols..8 * cols], &x[..cols]);
        assert_eq!(one[0].to_bits(), want.to_bits());
        let (mut got, mut want) = (x[..cols].to_vec(), x[..cols].to_vec());
        m.add_scaled_row(3, 0.37, &mut got);
        for (o, &v) in want.iter_mut().zip(&w[3 * cols..4 * cols]) {
            *o += 0.37 * v;
        }
        assert_eq!(got, want);
    }
}

/// The buffers a compute thread keeps between calls stay within what the
/// memory plan counts per thread (`per_thread_bytes`), on every product
/// (decode, a chunk, one row) at this CPU's level, for matrices of growing
/// then shrinking widths (a `Vec` grown by doubling would hold more).
#[test]
fn a_threads_kernel_buffers_stay_within_what_the_plan_counts() {
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    one.install(|| {
        let mut widest = 0;
        for cols in [512, 1536, 2048, 4608, 256, 1024] {
            widest = usize::max(widest, cols);
            for ty in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q8_0, GgmlType::Iq2Xxs] {
                let rows = 24;
                let bytes = random_blocks(ty, rows * cols / ty.block_elems(), 3);
                let m = GgmlMatrix::new("w", ty, rows, cols, &bytes).unwrap();
                let x = inputs(40 * cols, 4);
                m.matvec(&x[..cols], &mut vec![0.0; rows]);
                m.row_dots(1, &x[..3 * cols], &mut [0.0; 3]);
                m.matmul(&x, &mut vec![0.0; 40 * rows]);
                let (held, counted) = (held_bytes(), per_thread_bytes(widest));
                assert!(held <= counted, "{} at {cols} columns: {held} bytes held, {counted} counted", ty.name());
            }
        }
    });
}

/// The fused AVX2 row products (decoded in registers) against dot8 of the
/// twins' rows, bit for bit, for every type that has one.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_fused_avx2_row_products_are_dot8_of_the_twins_rows() {
    if !(crate::quant::simd::has_avx2() && has_f16c()) {
        crate::skip::report_skip("SKIP ggml fused AVX2 rows: this CPU runs only the baseline build");
        return;
    }
    for ty in GgmlType::ALL.into_iter().filter(|&t| avx2::fused(t)) {
        // Every group size dot_rows interleaves, 1 to 4 rows.
        for n in 1..=4 {
            let cols = 512;
            let rb = ty.row_bytes(cols).unwrap();
            let bytes = random_blocks(ty, n * cols / ty.block_elems(), 13 + n as u32);
            let x = inputs(cols, 14);
            let mut out = vec![0f32; n];
            // SAFETY: AVX2, FMA and F16C were detected above.
            unsafe { avx2::dot_rows(ty, &bytes, rb, &x, &mut out) };
            for (r, &got) in out.iter().enumerate() {
                let mut w = vec![0f32; cols];
                dequantize_row_portable(ty, &bytes[r * rb..(r + 1) * rb], &mut w);
                assert_eq!(got.to_bits(), dot8_scalar(&w, &x).to_bits(), "{} row {r} of {n}", ty.name());
            }
        }
    }
}

/// The AVX-512 Q8_0 row products (two rows a vector) against dot8 of the
/// twins' rows, bit for bit, every block with its own scale (so a row
/// given its neighbour's would show); and a matvec that takes them for
/// most of its rows gives the same bits.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_avx512_q8_0_row_products_are_dot8_of_the_twins_rows() {
    if !avx512::runs(GgmlType::Q8_0) {
        crate::skip::report_skip("SKIP ggml AVX-512 Q8_0 rows: this CPU or kernel level lacks AVX-512F/DQ");
        return;
    }
    let ty = GgmlType::Q8_0;
    for cols in [32, 64, 512, 2080] {
        let rb = ty.row_bytes(cols).unwrap();
        let bytes = q8_0_blocks_scaled_apart(avx512::ROWS * cols / ty.block_elems(), 17 + cols as u32);
        let x = inputs(cols, 18);
        let mut out = [f32::NAN; avx512::ROWS];
        // SAFETY: `runs` checked the features.
        unsafe { avx512::dot_rows(&bytes, rb, &x, &mut out) };
        for (r, &got) in out.iter().enumerate() {
            let mut w = vec![0f32; cols];
            dequantize_row_portable(ty, &bytes[r * rb..(r + 1) * rb], &mut w);
            assert_eq!(got.to_bits(), dot8_scalar(&w, &x).to_bits(), "cols {cols} row {r}");
        }
    }
    // 203 rows: three whole tasks, then a last one of eleven (one call of
    // eight, then the AVX2 form on three).
    let (rows, cols) = (203, 256);
    let rb = ty.row_bytes(cols).unwrap();
    let bytes = q8_0_blocks_scaled_apart(rows * cols / ty.block_elems(), 19);
    let m = GgmlMatrix::new("w", ty, rows, cols, &bytes).unwrap();
    let x = inputs(cols, 20);
    let mut y = vec![f32::NAN; rows];
    m.matvec(&x, &mut y);
    for (r, &got) in y.iter().enumerate() {
        let mut w = vec![0f32; cols];
        dequantize_row_portable(ty, &bytes[r * rb..(r + 1) * rb], &mut w);
        assert_eq!(got.to_bits(), dot8_scalar(&w, &x).to_bits(), "matvec row {r}");
    }
}

/// `n` random Q8_0 blocks, block `i`'s scale `0.001 * (1 + i % 13)`.
#[cfg(target_arch = "x86_64")]
fn q8_0_blocks_scaled_apart(n: usize, seed: u32) -> Vec<u8> {
    let mut bytes = random_blocks(GgmlType::Q8_0, n, seed);
    for (i, b) in bytes.chunks_exact_mut(GgmlType::Q8_0.block_bytes()).enumerate() {
        b[..2].copy_from_slice(&half::f16::from_f32(0.001 * (1 + i % 13) as f32).to_bits().to_le_bytes());
    }
    bytes
}
