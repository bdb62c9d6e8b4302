//! What DeepSeek-V4's attention costs per decode token at long context, on
//! V4-Flash's full-scale shape (`synth --like deepseek-v4-flash`'s config):
//! one CSA and one HCA layer with random q8 weights (the compressors'
//! mixes and position biases f32, as converted) and states of `ctx`
//! tokens of random entries, the token at position `ctx - 1` timed with
//! one compute thread and with two, side by side in this run, beside a
//! warm-cache MoE block (6 routed + 1 shared expert, q8 matvecs of
//! 2048 x 4096) for the share of a decode step.
//!
//! `cargo bench -p waste-engine --bench v4` (medians of 5).

use std::path::Path;

mod common;
use common::*;
use waste_engine::config::layout::V4AttnTensors;
use waste_engine::config::{ModelConfig, V4Attn};
use waste_engine::source::TensorSource;
use waste_engine::transformer::v4::attention::{V4Attention, V4Scratch};
use waste_engine::transformer::v4::V4State;

const CONTEXTS: [usize; 3] = [4096, 32768, 131072];
const RUNS: usize = 5;

fn main() {
    let json = waste_engine::synth::like_config("deepseek-v4-flash", None).expect("the V4-Flash config");
    let cfg = ModelConfig::from_json_str(&json.to_string(), Path::new("config.json")).expect("a valid config");
    let v4 = cfg.add.v4.clone().expect("V4 settings");
    let x = random(cfg.hidden_size, 11, 1.0);
    let mut y = vec![0.0f32; cfg.hidden_size];
    eprintln!("building two layers of random q8 weights at full scale ...");
    let csa_layer = v4.layers.iter().position(|&k| k == V4Attn::Csa).expect("a CSA layer");
    let hca_layer = v4.layers.iter().position(|&k| k == V4Attn::Hca).expect("an HCA layer");
    let layers: Vec<(&str, usize, V4Attention)> = [("CSA", csa_layer), ("HCA", hca_layer)]
        .into_iter()
        .map(|(n, l)| {
            let tensors = V4AttnTensors::of(&cfg, &v4, l);
            (n, l, V4Attention::load(&cfg, &v4, &RandomTrunk(&cfg), l, &tensors).expect("the layer"))
        })
        .collect();
    let (h, i) = (cfg.hidden_size, cfg.moe_intermediate_size);
    let t = RandomTrunk(&cfg);
    let up = t.matrix(&format!("model.layers.{csa_layer}.mlp.shared_experts.up_proj.weight")).unwrap();
    let down = t.matrix(&format!("model.layers.{csa_layer}.mlp.shared_experts.down_proj.weight")).unwrap();
    let (mut gate_y, mut down_y) = (vec![0.0f32; i], vec![0.0f32; h]);
    let moe_ms = median_ms(RUNS, || {
        for _ in 0..7 {
            up.matvec(&x, &mut gate_y);
            up.matvec(&x, &mut gate_y);
            down.matvec(&gate_y, &mut down_y);
        }
    });
    let pools: Vec<(usize, rayon::ThreadPool)> = [1, 2]
        .into_iter()
        .map(|n| (n, rayon::ThreadPoolBuilder::new().num_threads(n).build().expect("a thread pool")))
        .collect();
    println!(
        "DeepSeek-V4-Flash shape: {} heads of {}, window {}, CSA rate {} (indexer {} x {} choosing {}), HCA rate {}; MoE block (7 experts, q8) {moe_ms:.2} ms",
        cfg.num_heads,
        v4.head_dim,
        v4.sliding_window,
        v4.csa_rate,
        v4.index_heads,
        v4.index_head_dim,
        v4.index_topk,
        v4.hca_rate
    );
    println!("| context | layer | 1 thread ms | 2 threads ms | 2 / 1 | attention share of a step (2 threads, warm experts) |");
    println!("|---|---|---|---|---|---|");
    for ctx in CONTEXTS {
        let mut times = Vec::new();
        for (name, l, layer) in &layers {
            let mut st = V4State::new(&cfg, *l, ctx);
            st.window = random(st.window.len(), 5, 1.0);
            st.entries = random(st.entries.len(), ctx as u64, 1.0);
            let mut s = V4Scratch::new(&cfg, ctx);
            let pos = ctx - 1;
            let ms: Vec<f64> = pools
                .iter()
                .map(|(_, p)| {
                    p.install(|| median_ms(RUNS, || layer.forward(&x, pos, &mut st, &mut s, &mut y).unwrap()))
                })
                .collect();
            times.push((name, ms));
        }
        // 43 layers: the CSA / HCA mix of the config.
        let csa = v4.layers.iter().filter(|&&k| k == V4Attn::Csa).count() as f64;
        let hca = v4.layers.len() as f64 - csa;
        let attn2 = csa * times[0].1[1] + hca * times[1].1[1];
        let step2 = attn2 + cfg.num_layers as f64 * moe_ms;
        for (name, ms) in &times {
            println!(
                "| {ctx} | {name} | {:.2} | {:.2} | {:.2} | {:.0}% (step {:.2} s) |",
                ms[0],
                ms[1],
                ms[1] / ms[0],
                100.0 * attn2 / step2,
                step2 / 1e3
            );
        }
    }
}
