use super::*;

fn params(temperature: f32, top_k: u32, top_p: f32) -> SamplingParams {
    SamplingParams { temperature, top_k, top_p, seed: 7, ..SamplingParams::greedy() }
}

fn draw_many(logits: &[f32], p: &SamplingParams, n: usize) -> Vec<usize> {
    let mut rng = Rng::new(p.seed);
    (0..n).map(|_| sample(logits, p, &mut rng)).collect()
}

#[test]
fn greedy_picks_lowest_index_on_ties() {
    assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
    assert_eq!(sample(&[0.0, 2.0, 1.0], &params(0.0, 0, 1.0), &mut Rng::new(1)), 1);
}

#[test]
fn top_k_one_is_greedy() {
    let logits = [0.3, 0.1, 2.0, 1.9];
    assert!(draw_many(&logits, &params(1.5, 1, 1.0), 100).iter().all(|&t| t == 2));
}

#[test]
fn tiny_top_p_is_greedy() {
    let logits = [0.3, 0.1, 2.0, 1.9];
    assert!(draw_many(&logits, &params(1.0, 0, 1e-6), 100).iter().all(|&t| t == 2));
}

#[test]
fn top_k_never_leaves_the_k_best() {
    let logits = [5.0, 4.0, 3.0, 2.0, 1.0, 0.0];
    assert!(draw_many(&logits, &params(5.0, 3, 1.0), 1000).iter().all(|&t| t < 3));
}

#[test]
fn frequencies_follow_the_distribution() {
    // softmax([ln 1, ln 3]) = [0.25, 0.75]
    let logits = [0.0f32, 3.0f32.ln()];
    let n = 20_000;
    let ones = draw_many(&logits, &params(1.0, 0, 1.0), n).iter().filter(|&&t| t == 1).count();
    let freq = ones as f64 / n as f64;
    assert!((freq - 0.75).abs() < 0.015, "frequency {freq}");
}

#[test]
fn top_p_keeps_exactly_the_nucleus() {
    // probabilities 0.5, 0.25, 0.125, 0.125: top-p 0.7 keeps the first two
    // (0.75 >= 0.7), and their renormalised frequencies are 2/3, 1/3.
    let logits = [4.0f32.ln(), 2.0f32.ln(), 0.0, 0.0];
    let draws = draw_many(&logits, &params(1.0, 0, 0.7), 30_000);
    assert!(draws.iter().all(|&t| t < 2));
    let zeros = draws.iter().filter(|&&t| t == 0).count() as f64 / draws.len() as f64;
    assert!((zeros - 2.0 / 3.0).abs() < 0.015, "{zeros}");
}

#[test]
fn top_p_over_a_large_vocabulary_matches_a_full_sort() {
    // The floor pre-filter must keep the same nucleus as sorting everything.
    let logits: Vec<f32> = (0..5000u32).map(|i| ((i.wrapping_mul(2654435761) >> 7) % 1000) as f32 / 120.0).collect();
    for top_p in [0.3f32, 0.9, 0.999] {
        let p = params(1.0, 0, top_p);
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
        let max = logits[order[0] as usize] as f64;
        let probs: Vec<f64> = logits.iter().map(|&l| (l as f64 - max).exp()).collect();
        let total: f64 = probs.iter().sum();
        let mut cum = 0.0;
        let mut nucleus = std::collections::HashSet::new();
        for &i in &order {
            cum += probs[i as usize];
            nucleus.insert(i as usize);
            if cum >= top_p as f64 * total {
                break;
            }
        }
        let draws = draw_many(&logits, &p, 3000);
        assert!(draws.iter().all(|t| nucleus.contains(t)), "top-p {top_p}");
        if nucleus.len() > 3 {
            let distinct: std::collections::HashSet<_> = draws.iter().collect();
            assert!(distinct.len() > 3, "top-p {top_p}: only {} distinct", distinct.len());
        }
    }
}

#[test]
fn min_p_drops_tokens_below_the_scaled_threshold() {
    // relative probabilities 1, 0.5, 0.09: min-p 0.1 keeps the first two.
    let logits = [0.0f32, 0.5f32.ln(), 0.09f32.ln()];
    let mut p = params(1.0, 0, 1.0);
    p.min_p = 0.1;
    let draws = draw_many(&logits, &p, 5000);
    assert!(draws.iter().all(|&t| t < 2));
    assert!(draws.contains(&1));
    // The threshold is taken after the temperature (HF order): at T = 0.5
    // the second token's relative probability is 0.25, still kept at 0.2...
    p.temperature = 0.5;
    p.min_p = 0.2;
    assert!(draw_many(&logits, &p, 5000).contains(&1));
    // ... and dropped at 0.3.
    p.min_p = 0.3;
    assert!(draw_many(&logits, &p, 5000).iter().all(|&t| t == 0));
}

#[test]
fn repetition_penalty_follows_llama_cpp() {
    let logits = [2.0f32, -2.0, 1.0, 0.5];
    let mut p = params(0.0, 0, 1.0);
    p.repetition_penalty = 2.0;
    let out = adjust(&logits, &p, &[0, 1, 1]);
    // positive logits are divided, negative multiplied, unseen untouched
    assert_eq!(&out[..], &[1.0, -4.0, 1.0, 0.5]);
    assert_eq!(sample(&out, &p, &mut Rng::new(0)), 0);
}

#[test]
fn presence_and_frequency_penalties_follow_openai() {
    let logits = [3.0f32, 3.0, 3.0];
    let mut p = params(0.0, 0, 1.0);
    p.presence_penalty = 0.5;
    p.frequency_penalty = 0.25;
    let out = adjust(&logits, &p, &[0, 0, 0, 1]);
    assert_eq!(&out[..], &[3.0 - 0.75 - 0.5, 3.0 - 0.25 - 0.5, 3.0]);
}

#[test]
fn penalty_window_counts_only_the_last_n_tokens() {
    let logits = [1.0f32, 1.0, 1.0];
    let mut p = params(0.0, 0, 1.0);
    p.presence_penalty = 1.0;
    p.penalty_last_n = 2;
    let out = adjust(&logits, &p, &[0, 1, 2]);
    assert_eq!(&out[..], &[1.0, 0.0, 0.0]);
    p.penalty_last_n = 0;
    assert!(matches!(adjust(&logits, &p, &[0, 1, 2]), Cow::Borrowed(_)));
}

#[test]
fn logit_bias_is_added_before_everything() {
    let logits = [1.0f32, 0.0, 0.5];
    let mut p = params(0.0, 0, 1.0);
    p.logit_bias = vec![(1, 5.0), (0, -100.0)];
    let out = adjust(&logits, &p, &[]);
    assert_eq!(&out[..], &[-99.0, 5.0, 0.5]);
    assert_eq!(sample(&out, &p, &mut Rng::new(0)), 1);
}

#[test]
fn same_seed_same_stream() {
    let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
    let draw = |seed| {
        let mut p = params(0.9, 20, 0.95);
        p.seed = seed;
        p.min_p = 0.05;
        draw_many(&logits, &p, 40)
    };
    assert_eq!(draw(42), draw(42));
    assert_ne!(draw(42), draw(43));
    // Pinned: the generator is part of the reproducibility contract.
    assert_eq!(Rng::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
}

#[test]
fn nonsense_parameters_are_errors() {
    let ok = params(0.7, 40, 0.9);
    assert!(ok.validate(10).is_ok());
    let bad: Vec<(&str, SamplingParams)> = vec![
        ("negative temperature", params(-0.1, 0, 1.0)),
        ("NaN temperature", params(f32::NAN, 0, 1.0)),
        ("top-p 0", params(1.0, 0, 0.0)),
        ("top-p 1.5", params(1.0, 0, 1.5)),
        ("min-p", SamplingParams { min_p: 1.5, ..ok.clone() }),
        ("min-p NaN", SamplingParams { min_p: f32::NAN, ..ok.clone() }),
        ("repetition 0", SamplingParams { repetition_penalty: 0.0, ..ok.clone() }),
        ("repetition inf", SamplingParams { repetition_penalty: f32::INFINITY, ..ok.clone() }),
        ("presence", SamplingParams { presence_penalty: 2.5, ..ok.clone() }),
        ("frequency", SamplingParams { frequency_penalty: -3.0, ..ok.clone() }),
        ("bias token", SamplingParams { logit_bias: vec![(10, 1.0)], ..ok.clone() }),
        ("bias value", SamplingParams { logit_bias: vec![(1, 101.0)], ..ok.clone() }),
        ("bias NaN", SamplingParams { logit_bias: vec![(1, f32::NAN)], ..ok.clone() }),
        ("top logprobs", SamplingParams { top_logprobs: 21, ..ok.clone() }),
    ];
    for (what, p) in bad {
        assert!(p.validate(10).is_err(), "{what} was accepted");
    }
}

#[test]
fn logprob_is_normalised() {
    let logits = [1.0f32, 2.0, 3.0];
    let total: f64 = (0..3).map(|i| (logprob(&logits, i) as f64).exp()).sum();
    assert!((total - 1.0).abs() < 1e-6);
}

#[test]
fn top_logprobs_are_sorted_and_match_logprob() {
    let logits = [1.0f32, 3.0, 2.0, 3.0, f32::NAN];
    let clean = [1.0f32, 3.0, 2.0, 3.0];
    let lse = log_sum_exp(&clean);
    let top = top_logprobs(&logits, lse, 3);
    assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3, 2]);
    for (id, lp) in top {
        assert_eq!(lp, logprob(&clean, id as usize));
    }
    assert!(top_logprobs(&logits, lse, 0).is_empty());
}

#[test]
fn exp_nonpos_matches_libm_closely() {
    // The independent reference is the platform's libm `exp`.
    let mut worst = 0.0f64;
    let mut check = |x: f64| {
        let (got, want) = (exp_nonpos(x), x.exp());
        worst = worst.max(((got - want) / want).abs());
    };
    let n = 2_000_000;
    for i in 0..=n {
        check(-700.0 * i as f64 / n as f64);
    }
    // Around the reduction boundaries (k ln2 +- ln2/2) and tiny |x|.
    for k in 0..1000 {
        for d in [-1e-12, 0.0, 1e-12] {
            let x = -(k as f64 + 0.5) * std::f64::consts::LN_2 + d;
            if (-700.0..=0.0).contains(&x) {
                check(x);
            }
        }
    }
    for x in [-1e-300, -1e-17, -1e-9, -0.0, 0.0] {
        check(x);
    }
    assert!(worst < 3e-13, "worst relative error {worst:e}");
    assert_eq!(exp_nonpos(0.0), 1.0);
    assert_eq!(exp_nonpos(-0.0), 1.0);
    // What counts as no probability at all.
    for x in [f64::NEG_INFINITY, f64::NAN, -700.5, -1e300] {
        assert_eq!(exp_nonpos(x), 0.0, "{x}");
    }
}

#[test]
fn exp_passes_match_the_definition() {
    // Lengths around the 8-wide chunks, specials included.
    for len in [0usize, 1, 7, 8, 9, 15, 16, 17, 1001] {
        let logits: Vec<f32> = (0..len as u32)
            .map(|i| match i % 97 {
                5 => f32::NEG_INFINITY,
                6 => -0.0,
                _ => ((i.wrapping_mul(2654435761) >> 9) % 3000) as f32 / 50.0 - 30.0,
            })
            .collect();
        let (max, nan) = exp::max_and_nan(&logits);
        let want_max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(max, want_max, "len {len}");
        assert!(!nan);
        let max = max as f64;
        for inv_t in [1.0, 1.25] {
            let mut lanes = [0.0f64; 8];
            let each: Vec<f64> = logits.iter().map(|&l| exp_nonpos((l as f64 - max) * inv_t)).collect();
            for (i, e) in each.iter().enumerate() {
                lanes[i % 8] += e;
            }
            let want =
                ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
            let sum = exp::exp_sum(&logits, max, inv_t);
            assert_eq!(sum.to_bits(), want.to_bits(), "len {len}");
        }
    }
    assert!(exp::max_and_nan(&[1.0, f32::NAN, 2.0]).1);
}

#[test]
fn log_sum_exp_matches_a_plain_f64_reference() {
    let logits: Vec<f32> =
        (0..100_003u32).map(|i| ((i.wrapping_mul(2654435761) >> 9) % 4000) as f32 / 97.0 - 20.0).collect();
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let want = max + logits.iter().map(|&l| (l as f64 - max).exp()).sum::<f64>().ln();
    let got = log_sum_exp(&logits);
    assert!((got - want).abs() <= 1e-12 * want.abs(), "{got} vs {want}");
    assert!(log_sum_exp(&[1.0, f32::NAN]).is_nan());
    assert!(log_sum_exp(&[f32::NEG_INFINITY; 3]).is_nan());
    assert_eq!(log_sum_exp(&[]), f64::NEG_INFINITY);
    assert_eq!(log_sum_exp(&[2.0]), 2.0);
}

#[test]
fn lane_sum_is_fixed_interleaved_order() {
    // Lane j holds values[j], values[j + 8], ...; lanes combine pairwise.
    let v: Vec<f64> = (0..29).map(|i| 1.0 / (i as f64 + 1.0)).collect();
    let mut lanes = [0.0f64; 8];
    for (i, x) in v.iter().enumerate() {
        lanes[i % 8] += x;
    }
    let want = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    assert_eq!(lane_sum(&v).to_bits(), want.to_bits());
    assert_eq!(lane_sum(&[]), 0.0);
}

#[test]
fn total_key_orders_like_total_cmp() {
    let mut values = vec![
        0.0f32,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        f32::from_bits(1),
        f32::from_bits(0x8000_0001),
        f32::MAX,
        f32::MIN,
        1.0,
        -1.0,
    ];
    let mut s = 12345u32;
    for _ in 0..2000 {
        s = s.wrapping_mul(1664525).wrapping_add(1013904223);
        let v = f32::from_bits(s);
        if !v.is_nan() {
            values.push(v);
        }
    }
    for &a in &values {
        for &b in values.iter().step_by(7) {
            assert_eq!(total_key(a).cmp(&total_key(b)), a.total_cmp(&b), "{a} {b}");
        }
    }
}

/// The reference: sort every non-NaN id by `by_logit_desc` and take `n`.
fn top_ids_by_full_sort(logits: &[f32], n: usize) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..logits.len() as u32).filter(|&i| !logits[i as usize].is_nan()).collect();
    ids.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
    ids.truncate(n);
    ids
}

#[test]
fn top_ids_match_a_full_sort() {
    // Heavy ties, both zeros, infinities and NaN; and the worst case for the
    // one-pass buffer (ascending logits: every id enters it).
    let mut tied: Vec<f32> = (0..5000u32).map(|i| ((i.wrapping_mul(2654435761) >> 11) % 50) as f32 - 25.0).collect();
    tied[7] = -0.0;
    tied[8] = 0.0;
    tied[9] = f32::NAN;
    tied[10] = f32::INFINITY;
    tied[11] = f32::NEG_INFINITY;
    let ascending: Vec<f32> = (0..3000).map(|i| i as f32 * 0.5).collect();
    let zeros = vec![0.0f32; 300];
    for logits in [&tied, &ascending, &zeros] {
        for n in [1, 2, 5, 40, 255, 256, 257, 1000, 2999, 3000, 4999, 5000, 6000] {
            assert_eq!(top_ids(logits, n), top_ids_by_full_sort(logits, n), "n {n} of {}", logits.len());
        }
    }
}

/// The reference nucleus: every eligible id sorted by rank, the shortest
/// prefix whose mass reaches the target; its last rank (0: all kept).
fn nucleus_by_full_sort(logits: &[f32], rel: &[f32], floor: f32, target: f64) -> u64 {
    let mut ranks: Vec<u64> = (0..logits.len()).filter(|&i| rel[i] >= floor).map(|i| rank(logits[i], i)).collect();
    ranks.sort_unstable_by(|a, b| b.cmp(a));
    let mut acc = 0.0;
    for &r in &ranks {
        acc += rel[rank_id(r) as usize] as f64;
        if acc >= target {
            return r;
        }
    }
    0
}

#[test]
fn nucleus_matches_a_full_sort() {
    let n = 40_000u32;
    let hash = |i: u32| (i.wrapping_mul(2654435761) >> 8) as f32 / (1u32 << 24) as f32;
    let shapes: Vec<(&str, Vec<f32>)> = vec![
        ("flat", (0..n).map(|i| hash(i) * 4.0).collect()),
        ("peaked", (0..n).map(|i| if i % 997 == 0 { 20.0 - hash(i) } else { hash(i) * 8.0 - 4.0 }).collect()),
        // Few distinct values: one sub-bucket holds thousands of ties.
        ("quantised", (0..n).map(|i| (hash(i) * 6.0).floor() * 0.5).collect()),
        ("wide", (0..n).map(|i| (hash(i) - 0.5) * 200.0).collect()),
    ];
    let mut checked = 0;
    for (name, logits) in &shapes {
        for t in [1.0f32, 0.8, 1.0 / 3.0] {
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut rel = vec![0.0f32; logits.len()];
            let total = mass::mass_each(logits, max, mass::inv_temperature(t), &mut rel);
            for min_p in [0.0f32, 0.01] {
                let floor = min_p.max(f32::from_bits(1));
                for top_p in [1e-6f64, 0.1, 0.5, 0.9, 0.95, 0.999, 0.9999] {
                    let target = top_p * total;
                    assert_eq!(
                        nucleus(logits, &rel, floor, target),
                        nucleus_by_full_sort(logits, &rel, floor, target),
                        "{name} T {t} min-p {min_p} top-p {top_p}"
                    );
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 4 * 3 * 2 * 7);
}

#[test]
fn exp32_nonpos_matches_libm_closely() {
    // The independent reference is the platform's f64 libm `exp` of the same
    // f32 argument.
    let mut worst = 0.0f64;
    let mut check = |x: f32| {
        let (got, want) = (exp32_nonpos(x) as f64, (x as f64).exp());
        worst = worst.max(((got - want) / want).abs());
    };
    let n = 2_000_000;
    for i in 0..=n {
        check(-87.0 * i as f32 / n as f32);
    }
    for k in 0..126 {
        for d in [-1e-6f32, 0.0, 1e-6] {
            let x = -(k as f32 + 0.5) * std::f32::consts::LN_2 + d;
            if (-87.0..=0.0).contains(&x) {
                check(x);
            }
        }
    }
    for x in [-1e-38f32, -1e-20, -1e-7, -0.0, 0.0, f32::from_bits(0x8000_0001)] {
        check(x);
    }
    assert!(worst < 2.5e-7, "worst relative error {worst:e}");
    assert_eq!(exp32_nonpos(0.0), 1.0);
    assert_eq!(exp32_nonpos(-0.0), 1.0);
    for x in [f32::NEG_INFINITY, f32::NAN, -87.01, -1e30] {
        assert_eq!(exp32_nonpos(x), 0.0, "{x}");
    }
}

#[test]
fn mass_passes_match_the_definition() {
    // Lengths around the 8-wide chunks and the 16-wide skips, specials
    // included.
    for len in [0usize, 1, 7, 8, 9, 15, 16, 17, 33, 1001] {
        let logits: Vec<f32> = (0..len as u32)
            .map(|i| match i % 97 {
                5 => f32::NEG_INFINITY,
                6 => -0.0,
                7 => f32::NAN,
                _ => ((i.wrapping_mul(2654435761) >> 9) % 3000) as f32 / 50.0 - 30.0,
            })
            .collect();
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for inv_t in [1.0f32, 1.25, 40.0] {
            let each: Vec<f32> = logits.iter().map(|&l| exp32_nonpos((l - max) * inv_t)).collect();
            let mut lanes = [0.0f64; 8];
            for (i, e) in each.iter().enumerate() {
                lanes[i % 8] += *e as f64;
            }
            let mut got = vec![0.0f32; len];
            let sum = mass::mass_each(&logits, max, inv_t, &mut got);
            assert_eq!(sum.to_bits(), combine_lanes(&lanes).to_bits(), "len {len}");
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                each.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "len {len}"
            );
        }
        for from in [0, 1, 5, 16, len] {
            for floor in [f32::NEG_INFINITY, 0.0, 25.0, 100.0] {
                let want = (from..len).find(|&i| logits[i] >= floor).unwrap_or(len);
                assert_eq!(mass::next_at_least(&logits, from, floor), want);
            }
            let bucket = total_key(-0.0) >> 20;
            let want = (from..len).find(|&i| total_key(logits[i]) >> 20 == bucket).unwrap_or(len);
            assert_eq!(mass::next_in_bucket(&logits, from, bucket), want);
        }
        assert_eq!(argmax(&logits), mass::scalar::argmax(&logits), "len {len}");
    }
    assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY]), 0);
    assert_eq!(argmax(&[-0.0, 0.0, -1.0]), 0);
    assert_eq!(argmax(&[f32::NAN, 1.0, 3.0, 2.0, 3.0]), 2);
}

#[test]
fn f32_sampling_masses_stay_within_f32_precision_of_f64() {
    // What moving the masses from f64 to f32 changed: relative to the exact
    // exp((l - max) / T) of the f32 logits, for every token with a mass of
    // at least 1e-30 relative to the most likely one.
    let logits: Vec<f32> = (0..160_000u32)
        .map(|i| ((i.wrapping_mul(2654435761) >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 60.0)
        .collect();
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for t in [1.0f32, 0.8, 0.3] {
        let mut rel = vec![0.0f32; logits.len()];
        let total = mass::mass_each(&logits, max, mass::inv_temperature(t), &mut rel);
        let mut worst = 0.0f64;
        let mut exact_total = 0.0f64;
        for (&l, &q) in logits.iter().zip(&rel) {
            let exact = ((l as f64 - max as f64) / t as f64).exp();
            exact_total += exact;
            if exact >= 1e-30 {
                worst = worst.max((q as f64 - exact).abs() / exact);
            }
        }
        // Two f32 roundings of x = (l - max) / T (|x| up to 69 here) and the
        // polynomial's 2.5e-7.
        assert!(worst < 1e-5, "T {t}: worst relative change {worst:e}");
        let sum_change = ((total - exact_total) / exact_total).abs();
        assert!(sum_change < 1e-6, "T {t}: total moved by {sum_change:e}");
    }
}

#[test]
fn top_p_among_tied_logits_keeps_the_lowest_ids() {
    // 1000 equal logits: the rank order is the id order, so top-p 0.5 keeps
    // ids 0..500 exactly (the cut falls inside a run of equal logits, which
    // the block sums resolve by id).
    let logits = vec![1.5f32; 1000];
    let draws = draw_many(&logits, &params(1.0, 0, 0.5), 5000);
    assert!(draws.iter().all(|&t| t < 500));
    assert!(draws.iter().any(|&t| t >= 450) && draws.iter().any(|&t| t < 50));
}

#[test]
fn block_sums_follow_the_kept_set() {
    let logits: Vec<f32> = (0..1000u32).map(|i| ((i.wrapping_mul(2654435761) >> 20) % 16) as f32).collect();
    let rel: Vec<f32> = logits.iter().map(|&l| exp32_nonpos(l - 15.0)).collect();
    for cut in [None, Some((total_key(7.0), 500)), Some((total_key(7.0), 0))] {
        let kept = Kept { floor: 1e-3, cut };
        let sums = block_sums(&logits, &rel, kept);
        assert_eq!(sums.len(), 16);
        for (b, &got) in sums.iter().enumerate() {
            let mut lanes = [0.0f64; 8];
            for i in b * 64..((b + 1) * 64).min(1000) {
                let key = total_key(logits[i]);
                let ranked = cut.is_none_or(|(k, id)| key > k || (key == k && i as u32 <= id));
                if rel[i] >= 1e-3 && ranked {
                    lanes[i % 8] += rel[i] as f64;
                }
            }
            assert_eq!(got.to_bits(), combine_lanes(&lanes).to_bits(), "block {b}");
        }
    }
}

#[test]
fn tiny_temperature_keeps_the_most_likely_token() {
    // 1 / 1e-40 overflows f32: an infinite factor made the most likely
    // tokens' masses 0 * inf = NaN, i.e. none at all, and the draw fell back
    // to the first of them every time. Both tied tokens must be drawn.
    let logits = [0.5f32, 2.0, 1.0, 2.0, 1.999];
    for top_p in [1.0f32, 0.9] {
        let draws = draw_many(&logits, &params(1e-40, 0, top_p), 200);
        assert!(draws.iter().all(|&t| t == 1 || t == 3), "top-p {top_p}");
        assert!(draws.contains(&1) && draws.contains(&3), "top-p {top_p}");
    }
}
