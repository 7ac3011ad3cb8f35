//! `spechost run` on bad input: a one-line error naming the problem and the fix, a non-zero
//! exit code, and never a panic.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::assert_fails_with;
use spechost::config::cache_dir;
use spechost::models::DefaultModel;

fn spechost(args: &[&str], stdin: Option<&str>) -> Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_spechost"))
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spechost starts");
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("write stdin");
    }
    child.wait_with_output().expect("spechost finishes")
}

fn smollm2() -> PathBuf {
    DefaultModel::SmolLm2.path(&cache_dir())
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("spechost-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir.join(name)
}

fn s(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

#[test]
fn missing_model_names_the_fetch_command() {
    let out = spechost(
        &["run", "--model", "/nonexistent/m.gguf", "--prompt", "hi"],
        None,
    );
    assert_fails_with(
        &out,
        &["/nonexistent/m.gguf", "not found", "spechost models fetch"],
    );
}

#[test]
fn non_gguf_and_corrupt_models_are_refused() {
    let text = scratch("text.gguf");
    std::fs::write(&text, "just text").expect("write");
    let out = spechost(&["run", "--model", s(&text), "--prompt", "hi"], None);
    assert_fails_with(&out, &["not a GGUF model"]);

    let corrupt = scratch("corrupt.gguf");
    let mut bytes = b"GGUF\x03\x00\x00\x00".to_vec();
    bytes.extend(std::iter::repeat_n(0xAB, 4096));
    std::fs::write(&corrupt, bytes).expect("write");
    let out = spechost(&["run", "--model", s(&corrupt), "--prompt", "hi"], None);
    assert_fails_with(&out, &["could not load", "corrupt"]);
}

#[test]
fn unreadable_prompt_file_and_empty_prompt() {
    let model = smollm2();
    let out = spechost(
        &[
            "run",
            "--model",
            s(&model),
            "--prompt-file",
            "/nonexistent/prompt.txt",
        ],
        None,
    );
    assert_fails_with(&out, &["/nonexistent/prompt.txt"]);
    let out = spechost(
        &["run", "--model", s(&model), "--raw", "--prompt", ""],
        None,
    );
    assert_fails_with(&out, &["prompt is empty"]);
}

#[test]
fn zero_draft_length_and_tiny_context() {
    let model = smollm2();
    let out = spechost(
        &[
            "run",
            "--model",
            s(&model),
            "--prompt",
            "hi",
            "--draft-max",
            "0",
        ],
        None,
    );
    assert_fails_with(&out, &["--draft-max", "--cascade none"]);
    let out = spechost(
        &[
            "run",
            "--model",
            s(&model),
            "--prompt",
            "hi",
            "--ctx-size",
            "4",
        ],
        None,
    );
    assert_fails_with(&out, &["--ctx-size 4", "at least"]);
    let long = "word ".repeat(400);
    let out = spechost(
        &[
            "run",
            "--model",
            s(&model),
            "--prompt",
            &long,
            "--ctx-size",
            "128",
            "--max-tokens",
            "16",
        ],
        None,
    );
    assert_fails_with(&out, &["exceed the context size", "raise --ctx-size"]);
}

#[test]
fn unknown_cascade_name_lists_the_known_ones() {
    let model = smollm2();
    let out = spechost(
        &[
            "run",
            "--model",
            s(&model),
            "--prompt",
            "hi",
            "--cascade",
            "lookup,telepathy",
        ],
        None,
    );
    assert_fails_with(&out, &["telepathy", "lookup"]);
}

#[test]
fn prompt_from_stdin_streams_text_and_prints_stats() {
    let _guard = common::exclusive();
    let model = smollm2();
    let out = spechost(
        &[
            "run",
            "--model",
            s(&model),
            "--cascade",
            "lookup",
            "--max-tokens",
            "24",
            "--json",
        ],
        Some("Repeat after me: the cat sat on the mat. The cat sat on the mat."),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failed: {stderr}");
    assert!(!out.stdout.is_empty(), "no text on stdout");
    let json_line = stderr.lines().last().expect("stats line");
    let stats: serde_json::Value = serde_json::from_str(json_line)
        .unwrap_or_else(|e| panic!("stats are not JSON ({e}): {json_line}"));
    assert_eq!(stats["cascade"][0], "lookup", "stats: {stats}");
    assert!(
        stats["stats"]["generated_tokens"].as_u64().unwrap_or(0) > 0,
        "stats: {stats}"
    );
}
