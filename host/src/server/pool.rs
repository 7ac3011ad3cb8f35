//! A slot's plugin and policy instances, kept across requests.
//!
//! A plugin may keep state outside its sessions (the `suffix` plugin's cross-request cache, the
//! `cost` policy's acceptance estimates), which pays off only if the same instance serves
//! request after request. So a slot keeps one drafter instance per (name, version, config,
//! incarnation) and builds each request's cascade from them, whichever cascade the request
//! chose; the scored mode's calibration of each source (what it learnt of the source's
//! acceptance) is kept beside it, as a benchmark pass keeps its cascade.
//!
//! Policies are chosen per request with settings of the client's choosing, so their instances
//! are bounded: at most [`MAX_LIVE_POLICIES`] live ones per slot, the least recently used
//! dropped first. A quarantined instance (drafter or policy) holds no WebAssembly instance and
//! stays quarantined: a drafter until its plugin is reloaded (a new incarnation) or replaced,
//! a policy until its version changes (at most [`MAX_QUARANTINED_POLICIES`] are remembered).
//! Instances of versions, configs or incarnations the registry no longer publishes are dropped
//! when the slot sees a new registry generation; a request still drafting with one keeps it
//! until it ends.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::metrics::{Metrics, PluginHealthDelta, PluginInstances};
use super::registry::{ResolvedPolicy, ResolvedSource, Snapshot, SourceKey};
use super::share::{SharedResponses, Sharing};
use crate::cascade::{
    AcceptanceHistory, Cascade, CascadeSettings, Decision, DraftModelCosts, DraftSampling,
    DraftSource, Feedback, ModelFacts, PolicySetup, Proposal, RoundPolicy, RoundRecord,
    SampledDraft, SourceFault, Token,
};
use crate::plugins::{PluginPolicy, PluginSource};

/// Most live policy instances a slot keeps (each reserves a WebAssembly instance's memory).
pub const MAX_LIVE_POLICIES: usize = 4;
/// Most quarantined policy instances a slot remembers (they hold no WebAssembly instance).
pub const MAX_QUARANTINED_POLICIES: usize = 64;

/// What a slot last reported to the metrics about one instance.
#[derive(Debug, Clone, Copy, Default)]
struct Reported {
    faults: u32,
    restarts: u32,
    quarantined: bool,
}

impl Reported {
    /// Adds what changed since `self` to `metrics` under `name`, then remembers `now`.
    fn advance(&mut self, now: Reported, name: &str, metrics: &Metrics) {
        let delta = PluginHealthDelta {
            faults: u64::from(now.faults.saturating_sub(self.faults)),
            restarts: u64::from(now.restarts.saturating_sub(self.restarts)),
            quarantined: now.quarantined && !self.quarantined,
        };
        if delta != PluginHealthDelta::default() {
            metrics.plugin_health(name, delta);
        }
        *self = now;
    }
}

#[derive(Debug)]
struct Entry {
    source: Arc<Mutex<PluginSource>>,
    reported: Reported,
    /// What the scored cascade learnt of this source's acceptance.
    calibration: AcceptanceHistory,
    /// The number of the last shared response it was handed ([`SharedResponses`]).
    observed: u64,
}

#[derive(Debug)]
struct PolicyEntry {
    policy: Arc<Mutex<PluginPolicy>>,
    reported: Reported,
    /// When it was last used, in the pool's use count.
    last_used: u64,
}

/// The plugin and policy instances of one slot.
#[derive(Debug)]
pub struct SourcePool {
    /// The slot's number.
    slot: usize,
    /// The finished responses of every slot and replica, handed to the instances.
    sharing: Arc<Sharing>,
    entries: BTreeMap<SourceKey, Entry>,
    policies: BTreeMap<SourceKey, PolicyEntry>,
    /// Cascades built so far: the clock of [`PolicyEntry::last_used`].
    uses: u64,
}

impl SourcePool {
    /// The empty pool of slot `slot`, whose instances learn from the responses in `sharing`.
    pub fn new(slot: usize, sharing: Arc<Sharing>) -> Self {
        Self {
            slot,
            sharing,
            entries: BTreeMap::new(),
            policies: BTreeMap::new(),
            uses: 0,
        }
    }

    /// A cascade over `sources`, in order, each backed by this pool's instance of that source
    /// (made now if the pool has none, and handed the shared responses it has not seen) and
    /// starting from its kept calibration, with this pool's instance of `policy`, if any.
    pub fn cascade(
        &mut self,
        sources: &[ResolvedSource],
        policy: Option<&ResolvedPolicy>,
        settings: CascadeSettings,
    ) -> Cascade {
        self.uses += 1;
        let mut calibration = Vec::with_capacity(sources.len());
        let slots: Vec<Box<dyn DraftSource>> = sources
            .iter()
            .map(|resolved| {
                let key = resolved.key();
                let entry = self.entries.entry(key.clone()).or_insert_with(|| Entry {
                    source: Arc::new(Mutex::new(resolved.plugin.source(resolved.config.clone()))),
                    reported: Reported::default(),
                    calibration: AcceptanceHistory::default(),
                    observed: 0,
                });
                hand_shared_responses(entry, &self.sharing.responses, self.slot, &key);
                calibration.push(entry.calibration.clone());
                Box::new(Shared {
                    name: resolved.plugin.name().to_owned(),
                    source: Arc::clone(&entry.source),
                }) as Box<dyn DraftSource>
            })
            .collect();
        let cascade = Cascade::new(slots, settings).with_calibration(calibration);
        let Some(resolved) = policy else {
            return cascade;
        };
        let key = resolved.key();
        if !self.policies.contains_key(&key) {
            self.make_room_for_a_policy();
        }
        let uses = self.uses;
        let entry = self.policies.entry(key).or_insert_with(|| PolicyEntry {
            policy: Arc::new(Mutex::new(resolved.policy.policy(resolved.config.clone()))),
            reported: Reported::default(),
            last_used: uses,
        });
        entry.last_used = uses;
        cascade.with_policy(Box::new(SharedPolicy {
            name: resolved.policy.name().to_owned(),
            policy: Arc::clone(&entry.policy),
        }))
    }

    /// Drops the least recently used live policy instance when there are
    /// [`MAX_LIVE_POLICIES`], and the oldest quarantined one when there are
    /// [`MAX_QUARANTINED_POLICIES`].
    fn make_room_for_a_policy(&mut self) {
        for quarantined in [false, true] {
            let limit = if quarantined {
                MAX_QUARANTINED_POLICIES
            } else {
                MAX_LIVE_POLICIES
            };
            let of_kind = self
                .policies
                .iter()
                .filter(|(_, entry)| is_quarantined(&entry.policy) == quarantined);
            if of_kind.clone().count() < limit {
                continue;
            }
            let oldest = of_kind
                .min_by_key(|(_, entry)| entry.last_used)
                .map(|(key, _)| key.clone());
            if let Some(oldest) = oldest {
                self.policies.remove(&oldest);
            }
        }
    }

    /// Keeps what a finished request's cascade over `sources` learnt of their acceptance
    /// (`calibration`, in the same order, from [`Cascade::calibration`]).
    pub fn keep_calibration(
        &mut self,
        sources: &[ResolvedSource],
        calibration: Vec<AcceptanceHistory>,
    ) {
        for (resolved, learnt) in sources.iter().zip(calibration) {
            if let Some(entry) = self.entries.get_mut(&resolved.key()) {
                entry.calibration = learnt;
            }
        }
    }

    /// Asks every drafter instance to save its cross-request state (into its plugin's state
    /// slot, which the caller persists).
    pub fn checkpoint(&mut self) {
        for (key, entry) in &self.entries {
            if let Err(fault) = lock(&entry.source).checkpoint() {
                tracing::warn!(plugin = %key.name, "cannot checkpoint: {}", fault.what);
            }
        }
    }

    /// Reports health changes, then drops instances of versions, configs or incarnations
    /// `snapshot` no longer publishes.
    pub fn prune(&mut self, snapshot: &Snapshot, metrics: &Metrics) {
        self.report(metrics);
        self.entries.retain(|key, _| snapshot.is_current(key));
        self.policies
            .retain(|key, _| snapshot.is_current_policy(key));
    }

    /// Adds the faults, restarts and quarantines of every instance since the last report to
    /// `metrics`.
    pub fn report(&mut self, metrics: &Metrics) {
        for (key, entry) in &mut self.entries {
            let now = {
                let source = lock(&entry.source);
                Reported {
                    faults: source.faults(),
                    restarts: source.restarts(),
                    quarantined: source.is_quarantined(),
                }
            };
            entry.reported.advance(now, &key.name, metrics);
        }
        for (key, entry) in &mut self.policies {
            let now = {
                let policy = lock(&entry.policy);
                Reported {
                    faults: policy.faults(),
                    restarts: 0,
                    quarantined: policy.is_quarantined(),
                }
            };
            entry.reported.advance(now, &key.name, metrics);
        }
    }

    /// The live (not quarantined) instances this pool keeps.
    pub fn instances(&self) -> PluginInstances {
        PluginInstances {
            drafters: self
                .entries
                .values()
                .filter(|entry| !lock(&entry.source).is_quarantined())
                .count(),
            policies: self
                .policies
                .values()
                .filter(|entry| !is_quarantined(&entry.policy))
                .count(),
        }
    }
}

fn is_quarantined(policy: &Mutex<PluginPolicy>) -> bool {
    lock(policy).is_quarantined()
}

fn lock<T>(instance: &Mutex<T>) -> MutexGuard<'_, T> {
    // `PluginSource` and `PluginPolicy` turn every guest failure into a fault and never panic
    // midway through a change of their own state, so a poisoned lock still guards a usable
    // instance.
    instance.lock().unwrap_or_else(|e| e.into_inner())
}

/// A cascade slot backed by a pooled instance. Only the slot's thread uses it, so the lock is
/// never contended; it exists so that the pool keeps the instance after the cascade is gone.
struct Shared {
    name: String,
    source: Arc<Mutex<PluginSource>>,
}

impl DraftSource for Shared {
    fn name(&self) -> &str {
        &self.name
    }

    fn begin(&mut self, facts: &ModelFacts, prompt: &[Token]) -> Result<(), SourceFault> {
        lock(&self.source).begin(facts, prompt)
    }

    fn propose(&mut self, max_len: usize) -> Result<Proposal, SourceFault> {
        lock(&self.source).propose(max_len)
    }

    fn feedback(&mut self, feedback: Feedback) -> Result<(), SourceFault> {
        lock(&self.source).feedback(feedback)
    }

    fn feed(&mut self, tokens: &[Token]) -> Result<(), SourceFault> {
        lock(&self.source).feed(tokens)
    }

    fn end(&mut self) {
        lock(&self.source).end();
    }

    fn is_expensive(&self) -> bool {
        lock(&self.source).is_expensive()
    }

    fn draft_model_costs(&self) -> Option<DraftModelCosts> {
        lock(&self.source).draft_model_costs()
    }

    fn sample_drafts(&mut self, sampling: Option<DraftSampling>) {
        lock(&self.source).sample_drafts(sampling);
    }

    fn take_draw(&mut self) -> Option<SampledDraft> {
        lock(&self.source).take_draw()
    }

    fn take_catch_up_time(&mut self) -> Duration {
        lock(&self.source).take_catch_up_time()
    }

    fn checkpoint(&mut self) -> Result<(), SourceFault> {
        lock(&self.source).checkpoint()
    }
}

/// Hands `entry` (the instance `key` of slot `slot`) the responses recorded in `shared` since
/// it last looked, except those it served itself, oldest first. Bounded in time, so that a
/// request never waits long for its drafters' catch-up: once the calls took one call deadline
/// in all, the rest wait for the instance's next request (a new instance may have all the
/// responses kept to take, each call under its own deadline).
/// A fault ends the hand-off: the response that faulted is not handed again.
fn hand_shared_responses(
    entry: &mut Entry,
    shared: &SharedResponses,
    slot: usize,
    key: &SourceKey,
) {
    let responses = shared.since(entry.observed);
    if responses.is_empty() {
        return;
    }
    let mut source = lock(&entry.source);
    let budget = source.limits().call_deadline;
    let started = Instant::now();
    for response in &responses {
        entry.observed = response.number;
        if response.was_served_by(slot, key) {
            continue;
        }
        if let Err(fault) = source.observe_response(&response.tokens) {
            tracing::warn!(plugin = %key.name, "cannot take a shared response: {}", fault.what);
            break;
        }
        if started.elapsed() >= budget {
            break;
        }
    }
}

/// A cascade's policy backed by a pooled instance (see [`Shared`]).
struct SharedPolicy {
    name: String,
    policy: Arc<Mutex<PluginPolicy>>,
}

impl RoundPolicy for SharedPolicy {
    fn name(&self) -> &str {
        &self.name
    }

    fn begin(&mut self, facts: &ModelFacts, setup: &PolicySetup) -> Result<(), SourceFault> {
        lock(&self.policy).begin(facts, setup)
    }

    fn wants_text(&self) -> bool {
        lock(&self.policy).wants_text()
    }

    fn observe(&mut self, round: &RoundRecord) -> Result<(), SourceFault> {
        lock(&self.policy).observe(round)
    }

    fn decide(&mut self) -> Result<Decision, SourceFault> {
        lock(&self.policy).decide()
    }

    fn end(&mut self) {
        lock(&self.policy).end();
    }
}
