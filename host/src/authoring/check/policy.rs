//! The policy half of the suite: the policy chooses the draft length of a `lookup` cascade
//! replaying the trace through the engine's round protocol (as `simulate` does), every call
//! recorded. Determinism is judged on the recorded calls, not on a second replay: a round's
//! record holds measured times (`draft-us`), which differ from run to run, so a fresh instance
//! is given exactly the recorded setups and rounds and must decide exactly as the first did.

use std::sync::{Arc, Mutex, PoisonError};

use super::timing::CallLog;
use super::{
    Check, CheckOptions, CheckReport, config_checks, memory_check, replayed_requests, skip,
    time_check,
};
use crate::bench::simulate::replay;
use crate::bench::trace::Trace;
use crate::cascade::{
    Cascade, CascadeSettings, Decision, DraftSource, ModelFacts, PolicySetup, RoundPolicy,
    RoundRecord, SourceFault,
};
use crate::plugins::{LoadedPolicy, PluginHost, PluginPolicy, SourceSpec};

/// The guest functions a policy replay calls, in the order the report lists them.
const METHODS: &[&str] = &["open", "decide", "observe", "close"];

/// The drafter whose cascade the policy runs.
const CASCADE_SOURCE: &str = "lookup";

/// Runs the policy checks after `loads` passed.
pub(super) fn check(
    host: &PluginHost,
    plugin: &LoadedPolicy,
    trace: &Trace,
    options: &CheckOptions,
    report: &mut CheckReport,
) {
    const REPLAY_CHECKS: &[&str] = &["decisions", "time per call", "memory", "deterministic"];
    let facts = trace.target.facts();
    let setup = PolicySetup {
        sources: vec![CASCADE_SOURCE.to_owned()],
        max_draft_len: options.max_draft_len,
        verify_costs: trace.target.verify_costs().per_batch,
        draft_model: None,
        prompt_len: 0,
        max_tokens: 0,
    };
    config_checks(|config| plugin.check_config(config, &facts, &setup), report);
    if let Err(error) = plugin.check_config(&options.config, &facts, &setup) {
        report.checks.push(Check::fail(
            "decisions",
            format!("`open` rejected the config to replay with: {error}"),
        ));
        skip(report, &REPLAY_CHECKS[1..], "`open` rejected the config");
        return;
    }
    let lookup = match host.load(&SourceSpec::Builtin(CASCADE_SOURCE.to_owned())) {
        Ok(lookup) => lookup,
        Err(error) => {
            let why = format!("the `{CASCADE_SOURCE}` cascade to replay with: {error}");
            report.checks.push(Check::fail("decisions", why));
            skip(report, &REPLAY_CHECKS[1..], "no cascade to replay with");
            return;
        }
    };
    let requests = replayed_requests(trace, options.requests_per_workload);
    let log = Arc::new(Mutex::new(Recording::default()));
    let recorder = Recorder {
        policy: plugin.policy(options.config.clone()),
        recording: Arc::clone(&log),
    };
    let sources: Vec<Box<dyn DraftSource>> = vec![Box::new(lookup.source(""))];
    let mut cascade =
        Cascade::new(sources, CascadeSettings::default()).with_policy(Box::new(recorder));
    for request in &requests {
        replay(request, &trace.target, options.max_draft_len, &mut cascade);
    }
    drop(cascade);
    let recording = std::mem::take(&mut *log.lock().unwrap_or_else(PoisonError::into_inner));

    report.figures.requests = requests.len();
    report.figures.rounds = recording.decisions().count();
    report.figures.peak_memory_bytes = recording.peak_memory;
    report.checks.push(recording.decisions_check(&setup));
    report.figures.calls = recording.calls.figures(METHODS);
    report
        .checks
        .push(time_check(&report.figures.calls, &options.limits));
    report
        .checks
        .push(memory_check(recording.peak_memory, &options.limits));
    if !recording.faults.is_empty() {
        skip(report, &REPLAY_CHECKS[3..], "the replay faulted");
        return;
    }
    report.checks.push(deterministic_check(
        plugin.policy(options.config.clone()),
        &recording.events,
        &facts,
    ));
}

/// One call the cascade made to the policy.
#[derive(Debug, Clone)]
enum Event {
    Begin(PolicySetup),
    Decide(Decision),
    Observe(RoundRecord),
    End,
}

/// What the policy was asked and answered during the replay.
#[derive(Debug, Default)]
struct Recording {
    events: Vec<Event>,
    faults: Vec<String>,
    calls: CallLog,
    peak_memory: usize,
}

impl Recording {
    fn decisions(&self) -> impl Iterator<Item = &Decision> {
        self.events.iter().filter_map(|event| match event {
            Event::Decide(decision) => Some(decision),
            _ => None,
        })
    }

    /// The `decisions` check: no fault, every decision within the setup.
    fn decisions_check(&self, setup: &PolicySetup) -> Check {
        let rounds = self.decisions().count();
        if let Some(first) = self.faults.first() {
            return Check::fail(
                "decisions",
                format!(
                    "{} of the calls over {rounds} rounds faulted; the first: {first}. A fault makes the round plain decoding, and repeated faults quarantine the policy (speculation off)",
                    self.faults.len()
                ),
            );
        }
        let problems: Vec<String> = self
            .decisions()
            .filter_map(|decision| out_of_bounds(decision, setup))
            .collect();
        match problems.first() {
            Some(first) => Check::fail(
                "decisions",
                format!(
                    "{} of {rounds} decisions break the setup; the first: {first}. The host cuts or ignores them, but a policy's decisions must stay within its `policy-setup`",
                    problems.len()
                ),
            ),
            None => {
                let drafted = self.decisions().filter(|d| d.max_draft_len > 0).count();
                Check::pass(
                    "decisions",
                    format!(
                        "{rounds} rounds, {drafted} with a draft, every decision within max-draft-len {} and naming only the cascade's sources",
                        setup.max_draft_len
                    ),
                )
            }
        }
    }
}

/// What is wrong with `decision` under `setup`, if anything.
fn out_of_bounds(decision: &Decision, setup: &PolicySetup) -> Option<String> {
    let unknown = |names: &[String]| {
        names
            .iter()
            .find(|name| !setup.sources.contains(name))
            .map(|name| name.chars().take(40).collect::<String>())
    };
    if decision.max_draft_len > setup.max_draft_len {
        return Some(format!(
            "a draft length of {} where max-draft-len is {}",
            decision.max_draft_len, setup.max_draft_len
        ));
    }
    if decision.shadow_len > setup.max_draft_len {
        return Some(format!(
            "a shadow length of {} where max-draft-len is {}",
            decision.shadow_len, setup.max_draft_len
        ));
    }
    if let Some(name) = decision.order.as_deref().and_then(unknown) {
        return Some(format!(
            "an order naming `{name}`, not a source of the cascade"
        ));
    }
    unknown(&decision.exclude)
        .map(|name| format!("an exclusion of `{name}`, not a source of the cascade"))
}

/// The policy inside the replayed cascade, recording each call.
struct Recorder {
    policy: PluginPolicy,
    recording: Arc<Mutex<Recording>>,
}

impl Recorder {
    fn record<T>(
        &mut self,
        method: &'static str,
        call: impl FnOnce(&mut PluginPolicy) -> Result<T, SourceFault>,
        event: impl FnOnce(&T) -> Option<Event>,
    ) -> Result<T, SourceFault> {
        let mut recording = self
            .recording
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let policy = &mut self.policy;
        let result = recording.calls.time(method, || call(policy));
        match &result {
            Ok(value) => recording.events.extend(event(value)),
            Err(fault) => recording.faults.push(fault.to_string()),
        }
        recording.peak_memory = recording.peak_memory.max(self.policy.peak_memory());
        result
    }
}

impl RoundPolicy for Recorder {
    fn name(&self) -> &str {
        self.policy.name()
    }

    fn begin(&mut self, facts: &ModelFacts, setup: &PolicySetup) -> Result<(), SourceFault> {
        let begun = setup.clone();
        self.record(
            "open",
            |policy| policy.begin(facts, setup),
            |_| Some(Event::Begin(begun)),
        )
    }

    fn wants_text(&self) -> bool {
        self.policy.wants_text()
    }

    fn observe(&mut self, round: &RoundRecord) -> Result<(), SourceFault> {
        let observed = round.clone();
        self.record(
            "observe",
            |policy| policy.observe(round),
            |_| Some(Event::Observe(observed)),
        )
    }

    fn decide(&mut self) -> Result<Decision, SourceFault> {
        self.record("decide", PluginPolicy::decide, |decision| {
            Some(Event::Decide(decision.clone()))
        })
    }

    fn end(&mut self) {
        let _ = self.record(
            "close",
            |policy| {
                policy.end();
                Ok(())
            },
            |_| Some(Event::End),
        );
        if let Some(fault) = self.policy.last_fault() {
            let mut recording = self
                .recording
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if recording.faults.is_empty() {
                recording.faults.push(fault.to_string());
            }
        }
    }
}

/// The `deterministic` check: `fresh`, given exactly the recorded calls, decides as recorded.
fn deterministic_check(mut fresh: PluginPolicy, events: &[Event], facts: &ModelFacts) -> Check {
    let mut round = 0;
    for event in events {
        let differs = match event {
            Event::Begin(setup) => fresh.begin(facts, setup).err().map(|f| f.to_string()),
            Event::Observe(record) => fresh.observe(record).err().map(|f| f.to_string()),
            Event::End => {
                fresh.end();
                None
            }
            Event::Decide(recorded) => {
                round += 1;
                match fresh.decide() {
                    Ok(decision) if decision == *recorded => None,
                    Ok(decision) => Some(format!(
                        "round {round}: decided {decision:?} where the first instance decided {recorded:?}"
                    )),
                    Err(fault) => Some(fault.to_string()),
                }
            }
        };
        if let Some(problem) = differs {
            return Check::fail(
                "deterministic",
                format!(
                    "a fresh instance given the same setups and rounds did not decide the same ({problem}); a policy's decisions must follow from what it was told (seed any randomness)"
                ),
            );
        }
    }
    Check::pass(
        "deterministic",
        format!("a fresh instance given the same {round} rounds decided the same"),
    )
}
