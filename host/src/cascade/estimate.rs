//! How many tokens of a proposal the target is expected to accept.
//!
//! A source that gives confidences says it directly: `confidence[i]` is its probability that
//! the draft is accepted up to and including token `i`, so the expected accepted length is their
//! sum. For a source that gives none, [`PositionAcceptance`] learns, per draft position, how
//! often the target agreed with the source at that position given it agreed at every earlier
//! one, from every proposal that could be checked: the verified one, and unverified ones (losing
//! or shadow proposals) compared with the tokens the target committed.

use super::source::{Proposal, Token};

/// Per-position conditional acceptance of one source, with a uniform prior.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PositionAcceptance {
    /// `compared[j]`: proposals whose position `j` was checked (all earlier ones matched).
    compared: Vec<u64>,
    /// `matched[j]`: of those, proposals whose position `j` matched.
    matched: Vec<u64>,
}

impl PositionAcceptance {
    /// Records a proposal of `drafted` tokens whose first `matched` tokens matched the target,
    /// where the target's tokens were known for the first `known` positions.
    pub fn record(&mut self, drafted: usize, matched: usize, known: usize) {
        let checked = drafted.min(known).min(matched + 1);
        if self.compared.len() < checked {
            self.compared.resize(checked, 0);
            self.matched.resize(checked, 0);
        }
        for position in 0..checked {
            self.compared[position] += 1;
            self.matched[position] += u64::from(position < matched);
        }
    }

    /// The estimated probability that position `j` matches given all earlier ones did: the
    /// posterior mean under a uniform prior, `(matched + 1) / (compared + 2)`.
    pub fn conditional(&self, position: usize) -> f64 {
        let compared = self.compared.get(position).copied().unwrap_or(0);
        let matched = self.matched.get(position).copied().unwrap_or(0);
        (matched as f64 + 1.0) / (compared as f64 + 2.0)
    }

    /// Expected accepted tokens of a proposal of `len` tokens with no confidences.
    pub fn expected_accepted(&self, len: usize) -> f64 {
        let mut survive = 1.0;
        let mut expected = 0.0;
        for position in 0..len {
            survive *= self.conditional(position);
            expected += survive;
        }
        expected
    }
}

/// Expected accepted tokens of `proposal`: the sum of its confidences when it has them, else
/// what `history` predicts for its length.
pub fn expected_accepted(proposal: &Proposal, history: &PositionAcceptance) -> f64 {
    if proposal.confidence.len() == proposal.tokens.len() && !proposal.tokens.is_empty() {
        proposal
            .confidence
            .iter()
            .map(|&c| f64::from(c).clamp(0.0, 1.0))
            .sum()
    } else {
        history.expected_accepted(proposal.tokens.len())
    }
}

/// Leading tokens of `proposal` equal to `truth`.
pub fn matching_prefix(proposal: &[Token], truth: &[Token]) -> usize {
    proposal
        .iter()
        .zip(truth)
        .take_while(|(drafted, actual)| drafted == actual)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unseen_positions_are_even_odds() {
        let history = PositionAcceptance::default();
        assert!((history.conditional(3) - 0.5).abs() < 1e-12);
        assert!((history.expected_accepted(2) - (0.5 + 0.25)).abs() < 1e-12);
    }

    #[test]
    fn records_only_positions_that_were_checked() {
        let mut history = PositionAcceptance::default();
        // 4 drafted, 1 matched: positions 0 (match) and 1 (mismatch) were checked.
        history.record(4, 1, 10);
        // 4 drafted, all 2 known positions matched: censored after position 1.
        history.record(4, 2, 2);
        assert_eq!(history.compared, vec![2, 2], "seen {history:?}");
        assert_eq!(history.matched, vec![2, 1], "seen {history:?}");
        assert!((history.conditional(0) - 3.0 / 4.0).abs() < 1e-12);
        assert!((history.conditional(1) - 2.0 / 4.0).abs() < 1e-12);
    }

    #[test]
    fn confidences_win_over_history() {
        let proposal = Proposal {
            tokens: vec![1, 2, 3],
            confidence: vec![0.9, 0.8, 2.0],
        };
        let expected = expected_accepted(&proposal, &PositionAcceptance::default());
        assert!((expected - 2.7).abs() < 1e-6, "clamped sum, got {expected}");
        let bare = Proposal::from_tokens(vec![1, 2]);
        assert!((expected_accepted(&bare, &PositionAcceptance::default()) - 0.75).abs() < 1e-12);
    }

    #[test]
    fn matching_prefix_stops_at_first_difference() {
        assert_eq!(matching_prefix(&[1, 2, 3], &[1, 2, 4, 5]), 2);
        assert_eq!(matching_prefix(&[1, 2], &[1]), 1);
        assert_eq!(matching_prefix(&[], &[1]), 0);
    }
}
