//! A slot's plugin instances, kept across requests.
//!
//! A plugin may keep state outside its sessions (the `suffix` plugin's cross-request cache),
//! which pays off only if the same instance serves request after request. So a slot keeps one
//! instance per (plugin name, version, config) and builds each request's cascade from them,
//! whichever cascade the request chose. Instances of versions or configs the registry no longer
//! publishes, and quarantined instances, are dropped when the slot sees a new registry
//! generation; a request still drafting with one keeps it until it ends.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::hotswap::{ResolvedSource, Snapshot, SourceKey};
use super::metrics::{Metrics, PluginHealthDelta};
use crate::cascade::{
    Cascade, CascadeSettings, DraftSource, Feedback, ModelFacts, Proposal, SourceFault, Token,
};
use crate::plugins::PluginSource;

/// What a slot last reported to the metrics about one instance.
#[derive(Debug, Clone, Copy, Default)]
struct Reported {
    faults: u32,
    restarts: u32,
    quarantined: bool,
}

#[derive(Debug)]
struct Entry {
    source: Arc<Mutex<PluginSource>>,
    reported: Reported,
}

/// The plugin instances of one slot.
#[derive(Debug, Default)]
pub struct SourcePool {
    entries: BTreeMap<SourceKey, Entry>,
}

impl SourcePool {
    /// A cascade over `sources`, in order, each backed by this pool's instance of that source
    /// (made now if the pool has none).
    pub fn cascade(&mut self, sources: &[ResolvedSource], settings: CascadeSettings) -> Cascade {
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
        Cascade::new(slots, settings)
    }

    /// Reports health changes, then drops instances `snapshot` no longer publishes and
    /// quarantined ones.
    pub fn prune(&mut self, snapshot: &Snapshot, metrics: &Metrics) {
        self.report(metrics);
        self.entries
            .retain(|key, entry| snapshot.is_current(key) && !entry.reported.quarantined);
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
            let delta = PluginHealthDelta {
                faults: u64::from(now.faults.saturating_sub(entry.reported.faults)),
                restarts: u64::from(now.restarts.saturating_sub(entry.reported.restarts)),
                quarantined: now.quarantined && !entry.reported.quarantined,
            };
            if delta != PluginHealthDelta::default() {
                metrics.plugin_health(&key.name, delta);
            }
            entry.reported = now;
        }
    }
}

fn lock(source: &Mutex<PluginSource>) -> MutexGuard<'_, PluginSource> {
    // A `PluginSource` turns every guest failure into a fault and never panics midway through
    // a change of its own state, so a poisoned lock still guards a usable source.
    source.lock().unwrap_or_else(|e| e.into_inner())
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
}
