//! What DeepSeek Sparse Attention's indexer costs per decode token at long
//! context, on DeepSeek-V3.2's full-scale shape (`synth --like
//! deepseek-v3.2`'s config): one MLA layer with random q8 weights (the
//! indexer's head weights f32, as converted) and a latent cache of `ctx`
//! random rows; the token at position `ctx - 1` timed through
//!
//! * the indexer alone (its key, q, head weights, the score of every
//!   position, the top-2048 choice),
//! * the whole DSA layer (projections, indexer, MLA over the 2048 chosen),
//! * the same layer as dense MLA over every position (what DSA replaces),
//! * a warm-cache MoE block of the same layer (8 routed + 1 shared expert,
//!   q8 `gate`/`up`/`down` matvecs of 2048 x 7168), so the share of a whole
//!   decode step is known without the disk: step = 61 attention layers + 58
//!   MoE blocks + 3 dense MLPs (18432 wide, timed as 9 experts' worth each).
//!
//! `cargo bench -p waste-engine --bench dsa` (medians of 5; one thread for
//! the attention, the matvecs as the engine runs them).

use std::path::Path;

mod common;
use common::*;
use waste_engine::config::layout::MlaTensors;
use waste_engine::config::ModelConfig;
use waste_engine::kv::{KvRows, KvType};
use waste_engine::source::TensorSource;
use waste_engine::transformer::dsa::{Indexer, IndexerScratch, Selection};
use waste_engine::transformer::mla::{Mla, MlaScratch};
use waste_engine::transformer::rope::Rope;

const CONTEXTS: [usize; 3] = [4096, 32768, 131072];
const RUNS: usize = 5;

fn config(model_type: &str) -> ModelConfig {
    let mut json = waste_engine::synth::like_config("deepseek-v3.2", None).expect("the deepseek-v3.2 config");
    json["model_type"] = model_type.into();
    ModelConfig::from_json_str(&json.to_string(), Path::new("config.json")).expect("a valid config")
}

fn main() {
    let layer = 3; // the first MoE layer
    let dsa = config("deepseek_v32");
    let dense = config("deepseek_v3");
    let x = random(dsa.hidden_size, 11, 1.0);
    let mut out = vec![0.0f32; dsa.hidden_size];
    eprintln!("building one layer of random q8 weights at full scale ...");
    let dsa_tensors = MlaTensors::of(&dsa, layer).expect("an MLA shape");
    let dense_tensors = MlaTensors::of(&dense, layer).expect("an MLA shape");
    let sparse_layer = Mla::load(&dsa, &RandomTrunk(&dsa), layer, &dsa_tensors).expect("the DSA layer");
    let dense_layer = Mla::load(&dense, &RandomTrunk(&dense), layer, &dense_tensors).expect("the dense layer");
    let rope = Rope::new(dsa.mla_rope.as_ref().expect("MLA rope"));
    let indexer_tensors = dsa_tensors.indexer.as_ref().expect("an indexer on this layer");
    let indexer = Indexer::load(&dsa, &RandomTrunk(&dsa), layer, Some(&rope), indexer_tensors).expect("the indexer");
    let (h, i) = (dsa.hidden_size, dsa.moe_intermediate_size);
    let up = RandomTrunk(&dsa).matrix("model.layers.3.mlp.shared_experts.up_proj.weight").unwrap();
    let down = RandomTrunk(&dsa).matrix("model.layers.3.mlp.shared_experts.down_proj.weight").unwrap();
    let (mut gate_y, mut down_y) = (vec![0.0f32; i], vec![0.0f32; h]);
    let moe_ms = median_ms(RUNS, || {
        for _ in 0..9 {
            up.matvec(&x, &mut gate_y);
            up.matvec(&x, &mut gate_y);
            down.matvec(&gate_y, &mut down_y);
        }
    });
    let d = dsa.add.dsa.clone().expect("DSA");
    let m = dsa.mla.expect("MLA");
    println!(
        "DeepSeek-V3.2 shape: {} heads, kv_lora {}, indexer {} x {}, index_topk {}; MoE block (9 experts, q8) {moe_ms:.2} ms",
        m.num_heads, m.kv_lora_rank, d.n_heads, d.head_dim, d.topk
    );
    println!("| context | indexer ms/layer | DSA layer ms | dense MLA layer ms | indexer / DSA layer | indexer / decode step (warm experts) |");
    println!("|---|---|---|---|---|---|");
    for ctx in CONTEXTS {
        let stride = dsa.state_floats_per_token(layer);
        let mut cache = KvRows::new(KvType::F32, ctx, stride);
        cache.words_mut().copy_from_slice(&random(ctx * stride, ctx as u64, 1.0));
        let mut s = MlaScratch::new(&dsa, ctx);
        let mut sel = Selection::for_config(&dsa);
        let pos = ctx - 1;
        let layer_ms =
            median_ms(RUNS, || sparse_layer.forward(&x, pos, &mut cache, &mut s, &mut sel, &mut out).unwrap());
        let mut is = IndexerScratch::new(&dsa, ctx);
        let (cos, sin) = (vec![0.6f32; m.qk_rope_head_dim / 2], vec![0.8f32; m.qk_rope_head_dim / 2]);
        let w = m.cache_width();
        let q_resid = random(m.q_lora_rank.unwrap_or(0), 5, 1.0);
        let index_ms =
            median_ms(RUNS, || indexer.select(&x, &q_resid, pos, &cos, &sin, (&cache, w..stride), &mut is, &mut sel));
        drop(cache);
        let dstride = dense.state_floats_per_token(layer);
        let mut dcache = KvRows::new(KvType::F32, ctx, dstride);
        dcache.words_mut().copy_from_slice(&random(ctx * dstride, ctx as u64, 1.0));
        let mut ds = MlaScratch::new(&dense, ctx);
        let dense_ms = median_ms(RUNS, || {
            dense_layer.forward(&x, pos, &mut dcache, &mut ds, &mut Selection::default(), &mut out).unwrap()
        });
        let step = dsa.num_layers as f64 * layer_ms + dsa.num_layers as f64 * moe_ms;
        println!(
            "| {ctx} | {index_ms:.2} | {layer_ms:.2} | {dense_ms:.2} | {:.0}% | {:.0}% (step {:.2} s) |",
            100.0 * index_ms / layer_ms,
            100.0 * dsa.num_layers as f64 * index_ms / step,
            step / 1e3
        );
    }
}
