//! Deliberately broken plugins (built from `tests/hostile/`) in a cascade on a real model:
//! the host survives, the output stays identical to plain decoding, and a warning names the
//! plugin and what it did.

mod common;

use common::*;
use spechost::cascade::Cascade;
use spechost::engine::SamplingParams;
use spechost::models::DefaultModel;
use spechost::plugins::SandboxLimits;
use spechost::plugins::SourceSpec;

const MAX_TOKENS: usize = 48;

/// Runs `[hostile, lookup]` and plain decoding on the same prompt under the default sandbox
/// limits; returns the warnings logged and the hostile source's fault count.
fn run_hostile(stem: &str) -> (String, u64) {
    run_hostile_with(stem, &SandboxLimits::default())
}

/// Like [`run_hostile`], under `limits`.
fn run_hostile_with(stem: &str, limits: &SandboxLimits) -> (String, u64) {
    let _guard = exclusive();
    let target = load(DefaultModel::SmolLm2);
    let host = plugin_host();
    let message = &fixtures()[0].user_message;
    let plain = generate(
        &target,
        message,
        MAX_TOKENS,
        SamplingParams::greedy(),
        8,
        &mut Cascade::empty(),
    );
    let (spec, logs) = capture_warnings(|| {
        let specs = [wasm(stem), SourceSpec::Builtin("lookup".into())];
        let mut cascade = cascade_with_limits(&host, &specs, limits);
        generate(
            &target,
            message,
            MAX_TOKENS,
            SamplingParams::greedy(),
            8,
            &mut cascade,
        )
    });
    assert_eq!(
        spec.tokens,
        plain.tokens,
        "{stem}: output differs from plain decoding at token {:?}",
        first_difference(&spec.tokens, &plain.tokens)
    );
    let faults = spec.stats.sources[0].faults;
    (logs, faults)
}

/// Asserts the plugin was reported by name with each of `needles`, and quarantined.
fn assert_reported(stem: &str, needles: &[&str]) {
    assert_reported_with(stem, &SandboxLimits::default(), needles);
}

/// Like [`assert_reported`], under `limits`.
fn assert_reported_with(stem: &str, limits: &SandboxLimits, needles: &[&str]) {
    let (logs, faults) = run_hostile_with(stem, limits);
    assert!(faults >= 1, "{stem}: no fault counted; logs:\n{logs}");
    let lower = logs.to_lowercase();
    assert!(
        logs.contains(stem),
        "{stem}: warnings do not name the plugin:\n{logs}"
    );
    for needle in needles {
        assert!(
            lower.contains(needle),
            "{stem}: `{needle}` not in warnings:\n{logs}"
        );
    }
    assert!(
        lower.contains("quarantin"),
        "{stem}: never quarantined:\n{logs}"
    );
}

#[test]
fn panicking_plugin_is_restarted_then_quarantined() {
    assert_reported("hostile_panic", &["panic"]);
}

#[test]
fn plugin_panicking_in_its_constructor_is_quarantined() {
    assert_reported("hostile_panic_open", &["panic"]);
}

#[test]
fn endless_loop_hits_the_deadline() {
    assert_reported("hostile_loop", &["deadline"]);
}

#[test]
fn unbounded_allocation_hits_the_memory_limit() {
    // A generous deadline, so the memory cap (not the clock) is what stops the plugin.
    let limits = SandboxLimits {
        memory_limit: 32 << 20,
        call_deadline: std::time::Duration::from_secs(10),
        ..SandboxLimits::default()
    };
    assert_reported_with("hostile_alloc", &limits, &["memory limit"]);
}

#[test]
fn unbounded_allocation_under_default_limits_is_stopped() {
    // Under the default 256 MiB / 50 ms, either limit may trip first; both contain it.
    let (logs, faults) = run_hostile("hostile_alloc");
    assert!(faults >= 1, "no fault counted; logs:\n{logs}");
    assert!(logs.contains("quarantined"), "never quarantined:\n{logs}");
}

#[test]
fn oversized_proposal_is_refused() {
    assert_reported("hostile_flood", &["10000"]);
}

#[test]
fn out_of_vocabulary_tokens_are_refused() {
    assert_reported("hostile_oov", &["vocab"]);
}

#[test]
fn garbage_confidence_is_refused() {
    assert_reported("hostile_badconf", &["confidence"]);
}

#[test]
fn tree_shapes_that_do_not_fit_are_refused() {
    assert_reported("hostile_badtree", &["tree of 2 paths, at most 1"]);
}

#[test]
fn slow_constructor_hits_the_deadline() {
    assert_reported("hostile_slow_open", &["deadline"]);
}

#[test]
fn file_env_and_network_access_are_denied() {
    let (logs, faults) = run_hostile("hostile_fileopen");
    assert_eq!(
        faults, 0,
        "the sandbox let something through; logs:\n{logs}"
    );
    assert!(
        logs.contains("hostile_fileopen"),
        "the plugin's own warning about the denied access is missing:\n{logs}"
    );
}

#[test]
fn sleeping_in_a_host_call_cannot_stall_generation() {
    let (logs, faults) = run_hostile("hostile_sleep");
    assert_eq!(
        faults, 0,
        "the sleep was not cut short, so it hit the deadline; logs:\n{logs}"
    );
}

/// Runs `lookup` under the hostile policy `stem` and plain decoding on the same prompt; returns
/// the warnings logged and the speculative run's stats.
fn run_hostile_policy(stem: &str) -> (String, spechost::engine::GenerationStats) {
    let _guard = exclusive();
    let target = load(DefaultModel::SmolLm2);
    let host = plugin_host();
    let message = &fixtures()[0].user_message;
    let plain = generate(
        &target,
        message,
        MAX_TOKENS,
        SamplingParams::greedy(),
        8,
        &mut Cascade::empty(),
    );
    let (spec, logs) = capture_warnings(|| {
        let policy = host
            .load_policy(&wasm(stem))
            .unwrap_or_else(|e| panic!("{e:#}; build the plugins with scripts/build-plugins.sh"));
        let mut cascade = cascade(&host, &[SourceSpec::Builtin("lookup".into())])
            .with_policy(Box::new(policy.policy("")));
        generate(
            &target,
            message,
            MAX_TOKENS,
            SamplingParams::greedy(),
            8,
            &mut cascade,
        )
    });
    assert_eq!(
        spec.tokens,
        plain.tokens,
        "{stem}: output differs from plain decoding at token {:?}",
        first_difference(&spec.tokens, &plain.tokens)
    );
    (logs, spec.stats)
}

#[test]
fn panicking_policy_is_quarantined_and_speculation_turns_off() {
    let (logs, stats) = run_hostile_policy("hostile_policy_panic");
    assert!(
        logs.contains("hostile_policy_panic") && logs.contains("quarantined"),
        "no quarantine warning naming the policy:\n{logs}"
    );
    assert!(
        logs.contains("speculation is off"),
        "the warning does not say what happens next:\n{logs}"
    );
    // Each instance decides one round before it panics; a restarted instance starts afresh,
    // so the three instances before quarantine draft at most three rounds in all.
    assert!(
        (1..=3).contains(&stats.draft_rounds),
        "drafted in {} rounds; only the healthy first decision of each instance may draft",
        stats.draft_rounds
    );
}

#[test]
fn absurd_policy_decisions_are_bounded() {
    let (logs, stats) = run_hostile_policy("hostile_policy_absurd");
    assert!(
        !logs.contains("quarantined"),
        "absurd but valid decisions must not count as faults:\n{logs}"
    );
    assert!(
        stats.drafted <= 8 * stats.draft_rounds,
        "drafts exceeded --draft-max 8: {} tokens in {} rounds",
        stats.drafted,
        stats.draft_rounds
    );
    assert_eq!(
        stats.sources[0].faults, 0,
        "lookup faulted: shadow drafts were not capped"
    );
}

#[test]
fn million_token_proposal_is_refused() {
    assert_reported("hostile_flood_million", &["1000000"]);
}

#[test]
fn reading_the_clocks_in_a_tight_loop_hits_the_deadline() {
    assert_reported("hostile_clock", &["deadline"]);
}

/// The new hostile plugins at the source level, without a model: exact fault texts, and the
/// load error of a plugin built against another WIT version.
mod without_a_model {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use spechost::cascade::{
        DraftModel, DraftModelFactory, DraftSource, Drafted, DraftedToken, ModelFacts, Token,
    };
    use spechost::plugins::{DEFAULT_CALL_DEADLINE, DEFAULT_MAX_FAULTS, LoadError};

    use super::*;

    /// Draft length asked for in every round.
    const MAX_DRAFT_LEN: usize = 8;

    /// SmolLM2's vocabulary, without loading it.
    fn facts() -> ModelFacts {
        ModelFacts {
            vocab_size: 49_152,
            bos: Some(1),
            eos: Some(2),
            eog: vec![2],
            context_size: 4096,
        }
    }

    const PROMPT: [Token; 4] = [101, 102, 103, 104];

    #[test]
    fn million_token_proposal_is_a_fault_that_keeps_the_instance() {
        let plugin = plugin_host()
            .load(&wasm("hostile_flood_million"))
            .unwrap_or_else(|e| panic!("{e}"));
        let mut source = plugin.source("");
        source.begin(&facts(), &PROMPT).expect("opens");
        for round in 1..=DEFAULT_MAX_FAULTS {
            let fault = source
                .propose(MAX_DRAFT_LEN)
                .expect_err("a million tokens is refused");
            assert_eq!(
                fault.what, "proposed 1000000 tokens, at most 8 were asked for",
                "round {round}"
            );
        }
        assert!(
            source.is_quarantined(),
            "quarantined after {DEFAULT_MAX_FAULTS} faults"
        );
        assert_eq!(
            source.restarts(),
            0,
            "an invalid proposal is no trap: the instance keeps running"
        );
    }

    #[test]
    fn clock_reads_that_finish_within_the_deadline_are_no_fault() {
        // A deadline no loaded machine reaches, so the outcome does not depend on timing: what is
        // checked is that reading the clocks, however often, is not itself a fault.
        let limits = SandboxLimits {
            call_deadline: Duration::from_secs(30),
            ..SandboxLimits::default()
        };
        let plugin = plugin_host()
            .load(&wasm("hostile_clock"))
            .unwrap_or_else(|e| panic!("{e}"));
        let mut source = plugin.source_with_limits("reads=100000", limits);
        source.begin(&facts(), &PROMPT).expect("opens");
        for round in 0..3 {
            let proposal = source.propose(MAX_DRAFT_LEN);
            assert!(
                proposal.as_ref().is_ok_and(|p| p.tokens.is_empty()),
                "round {round}: {proposal:?}"
            );
            source.feed(&[105]).expect("feed");
        }
        assert_eq!(source.faults(), 0, "last fault: {:?}", source.last_fault());
    }

    #[test]
    fn plugin_built_against_an_older_wit_is_refused_naming_the_sdk_to_rebuild_with() {
        let err = plugin_host()
            .load(&wasm("hostile_old_wit"))
            .expect_err("a drafter-api@0.1.0 component is refused");
        assert!(
            matches!(err, LoadError::MissingExport { .. }),
            "got {err:?}"
        );
        let message = err.to_string();
        let version = spechost_sdk::WIT_VERSION;
        let (minor, _patch) = version.rsplit_once('.').expect("major.minor.patch");
        for needle in [
            "hostile_old_wit",
            &format!("spechost:drafter/drafter-api@{version}"),
            "spechost:drafter/drafter-api@0.1.0",
            &format!("rebuild it against spechost-sdk {minor}"),
        ] {
            assert!(message.contains(needle), "`{needle}` not in: {message}");
        }
    }

    /// A draft model that takes `delay` per `propose` and drafts `10, 11, ...` with
    /// probability 0.9. Past `tripwire` calls in all it panics, which ends a guest call the host
    /// failed to end (the panic crosses the guest and fails the test).
    struct SlowDraftModel {
        delay: Duration,
        calls: Arc<AtomicU32>,
        tripwire: u32,
    }

    impl DraftModelFactory for SlowDraftModel {
        fn open(&self) -> Result<Box<dyn DraftModel>, String> {
            Ok(Box::new(SlowDraftModel {
                delay: self.delay,
                calls: Arc::clone(&self.calls),
                tripwire: self.tripwire,
            }))
        }
    }

    impl DraftModel for SlowDraftModel {
        fn reset(&mut self) {}

        fn feed(&mut self, _tokens: &[Token]) {}

        fn propose(&mut self, settings: spechost::cascade::ProposalSettings) -> Drafted {
            let max_draft_len = settings.max_draft_len;
            std::thread::sleep(self.delay);
            let calls = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
            assert!(
                calls <= self.tripwire,
                "the host ran the draft model {calls} times, {:?} of native work, inside guest calls with a {DEFAULT_CALL_DEADLINE:?} deadline: work the host does on a plugin's behalf is unbounded",
                self.delay * calls
            );
            let tokens = (0..max_draft_len.min(64) as Token)
                .map(|i| DraftedToken {
                    token: 10 + i,
                    prob: 0.9,
                })
                .collect();
            Drafted {
                tokens,
                ..Drafted::default()
            }
        }
    }

    #[test]
    fn draft_model_time_is_credited_back_to_the_call_deadline() {
        // One bridge call outlasts the deadline three times over; the plugin's own code takes
        // microseconds. The deadline bounds the plugin, not the native model it asked to run.
        let host = plugin_host();
        host.attach_draft_model(
            Arc::new(SlowDraftModel {
                delay: 3 * DEFAULT_CALL_DEADLINE,
                calls: Arc::default(),
                tripwire: u32::MAX,
            }),
            None,
        );
        let plugin = host
            .load(&SourceSpec::Builtin("draft".into()))
            .unwrap_or_else(|e| panic!("{e}; build the plugins with scripts/build-plugins.sh"));
        let mut source = plugin.source("");
        source.begin(&facts(), &PROMPT).expect("opens");
        let proposal = source.propose(4).expect("no deadline fault");
        assert_eq!(proposal.tokens, [10, 11, 12, 13], "proposal: {proposal:?}");
        assert_eq!(source.faults(), 0, "last fault: {:?}", source.last_fault());
    }

    #[test]
    fn draft_model_work_inside_one_call_is_bounded() {
        // 1 ms per bridge call; the tripwire allows 20 deadlines' worth of native work (1 s) in
        // one guest call. A host that bounds it faults the plugin long before.
        let delay = Duration::from_millis(1);
        let tripwire = 20 * DEFAULT_CALL_DEADLINE.as_millis() as u32;
        let host = plugin_host();
        host.attach_draft_model(
            Arc::new(SlowDraftModel {
                delay,
                calls: Arc::default(),
                tripwire,
            }),
            None,
        );
        let plugin = host
            .load(&wasm("hostile_bridge_loop"))
            .unwrap_or_else(|e| panic!("{e}"));
        let mut source = plugin.source("");
        source.begin(&facts(), &PROMPT).expect("opens");
        let fault = source
            .propose(MAX_DRAFT_LEN)
            .expect_err("an endless loop of draft-model calls is a fault");
        assert!(
            fault.what.contains("propose"),
            "the fault names the call: {fault}"
        );
        assert_eq!(source.faults(), 1);
    }
}
