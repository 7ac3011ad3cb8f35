//! What drafting with the draft model costs, measured at start-up on a context like those its
//! sources draft with (the same threads and settings; `run` and `bench` on the draft CPUs when
//! given), so that a policy can price the draft model before its first ask (WIT
//! `policy-setup.draft-model`).
//!
//! Each repetition catches a fresh context of [`CATCH_UP_TOKENS`] synthetic tokens up and drafts
//! [`DRAFTED_TOKENS`] after it, never stopping early; the catch-up's decodes are timed apart
//! from the drafting (`Drafted::catch_up_time`). One unmeasured warm-up first, then the median
//! of [`REPETITIONS`].

use std::time::{Duration, Instant};

use crate::cascade::{DraftModel, DraftModelCosts, Drafted, ProposalSettings, Token};

/// Context tokens each repetition catches up with (fewer when the context is smaller): a
/// prompt's length, so that the drafting after it attends to a context of that size too.
const CATCH_UP_TOKENS: usize = 256;
/// Tokens each repetition drafts.
const DRAFTED_TOKENS: usize = 8;
/// Measured repetitions, after one warm-up.
const REPETITIONS: usize = 3;

/// Measures `model`, a fresh context of the draft model as a plugin instance gets it (`run`,
/// `bench`); leaves it empty. `None` when it drafts nothing (see [`measure`]). The costs'
/// `agreement` is left to [`super::measure_agreement`].
pub fn measure_draft_model(
    model: &mut dyn DraftModel,
    vocab_size: u32,
    ctx_size: usize,
) -> Option<DraftModelCosts> {
    measure(vocab_size, ctx_size, |context, max_draft_len| {
        model.reset();
        model.feed(context);
        let drafted = model.propose(ProposalSettings::greedy(max_draft_len, 0.0));
        model.reset();
        drafted
    })
}

/// Runs the repetitions through `draft(context, max_draft_len)`, which drafts after `context`
/// from an empty cache. `None`, with a warning, when the context cannot hold a measurement or a
/// repetition drafted nothing (the draft model failed); policies then learn the cost from
/// their asks.
fn measure(
    vocab_size: u32,
    ctx_size: usize,
    draft: impl FnMut(&[Token], usize) -> Drafted,
) -> Option<DraftModelCosts> {
    let measured = repeat(vocab_size, ctx_size, draft);
    match measured {
        Some(costs) => tracing::info!(
            per_token_ms = costs.per_token.as_secs_f64() * 1e3,
            catch_up_per_token_ms = costs.catch_up_per_token.as_secs_f64() * 1e3,
            "measured the draft model"
        ),
        None => tracing::warn!(
            ctx_size,
            "cannot measure the draft model; policies learn its cost from their asks"
        ),
    }
    measured
}

fn repeat(
    vocab_size: u32,
    ctx_size: usize,
    mut draft: impl FnMut(&[Token], usize) -> Drafted,
) -> Option<DraftModelCosts> {
    let context_len = CATCH_UP_TOKENS.min(ctx_size.saturating_sub(DRAFTED_TOKENS));
    if context_len == 0 || vocab_size == 0 {
        return None;
    }
    let mut per_token = Vec::with_capacity(REPETITIONS);
    let mut catch_up_per_token = Vec::with_capacity(REPETITIONS);
    for repetition in 0..=REPETITIONS {
        // Each repetition's context starts with another token, so nothing of the last is reused.
        let context: Vec<Token> = (0..context_len)
            .map(|i| ((repetition * context_len + i) as u32) % vocab_size)
            .collect();
        let started = Instant::now();
        let drafted = draft(&context, DRAFTED_TOKENS);
        let elapsed = started.elapsed();
        if drafted.tokens.is_empty() {
            return None;
        }
        if repetition == 0 {
            continue;
        }
        let drafting = elapsed.saturating_sub(drafted.catch_up_time);
        per_token.push(drafting / drafted.tokens.len() as u32);
        catch_up_per_token.push(drafted.catch_up_time / context_len as u32);
    }
    Some(DraftModelCosts {
        per_token: median(&mut per_token),
        catch_up_per_token: median(&mut catch_up_per_token),
        agreement: None,
    })
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cascade::DraftedToken;

    /// A draft model that takes `catch_up` per context token and `per_token` per drafted token,
    /// by sleeping, and drafts token 1.
    struct Timed {
        fed: usize,
        catch_up: Duration,
        per_token: Duration,
    }

    impl DraftModel for Timed {
        fn reset(&mut self) {
            self.fed = 0;
        }

        fn feed(&mut self, tokens: &[Token]) {
            self.fed += tokens.len();
        }

        fn propose(&mut self, settings: ProposalSettings) -> Drafted {
            let max_draft_len = settings.max_draft_len;
            let catch_up_time = self.catch_up * self.fed as u32;
            std::thread::sleep(catch_up_time + self.per_token * max_draft_len as u32);
            Drafted {
                tokens: vec![
                    DraftedToken {
                        token: 1,
                        prob: 1.0
                    };
                    max_draft_len
                ],
                catch_up_time,
                ..Drafted::default()
            }
        }
    }

    #[test]
    fn drafting_is_priced_apart_from_catching_up() {
        let mut model = Timed {
            fed: 0,
            catch_up: Duration::from_micros(50),
            per_token: Duration::from_millis(2),
        };
        let costs = measure_draft_model(&mut model, 100, 4096).expect("measured");
        assert_eq!(costs.catch_up_per_token, Duration::from_micros(50));
        // Sleeping oversleeps; it never undersleeps.
        assert!(
            costs.per_token >= Duration::from_millis(2)
                && costs.per_token < Duration::from_millis(4),
            "{costs:?}"
        );
    }

    #[test]
    fn a_draft_model_that_drafts_nothing_has_no_costs() {
        struct Silent;
        impl DraftModel for Silent {
            fn reset(&mut self) {}
            fn feed(&mut self, _tokens: &[Token]) {}
            fn propose(&mut self, _settings: ProposalSettings) -> Drafted {
                Drafted::default()
            }
        }
        assert_eq!(measure_draft_model(&mut Silent, 100, 4096), None);
        assert_eq!(
            measure_draft_model(&mut Silent, 100, DRAFTED_TOKENS),
            None,
            "no room for a context"
        );
    }
}
