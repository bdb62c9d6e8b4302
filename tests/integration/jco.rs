//! The bundled component loaded by a second host binding: jco (JavaScript,
//! tests/jco/host.mjs) implements the `model` imports of wit/engine.wit over
//! a stub model with fixed logits and calls the `control` exports. Its
//! answers are checked here against the Rust host on the same container and
//! against the stub's rule, so the contract is shown to stand on its own.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use waste_host::{ChatMessage, Engine, Model, OpenOptions};

use crate::common::{report_skip, stderr, waste, TempDir};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn present(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().map(|o| o.status.success()).unwrap_or(false)
}

/// The stub's rule, as in tests/jco/host.mjs: after a state of `position`
/// tokens the one logit that is not 0 is that of this token.
fn stub_next(position: usize, vocab: usize) -> u32 {
    ((position * 37 + 11) % vocab) as u32
}

/// The committed lock file's packages, installed once (CI runs `npm ci`
/// first, in .ci/run; a fresh clone gets them here).
fn install_jco(dir: &Path) {
    if dir.join("node_modules/@bytecodealliance/jco/dist/jco.js").is_file()
        && dir.join("node_modules/@bytecodealliance/preview2-shim/package.json").is_file()
    {
        return;
    }
    let o = Command::new("npm").args(["ci", "--no-audit", "--no-fund"]).current_dir(dir).output().expect("run npm ci");
    assert!(o.status.success(), "npm ci in {} failed:\n{}", dir.display(), String::from_utf8_lossy(&o.stderr));
}

#[test]
fn jco_host_runs_the_exported_component_over_a_stub_model() {
    if !present("node") || !present("npm") {
        report_skip("SKIP jco_host_runs_the_exported_component_over_a_stub_model: node or npm is missing");
        return;
    }
    let jco_dir = root().join("tests/jco");
    install_jco(&jco_dir);

    let tmp = TempDir::new("jco");
    let wasm = tmp.path().join("waste-engine.wasm");
    let o = waste(&["component", "--out", wasm.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));

    // The Rust host's answers on the same container.
    let container = root().join("examples/bible-moe.waste");
    let model = Model::open(&container, &OpenOptions::default()).expect("open bible-moe");
    let info = model.info().clone();
    let engine = Engine::new().unwrap();
    let mut session = engine.session(model).unwrap();
    let text = "In the beginning God created <|im_start|> the heaven";
    let messages = vec![ChatMessage::new("system", "Answer from the book."), ChatMessage::new("user", "And God said")];
    let want_ids = session.tokenize(text).unwrap();
    let want_markup = session.tokenize_markup(text).unwrap();
    let want_chat_ids = session.apply_chat_template(&messages, None, true).unwrap();
    let want_chat_text = session.render_chat_template(&messages, None, true).unwrap();
    let prompt = session.tokenize("In the beginning").unwrap();
    let vocab = info.vocab_size;
    let (max_tokens, top_logprobs) = (6usize, 2u32);

    let spec = json!({
        "component": wasm,
        // The contract's version, from its one statement.
        "wit_version": waste_host::WIT_PACKAGE.rsplit_once('@').unwrap().1,
        "out_dir": tmp.path().join("js"),
        "tokenizer_dir": container,
        "vocab_size": vocab,
        "context": 64,
        "bos": info.bos_token,
        "eos": info.eos_tokens,
        "text": text,
        "prompt_ids": prompt,
        "max_tokens": max_tokens,
        "top_logprobs": top_logprobs,
        "messages": messages.iter().map(|m| json!({"role": m.role, "content": m.content})).collect::<Vec<_>>(),
    });
    let spec_path = tmp.path().join("spec.json");
    std::fs::write(&spec_path, spec.to_string()).unwrap();
    let o = Command::new("node").arg(jco_dir.join("host.mjs")).arg(&spec_path).output().expect("run node");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "the jco host failed:\n{out}\n{}", String::from_utf8_lossy(&o.stderr));
    let got: Value = serde_json::from_str(out.trim()).expect("one JSON line from host.mjs");
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array().expect("an id list").iter().map(|x| x.as_u64().unwrap() as u32).collect()
    };

    // The tokenizer, the detokenizer and the chat template agree with the
    // Rust host's.
    assert_eq!(ids(&got["tokenize"]), want_ids);
    assert_eq!(ids(&got["tokenize_markup"]), want_markup);
    assert_ne!(want_ids, want_markup, "the text must hold a special token");
    assert_eq!(got["detokenize"], text);
    assert_eq!(got["detokenize_prompt"].as_str().unwrap(), session.detokenize(&prompt).unwrap());
    assert_eq!(ids(&got["chat_ids"]), want_chat_ids);
    assert_eq!(got["chat_text"], want_chat_text.as_str());
    assert_eq!(got["chat_vars"]["err"]["tag"], "invalid-argument", "{got}");
    let vars_error = got["chat_vars"]["err"]["val"].as_str().unwrap_or_default();
    assert!(vars_error.contains("\"messages\" is set by the renderer itself"), "{}", got["chat_vars"]);
    // The host's refusal of a template reaches the caller as a template error.
    assert_eq!(got["no_template"]["err"]["tag"], "chat-template", "{got}");
    assert!(got["no_template"]["err"]["val"].as_str().unwrap().contains("stub: no template"), "{got}");

    // Greedy generation follows the stub: token i comes after a state of
    // prompt + i tokens; the last one is held, not evaluated.
    let g = &got["generate"];
    let want_gen: Vec<u32> = (0..max_tokens).map(|i| stub_next(prompt.len() + i, vocab)).collect();
    assert_eq!(ids(&g["tokens"]), want_gen);
    assert_eq!(g["stop_reason"], "length");
    assert_eq!(g["position_after"].as_u64().unwrap() as usize, prompt.len() + max_tokens - 1);
    assert_eq!(g["text"].as_str().unwrap(), session.detokenize(&want_gen).unwrap());
    // One logit of 10 over vocab-1 zeros: log p = 10 - ln(e^10 + vocab - 1);
    // the runner-up is the lowest id with a 0 logit.
    let log_z = (10f64.exp() + (vocab - 1) as f64).ln();
    let events = g["events"].as_array().unwrap();
    assert_eq!(events.len(), max_tokens);
    for (i, (lp, ev)) in g["logprobs"].as_array().unwrap().iter().zip(events).enumerate() {
        assert_eq!(ev["token"].as_u64().unwrap() as u32, want_gen[i]);
        let top = lp[1].as_array().unwrap();
        assert_eq!(top.len(), top_logprobs as usize);
        assert!((lp[0].as_f64().unwrap() - (10.0 - log_z)).abs() < 1e-4, "{lp}");
        assert_eq!(top[0][0].as_u64().unwrap() as u32, want_gen[i]);
        let runner_up = if want_gen[i] == 0 { 1 } else { 0 };
        assert_eq!(top[1][0].as_u64().unwrap(), runner_up);
        assert!((top[1][1].as_f64().unwrap() + log_z).abs() < 1e-4, "{lp}");
        assert_eq!(ev["logprob"], lp[0]);
    }

    // The second turn evaluates the held token first, and emit-token's
    // false cancels after two tokens.
    let c = &got["cancelled"];
    let p0 = prompt.len() + max_tokens;
    assert_eq!(ids(&c["tokens"]), vec![stub_next(p0, vocab), stub_next(p0 + 1, vocab)]);
    assert_eq!(c["stop_reason"], "cancelled");
    assert_eq!(c["position_after"].as_u64().unwrap() as usize, p0 + 1);

    // Errors cross the boundary as the WIT says: a bad parameter is
    // invalid-argument, a failing host import is failed with its message.
    assert_eq!(got["bad_param"]["err"]["tag"], "invalid-argument", "{got}");
    assert!(got["bad_param"]["err"]["val"].as_str().unwrap().contains("top-p"));
    assert_eq!(got["host_failure"]["err"]["tag"], "failed", "{got}");
    assert!(got["host_failure"]["err"]["val"].as_str().unwrap().contains("stub: evaluate refused on purpose"));
}
