//! The Python example drafter (`examples/python-drafter/`, built with componentize-py) in the
//! host, on the default model (SmolLM2-135M): `spechost run` with it prints exactly plain
//! decoding's greedy output while it drafts, a bad setting is refused naming it, a live server
//! takes it in a hot swap while clients stream (no failed request, every output that of plain
//! decoding), and with its largest table, filled by random tokens over whole contexts, it stays
//! within the sandbox's memory and time limits. Its conformance and per-call costs are
//! `spechost plugin check`'s (tests/plugin_tools.rs, docs/plugins.md).
//!
//! componentize-py comes from PyPI: scripts/test.sh installs it (`install_componentize_py` in
//! scripts/env.sh, which sets SPECHOST_COMPONENTIZE_PY) and builds the example beside the Rust
//! plugins; these tests rebuild it when its sources are newer, and fail without the variable.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::SystemTime;

use common::server::*;
use common::*;
use serde_json::{Value, json};
use spechost::cascade::{DraftSource, Feedback, ModelFacts, Token, matching_prefix};
use spechost::plugins::{SandboxLimits, SourceSpec};

/// The plugin's name: its file stem.
const NAME: &str = "python_drafter";
/// Draft length of the fixed policy the tests use: the default (`cost`) policy's choices depend
/// on the machine's measured speed, and whether the drafter drafts must not.
const POLICY: &str = "fixed,k=8";

/// The example's directory.
fn example_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/python-drafter")
}

fn modified(path: &Path) -> SystemTime {
    std::fs::metadata(path)
        .and_then(|metadata| metadata.modified())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The built Python drafter, rebuilt first if a source of it is newer (once per test process).
fn python_drafter() -> PathBuf {
    static BUILDING: Mutex<()> = Mutex::new(());
    let _building = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    let componentize_py = std::env::var_os("SPECHOST_COMPONENTIZE_PY").unwrap_or_else(|| {
        panic!(
            "SPECHOST_COMPONENTIZE_PY is not set: run the tests with scripts/test.sh, or \
             `source scripts/env.sh && install_componentize_py` first"
        )
    });
    let example = example_dir();
    let wasm = wasm_dir().join(format!("{NAME}.wasm"));
    let newest_source = ["app.py", "wit/world.wit", "build.sh"]
        .iter()
        .map(|file| modified(&example.join(file)))
        .max()
        .expect("three sources");
    if !wasm.exists() || modified(&wasm) < newest_source {
        let status = Command::new(example.join("build.sh"))
            .arg(&wasm)
            .env("SPECHOST_COMPONENTIZE_PY", componentize_py)
            .status()
            .expect("examples/python-drafter/build.sh runs");
        assert!(status.success(), "examples/python-drafter/build.sh failed");
    }
    wasm
}

/// `spechost run` on the edit prompt, greedy; returns stdout and the `--json` stats.
fn run(extra: &[&str]) -> (String, Value) {
    let prompt = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/prompts/edit.txt");
    let mut args = vec![
        "run",
        "--model",
        "smollm2",
        "--prompt-file",
        arg(&prompt),
        "--max-tokens",
        "64",
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = spechost(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "spechost {args:?} failed: {stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    let stats = serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("the last stderr line is not JSON stats ({e}): {stderr}"));
    (String::from_utf8_lossy(&out.stdout).into_owned(), stats)
}

#[test]
fn run_with_the_python_drafter_prints_plain_decodings_output_and_drafts() {
    let drafter = python_drafter();
    smollm2_path();
    let _guard = exclusive();
    let (plain, _) = run(&["--cascade", "none"]);
    let (speculative, stats) = run(&["--cascade", arg(&drafter), "--policy", POLICY]);
    assert_eq!(speculative, plain, "the Python drafter changed the output");
    let source = &stats["stats"]["sources"][0];
    assert_eq!(source["name"], NAME, "{stats}");
    assert_eq!(source["faults"], 0, "{source}");
    let drafted = source["drafted"].as_u64().unwrap_or(0);
    let accepted = source["accepted"].as_u64().unwrap_or(0);
    assert!(
        drafted > 0 && accepted > 0,
        "the Python drafter drafted {drafted} and had {accepted} accepted: {source}"
    );

    let refused = spechost(&[
        "run",
        "--model",
        "smollm2",
        "--prompt",
        "hi",
        "--max-tokens",
        "4",
        "--cascade",
        arg(&drafter),
        "--plugin-config",
        "python_drafter.minprob=0.3",
    ]);
    assert_fails_with(
        &refused,
        &[
            NAME,
            "unknown setting `minprob`",
            "`min_prob`, `max_ngrams`",
        ],
    );
}

#[test]
fn a_live_server_takes_the_python_drafter_in_a_hot_swap_without_changing_outputs() {
    let drafter = python_drafter();
    let _guard = exclusive();
    let dir = scratch("python-plugin");
    let plugins = dir.join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugin dir");
    install(&drafter, &plugins.join(format!("{NAME}.wasm")));
    let server = Server::start(&[
        "--admin-token",
        ADMIN_TOKEN,
        "--plugin-dir",
        arg(&plugins),
        "--cascade",
        "lookup",
        "--policy",
        POLICY,
    ]);
    let prompts = drafting_prompts();
    let max_tokens = 64;
    let plain = plain_answers(&server, &prompts, max_tokens);

    // One client streams request after request with the default cascade and says when each
    // has started, so that every swap lands while a request is in flight.
    let client = StreamingClient::start(&server, prompts.clone(), max_tokens);

    // The first swap loads the component from the plugin directory; the others name it.
    let cascades = [
        format!("{NAME}.wasm"),
        format!("lookup,{NAME}"),
        NAME.to_owned(),
        format!("{NAME},lookup"),
        "lookup".to_owned(),
        NAME.to_owned(),
    ];
    for (round, cascade) in cascades.iter().enumerate() {
        client.wait_for_request();
        let updated = admin_put(&server, "/admin/cascade", &json!({"cascade": cascade}));
        assert_eq!(
            updated.status, 200,
            "swap {round} to {cascade}: {}",
            updated.body
        );
    }
    // Two more requests, all with the Python drafter alone.
    for _ in 0..2 {
        client.wait_for_request();
    }
    let results = client.stop();

    let swaps = assert_plain_answers(&results, &plain);
    let (mut drafted, mut accepted) = (0, 0);
    for (index, (_, streamed)) in results.iter().enumerate() {
        let speculative = &streamed.last()["speculative"];
        let python = speculative["sources"]
            .as_array()
            .and_then(|sources| sources.iter().find(|s| s["name"] == NAME));
        if let Some(python) = python {
            assert_eq!(python["faults"], 0, "request {index}: {python}");
            drafted += python["drafted"].as_u64().unwrap_or(0);
            accepted += python["accepted"].as_u64().unwrap_or(0);
        }
    }
    assert!(
        swaps >= 1,
        "no request was swapped mid-flight; the test proved nothing"
    );
    assert!(
        drafted > 0 && accepted > 0,
        "the Python drafter drafted {drafted} tokens and had {accepted} accepted in {} requests",
        results.len()
    );
    let page = metrics(&server);
    let faults = format!("spechost_plugin_faults_total{{plugin=\"{NAME}\"}}");
    assert_eq!(sample(&page, &faults), 0.0, "{page}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn python_drafter_at_its_largest_table_stays_within_the_sandbox() {
    let python = python_drafter();
    // Alone: the call deadline is wall time, and a model test beside it would share the cores.
    let _guard = exclusive();
    let host = plugin_host();
    let plugin = host
        .load(&SourceSpec::Path(python))
        .expect("the drafter loads");
    let mut source = plugin.source_with_limits(
        "max_ngrams=262144, min_prob=0".to_owned(),
        SandboxLimits::default(),
    );
    let facts = ModelFacts {
        vocab_size: 49_152,
        bos: Some(1),
        eos: Some(2),
        eog: vec![2],
        context_size: 8192,
    };
    // Random tokens: almost every position is a new pair and a new single token, so the table
    // fills to its bound. Requests of a full context, fed as a prompt then in rounds of 8.
    let mut random = 7_u64;
    let mut next = || {
        random = random
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((random >> 33) % u64::from(facts.vocab_size)) as Token
    };
    for request in 0..60 {
        let prompt: Vec<Token> = (0..4096).map(|_| next()).collect();
        source.begin(&facts, &prompt).expect("open and feed");
        for _ in 0..512 {
            let proposal = source.propose(8).expect("propose");
            assert!(
                proposal.tokens.iter().all(|&t| t < facts.vocab_size),
                "{proposal:?}"
            );
            let committed: Vec<Token> = (0..8).map(|_| next()).collect();
            let n_accepted = matching_prefix(&proposal.tokens, &committed).min(7);
            let outcome = Feedback {
                won: !proposal.tokens.is_empty(),
                n_accepted: n_accepted as u32,
                target_token: committed[n_accepted],
            };
            source.feedback(outcome).expect("feedback");
            source.feed(&committed).expect("feed");
        }
        source.end();
        assert_eq!(
            source.faults(),
            0,
            "request {request}: {:?}",
            source.last_fault()
        );
    }
}
