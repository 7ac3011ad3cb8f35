//! Outputs no user would call an answer: a model that echoes its prompt (what a pretrained model
//! does with a chat request) or loops on itself. Prompt lookup predicts both trivially, so
//! counting them overstates what a user gets: `bench` flags each request on plain decoding's
//! output, shows their share per workload and leaves them out of headline figures (they stay in
//! `requests.csv`).

use serde::Serialize;

use crate::cascade::Token;

/// Words of the prompt's opening that an output must repeat, in order, to be an echo.
pub const ECHO_WORDS: usize = 8;
/// Fewest words an opening needs for the echo check: shorter ones occur in real answers.
const MIN_ECHO_WORDS: usize = 4;
/// A loop is a block of tokens repeated back to back at least this many times...
pub const LOOP_REPEATS: usize = 3;
/// ...over at least this many tokens in all.
pub const LOOP_MIN_TOKENS: usize = 32;

/// Why an output is not an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Degeneracy {
    /// It repeats the first [`ECHO_WORDS`] words of the prompt's opening verbatim.
    Echo,
    /// A block of tokens repeats back to back, [`LOOP_REPEATS`] times or more over at least
    /// [`LOOP_MIN_TOKENS`] tokens.
    Loop,
}

impl Degeneracy {
    /// `echo` or `loop`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Echo => "echo",
            Self::Loop => "loop",
        }
    }
}

/// Whether an output (`text` and its `tokens`) is degenerate, for a request whose prompt opens
/// with `opening` (the first user message of a chat request, a raw prompt's text).
pub fn check(opening: &str, text: &str, tokens: &[Token]) -> Option<Degeneracy> {
    if echoes(opening, text) {
        Some(Degeneracy::Echo)
    } else if loops(tokens) {
        Some(Degeneracy::Loop)
    } else {
        None
    }
}

/// Whether `text` holds the first [`ECHO_WORDS`] words of `opening` in a row (whitespace
/// between them may differ).
fn echoes(opening: &str, text: &str) -> bool {
    let opening: Vec<&str> = opening.split_whitespace().take(ECHO_WORDS).collect();
    if opening.len() < MIN_ECHO_WORDS {
        return false;
    }
    let words: Vec<&str> = text.split_whitespace().collect();
    words
        .windows(opening.len())
        .any(|window| window == opening.as_slice())
}

/// Whether some block of `tokens` repeats back to back [`LOOP_REPEATS`] times or more, over at
/// least [`LOOP_MIN_TOKENS`] tokens, anywhere in the output.
fn loops(tokens: &[Token]) -> bool {
    let longest_period = tokens.len() / LOOP_REPEATS;
    (1..=longest_period).any(|period| {
        let needed = (LOOP_REPEATS * period).max(LOOP_MIN_TOKENS);
        // `run` counts positions equal to the token `period` before them, back to back; a
        // block repeated `r` times spans `run + period` tokens.
        let mut run = 0;
        for i in period..tokens.len() {
            if tokens[i] == tokens[i - period] {
                run += 1;
                if run + period >= needed {
                    return true;
                }
            } else {
                run = 0;
            }
        }
        false
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPENING: &str =
        "Add type hints to this function:\n\ndef area(width, height):\n    return width * height";

    #[test]
    fn an_echo_of_the_prompt_is_flagged() {
        // What the pretrained Gemma does with a chat request: the instruction, again.
        let echo = "Add type hints to this function:\ndef area(width, height):\n    return width * height\n\nAdd type";
        let tokens: Vec<Token> = (0..40).collect();
        assert_eq!(check(OPENING, echo, &tokens), Some(Degeneracy::Echo));
    }

    #[test]
    fn an_answer_that_copies_the_code_but_not_the_opening_passes() {
        let answer = "def area(width: float, height: float) -> float:\n    return width * height";
        let tokens: Vec<Token> = (0..40).collect();
        assert_eq!(check(OPENING, answer, &tokens), None);
    }

    #[test]
    fn a_short_opening_never_makes_an_echo() {
        assert!(!echoes("Say hi", "Say hi"));
    }

    #[test]
    fn a_loop_is_flagged_wherever_it_is() {
        let block = [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17];
        let mut tokens: Vec<Token> = (100..130).collect();
        for _ in 0..3 {
            tokens.extend(block);
        }
        tokens.extend(200..230);
        assert_eq!(check(OPENING, "text", &tokens), Some(Degeneracy::Loop));
        // One token repeated 32 times is a loop too.
        assert!(loops(&[5; LOOP_MIN_TOKENS]));
        assert!(!loops(&[5; LOOP_MIN_TOKENS - 1]));
    }

    #[test]
    fn a_short_repetition_is_not_a_loop() {
        // "green pear, red apple, green pear, red apple": twice, as asked.
        let mut tokens: Vec<Token> = (0..20).collect();
        tokens.extend([1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6]);
        tokens.extend(300..340);
        assert_eq!(check(OPENING, "green pear", &tokens), None);
        // Two copies of a long block are not three.
        let block: Vec<Token> = (0..30).collect();
        let twice = [block.as_slice(), &block].concat();
        assert!(!loops(&twice));
    }
}
