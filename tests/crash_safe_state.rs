//! Crash safety of persisted plugin state, through the real binary: `spechost suffix warm` is
//! killed with SIGKILL at many moments, several of them while it writes the cache file (as soon
//! as its temporary file appears). Every time, the cache file is afterwards the old version or
//! the new one, byte for byte, never a mix or a torn write; and the suffix drafter of
//! `spechost run --state-dir` loads either without a warning.
//!
//! The same for `spechost serve --state-dir`: a server saving its state on SIGTERM is killed
//! with SIGKILL, and the next server loads the old or the new version and drafts with it.
//!
//! The host writes state through a temporary file, fsync and rename (`plugins::state`). A
//! writer killed before its rename leaves its temporary file behind: harmless (never read), and
//! listed by this test so that it is visible; nothing removes them yet.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::server::{PATIENCE, Server, chat_body, chat_text, drafting_prompts, post, wait_for};
use serde_json::json;
use spechost::config::cache_dir;
use spechost::models::DefaultModel;

/// Times the writer is killed.
const KILLS: u32 = 10;
/// Texts in the corpus that makes the old version of the cache file.
const OLD_TEXTS: usize = 8;
/// Texts in the corpus warmed into it while being killed; with [`WORDS_PER_TEXT`] words each,
/// about 200 000 tokens, a file of about 1 MB: long enough to write that a kill can land inside
/// the write, small enough to load within one plugin call deadline.
const NEW_TEXTS: usize = 48;
/// Words per corpus text.
const WORDS_PER_TEXT: usize = 3000;
/// Warming only needs the responses stored, not a deep trie: depth 1 keeps each warm short. The
/// file does not depend on it (it holds responses), and `run` loads it at the default depth.
const WARM_CONFIG: &str = "max_depth=1";
/// What the suffix drafter logs when it refuses a cache file.
const IGNORED_WARNING: &str = "ignoring the saved response cache";
/// What the host logs when it cannot use a state file at all.
const UNUSABLE_WARNING: &str = "the plugin starts empty";
/// What it logs when it loads one.
const LOADED_NOTE: &str = "suffix: loaded";
/// Pause between looks for the writer's temporary file.
const POLL: Duration = Duration::from_micros(200);

/// A scratch directory for one test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("spechost-crash-safe-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Self(dir)
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn model() -> String {
    let path = DefaultModel::SmolLm2.path(&cache_dir());
    assert!(
        path.exists(),
        "{} is missing; fetch it with `spechost models fetch smollm2`",
        path.display()
    );
    path.display().to_string()
}

/// A corpus file of `texts` lines of pseudo-random English-like text, different per `seed`.
fn write_corpus(path: &Path, texts: usize, seed: u64) {
    const WORDS: [&str; 32] = [
        "the",
        "cache",
        "holds",
        "earlier",
        "responses",
        "and",
        "a",
        "drafter",
        "proposes",
        "what",
        "followed",
        "them",
        "before",
        "server",
        "request",
        "token",
        "model",
        "write",
        "file",
        "crash",
        "kill",
        "rename",
        "atomic",
        "version",
        "old",
        "new",
        "blob",
        "loads",
        "every",
        "time",
        "quickly",
        "never",
    ];
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = |bound: usize| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) as usize % bound
    };
    let mut corpus = String::new();
    for _ in 0..texts {
        let words: Vec<String> = (0..WORDS_PER_TEXT)
            .map(|_| match next(8) {
                0 => next(100_000).to_string(),
                _ => WORDS[next(WORDS.len())].to_owned(),
            })
            .collect();
        corpus.push_str(&serde_json::json!({ "response": words.join(" ") }).to_string());
        corpus.push('\n');
    }
    std::fs::write(path, corpus).expect("write corpus");
}

/// `spechost suffix warm` of `corpus` into `out`, started.
fn start_warm(corpus: &Path, out: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_spechost"))
        .args(["suffix", "warm", "--corpus"])
        .arg(corpus)
        .arg("--out")
        .arg(out)
        .args(["-m", &model(), "--plugin-config", WARM_CONFIG])
        .env("RUST_LOG", "spechost=warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spechost starts")
}

/// Runs `spechost suffix warm` to the end; fails with its stderr if it fails.
fn warm(corpus: &Path, out: &Path) {
    let output = start_warm(corpus, out)
        .wait_with_output()
        .expect("spechost finishes");
    assert!(
        output.status.success(),
        "warm failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The writer's temporary files in `dir`: `.<file name>.<pid>.<n>.tmp`.
fn temp_files(dir: &Path, file_name: &str) -> Vec<(PathBuf, u32)> {
    let prefix = format!(".{file_name}.");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?.to_owned();
            let rest = name.strip_prefix(&prefix)?.strip_suffix(".tmp")?;
            let pid = rest.split('.').next()?.parse().ok()?;
            Some((path, pid))
        })
        .collect()
}

/// How one kill went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Moment {
    /// Killed after a delay, wherever the writer was.
    AfterDelay,
    /// Killed as soon as its temporary file appeared: while writing, syncing or renaming.
    DuringWrite,
    /// It finished before the kill.
    Finished,
}

/// Kills `child` once its temporary file for `file_name` appears in `dir`, after `extra_polls`
/// more looks; or lets it finish if it gets there first.
fn kill_during_write(child: &mut Child, dir: &Path, file_name: &str, extra_polls: u32) -> Moment {
    let pid = child.id();
    let started = Instant::now();
    loop {
        assert!(
            started.elapsed() < PATIENCE,
            "{file_name} was never written in {}",
            dir.display()
        );
        if child.try_wait().expect("wait on spechost").is_some() {
            return Moment::Finished;
        }
        if temp_files(dir, file_name).iter().any(|(_, p)| *p == pid) {
            for _ in 0..extra_polls {
                std::thread::sleep(POLL);
            }
            child.kill().expect("SIGKILL");
            return Moment::DuringWrite;
        }
        std::thread::sleep(POLL);
    }
}

/// A greedy `spechost run` with the suffix drafter and `state_dir`; returns its stderr.
fn run_with_state(state_dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_spechost"))
        .args(["run", "-m", &model(), "-c", "suffix", "-n", "4"])
        .args(["--policy", "fixed,k=4", "--draft-max", "4"])
        .args(["-p", "Say something about caches."])
        .arg("--state-dir")
        .arg(state_dir)
        .env("RUST_LOG", "spechost=info")
        .stdin(Stdio::null())
        .output()
        .expect("spechost runs")
}

#[test]
fn killed_state_writer_leaves_the_old_or_the_new_file_never_a_corrupt_one() {
    let _guard = common::exclusive();
    let scratch = Scratch::new("kill");
    let old_corpus = scratch.join("old.jsonl");
    let new_corpus = scratch.join("new.jsonl");
    write_corpus(&old_corpus, OLD_TEXTS, 1);
    write_corpus(&new_corpus, NEW_TEXTS, 2);

    // The two versions the file may hold: warmed from the old corpus, then that extended by
    // the new one (warming is deterministic).
    let reference = scratch.join("reference.state");
    warm(&old_corpus, &reference);
    let old = std::fs::read(&reference).expect("old version written");
    let started = Instant::now();
    warm(&new_corpus, &reference);
    // Only used to spread the timed kills over a run, never asserted on.
    let full_run = started.elapsed();
    let new = std::fs::read(&reference).expect("new version written");
    assert!(
        new.len() > old.len(),
        "warming did not extend the cache: {} then {} bytes",
        old.len(),
        new.len()
    );

    let dir = scratch.join("state");
    std::fs::create_dir_all(&dir).expect("state dir");
    let file_name = "suffix.state";
    let file = dir.join(file_name);
    let mut moments = Vec::new();
    let mut killed_pids = Vec::new();
    for kill in 0..KILLS {
        std::fs::write(&file, &old).expect("reset to the old version");
        let mut child = start_warm(&new_corpus, &file);
        let moment = if kill % 2 == 0 {
            // Spread over the run: model load, tokenizing, warming, writing.
            let delay = full_run.mul_f64(f64::from(kill + 2) / f64::from(KILLS + 2));
            std::thread::sleep(delay);
            match child.kill() {
                Ok(()) => Moment::AfterDelay,
                Err(_) => Moment::Finished,
            }
        } else {
            kill_during_write(&mut child, &dir, file_name, kill / 2)
        };
        let status = child.wait().expect("spechost ends");
        let moment = if moment != Moment::Finished && status.success() {
            // The kill came after the process had already exited.
            Moment::Finished
        } else {
            moment
        };
        if moment != Moment::Finished {
            killed_pids.push(child.id());
        }
        moments.push(moment);

        let now = std::fs::read(&file).expect("the state file still exists");
        let version = if now == old {
            "old"
        } else if now == new {
            "new"
        } else {
            panic!(
                "kill {kill} ({moment:?}) left a state file of {} bytes that is neither the old ({} bytes) nor the new ({} bytes) version",
                now.len(),
                old.len(),
                new.len()
            );
        };
        if moment == Moment::Finished {
            assert_eq!(version, "new", "a finished warm left the old version");
        }
        eprintln!("kill {kill}: {moment:?}, file is the {version} version");
    }

    // One writer left alone: it replaces the file and leaves no temporary file.
    std::fs::write(&file, &old).expect("reset to the old version");
    let finished = start_warm(&new_corpus, &file);
    let finished_pid = finished.id();
    let output = finished.wait_with_output().expect("spechost finishes");
    assert!(
        output.status.success(),
        "warm failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        std::fs::read(&file).is_ok_and(|now| now == new),
        "a finished warm did not leave the new version"
    );
    assert!(
        !temp_files(&dir, file_name)
            .iter()
            .any(|(_, pid)| *pid == finished_pid),
        "a finished writer left its temporary file"
    );

    let leftovers = temp_files(&dir, file_name);
    for (path, pid) in &leftovers {
        assert!(
            killed_pids.contains(pid),
            "{} belongs to a writer that was not killed: finished writers must not leave temporary files",
            path.display()
        );
        let len = std::fs::metadata(path).map_or(0, |m| m.len() as usize);
        assert!(
            len <= new.len(),
            "{} holds {len} bytes, more than the file being written",
            path.display()
        );
    }
    let sizes: Vec<u64> = leftovers
        .iter()
        .map(|(path, _)| std::fs::metadata(path).map_or(0, |m| m.len()))
        .collect();
    eprintln!(
        "moments: {moments:?}; temporary files left by killed writers, in bytes: {sizes:?} (the file is {} bytes)",
        new.len()
    );

    // The drafter loads either version without a warning.
    for (version, bytes) in [("old", &old), ("new", &new)] {
        let state_dir = scratch.join(&format!("run-{version}"));
        std::fs::create_dir_all(&state_dir).expect("state dir");
        std::fs::write(state_dir.join(file_name), bytes).expect("write state");
        let output = run_with_state(&state_dir);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{version}: run failed: {stderr}");
        assert!(
            !stderr.contains(IGNORED_WARNING) && !stderr.contains(UNUSABLE_WARNING),
            "{version}: the state file was not loaded: {stderr}"
        );
        assert!(
            stderr.contains(LOADED_NOTE),
            "{version}: no sign that the cache was loaded: {stderr}"
        );
    }
}

/// Times the serve test kills a server that is saving its state.
const SERVE_KILLS: u32 = 6;
/// The suffix drafter's state file in a `--state-dir`.
const SUFFIX_STATE: &str = "suffix.state";

/// Sends SIGTERM (the server finishes, then saves its state), then SIGKILL: after `delay`, or,
/// without one, once its temporary state file appears in `dir`.
fn kill_while_saving(server: &mut Server, dir: &Path, delay: Option<Duration>) -> Moment {
    let pid = server.child.id();
    let sent = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    assert!(
        sent.is_ok_and(|status| status.success()),
        "kill -TERM {pid}"
    );
    let moment = match delay {
        Some(delay) => {
            std::thread::sleep(delay);
            let _ = server.child.kill();
            Moment::AfterDelay
        }
        None => kill_during_write(&mut server.child, dir, SUFFIX_STATE, 0),
    };
    let status = server.child.wait().expect("the server ends");
    if status.success() {
        Moment::Finished
    } else {
        moment
    }
}

/// Starts a server on `args` and checks that it loaded the saved suffix state and left no
/// temporary file of a killed writer.
fn start_with_saved_state(args: &[&str], dir: &Path) -> Server {
    let server = Server::start(args);
    wait_for(&server, "the saved state to be loaded", || {
        server.log().contains("loaded plugin state")
    });
    let leftovers = temp_files(dir, SUFFIX_STATE);
    assert!(
        leftovers.is_empty(),
        "temporary files of killed writers were not removed at start: {leftovers:?}"
    );
    server
}

/// Asks `server` for `prompt` with the suffix drafter and checks the output, then that the
/// drafter loaded the saved response cache without a warning.
fn check_suffix_answer(server: &Server, prompt: &str, plain: &str) {
    let answer = post(
        server,
        "/v1/chat/completions",
        &chat_body(prompt, 48, json!({"speculative": {"cascade": "suffix"}})),
    );
    assert_eq!(chat_text(&answer), plain, "suffix changed the output");
    wait_for(server, "the suffix drafter to load its cache", || {
        server.log().contains(LOADED_NOTE)
    });
    let log = server.log();
    assert!(
        !log.contains(IGNORED_WARNING) && !log.contains(UNUSABLE_WARNING),
        "the saved state was not used: {log}"
    );
}

#[test]
fn serve_state_killed_while_saving_is_the_old_or_the_new_version_never_corrupt() {
    let _guard = common::exclusive();
    let scratch = Scratch::new("serve-kill");
    let state_file = scratch.join(SUFFIX_STATE);
    let state_arg = scratch.0.to_str().expect("UTF-8 temp dir");
    let args = ["--cascade", "suffix", "--state-dir", state_arg];
    let prompts = drafting_prompts();

    let first = Server::start(&args);
    let plain: Vec<String> = prompts
        .iter()
        .map(|prompt| {
            chat_text(&post(
                &first,
                "/v1/chat/completions",
                &chat_body(prompt, 48, json!({"speculative": {"cascade": "none"}})),
            ))
        })
        .collect();
    let suffix_body = chat_body(
        &prompts[0],
        48,
        json!({"speculative": {"cascade": "suffix"}}),
    );
    assert_eq!(
        chat_text(&post(&first, "/v1/chat/completions", &suffix_body)),
        plain[0]
    );
    first.terminate();
    assert!(state_file.exists(), "no state saved on SIGTERM");

    let mut moments = Vec::new();
    for kill in 0..SERVE_KILLS {
        let before = std::fs::read(&state_file).expect("a state file");
        let mut server = start_with_saved_state(&args, &scratch.0);
        let prompt = kill as usize % prompts.len();
        check_suffix_answer(&server, &prompts[prompt], &plain[prompt]);
        // One more response in the cache, so that the shutdown writes a new version.
        let next = (prompt + 1) % prompts.len();
        let body = chat_body(
            &prompts[next],
            48,
            json!({"speculative": {"cascade": "suffix"}}),
        );
        assert_eq!(
            chat_text(&post(&server, "/v1/chat/completions", &body)),
            plain[next]
        );
        let delay = (kill % 2 == 0).then(|| Duration::from_millis(u64::from(kill) * 2));
        let moment = kill_while_saving(&mut server, &scratch.0, delay);
        let after = std::fs::read(&state_file).expect("the state file survives the kill");
        if moment == Moment::Finished {
            assert_ne!(after, before, "a finished shutdown left the old state");
        }
        eprintln!(
            "kill {kill}: {moment:?}, state file {} ({} bytes)",
            if after == before { "old" } else { "new" },
            after.len()
        );
        moments.push(moment);
    }
    assert!(
        moments.iter().any(|m| *m != Moment::Finished),
        "every server finished before its SIGKILL, so no kill was tested: {moments:?}"
    );

    let last = start_with_saved_state(&args, &scratch.0);
    check_suffix_answer(&last, &prompts[0], &plain[0]);
    last.terminate();
}
