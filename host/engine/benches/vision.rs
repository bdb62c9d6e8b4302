//! What Kimi K3's image preprocessing costs on this machine, random pixels
//! at the release's settings: RGB 4000x3000 (within the 65,536-patch
//! budget: kept, 15,444 tokens) and 6000x4500 (scaled down to it), RGBA
//! 1920x1080 (kept) and 2400x1800 (kept: under the budget too); the
//! resize alone and the whole pipeline.
//!
//! Then the tower and projector at the release's shape (random q8 weights,
//! as a container stores them): one 448x448 image (1024 patches, 256
//! tokens) on 1 and 2 threads, timed once each (about half a minute).
//!
//! `cargo bench -p waste-engine --bench vision` (preprocessing: medians of
//! 5); `-- tower` runs the tower alone.

mod common;
use common::*;
use waste_engine::config::{GridResize, VisionConfig, TORCH_F32_EPS};
use waste_engine::quant::{quantize_trunk, QMatrix, TrunkFormat};
use waste_engine::source::TensorSource;
use waste_engine::vision::preprocess::{plan, preprocess, resize_bicubic, Pixels, PreprocessConfig};
use waste_engine::vision::tower::VisionTower;

const RUNS: usize = 5;

/// K3's `vision_config` (K3-VISION.md §1).
const RELEASE: VisionConfig = VisionConfig {
    patch_size: 14,
    pos_grid: (64, 64),
    grid_resize: GridResize::Bilinear,
    hidden: 1024,
    heads: 12,
    qkv_hidden: 1536,
    intermediate: 4096,
    layers: 27,
    rms_eps: TORCH_F32_EPS,
    merge: (2, 2),
    text_hidden: 7168,
    projector_eps: 1e-5,
    placeholder: 163_605,
};

/// The tower's tensors, random: matrices q8, vectors near 1.
struct RandomTower(Vec<(String, Vec<usize>)>);

impl TensorSource for RandomTower {
    fn matrix(&self, name: &str) -> waste_engine::Result<QMatrix> {
        let s = &self.0.iter().find(|(n, _)| n == name).expect("a tower tensor").1;
        let (rows, cols) = (s[0], s[1]);
        let w = random(rows * cols, rows as u64 * 31 + cols as u64, 0.03);
        Ok(QMatrix::from_byte_vec(TrunkFormat::Q8, rows, cols, quantize_trunk(TrunkFormat::Q8, &w, rows, cols))
            .expect("q8 bytes"))
    }
    fn vector(&self, name: &str) -> waste_engine::Result<Vec<f32>> {
        let n = self.0.iter().find(|(n, _)| n == name).expect("a tower tensor").1[0];
        Ok(random(n, 5, 0.1).iter().map(|v| 1.0 + v).collect())
    }
    fn has(&self, name: &str) -> bool {
        self.0.iter().any(|(n, _)| n == name)
    }
}

fn tower() {
    let tower = VisionTower::load(&RELEASE, &RandomTower(RELEASE.tensor_shapes())).expect("tower");
    let cfg = PreprocessConfig::default();
    let data: Vec<u8> = random(448 * 448 * 3, 11, 1.0).iter().map(|v| (v.abs() * 255.0) as u8).collect();
    let image = preprocess(&Pixels::new(448, 448, 3, data).expect("pixels"), &cfg);
    let patches = image.plan.grid.0 * image.plan.grid.1;
    println!("| threads | patches | tokens | tower + projector s | s per 1024 patches | ms per image token |");
    println!("|---|---|---|---|---|---|");
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool");
        let t = std::time::Instant::now();
        let rows = pool.install(|| tower.forward(&image)).expect("forward");
        let s = t.elapsed().as_secs_f64();
        let tokens = rows.len() / RELEASE.text_hidden;
        println!(
            "| {threads} | {patches} | {tokens} | {s:.1} | {:.1} | {:.0} |",
            s * 1024.0 / patches as f64,
            s * 1e3 / tokens as f64
        );
    }
}

fn main() {
    if std::env::args().any(|a| a == "tower") {
        return tower();
    }
    preprocessing();
    tower();
}

fn preprocessing() {
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
