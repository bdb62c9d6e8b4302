//! Converting a release-style checkpoint (tests/gen_mxfp4_fixtures.py): the
//! tiny DeepSeek-V3 with MXFP4 routed experts, an fp8 block-scaled and bf16
//! trunk, in four shards. Decoding is held to transformers' own
//! dequantisation, the converted model to transformers' logits on the
//! dequantised weights; then resumption, --jobs, --reclaim, --verify and
//! the errors for broken inputs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use waste_engine::checkpoint::HfCheckpoint;
use waste_engine::convert::{ShardLedger, Unit};
use waste_host::{Engine, Model, OpenOptions};

use crate::common::*;

const FIXTURE: &str = "deepseek_v3-mxfp4";
const SHARDS: [&str; 4] = [
    "model-00001-of-00004.safetensors",
    "model-00002-of-00004.safetensors",
    "model-00003-of-00004.safetensors",
    "model-00004-of-00004.safetensors",
];

/// A private copy of the fixture (reclaim deletes from it; error tests damage it).
fn source_copy(tmp: &TempDir) -> PathBuf {
    let src = fixture(FIXTURE);
    let dst = tmp.path().join("src");
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    dst
}

fn run_convert(src: &Path, out: &Path, extra: &[&str], env: Option<(&str, &str)>) -> std::process::Output {
    let mut cmd = Command::new(waste_bin());
    cmd.args(["convert", src.to_str().unwrap(), out.to_str().unwrap()]).args(extra);
    if let Some((k, v)) = env {
        cmd.env(k, v);
    }
    cmd.output().expect("run waste convert")
}

fn files_of(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap())
        })
        .collect()
}

/// Same file names, same bytes.
fn assert_same_container(a: &Path, b: &Path, what: &str) {
    let (fa, fb) = (files_of(a), files_of(b));
    assert_eq!(fa.keys().collect::<Vec<_>>(), fb.keys().collect::<Vec<_>>(), "{what}: file sets differ");
    for (name, bytes) in &fa {
        assert!(bytes == &fb[name], "{what}: {name} differs");
    }
}

/// (header length, header JSON) of a safetensors file.
fn header(path: &Path) -> (usize, serde_json::Value) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    (n, serde_json::from_slice(&bytes[8..8 + n]).unwrap())
}

/// Every f32 tensor of a safetensors file (the dequantised reference).
fn read_f32_tensors(path: &Path) -> BTreeMap<String, Vec<f32>> {
    let bytes = std::fs::read(path).unwrap();
    let (n, h) = header(path);
    let mut out = BTreeMap::new();
    for (name, info) in h.as_object().unwrap() {
        if name == "__metadata__" {
            continue;
        }
        assert_eq!(info["dtype"], "F32", "{name}");
        let off = info["data_offsets"].as_array().unwrap();
        let (s, e) = (off[0].as_u64().unwrap() as usize, off[1].as_u64().unwrap() as usize);
        let data = bytes[8 + n + s..8 + n + e].chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap()));
        out.insert(name.clone(), data.collect());
    }
    out
}

#[test]
fn convert_release_decode_equals_transformers_dequantization_exactly() {
    let dir = fixture(FIXTURE);
    let ckpt = HfCheckpoint::open(&dir).unwrap();
    let reference = read_f32_tensors(&dir.join("dequantized.safetensors"));
    let mut seen = BTreeMap::new();
    for (name, want) in &reference {
        let (got, _) = ckpt.tensor_f32(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got.len(), want.len(), "{name}");
        let bad = got.iter().zip(want).position(|(a, b)| a.to_bits() != b.to_bits());
        assert!(bad.is_none(), "{name}: element {bad:?} differs from transformers' dequantisation");
        *seen.entry(ckpt.tensor_encoding(name).unwrap()).or_insert(0) += 1;
    }
    // Every source encoding was exercised (counts from tests/gen_mxfp4_fixtures.py).
    assert_eq!(seen.get("mxfp4"), Some(&96), "{seen:?}");
    assert_eq!(seen.get("fp8-e4m3"), Some(&26), "{seen:?}");
    assert_eq!(seen.get("bf16"), Some(&8), "{seen:?}");
    assert_eq!(seen.get("f32"), Some(&21), "{seen:?}");
    // The companions are no tensors of their own.
    assert!(ckpt.tensor_names().iter().all(|n| !n.contains("weight_scale") && !n.contains("weight_packed")));
}

#[test]
fn convert_release_f32_logits_match_transformers_on_the_dequantized_weights() {
    let tmp = TempDir::new("release-logits");
    let out = tmp.path().join("m.waste");
    let o = run_convert(&fixture(FIXTURE), &out, &["--experts", "f32", "--trunk", "f32"], None);
    assert!(o.status.success(), "{}", stderr(&o));
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture(FIXTURE).join("reference.json")).unwrap()).unwrap();
    let ids: Vec<u32> = json["prompt_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let want: Vec<f32> = std::fs::read(fixture(FIXTURE).join("reference_logits.f32"))
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let model = Model::open(&out, &exact()).unwrap();
    let engine = Engine::new().unwrap();
    let mut session = engine.session(model).unwrap();
    let (got, _) = session.eval(&ids, true).unwrap();
    assert_eq!(got.len(), want.len());
    let v = want.len() / ids.len();
    let mut worst = 0f32;
    for p in 0..ids.len() {
        let (ours, theirs) = (&got[p * v..(p + 1) * v], &want[p * v..(p + 1) * v]);
        let scale = theirs.iter().fold(0f32, |m, x| m.max(x.abs()));
        let diff = ours.iter().zip(theirs).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        worst = worst.max(diff / scale);
        let top = |x: &[f32]| (0..x.len()).fold(0, |b, i| if x[i] > x[b] { i } else { b });
        assert_eq!(top(ours), top(theirs), "top-1 differs at position {p}");
    }
    eprintln!("release f32: max |logit diff| / max |logit| = {worst:e}");
    assert!(worst <= 1e-4, "max |logit diff| / max |logit| = {worst:e}");
}

#[test]
fn convert_release_interrupted_run_resumes_skipping_finished_banks_byte_identical() {
    let tmp = TempDir::new("release-resume");
    let src = fixture(FIXTURE);
    let one_shot = tmp.path().join("one.waste");
    assert!(run_convert(&src, &one_shot, &[], None).status.success());

    // Killed after the first bank: no manifest, layer 2's bank done, layer 3's not.
    let out = tmp.path().join("resumed.waste");
    let o = run_convert(&src, &out, &[], Some(("WASTE_CONVERT_FAIL_AFTER_BANKS", "1")));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(!out.join("manifest.json").exists(), "manifest written before the end");
    assert!(out.join("experts-002.bin.done").is_file() && !out.join("experts-003.bin").exists());
    assert!(Model::open(&out, &OpenOptions::default()).is_err(), "a partial directory must not open");
    let o = run_convert(&src, &out, &[], None);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("reused the trunk and 1 finished bank(s) (layers 2)"), "{}", stderr(&o));
    assert_same_container(&one_shot, &out, "resumed vs one-shot");

    // A bank deleted and a record header damaged after a full run: both
    // are made again, the trunk is reused, the result is the same.
    std::fs::remove_file(out.join("experts-003.bin")).unwrap();
    let bank = out.join("experts-002.bin");
    let mut bytes = std::fs::read(&bank).unwrap();
    bytes[5 * 4096 + 12] ^= 1; // expert number of record 5
    std::fs::write(&bank, bytes).unwrap();
    let o = run_convert(&src, &out, &[], None);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("reused the trunk and 0 finished bank(s)"), "{}", stderr(&o));
    assert_same_container(&one_shot, &out, "repaired vs one-shot");
}

#[test]
fn convert_release_jobs_do_not_change_a_byte() {
    let tmp = TempDir::new("release-jobs");
    let src = fixture(FIXTURE);
    let (a, b) = (tmp.path().join("j1.waste"), tmp.path().join("j3.waste"));
    assert!(run_convert(&src, &a, &["--jobs", "1"], None).status.success());
    let o = run_convert(&src, &b, &["--jobs", "3"], None);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_same_container(&a, &b, "--jobs 1 vs --jobs 3");
    let o = run_convert(&src, &tmp.path().join("j0.waste"), &["--jobs", "0"], None);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

#[test]
fn convert_release_reclaim_refuses_a_shard_still_needed() {
    let tmp = TempDir::new("release-reclaim-ledger");
    let src = source_copy(&tmp);
    let ckpt = HfCheckpoint::open(&src).unwrap();
    let mut ledger = ShardLedger::new(&ckpt, &[2, 3]);
    // Shard 4 holds the LM head and layer 3's upper experts.
    let e = ledger.reclaim(3).unwrap_err().to_string();
    assert!(e.contains("model-00004-of-00004.safetensors") && e.contains("not written yet"), "{e}");
    assert!(src.join(SHARDS[3]).is_file());
    ledger.done(Unit::Trunk);
    assert_eq!(ledger.reclaimable(), vec![0], "only the embedding + dense-layer shard is free");
    ledger.reclaim(0).unwrap();
    assert!(!src.join(SHARDS[0]).exists());
    let e = ledger.reclaim(1).unwrap_err().to_string();
    assert!(e.contains("layer 2"), "{e}");
    ledger.done(Unit::Bank(2));
    ledger.reclaim(1).unwrap();
    assert_eq!(ledger.needed_by(2).into_iter().collect::<Vec<_>>(), vec![Unit::Bank(3)]);
}

#[test]
fn convert_release_reclaim_deletes_every_shard_and_resumes_after_a_kill() {
    let tmp = TempDir::new("release-reclaim");
    let one_shot = tmp.path().join("one.waste");
    assert!(run_convert(&fixture(FIXTURE), &one_shot, &[], None).status.success());

    let src = source_copy(&tmp);
    let out = tmp.path().join("r.waste");
    let o = run_convert(&src, &out, &["--reclaim"], Some(("WASTE_CONVERT_FAIL_AFTER_BANKS", "1")));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    // Trunk and layer 2 written: shards 1 (embedding, layers 0-1) and 2
    // (layer 2) are gone, 3 and 4 (layer 3, LM head... written, but layer 3
    // is not) stay.
    let present: Vec<bool> = SHARDS.iter().map(|s| src.join(s).is_file()).collect();
    assert_eq!(present, vec![false, false, true, true]);
    let o = run_convert(&src, &out, &["--reclaim"], None);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(SHARDS.iter().all(|s| !src.join(s).exists()), "every shard reclaimed");
    assert!(src.join("config.json").is_file() && src.join("tokenizer.json").is_file(), "only shards are deleted");
    assert_same_container(&one_shot, &out, "reclaimed + resumed vs one-shot");

    // Without the finished output, the deleted shards are an error.
    let o = run_convert(&src, &tmp.path().join("again.waste"), &[], None);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("does not exist"), "{}", stderr(&o));
    let o = run_convert(&fixture(FIXTURE), &tmp.path().join("v.waste"), &["--reclaim", "--verify"], None);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--verify"), "{}", stderr(&o));
}

#[test]
fn convert_release_verify_reports_the_error_of_every_matrix() {
    let tmp = TempDir::new("release-verify");
    let src = fixture(FIXTURE);
    let exact = tmp.path().join("f32.waste");
    let o = run_convert(&src, &exact, &["--experts", "f32", "--verify", "--json"], None);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2 * 16 * 3, "2 MoE layers x 16 experts x gate/up/down");
    assert!(rows.iter().all(|r| r["max_abs"] == 0.0 && r["rms"] == 0.0), "f32 experts are exact");

    let o = run_convert(&src, &tmp.path().join("rvq3.waste"), &["--verify"], None);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("max_abs") && text.contains("relative"), "{text}");
    let rel: Vec<f64> = text
        .lines()
        .filter(|l| l.contains(" gate ") || l.contains(" up ") || l.contains(" down "))
        .map(|l| l.split_whitespace().last().unwrap().parse().unwrap())
        .collect();
    assert_eq!(rel.len(), 96, "{text}");
    // 3-bit RVQ: a real, bounded error (LESSONS.md: ~0.2 on real experts).
    assert!(rel.iter().all(|&r| r > 0.01 && r < 0.6), "{rel:?}");
}

/// Rewrites a safetensors header in place (same length).
fn edit_header(path: &Path, edit: impl Fn(&str) -> String) {
    let mut bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let text = std::str::from_utf8(&bytes[8..8 + n]).unwrap().to_string();
    let new = edit(&text);
    assert_eq!(new.len(), text.len(), "header edit must keep the length");
    assert_ne!(new, text, "header edit changed nothing");
    bytes[8..8 + n].copy_from_slice(new.as_bytes());
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn convert_release_bad_inputs_fail_with_a_clear_error() {
    let tmp = TempDir::new("release-bad");
    let convert_err = |src: &Path, tag: &str| {
        let out = tmp.path().join(format!("{tag}.waste"));
        let o = run_convert(src, &out, &[], None);
        assert_eq!(o.status.code(), Some(1), "{tag}: {}", stderr(&o));
        assert_eq!(stderr(&o).lines().count(), 1, "{tag}: one line: {}", stderr(&o));
        stderr(&o)
    };

    // Wrong MXFP4 scale shape: [32, 2] declared as [64, 1].
    let src = source_copy(&tmp);
    let key = "\"model.layers.2.mlp.experts.0.gate_proj.weight_scale\":{\"dtype\":\"U8\",\"shape\":[32,2]";
    edit_header(&src.join(SHARDS[1]), |h| h.replace(key, &key.replace("[32,2]", "[64,1]")));
    let e = convert_err(&src, "scale-shape");
    assert!(e.contains("experts.0.gate_proj") && e.contains("[64, 1]") && e.contains("[32, 2]"), "{e}");

    // A truncated shard.
    let src = tmp.path().join("trunc");
    std::fs::rename(source_copy(&tmp), &src).unwrap();
    let f = src.join(SHARDS[2]);
    let len = std::fs::metadata(&f).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&f).unwrap().set_len(len - 100).unwrap();
    let e = convert_err(&src, "truncated");
    assert!(e.contains(SHARDS[2]) && e.contains("truncated"), "{e}");

    // An fp8 weight without its block scale.
    let src = tmp.path().join("noscale");
    std::fs::rename(source_copy(&tmp), &src).unwrap();
    edit_header(&src.join(SHARDS[0]), |h| {
        h.replacen("layers.0.self_attn.o_proj.weight_scale_inv", "layers.0.self_attn.o_proj.weight_scale_xxx", 1)
    });
    let e = convert_err(&src, "noscale");
    assert!(e.contains("o_proj.weight") && e.contains("_scale_inv"), "{e}");

    // An E8M0 scale byte of 255 (NaN).
    let src = tmp.path().join("nan");
    std::fs::rename(source_copy(&tmp), &src).unwrap();
    let shard = src.join(SHARDS[1]);
    let (n, h) = header(&shard);
    let off = h["model.layers.2.mlp.experts.3.up_proj.weight_scale"]["data_offsets"][0].as_u64().unwrap() as usize;
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[8 + n + off] = 255;
    std::fs::write(&shard, bytes).unwrap();
    let e = convert_err(&src, "nan");
    assert!(e.contains("experts.3.up_proj") && e.contains("255"), "{e}");
}

#[test]
fn convert_release_k3_prefixed_mxfp4_experts_land_exactly_in_the_records() {
    let dir = fixture("kimi_k3-mxfp4");
    let reference = read_f32_tensors(&dir.join("dequantized.safetensors"));
    let ckpt = HfCheckpoint::open(&dir).unwrap();
    for (name, want) in &reference {
        // The text tensors carry the prefix; the fixture's one vision tensor keeps its name.
        let plain = name.strip_prefix("language_model.").unwrap_or(name);
        let (got, _) = ckpt.tensor_f32(plain).unwrap_or_else(|e| panic!("{plain}: {e}"));
        assert!(got.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()) && got.len() == want.len(), "{plain}");
    }
    assert_eq!(ckpt.tensor_encoding("model.layers.1.block_sparse_moe.experts.0.w1.weight").as_deref(), Some("mxfp4"));

    // Through the converter: f32 expert records hold exactly the dequantised latent experts.
    let tmp = TempDir::new("release-k3");
    let out = tmp.path().join("k3.waste");
    let o = run_convert(&dir, &out, &["--experts", "f32", "--trunk", "f32", "--jobs", "2"], None);
    assert!(o.status.success(), "{}", stderr(&o));
    let container = waste_engine::container::Container::open(&out).unwrap();
    let banks = container.expert_banks().unwrap();
    let layers = banks.moe_layers();
    assert!(!layers.is_empty());
    for layer in layers {
        let bank = banks.bank(layer).unwrap();
        let bytes = std::fs::read(&bank.path).unwrap();
        for e in 0..bank.experts {
            let rec = &bytes[e * banks.record_bytes()..(e + 1) * banks.record_bytes()];
            let (g, u, d) =
                waste_engine::quant::decode_expert(bank.format, banks.shape(), &rec[banks.payload_range(layer)], None);
            let p = format!("language_model.model.layers.{layer}.block_sparse_moe.experts.{e}");
            for (got, w) in [(g, "w1"), (u, "w3"), (d, "w2")] {
                assert!(got == reference[&format!("{p}.{w}.weight")], "layer {layer} expert {e} {w}");
            }
        }
    }
}

/// The fixture's files without its shards: what a downloader fetches first.
fn source_without_shards(tmp: &TempDir, name: &str) -> PathBuf {
    let dst = tmp.path().join(name);
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(fixture(FIXTURE)).unwrap() {
        let e = e.unwrap();
        if !SHARDS.iter().any(|s| e.file_name() == *s) {
            std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
        }
    }
    dst
}

fn shards_present(dir: &Path) -> usize {
    SHARDS.iter().filter(|s| dir.join(s).exists()).count()
}

/// Bytes of source shards on disk now (a `.part` being written included).
fn shard_bytes(dir: &Path) -> u64 {
    let names = SHARDS.iter().flat_map(|s| [s.to_string(), format!("{s}.part")]);
    names.filter_map(|n| std::fs::metadata(dir.join(n)).ok()).map(|m| m.len()).sum()
}

/// A downloader: copies `shards` into `dst` in index order, each only once
/// fewer than `window` shards are there, most as `<name>.part` then renamed,
/// `in_place` ones written under their final name in two halves with a pause
/// between (the converter must wait for the second). Stops when `child`
/// exits. Returns (shards fed, the most shards ever seen present).
fn feed_shards(
    dst: &Path,
    shards: &[&str],
    window: usize,
    in_place: &str,
    child: &mut std::process::Child,
) -> (usize, usize) {
    let mut most = 0;
    let mut most_bytes = 0;
    for (fed, name) in shards.iter().enumerate() {
        loop {
            let n = shards_present(dst);
            most = most.max(n);
            most_bytes = most_bytes.max(shard_bytes(dst));
            if n < window {
                break;
            }
            if child.try_wait().unwrap().is_some() {
                return (fed, most);
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let bytes = std::fs::read(fixture(FIXTURE).join(name)).unwrap();
        if *name == in_place {
            use std::io::Write;
            let mut f = std::fs::File::create(dst.join(name)).unwrap();
            f.write_all(&bytes[..bytes.len() / 2]).unwrap();
            f.flush().unwrap();
            std::thread::sleep(std::time::Duration::from_millis(400));
            f.write_all(&bytes[bytes.len() / 2..]).unwrap();
        } else {
            let part = dst.join(format!("{name}.part"));
            std::fs::write(&part, &bytes).unwrap();
            std::fs::rename(&part, dst.join(name)).unwrap();
        }
        most = most.max(shards_present(dst));
        most_bytes = most_bytes.max(shard_bytes(dst));
    }
    eprintln!("feed_shards: at most {most} shard(s), {most_bytes} source bytes on disk at once");
    (shards.len(), most)
}

fn spawn_convert(src: &Path, out: &Path, extra: &[&str], env: Option<(&str, &str)>, log: &Path) -> std::process::Child {
    let mut cmd = Command::new(waste_bin());
    cmd.args(["convert", src.to_str().unwrap(), out.to_str().unwrap()]).args(extra);
    if let Some((k, v)) = env {
        cmd.env(k, v);
    }
    cmd.stdout(std::process::Stdio::null()).stderr(std::fs::File::create(log).unwrap());
    cmd.spawn().expect("spawn waste convert")
}

/// `--follow --reclaim` starts from config + index alone and converts while
/// a downloader keeping at most 2 shards on disk feeds them (2 is this
/// fixture's floor: layer 3's bank spans shards 3 and 4); interrupted after
/// the first bank and rerun, it resumes. The output is the one-shot one.
#[test]
fn convert_release_follow_reclaim_converts_while_shards_arrive_at_most_2_on_disk() {
    let tmp = TempDir::new("release-follow");
    let one_shot = tmp.path().join("one.waste");
    assert!(run_convert(&fixture(FIXTURE), &one_shot, &[], None).status.success());
    let args = ["--follow", "--reclaim", "--follow-timeout", "60"];

    let src = source_without_shards(&tmp, "dl");
    let out = tmp.path().join("f.waste");
    let log = tmp.path().join("f.log");
    let mut child = spawn_convert(&src, &out, &args, None, &log);
    let (fed, most) = feed_shards(&src, &SHARDS, 2, SHARDS[1], &mut child);
    let status = child.wait().unwrap();
    let err = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{err}");
    assert_eq!(fed, 4, "{err}");
    assert!(most <= 2, "{most} shards were on disk at once");
    assert_eq!(shards_present(&src), 0, "every shard reclaimed");
    assert!(std::fs::read_dir(&out).unwrap().all(|e| !e.unwrap().file_name().to_string_lossy().contains("part")));
    assert_same_container(&one_shot, &out, "--follow --reclaim vs one-shot");

    // Killed after the first bank (layer 2), then rerun: the downloader
    // goes on with the shards the first run did not consume.
    let src = source_without_shards(&tmp, "dl2");
    let out = tmp.path().join("r.waste");
    let log = tmp.path().join("r.log");
    let mut child = spawn_convert(&src, &out, &args, Some(("WASTE_CONVERT_FAIL_AFTER_BANKS", "1")), &log);
    let (fed, most) = feed_shards(&src, &SHARDS, 2, "", &mut child);
    let status = child.wait().unwrap();
    let err = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(!out.join("manifest.json").exists() && out.join("experts-002.bin.done").is_file(), "{err}");
    let mut child = spawn_convert(&src, &out, &args, None, &log);
    let (rest, most2) = feed_shards(&src, &SHARDS[fed..], 2, "", &mut child);
    let status = child.wait().unwrap();
    let err = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{err}");
    assert_eq!(fed + rest, 4, "{err}");
    assert!(most.max(most2) <= 2);
    assert_eq!(shards_present(&src), 0, "every shard reclaimed");
    assert_same_container(&one_shot, &out, "--follow resumed vs one-shot");
}

/// A shard that never arrives: with a window of 1 shard, layer 3's bank
/// waits for shard 4 while the downloader waits for shard 3 to go. The
/// converter gives up after --follow-timeout, naming the shard and the unit.
#[test]
fn convert_release_follow_times_out_naming_the_missing_shard() {
    let tmp = TempDir::new("release-follow-timeout");
    let src = source_without_shards(&tmp, "dl");
    let out = tmp.path().join("t.waste");
    let log = tmp.path().join("t.log");
    let mut child = spawn_convert(&src, &out, &["--follow", "--reclaim", "--follow-timeout", "2"], None, &log);
    let (fed, _) = feed_shards(&src, &SHARDS, 1, "", &mut child);
    let status = child.wait().unwrap();
    let err = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert_eq!(fed, 3, "{err}");
    assert!(err.contains("model-00004-of-00004.safetensors does not exist"), "{err}");
    assert!(err.contains("expert bank of layer 3") && err.contains("after 2 s"), "{err}");
    assert!(!out.join("manifest.json").exists());

    // Without an index there is nothing to follow (usage-level error).
    let single = tmp.path().join("single");
    std::fs::create_dir_all(&single).unwrap();
    std::fs::copy(src.join("config.json"), single.join("config.json")).unwrap();
    let o = run_convert(&single, &tmp.path().join("s.waste"), &["--follow"], None);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("model.safetensors.index.json"), "{}", stderr(&o));
}
