//! The C example (examples/c/embed.c) compiled with the system C compiler
//! against the built libwaste and run on the shipped demo model.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::TempDir;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// target/release: the directory above the test binary's deps/, where
/// cargo puts libwaste.so after `cargo build --release -p waste-ffi`.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe.parent().and_then(Path::parent).expect("target dir").to_path_buf();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let o = Command::new(cargo)
        .args(["build", "--release", "-p", "waste-ffi"])
        .current_dir(root())
        .output()
        .expect("run cargo build -p waste-ffi");
    assert!(o.status.success(), "building waste-ffi failed:\n{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        dir.join("libwaste.so").is_file() || dir.join("libwaste.dylib").is_file(),
        "no libwaste in {}",
        dir.display()
    );
    dir
}

/// The chat turn the C and Python examples end with: the template's
/// lengths as the Rust API gives them, and a first reply token that heads
/// its three alternatives. Returns the alternatives line.
fn check_chat_turn(out: &str) -> String {
    use waste_host::{ChatMessage, Engine, Model, OpenOptions};
    let model = Model::open(&root().join("examples/bible-moe.waste"), &OpenOptions::default()).unwrap();
    let engine = Engine::new().unwrap();
    let mut s = engine.session(model).unwrap();
    let msgs = [ChatMessage::new("user", "And God said")];
    let text = s.render_chat_template(&msgs, None, true).unwrap();
    let ids = s.apply_chat_template(&msgs, None, true).unwrap();
    let want = format!("chat prompt: {} bytes, {} tokens", text.len(), ids.len());
    assert!(out.contains(&want), "{want:?} missing from:\n{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("first reply token "))
        .unwrap_or_else(|| panic!("no alternatives line in:\n{out}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    // first reply token T; alternatives: T (lp) A (lp) B (lp)
    assert_eq!(words.len(), 11, "{line}");
    assert_eq!(words[3].trim_end_matches(';'), words[5], "{line}");
    line.to_string()
}

#[test]
fn c_example_plans_opens_streams_and_reloads_state() {
    let lib = lib_dir();
    let tmp = TempDir::new("ffi-c");
    let exe = tmp.path().join("embed");
    let o = Command::new("cc")
        .arg("-Wall")
        .arg("-Werror")
        .arg(root().join("examples/c/embed.c"))
        .arg("-I")
        .arg(root().join("ffi/include"))
        .arg("-L")
        .arg(&lib)
        .arg("-lwaste")
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("run cc");
    assert!(o.status.success(), "cc failed:\n{}", String::from_utf8_lossy(&o.stderr));
    let o = Command::new(&exe)
        .arg(root().join("examples/bible-moe.waste"))
        .arg(tmp.path().join("state.bin"))
        .env("LD_LIBRARY_PATH", &lib)
        .env("DYLD_LIBRARY_PATH", &lib)
        .output()
        .expect("run the C example");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "the C example failed:\n{out}\n{err}");
    assert!(out.contains("generated 16 tokens"), "{out}");
    check_chat_turn(&out);
    assert!(out.contains("state: saved at 18, loaded at 18"), "{out}");
    assert!(err.contains("[16 tokens, experts reused"), "progress lines missing: {err}");
}

#[test]
fn component_subcommand_writes_the_bundled_component() {
    let tmp = TempDir::new("component");
    let out = tmp.path().join("waste-engine.wasm");
    let o = crate::common::waste(&["component", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", crate::common::stderr(&o));
    let bytes = std::fs::read(&out).expect("component written");
    // A component (not a core module): magic, then version 0x0d and layer 1.
    assert_eq!(&bytes[..8], b"\0asm\x0d\x00\x01\x00", "not a wasm component");
    let o = crate::common::waste(&["component"]);
    assert_eq!(o.status.code(), Some(2), "a missing --out is a usage error");
}

/// False (after a loud SKIP naming `test`) when python3 cannot run.
fn python3_present(test: &str) -> bool {
    let present = Command::new("python3").arg("--version").output().map(|o| o.status.success()).unwrap_or(false);
    if !present {
        crate::common::report_skip(&format!("SKIP {test}: python3 is missing"));
    }
    present
}

/// The built shared library, for the Python binding's `WASTE_LIB`.
fn shared_lib() -> PathBuf {
    let lib = lib_dir();
    if lib.join("libwaste.so").is_file() {
        lib.join("libwaste.so")
    } else {
        lib.join("libwaste.dylib")
    }
}

#[test]
fn python_example_plans_opens_streams_and_reloads_state() {
    if !python3_present("python_example_plans_opens_streams_and_reloads_state") {
        return;
    }
    let tmp = TempDir::new("ffi-py");
    let o = Command::new("python3")
        .arg(root().join("examples/python/embed.py"))
        .arg(root().join("examples/bible-moe.waste"))
        .arg(tmp.path().join("state.bin"))
        .env("WASTE_LIB", shared_lib())
        .output()
        .expect("run python3");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "the Python example failed:\n{out}\n{err}");
    assert!(out.contains("generated 16 tokens"), "{out}");
    check_chat_turn(&out);
    assert!(out.contains("state: saved at 18, loaded at 18"), "{out}");
    assert!(err.contains("[16 tokens, experts reused"), "progress lines missing: {err}");
    // The schema-constrained answer parses and holds to the schema.
    let json = out.lines().find_map(|l| l.strip_prefix("json: ")).unwrap_or_else(|| panic!("no json line: {out}"));
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json:?}"));
    assert!(["Genesis", "Exodus"].contains(&v["book"].as_str().unwrap_or("")), "{v}");
    assert!((1..=50).contains(&v["chapter"].as_i64().unwrap_or(0)), "{v}");
}

/// Regression: the Python binding could not pass chat-template variables
/// (`enable_thinking`), which the C ABI, CLI and server already carried.
#[test]
fn python_binding_renders_template_variables_as_transformers_does() {
    if !python3_present("python_binding_renders_template_variables_as_transformers_does") {
        return;
    }
    let tmp = TempDir::new("ffi-py-vars");
    let model = crate::common::bible_moe_with_qwen3_template(&tmp);
    let o = Command::new("python3")
        .arg(root().join("tests/python/check_template_vars.py"))
        .arg(&model)
        .arg(crate::common::fixtures().join("chat_templates/expected.json"))
        .env("WASTE_LIB", shared_lib())
        .output()
        .expect("run python3");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "check_template_vars.py failed:\n{out}\n{err}");
    let checked: usize = out
        .lines()
        .find_map(|l| l.strip_prefix("checked ")?.strip_suffix(" cases")?.parse().ok())
        .unwrap_or_else(|| panic!("no count in:\n{out}"));
    assert!(checked >= 4, "only {checked} cases checked:\n{out}");
    assert!(out.contains("rejected: "), "{out}");
}

#[test]
fn rust_example_plans_opens_streams_and_reloads_state() {
    let tmp = TempDir::new("ffi-rs");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let o = Command::new(cargo)
        .args(["run", "--quiet", "--release", "-p", "waste-host", "--example", "embed", "--"])
        .arg(root().join("examples/bible-moe.waste"))
        .arg(tmp.path().join("state.bin"))
        .current_dir(root())
        .output()
        .expect("run cargo run --example embed");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "the Rust example failed:\n{out}\n{err}");
    assert!(out.contains("generated 16 tokens"), "{out}");
    assert!(out.contains("state: saved at 18, loaded at 18"), "{out}");
    assert!(err.contains("[16 tokens, experts reused"), "progress lines missing: {err}");
}

/// Images through the C ABI from Python (examples/python/image.py): both
/// fixture images attached, their markup in the message's `media`, and the
/// greedy answer is the pure-torch reference's (tests/gen_k3_vision_tower.py).
#[test]
fn python_example_answers_from_images() {
    if !python3_present("python_example_answers_from_images") {
        return;
    }
    let tmp = TempDir::new("ffi-py-image");
    let c = crate::common::convert("kimi_k3-vision", "f32", "f32", tmp.path());
    let fixture = crate::common::fixture("kimi_k3-vision");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(fixture.join("reference.json")).unwrap()).unwrap();
    let want: Vec<String> =
        r["chat"]["greedy_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap().to_string()).collect();
    let o = Command::new("python3")
        .arg(root().join("examples/python/image.py"))
        .arg(&c)
        .arg(want.len().to_string())
        .arg(r["cli"]["text"].as_str().unwrap())
        .arg(fixture.join("image_a.png"))
        .arg(fixture.join("image_b.png"))
        .env("WASTE_LIB", shared_lib())
        .output()
        .expect("run python3");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "the Python image example failed:\n{out}\n{err}");
    assert!(out.contains("150x100, 24 positions") && out.contains("40x130, 10 positions"), "{out}");
    assert!(out.contains(&format!("tokens: {}", want.join(" "))), "{out}");
}

/// Regression: a field added to a C struct (`waste_open_options.kv_type`)
/// must be added to the Python binding's mirror too, or the library writes
/// past the struct Python allocated. Every mirrored struct's size and the
/// C one's agree.
#[test]
fn python_binding_structs_have_the_c_layouts_sizes() {
    if !python3_present("python_binding_structs_have_the_c_layouts_sizes") {
        return;
    }
    use std::mem::size_of;
    let c = [
        ("OpenOptions", size_of::<waste::waste_open_options>()),
        ("MemoryPlan", size_of::<waste::waste_memory_plan>()),
        ("Str", size_of::<waste::waste_str>()),
        ("GenerateParams", size_of::<waste::waste_generate_params>()),
        ("TopLogprob", size_of::<waste::waste_top_logprob>()),
        ("TokenEvent", size_of::<waste::waste_token_event>()),
        ("ChatMessage", size_of::<waste::waste_chat_message>()),
        ("ImageInfo", size_of::<waste::waste_image_info>()),
        ("SamplerOption", size_of::<waste::waste_sampler_option>()),
        ("Completion", size_of::<waste::waste_completion>()),
    ];
    let names: Vec<&str> = c.iter().map(|(n, _)| *n).collect();
    let script = format!("import ctypes, waste\nfor n in {names:?}:\n    print(n, ctypes.sizeof(getattr(waste, n)))\n");
    let o = Command::new("python3")
        .arg("-c")
        .arg(script)
        .env("PYTHONPATH", root().join("examples/python"))
        .env("WASTE_LIB", shared_lib())
        .output()
        .expect("run python3");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}\n{}", String::from_utf8_lossy(&o.stderr));
    for ((name, size), line) in c.iter().zip(out.lines()) {
        assert_eq!(line, format!("{name} {size}"), "examples/python/waste.py's {name} vs the C struct");
    }
    assert_eq!(out.lines().count(), c.len());
}
