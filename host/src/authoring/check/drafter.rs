//! The drafter half of the suite: a drafter is replayed over the trace as the host drives it
//! for one request at a time with greedy verification (`open` with the prompt, the first output
//! token, then per round `propose`, `feedback`, `feed` of the committed tokens), each call
//! timed, every proposal checked by the host's own rules ([`PluginSource`]). A server also hands
//! each instance the responses of requests it did not serve (`observe-response`); the suite does
//! so with every other request's output, then replays the requests in between.

use std::path::{Path, PathBuf};

use super::timing::CallLog;
use super::{
    Check, CheckOptions, CheckReport, Outcome, config_checks, format_bytes, memory_check,
    replayed_requests, skip, time_check,
};
use crate::bench::trace::{Trace, TraceRequest};
use crate::cascade::{DraftSource, Feedback, ModelFacts, Proposal, SourceFault, matching_prefix};
use crate::plugins::{LoadedPlugin, PluginHost, PluginSource, SourceSpec};

/// The guest functions a drafter replay calls, in the order the report lists them. `open`
/// includes the session's first `feed` (the prompt).
const METHODS: &[&str] = &[
    "open",
    "feed",
    "propose",
    "feedback",
    "close",
    "observe-response",
];

/// Bytes of the unreadable state blob a drafter must treat as absent.
const GARBAGE_BLOB: &[u8] = b"not a state blob written by this plugin \x00\xff\x13\x37";

/// Runs the drafter checks after `loads` passed.
pub(super) fn check(
    host: &PluginHost,
    plugin: &LoadedPlugin,
    trace: &Trace,
    options: &CheckOptions,
    report: &mut CheckReport,
) {
    let facts = trace.target.facts();
    config_checks(|config| plugin.check_config(config, &facts), report);
    const REPLAY_CHECKS: &[&str] = &[
        "proposals",
        "time per call",
        "memory",
        "deterministic",
        "observe",
        "state",
    ];
    if let Err(error) = plugin.check_config(&options.config, &facts) {
        report.checks.push(Check::fail(
            "proposals",
            format!("`open` rejected the config to replay with: {error}"),
        ));
        skip(report, &REPLAY_CHECKS[1..], "`open` rejected the config");
        return;
    }
    let requests = replayed_requests(trace, options.requests_per_workload);
    let driver = Driver {
        facts: &facts,
        max_draft_len: options.max_draft_len,
    };

    let mut log = CallLog::default();
    let mut first = plugin.source(options.config.clone());
    let replay = driver.replay(&mut first, &requests, &mut log);
    let observed = replay
        .faults
        .is_empty()
        .then(|| driver.observe_check(plugin, &options.config, &requests, &mut log));
    report.figures.requests = requests.len();
    report.figures.rounds = replay.proposals.len();
    report.figures.peak_memory_bytes = first.peak_memory();
    report
        .checks
        .push(replay.validity_check(requests.len(), plugin.uses_draft_model()));
    report.figures.calls = log.figures(METHODS);
    report
        .checks
        .push(time_check(&report.figures.calls, &options.limits));
    report
        .checks
        .push(memory_check(first.peak_memory(), &options.limits));
    let Some(observed) = observed else {
        skip(report, &REPLAY_CHECKS[3..], "the replay faulted");
        return;
    };

    let mut second = plugin.source(options.config.clone());
    let again = driver.replay(&mut second, &requests, &mut CallLog::default());
    report.checks.push(
        match first_difference(&replay.proposals, &again.proposals) {
            None => Check::pass(
                "deterministic",
                format!(
                    "a second fresh instance made the same {} proposals",
                    replay.proposals.len()
                ),
            ),
            Some(where_) => Check::fail(
                "deterministic",
                format!(
                    "two fresh instances replaying the same requests proposed differently ({where_}); the scored cascade and `plugin bench` assume a drafter's proposals follow from what it was fed (seed any randomness, iterate maps in a fixed order)"
                ),
            ),
        },
    );
    report.checks.push(observed);
    let state = StateCheck {
        host,
        plugin: &options.plugin,
        config: &options.config,
        driver: &driver,
        requests: &requests,
    };
    let (check, state_bytes) = state.run();
    report.figures.state_bytes = state_bytes;
    report.checks.push(check);
}

/// What a replay saw.
struct Replay {
    /// Every proposal, round by round (a faulty one as the empty proposal the host used).
    proposals: Vec<Proposal>,
    /// Each fault, in words.
    faults: Vec<String>,
    /// Draft tokens proposed and accepted.
    drafted: usize,
    accepted: usize,
}

impl Replay {
    /// The `proposals` check; `drives_draft_model`: the plugin imports `draft-model`, which the
    /// check runs without, so proposing nothing is expected.
    fn validity_check(&self, requests: usize, drives_draft_model: bool) -> Check {
        let rounds = self.proposals.len();
        if let Some(first) = self.faults.first() {
            return Check::fail(
                "proposals",
                format!(
                    "{} of the calls over {requests} requests faulted; the first: {first}. The host drops a faulty proposal, re-creates a trapped instance and quarantines the plugin after repeated faults",
                    self.faults.len()
                ),
            );
        }
        let detail = format!(
            "{rounds} rounds over {requests} requests, {} tokens proposed, {} accepted ({:.1}%), every proposal valid",
            self.drafted,
            self.accepted,
            100.0 * self.accepted as f64 / self.drafted.max(1) as f64
        );
        if self.drafted == 0 && drives_draft_model {
            Check::new(
                "proposals",
                Outcome::Warn,
                format!(
                    "{detail}; it drives the draft model, which `plugin check` runs without, so it proposed nothing: try it with `spechost run --draft-model`"
                ),
            )
        } else if self.drafted == 0 {
            Check::new(
                "proposals",
                Outcome::Warn,
                format!("{detail}, but it proposed nothing in any round"),
            )
        } else {
            Check::pass("proposals", detail)
        }
    }
}

/// Drives drafter sources over traced requests.
struct Driver<'a> {
    facts: &'a ModelFacts,
    max_draft_len: usize,
}

impl Driver<'_> {
    /// Replays `requests` in order through `source`, timing each call into `log`.
    fn replay(
        &self,
        source: &mut PluginSource,
        requests: &[&TraceRequest],
        log: &mut CallLog,
    ) -> Replay {
        let mut replay = Replay {
            proposals: Vec::new(),
            faults: Vec::new(),
            drafted: 0,
            accepted: 0,
        };
        let note = |result: Result<(), SourceFault>, faults: &mut Vec<String>| {
            if let Err(fault) = result {
                faults.push(fault.to_string());
            }
        };
        for request in requests {
            let output = &request.output;
            note(
                log.time("open", || source.begin(self.facts, &request.prompt)),
                &mut replay.faults,
            );
            if !output.is_empty() {
                note(
                    log.time("feed", || source.feed(&output[..1])),
                    &mut replay.faults,
                );
            }
            let mut position = 1;
            while position < output.len() {
                let proposal = match log.time("propose", || source.propose(self.max_draft_len)) {
                    Ok(proposal) => proposal,
                    Err(fault) => {
                        replay.faults.push(fault.to_string());
                        Proposal::empty()
                    }
                };
                let rest = &output[position..];
                let accepted = matching_prefix(&proposal.tokens, rest);
                let won = !proposal.tokens.is_empty();
                let outcome = Feedback {
                    won,
                    n_accepted: if won { accepted as u32 } else { 0 },
                    target_token: rest[accepted.min(rest.len() - 1)],
                };
                note(
                    log.time("feedback", || source.feedback(outcome)),
                    &mut replay.faults,
                );
                let committed = (accepted + 1).min(rest.len());
                note(
                    log.time("feed", || source.feed(&rest[..committed])),
                    &mut replay.faults,
                );
                replay.drafted += proposal.tokens.len();
                replay.accepted += accepted;
                replay.proposals.push(proposal);
                position += committed;
            }
            log.time("close", || source.end());
        }
        if let (Some(fault), true) = (source.last_fault(), replay.faults.is_empty()) {
            // A fault while closing a session is recorded by the source, not returned.
            replay.faults.push(fault.to_string());
        }
        replay
    }
}

impl Driver<'_> {
    /// The `observe` check: a fresh instance is handed the outputs of every other
    /// request (the first, third, ...) as a server hands an instance other requests' responses,
    /// then replays the requests in between; it must not fault. The detail compares its
    /// accepted draft tokens with those of a fresh instance that was handed nothing.
    fn observe_check(
        &self,
        plugin: &LoadedPlugin,
        config: &str,
        requests: &[&TraceRequest],
        log: &mut CallLog,
    ) -> Check {
        const NAME: &str = "observe";
        let later: Vec<_> = requests.iter().skip(1).step_by(2).copied().collect();
        if later.is_empty() {
            return Check::new(NAME, Outcome::Skip, "needs two requests or more to replay");
        }
        let mut observing = plugin.source(config.to_owned());
        let responses: Vec<&[_]> = requests
            .iter()
            .step_by(2)
            .map(|request| request.output.as_slice())
            .filter(|output| !output.is_empty())
            .collect();
        for response in &responses {
            if let Err(fault) =
                log.time("observe-response", || observing.observe_response(response))
            {
                return Check::fail(
                    NAME,
                    format!(
                        "`observe-response` faulted on a {}-token response: {fault}; the host re-creates a trapped instance, which loses what it learnt, and quarantines a plugin that keeps faulting",
                        response.len()
                    ),
                );
            }
        }
        let taught = self.replay(&mut observing, &later, log);
        if let Some(fault) = taught.faults.first() {
            return Check::fail(
                NAME,
                format!(
                    "handed {} responses of other requests, the instance then faulted: {fault}",
                    responses.len()
                ),
            );
        }
        let fresh = self.replay(
            &mut plugin.source(config.to_owned()),
            &later,
            &mut CallLog::default(),
        );
        let detail = format!(
            "handed the outputs of {} requests as other requests' responses, an instance got {} draft tokens accepted over the {} requests between them, a fresh one {}",
            responses.len(),
            taught.accepted,
            later.len(),
            fresh.accepted
        );
        if taught.proposals == fresh.proposals {
            Check::pass(
                NAME,
                format!(
                    "{detail}: it drafts as if it was handed nothing (it keeps no memory of other requests' responses)"
                ),
            )
        } else {
            Check::pass(NAME, detail)
        }
    }
}

/// Where two replays' proposals first differ: `round N of the replay: [..] then [..]`.
fn first_difference(first: &[Proposal], second: &[Proposal]) -> Option<String> {
    let same = |a: &Proposal, b: &Proposal| {
        a.tokens == b.tokens
            && a.confidence.len() == b.confidence.len()
            && a.confidence
                .iter()
                .zip(&b.confidence)
                .all(|(x, y)| x.to_bits() == y.to_bits())
    };
    let round =
        (0..first.len().max(second.len())).find(|&i| match (first.get(i), second.get(i)) {
            (Some(a), Some(b)) => !same(a, b),
            _ => true,
        })?;
    let show = |proposal: Option<&Proposal>| {
        proposal.map_or_else(
            || "nothing".to_owned(),
            |p| format!("{:?} with confidences {:?}", p.tokens, p.confidence),
        )
    };
    Some(format!(
        "round {} of the replay: {} then {}",
        round + 1,
        show(first.get(round)),
        show(second.get(round))
    ))
}

/// The state round-trip: an instance replays the first half of the requests and checkpoints;
/// a fresh instance restored from that blob must then propose on the second half exactly as
/// the instance that saved it; a blob the plugin cannot read must be treated as absent.
struct StateCheck<'a> {
    host: &'a PluginHost,
    plugin: &'a Path,
    config: &'a str,
    driver: &'a Driver<'a>,
    requests: &'a [&'a TraceRequest],
}

impl StateCheck<'_> {
    /// The check and the size of the blob saved (0: none).
    fn run(&self) -> (Check, usize) {
        let dir = scratch_dir();
        let result = self.round_trip(&dir);
        std::fs::remove_dir_all(&dir).ok();
        match result {
            Ok(outcome) => outcome,
            Err(error) => (Check::fail("state", error), 0),
        }
    }

    fn round_trip(&self, dir: &Path) -> Result<(Check, usize), String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let spec = SourceSpec::Path(self.plugin.to_owned());
        let load = |file: &Path| {
            self.host
                .load_with_state_file(&spec, file)
                .map_err(|error| error.to_string())
        };
        let saved_file = dir.join("saved.state");
        let saver = load(&saved_file)?;
        let mut saving = saver.source(self.config);
        let (earlier, later) = self.requests.split_at(self.requests.len() / 2);
        self.driver
            .replay(&mut saving, earlier, &mut CallLog::default());
        if let Err(fault) = saving.checkpoint() {
            return Err(format!("`checkpoint` faulted: {fault}"));
        }
        let Some(blob) = saver.state().blob() else {
            return Ok((
                Check::pass(
                    "state",
                    "keeps no state across restarts (saved nothing at `checkpoint`)",
                ),
                0,
            ));
        };
        saver
            .state()
            .persist()
            .map_err(|e| format!("cannot write {}: {e}", saved_file.display()))?;
        let mut restored = load(&saved_file)?.source(self.config);
        let expected = self
            .driver
            .replay(&mut saving, later, &mut CallLog::default());
        let got = self
            .driver
            .replay(&mut restored, later, &mut CallLog::default());
        if let Some(where_) = first_difference(&expected.proposals, &got.proposals) {
            return Ok((
                Check::fail(
                    "state",
                    format!(
                        "a fresh instance restored from the {} blob it saved proposes differently from the instance that saved it ({where_}); save everything the proposals depend on, or nothing",
                        format_bytes(blob.len())
                    ),
                ),
                blob.len(),
            ));
        }
        let garbage_file = dir.join("garbage.state");
        std::fs::write(&garbage_file, GARBAGE_BLOB)
            .map_err(|e| format!("cannot write {}: {e}", garbage_file.display()))?;
        let mut confused = load(&garbage_file)?.source(self.config);
        let replay = self.driver.replay(
            &mut confused,
            &later[..later.len().min(1)],
            &mut CallLog::default(),
        );
        if let Some(fault) = replay.faults.first() {
            return Ok((
                Check::fail(
                    "state",
                    format!(
                        "with a state blob it did not write, it faulted ({fault}); a plugin must treat a blob it cannot read as absent (check a magic number, version and checksum)"
                    ),
                ),
                blob.len(),
            ));
        }
        Ok((
            Check::pass(
                "state",
                format!(
                    "restored from its {} blob, a fresh instance proposes as the one that saved it; an unreadable blob is treated as absent",
                    format_bytes(blob.len())
                ),
            ),
            blob.len(),
        ))
    }
}

/// A directory of its own for one check's state files.
fn scratch_dir() -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    std::env::temp_dir().join(format!(
        "spechost-plugin-check-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}
