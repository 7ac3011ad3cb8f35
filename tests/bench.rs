//! `spechost bench` end to end on SmolLM2-135M (`spechost models fetch smollm2`) with the
//! `lookup` plugin (`scripts/build-plugins.sh`): a tiny workload, every output file written,
//! and every greedy output equal to plain decoding.

mod common;

use std::path::{Path, PathBuf};

/// Two requests, one of each format: repetitive text, so `lookup` finds drafts to verify.
const WORKLOAD: &str = concat!(
    r#"{"id": "repeat", "category": "edit", "messages": [{"role": "user", "content": "Copy this list exactly: red apple, green pear, red apple, green pear, red apple, green pear."}], "max_tokens": 64}"#,
    "\n",
    r#"{"prompt": "one two three four, one two three four, one two three four, one two"}"#,
    "\n",
);

#[test]
fn bench_writes_every_result_and_outputs_match_plain_decoding() {
    let _guard = common::exclusive();
    let model = common::smollm2_path();
    let workload = scratch("tiny.jsonl");
    std::fs::write(&workload, WORKLOAD).expect("write workload");
    let out_dir = scratch("results");
    let out = quick_bench(&[
        "--model",
        common::arg(&model),
        "--workload",
        common::arg(&workload),
        "--cascade",
        "lookup",
        "--policy",
        "fixed",
        "--draft-max",
        "4",
        "--max-tokens",
        "24",
        "--ctx-size",
        "1024",
        "--out",
        common::arg(&out_dir),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("| tiny | plain |") && stdout.contains("| tiny | lookup K=4 |"),
        "table rows missing from stdout:\n{stdout}"
    );
    assert!(!stdout.contains("DIFFERS"), "an output differed:\n{stdout}");

    for file in ["results.md", "results.csv"] {
        let text = std::fs::read_to_string(out_dir.join(file)).expect(file);
        assert!(
            text.contains("lookup K=4"),
            "{file} lacks the cascade row:\n{text}"
        );
    }
    let json = std::fs::read_to_string(out_dir.join("results.json")).expect("results.json");
    let report: serde_json::Value = serde_json::from_str(&json).expect("results.json parses");
    assert_eq!(report["outputs_match"], true, "{json}");
    let configurations = report["workloads"][0]["configurations"]
        .as_array()
        .expect("configurations");
    assert_eq!(configurations.len(), 2, "plain and lookup K=4: {json}");
    for configuration in configurations {
        assert_eq!(configuration["outputs_match"], true, "{configuration}");
        let generated = configuration["generated_tokens"].as_u64().expect("tokens");
        assert!(
            (2..=48).contains(&generated),
            "2 requests of at most 24 tokens: {configuration}"
        );
    }
    assert_eq!(configurations[1]["sources"][0]["name"], "lookup", "{json}");
    let curve = report["workloads"][0]["verify_cost"]["points"]
        .as_array()
        .expect("verify cost curve");
    assert_eq!(curve.len(), 5, "batches of 1..=K+1 tokens: {json}");
    // What the real verify decodes took against the curve: plain decoding's single tokens at
    // least, each size with a positive ratio.
    let observed = report["workloads"][0]["verify_cost"]["observed"]
        .as_array()
        .expect("observed verify costs");
    assert_eq!(observed[0]["tokens"], 1, "{json}");
    for size in observed {
        assert!(
            size["ratio"].as_f64() > Some(0.0) && size["decodes"].as_u64() > Some(0),
            "{size}"
        );
    }
    for configuration in configurations {
        assert!(
            configuration["ideal_speedup"].as_f64() > Some(0.0)
                && configuration["efficiency"].as_f64() > Some(0.0),
            "ideal speedup and efficiency: {configuration}"
        );
    }
    assert!(
        configurations[1]["drafted"].as_u64() > Some(0),
        "lookup drafted nothing on repetitive text: {json}"
    );

    for file in ["speedup.svg", "acceptance-by-position.svg"] {
        let svg = std::fs::read_to_string(out_dir.join(file)).expect(file);
        assert!(
            svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>") && svg.len() > 500,
            "{file} is not a drawn SVG: {svg}"
        );
    }
    let _ = std::fs::remove_dir_all(out_dir);
}

/// The pretrained Gemma echoes a chat request (the instruction and the function, again):
/// `bench` flags it and leaves it out of the figures. Prompted as `auto` chooses for a model
/// without a chat template, the same request's raw form is continued, and no output is flagged.
#[test]
fn a_base_model_gets_raw_prompts_and_an_echo_of_a_chat_prompt_is_flagged() {
    let _guard = common::exclusive();
    let model = common::gemma3_path();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/workloads");
    let first_edit = std::fs::read_to_string(dir.join("edit.jsonl"))
        .expect("examples/workloads/edit.jsonl")
        .lines()
        .next()
        .expect("a request")
        .to_owned();
    let workload = scratch("edit.jsonl");
    std::fs::write(&workload, first_edit + "\n").expect("write workload");
    for (style, expected_style, flagged) in [("chat", "chat", true), ("auto", "raw", false)] {
        let out_dir = scratch(&format!("results-{style}"));
        let out = quick_bench(&[
            "--model",
            common::arg(&model),
            "--workload",
            common::arg(&workload),
            "--prompt-style",
            style,
            "--cascade",
            "lookup",
            "--max-tokens",
            "48",
            "--ctx-size",
            "2048",
            "--out",
            common::arg(&out_dir),
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "bench --prompt-style {style} failed:\n{stderr}"
        );
        let results: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(out_dir.join("results.json")).expect("results.json"),
        )
        .expect("results.json is JSON");
        assert_eq!(results["prompt_style"], expected_style, "{results}");
        let degenerate = &results["workloads"][0]["degenerate"];
        let requests_csv = std::fs::read_to_string(out_dir.join("requests.csv")).expect("csv");
        if flagged {
            assert_eq!(degenerate[0]["degeneracy"], "echo", "{results}");
            // Left out of the figures, kept in requests.csv.
            assert_eq!(
                results["workloads"][0]["configurations"][0]["generated_tokens"],
                0
            );
            assert!(
                requests_csv.contains(",edit-textwrap-wrap,echo,"),
                "{requests_csv}"
            );
        } else {
            assert_eq!(degenerate.as_array().map(Vec::len), Some(0), "{results}");
            assert!(
                requests_csv.contains(",edit-textwrap-wrap,,"),
                "{requests_csv}"
            );
        }
        let _ = std::fs::remove_dir_all(out_dir);
    }
}

/// `bench --clients` (issue 24): the server started in this process, one and then two
/// concurrent clients streaming the workload over HTTP (its chat request to
/// /v1/chat/completions, its raw one to /v1/completions), plain decoding and `lookup`; every
/// answer equals plain decoding's at one client, and `run` is measured next to one-client
/// `serve`.
#[test]
fn serve_bench_drives_concurrent_clients_and_every_answer_matches_plain_decoding() {
    let _guard = common::exclusive();
    let out_dir = scratch("serve-results");
    let out = tiny_serve_bench(&out_dir, &["--max-tokens", "16"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bench --clients failed:\n{stdout}\n{stderr}"
    );
    for row in [
        "| plain | 1 | 1 |",
        "| plain | 2 | 2 |",
        "| lookup cost K≤4 | 1 | 1 |",
        "| lookup cost K≤4 | 2 | 2 |",
    ] {
        assert!(stdout.contains(row), "row `{row}` missing:\n{stdout}");
    }
    assert_eq!(
        stdout.matches(" | yes |").count(),
        4,
        "every level identical to plain decoding at one client:\n{stdout}"
    );
    assert!(
        stdout.contains("| configuration | run tok/s | serve tok/s (1 client) | serve / run |"),
        "the single-stream comparison:\n{stdout}"
    );
    let json =
        std::fs::read_to_string(out_dir.join("serve-results.json")).expect("serve-results.json");
    let report: serde_json::Value = serde_json::from_str(&json).expect("serve-results.json parses");
    assert_eq!(report["outputs_match"], true, "{json}");
    let rows = report["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 4, "2 configurations × 2 client counts: {json}");
    for row in rows {
        let figures = &row["figures"];
        let tokens = figures["completion_tokens"].as_u64().expect("tokens");
        let requests = figures["requests"].as_u64().expect("requests");
        assert!(
            (requests..=16 * requests).contains(&tokens)
                && figures["tokens_per_second"].as_f64() > Some(0.0),
            "at most 16 tokens per request, timed: {row}"
        );
        assert!(
            figures["time_to_first_token"]["p95_ms"].as_f64() > Some(0.0),
            "time to first token measured: {row}"
        );
    }
    for single in report["single_stream"]
        .as_array()
        .expect("single-stream rows")
    {
        assert!(
            single["run_tokens_per_second"].as_f64() > Some(0.0)
                && single["serve_tokens_per_second"].as_f64() > Some(0.0),
            "run and one-client serve side by side: {single}"
        );
    }
    let references = report["references"].as_array().expect("references");
    assert_eq!(references.len(), 2, "both requests were sent: {json}");
    let csv =
        std::fs::read_to_string(out_dir.join("serve-results.csv")).expect("serve-results.csv");
    assert_eq!(
        csv.lines().count(),
        5,
        "a header and a line per level:\n{csv}"
    );
    assert!(out_dir.join("serve-results.md").exists());
    let _ = std::fs::remove_dir_all(out_dir);
}

/// At a temperature every request samples at its own seed (`--seed` plus its index), in the
/// engine and over HTTP, so every output still equals plain decoding's and every answer its
/// reference; the reports say how requests were sampled.
#[test]
fn a_sampled_bench_matches_plain_decoding_at_each_requests_seed() {
    let _guard = common::exclusive();
    let out_dir = scratch("sampled-results");
    let out = tiny_serve_bench(
        &out_dir,
        &[
            "--max-tokens",
            "24",
            "--temp",
            "0.9",
            "--top-k",
            "40",
            "--seed",
            "3",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "sampled bench failed:\n{stdout}\n{stderr}"
    );
    let json =
        std::fs::read_to_string(out_dir.join("serve-results.json")).expect("serve-results.json");
    let report: serde_json::Value = serde_json::from_str(&json).expect("serve-results.json parses");
    assert_eq!(report["outputs_match"], true, "{json}");
    assert_eq!(
        report["sampling"], "temperature 0.9, top-k 40, seeds from 3",
        "{json}"
    );
    assert!(
        stdout.contains("temperature 0.9, top-k 40, seeds from 3"),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(out_dir);

    let bad = common::spechost(&[
        "bench",
        "--model",
        common::arg(&common::smollm2_path()),
        "--workload",
        common::arg(&scratch("serve.jsonl")),
        "--cascade",
        "lookup",
        "--temp=-1",
    ]);
    common::assert_fails_with(&bad, &["--temp", "-1"]);
}

#[test]
fn bad_workload_line_is_an_error_naming_file_and_line() {
    let workload = scratch("bad.jsonl");
    std::fs::write(&workload, "{\"prompt\": \"ok\"}\n{\"messages\": \"hi\"}\n").expect("write");
    let out = common::spechost(&[
        "bench",
        "--model",
        "/nonexistent/m.gguf",
        "--workload",
        common::arg(&workload),
        "--cascade",
        "lookup",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure: {stderr}");
    assert!(!stderr.contains("panicked"), "panicked: {stderr}");
    let needle = format!("{}:2: ", workload.display());
    assert!(
        stderr.contains(&needle) && stderr.contains("invalid type"),
        "wanted `{needle}` and the problem in: {stderr}"
    );
}

/// Issue 4's exactness check: the full cascade, in both modes, keeps greedy output identical to
/// plain decoding on every sample workload of `examples/workloads/` (the first two requests of
/// each, at most 48 tokens, to keep the suite short). `bench` fails on any difference.
#[test]
fn the_full_cascade_matches_plain_decoding_on_every_sample_workload() {
    let _guard = common::exclusive();
    // By its name below, so that `--draft-model auto` finds its default draft.
    common::smollm2_path();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/workloads");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("examples/workloads/")
        .map(|entry| entry.expect("readable entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "jsonl"))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "the sample workloads: {files:?}");
    let mut args: Vec<String> = ["bench", "--model", "smollm2"].map(str::to_owned).to_vec();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("readable workload");
        let head: String = text
            .lines()
            .take(2)
            .map(|line| format!("{line}\n"))
            .collect();
        let name = file.file_name().expect("a file name");
        let subset = scratch(&name.to_string_lossy());
        std::fs::write(&subset, head).expect("write the subset");
        args.extend(["--workload".to_owned(), common::arg(&subset).to_owned()]);
    }
    args.extend(
        [
            "--cascade",
            "lookup,suffix,draft",
            "--policy",
            "fixed",
            "--draft-max",
            "8",
            "--draft-model",
            "auto",
            "--cascade-mode",
            "first,scored",
            "--repeat",
            "1",
            "--warmup",
            "0",
            "--cost-repeat",
            "1",
            "--max-tokens",
            "48",
        ]
        .map(str::to_owned),
    );
    let out = common::spechost(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed:\n{stdout}\n{stderr}");
    assert_eq!(
        stdout.matches("| same |").count(),
        2 * files.len(),
        "both modes on every workload matched plain decoding:\n{stdout}"
    );
}

/// `bench --clients 1,2` on SmolLM2 and [`WORKLOAD`] with `lookup` at K≤4, one request per
/// client, results in `out_dir`, and `extra` flags.
fn tiny_serve_bench(out_dir: &Path, extra: &[&str]) -> std::process::Output {
    let model = common::smollm2_path();
    let workload = scratch("serve.jsonl");
    std::fs::write(&workload, WORKLOAD).expect("write workload");
    let args = [
        "--model",
        common::arg(&model),
        "--workload",
        common::arg(&workload),
        "--cascade",
        "lookup",
        "--draft-max",
        "4",
        "--clients",
        "1,2",
        "--requests-per-client",
        "1",
        "--ctx-size",
        "1024",
        "--out",
        common::arg(out_dir),
    ];
    quick_bench(&[&args[..], extra].concat())
}

/// `spechost bench` with `args`, one measured pass, no warm-up, and a one-point verify cost curve
/// measured once: quick, and enough to check what it writes.
fn quick_bench(args: &[&str]) -> std::process::Output {
    let quick = [
        "--repeat",
        "1",
        "--warmup",
        "0",
        "--cost-max-tokens",
        "1",
        "--cost-repeat",
        "1",
    ];
    let all: Vec<&str> = ["bench"]
        .iter()
        .chain(args)
        .chain(&quick)
        .copied()
        .collect();
    common::spechost(&all)
}

fn scratch(name: &str) -> PathBuf {
    common::scratch_file("bench", name)
}
