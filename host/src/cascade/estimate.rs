//! How many tokens of a proposal the target is expected to accept, learned per source.
//!
//! A source that gives confidences says it directly: `confidence[i]` is its probability that
//! the draft is accepted up to and including token `i`, so the expected accepted length is their
//! sum. Sources are not equally honest about it (a suffix tree's path probabilities count how
//! often a continuation followed, not how often the target will agree), so
//! [`ConfidenceCalibration`] learns how often drafts of each stated confidence were really
//! accepted that far, and the sum is taken over those rates. For a source that gives none,
//! [`PositionAcceptance`] learns, per draft position, how often the target agreed with the
//! source at that position given it agreed at every earlier one.
//!
//! Both learn from every proposal that could be checked: the verified one, and unverified ones
//! (losing or shadow proposals) compared with the tokens the target committed. Both carry over
//! from request to request and forget old rounds geometrically ([`FORGET_AFTER`]), so a source
//! that does well on one kind of request and badly on the next is re-ranked within a few
//! hundred rounds.

use super::source::{Proposal, Token};
use super::tree::TreeShape;

/// Once this many observations are counted at a position or a confidence bin, its counts are
/// halved: older rounds weigh less, and estimates follow the workload.
pub const FORGET_AFTER: f64 = 256.0;
/// Confidence bins of [`ConfidenceCalibration`], equal widths over [0, 1].
const CONFIDENCE_BINS: usize = 10;
/// Pseudo-observations at the stated confidence in each bin: a source's own confidence is
/// trusted until a few of its drafts were checked.
const CONFIDENCE_PRIOR: f64 = 4.0;

/// Counts of checked predictions: how many were checked and how many came true, halved
/// together once [`FORGET_AFTER`] are counted.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Tally {
    checked: f64,
    hits: f64,
}

impl Tally {
    fn add(&mut self, hit: bool) {
        if self.checked >= FORGET_AFTER {
            self.checked /= 2.0;
            self.hits /= 2.0;
        }
        self.checked += 1.0;
        self.hits += f64::from(u8::from(hit));
    }

    /// The posterior mean rate given `prior` pseudo-observations of rate `prior_rate`.
    fn rate(&self, prior: f64, prior_rate: f64) -> f64 {
        (self.hits + prior * prior_rate) / (self.checked + prior)
    }
}

/// Per-position conditional acceptance of one source, with a uniform prior.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PositionAcceptance {
    /// `positions[j]`: proposals whose position `j` was checked (every earlier one matched),
    /// and how many of them matched there.
    positions: Vec<Tally>,
}

impl PositionAcceptance {
    /// Records a proposal of `drafted` tokens whose first `matched` tokens matched the target,
    /// where the target's tokens were known for the first `known` positions.
    pub fn record(&mut self, drafted: usize, matched: usize, known: usize) {
        let checked = drafted.min(known).min(matched + 1);
        if self.positions.len() < checked {
            self.positions.resize(checked, Tally::default());
        }
        for (position, tally) in self.positions[..checked].iter_mut().enumerate() {
            tally.add(position < matched);
        }
    }

    /// The estimated probability that position `j` matches given all earlier ones did: the
    /// posterior mean under a uniform prior, `(matched + 1) / (checked + 2)`.
    pub fn conditional(&self, position: usize) -> f64 {
        self.positions
            .get(position)
            .copied()
            .unwrap_or_default()
            .rate(2.0, 0.5)
    }

    /// The estimated probability that a proposal with no confidences is accepted through
    /// each of its first `len` tokens: the running product of the conditionals.
    pub fn survival(&self, len: usize) -> Vec<f64> {
        (0..len)
            .scan(1.0, |survive, position| {
                *survive *= self.conditional(position);
                Some(*survive)
            })
            .collect()
    }
}

/// How often one source's drafts were accepted up to a token it gave a confidence `c`, by bins
/// of `c`: a reliability table that turns stated confidences into measured ones.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConfidenceCalibration {
    /// `bins[b]`: tokens with a confidence in bin `b` whose fate is known, and how many of them
    /// were accepted (with every token before them).
    bins: [Tally; CONFIDENCE_BINS],
}

impl ConfidenceCalibration {
    /// Records a proposal with `confidence` per token whose first `matched` tokens matched the
    /// target, where the target's tokens were known for the first `known` positions. A token's
    /// fate is known when it matched, or when an earlier or the same position was seen to
    /// differ; the rest are censored and not counted.
    pub fn record(&mut self, confidence: &[f32], matched: usize, known: usize) {
        let mismatch_seen = matched < known.min(confidence.len());
        for (position, &stated) in confidence.iter().enumerate() {
            if position >= matched && !mismatch_seen {
                break;
            }
            self.bins[bin(stated)].add(position < matched);
        }
    }

    /// Records a tree proposal's tokens stated at `confidence` by their fates (`None`: not
    /// known), each token's confidence being the probability that the target accepts the path
    /// through it ([`tree_fates`]).
    pub fn record_fates(&mut self, confidence: &[f32], fates: &[Option<bool>]) {
        for (&stated, &fate) in confidence.iter().zip(fates) {
            if let Some(accepted) = fate {
                self.bins[bin(stated)].add(accepted);
            }
        }
    }

    /// The measured probability that a token stated at `confidence` is accepted, shrunk
    /// towards the statement while its bin has few observations.
    pub fn calibrated(&self, confidence: f32) -> f64 {
        self.bins[bin(confidence)].rate(CONFIDENCE_PRIOR, stated(confidence))
    }
}

/// A source's confidence as a probability: clamped to [0, 1], and 0 when it is not a number.
fn stated(confidence: f32) -> f64 {
    if confidence.is_finite() {
        f64::from(confidence).clamp(0.0, 1.0)
    } else {
        0.0
    }
}

/// The bin of a stated confidence.
fn bin(confidence: f32) -> usize {
    ((stated(confidence) * CONFIDENCE_BINS as f64) as usize).min(CONFIDENCE_BINS - 1)
}

/// What the cascade knows about one source's acceptance: by position for its proposals without
/// confidences, by stated confidence for those with (apart for the tokens of a tree off its
/// leading chain: a source's second choices need not be as honest as its first).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AcceptanceHistory {
    by_position: PositionAcceptance,
    by_confidence: ConfidenceCalibration,
    off_spine: ConfidenceCalibration,
}

impl AcceptanceHistory {
    /// Records `proposal`, whose first `matched` tokens matched the target's tokens, known for
    /// its first `known` positions (a chain: a tree goes to [`Self::record_tree`]).
    pub fn record(&mut self, proposal: &Proposal, matched: usize, known: usize) {
        let drafted = proposal.tokens.len();
        self.by_position.record(drafted, matched, known);
        if has_confidences(proposal) {
            self.by_confidence
                .record(&proposal.confidence, matched, known);
        }
    }

    /// Records a tree `proposal` against the tokens the target `committed` after its row 0:
    /// acceptance by position along its leading chain (what a chain verified in its place
    /// would have shown), and its confidences by every token's fate ([`tree_fates`]), those
    /// of the leading chain as a chain's, the others apart.
    pub fn record_tree(&mut self, proposal: &Proposal, committed: &[Token]) {
        let shape = TreeShape::new(&proposal.tokens, &proposal.parents);
        let spine = shape.spine_len();
        let matched = matching_prefix(&proposal.tokens[..spine], committed);
        self.by_position.record(spine, matched, committed.len());
        if has_confidences(proposal) {
            let fates = tree_fates(&shape, committed);
            let (confidence, fates) = (&proposal.confidence, &fates);
            self.by_confidence
                .record_fates(&confidence[..spine], &fates[..spine]);
            self.off_spine
                .record_fates(&confidence[spine..], &fates[spine..]);
        }
    }

    /// The estimated probability that the target accepts `proposal` through each of its
    /// tokens: its calibrated confidences when it has them (of a tree, those off its leading
    /// chain by what such tokens achieved), else what acceptance by position predicts (of a
    /// tree, at each token's depth).
    pub fn survival(&self, proposal: &Proposal) -> Vec<f64> {
        if has_confidences(proposal) {
            let spine = TreeShape::new(&proposal.tokens, &proposal.parents).spine_len();
            return proposal
                .confidence
                .iter()
                .enumerate()
                .map(|(index, &c)| {
                    if index < spine {
                        self.by_confidence.calibrated(c)
                    } else {
                        self.off_spine.calibrated(c)
                    }
                })
                .collect();
        }
        if proposal.parents.is_empty() {
            return self.by_position.survival(proposal.tokens.len());
        }
        let depths = TreeShape::new(&proposal.tokens, &proposal.parents).depths();
        let deepest = depths.iter().copied().max().unwrap_or(0);
        let by_depth = self.by_position.survival(deepest);
        depths[1..]
            .iter()
            .map(|&depth| by_depth[depth - 1])
            .collect()
    }

    /// Expected accepted tokens of `proposal`: the sum of its [survival](Self::survival).
    pub fn expected_accepted(&self, proposal: &Proposal) -> f64 {
        self.survival(proposal).iter().sum()
    }
}

/// The fate of each token of a tree against the tokens the target committed after row 0:
/// accepted on the path the target followed; not accepted where the path left its parent, or
/// below a token not accepted; unknown (`None`) below the path's end deeper than the target's
/// committed tokens reach.
pub fn tree_fates(shape: &TreeShape<'_>, committed: &[Token]) -> Vec<Option<bool>> {
    let path = shape.follow(committed);
    let depths = shape.depths();
    // Per row: its fate, row 0 (the context) on the path.
    let mut fates: Vec<Option<bool>> = Vec::with_capacity(shape.len() + 1);
    fates.push(Some(true));
    for index in 0..shape.len() {
        let row = index + 1;
        let fate = match fates[shape.parent(index)] {
            Some(true) if path.contains(&row) => Some(true),
            Some(true) if depths[row] <= committed.len() => Some(false),
            Some(true) | None => None,
            Some(false) => Some(false),
        };
        fates.push(fate);
    }
    fates.remove(0);
    fates
}

/// Whether `proposal` gives a confidence for each of its (one or more) tokens.
fn has_confidences(proposal: &Proposal) -> bool {
    proposal.confidence.len() == proposal.tokens.len() && !proposal.tokens.is_empty()
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

    fn checked(history: &PositionAcceptance) -> Vec<(f64, f64)> {
        history
            .positions
            .iter()
            .map(|t| (t.checked, t.hits))
            .collect()
    }

    #[test]
    fn unseen_positions_are_even_odds() {
        let history = PositionAcceptance::default();
        assert!((history.conditional(3) - 0.5).abs() < 1e-12);
        assert_eq!(history.survival(2), [0.5, 0.25]);
    }

    #[test]
    fn records_only_positions_that_were_checked() {
        let mut history = PositionAcceptance::default();
        // 4 drafted, 1 matched: positions 0 (match) and 1 (mismatch) were checked.
        history.record(4, 1, 10);
        // 4 drafted, all 2 known positions matched: censored after position 1.
        history.record(4, 2, 2);
        assert_eq!(checked(&history), vec![(2.0, 2.0), (2.0, 1.0)]);
        assert!((history.conditional(0) - 3.0 / 4.0).abs() < 1e-12);
        assert!((history.conditional(1) - 2.0 / 4.0).abs() < 1e-12);
    }

    #[test]
    fn old_observations_are_forgotten_geometrically() {
        let mut history = PositionAcceptance::default();
        for _ in 0..1000 {
            history.record(1, 0, 1);
        }
        assert!(history.conditional(0) < 0.01, "{history:?}");
        // After as many hits as the window holds, the early misses weigh half or less.
        for _ in 0..FORGET_AFTER as usize {
            history.record(1, 1, 1);
        }
        let rate = history.conditional(0);
        assert!(rate > 0.5 && rate < 0.9, "rate {rate}: {history:?}");
        assert!(history.positions[0].checked <= FORGET_AFTER + 1.0);
    }

    #[test]
    fn calibration_counts_known_fates_only() {
        let mut calibration = ConfidenceCalibration::default();
        // A verified draft: 2 of 4 accepted, position 2 was seen to differ, so all 4 are known.
        calibration.record(&[0.95, 0.85, 0.75, 0.65], 2, 4);
        // A losing draft compared with 2 committed tokens, both matched: the rest are unknown.
        calibration.record(&[0.95, 0.85, 0.75], 2, 2);
        let tallies: Vec<(f64, f64)> = calibration
            .bins
            .iter()
            .map(|t| (t.checked, t.hits))
            .collect();
        assert_eq!(tallies[9], (2.0, 2.0), "{tallies:?}");
        assert_eq!(tallies[8], (2.0, 2.0), "{tallies:?}");
        assert_eq!(tallies[7], (1.0, 0.0), "{tallies:?}");
        assert_eq!(tallies[6], (1.0, 0.0), "{tallies:?}");
    }

    #[test]
    fn every_token_of_a_tree_is_calibrated_by_its_fate() {
        // Rows 1-3 a chain 10 11 12, row 4 (21) a second child of row 1, row 5 (30) of row 0.
        let (tokens, parents) = ([10, 11, 12, 21, 30], [0, 1, 2, 1, 0]);
        let shape = TreeShape::new(&tokens, &parents);
        // The target took 10, 21, then its own 5: row 4's branch; all else is known lost.
        let (yes, no) = (Some(true), Some(false));
        assert_eq!(tree_fates(&shape, &[10, 21, 5]), [yes, no, no, yes, no]);
        // Only 10 committed (generation ended): below row 1 nothing is known.
        assert_eq!(tree_fates(&shape, &[10]), [yes, None, None, None, no]);

        let proposal = Proposal {
            tokens: tokens.to_vec(),
            confidence: vec![0.95, 0.45, 0.35, 0.55, 0.05],
            parents: parents.to_vec(),
        };
        let mut history = AcceptanceHistory::default();
        history.record_tree(&proposal, &[10, 21, 5]);
        let tallies = |calibration: &ConfidenceCalibration| -> Vec<(f64, f64)> {
            calibration
                .bins
                .iter()
                .map(|t| (t.checked, t.hits))
                .collect()
        };
        // The leading chain 10 11 12 (0.95 0.45 0.35), then 21 (0.55) and 30 (0.05) apart.
        let spine = tallies(&history.by_confidence);
        assert_eq!(
            [spine[9], spine[4], spine[3]],
            [(1.0, 1.0), (1.0, 0.0), (1.0, 0.0)]
        );
        let off = tallies(&history.off_spine);
        assert_eq!([off[5], off[0]], [(1.0, 1.0), (1.0, 0.0)]);
        assert_eq!(spine.iter().map(|t| t.0).sum::<f64>(), 3.0);
        assert_eq!(off.iter().map(|t| t.0).sum::<f64>(), 2.0);
        // Estimates: the chain's tokens by the chain's table, the others by theirs.
        let fresh = AcceptanceHistory::default().survival(&proposal);
        let learnt = history.survival(&proposal);
        assert!(learnt[3] > fresh[3], "21 at 0.55 was accepted: {learnt:?}");
        assert!(learnt[4] < fresh[4], "30 at 0.05 was not: {learnt:?}");
        // By position, the leading chain 10 11 12: 10 matched, 11 did not.
        assert_eq!(checked(&history.by_position), [(1.0, 1.0), (1.0, 0.0)]);
    }

    #[test]
    fn an_overconfident_source_is_scored_by_what_it_achieves() {
        let proposal = Proposal {
            tokens: vec![1, 2, 3, 4],
            confidence: vec![0.9, 0.9, 0.9, 0.9],
            parents: Vec::new(),
        };
        let mut history = AcceptanceHistory::default();
        assert!((history.expected_accepted(&proposal) - 3.6).abs() < 1e-6);
        // Its 0.9s come true a quarter of the time: the first token always, the rest never.
        for _ in 0..200 {
            history.record(&proposal, 1, 4);
        }
        let expected = history.expected_accepted(&proposal);
        assert!((expected - 1.0).abs() < 0.1, "got {expected}");
    }

    #[test]
    fn confidences_win_over_history() {
        let history = AcceptanceHistory::default();
        let proposal = Proposal {
            tokens: vec![1, 2, 3, 4],
            confidence: vec![0.9, 0.8, 2.0, f32::NAN],
            parents: Vec::new(),
        };
        let expected = history.expected_accepted(&proposal);
        assert!((expected - 2.7).abs() < 1e-6, "clamped sum, got {expected}");
        let bare = Proposal::from_tokens(vec![1, 2]);
        assert!((history.expected_accepted(&bare) - 0.75).abs() < 1e-12);
    }

    #[test]
    fn matching_prefix_stops_at_first_difference() {
        assert_eq!(matching_prefix(&[1, 2, 3], &[1, 2, 4, 5]), 2);
        assert_eq!(matching_prefix(&[1, 2], &[1]), 1);
        assert_eq!(matching_prefix(&[], &[1]), 0);
    }
}
