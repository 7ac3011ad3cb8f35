//! The draft-model bridge: ask the host's draft model (`--draft-model`) for tokens.
//!
//! The host runs a second, smaller model natively and keeps one draft context per source; the
//! plugin decides what that context holds ([`reset`], [`feed`]), how many tokens to ask for and
//! where to stop ([`propose`]). A drafter built on it typically resets in
//! [`Drafter::new`](crate::Drafter::new), feeds what its own `feed` receives, and turns the
//! drafted tokens' probabilities into a [`Proposal`](crate::Proposal)'s confidence. When the
//! host has no draft model, [`available`] is false, every other call does nothing and
//! [`propose`] returns nothing.
//!
//! Time the host spends computing in these calls does not count against the plugin's deadline.
//!
//! Built natively, for tests, the calls go to a fake installed on the current thread with
//! [`crate::testing::install_draft_model`]: a function from a context to the next token. The SDK
//! keeps the context and applies `max_draft_len` and `p_min` as the host does; without a fake,
//! [`available`] is false.
//!
//! ```
//! use spechost_sdk::testing::install_draft_model;
//! use spechost_sdk::{DraftedToken, draft_model};
//!
//! /// A fake draft model that counts up, less and less sure of itself.
//! install_draft_model(|context| {
//!     let &last = context.last()?;
//!     Some(DraftedToken { token: last + 1, prob: 1.0 / last as f32 })
//! });
//!
//! assert!(draft_model::available());
//! draft_model::reset();
//! draft_model::feed(&[1]);
//! let tokens: Vec<u32> = draft_model::propose(8, 0.3)
//!     .iter()
//!     .map(|drafted| drafted.token)
//!     .collect();
//! // 2 (prob 1), 3 (prob 0.5), 4 (prob 0.33), 5 (prob 0.25 < 0.3: returned, then stop).
//! assert_eq!(tokens, [2, 3, 4, 5]);
//! ```

use crate::records::{DraftedPosition, DraftedToken, Token};

/// Whether the host has a draft model loaded. When it has not, [`reset`] and [`feed`] do nothing
/// and [`propose`] returns nothing.
pub fn available() -> bool {
    backend::available()
}

/// Empties the draft model's context: call it at the start of a request (in
/// [`Drafter::new`](crate::Drafter::new)), or before feeding a different context.
pub fn reset() {
    backend::reset();
}

/// Appends committed tokens to the draft model's context.
///
/// Evaluation is lazy: the host decodes them at the next [`propose`], reusing its cache for
/// tokens it already drafted, so feeding each round's committed tokens is cheap.
pub fn feed(tokens: &[Token]) {
    backend::feed(tokens);
}

/// Greedily drafts up to `max_draft_len` tokens continuing the context.
///
/// Stops early after the first token whose probability is below `p_min`; that token is still
/// returned, so the caller sees why drafting stopped (and usually drops it). The drafted tokens
/// are not added to the context: [`feed`] the ones the target commits.
pub fn propose(max_draft_len: usize, p_min: f32) -> Vec<DraftedToken> {
    backend::propose(max_draft_len, p_min)
}

/// As [`propose`], also giving the draft model's second choice at each position where its
/// greedy token's probability is below `split_below` (WIT 0.8.2): where a tree proposal may
/// branch ([`crate::tree`]). The second choice comes from the same distribution, without
/// another decode, and is not continued. A draw (a request at a temperature) gives no second
/// choices.
pub fn propose_with_runners_up(
    max_draft_len: usize,
    p_min: f32,
    split_below: f32,
) -> Vec<DraftedPosition> {
    backend::propose_with_runners_up(max_draft_len, p_min, split_below)
}

#[cfg(target_arch = "wasm32")]
use crate::bindings::drafter::draft_model as backend;

#[cfg(not(target_arch = "wasm32"))]
pub(crate) use self::native as backend;

/// The per-thread fake that stands in for the host's draft model natively.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod native {
    use std::cell::RefCell;

    use crate::records::{DraftedPosition, DraftedToken, Token};

    /// A fake's next-token function: the greedy next token after a context, or `None` to stop;
    /// or, as a runner-up function, the second choice there.
    pub(crate) type NextToken = Box<dyn FnMut(&[Token]) -> Option<DraftedToken>>;

    struct Fake {
        next_token: NextToken,
        runner_up: Option<NextToken>,
        context: Vec<Token>,
    }

    thread_local! {
        static FAKE: RefCell<Option<Fake>> = const { RefCell::new(None) };
    }

    pub(crate) fn install(next_token: NextToken) {
        FAKE.set(Some(Fake {
            next_token,
            runner_up: None,
            context: Vec::new(),
        }));
    }

    /// Gives the installed fake second choices; `false` when none is installed.
    pub(crate) fn install_runner_up(runner_up: NextToken) -> bool {
        FAKE.with_borrow_mut(|fake| match fake {
            Some(fake) => {
                fake.runner_up = Some(runner_up);
                true
            }
            None => false,
        })
    }

    pub(crate) fn remove() {
        FAKE.set(None);
    }

    pub(crate) fn context() -> Option<Vec<Token>> {
        FAKE.with_borrow(|fake| fake.as_ref().map(|fake| fake.context.clone()))
    }

    pub(crate) fn available() -> bool {
        FAKE.with_borrow(Option::is_some)
    }

    pub(crate) fn reset() {
        FAKE.with_borrow_mut(|fake| {
            if let Some(fake) = fake {
                fake.context.clear();
            }
        });
    }

    pub(crate) fn feed(tokens: &[Token]) {
        FAKE.with_borrow_mut(|fake| {
            if let Some(fake) = fake {
                fake.context.extend_from_slice(tokens);
            }
        });
    }

    pub(crate) fn propose(max_draft_len: usize, p_min: f32) -> Vec<DraftedToken> {
        propose_with_runners_up(max_draft_len, p_min, 0.0)
            .into_iter()
            .map(|position| position.chosen)
            .collect()
    }

    pub(crate) fn propose_with_runners_up(
        max_draft_len: usize,
        p_min: f32,
        split_below: f32,
    ) -> Vec<DraftedPosition> {
        FAKE.with_borrow_mut(|fake| {
            let Some(Fake {
                next_token,
                runner_up,
                context,
            }) = fake
            else {
                return Vec::new();
            };
            // Drafted tokens extend the context while drafting, and are taken off again after:
            // the host never adds them to the context either.
            let fed = context.len();
            let mut drafted = Vec::new();
            while drafted.len() < max_draft_len {
                let Some(next) = next_token(context) else {
                    break;
                };
                assert!(
                    (0.0..=1.0).contains(&next.prob),
                    "the fake draft model gave token {} probability {}; give probabilities in \
                     [0, 1], as the host does",
                    next.token,
                    next.prob
                );
                let second = if next.prob < split_below {
                    runner_up.as_mut().and_then(|runner_up| runner_up(context))
                } else {
                    None
                };
                drafted.push(DraftedPosition {
                    chosen: next,
                    runner_up: second,
                });
                context.push(next.token);
                if next.prob < p_min {
                    break;
                }
            }
            context.truncate(fed);
            drafted
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{draft_model_context, install_draft_model, remove_draft_model};

    /// The sequence the fake continues, and the probability it gives each position.
    const SEQUENCE: [Token; 6] = [10, 11, 12, 13, 14, 15];
    const PROBS: [f32; 6] = [0.9, 0.9, 0.8, 0.2, 0.9, 0.9];

    fn install_sequence() {
        install_draft_model(|context| {
            let position = context.len();
            Some(DraftedToken {
                token: *SEQUENCE.get(position)?,
                prob: PROBS[position],
            })
        });
    }

    fn tokens(drafted: &[DraftedToken]) -> Vec<Token> {
        drafted.iter().map(|drafted| drafted.token).collect()
    }

    #[test]
    fn without_a_fake_nothing_is_available() {
        assert!(!available());
        reset();
        feed(&[1, 2]);
        assert_eq!(propose(4, 0.0), []);
        assert_eq!(draft_model_context(), None);
    }

    #[test]
    fn proposes_up_to_max_draft_len_from_the_fed_context() {
        install_sequence();
        assert!(available());
        feed(&[10]);
        assert_eq!(tokens(&propose(2, 0.0)), [11, 12]);
        assert_eq!(
            draft_model_context(),
            Some(vec![10]),
            "drafted tokens stay out of the context"
        );
        feed(&[11, 12]);
        assert_eq!(tokens(&propose(8, 0.0)), [13, 14, 15]);
        assert_eq!(propose(0, 0.0), []);
    }

    #[test]
    fn stops_after_the_first_token_below_p_min() {
        install_sequence();
        let drafted = propose(6, 0.5);
        assert_eq!(tokens(&drafted), [10, 11, 12, 13]);
        assert_eq!(drafted[3].prob, 0.2, "the stopping token is returned");
    }

    #[test]
    fn reset_empties_the_context_and_remove_uninstalls() {
        install_sequence();
        feed(&[10, 11]);
        reset();
        assert_eq!(draft_model_context(), Some(Vec::new()));
        assert_eq!(tokens(&propose(1, 0.0)), [10]);
        remove_draft_model();
        assert!(!available());
    }

    #[test]
    fn second_choices_come_where_the_greedy_token_is_unsure() {
        install_sequence();
        // The runner-up after a context: one more than the greedy token.
        assert!(crate::testing::install_runner_up(|context| {
            Some(DraftedToken {
                token: SEQUENCE[context.len()] + 100,
                prob: 0.1,
            })
        }));
        let drafted = propose_with_runners_up(5, 0.0, 0.85);
        let runners_up: Vec<Option<Token>> = drafted
            .iter()
            .map(|position| position.runner_up.map(|runner_up| runner_up.token))
            .collect();
        // Probabilities 0.9 0.9 0.8 0.2 0.9: second choices at 12 and 13.
        assert_eq!(runners_up, [None, None, Some(112), Some(113), None]);
        assert_eq!(
            tokens(&propose(5, 0.0)),
            [10, 11, 12, 13, 14],
            "the same greedy tokens"
        );
        remove_draft_model();
        assert!(!crate::testing::install_runner_up(|_| None), "no fake");
    }

    #[test]
    #[should_panic(expected = "probability 1.5")]
    fn panics_on_a_fake_probability_outside_zero_one() {
        install_draft_model(|_| {
            Some(DraftedToken {
                token: 1,
                prob: 1.5,
            })
        });
        propose(1, 0.0);
    }
}
