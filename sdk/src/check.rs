//! The proposal rules: [`check_proposal`], the one function that decides whether a proposal is
//! valid, and [`check_tree`], whether a tree proposal's shape fits it.
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
    /// A tree shape without one parent per token.
    TreeParentCount {
        /// Parents in the shape.
        n_parents: usize,
        /// Tokens in the proposal.
        n_tokens: usize,
    },
    /// A token whose parent row is not before it (`parent > position`).
    TreeParentNotBefore {
        /// The token's index in the proposal.
        position: usize,
        /// The row it names as its parent.
        parent: u32,
    },
    /// Two children of one row with the same token: the second could never be accepted.
    TreeRepeatedSibling {
        /// The second one's index in the proposal.
        position: usize,
        /// The token both hold.
        token: Token,
    },
    /// More paths (leaves) than the host takes ([`crate::tree::max_paths`]).
    TreeTooManyPaths {
        /// Paths in the tree.
        paths: usize,
        /// The most the host takes.
        max_paths: usize,
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
            ProposalError::TreeParentCount { .. } => "give a tree one parent per token",
            ProposalError::TreeParentNotBefore { .. } => {
                "list a tree's tokens after their parents: parents[i] <= i"
            }
            ProposalError::TreeRepeatedSibling { .. } => {
                "merge continuations that share a token under the same row"
            }
            ProposalError::TreeTooManyPaths { .. } => "keep a tree within tree::max_paths() paths",
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
            ProposalError::TreeParentCount {
                n_parents,
                n_tokens,
            } => write!(
                f,
                "shaped a tree with {n_parents} parents for {n_tokens} tokens, must give one per token"
            ),
            ProposalError::TreeParentNotBefore { position, parent } => write!(
                f,
                "shaped token {position} under row {parent}, which is not before it"
            ),
            ProposalError::TreeRepeatedSibling { position, token } => write!(
                f,
                "shaped token {position} ({token}) as a sibling holding the same token as another"
            ),
            ProposalError::TreeTooManyPaths { paths, max_paths } => write!(
                f,
                "shaped a tree of {paths} paths, at most {max_paths} are taken"
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

/// Checks the shape of a tree proposal of `tokens`: `parents[i]` is the row token `i`
/// continues (row 0 the last context token, row `j + 1` token `j`), as the WIT's `tree`
/// interface says. Valid when there is one parent per token, each row is before its children
/// (`parents[i] <= i`), no two children of a row hold the same token, and the tree has at most
/// `max_paths` leaves. The error is the first rule broken, in that order.
///
/// ```
/// use spechost_sdk::{ProposalError, check_tree};
///
/// // Two continuations after the first token: 5 6 and 5 7.
/// assert_eq!(check_tree(&[5, 6, 7], &[0, 1, 1], 2), Ok(()));
/// assert_eq!(
///     check_tree(&[5, 6, 7], &[0, 1, 1], 1),
///     Err(ProposalError::TreeTooManyPaths { paths: 2, max_paths: 1 })
/// );
/// ```
pub fn check_tree(
    tokens: &[Token],
    parents: &[u32],
    max_paths: usize,
) -> Result<(), ProposalError> {
    if parents.len() != tokens.len() {
        return Err(ProposalError::TreeParentCount {
            n_parents: parents.len(),
            n_tokens: tokens.len(),
        });
    }
    let mut has_child = vec![false; tokens.len() + 1];
    let mut paths = 1;
    for (position, (&parent, &token)) in parents.iter().zip(tokens).enumerate() {
        let row = parent as usize;
        if row > position {
            return Err(ProposalError::TreeParentNotBefore { position, parent });
        }
        let sibling =
            (0..position).any(|earlier| parents[earlier] == parent && tokens[earlier] == token);
        if sibling {
            return Err(ProposalError::TreeRepeatedSibling { position, token });
        }
        // A row's first child continues its path; every later one starts another.
        paths += usize::from(std::mem::replace(&mut has_child[row], true));
    }
    if paths > max_paths {
        return Err(ProposalError::TreeTooManyPaths { paths, max_paths });
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

    /// A tree case: its name, the tokens, their parents, the paths taken, and the verdict.
    type TreeCase = (
        &'static str,
        &'static [Token],
        &'static [u32],
        usize,
        Result<(), &'static str>,
    );

    #[test]
    fn tree_shapes_are_checked_rule_by_rule() {
        #[rustfmt::skip]
        let cases: &[TreeCase] = &[
            ("a chain", &[1, 2, 3], &[0, 1, 2], 1, Ok(())),
            ("empty", &[], &[], 1, Ok(())),
            ("two paths from the root", &[1, 2], &[0, 0], 2, Ok(())),
            ("one parent short", &[1, 2], &[0], 2,
                Err("shaped a tree with 1 parents for 2 tokens, must give one per token")),
            ("a parent after its child", &[1, 2], &[0, 2], 2,
                Err("shaped token 1 under row 2, which is not before it")),
            ("twins", &[1, 1], &[0, 0], 2,
                Err("shaped token 1 (1) as a sibling holding the same token as another")),
            ("too many paths", &[1, 2, 3], &[0, 0, 0], 2,
                Err("shaped a tree of 3 paths, at most 2 are taken")),
        ];
        for &(case, tokens, parents, max_paths, expected) in cases {
            let checked = check_tree(tokens, parents, max_paths).map_err(|e| e.to_string());
            assert_eq!(
                checked.as_ref().map_err(String::as_str).copied(),
                expected,
                "{case}"
            );
        }
    }
}
