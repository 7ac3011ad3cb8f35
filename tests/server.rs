//! `spechost serve` on loopback with the default model (SmolLM2-135M), driven by a real HTTP
//! client: OpenAI-compatible answers, greedy output identical to `spechost run` and to plain
//! decoding, streaming, per-request cascades and policies, the draft model, and the official
//! OpenAI Python client. The admin API is in `server_admin.rs`, misbehaving clients and plugins
//! in `server_faults.rs`, the limits of `docs/security.md` in `server_limits.rs`.
//!
//! Each test starts its own server (`spechost serve --port 0`, address read from stdout) and
//! kills it at the end. Needs the model (`spechost models fetch smollm2`) and the plugins
//! (`scripts/build-plugins.sh`).

mod common;

use std::path::Path;
use std::process::Command;

use common::exclusive;
use common::server::*;
use serde_json::{Value, json};

#[test]
fn serve_and_run_pick_the_same_policy_and_give_the_same_greedy_output() {
    let _guard = exclusive();
    let prompt = fixture("edit-shlex-split");
    let run = Command::new(env!("CARGO_BIN_EXE_spechost"))
        .args([
            "run",
            "--model",
            "smollm2",
            "--cascade",
            "lookup",
            "--ctx-size",
            CTX_SIZE,
            "--json",
        ])
        .args(["--max-tokens", "64", "--prompt", &prompt])
        .output()
        .expect("spechost run starts");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "spechost run failed: {stderr}");
    let expected = String::from_utf8(run.stdout).expect("run prints UTF-8");
    let run_report: Value = stderr
        .lines()
        .rev()
        .find_map(|line| serde_json::from_str(line).ok())
        .expect("`run --json` reports on stderr");

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
    assert_eq!(
        (&speculative["policy"], &speculative["draft_max"]),
        (&run_report["policy"], &run_report["draft_max"]),
        "serve and run pick different defaults: {speculative} vs {run_report}"
    );
    assert_eq!(run_report["policy"], "cost", "{run_report}");
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
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"], 0,
        "{usage}"
    );

    // The same request again: its slot's cache keeps all of the prompt but the last token,
    // and the answer does not change.
    let again = post(
        &server,
        "/v1/chat/completions",
        &chat_body(&prompt, 64, json!({})),
    );
    assert_eq!(
        chat_text(&again),
        expected,
        "a kept prompt prefix changed the answer"
    );
    let usage = &again.body["usage"];
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"].as_u64(),
        usage["prompt_tokens"].as_u64().map(|n| n - 1),
        "{usage}"
    );
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
            json!({"speculative": {"cascade": "lookup,suffix", "mode": "scored"}}),
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
        "one measurement, at start-up: {log}"
    );
    assert!(
        !log.contains("WARN"),
        "a server whose cascades need no draft model warns of nothing: {log}"
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
    let accepted = |answer: &Answer| answer.body["speculative"]["accepted"].as_u64().unwrap_or(0);
    let suffix_body = chat_body(&prompt, 48, json!({"speculative": {"cascade": "suffix"}}));
    // First: every finished response reaches the drafters of later requests (the slots share
    // them), so only the first request sees a cache that has never met this answer.
    let cold = post(&server, "/v1/chat/completions", &suffix_body);
    let plain = post(
        &server,
        "/v1/chat/completions",
        &chat_body(&prompt, 48, json!({"speculative": {"cascade": "none"}})),
    );
    let plain_text = chat_text(&plain);
    assert_eq!(chat_text(&cold), plain_text);
    // A fixed draft length: the default `cost` policy leaves out a draft model that does not
    // pay, and this one does not on 2 cores. The draft model comes first: `suffix` has seen this
    // very answer and would win every round ahead of it.
    for cascade in ["draft", "draft,suffix"] {
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
