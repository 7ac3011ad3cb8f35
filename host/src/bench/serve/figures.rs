//! A level's figures from its answers' client-side timings: aggregate throughput (the median
//! over the level's passes), and the spread of time to first token and of time per output token
//! over every pass's requests.

use std::time::Duration;

use serde::Serialize;

use super::super::stats::{Summary, percentile};
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

/// One measured pass of a level: every client's answers and the pass's wall time, from its
/// first request sent to its last answer read.
#[derive(Debug, Clone)]
pub struct Pass {
    /// Every client's answers.
    pub answers: Vec<Streamed>,
    /// The pass's wall time.
    pub wall_time: Duration,
}

impl Pass {
    /// Completion tokens over wall time: what the server delivered to all clients together.
    pub fn tokens_per_second(&self) -> f64 {
        let tokens = self.answers.iter().map(|a| a.completion_tokens).sum();
        rate(tokens, self.wall_time.as_secs_f64())
    }
}

/// What one level (a configuration at a client count) measured over its passes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LevelFigures {
    /// Requests measured over every pass (the warm-ups left out).
    pub requests: usize,
    /// Their generated tokens, as the server's `usage` counts them.
    pub completion_tokens: usize,
    /// The passes' wall times together, in seconds.
    pub wall_seconds: f64,
    /// The median over the passes of each pass's completion tokens over its wall time: what
    /// the server delivered to all clients together.
    pub tokens_per_second: f64,
    /// Each pass's tok/s, in the order measured.
    pub pass_tokens_per_second: Vec<f64>,
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

/// The figures of a level measured in `passes`.
pub fn figures(passes: &[Pass]) -> LevelFigures {
    let answers: Vec<&Streamed> = passes.iter().flat_map(|pass| &pass.answers).collect();
    let completion_tokens: usize = answers.iter().map(|a| a.completion_tokens).sum();
    let wall_seconds = passes.iter().map(|pass| pass.wall_time.as_secs_f64()).sum();
    let pass_tokens_per_second: Vec<f64> = passes.iter().map(Pass::tokens_per_second).collect();
    let first_tokens: Vec<Duration> = answers
        .iter()
        .filter_map(|a| a.time_to_first_token)
        .collect();
    let per_token: Vec<Duration> = answers
        .iter()
        .filter_map(|a| time_per_output_token(a))
        .collect();
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
        tokens_per_second: Summary::of(&pass_tokens_per_second).map_or(0.0, |s| s.median),
        pass_tokens_per_second,
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

    fn pass(answers: &[Streamed], wall_ms: u64) -> Pass {
        Pass {
            answers: answers.to_vec(),
            wall_time: Duration::from_millis(wall_ms),
        }
    }

    #[test]
    fn level_figures_take_tokens_over_wall_time_and_percentiles_over_requests() {
        let answers = [answer(11, 20, 100), answer(21, 40, 100), answer(1, 60, 0)];
        let level = figures(&[pass(&answers, 2000)]);
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
        assert_eq!(figures(&[]).tokens_per_second, 0.0);
        assert_eq!(figures(&[pass(&[], 0)]).tokens_per_second, 0.0);
    }

    #[test]
    fn level_tok_s_is_the_median_pass_and_latencies_pool_every_pass() {
        let passes = [
            pass(&[answer(11, 10, 100)], 1000),
            pass(&[answer(11, 30, 100)], 250),
            pass(&[answer(11, 20, 100)], 500),
        ];
        let level = figures(&passes);
        assert_eq!(level.pass_tokens_per_second, vec![11.0, 44.0, 22.0]);
        assert!(
            (level.tokens_per_second - 22.0).abs() < 1e-9,
            "the median pass, not 33 tokens over 1.75 s: {level:?}"
        );
        assert_eq!((level.requests, level.completion_tokens), (3, 33));
        assert!((level.wall_seconds - 1.75).abs() < 1e-9, "{level:?}");
        assert_eq!(
            level.time_to_first_token,
            Some(Percentiles {
                p50_ms: 20.0,
                p95_ms: 29.0
            }),
            "over every pass's requests: {level:?}"
        );
    }

    #[test]
    fn an_answer_without_text_has_no_time_to_first_token() {
        let level = figures(&[pass(&[answer(0, 0, 0), answer(5, 100, 40)], 1000)]);
        assert_eq!(
            level.time_to_first_token,
            Some(Percentiles {
                p50_ms: 100.0,
                p95_ms: 100.0
            })
        );
        assert_eq!(
            figures(&[pass(&[answer(0, 0, 0)], 0)]).time_to_first_token,
            None
        );
    }
}
