//! A slot: one engine thread that owns one llama.cpp context and its plugin instances, and
//! generates the requests it takes from the queue, one after another.
//!
//! One request, in order:
//! 1. skip it if its client already went away;
//! 2. resolve its cascade against the published registry snapshot and build it, with its
//!    policy, from the slot's [`SourcePool`]; with a policy, measure the target's verify cost
//!    curve first if this slot has not measured it up to the request's draft length;
//! 3. generate, asking a [`SwapControl`] before every round: it stops when the client is gone,
//!    and when the registry published a new generation it resolves the request's cascade again
//!    and, if its sources changed (a new plugin version, config or default cascade), hands the
//!    engine a new cascade, which the engine begins with the whole context so far;
//! 4. send the result, count it, report plugin health; with `--state-dir`, save the plugins'
//!    cross-request state when [`STATE_SAVE_INTERVAL`] has passed since the last save, and
//!    when the slot stops.
//!
//! A panic while generating is caught: the request fails with a 500 and the slot goes on (the
//! next request starts from a cleared KV cache).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use super::hotswap::{CascadeChoice, Registry, ResolvedPolicy, ResolvedSource, SourceKey};
use super::metrics::{Metrics, RequestOutcome};
use super::pool::SourcePool;
use super::scheduler::{Event, Finished, Job, Queue};
use crate::cascade::CascadeSettings;
use crate::engine::{Request, RoundDecision, Session, StopReason};
use crate::run::{measure_verify_costs, save_plugin_states};

/// Least time between two saves of the plugins' state by one slot (with `--state-dir`).
pub const STATE_SAVE_INTERVAL: Duration = Duration::from_secs(60);

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
    /// Whether plugins' state is persisted (`--state-dir`).
    pub saves_state: bool,
    /// The target's verify cost curve as this slot measured it, for policies.
    pub verify_costs: VerifyCurve,
}

/// A slot's verify cost curve, measured on the first request with a policy, and again when a
/// request drafts longer than it reaches.
#[derive(Debug, Default)]
pub struct VerifyCurve {
    /// `costs[n - 1]`: one verify batch of `n` tokens.
    costs: Vec<Duration>,
    /// The draft length it was measured for.
    draft_max: Option<usize>,
}

impl Slot<'_> {
    /// Serves requests until the queue is closed and empty.
    pub fn run(mut self) {
        tracing::debug!(slot = self.index, "slot started");
        let mut state_saved_at = Instant::now();
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
            if self.saves_state && state_saved_at.elapsed() >= STATE_SAVE_INTERVAL {
                self.save_state();
                state_saved_at = Instant::now();
            }
            self.queue.finished();
        }
        if self.saves_state {
            self.save_state();
        }
        tracing::debug!(slot = self.index, "slot stopped");
    }

    /// Checkpoints this slot's drafter instances and writes every plugin's state file. With
    /// several slots, the last to save a plugin's state wins.
    fn save_state(&mut self) {
        self.pool.checkpoint();
        save_plugin_states(self.registry.snapshot().loaded_plugins());
    }

    /// `job`'s request, with the verify cost curve when a policy will choose its draft lengths.
    fn request_for(&mut self, job: &Job) -> Request {
        let mut request = job.request.clone();
        if job.policy.is_none() {
            return request;
        }
        let curve = &mut self.verify_costs;
        if curve
            .draft_max
            .is_none_or(|measured| measured < request.draft_max)
        {
            // Logs the curve and how long measuring it took.
            match measure_verify_costs(&mut self.session, &request.prompt, request.draft_max) {
                Ok(costs) => {
                    curve.costs = costs;
                    curve.draft_max = Some(request.draft_max);
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot measure the verify cost curve; policies learn it from rounds");
                }
            }
        }
        request.verify_costs = curve.costs.clone();
        request
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
        let resolved = match snapshot.resolve(&job.cascade) {
            Ok(resolved) => resolved,
            Err(error) => {
                let _ = job.events.send(Event::Failed(error.to_string()));
                self.metrics.request(job.endpoint, RequestOutcome::Failed);
                return;
            }
        };
        let settings = CascadeSettings {
            mode: job.mode,
            ..CascadeSettings::default()
        };
        let request = self.request_for(job);
        let mut cascade = self
            .pool
            .cascade(&resolved, job.policy.as_ref(), settings.clone());
        let mut control = SwapControl {
            events: &job.events,
            registry: &self.registry,
            metrics: &self.metrics,
            pool: &mut self.pool,
            choice: &job.cascade,
            policy: job.policy.as_ref(),
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
                .generate_controlled(&request, &mut cascade, &mut on_text, &mut || {
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
                    policy: job.policy.as_ref().map(ResolvedPolicy::label),
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
    policy: Option<&'a ResolvedPolicy>,
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
        RoundDecision::Replace(
            self.pool
                .cascade(&resolved, self.policy, self.settings.clone()),
        )
    }
}
