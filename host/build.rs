//! Builds the control component (guest/) for wasm32-wasip2 and hands its
//! path to the crate, which embeds the bytes: `waste` needs no file beside it.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "wasm32-wasip2";

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest_dir.parent().expect("host/ lives inside the workspace").to_path_buf();
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    for watched in ["guest/src", "guest/Cargo.toml", "wit", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }

    check_target_installed();

    // A separate target directory: the outer build holds the lock on ours.
    let target_dir = out_dir.join("guest-target");
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args(["build", "--release", "--locked", "-p", "waste-guest", "--target", TARGET])
        .arg("--target-dir")
        .arg(&target_dir);
    // The component is embedded and compiled at every start: keep it small
    // (no debug info, stripped, optimised for size over the workspace's
    // release settings).
    cmd.env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .env("CARGO_PROFILE_RELEASE_STRIP", "true")
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "s")
        .env("CARGO_PROFILE_RELEASE_LTO", "true")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
        .env("CARGO_PROFILE_RELEASE_PANIC", "unwind");
    // Flags meant for the host build must not leak into the wasm build.
    for var in ["CARGO_ENCODED_RUSTFLAGS", "RUSTFLAGS", "CARGO_BUILD_TARGET", "CARGO_TARGET_DIR", "RUSTC_WORKSPACE_WRAPPER"] {
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
}

/// Fails early with the fix spelled out, instead of a wall of "can't find
/// crate for std" errors. rust-toolchain.toml lists the target, so rustup
/// normally installs it on first use.
fn check_target_installed() {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let Ok(out) = Command::new(rustc).args(["--print", "sysroot"]).output() else { return };
    let sysroot = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let std_dir = Path::new(&sysroot).join("lib/rustlib").join(TARGET);
    if !sysroot.is_empty() && !std_dir.exists() {
        panic!(
            "the Rust target {TARGET} is not installed in {sysroot}; run `rustup target add {TARGET}` \
             (rust-toolchain.toml lists it, so a rustup-managed toolchain installs it automatically)"
        );
    }
}
