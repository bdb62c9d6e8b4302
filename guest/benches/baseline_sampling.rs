// The previous guest/src/sampling.rs (git 7f02c8c), verbatim but for its
// test module: the baseline `benches/sampling.rs` measures beside the
// current one. Not used by anything else.

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
    if params.top_k == 0 || params.top_k as usize >= logits.len() {
        return sample_without_top_k(logits, params, inv_t, rng);
    }
    // The top-k candidates in `by_logit_desc` order with their unnormalised
    // probabilities exp((l - max) / T) and their total mass, summed in that
    // fixed order.
    let order = top_ids(logits, params.top_k as usize);
    if order.is_empty() {
        return 0;
    }
    let max = logits[order[0] as usize] as f64;
    let probs: Vec<f64> = order
        .iter()
        .map(|&i| ((logits[i as usize] as f64 - max) * inv_t).exp())
        .collect();
    let total: f64 = probs.iter().sum();
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

/// Sampling with no top-k: top-p and min-p over the whole vocabulary.
///
/// Sorting 160k candidates per token costs tens of milliseconds inside the
/// component, so nothing is sorted: the min-p set is a threshold test, the
/// top-p nucleus is found by a mass-guided quickselect (expected O(V)), and
/// the draw walks the surviving ids in id order. The kept set is the same as
/// the sorted-prefix definition (up to the rounding of a sum taken in
/// another order); only which of them a given random number lands on differs,
/// and that is fixed by the seed on every platform.
fn sample_without_top_k(
    logits: &[f32],
    params: &SamplingParams,
    inv_t: f64,
    rng: &mut Rng,
) -> usize {
    let max_id = argmax(logits);
    let max = logits[max_id] as f64;
    if max == f64::NEG_INFINITY || logits[max_id].is_nan() {
        return max_id;
    }
    // Probabilities relative to the most likely token (which has 1.0).
    let rel: Vec<f64> = logits
        .iter()
        .map(|&l| {
            if l.is_nan() {
                0.0
            } else {
                ((l as f64 - max) * inv_t).exp()
            }
        })
        .collect();
    let total: f64 = rel.iter().sum();
    // HF MinPLogitsWarper keeps p >= min_p * p_max, i.e. rel >= min_p.
    let floor = params.min_p as f64;
    let mut kept: Vec<u32> = (0..logits.len() as u32)
        .filter(|&i| {
            !logits[i as usize].is_nan() && rel[i as usize] > 0.0 && rel[i as usize] >= floor
        })
        .collect();
    if kept.is_empty() {
        return max_id;
    }
    if params.top_p < 1.0 {
        // Both sets are prefixes of the sorted order, so the answer is the
        // shorter one: the nucleus within the min-p set when that set holds
        // enough mass, else the min-p set itself.
        let target = params.top_p as f64 * total;
        let kept_mass: f64 = kept.iter().map(|&i| rel[i as usize]).sum();
        if kept_mass >= target {
            truncate_to_nucleus(&mut kept, &rel, logits, target);
        }
    }
    let mut member = vec![false; logits.len()];
    for &i in &kept {
        member[i as usize] = true;
    }
    let kept_total: f64 = (0..logits.len())
        .filter(|&i| member[i])
        .map(|i| rel[i])
        .sum();
    let mut draw = rng.next_f64() * kept_total;
    let mut last = max_id;
    for (i, (&m, &p)) in member.iter().zip(&rel).enumerate() {
        if !m {
            continue;
        }
        if draw < p {
            return i;
        }
        draw -= p;
        last = i;
    }
    // Rounding can leave a sliver past the last candidate.
    last
}

/// Shrinks `ids` (any order) to the smallest set of most likely tokens whose
/// mass reaches `target`, in expected linear time.
fn truncate_to_nucleus(ids: &mut Vec<u32>, rel: &[f64], logits: &[f32], target: f64) {
    let cmp = by_logit_desc(logits);
    let (mut lo, mut hi) = (0usize, ids.len());
    // Mass of ids[..lo], all of which are in the nucleus.
    let mut acc = 0.0f64;
    while hi - lo > 64 {
        let mid = lo + (hi - lo) / 2;
        // ids[lo..mid] become the (mid - lo) most likely of ids[lo..hi].
        ids[lo..hi].select_nth_unstable_by(mid - lo, &cmp);
        let above: f64 = ids[lo..mid].iter().map(|&i| rel[i as usize]).sum();
        if acc + above >= target {
            hi = mid;
        } else {
            acc += above + rel[ids[mid] as usize];
            if acc >= target {
                ids.truncate(mid + 1);
                return;
            }
            lo = mid + 1;
        }
    }
    ids[lo..hi].sort_unstable_by(&cmp);
    for k in lo..hi {
        acc += rel[ids[k] as usize];
        if acc >= target {
            ids.truncate(k + 1);
            return;
        }
    }
    ids.truncate(hi);
}
