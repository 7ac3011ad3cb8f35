//! What a request asks of its output, on a live server with the default model (issue 26):
//! log-probabilities (`logprobs`, `top_logprobs`, the legacy completions' `logprobs: N`) equal
//! to plain decoding's, whole and streamed; and constrained output (`grammar`, `json_schema`,
//! `response_format`) that parses, follows its schema, and is the same with and without
//! speculation, greedy and seeded.
//!
//! Each test starts its own server and kills it at the end (`common::server`).

mod common;

use common::exclusive;
use common::server::*;
use serde_json::{Value, json};

/// A prompt the default cascade drafts well for: the answer repeats the list.
const REPEAT: &str = "Repeat this list exactly, once: alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau upsilon";

/// Speculation off for one request.
fn plain() -> Value {
    json!({"cascade": "none"})
}

#[test]
fn logprobs_equal_plain_decodings_whole_and_streamed() {
    let _guard = exclusive();
    let server = Server::start(&[]);
    let ask = json!({"logprobs": true, "top_logprobs": 3});
    let speculating = post(
        &server,
        "/v1/chat/completions",
        &chat_body(REPEAT, 48, ask.clone()),
    );
    let mut plain_body = chat_body(REPEAT, 48, ask.clone());
    plain_body["speculative"] = plain();
    let decoded = post(&server, "/v1/chat/completions", &plain_body);
    assert_eq!(chat_text(&speculating), chat_text(&decoded));
    let accepted = speculating.body["speculative"]["accepted"].as_u64();
    assert!(accepted.is_some_and(|n| n > 0), "{}", speculating.body);
    let content = &speculating.body["choices"][0]["logprobs"]["content"];
    assert_eq!(content, &decoded.body["choices"][0]["logprobs"]["content"]);
    let entries = content.as_array().expect("content list");
    assert_eq!(
        entries.len() as u64,
        speculating.body["usage"]["completion_tokens"]
            .as_u64()
            .unwrap_or(0)
            - u64::from(speculating.body["choices"][0]["finish_reason"] == "stop"),
        "one entry per token of the text (not the end-of-generation token)"
    );
    let joined: String = entries
        .iter()
        .map(|entry| entry["token"].as_str().expect("token text"))
        .collect();
    assert_eq!(joined, chat_text(&speculating));
    for entry in entries {
        let logprob = entry["logprob"].as_f64().expect("a number");
        let top = entry["top_logprobs"].as_array().expect("alternatives");
        assert_eq!(top.len(), 3, "{entry}");
        assert!(logprob <= 0.0, "{entry}");
        // Greedy: the token chosen is the most likely one.
        assert_eq!(top[0]["token"], entry["token"], "{entry}");
        assert_eq!(top[0]["logprob"], entry["logprob"], "{entry}");
        assert!(top[1]["logprob"].as_f64() <= top[0]["logprob"].as_f64());
    }

    // Streamed: the chunks' entries, joined, are the whole answer's.
    let streamed = stream(&server, "/v1/chat/completions", &chat_body(REPEAT, 48, ask));
    let from_chunks: Vec<Value> = streamed
        .chunks
        .iter()
        .filter_map(|chunk| chunk["choices"][0]["logprobs"]["content"].as_array())
        .flatten()
        .cloned()
        .collect();
    assert_eq!(&Value::from(from_chunks), content);
    let without = post(
        &server,
        "/v1/chat/completions",
        &chat_body(REPEAT, 8, json!({})),
    );
    assert_eq!(without.body["choices"][0]["logprobs"], Value::Null);

    // Legacy completions: parallel lists, text offsets into the completion.
    let completion = post(
        &server,
        "/v1/completions",
        &json!({"prompt": REPEAT, "max_tokens": 24, "temperature": 0, "logprobs": 2}),
    );
    assert_eq!(completion.status, 200, "{}", completion.body);
    let logprobs = &completion.body["choices"][0]["logprobs"];
    let tokens: Vec<&str> = logprobs["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|token| token.as_str().expect("text"))
        .collect();
    assert_eq!(tokens.concat(), completion.body["choices"][0]["text"]);
    let offsets = logprobs["text_offset"].as_array().expect("offsets");
    let mut expected = 0;
    for (token, offset) in tokens.iter().zip(offsets) {
        assert_eq!(offset, expected);
        expected += token.chars().count() as u64;
    }
    assert_eq!(
        logprobs["token_logprobs"].as_array().map(Vec::len),
        Some(tokens.len())
    );
    assert!(
        logprobs["top_logprobs"]
            .as_array()
            .expect("alternatives")
            .iter()
            .all(|top| top
                .as_object()
                .is_some_and(|top| !top.is_empty() && top.len() <= 2)),
        "{logprobs}"
    );
    for (body, param) in [
        (
            chat_body(REPEAT, 4, json!({"top_logprobs": 2})),
            "top_logprobs",
        ),
        (
            chat_body(REPEAT, 4, json!({"logprobs": true, "top_logprobs": 21})),
            "top_logprobs",
        ),
    ] {
        let refused = post(&server, "/v1/chat/completions", &body);
        assert_eq!(refused.status, 400, "{}", refused.body);
        assert_eq!(refused.body["error"]["param"], param, "{}", refused.body);
    }
    server.terminate();
}

/// Sends a completion under `grammar` and checks that it fails with a 400 naming the grammar,
/// with `needle` in the message.
fn assert_grammar_fails(server: &Server, grammar: &str, needle: &str) {
    let failed = post(
        server,
        "/v1/completions",
        &json!({"prompt": "Write:", "grammar": grammar, "max_tokens": 4, "temperature": 0}),
    );
    assert_eq!(failed.status, 400, "{}", failed.body);
    assert_eq!(failed.body["error"]["param"], "grammar", "{}", failed.body);
    let message = failed.body["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains(needle) && message.contains("to check one token"),
        "{message}"
    );
}

/// Tokens the source `name` had accepted in `answer`'s `speculative` block, if it drafted.
fn accepted_by(answer: &Answer, name: &str) -> Option<u64> {
    answer.body["speculative"]["sources"]
        .as_array()?
        .iter()
        .find(|source| source["name"] == name)
        .and_then(|source| source["accepted"].as_u64())
}

/// A person, as a schema whose every output is short.
fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "languages": {"type": "array", "items": {"enum": ["rust", "c", "python"]}, "maxItems": 3}
        },
        "required": ["name", "age", "languages"],
        "additionalProperties": false
    })
}

/// Checks `text` is a JSON person of [`person_schema`].
fn assert_person(text: &str) {
    let person: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let object = person
        .as_object()
        .unwrap_or_else(|| panic!("an object: {text}"));
    assert_eq!(object.len(), 3, "{text}");
    assert!(
        person["name"]
            .as_str()
            .is_some_and(|name| name.chars().count() <= 24),
        "{text}"
    );
    assert!(
        person["age"].as_u64().is_some_and(|age| age <= 150),
        "{text}"
    );
    let languages = person["languages"]
        .as_array()
        .unwrap_or_else(|| panic!("a list: {text}"));
    assert!(languages.len() <= 3, "{text}");
    for language in languages {
        assert!(
            ["rust", "c", "python"].contains(&language.as_str().unwrap_or("")),
            "{text}"
        );
    }
}

#[test]
fn constrained_outputs_parse_and_are_the_same_with_and_without_speculation() {
    let _guard = exclusive();
    let server = Server::start(&[]);
    let ask = "Describe Ada, a 36 year old programmer who writes Rust and C, as JSON.";
    let schema = person_schema();
    let format =
        json!({"type": "json_schema", "json_schema": {"name": "person", "schema": schema}});
    for (constraint, sampling) in [
        (json!({"response_format": format}), json!({})),
        (json!({"json_schema": schema}), json!({})),
        (
            json!({"response_format": format}),
            json!({"temperature": 0.8, "seed": 7}),
        ),
    ] {
        let mut extra = constraint.clone();
        extra
            .as_object_mut()
            .expect("object")
            .extend(sampling.as_object().expect("object").clone());
        let speculating = post(
            &server,
            "/v1/chat/completions",
            &chat_body(ask, 160, extra.clone()),
        );
        let text = chat_text(&speculating);
        assert_eq!(
            speculating.body["choices"][0]["finish_reason"], "stop",
            "{}",
            speculating.body
        );
        assert_person(&text);
        let mut plain_body = chat_body(ask, 160, extra);
        plain_body["speculative"] = plain();
        assert_eq!(
            chat_text(&post(&server, "/v1/chat/completions", &plain_body)),
            text,
            "{constraint} {sampling}"
        );
    }

    // The grammar source drafted those (a schema's keys and punctuation), unless a request or
    // the server turns it off.
    let constrained = chat_body(ask, 160, json!({"response_format": format}));
    let mut undrafted = constrained.clone();
    undrafted["speculative"] = json!({"grammar_drafts": false});
    let (drafted, undrafted) = (
        post(&server, "/v1/chat/completions", &constrained),
        post(&server, "/v1/chat/completions", &undrafted),
    );
    assert_eq!(chat_text(&drafted), chat_text(&undrafted));
    assert!(
        accepted_by(&drafted, "grammar").is_some_and(|accepted| accepted > 0),
        "{}",
        drafted.body["speculative"]
    );
    assert_eq!(
        accepted_by(&undrafted, "grammar"),
        None,
        "{}",
        undrafted.body["speculative"]
    );

    // A GBNF grammar: only its strings, then the end.
    let grammar = r#"root ::= "yes" | "no" | "maybe""#;
    let answer = post(
        &server,
        "/completions",
        &json!({"prompt": "Is the sky green? Answer:", "grammar": grammar, "max_tokens": 8, "temperature": 0}),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    let text = answer.body["choices"][0]["text"].as_str().expect("text");
    assert!(["yes", "no", "maybe"].contains(&text), "{text}");
    assert_eq!(answer.body["choices"][0]["finish_reason"], "stop");

    // Any JSON object.
    let object = post(
        &server,
        "/v1/chat/completions",
        &chat_body(
            "List two colours as JSON.",
            96,
            json!({"response_format": {"type": "json_object"}}),
        ),
    );
    let text = chat_text(&object);
    if object.body["choices"][0]["finish_reason"] == "stop" {
        assert!(
            serde_json::from_str::<Value>(&text).is_ok_and(|v| v.is_object()),
            "{text}"
        );
    } else {
        assert!(text.trim_start().starts_with('{'), "{text}");
    }

    // A grammar of thousands of alternatives at one point passes every static check but takes
    // seconds to check a token: its request is refused, naming it, and the server goes on.
    let alternatives: Vec<String> = (0..6000).map(|i| format!("\"a{i}\"")).collect();
    let heavy = format!("root ::= ({})+", alternatives.join(" | "));
    // Refused before it was queued: tried on a sample of the vocabulary, not on the batcher.
    assert_grammar_fails(&server, &heavy, "would take about");

    // The same kind of alternatives after a fixed word: quick at the start, so it is queued,
    // and its request fails after the first slow token, naming its grammar.
    let words: Vec<String> = (0..8000)
        .map(|i| {
            let letter = |n: usize| char::from(b'a' + (n % 26) as u8);
            format!("\"{}{}{}\"", letter(i / 676), letter(i / 26), letter(i))
        })
        .collect();
    let late = format!("root ::= \"Yes\" ({})+", words.join(" | "));
    assert_grammar_fails(&server, &late, "took");
    let after = post(
        &server,
        "/completions",
        &json!({"prompt": "Is the sky green? Answer:", "grammar": grammar, "max_tokens": 8, "temperature": 0}),
    );
    assert_eq!(after.status, 200, "{}", after.body);

    for (extra, param) in [
        (json!({"grammar": "root ::= ("}), "grammar"),
        (json!({"grammar": "start ::= \"a\""}), "grammar"),
        // Repeats what can match nothing: llama.cpp would take seconds per token.
        (
            json!({"grammar": "root ::= (x x x x x x x x x x x x)+\nx ::= [a-z ]?"}),
            "grammar",
        ),
        (
            json!({"response_format": {"type": "xml"}}),
            "response_format",
        ),
        (
            json!({"json_schema": {"type": "object"}, "grammar": grammar}),
            "json_schema",
        ),
    ] {
        let refused = post(
            &server,
            "/v1/chat/completions",
            &chat_body(ask, 8, extra.clone()),
        );
        assert_eq!(refused.status, 400, "{extra}: {}", refused.body);
        assert_eq!(refused.body["error"]["param"], param, "{}", refused.body);
    }
    server.terminate();

    // A server started without the grammar source drafts with it only when a request asks.
    let server = Server::start(&["--no-grammar-drafts"]);
    let undrafted = post(&server, "/v1/chat/completions", &constrained);
    assert_eq!(accepted_by(&undrafted, "grammar"), None);
    let mut asking = constrained;
    asking["speculative"] = json!({"grammar_drafts": true});
    let drafted = post(&server, "/v1/chat/completions", &asking);
    assert!(
        accepted_by(&drafted, "grammar").is_some(),
        "{}",
        drafted.body
    );
    assert_eq!(chat_text(&drafted), chat_text(&undrafted));
    server.terminate();
}

#[test]
fn several_choices_draw_with_their_own_seeds_whole_and_streamed() {
    let _guard = exclusive();
    let server = Server::start(&["--parallel", "2"]);
    let ask = "Name a colour and say why you like it.";
    let seeded = json!({"n": 3, "temperature": 0.9, "seed": 11});
    let whole = post(
        &server,
        "/v1/chat/completions",
        &chat_body(ask, 24, seeded.clone()),
    );
    assert_eq!(whole.status, 200, "{}", whole.body);
    let choices = whole.body["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3, "{}", whole.body);
    let texts: Vec<&str> = choices
        .iter()
        .enumerate()
        .map(|(index, choice)| {
            assert_eq!(choice["index"], index, "{choice}");
            choice["message"]["content"].as_str().expect("text")
        })
        .collect();
    assert!(texts[0] != texts[1] || texts[1] != texts[2], "{texts:?}");
    // Choice i draws with seed + i: choice 1 is what a single request of seed 12 gives.
    let alone = post(
        &server,
        "/v1/chat/completions",
        &chat_body(ask, 24, json!({"temperature": 0.9, "seed": 12})),
    );
    assert_eq!(chat_text(&alone), texts[1]);
    // The prompt counted once, every choice's tokens.
    let usage = &whole.body["usage"];
    assert_eq!(usage["prompt_tokens"], alone.body["usage"]["prompt_tokens"]);
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(
            usage["prompt_tokens"].as_u64().unwrap_or(0)
                + usage["completion_tokens"].as_u64().unwrap_or(0)
        )
    );
    assert!(
        usage["completion_tokens"].as_u64() > Some(24),
        "three answers: {usage}"
    );

    // Streamed: every choice's text under its index, a finish for each, usage after all.
    let mut body = chat_body(ask, 24, seeded);
    body["stream_options"] = json!({"include_usage": true});
    let streamed = stream(&server, "/v1/chat/completions", &body);
    assert!(
        streamed.done && streamed.errors().is_empty(),
        "{:?}",
        streamed.chunks
    );
    for (index, text) in texts.iter().enumerate() {
        let joined: String = streamed
            .chunks
            .iter()
            .filter(|chunk| chunk["choices"][0]["index"] == index)
            .filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(&joined, text, "choice {index}");
        let finishes = streamed
            .chunks
            .iter()
            .filter(|chunk| {
                chunk["choices"][0]["index"] == index
                    && chunk["choices"][0]["finish_reason"].is_string()
            })
            .count();
        assert_eq!(finishes, 1, "choice {index}");
    }
    let last = streamed.chunks.last().expect("chunks");
    for count in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(last["usage"][count], usage[count], "{last}");
    }

    // Greedy choices are all the same; completions take `n` too.
    let greedy = post(
        &server,
        "/v1/completions",
        &json!({"prompt": "1, 2, 3,", "max_tokens": 6, "temperature": 0, "n": 2, "logprobs": 1}),
    );
    assert_eq!(greedy.status, 200, "{}", greedy.body);
    let choices = greedy.body["choices"].as_array().expect("choices");
    assert_eq!(choices[0]["text"], choices[1]["text"]);
    assert_eq!(choices[0]["logprobs"], choices[1]["logprobs"]);
    for n in [0, 17] {
        let refused = post(&server, "/v1/completions", &json!({"prompt": "x", "n": n}));
        assert_eq!(refused.status, 400, "{}", refused.body);
        assert_eq!(refused.body["error"]["param"], "n", "{}", refused.body);
    }
    server.terminate();
}
