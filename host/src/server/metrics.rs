//! Server counters and `GET /metrics` in the Prometheus text format (version 0.0.4).
//!
//! Counters are updated once per request (by the slot that ran it) and once per plugin event,
//! never per token, so one mutex over all of them costs nothing measurable. Gauges (queue depth,
//! running requests) are read from the queue when the page is rendered.
//!
//! Families, all prefixed `spechost_`:
//! - `requests_total{endpoint, outcome}`: completed, cancelled (client went away), failed,
//!   rejected (queue full or shutting down), invalid (400);
//! - `prompt_tokens_total`, `generated_tokens_total`, `prompt_seconds_total`,
//!   `generation_seconds_total`, and `generation_tokens_per_second` (since start);
//! - `draft_rounds_total`, `drafted_tokens_total`, `accepted_tokens_total`,
//!   `cut_draft_tokens_total`, `replayed_tokens_total`, `cascade_swaps_total`;
//! - per source: `source_rounds_won_total`, `source_drafted_tokens_total`,
//!   `source_accepted_tokens_total`, `source_accepted_at_position_total{position}` (winning
//!   rounds whose draft position was accepted; divide by rounds won for acceptance by position);
//! - per plugin: `plugin_faults_total`, `plugin_restarts_total`, `plugin_quarantines_total`;
//!   `plugin_reloads_total{outcome}` (published, rejected);
//! - `queue_waiting`, `queue_running`, `queue_slots`, `queue_max`;
//! - `plugin_instances{kind}`: live drafter and policy instances in all slots (bounded: a
//!   slot keeps one per loaded source and at most `pool::MAX_LIVE_POLICIES` policies).
//!
//! The page needs the admin token unless the server runs with `--public-metrics`: per-source
//! acceptance tells something about what other tenants generate.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use super::admin::MetricsReader;
use super::scheduler::QueueGauges;
use super::state::AppState;
use crate::cascade::SourceStats;
use crate::engine::GenerationStats;

/// Requests whose times make the `Retry-After` estimate: recent enough to follow a change of
/// load within a burst, enough to smooth one odd request.
const RECENT_REQUESTS: usize = 16;

/// Content type of the Prometheus text format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The endpoint a request came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Endpoint {
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/chat/completions`.
    ChatCompletions,
}

impl Endpoint {
    fn as_str(self) -> &'static str {
        match self {
            Self::Completions => "completions",
            Self::ChatCompletions => "chat_completions",
        }
    }
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum RequestOutcome {
    /// Generated to the end.
    Completed,
    /// The client went away before the end.
    Cancelled,
    /// Generation failed.
    Failed,
    /// Not queued: the queue was full or the server was shutting down.
    Rejected,
    /// Refused as invalid (400).
    Invalid,
}

impl RequestOutcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Cancelled => "cancelled",
            Self::Failed => "failed",
            Self::Rejected => "rejected",
            Self::Invalid => "invalid",
        }
    }
}

/// How a plugin update ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ReloadOutcome {
    /// A new snapshot was published.
    Published,
    /// The update was refused; the old plugins stay.
    Rejected,
}

impl ReloadOutcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::Published => "published",
            Self::Rejected => "rejected",
        }
    }
}

/// What a slot saw of one plugin instance since it last reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PluginHealthDelta {
    /// New faults.
    pub faults: u64,
    /// New restarts.
    pub restarts: u64,
    /// Whether the instance was quarantined since.
    pub quarantined: bool,
}

#[derive(Debug, Default, Clone, Copy)]
struct PluginCounters {
    faults: u64,
    restarts: u64,
    quarantines: u64,
}

#[derive(Debug, Default)]
struct Counters {
    requests: BTreeMap<(Endpoint, RequestOutcome), u64>,
    prompt_tokens: u64,
    generated_tokens: u64,
    prompt_time: Duration,
    generation_time: Duration,
    draft_rounds: u64,
    drafted: u64,
    accepted: u64,
    cut_draft_tokens: u64,
    replayed_tokens: u64,
    swaps: u64,
    sources: BTreeMap<String, SourceStats>,
    plugins: BTreeMap<String, PluginCounters>,
    reloads: BTreeMap<ReloadOutcome, u64>,
    /// Times (prompt plus generation) of the last [`RECENT_REQUESTS`] generated requests.
    recent: VecDeque<Duration>,
    /// Live plugin instances by slot.
    instances: BTreeMap<usize, PluginInstances>,
}

/// Live plugin instances of one slot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PluginInstances {
    /// Drafter instances.
    pub drafters: usize,
    /// Policy instances.
    pub policies: usize,
}

/// The server's counters.
#[derive(Debug, Default)]
pub struct Metrics {
    counters: Mutex<Counters>,
}

impl Metrics {
    fn lock(&self) -> MutexGuard<'_, Counters> {
        // Counters stay consistent whatever panicked while holding the lock.
        self.counters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a request that ended without generating (cancelled while queued, rejected,
    /// invalid, failed).
    pub fn request(&self, endpoint: Endpoint, outcome: RequestOutcome) {
        *self.lock().requests.entry((endpoint, outcome)).or_default() += 1;
    }

    /// Counts a request that generated, with its stats and the cascade swaps it went through.
    pub fn generation(
        &self,
        endpoint: Endpoint,
        outcome: RequestOutcome,
        stats: &GenerationStats,
        swaps: u32,
    ) {
        let mut counters = self.lock();
        *counters.requests.entry((endpoint, outcome)).or_default() += 1;
        counters.prompt_tokens += stats.prompt_tokens as u64;
        counters.generated_tokens += stats.generated_tokens as u64;
        counters.prompt_time += stats.prompt_time;
        counters.generation_time += stats.generation_time;
        counters.draft_rounds += stats.draft_rounds;
        counters.drafted += stats.drafted;
        counters.accepted += stats.accepted;
        counters.cut_draft_tokens += stats.cut_draft_tokens;
        counters.replayed_tokens += stats.replayed_tokens;
        counters.swaps += u64::from(swaps);
        if counters.recent.len() == RECENT_REQUESTS {
            counters.recent.pop_front();
        }
        counters
            .recent
            .push_back(stats.prompt_time + stats.generation_time);
        for source in &stats.sources {
            counters
                .sources
                .entry(source.name.clone())
                .or_insert_with(|| SourceStats::named(&source.name))
                .add(source);
        }
    }

    /// Adds what a slot saw of a plugin instance.
    pub fn plugin_health(&self, plugin: &str, delta: PluginHealthDelta) {
        let mut counters = self.lock();
        let entry = counters.plugins.entry(plugin.to_owned()).or_default();
        entry.faults += delta.faults;
        entry.restarts += delta.restarts;
        entry.quarantines += u64::from(delta.quarantined);
    }

    /// Counts a plugin update (admin call or watcher).
    pub fn reload(&self, outcome: ReloadOutcome) {
        *self.lock().reloads.entry(outcome).or_default() += 1;
    }

    /// Mean time of the last few generated requests (prompt plus generation); zero before the
    /// first. Recent rather than lifetime, so a `Retry-After` follows the load of the moment.
    pub fn recent_request_time(&self) -> Duration {
        let counters = self.lock();
        match u32::try_from(counters.recent.len()) {
            Ok(n) if n > 0 => counters.recent.iter().sum::<Duration>() / n,
            _ => Duration::ZERO,
        }
    }

    /// Records the live plugin instances of slot `slot`.
    pub fn plugin_instances(&self, slot: usize, instances: PluginInstances) {
        self.lock().instances.insert(slot, instances);
    }

    /// The metrics page.
    pub fn render(&self, queue: QueueGauges) -> String {
        let counters = self.lock();
        let mut page = Page::default();

        page.family(
            "requests_total",
            "counter",
            "Requests by endpoint and outcome.",
        );
        for ((endpoint, outcome), count) in &counters.requests {
            page.sample(
                "requests_total",
                &[
                    ("endpoint", endpoint.as_str()),
                    ("outcome", outcome.as_str()),
                ],
                *count,
            );
        }
        for (name, help, value) in [
            (
                "prompt_tokens_total",
                "Prompt tokens decoded.",
                counters.prompt_tokens,
            ),
            (
                "generated_tokens_total",
                "Tokens generated.",
                counters.generated_tokens,
            ),
            (
                "draft_rounds_total",
                "Rounds that verified a draft.",
                counters.draft_rounds,
            ),
            (
                "drafted_tokens_total",
                "Draft tokens verified.",
                counters.drafted,
            ),
            (
                "accepted_tokens_total",
                "Draft tokens accepted.",
                counters.accepted,
            ),
            (
                "cut_draft_tokens_total",
                "Draft tokens proposed but cut by a verify step: not worth their rows beside the other requests' rounds.",
                counters.cut_draft_tokens,
            ),
            (
                "replayed_tokens_total",
                "Tokens a recurrent target decoded again after drafts cut short.",
                counters.replayed_tokens,
            ),
            (
                "cascade_swaps_total",
                "Cascades replaced between rounds of a running request.",
                counters.swaps,
            ),
        ] {
            page.family(name, "counter", help);
            page.sample(name, &[], value);
        }
        for (name, help, time) in [
            (
                "prompt_seconds_total",
                "Time spent decoding prompts.",
                counters.prompt_time,
            ),
            (
                "generation_seconds_total",
                "Time spent generating after the first token.",
                counters.generation_time,
            ),
        ] {
            page.family(name, "counter", help);
            page.sample(name, &[], time.as_secs_f64());
        }
        let tokens_per_second = match counters.generation_time.as_secs_f64() {
            secs if secs > 0.0 => counters.generated_tokens as f64 / secs,
            _ => 0.0,
        };
        page.family(
            "generation_tokens_per_second",
            "gauge",
            "Generated tokens per second of generation time, since start.",
        );
        page.sample("generation_tokens_per_second", &[], tokens_per_second);

        type SourceCounter = fn(&SourceStats) -> u64;
        let source_families: [(&str, &str, SourceCounter); 3] = [
            (
                "source_rounds_won_total",
                "Rounds whose draft came from this source.",
                |s| s.won,
            ),
            (
                "source_drafted_tokens_total",
                "Draft tokens of this source that were verified.",
                |s| s.drafted,
            ),
            (
                "source_accepted_tokens_total",
                "Draft tokens of this source that were accepted.",
                |s| s.accepted,
            ),
        ];
        for (name, help, value) in source_families {
            page.family(name, "counter", help);
            for (source, stats) in &counters.sources {
                page.sample(name, &[("source", source)], value(stats));
            }
        }
        page.family(
            "source_accepted_at_position_total",
            "counter",
            "Winning rounds of this source whose draft token at this position (from 0) was accepted.",
        );
        for (source, stats) in &counters.sources {
            for (position, count) in stats.accepted_by_position.iter().enumerate() {
                page.sample(
                    "source_accepted_at_position_total",
                    &[("source", source), ("position", &position.to_string())],
                    *count,
                );
            }
        }

        type PluginCounter = fn(&PluginCounters) -> u64;
        let plugin_families: [(&str, &str, PluginCounter); 3] = [
            (
                "plugin_faults_total",
                "Plugin faults: traps, time-outs, memory-limit hits, invalid proposals.",
                |p| p.faults,
            ),
            (
                "plugin_restarts_total",
                "Plugin instances re-created after a trap.",
                |p| p.restarts,
            ),
            (
                "plugin_quarantines_total",
                "Plugin instances quarantined after repeated faults.",
                |p| p.quarantines,
            ),
        ];
        for (name, help, value) in plugin_families {
            page.family(name, "counter", help);
            for (plugin, plugin_counters) in &counters.plugins {
                page.sample(name, &[("plugin", plugin)], value(plugin_counters));
            }
        }
        page.family(
            "plugin_reloads_total",
            "counter",
            "Plugin updates (admin calls and watched files) by outcome.",
        );
        for (outcome, count) in &counters.reloads {
            page.sample(
                "plugin_reloads_total",
                &[("outcome", outcome.as_str())],
                *count,
            );
        }

        page.family(
            "plugin_instances",
            "gauge",
            "Live plugin instances in all slots, by kind.",
        );
        let drafters = counters
            .instances
            .values()
            .map(|i| i.drafters)
            .sum::<usize>();
        let policies = counters
            .instances
            .values()
            .map(|i| i.policies)
            .sum::<usize>();
        page.sample("plugin_instances", &[("kind", "drafter")], drafters);
        page.sample("plugin_instances", &[("kind", "policy")], policies);

        for (name, help, value) in [
            (
                "queue_waiting",
                "Requests waiting for a slot.",
                queue.waiting,
            ),
            ("queue_running", "Requests being generated.", queue.running),
            (
                "queue_slots",
                "Slots (requests generated at once).",
                queue.slots,
            ),
            ("queue_max", "Most requests that may wait.", queue.max_queue),
        ] {
            page.family(name, "gauge", help);
            page.sample(name, &[], value);
        }
        page.text
    }
}

/// A metrics page being written.
#[derive(Debug, Default)]
pub(super) struct Page {
    /// The page so far.
    pub(super) text: String,
}

impl Page {
    /// Starts the family `spechost_NAME` of `kind` (counter, gauge).
    pub(super) fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP spechost_{name} {help}");
        let _ = writeln!(self.text, "# TYPE spechost_{name} {kind}");
    }

    /// One sample of the family `spechost_NAME`.
    pub(super) fn sample(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        value: impl std::fmt::Display,
    ) {
        let _ = write!(self.text, "spechost_{name}");
        if !labels.is_empty() {
            let labels: Vec<String> = labels
                .iter()
                .map(|(key, value)| format!("{key}=\"{}\"", escape_label(value)))
                .collect();
            let _ = write!(self.text, "{{{}}}", labels.join(","));
        }
        let _ = writeln!(self.text, " {value}");
    }
}

/// A label value with `\`, `"` and newlines escaped, as the text format requires.
fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// `GET /metrics`.
pub async fn page(_: MetricsReader, State(state): State<AppState>) -> impl IntoResponse {
    let mut text = state.metrics.render(state.queue.gauges());
    text.push_str(&state.sharing.metrics());
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gauges() -> QueueGauges {
        QueueGauges {
            waiting: 2,
            running: 1,
            slots: 1,
            max_queue: 8,
        }
    }

    #[test]
    fn renders_counters_per_source_and_position() {
        let metrics = Metrics::default();
        let mut lookup = SourceStats::named("lookup");
        lookup.won = 3;
        lookup.drafted = 9;
        lookup.accepted = 5;
        lookup.accepted_by_position = vec![3, 2];
        let stats = GenerationStats {
            prompt_tokens: 10,
            generated_tokens: 20,
            generation_time: Duration::from_secs(2),
            sources: vec![lookup],
            ..GenerationStats::default()
        };
        metrics.generation(
            Endpoint::ChatCompletions,
            RequestOutcome::Completed,
            &stats,
            1,
        );
        metrics.plugin_health(
            "we\"ird",
            PluginHealthDelta {
                faults: 3,
                restarts: 2,
                quarantined: true,
            },
        );
        let page = metrics.render(gauges());
        for line in [
            "spechost_requests_total{endpoint=\"chat_completions\",outcome=\"completed\"} 1",
            "spechost_generated_tokens_total 20",
            "spechost_generation_tokens_per_second 10",
            "spechost_cascade_swaps_total 1",
            "spechost_source_accepted_tokens_total{source=\"lookup\"} 5",
            "spechost_source_accepted_at_position_total{source=\"lookup\",position=\"1\"} 2",
            "spechost_plugin_quarantines_total{plugin=\"we\\\"ird\"} 1",
            "spechost_queue_waiting 2",
            "# TYPE spechost_requests_total counter",
        ] {
            assert!(
                page.lines().any(|l| l == line),
                "missing `{line}` in:\n{page}"
            );
        }
    }

    #[test]
    fn request_time_follows_recent_requests_only() {
        let metrics = Metrics::default();
        assert_eq!(metrics.recent_request_time(), Duration::ZERO);
        let took = |secs| GenerationStats {
            prompt_time: Duration::from_secs(1),
            generation_time: Duration::from_secs(secs),
            ..GenerationStats::default()
        };
        metrics.generation(
            Endpoint::Completions,
            RequestOutcome::Completed,
            &took(3),
            0,
        );
        metrics.request(Endpoint::Completions, RequestOutcome::Rejected);
        assert_eq!(metrics.recent_request_time(), Duration::from_secs(4));
        // A long request early on, then a burst of short ones: the estimate is the burst's.
        metrics.generation(
            Endpoint::Completions,
            RequestOutcome::Completed,
            &took(59),
            0,
        );
        for _ in 0..RECENT_REQUESTS {
            metrics.generation(
                Endpoint::Completions,
                RequestOutcome::Completed,
                &took(0),
                0,
            );
        }
        assert_eq!(metrics.recent_request_time(), Duration::from_secs(1));
    }
}
