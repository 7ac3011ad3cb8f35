//! The target's verify cost curve: how long one verify batch of `n` tokens takes, for
//! `n = 1..=max_tokens`, at a fixed context.
//!
//! Speculation pays when verifying `n` tokens costs less than `n` single-token steps; this curve
//! says by how much, so a benchmark can tell what speedup an acceptance rate allows at best and
//! a policy can choose the draft length that pays most.
//!
//! In order: the context is decoded once; then, per repetition (after one unmeasured warm-up
//! sweep), a batch of each size `n` is decoded at the end of the context with logits at every
//! position (exactly as a verify round does) and timed, and the KV cache is rolled back with
//! `seq_rm`. Sizes are interleaved within a repetition so slow drift of the machine touches all of
//! them alike; the result is the median per size.

use std::time::{Duration, Instant};

use super::{ObservedRatio, Session, decode_error};
use crate::cascade::{Token, curve_cost_by};
use crate::engine::EngineError;

/// Default repetitions of [`Session::measure_verify_costs`].
pub const DEFAULT_COST_REPETITIONS: usize = 5;

/// Verify costs measured after contexts of several lengths, for requests of any length.
///
/// Every row of a verify batch attends to the whole context, so a batch's cost grows with the
/// context while a single token's matrix products do not: measured on SmolLM2-135M (2 cores),
/// 25 tokens cost 4.5 times one after 64 tokens of context and 7.9 times after 520. A curve
/// measured after a short context would make a policy draft too much on long prompts. Attention
/// grows linearly with the context, so [`Self::at`] interpolates linearly between the measured
/// lengths (and extrapolates from the last two past the longest).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VerifyCurve {
    /// `(context length, costs)`, by increasing context length; `costs[n - 1]` is one verify
    /// batch of `n` tokens.
    points: Vec<(usize, Vec<Duration>)>,
}

impl VerifyCurve {
    /// A curve from measurements `(context length, costs)`, in any order.
    pub fn new(mut points: Vec<(usize, Vec<Duration>)>) -> Self {
        points.sort_by_key(|(context, _)| *context);
        points.dedup_by_key(|(context, _)| *context);
        Self { points }
    }

    /// Whether nothing was measured.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// The costs of verify batches after `context_len` tokens (`[n - 1]`: `n` tokens), as many
    /// sizes as every measurement has; empty when nothing was measured.
    pub fn at(&self, context_len: usize) -> Vec<Duration> {
        self.between(context_len)
            .map(|between| (0..between.sizes()).map(|n| between.cost(n)).collect())
            .unwrap_or_default()
    }

    /// What verifying `rows` tokens costs after `context_len` tokens, in seconds:
    /// [`curve_cost`](crate::cascade::curve_cost) of [`Self::at`], computing only the sizes it reads (once per verify
    /// decode); NaN when nothing was measured.
    pub fn price(&self, context_len: usize, rows: usize) -> f64 {
        match self.between(context_len) {
            Some(between) => {
                curve_cost_by(between.sizes(), |n| between.cost(n).as_secs_f64(), rows)
            }
            None => f64::NAN,
        }
    }

    /// The two measurements `context_len` lies between (or extrapolates from), and where.
    fn between(&self, context_len: usize) -> Option<Between<'_>> {
        let (low, high, share) = match self.points.as_slice() {
            [] => return None,
            [(_, only)] => (only, only, 0.0),
            [(first_len, first), ..] if context_len <= *first_len => (first, first, 0.0),
            points => {
                let (low, high) = points
                    .windows(2)
                    .find(|pair| context_len <= pair[1].0)
                    .map_or_else(
                        || (&points[points.len() - 2], &points[points.len() - 1]),
                        |pair| (&pair[0], &pair[1]),
                    );
                let share = (context_len - low.0) as f64 / (high.0 - low.0) as f64;
                (&low.1, &high.1, share)
            }
        };
        Some(Between { low, high, share })
    }
}

/// A context length's place between two measured curves.
struct Between<'c> {
    low: &'c [Duration],
    high: &'c [Duration],
    /// How far from `low` to `high` (beyond 1: extrapolated).
    share: f64,
}

impl Between<'_> {
    /// Sizes both curves have.
    fn sizes(&self) -> usize {
        self.low.len().min(self.high.len())
    }

    /// The cost of `index + 1` tokens, interpolated.
    fn cost(&self, index: usize) -> Duration {
        let (short, long) = (self.low[index], self.high[index]);
        if self.share == 0.0 {
            return short;
        }
        let (short, long) = (short.as_secs_f64(), long.as_secs_f64());
        Duration::from_secs_f64((short + (long - short) * self.share).max(0.0))
    }
}

impl Session<'_> {
    /// The verify cost curve requests get (empty until measured).
    pub fn verify_curve(&self) -> &VerifyCurve {
        &self.verify_curve
    }

    /// Gives requests `curve` (measured elsewhere: a benchmark's after each workload's
    /// prompts) from now on, forgetting the decodes observed against the previous one.
    pub fn set_verify_curve(&mut self, curve: VerifyCurve) {
        self.verify_curve = curve;
        self.observed.clear();
    }

    /// What this session's verify decodes of one sequence took over the curve's prices, by
    /// batch size, since the curve was set (`observed.rs`).
    pub fn observed_costs(&self) -> Vec<ObservedRatio> {
        self.observed.ratios()
    }

    /// Measures the verify cost curve after `prompt` (a request's own, as `spechost run` does)
    /// for batches of up to `max_draft_len + 1` tokens (as far as the batch and context allow)
    /// and gives it to requests from now on. Leaves the KV cache empty.
    pub fn measure_verify_curve_after(
        &mut self,
        prompt: &[Token],
        max_draft_len: usize,
    ) -> Result<(), EngineError> {
        let started = Instant::now();
        let room = (self.ctx_size() as usize).saturating_sub(prompt.len());
        let largest = (max_draft_len + 1).min(self.batch_size).min(room).max(1);
        let costs = self.measure_verify_costs(prompt, largest, DEFAULT_COST_REPETITIONS)?;
        let first = costs.first().copied().unwrap_or_default();
        let last = costs.last().copied().unwrap_or_default();
        tracing::info!(
            one_token_ms = first.as_secs_f64() * 1e3,
            tokens = costs.len(),
            all_tokens_ms = last.as_secs_f64() * 1e3,
            relative = last.as_secs_f64() / first.as_secs_f64().max(1e-9),
            took_ms = started.elapsed().as_secs_f64() * 1e3,
            "measured the verify cost curve"
        );
        self.set_verify_curve(VerifyCurve::new(vec![(prompt.len(), costs)]));
        Ok(())
    }

    /// Measures one verify batch of `n` tokens after `context`, for `n = 1..=max_tokens`:
    /// `costs[n - 1]` is the median over `repetitions` of one `llama_decode` of `n` tokens with
    /// logits at every position, a single token timed right after an untimed one as plain
    /// decoding decodes them. The batch's token ids repeat the context's (the cost does not
    /// depend on them). Leaves the KV cache empty.
    ///
    /// Errors when `context` is empty, `max_tokens` or `repetitions` is 0, `max_tokens` exceeds
    /// the batch size, or context and batch do not fit in the context size.
    pub fn measure_verify_costs(
        &mut self,
        context: &[Token],
        max_tokens: usize,
        repetitions: usize,
    ) -> Result<Vec<Duration>, EngineError> {
        self.measure_verify_costs_within(context, max_tokens, repetitions, Duration::MAX)
    }

    /// [`Self::measure_verify_costs`], repeating only while `budget` lasts: the warm-up sweep
    /// and one measured repetition always run, and no repetition starts once `budget` has
    /// passed since the start. A server measures at start-up with a budget, so its start
    /// stays bounded on slow machines and large models.
    pub fn measure_verify_costs_within(
        &mut self,
        context: &[Token],
        max_tokens: usize,
        repetitions: usize,
        budget: Duration,
    ) -> Result<Vec<Duration>, EngineError> {
        self.measure_costs(
            context,
            max_tokens,
            repetitions,
            budget,
            Sweeps::WarmUpFirst,
        )
    }

    fn measure_costs(
        &mut self,
        context: &[Token],
        max_tokens: usize,
        repetitions: usize,
        budget: Duration,
        sweeps: Sweeps,
    ) -> Result<Vec<Duration>, EngineError> {
        self.check_cost_probe(context, max_tokens, repetitions)?;
        let started = Instant::now();
        let first = match sweeps {
            Sweeps::WarmUpFirst => 0,
            Sweeps::AllMeasured => 1,
        };
        let n_past = context.len();
        let batch: Vec<Token> = context.iter().copied().cycle().take(max_tokens).collect();
        self.context.clear();
        self.decode_prompt(context, &mut || false)?;
        let mut samples = vec![Vec::with_capacity(repetitions); max_tokens];
        for repetition in first..=repetitions {
            if repetition > 1 && started.elapsed() >= budget {
                break;
            }
            for n_tokens in 1..=max_tokens {
                if n_tokens == 1 {
                    // Plain decoding's single tokens follow single tokens, and llama.cpp reuses
                    // the graph of the one before; the sweep's last decode was the largest. One
                    // untimed single token first prices the next as plain decoding pays it.
                    self.decode_round(batch[0], &[], n_past)?;
                    self.context
                        .remove_from(n_past)
                        .map_err(|e| decode_error(1, e))?;
                }
                let started = Instant::now();
                self.decode_round(batch[0], &batch[1..n_tokens], n_past)?;
                let elapsed = started.elapsed();
                self.context
                    .remove_from(n_past)
                    .map_err(|e| decode_error(n_tokens, e))?;
                // Repetition 0 warms caches and thread pools up; it is not measured.
                if repetition > 0 {
                    samples[n_tokens - 1].push(elapsed);
                }
            }
        }
        self.context.clear();
        Ok(samples.iter_mut().map(|s| median(s)).collect())
    }

    /// Measures the verify cost curve after synthetic contexts of each of `context_lens` tokens
    /// (those that fit, each with a batch of up to `max_tokens`), sharing `budget` between them
    /// as [`Self::measure_verify_costs_within`] does, and gives it to requests from now on (a
    /// server's slot, at start-up). Leaves the KV cache empty.
    pub fn measure_verify_curve(
        &mut self,
        context_lens: &[usize],
        max_tokens: usize,
        repetitions: usize,
        budget: Duration,
    ) -> Result<&VerifyCurve, EngineError> {
        let vocab_size = self.target.vocab_size().max(1);
        let per_point = budget / u32::try_from(context_lens.len().max(1)).unwrap_or(u32::MAX);
        let mut points = Vec::with_capacity(context_lens.len());
        for &context_len in context_lens {
            let room = (self.ctx_size() as usize).saturating_sub(context_len);
            let largest = max_tokens.min(self.batch_size).min(room);
            if context_len == 0 || largest == 0 {
                continue;
            }
            let context: Vec<Token> = (0..context_len as u32).map(|i| i % vocab_size).collect();
            // The first context's warm-up sweep warms caches and thread pools for all.
            let sweeps = if points.is_empty() {
                Sweeps::WarmUpFirst
            } else {
                Sweeps::AllMeasured
            };
            let costs = self.measure_costs(&context, largest, repetitions, per_point, sweeps)?;
            points.push((context_len, costs));
        }
        self.set_verify_curve(VerifyCurve::new(points));
        Ok(&self.verify_curve)
    }

    fn check_cost_probe(
        &self,
        context: &[Token],
        max_tokens: usize,
        repetitions: usize,
    ) -> Result<(), EngineError> {
        let problem = |problem: String| Err(EngineError::VerifyCost { problem });
        if context.is_empty() {
            return problem("the context is empty; give at least one token".into());
        }
        if max_tokens == 0 || repetitions == 0 {
            return problem(format!(
                "asked for batches of up to {max_tokens} tokens, {repetitions} times; both must be at least 1"
            ));
        }
        if max_tokens > self.batch_size {
            return problem(format!(
                "batches of {max_tokens} tokens exceed the session's batch size of {}; measure at most that many",
                self.batch_size
            ));
        }
        let needed = context.len() + max_tokens;
        let ctx_size = self.ctx_size() as usize;
        if needed > ctx_size {
            return problem(format!(
                "a context of {} tokens plus a batch of {max_tokens} needs {needed} cells, the session has {ctx_size}; use a shorter context or a larger --ctx-size",
                context.len()
            ));
        }
        Ok(())
    }
}

/// Whether a measurement starts with an unmeasured warm-up sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sweeps {
    /// One warm-up sweep over every size, then the measured ones.
    WarmUpFirst,
    /// Every sweep is measured (the caches are warm already).
    AllMeasured,
}

/// The median of `samples` (the mean of the two middle values for an even count); zero for
/// none.
fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    let middle = samples.len() / 2;
    match samples.len() {
        0 => Duration::ZERO,
        n if n.is_multiple_of(2) => (samples[middle - 1] + samples[middle]) / 2,
        _ => samples[middle],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cascade::curve_cost;

    #[test]
    fn a_price_is_the_cost_of_the_interpolated_curve_at_that_size() {
        let ms = |n: u64| Duration::from_micros(n * 997);
        let curves = [
            VerifyCurve::default(),
            VerifyCurve::new(vec![(64, vec![ms(10), ms(12), ms(15)])]),
            VerifyCurve::new(vec![
                (64, vec![ms(10), ms(12), ms(15), ms(17)]),
                (520, vec![ms(11), ms(16), ms(23)]),
                (1024, vec![ms(13), ms(21), ms(30), ms(41)]),
            ]),
        ];
        for curve in &curves {
            for context in [1, 64, 100, 520, 700, 1024, 3000] {
                for rows in 1..=6 {
                    let want = curve_cost(&curve.at(context), rows);
                    let got = curve.price(context, rows);
                    assert!(
                        got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                        "context {context}, {rows} rows: {got} against {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_curve_interpolates_linearly_in_the_context_length() {
        let ms = Duration::from_millis;
        let curve = VerifyCurve::new(vec![
            (1064, vec![ms(12), ms(40)]),
            (64, vec![ms(6), ms(10), ms(14)]),
        ]);
        assert_eq!(
            curve.at(0),
            vec![ms(6), ms(10), ms(14)],
            "below: the shortest"
        );
        assert_eq!(
            curve.at(564),
            vec![ms(9), ms(25)],
            "halfway, as many sizes as both have"
        );
        assert_eq!(curve.at(1064), vec![ms(12), ms(40)]);
        assert_eq!(
            curve.at(2064),
            vec![ms(18), ms(70)],
            "past the longest: extrapolated"
        );
        assert!(VerifyCurve::default().at(100).is_empty());
        let single = VerifyCurve::new(vec![(64, vec![ms(6)])]);
        assert_eq!(single.at(5000), vec![ms(6)]);
    }

    #[test]
    fn median_of_odd_even_and_empty_samples() {
        let ms = Duration::from_millis;
        assert_eq!(median(&mut [ms(3), ms(1), ms(2)]), ms(2));
        assert_eq!(
            median(&mut [ms(4), ms(1), ms(3), ms(2)]),
            Duration::from_micros(2500)
        );
        assert_eq!(median(&mut []), Duration::ZERO);
    }
}
