//! What the engine's benches share.

use std::time::Instant;

use waste_engine::config::ModelConfig;
use waste_engine::quant::{quantize_trunk, QMatrix, TrunkFormat};
use waste_engine::source::TensorSource;

/// Deterministic values in [-scale, scale) (xorshift).
#[allow(dead_code)] // not every bench draws floats
pub fn random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// The median of `runs` timings of `f` in ms, after one untimed call.
pub fn median_ms(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[runs / 2]
}

/// Every trunk tensor of the config, random, in the format a q8 trunk
/// stores it (`TensorRole::trunk_format`): q8 matrices, f32 routers, the
/// indexers' head weights and V4's mixes; norms near 1.
#[allow(dead_code)] // the vision bench has no trunk
pub struct RandomTrunk<'a>(pub &'a ModelConfig);

impl TensorSource for RandomTrunk<'_> {
    fn matrix(&self, name: &str) -> waste_engine::Result<QMatrix> {
        let shape = self.0.trunk_tensor_shape(name).expect("a trunk tensor of the config");
        let (rows, cols) = (shape[0], shape[1]);
        let w = random(rows * cols, name.len() as u64 * 7919 + rows as u64, 0.02);
        let fmt = self.0.tensor_role(name).trunk_format(TrunkFormat::Q8);
        if fmt == TrunkFormat::F32 {
            return Ok(QMatrix::from_f32(w, rows, cols));
        }
        Ok(QMatrix::from_byte_vec(fmt, rows, cols, quantize_trunk(fmt, &w, rows, cols)).expect("q8 bytes of the shape"))
    }
    fn vector(&self, name: &str) -> waste_engine::Result<Vec<f32>> {
        let n = self.0.trunk_tensor_shape(name).expect("a trunk tensor")[0];
        Ok(random(n, 3, 0.1).iter().map(|v| 1.0 + v).collect())
    }
    fn has(&self, _: &str) -> bool {
        true
    }
}
