//! One function per subcommand, each a client of the waste-host API.

use std::io::{IsTerminal, Read};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::json;
use waste_host::quant::{ExpertFormat, TrunkFormat};
use waste_host::{ConvertOptions, Engine, GenerateParams, OpenOptions, Session};

use crate::output;
use crate::{ConvertArgs, DetokenizeArgs, EvalArgs, InfoArgs, ModelArgs, RunArgs, TokenizeArgs, VersionArgs};

/// A mistake in how the command was called: exit code 2.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

pub fn is_usage_error(e: &anyhow::Error) -> bool {
    e.downcast_ref::<UsageError>().is_some()
        || matches!(e.downcast_ref::<waste_host::Error>(), Some(waste_host::Error::Arg(_)))
}

pub fn usage(msg: impl Into<String>) -> anyhow::Error {
    UsageError(msg.into()).into()
}

pub fn convert(a: ConvertArgs) -> Result<()> {
    let experts = ExpertFormat::parse(&a.experts)
        .ok_or_else(|| usage(format!("--experts {:?}: expected f32, q8, q4, rvq3, rvq2 or rvq4p", a.experts)))?;
    let trunk = TrunkFormat::parse(&a.trunk)
        .ok_or_else(|| usage(format!("--trunk {:?}: expected f32, q8 or q4", a.trunk)))?;
    if a.verify && a.reclaim {
        return Err(usage("--verify reads the source checkpoint, which --reclaim deletes; run them separately"));
    }
    if a.verify && a.follow {
        return Err(usage("--verify reads the whole source, which --follow does not wait to have; run it separately"));
    }
    let opts = ConvertOptions {
        experts,
        trunk,
        jobs: a.jobs as usize,
        reclaim: a.reclaim,
        follow: a.follow.then(|| std::time::Duration::from_secs(a.follow_timeout)),
        ..ConvertOptions::default()
    };
    let started = Instant::now();
    let mut bar: Option<indicatif::ProgressBar> = None;
    let report = waste_host::convert(&a.src, &a.out, &opts, &mut |p| {
        let bar = bar.get_or_insert_with(|| output::progress_bar(p.total));
        bar.set_position(p.done);
        bar.set_message(p.what.clone());
    })
    .with_context(|| format!("converting {}", a.src.display()))?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    eprintln!(
        "wrote {} in {:.1} s: trunk {:.2} MB ({}), experts {:.2} MB ({}, {} layers, {} bytes per record)",
        a.out.display(),
        started.elapsed().as_secs_f64(),
        report.trunk_bytes as f64 / 1e6,
        trunk.name(),
        report.expert_bytes as f64 / 1e6,
        experts.name(),
        report.moe_layers,
        report.expert_record_bytes
    );
    if !report.ignored_tensors.is_empty() {
        eprintln!("ignored {} unused tensor(s): {}", report.ignored_tensors.len(), report.ignored_tensors.join(", "));
    }
    if report.trunk_reused || !report.reused_banks.is_empty() {
        let layers: Vec<String> = report.reused_banks.iter().map(|l| l.to_string()).collect();
        eprintln!(
            "resumed: reused {}{} finished bank(s) (layers {})",
            if report.trunk_reused { "the trunk and " } else { "" },
            layers.len(),
            layers.join(",")
        );
    }
    for shard in &report.reclaimed_shards {
        eprintln!("reclaimed {}", shard.display());
    }
    if a.verify {
        crate::cmd_convert_verify::verify(&a.src, &a.out, a.json)?;
    }
    Ok(())
}

pub fn open(args: &ModelArgs) -> Result<(Engine, Session)> {
    let budget = crate::cmd_stream::budget_arg(&args.budget)?;
    let (threads, cpus) = thread_args(args)?;
    let options = OpenOptions { context: args.ctx, budget, threads, cpus, ..OpenOptions::default() };
    let model = crate::render::open_model(&args.model, &options)
        .with_context(|| format!("opening {}", args.model.display()))?;
    let engine = Engine::new()?;
    let session = engine.session(model)?;
    Ok((engine, session))
}

/// `--threads` / `--cpus`; a malformed cpu list is a usage error.
pub fn thread_args(args: &ModelArgs) -> Result<(Option<usize>, Option<waste_host::pool::CpuSet>)> {
    let cpus = match &args.cpus {
        None => None,
        Some(list) => Some(waste_host::pool::CpuSet::parse(list).map_err(|e| usage(format!("--cpus: {e}")))?),
    };
    Ok((args.threads.map(|n| n as usize), cpus))
}

/// The prompt from the argument, `--file`, or stdin (`-`, or no argument
/// with stdin not a terminal).
fn read_prompt(arg: Option<&str>, file: Option<&Path>) -> Result<String> {
    if let Some(path) = file {
        return std::fs::read_to_string(path).with_context(|| format!("reading the prompt from {}", path.display()));
    }
    match arg {
        Some("-") => read_stdin(),
        Some(text) => Ok(text.to_string()),
        None if !std::io::stdin().is_terminal() => read_stdin(),
        None => Err(usage("no prompt: give it as an argument, with --file, or on stdin")),
    }
}

fn read_stdin() -> Result<String> {
    let mut text = String::new();
    std::io::stdin().read_to_string(&mut text).context("reading the prompt from stdin")?;
    if text.is_empty() {
        return Err(usage("no prompt: stdin was empty (give the prompt as an argument, with --file, or on stdin)"));
    }
    Ok(text)
}

fn encode(session: &mut Session, text: &str, markup: bool) -> Result<Vec<u32>> {
    let tokens = if markup { session.tokenize_markup(text)? } else { session.tokenize(text)? };
    Ok(tokens)
}

/// Loads `--sampler PATH` with its `--sampler-opt NAME=NUMBER` options
/// (shared by `run` and `serve`).
pub fn sampler_plugin(path: &std::path::Path, opts: &[String]) -> Result<waste_host::plugin::SamplerPlugin> {
    let mut options = Vec::new();
    for item in opts {
        let parsed = item.split_once('=').and_then(|(k, v)| Some((k.trim().to_string(), v.trim().parse::<f32>().ok()?)));
        options.push(parsed.ok_or_else(|| usage(format!("--sampler-opt {item:?}: expected NAME=NUMBER, e.g. tau=5")))?);
    }
    waste_host::plugin::SamplerPlugin::load(path, options, Default::default())
        .with_context(|| format!("loading the sampler plugin {}", path.display()))
}

pub fn run(a: RunArgs) -> Result<()> {
    if !(a.temperature.is_finite() && a.temperature >= 0.0) {
        bail!(usage(format!("--temp {}: the temperature must be a number >= 0", a.temperature)));
    }
    if !(a.top_p > 0.0 && a.top_p <= 1.0) {
        bail!(usage(format!("--top-p {}: must be in (0, 1]", a.top_p)));
    }
    let prompt = read_prompt(a.prompt.as_deref(), a.file.as_deref())?;
    let (_engine, mut session) = open(&a.model)?;
    if let Some(path) = &a.sampler {
        session.set_sampler(Some(sampler_plugin(path, &a.sampler_opt)?));
    }
    if let Some(path) = &a.load_state {
        session.load_state(path).with_context(|| format!("loading the session from {}", path.display()))?;
    }
    let mut tokens = Vec::new();
    if let (Some(bos), 0) = (session.model().info().bos_token, session.tokens().len()) {
        tokens.push(bos);
    }
    tokens.extend(encode(&mut session, &prompt, a.markup)?);
    if tokens.is_empty() {
        bail!(usage("the prompt encodes to no tokens"));
    }
    let logit_bias = parse_logit_bias(&a.logit_bias)?;
    let params = GenerateParams {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repetition_penalty: a.repeat_penalty,
        presence_penalty: a.presence_penalty,
        frequency_penalty: a.frequency_penalty,
        penalty_last_n: a.repeat_last_n,
        logit_bias,
        top_logprobs: a.logprobs.unwrap_or(0),
        seed: a.seed,
        max_tokens: a.max_tokens,
        stop_at_eos: !a.ignore_eos,
        stop_strings: a.stop.clone(),
        stop_tokens: a.stop_token.clone(),
    };
    let show_logprobs = a.logprobs.is_some();
    let renderer = Arc::new(Mutex::new(crate::render::Renderer::new()));
    let sink = renderer.clone();
    let started = Instant::now();
    let completion = session.generate(&tokens, &params, move |event| {
        if show_logprobs {
            let top: Vec<_> = event.top_logprobs.iter().map(|(id, lp)| json!({"id": id, "logprob": lp})).collect();
            eprintln!("{}", json!({"token": event.token, "text": event.text, "logprob": event.logprob, "top": top}));
        }
        // A closed stdout (a pipe to `head`) ends the generation quietly.
        sink.lock().map(|mut r| r.token(event)).unwrap_or(false)
    })?;
    let seconds = started.elapsed().as_secs_f64();
    println!();
    if let Some(path) = &a.save_state {
        session.save_state(path).with_context(|| format!("saving the session to {}", path.display()))?;
    }
    let totals = {
        let mut r = renderer.lock().map_err(|_| anyhow::anyhow!("statistics lock poisoned"))?;
        r.clear();
        r.totals
    };
    eprintln!("{} (stop: {})", output::stats_line(&totals, seconds), completion.stop_reason.as_str());
    Ok(())
}

/// `ID=BIAS` pairs of `--logit-bias`.
fn parse_logit_bias(items: &[String]) -> Result<Vec<(u32, f32)>> {
    items
        .iter()
        .map(|item| {
            let parsed = item
                .split_once('=')
                .and_then(|(id, bias)| Some((id.trim().parse::<u32>().ok()?, bias.trim().parse::<f32>().ok()?)));
            parsed.ok_or_else(|| usage(format!("--logit-bias {item:?}: expected ID=BIAS, e.g. 42=-5")))
        })
        .collect()
}

pub fn eval(a: EvalArgs) -> Result<()> {
    let (_engine, mut session) = open(&a.model)?;
    let tokens = match (&a.tokens, &a.prompt) {
        (Some(ids), _) => ids.clone(),
        (None, prompt) => {
            let text = read_prompt(prompt.as_deref(), a.file.as_deref())?;
            encode(&mut session, &text, a.markup)?
        }
    };
    if tokens.is_empty() {
        bail!(usage("nothing to evaluate: no tokens"));
    }
    let vocab = session.model().info().vocab_size;
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
        bail!(usage(format!("token id {bad} is outside the vocabulary (size {vocab})")));
    }
    let all = a.all_positions;
    let (logits, _stats) = session.eval(&tokens, all)?;
    let last = &logits[logits.len() - vocab..];
    if let Some(path) = &a.logits {
        let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(path, bytes).with_context(|| format!("writing logits to {}", path.display()))?;
    }
    let mut order: Vec<usize> = (0..vocab).collect();
    order.sort_by(|&x, &y| last[y].total_cmp(&last[x]).then(x.cmp(&y)));
    let max = last.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let log_sum = last.iter().map(|&l| (l as f64 - max).exp()).sum::<f64>().ln() + max;
    let has_tokenizer = session.model().info().has_tokenizer;
    let mut top = Vec::new();
    for &id in order.iter().take(a.top) {
        let text = if has_tokenizer { Some(session.detokenize(&[id as u32])?) } else { None };
        top.push((id, last[id], last[id] as f64 - log_sum, text));
    }
    if a.json {
        let top: Vec<_> = top
            .iter()
            .map(|(id, logit, lp, text)| json!({"id": id, "logit": logit, "logprob": lp, "text": text}))
            .collect();
        println!("{}", json!({"tokens": tokens, "positions": tokens.len(), "vocab_size": vocab, "top": top}));
    } else {
        println!("{} tokens evaluated; most likely next tokens:", tokens.len());
        for (id, logit, lp, text) in &top {
            let shown = text.as_deref().map(|t| format!("{t:?}")).unwrap_or_default();
            println!("{id:>8}  logprob {lp:>9.4}  logit {logit:>9.4}  {shown}");
        }
    }
    Ok(())
}

pub fn tokenize(a: TokenizeArgs) -> Result<()> {
    let text = read_prompt(a.text.as_deref(), a.file.as_deref())?;
    let (_engine, mut session) = open(&a.model)?;
    let ids = encode(&mut session, &text, a.markup)?;
    let mode = if a.markup { "markup" } else { "content" };
    if a.json {
        println!("{}", json!({"mode": mode, "tokens": ids}));
    } else {
        eprintln!("mode: {mode} ({} tokens)", ids.len());
        println!("{}", ids.iter().map(u32::to_string).collect::<Vec<_>>().join(","));
    }
    Ok(())
}

pub fn detokenize(a: DetokenizeArgs) -> Result<()> {
    let mut ids = Vec::new();
    for part in a.ids.iter().flat_map(|s| s.split([',', ' '])).filter(|s| !s.is_empty()) {
        let id: u32 = part.trim().parse().map_err(|_| usage(format!("{part:?} is not a token id")))?;
        ids.push(id);
    }
    let (_engine, mut session) = open(&a.model)?;
    let text = session.detokenize(&ids)?;
    if a.json {
        println!("{}", json!({"tokens": ids, "text": text}));
    } else {
        println!("{text}");
    }
    Ok(())
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
    let container = waste_host::container::Container::open(&a.model)
        .with_context(|| format!("opening {}", a.model.display()))?;
    let i = &container.info();
    if a.json {
        println!(
            "{}",
            json!({
                "family": i.family, "vocab_size": i.vocab_size, "hidden_size": i.hidden_size,
                "layers": i.num_layers, "moe_layers": i.moe_layers, "experts": i.num_experts, "top_k": i.top_k,
                "max_position_embeddings": i.max_position_embeddings, "bos_token": i.bos_token,
                "eos_tokens": i.eos_tokens, "trunk_format": i.trunk_format, "expert_format": i.expert_format,
                "expert_record_bytes": i.expert_record_bytes, "trunk_bytes": i.trunk_bytes,
                "has_tokenizer": i.has_tokenizer, "has_chat_template": i.has_chat_template,
                "router": i.router, "shared_expert_width": i.shared_expert_width,
                "total_params": i.total_params, "active_params": i.active_params,
                "layer_pattern": i.layers.iter().map(|l| json!({
                    "attention": l.attention, "ffn": if l.moe { "moe" } else { "dense" },
                    "state_bytes_fixed": l.state_bytes_fixed, "state_bytes_per_token": l.state_bytes_per_token,
                })).collect::<Vec<_>>(),
                "state_bytes_fixed": i.layers.iter().map(|l| l.state_bytes_fixed).sum::<u64>(),
                "state_bytes_per_token": i.layers.iter().map(|l| l.state_bytes_per_token).sum::<u64>(),
            })
        );
    } else {
        println!("family        {}", i.family);
        println!("layers        {} ({} MoE)", i.num_layers, i.moe_layers);
        println!("hidden        {}", i.hidden_size);
        println!("experts       {} per MoE layer, top-{}, router {}", i.num_experts, i.top_k, i.router);
        if i.shared_expert_width > 0 {
            println!("shared expert width {} per MoE layer", i.shared_expert_width);
        }
        println!(
            "parameters    {} total, {} active per token ({} / {})",
            short_count(i.total_params),
            short_count(i.active_params),
            i.total_params,
            i.active_params
        );
        let pattern: Vec<String> =
            i.layers.iter().map(|l| format!("{}/{}", l.attention, if l.moe { "MoE" } else { "dense" })).collect();
        println!("layer pattern {}", pattern.join(" "));
        let fixed: u64 = i.layers.iter().map(|l| l.state_bytes_fixed).sum();
        let per_token: u64 = i.layers.iter().map(|l| l.state_bytes_per_token).sum();
        println!("state         {fixed} bytes fixed + {per_token} bytes per token of context");
        for (n, l) in i.layers.iter().enumerate() {
            println!(
                "  layer {n:<3} {} {:<5} state {} bytes fixed, {} bytes/token",
                l.attention,
                if l.moe { "MoE" } else { "dense" },
                l.state_bytes_fixed,
                l.state_bytes_per_token
            );
        }
        println!("vocabulary    {}", i.vocab_size);
        println!("context       {} max", i.max_position_embeddings);
        println!("trunk         {} ({:.2} MB resident)", i.trunk_format, i.trunk_bytes as f64 / 1e6);
        println!("experts       {} ({} bytes per record)", i.expert_format, i.expert_record_bytes);
        println!("tokenizer     {}", if i.has_tokenizer { "yes" } else { "none" });
        println!("chat template {}", if i.has_chat_template { "yes" } else { "none" });
    }
    Ok(())
}

pub fn version(a: VersionArgs) -> Result<()> {
    let format = waste_host::container::manifest::FORMAT_VERSION;
    if a.json {
        // Compiling the bundled component is what every command pays at
        // start-up; report it so it can be watched.
        let engine = Engine::new()?;
        println!(
            "{}",
            json!({
                "version": waste_host::VERSION, "container_format": format, "wit": "waste:engine@0.1.0",
                "component_bytes": waste_host::component_bytes().len(),
                "component_compile_ms": engine.compile_time().as_secs_f64() * 1000.0,
                "component_instantiate_ms": engine.measure_instantiate()?.as_secs_f64() * 1000.0,
            })
        );
    } else {
        println!("waste {} (container format {format}, wit waste:engine@0.1.0)", waste_host::VERSION);
    }
    Ok(())
}

/// Writes the bundled control component, for hosts with their own wasmtime
/// binding (docs/EMBEDDING.md).
pub fn component(a: crate::ComponentArgs) -> Result<()> {
    let bytes = waste_host::component_bytes();
    std::fs::write(&a.out, bytes).with_context(|| format!("writing {}", a.out.display()))?;
    println!("{}: {} bytes (WIT world waste:engine/engine, wit/engine.wit)", a.out.display(), bytes.len());
    Ok(())
}
