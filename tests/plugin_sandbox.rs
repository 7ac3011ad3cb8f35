//! Drafter plugins in the sandbox, without a model: the built-in `lookup` drafts, hostile
//! plugins fault, are restarted and quarantined, and broken files give the right `LoadError`.
//!
//! The `.wasm` files come from `scripts/build-plugins.sh`: they are looked for in
//! `$SPECHOST_WASM_DIR`, else `<target>/wasm32-wasip2/release` next to this test binary.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::capture_warnings;

use spechost::cascade::{DraftSource, Feedback, ModelFacts, Proposal, SourceFault, Token};
use spechost::plugins::SourceSpec;
use spechost::plugins::{
    DEFAULT_CALL_DEADLINE, DEFAULT_MAX_FAULTS, LoadError, PluginHost, PluginHostConfig,
    PluginSource, SandboxLimits,
};

/// Vocabulary of the pretend target (SmolLM2's size).
const VOCAB_SIZE: u32 = 49_152;
/// Draft length asked for in every round.
const MAX_DRAFT_LEN: usize = 8;
/// Rounds a hostile plugin gets to reach quarantine; each one faults at least every third call.
const MAX_ROUNDS: usize = 30;
/// How long a call to a quarantined source may take: far below one deadline, since the guest
/// is not called.
const QUARANTINED_CALL_BUDGET: Duration = Duration::from_millis(5);
/// Slack over the call deadline for a timed-out call (tick granularity, restart, a busy CI box).
const DEADLINE_SLACK: Duration = Duration::from_millis(250);

fn facts() -> ModelFacts {
    ModelFacts {
        vocab_size: VOCAB_SIZE,
        bos: Some(1),
        eos: Some(2),
        eog: vec![2],
        context_size: 4096,
    }
}

/// Where the suite's `.wasm` files are.
fn wasm_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SPECHOST_WASM_DIR") {
        return PathBuf::from(dir);
    }
    // This binary is `<target>/release/deps/plugin_sandbox-<hash>`.
    let beside_exe = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.ancestors().nth(3).map(Path::to_path_buf))
        .map(|target| target.join("wasm32-wasip2").join("release"));
    let from_env = std::env::var_os("CARGO_TARGET_DIR")
        .map(|target| PathBuf::from(target).join("wasm32-wasip2").join("release"));
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/wasm32-wasip2/release");
    [beside_exe, from_env]
        .into_iter()
        .flatten()
        .find(|dir| dir.is_dir())
        .unwrap_or(workspace)
}

/// The path of `<stem>.wasm`, or a failure saying how to build it.
fn wasm(stem: &str) -> PathBuf {
    let path = wasm_dir().join(format!("{stem}.wasm"));
    assert!(
        path.is_file(),
        "{} is missing; run `scripts/build-plugins.sh` (or set SPECHOST_WASM_DIR to where the plugins are)",
        path.display()
    );
    path
}

/// A scratch directory for one test, removed when dropped.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "spechost-plugin-sandbox-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir is writable");
        Self(dir)
    }

    fn join(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A host with a compile cache shared by the runs of this suite, so hostile plugins are
/// compiled once per machine.
fn host() -> PluginHost {
    let cache_dir = std::env::temp_dir().join("spechost-plugin-sandbox-cache");
    PluginHost::new(PluginHostConfig {
        cache_dir: Some(cache_dir),
        plugin_dirs: vec![wasm_dir()],
        ..PluginHostConfig::default()
    })
    .expect("plugin host starts")
}

fn source(stem: &str, limits: SandboxLimits) -> PluginSource {
    let plugin = host()
        .load_file(&wasm(stem))
        .unwrap_or_else(|e| panic!("{stem} loads: {e}"));
    plugin.source_with_limits(String::new(), limits)
}

/// `1 2 3 4 5` three times, then `1 2 3`: an unambiguous continuation `4 5 1 2 ...`.
fn repetitive_prompt() -> Vec<Token> {
    let mut prompt: Vec<Token> = (0..3).flat_map(|_| [101, 102, 103, 104, 105]).collect();
    prompt.extend([101, 102, 103]);
    prompt
}

/// Drives `source` through begin and propose/feedback/feed rounds until it is quarantined,
/// collecting every fault. Fails if it never is.
fn run_until_quarantined(source: &mut PluginSource) -> Vec<SourceFault> {
    let mut faults = Vec::new();
    if let Err(fault) = source.begin(&facts(), &repetitive_prompt()) {
        faults.push(fault);
    }
    for round in 0..MAX_ROUNDS {
        if source.is_quarantined() {
            break;
        }
        match source.propose(MAX_DRAFT_LEN) {
            Err(fault) => faults.push(fault),
            Ok(proposal) => {
                let outcome = Feedback {
                    won: !proposal.tokens.is_empty(),
                    n_accepted: 0,
                    target_token: 104,
                };
                if let Err(fault) = source.feedback(outcome) {
                    faults.push(fault);
                }
            }
        }
        if let Err(fault) = source.feed(&[104 + (round % 2) as Token]) {
            faults.push(fault);
        }
    }
    assert!(
        source.is_quarantined(),
        "{} not quarantined after {MAX_ROUNDS} rounds; faults: {faults:?}",
        source.name()
    );
    faults
}

/// The common checks on a hostile plugin: exactly `max_faults` faults, each naming the plugin
/// and saying `what`, then quarantine, after which calls are quick no-ops.
fn assert_faults_then_quarantine(source: &mut PluginSource, what: &str) -> Vec<SourceFault> {
    let faults = run_until_quarantined(source);
    let name = source.name().to_owned();
    assert_eq!(
        faults.len() as u32,
        DEFAULT_MAX_FAULTS,
        "{name}: expected exactly {DEFAULT_MAX_FAULTS} faults before quarantine, got {faults:#?}"
    );
    assert_eq!(source.faults(), DEFAULT_MAX_FAULTS, "{name}: fault counter");
    for fault in &faults {
        let text = fault.to_string();
        assert_eq!(fault.source, name, "fault names another source: {text}");
        assert!(
            text.contains(&format!("`{name}`")),
            "fault text does not name the plugin: {text}"
        );
        assert!(
            text.contains(what),
            "fault text does not say `{what}`: {text}"
        );
    }
    assert_eq!(source.last_fault(), faults.last(), "{name}: last fault");
    assert_quarantined_calls_are_quick(source);
    faults
}

/// A quarantined source answers without calling the guest.
fn assert_quarantined_calls_are_quick(source: &mut PluginSource) {
    let faults_before = source.faults();
    for _ in 0..3 {
        let started = Instant::now();
        let proposal = source.propose(MAX_DRAFT_LEN);
        let feed = source.feed(&[7]);
        let elapsed = started.elapsed();
        assert_eq!(
            proposal,
            Ok(Proposal::empty()),
            "{}: quarantined propose",
            source.name()
        );
        assert_eq!(feed, Ok(()), "{}: quarantined feed", source.name());
        assert!(
            elapsed < QUARANTINED_CALL_BUDGET,
            "{}: quarantined calls took {elapsed:?}",
            source.name()
        );
    }
    assert_eq!(
        source.begin(&facts(), &[1, 2, 3]),
        Ok(()),
        "quarantined begin"
    );
    assert_eq!(
        source.faults(),
        faults_before,
        "{}: faults after quarantine",
        source.name()
    );
}

#[test]
fn lookup_proposes_the_repeated_continuation() {
    let lookup = host()
        .load(&SourceSpec::Builtin("lookup".into()))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(lookup.name(), "lookup");
    let mut source = lookup.source("");
    source
        .begin(&facts(), &repetitive_prompt())
        .expect("lookup opens");
    let proposal = source.propose(4).expect("lookup proposes");
    assert_eq!(
        proposal.tokens,
        [104, 105, 101, 102],
        "proposal: {proposal:?}"
    );

    // Accept two tokens and the target's next one; the draft follows the new context.
    source
        .feedback(Feedback {
            won: true,
            n_accepted: 2,
            target_token: 101,
        })
        .expect("feedback");
    source.feed(&[104, 105, 101]).expect("feed");
    let proposal = source.propose(3).expect("lookup proposes again");
    assert_eq!(
        proposal.tokens,
        [102, 103, 104],
        "proposal after feed: {proposal:?}"
    );
    source.end();
    assert_eq!(
        source.faults(),
        0,
        "lookup faulted: {:?}",
        source.last_fault()
    );
}

#[test]
fn lookup_keeps_working_across_requests() {
    let plugin = host()
        .load(&SourceSpec::Builtin("lookup".into()))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut source = plugin.source("");
    for request in 0..3 {
        source.begin(&facts(), &repetitive_prompt()).expect("begin");
        let proposal = source.propose(2).expect("propose");
        assert_eq!(
            proposal.tokens,
            [104, 105],
            "request {request}: {proposal:?}"
        );
        source.end();
    }
    assert_eq!((source.faults(), source.restarts()), (0, 0));
}

#[test]
fn panicking_plugin_is_restarted_then_quarantined() {
    let mut source = source("hostile_panic", SandboxLimits::default());
    let faults = assert_faults_then_quarantine(&mut source, "trapped in propose");
    assert!(
        faults
            .iter()
            .all(|fault| fault.what.contains("panicked at")),
        "the guest's panic message should be in the fault: {faults:#?}"
    );
    assert_eq!(
        source.restarts(),
        DEFAULT_MAX_FAULTS - 1,
        "each trap but the last is followed by a restart"
    );
}

#[test]
fn restarted_instance_sees_the_whole_context() {
    let mut source = source("hostile_panic", SandboxLimits::default());
    source.begin(&facts(), &repetitive_prompt()).expect("begin");
    for call in 1..=2 {
        let proposal = source
            .propose(MAX_DRAFT_LEN)
            .expect("calls 1 and 2 succeed");
        assert_eq!(proposal.tokens, [103], "call {call}: {proposal:?}");
    }
    source.propose(MAX_DRAFT_LEN).expect_err("call 3 panics");
    assert_eq!(source.restarts(), 0, "the restart waits for the next call");

    // This feed restarts the instance, re-opens the session and replays prompt + token.
    source.feed(&[777]).expect("restart and replay");
    assert_eq!(source.restarts(), 1);
    let proposal = source
        .propose(MAX_DRAFT_LEN)
        .expect("the new instance proposes");
    assert_eq!(
        proposal.tokens,
        [777],
        "the replayed context must end with the fed token"
    );
    assert_eq!(source.faults(), 1);
    assert!(!source.is_quarantined());
}

#[test]
fn rejected_config_is_a_fault_naming_the_setting() {
    let plugin = host()
        .load(&SourceSpec::Builtin("lookup".into()))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut source = plugin.source("max_ngram=99");
    let fault = source
        .begin(&facts(), &repetitive_prompt())
        .expect_err("lookup rejects max_ngram=99");
    assert!(
        fault.what.contains("rejected its configuration") && fault.what.contains("max_ngram"),
        "fault: {fault}"
    );
    // The rest of the request goes on without the plugin, and without more faults.
    assert_eq!(source.propose(MAX_DRAFT_LEN), Ok(Proposal::empty()));
    assert_eq!(source.feed(&[104]), Ok(()));
    source.end();
    assert_eq!((source.faults(), source.restarts()), (1, 0));
}

#[test]
fn plugin_panicking_in_open_is_quarantined() {
    let mut source = source("hostile_panic_open", SandboxLimits::default());
    assert_faults_then_quarantine(&mut source, "trapped in open");
}

#[test]
fn endless_loop_hits_the_call_deadline() {
    let mut timed = source("hostile_loop", SandboxLimits::default());
    timed
        .begin(&facts(), &repetitive_prompt())
        .expect("hostile_loop opens");
    let started = Instant::now();
    let fault = timed
        .propose(MAX_DRAFT_LEN)
        .expect_err("the loop times out");
    let elapsed = started.elapsed();
    assert!(
        elapsed >= DEFAULT_CALL_DEADLINE && elapsed < DEFAULT_CALL_DEADLINE + DEADLINE_SLACK,
        "interrupted after {elapsed:?}, deadline is {DEFAULT_CALL_DEADLINE:?}"
    );
    assert!(
        fault
            .what
            .contains("exceeded its 50 ms deadline in propose"),
        "fault: {fault}"
    );

    let mut source = source("hostile_loop", SandboxLimits::default());
    assert_faults_then_quarantine(&mut source, "exceeded its 50 ms deadline in propose");
}

#[test]
fn slow_open_hits_the_call_deadline() {
    let mut source = source("hostile_slow_open", SandboxLimits::default());
    assert_faults_then_quarantine(&mut source, "exceeded its 50 ms deadline in open");
}

#[test]
fn unbounded_allocation_hits_the_memory_limit() {
    // A small cap and a long deadline, so the cap is what stops the plugin even on a loaded
    // machine (writing 256 MiB can take longer than 50 ms; either way it would be a fault).
    let limits = SandboxLimits {
        memory_limit: 16 << 20,
        call_deadline: Duration::from_secs(2),
        ..SandboxLimits::default()
    };
    let mut source = source("hostile_alloc", limits);
    assert_faults_then_quarantine(&mut source, "exceeded its 16 MiB memory limit in propose");
}

#[test]
fn oversized_proposal_is_a_fault_without_restart() {
    let mut source = source("hostile_flood", SandboxLimits::default());
    assert_faults_then_quarantine(
        &mut source,
        "proposed 10000 tokens, at most 8 were asked for",
    );
    assert_eq!(
        source.restarts(),
        0,
        "an invalid proposal leaves the instance running"
    );
}

#[test]
fn out_of_vocabulary_tokens_are_a_fault() {
    let mut source = source("hostile_oov", SandboxLimits::default());
    assert_faults_then_quarantine(&mut source, "vocabulary has 49152 tokens");
    assert_eq!(
        source.restarts(),
        0,
        "an invalid proposal leaves the instance running"
    );
}

#[test]
fn confidence_outside_unit_interval_is_a_fault() {
    let mut source = source("hostile_badconf", SandboxLimits::default());
    let faults = assert_faults_then_quarantine(&mut source, "must be in [0,1]");
    assert!(
        faults[0].what.contains("gave confidence"),
        "first fault: {}",
        faults[0]
    );
}

#[test]
fn sandbox_denies_files_environment_and_network() {
    let mut source = source("hostile_fileopen", SandboxLimits::default());
    source
        .begin(&facts(), &repetitive_prompt())
        .expect("hostile_fileopen opens");
    for round in 0..5 {
        let proposal = source.propose(MAX_DRAFT_LEN);
        assert!(proposal.is_ok(), "round {round}: {proposal:?}");
        source.feed(&[104]).expect("feed");
    }
    source.end();
    assert_eq!(
        source.faults(),
        0,
        "the plugin reached a file, variable or socket: {:?}",
        source.last_fault()
    );
}

#[test]
fn plugin_log_lines_name_the_plugin() {
    let mut source = source("hostile_fileopen", SandboxLimits::default());
    let ((), text) = capture_warnings(|| {
        source
            .begin(&facts(), &repetitive_prompt())
            .expect("hostile_fileopen opens");
        source
            .propose(MAX_DRAFT_LEN)
            .expect("hostile_fileopen proposes");
    });
    let line = text
        .lines()
        .find(|line| line.contains("sandbox denied, in propose"))
        .unwrap_or_else(|| panic!("the plugin's log line is missing; log:\n{text}"));
    assert!(
        line.contains("plugin=\"hostile_fileopen\"") || line.contains("plugin=hostile_fileopen"),
        "line: {line}"
    );
}

#[test]
fn quarantine_is_announced_once_naming_plugin_and_last_fault() {
    let mut source = source("hostile_flood", SandboxLimits::default());
    let ((), text) = capture_warnings(|| {
        run_until_quarantined(&mut source);
        assert_quarantined_calls_are_quick(&mut source);
    });
    let quarantine_lines: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("quarantined"))
        .collect();
    assert_eq!(quarantine_lines.len(), 1, "log:\n{text}");
    let line = quarantine_lines[0];
    assert!(
        line.contains("hostile_flood")
            && line.contains("3 faults")
            && line.contains("proposed 10000 tokens"),
        "quarantine line: {line}"
    );
    let fault_lines = text
        .lines()
        .filter(|line| line.contains("draft source `hostile_flood` proposed"))
        .count();
    assert_eq!(fault_lines, 3, "one warning per fault; log:\n{text}");
}

#[test]
fn core_module_is_not_a_component() {
    let dir = ScratchDir::new("core");
    let path = dir.join("core_module.wasm");
    std::fs::write(&path, b"\0asm\x01\0\0\0").expect("write");
    let err = host()
        .load_file(&path)
        .expect_err("a core module is refused");
    assert!(
        matches!(err, LoadError::NotAComponent { .. }),
        "got {err:?}"
    );
    assert!(err.to_string().contains("wasm32-wasip2"), "message: {err}");
}

#[test]
fn truncated_component_is_invalid() {
    let bytes = std::fs::read(wasm("lookup")).expect("lookup.wasm reads");
    let dir = ScratchDir::new("truncated");
    let path = dir.join("truncated.wasm");
    std::fs::write(&path, &bytes[..bytes.len() / 2]).expect("write");
    let err = host()
        .load_file(&path)
        .expect_err("half a component is refused");
    assert!(
        matches!(err, LoadError::InvalidComponent { .. }),
        "got {err:?}"
    );
    assert!(err.to_string().contains("truncated"), "message: {err}");
}

#[test]
fn missing_file_and_unknown_builtin_say_what_to_do() {
    let err = host()
        .load(&SourceSpec::Path("/nonexistent/drafter.wasm".into()))
        .expect_err("no such file");
    assert!(matches!(err, LoadError::NotFound { .. }), "got {err:?}");
    assert!(
        err.to_string().contains("/nonexistent/drafter.wasm"),
        "message: {err}"
    );

    let err = host()
        .load(&SourceSpec::Builtin("nope".into()))
        .expect_err("no such built-in");
    assert!(
        matches!(err, LoadError::UnknownBuiltin { .. }),
        "got {err:?}"
    );
    assert!(
        err.to_string().contains("lookup") && err.to_string().contains(".wasm"),
        "message: {err}"
    );
}

#[test]
fn corrupt_cache_entry_is_recompiled_and_overwritten() {
    let cache_dir = ScratchDir::new("cache");
    let host = PluginHost::new(PluginHostConfig {
        cache_dir: Some(cache_dir.0.clone()),
        ..PluginHostConfig::default()
    })
    .expect("host");
    host.load_file(&wasm("lookup"))
        .expect("first load compiles and caches");
    let entries: Vec<PathBuf> = std::fs::read_dir(cache_dir.join("components"))
        .expect("cache dir exists")
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .collect();
    assert_eq!(entries.len(), 1, "cache entries: {entries:?}");
    let entry = &entries[0];
    assert!(
        entry.extension().is_some_and(|ext| ext == "cwasm"),
        "entry: {}",
        entry.display()
    );

    std::fs::write(entry, b"garbage").expect("corrupt the entry");
    let plugin = host
        .load_file(&wasm("lookup"))
        .expect("corrupt entry is recompiled");
    let rewritten = std::fs::read(entry).expect("entry exists");
    assert_ne!(rewritten, b"garbage", "entry was not overwritten");

    let mut source = plugin.source("");
    source.begin(&facts(), &repetitive_prompt()).expect("begin");
    assert_eq!(source.propose(2).expect("propose").tokens, [104, 105]);
}
