//! Cross-request plugin state through the real binary: the suffix drafter's cache of earlier
//! responses survives the process (`--state-dir`), can be warmed offline (`spechost suffix
//! warm`), and a corrupt state file is ignored with a warning, never trusted.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use spechost::config::cache_dir;
use spechost::models::DefaultModel;

const PROMPT: &str = "List the first ten prime numbers, one per line, each with a short fact.";
const MAX_TOKENS: &str = "48";

fn spechost(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_spechost"))
        .args(args)
        .env("RUST_LOG", "spechost=warn")
        .output()
        .expect("spechost runs")
}

/// A fresh directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("spechost-state-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn model() -> String {
    DefaultModel::SmolLm2
        .path(&cache_dir())
        .display()
        .to_string()
}

/// Output text, and the suffix source's accepted tokens, of a greedy `run` with `extra` flags.
fn run(cascade: &str, extra: &[&str]) -> (String, u64, String) {
    let model = model();
    let mut args = vec![
        "run",
        "-m",
        &model,
        "-c",
        cascade,
        "-n",
        MAX_TOKENS,
        "-p",
        PROMPT,
        "--json",
        "--policy",
        "fixed,k=8",
        "--draft-max",
        "8",
    ];
    args.extend_from_slice(extra);
    let output = spechost(&args);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "run failed: {stderr}");
    let report: serde_json::Value = stderr
        .lines()
        .rev()
        .find_map(|line| serde_json::from_str(line).ok())
        .unwrap_or_else(|| panic!("no JSON report in: {stderr}"));
    let accepted = report["stats"]["sources"]
        .as_array()
        .and_then(|sources| sources.iter().find(|s| s["name"] == "suffix"))
        .map_or(0, |suffix| suffix["accepted"].as_u64().unwrap_or(0));
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        accepted,
        stderr,
    )
}

fn state_dir_arg(dir: &Path) -> String {
    dir.display().to_string()
}

#[test]
fn suffix_cache_survives_the_process_through_the_state_dir() {
    let _guard = common::exclusive();
    let dir = scratch("survives");
    let dir_arg = state_dir_arg(&dir);
    let (plain, _, _) = run("none", &[]);
    let (first, first_accepted, _) = run("suffix", &["--state-dir", &dir_arg]);
    assert_eq!(first, plain, "speculation changed the output");
    let file = dir.join("suffix.state");
    assert!(file.is_file(), "no state file written in {}", dir.display());
    let (second, second_accepted, _) = run("suffix", &["--state-dir", &dir_arg]);
    assert_eq!(second, plain, "speculation changed the output");
    assert!(
        second_accepted > first_accepted + 10,
        "the second process did not use the saved cache: accepted {first_accepted} then {second_accepted}"
    );
}

#[test]
fn warmed_cache_drafts_the_answer_it_was_warmed_with() {
    let _guard = common::exclusive();
    let dir = scratch("warm");
    let (plain, cold_accepted, _) = run("suffix", &[]);
    let corpus = dir.join("corpus.jsonl");
    let line = serde_json::json!({ "response": plain.trim_end() }).to_string();
    std::fs::write(
        &corpus,
        format!("{line}\n\"unrelated text that never comes up\"\n"),
    )
    .expect("write corpus");
    let out = dir.join("suffix.state");
    let model = model();
    let warm = spechost(&[
        "suffix",
        "warm",
        "--corpus",
        &corpus.display().to_string(),
        "--out",
        &out.display().to_string(),
        "-m",
        &model,
    ]);
    let stderr = String::from_utf8_lossy(&warm.stderr);
    assert!(warm.status.success(), "warm failed: {stderr}");
    assert!(stderr.contains("from 2 texts"), "report: {stderr}");
    let (warmed, warm_accepted, _) = run("suffix", &["--state-dir", &state_dir_arg(&dir)]);
    assert_eq!(warmed, plain, "speculation changed the output");
    assert!(
        warm_accepted > cold_accepted + 10,
        "the warmed cache was not used: accepted {cold_accepted} cold, {warm_accepted} warmed"
    );
}

#[test]
fn corrupt_state_file_is_ignored_with_a_warning() {
    let _guard = common::exclusive();
    let dir = scratch("corrupt");
    std::fs::write(
        dir.join("suffix.state"),
        b"SHSUFFIX garbage that is not a cache",
    )
    .expect("write");
    let (plain, _, _) = run("none", &[]);
    let (out, _, stderr) = run("suffix", &["--state-dir", &state_dir_arg(&dir)]);
    assert_eq!(out, plain, "a corrupt cache changed the output");
    assert!(
        stderr.contains("suffix") && stderr.to_lowercase().contains("ignor"),
        "no warning about the corrupt state file: {stderr}"
    );
}
