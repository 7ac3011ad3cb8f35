//! The harness of the `spechost serve` tests: a server child process on loopback with the
//! default model (SmolLM2-135M), a blocking HTTP client, and readers of answers, streams and
//! metrics. Each test starts its own server (`--port 0`, address read from stdout) and kills it
//! at the end.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use spechost::config::cache_dir;
use spechost::models::DefaultModel;

use super::{fixtures, wasm_dir};

/// Admin token of the servers that have one.
pub const ADMIN_TOKEN: &str = "test-admin-token";
/// Context of every test server, in tokens (fits every fixture prompt plus its output).
pub const CTX_SIZE: &str = "2048";
/// How long a test waits for something the server does in the background (a watched file
/// reloaded, a cancelled request counted). Waiting is not timing: it only bounds a hang.
pub const PATIENCE: Duration = Duration::from_secs(120);

/// A `spechost serve` child process, killed on drop.
pub struct Server {
    pub child: Child,
    pub base: String,
    log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts `spechost serve --model smollm2 --port 0 --ctx-size 2048 --public-metrics ARGS`
    /// (`ARGS` may give its own `--ctx-size`) and waits for its `listening on` line.
    pub fn start(args: &[&str]) -> Self {
        Self::start_exact(&[&["--public-metrics"], args].concat())
    }

    /// [`Self::start`] without `--public-metrics`.
    pub fn start_exact(args: &[&str]) -> Self {
        let model = DefaultModel::SmolLm2.path(&cache_dir());
        assert!(
            model.exists(),
            "{} is missing; fetch it with `spechost models fetch smollm2`",
            model.display()
        );
        Self::launch("smollm2", args)
    }

    /// [`Self::start`] on another target: `model` is a path or a default model's name.
    pub fn start_with_model(model: &str, args: &[&str]) -> Self {
        Self::launch(model, &[&["--public-metrics"], args].concat())
    }

    /// [`Self::start`] with stdout closed before the server writes to it, as `spechost serve |
    /// head -1` leaves it after the first line; the address is read from the log instead.
    pub fn start_with_stdout_closed(args: &[&str]) -> Self {
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let args = [&["--public-metrics"], args].concat();
        let (mut child, log) = Self::spawn("smollm2", &args, writer.into());
        let started = Instant::now();
        let base = loop {
            let text = log.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let address = text
                .lines()
                .find(|line| line.contains(" serving "))
                .and_then(|line| line.split_once("address="))
                .and_then(|(_, rest)| rest.split([',', ' ']).next());
            if let Some(address) = address {
                break format!("http://{address}");
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("spechost serve stopped ({status}); its log:\n{text}");
            }
            assert!(
                started.elapsed() < PATIENCE,
                "spechost serve did not start; its log:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        Self { child, base, log }
    }

    fn launch(model: &str, args: &[&str]) -> Self {
        let (mut child, log) = Self::spawn(model, args, Stdio::piped());
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut line = String::new();
        let read = BufReader::new(stdout).read_line(&mut line);
        let base = match line.trim().strip_prefix("listening on ") {
            Some(base) if read.is_ok() => base.to_owned(),
            _ => {
                let status = child.wait();
                std::thread::sleep(Duration::from_millis(200));
                panic!(
                    "spechost serve did not start ({status:?}, stdout {line:?}); its log:\n{}",
                    log.lock().unwrap_or_else(|e| e.into_inner())
                );
            }
        };
        Self { child, base, log }
    }

    /// Spawns `spechost serve --model MODEL --port 0 --ctx-size 2048 ARGS` with `stdout`, and
    /// collects its stderr into the returned log.
    fn spawn(model: &str, args: &[&str], stdout: Stdio) -> (Child, Arc<Mutex<String>>) {
        let default_ctx: &[&str] = if args.contains(&"--ctx-size") {
            &[]
        } else {
            &["--ctx-size", CTX_SIZE]
        };
        let mut child = Command::new(env!("CARGO_BIN_EXE_spechost"))
            .args(["serve", "--model", model, "--port", "0"])
            .args(default_ctx)
            .args(args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(Stdio::piped())
            .spawn()
            .expect("spechost serve starts");
        let log = Arc::new(Mutex::new(String::new()));
        let mut stderr = child.stderr.take().expect("stderr is piped");
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buffer) {
                if n == 0 {
                    break;
                }
                let text = String::from_utf8_lossy(&buffer[..n]).into_owned();
                sink.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push_str(&text);
            }
        });
        (child, log)
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Stops the server as a service manager would (SIGTERM), waits for it to exit and returns
    /// its log.
    pub fn terminate(mut self) -> String {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status();
        assert!(
            sent.is_ok_and(|status| status.success()),
            "kill -TERM {pid}"
        );
        let started = Instant::now();
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    // The log reader may still be reading the last lines.
                    std::thread::sleep(Duration::from_millis(200));
                    let log = self.log();
                    assert!(status.success(), "exit {status:?}; log:\n{log}");
                    return log;
                }
                Ok(None) if started.elapsed() < PATIENCE => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                other => panic!("the server did not stop on SIGTERM: {other:?}"),
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP client that returns error statuses as responses.
pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into()
}

/// Sends `body` as compact JSON (ureq's `send_json` pretty-prints, which would distort the
/// body-size limits under test).
pub fn send(
    request: ureq::RequestBuilder<ureq::typestate::WithBody>,
    body: &Value,
) -> Result<ureq::http::Response<ureq::Body>, ureq::Error> {
    request
        .header("Content-Type", "application/json")
        .send(body.to_string())
}

/// An answer: status, headers of interest, JSON body.
pub struct Answer {
    pub status: u16,
    pub retry_after: Option<String>,
    pub body: Value,
}

pub fn answer(result: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Answer {
    let mut response = result.expect("the server answers");
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let text = response.body_mut().read_to_string().expect("body");
    let body = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("status {status}: body is not JSON ({e}): {text}"));
    Answer {
        status,
        retry_after,
        body,
    }
}

pub fn post(server: &Server, path: &str, body: &Value) -> Answer {
    answer(send(agent().post(server.url(path)), body))
}

pub fn admin_put(server: &Server, path: &str, body: &Value) -> Answer {
    answer(send(
        agent()
            .put(server.url(path))
            .header("Authorization", format!("Bearer {ADMIN_TOKEN}")),
        body,
    ))
}

pub fn admin_post(server: &Server, path: &str, body: &Value) -> Answer {
    answer(send(
        agent()
            .post(server.url(path))
            .header("Authorization", format!("Bearer {ADMIN_TOKEN}")),
        body,
    ))
}

pub fn get(server: &Server, path: &str, token: Option<&str>) -> Answer {
    let mut request = agent().get(server.url(path));
    if let Some(token) = token {
        request = request.header("Authorization", format!("Bearer {token}"));
    }
    answer(request.call())
}

pub fn metrics(server: &Server) -> String {
    agent()
        .get(server.url("/metrics"))
        .call()
        .expect("metrics answer")
        .body_mut()
        .read_to_string()
        .expect("metrics text")
}

/// The value of a metrics sample (`name{labels}` exactly as rendered), 0 if absent.
pub fn sample(page: &str, name: &str) -> f64 {
    page.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// Waits until `ready` holds, failing after [`PATIENCE`] with `what` and the server's log.
pub fn wait_for(server: &Server, what: &str, mut ready: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ready() {
        assert!(
            started.elapsed() < PATIENCE,
            "gave up waiting for {what}; server log:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A chat body: one user message, greedy, `max_tokens`, plus `extra` fields.
pub fn chat_body(user: &str, max_tokens: usize, extra: Value) -> Value {
    let mut body = json!({
        "model": "smollm2",
        "messages": [{"role": "user", "content": user}],
        "max_tokens": max_tokens,
        "temperature": 0,
    });
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    body
}

pub fn chat_text(answer: &Answer) -> String {
    assert_eq!(answer.status, 200, "chat failed: {}", answer.body);
    answer.body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no content in {}", answer.body))
        .to_owned()
}

/// What a streamed answer delivered.
#[derive(Debug, Default)]
pub struct Streamed {
    pub status: u16,
    /// Every `data:` payload but `[DONE]`, parsed.
    pub chunks: Vec<Value>,
    pub done: bool,
}

impl Streamed {
    /// The text of every chunk's delta (chat) or text (completions), joined.
    pub fn text(&self) -> String {
        self.chunks
            .iter()
            .filter_map(|chunk| {
                let choice = chunk["choices"].get(0)?;
                choice["delta"]["content"]
                    .as_str()
                    .or_else(|| choice["text"].as_str())
            })
            .collect()
    }

    /// The chunk that carries `finish_reason`.
    pub fn last(&self) -> &Value {
        self.chunks
            .iter()
            .rev()
            .find(|chunk| chunk["choices"][0]["finish_reason"].is_string())
            .unwrap_or_else(|| panic!("no chunk with a finish_reason in {:?}", self.chunks))
    }

    pub fn errors(&self) -> Vec<&Value> {
        self.chunks
            .iter()
            .filter(|c| c.get("error").is_some())
            .collect()
    }
}

/// Reads SSE lines from `reader` into `streamed`, calling `on_chunk` after each chunk.
pub fn read_events(reader: impl Read, streamed: &mut Streamed, mut on_chunk: impl FnMut(&Value)) {
    for line in BufReader::new(reader).lines() {
        let line = line.expect("stream line");
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            streamed.done = true;
            break;
        }
        let chunk: Value = serde_json::from_str(data).expect("chunk is JSON");
        on_chunk(&chunk);
        streamed.chunks.push(chunk);
    }
}

/// Posts `body` with `stream: true` to `path` and reads the whole stream.
pub fn stream(server: &Server, path: &str, body: &Value) -> Streamed {
    stream_at(&server.base, path, body, |_| {})
}

/// Like [`stream`], on the server at `base`, calling `on_chunk` after each chunk.
pub fn stream_at(base: &str, path: &str, body: &Value, on_chunk: impl FnMut(&Value)) -> Streamed {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let response = send(agent().post(format!("{base}{path}")), &body).expect("the server answers");
    let mut streamed = Streamed {
        status: response.status().as_u16(),
        ..Streamed::default()
    };
    if streamed.status == 200 {
        read_events(response.into_body().into_reader(), &mut streamed, on_chunk);
    }
    streamed
}

/// The user message of the fixture prompt `id`.
pub fn fixture(id: &str) -> String {
    fixtures()
        .into_iter()
        .find(|f| f.id == id)
        .unwrap_or_else(|| panic!("no fixture {id}"))
        .user_message
}

/// The user messages of four fixture prompts where drafts pay: an edit, an extraction and two
/// HumanEval problems.
#[allow(dead_code)] // Not every test binary uses every helper.
pub fn drafting_prompts() -> Vec<String> {
    [
        "edit-shlex-split",
        "extract-protocols-0",
        "HumanEval-2",
        "HumanEval-5",
    ]
    .iter()
    .map(|id| fixture(id))
    .collect()
}

/// A temporary directory for one test, removed first if a previous run left it.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("spechost-server-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// A built plugin's `.wasm` path (from `scripts/build-plugins.sh`).
pub fn built(stem: &str) -> PathBuf {
    let path = wasm_dir().join(format!("{stem}.wasm"));
    assert!(
        path.exists(),
        "{} is missing; build the plugins with scripts/build-plugins.sh",
        path.display()
    );
    path
}

/// The sha256 `server` shows for its plugin `name` (`GET /admin/cascade`), if it has one.
pub fn plugin_sha(server: &Server, name: &str) -> Option<Value> {
    let shown = get(server, "/admin/cascade", Some(ADMIN_TOKEN));
    shown.body["plugins"]
        .as_array()
        .and_then(|plugins| plugins.iter().find(|p| p["name"] == name))
        .map(|p| p["sha256"].clone())
}

/// Replaces `to` with a copy of `from` in one rename, so no reader sees half a file.
pub fn install(from: &Path, to: &Path) {
    let temp = to.with_extension("wasm.partial");
    std::fs::copy(from, &temp).expect("copy plugin");
    std::fs::rename(&temp, to).expect("rename plugin into place");
}

/// Each of `prompts` answered by `server` with plain decoding (`speculative.cascade: none`),
/// greedy, at most `max_tokens` tokens: what every cascade must answer too.
#[allow(dead_code)] // Not every test binary uses every helper.
pub fn plain_answers(server: &Server, prompts: &[String], max_tokens: usize) -> Vec<String> {
    prompts
        .iter()
        .map(|prompt| {
            chat_text(&post(
                server,
                "/v1/chat/completions",
                &chat_body(
                    prompt,
                    max_tokens,
                    json!({"speculative": {"cascade": "none"}}),
                ),
            ))
        })
        .collect()
}

/// A client streaming one chat request after another (the prompts in turn, the server's default
/// cascade) until stopped, saying when each has started: a hot-swap test swaps while a request
/// is in flight.
#[allow(dead_code)] // Not every test binary uses every helper.
pub struct StreamingClient {
    stop: Arc<std::sync::atomic::AtomicBool>,
    started: std::sync::mpsc::Receiver<()>,
    thread: std::thread::JoinHandle<Vec<(usize, Streamed)>>,
}

#[allow(dead_code)] // Not every test binary uses every helper.
impl StreamingClient {
    /// Starts streaming `prompts` to `server`.
    pub fn start(server: &Server, prompts: Vec<String>, max_tokens: usize) -> Self {
        let (tell, started) = std::sync::mpsc::channel::<()>();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let base = server.base.clone();
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut results = Vec::new();
            for index in 0.. {
                if stopped.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let prompt = index % prompts.len();
                let mut told = false;
                let body = chat_body(&prompts[prompt], max_tokens, json!({}));
                let streamed = stream_at(&base, "/v1/chat/completions", &body, |_| {
                    if !told {
                        told = true;
                        let _ = tell.send(());
                    }
                });
                results.push((prompt, streamed));
            }
            results
        });
        Self {
            stop,
            started,
            thread,
        }
    }

    /// Waits until the next request has started streaming.
    pub fn wait_for_request(&self) {
        self.started
            .recv_timeout(PATIENCE)
            .expect("the client starts a request");
    }

    /// Stops after the request in flight; every request's prompt index and answer, in order.
    pub fn stop(self) -> Vec<(usize, Streamed)> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.join().expect("client thread")
    }
}

/// Asserts that every streamed answer succeeded whole and equals plain decoding's answer to its
/// prompt (`plain[prompt]`); returns the swaps the answers report, summed.
pub fn assert_plain_answers(results: &[(usize, Streamed)], plain: &[String]) -> u64 {
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
    swaps
}
