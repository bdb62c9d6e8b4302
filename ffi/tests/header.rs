//! CI's check that the committed include/waste.h is what cbindgen generates
//! from the current source.

use std::path::Path;

#[test]
fn committed_header_matches_cbindgen() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("read cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates waste.h");
    let mut fresh = Vec::new();
    bindings.write(&mut fresh);
    let committed_path = crate_dir.join("include/waste.h");
    if std::env::var_os("WASTE_UPDATE_HEADER").is_some() {
        std::fs::write(&committed_path, &fresh).expect("write include/waste.h");
        return;
    }
    let tmp = std::env::temp_dir().join(format!("waste-h-{}.h", std::process::id()));
    std::fs::write(&tmp, &fresh).expect("write the fresh header");
    let committed = std::fs::read(&committed_path).unwrap_or_default();
    assert!(
        committed == fresh,
        "ffi/include/waste.h differs from what cbindgen generates now (fresh copy: {}); update it with \
         `WASTE_UPDATE_HEADER=1 cargo test --release -p waste-ffi --test header` and commit it",
        tmp.display()
    );
    let _ = std::fs::remove_file(&tmp);
}
