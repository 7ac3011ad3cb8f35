//! Turning committed tokens into streamed text: UTF-8 reassembly and stop strings.
//!
//! Stop strings are matched incrementally: each stop string keeps a Knuth-Morris-Pratt state
//! (how much of it the text so far ends with), advanced once per new byte, so a token costs
//! time in proportion to its own bytes times the number of stop strings, never to the length
//! of the text or of the stop strings. The same states say how much text to hold back: the
//! longest partial match.

/// Most stop strings a request may give (OpenAI allows 4; llama.cpp any number).
pub const MAX_STOP_STRINGS: usize = 16;
/// Longest stop string, in bytes.
pub const MAX_STOP_STRING_BYTES: usize = 1024;

/// Why a list of stop strings was refused; each message names the limit to stay within.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StopStringsError {
    /// More than [`MAX_STOP_STRINGS`].
    #[error("at most {MAX_STOP_STRINGS} stop strings, got {given}; drop some")]
    TooMany {
        /// How many were given.
        given: usize,
    },
    /// One longer than [`MAX_STOP_STRING_BYTES`].
    #[error(
        "stop string {index} is {bytes} bytes long; stop strings may be at most {MAX_STOP_STRING_BYTES} bytes"
    )]
    TooLong {
        /// Its position in the list, from 0.
        index: usize,
        /// Its length.
        bytes: usize,
    },
}

/// Stop strings of a request: generation ends before the first occurrence of any of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopStrings(Vec<String>);

impl StopStrings {
    /// Stop strings from a list; empty strings are ignored. At most [`MAX_STOP_STRINGS`], each
    /// at most [`MAX_STOP_STRING_BYTES`] long.
    pub fn new(strings: impl IntoIterator<Item = String>) -> Result<Self, StopStringsError> {
        let strings: Vec<String> = strings.into_iter().filter(|s| !s.is_empty()).collect();
        if strings.len() > MAX_STOP_STRINGS {
            return Err(StopStringsError::TooMany {
                given: strings.len(),
            });
        }
        if let Some((index, long)) = strings
            .iter()
            .enumerate()
            .find(|(_, s)| s.len() > MAX_STOP_STRING_BYTES)
        {
            return Err(StopStringsError::TooLong {
                index,
                bytes: long.len(),
            });
        }
        Ok(Self(strings))
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// One stop string and how much of it the text so far ends with.
#[derive(Debug, Clone)]
struct StopMatcher {
    pattern: Vec<u8>,
    /// `failure[i]`: the length of the longest proper prefix of `pattern[..=i]` that is also a
    /// suffix of it (KMP's failure function).
    failure: Vec<usize>,
    /// Bytes of `pattern` the text so far ends with (always < `pattern.len()` between bytes).
    matched: usize,
}

impl StopMatcher {
    fn new(pattern: &str) -> Self {
        let pattern = pattern.as_bytes().to_vec();
        let mut failure = vec![0; pattern.len()];
        let mut length = 0;
        for i in 1..pattern.len() {
            while length > 0 && pattern[i] != pattern[length] {
                length = failure[length - 1];
            }
            if pattern[i] == pattern[length] {
                length += 1;
            }
            failure[i] = length;
        }
        Self {
            pattern,
            failure,
            matched: 0,
        }
    }

    /// Takes one more byte of text; `true` when the text now ends with the whole pattern.
    fn advance(&mut self, byte: u8) -> bool {
        while self.matched > 0 && self.pattern[self.matched] != byte {
            self.matched = self.failure[self.matched - 1];
        }
        if self.pattern[self.matched] == byte {
            self.matched += 1;
        }
        if self.matched == self.pattern.len() {
            self.matched = self.failure[self.matched - 1];
            return true;
        }
        false
    }
}

/// Accumulates token bytes and releases text that is complete UTF-8 and cannot be part of a
/// stop string.
#[derive(Debug, Default)]
pub(super) struct TextStream {
    matchers: Vec<StopMatcher>,
    /// Bytes of an incomplete UTF-8 character.
    bytes: Vec<u8>,
    /// Decoded text not yet released: at most the longest partial match of a stop string.
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
            matchers: stops.0.iter().map(|stop| StopMatcher::new(stop)).collect(),
            ..Self::default()
        }
    }

    /// Adds the bytes of one token and returns what can be shown now. When stop strings
    /// complete inside this token's text, the text ends before the one that starts first.
    pub(super) fn push(&mut self, piece: &[u8]) -> Released {
        self.bytes.extend_from_slice(piece);
        let valid = match std::str::from_utf8(&self.bytes) {
            Ok(_) => self.bytes.len(),
            Err(e) if e.error_len().is_some() => self.bytes.len(), // invalid: replace below
            Err(e) => e.valid_up_to(),
        };
        let rest = self.bytes.split_off(valid);
        let new_text = String::from_utf8_lossy(&self.bytes).into_owned();
        self.bytes = rest;

        let mut stop_at: Option<usize> = None;
        for (offset, &byte) in new_text.as_bytes().iter().enumerate() {
            let end = self.held.len() + offset + 1;
            for matcher in &mut self.matchers {
                if matcher.advance(byte) {
                    let start = end - matcher.pattern.len();
                    stop_at = Some(stop_at.map_or(start, |earliest| earliest.min(start)));
                }
            }
        }
        self.held.push_str(&new_text);
        if let Some(at) = stop_at {
            self.held.truncate(at);
            return Released {
                text: std::mem::take(&mut self.held),
                stopped: true,
            };
        }
        // A partial match starts at a character boundary: it equals a prefix of a stop string,
        // which starts with a whole character.
        let keep = self.matchers.iter().map(|m| m.matched).max().unwrap_or(0);
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

    /// What a push that hit a stop string releases: `text`, the text before it.
    fn stopped(text: &str) -> Released {
        Released {
            text: text.to_owned(),
            stopped: true,
        }
    }

    fn stream(stops: &[&str]) -> TextStream {
        TextStream::new(StopStrings::new(stops.iter().map(|s| s.to_string())).expect("valid"))
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
        assert_eq!(released, stopped(""));
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

    #[test]
    fn the_stop_string_that_starts_first_wins_within_one_token() {
        let mut s = stream(&["cd", "abcdef"]);
        let released = s.push(b"xabcdefg");
        assert_eq!(released, stopped("x"));
        let mut s = stream(&["cd", "abcdef"]);
        assert_eq!(s.push(b"xab").text, "x", "`ab` may start either");
        assert!(s.push(b"c").text.is_empty());
        let released = s.push(b"d");
        assert_eq!(
            released,
            stopped("ab"),
            "`cd` completes first, one token at a time"
        );
    }

    #[test]
    fn self_overlapping_stop_strings_are_found() {
        // KMP's failure function: after `aab` fails at `aaa`, `aa` is still a partial match.
        let mut s = stream(&["aab"]);
        assert_eq!(s.push(b"aa").text, "");
        assert_eq!(s.push(b"a").text, "a");
        assert!(s.push(b"b").stopped);
        let mut s = stream(&["ababc"]);
        assert_eq!(
            s.push(b"ababa").text,
            "ab",
            "`aba` may still become `ababc`"
        );
        let released = s.push(b"bc");
        assert_eq!(released, stopped(""));
    }

    #[test]
    fn held_text_is_a_partial_match_of_multibyte_characters() {
        let mut s = stream(&["é!"]);
        assert_eq!(s.push("café".as_bytes()).text, "caf");
        assert_eq!(s.push(b" ").text, "é ");
        assert_eq!(s.finish(), "");
    }

    #[test]
    fn stop_strings_are_bounded_in_number_and_length() {
        let many = (0..=MAX_STOP_STRINGS).map(|i| format!("s{i}"));
        assert_eq!(
            StopStrings::new(many),
            Err(StopStringsError::TooMany {
                given: MAX_STOP_STRINGS + 1
            })
        );
        let long = "x".repeat(MAX_STOP_STRING_BYTES + 1);
        let error = StopStrings::new(["ok".to_owned(), long]).expect_err("too long");
        assert!(error.to_string().contains("at most 1024 bytes"), "{error}");
        let empty_ones = StopStrings::new(vec![String::new(); 100]).expect("empty ones dropped");
        assert!(empty_ones.is_empty());
    }

    #[test]
    fn long_partial_matches_are_held_then_released() {
        // Text that keeps matching most of a long stop string, one byte at a time (each push
        // advances the matcher by one byte instead of rescanning what is held).
        let stop = "ab".repeat(MAX_STOP_STRING_BYTES / 2 - 1) + "c";
        let mut s = stream(&[stop.as_str()]);
        let mut released = String::new();
        for i in 0..100_000 {
            released.push_str(&s.push(if i % 2 == 0 { b"a" } else { b"b" }).text);
        }
        released.push_str(&s.finish());
        assert_eq!(released.len(), 100_000, "everything released at the end");
    }
}
