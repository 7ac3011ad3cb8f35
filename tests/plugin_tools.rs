//! `spechost plugin check` and `spechost plugin bench` on the plugins the suite builds: every
//! built-in and example conforms; every hostile plugin fails, with its reason in the report;
//! the bench replays the bundled trace through a drafter alone and behind `lookup`.

mod common;

use std::path::PathBuf;
use std::process::Output;

use common::{arg, spechost, wasm_dir};

fn wasm_file(stem: &str) -> PathBuf {
    let path = wasm_dir().join(format!("{stem}.wasm"));
    assert!(
        path.is_file(),
        "{} is missing; build it with scripts/build-plugins.sh{}",
        path.display(),
        if stem == "python_drafter" {
            " and examples/python-drafter/build.sh (after `source scripts/env.sh && install_componentize_py`)"
        } else {
            ""
        }
    );
    path
}

fn check(stem: &str) -> (Output, String) {
    let output = spechost(&["plugin", "check", arg(&wasm_file(stem))]);
    let report = String::from_utf8_lossy(&output.stdout).into_owned();
    (output, report)
}

#[test]
fn built_in_and_example_plugins_conform() {
    for stem in [
        "lookup",
        "suffix",
        "draft",
        "markov_drafter",
        "python_drafter",
        "policy_cost",
        "policy_window",
        "policy_fixed",
        "policy_heuristic",
        "policy_content",
    ] {
        let (output, report) = check(stem);
        assert!(
            output.status.success(),
            "{stem} does not conform:\n{report}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(!report.contains("FAIL"), "{stem}:\n{report}");
        for name in ["loads", "config", "bad config", "time per call", "memory"] {
            assert!(
                report.contains(&format!("PASS  {name}")),
                "{stem}:\n{report}"
            );
        }
        assert!(report.contains("PASS  deterministic"), "{stem}:\n{report}");
        if !stem.starts_with("policy") {
            assert_observe_line(stem, &report);
        }
    }
}

/// Checks the `observe` line of a drafter's report: `suffix` learns from responses
/// it did not serve, `lookup` keeps nothing across requests.
fn assert_observe_line(stem: &str, report: &str) {
    let line = report
        .lines()
        .find(|line| line.split_whitespace().nth(1) == Some("observe"))
        .unwrap_or_else(|| panic!("{stem}: no `observe` line in:\n{report}"));
    assert!(line.contains("PASS"), "{stem}: {line}");
    let accepted = |after: &str| -> u64 {
        let rest = &line[line.find(after).expect("figure") + after.len()..];
        rest.split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|digits| digits.parse().ok())
            .expect("a number")
    };
    let (taught, fresh) = (accepted("an instance got "), accepted("a fresh one "));
    match stem {
        "suffix" => assert!(
            taught > fresh,
            "suffix learns from responses it did not serve: {line}"
        ),
        "lookup" => assert!(
            line.contains("it drafts as if it was handed nothing"),
            "lookup keeps no cross-request memory: {line}"
        ),
        _ => {}
    }
}

#[test]
fn every_hostile_plugin_fails_with_its_reason() {
    let cases: &[(&str, &str, &str)] = &[
        ("hostile_alloc", "FAIL  proposals", "in propose"),
        ("hostile_badconf", "FAIL  proposals", "confidence NaN"),
        (
            "hostile_bridge_loop",
            "FAIL  bad config",
            "silently ignored",
        ),
        ("hostile_clock", "FAIL  proposals", "deadline in propose"),
        ("hostile_fileopen", "FAIL  bad config", "silently ignored"),
        ("hostile_flood", "FAIL  proposals", "proposed 10000 tokens"),
        (
            "hostile_flood_million",
            "FAIL  proposals",
            "proposed 1000000 tokens",
        ),
        ("hostile_loop", "FAIL  proposals", "deadline in propose"),
        ("hostile_old_wit", "FAIL  loads", "drafter-api@0.1.0"),
        ("hostile_oov", "FAIL  proposals", "proposed token 49152"),
        (
            "hostile_panic",
            "FAIL  proposals",
            "deliberate panic in propose",
        ),
        (
            "hostile_observe_panic",
            "FAIL  observe",
            "deliberate panic in observe-response",
        ),
        (
            "hostile_panic_open",
            "FAIL  config",
            "deliberate panic in new",
        ),
        (
            "hostile_policy_absurd",
            "FAIL  decisions",
            "draft length of 4294967295",
        ),
        (
            "hostile_policy_panic",
            "FAIL  decisions",
            "panics in decide",
        ),
        ("hostile_sleep", "FAIL  bad config", "silently ignored"),
        ("hostile_slow_open", "FAIL  config", "deadline in open"),
    ];
    for (stem, check_line, reason) in cases {
        let (output, report) = check(stem);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stem}:\n{report}\n{stderr}");
        assert!(
            stderr.contains("does not conform"),
            "{stem}: no verdict on stderr: {stderr}"
        );
        let line = report
            .lines()
            .find(|line| line.trim_start().starts_with(check_line))
            .unwrap_or_else(|| panic!("{stem}: no `{check_line}` line in:\n{report}"));
        assert!(line.contains(reason), "{stem}: `{reason}` not in: {line}");
    }
}

#[test]
fn the_json_report_lists_checks_and_figures() {
    let output = spechost(&[
        "plugin",
        "check",
        arg(&wasm_file("suffix")),
        "--json",
        "--requests",
        "1",
    ]);
    assert!(output.status.success());
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("plugin check --json prints JSON");
    assert_eq!(report["kind"], "drafter");
    let checks = report["checks"].as_array().expect("checks");
    assert!(
        checks.iter().all(|check| check["outcome"] == "pass"),
        "{report:#}"
    );
    let figures = &report["figures"];
    assert_eq!(
        figures["requests"], 4,
        "one request of each of the 4 workloads"
    );
    assert!(figures["peak_memory_bytes"].as_u64().expect("memory") > 0);
    assert!(
        figures["state_bytes"].as_u64().expect("state") > 0,
        "suffix saves its cache"
    );
    let propose = figures["calls"]
        .as_array()
        .expect("calls")
        .iter()
        .find(|call| call["method"] == "propose")
        .expect("propose timed");
    assert!(propose["calls"].as_u64().expect("count") > 0);
}

#[test]
fn the_bench_replays_the_bundled_trace_alone_and_behind_lookup() {
    let output = spechost(&["plugin", "bench", arg(&wasm_file("markov_drafter"))]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for workload in ["edit", "summarize", "extract", "code"] {
        for configuration in ["lookup K=", "markov_drafter K=", "lookup,markov_drafter K="] {
            assert!(
                stdout.contains(&format!("| {workload} | {configuration}")),
                "no {workload} row for {configuration} in:\n{stdout}"
            );
        }
    }
    assert!(stdout.contains("replayed in"), "{stdout}");

    let named_like_lookup = spechost(&["plugin", "bench", arg(&wasm_file("lookup"))]);
    common::assert_fails_with(&named_like_lookup, &["rename the .wasm file"]);
    let no_plugin = spechost(&["plugin", "check", "/nonexistent/p.wasm"]);
    assert_eq!(no_plugin.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&no_plugin.stdout).contains("FAIL  loads"));
}

/// componentize-py, as `scripts/env.sh install_componentize_py` installs it.
fn componentize_py() -> String {
    std::env::var("SPECHOST_COMPONENTIZE_PY").unwrap_or_else(|_| {
        panic!(
            "SPECHOST_COMPONENTIZE_PY is not set; run `source scripts/env.sh && install_componentize_py` (scripts/test.sh does)"
        )
    })
}

#[test]
fn python_projects_from_plugin_new_build_and_conform() {
    let componentize = componentize_py();
    let dir = common::scratch_file("plugin-new-python", "projects");
    let _ = std::fs::remove_dir_all(&dir);
    for kind in ["drafter", "policy"] {
        let name = format!("py-{kind}");
        let made = spechost(&[
            "plugin",
            "new",
            &name,
            "--lang",
            "python",
            "--kind",
            kind,
            "--dir",
            arg(&dir),
        ]);
        assert!(
            made.status.success(),
            "plugin new: {}",
            String::from_utf8_lossy(&made.stderr)
        );
        let built = std::process::Command::new(dir.join(&name).join("build.sh"))
            .env("SPECHOST_COMPONENTIZE_PY", &componentize)
            .env("SPECHOST", env!("CARGO_BIN_EXE_spechost"))
            .output()
            .expect("build.sh runs");
        let stderr = String::from_utf8_lossy(&built.stderr);
        assert!(built.status.success(), "{name}/build.sh failed:\n{stderr}");
        assert!(stderr.contains("result: conforms"), "{name}:\n{stderr}");
        let wasm = String::from_utf8_lossy(&built.stdout).trim().to_owned();
        assert!(wasm.ends_with(&format!("{name}.wasm")), "printed: {wasm}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
