use super::*;
use crate::transformer::State;
use std::path::Path;

fn input(budget: Option<u64>, usable: u64) -> PlanInput {
    PlanInput {
        context: 64,
        kv_type: KvType::F32,
        trunk: 100,
        embedding_on_disk: 1000,
        state: 20,
        scratch: 30,
        prefill_chunk: 64,
        vision: 0,
        record_bytes: 10,
        top_k: 2,
        moe_layers: 4,
        experts: 8,
        usable_ram: usable,
        budget,
    }
}

#[test]
fn plan_floor_working_sets_and_auto_budget() {
    let p = plan_from(input(Some(400), 0)).unwrap();
    assert_eq!((p.min_cache, p.floor, p.working_set, p.recommended), (40, 190, 80, 430));
    assert_eq!((p.cache_slots, p.cache_bytes), (25, 250));
    assert_eq!(p.total(), 400);
    // 7/8 of 400 = 350: floor + 2 working sets (350) fits, + 3 (430) does not.
    let p = plan_from(input(None, 400)).unwrap();
    assert_eq!((p.budget, p.budget_source), (350, BudgetSource::Auto { working_sets: 2 }));
    let p = plan_from(input(None, 100)).unwrap();
    assert_eq!((p.budget, p.budget_source), (190, BudgetSource::Auto { working_sets: 0 }));
    let e = plan_from(input(Some(189), 0)).unwrap_err().to_string();
    assert!(e.contains("floor of 190 B") && e.contains("waste plan"), "{e}");
    // A budget above the whole model caps the cache at every record.
    assert_eq!(plan_from(input(Some(10_000), 0)).unwrap().cache_slots, 32);
}

fn fixture_config(family: &str) -> ModelConfig {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(format!("tiny-{family}/config.json"));
    ModelConfig::from_file(&path).unwrap()
}

/// Regression: the planner sized every layer as GQA keys and values.
/// Kimi-Linear keeps a latent row per token in its MLA layers and a
/// fixed KDA state (delta-rule matrices and conv rings) in the others.
#[test]
fn plan_state_of_kimi_linear_is_latent_rows_plus_fixed_kda_state() {
    let cfg = fixture_config("kimi_linear");
    // Layers: KDA KDA MLA KDA MLA; KDA 2 heads x 16, conv 4; MLA kv_lora 16 + rope 8.
    let kda = 2 * 16 * 16 + 3 * (4 - 1) * (2 * 16);
    let mla_per_token = 16 + 8;
    for ctx in [1usize, 100, 512] {
        for kv in KvType::ALL {
            // The KDA state stays f32; the latent rows take the cache's type.
            let want = 4 * (3 * kda + 2 * kv.words(mla_per_token) * ctx) as u64;
            assert_eq!(state_bytes(&cfg, ctx, kv), want, "context {ctx}, {kv}");
            assert_eq!(State::with_kv(&cfg, ctx, kv).bytes() as u64, want, "what the engine allocates");
        }
        assert_eq!(state_bytes(&cfg, ctx, KvType::F32), 4 * (3 * kda + 2 * mla_per_token * ctx) as u64);
    }
}

/// DeepSeek-V3: every layer MLA with q-LoRA, the absorbed latent cache
/// only (kv_lora + rope floats per token), no K/V heads.
#[test]
fn plan_state_of_deepseek_v3_is_the_latent_cache() {
    let cfg = fixture_config("deepseek_v3");
    for ctx in [1usize, 100, 2048] {
        let want = 4 * (4 * (16 + 8) * ctx) as u64;
        assert_eq!(state_bytes(&cfg, ctx, KvType::F32), want, "context {ctx}");
        assert_eq!(State::new(&cfg, ctx).bytes() as u64, want);
        assert_eq!(state_bytes(&cfg, ctx, KvType::Bf16), want / 2, "context {ctx}: bf16 latents");
        assert_eq!(State::with_kv(&cfg, ctx, KvType::Bf16).bytes() as u64, want / 2);
    }
}

/// GQA models keep K and V rows in the KV cache's type: f32 4 bytes a
/// value, bf16 2, q8 one plus an f32 scale per 32; the plan counts what
/// the state allocates.
#[test]
fn plan_state_of_a_gqa_model_counts_its_kv_cache_type() {
    let q = fixture_config("qwen3_moe");
    let (layers, kv_dim, ctx) = (q.num_layers as u64, q.kv_dim(), 10);
    let per_row =
        [(KvType::F32, 4 * kv_dim), (KvType::Bf16, 2 * kv_dim), (KvType::Q8, kv_dim + 4 * kv_dim.div_ceil(32))];
    for (kv, row_bytes) in per_row {
        let want = 2 * layers * ctx as u64 * row_bytes as u64;
        assert_eq!(state_bytes(&q, ctx, kv), want, "{kv}");
        assert_eq!(State::with_kv(&q, ctx, kv).bytes() as u64, want, "{kv}: what the engine allocates");
    }
}

/// The model's buffers of one forward pass, written out from the config
/// (not from the constructors): the token scratch with GQA, MLA and KDA
/// scratch, a chunk of `chunk` tokens, one row of logits. No AttnRes or
/// latent MoE (K3 is checked by the bound below only).
fn forward_floats_by_hand(cfg: &ModelConfig, ctx: usize, chunk: usize) -> usize {
    let h = cfg.hidden_size;
    let picks = 4 * (cfg.top_k + 1);
    // A score per position for every query head (decode runs the KV
    // heads in parallel), and each KV head's keys of a bf16 or q8 cache
    // decoded, KEY_TILE at a time.
    let tile = crate::kv::KEY_TILE * cfg.head_dim * cfg.num_kv_heads;
    // ..and each KV head's query heads transposed for the scores, in
    // blocks padded to whole vectors of lanes.
    use crate::attend::QueryColumns;
    let columns = cfg.num_kv_heads * QueryColumns::len(cfg.num_heads / cfg.num_kv_heads.max(1), cfg.head_dim);
    let attn = 2 * cfg.q_dim() + 2 * cfg.kv_dim() + cfg.num_heads * ctx + 2 * (cfg.head_dim / 2) + tile + columns;
    let mla = cfg.mla.map_or(0, |m| {
        use crate::transformer::mla::{LANE_SCORE_FLOATS, MLA_LANES};
        let ql = m.q_lora_rank.unwrap_or(0);
        // Each lane's block of heads: a query of a cache row's width,
        // an attended latent and a score per position each.
        let block = (LANE_SCORE_FLOATS / ctx).clamp(1, m.num_heads.div_ceil(MLA_LANES));
        let gathered = cfg.add.dsa.as_ref().map_or(0, |d| d.topk.min(ctx) * m.cache_width());
        // ..and a tile of decoded cache rows per lane, and the token's
        // own row before it is stored (its widest layer's).
        let tile = crate::kv::KEY_TILE * m.cache_width();
        let row = (0..cfg.num_layers).map(|l| cfg.state_floats_per_token(l)).max().unwrap_or(0);
        m.num_heads * m.qk_head_dim()
            + m.cache_width()
            + MLA_LANES
                * (block * (m.cache_width() + m.kv_lora_rank + ctx) + tile + QueryColumns::len(block, m.cache_width()))
            + row
            + gathered
            + m.num_heads * m.v_head_dim
            + 2 * ql
            + 2 * m.qk_rope_head_dim
    });
    let kda = cfg.kda.map_or(0, |k| 9 * k.qkv_dim() + 2 * k.head_dim + k.num_heads);
    // DSA: the indexer's q, head weights, rope scratch, a score and an
    // order slot per position; each token's selection of index_topk.
    let (dsa, selection) = cfg.add.dsa.as_ref().map_or((0, 0), |d| {
        let rope = cfg.mla.map_or(0, |m| m.qk_rope_head_dim);
        // ..and each score lane's tile of decoded keys.
        let tiles = crate::transformer::dsa::SCORE_LANES * crate::transformer::dsa::SCORE_BLOCK * d.head_dim;
        (d.n_heads * d.head_dim + d.n_heads + rope + 2 * ctx + tiles, d.topk)
    });
    let shared = 2 * cfg.shared_intermediate_size + if cfg.shared_intermediate_size > 0 { h } else { 0 };
    let token =
        3 * h + attn + mla + kda + dsa + selection + 2 * cfg.intermediate_size + cfg.num_experts + shared + picks;
    // Per token of a chunk: x, xn, y, picks, selection, the dense or
    // shared gate/up products and the shared experts' output.
    let dense = (0..cfg.num_layers).any(|l| !cfg.is_moe_layer(l));
    let products = 2 * if dense { cfg.intermediate_size } else { 0 }.max(cfg.shared_intermediate_size);
    let shared_y = if cfg.shared_intermediate_size > 0 { h } else { 0 };
    // An MLA layer's projections and attention outputs per token, and
    // a KDA layer's projections, decay, gate, beta and outputs, for
    // the tokens a mixer takes at once.
    let mla_rows = cfg.mla.map_or(0, |m| {
        m.num_heads * m.qk_head_dim() + 2 * m.q_lora_rank.unwrap_or(0) + m.cache_width() + m.num_heads * m.v_head_dim
    });
    let kda_rows = cfg.kda.map_or(0, |k| 6 * k.qkv_dim() + k.head_dim + k.num_heads);
    let per_token = 3 * h + picks + selection + products + shared_y;
    let mixer = chunk.min(crate::transformer::prefill::MIXER_TOKENS) * (mla_rows + kda_rows);
    let chunk = if chunk > 1 { chunk * per_token + mixer } else { 0 };
    token + chunk + cfg.vocab_size
}

/// Regression: the estimate counted GQA scores per head and left out
/// the MLA and KDA scratch. Now the model's part is built from the
/// forward pass's own constructors; it must equal the hand count for
/// Kimi-Linear (fixture and released shapes) and DeepSeek-V3, and the
/// whole figure must cover it plus the rvq3 / rvq4p kernels' tables
/// and scratch and a chunk's per-pick outputs.
#[test]
fn scratch_covers_the_forward_pass_buffers_of_kimi_linear_and_deepseek() {
    use crate::transformer::prefill::{forward_buffer_floats, MAX_PREFILL_CHUNK};
    let released = ModelConfig::from_json_str(
        &crate::synth::like_config("kimi-linear-48b", None).unwrap().to_string(),
        Path::new("config.json"),
    )
    .unwrap();
    let configs = [
        ("kimi_linear", fixture_config("kimi_linear")),
        ("deepseek_v3", fixture_config("deepseek_v3")),
        ("deepseek_v32", fixture_config("deepseek_v32")),
        ("glm_moe_dsa", fixture_config("glm_moe_dsa")),
        ("kimi-linear-48b", released),
    ];
    for (name, cfg) in &configs {
        for ctx in [1usize, 64, 4096] {
            for chunk in [1, 64, MAX_PREFILL_CHUNK] {
                assert_eq!(
                    forward_buffer_floats(cfg, ctx, chunk),
                    forward_floats_by_hand(cfg, ctx, chunk),
                    "{name}: context {ctx}, chunk {chunk}"
                );
            }
            let (h, i) = (cfg.expert_hidden(), cfg.moe_intermediate_size);
            for chunk in [64, 2048] {
                // One token's tables and kernel scratch; for a matrix
                // format also the batch's [chunk, inter] gate and up.
                let rvq3 = 4 * (h / 8 * 3 * 256 + 2 * i + i / 8 * 3 * 256);
                let rvq4p = 4 * (h / 8 * 4 * 64 + 2 * i + i / 8 * 4 * 64) + (h / 8 + i / 8) * 256;
                // ..and q4's int8 inputs (1.06 bytes a value), gate/up's or
                // down's, and a trunk product's over the chunk.
                let int8 = |cols: usize| chunk * cols.div_ceil(128) * (128 + 4 + 4);
                let matrices = 4 * (h + 2 * i + 2 * chunk * i) + int8(h.max(i));
                let kda = cfg.kda.map_or(0, |k| k.qkv_dim());
                let mla = cfg.mla.map_or(0, |m| m.num_heads * m.v_head_dim);
                let widest = [h, cfg.q_dim(), cfg.intermediate_size, cfg.shared_intermediate_size, kda, mla];
                // A token's per-pick outputs, one expert's gathered
                // inputs and outputs, the routing turned around.
                let outputs = 4 * (cfg.top_k + 2 * chunk) * h + 16 * chunk * cfg.top_k + 40 * cfg.num_experts;
                let need = 4 * forward_floats_by_hand(cfg, ctx, chunk)
                    + rvq3.max(rvq4p).max(matrices)
                    + int8(widest.into_iter().max().unwrap())
                    + outputs;
                let got = scratch_bytes(cfg, ChunkInputs::Int8, ctx, chunk);
                // GGUF Q4_K's int16 inputs (2.5 bytes a value: the codes,
                // a scale and a code sum per 32 values, a code sum per 16)
                // in place of int8's, for its trunk and its experts.
                let int16 = |cols: usize| chunk * (2 * cols + 16 * cols.div_ceil(32));
                let widest = widest.into_iter().max().unwrap();
                let more = int16(h.max(i)) - int8(h.max(i)) + int16(widest) - int8(widest);
                let got16 = scratch_bytes(cfg, ChunkInputs::Int16, ctx, chunk);
                assert!(
                    got16 >= (need + more) as u64,
                    "{name} int16: context {ctx}, chunk {chunk}: {got16} < {}",
                    need + more
                );
                assert!(got16 <= (need + more) as u64 + (4 << 20), "{name} int16: {got16} vs {}", need + more);
                assert!(got >= need as u64, "{name}: context {ctx}, chunk {chunk}: {got} < {need}");
                // An estimate, not a blanket: within a few MiB of the count.
                assert!(got <= need as u64 + (4 << 20), "{name}: context {ctx}, chunk {chunk}: {got} vs {need}");
            }
        }
    }
    // K3 (AttnRes banks, latent MoE): the figure covers the model's part.
    let k3 = fixture_config("kimi_k3");
    let model = 4 * forward_buffer_floats(&k3, 512, 64) as u64;
    assert!(scratch_bytes(&k3, ChunkInputs::Int8, 512, 64) > model);
}

/// The plan's chunk: the largest whose buffers beyond decode's take at
/// most an eighth of the room, the smallest when none does.
#[test]
fn the_plan_picks_the_largest_chunk_an_eighth_of_the_room_holds() {
    let cfg = fixture_config("qwen3_moe");
    let i8 = ChunkInputs::Int8;
    let extra = |c: usize| scratch_bytes(&cfg, i8, 64, c) - scratch_bytes(&cfg, i8, 64, 1);
    let of = |c: usize| scratch_bytes(&cfg, i8, 64, c);
    assert_eq!(choose_prefill_chunk(of, 0), SMALLEST_CHUNK);
    assert_eq!(choose_prefill_chunk(of, 8 * extra(4096)), 4096);
    assert!(extra(2048) < extra(4096));
    assert_eq!(choose_prefill_chunk(of, 8 * extra(2048)), 2048);
    assert_eq!(choose_prefill_chunk(of, 8 * extra(512) + 7), 512);
}

/// A synthetic OLMoE container (our own formats), opened; its folder
/// is removed once open (the plan reads only the manifest).
fn synthetic_olmoe(tag: &str) -> Container {
    let dir = std::env::temp_dir().join(format!("waste-plan-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ours = dir.join("olmoe.waste");
    let made = crate::synth::synth(&ours, &crate::synth::preset("olmoe-trace").unwrap(), &mut |_, _| {});
    let container = made.and_then(|_| Container::open(&ours));
    let _ = std::fs::remove_dir_all(&dir);
    container.unwrap()
}

/// The scratch `container` plans with `threads` threads, a context of
/// `context` tokens and chunks of `chunk` tokens.
fn scratch_with_threads(container: &Container, context: usize, threads: usize, chunk: usize) -> u64 {
    let request = PlanRequest {
        context: Some(context),
        budget: Some(1 << 30),
        prefill_chunk: Some(chunk),
        threads: Some(threads),
        ..PlanRequest::default()
    };
    plan(container, &request).unwrap().scratch
}

/// A GGUF model's plan counts each compute thread's kernel buffers (the
/// int16 block kernel's transposed block, the decoded rows), which the
/// plan once left out: more threads, more scratch, by exactly those
/// buffers and each thread's prefill attention blocks; our own formats
/// keep no kernel buffers per thread.
#[test]
fn a_gguf_models_plan_counts_every_threads_kernel_buffers() {
    let gguf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/gguf/models/wide-qwen3moe-q4_k_m.gguf");
    let container = crate::paths::open_container(&gguf).unwrap();
    let (cfg, m) = (container.config(), container.manifest());
    let one_thread = per_thread_bytes(cfg, m, 1) / 2;
    let shape = cfg.expert_shape();
    let cols = widest_trunk_input(cfg).max(shape.hidden).max(shape.inter);
    assert_eq!(one_thread, crate::quant::ggml::per_thread_bytes(cols) as u64);
    assert!(one_thread > 0);
    let blocks = crate::transformer::attention::prefill_block_bytes(cfg, 512) as u64;
    let more = scratch_with_threads(&container, 512, 5, 64) - scratch_with_threads(&container, 512, 1, 64);
    assert_eq!(more, 4 * (one_thread + blocks));
    let container = synthetic_olmoe("threads");
    assert_eq!(per_thread_bytes(container.config(), container.manifest(), 8), 0);
}

/// Regression: with each thread's attention blocks counted, an
/// automatic budget at a long context picked its chunk by the forward
/// pass's buffers alone, and the chunk's full scratch then passed the
/// budget it was picked for ("a budget of 210.8 MB is under this
/// model's floor of 211.4 MB": the agents' 131,072-token server did not
/// start). Every context and thread count must plan.
#[test]
fn an_automatic_budget_at_a_long_context_plans_with_its_chunks_thread_buffers() {
    // The agents' model: the tiny Qwen3-MoE at a 131,072-token context.
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-qwen3_moe");
    let dir = std::env::temp_dir().join(format!("waste-plan-long-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(&src).unwrap();
    for entry in std::fs::read_dir(&fixture).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, src.join(path.file_name().unwrap())).unwrap();
    }
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    config["max_position_embeddings"] = 131_072.into();
    std::fs::write(src.join("config.json"), config.to_string()).unwrap();
    let out = dir.join("m.waste");
    let made = crate::convert::convert(&src, &out, &Default::default(), &mut |_| {});
    let container = made.and_then(|_| Container::open(&out));
    let _ = std::fs::remove_dir_all(&dir);
    let container = container.unwrap();
    for context in [4096, 32_768, 131_072] {
        for threads in 1..=4 {
            let request = PlanRequest {
                context: Some(context),
                threads: Some(threads),
                usable_ram: Some(24 << 30),
                ..PlanRequest::default()
            };
            let p = plan(&container, &request).unwrap_or_else(|e| panic!("{context} tokens, {threads} threads: {e}"));
            assert!(p.total() <= p.budget, "{context} tokens, {threads} threads: {p:?}");
        }
    }
}

/// The plan once left out each compute thread's prefill attention
/// blocks (queries, outputs, up to 8 MB of scores and a key tile), so a
/// GQA model's prefill could pass its budget by that much a thread: a
/// chunk now counts them per thread, a decode step (chunk 1) does not.
#[test]
fn the_plan_counts_each_threads_prefill_attention_blocks() {
    let container = synthetic_olmoe("blocks");
    let blocks = crate::transformer::attention::prefill_block_bytes(container.config(), 4096) as u64;
    assert!(blocks > 1 << 20, "olmoe's blocks at 4096 keys: {blocks} B");
    let more = scratch_with_threads(&container, 4096, 3, 64) - scratch_with_threads(&container, 4096, 1, 64);
    assert_eq!(more, 2 * blocks);
    let at = |threads| model_scratch_bytes(&container, 4096, 1, threads);
    assert_eq!(at(3), at(1));
}

#[test]
fn sizes_parse() {
    assert_eq!(parse_size("1.5G"), Some(1_500_000_000));
    assert_eq!(parse_size("512MiB"), Some(512 << 20));
    assert_eq!(parse_size("800 MB"), Some(800_000_000));
    assert_eq!(parse_size("4096"), Some(4096));
    assert_eq!(parse_size("lots"), None);
    assert_eq!(parse_size("-1G"), None);
}
