//! `waste info`, `waste version` and `waste component`.

use std::path::PathBuf;

use crate::output::outln;
use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;
use waste_host::Engine;

#[derive(Args)]
pub struct InfoArgs {
    /// Container directory, or GGUF file (run in place).
    pub model: PathBuf,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct VersionArgs {
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct ComponentArgs {
    /// Where to write the component.
    #[arg(long)]
    pub out: PathBuf,
}

/// `2.78T`, `105.36B`, `3.20M`: a parameter count as papers write it.
fn short_count(n: u64) -> String {
    let v = n as f64;
    match v {
        v if v >= 1e12 => format!("{:.2}T", v / 1e12),
        v if v >= 1e9 => format!("{:.2}B", v / 1e9),
        v if v >= 1e6 => format!("{:.2}M", v / 1e6),
        _ => n.to_string(),
    }
}

pub fn info(a: InfoArgs) -> Result<()> {
    // The manifest says it all: loading a trunk (27 GB for K3) to describe
    // it would be waste.
    let container = waste_host::open_container(&a.model).with_context(|| format!("opening {}", a.model.display()))?;
    let i = &waste_host::ModelInfo::of(&container);
    if a.json {
        outln!(
            "{}",
            json!({
                "family": i.family, "vocab_size": i.vocab_size, "hidden_size": i.hidden_size,
                "layers": i.num_layers, "moe_layers": i.moe_layers, "experts": i.num_experts, "top_k": i.top_k,
                "max_position_embeddings": i.max_position_embeddings, "bos_token": i.bos_token,
                "eos_tokens": i.eos_tokens, "trunk_format": i.trunk_format, "expert_format": i.expert_format,
                "trunk_types": counts(&i.trunk_types), "expert_types": counts(&i.expert_types),
                "expert_record_bytes": i.expert_record_bytes, "trunk_bytes": i.trunk_bytes,
                "has_tokenizer": i.has_tokenizer, "has_chat_template": i.has_chat_template,
                "router": i.router, "shared_expert_width": i.shared_expert_width,
                "total_params": i.total_params, "active_params": i.active_params,
                "embedding_params": i.embedding_params, "lm_head_params": i.lm_head_params,
                "layer_pattern": i.layers.iter().map(|l| json!({
                    "attention": l.attention, "ffn": if l.moe { "moe" } else { "dense" },
                    "state_bytes_fixed": l.state_bytes_fixed, "state_bytes_per_token": l.state_bytes_per_token,
                    "state_tokens_per_row": l.state_tokens_per_row, "window": l.window,
                })).collect::<Vec<_>>(),
                "skipped": i.skipped,
                "vision": i.vision.as_ref().map(|v| json!({
                    "layers": v.layers, "hidden": v.hidden, "heads": v.heads, "parameters": v.parameters,
                    "bytes": v.bytes, "format": v.format, "grid_resize": v.grid_resize,
                })),
                "state_bytes_fixed": i.layers.iter().map(|l| l.state_bytes_fixed).sum::<u64>(),
                "state_bytes_per_token": i.layers.iter().map(|l| l.state_bytes_per_token).sum::<u64>(),
            })
        );
    } else {
        outln!("family        {}", i.family);
        outln!("layers        {} ({} MoE)", i.num_layers, i.moe_layers);
        outln!("hidden        {}", i.hidden_size);
        outln!("experts       {} per MoE layer, top-{}, router {}", i.num_experts, i.top_k, i.router);
        if i.shared_expert_width > 0 {
            outln!("shared expert width {} per MoE layer", i.shared_expert_width);
        }
        outln!(
            "parameters    {} total, {} active per token ({} / {})",
            short_count(i.total_params),
            short_count(i.active_params),
            i.total_params,
            i.active_params
        );
        // Vendors count "active" differently: with the embedding table,
        // without it (OpenAI), without it and the LM head (Zhipu).
        let without_table = i.active_params - i.embedding_params;
        outln!(
            "              {} active without the embedding table, {} without it and the LM head",
            short_count(without_table),
            short_count(without_table - i.lm_head_params)
        );
        let pattern: Vec<String> =
            i.layers.iter().map(|l| format!("{}/{}", l.attention, if l.moe { "MoE" } else { "dense" })).collect();
        outln!("layer pattern {}", pattern.join(" "));
        let fixed: u64 = i.layers.iter().map(|l| l.state_bytes_fixed).sum();
        let per_token: u64 = i.layers.iter().filter(|l| l.window.is_none()).map(|l| l.state_bytes_per_token).sum();
        let windowed: u64 = i.layers.iter().filter(|l| l.window.is_some()).map(|l| l.state_bytes_per_token).sum();
        let windows = if windowed > 0 {
            let w = i.layers.iter().filter_map(|l| l.window).max().unwrap_or(0);
            format!(" + {windowed} bytes per token of the last {w} on sliding-window layers")
        } else {
            String::new()
        };
        outln!(
            "state         {fixed} bytes fixed + {per_token} bytes per token of context{windows} (KV cache {}, the default)",
            waste_host::KvType::default()
        );
        for (n, l) in i.layers.iter().enumerate() {
            let window = l.window.map_or(String::new(), |w| {
                format!(" (window of {w}: at most {} bytes)", w as u64 * l.state_bytes_per_token)
            });
            let rows = match l.state_tokens_per_row {
                1 => String::new(),
                m => format!(" (an entry of {} bytes per {m} tokens)", l.state_bytes_per_token * m),
            };
            outln!(
                "  layer {n:<3} {} {:<5} state {} bytes fixed, {} bytes/token{rows}{window}",
                l.attention,
                if l.moe { "MoE" } else { "dense" },
                l.state_bytes_fixed,
                l.state_bytes_per_token
            );
        }
        outln!("vocabulary    {}", i.vocab_size);
        outln!("context       {} max", i.max_position_embeddings);
        outln!(
            "trunk         {} ({:.2} MB resident; {})",
            i.trunk_format,
            i.trunk_bytes as f64 / 1e6,
            listed(&i.trunk_types, "tensor")
        );
        outln!(
            "experts       {} ({} bytes per record; {})",
            i.expert_format,
            i.expert_record_bytes,
            listed(&i.expert_types, "layer")
        );
        outln!("tokenizer     {}", if i.has_tokenizer { "yes" } else { "none" });
        outln!("chat template {}", if i.has_chat_template { "yes" } else { "none" });
        if let Some(v) = &i.vision {
            outln!(
                "vision tower  {} layers of width {}, {} heads, {} parameters, {:.2} MB ({}; read at the first image), position grid resized {}",
                v.layers,
                v.hidden,
                v.heads,
                short_count(v.parameters),
                v.bytes as f64 / 1e6,
                v.format,
                v.grid_resize
            );
        }
        for s in &i.skipped {
            outln!("not converted {s}");
        }
    }
    Ok(())
}

pub fn version(a: VersionArgs) -> Result<()> {
    let format = waste_host::FORMAT_VERSION;
    if a.json {
        // Compiling the bundled component is what every command pays at
        // start-up; report it so it can be watched.
        let engine = Engine::new()?;
        outln!(
            "{}",
            json!({
                "version": waste_host::VERSION, "container_format": format, "wit": waste_host::WIT_PACKAGE,
                "component_bytes": waste_host::component_bytes().len(),
                "component_compile_ms": engine.compile_time().as_secs_f64() * 1000.0,
                "component_instantiate_ms": engine.measure_instantiate()?.as_secs_f64() * 1000.0,
            })
        );
    } else {
        outln!("waste {} (container format {format}, wit {})", waste_host::VERSION, waste_host::WIT_PACKAGE);
    }
    Ok(())
}

/// Writes the bundled control component, for hosts with their own wasmtime
/// binding (docs/EMBEDDING.md).
pub fn component(a: ComponentArgs) -> Result<()> {
    let bytes = waste_host::component_bytes();
    std::fs::write(&a.out, bytes).with_context(|| format!("writing {}", a.out.display()))?;
    outln!("{}: {} bytes (WIT world waste:engine/engine, wit/engine.wit)", a.out.display(), bytes.len());
    Ok(())
}

/// `{"q4": 120, "f32": 61}` in the order given (most first).
fn counts(types: &[(String, usize)]) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for (name, n) in types {
        m.insert(name.clone(), json!(n));
    }
    serde_json::Value::Object(m)
}

/// `120 q4 tensors, 61 f32`: each format with its count, the noun once.
fn listed(types: &[(String, usize)], noun: &str) -> String {
    let parts: Vec<String> = types
        .iter()
        .enumerate()
        .map(|(k, (name, n))| {
            let noun = if k > 0 {
                String::new()
            } else if *n == 1 {
                format!(" {noun}")
            } else {
                format!(" {noun}s")
            };
            format!("{n} {name}{noun}")
        })
        .collect();
    parts.join(", ")
}
