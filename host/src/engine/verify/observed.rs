//! What verify batches of one sequence really cost, against the curve measured at start-up.
//!
//! The verify curve ([`VerifyCurve`](super::VerifyCurve)) is measured once, decoding batches of
//! each size back to back. Real rounds decode between plugin calls, at other context lengths,
//! on a machine whose speed drifts with its neighbours. The session records every decode of
//! one sequence's verify rows as its time over the curve's price for it (at its context), by
//! batch size, and `bench` reports the mean of each size next to the curve: how far the
//! curve the policies priced their rounds by, and the `ideal` speedup figures rest on, was
//! from the rounds themselves (docs/benchmarks-history.md, "The verify curve against the rounds").

use std::time::Duration;

use serde::Serialize;

/// The real verify decodes of one batch size over the curve, as reported.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ObservedRatio {
    /// Tokens in the batch.
    pub tokens: usize,
    /// The mean over its decodes of the time one took over the curve's price for it.
    pub ratio: f64,
    /// Decodes of this size seen.
    pub decodes: u64,
}

/// Real verify decode times over the curve's prices, by batch size.
#[derive(Debug, Clone, Default)]
pub(super) struct ObservedCosts {
    /// `[n - 1]`: the sum of the ratios of decodes of `n` rows, and how many.
    by_rows: Vec<(f64, u64)>,
}

impl ObservedCosts {
    /// Records that a decode of `rows` rows of one sequence took `took` where the curve
    /// priced it at `priced` seconds. Ignored when the curve gave no price.
    pub fn record(&mut self, rows: usize, took: Duration, priced: f64) {
        if rows == 0 || !(priced.is_finite() && priced > 0.0) {
            return;
        }
        if self.by_rows.len() < rows {
            self.by_rows.resize(rows, (0.0, 0));
        }
        let (sum, count) = &mut self.by_rows[rows - 1];
        *sum += took.as_secs_f64() / priced;
        *count += 1;
    }

    /// Every batch size seen, smallest first.
    pub fn ratios(&self) -> Vec<ObservedRatio> {
        self.by_rows
            .iter()
            .enumerate()
            .filter(|(_, (_, count))| *count > 0)
            .map(|(index, &(sum, count))| ObservedRatio {
                tokens: index + 1,
                ratio: sum / count as f64,
                decodes: count,
            })
            .collect()
    }

    /// Forgets every decode (the curve they were priced by was replaced).
    pub fn clear(&mut self) {
        self.by_rows.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: f64) -> Duration {
        Duration::from_secs_f64(n / 1e3)
    }

    #[test]
    fn each_size_reports_the_mean_of_its_decodes_over_the_curve() {
        let mut observed = ObservedCosts::default();
        observed.record(1, ms(11.0), 0.010);
        observed.record(1, ms(9.0), 0.010);
        observed.record(6, ms(18.0), 0.012);
        for (rows, priced) in [(3, f64::NAN), (3, 0.0), (0, 0.01)] {
            observed.record(rows, ms(20.0), priced);
        }
        let ratios = observed.ratios();
        assert_eq!(ratios.len(), 2, "no price, no sample: {ratios:?}");
        assert_eq!((ratios[0].tokens, ratios[0].decodes), (1, 2));
        assert!((ratios[0].ratio - 1.0).abs() < 1e-9, "{ratios:?}");
        assert_eq!((ratios[1].tokens, ratios[1].decodes), (6, 1));
        assert!((ratios[1].ratio - 1.5).abs() < 1e-9, "{ratios:?}");
        observed.clear();
        assert!(observed.ratios().is_empty());
    }
}
