//! Mirostat v2 (Basu et al., "Mirostat: a neural text decoding algorithm
//! that directly controls perplexity", ICLR 2021, algorithm 2), as a WASTE
//! sampler plugin. The update follows llama.cpp's
//! `llama_sampler_mirostat_v2_apply` (src/llama-sampling.cpp): softmax at the
//! temperature, drop tokens whose surprise `-log2 p` exceeds `mu` (keeping at
//! least one), renormalise, draw, then `mu -= eta * (surprise - tau)`; `mu`
//! starts at `2 * tau`.
//!
//! Built for wasm32-wasip2 by the integration tests; the logic below also
//! compiles natively for its own unit tests.

/// SplitMix64, as the engine's own sampler uses: reproducible everywhere.
pub struct Rng(u64);

impl Rng {
    pub fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

pub struct Mirostat {
    pub tau: f64,
    pub eta: f64,
    pub mu: f64,
    pub temperature: f64,
    /// Surprise (bits) of the last draw, under the truncated distribution.
    pub last_surprise: f64,
    rng: Rng,
}

impl Mirostat {
    pub fn new(tau: f64, eta: f64, temperature: f64, seed: u64) -> Result<Mirostat, String> {
        if !(tau.is_finite() && tau > 0.0) {
            return Err(format!("mirostat: tau must be > 0, got {tau}"));
        }
        if !(eta.is_finite() && eta > 0.0 && eta <= 1.0) {
            return Err(format!("mirostat: eta must be in (0, 1], got {eta}"));
        }
        if !(temperature.is_finite() && temperature > 0.0) {
            return Err(format!("mirostat: temperature must be > 0, got {temperature}"));
        }
        Ok(Mirostat { tau, eta, mu: 2.0 * tau, temperature, last_surprise: 0.0, rng: Rng(seed) })
    }

    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, String> {
        let mut order: Vec<u32> = (0..logits.len() as u32).filter(|&i| !logits[i as usize].is_nan()).collect();
        if order.is_empty() {
            return Err("mirostat: no finite logits".into());
        }
        order.sort_unstable_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
        let max = logits[order[0] as usize] as f64;
        let probs: Vec<f64> =
            order.iter().map(|&i| ((logits[i as usize] as f64 - max) / self.temperature).exp()).collect();
        let total: f64 = probs.iter().sum();
        let keep = probs.iter().take_while(|&&p| -(p / total).log2() <= self.mu).count().max(1);
        let kept_total: f64 = probs[..keep].iter().sum();
        let mut draw = self.rng.next_f64() * kept_total;
        let mut pick = keep - 1;
        for (n, p) in probs[..keep].iter().enumerate() {
            if draw < *p {
                pick = n;
                break;
            }
            draw -= p;
        }
        let surprise = -(probs[pick] / kept_total).log2();
        self.last_surprise = surprise;
        self.mu -= self.eta * (surprise - self.tau);
        Ok(order[pick])
    }
}

#[cfg(target_arch = "wasm32")]
mod component {
    use std::cell::RefCell;

    wit_bindgen::generate!({ world: "sampler-plugin", path: "../../wit" });

    use exports::waste::engine::sampler::{Guest, SamplerParams};

    thread_local! {
        static STATE: RefCell<Option<super::Mirostat>> = const { RefCell::new(None) };
    }

    struct Plugin;

    impl Guest for Plugin {
        fn begin(params: SamplerParams) -> Result<(), String> {
            let opt =
                |name: &str, default: f64| params.options.iter().find(|o| o.0 == name).map_or(default, |o| o.1 as f64);
            let t = if params.temperature > 0.0 { params.temperature as f64 } else { 1.0 };
            let m = super::Mirostat::new(opt("tau", 5.0), opt("eta", 0.1), t, params.seed)?;
            STATE.with(|s| *s.borrow_mut() = Some(m));
            Ok(())
        }

        fn sample(logits: Vec<f32>, _recent: Vec<u32>) -> Result<u32, String> {
            STATE.with(|s| match s.borrow_mut().as_mut() {
                Some(m) => m.sample(&logits),
                None => Err("mirostat: sample before begin".into()),
            })
        }
    }

    export!(Plugin);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mu_tracks_the_target_surprise() {
        // Over a flat distribution of 1024 tokens a draw costs 10 bits when
        // everything is kept and 0 when one token is: the feedback on mu
        // mixes the two so that the average surprise is tau.
        let logits = vec![0.0f32; 1024];
        let mut m = Mirostat::new(6.0, 0.1, 1.0, 1).unwrap();
        let mut sum = 0.0;
        for _ in 0..4000 {
            m.sample(&logits).unwrap();
            sum += m.last_surprise;
        }
        let mean = sum / 4000.0;
        assert!((mean - 6.0).abs() < 0.2, "mean surprise {mean}");
    }

    #[test]
    fn a_peaked_distribution_is_greedy_at_low_tau() {
        let mut logits = vec![0.0f32; 100];
        logits[7] = 12.0;
        let mut m = Mirostat::new(0.01, 0.1, 1.0, 3).unwrap();
        assert!((0..50).all(|_| m.sample(&logits) == Ok(7)));
    }

    #[test]
    fn bad_options_are_errors() {
        assert!(Mirostat::new(0.0, 0.1, 1.0, 0).is_err());
        assert!(Mirostat::new(5.0, 2.0, 1.0, 0).is_err());
        assert!(Mirostat::new(5.0, 0.1, 0.0, 0).is_err());
    }
}
