//! manifest.json: parsed, validated against the files beside it, planned.
#![no_main]
use libfuzzer_sys::fuzz_target;
use waste_engine::container::Container;

fuzz_target!(|data: &[u8]| {
    let src = waste_fuzz::container();
    // A copy of the container whose manifest is the input; the other files
    // are hard links, so the trunk and banks stay the real ones.
    let dir = waste_fuzz::scratch().join("manifest.waste");
    if !dir.exists() {
        std::fs::create_dir_all(&dir).unwrap();
        for e in std::fs::read_dir(src).unwrap() {
            let p = e.unwrap().path();
            std::fs::hard_link(&p, dir.join(p.file_name().unwrap())).unwrap();
        }
    }
    let _ = std::fs::remove_file(dir.join("manifest.json"));
    std::fs::write(dir.join("manifest.json"), data).unwrap();
    if let Ok(mut c) = Container::open(&dir) {
        let _ = c.expert_banks();
        let _ = waste_engine::plan::plan(&c, &Default::default());
        let _ = c.require_checksums();
    }
});
