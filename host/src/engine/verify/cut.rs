//! Which draft tokens of a verify step of several requests are worth their rows.
//!
//! Each request's policy sizes its draft for its own round, with at best an estimate of what
//! the other requests will verify beside it. The step sees every round at once, and what its
//! batch will cost: llama.cpp decodes rounds of different lengths in several passes over the
//! weights (`layout.rs`), so on a compute-bound machine one request's 8-token draft beside
//! three plain rounds adds a pass costing more than the three plain rows together, and its
//! expected yield rarely pays for it. The step therefore cuts the drafts to the lengths that
//! maximise its expected committed tokens per unit of time:
//!
//! ```text
//! argmax over k_i ≤ d_i of  Σ_i (1 + Σ_{j<k_i} s_i[j]) / cost(rows: k_i + 1 per sequence)
//! ```
//!
//! where `s_i[j]` is the cascade's estimate that request `i`'s draft is accepted through token
//! `j` and `cost` is the cost of the passes the batch takes (padded or split, as it will be
//! laid out), as the session's steps measured them (`pass_costs.rs`). A cut never changes a committed token: the target verifies a shorter
//! prefix of the same draft, and the rest is compared with the committed tokens as an
//! unverified proposal is.
//!
//! The search starts from the drafts as proposed and from every cap on all drafts at once (the
//! passes reward equal lengths), then changes one draft at a time while that pays.

use serde::{Deserialize, Serialize};

/// Whether a verify step of several requests cuts their drafts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum DraftCut {
    /// Cut each step's drafts to the lengths that pay most by the measured verify costs and
    /// each draft's expected acceptance.
    #[default]
    Auto,
    /// Verify every draft as its request's policy sized it.
    Off,
}

/// Sweeps of one-draft-at-a-time changes at most: each sweep tries every length of every
/// draft; two or three settle in practice.
const MAX_SWEEPS: usize = 4;
/// Relative gain below which a change is not taken (floating-point noise).
const MIN_GAIN: f64 = 1e-9;

/// One round of a step, as the cut sees it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Offer<'a> {
    /// Draft tokens proposed.
    pub drafted: usize,
    /// The estimated probability that the draft is accepted through each token, one per
    /// token; unknown (the draft is then kept whole) when it is not one per token.
    pub survival: &'a [f64],
}

impl Offer<'_> {
    /// Whether the draft's survival is known, token by token.
    fn known(&self) -> bool {
        self.survival.len() == self.drafted
    }
}

/// The draft lengths, one per offer and each at most its `drafted`, that give the most
/// expected committed tokens per unit of `cost` (the batch's cost with those draft lengths);
/// the drafts as proposed when `cost` is unknown (NaN).
pub(super) fn draft_lengths(offers: &[Offer<'_>], cost: impl Fn(&[usize]) -> f64) -> Vec<usize> {
    let proposed: Vec<usize> = offers.iter().map(|offer| offer.drafted).collect();
    let rate = |lengths: &[usize]| expected_tokens(offers, lengths) / cost(lengths);
    let mut best_rate = rate(&proposed);
    if !best_rate.is_finite() {
        return proposed;
    }
    let mut best = proposed.clone();
    let longest = proposed.iter().copied().max().unwrap_or(0);
    for cap in 0..longest {
        let lengths = limits(offers)
            .map(|(fixed, drafted)| if fixed { drafted } else { drafted.min(cap) })
            .collect::<Vec<_>>();
        let capped = rate(&lengths);
        if capped > best_rate * (1.0 + MIN_GAIN) {
            best = lengths;
            best_rate = capped;
        }
    }
    for _ in 0..MAX_SWEEPS {
        let mut improved = false;
        for (index, (fixed, drafted)) in limits(offers).enumerate() {
            if fixed {
                continue;
            }
            for length in 0..=drafted {
                if length == best[index] {
                    continue;
                }
                let mut lengths = best.clone();
                lengths[index] = length;
                let changed = rate(&lengths);
                if changed > best_rate * (1.0 + MIN_GAIN) {
                    best = lengths;
                    best_rate = changed;
                    improved = true;
                }
            }
        }
        if !improved {
            break;
        }
    }
    best
}

/// Whether each offer's length is fixed (its survival unknown), and its draft length.
fn limits<'o>(offers: &'o [Offer<'_>]) -> impl Iterator<Item = (bool, usize)> + 'o {
    offers.iter().map(|offer| (!offer.known(), offer.drafted))
}

/// Tokens the rounds are expected to commit with drafts of `lengths`: each its target token
/// and its draft's expected accepted prefix (a draft of unknown survival counts as accepted
/// whole: it is never cut, and the rest are weighed against it as they are).
fn expected_tokens(offers: &[Offer<'_>], lengths: &[usize]) -> f64 {
    offers
        .iter()
        .zip(lengths)
        .map(|(offer, &length)| {
            let accepted = if offer.known() {
                offer.survival[..length]
                    .iter()
                    .map(|&p| {
                        if p.is_finite() {
                            p.clamp(0.0, 1.0)
                        } else {
                            0.0
                        }
                    })
                    .sum()
            } else {
                length as f64
            };
            1.0 + accepted
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::super::layout::{BatchLayout, plan};
    use super::*;

    /// A geometric survival: each token accepted with `rate` given the ones before.
    fn geometric(rate: f64, len: usize) -> Vec<f64> {
        (1..=len as i32).map(|i| rate.powi(i)).collect()
    }

    /// The cost of a batch of rounds (one per sequence, in order) with drafts of `lengths`,
    /// laid out as the session would, by the cost of one pass of `n` rows.
    fn batch_cost(pass: impl Fn(usize) -> f64) -> impl Fn(&[usize]) -> f64 {
        move |lengths: &[usize]| {
            let rows: Vec<usize> = lengths.iter().map(|&k| k + 1).collect();
            plan(BatchLayout::Auto, &rows, 512, |one| pass(one.total())).cost
        }
    }

    fn offers(survival: &[Vec<f64>]) -> Vec<Offer<'_>> {
        survival
            .iter()
            .map(|s| Offer {
                drafted: s.len(),
                survival: s,
            })
            .collect()
    }

    /// SmolLM2 Q8_0 on 2 cores: 0.73 per pass plus 0.27 per row.
    fn compute_bound(n: usize) -> f64 {
        0.73 + 0.27 * n as f64
    }

    /// A memory-bound machine: a pass costs about the same whatever its rows.
    fn memory_bound(n: usize) -> f64 {
        1.0 + 0.02 * n as f64
    }

    #[test]
    fn a_lone_uncertain_draft_beside_plain_rounds_is_cut_where_passes_cost() {
        let survival = [vec![], vec![], geometric(0.5, 8), vec![]];
        let lengths = draft_lengths(&offers(&survival), batch_cost(compute_bound));
        assert_eq!(lengths, [0, 0, 0, 0]);
    }

    #[test]
    fn drafts_are_kept_where_extra_rows_are_nearly_free() {
        let survival = [vec![], vec![], geometric(0.9, 8), vec![]];
        let lengths = draft_lengths(&offers(&survival), batch_cost(memory_bound));
        assert_eq!(lengths, [0, 0, 8, 0], "padded to one pass");
        // An uncertain one only as far as its first tokens pay for their padding.
        let survival = [vec![], vec![], geometric(0.5, 8), vec![]];
        let lengths = draft_lengths(&offers(&survival), batch_cost(memory_bound));
        assert_eq!(lengths, [0, 0, 1, 0]);
    }

    #[test]
    fn confident_drafts_of_every_round_are_kept_in_one_pass() {
        let survival = vec![geometric(0.95, 4); 4];
        let lengths = draft_lengths(&offers(&survival), batch_cost(compute_bound));
        assert_eq!(lengths, [4, 4, 4, 4]);
    }

    #[test]
    fn unequal_drafts_are_cut_towards_one_pass() {
        let survival = [geometric(0.9, 3), geometric(0.9, 8), geometric(0.9, 3)];
        let lengths = draft_lengths(&offers(&survival), batch_cost(compute_bound));
        let cost = batch_cost(compute_bound);
        let all = offers(&survival);
        let rate = |lengths: &[usize]| expected_tokens(&all, lengths) / cost(lengths);
        assert!(rate(&lengths) > rate(&[3, 8, 3]), "{lengths:?}");
        assert!(rate(&lengths) >= rate(&[3, 3, 3]), "{lengths:?}");
    }

    #[test]
    fn drafts_of_unknown_survival_are_kept_whole() {
        let known = geometric(0.3, 6);
        let offers = [
            Offer {
                drafted: 5,
                survival: &[],
            },
            Offer {
                drafted: 6,
                survival: &known,
            },
        ];
        let lengths = draft_lengths(&offers, batch_cost(compute_bound));
        assert_eq!(lengths[0], 5);
        assert!(lengths[1] < 6, "{lengths:?}");
    }

    #[test]
    fn an_unknown_cost_keeps_every_draft() {
        let survival = [geometric(0.1, 5), vec![]];
        let lengths = draft_lengths(&offers(&survival), |_| f64::NAN);
        assert_eq!(lengths, [5, 0]);
    }
}
