//! What Kimi K3's image preprocessing costs on this machine, random pixels
//! at the release's settings: RGB 4000x3000 (within the 65,536-patch
//! budget: kept, 15,444 tokens) and 6000x4500 (scaled down to it), RGBA
//! 1920x1080 (kept) and 2400x1800 (kept: under the budget too); the
//! resize alone and the whole pipeline.
//!
//! `cargo bench -p waste-engine --bench vision` (medians of 5).

mod common;
use common::*;
use waste_engine::vision::preprocess::{plan, preprocess, resize_bicubic, Pixels, PreprocessConfig};

const RUNS: usize = 5;

fn main() {
    let cfg = PreprocessConfig::default();
    println!("| image | planned | tokens | resize ms | whole preprocessing ms |");
    println!("|---|---|---|---|---|");
    for (w, h, c) in [(4000usize, 3000usize, 3usize), (6000, 4500, 3), (1920, 1080, 4), (2400, 1800, 4)] {
        let mut s = 0x9E37_79B9u32;
        let data: Vec<u8> = (0..w * h * c)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s >> 24) as u8
            })
            .collect();
        let px = Pixels::new(w, h, c, data).expect("pixels");
        let p = plan(w, h, &cfg);
        let resize = median_ms(RUNS, || {
            std::hint::black_box(resize_bicubic(&px, p.width, p.height));
        });
        let whole = median_ms(RUNS, || {
            std::hint::black_box(preprocess(&px, &cfg));
        });
        println!(
            "| {w}x{h} {} | {}x{} | {} | {resize:.0} | {whole:.0} |",
            if c == 4 { "RGBA" } else { "RGB" },
            p.width,
            p.height,
            p.tokens(&cfg)
        );
    }
}
