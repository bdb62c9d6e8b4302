//! A session file loaded into a fresh state of the tiny model.
#![no_main]
use libfuzzer_sys::fuzz_target;
use waste_engine::transformer::state_io::{load_session, SessionShape};
use waste_engine::{Model, OpenOptions};

fuzz_target!(|data: &[u8]| {
    static MODEL: std::sync::OnceLock<std::sync::Arc<Model>> = std::sync::OnceLock::new();
    let model = MODEL.get_or_init(|| {
        let o = OpenOptions { context: Some(64), budget: Some(256 << 20), readers: 0, ..OpenOptions::default() };
        Model::open(waste_fuzz::container(), &o).unwrap()
    });
    let path = waste_fuzz::file_with("state.bin", data);
    let (identity, info) = (model.identity(), model.info());
    let shape = SessionShape { model_identity: &identity, family: &info.family, vocab_size: info.vocab_size };
    let mut state = model.new_state();
    let _ = load_session(&path, &shape, &mut state);
});
