//! A slot: one thread that generates the requests it takes from the queue, one after another,
//! on its sequence of the shared context (the batcher decodes every slot's rounds together), and
//! keeps its plugin instances across them.
//!
//! One request, in order:
//! 1. skip it if its client already went away;
//! 2. resolve its cascade against the published registry snapshot and build it, with its
//!    policy, from the slot's [`SourcePool`];
//! 3. generate on the slot's [`BatchedSequence`], asking a [`SwapControl`] between prompt
//!    chunks whether the client is gone, and before every round: it stops when the client is
//!    gone, and when the registry published a new generation it resolves the request's cascade
//!    again and, if its sources changed (a new plugin version, config or default cascade),
//!    hands the engine a new cascade, which the engine begins with the whole context so far;
//! 4. send the result, count it, record its output for the other slots' and replicas'
//!    drafters (`share`), keep what the cascade learnt of its sources, report plugin
//!    health; with `--state-dir`, save the plugins' cross-request state when
//!    [`STATE_SAVE_INTERVAL`] has passed since the last save, and when the slot stops.
//!
//! A panic while generating is caught: the request fails with a 500 and the slot goes on (its
//! sequence's request is ended in the batcher, and the next starts from an empty cache).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use super::error::ApiError;
use super::metrics::{Metrics, RequestOutcome};
use super::pool::SourcePool;
use super::registry::{CascadeChoice, Registry, ResolvedPolicy, ResolvedSource, SourceKey};
use super::scheduler::{Event, Finished, Job, Queue};
use super::share::Sharing;
use super::startup::SlotHandles;
use crate::cascade::CascadeSettings;
use crate::config::ServeConfig;
use crate::engine::{
    BatchedSequence, EngineError, OutputPiece, RoundControl, RoundDecision, StopReason,
};
use crate::plugins::save_plugin_states;

/// Least time between two saves of the plugins' state by one slot (with `--state-dir`).
pub const STATE_SAVE_INTERVAL: Duration = Duration::from_secs(60);

/// One slot thread's sequence, plugin instances, and what it shares with the server.
pub struct Slot<'a> {
    /// The slot's number, for logs; also its sequence's number.
    pub index: usize,
    /// Its sequence of the shared context.
    pub sequence: BatchedSequence<'a>,
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
    /// Where finished responses go, for other slots' and replicas' drafters.
    pub sharing: Arc<Sharing>,
}

impl<'a> Slot<'a> {
    /// Slot `index` over `sequence`, with an empty plugin pool, saving plugin state when the
    /// server has `--state-dir`.
    pub fn new(
        index: usize,
        sequence: BatchedSequence<'a>,
        handles: SlotHandles,
        config: &ServeConfig,
    ) -> Self {
        Self {
            index,
            sequence,
            registry: handles.registry,
            queue: handles.queue,
            metrics: handles.metrics,
            pool: SourcePool::new(index, Arc::clone(&handles.sharing)),
            sharing: handles.sharing,
            saves_state: config.state_dir.is_some(),
        }
    }

    /// Serves requests until the queue is closed and empty.
    pub fn run(mut self) {
        tracing::debug!(slot = self.index, "slot started");
        let mut state_saved_at = Instant::now();
        while let Some(job) = self.queue.next(self.index, self.sequence.cached()) {
            let span = job.span.clone();
            let _entered = span.enter();
            let served = std::panic::catch_unwind(AssertUnwindSafe(|| self.generate(&job)));
            // A panic may have left the sequence's request open in the batcher.
            self.sequence.end();
            if served.is_err() {
                tracing::error!(slot = self.index, "generation panicked; the slot goes on");
                let _ = job.events.send(Event::Failed(ApiError::internal(
                    "internal error: generation panicked; see the server log",
                )));
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

    fn generate(&mut self, job: &Job) {
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
                let _ = job
                    .events
                    .send(Event::Failed(ApiError::internal(error.to_string())));
                self.metrics.request(job.endpoint, RequestOutcome::Failed);
                return;
            }
        };
        let settings = CascadeSettings {
            mode: job.mode,
            grammar_drafts: job.grammar_drafts,
            ..CascadeSettings::default()
        };
        let request = job.request.clone();
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
            sources: resolved,
            swaps: 0,
        };
        let mut on_text = |piece: OutputPiece<'_>| {
            let _ = job.events.send(Event::Text {
                choice: job.choice,
                text: piece.text.to_owned(),
                logprobs: piece.logprobs.to_vec(),
            });
        };
        let result =
            self.sequence
                .generate_controlled(&request, &mut cascade, &mut on_text, &mut control);
        let swaps = control.swaps;
        let sources = control.sources;
        self.pool.keep_calibration(&sources, cascade.calibration());
        // Counted before answered: a client that reads the metrics after its answer sees its
        // request's plugin faults.
        self.pool.report(&self.metrics);
        self.metrics
            .plugin_instances(self.index, self.pool.instances());
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
                self.sharing
                    .finished(self.index, keys(&sources), &outcome.tokens);
                let _ = job.events.send(Event::Done(Box::new(Finished {
                    choice: job.choice,
                    cascade: cascade.source_names(),
                    max_draft_len: job.request.max_draft_len,
                    mode: job.mode,
                    policy: job.policy.as_ref().map(ResolvedPolicy::label),
                    swaps,
                    queue_time,
                    outcome,
                })));
            }
            Err(error) => {
                tracing::warn!(%error, "generation failed");
                let _ = job.events.send(Event::Failed(generation_error(&error)));
                self.metrics.request(job.endpoint, RequestOutcome::Failed);
            }
        }
    }
}

/// The answer to a request whose generation failed: a 400 naming `grammar` when the request's
/// grammar caused it, else a 500.
fn generation_error(error: &EngineError) -> ApiError {
    match error {
        EngineError::Grammar(_) | EngineError::GrammarTooSlow { .. } => {
            ApiError::invalid_param("grammar", error.to_string())
        }
        _ => ApiError::internal(error.to_string()),
    }
}

fn keys(sources: &[ResolvedSource]) -> Vec<SourceKey> {
    sources.iter().map(ResolvedSource::key).collect()
}

/// Decides between the rounds of one request (and between the chunks of its prompt): stop when
/// its client is gone, swap its cascade when the registry published sources it should now use.
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
    sources: Vec<ResolvedSource>,
    swaps: u32,
}

impl RoundControl for SwapControl<'_> {
    fn stop_prefill(&mut self) -> bool {
        self.events.is_closed()
    }

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
        if keys(&resolved) == keys(&self.sources) {
            return RoundDecision::Continue;
        }
        tracing::debug!(
            generation,
            cascade = %resolved.iter().map(|s| s.plugin.name()).collect::<Vec<_>>().join(","),
            "swapping the cascade between rounds"
        );
        let replacement = self
            .pool
            .cascade(&resolved, self.policy, self.settings.clone());
        self.sources = resolved;
        self.swaps += 1;
        RoundDecision::Replace(replacement)
    }
}
