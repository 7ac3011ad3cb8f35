//! A level's figures from its answers' client-side timings: aggregate throughput, and the
//! spread of time to first token and of time per output token over its requests.

use std::time::Duration;

use serde::Serialize;

use super::super::stats::percentile;
use super::client::Streamed;

/// The 50th and 95th percentiles of a sample, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Percentiles {
    /// The median.
    pub p50_ms: f64,
    /// The 95th percentile.
    pub p95_ms: f64,
}

impl Percentiles {
    /// The percentiles of `durations`; `None` when there are none.
    pub fn of(durations: &[Duration]) -> Option<Self> {
        let millis: Vec<f64> = durations.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        Some(Self {
            p50_ms: percentile(&millis, 0.5)?,
            p95_ms: percentile(&millis, 0.95)?,
        })
    }
}

/// What one level (a configuration at a client count) measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LevelFigures {
    /// Requests measured (the warm-up left out).
    pub requests: usize,
    /// Their generated tokens, as the server's `usage` counts them.
    pub completion_tokens: usize,
    /// From the level's first request sent to its last answer read, in seconds.
    pub wall_seconds: f64,
    /// `completion_tokens / wall_seconds`: what the server delivered to all clients together.
    pub tokens_per_second: f64,
    /// Time to first token over the requests that streamed any text.
    pub time_to_first_token: Option<Percentiles>,
    /// Time per output token over the requests with at least two tokens: (last token time −
    /// first token time) / (tokens − 1).
    pub time_per_output_token: Option<Percentiles>,
    /// Tokens after each request's first over the time after it, summed over the requests:
    /// the generation speed `spechost run` reports (prompt excluded).
    pub generation_tokens_per_second: f64,
}

/// `answer`'s mean time per token after its first; `None` with fewer than two tokens.
pub fn time_per_output_token(answer: &Streamed) -> Option<Duration> {
    let gaps = u32::try_from(answer.completion_tokens.checked_sub(1)?).ok()?;
    (gaps > 0).then(|| answer.generation_time / gaps)
}

/// The figures of a level whose `answers` took `wall_time` together.
pub fn figures(answers: &[Streamed], wall_time: Duration) -> LevelFigures {
    let completion_tokens: usize = answers.iter().map(|a| a.completion_tokens).sum();
    let wall_seconds = wall_time.as_secs_f64();
    let first_tokens: Vec<Duration> = answers
        .iter()
        .filter_map(|a| a.time_to_first_token)
        .collect();
    let per_token: Vec<Duration> = answers.iter().filter_map(time_per_output_token).collect();
    let timed_tokens: usize = answers
        .iter()
        .map(|a| a.completion_tokens.saturating_sub(1))
        .sum();
    let generation_seconds: f64 = answers
        .iter()
        .map(|a| a.generation_time.as_secs_f64())
        .sum();
    LevelFigures {
        requests: answers.len(),
        completion_tokens,
        wall_seconds,
        tokens_per_second: rate(completion_tokens, wall_seconds),
        time_to_first_token: Percentiles::of(&first_tokens),
        time_per_output_token: Percentiles::of(&per_token),
        generation_tokens_per_second: rate(timed_tokens, generation_seconds),
    }
}

/// `tokens / seconds`, 0 when nothing was timed.
fn rate(tokens: usize, seconds: f64) -> f64 {
    if seconds > 0.0 {
        tokens as f64 / seconds
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(tokens: usize, first_ms: u64, generation_ms: u64) -> Streamed {
        Streamed {
            text: String::new(),
            completion_tokens: tokens,
            time_to_first_token: (tokens > 0).then(|| Duration::from_millis(first_ms)),
            generation_time: Duration::from_millis(generation_ms),
        }
    }

    #[test]
    fn time_per_output_token_spreads_generation_over_the_tokens_after_the_first() {
        assert_eq!(
            time_per_output_token(&answer(11, 50, 100)),
            Some(Duration::from_millis(10))
        );
        assert_eq!(time_per_output_token(&answer(1, 50, 0)), None);
        assert_eq!(time_per_output_token(&answer(0, 0, 0)), None);
    }

    #[test]
    fn level_figures_take_tokens_over_wall_time_and_percentiles_over_requests() {
        let answers = [answer(11, 20, 100), answer(21, 40, 100), answer(1, 60, 0)];
        let level = figures(&answers, Duration::from_secs(2));
        assert_eq!(
            (level.requests, level.completion_tokens),
            (3, 33),
            "{level:?}"
        );
        assert!((level.tokens_per_second - 16.5).abs() < 1e-9, "{level:?}");
        assert_eq!(
            level.time_to_first_token,
            Some(Percentiles {
                p50_ms: 40.0,
                p95_ms: 58.0
            }),
            "{level:?}"
        );
        let per_token = level
            .time_per_output_token
            .expect("two requests have 2+ tokens");
        assert!(
            (per_token.p50_ms - 7.5).abs() < 1e-9 && (per_token.p95_ms - 9.75).abs() < 1e-9,
            "10 ms and 5 ms per token: {per_token:?}"
        );
        assert!(
            (level.generation_tokens_per_second - 150.0).abs() < 1e-9,
            "30 tokens after the first in 0.2 s: {level:?}"
        );
        assert_eq!(figures(&[], Duration::ZERO).tokens_per_second, 0.0);
    }

    #[test]
    fn an_answer_without_text_has_no_time_to_first_token() {
        let level = figures(
            &[answer(0, 0, 0), answer(5, 100, 40)],
            Duration::from_secs(1),
        );
        assert_eq!(
            level.time_to_first_token,
            Some(Percentiles {
                p50_ms: 100.0,
                p95_ms: 100.0
            })
        );
        assert_eq!(
            figures(&[answer(0, 0, 0)], Duration::ZERO).time_to_first_token,
            None
        );
    }
}
