//! The Python clients the server tests drive (openai, anthropic, ollama,
//! jsonschema), provisioned by the tests themselves: a virtual environment
//! under the target directory with tests/server/requirements.txt's pinned
//! versions, made on first use and kept while that file is unchanged. A
//! fresh machine needs only python3 with its `venv` module and access to
//! PyPI; nothing is installed outside the target directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

static PROVISIONED: OnceLock<Result<PathBuf, String>> = OnceLock::new();

/// The provisioned interpreter, made on the first call; why not, if it
/// cannot be made (no python3, no venv module, no access to PyPI).
pub(crate) fn python() -> Result<&'static Path, String> {
    PROVISIONED.get_or_init(provision).as_deref().map_err(Clone::clone)
}

fn provision() -> Result<PathBuf, String> {
    let requirements_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("server/requirements.txt");
    let requirements = std::fs::read_to_string(&requirements_path)
        .map_err(|e| format!("reading {}: {e}", requirements_path.display()))?;
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("python-clients");
    let python = dir.join(if cfg!(windows) { "Scripts/python.exe" } else { "bin/python" });
    // Written last: its content says the environment is complete and for
    // which requirements.
    let stamp = dir.join("requirements.installed");
    if python.exists() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == requirements) {
        return Ok(python);
    }
    let run = |what: &str, cmd: &mut Command| -> Result<(), String> {
        let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
        if out.status.success() {
            return Ok(());
        }
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(3).collect();
        Err(format!("{what} failed: {}", tail.into_iter().rev().collect::<Vec<_>>().join(" / ")))
    };
    run("python3 -m venv", Command::new("python3").args(["-m", "venv", "--clear"]).arg(&dir))?;
    run(
        "pip install -r tests/server/requirements.txt",
        Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input", "-r"])
            .arg(&requirements_path),
    )?;
    std::fs::write(&stamp, &requirements).map_err(|e| format!("writing {}: {e}", stamp.display()))?;
    Ok(python)
}
