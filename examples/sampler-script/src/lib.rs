//! A sampler plugin that writes a script: the token ids given as options
//! `t0`, `t1`, ... (each an f32 holding a token id; f32 is exact for ids
//! below 2^24) are chosen in order, one per draw, whatever the logits say;
//! after the last one it falls back to greedy (argmax) choice.
//!
//! Its use is testing what the engine and its clients do with a given
//! output (tool-call parsing in `waste serve`, stop handling) on the tiny
//! random-weight fixtures, which never write such text by themselves. The
//! model still runs every step: only the choice of token is scripted.
//!
//! Options: `t0`..`tN-1`, contiguous from `t0` (a gap is an error, so a
//! typo cannot silently shorten the script). Every generation (every
//! `begin`) restarts the script.

/// The script and how far it has been played.
pub struct Script {
    tokens: Vec<u32>,
    next: usize,
}

impl Script {
    /// Reads `t0`, `t1`, ... from `options`; other names are errors.
    pub fn from_options(options: &[(String, f32)]) -> Result<Script, String> {
        let mut slots: Vec<Option<u32>> = Vec::new();
        for (name, value) in options {
            let index: usize = name
                .strip_prefix('t')
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| format!("script: unknown option {name:?} (expected t0, t1, ...)"))?;
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
        let tokens = slots
            .iter()
            .enumerate()
            .map(|(i, t)| t.ok_or_else(|| format!("script: t{i} is missing")))
            .collect::<Result<Vec<u32>, String>>()?;
        Ok(Script { tokens, next: 0 })
    }

    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, String> {
        if let Some(&t) = self.tokens.get(self.next) {
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

        fn sample(logits: Vec<f32>, _recent: Vec<u32>) -> Result<u32, String> {
            STATE.with(|s| match s.borrow_mut().as_mut() {
                Some(script) => script.sample(&logits),
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
        let got: Vec<u32> = (0..5).map(|_| s.sample(&logits).unwrap()).collect();
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
        assert!(s.sample(&[0.0; 10]).is_err());
    }

    #[test]
    fn an_empty_script_is_greedy() {
        let mut s = Script::from_options(&[]).unwrap();
        assert_eq!(s.sample(&[1.0, f32::NAN, 5.0, 5.0]), Ok(2));
    }
}
