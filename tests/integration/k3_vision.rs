//! Kimi K3's image preprocessing against Pillow and numpy
//! (tests/gen_k3_vision_preprocess.py): every case of the corpus, RGB and
//! RGBA, unscaled and scaled down by the patch budget or the side limit,
//! gives the same resized bytes and the same f32 `pixel_values` bit for bit.

use waste_host::vision::decode::{decode, MAX_SOURCE_PIXELS};
use waste_host::vision::preprocess::{preprocess, Chessboard, Pixels, PreprocessConfig};

use crate::common::*;

/// A case's source pixels (`<name>.in`, RGB or RGBA by its `mode`).
fn source(dir: &std::path::Path, case: &serde_json::Value) -> Pixels {
    let n = |v: &serde_json::Value| v.as_u64().unwrap() as usize;
    let channels = if case["mode"] == "RGBA" { 4 } else { 3 };
    let name = case["name"].as_str().unwrap();
    Pixels::new(n(&case["width"]), n(&case["height"]), channels, std::fs::read(dir.join(format!("{name}.in"))).unwrap())
        .unwrap()
}

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
        let src = source(&dir, case);
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
        let src = source(&dir, case);
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

/// Image files decode to the pixels Pillow gives the processor: PNG (RGB,
/// RGBA, L, LA, palette with and without transparency), GIF and lossless
/// WebP bit for bit, JPEG within the measured decoder difference; the
/// mode (RGB or RGBA) as the processor's rule picks it.
#[test]
fn image_files_decode_as_pillow_opens_them() {
    let dir = fixtures().join("k3_vision_decode");
    let e: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
    let mut failures = Vec::new();
    for case in e["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let bytes = std::fs::read(dir.join(case["file"].as_str().unwrap())).unwrap();
        let d = decode(&bytes, MAX_SOURCE_PIXELS).unwrap_or_else(|err| panic!("{name}: {err}"));
        let want = std::fs::read(dir.join(format!("{name}.pixels"))).unwrap();
        let channels = if case["mode"] == "RGBA" { 4 } else { 3 };
        if d.pixels.channels != channels
            || [d.width, d.height]
                != [case["width"].as_u64().unwrap() as usize, case["height"].as_u64().unwrap() as usize]
        {
            failures.push(format!("{name}: {}x{} with {} channels", d.width, d.height, d.pixels.channels));
            continue;
        }
        let max_diff = d.pixels.data.iter().zip(&want).map(|(a, b)| a.abs_diff(*b)).max().unwrap_or(0);
        eprintln!("{name}: max |decoded - Pillow| = {max_diff}");
        // JPEG: zune-jpeg and libjpeg-turbo measured 3 apart at most (4:2:0).
        let bound = if case["exact"].as_bool().unwrap() { 0 } else { 4 };
        if max_diff > bound || d.pixels.data.len() != want.len() {
            failures.push(format!("{name}: max difference {max_diff} (bound {bound})"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A file past the pixel bound is refused from its header, before any
/// pixel is decoded; garbage and truncated files are one-line errors.
#[test]
fn oversized_garbage_and_truncated_images_are_refused_in_one_line() {
    let dir = fixtures().join("k3_vision_decode");
    let png = std::fs::read(dir.join("png_rgb.png")).unwrap();
    let err = decode(&png, 37 * 23 - 1).err().expect("past the bound");
    assert!(err.to_string().contains("37x23"), "{err}");
    for bad in [&b"not an image at all"[..], &png[..png.len() / 2], &[0x89, b'P', b'N', b'G'][..]] {
        let err = decode(bad, MAX_SOURCE_PIXELS).err().expect("refused");
        assert!(!err.to_string().contains('\n'), "{err}");
    }
}
