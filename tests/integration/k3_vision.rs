//! Kimi K3's image preprocessing against Pillow and numpy
//! (tests/gen_k3_vision_preprocess.py): every case of the corpus, RGB and
//! RGBA, unscaled and scaled down by the patch budget or the side limit,
//! gives the same resized bytes and the same f32 `pixel_values` bit for bit.

use waste_engine::vision::decode::{decode, MAX_SOURCE_PIXELS};
use waste_engine::vision::preprocess::{preprocess, Chessboard, Pixels, PreprocessConfig};

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
    let mut h = waste_engine::files::Fnv::new();
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
        let out =
            waste_engine::vision::preprocess::resize_bicubic(&src, n(&case["resized"][0]), n(&case["resized"][1]));
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

fn vision_reference() -> serde_json::Value {
    let path = fixture("kimi_k3-vision").join("reference.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn f32_file(name: &str) -> Vec<f32> {
    let bytes = std::fs::read(fixture("kimi_k3-vision").join(name)).unwrap();
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

/// Worst |diff| relative to each row's largest value.
fn worst_row_error(got: &[f32], want: &[f32], width: usize) -> f32 {
    assert_eq!(got.len(), want.len());
    got.chunks_exact(width)
        .zip(want.chunks_exact(width))
        .map(|(a, b)| {
            let max = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / max
        })
        .fold(0f32, f32::max)
}

/// `waste convert` carries the tower into the container (8-bit under a
/// 4-bit trunk, f32 in an f32 one) with the processor settings; the opened
/// model turns each fixture image into the reference's rows and answers
/// the prompt holding both with the reference's logits at every position.
#[test]
fn k3_container_carries_the_vision_tower_and_answers_from_images() {
    let tmp = TempDir::new("k3-vision");
    let r = vision_reference();
    let ids: Vec<u32> = r["prompt_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let want_logits = f32_file("reference_logits.f32");
    for (experts, trunk, row_bound) in [("f32", "f32", 1e-4f32), ("rvq3", "q4", 0.05)] {
        let c = convert("kimi_k3-vision", experts, trunk, tmp.path());
        let o = waste(&["info", c.to_str().unwrap(), "--json"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let info: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        let want_format = if trunk == "f32" { "f32" } else { "q8" };
        assert_eq!(info["vision"]["layers"], 3, "{info}");
        assert_eq!(info["vision"]["format"], want_format, "{info}");
        assert_eq!(info["vision"]["grid_resize"], "bilinear");

        let model = waste_host::Model::open(&c, &exact()).unwrap();
        assert!(model.vision().is_some());
        let text_hidden = model.vision().unwrap().text_hidden;
        let mut images = Vec::new();
        for name in ["a", "b"] {
            let img = &r["images"][name];
            let bytes = std::fs::read(fixture("kimi_k3-vision").join(img["file"].as_str().unwrap())).unwrap();
            let rows = model.encode_image(&bytes).unwrap();
            assert_eq!(
                [rows.width, rows.height],
                [img["size"][0].as_u64().unwrap() as usize, img["size"][1].as_u64().unwrap() as usize]
            );
            let e = worst_row_error(&rows.rows, &f32_file(img["features_file"].as_str().unwrap()), text_hidden);
            println!("{trunk} trunk, image {name}: tower rows worst relative error {e:e}");
            assert!(e <= row_bound, "{trunk} trunk, image {name}: row error {e}");
            images.push(rows);
        }
        if trunk == "f32" {
            let mut state = model.new_state();
            let refs: Vec<&_> = images.iter().collect();
            let (logits, _) = model.forward_with_images(&mut state, &ids, &refs, true).unwrap();
            let v = model.info().vocab_size;
            assert_eq!(logits.len(), want_logits.len());
            let e = worst_row_error(&logits, &want_logits, v);
            println!("f32 container: prompt logits worst relative error {e:e}");
            assert!(e <= 1e-4, "prompt logits: {e}");
            assert_eq!(state.position() as u64, r["expanded_length"].as_u64().unwrap());
        }
    }
}

/// The planner counts the tower only when asked (`--vision`), and a model
/// without one says so in one line.
#[test]
fn plan_counts_the_vision_tower_only_when_asked() {
    let tmp = TempDir::new("k3-vision-plan");
    let c = convert("kimi_k3-vision", "rvq3", "q4", tmp.path());
    let plan = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["plan", c.to_str().unwrap(), "--json"];
        args.extend_from_slice(extra);
        let o = waste(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_str(&stdout(&o)).unwrap()
    };
    let (text, vision) = (plan(&[]), plan(&["--vision"]));
    assert_eq!(text["vision"], 0);
    let v = vision["vision"].as_u64().unwrap();
    assert!(v > 0 && vision["floor"].as_u64().unwrap() == text["floor"].as_u64().unwrap() + v, "{text} {vision}");
    assert_eq!(text["trunk"], vision["trunk"], "the tower is not resident trunk");

    let plain = convert("kimi_k3", "rvq3", "q4", tmp.path());
    let o = waste(&["plan", plain.to_str().unwrap(), "--vision"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("no vision tower") && err.trim().lines().count() == 1, "{err}");
}

/// `waste run --image A --image B -p TEXT` puts both images before the
/// text and decodes the reference's greedy tokens (an f32 container, so
/// the comparison is exact); a text-only model refuses `--image` in one
/// line.
#[test]
fn waste_run_answers_from_images_given_with_image() {
    let tmp = TempDir::new("k3-vision-run");
    let r = vision_reference();
    let cli = &r["cli"];
    let c = convert("kimi_k3-vision", "f32", "f32", tmp.path());
    let dir = fixture("kimi_k3-vision");
    let (a, b) = (dir.join("image_a.png"), dir.join("image_b.png"));
    let text = cli["text"].as_str().unwrap();
    let n = cli["greedy_ids"].as_array().unwrap().len().to_string();
    let o = waste(&[
        "run",
        c.to_str().unwrap(),
        "--image",
        a.to_str().unwrap(),
        "--image",
        b.to_str().unwrap(),
        "-p",
        text,
        "--temp",
        "0",
        "-n",
        &n,
        "--logprobs",
        "0",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ids: Vec<u64> = stderr(&o)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["token"].as_u64())
        .collect();
    let want: Vec<u64> = cli["greedy_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(ids, want, "greedy tokens after two images");

    let plain = convert("kimi_k3", "f32", "f32", tmp.path());
    let o = waste(&["run", plain.to_str().unwrap(), "--image", a.to_str().unwrap(), "-p", text, "-n", "2"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("no vision tower") && err.trim().lines().count() == 1, "{err}");
}

/// A conversation holding images saves and loads like any other: the
/// loaded session continues with the logits the original would give, and
/// the prefix cache never resumes across an image (equal placeholder
/// tokens do not mean equal images).
#[test]
fn a_conversation_with_images_saves_loads_and_is_never_reused_past_an_image() {
    let tmp = TempDir::new("k3-vision-state");
    let r = vision_reference();
    let cli = &r["cli"];
    let c = convert("kimi_k3-vision", "f32", "f32", tmp.path());
    let engine = waste_host::Engine::new().unwrap();
    let mut s = open_session(&engine, &c);
    let dir = fixture("kimi_k3-vision");
    for name in ["image_a.png", "image_b.png"] {
        s.attach_image(&std::fs::read(dir.join(name)).unwrap()).unwrap();
    }
    assert_eq!(s.pending_images(), 2);
    let ids: Vec<u32> = cli["prompt_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    s.eval(&ids, false).unwrap();
    assert_eq!(s.pending_images(), 0);
    let snapshot = s.snapshot();
    let path = tmp.path().join("images.state");
    s.save_state(&path).unwrap();
    let next = [cli["greedy_ids"][0].as_u64().unwrap() as u32];
    let (want, _) = s.eval(&next, false).unwrap();

    let mut t = open_session(&engine, &c);
    t.load_state(&path).unwrap();
    assert_eq!(t.position(), s.position() - 1);
    let (got, _) = t.eval(&next, false).unwrap();
    assert_eq!(got, want, "the loaded conversation continues bit for bit");

    // The same tokens with other images behind them must not be resumed.
    let pad = s.model().vision().unwrap().placeholder;
    assert_eq!(snapshot.usable_prefix(&ids, true), ids.iter().position(|&t| t == pad).unwrap());
    // A placeholder without an attached image is refused, not run.
    let mut u = open_session(&engine, &c);
    let err = u.eval(&ids, false).unwrap_err().to_string();
    assert!(err.contains("image placeholders"), "{err}");
}

/// `/image FILE` in `waste chat` attaches the image to the next message:
/// its markup goes before the content through the model's template, and
/// the reply is the reference's (the text up to its first partial
/// character); a later turn that replays the conversation attaches the
/// images again.
#[test]
fn chat_image_command_attaches_images_to_the_next_message() {
    let tmp = TempDir::new("k3-vision-chat");
    let r = vision_reference();
    let chat = &r["chat"];
    let c = convert("kimi_k3-vision", "f32", "f32", tmp.path());
    let dir = fixture("kimi_k3-vision");
    let text = r["cli"]["text"].as_str().unwrap();
    let input = format!(
        "/image {}\n/image {}\n{text}\nAnd the other one?\n/stats\n",
        dir.join("image_a.png").display(),
        dir.join("image_b.png").display()
    );
    let n = chat["greedy_ids"].as_array().unwrap().len().to_string();
    let o = waste_with_stdin(&["chat", c.to_str().unwrap(), "--temp", "0", "-n", &n], Some(&input));
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("image 150x100: 24 positions") && out.contains("image 40x130: 10 positions"), "{out}");
    let want = chat["greedy_text"].as_str().unwrap();
    let clean = &want[..want.find('\u{FFFD}').unwrap_or(want.len())];
    assert!(clean.len() >= 4 && out.contains(clean), "reply {clean:?} not in {out}");
    // The reply holds partial characters, so its text re-encodes to other
    // tokens and the second turn replays the conversation: the images are
    // attached again and the turn is answered.
    assert!(out.contains("turns 2 |") && out.contains("replays 1"), "{out}");
}
