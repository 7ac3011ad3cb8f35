//! Shared by the integration tests: default models, fixture prompts, cascades of plugins.

#![allow(dead_code)] // each test binary uses a different part of this module

pub mod server;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};

use spechost::cascade::{Cascade, CascadeSettings, DraftSource};
use spechost::config::cache_dir;
use spechost::engine::{
    Outcome, Request, SamplingParams, Session, SessionParams, Target, TargetParams,
};
use spechost::models::DefaultModel;
use spechost::plugins::SourceSpec;
use spechost::plugins::{PluginHost, PluginHostConfig, SandboxLimits};

/// Model tests run one at a time: two llama.cpp thread pools on two cores would only slow
/// each other down.
static MODEL_LOCK: Mutex<()> = Mutex::new(());

/// Takes the model lock (ignoring poisoning by a failed test).
pub fn exclusive() -> MutexGuard<'static, ()> {
    MODEL_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Loads a default model, or fails saying how to fetch it.
pub fn load(model: DefaultModel) -> Target {
    let path = model.path(&cache_dir());
    assert!(
        path.exists(),
        "{} is missing at {}; fetch it with `spechost models fetch {}` (scripts/test.sh does)",
        model.alias(),
        path.display(),
        model.alias()
    );
    Target::load(&path, &TargetParams::default()).expect("default model loads")
}

/// Session settings for tests: a context large enough for every fixture prompt.
pub fn session_params() -> SessionParams {
    SessionParams {
        ctx_size: 2048,
        ..SessionParams::default()
    }
}

/// A fixture prompt: one request from `tests/fixtures/prompts.jsonl`.
pub struct Fixture {
    pub id: String,
    pub user_message: String,
}

/// The fixture prompts (taken from `../shared/workloads/`: edit, summarize, extract, code).
pub fn fixtures() -> Vec<Fixture> {
    let text = include_str!("../fixtures/prompts.jsonl");
    text.lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).expect("fixture is JSON");
            Fixture {
                id: value["id"].as_str().expect("id").to_owned(),
                user_message: value["messages"][0]["content"]
                    .as_str()
                    .expect("content")
                    .to_owned(),
            }
        })
        .collect()
}

/// A plugin host that finds the plugins built by `scripts/build-plugins.sh`.
pub fn plugin_host() -> PluginHost {
    PluginHost::new(PluginHostConfig {
        cache_dir: Some(cache_dir()),
        ..PluginHostConfig::default()
    })
    .expect("plugin host starts")
}

/// A cascade of the given sources (built-in names or .wasm paths), each with an empty config
/// and the host's default sandbox limits.
pub fn cascade(host: &PluginHost, specs: &[SourceSpec]) -> Cascade {
    cascade_with_limits(host, specs, &SandboxLimits::default())
}

/// Like [`cascade`], with the given cascade settings.
pub fn cascade_with_settings(
    host: &PluginHost,
    specs: &[SourceSpec],
    settings: CascadeSettings,
) -> Cascade {
    Cascade::new(sources(host, specs, &SandboxLimits::default()), settings)
}

/// Like [`cascade`], with the given sandbox limits for every source.
pub fn cascade_with_limits(
    host: &PluginHost,
    specs: &[SourceSpec],
    limits: &SandboxLimits,
) -> Cascade {
    Cascade::new(sources(host, specs, limits), CascadeSettings::default())
}

/// The sources of `specs`, each with an empty config and `limits`.
fn sources(
    host: &PluginHost,
    specs: &[SourceSpec],
    limits: &SandboxLimits,
) -> Vec<Box<dyn DraftSource>> {
    specs
        .iter()
        .map(|spec| {
            let plugin = host.load(spec).unwrap_or_else(|e| {
                panic!("{e:#}; build the plugins with scripts/build-plugins.sh")
            });
            Box::new(plugin.source_with_limits(String::new(), limits.clone()))
                as Box<dyn DraftSource>
        })
        .collect()
}

/// Where the wasm components of the workspace are built: `<target>/wasm32-wasip2/release`,
/// found from this test binary's path (`<target>/release/deps/<test>`).
pub fn wasm_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("test binary inside <target>/release/deps");
    target.join("wasm32-wasip2").join("release")
}

/// A `.wasm` built by the suite (a hostile plugin or an example), by file stem.
pub fn wasm(stem: &str) -> SourceSpec {
    let path = wasm_dir().join(format!("{stem}.wasm"));
    assert!(
        path.exists(),
        "{} is missing; build it with scripts/build-plugins.sh",
        path.display()
    );
    SourceSpec::Path(path)
}

/// Generates a completion of `user_message` with `cascade`.
pub fn generate(
    target: &Target,
    user_message: &str,
    max_tokens: usize,
    sampling: SamplingParams,
    max_draft_len: usize,
    cascade: &mut Cascade,
) -> Outcome {
    let mut session = target.session(&session_params()).expect("session");
    generate_in(
        target,
        &mut session,
        user_message,
        max_tokens,
        sampling,
        max_draft_len,
        cascade,
    )
}

/// [`generate`] in an existing session of `target`.
pub fn generate_in(
    target: &Target,
    session: &mut Session<'_>,
    user_message: &str,
    max_tokens: usize,
    sampling: SamplingParams,
    max_draft_len: usize,
    cascade: &mut Cascade,
) -> Outcome {
    let prompt = target.tokenize_chat(user_message).expect("chat template");
    let mut request = Request::new(prompt, max_tokens, sampling);
    request.max_draft_len = max_draft_len;
    session
        .generate(&request, cascade, &mut |_| {})
        .expect("generation succeeds")
}

/// Index of the first differing token, for assertion messages.
pub fn first_difference(a: &[u32], b: &[u32]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or_else(|| (a.len() != b.len()).then(|| a.len().min(b.len())))
}

/// Runs the `spechost` binary with `args` and no stdin.
pub fn spechost(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_spechost"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("spechost runs")
}

/// Asserts a clean failure whose `error:` line contains every one of `needles`.
pub fn assert_fails_with(output: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "expected failure, stderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "panicked: {stderr}");
    let error = stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no `error:` line in: {stderr}"));
    for needle in needles {
        assert!(error.contains(needle), "`{needle}` not in: {error}");
    }
}

/// The path of SmolLM2-135M, which must have been fetched.
pub fn smollm2_path() -> PathBuf {
    fetched_path(DefaultModel::SmolLm2)
}

/// The path of Gemma-3-270M (pretrained), which must have been fetched.
#[allow(dead_code)] // Not every test binary uses every helper.
pub fn gemma3_path() -> PathBuf {
    fetched_path(DefaultModel::Gemma3)
}

/// The cached path of `model`, which must have been fetched.
fn fetched_path(model: DefaultModel) -> PathBuf {
    let path = model.path(&cache_dir());
    assert!(
        path.exists(),
        "{} is missing at {}; fetch it with `spechost models fetch {}`",
        model.file_name(),
        path.display(),
        model.alias()
    );
    path
}

/// `name` in a scratch directory of this test binary (`group` tells binaries apart).
pub fn scratch_file(group: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("spechost-{group}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir.join(name)
}

/// `path` as a command-line argument.
pub fn arg(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// Whether this CPU has AMX (Intel Sapphire Rapids and later): llama.cpp then keeps Q4_0,
/// Q4_1, Q8_0 and K-quant weights in its AMX buffers and computes their products itself, so the
/// host's batched kernel gets only the products of weights outside them (Gemma 3's tied output
/// layer, Q5_0 layers).
pub fn amx() -> bool {
    std::fs::read_to_string("/proc/cpuinfo")
        .is_ok_and(|info| info.split_whitespace().any(|flag| flag == "amx_int8"))
}

/// Whether the CPU has the instructions of the host's AVX-512 VNNI kernel (`quant_matmul`): it
/// computes the Q8_0, Q5_0 and Q4_0 products of batches and of single rows.
pub fn avx512_vnni() -> bool {
    cfg!(target_arch = "x86_64")
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// Whether the CPU has the instructions of the host's AVX2 kernel (AVX2, FMA, F16C): it computes
/// the Q4_1, Q8_0 and Q4_0 products of batches.
pub fn avx2() -> bool {
    cfg!(target_arch = "x86_64")
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// A model of `kind` written by scripts/make-test-model.py (with `args`) as `file` in a scratch
/// directory, once per test process (the tests of a binary share it).
pub fn generated_model(kind: &str, args: &[&str], file: &str) -> PathBuf {
    static WRITING: Mutex<()> = Mutex::new(());
    let _writing = WRITING.lock().unwrap_or_else(|e| e.into_inner());
    let python = std::env::var("SPECHOST_GGUF_PYTHON").unwrap_or_else(|_| {
        panic!("SPECHOST_GGUF_PYTHON is not set: run the tests with scripts/test.sh, or `source scripts/env.sh && install_gguf_writer` first")
    });
    let out = scratch_file("generated", file);
    if out.exists() {
        return out;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/make-test-model.py");
    let tokenizer = DefaultModel::SmolLm2.path(&cache_dir());
    let status = Command::new(python)
        .arg(script)
        .args([kind, arg(&tokenizer), arg(&out)])
        .args(args)
        .status()
        .expect("python runs");
    assert!(status.success(), "make-test-model.py {kind} failed");
    out
}

/// A `tracing` writer that keeps everything in memory, so a test can read the warnings.
#[derive(Clone, Default)]
pub struct CapturedLog(Arc<Mutex<Vec<u8>>>);

impl CapturedLog {
    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }
}

impl Write for CapturedLog {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs `f` with this thread's `tracing` warnings captured; returns its result and the log.
///
/// `tracing` caches each callsite's interest for the whole process. While a single dispatcher
/// is registered, a callsite first reached on another test's thread (which has no subscriber)
/// is cached as never enabled, and this thread's events from it are dropped. A second
/// dispatcher, registered for as long as the capture runs, makes every callsite registration
/// ask all registered dispatchers instead.
pub fn capture_warnings<T>(f: impl FnOnce() -> T) -> (T, String) {
    let warnings_to = |writer: CapturedLog| {
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish()
    };
    let log = CapturedLog::default();
    let _anchor = tracing::Dispatch::new(warnings_to(CapturedLog::default()));
    let result = tracing::subscriber::with_default(warnings_to(log.clone()), f);
    (result, log.text())
}
