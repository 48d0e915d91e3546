//! stdio upstreams: one child process per backend, speaking newline-delimited JSON-RPC on its
//! stdin/stdout (the MCP stdio transport). The same actor drives a 2024-11-05 HTTP+SSE session
//! (`sse.rs`): its event stream in place of stdout, POSTs in place of stdin, a new session in
//! place of a restart — everything above the link (ids, progress, server requests) is shared.
//!
//! Shape: [`StdioUpstream`] is a cheap handle. On first use it spawns one actor task
//! (`Actor::run`) that owns the child and everything about it: a `select!` over the command
//! queue, the child's stdout lines and the child's exit, plus the map of in-flight requests.
//! Two helper tasks per child keep the actor from ever blocking on a pipe: a writer (stdin) and
//! a rate-limited stderr logger. The child is restarted with exponential backoff when it dies.
//!
//! Why ids are rewritten: one pipe carries the requests of many clients, and JSON-RPC ids and
//! `progressToken`s must be unique among the sender's in-flight requests on one connection
//! (docs/protocol.md §8 item 14). Two clients both sending `"id":1` would otherwise get each other's
//! answers. Each request therefore goes up with a gateway id (an integer from a counter that never
//! repeats) and, if it asked for progress, the token `"portico-<gateway id>"`; answers and
//! progress are mapped back and the caller's own id/token restored.
//!
//! Invariants:
//! - Only this module spawns processes; every child is `kill_on_drop`, and its stdin is closed
//!   when the backend shuts down or is dropped.
//! - Nothing the child writes can panic portico or grow memory without bound: stdout lines are
//!   capped at `max_line_bytes` (the rest of a longer line is discarded as it streams), bad
//!   lines are logged and skipped, and per-request queues drop progress rather than grow.
//! - Nor can a child that stops reading: what is queued for its stdin and not yet written is
//!   bounded (`upstream::MAX_UNWRITTEN_BYTES`); beyond it requests, and a client's
//!   notifications and answers to the server, are refused at once.
//! - The child never waits on us: server-initiated requests are answered at once.

use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::json;
use serde_json::value::{RawValue, to_raw_value};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStderr, ChildStdin, Command};
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::time::{Instant, sleep_until, timeout, timeout_at};
use tracing::{debug, info, warn};

use super::sse::{SseConn, SseTarget};
use super::{CallClock, MessageStream, Reply, UpstreamError};
use crate::config::BackendConfig;
use crate::protocol::{code, first_byte, status_for_code};

mod actor;
mod wire;

use actor::{Actor, Cmd, Pending};
pub(crate) use wire::{Line, LineReader};
use wire::{Outbound, asks_for_logs, line_of, request_line, rewrite_token};

/// First restart delay after a crash; doubles on every further crash up to `MAX_BACKOFF`.
const INITIAL_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A child that stayed up this long counts as healthy: the next crash starts the backoff afresh.
const STABLE_AFTER: Duration = Duration::from_secs(10);
/// After the child exits, how long stdout is still read for answers it wrote just before.
const EXIT_DRAIN: Duration = Duration::from_millis(200);
/// How long a child gets to exit on its own once its stdin is closed before it is killed.
const EXIT_GRACE: Duration = Duration::from_millis(500);
/// stderr lines logged per second per backend; the rest are counted and reported.
const STDERR_LINES_PER_SEC: u32 = 20;
const MAX_STDERR_LINE: usize = 16 * 1024;
/// Messages queued per request for a caller that reads slowly; progress beyond it is dropped
/// (one slot is always kept free for the final answer).
const EVENT_QUEUE: usize = 64;
/// Server notifications not tied to a request, buffered per subscriber.
const BROADCAST_QUEUE: usize = 256;
/// Prefix of the progress tokens portico sends upstream.
const TOKEN_PREFIX: &str = "portico-";
/// What a server-initiated request other than `ping` gets back.
const NO_SERVER_REQUESTS: &str = "no call this request could belong to is in flight (or, on a \
                                  child shared by clients, more than one is), so portico cannot \
                                  relay it to a client";

/// How to send one request.
#[derive(Debug, Clone, Copy)]
pub struct CallOptions {
    /// Send `notifications/cancelled` upstream when the caller drops the answer before the
    /// response arrived (or the deadline passed). Ignored for `initialize`, which the spec says
    /// must never be cancelled.
    pub cancel_on_drop: bool,
    /// Write the request only to this child generation (see [`StdioUpstream::generation`]). If
    /// the child restarted in between, the call fails with `Restarted` instead of reaching a
    /// fresh legacy server that has not been through `initialize`.
    pub generation: Option<u64>,
    /// The caller asked for log lines though the line does not say so: the legacy bridge
    /// strips `logLevel` going up and sets the child's level itself. Only for a child that
    /// serves one client (a shared child's unasked lines are nobody's).
    pub logs: bool,
}

impl Default for CallOptions {
    fn default() -> Self {
        CallOptions {
            cancel_on_drop: true,
            generation: None,
            logs: false,
        }
    }
}

/// What the actor publishes about the child (read by `is_up`, `generation`, metrics).
#[derive(Debug, Clone, Default)]
struct Status {
    up: bool,
    /// Incremented at every successful spawn; 0 = never started.
    generation: u64,
    restarts: u64,
    pid: Option<u32>,
}

/// One stdio backend.
pub struct StdioUpstream {
    /// Backend name, for errors and logs.
    pub name: String,
    cmd: mpsc::UnboundedSender<Cmd>,
    /// The actor until first use: `new` may run outside a runtime, so nothing is spawned there.
    idle: Mutex<Option<Actor>>,
    status: watch::Receiver<Status>,
    notes: broadcast::Sender<Bytes>,
    /// Source of gateway ids (never reused, so never ambiguous on the pipe).
    next_id: AtomicU64,
    /// `timeout_ms`: after the first message, the longest silence between two of a request's
    /// messages; and `max_call_ms` ([`CallClock`]).
    timeout: Duration,
    max_call: Option<Duration>,
    /// The link is a 2024-11-05 HTTP+SSE session instead of a child process (`sse.rs`).
    sse: Option<Arc<SseTarget>>,
}

impl StdioUpstream {
    /// Prepares the backend; the child is spawned on first use.
    pub fn new(cfg: &BackendConfig, command: Vec<String>) -> StdioUpstream {
        let (cmd, rx) = mpsc::unbounded_channel();
        let (status_tx, status) = watch::channel(Status::default());
        let (notes, _) = broadcast::channel(BROADCAST_QUEUE);
        let (program, args) = match command.split_first() {
            Some((p, a)) => (p.clone(), a.to_vec()),
            None => (String::new(), Vec::new()),
        };
        let actor = Actor {
            name: cfg.name.as_str().into(),
            program,
            args,
            env: cfg.env.clone(),
            cwd: cfg.cwd.clone(),
            max_line: cfg.max_line_bytes.max(1),
            rx,
            status: status_tx,
            notes: notes.clone(),
            pending: HashMap::new(),
            backlog: VecDeque::new(),
            warnings: super::WarnBudget::new(cfg.name.as_str().into()),
            owned: false,
            sse: None,
        };
        StdioUpstream {
            name: cfg.name.clone(),
            cmd,
            idle: Mutex::new(Some(actor)),
            status,
            notes,
            next_id: AtomicU64::new(1),
            timeout: Duration::from_millis(cfg.timeout_ms),
            max_call: Some(cfg.max_call()),
            sse: None,
        }
    }

    /// A backend reached over the 2024-11-05 HTTP+SSE transport: the same actor, whose link
    /// is an event stream and POSTs instead of a child's pipes (one stream = one session).
    pub fn new_sse(cfg: &BackendConfig, target: Arc<SseTarget>) -> StdioUpstream {
        let mut up = StdioUpstream::new(cfg, Vec::new());
        if let Some(actor) = up
            .idle
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            actor.sse = Some(target.clone());
        }
        up.sse = Some(target);
        up
    }

    /// Whether the link is an HTTP+SSE session rather than a child process.
    pub fn is_sse(&self) -> bool {
        self.sse.is_some()
    }

    /// A link of the same kind for one client alone (`isolation = "per_client"`, and every
    /// HTTP+SSE backend: a session's state is its client's).
    /// `team`: the owner's team headers, sent on an SSE session's GET and POSTs.
    pub fn owned_sibling(
        &self,
        cfg: &BackendConfig,
        team: &[(http::HeaderName, http::HeaderValue)],
    ) -> Option<StdioUpstream> {
        match (&self.sse, &cfg.command) {
            (Some(t), _) => {
                let up = StdioUpstream::new_sse(cfg, Arc::new(t.with_headers(team)));
                up.set_owned();
                Some(up)
            }
            (None, Some(cmd)) => Some(StdioUpstream::new_owned(cfg, cmd.clone())),
            (None, None) => None,
        }
    }

    fn set_owned(&self) {
        if let Some(actor) = self.idle.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            actor.owned = true;
        }
    }

    /// A child of one client's own (`isolation = "per_client"`): the server's requests during
    /// a call go to that client's newest call in flight.
    pub fn new_owned(cfg: &BackendConfig, command: Vec<String>) -> StdioUpstream {
        let up = StdioUpstream::new(cfg, command);
        up.set_owned();
        up
    }

    /// Sends one JSON-RPC message. A request answers with `Reply { status, messages }`: `One`
    /// when the response came first, else `Many` (progress and other notifications for this
    /// request with the caller's token restored, then the response). The status mirrors a
    /// JSON-RPC error code the way modern HTTP servers do (`status_for_code`). A notification
    /// answers 202 `Empty`. Nothing by `deadline` → `Timeout`, and the request is cancelled;
    /// each message about the request moves the deadline on ([`CallClock`]).
    pub async fn call(&self, body: Bytes, deadline: Instant) -> Result<Reply, UpstreamError> {
        self.call_with(body, deadline, CallOptions::default()).await
    }

    /// A request that is never cancelled upstream, even when its answer is dropped: for
    /// `initialize` and other handshake steps (`call` already treats `initialize` this way).
    pub async fn request(&self, body: Bytes, deadline: Instant) -> Result<Reply, UpstreamError> {
        let opts = CallOptions {
            cancel_on_drop: false,
            ..CallOptions::default()
        };
        self.call_with(body, deadline, opts).await
    }

    /// `call` with explicit options (the legacy bridge pins requests to a child generation).
    pub async fn call_with(
        &self,
        body: Bytes,
        deadline: Instant,
        opts: CallOptions,
    ) -> Result<Reply, UpstreamError> {
        let msg = Outbound::parse(&body)?;
        let Some(orig_id) = msg.id else {
            self.notify(body, deadline).await?;
            return Ok(Reply {
                status: StatusCode::ACCEPTED,
                headers: HeaderMap::new(),
                messages: MessageStream::Empty,
            });
        };
        self.start();
        let gid = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (params, orig_token) = match msg.params.and_then(|p| rewrite_token(p, gid)) {
            Some((p, token)) => (Some(p), Some(token)),
            None => (msg.params.map(RawValue::to_owned), None),
        };
        let line = request_line(gid, &msg.method, params.as_deref());
        let cancellable = opts.cancel_on_drop && msg.method != "initialize";
        // A listen stream's acknowledgement and notifications are no replies to the request:
        // the child writes them as unsolicited messages tagged with the id it saw (the gateway
        // id, docs/protocol.md §8 item 14). Subscribed before the request is written, so none
        // is missed.
        let listening = (msg.method == "subscriptions/listen")
            .then(|| (self.notes.subscribe(), orig_id.to_owned()));
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        let pending = Pending {
            orig_id: orig_id.to_owned(),
            orig_token,
            // A listen stream carries no log lines (docs/protocol.md §2), whatever it asked.
            // Read from `_meta`, not found anywhere in the text: a call whose arguments merely
            // contain the key's name must not claim another client's lines.
            logs: msg.method != "subscriptions/listen" && (opts.logs || asks_for_logs(msg.params)),
            cancellable,
            generation: opts.generation,
            tx,
        };
        self.send(Cmd::Request { gid, line, pending })?;
        let mut answer = Answer {
            rx,
            deadline,
            clock: CallClock::new(deadline, self.timeout, self.max_call),
            guard: CancelGuard {
                gid,
                cmd: cancellable.then(|| self.cmd.clone()),
                reason: "the client went away",
            },
        };
        if let Some((notes, orig)) = listening {
            return Ok(listen_reply(gid, &orig, notes, answer));
        }
        // Wait for the first message so the status is known before the caller renders: a lone
        // response becomes `One` with its mirrored status; anything else starts a stream.
        match answer.next().await? {
            Event::Response(status, body) => Ok(Reply::one(status, body)),
            Event::Note(first) => {
                let rest = futures_util::stream::unfold(Some(answer), |st| async move {
                    let mut st = st?;
                    match st.next().await {
                        Ok(Event::Note(b)) => Some((Ok(b), Some(st))),
                        Ok(Event::Response(_, b)) => Some((Ok(b), None)),
                        Err(e) => Some((Err(e), None)),
                    }
                });
                let first = futures_util::stream::once(async move { Ok(first) });
                Ok(Reply {
                    status: StatusCode::OK,
                    headers: HeaderMap::new(),
                    messages: MessageStream::Many(first.chain(rest).boxed()),
                })
            }
        }
    }

    /// Writes a client's response to one of the server's own requests (which keep the
    /// server's ids: portico never rewrites them), as it is. `Overloaded` when the server has
    /// stopped reading and the line does not fit its queue: refused, not dropped.
    pub async fn respond(&self, body: Bytes, deadline: Instant) -> Result<(), UpstreamError> {
        if !crate::protocol::is_response(&body) {
            return Err(UpstreamError::Protocol("not a response".into()));
        }
        self.write(line_of(body.to_vec()), deadline).await
    }

    /// Sends a notification (e.g. `notifications/initialized`). Written once the child is up
    /// (kept for the next child while none runs); `Overloaded` as for [`respond`](Self::respond).
    pub async fn notify(&self, body: Bytes, deadline: Instant) -> Result<(), UpstreamError> {
        let msg = Outbound::parse(&body)?;
        if msg.id.is_some() {
            return Err(UpstreamError::Protocol("not a notification".into()));
        }
        if msg.method == "notifications/cancelled" {
            // Its requestId is in the client's id space, which the child never saw; forwarding it
            // could cancel another client's request that happens to hold that gateway id.
            // Cancellation happens by dropping the answer stream instead.
            debug!(backend = %self.name, "client notifications/cancelled not forwarded");
            return Ok(());
        }
        self.start();
        self.write(line_of(body.to_vec()), deadline).await
    }

    /// Hands a client's line to the actor and waits (until `deadline`) for its word on it:
    /// queued for the link, kept for the next child, or refused.
    async fn write(&self, line: Bytes, deadline: Instant) -> Result<(), UpstreamError> {
        let (ack, taken) = oneshot::channel();
        self.send(Cmd::Notify {
            line,
            ack: Some(ack),
        })?;
        match timeout_at(deadline, taken).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Err(stopped()),
            Err(_) => Err(UpstreamError::Timeout),
        }
    }

    /// Server notifications not tied to a request (`list_changed`, `resources/updated`, log
    /// messages, ...), as sent by the child.
    pub fn subscribe(&self) -> broadcast::Receiver<Bytes> {
        self.notes.subscribe()
    }

    /// The child generation a request sent now will reach: the running child's, or while none
    /// runs (before the first start, during a restart) the next one's. It grows at every
    /// (re)spawn, so a change means a fresh child that needs a new `initialize` (legacy). Read
    /// before a handshake, it names the child the handshake lands on — except when the child
    /// dies in between, which [`CallOptions::generation`] catches.
    pub fn generation(&self) -> u64 {
        let s = self.status.borrow();
        if s.up { s.generation } else { s.generation + 1 }
    }

    /// Restart attempts since the first start (including failed spawns).
    pub fn restarts(&self) -> u64 {
        self.status.borrow().restarts
    }

    /// Whether a child is running right now.
    pub fn is_up(&self) -> bool {
        self.status.borrow().up
    }

    /// The running child's process id.
    pub fn pid(&self) -> Option<u32> {
        self.status.borrow().pid
    }

    /// Closes the child's stdin, gives it `EXIT_GRACE` to exit, then kills it. Every in-flight
    /// request fails; later calls fail with `Closed`.
    pub async fn shutdown(&self) {
        if self.take_idle().is_some() {
            return; // never started: dropping the actor closes the queue
        }
        let (tx, rx) = oneshot::channel();
        if self.cmd.send(Cmd::Shutdown(Some(tx))).is_ok() {
            let _ = rx.await;
        }
    }

    fn take_idle(&self) -> Option<Actor> {
        // The lock is never held across anything that can panic; recover from poison anyway.
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    fn start(&self) {
        if let Some(actor) = self.take_idle() {
            tokio::spawn(actor.run());
        }
    }

    fn send(&self, cmd: Cmd) -> Result<(), UpstreamError> {
        self.cmd.send(cmd).map_err(|_| stopped())
    }
}

impl Drop for StdioUpstream {
    fn drop(&mut self) {
        // A route table rebuilt on reload drops its backends; their children must go with them.
        let _ = self.cmd.send(Cmd::Shutdown(None));
    }
}

/// A `subscriptions/listen` answer: the child's messages tagged with this request's gateway id
/// (the acknowledgement, then notifications), their `subscriptionId` given back as the caller's
/// id, until the response ends the stream. Dropping it cancels the request, which ends the
/// child's stream too.
fn listen_reply(
    gid: u64,
    orig: &RawValue,
    notes: broadcast::Receiver<Bytes>,
    answer: Answer,
) -> Reply {
    let orig: serde_json::Value = serde_json::from_str(orig.get()).unwrap_or_default();
    let stream = futures_util::stream::unfold(Some((notes, answer)), move |st| {
        let orig = orig.clone();
        async move {
            let (mut notes, mut answer) = st?;
            loop {
                tokio::select! {
                    n = notes.recv() => match n {
                        Ok(m) => {
                            if let Some(m) = tagged(&m, gid, &orig) {
                                return Some((Ok(m), Some((notes, answer))));
                            }
                        }
                        Err(broadcast::error::RecvError::Lagged(_)) => {}
                        Err(broadcast::error::RecvError::Closed) => return Some((Err(stopped()), None)),
                    },
                    a = answer.next() => return match a {
                        Ok(Event::Note(b)) => Some((Ok(b), Some((notes, answer)))),
                        Ok(Event::Response(_, b)) => Some((Ok(b), None)),
                        Err(e) => Some((Err(e), None)),
                    },
                }
            }
        }
    });
    Reply {
        status: StatusCode::OK,
        headers: HeaderMap::new(),
        messages: MessageStream::Many(stream.boxed()),
    }
}

/// One unsolicited message of the child, if it belongs to the listen request `gid`: with the
/// caller's id as its `subscriptionId`.
fn tagged(msg: &[u8], gid: u64, orig: &serde_json::Value) -> Option<Bytes> {
    let mut v: serde_json::Value = serde_json::from_slice(msg).ok()?;
    let sid = v.pointer_mut("/params/_meta/io.modelcontextprotocol~1subscriptionId")?;
    if sid.as_u64() != Some(gid) && sid.as_str() != Some(gid.to_string().as_str()) {
        return None;
    }
    *sid = orig.clone();
    Some(Bytes::from(v.to_string()))
}

fn stopped() -> UpstreamError {
    UpstreamError::Closed("stdio backend is shut down".into())
}

// === The caller's side of one request ===

/// What the actor tells one caller.
enum Event {
    Note(Bytes),
    Response(StatusCode, Bytes),
}

/// Failure of a request as seen by the actor (child exit, restart between pin and write).
type Outcome = Result<Event, UpstreamError>;

struct Answer {
    rx: mpsc::Receiver<Outcome>,
    /// When the next message is due: the request's deadline, then moved on by each message.
    deadline: Instant,
    clock: CallClock,
    guard: CancelGuard,
}

impl Answer {
    async fn next(&mut self) -> Outcome {
        match timeout_at(self.deadline, self.rx.recv()).await {
            Err(_) => {
                // The guard stays armed: dropping this answer cancels the request upstream.
                self.guard.reason = "the deadline passed";
                Err(UpstreamError::Timeout)
            }
            Ok(None) => {
                self.guard.cmd = None;
                Err(stopped())
            }
            Ok(Some(Ok(Event::Note(b)))) => {
                self.deadline = self.clock.after_message();
                Ok(Event::Note(b))
            }
            Ok(Some(done)) => {
                // Answered or failed: the actor has forgotten the request, nothing to cancel.
                self.guard.cmd = None;
                done
            }
        }
    }
}

/// Cancels the request upstream when the caller drops its answer before the response.
struct CancelGuard {
    gid: u64,
    /// `None` once answered, or for requests that must not be cancelled.
    cmd: Option<mpsc::UnboundedSender<Cmd>>,
    reason: &'static str,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if let Some(cmd) = self.cmd.take() {
            let _ = cmd.send(Cmd::Cancel {
                gid: self.gid,
                reason: self.reason,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_log_level_in_meta_asks_for_logs() {
        let asks =
            |params: &str| asks_for_logs(Some(&RawValue::from_string(params.into()).unwrap()));
        assert!(asks(
            r#"{"_meta":{"io.modelcontextprotocol/logLevel":"info"}}"#
        ));
        assert!(!asks(
            r#"{"_meta":{"io.modelcontextprotocol/logLevel":null}}"#
        ));
        assert!(!asks(
            r#"{"arguments":{"x":"io.modelcontextprotocol/logLevel"}}"#
        ));
        assert!(!asks(
            r#"{"_meta":{"k":"io.modelcontextprotocol/logLevel"}}"#
        ));
        assert!(!asks(
            r#"{"arguments":{"_meta":{"io.modelcontextprotocol/logLevel":"info"}}}"#
        ));
        assert!(!asks_for_logs(None));
    }

    #[tokio::test]
    async fn line_reader_skips_oversized_lines() {
        let input: &[u8] = b"short\r\n0123456789abcdef\n\nok\ntail";
        let mut r = LineReader::new(input, 8);
        let mut got = Vec::new();
        while let Some(line) = r.next_line().await.unwrap() {
            got.push(match line {
                Line::Text(t) => String::from_utf8(t).unwrap(),
                Line::TooLong(n) => format!("<{n}>"),
            });
        }
        assert_eq!(got, ["short", "<16>", "ok", "tail"]);
    }

    #[test]
    fn progress_token_is_rewritten_and_kept() {
        let params = RawValue::from_string(
            r#"{"name":"t","arguments":{"n":12345678901234567890},"_meta":{"progressToken":"tok"}}"#
                .into(),
        )
        .unwrap();
        let (p, orig) = rewrite_token(&params, 7).unwrap();
        assert_eq!(orig.get(), r#""tok""#);
        assert!(
            p.get().contains(r#""progressToken":"portico-7""#),
            "{}",
            p.get()
        );
        assert!(
            p.get().contains("12345678901234567890"),
            "big numbers survive: {}",
            p.get()
        );
        let none = RawValue::from_string(r#"{"name":"t"}"#.into()).unwrap();
        assert!(rewrite_token(&none, 7).is_none());
    }

    #[test]
    fn lines_keep_their_framing() {
        let line = line_of(b"{\n  \"a\": \"x\\ny\"\r\n}".to_vec());
        assert_eq!(&line[..], b"{   \"a\": \"x\\ny\"  }\n");
        let req = request_line(3, "tools/call", None);
        assert_eq!(
            &req[..],
            b"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/call\"}\n"
        );
    }
}
