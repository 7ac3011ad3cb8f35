//! `spechost serve` against what goes wrong (`docs/security.md`, Server): requests it cannot
//! serve answered with OpenAI errors, a full queue and clients that leave, hostile plugins next
//! to healthy requests, fuzzed request bodies, and overload (`bench/overload.py`).
//!
//! Each test starts its own server and kills it at the end (`common::server`).

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::exclusive;
use common::server::*;
use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, TestRunner};
use serde_json::{Value, json};

#[test]
fn refuses_what_it_cannot_do_with_openai_errors() {
    let _guard = exclusive();
    let server = Server::start(&["--max-body-bytes", "4096", "--max-tokens-limit", "512"]);
    assert_eq!(get(&server, "/health", None).body["status"], "ok");
    let models = get(&server, "/v1/models", None);
    assert_eq!(models.body["data"][0]["id"], "smollm2", "{}", models.body);

    let long_text = "word ".repeat(2000);
    let long_prompt = vec![5u32; 1600];
    for (path, body, status, needle) in [
        (
            "/v1/chat/completions",
            chat_body("hi", 8, json!({"model": "gpt-4"})),
            404,
            "serves `smollm2`",
        ),
        (
            "/v1/chat/completions",
            chat_body("hi", 100_000, json!({})),
            400,
            "--max-tokens-limit",
        ),
        (
            "/v1/chat/completions",
            chat_body(&long_text, 8, json!({})),
            413,
            "--max-body-bytes",
        ),
        (
            "/v1/completions",
            json!({"prompt": long_prompt, "max_tokens": 512}),
            400,
            "exceed the context",
        ),
        (
            "/v1/chat/completions",
            chat_body("hi", 8, json!({"n": 100})),
            400,
            "n must be between 1 and 16",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": "hi"}),
            400,
            "messages",
        ),
        (
            "/v1/completions",
            json!({"prompt": [999_999_999]}),
            400,
            "outside the vocabulary",
        ),
    ] {
        let answer = post(&server, path, &body);
        let error = &answer.body["error"];
        assert_eq!(answer.status, status, "{path}: {}", answer.body);
        let message = error["message"].as_str().unwrap_or_default();
        assert!(message.contains(needle), "`{needle}` not in {message}");
        assert!(
            error["type"].is_string(),
            "not an OpenAI error: {}",
            answer.body
        );
    }
    let unknown = get(&server, "/v1/nothing", None);
    assert_eq!(unknown.status, 404);

    let ok = post(
        &server,
        "/v1/chat/completions",
        &chat_body("Say hi.", 8, json!({})),
    );
    chat_text(&ok);
    let page = metrics(&server);
    for name in [
        "spechost_requests_total{endpoint=\"chat_completions\",outcome=\"completed\"}",
        "spechost_requests_total{endpoint=\"chat_completions\",outcome=\"invalid\"}",
        "spechost_generated_tokens_total",
        "spechost_queue_slots",
    ] {
        assert!(
            sample(&page, name) >= 1.0,
            "`{name}` missing or 0 in:\n{page}"
        );
    }
    assert!(page.contains("# TYPE spechost_source_accepted_at_position_total counter"));
}

#[test]
fn a_full_queue_answers_429_and_a_client_that_leaves_is_cancelled() {
    let _guard = exclusive();
    let server = Server::start(&["--parallel", "1", "--max-queue", "1"]);
    let long =
        json!({"prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "max_tokens": 1500, "temperature": 0});

    // A long streamed request holds the only slot; stop reading it once it runs.
    let mut body = long.clone();
    body["stream"] = json!(true);
    let response = send(agent().post(server.url("/v1/completions")), &body).expect("stream starts");
    assert_eq!(response.status().as_u16(), 200);
    let mut running = BufReader::new(response.into_body().into_reader());
    let mut first = String::new();
    while !first.starts_with("data: ") {
        first.clear();
        running.read_line(&mut first).expect("first chunk");
    }

    // A second request waits in the queue; its client gives up after a while.
    let waiting_url = server.url("/v1/completions");
    let waiting = std::thread::spawn(move || {
        let impatient: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(2)))
            .build()
            .into();
        send(
            impatient.post(waiting_url),
            &json!({"prompt": "Hello", "max_tokens": 8}),
        )
        .is_err()
    });
    wait_for(&server, "the second request to queue", || {
        sample(&metrics(&server), "spechost_queue_waiting") == 1.0
    });

    let refused = post(
        &server,
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 8}),
    );
    assert_eq!(refused.status, 429, "{}", refused.body);
    assert_eq!(refused.body["error"]["code"], "queue_full");
    let retry_after: u64 = refused
        .retry_after
        .as_deref()
        .and_then(|v| v.parse().ok())
        .expect("Retry-After in seconds");
    assert!(retry_after >= 1, "Retry-After {retry_after}");

    assert!(
        waiting.join().expect("client thread"),
        "the impatient client got an answer"
    );
    drop(running);
    let cancelled = "spechost_requests_total{endpoint=\"completions\",outcome=\"cancelled\"}";
    wait_for(&server, "both requests to be cancelled", || {
        sample(&metrics(&server), cancelled) == 2.0
    });
    let page = metrics(&server);
    assert_eq!(sample(&page, "spechost_queue_running"), 0.0, "{page}");
    assert!(
        sample(&page, "spechost_generated_tokens_total") < 1500.0,
        "the abandoned stream was generated to the end:\n{page}"
    );
    let after = post(
        &server,
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 4}),
    );
    assert_eq!(after.status, 200, "{}", after.body);
}

/// Drafters from `tests/hostile/` that open cleanly, then misbehave in `propose`: a panic every
/// third call, an endless loop, unbounded allocation, proposals of 10 000 and of 1 000 000
/// tokens, ids outside the vocabulary, confidences outside [0, 1], endless clock reads.
const HOSTILE_DRAFTERS: [&str; 8] = [
    "hostile_panic",
    "hostile_loop",
    "hostile_alloc",
    "hostile_flood",
    "hostile_flood_million",
    "hostile_oov",
    "hostile_badconf",
    "hostile_clock",
];
/// A policy from `tests/hostile/` that panics in every decision after its first.
const HOSTILE_POLICY: &str = "hostile_policy_panic";

/// One request of the hostile-plugin test: which prompt, its `speculative` block, and the
/// hostile plugin it uses, if any (those are streamed, so faults land mid-stream).
struct Planned {
    prompt: usize,
    speculative: Value,
    hostile: Option<&'static str>,
}

/// Each hostile drafter leads the cascade of one request, the hostile policy (the server's
/// default) chooses the draft lengths of another, and well-behaved requests (lookup, suffix,
/// plain decoding) come between them.
fn hostile_plan(prompts: usize) -> Vec<Planned> {
    let well_behaved = [
        json!({"cascade": "lookup", "policy": "fixed", "draft_max": 8}),
        json!({"cascade": "suffix,lookup", "policy": "window", "draft_max": 8}),
        json!({"cascade": "none"}),
    ];
    let mut plan = Vec::new();
    for (index, &stem) in HOSTILE_DRAFTERS.iter().enumerate() {
        plan.push(Planned {
            prompt: index % prompts,
            speculative: json!({"cascade": format!("{stem},lookup"), "policy": "fixed", "draft_max": 8}),
            hostile: Some(stem),
        });
        plan.push(Planned {
            prompt: (index + 1) % prompts,
            speculative: well_behaved[index % well_behaved.len()].clone(),
            hostile: None,
        });
    }
    plan.push(Planned {
        prompt: 0,
        speculative: json!({"cascade": "lookup", "draft_max": 8}),
        hostile: Some(HOSTILE_POLICY),
    });
    plan
}

/// What one planned request answered: its text and its `speculative` block.
fn run_planned(base: &str, prompt: &str, planned: &Planned) -> (String, Value) {
    let body = chat_body(prompt, 48, json!({"speculative": planned.speculative}));
    if planned.hostile.is_none() {
        let whole = answer(send(
            agent().post(format!("{base}/v1/chat/completions")),
            &body,
        ));
        return (chat_text(&whole), whole.body["speculative"].clone());
    }
    let streamed = stream_at(base, "/v1/chat/completions", &body, |_| {});
    assert_eq!(streamed.status, 200, "{:?}", planned.hostile);
    assert!(
        streamed.done && streamed.errors().is_empty(),
        "{:?}: {:?}",
        planned.hostile,
        streamed.chunks
    );
    (streamed.text(), streamed.last()["speculative"].clone())
}

#[test]
fn hostile_plugins_of_some_requests_change_no_output_and_are_counted() {
    let _guard = exclusive();
    let mut cascade = vec!["lookup".to_owned()];
    cascade.extend(
        HOSTILE_DRAFTERS
            .iter()
            .map(|stem| built(stem).display().to_string()),
    );
    let policy = built(HOSTILE_POLICY).display().to_string();
    let server = Server::start(&[
        "--parallel",
        "2",
        "--cascade",
        &cascade.join(","),
        "--policy",
        &policy,
    ]);
    let prompts: Vec<String> = ["edit-shlex-split", "extract-protocols-0", "HumanEval-2"]
        .iter()
        .map(|id| fixture(id))
        .collect();
    let plain: Vec<String> = prompts
        .iter()
        .map(|prompt| {
            chat_text(&post(
                &server,
                "/v1/chat/completions",
                &chat_body(prompt, 48, json!({"speculative": {"cascade": "none"}})),
            ))
        })
        .collect();

    // Every request at once: two slots run them, a hostile one next to a well-behaved one.
    let plan = hostile_plan(prompts.len());
    let answers: Vec<(String, Value)> = std::thread::scope(|scope| {
        let running: Vec<_> = plan
            .iter()
            .map(|planned| {
                let (base, prompt) = (&server.base, &prompts[planned.prompt]);
                scope.spawn(move || run_planned(base, prompt, planned))
            })
            .collect();
        running
            .into_iter()
            .map(|request| request.join().expect("client thread"))
            .collect()
    });

    for (planned, (text, speculative)) in plan.iter().zip(&answers) {
        assert_eq!(
            text, &plain[planned.prompt],
            "{}: differs from plain decoding",
            planned.speculative
        );
        let Some(stem) = planned.hostile.filter(|stem| *stem != HOSTILE_POLICY) else {
            continue;
        };
        let faults = speculative["sources"]
            .as_array()
            .and_then(|sources| sources.iter().find(|s| s["name"] == stem))
            .and_then(|source| source["faults"].as_u64());
        assert!(
            faults >= Some(1),
            "{stem}: no fault reported in {speculative}"
        );
    }
    let page = metrics(&server);
    for stem in HOSTILE_DRAFTERS.iter().chain([&HOSTILE_POLICY]) {
        for family in ["plugin_faults_total", "plugin_quarantines_total"] {
            let name = format!("spechost_{family}{{plugin=\"{stem}\"}}");
            assert!(
                sample(&page, &name) >= 1.0,
                "`{name}` missing or 0 in:\n{page}"
            );
        }
    }
    for stem in ["lookup", "suffix"] {
        let name = format!("spechost_plugin_faults_total{{plugin=\"{stem}\"}}");
        assert_eq!(
            sample(&page, &name),
            0.0,
            "a well-behaved plugin faulted:\n{page}"
        );
    }
    let completed = "spechost_requests_total{endpoint=\"chat_completions\",outcome=\"completed\"}";
    assert_eq!(
        sample(&page, completed),
        (plan.len() + plain.len()) as f64,
        "{page}"
    );
    assert_eq!(get(&server, "/health", None).body["status"], "ok");
    assert!(
        !server.log().contains("generation panicked"),
        "{}",
        server.log()
    );
}

#[test]
fn a_drafter_panicking_on_other_requests_responses_changes_no_output() {
    let _guard = exclusive();
    let stem = "hostile_observe_panic";
    let hostile = built(stem).display().to_string();
    let server = Server::start(&["--cascade", &format!("lookup,{hostile}")]);
    let prompts: Vec<String> = ["extract-protocols-0", "edit-shlex-split"]
        .iter()
        .map(|id| fixture(id))
        .collect();
    let ask = |prompt: &str, cascade: &str| {
        let answer = post(
            &server,
            "/v1/chat/completions",
            &chat_body(
                prompt,
                32,
                json!({"speculative": {"cascade": cascade, "policy": "fixed", "draft_max": 4}}),
            ),
        );
        assert_eq!(answer.status, 200, "{}", answer.body);
        chat_text(&answer)
    };
    // Each answer is handed to the hostile drafter's instance before its next request: it
    // panics there, is re-created, and drafts on.
    for prompt in &prompts {
        let plain = ask(prompt, "none");
        assert_eq!(ask(prompt, &format!("{stem},lookup")), plain);
        assert_eq!(ask(prompt, &format!("{stem},lookup")), plain);
    }
    let page = metrics(&server);
    let faults = sample(
        &page,
        &format!("spechost_plugin_faults_total{{plugin=\"{stem}\"}}"),
    );
    assert!(
        faults >= 2.0,
        "faults while taking responses not counted:\n{page}"
    );
    assert!(
        server.log().contains("cannot take a shared response"),
        "{}",
        server.log()
    );
    assert_eq!(get(&server, "/health", None).body["status"], "ok");
}

/// Bodies the fuzz test posts (one server for all of them); `PROPTEST_CASES` overrides it.
const FUZZ_CASES: u32 = 200;
/// `--max-body-bytes` of the fuzzed server: huge strings straddle it.
const FUZZ_BODY_LIMIT: usize = 32 * 1024;
/// `--max-tokens-limit` of the fuzzed server, so that the few valid bodies finish at once.
const FUZZ_MAX_TOKENS: &str = "8";
/// Keys the two generation endpoints read, top level and in `speculative`.
const API_KEYS: &[&str] = &[
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "n",
    "stream",
    "stream_options",
    "logprobs",
    "top_logprobs",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "tools",
    "response_format",
    "grammar",
    "json_schema",
    "echo",
    "suffix",
    "best_of",
    "speculative",
    "cascade",
    "policy",
    "draft_max",
    "mode",
    "role",
    "content",
    "type",
    "text",
    "include_usage",
];

/// Short text, any Unicode.
fn fuzz_text() -> impl Strategy<Value = String> {
    "\\PC{0,24}"
}

/// A key the API reads, or any other.
fn fuzz_key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(API_KEYS).prop_map(str::to_owned),
        1 => fuzz_text(),
    ]
}

/// Any JSON value: scalars of every type (extreme numbers included), arrays, objects.
fn fuzz_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("JSON has no NaN or infinity", |f| {
            serde_json::Number::from_f64(f).map(Value::Number)
        }),
        fuzz_text().prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(fuzz_key(), inner, 0..6)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

/// A body close to a valid one: known keys with plausible values, some out of range.
fn fuzz_plausible() -> impl Strategy<Value = Value> {
    let message = (
        prop::sample::select(vec!["system", "developer", "user", "assistant", "tool", ""]),
        prop_oneof![
            fuzz_text().prop_map(Value::from),
            Just(Value::Null),
            prop::collection::vec(
                (prop::sample::select(vec!["text", "image_url"]), fuzz_text())
                    .prop_map(|(kind, text)| json!({"type": kind, "text": text})),
                0..3
            )
            .prop_map(Value::Array),
        ],
    )
        .prop_map(|(role, content)| json!({"role": role, "content": content}));
    let prompt = prop_oneof![
        fuzz_text().prop_map(Value::from),
        prop::collection::vec(0u32..60_000, 0..12).prop_map(|ids| json!(ids)),
        prop::collection::vec(fuzz_text(), 0..3).prop_map(|texts| json!(texts)),
    ];
    let speculative = (
        prop::sample::select(vec!["lookup", "suffix,lookup", "none", "nope", "./x.wasm", ""]),
        0usize..40,
        prop::sample::select(vec!["first", "scored", "best"]),
        prop::sample::select(vec!["fixed", "window,raise=2", "cost", "nope,k"]),
    )
        .prop_map(|(cascade, max_draft_len, mode, policy)| {
            json!({"cascade": cascade, "draft_max": max_draft_len, "mode": mode, "policy": policy})
        });
    (
        prop::collection::vec(message, 0..4),
        prompt,
        prop::option::of(0usize..12),
        prop::option::of(-1.0f64..3.0),
        prop::option::of(prop::collection::vec(fuzz_text(), 0..20)),
        any::<bool>(),
        prop::option::of(speculative),
    )
        .prop_map(
            |(messages, prompt, max_tokens, temperature, stop, stream, speculative)| {
                let mut body = json!({"messages": messages, "prompt": prompt, "stream": stream});
                for (key, value) in [
                    ("max_tokens", max_tokens.map(Value::from)),
                    ("temperature", temperature.map(Value::from)),
                    ("stop", stop.map(Value::from)),
                    ("speculative", speculative),
                ] {
                    if let Some(value) = value {
                        body[key] = value;
                    }
                }
                body
            },
        )
}

/// A body of two huge strings (in `messages` and `prompt`), from 2 KiB under the body limit to
/// 4 KiB over it. Far over it, the server answers 413 and closes the connection while the client
/// may still be sending, as most servers do; that is not what is tested here.
fn fuzz_huge() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::sample::select(vec!["word ", "é", "🦀", "\"", "\\", "\u{0}"]),
        (FUZZ_BODY_LIMIT - 2048)..(FUZZ_BODY_LIMIT + 4096),
    )
        .prop_map(|(piece, body_bytes)| {
            let escaped = Value::from(piece).to_string().len() - 2;
            let text = piece.repeat(body_bytes / 2 / escaped);
            json!({"messages": [{"role": "user", "content": text}], "prompt": text})
                .to_string()
                .into_bytes()
        })
}

/// Arrays or objects nested up to far past serde_json's recursion limit.
fn fuzz_deep() -> impl Strategy<Value = Vec<u8>> {
    (1usize..4000, any::<bool>(), any::<bool>()).prop_map(|(depth, objects, in_messages)| {
        let (open, close) = if objects {
            ("{\"a\":", "}")
        } else {
            ("[", "]")
        };
        let nested = format!("{}1{}", open.repeat(depth), close.repeat(depth));
        if in_messages {
            format!("{{\"messages\":{nested},\"prompt\":{nested}}}").into_bytes()
        } else {
            nested.into_bytes()
        }
    })
}

/// Not JSON: random bytes (invalid UTF-8 included), or a valid-looking body cut short.
fn fuzz_not_json() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256),
        (fuzz_plausible(), any::<prop::sample::Index>()).prop_map(|(body, cut)| {
            let bytes = body.to_string().into_bytes();
            bytes[..cut.index(bytes.len())].to_vec()
        }),
    ]
}

/// An endpoint and a body for it.
fn fuzz_request() -> impl Strategy<Value = (&'static str, Vec<u8>)> {
    let body = prop_oneof![
        3 => fuzz_json().prop_map(|value| value.to_string().into_bytes()),
        3 => prop::collection::btree_map(fuzz_key(), fuzz_json(), 1..10)
            .prop_map(|map| Value::Object(map.into_iter().collect()).to_string().into_bytes()),
        3 => fuzz_plausible().prop_map(|value| value.to_string().into_bytes()),
        1 => fuzz_huge(),
        1 => fuzz_deep(),
        1 => fuzz_not_json(),
    ];
    (
        prop::sample::select(vec!["/v1/chat/completions", "/v1/completions"]),
        body,
    )
}

/// Checks one answer to a fuzzed body: a 200 that completes (a whole JSON answer, or a stream
/// that ends with `[DONE]` and no error), or a 4xx with an OpenAI-style error.
fn check_fuzz_answer(
    result: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
) -> Result<(), TestCaseError> {
    let mut response = result.map_err(|e| TestCaseError::fail(format!("no answer: {e}")))?;
    let status = response.status().as_u16();
    let streamed = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let text = response
        .body_mut()
        .read_to_string()
        .map_err(|e| TestCaseError::fail(format!("status {status}: body not read: {e}")))?;
    if status == 200 && streamed {
        let mut done = false;
        for data in text.lines().filter_map(|line| line.strip_prefix("data: ")) {
            done = data == "[DONE]";
            if !done {
                let chunk: Value = serde_json::from_str(data)
                    .map_err(|e| TestCaseError::fail(format!("chunk not JSON ({e}): {data}")))?;
                prop_assert!(chunk.get("error").is_none(), "error in a stream: {}", chunk);
            }
        }
        prop_assert!(done, "stream without [DONE]: {}", text);
        return Ok(());
    }
    let body: Value = serde_json::from_str(&text)
        .map_err(|e| TestCaseError::fail(format!("status {status}: not JSON ({e}): {text}")))?;
    if status == 200 {
        prop_assert!(
            body["choices"][0].is_object(),
            "200 without a choice: {}",
            body
        );
        return Ok(());
    }
    prop_assert!((400..500).contains(&status), "status {}: {}", status, body);
    prop_assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
            && body["error"]["type"].is_string(),
        "status {}: not an OpenAI error: {}",
        status,
        body
    );
    Ok(())
}

#[test]
fn fuzzed_request_bodies_get_4xx_errors_and_never_break_the_server() {
    let _guard = exclusive();
    let limit = FUZZ_BODY_LIMIT.to_string();
    let server = Server::start(&[
        "--max-body-bytes",
        &limit,
        "--max-tokens-limit",
        FUZZ_MAX_TOKENS,
    ]);
    assert!(
        server.base.starts_with("http://127.0.0.1:"),
        "without --host the server must listen on loopback only: {}",
        server.base
    );
    let client: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(PATIENCE))
        .build()
        .into();
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(FUZZ_CASES);
    let mut runner = TestRunner::new(ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/server.proptest-regressions"
        )))),
        ..ProptestConfig::default()
    });
    let outcome = runner.run(&fuzz_request(), |(path, body)| {
        let sent = client
            .post(server.url(path))
            .header("Content-Type", "application/json")
            .send(&body[..]);
        check_fuzz_answer(sent)
    });
    if let Err(failure) = outcome {
        panic!("{failure}\nserver log:\n{}", server.log());
    }
    assert_eq!(get(&server, "/health", None).body["status"], "ok");
    let page = metrics(&server);
    assert!(
        sample(
            &page,
            "spechost_requests_total{endpoint=\"chat_completions\",outcome=\"invalid\"}"
        ) >= 1.0,
        "no body was refused as invalid, so the bodies were not fuzzed:\n{page}"
    );
}

/// How long the overload test offers load.
const OVERLOAD_SECONDS: &str = "10";
/// Idle connections and slowloris connections held open during the overload test, each.
const OVERLOAD_HELD: &str = "16";
/// The overload server's `--header-timeout`: the held connections must be closed by then.
const OVERLOAD_HEADER_TIMEOUT: &str = "3";
/// A generous bound on the server's memory under overload (SmolLM2 and one slot take a few
/// hundred MiB): growing with the offered load would cross it.
const OVERLOAD_MAX_RSS_BYTES: f64 = 2.0 * (1u64 << 30) as f64;

#[test]
fn overload_is_refused_with_429_without_growing_memory_and_outputs_stay_right() {
    let _guard = exclusive();
    let python = std::env::var("SPECHOST_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let server = Server::start(&[
        "--parallel",
        "1",
        "--max-queue",
        "4",
        "--header-timeout",
        OVERLOAD_HEADER_TIMEOUT,
    ]);
    let dir = scratch("overload");
    let report = dir.join("overload.json");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/overload.py");
    let output = Command::new(&python)
        .arg(&script)
        .args(["--base-url", &server.base, "--seconds", OVERLOAD_SECONDS])
        .args(["--idle", OVERLOAD_HELD, "--slowloris", OVERLOAD_HELD])
        .args(["--pid", &server.child.id().to_string()])
        .arg("--json")
        .arg(&report)
        .output()
        .unwrap_or_else(|e| {
            panic!("`{python}` does not start ({e}); set SPECHOST_PYTHON to a Python 3")
        });
    assert!(
        output.status.success(),
        "{} failed:\nstdout: {}\nstderr: {}\nserver log:\n{}",
        script.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
        server.log()
    );
    let text = std::fs::read_to_string(&report).expect("overload.py wrote its JSON");
    let result: Value = serde_json::from_str(&text).expect("overload.py JSON");
    let count = |key: &str| result["status_counts"][key].as_u64().unwrap_or(0);
    assert!(count("429") >= 1, "4x capacity got no 429: {result}");
    assert!(
        count("200") >= 1,
        "nothing completed under overload: {result}"
    );
    for key in ["503", "other", "error"] {
        assert_eq!(count(key), 0, "`{key}` answers under overload: {result}");
    }
    assert_eq!(
        result["wrong_outputs"], 0,
        "a completed output differs from plain decoding: {result}"
    );
    let rss_max = result["rss_max_bytes"].as_f64().unwrap_or(0.0);
    assert!(
        rss_max > 0.0 && rss_max < OVERLOAD_MAX_RSS_BYTES,
        "server RSS peaked at {rss_max} bytes: {result}"
    );
    for kind in ["idle", "slowloris"] {
        assert_eq!(
            result[format!("{kind}_closed_by_server")],
            result[kind],
            "{kind} connections outlived --header-timeout {OVERLOAD_HEADER_TIMEOUT} s during a {OVERLOAD_SECONDS} s load: {result}"
        );
    }
    assert_eq!(get(&server, "/health", None).body["status"], "ok");
    let _ = std::fs::remove_dir_all(&dir);
}
