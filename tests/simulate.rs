//! The offline tools against the real thing, on SmolLM2-135M (`spechost models fetch smollm2`)
//! with the `lookup` and `suffix` plugins (`scripts/build-plugins.sh`):
//!
//! - `spechost simulate` replaying a `spechost trace` gives the counters of a real greedy
//!   `spechost bench` run of the same requests, in ordered and scored mode, and closely in
//!   tree mode (each round's tree is sized by the verify costs each measured on its own);
//! - `spechost prompts` writes exactly the text the target tokenizes;
//! - `Session::measure_verify_costs` measures every batch size and refuses what cannot run.

mod common;

use std::path::{Path, PathBuf};

use serde_json::Value;
use spechost::bench::trace::Trace;
use spechost::cascade::Cascade;
use spechost::engine::{MessageContents, Request, SamplingParams, SessionParams};
use spechost::models::DefaultModel;

/// Runs spechost and returns its stdout, failing with both streams when it fails.
fn spechost_ok(args: &[&str]) -> String {
    let out = common::spechost(args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "spechost {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()))
}

/// Three requests served in order: text to copy (so `lookup` drafts), and a second list that
/// repeats words of the first.
const WORKLOAD: &str = concat!(
    r#"{"id": "copy", "messages": [{"role": "user", "content": "Copy this list exactly: red apple, green pear, red apple, green pear, red apple, green pear."}], "max_tokens": 40}"#,
    "\n",
    r#"{"id": "code", "messages": [{"role": "user", "content": "Add type hints: def area(width, height):\n    return width * height\n\ndef volume(width, height, depth):\n    return area(width, height) * depth"}], "max_tokens": 48}"#,
    "\n",
    r#"{"id": "again", "messages": [{"role": "user", "content": "Copy this list exactly: green pear, red apple, green pear, red apple."}], "max_tokens": 32}"#,
    "\n",
);

/// The only configuration of a `bench` or `simulate` result file with `label`, on its only
/// workload.
fn configuration<'v>(results: &'v Value, label: &str) -> &'v Value {
    results["workloads"][0]["configurations"]
        .as_array()
        .expect("configurations")
        .iter()
        .find(|c| c["label"] == label)
        .unwrap_or_else(|| panic!("no `{label}` in {results}"))
}

#[test]
fn simulation_of_a_trace_counts_what_a_real_greedy_run_counts() {
    let _guard = common::exclusive();
    let model = common::smollm2_path();
    let workload = scratch("copy.jsonl");
    std::fs::write(&workload, WORKLOAD).expect("write workload");
    let trace = scratch("copy-trace.jsonl");
    let bench_out = scratch("bench");
    let simulate_out = scratch("simulate");
    let target = ["--model", common::arg(&model), "--ctx-size", "1024"];

    // The verify cost curves are kept short and measured once: only their shape is checked.
    let mut args = vec![
        "trace",
        "--workload",
        common::arg(&workload),
        "--out",
        common::arg(&trace),
    ];
    args.extend(target);
    args.extend(["--cost-max-tokens", "9", "--cost-repeat", "1"]);
    spechost_ok(&args);
    // Ordered `lookup`, and scored `lookup,suffix`, where the winner of each round depends on
    // what the cascade learnt from earlier rounds about both sources; in tree mode, both
    // sources' proposals verified together where they differ.
    let cascades = [
        "--cascade",
        "lookup",
        "--cascade",
        "lookup,suffix",
        "--cascade-mode",
        "first,scored,tree",
    ];
    let mut args = vec![
        "bench",
        "--workload",
        common::arg(&workload),
        "--policy",
        "fixed",
        "--draft-max",
        "8",
        "--repeat",
        "1",
        "--warmup",
        "0",
        "--cost-max-tokens",
        "1",
        "--cost-repeat",
        "1",
        "--out",
        common::arg(&bench_out),
    ];
    args.extend(cascades);
    args.extend(target);
    spechost_ok(&args);
    let mut args = vec![
        "simulate",
        "--trace",
        common::arg(&trace),
        "--draft-max",
        "8",
        "--out",
        common::arg(&simulate_out),
    ];
    args.extend(cascades);
    let table = spechost_ok(&args);
    assert!(table.contains("| copy | lookup K=8 |"), "table:\n{table}");
    assert!(
        table.contains("| copy | lookup,suffix K=8 scored |"),
        "table:\n{table}"
    );

    let recorded = Trace::read(&trace).expect("the trace reads back");
    assert_eq!(recorded.requests.len(), 3, "{recorded:?}");
    assert_eq!(
        recorded.target.verify_costs_us.len(),
        9,
        "{:?}",
        recorded.target
    );
    let real_results = read_json(&bench_out.join("results.json"));
    assert_eq!(real_results["outputs_match"], true, "{real_results}");
    let simulated_results = read_json(&simulate_out.join("simulation.json"));
    for label in [
        "lookup K=8",
        "lookup K=8 scored",
        "lookup,suffix K=8",
        "lookup,suffix K=8 scored",
        "lookup,suffix K=8 tree",
    ] {
        let real = configuration(&real_results, label);
        let simulated = configuration(&simulated_results, label);
        assert!(
            real["drafted"].as_u64() > Some(0),
            "{label} drafted nothing, the comparison would be vacuous: {real}"
        );
        if label.ends_with("tree") {
            // Each round's tree is sized by the measured verify costs, which the bench and
            // the trace measure apart: the counters agree closely, not exactly.
            let committed = |c: &Value| c["mean_committed_per_round"].as_f64().expect("mean");
            let (real_committed, simulated_committed) = (committed(real), committed(simulated));
            assert!(
                (simulated_committed - real_committed).abs() <= 0.05 * real_committed,
                "{label}: committed per round: real {real_committed}, simulated {simulated_committed}"
            );
            continue;
        }
        // Greedy output is the trace's under any cascade, and both drafters are
        // deterministic: the replay makes the same calls with the same tokens as the real run,
        // so every counter is equal.
        for counter in [
            "rounds",
            "draft_rounds",
            "tree_rounds",
            "drafted",
            "accepted",
            "verify_batches",
            "mean_accepted_per_draft_round",
            "mean_committed_per_round",
        ] {
            assert_eq!(
                real[counter], simulated[counter],
                "{label}: `{counter}` differs:\nreal {real}\nsimulated {simulated}"
            );
        }
        for source in 0..real["sources"].as_array().map_or(0, Vec::len) {
            for counter in ["name", "won", "drafted", "accepted", "accepted_by_position"] {
                assert_eq!(
                    real["sources"][source][counter], simulated["sources"][source][counter],
                    "{label}: source {source}'s `{counter}` differs:\nreal {real}\nsimulated {simulated}"
                );
            }
        }
        // What the issue asks for, implied by the equalities above: within 5%.
        let mean = |c: &Value| c["mean_accepted_per_draft_round"].as_f64().expect("mean");
        let (real_mean, simulated_mean) = (mean(real), mean(simulated));
        assert!(
            (simulated_mean - real_mean).abs() <= 0.05 * real_mean,
            "{label}: mean accepted per draft round: real {real_mean}, simulated {simulated_mean}"
        );
        // Both curves cover K + 1 = 9 tokens, so both give an ideal speedup.
        assert!(real["ideal_speedup"].as_f64() > Some(0.0), "{real}");
        assert!(real["efficiency"].as_f64() > Some(0.0), "{real}");
        assert!(
            simulated["ideal_speedup"].as_f64() > Some(0.0),
            "{simulated}"
        );
    }
    let _ = std::fs::remove_dir_all(bench_out);
    let _ = std::fs::remove_dir_all(simulate_out);
}

#[test]
fn prompts_are_the_exact_text_the_target_tokenizes() {
    let _guard = common::exclusive();
    let model = common::smollm2_path();
    let workload = scratch("prompts.jsonl");
    std::fs::write(&workload, WORKLOAD).expect("write workload");
    let out = scratch("prompts");
    spechost_ok(&[
        "prompts",
        "--model",
        common::arg(&model),
        "--workload",
        common::arg(&workload),
        "--max-tokens",
        "36",
        "--out",
        common::arg(&out),
    ]);
    let index = std::fs::read_to_string(out.join("index.jsonl")).expect("index.jsonl");
    let entries: Vec<Value> = index
        .lines()
        .map(|line| serde_json::from_str(line).expect("index line is JSON"))
        .collect();
    let ids: Vec<&str> = entries
        .iter()
        .map(|e| e["id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, ["copy", "code", "again"], "{index}");
    let max_tokens: Vec<u64> = entries
        .iter()
        .map(|e| e["max_tokens"].as_u64().expect("max_tokens"))
        .collect();
    assert_eq!(
        max_tokens,
        [36, 36, 32],
        "capped at --max-tokens 36: {index}"
    );

    let target = common::load(DefaultModel::SmolLm2);
    let messages: Vec<Value> = WORKLOAD
        .lines()
        .map(|line| serde_json::from_str(line).expect("workload line"))
        .collect();
    for (entry, message) in entries.iter().zip(&messages) {
        let file = out.join(entry["file"].as_str().expect("file"));
        let text = std::fs::read_to_string(&file).expect("prompt file");
        let content = message["messages"][0]["content"].as_str().expect("content");
        let expected = target
            .tokenize_messages(&[("user", content)], MessageContents::Plain)
            .expect("chat template");
        let tokens = target.tokenize_raw(&text);
        assert_eq!(
            tokens,
            expected,
            "{} does not tokenize to the templated request",
            file.display()
        );
        assert_eq!(
            entry["prompt_tokens"].as_u64(),
            Some(tokens.len() as u64),
            "{entry}"
        );
        assert!(
            text.ends_with("assistant\n"),
            "ends where the answer starts: {text:?}"
        );
    }
    let _ = std::fs::remove_dir_all(out);
}

#[test]
fn other_tools_answers_are_flagged_by_benchs_rule_and_bad_lines_are_named() {
    let _guard = common::exclusive();
    let model = common::smollm2_path();
    let workload = scratch("check.jsonl");
    std::fs::write(&workload, WORKLOAD).expect("write workload");
    let outputs = scratch("answers.jsonl");
    let looping = "Copyright\n\n".repeat(40);
    let answers = [
        serde_json::json!({"workload": "check", "id": "copy", "tool": "a",
            "text": "red apple, green pear, red apple, green pear, red apple, green pear."}),
        serde_json::json!({"workload": "check", "id": "code", "tool": "b", "text": looping}),
        serde_json::json!({"workload": "check", "id": "again", "tool": "c",
            "text": "Sure. Copy this list exactly: green pear, red apple, green pear, red apple."}),
    ];
    let lines: String = answers.iter().map(|a| format!("{a}\n\n")).collect();
    std::fs::write(&outputs, lines).expect("write answers");
    let args = |outputs: &Path| {
        vec![
            "check-outputs".to_owned(),
            "--model".into(),
            common::arg(&model).into(),
            "--workload".into(),
            common::arg(&workload).into(),
            "--outputs".into(),
            common::arg(outputs).into(),
        ]
    };
    let stdout = spechost_ok(
        &args(&outputs)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let verdicts: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    let degenerate: Vec<&Value> = verdicts.iter().map(|v| &v["degenerate"]).collect();
    assert_eq!(
        degenerate,
        [&Value::Null, &Value::from("loop"), &Value::from("echo")],
        "{stdout}"
    );
    assert_eq!(verdicts[1]["tool"], "b", "other fields are kept: {stdout}");

    // A good line, then a bad one: an error naming the bad line, and no partial output.
    let unknown = scratch("unknown.jsonl");
    let bad = r#"{"workload": "check", "id": "nope", "text": "x"}"#;
    std::fs::write(&unknown, format!("{}\n{bad}\n", answers[0])).expect("write");
    let out = common::spechost(
        &args(&unknown)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("unknown.jsonl:2") && stderr.contains("no request `nope`"),
        "names the line and the request: {stderr}"
    );
    assert!(out.stdout.is_empty(), "nothing written: {:?}", out.stdout);
    for path in [workload, outputs, unknown] {
        let _ = std::fs::remove_file(path);
    }
}

#[test]
fn verify_costs_cover_every_batch_size_and_refuse_what_cannot_run() {
    let _guard = common::exclusive();
    let target = common::load(DefaultModel::SmolLm2);
    let params = SessionParams {
        ctx_size: 64,
        batch_size: 8,
        ..SessionParams::default()
    };
    let mut session = target.session(&params).expect("session");
    let context = target
        .tokenize_chat("Count to ten.")
        .expect("chat template");

    let costs = session
        .measure_verify_costs(&context, 8, 1)
        .expect("batches of 1..=8 fit");
    assert_eq!(costs.len(), 8, "one cost per batch size: {costs:?}");
    assert!(
        costs.iter().all(|c| !c.is_zero()),
        "every batch was timed: {costs:?}"
    );

    // llama.cpp may round the context up; ask for a batch that overflows whatever it gave.
    let ctx_size = session.ctx_size() as usize;
    let long = vec![1; ctx_size - 4];
    let overflow = format!("needs {} cells, the session has {ctx_size}", ctx_size + 4);
    for (context, max_tokens, repetitions, needle) in [
        (&context[..], 9, 1, "batch size of 8"),
        (&context[..], 0, 1, "at least 1"),
        (&context[..], 4, 0, "at least 1"),
        (&[][..], 4, 1, "context is empty"),
        (&long[..], 8, 1, overflow.as_str()),
    ] {
        let err = session
            .measure_verify_costs(context, max_tokens, repetitions)
            .expect_err(needle)
            .to_string();
        assert!(err.contains(needle), "wanted `{needle}` in: {err}");
    }

    // The measurement leaves the session ready to generate.
    let prompt = target.tokenize_chat("Hi").expect("chat template");
    let request = Request::new(prompt, 4, SamplingParams::greedy());
    let outcome = session
        .generate(&request, &mut Cascade::empty(), &mut |_| {})
        .expect("generation after measuring");
    assert!(!outcome.tokens.is_empty(), "{outcome:?}");
}

fn scratch(name: &str) -> PathBuf {
    common::scratch_file("simulate", name)
}
