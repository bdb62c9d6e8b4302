//! Embedding WASTE from Rust: plan, open, stream with progress, save/load.
//!
//! `cargo run --release -p waste-host --example embed -- MODEL.waste STATE_FILE`

use std::path::Path;
use std::sync::{Arc, Mutex};

use waste_host::{Engine, GenerateParams, Model, OpenOptions};

fn main() -> waste_host::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (model_path, state_path) = match &args[1..] {
        [m, s] => (Path::new(m), Path::new(s)),
        _ => return Err(waste_host::Error::Arg("usage: embed MODEL.waste STATE_FILE".into())),
    };
    println!("waste {}", waste_host::VERSION);
    let plan = waste_host::plan_path(model_path, &Default::default())?;
    println!("plan: floor {}, recommended {} bytes", plan.floor, plan.recommended);
    let options = OpenOptions { budget: Some(plan.recommended), ..OpenOptions::default() };
    let model = Model::open(model_path, &options)?;
    let engine = Engine::new()?;
    let mut session = engine.session(Arc::clone(&model))?;
    let prompt = session.tokenize("And God said")?;
    let params = GenerateParams { temperature: 0.0, max_tokens: 16, ..GenerateParams::default() };
    // The callback must be 'static: progress is shared through an Arc.
    let progress = Arc::new(Mutex::new((0u32, waste_host::Picks::default(), 0u64)));
    let seen = Arc::clone(&progress);
    let done = session.generate(&prompt, &params, move |ev| {
        let mut p = seen.lock().unwrap();
        p.0 += 1;
        p.1.add(&ev.stats.picks());
        p.2 += ev.stats.bytes_read;
        eprintln!(
            "[{} tokens, experts reused {}, prefetched {}, read {}, {} bytes read, {:.2} of {:.2} ms in I/O]",
            p.0, p.1.reused, p.1.prefetched, p.1.missed, p.2, ev.stats.ms_io, ev.stats.ms_total
        );
        true
    })?;
    println!("{}\ngenerated {} tokens", done.text, done.tokens.len());
    let saved = session.position();
    session.save_state(state_path)?;
    session.reset();
    session.load_state(state_path)?;
    println!("state: saved at {saved}, loaded at {}", session.position());
    let s = model.store_stats();
    println!("store: experts {}, {} bytes read", s.picks, s.bytes_read);
    Ok(())
}
