//! Numbers of a benchmark: totals of one pass over a workload, and summaries over passes.
//!
//! A *pass* is one configuration decoding every request of a workload once, in order. Its
//! generation speed is the pass's generated tokens over its generation time (the time after
//! each request's first token, as [`GenerationStats::generation_tokens_per_second`] counts it),
//! so long requests weigh more than short ones, as they do for a server.

use std::time::Duration;

use serde::Serialize;

use crate::cascade::SourceStats;
use crate::engine::GenerationStats;

/// Median, smallest and largest of a sample.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    /// The median (the mean of the two middle values for an even count).
    pub median: f64,
    /// The smallest value.
    pub min: f64,
    /// The largest value.
    pub max: f64,
}

impl Summary {
    /// Summarises `values`; `None` when there are none.
    pub fn of(values: &[f64]) -> Option<Self> {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let (&min, &max) = (sorted.first()?, sorted.last()?);
        let middle = sorted.len() / 2;
        let median = if sorted.len().is_multiple_of(2) {
            (sorted[middle - 1] + sorted[middle]) / 2.0
        } else {
            sorted[middle]
        };
        Some(Self { median, min, max })
    }
}

/// The `fraction` quantile of `values` (0.5: the median, as [`Summary`] takes it; 0.95: the
/// 95th percentile), interpolated linearly between the two nearest ranks; `None` when there are
/// no values.
pub fn percentile(values: &[f64], fraction: f64) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let last = sorted.len().checked_sub(1)?;
    let rank = fraction.clamp(0.0, 1.0) * last as f64;
    let below = rank.floor() as usize;
    let above = rank.ceil() as usize;
    let weight = rank - below as f64;
    Some(sorted[below] + (sorted[above] - sorted[below]) * weight)
}

/// `value / baseline`, or `None` when the baseline is zero (nothing was timed) or not finite.
pub fn speedup(value: f64, baseline: f64) -> Option<f64> {
    (baseline > 0.0 && baseline.is_finite() && value.is_finite()).then(|| value / baseline)
}

/// `part / whole` of two durations, 0 for an empty whole.
fn share(part: Duration, whole: Duration) -> f64 {
    let whole = whole.as_secs_f64();
    if whole > 0.0 {
        part.as_secs_f64() / whole
    } else {
        0.0
    }
}

/// `part / whole` of two counts, 0 for an empty whole.
fn fraction(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// Counters of one or more passes, summed over their requests.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    /// Requests decoded.
    pub requests: u64,
    /// Generated tokens, each request's first token included.
    pub generated_tokens: u64,
    /// Generated tokens after each request's first: those `generation_time` covers.
    pub timed_tokens: u64,
    /// Time from each request's first token to its last.
    pub generation_time: Duration,
    /// Verify rounds.
    pub rounds: u64,
    /// Rounds that verified a non-empty draft.
    pub draft_rounds: u64,
    /// Draft tokens verified.
    pub drafted: u64,
    /// Draft tokens accepted.
    pub accepted: u64,
    /// Rounds that verified drawn drafts by rejection sampling.
    pub drawn_rounds: u64,
    /// Rounds whose draft was a tree.
    pub tree_rounds: u64,
    /// `verify_batches[n - 1]`: rounds that verified `n` tokens.
    pub verify_batches: Vec<u64>,
    /// Time in the target's verify batches.
    pub verify_time: Duration,
    /// Time asking the cascade for drafts and feeding it.
    pub draft_time: Duration,
    /// Per-source counters, in cascade order, summed over requests.
    pub sources: Vec<SourceStats>,
}

impl Totals {
    /// Adds one request's stats.
    pub fn add_request(&mut self, stats: &GenerationStats) {
        self.requests += 1;
        self.generated_tokens += stats.generated_tokens as u64;
        self.timed_tokens += stats.generated_tokens.saturating_sub(1) as u64;
        self.generation_time += stats.generation_time;
        self.rounds += stats.rounds;
        self.draft_rounds += stats.draft_rounds;
        self.drafted += stats.drafted;
        self.accepted += stats.accepted;
        self.drawn_rounds += stats.drawn_rounds;
        self.tree_rounds += stats.tree_rounds;
        add_counts(&mut self.verify_batches, &stats.verify_batches);
        self.verify_time += stats.verify_time;
        self.draft_time += stats.draft_time;
        add_sources(&mut self.sources, &stats.sources);
    }

    /// Adds the totals of another pass.
    pub fn add(&mut self, other: &Totals) {
        self.requests += other.requests;
        self.generated_tokens += other.generated_tokens;
        self.timed_tokens += other.timed_tokens;
        self.generation_time += other.generation_time;
        self.rounds += other.rounds;
        self.draft_rounds += other.draft_rounds;
        self.drafted += other.drafted;
        self.accepted += other.accepted;
        self.drawn_rounds += other.drawn_rounds;
        self.tree_rounds += other.tree_rounds;
        add_counts(&mut self.verify_batches, &other.verify_batches);
        self.verify_time += other.verify_time;
        self.draft_time += other.draft_time;
        add_sources(&mut self.sources, &other.sources);
    }

    /// Generated tokens per second after each request's first token.
    pub fn tokens_per_second(&self) -> f64 {
        let secs = self.generation_time.as_secs_f64();
        if secs > 0.0 {
            self.timed_tokens as f64 / secs
        } else {
            0.0
        }
    }

    /// Accepted over drafted tokens, in [0, 1].
    pub fn acceptance(&self) -> f64 {
        fraction(self.accepted, self.drafted)
    }

    /// Mean accepted draft tokens per round that verified a draft.
    pub fn mean_accepted_per_draft_round(&self) -> f64 {
        fraction(self.accepted, self.draft_rounds)
    }

    /// Mean tokens committed per verify round (accepted draft tokens plus the target's own).
    pub fn mean_committed_per_round(&self) -> f64 {
        fraction(self.timed_tokens, self.rounds)
    }

    /// Share of generation time spent drafting (asking and feeding the cascade), in [0, 1].
    pub fn draft_share(&self) -> f64 {
        share(self.draft_time, self.generation_time)
    }

    /// Share of generation time spent in the target's verify batches, in [0, 1].
    pub fn verify_share(&self) -> f64 {
        share(self.verify_time, self.generation_time)
    }
}

/// Adds counts index by index, growing `into` as needed.
fn add_counts(into: &mut Vec<u64>, from: &[u64]) {
    if into.len() < from.len() {
        into.resize(from.len(), 0);
    }
    for (sum, count) in into.iter_mut().zip(from) {
        *sum += count;
    }
}

/// Adds per-source counters position by position; the cascade's order is the same every time.
fn add_sources(into: &mut Vec<SourceStats>, from: &[SourceStats]) {
    for (index, source) in from.iter().enumerate() {
        match into.get_mut(index) {
            Some(total) => total.add(source),
            None => into.push(source.clone()),
        }
    }
}

/// For each draft position up to `positions`, the share of the source's winning rounds in which
/// that position was accepted; empty when the source never won.
pub fn acceptance_by_position(source: &SourceStats, positions: usize) -> Vec<f64> {
    if source.won == 0 {
        return Vec::new();
    }
    (0..positions)
        .map(|i| {
            fraction(
                source.accepted_by_position.get(i).copied().unwrap_or(0),
                source.won,
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_takes_median_min_and_max() {
        let odd = Summary::of(&[3.0, 1.0, 2.0]).expect("values");
        assert_eq!(
            (odd.median, odd.min, odd.max),
            (2.0, 1.0, 3.0),
            "seen {odd:?}"
        );
        let even = Summary::of(&[4.0, 1.0, 3.0, 2.0]).expect("values");
        assert_eq!(
            (even.median, even.min, even.max),
            (2.5, 1.0, 4.0),
            "seen {even:?}"
        );
        let one = Summary::of(&[7.5]).expect("values");
        assert_eq!(
            (one.median, one.min, one.max),
            (7.5, 7.5, 7.5),
            "seen {one:?}"
        );
        assert_eq!(Summary::of(&[]), None);
    }

    #[test]
    fn percentiles_interpolate_between_ranks_and_the_50th_is_the_median() {
        let values = [40.0, 10.0, 30.0, 20.0];
        let median = Summary::of(&values).expect("values").median;
        assert_eq!(percentile(&values, 0.5), Some(median), "p50 of {values:?}");
        let p95 = percentile(&values, 0.95).expect("values");
        assert!((p95 - 38.5).abs() < 1e-9, "p95 of {values:?}: seen {p95}");
        assert_eq!(percentile(&values, 0.0), Some(10.0));
        assert_eq!(percentile(&values, 1.0), Some(40.0));
        assert_eq!(percentile(&[7.0], 0.95), Some(7.0));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn speedup_is_a_ratio_of_medians_undefined_without_a_baseline() {
        let plain = Summary::of(&[100.0, 90.0, 110.0]).expect("values");
        let cascade = Summary::of(&[150.0, 160.0, 140.0]).expect("values");
        let ratio = speedup(cascade.median, plain.median).expect("baseline > 0");
        assert!((ratio - 1.5).abs() < 1e-12, "seen {ratio}");
        assert_eq!(speedup(10.0, 0.0), None);
        assert_eq!(speedup(f64::NAN, 1.0), None);
    }

    fn request(generated: usize, secs: f64, drafted: u64, accepted: u64) -> GenerationStats {
        let mut lookup = SourceStats::named("lookup");
        lookup.won = 2;
        lookup.drafted = drafted;
        lookup.accepted = accepted;
        lookup.accepted_by_position = vec![accepted.min(2); accepted.min(1) as usize];
        GenerationStats {
            generated_tokens: generated,
            generation_time: Duration::from_secs_f64(secs),
            rounds: 4,
            draft_rounds: 2,
            drafted,
            accepted,
            verify_batches: vec![2, 0, 2],
            verify_time: Duration::from_secs_f64(secs / 2.0),
            draft_time: Duration::from_secs_f64(secs / 10.0),
            sources: vec![lookup],
            ..GenerationStats::default()
        }
    }

    #[test]
    fn totals_sum_requests_and_derive_rates() {
        let mut pass = Totals::default();
        pass.add_request(&request(11, 1.0, 8, 2));
        pass.add_request(&request(21, 1.0, 8, 4));
        assert_eq!(
            (pass.requests, pass.generated_tokens, pass.timed_tokens),
            (2, 32, 30)
        );
        assert!(
            (pass.tokens_per_second() - 15.0).abs() < 1e-9,
            "seen {pass:?}"
        );
        assert!((pass.acceptance() - 6.0 / 16.0).abs() < 1e-12);
        assert!((pass.mean_accepted_per_draft_round() - 1.5).abs() < 1e-12);
        assert!((pass.verify_share() - 0.5).abs() < 1e-9);
        assert!((pass.draft_share() - 0.1).abs() < 1e-9);
        assert_eq!(pass.verify_batches, vec![4, 0, 4], "seen {pass:?}");
        assert!((pass.mean_committed_per_round() - 30.0 / 8.0).abs() < 1e-12);
        let lookup = &pass.sources[0];
        assert_eq!((lookup.won, lookup.accepted), (4, 6), "seen {lookup:?}");
        assert_eq!(lookup.accepted_by_position, vec![4], "seen {lookup:?}");

        let mut both = pass.clone();
        both.add(&pass);
        assert_eq!((both.requests, both.sources[0].won), (4, 8));
        assert!((both.tokens_per_second() - 15.0).abs() < 1e-9);
        assert_eq!(Totals::default().tokens_per_second(), 0.0);
    }

    #[test]
    fn acceptance_by_position_is_normalised_by_rounds_won() {
        let mut source = SourceStats::named("lookup");
        source.won = 4;
        source.accepted_by_position = vec![3, 1];
        assert_eq!(acceptance_by_position(&source, 3), vec![0.75, 0.25, 0.0]);
        source.won = 0;
        assert!(acceptance_by_position(&source, 3).is_empty());
    }
}
