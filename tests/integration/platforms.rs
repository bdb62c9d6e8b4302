//! Other platforms, executed rather than only compiled (issue 19): the
//! `waste` binary cross-built for ARM Linux runs the shipped model under
//! qemu-user, and the one cross-built for Windows under wine, and each says
//! what the x86 Linux build says.

use std::process::Command;

use crate::common::{report_skip, stderr, stdout, target_dir, waste};

/// `.ci/run` cross-builds it (`cargo build --release --target
/// aarch64-unknown-linux-gnu -p waste-cli`) before the tests.
fn arm_waste() -> Result<std::path::PathBuf, String> {
    let bin = target_dir().join("aarch64-unknown-linux-gnu/release/waste");
    if !bin.is_file() {
        return Err(format!(
            "no ARM build at {} (cargo build --release --target aarch64-unknown-linux-gnu -p waste-cli)",
            bin.display()
        ));
    }
    match Command::new("qemu-aarch64").arg("--version").output() {
        Ok(o) if o.status.success() => Ok(bin),
        _ => Err("qemu-aarch64 is not installed (apt-get install qemu-user)".into()),
    }
}

/// Greedy decoding of bible-moe (rvq3 experts, q4 trunk) through the NEON
/// kernels under emulation gives the x86 build's tokens. The rvq3 kernels
/// are bit-identical to their scalar definition on every ISA; the trunk's
/// dot products agree to rounding (fused, reordered), which leaves the
/// greedy choice unchanged here: a change that moves a token is worth
/// seeing.
#[test]
fn arm_build_runs_the_shipped_model_as_the_x86_build_does() {
    let bin = match arm_waste() {
        Ok(b) => b,
        Err(why) => {
            report_skip(&format!("SKIP arm_build_runs_the_shipped_model_as_the_x86_build_does: {why}"));
            return;
        }
    };
    let model = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/bible-moe.waste");
    let args = ["run", model.to_str().unwrap(), "And God said", "-n", "24", "--temp", "0", "--seed", "1"];
    let x86 = waste(&args);
    assert!(x86.status.success(), "{}", stderr(&x86));
    let arm = Command::new("qemu-aarch64")
        .args(["-L", "/usr/aarch64-linux-gnu"])
        .arg(&bin)
        .args(args)
        .output()
        .expect("run the ARM build under qemu");
    assert!(arm.status.success(), "the ARM build failed: {}", stderr(&arm));
    assert_eq!(stdout(&arm), stdout(&x86), "ARM and x86 generate different text");
    assert!(stdout(&x86).split_whitespace().count() >= 10, "{}", stdout(&x86));
}

/// `.ci/run` cross-builds it (`cargo build --release --target
/// x86_64-pc-windows-gnu -p waste-cli`, MinGW-w64) and installs wine64.
fn windows_waste() -> Result<std::path::PathBuf, String> {
    let bin = target_dir().join("x86_64-pc-windows-gnu/release/waste.exe");
    if !bin.is_file() {
        return Err(format!(
            "no Windows build at {} (cargo build --release --target x86_64-pc-windows-gnu -p waste-cli)",
            bin.display()
        ));
    }
    match Command::new("wine").arg("--version").output() {
        Ok(o) if o.status.success() => Ok(bin),
        _ => Err("wine is not installed (apt-get install wine64)".into()),
    }
}

/// `wine` with this test's own prefix (made on first use, kept in the
/// target directory) and its chatter off.
fn wine(prefix: &std::path::Path) -> Command {
    let mut c = Command::new("wine");
    c.env("WINEPREFIX", prefix).env("WINEDEBUG", "-all");
    c
}

/// The prefix, able to start a Rust program: wine 8 lacks the
/// `bcryptprimitives.dll` Rust's std needs, so tests/wine/ builds a
/// stand-in into the prefix when it has none.
fn wine_prefix(bin: &std::path::Path) -> Result<std::path::PathBuf, String> {
    let prefix = target_dir().join("wine-prefix");
    if wine(&prefix).arg(bin).arg("version").output().is_ok_and(|o| o.status.success()) {
        return Ok(prefix);
    }
    let dll = prefix.join("drive_c/windows/system32/bcryptprimitives.dll");
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("wine");
    let built = Command::new("x86_64-w64-mingw32-gcc")
        .args(["-shared", "-O2", "-o"])
        .arg(&dll)
        .arg(src.join("bcryptprimitives.c"))
        .arg(src.join("bcryptprimitives.def"))
        .arg("-lbcrypt")
        .output()
        .map_err(|e| format!("x86_64-w64-mingw32-gcc: {e} (apt-get install gcc-mingw-w64-x86-64)"))?;
    if !built.status.success() {
        return Err(format!("building the bcryptprimitives stand-in: {}", stderr(&built)));
    }
    let o = wine(&prefix).arg(bin).arg("version").output().map_err(|e| format!("wine: {e}"))?;
    if !o.status.success() {
        return Err(format!("the Windows build does not start under wine: {}", stderr(&o)));
    }
    Ok(prefix)
}

/// Under wine: greedy decoding of bible-moe, with the model named by a
/// drive-letter path with backslashes, expert reads through
/// `FILE_FLAG_NO_BUFFERING` and the threads on CPU 0 by
/// `SetThreadGroupAffinity`, gives the Linux build's text; the usable RAM
/// is `GlobalMemoryStatusEx`'s (wine answers from /proc/meminfo); a CPU
/// outside processor group 0 is refused with one line.
#[test]
fn windows_build_runs_the_shipped_model_as_the_linux_build_does() {
    let name = "windows_build_runs_the_shipped_model_as_the_linux_build_does";
    let (bin, prefix) = match windows_waste().and_then(|b| wine_prefix(&b).map(|p| (b, p))) {
        Ok(found) => found,
        Err(why) => {
            report_skip(&format!("SKIP {name}: {why}"));
            return;
        }
    };
    let model =
        std::fs::canonicalize(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/bible-moe.waste"))
            .unwrap();
    let windows_path = format!("Z:{}", model.to_str().unwrap().replace('/', "\\"));
    let args = |m: &str| ["run", m, "And God said", "-n", "24", "--temp", "0", "--seed", "1"].map(str::to_string);
    let linux = waste(&args(model.to_str().unwrap()).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(linux.status.success(), "{}", stderr(&linux));
    let win = wine(&prefix).arg(&bin).args(args(&windows_path)).args(["--cpus", "0"]).output().unwrap();
    assert!(win.status.success(), "the Windows build failed: {}", stderr(&win));
    assert_eq!(stdout(&win), stdout(&linux), "Windows and Linux generate different text");
    assert!(stderr(&win).contains("direct_io on"), "{}", stderr(&win));

    let plan = wine(&prefix).arg(&bin).args(["plan", &windows_path, "--json"]).output().unwrap();
    assert!(plan.status.success(), "{}", stderr(&plan));
    let usable = serde_json::from_str::<serde_json::Value>(&stdout(&plan)).unwrap()["usable_ram"].as_u64().unwrap();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let total: u64 = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!(usable.abs_diff(total * 1024) < 1 << 20, "usable {usable} vs MemTotal {} kB", total);

    let far = wine(&prefix).arg(&bin).args(["run", &windows_path, "x", "-n", "1", "--cpus", "70"]).output().unwrap();
    assert!(!far.status.success());
    let e = stderr(&far);
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(e.contains("processor group 0"), "{e}");
}
