//! GGUF input end to end: files written by llama.cpp's own
//! `convert_hf_to_gguf.py` (and by gguf-py's writer with ggml's Q4_K / Q6_K
//! quantisers, or by `llama-imatrix` and `llama-quantize` for every IQ type)
//! from tiny models, converted by `waste convert`, against
//! transformers run on the weights `gguf.quants.dequantize` gives for each
//! file (tests/fixtures/gguf/models.json); the same model converted from
//! its GGUF and from its safetensors giving the same logits; and the
//! tokenizer rebuilt from a GGUF vocabulary against the reference ids of
//! each family's real pre-tokenizer.

use std::path::{Path, PathBuf};

use waste_host::{Engine, Model, OpenOptions};

use crate::common::*;

pub(crate) fn gguf_dir() -> PathBuf {
    fixtures().join("gguf")
}

/// models.json (llama.cpp's converter, ggml's reference quantisers),
/// models_iq.json (llama-imatrix and llama-quantize, IQ types) and
/// models_spm.json (a Mixtral with a SentencePiece vocabulary).
pub(crate) fn models() -> Vec<serde_json::Value> {
    ["models.json", "models_iq.json", "models_spm.json"]
        .iter()
        .flat_map(|f| {
            let m: serde_json::Value = serde_json::from_slice(&std::fs::read(gguf_dir().join(f)).unwrap()).unwrap();
            m["models"].as_array().unwrap().clone()
        })
        .collect()
}

pub(crate) fn u32s(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

pub(crate) fn convert_gguf(file: &Path, experts: &str, trunk: &str, dir: &Path) -> PathBuf {
    let out = dir.join(format!("{}-{experts}-{trunk}.waste", file.file_stem().unwrap().to_string_lossy()));
    let o = waste(&["convert", file.to_str().unwrap(), out.to_str().unwrap(), "--experts", experts, "--trunk", trunk]);
    assert!(o.status.success(), "convert {} failed: {}", file.display(), stderr(&o));
    out
}

/// f32 logits at every position within 1e-4 of the largest, the same top-1
/// everywhere and the same greedy continuation, for every model fixture,
/// decoded to f32 and kept as stored (`--experts gguf --trunk gguf`, the
/// default for a GGUF file: the file's own blocks, computed on as such).
#[test]
fn gguf_models_match_transformers_on_their_dequantised_weights() {
    let tmp = TempDir::new("gguf-models");
    let engine = Engine::new().unwrap();
    for m in models() {
        let file = gguf_dir().join(m["file"].as_str().unwrap());
        let prompt = u32s(&m["prompt_ids"]);
        let shape = u32s(&m["logits_shape"]);
        let bytes = std::fs::read(gguf_dir().join(m["reference_logits"].as_str().unwrap())).unwrap();
        let want: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        let (t, v) = (shape[0] as usize, shape[1] as usize);
        assert_eq!((t, want.len()), (prompt.len(), t * v));
        for experts in ["f32", "gguf"] {
            let container = convert_gguf(&file, experts, experts, tmp.path());
            if experts == "gguf" {
                check_stored_types(&container, &m);
            }
            let mut session = engine.session(Model::open(&container, &exact()).unwrap()).unwrap();
            let (logits, _) = session.eval(&prompt, true).unwrap();
            let mut worst = 0f32;
            for p in 0..t {
                let (ours, theirs) = (&logits[p * v..(p + 1) * v], &want[p * v..(p + 1) * v]);
                let scale = theirs.iter().fold(0f32, |a, x| a.max(x.abs()));
                worst = worst.max(ours.iter().zip(theirs).fold(0f32, |a, (x, y)| a.max((x - y).abs())) / scale);
                assert_eq!(argmax(ours), argmax(theirs), "{} ({experts}): top-1 at position {p}", file.display());
            }
            eprintln!("{} experts {experts}: max |logit diff| / max |logit| = {worst:e}", m["file"]);
            assert!(worst <= 1e-4, "{} ({experts}): {worst:e}", file.display());
            session.reset();
            let out = session.generate(&prompt, &crate::oracle::greedy(), |_| true).unwrap();
            assert_eq!(out.tokens, u32s(&m["greedy_ids"]), "{} ({experts}): greedy continuation", file.display());
        }
    }
}

/// A `gguf` container names, per layer, the ggml types of the file's
/// `ffn_{gate,up,down}_exps` tensors (models.json's tensor table), and
/// keeps the token embedding in the file's type.
fn check_stored_types(container: &Path, m: &serde_json::Value) {
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(container.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["experts"]["format"], "gguf");
    let tensors = m["tensors"].as_array().unwrap();
    let type_of = |name: &str| -> &str {
        let t = tensors.iter().find(|t| t["name"] == name).unwrap_or_else(|| panic!("{name} not in models.json"));
        t["ggml_type"].as_str().unwrap()
    };
    let trunk = manifest["trunk"]["tensors"].as_array().unwrap();
    // `waste info` says the same: tensors by stored type, layers by their
    // gate/up/down types.
    let o = waste(&["info", container.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let info: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let total = |v: &serde_json::Value| v.as_object().unwrap().values().map(|n| n.as_u64().unwrap()).sum::<u64>();
    assert_eq!(total(&info["trunk_types"]), trunk.len() as u64, "{}", info["trunk_types"]);
    let mut by_layer = std::collections::BTreeMap::<String, u64>::new();
    for l in manifest["experts"]["layers"].as_array().unwrap() {
        let g = &l["ggml"];
        *by_layer
            .entry(format!(
                "{}/{}/{}",
                g["gate"].as_str().unwrap(),
                g["up"].as_str().unwrap(),
                g["down"].as_str().unwrap()
            ))
            .or_default() += 1;
    }
    let said: std::collections::BTreeMap<String, u64> =
        info["expert_types"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.as_u64().unwrap())).collect();
    assert_eq!(said, by_layer);
    let embed = trunk.iter().find(|t| t["name"] == "model.embed_tokens.weight").unwrap();
    let stored = match type_of("token_embd.weight") {
        "F32" => "f32",
        other => other,
    };
    assert_eq!(embed["format"], stored, "the embedding's type");
    let layers = manifest["experts"]["layers"].as_array().unwrap();
    assert!(!layers.is_empty());
    for l in layers {
        let n = l["layer"].as_u64().unwrap();
        for proj in ["gate", "up", "down"] {
            assert_eq!(l["ggml"][proj], type_of(&format!("blk.{n}.ffn_{proj}_exps.weight")), "layer {n} {proj}");
        }
    }
}

/// tiny-qwen3_moe-f32.gguf is llama.cpp's conversion of tests/fixtures/
/// tiny-qwen3_moe, weights unchanged: both routes, in the default formats,
/// make the same container bytes' worth of logits and the same tokens.
#[test]
fn a_gguf_and_its_safetensors_convert_to_the_same_logits() {
    let tmp = TempDir::new("gguf-routes");
    let gguf = convert_gguf(&gguf_dir().join("models/tiny-qwen3_moe-f32.gguf"), "rvq3", "q4", tmp.path());
    let hf = convert("qwen3_moe", "rvq3", "q4", tmp.path());
    let reference = reference("qwen3_moe");
    let engine = Engine::new().unwrap();
    let run = |c: &Path| {
        let mut s = engine.session(Model::open(c, &OpenOptions::default()).unwrap()).unwrap();
        let ids = s.tokenize(&reference.prompt_text).unwrap();
        let (logits, _) = s.eval(&reference.prompt_ids, true).unwrap();
        (ids, logits)
    };
    let (gguf_ids, gguf_logits) = run(&gguf);
    let (hf_ids, hf_logits) = run(&hf);
    assert_eq!(gguf_ids, reference.prompt_ids, "the rebuilt tokenizer against transformers' ids");
    assert_eq!(hf_ids, reference.prompt_ids);
    assert_eq!(gguf_logits.len(), hf_logits.len());
    let differ = gguf_logits.iter().zip(&hf_logits).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
    assert_eq!(differ, 0, "{differ} of {} logits differ between the two routes", hf_logits.len());
}

/// `get_vocab_base` of llama.cpp's converter (conversion/base.py): every
/// id in order, added tokens CONTROL when special or looking special
/// (`<|...|>`), USER_DEFINED otherwise, missing ids `[PAD{id}]` UNUSED, and
/// merges as "a b".
fn gguf_vocab_of(tokenizer_json: &serde_json::Value, pre: &str) -> waste_engine::gguf::tokenizer::Vocab {
    let model = &tokenizer_json["model"];
    let mut by_id: std::collections::BTreeMap<u64, (String, i64)> = std::collections::BTreeMap::new();
    for (tok, id) in model["vocab"].as_object().unwrap() {
        by_id.insert(id.as_u64().unwrap(), (tok.clone(), 1));
    }
    for a in tokenizer_json["added_tokens"].as_array().unwrap() {
        let tok = a["content"].as_str().unwrap().to_string();
        let looks_special = tok.starts_with("<|") && tok.ends_with("|>");
        let ty = if a["special"].as_bool().unwrap() || looks_special { 3 } else { 4 };
        by_id.insert(a["id"].as_u64().unwrap(), (tok, ty));
    }
    let n = by_id.keys().last().unwrap() + 1;
    let (mut tokens, mut types) = (Vec::new(), Vec::new());
    for i in 0..n {
        let (t, ty) = by_id.get(&i).cloned().unwrap_or((format!("[PAD{i}]"), 5));
        tokens.push(t);
        types.push(ty);
    }
    let merges = model["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            serde_json::Value::String(s) => s.clone(),
            pair => format!("{} {}", pair[0].as_str().unwrap(), pair[1].as_str().unwrap()),
        })
        .collect();
    waste_engine::gguf::tokenizer::Vocab {
        model: "gpt2".into(),
        pre: pre.into(),
        tokens,
        types,
        merges,
        add_space_prefix: true,
        bos: None,
        eos: None,
        add_bos: false,
        chat_template: None,
    }
}

/// Each family's real pre-tokenizer (tests/fixtures/tokenizer_families),
/// its vocabulary taken apart as llama.cpp's converter stores it and rebuilt
/// from the `tokenizer.ggml.pre` name the converter gives that family:
/// transformers' ids for every text, in both special-token modes.
#[test]
fn tokenizers_rebuilt_from_gguf_vocabularies_match_the_reference_ids() {
    let families = [
        ("qwen2", "qwen2"),
        ("qwen35", "qwen35"),
        ("deepseek_v3", "deepseek-v3"),
        ("glm4", "glm4"),
        ("gpt_oss", "gpt-4o"),
        ("minimax_m2", "minimax-m2"),
    ];
    let mut failures = Vec::new();
    let mut checked = 0;
    for (dir, pre) in families {
        let dir = fixtures().join("tokenizer_families").join(dir);
        let original: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("tokenizer.json")).unwrap()).unwrap();
        let files = waste_engine::gguf::tokenizer::files(&gguf_vocab_of(&original, pre)).unwrap();
        let json = String::from_utf8(files.iter().find(|(n, _)| *n == "tokenizer.json").unwrap().1.clone()).unwrap();
        let rebuilt: serde_json::Value = serde_json::from_str(&json).unwrap();
        // The pre-tokenizer's regexes are the release's, character for character.
        let regexes = |j: &serde_json::Value| -> Vec<String> {
            j["pre_tokenizer"]["pretokenizers"]
                .as_array()
                .map(|a| a.iter().filter_map(|p| p["pattern"]["Regex"].as_str().map(str::to_string)).collect())
                .unwrap_or_default()
        };
        assert_eq!(regexes(&rebuilt), regexes(&original), "{}", dir.display());
        let tk = waste_guest::tokenizer::Tokenizer::from_json(&json).unwrap();
        let cases: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("cases.json")).unwrap()).unwrap();
        let variant = cases["variants"].as_object().unwrap().values().next().unwrap();
        for (i, text) in cases["texts"].as_array().unwrap().iter().enumerate() {
            let text = text.as_str().unwrap();
            for (key, got) in [("markup", tk.encode_markup(text)), ("content", tk.encode(text))] {
                if got != u32s(&variant[key][i]) {
                    failures.push(format!("{} {key} #{i} {text:?}", dir.display()));
                }
                checked += 1;
            }
        }
    }
    assert!(failures.is_empty(), "{} of {checked} differ:\n{}", failures.len(), failures.join("\n"));
    assert!(checked > 600, "{checked}");
}

/// A SentencePiece (`llama`) vocabulary as llama.cpp's converter writes it
/// (tests/fixtures/tokenizer_families/llama_spm/vocab.gguf, from a
/// tokenizer.model trained with Llama's settings), rebuilt: transformers'
/// merges and vocabulary exactly, and transformers' ids and decoding for
/// every text, byte fallback and `▁` spaces included.
#[test]
fn a_sentencepiece_gguf_vocabulary_tokenizes_as_transformers_does() {
    use waste_engine::gguf::{tokenizer, GgufFile};
    let dir = fixtures().join("tokenizer_families/llama_spm");
    let g = GgufFile::open(&dir.join("vocab.gguf")).unwrap();
    let vocab = tokenizer::Vocab::read(&g).unwrap();
    assert_eq!((vocab.model.as_str(), vocab.add_bos, vocab.bos, vocab.eos), ("llama", true, Some(1), Some(2)));
    let files = tokenizer::files(&vocab).unwrap();
    let json = String::from_utf8(files.iter().find(|(n, _)| *n == "tokenizer.json").unwrap().1.clone()).unwrap();
    let rebuilt: serde_json::Value = serde_json::from_str(&json).unwrap();
    let original: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("tokenizer.json")).unwrap()).unwrap();
    for key in ["vocab", "merges", "byte_fallback", "fuse_unk"] {
        assert_eq!(rebuilt["model"][key], original["model"][key], "model.{key}");
    }
    for key in ["pre_tokenizer", "decoder", "added_tokens"] {
        assert_eq!(rebuilt[key], original[key], "{key}");
    }
    let tk = waste_guest::tokenizer::Tokenizer::from_json(&json).unwrap();
    let cases: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("cases.json")).unwrap()).unwrap();
    let mut failures = Vec::new();
    let texts = cases["texts"].as_array().unwrap();
    for (i, text) in texts.iter().enumerate() {
        let text = text.as_str().unwrap();
        let markup = tk.encode_markup(text);
        if markup != u32s(&cases["markup"][i]) {
            failures.push(format!("markup #{i} {text:?}"));
        }
        if tk.encode(text) != u32s(&cases["content"][i]) {
            failures.push(format!("content #{i} {text:?}"));
        }
        if tk.decode(&u32s(&cases["markup"][i])).unwrap() != cases["decode_markup"][i].as_str().unwrap() {
            failures.push(format!("decode #{i} {text:?}"));
        }
    }
    assert!(texts.len() > 60);
    assert!(failures.is_empty(), "{} of {} texts differ:\n{}", failures.len(), texts.len(), failures.join("\n"));
}

/// A Mixtral GGUF as released ones are, its vocabulary SentencePiece's
/// (byte fallback, `▁` spaces) as llama.cpp's converter writes it from a
/// tokenizer.model (tests/gen_gguf_fixtures_spm.py), run in place from
/// text to text: transformers' ids for the text (its BOS added as the
/// release's tokenizer adds it), for Mixtral-Instruct's template from the
/// file, and the continuation's text as transformers decodes it, byte
/// tokens included. Its logits and greedy ids are held with every other
/// fixture's (`models()`).
#[test]
fn a_mixtral_gguf_with_a_sentencepiece_vocabulary_runs_from_text_to_text() {
    let m = models().into_iter().find(|m| m["file"] == "models/tiny-mixtral_spm-q8_0.gguf").unwrap();
    let (file, text) = (gguf_dir().join(m["file"].as_str().unwrap()), &m["text"]);
    let engine = Engine::new().unwrap();
    let model = Model::open(&file, &exact()).unwrap();
    assert_eq!(model.info().bos_token, Some(1), "add_bos_token: the release's tokenizer adds <s>");
    let mut session = engine.session(model).unwrap();
    let content = session.tokenize(text["text"].as_str().unwrap()).unwrap();
    assert_eq!(content, u32s(&text["content_ids"]), "the text's ids");
    assert_eq!([&[1][..], &content].concat(), u32s(&text["ids"]), "the prompt's ids");

    let chat = &m["chat"];
    let messages: Vec<waste_host::ChatMessage> = chat["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|msg| waste_host::ChatMessage {
            role: msg["role"].as_str().unwrap().into(),
            content: Some(msg["content"].as_str().unwrap().into()),
            extra: None,
            media: Vec::new(),
        })
        .collect();
    assert_eq!(session.render_chat_template(&messages, None, true).unwrap(), chat["text"].as_str().unwrap());
    assert_eq!(session.apply_chat_template(&messages, None, true).unwrap(), u32s(&chat["ids"]), "the chat's ids");

    let greedy = u32s(&m["greedy_ids"]);
    assert!(greedy.iter().any(|&t| (3..259).contains(&t)), "the continuation holds no byte token: {greedy:?}");
    assert_eq!(session.detokenize(&content).unwrap(), text["prompt_text"].as_str().unwrap());
    let all = session.detokenize(&[u32s(&text["ids"]), greedy.clone()].concat()).unwrap();
    assert_eq!(all, text["decode_markup"].as_str().unwrap(), "the prompt and continuation, <s> kept");

    let n = greedy.len().to_string();
    let o = waste(&["run", file.to_str().unwrap(), text["text"].as_str().unwrap(), "-n", &n, "--temp", "0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), format!("{}\n", text["continuation_text"].as_str().unwrap()), "the streamed text");
}

/// A GGUF of an architecture we do not run, or a broken one, is one line.
#[test]
fn convert_refuses_broken_and_unsupported_gguf_files_with_one_line() {
    let tmp = TempDir::new("gguf-refused");
    for (file, want) in [
        ("malformed/truncated_data.gguf", "truncated"),
        ("malformed/bad_magic.gguf", "not a valid GGUF file"),
        ("types/q4_k.gguf", "GGUF architecture `wastetest`"),
    ] {
        let out = tmp.path().join("out.waste");
        let o = waste(&["convert", gguf_dir().join(file).to_str().unwrap(), out.to_str().unwrap()]);
        let err = stderr(&o);
        assert!(!o.status.success(), "{file}: converted");
        assert!(err.contains(want) && err.trim().lines().count() == 1, "{file}: {err}");
    }
}

/// A split model (tests/fixtures/gguf/split: wide-qwen3moe-q4_k_m in three
/// parts, its experts' slabs in different files) converted from its first
/// part gives its unsplit twin's logits bit for bit, kept as stored; and
/// `convert` given a later part says which file to give it.
#[test]
fn a_split_gguf_converts_to_the_logits_of_its_unsplit_twin() {
    let tmp = TempDir::new("gguf-split");
    let split = gguf_dir().join("split/wide-qwen3moe-q4_k_m-00001-of-00003.gguf");
    let whole = convert_gguf(&gguf_dir().join("models/wide-qwen3moe-q4_k_m.gguf"), "gguf", "gguf", tmp.path());
    let parts = convert_gguf(&split, "gguf", "gguf", tmp.path());
    let m = models().into_iter().find(|m| m["file"] == "models/wide-qwen3moe-q4_k_m.gguf").unwrap();
    check_stored_types(&parts, &m);
    let prompt = u32s(&m["prompt_ids"]);
    let engine = Engine::new().unwrap();
    let logits = |c: &Path| {
        let mut s = engine.session(Model::open(c, &OpenOptions::default()).unwrap()).unwrap();
        s.eval(&prompt, true).unwrap().0
    };
    let (a, b) = (logits(&whole), logits(&parts));
    assert_eq!(a.len(), b.len());
    let differ = a.iter().zip(&b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
    assert_eq!(differ, 0, "{differ} of {} logits differ between the split file and its twin", a.len());

    let out = tmp.path().join("from-part-2.waste");
    let part2 = gguf_dir().join("split/wide-qwen3moe-q4_k_m-00002-of-00003.gguf");
    let o = waste(&["convert", part2.to_str().unwrap(), out.to_str().unwrap()]);
    let err = stderr(&o);
    assert!(!o.status.success() && err.trim().lines().count() == 1, "{err}");
    assert!(err.contains("open the first part, wide-qwen3moe-q4_k_m-00001-of-00003.gguf"), "{err}");
}

/// tiny-qwen3_moe with a tokenizer 16 tokens narrower than its embedding:
/// what llama.cpp's converter writes as `[PAD{id}]` UNUSED tokens (which
/// the rebuilt tokenizer.json leaves out, as the release's own does) and
/// what Qwen's releases ship (151,936 rows for 151,669 tokens). The last 16
/// merges' tokens are dropped with every merge that makes or uses them.
fn padded_qwen3_moe(dir: &Path) -> PathBuf {
    let src = fixture("qwen3_moe");
    let hf = dir.join("tiny-qwen3_moe-padded");
    copy_dir(&src, &hf);
    let mut tok: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("tokenizer.json")).unwrap()).unwrap();
    let vocab = tok["model"]["vocab"].as_object_mut().unwrap();
    let rows = vocab.len() as u64;
    let dropped: Vec<String> =
        vocab.iter().filter(|(_, id)| id.as_u64().unwrap() >= rows - 16).map(|(t, _)| t.clone()).collect();
    vocab.retain(|_, id| id.as_u64().unwrap() < rows - 16);
    let merges = tok["model"]["merges"].as_array_mut().unwrap();
    merges.retain(|m| {
        let (a, b) = (m[0].as_str().unwrap(), m[1].as_str().unwrap());
        ![a.to_string(), b.to_string(), format!("{a}{b}")].iter().any(|t| dropped.contains(t))
    });
    std::fs::write(hf.join("tokenizer.json"), serde_json::to_vec(&tok).unwrap()).unwrap();
    let out = dir.join("padded.waste");
    let o = waste(&["convert", hf.to_str().unwrap(), out.to_str().unwrap(), "--experts", "q8", "--trunk", "f32"]);
    assert!(o.status.success(), "convert: {}", stderr(&o));
    out
}

/// `waste run` on a converted llama.cpp GGUF at temperature 2 ended with
/// `error: control component: unknown token id 535`, and `waste eval
/// --tokens` refused ids the embedding has: padding rows are never
/// sampled, decode to nothing, and are accepted as input.
#[test]
fn a_padded_vocabulary_never_fails_generation_at_temperature_2() {
    let tmp = TempDir::new("padded-vocab");
    let model = padded_qwen3_moe(tmp.path());
    let m = model.to_str().unwrap();
    // The padding rows hold real probability: the random tiny model gives
    // them about their share (16 of 512) of the mass at temperature 2.
    let o = waste(&["eval", m, "--tokens", "500,511,3", "--json", "--top", "512"]);
    assert!(o.status.success(), "eval of padding ids: {}", stderr(&o));
    let top: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    let padding_mass: f64 = top["top"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["id"].as_u64().unwrap() >= 496)
        .map(|t| (t["logprob"].as_f64().unwrap() / 2.0).exp())
        .sum();
    assert!(padding_mass > 0.005, "padding rows hold {padding_mass} of the unnormalised mass");
    for t in top["top"].as_array().unwrap().iter().filter(|t| t["id"].as_u64().unwrap() >= 496) {
        assert_eq!(t["text"], "", "a padding row decodes to nothing");
    }
    for seed in ["1", "2", "3"] {
        let o = waste(&["run", m, "Hello", "--temp", "2", "--seed", seed, "-n", "200", "--logprobs", "0"]);
        assert!(o.status.success(), "seed {seed}: {}", stderr(&o));
        let sampled: Vec<u64> = stderr(&o)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|j| j["token"].as_u64())
            .collect();
        assert!(!sampled.is_empty(), "no token lines: {}", stderr(&o));
        assert!(sampled.iter().all(|&t| t < 496), "seed {seed} sampled a padding row: {sampled:?}");
    }
}

/// `--experts gguf` and `--trunk gguf` copy a GGUF file's blocks; a
/// Hugging Face checkpoint has none to copy: one line, nothing written.
#[test]
fn keeping_experts_as_stored_needs_a_gguf_file() {
    let tmp = TempDir::new("gguf-stored-hf");
    let out = tmp.path().join("out.waste");
    let src = fixture("qwen3_moe");
    for (flags, want) in [
        (["--experts", "gguf", "--trunk", "q4"], "--experts gguf keeps a GGUF file's experts"),
        (["--experts", "q8", "--trunk", "gguf"], "--trunk gguf keeps a GGUF file's trunk"),
    ] {
        let mut args = vec!["convert", src.to_str().unwrap(), out.to_str().unwrap()];
        args.extend(flags);
        let o = waste(&args);
        let err = stderr(&o);
        assert!(!o.status.success());
        assert!(err.contains(want) && err.trim().lines().count() == 1, "{err}");
        assert!(!out.exists(), "{} was written", out.display());
    }
}

/// A `gguf` manifest whose per-layer types are unknown, missing or not
/// the records' is refused at open with one line.
#[test]
fn a_gguf_manifest_with_wrong_expert_types_is_refused_with_one_line() {
    let tmp = TempDir::new("gguf-manifest");
    let base = convert_gguf(&gguf_dir().join("models/wide-qwen3moe-q4_k_m.gguf"), "gguf", "f32", tmp.path());
    let cases: [(&str, ManifestEdit, &str); 3] = [
        ("unknown", |m| m["experts"]["layers"][0]["ggml"]["down"] = "Q4_2".into(), "are not ones WASTE computes on"),
        (
            "absent",
            |m| {
                m["experts"]["layers"][0].as_object_mut().unwrap().remove("ggml");
            },
            "ggml types present/absent contrary to format gguf",
        ),
        ("resized", |m| m["experts"]["layers"][0]["ggml"]["down"] = "Q4_K".into(), "expert record layout"),
    ];
    refused_after_manifest_edits(&base, tmp.path(), &cases);
}
