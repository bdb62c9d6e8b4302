//! Kimi K3's image preprocessing against Pillow and numpy
//! (tests/gen_k3_vision_preprocess.py): every case of the corpus, RGB and
//! RGBA, unscaled and scaled down by the patch budget or the side limit,
//! gives the same resized bytes and the same f32 `pixel_values` bit for bit.

use waste_host::vision::preprocess::{preprocess, Chessboard, Pixels, PreprocessConfig};

use crate::common::*;

/// FNV-1a 64 of the bytes, as the generator records it.
fn fnv_hex(bytes: &[u8]) -> String {
    let mut h = waste_host::files::Fnv::new();
    h.update(bytes);
    h.hex()
}

#[test]
fn k3_image_preprocessing_matches_pillow_and_numpy_bit_for_bit() {
    let dir = fixtures().join("k3_vision_preprocess");
    let e: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
    let board = &e["chessboard"];
    let n = |v: &serde_json::Value| v.as_u64().unwrap() as usize;
    let mut failures = Vec::new();
    for case in e["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let cfg = PreprocessConfig {
            patch_size: n(&e["patch_size"]),
            merge_kernel_size: n(&e["merge_kernel_size"]),
            in_patch_limit: n(&case["in_patch_limit"]),
            patch_limit_on_one_side: n(&case["patch_limit_on_one_side"]),
            image_mean: [0.5; 3],
            image_std: [0.5; 3],
            chessboard: Chessboard {
                square: n(&board["square"]),
                white: n(&board["white"]) as u8,
                gray: n(&board["gray"]) as u8,
            },
        };
        let channels = if case["mode"] == "RGBA" { 4 } else { 3 };
        let src = Pixels::new(
            n(&case["width"]),
            n(&case["height"]),
            channels,
            std::fs::read(dir.join(format!("{name}.in"))).unwrap(),
        )
        .unwrap();
        let out = preprocess(&src, &cfg);
        let plan = [
            out.plan.width,
            out.plan.height,
            out.plan.pad_width,
            out.plan.pad_height,
            out.plan.grid.0,
            out.plan.grid.1,
        ];
        let want = [
            n(&case["resized"][0]),
            n(&case["resized"][1]),
            n(&case["pad"][0]),
            n(&case["pad"][1]),
            n(&case["grid"][0]),
            n(&case["grid"][1]),
        ];
        if plan != want {
            failures.push(format!("{name}: plan {plan:?}, want {want:?}"));
            continue;
        }
        let resized = std::fs::read(dir.join(format!("{name}.resized"))).unwrap();
        if out.resized.data != resized {
            let diff = out.resized.data.iter().zip(&resized).filter(|(a, b)| a != b).count();
            failures.push(format!("{name}: {diff} of {} resized bytes differ", resized.len()));
            continue;
        }
        let bytes: Vec<u8> = out.pixel_values.iter().flat_map(|v| v.to_le_bytes()).collect();
        if fnv_hex(&bytes) != case["pixel_values_fnv1a64"].as_str().unwrap() {
            failures.push(format!("{name}: pixel_values differ (first {:?})", &out.pixel_values[..4]));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// PIL's `resize(BICUBIC)` alone at explicit sizes: both sides of the
/// boundary where Pillow swaps its two passes, and upscales of either side,
/// RGB and RGBA (through Pillow's premultiplied round trip).
#[test]
fn bicubic_resize_matches_pillow_on_both_pass_orders_and_upscales() {
    let dir = fixtures().join("k3_vision_preprocess");
    let e: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
    let n = |v: &serde_json::Value| v.as_u64().unwrap() as usize;
    let cases = e["resizes"].as_array().unwrap();
    assert!(cases.len() >= 7);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let channels = if case["mode"] == "RGBA" { 4 } else { 3 };
        let src = Pixels::new(
            n(&case["width"]),
            n(&case["height"]),
            channels,
            std::fs::read(dir.join(format!("{name}.in"))).unwrap(),
        )
        .unwrap();
        let out = waste_host::vision::preprocess::resize_bicubic(&src, n(&case["resized"][0]), n(&case["resized"][1]));
        let want = std::fs::read(dir.join(format!("{name}.resized"))).unwrap();
        assert!(
            out.data == want,
            "{name}: {} of {} bytes differ",
            out.data.iter().zip(&want).filter(|(a, b)| a != b).count(),
            want.len()
        );
    }
}
