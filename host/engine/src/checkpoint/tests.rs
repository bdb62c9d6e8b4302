//! Tests of the checkpoint reader (moved from checkpoint.rs; the dtype
//! decoders are tested in decode.rs).

mod reader {
    use super::super::*;
    use crate::stats::StepStats;
    use crate::transformer::experts::DenseExperts;

    /// A fresh, empty directory under the system temp dir.
    fn scratch_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("waste-ckpt-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn fixture(family: &str) -> PathBuf {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(format!("tiny-{family}"));
        assert!(d.join("config.json").is_file(), "fixture file missing: {}", d.join("config.json").display());
        d
    }

    fn write_tensors(path: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)]) {
        let bytes: Vec<Vec<u8>> = tensors.iter().map(|t| t.2.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
            .iter()
            .zip(&bytes)
            .map(|(t, b)| (t.0.clone(), safetensors::tensor::TensorView::new(Dtype::F32, t.1.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, path).unwrap();
    }

    #[test]
    fn opens_fixtures_single_and_sharded() {
        let q = HfCheckpoint::open(&fixture("qwen3_moe")).unwrap();
        assert_eq!(q.config().expert_layout, ExpertLayout::PerExpert);
        let (w, shape) = q.tensor_f32("model.embed_tokens.weight").unwrap();
        assert_eq!(shape, vec![512, 64]);
        assert_eq!(w.len(), 512 * 64);
        let [g, u, d] = q.expert_f32(1, 7).unwrap();
        assert_eq!((g.len(), u.len(), d.len()), (32 * 64, 32 * 64, 64 * 32));
        assert!(matches!(q.expert_f32(0, 0), Err(Error::Arg(_))), "layer 0 is dense");

        let m = HfCheckpoint::open(&fixture("mixtral")).unwrap();
        assert_eq!(m.shards.len(), 4);
        for name in m.config().trunk_tensor_names() {
            assert!(m.has(&name), "{name}");
        }
        let n_expert = m.tensor_names().iter().filter(|n| m.config().is_expert_tensor(n)).count();
        assert_eq!(n_expert, 4 * 8 * 3);
        let e = m.tensor_f32("nope").unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
    }

    #[test]
    fn missing_config_and_weights() {
        let d = scratch_dir("noconfig");
        let e = HfCheckpoint::open(&d).err().unwrap();
        assert!(e.to_string().contains("config.json"), "{e}");

        std::fs::copy(fixture("olmoe").join("config.json"), d.join("config.json")).unwrap();
        let e = HfCheckpoint::open(&d).err().unwrap();
        assert!(e.to_string().contains("model.safetensors"), "{e}");

        std::fs::write(d.join("config.json"), "{\"model_type\": ").unwrap();
        let e = HfCheckpoint::open(&d).err().unwrap();
        assert!(e.to_string().contains("config.json") && e.to_string().contains("malformed"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn truncated_and_corrupt_safetensors() {
        let src = fixture("olmoe");
        let d = scratch_dir("truncated");
        std::fs::copy(src.join("config.json"), d.join("config.json")).unwrap();
        let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
        let file = d.join("model.safetensors");

        std::fs::write(&file, &bytes[..bytes.len() - 100]).unwrap();
        let e = HfCheckpoint::open(&d).err().unwrap();
        assert!(matches!(e, Error::Format { .. }) && e.to_string().contains("model.safetensors"), "{e}");

        std::fs::write(&file, &bytes[..5]).unwrap();
        let e = HfCheckpoint::open(&d).err().unwrap();
        assert!(e.to_string().contains("model.safetensors"), "{e}");

        let mut bad = bytes.clone();
        bad[0..8].copy_from_slice(&u64::MAX.to_le_bytes());
        std::fs::write(&file, &bad).unwrap();
        let e = HfCheckpoint::open(&d).err().unwrap();
        assert!(e.to_string().contains("model.safetensors"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn index_naming_missing_or_foreign_shard() {
        let src = fixture("mixtral");
        let d = scratch_dir("shards");
        for f in ["config.json", "model.safetensors.index.json", "model-00001-of-00004.safetensors"] {
            std::fs::copy(src.join(f), d.join(f)).unwrap();
        }
        let e = HfCheckpoint::open(&d).err().unwrap();
        let msg = e.to_string();
        assert!(msg.contains("model.safetensors.index.json") && msg.contains("model-00002-of-00004"), "{msg}");

        std::fs::write(
            d.join("model.safetensors.index.json"),
            r#"{"weight_map": {"model.norm.weight": "../etc/passwd"}}"#,
        )
        .unwrap();
        let e = HfCheckpoint::open(&d).err().unwrap();
        assert!(e.to_string().contains("invalid shard name"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn unsupported_dtype_is_named() {
        let d = scratch_dir("dtype");
        std::fs::copy(fixture("olmoe").join("config.json"), d.join("config.json")).unwrap();
        let data = [0u8; 8];
        let view = safetensors::tensor::TensorView::new(Dtype::I32, vec![2], &data).unwrap();
        safetensors::serialize_to_file(vec![("model.norm.weight", view)], None, &d.join("model.safetensors")).unwrap();
        let c = HfCheckpoint::open(&d).unwrap();
        let e = c.tensor_f32("model.norm.weight").unwrap_err();
        assert!(matches!(e, Error::Unsupported(_)) && e.to_string().contains("I32"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Rewrites a per-expert fixture in the fused transformers-5 layout
    /// (optionally transposed, with Mixtral's block renamed to `mlp`) and
    /// checks every expert reads back identically.
    fn fused_roundtrip(family: &str, transposed: bool) -> PathBuf {
        let src = HfCheckpoint::open(&fixture(family)).unwrap();
        let cfg = src.config().clone();
        let (e, h, i) = (cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size);
        let d = scratch_dir(&format!("fused-{family}-{transposed}"));
        std::fs::copy(fixture(family).join("config.json"), d.join("config.json")).unwrap();
        let mut out = Vec::new();
        for name in src.tensor_names() {
            if !cfg.is_expert_tensor(&name) {
                let (w, shape) = src.tensor_f32(&name).unwrap();
                out.push((name.replace(".block_sparse_moe.", ".mlp."), shape, w));
            }
        }
        for l in (0..cfg.num_layers).filter(|&l| cfg.is_moe_layer(l)) {
            let (mut gu, mut dn) = (Vec::new(), Vec::new());
            for x in 0..e {
                let [g, u, dw] = src.expert_f32(l, x).unwrap();
                if transposed {
                    // [H, 2I] and [I, H]
                    for r in 0..h {
                        gu.extend((0..i).map(|c| g[c * h + r]));
                        gu.extend((0..i).map(|c| u[c * h + r]));
                    }
                    for r in 0..i {
                        dn.extend((0..h).map(|c| dw[c * i + r]));
                    }
                } else {
                    gu.extend_from_slice(&g);
                    gu.extend_from_slice(&u);
                    dn.extend_from_slice(&dw);
                }
            }
            let (gs, ds) =
                if transposed { (vec![e, h, 2 * i], vec![e, i, h]) } else { (vec![e, 2 * i, h], vec![e, h, i]) };
            out.push((format!("model.layers.{l}.mlp.experts.gate_up_proj"), gs, gu));
            out.push((format!("model.layers.{l}.mlp.experts.down_proj"), ds, dn));
        }
        write_tensors(&d.join("model.safetensors"), &out);

        let fused = HfCheckpoint::open(&d).unwrap();
        assert_eq!(fused.config().expert_layout, ExpertLayout::Fused);
        assert_eq!(fused.config().moe_block, "mlp");
        for l in (0..cfg.num_layers).filter(|&l| cfg.is_moe_layer(l)) {
            for x in 0..e {
                assert!(
                    fused.expert_f32(l, x).unwrap() == src.expert_f32(l, x).unwrap(),
                    "{family} layer {l} expert {x}"
                );
            }
        }
        d
    }

    #[test]
    fn fused_expert_layouts() {
        let _ = std::fs::remove_dir_all(fused_roundtrip("qwen3_moe", false));
        // The forward pass over the renamed, transposed Mixtral still
        // matches the reference logits.
        let d = fused_roundtrip("mixtral", true);
        let ckpt = HfCheckpoint::open(&d).unwrap();
        let cfg = ckpt.config().clone();
        let reference: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(fixture("mixtral").join("reference.json")).unwrap()).unwrap();
        let prompt: Vec<u32> =
            reference["prompt_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let want: Vec<f32> = std::fs::read(fixture("mixtral").join("reference_logits.f32"))
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let model = crate::transformer::Transformer::load(&cfg, &ckpt).unwrap();
        let mut state = crate::transformer::State::new(&cfg, prompt.len());
        let got = model.forward(&mut state, &prompt, &DenseExperts(&ckpt), false, &mut StepStats::default()).unwrap();
        let want = &want[(prompt.len() - 1) * cfg.vocab_size..];
        let max = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let diff = got.iter().zip(want).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(diff <= 1e-4 * max, "fused mixtral: {diff} vs max {max}");
        let _ = std::fs::remove_dir_all(d);
    }

    /// gpt-oss's release experts (MXFP4 `*_blocks` / `*_scales`) decode to
    /// exactly the f32 tensors transformers multiplies by: reassembled into its
    /// in-memory layout (`gate_up_proj [E, H, 2I]` with gate and up interleaved,
    /// `down_proj [E, I, H]`), every layer's bytes hash to the sha256 the
    /// generator recorded from `convert_moe_packed_tensors`.
    #[test]
    fn gpt_oss_mxfp4_experts_decode_bit_exactly_as_transformers() {
        use sha2::{Digest, Sha256};
        let dir = fixture("gpt_oss-mxfp4");
        let ckpt = HfCheckpoint::open(&dir).unwrap();
        let reference: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
        let cfg = ckpt.config();
        let (e, h, i) = (cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size);
        for layer in 0..cfg.num_layers {
            let mut gate_up = vec![0f32; e * h * 2 * i];
            let mut down = vec![0f32; e * i * h];
            for x in 0..e {
                let [g, u, d] = ckpt.expert_f32(layer, x).unwrap();
                for j in 0..i {
                    for c in 0..h {
                        gate_up[(x * h + c) * 2 * i + 2 * j] = g[j * h + c];
                        gate_up[(x * h + c) * 2 * i + 2 * j + 1] = u[j * h + c];
                    }
                }
                for r in 0..h {
                    for c in 0..i {
                        down[(x * i + c) * h + r] = d[r * i + c];
                    }
                }
            }
            for (name, values) in [("gate_up_proj", &gate_up), ("down_proj", &down)] {
                let key = format!("model.layers.{layer}.mlp.experts.{name}");
                let want = reference["dequantized_experts"][&key]["sha256_f32_le"].as_str().unwrap();
                let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                let got: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
                assert_eq!(got, want, "{key}");
            }
        }
    }
}

mod kimi_tests {
    use super::super::*;

    /// A config whose layer lists disagree with the tensors present fails
    /// at open, naming the config keys, the layer and the tensor.
    #[test]
    fn layer_lists_disagreeing_with_tensors_are_named() {
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-kimi_linear");
        let d = std::env::temp_dir().join(format!("waste-ckpt-test-{}-kimi-lists", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::copy(src.join("model.safetensors"), d.join("model.safetensors")).unwrap();
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
        // Layers 1 and 2 swapped: layer 1 holds KDA tensors.
        cfg["layer_types"][1] = "full_attention".into();
        cfg["layer_types"][2] = "linear_attention".into();
        std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
        let msg = HfCheckpoint::open(&d).err().expect("must fail").to_string();
        for needle in ["model.safetensors", "layer_types", "layer 1", "MLA", "model.layers.1.self_attn.A_log"] {
            assert!(msg.contains(needle), "{msg} lacks {needle}");
        }

        // Released layout with 0-based lists by mistake (all in range).
        let o = cfg.as_object_mut().unwrap();
        o.remove("layer_types");
        o.insert(
            "linear_attn_config".into(),
            serde_json::json!({"kda_layers": [0, 1, 3], "full_attn_layers": [2, 4], "head_dim": 16, "num_heads": 2}),
        );
        std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
        let msg = HfCheckpoint::open(&d).err().expect("must fail").to_string();
        assert!(msg.contains("linear_attn_config") && msg.contains("1-based"), "{msg}");

        // Dense layer 0 declared MoE.
        let o = cfg.as_object_mut().unwrap();
        o.insert(
            "linear_attn_config".into(),
            serde_json::json!({"kda_layers": [1, 2, 4], "full_attn_layers": [3, 5], "head_dim": 16, "num_heads": 2}),
        );
        o.insert("mlp_layer_types".into(), serde_json::json!(["sparse", "sparse", "sparse", "sparse", "sparse"]));
        std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
        let msg = HfCheckpoint::open(&d).err().expect("must fail").to_string();
        for needle in ["mlp_layer_types", "layer 0", "model.layers.0.mlp.gate_proj.weight"] {
            assert!(msg.contains(needle), "{msg} lacks {needle}");
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}
