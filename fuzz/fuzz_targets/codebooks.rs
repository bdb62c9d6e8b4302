//! A codebook range of codebooks-LLL.bin, any stage count.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&stages, bytes)) = data.split_first() else { return };
    let _ = waste_engine::quant::Codebooks::from_bytes(stages as usize % 8, bytes);
});
