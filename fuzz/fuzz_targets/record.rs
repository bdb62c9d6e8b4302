//! An expert record as read from a bank: header checked, payload checked,
//! then decoded by the kernels (which trust what the checks passed).
#![no_main]
use libfuzzer_sys::fuzz_target;
use waste_engine::container::Container;
use waste_engine::quant;

fuzz_target!(|data: &[u8]| {
    static BANKS: std::sync::OnceLock<waste_engine::container::ExpertBanks> = std::sync::OnceLock::new();
    let banks = BANKS.get_or_init(|| Container::open(waste_fuzz::container()).unwrap().expert_banks().unwrap());
    let layer = banks.moe_layers()[0];
    let mut buf = vec![0u8; banks.record_bytes()];
    let n = data.len().min(buf.len());
    buf[..n].copy_from_slice(&data[..n]);
    let expert = data.first().copied().unwrap_or(0) as usize % 8;
    if banks.check_record(layer, expert, &buf).is_ok() {
        let payload = &buf[banks.payload_range()];
        let cb = banks.bank(layer).and_then(|b| b.codebooks.as_ref());
        if quant::check_expert_payload(banks.format(), banks.shape(), payload, cb).is_ok() {
            let _ = quant::decode_expert(banks.format(), banks.shape(), payload, cb);
        }
    }
});
