//! The GGUF reader against the files and reference values of
//! tests/fixtures/gguf (written by tests/gen_gguf_fixtures.py with the
//! `gguf` package, the gguf-py llama.cpp ships): every tensor type
//! dequantised bit for bit as `gguf.quants.dequantize`, every metadata type,
//! and every malformed file refused with one line naming what is wrong.

use std::path::PathBuf;

use super::{GgufFile, Value};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/gguf")
}

fn json(name: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir().join(name)).unwrap()).unwrap()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

/// Each file's tensors, dequantised, against gguf-py's bits.
fn check_dequantised(files: &[serde_json::Value]) -> usize {
    let mut checked = 0;
    for f in files {
        let path = dir().join(f["file"].as_str().unwrap());
        let g = GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(g.data_start, f["data_offset"].as_u64().unwrap(), "{}", path.display());
        assert_eq!(g.alignment, f["alignment"].as_u64().unwrap());
        assert_eq!(g.tensors.len() as u64, f["n_tensors"].as_u64().unwrap());
        for t in f["tensors"].as_array().unwrap() {
            let name = t["name"].as_str().unwrap();
            let info = g.tensor(name).unwrap_or_else(|| panic!("{name} missing"));
            let ne: Vec<u64> = t["ne"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
            assert_eq!(info.ne, ne, "{name}");
            assert_eq!(info.ty.name(), t["ggml_type"].as_str().unwrap(), "{name}");
            assert_eq!(info.start, t["file_offset"].as_u64().unwrap(), "{name}");
            assert_eq!(info.end - info.start, t["n_bytes"].as_u64().unwrap(), "{name}");
            let Some(deq) = t["dequantized"].as_str() else { continue };
            let all = std::fs::read(dir().join(deq)).unwrap();
            let (at, n) =
                (t["dequantized_offset"].as_u64().unwrap() as usize, t["dequantized_count"].as_u64().unwrap() as usize);
            let want = f32s(&all[at..at + 4 * n]);
            let got = g.tensor_f32(info).unwrap();
            assert_eq!(got.len(), want.len(), "{name}");
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(a.to_bits() == b.to_bits(), "{}: {name}[{i}] = {a:e}, gguf-py {b:e}", path.display());
            }
            checked += 1;
        }
    }
    checked
}

#[test]
fn every_tensor_type_dequantises_as_gguf_py_does() {
    let m = json("manifest.json");
    let types = m["types"].as_array().unwrap();
    let names: Vec<&str> = types.iter().map(|f| f["tensors"][0]["ggml_type"].as_str().unwrap()).collect();
    for want in
        ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "MXFP4"]
    {
        assert!(names.contains(&want), "no fixture for {want}: {names:?}");
    }
    let n = check_dequantised(types);
    assert!(n >= 14 * 4, "only {n} tensors checked");
}

#[test]
fn alignments_and_files_without_trailing_padding_read_like_gguf_py() {
    let m = json("manifest.json");
    let misc = m["misc"].as_array().unwrap();
    check_dequantised(misc);
}

#[test]
fn every_metadata_type_reads_back_its_value() {
    let m = json("manifest.json");
    let f = m["misc"].as_array().unwrap().iter().find(|f| f["file"] == "misc/kv_all_types.gguf").unwrap();
    let g = GgufFile::open(&dir().join("misc/kv_all_types.gguf")).unwrap();
    let kv = f["kv"].as_array().unwrap();
    assert_eq!(g.metadata().len(), kv.len());
    fn same(v: &Value, want: &serde_json::Value) -> bool {
        match (v, want) {
            (Value::F32(x), serde_json::Value::String(s)) => x.to_string() == *s || (s == "nan" && x.is_nan()),
            (Value::F64(x), serde_json::Value::String(s)) => x.to_string() == *s || (s == "nan" && x.is_nan()),
            // serde_json's float parse may be an ulp off in f64; f32 is exact.
            (Value::F32(x), w) => w.as_f64().map(|w| w as f32) == Some(*x),
            (Value::F64(x), w) => w.as_f64() == Some(*x),
            (Value::Bool(b), w) => w.as_bool() == Some(*b),
            (Value::Str(s), w) => w.as_str() == Some(s),
            (Value::I8(_) | Value::I16(_) | Value::I32(_) | Value::I64(_), w) => {
                let x = match *v {
                    Value::I8(x) => i64::from(x),
                    Value::I16(x) => i64::from(x),
                    Value::I32(x) => i64::from(x),
                    Value::I64(x) => x,
                    _ => unreachable!(),
                };
                w.as_i64() == Some(x)
            }
            (Value::Array(a), serde_json::Value::Array(w)) => {
                a.len() == w.len() && a.iter().zip(w).all(|(x, y)| same(x, y))
            }
            (v, w) => v.as_u64().is_some() && v.as_u64() == w.as_u64(),
        }
    }
    for ((key, value), want) in g.metadata().iter().zip(kv) {
        assert_eq!(key, want["key"].as_str().unwrap());
        assert!(same(value, &want["value"]), "{key}: read {value:?}, gguf-py {}", want["value"]);
    }
}

#[test]
fn malformed_files_are_refused_with_one_line_naming_the_field() {
    let cases = json("malformed.json");
    let mut refused = 0;
    let mut failures = Vec::new();
    for c in cases.as_array().unwrap() {
        let file = c["file"].as_str().unwrap();
        let accepted = c["llama_cpp"].as_str().unwrap();
        let path = dir().join(file);
        let result = GgufFile::open(&path);
        // llama.cpp's gguf_init accepts the base file, v2 and zero-element
        // tensors; so do we. A truncated data section it accepts without
        // allocating, but its loader refuses; we refuse at open.
        if accepted == "accepted" || accepted.starts_with("ACCEPTED") {
            result.unwrap_or_else(|e| panic!("{file}: refused a file llama.cpp accepts: {e}"));
            continue;
        }
        let e = match result {
            Ok(_) => panic!("{file}: accepted ({})", c["what"]),
            Err(e) => e.to_string(),
        };
        assert!(!e.contains('\n') && e.contains("not a valid GGUF file"), "{file}: {e}");
        let field = c["field"].as_str().unwrap_or("");
        // The message names what the case damaged: the header field, the
        // key or tensor by name (`kv[1].key` as "key 1"), or the truncation.
        let index = |prefix: &str, word: &str| {
            field.strip_prefix(prefix).and_then(|r| r.split(']').next()).map(|i| format!("{word} {i}"))
        };
        let by_index = [index("kv[", "key"), index("tensor_info[", "tensor")];
        let named = ["magic", "version", "tensor_count", "kv_count", "alignment"]
            .iter()
            .any(|f| field.contains(f) && e.contains(f))
            || field.split([' ', '(', ')', '[']).any(|w| !w.is_empty() && e.contains(&format!("`{w}`")))
            || by_index.iter().flatten().any(|k| e.contains(k.as_str()))
            || e.contains("truncated");
        if !named {
            failures.push(format!("{file}: `{e}` does not name {field:?}"));
        }
        refused += 1;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(refused >= 30, "{refused}");
}

#[test]
fn a_tensor_count_beyond_the_file_is_refused_before_allocating() {
    // 2^62 tensors would be an allocation of exabytes if believed.
    let e = GgufFile::open(&dir().join("malformed/tensor_count_2p62.gguf")).err().unwrap().to_string();
    assert!(e.contains("tensor_count"), "{e}");
}

/// A copy of a model fixture with `edit` applied to its bytes, viewed as
/// HF: the view's error, or `None` if it was accepted.
fn view_edited(model: &str, tag: &str, edit: impl FnOnce(&mut Vec<u8>)) -> Option<String> {
    let mut bytes = std::fs::read(dir().join("models").join(model)).unwrap();
    edit(&mut bytes);
    let tmp = std::env::temp_dir().join(format!("waste-gguf-{tag}-{}.gguf", std::process::id()));
    std::fs::write(&tmp, &bytes).unwrap();
    let g = GgufFile::open(&tmp).unwrap();
    let err = super::hf::view(&g).err().map(|e| e.to_string());
    std::fs::remove_file(&tmp).unwrap();
    err
}

/// The byte offset just past `key` (a GGUF key string) in `bytes`.
fn after_key(bytes: &[u8], key: &[u8]) -> usize {
    bytes.windows(key.len()).position(|w| w == key).expect("the fixture has the key") + key.len()
}

/// A deepseek2 file without `expert_gating_func` (what the converter writes
/// when config.json lacks `scoring_func`) is refused in one line, not run
/// with a guessed router: llama.cpp would route it with softmax
/// (GGUF_NOTES.md 4.6). The key is renamed in a copy of the fixture (same
/// length, so the layout does not move).
#[test]
fn a_deepseek2_file_without_its_gating_function_is_refused() {
    let model = "tiny-deepseek_v3-q8_0.gguf";
    let err = view_edited(model, "no-gating", |b| {
        let at = after_key(b, b"deepseek2.expert_gating_func");
        b[at - 1] = b'X';
    })
    .expect("refused");
    assert!(err.contains("expert_gating_func") && err.contains("softmax") && err.lines().count() == 1, "{err}");
    assert_eq!(view_edited(model, "gating-intact", |_| {}), None);
}

/// GLM-5's layers 2 and 3 share an earlier layer's indexer selection and
/// have no indexer tensors. A glm-dsa file that lost the key saying so
/// would read as "every layer has its own indexer" (llama.cpp's default
/// below 1M tokens of context): refused in one line naming the layer, not
/// run with indexers that are not there. With the key intact it reads.
#[test]
fn a_glm_dsa_file_whose_indexer_types_disagree_with_its_tensors_is_refused() {
    let model = "tiny-glm_moe_dsa-q8_0.gguf";
    let err = view_edited(model, "glm-dsa-types", |b| {
        let at = after_key(b, b"glm-dsa.attention.indexer.types");
        b[at - 1] = b'X';
    })
    .expect("refused");
    assert!(err.contains("layer 2") && err.contains("lacks indexer tensors") && err.lines().count() == 1, "{err}");
    assert_eq!(view_edited(model, "glm-dsa-intact", |_| {}), None);
}

/// MiniMax-M2 routes with a sigmoid; a file saying softmax (llama.cpp's
/// gating function 1) describes another model, refused in one line.
#[test]
fn a_minimax_m2_file_with_another_gating_function_is_refused() {
    let err = view_edited("tiny-minimax_m2-q8_0.gguf", "minimax-gating", |b| {
        // The key, its value type (u32: 4 bytes), then the value.
        let at = after_key(b, b"minimax-m2.expert_gating_func");
        assert_eq!(b[at..at + 8], [4, 0, 0, 0, 2, 0, 0, 0]);
        b[at + 4] = 1;
    })
    .expect("refused");
    assert!(err.contains("expert_gating_func 1") && err.lines().count() == 1, "{err}");
}

/// Found by the `gguf` fuzz target: 2^62 f32 values fit the i64 element
/// bound but not their 2^64 bytes, and the byte count overflowed (a panic
/// with overflow checks, a wrapped small size without them).
#[test]
fn a_tensor_whose_byte_count_overflows_is_refused() {
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes()); // tensors
    b.extend_from_slice(&0u64.to_le_bytes()); // metadata
    b.extend_from_slice(&1u64.to_le_bytes());
    b.push(b't');
    b.extend_from_slice(&1u32.to_le_bytes()); // n_dims
    b.extend_from_slice(&(1u64 << 62).to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes()); // F32
    b.extend_from_slice(&0u64.to_le_bytes()); // offset
    let path = std::env::temp_dir().join(format!("waste-gguf-overflow-{}.gguf", std::process::id()));
    std::fs::write(&path, &b).unwrap();
    let e = GgufFile::open(&path).err().map(|e| e.to_string());
    let _ = std::fs::remove_file(&path);
    assert!(e.as_deref().is_some_and(|e| e.contains("overflows")), "{e:?}");
}

fn split_dir() -> PathBuf {
    dir().join("split")
}

fn split_part(i: usize) -> PathBuf {
    split_dir().join(format!("wide-qwen3moe-q4_k_m-{i:05}-of-00003.gguf"))
}

/// A copy of some parts under new names in a fresh directory.
fn split_copy(tag: &str, parts: &[(usize, &str)]) -> PathBuf {
    let tmp = std::env::temp_dir().join(format!("waste-gguf-split-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    for &(i, name) in parts {
        std::fs::copy(split_part(i), tmp.join(name)).unwrap();
    }
    tmp
}

/// tests/fixtures/gguf/split holds wide-qwen3moe-q4_k_m.gguf in three parts
/// (tests/gen_gguf_fixtures_split.py, gguf-py's split writer): opened from
/// its first part it is the same model, key for key and byte for byte.
#[test]
fn a_split_model_reads_as_its_unsplit_twin() {
    let whole = GgufFile::open(&dir().join("models/wide-qwen3moe-q4_k_m.gguf")).unwrap();
    let split = GgufFile::open(&split_part(1)).unwrap();
    assert_eq!(split.parts().len(), 3);
    assert_eq!(split.part_lens.len(), 3);
    let keys = |g: &GgufFile| -> Vec<(String, Value)> {
        g.metadata().iter().filter(|(k, _)| !k.starts_with("split.")).cloned().collect()
    };
    assert_eq!(keys(&split), keys(&whole));
    assert_eq!(split.tensors.len(), whole.tensors.len());
    let mut parts_used = std::collections::BTreeSet::new();
    for t in &whole.tensors {
        let s = split.tensor(&t.name).unwrap_or_else(|| panic!("{} missing from the parts", t.name));
        assert_eq!((&s.ne, s.ty), (&t.ne, t.ty), "{}", t.name);
        let rows = t.ne[1..].iter().product();
        assert_eq!(split.rows_bytes(s, 0, rows).unwrap(), whole.rows_bytes(t, 0, rows).unwrap(), "{}", t.name);
        parts_used.insert(s.part);
    }
    assert_eq!(parts_used.len(), 3, "every part holds tensors");
}

#[test]
fn opening_a_later_part_names_the_first() {
    let e = GgufFile::open(&split_part(2)).err().expect("refused").to_string();
    assert!(
        e.contains("part 2 of 3") && e.contains("open the first part, wide-qwen3moe-q4_k_m-00001-of-00003.gguf"),
        "{e}"
    );
    assert_eq!(e.lines().count(), 1);
}

#[test]
fn a_missing_part_is_named() {
    let tmp = split_copy("missing", &[(1, "m-00001-of-00003.gguf"), (2, "m-00002-of-00003.gguf")]);
    let e = GgufFile::open(&tmp.join("m-00001-of-00003.gguf")).err().expect("refused").to_string();
    std::fs::remove_dir_all(&tmp).unwrap();
    assert!(e.contains("part 3 of 3") && e.contains("missing") && e.contains("m-00003-of-00003.gguf"), "{e}");
}

#[test]
fn a_part_of_another_split_is_refused() {
    let tmp = split_copy(
        "foreign",
        &[(1, "m-00001-of-00003.gguf"), (2, "m-00002-of-00003.gguf"), (2, "m-00003-of-00003.gguf")],
    );
    let e = GgufFile::open(&tmp.join("m-00001-of-00003.gguf")).err().expect("refused").to_string();
    std::fs::remove_dir_all(&tmp).unwrap();
    assert!(e.contains("m-00003-of-00003.gguf") && e.contains("says it is part 2 of 3"), "{e}");
    assert_eq!(e.lines().count(), 1);
}

#[test]
fn a_renamed_first_part_says_why_its_parts_are_not_found() {
    let tmp = split_copy("renamed", &[(1, "model.gguf")]);
    let e = GgufFile::open(&tmp.join("model.gguf")).err().expect("refused").to_string();
    std::fs::remove_dir_all(&tmp).unwrap();
    assert!(e.contains("3 parts") && e.contains("-00001-of-00003.gguf"), "{e}");
}
