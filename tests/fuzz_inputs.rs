//! Property tests ("fuzzing" that fits a normal test run) of every parser that reads input a
//! user or another program wrote: `--cascade`, `--policy`, the TOML config file, workload files,
//! `suffix warm` corpora, and plugin files handed to the loader.
//!
//! Each parser, on any input: returns, never panics, and when it refuses, says so in a message
//! that names what it refused. On valid input built by the test, what it parses is what was
//! written (a round trip). Cases per property: proptest's default 256, or `PROPTEST_CASES`; the
//! plugin loader, which compiles, runs fewer. A failing case is shrunk and saved by proptest in
//! `tests/fuzz_inputs.proptest-regressions`; commit that file, and the case is replayed first on
//! every later run.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use spechost::bench::{ChatMessage, Completion, Workload, WorkloadError};
use spechost::cascade::{DraftSource as _, ModelFacts};
use spechost::config::{ConfigError, RunArgs, RunConfig};
use spechost::plugins::{LoadError, PluginHost, PluginHostConfig};
use spechost::plugins::{SourceSpec, SpecError, parse_cascade, parse_policy};
use spechost::warm::read_corpus;

/// Proptest's settings for every property here: the default cases (or `PROPTEST_CASES`), with
/// failures saved beside this file.
fn config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fuzz_inputs.proptest-regressions"
        )))),
        ..ProptestConfig::default()
    }
}

/// A scratch directory for this process's generated files, removed at exit of each test.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "spechost-fuzz-inputs-{}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir is writable");
        Self(dir)
    }

    /// Writes `bytes` to a fresh file named `<stem>-<n>.<extension>` and returns its path.
    fn file(&self, stem: &str, extension: &str, bytes: &[u8]) -> PathBuf {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = self.0.join(format!("{stem}-{n}.{extension}"));
        std::fs::write(&path, bytes).expect("write scratch file");
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Text that looks like what these parsers see: separators, quotes, brackets, whitespace and
/// the words they look for, mixed with arbitrary Unicode.
fn input_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => "[a-z0-9_]{1,6}",
        2 => prop::sample::select(vec![
            ",", "=", "/", ".wasm", "none", " ", "\t", "\n", "\r\n", "\"", "'", "[", "]", "{", "}",
            ":", "#", "\\", "[run]", "[plugins.x]", "\u{0}", "é", "🦀",
        ])
        .prop_map(str::to_owned),
        1 => any::<String>(),
    ];
    prop::collection::vec(piece, 0..24).prop_map(|pieces| pieces.concat())
}

/// A built-in-style name: what a cascade or policy entry names when it is not a path.
fn builtin_name() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9_-]{0,10}".prop_filter("`none` means no cascade", |name| name != "none")
}

/// Spaces and tabs, as users put around separators.
fn blank() -> impl Strategy<Value = String> {
    "[ \t]{0,2}"
}

// ---------------------------------------------------------------------------------------------
// --cascade

proptest! {
    #![proptest_config(config())]

    #[test]
    fn cascade_parser_refuses_cleanly_or_returns_unique_sources(spec in input_text()) {
        match parse_cascade(&spec) {
            Ok(sources) => {
                let names: Vec<String> = sources.iter().map(SourceSpec::name).collect();
                let mut unique = names.clone();
                unique.sort();
                unique.dedup();
                prop_assert_eq!(unique.len(), names.len(), "duplicate names in {:?}", names);
                prop_assert_eq!(sources.is_empty(), spec.trim() == "none");
                for source in &sources {
                    if let SourceSpec::Builtin(name) = source {
                        prop_assert!(
                            !name.is_empty() && !name.contains(',') && name.trim() == name,
                            "built-in name {:?} from {:?}", name, spec
                        );
                    }
                }
            }
            Err(error) => {
                prop_assert!(matches!(error, SpecError::Cascade { .. }), "{:?}", error);
                let message = error.to_string();
                prop_assert!(message.starts_with("invalid --cascade `"), "{}", message);
            }
        }
    }

    #[test]
    fn cascade_of_distinct_names_and_paths_round_trips(
        entries in prop::collection::vec(
            (builtin_name(), any::<bool>(), blank(), blank()),
            1..6,
        )
    ) {
        let mut expected = Vec::new();
        let mut written = Vec::new();
        for (name, as_path, before, after) in &entries {
            if expected.iter().any(|s: &SourceSpec| s.name() == *name) {
                continue;
            }
            let (source, text) = if *as_path {
                let path = format!("./plugins/{name}.wasm");
                (SourceSpec::Path(PathBuf::from(&path)), path)
            } else {
                (SourceSpec::Builtin(name.clone()), name.clone())
            };
            expected.push(source);
            written.push(format!("{before}{text}{after}"));
        }
        let spec = written.join(",");
        prop_assert_eq!(parse_cascade(&spec).map_err(|e| e.to_string()), Ok(expected));
    }
}

// ---------------------------------------------------------------------------------------------
// --policy

proptest! {
    #![proptest_config(config())]

    #[test]
    fn policy_parser_refuses_cleanly_or_returns_key_value_settings(spec in input_text()) {
        match parse_policy(&spec) {
            Ok(policy) => {
                prop_assert!(!policy.name().is_empty(), "empty name from {:?}", spec);
                if !policy.config.is_empty() {
                    for setting in policy.config.split(',') {
                        let key = setting.split_once('=').map(|(key, _)| key.trim());
                        prop_assert!(
                            key.is_some_and(|key| !key.is_empty()),
                            "setting {:?} of {:?}", setting, spec
                        );
                    }
                }
            }
            Err(error) => {
                prop_assert!(matches!(error, SpecError::Policy { .. }), "{:?}", error);
                let message = error.to_string();
                prop_assert!(message.starts_with("invalid --policy `"), "{}", message);
            }
        }
    }

    #[test]
    fn policy_name_and_settings_round_trip(
        name in builtin_name(),
        settings in prop::collection::vec(("[a-z_]{1,8}", "[a-z0-9.=-]{0,8}", blank()), 0..5),
    ) {
        let written: Vec<String> = settings
            .iter()
            .map(|(key, value, pad)| format!("{pad}{key}={value}{pad}"))
            .collect();
        let spec = std::iter::once(name.clone()).chain(written).collect::<Vec<_>>().join(",");
        let policy = parse_policy(&spec).map_err(|e| e.to_string());
        let expected_config = settings
            .iter()
            .map(|(key, value, _)| format!("{key}={value}"))
            .collect::<Vec<_>>()
            .join(",");
        prop_assert_eq!(
            policy.map(|p| (p.plugin, p.config)),
            Ok((SourceSpec::Builtin(name), expected_config))
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The TOML config file (`spechost run --config`)

/// `run --config <file with text> -p hi`, validated.
fn run_config(scratch: &Scratch, text: &str) -> Result<RunConfig, ConfigError> {
    let path = scratch.file("config", "toml", text.as_bytes());
    let args = RunArgs {
        config: Some(path),
        prompt: Some("hi".into()),
        ..RunArgs::default()
    };
    args.into_config(Path::new("/nonexistent-cache"))
}

/// A float as TOML writes it (`nan` and `inf` are lowercase there).
fn toml_float(value: f64) -> String {
    if value.is_nan() {
        "nan".into()
    } else if value.is_infinite() {
        if value > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        format!("{value:?}")
    }
}

/// A TOML basic string holding `text`, however odd.
fn toml_string(text: &str) -> String {
    toml::Value::String(text.to_owned()).to_string()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn config_file_of_any_text_is_refused_cleanly_or_accepted(text in input_text()) {
        let scratch = Scratch::new("toml-any");
        if let Err(error) = run_config(&scratch, &text) {
            prop_assert!(!error.to_string().is_empty());
        }
    }

    #[test]
    fn config_file_numbers_are_taken_or_refused_naming_the_setting(
        max_tokens in prop_oneof![Just(0i64), 1i64..100_000, any::<i64>()],
        ctx_size in prop_oneof![0i64..64, 16i64..1_000_000, any::<i64>()],
        temp in prop_oneof![
            Just(f64::NAN), Just(f64::INFINITY), Just(-0.0), -2.0f64..2.0, any::<f64>()
        ],
    ) {
        let scratch = Scratch::new("toml-numbers");
        let text = format!(
            "[run]\nmax_tokens = {max_tokens}\nctx_size = {ctx_size}\ntemp = {}\n",
            toml_float(temp)
        );
        // What `into_config` must say: a type error names a setting whose value does not fit
        // (when several do not, any of them: the file is read in key order), then the checks
        // run in order: --max-tokens, --ctx-size, --temp.
        let temp32 = temp as f32;
        let mut misfits = Vec::new();
        if usize::try_from(max_tokens).is_err() {
            misfits.push("max_tokens");
        }
        if u32::try_from(ctx_size).is_err() {
            misfits.push("ctx_size");
        }
        let expected_error = if !misfits.is_empty() {
            Some(misfits)
        } else if max_tokens == 0 {
            Some(vec!["--max-tokens must be at least 1"])
        } else if ctx_size < 16 {
            Some(vec!["--ctx-size"])
        } else if !(temp32.is_finite() && temp32 >= 0.0) {
            Some(vec!["--temp"])
        } else {
            None
        };
        match (run_config(&scratch, &text), expected_error) {
            (Ok(config), None) => {
                prop_assert_eq!(config.max_tokens as i64, max_tokens);
                prop_assert_eq!(i64::from(config.session.ctx_size), ctx_size);
                prop_assert_eq!(config.sampling.temperature.to_bits(), temp32.to_bits());
            }
            (Err(error), Some(needles)) => {
                let message = error.to_string();
                prop_assert!(
                    needles.iter().any(|needle| message.contains(needle)),
                    "none of {:?} in: {}", needles, message
                );
            }
            (result, expected) => {
                prop_assert!(false, "for\n{}\ngot {:?}, expected error {:?}", text, result, expected);
            }
        }
    }

    #[test]
    fn config_file_cascade_and_policy_parse_as_the_flags_do(
        cascade in input_text(),
        policy in input_text(),
    ) {
        let scratch = Scratch::new("toml-specs");
        let text = format!(
            "[run]\ncascade = {}\npolicy = {}\n",
            toml_string(&cascade),
            toml_string(&policy)
        );
        let from_file = run_config(&scratch, &text).map_err(|e| e.to_string());
        let direct = parse_cascade(&cascade).and_then(|sources| {
            parse_policy(&policy).map(|policy| (sources, policy))
        });
        match (from_file, direct) {
            (Ok(config), Ok((sources, policy))) => {
                prop_assert_eq!(config.cascade, sources);
                prop_assert_eq!(config.policy, policy);
            }
            (Err(file_error), Err(direct_error)) => {
                prop_assert_eq!(file_error, direct_error.to_string());
            }
            (from_file, direct) => {
                prop_assert!(false, "file gave {:?}, flags give {:?}", from_file, direct);
            }
        }
    }

    #[test]
    fn plugin_tables_become_key_value_configs(
        plugin in "[a-z][a-z0-9_]{0,8}",
        table in prop::collection::btree_map(
            "[a-z_][a-z0-9_]{0,8}",
            prop_oneof![
                "[a-zA-Z0-9 ._/-]{0,12}".prop_map(toml::Value::String),
                any::<i32>().prop_map(|n| toml::Value::Integer(n.into())),
                any::<bool>().prop_map(toml::Value::Boolean),
            ],
            0..5,
        ),
    ) {
        let scratch = Scratch::new("toml-plugins");
        let mut text = format!("[plugins.{plugin}]\n");
        for (key, value) in &table {
            text.push_str(&format!("{key} = {value}\n"));
        }
        let config = run_config(&scratch, &text).map_err(|e| e.to_string());
        prop_assert!(config.is_ok(), "{}\n{:?}", text, config);
        let configs = config.map(|c| c.plugin_configs).unwrap_or_default();
        let expected = table
            .iter()
            .map(|(key, value)| match value {
                toml::Value::String(s) => format!("{key}={s}"),
                toml::Value::Integer(n) => format!("{key}={n}"),
                toml::Value::Boolean(b) => format!("{key}={b}"),
                other => unreachable!("not generated: {other:?}"),
            })
            .collect::<Vec<_>>()
            .join(",");
        prop_assert_eq!(configs.get(&plugin), Some(&expected));
    }
}

// ---------------------------------------------------------------------------------------------
// Workload files (`spechost bench --workload`)

/// One generated workload request and how it is written.
#[derive(Debug, Clone)]
struct WrittenRequest {
    id: Option<String>,
    category: Option<String>,
    /// One form or both, never neither.
    messages: Option<Vec<ChatMessage>>,
    completion: Option<Completion>,
    max_tokens: Option<usize>,
    blank_lines_before: usize,
}

fn chat_message() -> impl Strategy<Value = ChatMessage> {
    let role = prop_oneof![
        prop::sample::select(vec!["system", "user", "assistant"]).prop_map(str::to_owned),
        "[a-z]{1,8}",
    ];
    (role, any::<String>()).prop_map(|(role, content)| ChatMessage { role, content })
}

fn written_request() -> impl Strategy<Value = WrittenRequest> {
    let messages = || prop::collection::vec(chat_message(), 1..4);
    let stop = || {
        prop::collection::vec(
            any::<String>().prop_filter("a stop string is not empty", |s| !s.is_empty()),
            0..3,
        )
    };
    let completion = || {
        (
            any::<String>().prop_filter("a raw prompt is not empty", |p| !p.is_empty()),
            stop(),
        )
            .prop_map(|(text, stop)| Completion { text, stop })
    };
    let forms = prop_oneof![
        messages().prop_map(|m| (Some(m), None)),
        completion().prop_map(|c| (None, Some(c))),
        (messages(), completion()).prop_map(|(m, c)| (Some(m), Some(c))),
    ];
    (
        any::<bool>(),
        prop::option::of(any::<String>()),
        forms,
        prop::option::of(1usize..100_000),
        0usize..3,
    )
        .prop_map(
            |(has_id, category, (messages, completion), max_tokens, blank_lines_before)| {
                WrittenRequest {
                    // Filled in with a unique value below when `has_id`.
                    id: has_id.then(String::new),
                    category,
                    messages,
                    completion,
                    max_tokens,
                    blank_lines_before,
                }
            },
        )
}

fn workload_line(request: &WrittenRequest) -> String {
    let mut line = serde_json::Map::new();
    if let Some(id) = &request.id {
        line.insert("id".into(), id.clone().into());
    }
    if let Some(category) = &request.category {
        line.insert("category".into(), category.clone().into());
    }
    if let Some(messages) = &request.messages {
        let messages = messages
            .iter()
            .map(|m| serde_json::json!({ "role": m.role, "content": m.content }))
            .collect();
        line.insert("messages".into(), serde_json::Value::Array(messages));
    }
    if let Some(completion) = &request.completion {
        line.insert("prompt".into(), completion.text.clone().into());
        if !completion.stop.is_empty() {
            line.insert("stop".into(), completion.stop.clone().into());
        }
    }
    if let Some(max_tokens) = request.max_tokens {
        line.insert("max_tokens".into(), max_tokens.into());
    }
    serde_json::Value::Object(line).to_string()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn workload_of_any_text_is_refused_naming_the_line_or_accepted(text in input_text()) {
        let path = Path::new("fuzz/w.jsonl");
        let n_lines = text.lines().count();
        match Workload::parse(path, &text) {
            Ok(workload) => {
                prop_assert!(!workload.requests.is_empty());
                prop_assert!(workload.requests.iter().all(|r| r.line >= 1 && r.line <= n_lines));
            }
            Err(WorkloadError::Line { line, .. } | WorkloadError::DuplicateId { line, .. }) => {
                prop_assert!(line >= 1 && line <= n_lines, "line {} of {}", line, n_lines);
            }
            Err(WorkloadError::Empty { .. }) => {
                prop_assert!(text.lines().all(|l| l.trim().is_empty()), "{:?}", text);
            }
            Err(other) => prop_assert!(false, "unexpected {:?}", other),
        }
    }

    #[test]
    fn written_workload_round_trips(mut requests in prop::collection::vec(written_request(), 1..8)) {
        let mut text = String::new();
        let mut line = 0;
        let mut expected = Vec::new();
        for (index, request) in requests.iter_mut().enumerate() {
            if request.id.is_some() {
                request.id = Some(format!("r{index}"));
            }
            for _ in 0..request.blank_lines_before {
                text.push_str("  \n");
                line += 1;
            }
            text.push_str(&workload_line(request));
            text.push('\n');
            line += 1;
            expected.push((
                request.id.clone().unwrap_or_else(|| format!("line-{line}")),
                request.category.clone(),
                request.messages.clone(),
                request.completion.clone(),
                request.max_tokens,
                line,
            ));
        }
        let workload = Workload::parse(Path::new("fuzz/w.jsonl"), &text);
        prop_assert!(workload.is_ok(), "{}\n{:?}", text, workload);
        let parsed: Vec<_> = workload
            .map(|w| w.requests)
            .unwrap_or_default()
            .into_iter()
            .map(|r| (r.id, r.category, r.messages, r.completion, r.max_tokens, r.line))
            .collect();
        prop_assert_eq!(parsed, expected);
    }
}

// ---------------------------------------------------------------------------------------------
// Corpora of `spechost suffix warm`

/// The ways a corpus line may hold a text.
fn corpus_line(text: &str, form: u8) -> String {
    let value = match form {
        0 => serde_json::Value::String(text.to_owned()),
        1 => serde_json::json!({ "text": text }),
        2 => serde_json::json!({ "id": 7, "response": text }),
        _ => serde_json::json!({ "messages": [
            { "role": "user", "content": "question" },
            { "role": "assistant", "content": text },
        ]}),
    };
    value.to_string()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn corpus_of_any_text_is_refused_naming_the_file_or_accepted(text in input_text()) {
        let scratch = Scratch::new("corpus-any");
        let path = scratch.file("corpus", "jsonl", text.as_bytes());
        match read_corpus(&path) {
            Ok(texts) => prop_assert!(texts.iter().all(|t| !t.is_empty())),
            Err(error) => {
                let message = format!("{error:#}");
                prop_assert!(message.contains(&*path.to_string_lossy()), "{}", message);
            }
        }
    }

    #[test]
    fn written_corpus_round_trips(texts in prop::collection::vec((any::<String>(), 0u8..4), 1..8)) {
        let scratch = Scratch::new("corpus-written");
        let content: String = texts
            .iter()
            .map(|(text, form)| corpus_line(text, *form) + "\n")
            .collect();
        let path = scratch.file("corpus", "jsonl", content.as_bytes());
        let expected: Vec<String> = texts
            .iter()
            .map(|(text, _)| text.clone())
            .filter(|text| !text.is_empty())
            .collect();
        match read_corpus(&path) {
            Ok(read) => prop_assert_eq!(read, expected),
            Err(error) => {
                prop_assert!(expected.is_empty(), "{:#}", error);
                prop_assert!(format!("{error:#}").contains("holds no text"), "{:#}", error);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Plugin files given to the loader

/// Where the suite's `.wasm` files are: `<target>/wasm32-wasip2/release`, found from this test
/// binary's path (`<target>/release/deps/<test>`).
fn wasm_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("test binary inside <target>/release/deps");
    target.join("wasm32-wasip2").join("release")
}

/// The bytes of the built `lookup.wasm`, or a failure saying how to build it.
fn lookup_wasm() -> Vec<u8> {
    let path = wasm_dir().join("lookup.wasm");
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; build the plugins with scripts/build-plugins.sh",
            path.display()
        )
    })
}

/// How a component file is damaged. Edits stay within the first and last 4 KiB: the headers of
/// the core module and the component's own sections, where the loader fails before compiling;
/// an edit in a function body costs a full compile per case.
#[derive(Debug, Clone)]
enum Damage {
    /// Keep only the first `per_mille`/1000 of the file.
    Truncate { per_mille: u32 },
    /// Overwrite bytes at `offset` from the start.
    OverwriteHead { offset: usize, bytes: Vec<u8> },
    /// Overwrite bytes ending `offset` bytes before the end.
    OverwriteTail { offset: usize, bytes: Vec<u8> },
    /// Replace the whole file by random bytes, with or without a component header.
    Random {
        component_header: bool,
        bytes: Vec<u8>,
    },
}

fn damage() -> impl Strategy<Value = Damage> {
    let bytes = prop::collection::vec(any::<u8>(), 1..8);
    prop_oneof![
        (0u32..1000).prop_map(|per_mille| Damage::Truncate { per_mille }),
        (0usize..4096, bytes.clone())
            .prop_map(|(offset, bytes)| Damage::OverwriteHead { offset, bytes }),
        (1usize..4096, bytes).prop_map(|(offset, bytes)| Damage::OverwriteTail { offset, bytes }),
        (any::<bool>(), prop::collection::vec(any::<u8>(), 0..512)).prop_map(
            |(component_header, bytes)| Damage::Random {
                component_header,
                bytes
            }
        ),
    ]
}

fn apply(damage: &Damage, wasm: &[u8]) -> Vec<u8> {
    let mut out = wasm.to_vec();
    match damage {
        Damage::Truncate { per_mille } => {
            out.truncate(wasm.len() * *per_mille as usize / 1000);
        }
        Damage::OverwriteHead { offset, bytes } => {
            for (i, byte) in bytes.iter().enumerate() {
                if let Some(slot) = out.get_mut(offset + i) {
                    *slot ^= byte | 1;
                }
            }
        }
        Damage::OverwriteTail { offset, bytes } => {
            let start = out.len().saturating_sub(*offset);
            for (i, byte) in bytes.iter().enumerate() {
                if let Some(slot) = out.get_mut(start + i) {
                    *slot ^= byte | 1;
                }
            }
        }
        Damage::Random {
            component_header,
            bytes,
        } => {
            out = if *component_header {
                b"\0asm\x0d\0\x01\0".to_vec()
            } else {
                Vec::new()
            };
            out.extend_from_slice(bytes);
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..config() })]

    #[test]
    fn damaged_component_files_are_refused_without_panicking(damage in damage()) {
        let scratch = Scratch::new("wasm");
        let path = scratch.file("damaged", "wasm", &apply(&damage, &lookup_wasm()));
        let host = PluginHost::new(PluginHostConfig::default()).expect("plugin host starts");
        match host.load_file(&path) {
            Err(error) => {
                let message = error.to_string();
                prop_assert!(message.contains("damaged-"), "no file or plugin name in: {}", message);
                prop_assert!(
                    matches!(
                        error,
                        LoadError::NotWasm { .. }
                            | LoadError::NotAComponent { .. }
                            | LoadError::InvalidComponent { .. }
                            | LoadError::MissingExport { .. }
                            | LoadError::Incompatible { .. }
                            | LoadError::Instantiate { .. }
                    ),
                    "{:?}", error
                );
            }
            // Some edits leave a valid component (a byte of a name or producers section): then
            // it must really work.
            Ok(plugin) => {
                prop_assert!(
                    !matches!(damage, Damage::Truncate { .. } | Damage::Random { .. }),
                    "{:?} was accepted",
                    damage
                );
                let mut source = plugin.source("");
                let facts = ModelFacts {
                    vocab_size: 1000,
                    bos: Some(1),
                    eos: Some(2),
                    eog: vec![2],
                    context_size: 512,
                };
                let _ = source.begin(&facts, &[5, 6, 7, 5, 6]);
                let _ = source.propose(4);
            }
        }
    }
}
