//! Turning committed tokens into streamed text: UTF-8 reassembly and stop strings.

/// Stop strings of a request: generation ends before the first occurrence of any of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopStrings(Vec<String>);

impl StopStrings {
    /// Stop strings from a list; empty strings are ignored.
    pub fn new(strings: impl IntoIterator<Item = String>) -> Self {
        Self(strings.into_iter().filter(|s| !s.is_empty()).collect())
    }

    /// Earliest position in `text` where a stop string starts, if any.
    fn find(&self, text: &str) -> Option<usize> {
        self.0.iter().filter_map(|s| text.find(s.as_str())).min()
    }

    /// Length of the longest suffix of `text` that is a proper prefix of a stop string: text
    /// that must be held back because the next token may complete a stop string.
    fn partial_suffix(&self, text: &str) -> usize {
        let mut longest = 0;
        for stop in &self.0 {
            for (start, _) in text.char_indices() {
                let tail = &text[start..];
                if tail.len() > longest && tail.len() < stop.len() && stop.starts_with(tail) {
                    longest = tail.len();
                }
            }
        }
        longest
    }
}

/// Accumulates token bytes and releases text that is complete UTF-8 and cannot be part of a
/// stop string.
#[derive(Debug, Default)]
pub(super) struct TextStream {
    stops: StopStrings,
    /// Bytes of an incomplete UTF-8 character.
    bytes: Vec<u8>,
    /// Decoded text not yet released.
    held: String,
}

/// What pushing one token's bytes released.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Released {
    /// Text safe to show.
    pub text: String,
    /// Whether a stop string was found (the text ends right before it).
    pub stopped: bool,
}

impl TextStream {
    pub(super) fn new(stops: StopStrings) -> Self {
        Self {
            stops,
            ..Self::default()
        }
    }

    /// Adds the bytes of one token and returns what can be shown now.
    pub(super) fn push(&mut self, piece: &[u8]) -> Released {
        self.bytes.extend_from_slice(piece);
        let valid = match std::str::from_utf8(&self.bytes) {
            Ok(_) => self.bytes.len(),
            Err(e) if e.error_len().is_some() => self.bytes.len(), // invalid: replace below
            Err(e) => e.valid_up_to(),
        };
        let rest = self.bytes.split_off(valid);
        self.held.push_str(&String::from_utf8_lossy(&self.bytes));
        self.bytes = rest;
        if let Some(at) = self.stops.find(&self.held) {
            self.held.truncate(at);
            return Released {
                text: std::mem::take(&mut self.held),
                stopped: true,
            };
        }
        let keep = self.stops.partial_suffix(&self.held);
        let text = self.held[..self.held.len() - keep].to_owned();
        self.held.drain(..self.held.len() - keep);
        Released {
            text,
            stopped: false,
        }
    }

    /// Releases everything still held at the end of generation.
    pub(super) fn finish(&mut self) -> String {
        let mut text = std::mem::take(&mut self.held);
        text.push_str(&String::from_utf8_lossy(&std::mem::take(&mut self.bytes)));
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(stops: &[&str]) -> TextStream {
        TextStream::new(StopStrings::new(stops.iter().map(|s| s.to_string())))
    }

    #[test]
    fn joins_utf8_split_across_tokens() {
        let mut s = stream(&[]);
        let euro = "€".as_bytes();
        assert_eq!(s.push(&euro[..1]).text, "");
        assert_eq!(s.push(&euro[1..]).text, "€");
    }

    #[test]
    fn holds_back_possible_stop_prefix_then_stops() {
        let mut s = stream(&["\n\nUser:"]);
        assert_eq!(s.push(b"Hello\n").text, "Hello");
        assert_eq!(s.push(b"\nUs").text, "");
        let released = s.push(b"er: hi");
        assert_eq!(
            released,
            Released {
                text: String::new(),
                stopped: true
            }
        );
    }

    #[test]
    fn releases_held_text_when_stop_does_not_follow() {
        let mut s = stream(&["END"]);
        assert_eq!(s.push(b"the EN").text, "the ");
        assert!(s.push(b"D").stopped);
        let mut s = stream(&["END"]);
        assert_eq!(s.push(b"the EN").text, "the ");
        assert_eq!(s.push(b"ough").text, "ENough");
        assert_eq!(s.finish(), "");
    }
}
