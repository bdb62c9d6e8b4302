//! Token sampling with a seeded PRNG whose stream is the same on every
//! platform (integer arithmetic only; the uniform draw is an exact f64 from
//! 53 random bits; every sum is f64 in a fixed order).
//!
//! Every `exp` here is written with IEEE-754 basic operations only (Rust
//! never fuses them), so a probability is the same bits natively and in the
//! component, whatever libm the platform has; in the component the
//! vocabulary-wide passes run on wasm SIMD lanes with the same operations.
//! The reported logprob uses f64 [`exp_nonpos`] (sampling_exp.rs); the
//! sampling masses without top-k use f32 [`exp32_nonpos`] (sampling_mass.rs,
//! four lanes per instruction instead of two; the reference's softmax is
//! f32 too). Sums over the whole vocabulary ([`lane_sum`]) are f64 in eight
//! interleaved lanes combined in a fixed order: deterministic, and free of a
//! serial dependency chain.
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

mod exp;
pub use exp::exp_nonpos;
use exp::{combine_lanes, exp_sum, max_and_nan};
mod mass;
pub use mass::exp32_nonpos;
use mass::{
    block_sums, bucket_mass, inv_temperature, mass_each, next_at_least, next_in_bucket, total_key, Kept, BLOCK,
};

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

impl SamplingParams {
    /// Greedy decoding and every other step off: the neutral starting point
    /// of tests and benches. The defaults a user gets are the host's
    /// (`GenerateParams::DEFAULTS`), which always sends every field.
    pub fn greedy() -> Self {
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
            return Err(format!("temperature must be a finite number >= 0, got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top-p must be in (0, 1], got {}", self.top_p));
        }
        if !(self.min_p >= 0.0 && self.min_p <= 1.0) {
            return Err(format!("min-p must be in [0, 1], got {}", self.min_p));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(format!("repetition penalty must be a finite number > 0, got {}", self.repetition_penalty));
        }
        for (name, v) in [("presence", self.presence_penalty), ("frequency", self.frequency_penalty)] {
            if !(-PENALTY_RANGE..=PENALTY_RANGE).contains(&v) {
                return Err(format!("{name} penalty must be in [-{PENALTY_RANGE}, {PENALTY_RANGE}], got {v}"));
            }
        }
        for &(token, bias) in &self.logit_bias {
            if token >= vocab_size {
                return Err(format!("logit bias: token {token} is outside the vocabulary of {vocab_size}"));
            }
            if !(-BIAS_RANGE..=BIAS_RANGE).contains(&bias) {
                return Err(format!(
                    "logit bias of token {token} must be in [-{BIAS_RANGE}, {BIAS_RANGE}], got {bias}"
                ));
            }
        }
        if self.top_logprobs > MAX_TOP_LOGPROBS {
            return Err(format!("top-logprobs must be at most {MAX_TOP_LOGPROBS}, got {}", self.top_logprobs));
        }
        Ok(())
    }

    fn penalties_active(&self) -> bool {
        self.penalty_last_n > 0
            && (self.repetition_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0)
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
    mass::argmax(logits)
}

/// `sum(values)` in eight interleaved lanes (`values[i]` into lane `i % 8`),
/// the lanes combined pairwise: a fixed order on every platform.
pub fn lane_sum(values: &[f64]) -> f64 {
    let mut acc = [0.0f64; 8];
    let chunks = values.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..8 {
            acc[j] += c[j];
        }
    }
    for (j, &v) in rest.iter().enumerate() {
        acc[j] += v;
    }
    combine_lanes(&acc)
}

/// `ln(sum(exp(logits)))`, in f64 (`exp_nonpos`, `lane_sum` order). NaN if
/// any logit is NaN, -inf for an empty slice.
pub fn log_sum_exp(logits: &[f32]) -> f64 {
    let (max, nan) = max_and_nan(logits);
    if nan {
        return f64::NAN;
    }
    if logits.is_empty() {
        return f64::NEG_INFINITY;
    }
    let max = max as f64;
    if max == f64::NEG_INFINITY {
        // Every logit -inf: no distribution.
        return f64::NAN;
    }
    max + exp_sum(logits, max, 1.0).ln()
}

/// Natural log-probability of `token` under softmax(logits), computed in f64.
pub fn logprob(logits: &[f32], token: usize) -> f32 {
    (logits[token] as f64 - log_sum_exp(logits)) as f32
}

/// The `n` most likely tokens under softmax(logits) with their
/// log-probabilities, most likely first, ties by lower id. `lse` is
/// `log_sum_exp(logits)`.
pub fn top_logprobs(logits: &[f32], lse: f64, n: usize) -> Vec<(u32, f32)> {
    if n == 0 {
        return Vec::new();
    }
    let ids = top_ids(logits, n);
    ids.into_iter().map(|i| (i, (logits[i as usize] as f64 - lse) as f32)).collect()
}

/// The order of every ranking here: descending logit under
/// `f32::total_cmp` (`total_key`), then ascending id. A total order, so no
/// result depends on a sort algorithm. The rank order as one integer: a
/// larger rank is earlier in that order.
#[inline(always)]
fn rank(v: f32, id: usize) -> u64 {
    ((total_key(v) as u64) << 32) | u64::from(u32::MAX - id as u32)
}

fn rank_id(r: u64) -> u32 {
    u32::MAX - r as u32
}

/// Up to this many, `top_ids` keeps a sorted buffer during one pass over the
/// logits instead of selecting among all of them.
const TOP_SCAN_MAX: usize = 256;

/// Ids of the `n` largest non-NaN logits, in rank order.
fn top_ids(logits: &[f32], n: usize) -> Vec<u32> {
    if n == 0 {
        return Vec::new();
    }
    if n <= TOP_SCAN_MAX {
        // One pass; a float compare against the n-th best so far rejects
        // almost every logit (total order refines float order, so
        // `v >= floor` keeps every candidate that can outrank it; NaN fails).
        // `next_at_least` skips the rejected ones 16 at a time in wasm.
        let mut best: Vec<u64> = Vec::with_capacity(n + 1);
        let mut floor = f32::NEG_INFINITY;
        let mut i = 0;
        loop {
            i = next_at_least(logits, i, floor);
            let Some(&v) = logits.get(i) else {
                break;
            };
            let r = rank(v, i);
            i += 1;
            if best.len() == n {
                if r <= best[n - 1] {
                    continue;
                }
                best.pop();
            }
            let at = best.partition_point(|&b| b > r);
            best.insert(at, r);
            if best.len() == n {
                floor = logits[rank_id(best[n - 1]) as usize];
            }
        }
        return best.into_iter().map(rank_id).collect();
    }
    let mut ranks: Vec<u64> =
        logits.iter().enumerate().filter(|(_, v)| !v.is_nan()).map(|(i, &v)| rank(v, i)).collect();
    if n < ranks.len() {
        ranks.select_nth_unstable_by(n - 1, |a, b| b.cmp(a));
        ranks.truncate(n);
    }
    ranks.sort_unstable_by(|a, b| b.cmp(a));
    ranks.into_iter().map(rank_id).collect()
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
    if params.top_k == 0 || params.top_k as usize >= logits.len() {
        return sample_without_top_k(logits, params, rng);
    }
    let inv_t = 1.0 / params.temperature as f64;
    // The top-k candidates in rank order with their unnormalised
    // probabilities exp((l - max) / T) and their total mass, summed in that
    // fixed order.
    let order = top_ids(logits, params.top_k as usize);
    if order.is_empty() {
        return 0;
    }
    let max = logits[order[0] as usize] as f64;
    if max == f64::NEG_INFINITY {
        return order[0] as usize;
    }
    let probs: Vec<f64> = order.iter().map(|&i| exp_nonpos((logits[i as usize] as f64 - max) * inv_t)).collect();
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
        let above = probs[..keep].iter().take_while(|&&p| p >= threshold).count();
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
/// component, so nothing is sorted: the masses are f32 (`mass_each`), the
/// min-p set is a threshold test, the top-p nucleus is found from histograms
/// of the mass over the logits' rank (`nucleus`), and the draw walks the
/// surviving ids in id order, a block of 64 at a time. The kept set is the
/// same as the sorted-prefix definition (up to the rounding of a sum taken in
/// another order); only which of them a given random number lands on
/// differs, and that is fixed by the seed on every platform.
fn sample_without_top_k(logits: &[f32], params: &SamplingParams, rng: &mut Rng) -> usize {
    let max_id = argmax(logits);
    let max = logits[max_id];
    if max == f32::NEG_INFINITY || max.is_nan() {
        return max_id;
    }
    // Masses relative to the most likely token (which has 1.0); NaN and -inf
    // logits get 0.
    let mut rel = vec![0.0f32; logits.len()];
    let total = mass_each(logits, max, inv_temperature(params.temperature), &mut rel);
    // HF MinPLogitsWarper keeps p >= min_p * p_max, i.e. rel >= min_p; a
    // token without mass is never kept.
    let floor = params.min_p.max(f32::from_bits(1));
    let mut cut = None;
    if params.top_p < 1.0 {
        // Both sets are prefixes of the sorted order, so the answer is the
        // shorter one: the nucleus within the min-p set when that set holds
        // enough mass, else the min-p set itself.
        let lowest = nucleus(logits, &rel, floor, params.top_p as f64 * total);
        if lowest != 0 {
            cut = Some(((lowest >> 32) as u32, rank_id(lowest)));
        }
    }
    draw_in_id_order(logits, &rel, Kept { floor, cut }, rng, max_id)
}

/// One draw from the (unnormalised) masses `p` of the `kept` tokens, walking
/// the ids in order: the blocks' kept masses (`block_sums`) first, then the
/// ids of the block the draw lands in. `fallback` when nothing is kept.
fn draw_in_id_order(logits: &[f32], p: &[f32], kept: Kept, rng: &mut Rng, fallback: usize) -> usize {
    let blocks = block_sums(logits, p, kept);
    let total = blocks.iter().fold(0.0f64, |a, &b| a + b);
    // NaN included.
    if total.is_nan() || total <= 0.0 {
        return fallback;
    }
    // The draw within block `b`; the last kept id of the block when rounding
    // leaves a sliver past it.
    let within = |b: usize, mut draw: f64| {
        let mut last = fallback;
        for i in b * BLOCK..((b + 1) * BLOCK).min(p.len()) {
            if kept.keeps(logits[i], p[i], i) {
                let q = p[i] as f64;
                if draw < q {
                    return i;
                }
                draw -= q;
                last = i;
            }
        }
        last
    };
    let mut draw = rng.next_f64() * total;
    let mut last = 0;
    for (b, &m) in blocks.iter().enumerate() {
        if m.is_nan() || m <= 0.0 {
            continue;
        }
        if draw < m {
            return within(b, draw);
        }
        draw -= m;
        last = b;
    }
    // Rounding can leave a sliver past the last block with mass.
    within(last, f64::INFINITY)
}

/// Buckets per histogram level of `nucleus`.
const NUCLEUS_BUCKETS: usize = 4096;

/// The nucleus: the smallest set of most likely tokens with mass `rel` at
/// least `floor` whose mass reaches `target`, as the rank of its least
/// likely token (0 when all such tokens together stay below `target`: all
/// are kept).
///
/// The logit's `total_key` orders the tokens like the ranks, so the mass is
/// histogrammed by its top 12 bits; the tokens of the bucket where the
/// running mass crosses `target` are collected (found 8 at a time in wasm)
/// and histogrammed by the next 12 bits; only that sub-bucket's tokens are
/// sorted. One pass over the vocabulary and one scan instead of a selection
/// among all tokens.
fn nucleus(logits: &[f32], rel: &[f32], floor: f32, target: f64) -> u64 {
    // Walks `mass` from the top bucket down; the bucket where `acc` reaches
    // `target`, `acc` then holding the mass above it (all of it for None).
    fn crossing(mass: &[f64], acc: &mut f64, target: f64) -> Option<usize> {
        for b in (0..mass.len()).rev() {
            if *acc + mass[b] >= target {
                return Some(b);
            }
            *acc += mass[b];
        }
        None
    }
    let mut acc = 0.0f64;
    let mut mass = Box::new([0.0f64; NUCLEUS_BUCKETS]);
    bucket_mass(logits, rel, floor, &mut mass);
    let Some(top) = crossing(&mass[..], &mut acc, target) else {
        return 0;
    };
    let top = top as u32;
    let mut ids: Vec<u32> = Vec::new();
    let mut i = 0;
    loop {
        i = next_in_bucket(logits, i, top);
        if i >= logits.len() {
            break;
        }
        if rel[i] >= floor {
            ids.push(i as u32);
        }
        i += 1;
    }
    mass.iter_mut().for_each(|m| *m = 0.0);
    for &i in &ids {
        mass[((total_key(logits[i as usize]) >> 8) & 0xFFF) as usize] += rel[i as usize] as f64;
    }
    // Sums in another order can leave the crossing short by a rounding
    // error: then the whole bucket is kept.
    let Some(sub) = crossing(&mass[..], &mut acc, target) else {
        return u64::from(top << 20) << 32;
    };
    let prefix = (top << 12) | sub as u32;
    let mut ranks: Vec<u64> = ids
        .iter()
        .map(|&i| i as usize)
        .filter(|&i| total_key(logits[i]) >> 8 == prefix)
        .map(|i| rank(logits[i], i))
        .collect();
    ranks.sort_unstable_by(|a, b| b.cmp(a));
    for &r in &ranks {
        acc += rel[rank_id(r) as usize] as f64;
        if acc >= target {
            return r;
        }
    }
    u64::from(prefix << 8) << 32
}

#[cfg(test)]
mod tests;
