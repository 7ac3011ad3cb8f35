//! CPU placement on a real model: the target's compute threads (the engine thread and
//! llama.cpp's OpenMP workers) run only on the requested CPUs, the draft model's on the draft
//! CPUs and the plugin host's threads on the others, as read back from `/proc`; bad
//! `--cpus`/`--threads` are clear errors.
//!
//! Needs `SmolLM2-135M-Instruct.Q4_1.gguf` (`spechost models fetch smollm2`).

mod common;

use std::collections::BTreeSet;
use std::process::Output;

use spechost::cascade::Cascade;
use spechost::engine::{Request, SamplingParams, SessionParams};
use spechost::models::DefaultModel;
use spechost::placement::{
    CpuList, DRAFT_THREAD_NAME, PlacementRequest, Plan, ThreadCpus, Topology, current_thread_cpus,
    thread_cpus,
};

/// The JSON report of a successful `spechost run --json` (its last stderr line).
fn run_report(output: &Output) -> serde_json::Value {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "spechost run failed: {stderr}");
    serde_json::from_str(stderr.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("last stderr line is the JSON report ({e}): {stderr}"))
}

fn tids(threads: &[ThreadCpus]) -> BTreeSet<u32> {
    threads.iter().map(|t| t.tid).collect()
}

/// Name of the thread the pinning test runs on. A new thread starts with its creator's name
/// (Rust renames its named threads from inside, once they run), so every thread this test's
/// code starts carries it or `spechost-epoch`, and the test harness's threads, named after
/// their tests, are told apart.
const TEST_THREAD: &str = "placement-pin";

/// The threads of `after` that are not in `before` and were started by the pinning test.
fn started_between(before: &[ThreadCpus], after: &[ThreadCpus]) -> Vec<ThreadCpus> {
    let old = tids(before);
    after
        .iter()
        .filter(|t| !old.contains(&t.tid))
        .filter(|t| t.name == TEST_THREAD || t.name == "spechost-epoch")
        .cloned()
        .collect()
}

#[test]
fn compute_threads_run_on_the_pinned_cpus_and_the_plugin_host_on_the_rest() {
    let _exclusive = common::exclusive();
    // A thread of its own, so the pinning does not leak into the test harness's threads.
    let test = std::thread::Builder::new().name(TEST_THREAD.into());
    test.spawn(|| {
        let topology = Topology::read_host().expect("sysfs");
        let compute = CpuList::from_cpus(topology.allowed.first());
        let plan = Plan::new(
            &topology,
            &PlacementRequest {
                cpus: Some(compute.clone()),
                ..PlacementRequest::default()
            },
        )
        .expect("one allowed CPU is a valid plan");
        assert_eq!(plan.threads, 1, "one CPU, one core, one thread");
        let auxiliary = topology.allowed.difference(&compute);

        let at_start = thread_cpus().expect("task list");
        plan.pin_auxiliary().expect("pin to the auxiliary CPUs");
        let host = common::plugin_host();
        let after_host = thread_cpus().expect("task list");
        plan.pin_compute().expect("pin to the compute CPUs");
        assert_eq!(current_thread_cpus().expect("readable"), compute);

        let target = common::load(DefaultModel::SmolLm2);
        // Two threads on one CPU, which the plan would refuse, so that llama.cpp starts an
        // OpenMP worker whose CPUs can be checked. They wait for each other at every barrier,
        // so the start-up check of batches stays short too (a verify batch of 2 tokens).
        let mut session = target
            .session(&SessionParams {
                threads: 2,
                max_draft_len: 1,
                ..common::session_params()
            })
            .expect("session");
        // Two threads on one CPU wait for each other at every barrier: keep the work tiny.
        let prompt = target.tokenize_raw("Once upon a time");
        let outcome = session
            .generate(
                &Request::new(prompt, 2, SamplingParams::greedy()),
                &mut Cascade::empty(),
                &mut |_| {},
            )
            .expect("generates");
        assert!(outcome.stats.generated_tokens > 0, "nothing generated");
        let at_end = thread_cpus().expect("task list");

        let host_threads = started_between(&at_start, &after_host);
        assert!(
            !host_threads.is_empty(),
            "the plugin host started its ticker: {after_host:?}"
        );
        let expected_auxiliary = if auxiliary.is_empty() {
            compute.clone()
        } else {
            auxiliary.clone()
        };
        for thread in &host_threads {
            assert_eq!(
                thread.cpus, expected_auxiliary,
                "plugin host thread {thread:?} is off the compute CPUs"
            );
        }
        let engine_threads = started_between(&after_host, &at_end);
        assert!(
            !engine_threads.is_empty(),
            "llama.cpp started no OpenMP worker for 2 threads: {at_end:?}"
        );
        for thread in &engine_threads {
            assert_eq!(
                thread.cpus, compute,
                "compute thread {thread:?} escaped the pinned CPUs"
            );
        }
        drop(host);
    })
    .expect("test thread starts")
    .join()
    .expect("placement test thread");
}

#[test]
fn run_reports_its_threads_on_the_requested_cpus() {
    let topology = Topology::read_host().expect("sysfs");
    let compute = CpuList::from_cpus(topology.allowed.first());
    let model = DefaultModel::SmolLm2.path(&spechost::config::cache_dir());
    let output = common::spechost(&[
        "run",
        "--model",
        model.to_str().expect("utf-8 path"),
        "--cascade",
        "none",
        "--max-tokens",
        "4",
        "--prompt",
        "hi",
        "--cpus",
        &compute.to_string(),
        "--json",
    ]);
    let json = run_report(&output);
    let placement = &json["placement"];
    assert_eq!(placement["plan"]["compute_cpus"], compute.to_string());
    assert_eq!(placement["plan"]["threads"], 1);
    let threads = placement["threads"].as_array().expect("thread list");
    let auxiliary = topology.allowed.difference(&compute);
    for thread in threads {
        let expected = if thread["name"] == "spechost-epoch" && !auxiliary.is_empty() {
            auxiliary.to_string()
        } else {
            compute.to_string()
        };
        assert_eq!(
            thread["cpus"], expected,
            "thread {thread} of `spechost run --cpus {compute}`"
        );
    }
}

#[test]
fn run_puts_the_draft_model_on_the_draft_cpus() {
    let topology = Topology::read_host().expect("sysfs");
    // The first CPU computes the target, the last the draft model (the same on one CPU).
    let compute = CpuList::from_cpus(topology.allowed.first());
    let draft = CpuList::from_cpus(topology.allowed.iter().last());
    let output = common::spechost(&[
        "run",
        "--model",
        "smollm2",
        "--draft-model",
        "auto",
        "--cascade",
        "draft",
        // Every round drafts (the default policy may find plain decoding faster).
        "--policy",
        "fixed",
        "--max-tokens",
        "8",
        "--prompt",
        "Count from one to ten.",
        "--cpus",
        &compute.to_string(),
        "--draft-cpus",
        &draft.to_string(),
        "--json",
    ]);
    let json = run_report(&output);
    assert_eq!(json["placement"]["plan"]["draft_cpus"], draft.to_string());
    assert!(
        json["stats"]["drafted"].as_u64().unwrap_or(0) > 0,
        "the draft model drafted: {json}"
    );
    let threads = json["placement"]["threads"]
        .as_array()
        .expect("thread list");
    let draft_threads: Vec<&serde_json::Value> = threads
        .iter()
        .filter(|thread| thread["name"] == DRAFT_THREAD_NAME)
        .collect();
    assert_eq!(
        draft_threads.len(),
        1,
        "one draft context, one worker: {threads:?}"
    );
    assert_eq!(draft_threads[0]["cpus"], draft.to_string());
}

#[test]
fn bad_cpu_lists_are_errors_naming_the_fix() {
    let topology = Topology::read_host().expect("sysfs");
    let past_last = topology.online.iter().last().expect("a CPU") + 1;
    let first = topology.online.first().expect("a CPU").to_string();
    let absent = past_last.to_string();
    let online = topology.online.to_string();
    for command in ["run", "info"] {
        let prompt: &[&str] = if command == "run" {
            &["--prompt", "hi"]
        } else {
            &[]
        };
        let with = |flags: &[&str]| {
            let mut args = vec![command];
            args.extend_from_slice(flags);
            args.extend_from_slice(prompt);
            common::spechost(&args)
        };
        common::assert_fails_with(
            &with(&["--cpus", &absent]),
            &[&format!("--cpus {absent}"), "do not exist", &online],
        );
        common::assert_fails_with(
            &with(&["--cpus", ""]),
            &["--cpus", "it is empty", "0-47,96-143"],
        );
        common::assert_fails_with(
            &with(&["--threads", "4", "--cpus", &first]),
            &["--threads 4", "give --threads 1 or fewer"],
        );
        common::assert_fails_with(
            &with(&["--draft-cpus", &absent]),
            &["--draft-cpus", "do not exist"],
        );
        common::assert_fails_with(
            &with(&["--cpus", &first, "--numa", "distribute"]),
            &["--numa distribute", "--numa numactl"],
        );
    }
}

#[test]
fn info_json_plans_one_thread_per_physical_core() {
    let topology = Topology::read_host().expect("sysfs");
    let output = common::spechost(&["info", "--json"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON on stdout");
    assert_eq!(
        json["plan"]["threads"],
        topology.cores_within(&topology.allowed),
        "{json}"
    );
    assert_eq!(json["topology"]["online"], topology.online.to_string());
    assert!(
        json["llama_cpp"]["devices"]
            .as_array()
            .is_some_and(|d| d.iter().any(|d| d["backend"] == "CPU")),
        "{json}"
    );
    let text = common::spechost(&["info"]);
    let text = String::from_utf8_lossy(&text.stdout);
    for needle in [
        "sockets",
        "NUMA",
        "THP",
        "plan",
        "compute CPUs",
        "llama.cpp",
    ] {
        assert!(text.contains(needle), "`{needle}` not in:\n{text}");
    }
}
