//! `spechost plugin check FILE.wasm`: the conformance suite a plugin must pass before anyone
//! loads it, run in this host's own sandbox against a recorded trace, no model needed.
//!
//! For either kind of plugin: it links against this host's WIT version; `open` accepts an empty
//! config and rejects one with an unknown key, with a message; over the trace's requests its
//! results are valid and no call faults (trap, time-out, memory cap); its time per call and
//! largest memory are measured against the sandbox limits; two fresh instances replaying the
//! same requests give the same results. A drafter's proposals are checked as the host checks
//! them (length, vocabulary, confidences); handing it other requests' responses
//! (`observe-response`) must not fault it; and its cross-request state must round-trip: an
//! instance restored from the blob it saved proposes as the one that saved it, and a blob it
//! cannot read is treated as absent. A policy's decisions must stay within `max-draft-len` and
//! name only the cascade's sources.
//!
//! Drafters are driven by [`drafter`], policies by [`policy`]; this file holds the report.

mod drafter;
mod policy;
mod timing;

use std::fmt::Write as _;
use std::path::PathBuf;

use serde::Serialize;

use self::timing::CallTimes;
use crate::bench::trace::Trace;
use crate::plugins::{
    LoadError, PluginHost, PluginHostConfig, PluginKind, SandboxLimits, SourceSpec,
};

/// The configuration `open` must reject: a key no plugin has.
pub const UNKNOWN_KEY_CONFIG: &str = "spechost-check-no-such-key=1";

/// Requests of each workload replayed by default (the first ones of each, in trace order).
pub const DEFAULT_REQUESTS_PER_WORKLOAD: usize = 2;

/// What `plugin check` is asked to do.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// The plugin's `.wasm` file.
    pub plugin: PathBuf,
    /// The trace to replay.
    pub trace: PathBuf,
    /// How the trace is named in the report.
    pub trace_name: String,
    /// The configuration string the replays open the plugin with.
    pub config: String,
    /// Requests of each workload of the trace to replay.
    pub requests_per_workload: usize,
    /// Draft length asked of a drafter each round (the policy's `max-draft-len`).
    pub max_draft_len: usize,
    /// The sandbox limits to check against.
    pub limits: SandboxLimits,
    /// The compile cache's directory.
    pub cache_dir: Option<PathBuf>,
}

/// How one check went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Conforms.
    Pass,
    /// Conforms, with something the author should look at (close to a limit).
    Warn,
    /// Does not conform: the host would fault, quarantine or misuse the plugin.
    Fail,
    /// Not run, because an earlier check failed.
    Skip,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Pass => "PASS",
            Outcome::Warn => "WARN",
            Outcome::Fail => "FAIL",
            Outcome::Skip => "SKIP",
        }
    }
}

/// One check of the suite.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What was checked, e.g. `config` or `deterministic`.
    pub name: &'static str,
    /// How it went.
    pub outcome: Outcome,
    /// What was found, with the figures, and the fix when it failed.
    pub detail: String,
}

impl Check {
    fn new(name: &'static str, outcome: Outcome, detail: impl Into<String>) -> Self {
        Self {
            name,
            outcome,
            detail: detail.into(),
        }
    }

    fn pass(name: &'static str, detail: impl Into<String>) -> Self {
        Self::new(name, Outcome::Pass, detail)
    }

    fn fail(name: &'static str, detail: impl Into<String>) -> Self {
        Self::new(name, Outcome::Fail, detail)
    }
}

/// The measured figures behind the checks.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Figures {
    /// Time per call of each guest function the replays made.
    pub calls: Vec<CallTimes>,
    /// The sandbox's limit on each call's CPU time, in µs.
    pub call_deadline_us: u64,
    /// The CPU time an instance took to start at load, in µs.
    pub start_time_us: u64,
    /// The sandbox's limit on the CPU time an instance takes to start, in µs.
    pub start_deadline_us: u64,
    /// The largest linear memory an instance had, in bytes.
    pub peak_memory_bytes: usize,
    /// The sandbox's cap on each linear memory, in bytes.
    pub memory_limit_bytes: usize,
    /// Size of the state blob the drafter saved at its checkpoint (0: none).
    pub state_bytes: usize,
    /// Requests replayed per run.
    pub requests: usize,
    /// Rounds replayed per run.
    pub rounds: usize,
}

/// Everything `plugin check` found; `--json` prints this value.
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    /// The plugin file.
    pub plugin: PathBuf,
    /// `drafter` or `policy`, when the file is a component of either world.
    pub kind: Option<&'static str>,
    /// The WIT package this host speaks.
    pub wit: String,
    /// The trace replayed.
    pub trace: String,
    /// The checks, in the order run.
    pub checks: Vec<Check>,
    /// The figures.
    pub figures: Figures,
}

impl CheckReport {
    /// Whether no check failed.
    pub fn passed(&self) -> bool {
        self.failures() == 0
    }

    /// How many checks failed.
    pub fn failures(&self) -> usize {
        self.checks
            .iter()
            .filter(|check| check.outcome == Outcome::Fail)
            .count()
    }

    /// The report as text: one line per check, then the verdict.
    pub fn text(&self) -> String {
        let mut out = format!(
            "spechost plugin check {} ({}, host WIT {}, trace {})\n",
            self.plugin.display(),
            self.kind.unwrap_or("not a plugin"),
            self.wit,
            self.trace
        );
        for check in &self.checks {
            let _ = writeln!(
                out,
                "  {}  {:<14} {}",
                check.outcome.label(),
                check.name,
                check.detail
            );
        }
        let verdict = match self.failures() {
            0 => "conforms".to_owned(),
            1 => "1 check failed".to_owned(),
            n => format!("{n} checks failed"),
        };
        let _ = writeln!(out, "result: {verdict}");
        out
    }
}

/// Runs the suite on `options.plugin`. Errors are the checker's own (the trace cannot be read,
/// the engine cannot start); everything wrong with the plugin is in the report.
pub fn check(options: &CheckOptions) -> anyhow::Result<CheckReport> {
    let trace = Trace::read(&options.trace)?;
    let host = PluginHost::new(PluginHostConfig {
        cache_dir: options.cache_dir.clone(),
        limits: options.limits.clone(),
        ..PluginHostConfig::default()
    })?;
    let mut report = CheckReport {
        plugin: options.plugin.clone(),
        kind: None,
        wit: format!(
            "{}@{}",
            spechost_sdk::WIT_PACKAGE,
            spechost_sdk::WIT_VERSION
        ),
        trace: options.trace_name.clone(),
        checks: Vec::new(),
        figures: Figures {
            call_deadline_us: micros(options.limits.call_deadline),
            start_deadline_us: micros(options.limits.start_deadline),
            memory_limit_bytes: options.limits.memory_limit,
            ..Figures::default()
        },
    };
    let spec = SourceSpec::Path(options.plugin.clone());
    match host.load(&spec) {
        Ok(plugin) => {
            report.kind = Some(PluginKind::Drafter.as_str());
            loads(PluginKind::Drafter, plugin.start_time(), &mut report);
            drafter::check(&host, &plugin, &trace, options, &mut report);
        }
        Err(LoadError::MissingExport { found, .. }) if found.contains("policy-api") => {
            match host.load_policy(&spec) {
                Ok(plugin) => {
                    report.kind = Some(PluginKind::Policy.as_str());
                    loads(PluginKind::Policy, plugin.start_time(), &mut report);
                    policy::check(&host, &plugin, &trace, options, &mut report);
                }
                Err(error) => report.checks.push(Check::fail("loads", error.to_string())),
            }
        }
        Err(error) => report.checks.push(Check::fail("loads", error.to_string())),
    }
    Ok(report)
}

/// Adds the passed `loads` check of a plugin of `kind` whose instance started in `start_time`
/// (recorded in `report`'s figures).
fn loads(kind: PluginKind, start_time: std::time::Duration, report: &mut CheckReport) {
    report.figures.start_time_us = micros(start_time);
    let check = Check::pass(
        "loads",
        format!(
            "a {} component linked against {}, started under the sandbox limits in {} of CPU time (the limit is {})",
            kind.as_str(),
            report.wit,
            format_us(report.figures.start_time_us as f64),
            format_us(report.figures.start_deadline_us as f64)
        ),
    );
    report.checks.push(check);
}

/// The checks every plugin gets on its `open`: an empty config is accepted, one with an unknown
/// key is rejected with a message. `open` is the plugin's, called in a throw-away instance.
fn config_checks(open: impl Fn(&str) -> Result<(), LoadError>, report: &mut CheckReport) {
    report.checks.push(match open("") {
        Ok(()) => Check::pass("config", "`open` accepts an empty config"),
        Err(error) => Check::fail(
            "config",
            format!(
                "`open` with an empty config failed: {error}; a plugin must run with its defaults when the user gives no settings"
            ),
        ),
    });
    report.checks.push(match open(UNKNOWN_KEY_CONFIG) {
        Err(LoadError::Config { detail, .. }) => Check::pass(
            "bad config",
            format!("`open` rejects `{UNKNOWN_KEY_CONFIG}`: {detail}"),
        ),
        Err(error) => Check::fail(
            "bad config",
            format!("`open` with `{UNKNOWN_KEY_CONFIG}` failed instead of returning an error: {error}"),
        ),
        Ok(()) => Check::fail(
            "bad config",
            format!(
                "`open` accepted `{UNKNOWN_KEY_CONFIG}`: a user's misspelt setting would be silently ignored; return an error naming the unknown key (spechost_sdk::config::Config::finish does)"
            ),
        ),
    });
}

/// The `time per call` check: every guest call's time against the deadline (calls that ran out
/// of time are faults, reported by the replay check).
fn time_check(calls: &[CallTimes], limits: &SandboxLimits) -> Check {
    let deadline = limits.call_deadline.as_secs_f64() * 1e6;
    let summary = calls
        .iter()
        .map(CallTimes::summary)
        .collect::<Vec<_>>()
        .join("; ");
    let slowest = calls.iter().map(|c| c.max_us).fold(0.0, f64::max);
    let detail = format!(
        "{summary} (CPU time); the limit is {} of CPU time per call",
        format_us(deadline)
    );
    if slowest * 2.0 > deadline {
        Check::new(
            "time per call",
            Outcome::Warn,
            format!(
                "{detail}: the slowest call took over half of it, so a slower CPU may time it out"
            ),
        )
    } else {
        Check::pass("time per call", detail)
    }
}

/// The `memory` check: the largest linear memory against the cap (a refused growth is a fault,
/// reported by the replay check).
fn memory_check(peak: usize, limits: &SandboxLimits) -> Check {
    let detail = format!(
        "largest linear memory {} of the {} allowed",
        format_bytes(peak),
        format_bytes(limits.memory_limit)
    );
    if peak.saturating_mul(2) > limits.memory_limit {
        Check::new(
            "memory",
            Outcome::Warn,
            format!("{detail}: over half, so longer requests may reach the cap"),
        )
    } else {
        Check::pass("memory", detail)
    }
}

/// Marks the checks that depend on a plugin that could not run.
fn skip(report: &mut CheckReport, names: &[&'static str], why: &str) {
    for &name in names {
        report.checks.push(Check::new(name, Outcome::Skip, why));
    }
}

fn micros(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// `0.4 µs`, `850 µs`, `12.3 ms`.
fn format_us(us: f64) -> String {
    if us < 10.0 {
        format!("{us:.1} µs")
    } else if us < 1000.0 {
        format!("{us:.0} µs")
    } else {
        format!("{:.1} ms", us / 1e3)
    }
}

/// `512 KiB`, `2.5 MiB`.
fn format_bytes(bytes: usize) -> String {
    let mib = bytes as f64 / f64::from(1u32 << 20);
    if mib >= 1.0 {
        format!("{mib:.1} MiB")
    } else {
        format!("{} KiB", bytes.div_ceil(1024))
    }
}

/// The requests the replays use: the first `per_workload` of each workload, in trace order.
fn replayed_requests(
    trace: &Trace,
    per_workload: usize,
) -> Vec<&crate::bench::trace::TraceRequest> {
    trace
        .workloads()
        .into_iter()
        .flat_map(|(_, requests)| requests.iter().take(per_workload.max(1)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_names_each_check_and_counts_failures() {
        let mut report = CheckReport {
            plugin: "p.wasm".into(),
            kind: Some("drafter"),
            wit: "spechost:drafter@0.8.0".into(),
            trace: "t".into(),
            checks: vec![
                Check::pass("loads", "ok"),
                Check::new("memory", Outcome::Warn, "close"),
            ],
            figures: Figures::default(),
        };
        assert!(report.passed());
        report.checks.push(Check::fail("deterministic", "differs"));
        assert_eq!(report.failures(), 1);
        let text = report.text();
        assert!(text.contains("FAIL  deterministic"), "{text}");
        assert!(text.contains("WARN  memory"), "{text}");
        assert!(text.ends_with("result: 1 check failed\n"), "{text}");
    }

    #[test]
    fn time_and_memory_warn_past_half_their_limit() {
        let limits = SandboxLimits::default();
        let quick = CallTimes::from_samples("propose", vec![10_000, 20_000, 30_000]);
        assert_eq!(time_check(&[quick], &limits).outcome, Outcome::Pass);
        let slow = CallTimes::from_samples("propose", vec![10_000, 40_000_000]);
        assert_eq!(time_check(&[slow], &limits).outcome, Outcome::Warn);
        assert_eq!(memory_check(1 << 20, &limits).outcome, Outcome::Pass);
        assert_eq!(
            memory_check(limits.memory_limit * 3 / 4, &limits).outcome,
            Outcome::Warn
        );
        assert_eq!(format_bytes(3 << 19), "1.5 MiB");
        assert_eq!(format_us(1500.0), "1.5 ms");
        assert_eq!(format_us(0.42), "0.4 µs");
    }
}
