//! Choosing what to propose from a trie: the greedy most-frequent path after the context's
//! best-scoring suffix, or, where the host verifies trees, the likeliest continuations after
//! it.
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
//! Where the host takes trees (`tree::max_paths() > 1`), the proposal is the paper's
//! speculation tree from the same suffix node: the nodes below it with the highest path
//! probabilities (best first, each child's probability its parent's times its share of the
//! parent's count), within `max_draft_len` tokens, `cap(m)` tokens deep, the host's paths and
//! `min_token_prob`; laid out depth first with each node's likeliest child first, so the greedy
//! path leads.
//!
//! Not here: finding the suffix nodes (the session keeps them current as tokens are fed).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use spechost_sdk::tree::{self, Branch};
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
    /// Most paths a proposal may have (`tree::max_paths`); 1: a chain.
    pub(crate) max_paths: usize,
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

/// A proposal and, when it is a tree, the row each token continues (empty for a chain).
pub(crate) type Speculation = (Proposal, Vec<u32>);

/// The tokens of `choice`, with their path probabilities as confidence: its greedy path, or its
/// speculation tree when the host takes several paths.
pub(crate) fn proposal(
    trie: &Trie,
    choice: &Choice,
    limits: &Limits,
    facts: &ModelFacts,
) -> Speculation {
    let cap = limits.cap(choice.match_len);
    if limits.max_paths > 1 {
        return tree(trie, choice.start, cap, limits, facts);
    }
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
    (proposal, Vec::new())
}

/// A node taken into a speculation tree.
struct Taken {
    node: NodeId,
    /// Index of its parent in the taken nodes; `None` under the start node.
    parent: Option<usize>,
    probability: f64,
}

/// A node that may join a speculation tree, ordered by path probability (the bits of a
/// non-negative `f64` order as it does), then by the order candidates were found in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Candidate {
    probability_bits: u64,
    found: Reverse<usize>,
    node: NodeId,
    /// Index of its parent among the taken nodes; `None` under the start node.
    parent: Option<usize>,
    depth: usize,
}

/// The speculation tree below `start`: the likeliest nodes at most `cap` deep, within
/// `limits` (see the module docs), laid out depth first, likeliest child first.
fn tree(
    trie: &Trie,
    start: NodeId,
    cap: usize,
    limits: &Limits,
    facts: &ModelFacts,
) -> Speculation {
    let mut candidates: BinaryHeap<Candidate> = BinaryHeap::new();
    let mut found = 0;
    let mut offer = |candidates: &mut BinaryHeap<Candidate>,
                     parent: NodeId,
                     from: Option<usize>,
                     probability: f64,
                     depth: usize| {
        if depth >= cap {
            return;
        }
        for child in trie.children(parent) {
            let share = (f64::from(trie.count(child)) / f64::from(trie.count(parent))).min(1.0);
            let probability = probability * share;
            if probability >= limits.min_token_prob && trie.token(child) != END_OF_TEXT {
                candidates.push(Candidate {
                    probability_bits: probability.to_bits(),
                    found: Reverse(found),
                    node: child,
                    parent: from,
                    depth: depth + 1,
                });
                found += 1;
            }
        }
    };
    offer(&mut candidates, start, None, 1.0, 0);
    let mut taken: Vec<Taken> = Vec::new();
    // Per taken node (and the start node, last): whether it has a child yet.
    let mut has_child = vec![false; limits.max_draft_len + 1];
    let mut paths = 1;
    while taken.len() < limits.max_draft_len {
        let Some(Candidate {
            probability_bits,
            node,
            parent,
            depth,
            ..
        }) = candidates.pop()
        else {
            break;
        };
        let slot = parent.unwrap_or(limits.max_draft_len);
        // A node's first child continues its path; another one starts a new path.
        if has_child[slot] && paths == limits.max_paths {
            continue;
        }
        paths += usize::from(has_child[slot]);
        has_child[slot] = true;
        let probability = f64::from_bits(probability_bits);
        taken.push(Taken {
            node,
            parent,
            probability,
        });
        // Generation stops at an end-of-generation token; drafting past it is wasted.
        if !facts.is_eog(trie.token(node)) {
            offer(
                &mut candidates,
                node,
                Some(taken.len() - 1),
                probability,
                depth,
            );
        }
    }
    lay_out(trie, &taken)
}

/// `taken` depth first from the start node, each node's children likeliest first (the earlier
/// taken on a tie): the proposal and each token's parent row (none for a chain).
fn lay_out(trie: &Trie, taken: &[Taken]) -> Speculation {
    let branches: Vec<Branch> = taken
        .iter()
        .map(|node| Branch {
            parent: node.parent,
            token: trie.token(node.node),
            probability: node.probability,
        })
        .collect();
    let all: Vec<usize> = (0..branches.len()).collect();
    tree::lay_out(&branches, &all)
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
            max_paths: 1,
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
