//! The ceiling of speculation: the target's verify cost curve, and the speedup an achieved
//! acceptance allows at best.
//!
//! A round that verifies `n` tokens (the last committed token and `n - 1` draft tokens) costs
//! the target `cost(n)` and commits the accepted draft plus one token; plain decoding commits
//! one token per `cost(1)`. If drafting and bookkeeping were free, a run of rounds would be
//!
//! ```text
//! ideal speedup = committed tokens × cost(1) / Σ over rounds of cost(n_round)
//!              = (committed / rounds) × cost(1) / mean cost(n_round)
//! ```
//!
//! times faster than plain decoding. The measured speedup over it, the *efficiency*, says how
//! much the loop itself leaves on the table (drafting, sampling, bookkeeping, noise).

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

/// The target's verify cost curve at one context length.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifyCosts {
    /// Tokens of context before each measured batch.
    pub context_tokens: usize,
    /// `per_batch[n - 1]`: the median time of one verify batch of `n` tokens.
    pub per_batch: Vec<Duration>,
}

/// One point of the curve, as reported.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VerifyCostPoint {
    /// Tokens in the batch.
    pub tokens: usize,
    /// Median time of one batch, in µs.
    pub micros: f64,
    /// Time of the batch over the time of a single token.
    pub relative: f64,
}

impl VerifyCosts {
    /// The ideal speedup of rounds that committed `committed` tokens, where
    /// `verify_batches[n - 1]` rounds verified `n` tokens; `None` when nothing was verified or a
    /// batch size is off the measured curve.
    pub fn ideal_speedup(&self, committed: u64, verify_batches: &[u64]) -> Option<f64> {
        let single = self.per_batch.first()?.as_secs_f64();
        let mut total = 0.0;
        for (index, &rounds) in verify_batches.iter().enumerate() {
            if rounds > 0 {
                total += rounds as f64 * self.per_batch.get(index)?.as_secs_f64();
            }
        }
        (total > 0.0 && single > 0.0).then(|| committed as f64 * single / total)
    }

    /// The curve, point by point.
    pub fn points(&self) -> Vec<VerifyCostPoint> {
        let single = self.per_batch.first().map_or(0.0, Duration::as_secs_f64);
        self.per_batch
            .iter()
            .enumerate()
            .map(|(index, cost)| VerifyCostPoint {
                tokens: index + 1,
                micros: cost.as_secs_f64() * 1e6,
                relative: if single > 0.0 {
                    cost.as_secs_f64() / single
                } else {
                    0.0
                },
            })
            .collect()
    }
}

/// A verify cost curve as a markdown table: tokens, µs per batch, cost relative to one token,
/// and that per token.
pub fn points_markdown(points: &[VerifyCostPoint]) -> String {
    let mut out = String::from(
        "| tokens verified | µs per batch | relative to 1 token | relative per token |\n|--:|--:|--:|--:|\n",
    );
    for point in points {
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.2} | {:.3} |",
            point.tokens,
            point.micros,
            point.relative,
            point.relative / point.tokens as f64
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn curve(micros: &[u64]) -> VerifyCosts {
        VerifyCosts {
            context_tokens: 100,
            per_batch: micros.iter().map(|&m| Duration::from_micros(m)).collect(),
        }
    }

    #[test]
    fn plain_decoding_is_its_own_ideal() {
        let costs = curve(&[1000, 1500]);
        let ideal = costs.ideal_speedup(50, &[50]).expect("measured");
        assert!((ideal - 1.0).abs() < 1e-12, "seen {ideal}");
    }

    #[test]
    fn ideal_weighs_each_round_by_its_batch_cost() {
        // 10 rounds of 3 tokens (cost 2 ms each) committing 25 tokens, against 1 ms per token:
        // 25 ms of plain decoding over 20 ms of verification.
        let costs = curve(&[1000, 1500, 2000]);
        let ideal = costs.ideal_speedup(25, &[0, 0, 10]).expect("measured");
        assert!((ideal - 1.25).abs() < 1e-12, "seen {ideal}");
        let mixed = costs.ideal_speedup(9, &[2, 0, 2]).expect("measured");
        assert!((mixed - 1.5).abs() < 1e-12, "9 ms over 6 ms, seen {mixed}");
    }

    #[test]
    fn ideal_is_undefined_off_the_curve_or_without_rounds() {
        let costs = curve(&[1000, 1500]);
        assert_eq!(costs.ideal_speedup(10, &[0, 0, 3]), None);
        assert_eq!(costs.ideal_speedup(0, &[]), None);
        assert_eq!(curve(&[]).ideal_speedup(1, &[1]), None);
    }

    #[test]
    fn points_and_table_give_relative_costs() {
        let costs = curve(&[1000, 1500]);
        let points = costs.points();
        assert_eq!(points[1].tokens, 2);
        assert!((points[1].relative - 1.5).abs() < 1e-12, "seen {points:?}");
        let table = points_markdown(&points);
        assert!(table.contains("| 2 | 1500 | 1.50 | 0.750 |"), "{table}");
    }
}
