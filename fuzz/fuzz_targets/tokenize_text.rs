//! Text through the shipped model's byte-level BPE and the Kimi tiktoken
//! tokenizer: encoding any UTF-8 and decoding it gives the text back.
#![no_main]
use libfuzzer_sys::fuzz_target;
use waste_guest::tokenizer::tiktoken::TiktokenTokenizer;
use waste_guest::tokenizer::Tokenizer;

fuzz_target!(|data: &[u8]| {
    static BPE: std::sync::OnceLock<Tokenizer> = std::sync::OnceLock::new();
    static TIK: std::sync::OnceLock<TiktokenTokenizer> = std::sync::OnceLock::new();
    let bpe = BPE.get_or_init(|| {
        let json = std::fs::read_to_string(waste_fuzz::repo().join("examples/bible-moe.waste/tokenizer.json")).unwrap();
        Tokenizer::from_json(&json).unwrap()
    });
    let tik = TIK.get_or_init(|| {
        let dir = waste_fuzz::repo().join("tests/fixtures/tiktoken");
        let ranks = std::fs::read(dir.join("tiktoken.model")).unwrap();
        let cfg = std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap();
        TiktokenTokenizer::from_kimi_files(&ranks, Some(&cfg), waste_guest::tokenizer::tiktoken::KIMI_PATTERN).unwrap()
    });
    let Ok(text) = std::str::from_utf8(data) else { return };
    assert_eq!(bpe.decode(&bpe.encode(text)).unwrap(), text, "byte-level BPE round trip");
    assert_eq!(tik.decode(&tik.encode(text)).unwrap(), text, "tiktoken round trip");
});
