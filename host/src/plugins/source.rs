//! [`PluginSource`]: a drafter plugin instance as a [`DraftSource`].
//!
//! Supervision (deadlines, traps, restarts, quarantine) is [`Supervised`]'s; this file says what
//! a drafter's calls mean. The source keeps the request's context in its [`DrafterRequest`], so
//! a dead instance is replaced without the cascade noticing: after a trap the next call that
//! needs the plugin instantiates it again, re-opens the session with the same config and facts,
//! and replays the whole context in one `feed`. A proposal that breaks the rules of
//! [`check_proposal`] (too long, token ids outside the vocabulary, confidences outside [0, 1])
//! is a fault too, but leaves the instance running, as is a tree shape the plugin declared
//! through the `tree` import that does not fit its proposal ([`check_tree`]). Once
//! quarantined, `propose` returns an empty proposal and `feed`/`feedback` do nothing.

use std::time::Duration;

use spechost_sdk::{check_proposal, check_tree};

use super::bindings;
use super::loaded::LoadedPlugin;
use super::sandbox::SandboxLimits;
use super::supervised::{Method, Supervised};
use super::world::{DrafterRequest, DrafterWorld};
use crate::cascade::{
    DraftModelCosts, DraftSampling, DraftSource, Feedback, ModelFacts, Proposal, SampledDraft,
    SourceFault, Token,
};

/// A drafter plugin as one slot of a cascade. Made by [`LoadedPlugin::source`].
pub struct PluginSource {
    supervised: Supervised<DrafterWorld>,
    /// How the draft model draws during this request's `propose` calls.
    sampling: Option<DraftSampling>,
    /// The draw of the last `propose` call, kept even when the call trapped afterwards.
    draw: Option<SampledDraft>,
    /// Most paths a proposal may have (`tree.max-paths`): 1, chains, unless the cascade
    /// merges trees for a verifier that takes them.
    max_paths: usize,
}

impl std::fmt::Debug for PluginSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginSource")
            .field("name", &self.supervised.name())
            .field("faults", &self.supervised.faults())
            .field("restarts", &self.supervised.restarts())
            .field("quarantined", &self.supervised.is_quarantined())
            .finish_non_exhaustive()
    }
}

impl PluginSource {
    /// A source over a fresh instance of `plugin`; the session opens at
    /// [`DraftSource::begin`]. If the instance cannot start now, `begin` tries again and
    /// reports a fault.
    pub(super) fn start(plugin: LoadedPlugin, config: String, limits: SandboxLimits) -> Self {
        let mut supervised = Supervised::new(plugin, config, limits);
        supervised.start_instance();
        Self {
            supervised,
            sampling: None,
            draw: None,
            max_paths: 1,
        }
    }

    /// Faults so far: traps, time-outs, memory-limit hits, invalid proposals, rejected configs.
    pub fn faults(&self) -> u32 {
        self.supervised.faults()
    }

    /// Times the instance was re-created after a trap.
    pub fn restarts(&self) -> u32 {
        self.supervised.restarts()
    }

    /// Whether the source reached `max_faults` and is no longer called.
    pub fn is_quarantined(&self) -> bool {
        self.supervised.is_quarantined()
    }

    /// The most recent fault, if any.
    pub fn last_fault(&self) -> Option<&SourceFault> {
        self.supervised.last_fault()
    }

    /// The limits this source runs under.
    pub fn limits(&self) -> &SandboxLimits {
        self.supervised.limits()
    }

    /// The largest size, in bytes, a linear memory of this source's instances has had so far.
    pub fn peak_memory(&self) -> usize {
        self.supervised.peak_memory()
    }

    /// Hands the instance a finished response it did not serve (another slot's or another
    /// replica's), between requests, under the call deadline. A quarantined instance, or one
    /// that trapped and has not restarted, misses it.
    pub fn observe_response(&mut self, response: &[Token]) -> Result<(), SourceFault> {
        if self.supervised.is_quarantined() {
            return Ok(());
        }
        self.supervised
            .call_instance(Method::ObserveResponse, |drafter, store| {
                drafter
                    .spechost_drafter_drafter_api()
                    .call_observe_response(store, response)
            })
            .map(drop)
    }
}

impl DraftSource for PluginSource {
    fn name(&self) -> &str {
        self.supervised.name()
    }

    fn begin(&mut self, facts: &ModelFacts, prompt: &[Token]) -> Result<(), SourceFault> {
        self.supervised.begin(DrafterRequest::new(facts, prompt))
    }

    fn propose(&mut self, max_draft_len: usize) -> Result<Proposal, SourceFault> {
        self.draw = None;
        if !self.supervised.is_active() || max_draft_len == 0 {
            return Ok(Proposal::empty());
        }
        self.supervised.ensure_session()?;
        let asked = u32::try_from(max_draft_len).unwrap_or(u32::MAX);
        let (sampling, draw, max_paths) = (self.sampling, &mut self.draw, self.max_paths);
        let mut shape = None;
        let proposed = self
            .supervised
            .call(Method::Propose, |drafter, store, session| {
                store.data_mut().draft.open_round(sampling);
                store.data_mut().tree.open_round(max_paths);
                let api = drafter.spechost_drafter_drafter_api();
                let proposed = api.session().call_propose(&mut *store, session, asked);
                // Taken before a trap drops the instance: a draw counts once made.
                *draw = store.data_mut().draft.close_round();
                shape = store.data_mut().tree.close_round();
                proposed
            })?;
        let Some(mut proposal) = proposed.map(Proposal::from) else {
            return Ok(Proposal::empty());
        };
        let vocab_size = self
            .supervised
            .request()
            .map_or(0, |request| request.facts.vocab_size);
        let checked = check_proposal(
            &proposal.tokens,
            &proposal.confidence,
            max_draft_len,
            vocab_size,
        )
        .and_then(|()| match &shape {
            Some(parents) => check_tree(&proposal.tokens, parents, max_paths),
            None => Ok(()),
        });
        if let Err(broken) = checked {
            return Err(self.supervised.fault(broken.to_string()));
        }
        if let Some(parents) = shape {
            proposal.set_parents(parents.into_iter().map(|row| row as usize).collect());
        }
        Ok(proposal)
    }

    fn set_max_paths(&mut self, paths: usize) {
        self.max_paths = paths.max(1);
    }

    fn feedback(&mut self, feedback: Feedback) -> Result<(), SourceFault> {
        if !self.supervised.is_active() {
            return Ok(());
        }
        // After a restart the new instance never made the proposal this feedback is about:
        // `call` does nothing without an open session.
        let outcome = bindings::Feedback::from(feedback);
        self.supervised
            .call(Method::Feedback, |drafter, store, session| {
                let api = drafter.spechost_drafter_drafter_api();
                api.session().call_feedback(store, session, outcome)
            })
            .map(drop)
    }

    fn feed(&mut self, tokens: &[Token]) -> Result<(), SourceFault> {
        let Some(request) = self.supervised.request_mut() else {
            return Ok(());
        };
        request.context.extend_from_slice(tokens);
        if !self.supervised.is_active() {
            return Ok(());
        }
        if !self.supervised.has_session() {
            // Restarting replays the whole context, these tokens included.
            return self.supervised.ensure_session();
        }
        self.supervised
            .call(Method::Feed, |drafter, store, session| {
                let api = drafter.spechost_drafter_drafter_api();
                api.session().call_feed(store, session, tokens)
            })
            .map(drop)
    }

    fn end(&mut self) {
        self.supervised.end();
    }

    fn is_expensive(&self) -> bool {
        self.supervised.plugin().uses_draft_model()
    }

    fn draft_model_costs(&self) -> Option<DraftModelCosts> {
        self.supervised.plugin().draft_model_costs()
    }

    fn sample_drafts(&mut self, sampling: Option<DraftSampling>) {
        self.sampling = sampling;
    }

    fn take_draw(&mut self) -> Option<SampledDraft> {
        self.draw.take()
    }

    fn take_catch_up_time(&mut self) -> Duration {
        self.supervised
            .store_mut()
            .map_or(Duration::ZERO, |state| state.draft.take_catch_up_time())
    }

    fn checkpoint(&mut self) -> Result<(), SourceFault> {
        if self.supervised.is_quarantined() {
            return Ok(());
        }
        // Only a running instance has state worth saving: a trapped one lost it.
        self.supervised
            .call_instance(Method::Checkpoint, |drafter, store| {
                drafter
                    .spechost_drafter_drafter_api()
                    .call_checkpoint(store)
            })
            .map(drop)
    }
}
