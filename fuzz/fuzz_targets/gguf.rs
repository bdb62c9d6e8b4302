//! A GGUF file: header, metadata, tensor infos; then the Hugging Face view
//! (config, tensor names, tokenizer) when the header holds.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = waste_fuzz::file_with("input.gguf", data);
    if waste_engine::gguf::GgufFile::open(&path).is_ok() {
        let _ = waste_engine::checkpoint::HfCheckpoint::open_gguf(&path);
    }
});
