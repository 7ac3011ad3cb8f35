//! Replicas sharing through Redis (`spechost serve --share redis://HOST:PORT/NAMESPACE`) on the
//! default model: responses reach the other replica's `suffix` drafter (an extract-style
//! workload alternating between two replicas drafts more with sharing than without, with the
//! same outputs), an admin update or a watched file's reload on one replica is live on the
//! other, Redis stopping mid-run fails no request and the replicas catch up when it returns,
//! and entries of another namespace or model, or malformed ones, are ignored and counted.
//!
//! Each test starts its own redis-server (installed by `scripts/test.sh`) on a free loopback
//! port, without persistence, and its own servers, and kills them at the end.

mod common;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::exclusive;
use common::server::*;
use serde_json::{Value, json};

/// Lines of the IANA protocol numbers table, as in the `extract` workload.
const PROTOCOL_LINES: [&str; 12] = [
    "ip\t0\tIP\t\t# internet protocol, pseudo protocol number",
    "icmp\t1\tICMP\t\t# internet control message protocol",
    "igmp\t2\tIGMP\t\t# Internet Group Management",
    "ggp\t3\tGGP\t\t# gateway-gateway protocol",
    "ipencap\t4\tIP-ENCAP\t# IP encapsulated in IP (officially ``IP'')",
    "st\t5\tST\t\t# ST datagram mode",
    "tcp\t6\tTCP\t\t# transmission control protocol",
    "egp\t8\tEGP\t\t# exterior gateway protocol",
    "igp\t9\tIGP\t\t# any private interior gateway (Cisco)",
    "pup\t12\tPUP\t\t# PARC universal packet protocol",
    "udp\t17\tUDP\t\t# user datagram protocol",
    "hmp\t20\tHMP\t\t# host monitoring protocol",
];

/// More lines, for tasks a client repeats: each is asked twice in a row, so the two
/// replicas get it in turn.
const REPEATED_LINES: [&str; 6] = [
    "xns-idp\t22\tXNS-IDP\t\t# Xerox NS IDP",
    "rdp\t27\tRDP\t\t# \"reliable datagram\" protocol",
    "iso-tp4\t29\tISO-TP4\t\t# ISO Transport Protocol class 4 [RFC905]",
    "dccp\t33\tDCCP\t\t# Datagram Congestion Control Prot. [RFC4340]",
    "xtp\t36\tXTP\t\t# Xpress Transfer Protocol",
    "ddp\t37\tDDP\t\t# Datagram Delivery Protocol",
];

/// Tokens generated per request.
const MAX_TOKENS: usize = 64;

fn extract_prompt(line: &str) -> String {
    format!(
        "Convert this line of the IANA protocol numbers table into a JSON object with the keys \"name\", \"number\", \"aliases\", \"comment\". Answer with the JSON object only.\n\n{line}"
    )
}

/// A redis-server child process on loopback, without persistence, killed on drop.
struct Redis {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Redis {
    /// Starts redis-server on a free port.
    fn start(name: &str) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        Self::start_on(port, scratch(&format!("redis-{name}")))
    }

    /// Starts redis-server on `port`, working in `dir`, and waits until it answers.
    fn start_on(port: u16, dir: PathBuf) -> Self {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start redis-server ({e}); scripts/test.sh installs it (apt package redis-server)")
            });
        let redis = Self { child, port, dir };
        let started = Instant::now();
        while redis.connection().is_err() {
            assert!(started.elapsed() < PATIENCE, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        redis
    }

    fn url(&self, namespace: &str) -> String {
        format!("redis://127.0.0.1:{}/{namespace}", self.port)
    }

    fn connection(&self) -> redis::RedisResult<redis::Connection> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", self.port))?;
        let mut connection = client.get_connection_with_timeout(Duration::from_secs(1))?;
        redis::cmd("PING").query::<String>(&mut connection)?;
        Ok(connection)
    }

    /// Stops the server (its data is gone: it keeps none) and returns its port and directory,
    /// to start it again there.
    fn stop(mut self) -> (u16, PathBuf) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        (self.port, self.dir.clone())
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A replica of the default model with `--share URL` (none when `None`), `--cascade suffix`
/// and a fixed draft length verified whole, so the test measures what the drafter knows, and
/// the admin API.
fn replica(share: Option<&str>, extra: &[&str]) -> Server {
    let mut args = vec![
        "--cascade",
        "suffix",
        "--policy",
        "fixed,k=8",
        "--draft-cut",
        "off",
        "--admin-token",
        ADMIN_TOKEN,
    ];
    if let Some(url) = share {
        args.extend(["--share", url]);
    }
    args.extend(extra);
    Server::start(&args)
}

fn share_health(server: &Server) -> Value {
    let health = get(server, "/health", None);
    assert_eq!(health.status, 200, "{}", health.body);
    health.body["share"].clone()
}

fn received(server: &Server) -> u64 {
    share_health(server)["received_responses"]
        .as_u64()
        .expect("received_responses")
}

/// A greedy chat request with the server's defaults; its text and the `speculative` block.
fn ask(server: &Server, prompt: &str) -> (String, Value) {
    let answer = post(
        server,
        "/v1/chat/completions",
        &chat_body(prompt, MAX_TOKENS, json!({})),
    );
    let text = chat_text(&answer);
    (text, answer.body["speculative"].clone())
}

/// What a workload alternating between two replicas cost: the verify rounds (after each
/// request's first token) and the tokens generated after the first, summed.
#[derive(Debug, Default)]
struct Alternating {
    texts: Vec<String>,
    rounds: u64,
    tokens_after_first: u64,
}

impl Alternating {
    /// Tokens generated per verify round: 1 for plain decoding, more the more drafts were
    /// accepted.
    fn tokens_per_round(&self) -> f64 {
        self.tokens_after_first as f64 / self.rounds as f64
    }
}

/// The extract prompts of `lines`, in order.
fn prompts(lines: &[&str]) -> Vec<String> {
    lines.iter().map(|line| extract_prompt(line)).collect()
}

/// The extract prompts of `REPEATED_LINES`, each twice in a row.
fn repeated_prompts() -> Vec<String> {
    prompts(&REPEATED_LINES)
        .into_iter()
        .flat_map(|prompt| [prompt.clone(), prompt])
        .collect()
}

/// Sends `prompts` to the two `replicas` in turn, after `earlier` requests were sent the same
/// way. With `wait_for_sharing`, before each request waits until its replica has received every
/// response the other finished, so the comparison does not depend on how fast Redis delivers.
fn alternate(
    replicas: [&Server; 2],
    prompts: &[String],
    earlier: usize,
    wait_for_sharing: bool,
) -> Alternating {
    let mut run = Alternating::default();
    for (i, prompt) in prompts.iter().enumerate() {
        let server = replicas[i % 2];
        if wait_for_sharing {
            // The other replica served every other request so far: the odd-numbered ones
            // before an even-numbered request, the even-numbered ones (the one just before
            // among them) before an odd-numbered one.
            let expected = (earlier + i).div_ceil(2) as u64;
            wait_for(server, "the other replica's responses", || {
                received(server) >= expected
            });
        }
        let (text, speculative) = ask(server, prompt);
        run.texts.push(text);
        run.rounds += speculative["rounds"].as_u64().expect("rounds");
        run.tokens_after_first += speculative["rounds"].as_u64().expect("rounds")
            + speculative["accepted"].as_u64().expect("accepted");
    }
    run
}

#[test]
fn replicas_sharing_their_responses_draft_more_and_answer_the_same() {
    let _guard = exclusive();
    let (distinct, repeated) = (prompts(&PROTOCOL_LINES), repeated_prompts());
    let (alone_a, alone_b) = (replica(None, &[]), replica(None, &[]));
    let alone = alternate([&alone_a, &alone_b], &distinct, 0, false);
    let alone_repeated = alternate([&alone_a, &alone_b], &repeated, distinct.len(), false);
    assert!(
        share_health(&alone_a).is_null(),
        "no share block without --share"
    );
    drop((alone_a, alone_b));

    let redis = Redis::start("alternate");
    let url = redis.url("extract");
    let (a, b) = (replica(Some(&url), &[]), replica(Some(&url), &[]));
    let shared = alternate([&a, &b], &distinct, 0, true);
    assert_eq!(
        shared.texts, alone.texts,
        "sharing changes what drafters know, never the output"
    );
    // Each replica's last response reaches the other after its request has returned.
    for server in [&a, &b] {
        wait_for(server, "the other replica's last response", || {
            received(server) >= (distinct.len() / 2) as u64
        });
    }
    let health = share_health(&a);
    assert_eq!(health["connected"], true, "{health}");
    assert_eq!(health["namespace"], "extract");
    assert_eq!(health["published_responses"], distinct.len() / 2);
    assert_eq!(health["received_responses"], distinct.len() / 2);
    let page = metrics(&b);
    assert_eq!(
        sample(&page, "spechost_shared_responses_total{origin=\"replica\"}"),
        (distinct.len() / 2) as f64
    );
    assert_eq!(sample(&page, "spechost_share_connected"), 1.0);
    let shared_repeated = alternate([&a, &b], &repeated, distinct.len(), true);
    assert_eq!(shared_repeated.texts, alone_repeated.texts);

    // The speedup speculation gives over plain decoding is, in target passes, the tokens
    // generated per verify round (plain decoding: 1).
    for (workload, alone, shared) in [
        ("distinct", &alone, &shared),
        ("repeated", &alone_repeated, &shared_repeated),
    ] {
        eprintln!(
            "tokens per verify round, {} {workload} extract requests alternating between two replicas: alone {:.3} ({} rounds), sharing {:.3} ({} rounds)",
            alone.texts.len(),
            alone.tokens_per_round(),
            alone.rounds,
            shared.tokens_per_round(),
            shared.rounds
        );
        assert!(
            shared.rounds < alone.rounds,
            "sharing must save verify rounds on {workload} requests: alone {alone:?}, shared {shared:?}"
        );
    }
    // A task one replica served is one the other drafts whole: a repeated task pays off once
    // for the fleet, not once per replica.
    let gain = shared_repeated.tokens_per_round() / alone_repeated.tokens_per_round();
    assert!(
        gain >= 1.3,
        "sharing must speed repeated tasks up by 1.3x or more in verify rounds, got {gain:.2}x"
    );
}

#[test]
fn an_admin_update_on_one_replica_is_live_on_the_other() {
    let _guard = exclusive();
    let redis = Redis::start("admin");
    let url = redis.url("admin");
    // A loads a plugin file B does not have: B takes it from Redis.
    let plugins = scratch("share-admin-plugins");
    install(&built("lookup"), &plugins.join("lookup_v2.wasm"));
    install(&built("policy_fixed"), &plugins.join("fixed_v2.wasm"));
    let plugin_dir = plugins.to_str().expect("UTF-8 path");
    let a = replica(Some(&url), &["--plugin-dir", plugin_dir]);
    let b = replica(Some(&url), &[]);
    wait_for(&b, "B connected", || share_health(&b)["connected"] == true);

    let before = share_health(&b)["applied_generation"].as_u64().unwrap_or(0);
    let updated = admin_put(
        &a,
        "/admin/cascade",
        &json!({
            "cascade": "lookup_v2.wasm,suffix",
            "draft_max": 6,
            "plugin_configs": {"suffix": {"max_depth": 32}},
        }),
    );
    assert_eq!(updated.status, 200, "{}", updated.body);
    let published_at = Instant::now();
    wait_for(&a, "A published", || {
        share_health(&a)["applied_generation"].as_u64() > Some(before)
    });
    let generation = share_health(&a)["applied_generation"].clone();
    wait_for(&b, "B applied A's update", || {
        share_health(&b)["applied_generation"] == generation
    });
    let took = published_at.elapsed();
    eprintln!("A's update was live on B after {took:?}");
    assert!(
        took <= Duration::from_secs(2),
        "an update must be live on every replica within 2 s, took {took:?}"
    );
    let shown = get(&b, "/admin/cascade", Some(ADMIN_TOKEN));
    assert_eq!(shown.status, 200, "{}", shown.body);
    assert_eq!(
        shown.body["defaults"]["cascade"],
        json!(["lookup_v2", "suffix"])
    );
    assert_eq!(shown.body["defaults"]["draft_max"], 6);
    let sha = |view: &Value, name: &str| {
        view["plugins"]
            .as_array()
            .and_then(|plugins| plugins.iter().find(|p| p["name"] == name))
            .map(|p| p["sha256"].clone())
            .unwrap_or_else(|| panic!("no plugin {name} in {view}"))
    };
    assert_eq!(
        sha(&shown.body, "lookup_v2"),
        sha(&updated.body, "lookup_v2")
    );
    let suffix = shown.body["plugins"]
        .as_array()
        .and_then(|plugins| plugins.iter().find(|p| p["name"] == "suffix"))
        .expect("suffix")
        .clone();
    assert_eq!(suffix["config"], "max_depth=32");

    // A policy file B lacks travels the same way, with its settings.
    let with_policy = admin_put(
        &a,
        "/admin/cascade",
        &json!({"policy": "fixed_v2.wasm,k=3"}),
    );
    assert_eq!(with_policy.status, 200, "{}", with_policy.body);
    let generation = share_health(&a)["applied_generation"].as_u64();
    wait_for(&a, "A published the policy", || {
        share_health(&a)["applied_generation"].as_u64() > generation
    });
    let generation = share_health(&a)["applied_generation"].clone();
    wait_for(&b, "B applied A's policy", || {
        share_health(&b)["applied_generation"] == generation
    });
    let shown = get(&b, "/admin/cascade", Some(ADMIN_TOKEN));
    assert_eq!(shown.body["defaults"]["policy"], "fixed_v2,k=3");
    let policy_sha = |view: &Value| {
        view["policies"]
            .as_array()
            .and_then(|policies| policies.iter().find(|p| p["name"] == "fixed_v2"))
            .map(|p| p["sha256"].clone())
            .unwrap_or_else(|| panic!("no policy fixed_v2 in {view}"))
    };
    assert_eq!(policy_sha(&shown.body), policy_sha(&with_policy.body));

    // B drafts with the new defaults, and its output is still plain decoding's.
    let prompt = extract_prompt(PROTOCOL_LINES[6]);
    let plain = plain_answers(&b, std::slice::from_ref(&prompt), MAX_TOKENS);
    let (text, speculative) = ask(&b, &prompt);
    assert_eq!(text, plain[0]);
    assert_eq!(speculative["cascade"], json!(["lookup_v2", "suffix"]));
    assert_eq!(speculative["policy"], "fixed_v2,k=3");
    let page = metrics(&b);
    assert_eq!(
        sample(&page, "spechost_share_updates_total{outcome=\"applied\"}"),
        2.0
    );
}

#[test]
fn a_plugin_file_reloaded_by_one_replicas_watcher_is_live_on_the_other() {
    let _guard = exclusive();
    let redis = Redis::start("watch");
    let url = redis.url("watch");
    let watched_dir = scratch("share-watch");
    let watched = watched_dir.join("watched.wasm");
    install(&built("lookup"), &watched);
    let dir = watched_dir.to_str().expect("UTF-8 path");
    let a = replica(Some(&url), &["--plugin-dir", dir, "--watch", dir]);
    let b = replica(Some(&url), &[]);
    wait_for(&b, "B connected", || share_health(&b)["connected"] == true);
    let sha = |server: &Server| plugin_sha(server, "watched");
    let updated = admin_put(
        &a,
        "/admin/cascade",
        &json!({"cascade": "watched.wasm,suffix"}),
    );
    assert_eq!(updated.status, 200, "{}", updated.body);
    wait_for(&b, "B applied A's cascade", || {
        sha(&b).is_some() && sha(&b) == sha(&a)
    });
    let before = sha(&a);

    // The watcher on A sees a new build of the file: A reloads it and publishes it, B takes
    // the new bytes from Redis.
    install(&built("suffix"), &watched);
    wait_for(&a, "A reloaded the changed file", || sha(&a) != before);
    wait_for(&b, "B took A's reloaded file", || sha(&b) == sha(&a));
    let prompt = extract_prompt(PROTOCOL_LINES[3]);
    let plain = plain_answers(&b, std::slice::from_ref(&prompt), MAX_TOKENS);
    let (text, speculative) = ask(&b, &prompt);
    assert_eq!(text, plain[0]);
    assert_eq!(speculative["cascade"], json!(["watched", "suffix"]));
    let _ = std::fs::remove_dir_all(&watched_dir);
}

#[test]
fn replicas_serve_alone_without_redis_and_catch_up_when_it_returns() {
    let _guard = exclusive();
    let redis = Redis::start("outage");
    let url = redis.url("outage");
    let (a, b) = (replica(Some(&url), &[]), replica(Some(&url), &[]));
    ask(&a, &extract_prompt(PROTOCOL_LINES[0]));
    wait_for(&b, "B received A's response", || received(&b) == 1);

    let (port, dir) = redis.stop();
    wait_for(&a, "A saw Redis go", || {
        share_health(&a)["connected"] == false
    });
    let prompts: Vec<String> = PROTOCOL_LINES[1..5]
        .iter()
        .map(|l| extract_prompt(l))
        .collect();
    for (i, prompt) in prompts.iter().enumerate() {
        let server = if i % 2 == 0 { &a } else { &b };
        let answer = post(
            server,
            "/v1/chat/completions",
            &chat_body(prompt, MAX_TOKENS, json!({})),
        );
        assert_eq!(
            answer.status, 200,
            "no request fails without Redis: {}",
            answer.body
        );
    }
    assert_eq!(share_health(&b)["connected"], false);

    let _redis = Redis::start_on(port, dir);
    // Each replica publishes what it queued while Redis was gone, and reads the other's.
    wait_for(&b, "B caught up with A's responses", || received(&b) == 3);
    wait_for(&a, "A caught up with B's responses", || received(&a) == 2);
    for server in [&a, &b] {
        let health = share_health(server);
        assert_eq!(health["connected"], true, "{health}");
        assert_eq!(health["dropped"], 0, "{health}");
    }
    let log = a.terminate();
    assert_eq!(
        log.matches("lost the shared Redis").count(),
        1,
        "one warning per outage, not one per retry:\n{log}"
    );
    assert!(
        log.matches("cannot reach the shared Redis").count() <= 1,
        "retries are not logged at warn level:\n{log}"
    );
}

#[test]
fn foreign_and_malformed_entries_are_ignored_and_counted() {
    let _guard = exclusive();
    let redis = Redis::start("garbage");
    let a = replica(Some(&redis.url("tenant-a")), &[]);
    let other_tenant = replica(Some(&redis.url("tenant-b")), &[]);
    let (text, _) = ask(&a, &extract_prompt(PROTOCOL_LINES[2]));
    assert!(!text.is_empty());

    let mut connection = redis.connection().expect("redis answers");
    let token = |t: u32| t.to_le_bytes().to_vec();
    let xadd = |connection: &mut redis::Connection, stream: &str, fields: &[(&str, Vec<u8>)]| {
        let mut command = redis::cmd("XADD");
        command.arg(stream).arg("*");
        for (name, value) in fields {
            command.arg(*name).arg(value.as_slice());
        }
        command.query::<String>(connection).expect("XADD");
    };
    let entry = |namespace: &str, model: &str, tokens: Vec<u8>| {
        vec![
            ("replica", b"intruder".to_vec()),
            ("namespace", namespace.as_bytes().to_vec()),
            ("model", model.as_bytes().to_vec()),
            ("tokens", tokens),
        ]
    };
    // Another tenant's namespace written into this one's stream, and another model's tokens.
    xadd(
        &mut connection,
        "tenant-a:responses",
        &entry("tenant-b", "any", token(1)),
    );
    xadd(
        &mut connection,
        "tenant-a:responses",
        &entry("tenant-a", "another-model", token(1)),
    );
    // Malformed: half a token, a token outside the vocabulary, no namespace nor tokens; and an
    // update nobody signed.
    let fingerprint_of_a = fingerprint(&redis);
    xadd(
        &mut connection,
        "tenant-a:responses",
        &entry("tenant-a", &fingerprint_of_a, vec![1, 2, 3]),
    );
    xadd(
        &mut connection,
        "tenant-a:responses",
        &entry("tenant-a", &fingerprint_of_a, token(u32::MAX)),
    );
    xadd(
        &mut connection,
        "tenant-a:responses",
        &[("replica", b"intruder".to_vec())],
    );
    xadd(
        &mut connection,
        "tenant-a:updates",
        &[
            ("replica", b"intruder".to_vec()),
            ("namespace", b"tenant-a".to_vec()),
            ("generation", b"99".to_vec()),
            ("update", b"{\"cascade\": \"rm -rf\"}".to_vec()),
        ],
    );
    // A well-formed response of the same model and namespace is taken.
    xadd(
        &mut connection,
        "tenant-a:responses",
        &entry("tenant-a", &fingerprint_of_a, token(1)),
    );

    // The well-formed entry is the stream's last: once it is taken, every entry was read.
    wait_for(&a, "A read every entry", || {
        let health = share_health(&a);
        health["received_responses"].as_u64() >= Some(1) && health["ignored_unsigned"] == 1
    });
    let health = share_health(&a);
    assert_eq!(health["ignored_foreign"], 2, "{health}");
    assert_eq!(health["ignored_malformed"], 3, "{health}");
    assert_eq!(received(&a), 1, "only the well-formed entry is taken");
    assert_eq!(
        share_health(&a)["applied_generation"],
        0,
        "an update not signed with the admin token is not applied"
    );
    assert_eq!(received(&other_tenant), 0, "namespaces are isolated");
    let page = metrics(&a);
    assert_eq!(
        sample(&page, "spechost_share_ignored_total{reason=\"foreign\"}"),
        2.0
    );
    assert_eq!(
        sample(&page, "spechost_share_ignored_total{reason=\"malformed\"}"),
        3.0
    );
    assert_eq!(
        sample(&page, "spechost_share_ignored_total{reason=\"unsigned\"}"),
        1.0
    );
    // The replica serves on.
    let (again, _) = ask(&a, &extract_prompt(PROTOCOL_LINES[2]));
    assert_eq!(again, text);
}

/// The model fingerprint replicas of the default model write, read from an entry of theirs.
fn fingerprint(redis: &Redis) -> String {
    let mut connection = redis.connection().expect("redis answers");
    let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg("tenant-a:responses")
        .arg("-")
        .arg("+")
        .arg("COUNT")
        .arg(1)
        .query(&mut connection)
        .expect("XRANGE");
    let entry = reply.ids.first().expect("A's response is in the stream");
    entry.get::<String>("model").expect("model field")
}
