//! A learned-hotlist usage file.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = waste_fuzz::file_with("usage.json", data);
    let _ = waste_engine::store::usage::load(&path, 3, 8);
});
