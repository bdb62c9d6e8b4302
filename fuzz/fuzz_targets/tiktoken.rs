//! A tiktoken rank file (base64 token, rank per line), then a tokenizer
//! over it encoding and decoding a fixed text.
#![no_main]
use libfuzzer_sys::fuzz_target;
use waste_guest::tokenizer::tiktoken::{parse_ranks, TiktokenTokenizer};

fuzz_target!(|data: &[u8]| {
    if parse_ranks(data, "tiktoken.model").is_ok() {
        if let Ok(t) = TiktokenTokenizer::from_kimi_files(data, None, r"\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+") {
            let ids = t.encode("Hello, world: 123 héllo");
            let _ = t.decode(&ids);
        }
    }
});
