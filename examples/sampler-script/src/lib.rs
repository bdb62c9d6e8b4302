//! A sampler plugin that writes a script: the token ids given as options
//! `t0`, `t1`, ... (each an f32 holding a token id; f32 is exact for ids
//! below 2^24) are chosen in order, one per draw, whatever the logits say;
//! after the last one it falls back to greedy (argmax) choice.
//!
//! A second script, `u0`, `u1`, ..., is played instead when the tokens
//! before the first draw hold the sequence `m0`, `m1`, ...: an agent's
//! request that ends with a tool's result (its template's
//! `</tool_response>` tag, say) then gets the answer to that result, while
//! its first request gets the call. Those tokens are the engine's penalty
//! window (`recent`): the prompt's last 64 tokens unless the request sets
//! another window, so the marker must lie that close to the prompt's end. A plugin is instantiated afresh for every generation, so it
//! cannot count requests; the prompt is what tells them apart.
//!
//! Its use is testing what the engine and its clients do with a given
//! output (tool-call parsing in `waste serve`, stop handling, coding
//! agents' tool turns) on the tiny random-weight fixtures, which never
//! write such text by themselves. The model still runs every step: only
//! the choice of token is scripted.
//!
//! Options: `t0`..`tN-1`, and optionally `u0`..`uK-1` with `m0`..`mJ-1`,
//! each family contiguous from 0 (a gap is an error, so a typo cannot
//! silently shorten a script). Every generation (every `begin`) restarts.

/// The scripts and how far the one chosen has been played.
pub struct Script {
    tokens: Vec<u32>,
    /// Played instead of `tokens` when `marker` precedes the first draw.
    after_marker: Vec<u32>,
    marker: Vec<u32>,
    /// Whether `after_marker` was chosen, once the first draw decided.
    marked: Option<bool>,
    next: usize,
}

/// One family of options (`t`, `u` or `m`): its ids in index order.
fn family(options: &[(String, f32)], letter: char) -> Result<Vec<u32>, String> {
    let mut slots: Vec<Option<u32>> = Vec::new();
    for (name, value) in options {
        let Some(index) = name.strip_prefix(letter).and_then(|n| n.parse::<usize>().ok()) else { continue };
        if !(value.is_finite() && *value >= 0.0 && value.fract() == 0.0 && *value < 16_777_216.0) {
            return Err(format!("script: {name} = {value} is not a token id"));
        }
        if slots.len() <= index {
            slots.resize(index + 1, None);
        }
        if slots[index].replace(*value as u32).is_some() {
            return Err(format!("script: {name} is given twice"));
        }
    }
    slots.iter().enumerate().map(|(i, t)| t.ok_or_else(|| format!("script: {letter}{i} is missing"))).collect()
}

impl Script {
    /// Reads `t0`, `t1`, ..., `u0`, ... and `m0`, ... from `options`;
    /// other names are errors.
    pub fn from_options(options: &[(String, f32)]) -> Result<Script, String> {
        for (name, _) in options {
            let known = name
                .strip_prefix(['t', 'u', 'm'])
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
            if !known {
                return Err(format!("script: unknown option {name:?} (expected t0, t1, ..., u0, ..., m0, ...)"));
            }
        }
        let (tokens, after_marker, marker) = (family(options, 't')?, family(options, 'u')?, family(options, 'm')?);
        if after_marker.is_empty() != marker.is_empty() {
            return Err("script: a second script (u0, ...) needs its marker (m0, ...), and a marker its script".into());
        }
        Ok(Script { tokens, after_marker, marker, marked: None, next: 0 })
    }

    /// The next token: the chosen script's, then the argmax of `logits`.
    /// `recent` is what precedes this draw (at the first, the prompt).
    pub fn sample(&mut self, logits: &[f32], recent: &[u32]) -> Result<u32, String> {
        let marker = &self.marker;
        let marked =
            *self.marked.get_or_insert_with(|| !marker.is_empty() && recent.windows(marker.len()).any(|w| w == marker));
        let script = if marked { &self.after_marker } else { &self.tokens };
        if let Some(&t) = script.get(self.next) {
            self.next += 1;
            if t as usize >= logits.len() {
                return Err(format!("script: token {t} is outside the vocabulary ({} entries)", logits.len()));
            }
            return Ok(t);
        }
        argmax(logits).ok_or_else(|| "script: no finite logits".to_string())
    }
}

/// The first index of the largest non-NaN logit.
fn argmax(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in logits.iter().enumerate() {
        if !v.is_nan() && best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map(|(i, _)| i as u32)
}

#[cfg(target_arch = "wasm32")]
mod component {
    use std::cell::RefCell;

    wit_bindgen::generate!({ world: "sampler-plugin", path: "../../wit" });

    use exports::waste::engine::sampler::{Guest, SamplerParams};

    thread_local! {
        static STATE: RefCell<Option<super::Script>> = const { RefCell::new(None) };
    }

    struct Plugin;

    impl Guest for Plugin {
        fn begin(params: SamplerParams) -> Result<(), String> {
            let script = super::Script::from_options(&params.options)?;
            STATE.with(|s| *s.borrow_mut() = Some(script));
            Ok(())
        }

        fn sample(logits: Vec<f32>, recent: Vec<u32>) -> Result<u32, String> {
            STATE.with(|s| match s.borrow_mut().as_mut() {
                Some(script) => script.sample(&logits, &recent),
                None => Err("script: sample before begin".into()),
            })
        }
    }

    export!(Plugin);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(list: &[(&str, f32)]) -> Vec<(String, f32)> {
        list.iter().map(|&(n, v)| (n.to_string(), v)).collect()
    }

    #[test]
    fn the_script_is_played_in_order_then_argmax() {
        let mut logits = vec![0.0f32; 10];
        logits[4] = 3.0;
        // Options in any order: the index in the name decides.
        let mut s = Script::from_options(&opts(&[("t1", 2.0), ("t0", 7.0), ("t2", 9.0)])).unwrap();
        let got: Vec<u32> = (0..5).map(|_| s.sample(&logits, &[]).unwrap()).collect();
        assert_eq!(got, [7, 2, 9, 4, 4]);
    }

    #[test]
    fn bad_scripts_are_errors() {
        assert!(Script::from_options(&opts(&[("t0", 1.0), ("t2", 1.0)])).is_err());
        assert!(Script::from_options(&opts(&[("t0", 1.5)])).is_err());
        assert!(Script::from_options(&opts(&[("t0", -1.0)])).is_err());
        assert!(Script::from_options(&opts(&[("t0", 1.0), ("t0", 2.0)])).is_err());
        assert!(Script::from_options(&opts(&[("tau", 1.0)])).is_err());
        let mut s = Script::from_options(&opts(&[("t0", 10.0)])).unwrap();
        assert!(s.sample(&[0.0; 10], &[]).is_err());
        assert!(Script::from_options(&opts(&[("u0", 1.0)])).is_err(), "a second script without its marker");
        assert!(Script::from_options(&opts(&[("m0", 1.0)])).is_err(), "a marker without its script");
        assert!(Script::from_options(&opts(&[("m", 1.0)])).is_err());
    }

    #[test]
    fn an_empty_script_is_greedy() {
        let mut s = Script::from_options(&[]).unwrap();
        assert_eq!(s.sample(&[1.0, f32::NAN, 5.0, 5.0], &[]), Ok(2));
    }

    #[test]
    fn the_second_script_plays_when_the_marker_precedes_the_first_draw() {
        let logits = vec![0.0f32; 10];
        let options = opts(&[("t0", 1.0), ("u0", 2.0), ("u1", 3.0), ("m0", 7.0), ("m1", 8.0)]);
        let mut s = Script::from_options(&options).unwrap();
        // The marker is a sequence: 7 then 8, anywhere before the first draw.
        assert_eq!(s.sample(&logits, &[5, 7, 8, 9]), Ok(2));
        assert_eq!(s.sample(&logits, &[5, 7, 8, 9, 2]), Ok(3));
        let mut s = Script::from_options(&options).unwrap();
        assert_eq!(s.sample(&logits, &[8, 7, 5]), Ok(1), "7 and 8 apart are no marker");
        // Decided once: a marker the script itself writes later changes nothing.
        assert_eq!(s.sample(&logits, &[8, 7, 5, 1, 7, 8]), Ok(0));
    }
}
