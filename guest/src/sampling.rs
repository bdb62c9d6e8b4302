//! Token sampling with a seeded PRNG whose stream is the same on every
//! platform (integer arithmetic only; the uniform draw is an exact f64 from
//! 53 random bits; every sum is f64 in a fixed order).
//!
//! One step, in this order (the order of llama.cpp's default sampler chain,
//! `common/sampling.cpp`, with HF's warper order for the truncations):
//! 1. logit bias (OpenAI `logit_bias`: added to the raw logit),
//! 2. penalties over the last `penalty_last_n` tokens of the sequence,
//!    prompt included, exactly as llama.cpp's `llama_sampler_penalties_apply`
//!    (src/llama-sampling.cpp): for a token seen `c > 0` times,
//!    `l = l <= 0 ? l * repeat : l / repeat` (HF's
//!    `RepetitionPenaltyLogitsProcessor`, which uses the whole sequence), then
//!    `l -= c * frequency + presence` (OpenAI's presence/frequency penalties),
//! 3. greedy when temperature is 0, otherwise top-k, temperature, top-p,
//!    min-p (HF `TopK`, `Temperature`, `TopP`, `MinP` warpers; top-k and the
//!    temperature commute), then one draw.
//!
//! Log-probabilities reported to the caller are those of the model's raw
//! distribution (before bias, penalties, temperature and truncation), as
//! OpenAI-style `logprobs` are.

use std::borrow::Cow;
use std::collections::HashMap;

/// Most alternatives a token may report (OpenAI's `top_logprobs` limit).
pub const MAX_TOP_LOGPROBS: u32 = 20;
/// The accepted range of presence and frequency penalties (OpenAI's).
pub const PENALTY_RANGE: f32 = 2.0;
/// The accepted range of a logit bias (OpenAI's).
pub const BIAS_RANGE: f32 = 100.0;

/// Sampling parameters; `validate` before use.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 disables top-k.
    pub top_k: u32,
    /// 1.0 disables top-p.
    pub top_p: f32,
    /// 0 disables min-p.
    pub min_p: f32,
    /// 1.0 disables the repetition penalty.
    pub repetition_penalty: f32,
    /// 0 disables.
    pub presence_penalty: f32,
    /// 0 disables.
    pub frequency_penalty: f32,
    /// How many of the most recent tokens (prompt included) the penalties
    /// look at; 0 disables all three penalties.
    pub penalty_last_n: u32,
    /// Added to the logit of the token, before anything else.
    pub logit_bias: Vec<(u32, f32)>,
    /// Alternatives reported per generated token (0..=20).
    pub top_logprobs: u32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            logit_bias: Vec::new(),
            top_logprobs: 0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Rejects values that have no meaning instead of producing odd output.
    /// `vocab_size` bounds the token ids of the logit bias.
    pub fn validate(&self, vocab_size: u32) -> Result<(), String> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(format!(
                "temperature must be a finite number >= 0, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top-p must be in (0, 1], got {}", self.top_p));
        }
        if !(self.min_p >= 0.0 && self.min_p <= 1.0) {
            return Err(format!("min-p must be in [0, 1], got {}", self.min_p));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(format!(
                "repetition penalty must be a finite number > 0, got {}",
                self.repetition_penalty
            ));
        }
        for (name, v) in [
            ("presence", self.presence_penalty),
            ("frequency", self.frequency_penalty),
        ] {
            if !(v >= -PENALTY_RANGE && v <= PENALTY_RANGE) {
                return Err(format!(
                    "{name} penalty must be in [-{PENALTY_RANGE}, {PENALTY_RANGE}], got {v}"
                ));
            }
        }
        for &(token, bias) in &self.logit_bias {
            if token >= vocab_size {
                return Err(format!(
                    "logit bias: token {token} is outside the vocabulary of {vocab_size}"
                ));
            }
            if !(bias >= -BIAS_RANGE && bias <= BIAS_RANGE) {
                return Err(format!("logit bias of token {token} must be in [-{BIAS_RANGE}, {BIAS_RANGE}], got {bias}"));
            }
        }
        if self.top_logprobs > MAX_TOP_LOGPROBS {
            return Err(format!(
                "top-logprobs must be at most {MAX_TOP_LOGPROBS}, got {}",
                self.top_logprobs
            ));
        }
        Ok(())
    }

    fn penalties_active(&self) -> bool {
        self.penalty_last_n > 0
            && (self.repetition_penalty != 1.0
                || self.presence_penalty != 0.0
                || self.frequency_penalty != 0.0)
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

/// `ln(sum(exp(logits)))`, in f64, summed in id order.
pub fn log_sum_exp(logits: &[f32]) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| ((l as f64) - max).exp()).sum();
    max + sum.ln()
}

/// Natural log-probability of `token` under softmax(logits), computed in f64.
pub fn logprob(logits: &[f32], token: usize) -> f32 {
    (logits[token] as f64 - log_sum_exp(logits)) as f32
}

/// The `n` most likely tokens under softmax(logits) with their
/// log-probabilities, most likely first, ties by lower id. `lse` is
/// `log_sum_exp(logits)`.
pub fn top_logprobs(logits: &[f32], lse: f64, n: usize) -> Vec<(u32, f32)> {
    let ids = top_ids(logits, n);
    ids.into_iter()
        .map(|i| (i, (logits[i as usize] as f64 - lse) as f32))
        .collect()
}

/// Descending logit, then ascending id: a total order, so the result never
/// depends on the sort algorithm.
fn by_logit_desc(logits: &[f32]) -> impl Fn(&u32, &u32) -> std::cmp::Ordering + '_ {
    move |&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    }
}

/// Ids of the `n` largest non-NaN logits, in `by_logit_desc` order.
fn top_ids(logits: &[f32], n: usize) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..logits.len() as u32)
        .filter(|&i| !logits[i as usize].is_nan())
        .collect();
    let cmp = by_logit_desc(logits);
    if n < ids.len() {
        if n == 0 {
            return Vec::new();
        }
        ids.select_nth_unstable_by(n - 1, &cmp);
        ids.truncate(n);
    }
    ids.sort_unstable_by(&cmp);
    ids
}

/// The logits after logit bias and penalties; borrowed when neither applies.
/// `recent` is the sequence so far, oldest first (the caller may pass more
/// than the window; only the last `penalty_last_n` count).
pub fn adjust<'a>(logits: &'a [f32], params: &SamplingParams, recent: &[u32]) -> Cow<'a, [f32]> {
    let penalise = params.penalties_active() && !recent.is_empty();
    if params.logit_bias.is_empty() && !penalise {
        return Cow::Borrowed(logits);
    }
    let mut out = logits.to_vec();
    for &(token, bias) in &params.logit_bias {
        if let Some(l) = out.get_mut(token as usize) {
            *l += bias;
        }
    }
    if penalise {
        let window = &recent[recent.len().saturating_sub(params.penalty_last_n as usize)..];
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &t in window {
            *counts.entry(t).or_insert(0) += 1;
        }
        // Each token is changed independently of the others, so the map's
        // iteration order cannot change the result.
        for (&token, &count) in &counts {
            let Some(l) = out.get_mut(token as usize) else {
                continue;
            };
            if *l <= 0.0 {
                *l *= params.repetition_penalty;
            } else {
                *l /= params.repetition_penalty;
            }
            *l -= count as f32 * params.frequency_penalty + params.presence_penalty;
        }
    }
    Cow::Owned(out)
}

/// Draws one token from logits already passed through `adjust`. `params`
/// must have been validated.
pub fn sample(logits: &[f32], params: &SamplingParams, rng: &mut Rng) -> usize {
    if params.temperature == 0.0 || logits.len() <= 1 {
        return argmax(logits);
    }
    let inv_t = 1.0 / params.temperature as f64;
    let cmp = by_logit_desc(logits);
    // Candidates in `by_logit_desc` order with their unnormalised
    // probabilities exp((l - max) / T), and the total mass of the candidate
    // set (after top-k), summed in a fixed order.
    let (order, probs, total) = if params.top_k > 0 && (params.top_k as usize) < logits.len() {
        let order = top_ids(logits, params.top_k as usize);
        if order.is_empty() {
            return 0;
        }
        let max = logits[order[0] as usize] as f64;
        let probs: Vec<f64> = order
            .iter()
            .map(|&i| ((logits[i as usize] as f64 - max) * inv_t).exp())
            .collect();
        let total = probs.iter().sum();
        (order, probs, total)
    } else {
        let max_id = argmax(logits);
        let max = logits[max_id] as f64;
        if max == f64::NEG_INFINITY || logits[max_id].is_nan() {
            return max_id;
        }
        let rel = |l: f32| ((l as f64 - max) * inv_t).exp();
        // Mass of every candidate, in id order.
        let total: f64 = logits.iter().filter(|l| !l.is_nan()).map(|&l| rel(l)).sum();
        // Sorting the whole vocabulary every step costs milliseconds at 160k
        // entries, so only the tokens that can survive top-p and min-p are
        // sorted: those with a relative probability of at least `floor`. A
        // floor whose set already holds `top_p` of the mass contains the
        // nucleus (that set is itself a prefix of the sorted order).
        let mut floor = if params.min_p > 0.0 {
            params.min_p as f64
        } else {
            0.0
        };
        if params.top_p >= 1.0 {
            if params.min_p == 0.0 {
                floor = 0.0;
            }
        } else {
            let target = params.top_p as f64 * total;
            let mut try_floor = 1.0f64 / 16.0;
            loop {
                if try_floor <= floor || try_floor < 1e-300 {
                    break;
                }
                let mass: f64 = logits
                    .iter()
                    .map(|&l| rel(l))
                    .filter(|&p| p >= try_floor)
                    .sum();
                if mass >= target {
                    floor = floor.max(try_floor);
                    break;
                }
                try_floor /= 16.0;
            }
        }
        let mut order: Vec<u32> = (0..logits.len() as u32)
            .filter(|&i| {
                let l = logits[i as usize];
                !l.is_nan() && (floor == 0.0 || rel(l) >= floor)
            })
            .collect();
        order.sort_unstable_by(&cmp);
        let probs: Vec<f64> = order.iter().map(|&i| rel(logits[i as usize])).collect();
        (order, probs, total)
    };
    let mut keep = probs.len();
    if params.top_p < 1.0 {
        // Smallest prefix whose probability mass reaches top_p.
        let target = params.top_p as f64 * total;
        let mut cumulative = 0.0;
        for (n, p) in probs.iter().enumerate() {
            cumulative += p;
            if cumulative >= target {
                keep = n + 1;
                break;
            }
        }
    }
    if params.min_p > 0.0 {
        // HF MinPLogitsWarper: drop p < min_p * p_max; probs[0] is p_max
        // (relative 1 after the top-k path's own max).
        let threshold = params.min_p as f64 * probs[0];
        let above = probs[..keep]
            .iter()
            .take_while(|&&p| p >= threshold)
            .count();
        keep = above.max(1);
    }
    let kept = &probs[..keep];
    let kept_total: f64 = kept.iter().sum();
    let mut draw = rng.next_f64() * kept_total;
    for (n, p) in kept.iter().enumerate() {
        if draw < *p {
            return order[n] as usize;
        }
        draw -= p;
    }
    // Rounding can leave a sliver past the last candidate.
    order[keep - 1] as usize
}

#[cfg(test)]
#[path = "sampling_tests.rs"]
mod tests;
