//! Choosing what to propose from a trie: the greedy most-frequent path after the context's
//! best-scoring suffix.
//!
//! For each suffix of the context that the trie holds (match length `m`, longest first), walk
//! from its node to the child with the highest count, again and again. Each step's probability
//! is `count(child) / count(node)`, the node's occurrence at the end of a text that goes on (the
//! context, a response being generated) included though nothing follows it yet, as the reference
//! implementation counts: a string seen once or twice before is discounted, where one seen
//! often barely is. The path probability is the product of the steps so far.
//! The walk stops before a token whose path probability would fall below `min_token_prob`,
//! after `cap(m) = min(max_draft_len, floor(alpha * m + beta))` tokens, after an end-of-generation
//! token, and where the trie ends. A path's score is the sum of its tokens' path probabilities
//! (the expected number of accepted tokens, if the counts were the truth); the highest score
//! wins, and between equal scores the longer match.
//!
//! The paper's drafter can propose a tree of continuations; a spechost proposal is one
//! sequence, so this is its single-path variant.
//!
//! Not here: finding the suffix nodes (the session keeps them current as tokens are fed).

use spechost_sdk::{ModelFacts, Proposal, Token};

use crate::trie::{END_OF_TEXT, NO_NODE, NodeId, Trie};

/// How long a path may get and how improbable its tokens may be.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Limits {
    /// The host's `max_draft_len` for this proposal.
    pub(crate) max_draft_len: usize,
    /// Lowest path probability a proposed token may have.
    pub(crate) min_token_prob: f64,
    /// Tokens proposed per token of match.
    pub(crate) alpha: f64,
    /// Tokens proposed on top of `alpha * m`.
    pub(crate) beta: f64,
}

impl Limits {
    /// Most tokens a match of `match_len` tokens may propose.
    ///
    /// Never grows as `match_len` shrinks, since `alpha >= 0`: [`best_path`] relies on it.
    pub(crate) fn cap(&self, match_len: usize) -> usize {
        // `alpha * m + beta` can land just below a whole number it means (0.29 * 100 is
        // 28.999999999999996 in binary); nudge it up by far less than any intended fraction.
        const ROUNDING_SLACK: f64 = 1e-9;
        let cap = (self.alpha * match_len as f64 + self.beta + ROUNDING_SLACK).floor();
        if cap <= 0.0 {
            0
        } else {
            // Saturates for huge values, and `max_draft_len` bounds it anyway.
            (cap as usize).min(self.max_draft_len)
        }
    }
}

/// The best path found in one trie: where it starts and how good it is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Choice {
    /// Node of the matched suffix.
    pub(crate) start: NodeId,
    /// Length of the matched suffix, `m`.
    pub(crate) match_len: usize,
    /// Sum of the path probabilities of its tokens.
    pub(crate) score: f64,
}

impl Choice {
    /// Whether `self` beats `other`: a higher score, or an equal score from a longer match.
    pub(crate) fn beats(&self, other: &Choice) -> bool {
        (self.score, self.match_len) > (other.score, other.match_len)
    }
}

/// The highest-scoring greedy path from any of the suffix nodes in `matches` (`matches[m]` for
/// match length `m`; index 0, the root, is never used), or `None` if none proposes a token.
pub(crate) fn best_path(
    trie: &Trie,
    matches: &[NodeId],
    limits: &Limits,
    facts: &ModelFacts,
) -> Option<Choice> {
    let mut best: Option<Choice> = None;
    for match_len in (1..matches.len()).rev() {
        let start = matches[match_len];
        if start == NO_NODE {
            continue;
        }
        let cap = limits.cap(match_len);
        // A path scores at most one per token, and shorter matches have no larger caps, so
        // none of them can beat `best` any more.
        if best.is_some_and(|best| best.score >= cap as f64) {
            break;
        }
        let (len, score) = walk(trie, start, match_len, cap, limits, facts, |_, _| {});
        let choice = Choice {
            start,
            match_len,
            score,
        };
        // Longest match first, so an equal score never replaces the longer match.
        if len > 0 && best.is_none_or(|best| score > best.score) {
            best = Some(choice);
        }
    }
    best
}

/// The tokens of `choice`, with their path probabilities as confidence.
pub(crate) fn proposal(
    trie: &Trie,
    choice: &Choice,
    limits: &Limits,
    facts: &ModelFacts,
) -> Proposal {
    let cap = limits.cap(choice.match_len);
    let mut proposal = Proposal::empty();
    walk(
        trie,
        choice.start,
        choice.match_len,
        cap,
        limits,
        facts,
        |token, probability| {
            proposal.tokens.push(token);
            // Rounding to `f32` cannot leave [0, 1].
            proposal.confidence.push(probability as f32);
        },
    );
    proposal
}

/// Follows best children from `start` (at `depth`) for at most `cap` tokens, calling
/// `emit(token, path_probability)` for each; returns the tokens walked and their score.
fn walk(
    trie: &Trie,
    start: NodeId,
    depth: usize,
    cap: usize,
    limits: &Limits,
    facts: &ModelFacts,
    mut emit: impl FnMut(Token, f64),
) -> (usize, f64) {
    let (mut node, mut depth) = (start, depth);
    let (mut len, mut score, mut probability) = (0, 0.0, 1.0);
    while len < cap {
        let child = trie.best_child(node);
        if child == NO_NODE {
            break;
        }
        let token = trie.token(child);
        if token == END_OF_TEXT {
            break;
        }
        // A child never counts more than its parent; `min` guards the confidence range all
        // the same.
        probability *= (f64::from(trie.count(child)) / f64::from(trie.count(node))).min(1.0);
        if probability < limits.min_token_prob {
            break;
        }
        emit(token, probability);
        len += 1;
        score += probability;
        // Generation stops at an end-of-generation token; drafting past it is wasted.
        if facts.is_eog(token) {
            break;
        }
        (node, depth) = (child, depth + 1);
    }
    (len, score)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_draft_len: usize, alpha: f64, beta: f64) -> Limits {
        Limits {
            max_draft_len,
            min_token_prob: 0.0,
            alpha,
            beta,
        }
    }

    #[test]
    fn cap_is_alpha_times_match_plus_beta_floored_and_bounded_by_max_draft_len() {
        assert_eq!(limits(16, 1.0, 0.0).cap(5), 5);
        assert_eq!(limits(4, 1.0, 0.0).cap(5), 4);
        assert_eq!(limits(16, 0.5, 0.0).cap(5), 2);
        assert_eq!(limits(16, 0.5, 1.0).cap(5), 3);
        assert_eq!(limits(16, 0.0, 2.0).cap(9), 2);
        assert_eq!(limits(16, 1.0, -3.0).cap(2), 0);
        assert_eq!(limits(1000, 0.29, 0.0).cap(100), 29, "binary rounding");
        assert_eq!(limits(usize::MAX, 1e30, 0.0).cap(3), usize::MAX);
    }

    #[test]
    fn ties_in_score_go_to_the_longer_match() {
        let short = Choice {
            start: 1,
            match_len: 2,
            score: 1.5,
        };
        let long = Choice {
            match_len: 3,
            ..short
        };
        assert!(long.beats(&short));
        assert!(!short.beats(&long));
        let better = Choice {
            score: 1.6,
            ..short
        };
        assert!(better.beats(&long));
    }
}
