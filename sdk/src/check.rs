//! The proposal rules: [`check_proposal`], the one function that decides whether a proposal is
//! valid.
//!
//! The host calls it on every proposal a plugin returns (a broken rule is a fault), and
//! [`crate::testing::Harness`] calls it on every proposal a drafter makes in a unit test (a
//! broken rule fails the test), so the two can never disagree. Both sides turn a
//! [`ProposalError`] into their own message: the host names the plugin, the harness names the
//! rule to follow ([`ProposalError::rule`]).

use std::fmt;

use crate::records::Token;

/// The first rule a proposal breaks, with the values involved.
///
/// Its `Display` reads after the plugin's name: "proposed 12 tokens, at most 8 were asked for".
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ProposalError {
    /// More tokens than the host asked for.
    TooLong {
        /// Tokens in the proposal.
        n_tokens: usize,
        /// The most the host asked for.
        max_draft_len: usize,
    },
    /// A token id outside the target's vocabulary.
    OutOfVocabulary {
        /// The first such token.
        token: Token,
        /// Its index in the proposal.
        position: usize,
        /// [`ModelFacts::vocab_size`](crate::ModelFacts::vocab_size).
        vocab_size: u32,
    },
    /// A confidence list that is neither empty nor one value per token.
    ConfidenceCount {
        /// Values in the confidence list.
        n_confidence: usize,
        /// Tokens in the proposal.
        n_tokens: usize,
    },
    /// A confidence value outside `[0, 1]` (NaN included).
    ConfidenceOutOfRange {
        /// The first such value.
        value: f32,
        /// Its index in the confidence list.
        position: usize,
    },
}

impl ProposalError {
    /// The rule that was broken, as advice to the plugin's author.
    pub fn rule(&self) -> &'static str {
        match self {
            ProposalError::TooLong { .. } => "never return more than max_draft_len tokens",
            ProposalError::OutOfVocabulary { .. } => {
                "propose only token ids below ModelFacts::vocab_size"
            }
            ProposalError::ConfidenceCount { .. } => "give one confidence value per token, or none",
            ProposalError::ConfidenceOutOfRange { .. } => {
                "confidence values are probabilities, in [0, 1]"
            }
        }
    }
}

impl fmt::Display for ProposalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ProposalError::TooLong {
                n_tokens,
                max_draft_len,
            } => write!(
                f,
                "proposed {n_tokens} tokens, at most {max_draft_len} were asked for"
            ),
            ProposalError::OutOfVocabulary {
                token,
                position,
                vocab_size,
            } => write!(
                f,
                "proposed token {token} at position {position}, vocabulary has {vocab_size} tokens"
            ),
            ProposalError::ConfidenceCount {
                n_confidence,
                n_tokens,
            } => write!(
                f,
                "gave {n_confidence} confidence values for {n_tokens} tokens, must give none or \
                 one per token"
            ),
            ProposalError::ConfidenceOutOfRange { value, position } => write!(
                f,
                "gave confidence {value} at position {position}, must be in [0,1]"
            ),
        }
    }
}

impl std::error::Error for ProposalError {}

/// Checks a proposal of `tokens` with `confidence` against a request for at most
/// `max_draft_len` tokens of a vocabulary of `vocab_size`: the rules of the WIT's `proposal`
/// record.
///
/// A proposal is valid when it has at most `max_draft_len` tokens, every token is below
/// `vocab_size`, and `confidence` is either empty or one value in `[0, 1]` per token. An empty
/// proposal is always valid. The error is the first rule broken, in that order.
///
/// ```
/// use spechost_sdk::{ProposalError, check_proposal};
///
/// assert_eq!(check_proposal(&[5, 6], &[0.9, 0.4], 8, 100), Ok(()));
/// assert_eq!(
///     check_proposal(&[5, 100], &[], 8, 100),
///     Err(ProposalError::OutOfVocabulary { token: 100, position: 1, vocab_size: 100 })
/// );
/// ```
pub fn check_proposal(
    tokens: &[Token],
    confidence: &[f32],
    max_draft_len: usize,
    vocab_size: u32,
) -> Result<(), ProposalError> {
    let n_tokens = tokens.len();
    if n_tokens > max_draft_len {
        return Err(ProposalError::TooLong {
            n_tokens,
            max_draft_len,
        });
    }
    if let Some((position, &token)) = tokens
        .iter()
        .enumerate()
        .find(|&(_, &token)| token >= vocab_size)
    {
        return Err(ProposalError::OutOfVocabulary {
            token,
            position,
            vocab_size,
        });
    }
    let n_confidence = confidence.len();
    if n_confidence != 0 && n_confidence != n_tokens {
        return Err(ProposalError::ConfidenceCount {
            n_confidence,
            n_tokens,
        });
    }
    if let Some((position, &value)) = confidence
        .iter()
        .enumerate()
        .find(|&(_, value)| !(0.0..=1.0).contains(value))
    {
        return Err(ProposalError::ConfidenceOutOfRange { value, position });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A case: its name, the proposal's tokens and confidence, the `max_draft_len` asked for,
    /// and the verdict (the fault's text when a rule is broken).
    type Case = (
        &'static str,
        &'static [Token],
        &'static [f32],
        usize,
        Result<(), &'static str>,
    );

    /// The one table of proposal cases: what the host faults and the harness fails on.
    #[test]
    fn every_rule_accepts_and_refuses_what_it_should() {
        const VOCAB_SIZE: u32 = 10;
        #[rustfmt::skip]
        let cases: &[Case] = &[
            ("empty, nothing asked", &[], &[], 0, Ok(())),
            ("empty", &[], &[], 8, Ok(())),
            ("as long as asked", &[1, 9], &[], 2, Ok(())),
            ("shorter than asked", &[9], &[], 8, Ok(())),
            ("confidence at both ends of [0, 1]", &[1, 2], &[1.0, 0.0], 2, Ok(())),
            ("negative zero confidence", &[1], &[-0.0], 2, Ok(())),
            ("too long",
                &[1, 2, 3], &[], 2, Err("proposed 3 tokens, at most 2 were asked for")),
            ("anything when nothing was asked",
                &[1], &[], 0, Err("proposed 1 tokens, at most 0 were asked for")),
            ("10 000 tokens",
                &[0; 10_000], &[], 8, Err("proposed 10000 tokens, at most 8 were asked for")),
            ("too long and out of vocabulary: length first",
                &[10, 10, 10], &[], 2, Err("proposed 3 tokens, at most 2 were asked for")),
            ("the vocabulary size itself",
                &[5, 10], &[], 8,
                Err("proposed token 10 at position 1, vocabulary has 10 tokens")),
            ("u32::MAX",
                &[u32::MAX], &[], 8,
                Err("proposed token 4294967295 at position 0, vocabulary has 10 tokens")),
            ("fewer confidence values than tokens",
                &[1, 2], &[0.5], 8,
                Err("gave 1 confidence values for 2 tokens, must give none or one per token")),
            ("more confidence values than tokens",
                &[1], &[0.5, 0.5], 8,
                Err("gave 2 confidence values for 1 tokens, must give none or one per token")),
            ("confidence without tokens",
                &[], &[0.5], 8,
                Err("gave 1 confidence values for 0 tokens, must give none or one per token")),
            ("NaN confidence",
                &[1], &[f32::NAN], 8, Err("gave confidence NaN at position 0, must be in [0,1]")),
            ("negative confidence",
                &[1, 2], &[0.5, -1.0], 8,
                Err("gave confidence -1 at position 1, must be in [0,1]")),
            ("confidence above one",
                &[1], &[7.0], 8, Err("gave confidence 7 at position 0, must be in [0,1]")),
            ("infinite confidence",
                &[1], &[f32::INFINITY], 8,
                Err("gave confidence inf at position 0, must be in [0,1]")),
        ];
        for &(case, tokens, confidence, max_draft_len, expected) in cases {
            let checked = check_proposal(tokens, confidence, max_draft_len, VOCAB_SIZE);
            let message = checked.map_err(|error| error.to_string());
            assert_eq!(
                message.as_ref().map_err(String::as_str).copied(),
                expected,
                "{case}: {} tokens, confidence {confidence:?}, max_draft_len {max_draft_len}",
                tokens.len()
            );
        }
    }
}
