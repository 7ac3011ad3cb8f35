//! `spechost serve` on loopback with the default model (SmolLM2-135M), driven by a real HTTP
//! client: OpenAI-compatible answers, greedy output identical to `spechost run` and to plain
//! decoding, streaming, per-request cascades, the bounded queue, client disconnects, admin
//! authentication, and hot swaps of the cascade and of plugin files while requests stream.
//! Reliability and security (`docs/security.md`, Server): hostile plugins next to healthy
//! requests, plugin paths confined to the plugin directories, fuzzed request bodies, overload
//! (`bench/overload.py`), and plugin state that survives a kill -9 while it is saved.
//!
//! Each test starts its own server (`spechost serve --port 0`, address read from stdout) and
//! kills it at the end. Needs the model (`spechost models fetch smollm2`) and the plugins
//! (`scripts/build-plugins.sh`).

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::exclusive;
use common::server::*;
use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, TestRunner};
use serde_json::{Value, json};

#[test]
fn greedy_chat_completion_is_identical_to_spechost_run() {
    let _guard = exclusive();
    let prompt = fixture("edit-shlex-split");
    let run = Command::new(env!("CARGO_BIN_EXE_spechost"))
        .args([
            "run",
            "--model",
            "smollm2",
            "--cascade",
            "none",
            "--ctx-size",
            CTX_SIZE,
        ])
        .args(["--max-tokens", "64", "--prompt", &prompt])
        .output()
        .expect("spechost run starts");
    assert!(
        run.status.success(),
        "spechost run failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let expected = String::from_utf8(run.stdout).expect("run prints UTF-8");

    let server = Server::start(&["--cascade", "lookup"]);
    let answer = post(
        &server,
        "/v1/chat/completions",
        &chat_body(&prompt, 64, json!({})),
    );
    let text = chat_text(&answer);
    assert_eq!(text, expected, "server and `spechost run` differ");
    let body = &answer.body;
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "smollm2");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    let usage = &body["usage"];
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(
            usage["prompt_tokens"].as_u64().unwrap_or(0)
                + usage["completion_tokens"].as_u64().unwrap_or(0)
        ),
        "usage: {usage}"
    );
    let speculative = &body["speculative"];
    assert_eq!(speculative["cascade"], json!(["lookup"]), "{speculative}");
    assert_eq!(speculative["sources"][0]["name"], "lookup");
    assert!(
        speculative["accepted"].as_u64() > Some(0),
        "lookup had nothing accepted on an edit prompt, so the identity check proved nothing: {speculative}"
    );
    for key in ["acceptance_percent", "mean_accepted_length", "rounds_won"] {
        assert!(
            speculative["sources"][0].get(key).is_some(),
            "no `{key}` in {speculative}"
        );
    }
}

#[test]
fn streams_chat_and_completions_as_server_sent_events() {
    let _guard = exclusive();
    let server = Server::start(&["--cascade", "lookup"]);
    let prompt = fixture("HumanEval-2");
    let whole = chat_text(&post(
        &server,
        "/v1/chat/completions",
        &chat_body(&prompt, 48, json!({})),
    ));

    let streamed = stream(
        &server,
        "/v1/chat/completions",
        &chat_body(
            &prompt,
            48,
            json!({"stream_options": {"include_usage": true}}),
        ),
    );
    assert_eq!(streamed.status, 200);
    assert!(streamed.done, "no [DONE] after {:?}", streamed.chunks);
    assert!(
        streamed.errors().is_empty(),
        "errors: {:?}",
        streamed.errors()
    );
    assert_eq!(streamed.text(), whole, "streamed and whole answers differ");
    let first = &streamed.chunks[0];
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let last = streamed.last();
    assert!(
        last["speculative"]["sources"].is_array(),
        "last chunk: {last}"
    );
    let usage = streamed.chunks.last().expect("a usage chunk");
    assert_eq!(usage["choices"], json!([]), "usage chunk: {usage}");
    assert!(usage["usage"]["completion_tokens"].as_u64() > Some(0));

    let completion = json!({"prompt": "def fibonacci(n):", "max_tokens": 24, "temperature": 0});
    let whole = post(&server, "/v1/completions", &completion);
    assert_eq!(whole.status, 200, "{}", whole.body);
    assert_eq!(whole.body["object"], "text_completion");
    let streamed = stream(&server, "/v1/completions", &completion);
    assert!(streamed.done);
    assert_eq!(
        Some(streamed.text().as_str()),
        whole.body["choices"][0]["text"].as_str(),
        "streamed completion differs"
    );
    assert_eq!(
        streamed.last()["choices"][0]["finish_reason"],
        whole.body["choices"][0]["finish_reason"]
    );
}

#[test]
fn each_request_may_choose_its_cascade_and_the_output_does_not_change() {
    let _guard = exclusive();
    let server = Server::start(&["--cascade", "lookup"]);
    let prompt = fixture("extract-protocols-0");
    let plain = post(
        &server,
        "/v1/chat/completions",
        &chat_body(&prompt, 48, json!({"speculative": {"cascade": "none"}})),
    );
    let plain_text = chat_text(&plain);
    assert_eq!(plain.body["speculative"]["drafted"], 0, "{}", plain.body);
    assert_eq!(plain.body["speculative"]["sources"], json!([]));

    let suffix = post(
        &server,
        "/v1/chat/completions",
        &chat_body(
            &prompt,
            48,
            json!({"speculative": {"cascade": "suffix,lookup", "draft_max": 3, "mode": "first"}}),
        ),
    );
    assert_eq!(
        chat_text(&suffix),
        plain_text,
        "suffix,lookup changed the output"
    );
    let speculative = &suffix.body["speculative"];
    assert_eq!(
        speculative["cascade"],
        json!(["suffix", "lookup"]),
        "{speculative}"
    );
    assert_eq!(speculative["draft_max"], 3);
    assert_eq!(speculative["sources"][0]["name"], "suffix");

    let default = post(
        &server,
        "/v1/chat/completions",
        &chat_body(&prompt, 48, json!({})),
    );
    assert_eq!(chat_text(&default), plain_text);
    assert_eq!(default.body["speculative"]["cascade"], json!(["lookup"]));
    let scored = post(
        &server,
        "/v1/chat/completions",
        &chat_body(
            &prompt,
            48,
            json!({"cascade": "lookup,suffix", "mode": "scored"}),
        ),
    );
    assert_eq!(
        chat_text(&scored),
        plain_text,
        "scored mode changed the output"
    );

    for (speculative, status, needle) in [
        (json!({"cascade": "nope"}), 400, "lookup, suffix"),
        (json!({"cascade": "./x.wasm"}), 400, "PUT /admin/cascade"),
        (
            json!({"policy": "adaptive"}),
            400,
            "is not loaded (loaded: ",
        ),
        (json!({"policy": "window,raise=2"}), 400, "raise"),
        (json!({"cascade": "draft"}), 400, "--draft-model"),
        (json!({"draft_max": 0}), 400, "between 1 and 24"),
        (json!({"cascde": "lookup"}), 400, "cascde"),
    ] {
        let answer = post(
            &server,
            "/v1/chat/completions",
            &chat_body(&prompt, 8, json!({"speculative": speculative})),
        );
        let message = answer.body["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(answer.status, status, "{speculative}: {}", answer.body);
        assert!(
            message.contains(needle),
            "{speculative}: `{needle}` not in {message}"
        );
    }
}

#[test]
fn each_request_may_choose_its_policy_and_the_output_does_not_change() {
    let _guard = exclusive();
    let server = Server::start(&["--cascade", "lookup,suffix", "--policy", "cost"]);
    let prompt = fixture("extract-protocols-0");
    let plain = post(
        &server,
        "/v1/chat/completions",
        &chat_body(&prompt, 48, json!({"speculative": {"cascade": "none"}})),
    );
    let plain_text = chat_text(&plain);
    assert_eq!(plain.body["speculative"]["policy"], Value::Null);
    for (speculative, reported) in [
        (json!({}), "cost"),
        (
            json!({"policy": "window,raise=0.9,k=8"}),
            "window,raise=0.9,k=8",
        ),
        (
            json!({"policy": "heuristic", "mode": "scored"}),
            "heuristic",
        ),
        (json!({"policy": "fixed", "draft_max": 4}), "fixed"),
    ] {
        // Twice: the second request runs on the slot's policy instance from the first.
        for _ in 0..2 {
            let answer = post(
                &server,
                "/v1/chat/completions",
                &chat_body(&prompt, 48, json!({"speculative": speculative})),
            );
            assert_eq!(
                chat_text(&answer),
                plain_text,
                "{speculative} changed the output"
            );
            assert_eq!(
                answer.body["speculative"]["policy"], reported,
                "{}",
                answer.body
            );
        }
    }
    let log = server.log();
    assert_eq!(
        log.matches("measured the verify cost curve").count(),
        1,
        "one measurement per slot, at start-up: {log}"
    );
}

#[test]
fn serves_the_draft_model_and_persists_plugin_state_across_restarts() {
    let _guard = exclusive();
    let state_dir = scratch("server-state");
    let state_file = state_dir.join("suffix.state");
    let args = [
        "--cascade",
        "suffix,draft",
        "--draft-model",
        "auto",
        "--state-dir",
        state_dir.to_str().expect("UTF-8 path"),
    ];
    let prompt = fixture("extract-protocols-0");
    let server = Server::start(&args);
    let plain = post(
        &server,
        "/v1/chat/completions",
        &chat_body(&prompt, 48, json!({"speculative": {"cascade": "none"}})),
    );
    let plain_text = chat_text(&plain);
    let accepted = |answer: &Answer| answer.body["speculative"]["accepted"].as_u64().unwrap_or(0);
    let suffix_body = chat_body(&prompt, 48, json!({"speculative": {"cascade": "suffix"}}));
    let cold = post(&server, "/v1/chat/completions", &suffix_body);
    assert_eq!(chat_text(&cold), plain_text);
    // A fixed draft length: the default `cost` policy leaves out a draft model that does not
    // pay, and this one does not on 2 cores.
    for cascade in ["draft", "suffix,draft"] {
        let answer = post(
            &server,
            "/v1/chat/completions",
            &chat_body(
                &prompt,
                48,
                json!({"speculative": {"cascade": cascade, "policy": "fixed,k=4"}}),
            ),
        );
        assert_eq!(
            chat_text(&answer),
            plain_text,
            "{cascade} changed the output"
        );
        let draft = &answer.body["speculative"]["sources"]
            .as_array()
            .and_then(|sources| sources.iter().find(|s| s["name"] == "draft").cloned())
            .unwrap_or_default();
        assert!(
            draft["drafted"].as_u64().unwrap_or(0) > 0,
            "the draft model drafted: {}",
            answer.body
        );
    }
    assert!(!state_file.exists(), "state is saved at most once a minute");
    server.terminate();
    let saved = std::fs::read(&state_file).expect("the suffix state is saved on shutdown");
    assert!(!saved.is_empty());

    let restarted = Server::start(&args);
    wait_for(&restarted, "the saved state loaded", || {
        restarted.log().contains("loaded plugin state")
    });
    let warm = post(&restarted, "/v1/chat/completions", &suffix_body);
    assert_eq!(chat_text(&warm), plain_text);
    assert!(
        accepted(&warm) > accepted(&cold),
        "the restored cache knows this answer: {} accepted, {} before it was cached",
        accepted(&warm),
        accepted(&cold)
    );
    restarted.terminate();
}

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
            chat_body("hi", 8, json!({"n": 2})),
            400,
            "n other than 1",
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

#[test]
fn admin_endpoints_are_off_without_a_token_and_require_it_with_one() {
    let _guard = exclusive();
    let closed = Server::start(&[]);
    assert_eq!(get(&closed, "/admin/cascade", None).status, 404);
    assert_eq!(
        get(&closed, "/admin/cascade", Some(ADMIN_TOKEN)).status,
        404
    );
    drop(closed);

    let server = Server::start(&["--admin-token", ADMIN_TOKEN, "--cascade", "lookup"]);
    let missing = get(&server, "/admin/cascade", None);
    assert_eq!(missing.status, 401, "{}", missing.body);
    assert_eq!(get(&server, "/admin/cascade", Some("wrong")).status, 401);
    let shown = get(&server, "/admin/cascade", Some(ADMIN_TOKEN));
    assert_eq!(shown.status, 200, "{}", shown.body);
    assert_eq!(shown.body["defaults"]["cascade"], json!(["lookup"]));
    let unauthorized_put = answer(send(
        agent().put(server.url("/admin/cascade")),
        &json!({"cascade": "suffix"}),
    ));
    assert_eq!(unauthorized_put.status, 401);

    let updated = admin_put(
        &server,
        "/admin/cascade",
        &json!({"cascade": "suffix", "draft_max": 4}),
    );
    assert_eq!(updated.status, 200, "{}", updated.body);
    assert_eq!(updated.body["defaults"]["cascade"], json!(["suffix"]));
    let answer = post(
        &server,
        "/v1/chat/completions",
        &chat_body("Name three colours.", 16, json!({})),
    );
    chat_text(&answer);
    assert_eq!(answer.body["speculative"]["cascade"], json!(["suffix"]));
    assert_eq!(answer.body["speculative"]["draft_max"], 4);

    for (body, status, needle) in [
        (
            json!({"cascade": "nope"}),
            422,
            "no built-in drafter `nope`",
        ),
        (
            json!({"plugin_configs": {"lookup": "max_ngram=banana"}}),
            422,
            "lookup",
        ),
    ] {
        let refused = admin_put(&server, "/admin/cascade", &body);
        assert_eq!(refused.status, status, "{body}: {}", refused.body);
        let message = refused.body["error"]["message"]
            .as_str()
            .unwrap_or_default();
        assert!(message.contains(needle), "`{needle}` not in {message}");
    }
    let unchanged = get(&server, "/admin/cascade", Some(ADMIN_TOKEN));
    assert_eq!(
        unchanged.body["defaults"]["cascade"],
        json!(["suffix"]),
        "a refused update changed the defaults"
    );
}

#[test]
fn hot_swaps_while_streaming_keep_every_output_identical_to_plain_decoding() {
    let _guard = exclusive();
    let dir = scratch("hotswap");
    let swapped = dir.join("swapped.wasm");
    install(&built("lookup"), &swapped);
    let cascade = format!("lookup,{}", swapped.display());
    let server = Server::start(&["--admin-token", ADMIN_TOKEN, "--cascade", &cascade]);
    let prompts: Vec<String> = [
        "edit-shlex-split",
        "extract-protocols-0",
        "HumanEval-2",
        "HumanEval-5",
    ]
    .iter()
    .map(|id| fixture(id))
    .collect();
    let max_tokens = 64;
    let plain: Vec<String> = prompts
        .iter()
        .map(|prompt| {
            chat_text(&post(
                &server,
                "/v1/chat/completions",
                &chat_body(
                    prompt,
                    max_tokens,
                    json!({"speculative": {"cascade": "none"}}),
                ),
            ))
        })
        .collect();

    // The client streams one request after another with the default cascade and says when
    // each has started, so that every swap lands while a request is in flight.
    let (started, requests_started) = mpsc::channel::<()>();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let client = {
        let base = server.base.clone();
        let prompts = prompts.clone();
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut results = Vec::new();
            for index in 0.. {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let prompt = index % prompts.len();
                let mut told = false;
                let body = chat_body(&prompts[prompt], max_tokens, json!({}));
                let streamed = stream_at(&base, "/v1/chat/completions", &body, |_| {
                    if !told {
                        told = true;
                        let _ = started.send(());
                    }
                });
                results.push((prompt, streamed));
            }
            results
        })
    };

    let cascades = [
        "swapped",
        "suffix,swapped",
        "swapped,lookup",
        "lookup,swapped",
    ];
    for round in 0..10 {
        requests_started
            .recv_timeout(PATIENCE)
            .expect("the client starts a request");
        let updated = admin_put(
            &server,
            "/admin/cascade",
            &json!({"cascade": cascades[round % cascades.len()]}),
        );
        assert_eq!(updated.status, 200, "swap {round}: {}", updated.body);
        let version = if round % 2 == 0 { "suffix" } else { "lookup" };
        install(&built(version), &swapped);
        let reloaded = admin_post(
            &server,
            "/admin/plugins/reload",
            &json!({"plugins": ["swapped"]}),
        );
        assert_eq!(reloaded.status, 200, "reload {round}: {}", reloaded.body);
        assert_eq!(
            reloaded.body["reloaded"],
            json!(["swapped"]),
            "reload {round}"
        );
    }

    // A broken version is refused and the working one kept.
    let before = get(&server, "/admin/cascade", Some(ADMIN_TOKEN));
    install(&built("hostile_panic"), &swapped);
    let refused = admin_post(
        &server,
        "/admin/plugins/reload",
        &json!({"plugins": ["swapped"]}),
    );
    assert_eq!(refused.status, 422, "{}", refused.body);
    assert!(
        refused.body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("smoke test"),
        "{}",
        refused.body
    );
    let after = get(&server, "/admin/cascade", Some(ADMIN_TOKEN));
    assert_eq!(
        before.body["plugins"], after.body["plugins"],
        "the broken version was published"
    );
    requests_started
        .recv_timeout(PATIENCE)
        .expect("one more request");

    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let results = client.join().expect("client thread");
    assert!(results.len() >= 11, "only {} requests ran", results.len());
    let mut swaps = 0;
    for (index, (prompt, streamed)) in results.iter().enumerate() {
        assert_eq!(streamed.status, 200, "request {index} failed");
        assert!(
            streamed.done && streamed.errors().is_empty(),
            "request {index}: {:?}",
            streamed.chunks
        );
        assert_eq!(
            streamed.text(),
            plain[*prompt],
            "request {index} (prompt {prompt}) differs from plain decoding"
        );
        swaps += streamed.last()["speculative"]["swaps"]
            .as_u64()
            .unwrap_or(0);
    }
    assert!(
        swaps >= 1,
        "no request was swapped mid-flight; the test proved nothing"
    );
    let page = metrics(&server);
    assert!(
        sample(&page, "spechost_cascade_swaps_total") >= 1.0,
        "{page}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn watch_reloads_a_changed_plugin_file_and_keeps_the_old_one_when_broken() {
    let _guard = exclusive();
    let dir = scratch("watch");
    let watched = dir.join("watched.wasm");
    install(&built("lookup"), &watched);
    let server = Server::start(&[
        "--admin-token",
        ADMIN_TOKEN,
        "--watch",
        dir.to_str().expect("UTF-8 temp dir"),
        "--cascade",
        watched.to_str().expect("UTF-8 temp dir"),
    ]);
    let sha = |server: &Server| {
        let shown = get(server, "/admin/cascade", Some(ADMIN_TOKEN));
        shown.body["plugins"]
            .as_array()
            .and_then(|plugins| plugins.iter().find(|p| p["name"] == "watched"))
            .map(|p| p["sha256"].clone())
            .unwrap_or_else(|| panic!("no `watched` plugin in {}", shown.body))
    };
    let original = sha(&server);
    install(&built("suffix"), &watched);
    wait_for(&server, "the changed file to be reloaded", || {
        sha(&server) != original
    });
    let reloaded = sha(&server);

    install(&built("hostile_panic"), &watched);
    let rejected = "spechost_plugin_reloads_total{outcome=\"rejected\"}";
    wait_for(&server, "the broken file to be refused", || {
        sample(&metrics(&server), rejected) >= 1.0
    });
    assert_eq!(sha(&server), reloaded, "the broken version was published");
    let answer = post(
        &server,
        "/v1/chat/completions",
        &chat_body("Say hi.", 8, json!({})),
    );
    chat_text(&answer);
    assert_eq!(answer.body["speculative"]["cascade"], json!(["watched"]));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_official_openai_python_client_works() {
    let python = std::env::var("SPECHOST_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let has_openai = Command::new(&python)
        .args(["-c", "import openai"])
        .output()
        .is_ok_and(|output| output.status.success());
    if !has_openai {
        println!(
            "skipped: `{python} -c 'import openai'` failed; scripts/test.sh installs the openai package into a venv and sets SPECHOST_PYTHON"
        );
        return;
    }
    let _guard = exclusive();
    let server = Server::start(&["--cascade", "lookup"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/openai_client.py");
    let output = Command::new(&python)
        .arg(&script)
        .args(["--base-url", &server.url("/v1")])
        .output()
        .expect("python starts");
    assert!(
        output.status.success(),
        "{} failed:\nstdout: {}\nstderr: {}\nserver log:\n{}",
        script.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
        server.log()
    );
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
fn plugins_named_over_the_api_resolve_only_inside_the_plugin_directories() {
    let _guard = exclusive();
    let dir = scratch("plugin-dirs");
    let plugins = dir.join("plugins");
    let outside = dir.join("outside");
    for path in [&plugins, &outside] {
        std::fs::create_dir_all(path).expect("scratch dir");
    }
    install(&built("lookup"), &plugins.join("inside.wasm"));
    install(&built("lookup"), &outside.join("outside.wasm"));
    install(&built("policy_fixed"), &outside.join("stray_policy.wasm"));
    std::os::unix::fs::symlink(outside.join("outside.wasm"), plugins.join("escape.wasm"))
        .expect("symlink");
    let server = Server::start(&[
        "--admin-token",
        ADMIN_TOKEN,
        "--plugin-dir",
        plugins.to_str().expect("UTF-8 temp dir"),
        "--cascade",
        "lookup",
    ]);

    let outside_file = outside.join("outside.wasm").display().to_string();
    let climbing = format!("{}/../outside/outside.wasm", plugins.display());
    let escape = plugins.join("escape.wasm").display().to_string();
    let stray_policy = format!("{},k=2", outside.join("stray_policy.wasm").display());
    for (body, needle) in [
        (
            json!({"cascade": outside_file}),
            "outside the plugin directories",
        ),
        (
            json!({"cascade": "../outside/outside.wasm"}),
            "contains `..`",
        ),
        (json!({"cascade": climbing}), "contains `..`"),
        (
            json!({"cascade": "escape.wasm"}),
            "outside the plugin directories",
        ),
        (
            json!({"cascade": format!("lookup,{escape}")}),
            "a symlink pointing out is refused",
        ),
        (json!({"cascade": "missing.wasm"}), "no file `missing.wasm`"),
        (
            json!({"policy": stray_policy}),
            "outside the plugin directories",
        ),
    ] {
        let refused = admin_put(&server, "/admin/cascade", &body);
        assert_eq!(refused.status, 400, "{body}: {}", refused.body);
        let message = refused.body["error"]["message"]
            .as_str()
            .unwrap_or_default();
        assert!(
            message.contains(needle) && message.contains("--plugin-dir"),
            "{body}: `{needle}` or the fix not in {message}"
        );
    }
    let shown = get(&server, "/admin/cascade", Some(ADMIN_TOKEN));
    let loaded = |key: &str| -> Vec<String> {
        shown.body[key]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|p| p["name"].as_str())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    for name in ["outside", "escape", "stray_policy"] {
        assert!(
            !loaded("plugins").contains(&name.to_owned())
                && !loaded("policies").contains(&name.to_owned()),
            "refused file `{name}` was loaded: {}",
            shown.body
        );
    }
    assert_eq!(
        shown.body["generation"], 0,
        "a refused update was published"
    );
    assert_eq!(
        sample(
            &metrics(&server),
            "spechost_plugin_reloads_total{outcome=\"rejected\"}"
        ),
        7.0,
        "every refused update is counted"
    );

    // The same file, by its path inside the plugin directory or absolute, is taken.
    let inside = admin_put(
        &server,
        "/admin/cascade",
        &json!({"cascade": "inside.wasm"}),
    );
    assert_eq!(inside.status, 200, "{}", inside.body);
    assert_eq!(inside.body["defaults"]["cascade"], json!(["inside"]));
    let absolute = format!("lookup,{}", plugins.join("inside.wasm").display());
    let both = admin_put(&server, "/admin/cascade", &json!({"cascade": absolute}));
    assert_eq!(both.status, 200, "{}", both.body);
    let answer = post(
        &server,
        "/v1/chat/completions",
        &chat_body("Say hi.", 8, json!({})),
    );
    chat_text(&answer);
    assert_eq!(
        answer.body["speculative"]["cascade"],
        json!(["lookup", "inside"])
    );
    let _ = std::fs::remove_dir_all(&dir);
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
        .prop_map(|(cascade, draft_max, mode, policy)| {
            json!({"cascade": cascade, "draft_max": draft_max, "mode": mode, "policy": policy})
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

/// Times the crash-safety test kills a server that is saving its state.
const STATE_KILLS: u32 = 6;
/// Pause between looks for the state writer's temporary file.
const STATE_POLL: Duration = Duration::from_micros(200);

/// The state writers' temporary files in `dir` (`.suffix.state.<pid>.<n>.tmp`) with their pids.
fn state_temporaries(dir: &Path) -> Vec<(PathBuf, u32)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?;
            let rest = name.strip_prefix(".suffix.state.")?.strip_suffix(".tmp")?;
            let pid = rest.split('.').next()?.parse().ok()?;
            Some((path.clone(), pid))
        })
        .collect()
}

/// How a server that was saving its state ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StateKill {
    /// SIGKILL a few milliseconds after SIGTERM, wherever the shutdown was.
    AfterDelay,
    /// SIGKILL as soon as its temporary state file appeared: while writing, syncing or renaming.
    DuringWrite,
    /// It saved and exited before the SIGKILL.
    Finished,
}

/// Sends SIGTERM (the server finishes, then saves its state), then SIGKILL: after `delay`, or,
/// without one, once its temporary state file appears in `dir`.
fn kill_while_saving(server: &mut Server, dir: &Path, delay: Option<Duration>) -> StateKill {
    let pid = server.child.id();
    let sent = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    assert!(
        sent.is_ok_and(|status| status.success()),
        "kill -TERM {pid}"
    );
    let moment = match delay {
        Some(delay) => {
            std::thread::sleep(delay);
            StateKill::AfterDelay
        }
        None => {
            let started = Instant::now();
            loop {
                if server.child.try_wait().ok().flatten().is_some() {
                    break StateKill::Finished;
                }
                if state_temporaries(dir).iter().any(|(_, p)| *p == pid) {
                    break StateKill::DuringWrite;
                }
                assert!(
                    started.elapsed() < PATIENCE,
                    "the server never saved its state"
                );
                std::thread::sleep(STATE_POLL);
            }
        }
    };
    let _ = server.child.kill();
    let status = server.child.wait().expect("the server ends");
    if status.success() {
        StateKill::Finished
    } else {
        moment
    }
}

/// Starts a server on `args` and checks that it loaded the saved suffix state without a
/// warning and left no temporary file of a killed writer.
fn start_with_saved_state(args: &[&str], dir: &Path) -> Server {
    let server = Server::start(args);
    wait_for(&server, "the saved state to be loaded", || {
        server.log().contains("loaded plugin state")
    });
    let leftovers = state_temporaries(dir);
    assert!(
        leftovers.is_empty(),
        "temporary files of killed writers were not removed at start: {leftovers:?}"
    );
    server
}

/// Asks `server` for `prompt` with the suffix drafter and checks the output, then that the
/// drafter loaded the saved response cache without a warning.
fn check_suffix_answer(server: &Server, prompt: &str, plain: &str) {
    let answer = post(
        server,
        "/v1/chat/completions",
        &chat_body(prompt, 48, json!({"speculative": {"cascade": "suffix"}})),
    );
    assert_eq!(chat_text(&answer), plain, "suffix changed the output");
    wait_for(server, "the suffix drafter to load its cache", || {
        server.log().contains("suffix: loaded")
    });
    let log = server.log();
    for warning in [
        "ignoring the saved response cache",
        "the plugin starts empty",
    ] {
        assert!(
            !log.contains(warning),
            "the saved state was not used: {log}"
        );
    }
}

#[test]
fn serve_state_killed_while_saving_is_the_old_or_the_new_version_never_corrupt() {
    let _guard = exclusive();
    let state_dir = scratch("serve-kill");
    let state_file = state_dir.join("suffix.state");
    let state_arg = state_dir.to_str().expect("UTF-8 temp dir");
    let args = ["--cascade", "suffix", "--state-dir", state_arg];
    let prompts: Vec<String> = [
        "edit-shlex-split",
        "extract-protocols-0",
        "HumanEval-2",
        "HumanEval-5",
    ]
    .iter()
    .map(|id| fixture(id))
    .collect();

    let first = Server::start(&args);
    let plain: Vec<String> = prompts
        .iter()
        .map(|prompt| {
            chat_text(&post(
                &first,
                "/v1/chat/completions",
                &chat_body(prompt, 48, json!({"speculative": {"cascade": "none"}})),
            ))
        })
        .collect();
    let suffix_body = chat_body(
        &prompts[0],
        48,
        json!({"speculative": {"cascade": "suffix"}}),
    );
    assert_eq!(
        chat_text(&post(&first, "/v1/chat/completions", &suffix_body)),
        plain[0]
    );
    first.terminate();
    assert!(state_file.exists(), "no state saved on SIGTERM");

    let mut moments = Vec::new();
    for kill in 0..STATE_KILLS {
        let before = std::fs::read(&state_file).expect("a state file");
        let mut server = start_with_saved_state(&args, &state_dir);
        let prompt = kill as usize % prompts.len();
        check_suffix_answer(&server, &prompts[prompt], &plain[prompt]);
        // One more response in the cache, so that the shutdown writes a new version.
        let next = (prompt + 1) % prompts.len();
        let body = chat_body(
            &prompts[next],
            48,
            json!({"speculative": {"cascade": "suffix"}}),
        );
        assert_eq!(
            chat_text(&post(&server, "/v1/chat/completions", &body)),
            plain[next]
        );
        let delay = (kill % 2 == 0).then(|| Duration::from_millis(u64::from(kill) * 2));
        let moment = kill_while_saving(&mut server, &state_dir, delay);
        let after = std::fs::read(&state_file).expect("the state file survives the kill");
        if moment == StateKill::Finished {
            assert_ne!(after, before, "a finished shutdown left the old state");
        }
        eprintln!(
            "kill {kill}: {moment:?}, state file {} ({} bytes)",
            if after == before { "old" } else { "new" },
            after.len()
        );
        moments.push(moment);
    }
    assert!(
        moments.iter().any(|m| *m != StateKill::Finished),
        "every server finished before its SIGKILL, so no kill was tested: {moments:?}"
    );

    let last = start_with_saved_state(&args, &state_dir);
    check_suffix_answer(&last, &prompts[0], &plain[0]);
    last.terminate();
    let _ = std::fs::remove_dir_all(&state_dir);
}
