//! Builds the control component (guest/) for wasm32-wasip2, precompiles it
//! for the native host with wasmtime, and hands both paths to the crate,
//! which embeds the bytes: `waste` needs no file beside it.
//!
//! Precompiling moves the ~0.5 s Cranelift compile of the component from
//! every start of `waste` to the build; at run time the precompiled bytes
//! deserialise in about a millisecond (runtime.rs falls back to compiling the
//! wasm if they do not load, e.g. on a CPU lacking a feature of the build
//! machine's).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

// The exact `Config` the runtime engine uses (see the file's comment).
mod engine_config {
    include!("src/engine_config.rs");
}

const TARGET: &str = "wasm32-wasip2";

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    // host/runtime/ is two levels below the workspace root.
    let root = manifest_dir.ancestors().nth(2).expect("host/runtime/ lives inside the workspace").to_path_buf();
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    for watched in ["guest/src", "guest/Cargo.toml", "wit", "Cargo.lock", "host/runtime/src/engine_config.rs"] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    println!("cargo:rerun-if-env-changed={NO_PRECOMPILE_ENV}");

    check_target_installed();

    // A separate target directory: the outer build holds the lock on ours.
    let target_dir = out_dir.join("guest-target");
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args(["build", "--release", "--locked", "-p", "waste-guest", "--target", TARGET])
        .arg("--target-dir")
        .arg(&target_dir);
    // The component is embedded (and compiled at start-up whenever the
    // precompiled code cannot be used): keep it small (no debug info,
    // stripped, optimised for size over the workspace's release settings).
    cmd.env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .env("CARGO_PROFILE_RELEASE_STRIP", "true")
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "s")
        .env("CARGO_PROFILE_RELEASE_LTO", "true")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
        .env("CARGO_PROFILE_RELEASE_PANIC", "unwind");
    // Flags meant for the host build must not leak into the wasm build.
    for var in
        ["CARGO_ENCODED_RUSTFLAGS", "RUSTFLAGS", "CARGO_BUILD_TARGET", "CARGO_TARGET_DIR", "RUSTC_WORKSPACE_WRAPPER"]
    {
        cmd.env_remove(var);
    }
    let status = cmd.status().unwrap_or_else(|e| panic!("could not run cargo to build the guest: {e}"));
    if !status.success() {
        panic!("building the control component (guest/) for {TARGET} failed; see the output above");
    }
    let wasm = target_dir.join(TARGET).join("release").join("waste_guest.wasm");
    if !wasm.is_file() {
        panic!("the guest build succeeded but {} is missing", wasm.display());
    }
    println!("cargo:rustc-env=WASTE_GUEST_WASM={}", wasm.display());

    let cwasm = out_dir.join("waste_guest.cwasm");
    let precompiled = match precompile_skip_reason() {
        Some(reason) => {
            println!(
                "cargo:warning=not precompiling the control component ({reason}); `waste` compiles it at every start"
            );
            Vec::new()
        }
        None => precompile(&wasm),
    };
    std::fs::write(&cwasm, &precompiled).unwrap_or_else(|e| panic!("could not write {}: {e}", cwasm.display()));
    println!("cargo:rustc-env=WASTE_GUEST_CWASM={}", cwasm.display());
}

/// Set to 1 to embed no precompiled component (always compile at start-up).
const NO_PRECOMPILE_ENV: &str = "WASTE_NO_PRECOMPILE";

/// Why the component cannot (or must not) be precompiled here, if so.
fn precompile_skip_reason() -> Option<String> {
    if env::var_os(NO_PRECOMPILE_ENV).is_some_and(|v| !v.is_empty() && v != "0") {
        return Some(format!("{NO_PRECOMPILE_ENV} is set"));
    }
    // Precompiled code is specific to a target and its CPU features, which
    // are only known when the build machine is the target: a cross build
    // embeds no precompiled code and compiles at start-up.
    let target = env::var("TARGET").expect("cargo sets TARGET");
    let host = env::var("HOST").expect("cargo sets HOST");
    if target != host {
        return Some(format!("cross-compiling for {target} on {host}"));
    }
    None
}

/// The component precompiled by an engine configured exactly as the runtime
/// one (`engine_config`), for the native CPU.
fn precompile(wasm: &Path) -> Vec<u8> {
    let started = Instant::now();
    let bytes = std::fs::read(wasm).unwrap_or_else(|e| panic!("could not read {}: {e}", wasm.display()));
    let engine = wasmtime::Engine::new(&engine_config::engine_config())
        .unwrap_or_else(|e| panic!("could not create the wasmtime engine for precompiling: {e:#}"));
    let cwasm = engine
        .precompile_component(&bytes)
        .unwrap_or_else(|e| panic!("precompiling the control component failed: {e:#}"));
    eprintln!(
        "precompiled {} ({} bytes) to {} bytes in {:.0} ms",
        wasm.display(),
        bytes.len(),
        cwasm.len(),
        started.elapsed().as_secs_f64() * 1000.0
    );
    cwasm
}

/// rustup does not add a target listed in rust-toolchain.toml to a toolchain
/// that is already installed (checked: `rustup target remove wasm32-wasip2`,
/// then any cargo command leaves it missing), so a fresh clone on a machine
/// with a stable toolchain would fail here. Add it through rustup when rustup
/// manages this toolchain; otherwise fail early with the fix spelled out,
/// instead of a wall of "can't find crate for std" errors.
fn check_target_installed() {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let Ok(out) = Command::new(rustc).args(["--print", "sysroot"]).output() else { return };
    let sysroot = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let std_dir = Path::new(&sysroot).join("lib/rustlib").join(TARGET);
    if sysroot.is_empty() || std_dir.exists() {
        return;
    }
    let mut rustup = Command::new("rustup");
    rustup.args(["target", "add", TARGET]);
    if let Ok(toolchain) = env::var("RUSTUP_TOOLCHAIN") {
        rustup.args(["--toolchain", &toolchain]);
    }
    let added = rustup.status().map(|s| s.success()).unwrap_or(false);
    if !added || !std_dir.exists() {
        panic!(
            "the Rust target {TARGET} is not installed in {sysroot} and `rustup target add {TARGET}` \
             did not install it; install it and build again"
        );
    }
}
