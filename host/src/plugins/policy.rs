//! [`PluginPolicy`]: a policy component as a [`RoundPolicy`].
//!
//! Supervision (deadlines, traps, restarts, quarantine) is [`Supervised`]'s; this file says what
//! a policy's calls mean. One instance serves every request of its cascade, one session per
//! request, so a policy may carry what it learned from one request to the next inside its
//! instance (the `cost` policy does). Recovery is simpler than a drafter's: after a trap the
//! next call re-creates the instance and re-opens the session, which starts from scratch. A
//! fault in `decide` makes the round plain decoding (K = 0), which can never be slower than
//! plain decoding; once quarantined, speculation stays off for the rest of the run.

use super::bindings;
use super::loaded::LoadedPolicy;
use super::supervised::{Method, Supervised};
use super::world::{PolicyRequest, PolicyWorld};
use crate::cascade::{Decision, ModelFacts, PolicySetup, RoundPolicy, RoundRecord, SourceFault};

/// A policy plugin for one cascade. Made by [`LoadedPolicy::policy`].
pub struct PluginPolicy {
    supervised: Supervised<PolicyWorld>,
}

impl std::fmt::Debug for PluginPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginPolicy")
            .field("name", &self.supervised.name())
            .field("faults", &self.supervised.faults())
            .field("quarantined", &self.supervised.is_quarantined())
            .finish_non_exhaustive()
    }
}

impl PluginPolicy {
    /// A policy over `plugin` with `config`, under the host's limits; the instance starts at the
    /// first request.
    pub(super) fn start(plugin: LoadedPolicy, config: String) -> Self {
        let limits = plugin.limits().clone();
        Self {
            supervised: Supervised::new(plugin, config, limits),
        }
    }

    /// Faults so far.
    pub fn faults(&self) -> u32 {
        self.supervised.faults()
    }

    /// The largest size, in bytes, a linear memory of this policy's instances has had so far.
    pub fn peak_memory(&self) -> usize {
        self.supervised.peak_memory()
    }

    /// The most recent fault, if any.
    pub fn last_fault(&self) -> Option<&SourceFault> {
        self.supervised.last_fault()
    }

    /// Whether the policy is quarantined (speculation is off for the rest of the run).
    pub fn is_quarantined(&self) -> bool {
        self.supervised.is_quarantined()
    }
}

impl RoundPolicy for PluginPolicy {
    fn name(&self) -> &str {
        self.supervised.name()
    }

    fn begin(&mut self, facts: &ModelFacts, setup: &PolicySetup) -> Result<(), SourceFault> {
        self.supervised.begin(PolicyRequest::new(facts, setup))
    }

    fn wants_text(&self) -> bool {
        self.supervised.is_active()
            && self
                .supervised
                .request()
                .is_some_and(|request| request.wants_text)
    }

    fn observe(&mut self, round: &RoundRecord) -> Result<(), SourceFault> {
        self.supervised.ensure_session()?;
        let record = bindings::RoundRecord::from(round);
        self.supervised
            .call(Method::Observe, |policy, store, session| {
                let api = policy.spechost_drafter_policy_api();
                api.policy_session().call_observe(store, session, &record)
            })
            .map(drop)
    }

    fn decide(&mut self) -> Result<Decision, SourceFault> {
        self.supervised.ensure_session()?;
        let decided = self
            .supervised
            .call(Method::Decide, |policy, store, session| {
                let api = policy.spechost_drafter_policy_api();
                api.policy_session().call_decide(store, session)
            })?;
        Ok(decided.map(Decision::from).unwrap_or_default())
    }

    fn end(&mut self) {
        self.supervised.end();
    }
}
