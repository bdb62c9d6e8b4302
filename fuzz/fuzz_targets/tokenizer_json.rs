//! tokenizer.json, then the tokenizer it describes on a fixed text.
#![no_main]
use libfuzzer_sys::fuzz_target;
use waste_guest::tokenizer::Tokenizer;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(t) = Tokenizer::from_json(text) {
        let ids = t.encode("Hello, world: 123 <|im_start|> héllo\n\n");
        let _ = t.decode(&ids);
        let _ = t.encode_markup("<|im_start|>user\nhi<|im_end|>");
    }
});
