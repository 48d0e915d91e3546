//! Upstreams: how portico reaches a backend. Transports are an enum, so every difference between
//! them shows up in a `match` here rather than behind a trait object.
//!
//! Two ways to use an upstream:
//! - pass-through (`Upstream::Http` only): the client's bytes go up and the backend's bytes come
//!   back untouched (`http::HttpUpstream::exchange` + `relay`);
//! - the message path (`Upstream::call`): one JSON-RPC request goes up and a `Reply` of decoded
//!   JSON-RPC messages comes back, for everything that must look at or change messages
//!   (bridging, caching, aggregation, stdio, the built-in demo).
//!
//! Upstreams never see the client's `http::Request`: only the message, and the client's headers
//! filtered through `frontend::forwardable`.

pub mod demo;
pub mod h1;
pub mod http;
pub mod sse;
pub mod stdio;

use ::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use std::sync::Arc;
use tokio::time::Instant;

use crate::error::GatewayError;
use crate::protocol;
use demo::Demo;

/// Why an upstream exchange failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum UpstreamError {
    /// Could not connect (refused, DNS, TLS).
    #[error("connect failed: {0}")]
    Connect(String),
    /// The deadline passed.
    #[error("timed out")]
    Timeout,
    /// The connection, stream or child process ended before the answer did.
    #[error("closed: {0}")]
    Closed(String),
    /// The backend answered something that is not MCP.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// Too many requests in flight to this backend.
    #[error("overloaded")]
    Overloaded,
    /// The request was pinned to a stdio child generation that is gone: the child restarted
    /// before the request was written, so the backend never saw it and it is safe to resend
    /// after a new handshake.
    #[error("closed: stdio server restarted; handshake needed")]
    Restarted,
}

/// Decoded JSON-RPC messages of one answer, in arrival order: notifications about the request
/// (progress, log), then the response.
pub enum MessageStream {
    /// Nothing (a notification was accepted).
    Empty,
    /// Exactly one message, known at once.
    One(Bytes),
    /// Messages arriving over time; an `Err` item ends the stream.
    Many(BoxStream<'static, Result<Bytes, UpstreamError>>),
}

/// A backend's answer on the message path.
pub struct Reply {
    /// HTTP status the backend used (or the one portico assigns for non-HTTP transports).
    pub status: StatusCode,
    /// Response headers (HTTP backends), e.g. a legacy `Mcp-Session-Id`.
    pub headers: HeaderMap,
    pub messages: MessageStream,
}

impl Reply {
    pub fn one(status: StatusCode, message: impl Into<Bytes>) -> Reply {
        Reply {
            status,
            headers: HeaderMap::new(),
            messages: MessageStream::One(message.into()),
        }
    }

    /// This reply with each message rewritten by `f` as it passes (a streamed answer's too:
    /// the response among its notifications), status and headers kept.
    pub fn map_messages(self, f: impl Fn(Bytes) -> Bytes + Send + 'static) -> Reply {
        use futures_util::StreamExt;
        let messages = match self.messages {
            MessageStream::Empty => MessageStream::Empty,
            MessageStream::One(m) => MessageStream::One(f(m)),
            MessageStream::Many(s) => MessageStream::Many(s.map(move |m| m.map(&f)).boxed()),
        };
        Reply { messages, ..self }
    }

    /// A notification accepted (202, nothing to say).
    pub fn accepted() -> Reply {
        Reply {
            status: StatusCode::ACCEPTED,
            headers: HeaderMap::new(),
            messages: MessageStream::Empty,
        }
    }

    /// The JSON-RPC response of this reply, skipping notifications sent before it (a cached
    /// answer, an aggregated part or portico's own discover is one message; progress about it
    /// has no one to go to). `name` and `timeout_ms` describe the route, for the errors.
    pub async fn final_message(self, name: &str, timeout_ms: u64) -> Result<Bytes, GatewayError> {
        let failed = |detail: &str| GatewayError::BackendFailed {
            backend: name.to_string(),
            detail: detail.to_string(),
        };
        match self.messages {
            MessageStream::One(m) => Ok(m),
            MessageStream::Empty => Err(failed("no answer to a request")),
            MessageStream::Many(mut stream) => {
                while let Some(item) = stream.next().await {
                    let msg =
                        item.map_err(|e| GatewayError::from_upstream(name, timeout_ms, &e))?;
                    if protocol::is_response(&msg) {
                        return Ok(msg);
                    }
                }
                Err(failed("the answer stream ended without a response"))
            }
        }
    }

    /// [`Reply::final_message`], decoded; a message that is neither a result nor an error is
    /// the backend's fault.
    pub async fn final_response(
        self,
        name: &str,
        timeout_ms: u64,
    ) -> Result<serde_json::Value, GatewayError> {
        let msg = self.final_message(name, timeout_ms).await?;
        serde_json::from_slice::<serde_json::Value>(&msg)
            .ok()
            .filter(|v| v.get("result").is_some() || v.get("error").is_some())
            .ok_or_else(|| GatewayError::BackendFailed {
                backend: name.to_string(),
                detail: "the answer holds neither a result nor an error".into(),
            })
    }
}

impl GatewayError {
    /// Turns an upstream failure into the client-facing error, naming the backend but never
    /// the internals (addresses, OS error text).
    pub fn from_upstream(backend: &str, timeout_ms: u64, e: &UpstreamError) -> GatewayError {
        match e {
            UpstreamError::Connect(_) => GatewayError::BackendUnreachable {
                backend: backend.to_string(),
            },
            UpstreamError::Timeout => GatewayError::BackendTimeout {
                backend: backend.to_string(),
                timeout_ms,
            },
            UpstreamError::Overloaded => GatewayError::Overloaded {
                backend: backend.to_string(),
            },
            UpstreamError::Closed(d) | UpstreamError::Protocol(d) => GatewayError::BackendFailed {
                backend: backend.to_string(),
                detail: d.clone(),
            },
            UpstreamError::Restarted => GatewayError::BackendFailed {
                backend: backend.to_string(),
                detail: e.to_string(),
            },
        }
    }
}

/// Who checks that a single JSON answer on the message path is a JSON-RPC response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerCheck {
    /// The upstream: the answer is read whole (valid JSON, a response, not a request) before
    /// it is returned, and refused as the backend's protocol error when it is not.
    Upstream,
    /// The caller, which reads the whole answer itself, counts what it cannot read as the
    /// backend's failure, and records the outcome on the backend's breaker: an aggregated
    /// list's member pages, read in one pass instead of two (`aggregate::lists`). Only a JSON
    /// answer is left to the caller; an event stream's messages are read as ever.
    Caller,
}

/// One request on the message path, already in the form the backend expects.
pub struct Outgoing<'a> {
    /// The JSON-RPC message to send.
    pub body: Bytes,
    /// The client's headers (filtered by `frontend::forwardable` before use).
    pub client_headers: &'a HeaderMap,
    /// Headers this message needs (MCP mirrors, session id), set over the forwarded ones.
    pub extra: Vec<(HeaderName, HeaderValue)>,
    pub deadline: Instant,
    pub check: AnswerCheck,
}

/// The clock of one streamed answer (README "Configuration reference", `timeout_ms` and
/// `max_call_ms`): the first message is due by the request's deadline; after each JSON-RPC
/// message the backend sends (a progress notification, a log line) the next is due `idle`
/// later, never past `hard`, the request's arrival plus `max_call_ms`. So a long call that
/// keeps reporting progress runs to its end, a silent one is cut `idle` after its last word,
/// and none outlives `max_call_ms`. Keep-alive comments are not messages and move nothing.
/// The deadline only ever moves later than the one the request was given: a caller with a
/// longer budget of its own (a `subscriptions/listen` stream) keeps it.
#[derive(Debug, Clone, Copy)]
pub struct CallClock {
    idle: std::time::Duration,
    hard: Option<Instant>,
    floor: Instant,
}

impl CallClock {
    /// For a request whose `deadline` is its arrival plus `idle` (every deadline a backend's
    /// request gets is; a shorter one only starts the hard bound earlier).
    pub fn new(
        deadline: Instant,
        idle: std::time::Duration,
        max_call: Option<std::time::Duration>,
    ) -> CallClock {
        let arrival = deadline.checked_sub(idle).unwrap_or(deadline);
        CallClock {
            idle,
            hard: max_call.map(|m| (arrival + m).max(deadline)),
            floor: deadline,
        }
    }

    /// The deadline once a message has just arrived.
    pub fn after_message(&self) -> Instant {
        let next = Instant::now() + self.idle;
        self.hard.map_or(next, |h| next.min(h)).max(self.floor)
    }

    /// Whether the call has reached its hard bound (`max_call_ms`), as opposed to an idle gap.
    pub fn past_hard(&self) -> bool {
        self.hard.is_some_and(|h| Instant::now() >= h)
    }
}

/// A backend's own warnings about what it sent (garbage lines, unknown ids), at most
/// [`WARNINGS_PER_WINDOW`] per [`WARNING_WINDOW`]; the rest are counted and reported as one
/// "suppressed N" line when the next window opens (or the budget is dropped). A broken backend
/// must not be able to flood the log.
pub struct WarnBudget {
    backend: Arc<str>,
    window: Instant,
    shown: u32,
    suppressed: u64,
}

/// Warnings shown per window and backend.
pub const WARNINGS_PER_WINDOW: u32 = 10;
/// The window of [`WarnBudget`].
pub const WARNING_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

impl WarnBudget {
    pub fn new(backend: Arc<str>) -> WarnBudget {
        WarnBudget {
            backend,
            window: Instant::now(),
            shown: 0,
            suppressed: 0,
        }
    }

    /// Whether one more warning may be logged now.
    pub fn allow(&mut self) -> bool {
        if self.window.elapsed() >= WARNING_WINDOW {
            self.flush();
            self.window = Instant::now();
            self.shown = 0;
        }
        if self.shown < WARNINGS_PER_WINDOW {
            self.shown += 1;
            return true;
        }
        if self.suppressed == 0 {
            // Said at once, so a reader knows the log is thinned even if the window's count
            // comes only later.
            tracing::warn!(backend = %self.backend, window_s = WARNING_WINDOW.as_secs(),
                "further warnings of this backend suppressed for the rest of the window");
        }
        self.suppressed += 1;
        false
    }

    /// Warnings suppressed and not reported yet.
    pub fn suppressed(&self) -> u64 {
        self.suppressed
    }

    fn flush(&mut self) {
        if self.suppressed > 0 {
            tracing::warn!(backend = %self.backend, suppressed = self.suppressed,
                "backend warnings suppressed (rate limit)");
            self.suppressed = 0;
        }
    }
}

impl Drop for WarnBudget {
    fn drop(&mut self) {
        self.flush();
    }
}

/// What a message link (a stdio child's stdin, an HTTP+SSE session's POSTs) may hold queued
/// and not yet written, in bytes. A server that stops reading must not make portico keep every
/// message sent to it meanwhile; beyond this a request, or a client's notification or answer to
/// the server, is refused at once (503), and a line portico writes of its own (a cancellation,
/// an answer to a `ping`) is dropped. One message always fits when nothing is queued, whatever
/// its size.
pub const MAX_UNWRITTEN_BYTES: usize = 16 * 1024 * 1024;

/// The sending half of a link's outgoing queue, bounded by [`MAX_UNWRITTEN_BYTES`]: a line
/// counts from when it is queued until its writer has written it (a write the server does not
/// take counts as long as it waits).
pub struct LineQueue {
    tx: tokio::sync::mpsc::UnboundedSender<Bytes>,
    unwritten: Arc<std::sync::atomic::AtomicUsize>,
}

/// The writing half of a [`LineQueue`].
pub struct LineRx {
    rx: tokio::sync::mpsc::UnboundedReceiver<Bytes>,
    unwritten: Arc<std::sync::atomic::AtomicUsize>,
}

/// Why a line was not queued.
#[derive(Debug, PartialEq)]
pub enum Unqueued {
    /// The server has not taken what was queued before: `MAX_UNWRITTEN_BYTES` wait.
    Full,
    /// The writer is gone (the link is closing).
    Closed,
}

impl LineQueue {
    pub fn new() -> (LineQueue, LineRx) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let unwritten = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let rx = LineRx {
            rx,
            unwritten: unwritten.clone(),
        };
        (LineQueue { tx, unwritten }, rx)
    }

    /// Queues one line unless the bytes still unwritten would pass the bound.
    pub fn send(&self, line: Bytes) -> Result<(), Unqueued> {
        use std::sync::atomic::Ordering::Relaxed;
        let len = line.len();
        // One sender (the link's actor) adds; the writer only subtracts, so this check cannot
        // be raced past the bound.
        let queued = self.unwritten.load(Relaxed);
        if queued > 0 && queued + len > MAX_UNWRITTEN_BYTES {
            return Err(Unqueued::Full);
        }
        self.unwritten.fetch_add(len, Relaxed);
        self.tx.send(line).map_err(|_| Unqueued::Closed)
    }

    /// Bytes queued and not yet written.
    pub fn unwritten(&self) -> usize {
        self.unwritten.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl LineRx {
    /// The next line to write; `None` once the queue is closed and empty.
    pub async fn recv(&mut self) -> Option<Bytes> {
        self.rx.recv().await
    }

    /// A line of `len` bytes has been written (or given up on): it no longer counts.
    pub fn written(&self, len: usize) {
        self.unwritten
            .fetch_sub(len, std::sync::atomic::Ordering::Relaxed);
    }
}

/// How a backend is reached.
pub enum Upstream {
    Http(Arc<http::HttpUpstream>),
    Stdio(Arc<stdio::StdioUpstream>),
    Builtin(Demo),
}

impl Upstream {
    /// Message path: send one message, get the decoded answer.
    pub async fn call(&self, out: Outgoing<'_>) -> Result<Reply, UpstreamError> {
        match self {
            Upstream::Http(h) => {
                h.post(
                    out.client_headers,
                    &out.extra,
                    out.body,
                    out.deadline,
                    out.check,
                )
                .await
            }
            Upstream::Stdio(s) => s.call(out.body, out.deadline).await,
            Upstream::Builtin(d) => Ok(d.call(&out.body)),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Upstream::Http(_) => "http",
            Upstream::Stdio(s) if s.is_sse() => "sse",
            Upstream::Stdio(_) => "stdio",
            Upstream::Builtin(_) => "builtin",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each message moves the deadline `idle` on, never past the hard bound and never before
    /// the deadline the request was given.
    #[tokio::test(start_paused = true)]
    async fn the_call_clock_moves_with_messages() {
        use std::time::Duration;
        let ms = Duration::from_millis;
        let start = Instant::now();
        let c = CallClock::new(start + ms(400), ms(400), Some(ms(1000)));
        tokio::time::advance(ms(300)).await;
        assert_eq!(c.after_message(), start + ms(700));
        tokio::time::advance(ms(500)).await;
        assert_eq!(c.after_message(), start + ms(1000), "capped by max_call");
        assert!(!c.past_hard());
        tokio::time::advance(ms(200)).await;
        assert!(c.past_hard());
        // A longer budget of the caller's own is kept.
        let c = CallClock::new(start + ms(60_000), ms(400), None);
        assert_eq!(c.after_message(), start + ms(60_000));
    }

    /// A link's queue holds at most `MAX_UNWRITTEN_BYTES` unwritten, counted until written;
    /// one line always fits into an empty queue.
    #[tokio::test]
    async fn a_line_queue_is_bounded_until_written() {
        let (q, mut rx) = LineQueue::new();
        let big = Bytes::from(vec![b'x'; MAX_UNWRITTEN_BYTES + 1]);
        assert_eq!(q.send(big.clone()), Ok(()), "one line always fits");
        assert_eq!(q.send(Bytes::from_static(b"{}\n")), Err(Unqueued::Full));
        let line = rx.recv().await.unwrap();
        assert_eq!(
            q.send(Bytes::from_static(b"{}\n")),
            Err(Unqueued::Full),
            "taken, not written"
        );
        rx.written(line.len());
        assert_eq!(q.unwritten(), 0);
        let half = Bytes::from(vec![b'y'; MAX_UNWRITTEN_BYTES / 2]);
        assert_eq!(q.send(half.clone()), Ok(()));
        assert_eq!(q.send(half.clone()), Ok(()));
        assert_eq!(q.send(Bytes::from_static(b"z")), Err(Unqueued::Full));
        drop(rx);
        q.unwritten.store(0, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(q.send(half), Err(Unqueued::Closed));
    }

    #[tokio::test(start_paused = true)]
    async fn warnings_are_budgeted_per_window() {
        let mut b = WarnBudget::new("b".into());
        let shown = (0..10_000).filter(|_| b.allow()).count();
        assert_eq!(shown, WARNINGS_PER_WINDOW as usize);
        assert_eq!(b.suppressed(), 10_000 - u64::from(WARNINGS_PER_WINDOW));
        tokio::time::advance(WARNING_WINDOW).await;
        assert!(b.allow(), "a new window, a new budget");
        assert_eq!(b.suppressed(), 0, "the summary was logged");
    }
}
