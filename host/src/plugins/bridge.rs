//! The WIT `draft-model` import: a plugin instance's handle on the host's draft model.
//!
//! Each instance gets its own [`DraftModel`] context, opened from the process's
//! [`DraftModelFactory`] at the instance's first proposal: until then the tokens it feeds wait
//! here (a few, or [`MAX_WAITING_TOKENS`] at most, which opens the context), so a plugin whose
//! policy never asks it to draft never costs a context (opening one takes tens of
//! milliseconds). The time the host spends in these calls is credited back to the guest call's
//! deadline (see `sandbox::CallClock`): the deadline bounds the plugin's own code, not the
//! native model it asked to run.
//!
//! At a request's temperature, a proposal asked inside the source's `propose` call is drawn
//! from the draft model's distribution, and the draw is *committed*: it becomes the source's
//! proposal for the round whatever the plugin then returns (see `cascade::SampledDraft`), and
//! asking again in the same call returns the same draw. Rejection sampling is exact only if
//! the draft verified was not chosen after seeing it.

use std::sync::Arc;
use std::time::Duration;

use super::bindings::{DraftModelHost, DraftedPosition, DraftedToken};
use super::sandbox::{HostState, Moment};
use crate::cascade::{
    DraftModel, DraftModelFactory, DraftSampling, Drafted, ProposalSettings, SampledDraft, Token,
};

/// Longest draft a plugin may ask the draft model for in one call; a larger `max-draft-len` is cut.
pub const MAX_BRIDGE_DRAFT_LEN: usize = 256;

/// Most tokens fed before the first proposal that wait for the context to open; feeding more
/// opens it.
pub const MAX_WAITING_TOKENS: usize = 1 << 16;

/// The draft model as one instance sees it.
pub(super) struct DraftBridge {
    factory: Option<Arc<dyn DraftModelFactory>>,
    model: Option<Box<dyn DraftModel>>,
    /// Tokens fed since the last reset while no context is open; the context gets them when it
    /// opens.
    waiting: Vec<Token>,
    /// Opening a context failed once for this instance: do not retry on every call.
    failed: bool,
    /// Time the context spent catching up with the context since the source last took it.
    catch_up_time: Duration,
    /// How proposals are drawn during the source's current `propose` call; `None` outside
    /// one, or when the request is greedy.
    sampling: Option<DraftSampling>,
    /// The draw made during the current `propose` call.
    draw: Option<SampledDraft>,
}

impl DraftBridge {
    pub(super) fn new(factory: Option<Arc<dyn DraftModelFactory>>) -> Self {
        Self {
            factory,
            model: None,
            waiting: Vec::new(),
            failed: false,
            catch_up_time: Duration::ZERO,
            sampling: None,
            draw: None,
        }
    }

    /// The source's `propose` call starts: proposals are drawn with `sampling` until
    /// [`Self::close_round`] (greedy when `None`).
    pub(super) fn open_round(&mut self, sampling: Option<DraftSampling>) {
        self.sampling = sampling;
        self.draw = None;
    }

    /// The source's `propose` call is over: the draw it made, if any. Proposals are greedy
    /// again until the next [`Self::open_round`].
    pub(super) fn close_round(&mut self) -> Option<SampledDraft> {
        self.sampling = None;
        self.draw.take()
    }

    /// Time the draft model spent catching up with the context in this instance's proposals
    /// since the last call, which starts counting again.
    pub(super) fn take_catch_up_time(&mut self) -> Duration {
        std::mem::take(&mut self.catch_up_time)
    }

    /// The instance's context, opened on first use with the tokens waiting for it; `None`
    /// without a draft model.
    fn model(&mut self, plugin: &str) -> Option<&mut Box<dyn DraftModel>> {
        if self.model.is_none() && !self.failed {
            let factory = self.factory.as_ref()?;
            match factory.open() {
                Ok(mut model) => {
                    model.feed(&std::mem::take(&mut self.waiting));
                    self.model = Some(model);
                }
                Err(reason) => {
                    self.failed = true;
                    self.waiting = Vec::new();
                    tracing::warn!(
                        plugin,
                        "cannot open a draft-model context: {reason}; the plugin gets no draft tokens"
                    );
                }
            }
        }
        self.model.as_mut()
    }

    /// Whether calls that only change the context can wait for the context to open.
    fn can_wait(&self) -> bool {
        self.model.is_none() && !self.failed && self.factory.is_some()
    }
}

impl HostState {
    /// Runs `call` on the draft model, crediting its time back to the guest's deadline.
    fn with_draft_model<T>(
        &mut self,
        default: T,
        call: impl FnOnce(&mut dyn DraftModel) -> T,
    ) -> T {
        let started = Moment::now();
        let result = match self.draft.model(&self.name) {
            Some(model) => call(model.as_mut()),
            None => default,
        };
        self.clock.credit(started.elapsed());
        result
    }

    /// A `propose` call of the plugin's: the draw already made in this source's `propose` call
    /// if there is one (it is committed), else a new draft (drawn, and then committed, at the
    /// request's temperature), with second choices below `split_below` when greedy.
    fn propose_drafted(&mut self, max_draft_len: u32, p_min: f32, split_below: f32) -> Drafted {
        if let Some(draw) = &self.draft.draw {
            return Drafted {
                tokens: draw.drafted_tokens().collect(),
                ..Drafted::default()
            };
        }
        let finite_or_zero = |value: f32| if value.is_finite() { value } else { 0.0 };
        let sampling = self.draft.sampling;
        let settings = ProposalSettings {
            max_draft_len: (max_draft_len as usize).min(MAX_BRIDGE_DRAFT_LEN),
            p_min: finite_or_zero(p_min),
            sampling,
            split_below: finite_or_zero(split_below),
        };
        let mut drafted =
            self.with_draft_model(Drafted::default(), |model| model.propose(settings));
        self.draft.catch_up_time += drafted.catch_up_time;
        if sampling.is_some() && !drafted.distributions.is_empty() {
            self.draft.draw = Some(SampledDraft {
                tokens: drafted.tokens.iter().map(|drafted| drafted.token).collect(),
                distributions: std::mem::take(&mut drafted.distributions),
            });
        }
        drafted
    }
}

impl DraftModelHost for HostState {
    fn available(&mut self) -> bool {
        self.draft.factory.is_some() && !self.draft.failed
    }

    fn reset(&mut self) {
        if self.draft.can_wait() {
            self.draft.waiting.clear();
            return;
        }
        self.with_draft_model((), |model| model.reset());
    }

    fn feed(&mut self, tokens: Vec<Token>) {
        if self.draft.can_wait() && self.draft.waiting.len() + tokens.len() <= MAX_WAITING_TOKENS {
            self.draft.waiting.extend_from_slice(&tokens);
            return;
        }
        self.with_draft_model((), |model| model.feed(&tokens));
    }

    fn propose(&mut self, max_draft_len: u32, p_min: f32) -> Vec<DraftedToken> {
        self.propose_drafted(max_draft_len, p_min, 0.0)
            .tokens
            .into_iter()
            .map(DraftedToken::from)
            .collect()
    }

    fn propose_with_runners_up(
        &mut self,
        max_draft_len: u32,
        p_min: f32,
        split_below: f32,
    ) -> Vec<DraftedPosition> {
        let drafted = self.propose_drafted(max_draft_len, p_min, split_below);
        let mut runners_up = drafted.runners_up.into_iter();
        drafted
            .tokens
            .into_iter()
            .map(|chosen| DraftedPosition {
                chosen: chosen.into(),
                runner_up: runners_up.next().flatten().map(DraftedToken::from),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::cascade::{self, TokenDistribution};
    use crate::plugins::sandbox::{SandboxLimits, Services};

    /// A factory whose contexts record what they are fed, counting the contexts opened.
    #[derive(Default)]
    struct Recording {
        opened: Arc<Mutex<usize>>,
        fed: Arc<Mutex<Vec<Token>>>,
    }

    struct RecordingModel {
        fed: Arc<Mutex<Vec<Token>>>,
    }

    impl DraftModelFactory for Recording {
        fn open(&self) -> Result<Box<dyn DraftModel>, String> {
            *self.opened.lock().expect("not poisoned") += 1;
            Ok(Box::new(RecordingModel {
                fed: Arc::clone(&self.fed),
            }))
        }
    }

    impl DraftModel for RecordingModel {
        fn reset(&mut self) {
            self.fed.lock().expect("not poisoned").clear();
        }

        fn feed(&mut self, tokens: &[Token]) {
            self.fed
                .lock()
                .expect("not poisoned")
                .extend_from_slice(tokens);
        }

        fn propose(&mut self, settings: ProposalSettings) -> Drafted {
            let max_draft_len = settings.max_draft_len;
            let Some(sampling) = settings.sampling else {
                return Drafted::default();
            };
            // A draw of token `seed + i` at position i, certain.
            let tokens: Vec<Token> = (0..max_draft_len as Token)
                .map(|i| sampling.seed as Token + i)
                .collect();
            Drafted {
                tokens: tokens
                    .iter()
                    .map(|&token| cascade::DraftedToken { token, prob: 1.0 })
                    .collect(),
                distributions: tokens
                    .iter()
                    .map(|&token| TokenDistribution {
                        probabilities: vec![(token, 1.0)],
                    })
                    .collect(),
                ..Drafted::default()
            }
        }
    }

    fn host_state(factory: &Recording) -> HostState {
        let factory = Recording {
            opened: Arc::clone(&factory.opened),
            fed: Arc::clone(&factory.fed),
        };
        HostState::new(
            Arc::from("test"),
            &SandboxLimits::default(),
            Services {
                state: None,
                draft_model: Some(Arc::new(factory)),
            },
        )
    }

    #[test]
    fn the_context_opens_at_the_first_proposal_with_what_was_fed_since_the_last_reset() {
        let factory = Recording::default();
        let mut state = host_state(&factory);
        DraftModelHost::feed(&mut state, vec![1, 2]);
        DraftModelHost::reset(&mut state);
        DraftModelHost::feed(&mut state, vec![3, 4]);
        DraftModelHost::feed(&mut state, vec![5]);
        assert_eq!(*factory.opened.lock().expect("not poisoned"), 0);
        DraftModelHost::propose(&mut state, 4, 0.0);
        assert_eq!(*factory.opened.lock().expect("not poisoned"), 1);
        assert_eq!(*factory.fed.lock().expect("not poisoned"), [3, 4, 5]);
        DraftModelHost::feed(&mut state, vec![6]);
        assert_eq!(*factory.fed.lock().expect("not poisoned"), [3, 4, 5, 6]);
    }

    #[test]
    fn a_draw_inside_a_propose_call_is_committed_and_proposals_outside_one_are_greedy() {
        let factory = Recording::default();
        let mut state = host_state(&factory);
        DraftModelHost::feed(&mut state, vec![1]);
        let sampling = DraftSampling {
            temperature: 0.7,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 40,
        };
        assert!(
            DraftModelHost::propose(&mut state, 2, 0.0).is_empty(),
            "greedy"
        );
        state.draft.open_round(Some(sampling));
        let tokens = |drafted: Vec<DraftedToken>| -> Vec<Token> {
            drafted.iter().map(|drafted| drafted.token).collect()
        };
        assert_eq!(
            tokens(DraftModelHost::propose(&mut state, 2, 0.0)),
            [40, 41]
        );
        assert_eq!(
            tokens(DraftModelHost::propose(&mut state, 5, 0.0)),
            [40, 41],
            "asking again in the same call returns the draw"
        );
        let draw = state.draft.close_round().expect("the call drew");
        assert_eq!(draw.tokens, [40, 41]);
        assert_eq!(draw.distributions.len(), 2);
        assert_eq!(state.draft.close_round(), None, "taken once");
        assert!(
            DraftModelHost::propose(&mut state, 2, 0.0).is_empty(),
            "greedy again"
        );
        state.draft.open_round(None);
        DraftModelHost::propose(&mut state, 2, 0.0);
        assert_eq!(
            state.draft.close_round(),
            None,
            "a greedy request draws nothing"
        );
    }

    #[test]
    fn feeding_more_than_can_wait_opens_the_context() {
        let factory = Recording::default();
        let mut state = host_state(&factory);
        DraftModelHost::feed(&mut state, vec![7; MAX_WAITING_TOKENS]);
        assert_eq!(*factory.opened.lock().expect("not poisoned"), 0);
        DraftModelHost::feed(&mut state, vec![8]);
        assert_eq!(*factory.opened.lock().expect("not poisoned"), 1);
        let fed = factory.fed.lock().expect("not poisoned");
        assert_eq!(fed.len(), MAX_WAITING_TOKENS + 1);
        assert_eq!(fed.last(), Some(&8));
    }
}
