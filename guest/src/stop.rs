//! Stop strings over streamed text: the text of each token is passed
//! through a gate that holds back whatever could still become the start of a
//! stop string, so a stop string split across tokens still fires and none of
//! it is ever emitted.

#[derive(Debug, Default)]
pub struct StopGate {
    stops: Vec<String>,
    held: String,
}

/// What the gate let through for one piece of text.
#[derive(Debug, PartialEq, Eq)]
pub struct Gated {
    /// Text that can no longer be part of a stop string.
    pub text: String,
    /// A stop string was completed; `text` ends right before it.
    pub stopped: bool,
}

/// Longest stop string accepted; a longer one is almost certainly a mistake
/// and would make the gate hold back that much text.
pub const MAX_STOP_BYTES: usize = 1024;
/// Most stop strings per request.
pub const MAX_STOPS: usize = 64;

impl StopGate {
    pub fn new(stops: &[String]) -> Result<StopGate, String> {
        if stops.len() > MAX_STOPS {
            return Err(format!("at most {MAX_STOPS} stop strings, got {}", stops.len()));
        }
        for s in stops {
            if s.is_empty() {
                return Err("a stop string is empty".into());
            }
            if s.len() > MAX_STOP_BYTES {
                return Err(format!("a stop string is {} bytes long, more than the {MAX_STOP_BYTES} allowed", s.len()));
            }
        }
        Ok(StopGate { stops: stops.to_vec(), held: String::new() })
    }

    pub fn push(&mut self, text: &str) -> Gated {
        if self.stops.is_empty() {
            return Gated { text: text.to_string(), stopped: false };
        }
        self.held.push_str(text);
        // The earliest stop string wins: everything from it on is dropped.
        let hit = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min();
        if let Some(at) = hit {
            let out = self.held[..at].to_string();
            self.held.clear();
            return Gated { text: out, stopped: true };
        }
        // Hold the longest suffix that is a proper prefix of a stop string.
        let keep_from = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.held.len());
        let out = self.held[..keep_from].to_string();
        self.held.drain(..keep_from);
        Gated { text: out, stopped: false }
    }

    /// The end of the stream: what was held back could not complete a stop
    /// string after all.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(stops: &[&str]) -> StopGate {
        StopGate::new(&stops.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn stop_string_split_across_pieces_fires_and_is_not_emitted() {
        let mut g = gate(&["\nUser:"]);
        assert_eq!(g.push("Hello"), Gated { text: "Hello".into(), stopped: false });
        assert_eq!(g.push(" there\nU"), Gated { text: " there".into(), stopped: false });
        assert_eq!(g.push("se"), Gated { text: "".into(), stopped: false });
        assert_eq!(g.push("r: more"), Gated { text: "".into(), stopped: true });
    }

    #[test]
    fn held_text_is_released_when_it_stops_matching() {
        let mut g = gate(&["abc"]);
        assert_eq!(g.push("xa").text, "x");
        assert_eq!(g.push("ab").text, "a");
        assert_eq!(g.push("d").text, "abd");
        assert_eq!(g.push("ab").text, "");
        assert_eq!(g.finish(), "ab");
    }

    #[test]
    fn text_before_the_stop_in_the_same_piece_is_emitted() {
        let mut g = gate(&["END", "STOP"]);
        assert_eq!(g.push("one STOP two END"), Gated { text: "one ".into(), stopped: true });
    }

    #[test]
    fn multibyte_text_is_held_on_character_boundaries() {
        let mut g = gate(&["€x"]);
        assert_eq!(g.push("é€").text, "é");
        assert_eq!(g.push("x"), Gated { text: "".into(), stopped: true });
    }

    #[test]
    fn no_stops_passes_everything_through() {
        let mut g = gate(&[]);
        assert_eq!(g.push("abc"), Gated { text: "abc".into(), stopped: false });
    }

    #[test]
    fn bad_stop_strings_are_errors() {
        assert!(StopGate::new(&["".to_string()]).is_err());
        assert!(StopGate::new(&["x".repeat(MAX_STOP_BYTES + 1)]).is_err());
        assert!(StopGate::new(&vec!["a".to_string(); MAX_STOPS + 1]).is_err());
    }
}
