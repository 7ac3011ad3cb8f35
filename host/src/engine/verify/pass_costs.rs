//! What one pass over the weights costs in batches of several sequences, learned from the
//! session's own verify steps.
//!
//! The verify curve ([`VerifyCurve`](super::VerifyCurve)) is measured at start-up on one
//! sequence; a pass of several sequences' rows costs more than as many rows of one sequence
//! (each sequence attends over its own KV stream, in an operation of its own). Measured on
//! Gemma-3-270M on 2 cores: four sequences' single rows cost about what four rows of one do,
//! but four sequences of two rows cost 33 ms where eight rows of one cost 30, so a draft token
//! beside other requests' rounds costs nearly twice what the curve says it adds. The batcher's
//! choices (padding, cutting drafts) need what the batch will really cost, so every verify
//! decode that took one pass is recorded here by its shape (sequences, rows each), as a moving
//! average; a shape not seen yet is priced by the curve (a pass of that many rows of one
//! sequence), which errs on the cheap side, so the shape gets tried, and then measured.

use std::collections::HashMap;
use std::time::Duration;

use super::layout::Pass;
use crate::cascade::curve_cost;

/// Weight of a new measurement in a shape's moving average.
const WEIGHT: f64 = 0.2;

/// Learned costs of passes over several sequences, by shape, in seconds.
#[derive(Debug, Clone, Default)]
pub(super) struct PassCosts {
    by_shape: HashMap<Pass, f64>,
}

impl PassCosts {
    /// What `pass` costs: learned for a pass of several sequences once one of its shape was
    /// decoded; else, and for one sequence, what `curve` (the verify curve at the batch's
    /// context, `[n - 1]`) says `pass.total()` rows cost.
    pub fn cost(&self, pass: Pass, curve: &[Duration]) -> f64 {
        if pass.sequences > 1
            && let Some(&seconds) = self.by_shape.get(&pass)
        {
            return seconds;
        }
        curve_cost(curve, pass.total())
    }

    /// Records that a decode of one pass of `pass`'s shape took `took`.
    pub fn record(&mut self, pass: Pass, took: Duration) {
        if pass.sequences < 2 {
            return;
        }
        let seconds = took.as_secs_f64();
        self.by_shape
            .entry(pass)
            .and_modify(|average| *average += WEIGHT * (seconds - *average))
            .or_insert(seconds);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn passes_of_several_sequences_are_priced_as_measured_once_seen() {
        let curve = [
            ms(15),
            ms(18),
            ms(21),
            ms(24),
            ms(26),
            ms(27),
            ms(29),
            ms(30),
        ];
        let four_by_two = Pass {
            sequences: 4,
            rows: 2,
        };
        let eight_of_one = Pass {
            sequences: 1,
            rows: 8,
        };
        let mut costs = PassCosts::default();
        assert!(
            (costs.cost(four_by_two, &curve) - 0.030).abs() < 1e-9,
            "the curve first"
        );
        costs.record(four_by_two, ms(33));
        assert!((costs.cost(four_by_two, &curve) - 0.033).abs() < 1e-9);
        costs.record(four_by_two, ms(38));
        assert!(
            (costs.cost(four_by_two, &curve) - 0.034).abs() < 1e-9,
            "a moving average"
        );
        costs.record(eight_of_one, ms(50));
        assert!(
            (costs.cost(eight_of_one, &curve) - 0.030).abs() < 1e-9,
            "one sequence: the curve, which knows the context"
        );
    }
}
