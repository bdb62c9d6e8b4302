//! The vision tower and the splice against tests/gen_k3_vision_tower.py's
//! pure-torch reference (tests/fixtures/tiny-kimi_k3-vision): the projected
//! rows of two images (bilinear and bicubic position grids) and the text
//! model's logits at every position of a prompt holding both.

use std::path::PathBuf;

use super::decode::{decode, MAX_SOURCE_PIXELS};
use super::expand_placeholders;
use super::preprocess::{preprocess, PreprocessConfig, Preprocessed};
use super::tower::VisionTower;
use crate::checkpoint::HfCheckpoint;
use crate::config::{GridResize, VisionConfig};
use crate::files::Fnv;
use crate::stats::StepStats;
use crate::transformer::experts::DenseExperts;
use crate::transformer::ops::argmax;
use crate::transformer::{Splice, State, Transformer};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-kimi_k3-vision")
}

fn reference() -> serde_json::Value {
    let path = dir().join("reference.json");
    assert!(path.exists(), "fixture file missing: {}", path.display());
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn f32s(name: &str) -> Vec<f32> {
    let path = dir().join(name);
    assert!(path.exists(), "fixture file missing: {}", path.display());
    std::fs::read(path).unwrap().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

fn open() -> (HfCheckpoint, VisionConfig) {
    let ckpt = HfCheckpoint::open(&dir()).unwrap_or_else(|e| panic!("open {}: {e}", dir().display()));
    let vision = ckpt.config().k3.and_then(|k| k.vision).expect("the fixture's config has a vision_config");
    (ckpt, vision)
}

/// The image as the engine's decoder and the release's preprocessing give
/// it, checked to be the reference's input bit for bit.
fn image(r: &serde_json::Value, name: &str) -> Preprocessed {
    let img = &r["images"][name];
    let bytes = std::fs::read(dir().join(img["file"].as_str().unwrap())).unwrap();
    let decoded = decode(&bytes, MAX_SOURCE_PIXELS).unwrap();
    let pre = preprocess(&decoded.pixels, &PreprocessConfig::default());
    let mut h = Fnv::new();
    pre.pixel_values.iter().for_each(|v| h.update(&v.to_le_bytes()));
    assert_eq!(h.hex(), img["pixel_values_fnv1a64"].as_str().unwrap(), "image {name}: pixel_values differ");
    pre
}

/// Worst |diff| relative to the row's largest value, over every row.
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

#[test]
fn oracle_k3_vision_tower_rows_match_the_reference_for_both_grid_resizes() {
    let r = reference();
    let (ckpt, vision) = open();
    assert_eq!(vision.grid_resize, GridResize::Bilinear, "the fixture's config names bilinear");
    for (mode, key) in [(GridResize::Bilinear, "features_file"), (GridResize::Bicubic, "features_bicubic_file")] {
        let tower = VisionTower::load(&VisionConfig { grid_resize: mode, ..vision }, &ckpt).unwrap();
        for name in ["a", "b"] {
            let pre = image(&r, name);
            let got = tower.forward(&pre).unwrap();
            let want = f32s(r["images"][name][key].as_str().unwrap());
            let e = worst_row_error(&got, &want, vision.text_hidden);
            println!("tower {mode:?} image {name}: worst row error {e:e}");
            assert!(e <= 1e-4, "{mode:?} image {name}: relative row error {e}");
        }
    }
}

/// The expanded prompt's rows: each image's placeholder repeated once per
/// projected row, those rows spliced in.
fn spliced_prompt(r: &serde_json::Value, tower: &VisionTower, placeholder: u32) -> (Vec<u32>, Vec<usize>, Vec<f32>) {
    let ids: Vec<u32> = r["prompt_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let feats: Vec<Vec<f32>> = ["a", "b"].iter().map(|n| tower.forward(&image(r, n)).unwrap()).collect();
    let counts: Vec<usize> = feats.iter().map(|f| f.len() / tower.config().text_hidden).collect();
    let (expanded, at) = expand_placeholders(&ids, placeholder, &counts).unwrap();
    (expanded, at, feats.concat())
}

#[test]
fn oracle_k3_vision_prompt_logits_match_the_reference_at_every_position() {
    let r = reference();
    let (ckpt, vision) = open();
    let cfg = ckpt.config().clone();
    let tower = VisionTower::load(&vision, &ckpt).unwrap();
    let (ids, at, rows) = spliced_prompt(&r, &tower, vision.placeholder);
    assert_eq!(ids.len() as u64, r["expanded_length"].as_u64().unwrap());
    let model = Transformer::load(&cfg, &ckpt).unwrap();
    let experts = DenseExperts(&ckpt);
    let mut state = State::new(&cfg, ids.len() + 16);
    let mut stats = StepStats::default();
    let splice = Splice { at: &at, rows: &rows };
    let got = model.forward_spliced(&mut state, &ids, splice, &experts, true, &mut stats).unwrap();
    let want = f32s("reference_logits.f32");
    let v = cfg.vocab_size;
    let e = worst_row_error(&got, &want, v);
    println!("k3 vision prompt: worst position error {e:e} over {} positions", ids.len());
    assert!(e <= 1e-4, "relative logit error {e}");

    let greedy: Vec<u32> = r["greedy_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let mut next = argmax(&got[(ids.len() - 1) * v..]) as u32;
    let mut out = Vec::new();
    for _ in 0..greedy.len() {
        out.push(next);
        next = argmax(&model.forward(&mut state, &[next], &experts, false, &mut stats).unwrap()) as u32;
    }
    assert_eq!(out, greedy, "greedy continuation after the image prompt");
}

/// Chunked prefill only regroups the work: with images spliced in, the
/// logits of every position are bit-identical to one token at a time.
#[test]
fn spliced_prompt_in_chunks_is_bit_identical_to_token_by_token() {
    let r = reference();
    let (ckpt, vision) = open();
    let cfg = ckpt.config().clone();
    let tower = VisionTower::load(&vision, &ckpt).unwrap();
    let (ids, at, rows) = spliced_prompt(&r, &tower, vision.placeholder);
    let experts = DenseExperts(&ckpt);
    let mut results = Vec::new();
    for chunk in [1, 7, 64] {
        let mut model = Transformer::load(&cfg, &ckpt).unwrap();
        model.set_prefill_chunk(chunk).unwrap();
        let mut state = State::new(&cfg, ids.len());
        let splice = Splice { at: &at, rows: &rows };
        let logits =
            model.forward_spliced(&mut state, &ids, splice, &experts, true, &mut StepStats::default()).unwrap();
        results.push(logits.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    }
    assert!(results.windows(2).all(|w| w[0] == w[1]), "chunked prefill changed a logit");
}

/// A splice that does not fit the call is refused before any work.
#[test]
fn malformed_splices_are_refused() {
    let (ckpt, _) = open();
    let cfg = ckpt.config().clone();
    let model = Transformer::load(&cfg, &ckpt).unwrap();
    let experts = DenseExperts(&ckpt);
    let h = cfg.hidden_size;
    let row = vec![0.5f32; 2 * h];
    for (at, rows) in [(&[1usize, 1][..], &row[..]), (&[3, 1], &row), (&[1, 9], &row), (&[1, 2], &row[..h])] {
        let mut state = State::new(&cfg, 16);
        let err = model
            .forward_spliced(&mut state, &[5, 6, 7, 8], Splice { at, rows }, &experts, false, &mut StepStats::default())
            .unwrap_err();
        assert!(err.to_string().contains("splice"), "{err}");
        assert_eq!(state.position(), 0);
    }
    let nan = vec![f32::NAN; h];
    let mut state = State::new(&cfg, 16);
    assert!(model
        .forward_spliced(
            &mut state,
            &[5, 6],
            Splice { at: &[1], rows: &nan },
            &experts,
            false,
            &mut StepStats::default()
        )
        .is_err());
}
