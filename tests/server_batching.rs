//! `spechost serve --parallel 4`: the rounds of every running request share each decode of one
//! llama.cpp context, and each request's output is exactly `spechost run`'s for its prompt,
//! whatever else is in the batch: greedy under every cascade (plain, `lookup,suffix`, the draft
//! model, itself batched), and seeded sampling at temperature. Requests of different lengths
//! start at different times, so batches hold prompts being read beside rounds of every length.
//!
//! Needs SmolLM2 and its default draft (`spechost models fetch smollm2`; the draft is made on
//! first use) and the plugins (`scripts/build-plugins.sh`).

mod common;

use std::process::Command;
use std::time::Duration;

use common::exclusive;
use common::server::*;
use serde_json::{Value, json};

/// Requests at once, and slots.
const CLIENTS: usize = 4;
/// Sampling of the seeded phase, given to `run` and to the server alike.
const TEMPERATURE: &str = "0.8";
const TOP_K: &str = "40";
const TOP_P: &str = "0.95";

/// `spechost run`'s text for `prompt` (plain decoding), with `sampling` flags.
fn run(prompt: &str, max_tokens: usize, sampling: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_spechost"))
        .args(["run", "--model", "smollm2", "--cascade", "none"])
        .args([
            "--ctx-size",
            CTX_SIZE,
            "--max-tokens",
            &max_tokens.to_string(),
        ])
        .args(sampling)
        .args(["--prompt", prompt])
        .output()
        .expect("spechost run starts");
    assert!(
        output.status.success(),
        "spechost run failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("run prints UTF-8")
}

/// The four requests: different prompts and lengths, each started 150 ms after the previous.
fn requests() -> Vec<(String, usize)> {
    drafting_prompts()
        .into_iter()
        .zip([24, 64, 40, 80])
        .collect()
}

/// Sends the requests at once (staggered), each with `extra` fields and its own `seed`
/// (`seed` + index) when given; returns each answer's text and body.
fn send_together(server: &Server, extra: &Value, seed: Option<u32>) -> Vec<(String, Value)> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = requests()
            .into_iter()
            .enumerate()
            .map(|(index, (prompt, max_tokens))| {
                let mut extra = extra.clone();
                if let Some(seed) = seed {
                    extra["seed"] = json!(seed + index as u32);
                }
                scope.spawn(move || {
                    std::thread::sleep(Duration::from_millis(150 * index as u64));
                    let answer = post(
                        server,
                        "/v1/chat/completions",
                        &chat_body(&prompt, max_tokens, extra),
                    );
                    (chat_text(&answer), answer.body)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().expect("client thread"))
            .collect()
    })
}

#[test]
fn concurrent_requests_give_exactly_runs_output_under_every_cascade() {
    let _guard = exclusive();
    let greedy: Vec<String> = requests()
        .iter()
        .map(|(prompt, max_tokens)| run(prompt, *max_tokens, &[]))
        .collect();
    // The server reads prompts 16 tokens a step (several chunks each, beside other requests'
    // rounds), `run` each in one batch: the KV cache, and so the output, must not depend on it.
    let server = Server::start(&[
        "--parallel",
        "4",
        "--draft-model",
        "auto",
        "--cascade",
        "lookup,suffix",
        "--prefill-chunk",
        "16",
    ]);
    let mut shared = 0.0f64;
    for cascade in ["none", "lookup,suffix", "draft"] {
        let extra = json!({"speculative": {"cascade": cascade}});
        for (index, (text, body)) in send_together(&server, &extra, None).iter().enumerate() {
            assert_eq!(
                text, &greedy[index],
                "request {index} under `{cascade}` at {CLIENTS} at once differs from `spechost run`"
            );
            let batch = body["speculative"]["mean_batch_requests"]
                .as_f64()
                .expect("mean_batch_requests");
            shared = shared.max(batch);
        }
    }
    assert!(
        shared > 1.5,
        "requests sent together should share verify batches; the most any request saw was {shared} requests per batch on average"
    );

    // Seeded sampling: the same draws as `run` with the seed, whatever shares the batch.
    let sampling = ["--temp", TEMPERATURE, "--top-k", TOP_K, "--top-p", TOP_P];
    let seed = 1234;
    let sampled: Vec<String> = requests()
        .iter()
        .enumerate()
        .map(|(index, (prompt, max_tokens))| {
            let seed = (seed + index as u32).to_string();
            run(
                prompt,
                *max_tokens,
                &[&sampling[..], &["--seed", &seed]].concat(),
            )
        })
        .collect();
    let extra = json!({
        "temperature": TEMPERATURE.parse::<f64>().expect("a number"),
        "top_k": TOP_K.parse::<i64>().expect("a number"),
        "top_p": TOP_P.parse::<f64>().expect("a number"),
        "speculative": {"cascade": "lookup,suffix"},
    });
    for (index, (text, _)) in send_together(&server, &extra, Some(seed))
        .iter()
        .enumerate()
    {
        assert_eq!(
            text,
            &sampled[index],
            "request {index}, seed {}, at {CLIENTS} at once differs from `spechost run` with that seed",
            seed + index as u32
        );
    }

    // The draft model's drafts drawn at the temperature, in the batched draft context, and
    // verified by rejection sampling in the shared verify steps (the distribution itself is
    // tested in `tests/draft_model.rs`).
    let extra = json!({
        "temperature": TEMPERATURE.parse::<f64>().expect("a number"),
        "speculative": {"cascade": "draft", "policy": "fixed"},
    });
    let answers = send_together(&server, &extra, Some(seed));
    let drawn: u64 = answers
        .iter()
        .map(|(_, body)| {
            body["speculative"]["drawn_rounds"]
                .as_u64()
                .expect("drawn_rounds")
        })
        .sum();
    let accepted: u64 = answers
        .iter()
        .map(|(_, body)| body["speculative"]["accepted"].as_u64().expect("accepted"))
        .sum();
    assert!(
        drawn > 0 && accepted > 0,
        "drawn drafts were verified ({drawn} rounds) and accepted ({accepted} tokens)"
    );
}
