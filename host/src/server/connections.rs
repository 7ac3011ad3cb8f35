//! The HTTP server's connections: accepting them within a limit, timing out clients that send
//! too slowly or sit idle, telling handlers when a client stops sending, and shutting down
//! within a deadline.
//!
//! axum's own `serve` exposes none of hyper's connection settings, so connections are served
//! here, one tokio task each, with hyper's HTTP/1 server:
//! - at most [`ConnectionLimits::max_connections`] are open; one more is answered 503 at once
//!   and closed, so file descriptors stay bounded and `/health` keeps answering;
//! - a client has [`ConnectionLimits::header_timeout`] to send each request's headers, which is
//!   also how long a kept-alive connection may sit idle (slowloris and idle connections are
//!   closed); the body has its own timeout (`extract.rs`);
//! - a client may close its sending side after its request (a half-close) and still get the
//!   answer. The connection's stream ([`ClientStream`]) keeps that end-of-file from hyper while a
//!   response is pending and tells the request's handler instead ([`ClientConnection`]), which
//!   then writes to the client now and then: a client that only half-closed reads the answer, a
//!   client that went away makes the write fail, the handler is dropped, and its generation is
//!   cancelled;
//! - on shutdown the listener closes, kept-alive connections close after their current
//!   request, and requests still running at [`ConnectionLimits::shutdown_timeout`] are cancelled
//!   (their handlers dropped), so the process exits within the deadline whatever clients do.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker, ready};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::ConnectInfo;
use axum::http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tower::ServiceExt as _;

/// How long accepting pauses after it failed (out of file descriptors, most likely), so a
/// failing `accept` does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// Least time between two log lines about failed accepts.
const ACCEPT_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// Limits of the server's connections (`--max-connections`, `--header-timeout`,
/// `--body-timeout`, `--shutdown-timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// Time to send a request's headers; also the most a kept-alive connection may sit idle.
    pub header_timeout: Duration,
    /// Time to send a request's body once its headers arrived.
    pub body_timeout: Duration,
    /// Time requests in flight may run on after the shutdown signal before they are
    /// cancelled.
    pub shutdown_timeout: Duration,
}

/// What a handler knows of its request's connection (a request extension; absent when the
/// router is driven without a connection, as in tests).
#[derive(Debug, Clone)]
pub struct ClientConnection {
    sent_all: watch::Receiver<bool>,
}

impl ClientConnection {
    /// Resolves once the client has closed its sending side: it half-closed and waits for the
    /// answer, or it went away. Only writing to it tells which.
    pub async fn stopped_sending(&mut self) {
        // An error means the connection is gone: stopped sending too.
        let _ = self.sent_all.wait_for(|stopped| *stopped).await;
    }
}

/// What a connection's stream and its requests share.
#[derive(Debug)]
struct ConnectionState {
    /// Requests whose responses are not completely handed to hyper yet.
    in_flight: AtomicUsize,
    /// Whether the client closed its sending side.
    sent_all: watch::Sender<bool>,
    /// hyper's read, parked on an end-of-file kept from it while a response is pending.
    parked_reader: Mutex<Option<Waker>>,
}

impl ConnectionState {
    fn new() -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            sent_all: watch::Sender::new(false),
            parked_reader: Mutex::new(None),
        }
    }

    fn parked_reader(&self) -> std::sync::MutexGuard<'_, Option<Waker>> {
        // A waker slot is consistent whatever panicked while it was held.
        self.parked_reader.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A request whose response has not been completely handed to hyper; dropping it releases an
/// end-of-file kept from hyper once no other request is pending.
#[derive(Debug)]
struct InFlight(Arc<ConnectionState>);

impl InFlight {
    fn start(state: &Arc<ConnectionState>) -> Self {
        state.in_flight.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(state))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1
            && let Some(reader) = self.0.parked_reader().take()
        {
            reader.wake();
        }
    }
}

/// A client's TCP stream as hyper reads it: an end-of-file while a response is pending is
/// reported to the handlers ([`ClientConnection`]) and shown to hyper only once every response
/// is out, so hyper neither drops the request nor answers a closed reader too early.
#[derive(Debug)]
struct ClientStream {
    stream: TcpStream,
    state: Arc<ConnectionState>,
}

impl AsyncRead for ClientStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !*this.state.sent_all.borrow() {
            let before = buf.filled().len();
            ready!(Pin::new(&mut this.stream).poll_read(cx, buf))?;
            if buf.filled().len() > before || buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            this.state.sent_all.send_replace(true);
        }
        // End of file: hyper sees it once no response is pending.
        if this.state.in_flight.load(Ordering::Acquire) == 0 {
            return Poll::Ready(Ok(()));
        }
        *this.state.parked_reader() = Some(cx.waker().clone());
        // The last response may have gone out between the check and the parking.
        if this.state.in_flight.load(Ordering::Acquire) == 0 {
            this.state.parked_reader().take();
            return Poll::Ready(Ok(()));
        }
        Poll::Pending
    }
}

impl AsyncWrite for ClientStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// A response body that keeps its request in flight until hyper has taken all of it.
struct TrackedBody {
    body: Body,
    _in_flight: InFlight,
}

impl HttpBody for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Serves `app` on `listeners` (one per listening address, all sharing `limits`) until `shutdown`
/// resolves, then closes every connection within [`ConnectionLimits::shutdown_timeout`].
pub async fn serve(
    listeners: Vec<TcpListener>,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let (stop, stopping) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut shutdown = pin!(shutdown);
    let mut last_accept_error: Option<Instant> = None;
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            (accepted, _, _) = futures_util::future::select_all(
                listeners.iter().map(|listener| Box::pin(listener.accept())),
            ) => match accepted {
                Ok((stream, peer)) => match Arc::clone(&permits).try_acquire_owned() {
                    Ok(permit) => {
                        connections.spawn(serve_connection(
                            stream,
                            peer,
                            app.clone(),
                            limits,
                            stopping.clone(),
                            permit,
                        ));
                    }
                    Err(_) => refuse(&stream, limits.max_connections),
                },
                Err(error) => {
                    if last_accept_error.is_none_or(|at| at.elapsed() >= ACCEPT_ERROR_LOG_INTERVAL) {
                        tracing::warn!(%error, open = connections.len(), "cannot accept connections (out of file descriptors? see --max-connections and `ulimit -n`)");
                        last_accept_error = Some(Instant::now());
                    }
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            }
        }
    }
    drop(listeners);
    stop.send_replace(true);
    let open = connections.len();
    if open > 0 {
        tracing::info!(
            open,
            deadline_s = limits.shutdown_timeout.as_secs_f64(),
            "shutting down: waiting for open connections"
        );
    }
    let drained = tokio::time::timeout(limits.shutdown_timeout, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            open = connections.len(),
            "shutdown deadline reached: cancelling the requests still open"
        );
        connections.abort_all();
        while connections.join_next().await.is_some() {}
    }
}

/// Serves one connection until it closes, or until shutdown closes it gracefully.
async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    app: Router,
    limits: ConnectionLimits,
    mut stopping: watch::Receiver<bool>,
    _permit: OwnedSemaphorePermit,
) {
    // Streamed tokens are small writes that must leave at once.
    let _ = stream.set_nodelay(true);
    let state = Arc::new(ConnectionState::new());
    let io = TokioIo::new(ClientStream {
        stream,
        state: Arc::clone(&state),
    });
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let in_flight = InFlight::start(&state);
        let mut request = request.map(Body::new);
        request.extensions_mut().insert(ConnectInfo(peer));
        request.extensions_mut().insert(ClientConnection {
            sent_all: state.sent_all.subscribe(),
        });
        let app = app.clone();
        async move {
            let response = app
                .oneshot(request)
                .await
                .unwrap_or_else(|never: Infallible| match never {});
            Ok::<_, Infallible>(response.map(|body| TrackedBody {
                body,
                _in_flight: in_flight,
            }))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let mut connection = pin!(builder.serve_connection(io, service));
    tokio::select! {
        served = connection.as_mut() => {
            if let Err(error) = served {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
            return;
        }
        _ = stopping.wait_for(|stop| *stop) => {}
    }
    connection.as_mut().graceful_shutdown();
    if let Err(error) = connection.await {
        tracing::debug!(%peer, %error, "connection ended with an error while shutting down");
    }
}

/// Answers a connection over the limit with 503 and closes it, without reading its request.
fn refuse(stream: &TcpStream, max_connections: usize) {
    let body = super::error::ApiError::unavailable(format!(
        "the server has {max_connections} connections open, the most it keeps (--max-connections); retry later"
    ))
    .to_json()
    .to_string();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    // A fresh socket's send buffer takes this at once; if not, the client just sees the close.
    let _ = stream.try_write(response.as_bytes());
}

/// File descriptors the process needs besides client connections: the listener, the model and
/// plugin files, the compile cache, logs, the state directory, the runtime's own.
const RESERVED_FILE_DESCRIPTORS: u64 = 128;

/// Makes room for `limits.max_connections` in the process's file-descriptor limit: raises the
/// soft limit towards the hard one if needed, and if that is not enough, lowers
/// `max_connections` to what fits, with a warning (running out of descriptors would refuse
/// connections without an answer and fail plugin and state files).
pub fn fit_file_limit(limits: &mut ConnectionLimits) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    let needed = limits.max_connections as u64 + RESERVED_FILE_DESCRIPTORS;
    let mut available = soft;
    if soft < needed {
        let raised = needed.min(hard);
        if setrlimit(Resource::RLIMIT_NOFILE, raised, hard).is_ok() {
            available = raised;
        }
    }
    if available < needed {
        let fits = available.saturating_sub(RESERVED_FILE_DESCRIPTORS).max(1) as usize;
        tracing::warn!(
            asked = limits.max_connections,
            fits,
            file_limit = available,
            "--max-connections does not fit the file-descriptor limit; raise it with `ulimit -n` (hard limit {hard})"
        );
        limits.max_connections = fits;
    }
}
