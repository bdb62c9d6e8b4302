//! Token sampling: greedy, temperature, top-k, top-p, with a seeded PRNG
//! whose stream is the same on every platform (integer arithmetic only; the
//! uniform draw is an exact f64 from 53 random bits).

/// Sampling parameters after validation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 disables top-k.
    pub top_k: u32,
    /// 1.0 disables top-p.
    pub top_p: f32,
    pub seed: u64,
}

impl SamplingParams {
    /// Rejects values that have no meaning instead of producing odd output.
    pub fn validate(&self) -> Result<(), String> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(format!("temperature must be a finite number >= 0, got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top-p must be in (0, 1], got {}", self.top_p));
        }
        Ok(())
    }
}

/// SplitMix64: tiny, well-mixed, and trivially reproducible everywhere.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Index of the largest logit; the lowest index wins ties, NaN never wins.
pub fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    let mut best_value = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_value {
            best = i;
            best_value = v;
        }
    }
    best
}

/// Natural log-probability of `token` under softmax(logits), computed in f64.
pub fn logprob(logits: &[f32], token: usize) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| ((l as f64) - max).exp()).sum();
    ((logits[token] as f64 - max) - sum.ln()) as f32
}

/// Draws one token. `params` must have been validated.
pub fn sample(logits: &[f32], params: &SamplingParams, rng: &mut Rng) -> usize {
    if params.temperature == 0.0 || logits.len() <= 1 {
        return argmax(logits);
    }
    // Candidates sorted by logit, highest first; equal logits keep id order
    // so the result does not depend on the sort implementation.
    let mut order: Vec<u32> = (0..logits.len() as u32).filter(|&i| !logits[i as usize].is_nan()).collect();
    if order.is_empty() {
        return 0;
    }
    order.sort_unstable_by(|&a, &b| {
        logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b))
    });
    if params.top_k > 0 && (params.top_k as usize) < order.len() {
        order.truncate(params.top_k as usize);
    }
    let inv_t = 1.0 / params.temperature as f64;
    let max = logits[order[0] as usize] as f64;
    let mut probs: Vec<f64> = order.iter().map(|&i| ((logits[i as usize] as f64 - max) * inv_t).exp()).collect();
    let total: f64 = probs.iter().sum();
    if params.top_p < 1.0 {
        // Smallest prefix whose probability mass reaches top_p.
        let target = params.top_p as f64 * total;
        let mut cumulative = 0.0;
        let mut keep = probs.len();
        for (n, p) in probs.iter().enumerate() {
            cumulative += p;
            if cumulative >= target {
                keep = n + 1;
                break;
            }
        }
        probs.truncate(keep);
        order.truncate(keep);
    }
    let total: f64 = probs.iter().sum();
    let mut draw = rng.next_f64() * total;
    for (n, p) in probs.iter().enumerate() {
        if draw < *p {
            return order[n] as usize;
        }
        draw -= p;
    }
    // Rounding can leave a sliver past the last candidate.
    order[order.len() - 1] as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: u32, top_p: f32) -> SamplingParams {
        SamplingParams { temperature, top_k, top_p, seed: 7 }
    }

    #[test]
    fn greedy_picks_lowest_index_on_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
        assert_eq!(sample(&[0.0, 2.0, 1.0], &params(0.0, 0, 1.0), &mut Rng::new(1)), 1);
    }

    #[test]
    fn top_k_one_is_greedy() {
        let logits = [0.3, 0.1, 2.0, 1.9];
        let mut rng = Rng::new(3);
        for _ in 0..100 {
            assert_eq!(sample(&logits, &params(1.5, 1, 1.0), &mut rng), 2);
        }
    }

    #[test]
    fn tiny_top_p_is_greedy() {
        let logits = [0.3, 0.1, 2.0, 1.9];
        let mut rng = Rng::new(3);
        for _ in 0..100 {
            assert_eq!(sample(&logits, &params(1.0, 0, 1e-6), &mut rng), 2);
        }
    }

    #[test]
    fn top_k_never_leaves_the_k_best() {
        let logits = [5.0, 4.0, 3.0, 2.0, 1.0, 0.0];
        let mut rng = Rng::new(11);
        for _ in 0..1000 {
            assert!(sample(&logits, &params(5.0, 3, 1.0), &mut rng) < 3);
        }
    }

    #[test]
    fn frequencies_follow_the_distribution() {
        // softmax([ln 1, ln 3]) = [0.25, 0.75]
        let logits = [0.0f32, 3.0f32.ln()];
        let mut rng = Rng::new(5);
        let n = 20_000;
        let ones = (0..n).filter(|_| sample(&logits, &params(1.0, 0, 1.0), &mut rng) == 1).count();
        let freq = ones as f64 / n as f64;
        assert!((freq - 0.75).abs() < 0.015, "frequency {freq}");
    }

    #[test]
    fn same_seed_same_stream() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let draw = |seed| {
            let mut rng = Rng::new(seed);
            (0..40).map(|_| sample(&logits, &params(0.9, 20, 0.95), &mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(draw(42), draw(42));
        assert_ne!(draw(42), draw(43));
        // Pinned: the generator is part of the reproducibility contract.
        assert_eq!(Rng::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn nonsense_parameters_are_errors() {
        assert!(params(-0.1, 0, 1.0).validate().is_err());
        assert!(params(f32::NAN, 0, 1.0).validate().is_err());
        assert!(params(1.0, 0, 0.0).validate().is_err());
        assert!(params(1.0, 0, 1.5).validate().is_err());
        assert!(params(0.7, 40, 0.9).validate().is_ok());
    }

    #[test]
    fn logprob_is_normalised() {
        let logits = [1.0f32, 2.0, 3.0];
        let total: f64 = (0..3).map(|i| (logprob(&logits, i) as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
    }
}
