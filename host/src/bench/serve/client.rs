//! One streamed request, timed on the client: hyper's HTTP/1 connection-level client over a
//! tokio `TcpStream`, a connection per request, the answer read as server-sent events as its
//! frames arrive.
//!
//! Both servers it drives (spechost, llama-server) stream OpenAI chunks: `choices[0].delta.content`
//! (chat) or `choices[0].text` (completion) carries the text, and with
//! `stream_options.include_usage` a chunk carries `usage.completion_tokens`. A chunk arriving
//! with text is a token time: the first one ends the time to first token, the last one ends
//! generation. A chunk may carry several tokens (a speculative round commits several), so the
//! token count comes from `usage`, never from counting chunks.

use std::pin::Pin;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use http_body::Body as _;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// One answer as the client saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Streamed {
    /// The generated text, its pieces joined.
    pub text: String,
    /// Generated tokens, as the server's `usage` counts them.
    pub completion_tokens: usize,
    /// From sending the request (before connecting) to the first piece of text; `None` when
    /// no text came (an immediate end of generation), which no time to first token describes.
    pub time_to_first_token: Option<Duration>,
    /// From the first piece of text to the last.
    pub generation_time: Duration,
}

/// Sends `body` to `path` of the server at `authority` (`HOST:PORT`) and reads the streamed
/// answer to its end.
pub async fn send(authority: &str, path: &str, body: &Value) -> anyhow::Result<Streamed> {
    let sent = Instant::now();
    let stream = tokio::net::TcpStream::connect(authority)
        .await
        .with_context(|| format!("connecting to {authority}"))?;
    // Requests are small and answers stream in small chunks: no coalescing delay.
    stream
        .set_nodelay(true)
        .context("setting TCP_NODELAY on the client's connection")?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .with_context(|| format!("starting HTTP/1 with {authority}"))?;
    let connection = tokio::spawn(connection);
    let request = hyper::Request::post(path)
        .header(HOST, authority)
        .header(CONTENT_TYPE, "application/json")
        .body(body.to_string())
        .context("building the request")?;
    let response = sender
        .send_request(request)
        .await
        .with_context(|| format!("sending a request to {authority}{path}"))?;
    let status = response.status();
    let mut body = response.into_body();
    let mut answer = AnswerReader::new(sent);
    let mut refusal = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame = frame.with_context(|| format!("reading the answer of {authority}{path}"))?;
        let arrived = Instant::now();
        if let Some(data) = frame.data_ref() {
            if status.is_success() {
                answer.push(data, arrived)?;
            } else {
                refusal.extend_from_slice(data);
            }
        }
    }
    connection.abort();
    if !status.is_success() {
        anyhow::bail!(
            "{authority}{path} answered {status}: {}",
            String::from_utf8_lossy(&refusal).trim()
        );
    }
    answer
        .finish()
        .with_context(|| format!("reading the answer of {authority}{path}"))
}

/// Reads server-sent events as their bytes arrive and keeps what the report needs.
#[derive(Debug)]
pub struct AnswerReader {
    /// Bytes of an event not complete yet.
    pending: Vec<u8>,
    sent: Instant,
    text: String,
    first_piece: Option<Instant>,
    last_piece: Option<Instant>,
    completion_tokens: Option<usize>,
}

impl AnswerReader {
    /// A reader of the answer to a request sent at `sent`.
    pub fn new(sent: Instant) -> Self {
        Self {
            pending: Vec::new(),
            sent,
            text: String::new(),
            first_piece: None,
            last_piece: None,
            completion_tokens: None,
        }
    }

    /// Reads the bytes of one frame, which arrived at `arrived`; an error for a chunk that is
    /// not JSON or reports an error.
    pub fn push(&mut self, bytes: &[u8], arrived: Instant) -> anyhow::Result<()> {
        // Line ends may be CRLF; JSON escapes every CR inside a payload.
        self.pending
            .extend(bytes.iter().filter(|&&byte| byte != b'\r'));
        while let Some(end) = self.pending.windows(2).position(|pair| pair == b"\n\n") {
            let event: Vec<u8> = self.pending.drain(..end + 2).collect();
            let event = String::from_utf8_lossy(&event);
            let data: Vec<&str> = event
                .lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .map(|data| data.strip_prefix(' ').unwrap_or(data))
                .collect();
            if !data.is_empty() {
                self.chunk(&data.join("\n"), arrived)?;
            }
        }
        Ok(())
    }

    /// Reads one event's data: `[DONE]` or a JSON chunk.
    fn chunk(&mut self, data: &str, arrived: Instant) -> anyhow::Result<()> {
        if data == "[DONE]" {
            return Ok(());
        }
        let chunk: Value = serde_json::from_str(data)
            .with_context(|| format!("a streamed chunk is not JSON: {data}"))?;
        if let Some(error) = chunk.get("error") {
            anyhow::bail!("the server reported an error mid-stream: {error}");
        }
        let choice = &chunk["choices"][0];
        let piece = choice["delta"]["content"]
            .as_str()
            .or_else(|| choice["text"].as_str())
            .unwrap_or_default();
        if !piece.is_empty() {
            self.text.push_str(piece);
            self.first_piece.get_or_insert(arrived);
            self.last_piece = Some(arrived);
        }
        if let Some(tokens) = chunk["usage"]["completion_tokens"].as_u64() {
            self.completion_tokens = Some(tokens as usize);
        }
        Ok(())
    }

    /// The answer, once the stream ended; an error when no chunk gave `usage`.
    pub fn finish(self) -> anyhow::Result<Streamed> {
        let completion_tokens = self.completion_tokens.context(
            "no chunk carried usage.completion_tokens; the server must honour stream_options.include_usage",
        )?;
        let (time_to_first_token, generation_time) = match (self.first_piece, self.last_piece) {
            (Some(first), Some(last)) => (Some(first - self.sent), last - first),
            // No text at all (an immediate end of generation): nothing was streamed.
            _ => (None, Duration::ZERO),
        };
        Ok(Streamed {
            text: self.text,
            completion_tokens,
            time_to_first_token,
            generation_time,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_frames_are_joined_and_timed_by_arrival() {
        let sent = Instant::now();
        let at = |ms| sent + Duration::from_millis(ms);
        let mut reader = AnswerReader::new(sent);
        reader
            .push(
                b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n",
                at(5),
            )
            .expect("role chunk");
        reader
            .push(
                b"data: {\"choices\":[{\"delta\":{\"content\":\"He\"}}]}\r\n\r\ndata: {\"cho",
                at(20),
            )
            .expect("first piece");
        reader
            .push(b"ices\":[{\"delta\":{\"content\":\"llo\"}}]}\n\n", at(50))
            .expect("second piece, split");
        reader
            .push(
                b"data: {\"choices\":[],\"usage\":{\"completion_tokens\":4}}\n\ndata: [DONE]\n\n",
                at(60),
            )
            .expect("usage and done");
        let answer = reader.finish().expect("usage was given");
        assert_eq!(
            answer,
            Streamed {
                text: "Hello".into(),
                completion_tokens: 4,
                time_to_first_token: Some(Duration::from_millis(20)),
                generation_time: Duration::from_millis(30),
            }
        );
    }

    #[test]
    fn completion_chunks_carry_text_and_errors_and_missing_usage_are_reported() {
        let sent = Instant::now();
        let mut reader = AnswerReader::new(sent);
        reader
            .push(b"data: {\"choices\":[{\"text\":\" four\"}]}\n\n", sent)
            .expect("completion chunk");
        let missing = AnswerReader::finish(reader).expect_err("no usage");
        assert!(
            missing.to_string().contains("include_usage"),
            "seen {missing}"
        );
        let mut failing = AnswerReader::new(sent);
        let error = failing
            .push(b"data: {\"error\":{\"message\":\"cancelled\"}}\n\n", sent)
            .expect_err("an error chunk");
        assert!(error.to_string().contains("cancelled"), "seen {error}");
    }
}
