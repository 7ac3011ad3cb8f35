//! `spechost serve` as a drop-in for llama-server (issue 26), on loopback with the default
//! model: the routes without `/v1`, API keys, CORS, `/tokenize`, `/detokenize` and `/props`, llama-server's
//! request fields (harmless ones accepted, the rest refused by name), and a request without
//! `max_tokens` near the end of the context.
//!
//! Each test starts its own server and kills it at the end (`common::server`).

mod common;

use common::exclusive;
use common::server::*;
use serde_json::{Value, json};

/// The key the keyed server is started with.
const API_KEY: &str = "sk-test-key-0123";

fn post_with(server: &Server, path: &str, header: Option<(&str, &str)>, body: &Value) -> Answer {
    let mut request = agent().post(server.url(path));
    if let Some((name, value)) = header {
        request = request.header(name, value);
    }
    answer(send(request, body))
}

#[test]
fn api_keys_guard_inference_and_leave_health_and_models_open() {
    let _guard = exclusive();
    let keys = scratch("api-keys").join("keys.txt");
    std::fs::write(
        &keys,
        format!("# keys of the test\n\nsk-other-key-4567\n{API_KEY}\n"),
    )
    .expect("key file");
    let server = Server::start(&[
        "--api-key-file",
        keys.to_str().expect("utf-8 path"),
        "--served-model-name",
        "smollm2,gpt-4o-mini",
    ]);
    for path in ["/health", "/v1/health", "/v1/models", "/models"] {
        assert_eq!(get(&server, path, None).status, 200, "{path} stays open");
    }
    let models = get(&server, "/v1/models", None);
    assert_eq!(
        models.body["data"][1]["id"], "gpt-4o-mini",
        "{}",
        models.body
    );
    let body = chat_body("Say hi.", 4, json!({}));
    for path in ["/v1/chat/completions", "/chat/completions"] {
        let missing = post(&server, path, &body);
        assert_eq!(missing.status, 401, "{path}: {}", missing.body);
        assert!(
            missing.body["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("API key")
        );
        let wrong = post_with(
            &server,
            path,
            Some(("Authorization", "Bearer sk-wrong")),
            &body,
        );
        assert_eq!(wrong.status, 401, "{path}: {}", wrong.body);
    }
    let bearer = format!("Bearer {API_KEY}");
    let ok = post_with(
        &server,
        "/chat/completions",
        Some(("Authorization", &bearer)),
        &body,
    );
    assert_eq!(ok.status, 200, "{}", ok.body);
    chat_text(&ok);
    assert!(
        ok.body["system_fingerprint"]
            .as_str()
            .is_some_and(|fingerprint| fingerprint.starts_with("spechost-")),
        "{}",
        ok.body
    );
    let mut aliased = body.clone();
    aliased["model"] = json!("gpt-4o-mini");
    let key = Some(("Authorization", bearer.as_str()));
    let by_alias = post_with(&server, "/chat/completions", key, &aliased);
    assert_eq!(by_alias.status, 200, "{}", by_alias.body);
    aliased["model"] = json!("gpt-5");
    let unknown = post_with(&server, "/chat/completions", key, &aliased);
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    let header = post_with(
        &server,
        "/completions",
        Some(("X-Api-Key", "sk-other-key-4567")),
        &json!({"prompt": "Hello", "max_tokens": 2}),
    );
    assert_eq!(header.status, 200, "{}", header.body);
    let tokenize = post(&server, "/tokenize", &json!({"content": "hi"}));
    assert_eq!(tokenize.status, 401, "{}", tokenize.body);
    assert_eq!(get(&server, "/props", None).status, 401);
    let props = get(&server, "/props", Some(API_KEY));
    assert_eq!(props.status, 200, "{}", props.body);
    assert_eq!(props.body["total_slots"], 1, "{}", props.body);
    assert_eq!(props.body["default_generation_settings"]["n_ctx"], 2048);
    assert!(
        props.body["chat_template"]
            .as_str()
            .is_some_and(|t| t.contains("im_start")),
        "SmolLM2's ChatML template: {}",
        props.body
    );
}

#[test]
fn pages_of_listed_origins_may_call_the_server_and_others_are_refused() {
    let _guard = exclusive();
    let ui = "http://localhost:5173";
    let server = Server::start(&["--cors-origins", ui, "--accept-any-model"]);
    let preflight = agent()
        .options(server.url("/v1/chat/completions"))
        .header("Origin", ui)
        .header("Access-Control-Request-Method", "POST")
        .header(
            "Access-Control-Request-Headers",
            "authorization, content-type",
        )
        .call()
        .expect("a preflight answer");
    assert_eq!(preflight.status().as_u16(), 204);
    let header = |name: &str| {
        preflight
            .headers()
            .get(name)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(header("access-control-allow-origin"), ui);
    assert!(header("access-control-allow-headers").contains("Authorization"));
    assert!(header("access-control-allow-methods").contains("POST"));

    // A client that hard-codes another model's name is served with --accept-any-model.
    let body = chat_body("Say hi.", 4, json!({"model": "gpt-4o"}));
    let mut allowed = send(
        agent()
            .post(server.url("/v1/chat/completions"))
            .header("Origin", ui),
        &body,
    )
    .expect("an answer");
    assert_eq!(allowed.status().as_u16(), 200);
    assert_eq!(
        allowed
            .headers()
            .get("access-control-allow-origin")
            .and_then(|value| value.to_str().ok()),
        Some(ui)
    );
    allowed
        .body_mut()
        .read_to_string()
        .expect("the answer's body");
    let other = answer(send(
        agent()
            .post(server.url("/v1/chat/completions"))
            .header("Origin", "http://evil.example"),
        &body,
    ));
    assert_eq!(other.status, 403, "{}", other.body);
}

#[test]
fn tokenize_detokenize_and_llama_server_fields() {
    let _guard = exclusive();
    let server = Server::start(&[]);
    let text = "Hello world, 1 2 3";
    let tokens = post(&server, "/tokenize", &json!({"content": text}));
    assert_eq!(tokens.status, 200, "{}", tokens.body);
    let ids = tokens.body["tokens"].clone();
    assert!(
        ids.as_array().is_some_and(|ids| ids.len() > 3),
        "{}",
        tokens.body
    );
    let pieces = post(
        &server,
        "/tokenize",
        &json!({"content": text, "with_pieces": true}),
    );
    let joined: String = pieces.body["tokens"]
        .as_array()
        .expect("pieces")
        .iter()
        .map(|token| token["piece"].as_str().expect("ASCII pieces are text"))
        .collect();
    assert_eq!(joined, text);
    let back = post(&server, "/detokenize", &json!({"tokens": ids}));
    assert_eq!(back.body["content"], text, "{}", back.body);
    let outside = post(&server, "/detokenize", &json!({"tokens": [999_999_999]}));
    assert_eq!(outside.status, 400, "{}", outside.body);

    // llama-server's fields: harmless ones pass, n_predict is max_tokens, the rest are refused.
    let prompt = json!({"prompt": "1, 2, 3, 4, 5,", "temperature": 0});
    let with = |extra: &[(&str, Value)]| {
        let mut body = prompt.clone();
        let fields = body.as_object_mut().expect("object");
        for (name, value) in extra {
            fields.insert((*name).to_owned(), value.clone());
        }
        post(&server, "/completions", &body)
    };
    let harmless = with(&[
        ("n_predict", json!(3)),
        ("cache_prompt", json!(true)),
        ("repeat_penalty", json!(1.0)),
        ("mirostat", json!(0)),
    ]);
    assert_eq!(harmless.status, 200, "{}", harmless.body);
    let timings = &harmless.body["timings"];
    assert_eq!(
        timings["predicted_n"], 3,
        "llama-server's timings: {timings}"
    );
    assert!(
        timings["prompt_n"].as_u64().is_some_and(|n| n > 0),
        "{timings}"
    );
    assert!(timings["draft_n_accepted"].as_u64() <= timings["draft_n"].as_u64());
    assert_eq!(
        harmless.body["usage"]["completion_tokens"], 3,
        "{}",
        harmless.body
    );
    for (field, value) in [
        ("grammar", json!("root ::= (")),
        ("json_schema", json!(3)),
        ("grammar_lazy", json!(true)),
        ("repeat_penalty", json!(1.2)),
        ("frobnicate", json!(true)),
    ] {
        let refused = with(&[(field, value)]);
        assert_eq!(refused.status, 400, "{field}: {}", refused.body);
        assert_eq!(refused.body["error"]["param"], field, "{}", refused.body);
    }

    // Without max_tokens, a prompt near the end of the context generates to its end and
    // finishes with `length` (OpenAI's and llama-server's behaviour), not a 400.
    let numbers: String = (1..900).map(|n| format!("{n}, ")).collect();
    let counted = post(&server, "/tokenize", &json!({"content": numbers}));
    let mut prompt: Vec<Value> = counted.body["tokens"].as_array().expect("tokens").clone();
    let ctx: usize = CTX_SIZE.parse().expect("a number");
    assert!(prompt.len() > ctx, "{} tokens", prompt.len());
    prompt.truncate(ctx - 4);
    let near_end = post(
        &server,
        "/completions",
        &json!({"prompt": prompt, "temperature": 0}),
    );
    assert_eq!(near_end.status, 200, "{}", near_end.body);
    assert_eq!(near_end.body["choices"][0]["finish_reason"], "length");
    assert_eq!(
        near_end.body["usage"]["completion_tokens"], 4,
        "{}",
        near_end.body
    );
    prompt.resize(ctx, json!(5));
    let full = post(&server, "/completions", &json!({"prompt": prompt}));
    assert_eq!(full.status, 400, "{}", full.body);
    let message = full.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("leaves no room to generate"), "{message}");
}

#[test]
fn several_hosts_slots_templates_and_assistant_prefill() {
    let _guard = exclusive();
    // 127.0.0.2 is loopback on Linux too: a second address without IPv6. The server writes one
    // `listening on` line per address to a stdout already closed (as `| head -1` leaves it), and
    // serves on (a panic on the broken pipe once stopped it when the reader was fast).
    let server = Server::start_with_stdout_closed(&["--host", "127.0.0.1,127.0.0.2"]);
    let port = server.base.rsplit(':').next().expect("a port").to_owned();
    let second = format!("http://127.0.0.2:{port}");
    for base in [server.base.clone(), second.clone()] {
        let health = answer(agent().get(format!("{base}/health")).call());
        assert_eq!(health.status, 200, "{base}: {}", health.body);
    }

    let slots = get(&server, "/slots", None);
    assert_eq!(slots.status, 200, "{}", slots.body);
    assert_eq!(slots.body[0]["id"], 0, "{}", slots.body);
    assert_eq!(slots.body[0]["is_processing"], false, "{}", slots.body);
    assert_eq!(get(&server, "/slots?fail_on_no_slot=1", None).status, 200);
    assert_eq!(get(&server, "/slots?frobnicate=2", None).status, 400);

    let user = json!({"role": "user", "content": "Count from 1 to 10."});
    let started = json!({"role": "assistant", "content": "1, 2, 3, 4,"});
    let templated = post(&server, "/apply-template", &json!({"messages": [user]}));
    assert_eq!(templated.status, 200, "{}", templated.body);
    let prompt = templated.body["prompt"].as_str().expect("prompt text");
    assert!(prompt.contains("Count from 1 to 10."), "{prompt}");
    assert!(prompt.ends_with("<|im_start|>assistant\n"), "{prompt:?}");
    // The last message is the assistant's: its answer is continued, not answered anew.
    let prefilled = post(
        &server,
        "/apply-template",
        &json!({"messages": [user, started]}),
    );
    let prefilled = prefilled.body["prompt"].as_str().expect("prompt text");
    assert_eq!(prefilled, format!("{prompt}1, 2, 3, 4,"));
    let new_turn = post(
        &server,
        "/apply-template",
        &json!({"messages": [user, started], "continue_final_message": false}),
    );
    let new_turn = new_turn.body["prompt"].as_str().expect("prompt text");
    assert!(
        new_turn.ends_with("<|im_start|>assistant\n"),
        "{new_turn:?}"
    );

    let body = json!({"messages": [user, started], "max_tokens": 8, "temperature": 0});
    let continued = post(&server, "/v1/chat/completions", &body);
    let text = chat_text(&continued);
    assert!(text.contains('5') && !text.contains("1, 2"), "{text:?}");
    let completion = post(
        &server,
        "/v1/completions",
        &json!({"prompt": prefilled, "max_tokens": 8, "temperature": 0}),
    );
    assert_eq!(completion.body["choices"][0]["text"], text.as_str());
    let refused = post(
        &server,
        "/v1/chat/completions",
        &json!({"messages": [user], "continue_final_message": true, "max_tokens": 4}),
    );
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert_eq!(refused.body["error"]["param"], "continue_final_message");
    server.terminate();
}

#[test]
fn chat_templates_by_name_from_a_jinja_file_and_the_ggufs_as_jinja() {
    let _guard = exclusive();
    let conversation = json!({"messages": [{"role": "user", "content": "  Hi  "}]});
    let template_of = |args: &[&str]| {
        let server = Server::start(&[&["--cascade", "none"], args].concat());
        let templated = post(&server, "/apply-template", &conversation);
        assert_eq!(templated.status, 200, "{args:?}: {}", templated.body);
        let chat = post(
            &server,
            "/v1/chat/completions",
            &chat_body("Hi", 2, json!({})),
        );
        assert_eq!(chat.status, 200, "{args:?}: {}", chat.body);
        let props = get(&server, "/props", None);
        server.terminate();
        (
            templated.body["prompt"].as_str().expect("text").to_owned(),
            props.body["chat_template"]
                .as_str()
                .unwrap_or("")
                .to_owned(),
        )
    };
    // SmolLM2's own template adds a system prompt when there is none; llama.cpp's ChatML,
    // which it resembles, does not.
    let (builtin, _) = template_of(&[]);
    assert!(!builtin.contains("SmolLM"), "{builtin}");
    let (jinja, _) = template_of(&["--jinja"]);
    assert!(
        jinja.starts_with("<|im_start|>system\nYou are a helpful AI assistant named SmolLM"),
        "{jinja}"
    );
    assert!(jinja.ends_with(&builtin), "{jinja:?} then {builtin:?}");
    let (llama3, _) = template_of(&["--chat-template", "llama3"]);
    assert!(
        llama3.contains("<|start_header_id|>user<|end_header_id|>"),
        "{llama3}"
    );

    let file = common::scratch_file("compat", "template.jinja");
    let source = "{% for m in messages %}[{{ m.role | upper }}] {{ m.content.strip() }}\n{% endfor %}{% if add_generation_prompt %}[ASSISTANT] {% endif %}";
    std::fs::write(&file, source).expect("template file");
    let (custom, shown) = template_of(&["--chat-template", common::arg(&file)]);
    assert_eq!(custom, "[USER] Hi\n[ASSISTANT] ");
    assert_eq!(shown, source, "/props shows the template in use");

    let bad = common::scratch_file("compat", "bad.jinja");
    std::fs::write(&bad, "{% for %}").expect("template file");
    for (value, needles) in [
        ("nonsense", &["--chat-template nonsense", "built-in"][..]),
        (common::arg(&bad), &["not a valid Jinja template"][..]),
    ] {
        let output = common::spechost(&[
            "serve",
            "--model",
            "smollm2",
            "--port",
            "0",
            "--cascade",
            "none",
            "--chat-template",
            value,
        ]);
        common::assert_fails_with(&output, needles);
    }
}
