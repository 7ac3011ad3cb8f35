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

use super::{Session, decode_error};
use crate::cascade::Token;
use crate::engine::EngineError;

/// Default repetitions of [`Session::measure_verify_costs`].
pub const DEFAULT_COST_REPETITIONS: usize = 5;

impl Session<'_> {
    /// Measures one verify batch of `n` tokens after `context`, for `n = 1..=max_tokens`:
    /// `costs[n - 1]` is the median over `repetitions` of one `llama_decode` of `n` tokens with
    /// logits at every position. The batch's token ids repeat the context's (the cost does not
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
        self.check_cost_probe(context, max_tokens, repetitions)?;
        let n_past = context.len();
        let batch: Vec<Token> = context.iter().copied().cycle().take(max_tokens).collect();
        self.context.clear();
        self.decode_prompt(context)?;
        let mut samples = vec![Vec::with_capacity(repetitions); max_tokens];
        for repetition in 0..=repetitions {
            for n_tokens in 1..=max_tokens {
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
