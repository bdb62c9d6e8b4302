//! A sampler plugin for the engine's tests: it misbehaves on purpose so the
//! tests can check that the host contains it. Option `mode`: 0 greedy (well
//! behaved), 1 trap, 2 loop forever, 3 allocate without bound, 4 choose a
//! token past the vocabulary.

/// Index of the largest logit (mode 0).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(target_arch = "wasm32")]
mod component {
    use std::cell::Cell;

    wit_bindgen::generate!({ world: "sampler-plugin", path: "../../wit" });

    use exports::waste::engine::sampler::{Guest, SamplerParams};

    thread_local! {
        static MODE: Cell<u32> = const { Cell::new(0) };
    }

    struct Plugin;

    impl Guest for Plugin {
        fn begin(params: SamplerParams) -> Result<(), String> {
            let mode = params.options.iter().find(|o| o.0 == "mode").map_or(0, |o| o.1 as u32);
            MODE.with(|m| m.set(mode));
            Ok(())
        }

        fn sample(logits: Vec<f32>, _recent: Vec<u32>) -> Result<u32, String> {
            match MODE.with(|m| m.get()) {
                1 => panic!("misbehave: deliberate trap"),
                2 => {
                    let mut x = 1u64;
                    loop {
                        x = std::hint::black_box(x.wrapping_mul(3).wrapping_add(1));
                    }
                }
                3 => {
                    let mut hoard: Vec<Vec<u8>> = Vec::new();
                    loop {
                        hoard.push(vec![1u8; 1 << 20]);
                        std::hint::black_box(&hoard);
                    }
                }
                4 => Ok(logits.len() as u32 + 7),
                _ => Ok(super::argmax(&logits)),
            }
        }
    }

    export!(Plugin);
}
