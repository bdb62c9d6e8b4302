//! What the fuzz targets share: a tiny converted container (made once per
//! process from the committed fixture), scratch files, the fixtures' paths.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use waste_engine::quant::ExpertFormat;

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A scratch directory of this process.
pub fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("waste-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("scratch dir");
        d
    })
}

/// `tiny-qwen3_moe` converted with rvq3 experts (codebooks included).
pub fn container() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = scratch().join("tiny.waste");
        let opts = waste_engine::ConvertOptions {
            experts: waste_engine::ExpertsAs::Encoded(ExpertFormat::Rvq3),
            ..Default::default()
        };
        waste_engine::convert(&repo().join("tests/fixtures/tiny-qwen3_moe"), &out, &opts, &mut |_| {})
            .expect("convert the fixture");
        out
    })
}

/// Writes `bytes` to a scratch file named `name` and returns its path.
pub fn file_with(name: &str, bytes: &[u8]) -> PathBuf {
    let p = scratch().join(name);
    std::fs::write(&p, bytes).expect("write scratch file");
    p
}
