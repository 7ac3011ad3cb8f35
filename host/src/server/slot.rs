//! A slot: one engine thread that owns one llama.cpp context and its plugin instances, and
//! generates the requests it takes from the queue, one after another.
//!
//! One request, in order:
//! 1. skip it if its client already went away;
//! 2. resolve its cascade against the published registry snapshot and build it from the slot's
//!    [`SourcePool`];
//! 3. generate, asking a [`SwapControl`] before every round: it stops when the client is gone,
//!    and when the registry published a new generation it resolves the request's cascade again
//!    and, if its sources changed (a new plugin version, config or default cascade), hands the
//!    engine a new cascade, which the engine begins with the whole context so far;
//! 4. send the result, count it, report plugin health.
//!
//! A panic while generating is caught: the request fails with a 500 and the slot goes on (the
//! next request starts from a cleared KV cache).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use tokio::sync::mpsc::UnboundedSender;

use super::hotswap::{CascadeChoice, Registry, ResolvedSource, SourceKey};
use super::metrics::{Metrics, RequestOutcome};
use super::pool::SourcePool;
use super::scheduler::{Event, Finished, Job, Queue};
use super::support;
use crate::cascade::CascadeSettings;
use crate::engine::{RoundDecision, Session, StopReason};

/// One engine thread's context, plugin instances, and what it shares with the server.
pub struct Slot<'a> {
    /// The slot's number, for logs.
    pub index: usize,
    /// Its llama.cpp context.
    pub session: Session<'a>,
    /// The published plugins and defaults.
    pub registry: Arc<Registry>,
    /// Where requests come from.
    pub queue: Arc<Queue>,
    /// Where counters go.
    pub metrics: Arc<Metrics>,
    /// Its plugin instances.
    pub pool: SourcePool,
}

impl Slot<'_> {
    /// Serves requests until the queue is closed and empty.
    pub fn run(mut self) {
        tracing::debug!(slot = self.index, "slot started");
        while let Some(job) = self.queue.next() {
            let span = job.span.clone();
            let _entered = span.enter();
            let served = std::panic::catch_unwind(AssertUnwindSafe(|| self.serve(&job)));
            if served.is_err() {
                tracing::error!(slot = self.index, "generation panicked; the slot goes on");
                let _ = job.events.send(Event::Failed(
                    "internal error: generation panicked; see the server log".into(),
                ));
                self.metrics.request(job.endpoint, RequestOutcome::Failed);
            }
            self.pool.report(&self.metrics);
            self.queue.finished();
        }
        tracing::debug!(slot = self.index, "slot stopped");
    }

    fn serve(&mut self, job: &Job) {
        if job.events.is_closed() {
            self.metrics
                .request(job.endpoint, RequestOutcome::Cancelled);
            return;
        }
        let queue_time = job.queued_at.elapsed();
        let snapshot = self.registry.snapshot();
        self.pool.prune(&snapshot, &self.metrics);
        let prepared = snapshot.resolve(&job.cascade).map_err(|e| e.to_string());
        let settings = support::cascade_settings(job.mode).map_err(|e| e.to_string());
        let (resolved, settings) = match (prepared, settings) {
            (Ok(resolved), Ok(settings)) => (resolved, settings),
            (Err(message), _) | (_, Err(message)) => {
                let _ = job.events.send(Event::Failed(message));
                self.metrics.request(job.endpoint, RequestOutcome::Failed);
                return;
            }
        };
        let mut cascade = self.pool.cascade(&resolved, settings.clone());
        let mut control = SwapControl {
            events: &job.events,
            registry: &self.registry,
            metrics: &self.metrics,
            pool: &mut self.pool,
            choice: &job.cascade,
            settings,
            generation: snapshot.generation,
            keys: keys(&resolved),
            swaps: 0,
        };
        let mut on_text = |text: &str| {
            let _ = job.events.send(Event::Text(text.to_owned()));
        };
        let result =
            self.session
                .generate_controlled(&job.request, &mut cascade, &mut on_text, &mut || {
                    control.before_round()
                });
        let swaps = control.swaps;
        match result {
            Ok(outcome) if outcome.stop_reason == StopReason::Cancelled => {
                tracing::info!(
                    generated = outcome.stats.generated_tokens,
                    "request cancelled: the client went away"
                );
                self.metrics.generation(
                    job.endpoint,
                    RequestOutcome::Cancelled,
                    &outcome.stats,
                    swaps,
                );
            }
            Ok(outcome) => {
                let stats = &outcome.stats;
                tracing::info!(
                    prompt_tokens = stats.prompt_tokens,
                    generated_tokens = stats.generated_tokens,
                    tokens_per_second = format_args!("{:.1}", stats.generation_tokens_per_second()),
                    acceptance = format_args!("{:.3}", stats.acceptance()),
                    swaps,
                    queue_ms = queue_time.as_millis() as u64,
                    stop_reason = ?outcome.stop_reason,
                    "request done"
                );
                self.metrics
                    .generation(job.endpoint, RequestOutcome::Completed, stats, swaps);
                let _ = job.events.send(Event::Done(Box::new(Finished {
                    cascade: cascade.source_names(),
                    draft_max: job.request.draft_max,
                    mode: job.mode,
                    swaps,
                    queue_time,
                    outcome,
                })));
            }
            Err(error) => {
                tracing::warn!(%error, "generation failed");
                let _ = job.events.send(Event::Failed(error.to_string()));
                self.metrics.request(job.endpoint, RequestOutcome::Failed);
            }
        }
    }
}

fn keys(sources: &[ResolvedSource]) -> Vec<SourceKey> {
    sources.iter().map(ResolvedSource::key).collect()
}

/// Decides between the rounds of one request: stop when its client is gone, swap its cascade
/// when the registry published sources it should now use.
struct SwapControl<'a> {
    events: &'a UnboundedSender<Event>,
    registry: &'a Registry,
    metrics: &'a Metrics,
    pool: &'a mut SourcePool,
    choice: &'a CascadeChoice,
    settings: CascadeSettings,
    /// The registry generation the current cascade was resolved at.
    generation: u64,
    /// The sources of the current cascade.
    keys: Vec<SourceKey>,
    swaps: u32,
}

impl SwapControl<'_> {
    fn before_round(&mut self) -> RoundDecision {
        if self.events.is_closed() {
            return RoundDecision::Stop;
        }
        let generation = self.registry.generation();
        if generation == self.generation {
            return RoundDecision::Continue;
        }
        let snapshot = self.registry.snapshot();
        self.generation = snapshot.generation;
        self.pool.prune(&snapshot, self.metrics);
        let resolved = match snapshot.resolve(self.choice) {
            Ok(resolved) => resolved,
            Err(error) => {
                tracing::warn!(%error, "keeping the request's cascade");
                return RoundDecision::Continue;
            }
        };
        let keys = keys(&resolved);
        if keys == self.keys {
            return RoundDecision::Continue;
        }
        tracing::debug!(
            generation,
            cascade = %resolved.iter().map(|s| s.plugin.name()).collect::<Vec<_>>().join(","),
            "swapping the cascade between rounds"
        );
        self.keys = keys;
        self.swaps += 1;
        RoundDecision::Replace(self.pool.cascade(&resolved, self.settings.clone()))
    }
}
