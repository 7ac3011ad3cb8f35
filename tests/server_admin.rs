//! `spechost serve`'s admin API on the default model: authentication, hot swaps of the cascade
//! and of plugin files while requests stream (every output still identical to plain decoding),
//! the plugin directory watcher, and plugin paths confined to the plugin directories.
//!
//! Each test starts its own server and kills it at the end (`common::server`).

mod common;

use common::exclusive;
use common::server::*;
use serde_json::json;

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
    let prompts = drafting_prompts();
    let max_tokens = 64;
    let plain = plain_answers(&server, &prompts, max_tokens);

    // The client streams one request after another with the default cascade and says when
    // each has started, so that every swap lands while a request is in flight.
    let client = StreamingClient::start(&server, prompts.clone(), max_tokens);

    let cascades = [
        "swapped",
        "suffix,swapped",
        "swapped,lookup",
        "lookup,swapped",
    ];
    for round in 0..10 {
        client.wait_for_request();
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
    client.wait_for_request();

    let results = client.stop();
    assert!(results.len() >= 11, "only {} requests ran", results.len());
    let swaps = assert_plain_answers(&results, &plain);
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
    let sha = |server: &Server| plugin_sha(server, "watched").expect("a `watched` plugin");
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
