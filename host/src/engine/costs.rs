//! The target's verify cost curve: how long one batch of `n` tokens (logits at every position)
//! takes, for `n = 1..=max_n`.
//!
//! The `cost` policy uses it to choose the draft length that maximizes committed tokens per
//! second, and the benchmark to compute the ideal speedup for an acceptance rate. It is measured
//! on the session's own context, after a filler prompt of [`CONTEXT_LEN`] tokens so attention
//! has something to read, at a few lengths ([`SAMPLED_LENGTHS`], the fastest of
//! [`REPETITIONS`] runs each: on a shared machine, interference only ever adds time, so the
//! minimum is the best estimate of the batch's own cost), and linearly interpolated in between:
//! on CPU the cost is close to piecewise linear in `n`, and measuring every length would take
//! seconds on larger models.
//! The KV cache is cleared afterwards.

use std::time::{Duration, Instant};

use super::error::EngineError;
use super::verify::Session;

/// Tokens of filler context the batches are decoded after.
pub const CONTEXT_LEN: usize = 128;
/// Batch sizes measured; others are interpolated.
pub const SAMPLED_LENGTHS: &[usize] = &[1, 2, 4, 8, 12, 16, 24, 32, 48, 64];
/// Timed runs per sampled length (after one untimed warm-up batch).
pub const REPETITIONS: usize = 3;

impl Session<'_> {
    /// Measures the time to verify `n` tokens in one batch, for `n = 1..=max_n`, at index
    /// `n - 1`. Clears the KV cache. Errors if the context is too small for the filler plus
    /// `max_n` tokens, or a decode fails.
    pub fn measure_verify_costs(&mut self, max_n: usize) -> Result<Vec<Duration>, EngineError> {
        let max_n = max_n.max(1);
        let filler = self.filler_tokens(CONTEXT_LEN);
        let mut lengths: Vec<usize> = SAMPLED_LENGTHS
            .iter()
            .copied()
            .filter(|&n| n < max_n)
            .collect();
        lengths.push(max_n);
        self.clear();
        self.decode_at(&filler, 0, false)?;
        // Warm-up: thread pool start, first touch of the batch buffers.
        self.decode_at(&filler[..max_n.min(filler.len())], CONTEXT_LEN, true)?;
        self.truncate(CONTEXT_LEN)?;
        let mut samples = Vec::with_capacity(lengths.len());
        for &n in &lengths {
            let batch: Vec<_> = filler.iter().cycle().take(n).copied().collect();
            let mut runs = Vec::with_capacity(REPETITIONS);
            for _ in 0..REPETITIONS {
                let started = Instant::now();
                self.decode_at(&batch, CONTEXT_LEN, true)?;
                runs.push(started.elapsed());
                self.truncate(CONTEXT_LEN)?;
            }
            let fastest = runs.into_iter().min().unwrap_or_default();
            samples.push((n, fastest));
        }
        self.clear();
        Ok(interpolate(&samples, max_n))
    }
}

/// Costs for `n = 1..=max_n` from `samples` (sorted by `n`, the first at `n = 1`), linear
/// between samples and flat before the first.
fn interpolate(samples: &[(usize, Duration)], max_n: usize) -> Vec<Duration> {
    (1..=max_n)
        .map(|n| {
            let upper = samples.iter().position(|&(m, _)| m >= n);
            match upper {
                Some(0) | None => samples.first().map_or(Duration::ZERO, |&(_, c)| c),
                Some(index) => {
                    let (n0, c0) = samples[index - 1];
                    let (n1, c1) = samples[index];
                    let t = (n - n0) as f64 / (n1 - n0) as f64;
                    c0.mul_f64(1.0 - t) + c1.mul_f64(t)
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpolates_linearly_between_samples() {
        let ms = Duration::from_millis;
        let costs = interpolate(&[(1, ms(10)), (3, ms(14)), (7, ms(30))], 7);
        let expected = [10, 12, 14, 18, 22, 26, 30].map(ms);
        assert_eq!(costs, expected.to_vec());
    }
}
