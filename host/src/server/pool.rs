//! A slot's plugin and policy instances, kept across requests.
//!
//! A plugin may keep state outside its sessions (the `suffix` plugin's cross-request cache, the
//! `cost` policy's acceptance estimates), which pays off only if the same instance serves
//! request after request. So a slot keeps one instance per (name, version, config) and builds
//! each request's cascade from them, whichever cascade and policy the request chose. Instances
//! of versions or configs the registry no longer publishes, and quarantined instances, are
//! dropped when the slot sees a new registry generation; a request still drafting with one
//! keeps it until it ends.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::hotswap::{ResolvedPolicy, ResolvedSource, Snapshot, SourceKey};
use super::metrics::{Metrics, PluginHealthDelta};
use crate::cascade::{
    Cascade, CascadeSettings, Decision, DraftSource, Feedback, ModelFacts, PolicySetup, Proposal,
    RoundPolicy, RoundRecord, SourceFault, Token,
};
use crate::plugins::{PluginPolicy, PluginSource};

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
}

#[derive(Debug)]
struct PolicyEntry {
    policy: Arc<Mutex<PluginPolicy>>,
    reported: Reported,
}

/// The plugin and policy instances of one slot.
#[derive(Debug, Default)]
pub struct SourcePool {
    entries: BTreeMap<SourceKey, Entry>,
    policies: BTreeMap<SourceKey, PolicyEntry>,
}

impl SourcePool {
    /// A cascade over `sources`, in order, each backed by this pool's instance of that source
    /// (made now if the pool has none), with this pool's instance of `policy`, if any.
    pub fn cascade(
        &mut self,
        sources: &[ResolvedSource],
        policy: Option<&ResolvedPolicy>,
        settings: CascadeSettings,
    ) -> Cascade {
        let slots: Vec<Box<dyn DraftSource>> = sources
            .iter()
            .map(|resolved| {
                let entry = self.entries.entry(resolved.key()).or_insert_with(|| Entry {
                    source: Arc::new(Mutex::new(resolved.plugin.source(resolved.config.clone()))),
                    reported: Reported::default(),
                });
                Box::new(Shared {
                    name: resolved.plugin.name().to_owned(),
                    source: Arc::clone(&entry.source),
                }) as Box<dyn DraftSource>
            })
            .collect();
        let cascade = Cascade::new(slots, settings);
        let Some(resolved) = policy else {
            return cascade;
        };
        let entry = self
            .policies
            .entry(resolved.key())
            .or_insert_with(|| PolicyEntry {
                policy: Arc::new(Mutex::new(resolved.policy.policy(resolved.config.clone()))),
                reported: Reported::default(),
            });
        cascade.with_policy(Box::new(SharedPolicy {
            name: resolved.policy.name().to_owned(),
            policy: Arc::clone(&entry.policy),
        }))
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

    /// Reports health changes, then drops instances `snapshot` no longer publishes and
    /// quarantined ones.
    pub fn prune(&mut self, snapshot: &Snapshot, metrics: &Metrics) {
        self.report(metrics);
        self.entries
            .retain(|key, entry| snapshot.is_current(key) && !entry.reported.quarantined);
        self.policies
            .retain(|key, entry| snapshot.is_current_policy(key) && !entry.reported.quarantined);
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

    fn checkpoint(&mut self) -> Result<(), SourceFault> {
        lock(&self.source).checkpoint()
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
