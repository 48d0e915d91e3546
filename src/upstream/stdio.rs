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
}

impl Default for CallOptions {
    fn default() -> Self {
        CallOptions {
            cancel_on_drop: true,
            generation: None,
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
            generation: None,
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
            self.notify(body).await?;
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
            logs: msg.method != "subscriptions/listen"
                && msg
                    .params
                    .is_some_and(|p| p.get().contains("io.modelcontextprotocol/logLevel")),
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
    /// server's ids: portico never rewrites them), as it is.
    pub async fn respond(&self, body: Bytes) -> Result<(), UpstreamError> {
        if !crate::protocol::is_response(&body) {
            return Err(UpstreamError::Protocol("not a response".into()));
        }
        self.send(Cmd::Notify(line_of(body.to_vec())))
    }

    /// Sends a notification (e.g. `notifications/initialized`). Written once the child is up.
    pub async fn notify(&self, body: Bytes) -> Result<(), UpstreamError> {
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
        self.send(Cmd::Notify(line_of(body.to_vec())))
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

// === The actor ===

enum Cmd {
    Request {
        gid: u64,
        line: Bytes,
        pending: Pending,
    },
    Notify(Bytes),
    Cancel {
        gid: u64,
        reason: &'static str,
    },
    /// Stop; the sender (if any) learns when the child is gone.
    Shutdown(Option<oneshot::Sender<()>>),
}

/// An in-flight request, keyed by gateway id.
struct Pending {
    orig_id: Box<RawValue>,
    orig_token: Option<Box<RawValue>>,
    /// The request asked for log lines (`_meta` `logLevel`, 2026-07-28).
    logs: bool,
    cancellable: bool,
    generation: Option<u64>,
    tx: mpsc::Sender<Outcome>,
}

impl Pending {
    /// Queues a notification unless only the slot reserved for the final answer is left.
    fn note(&self, body: Bytes) {
        if self.tx.capacity() > 1 {
            let _ = self.tx.try_send(Ok(Event::Note(body)));
        }
    }

    /// Always fits: the actor is the only sender and `note` keeps one slot free.
    fn finish(self, outcome: Outcome) {
        let _ = self.tx.try_send(outcome);
    }
}

/// Why a session ended.
enum End {
    Exited(String),
    Stop(Option<oneshot::Sender<()>>),
}

struct Actor {
    name: Arc<str>,
    program: String,
    args: Vec<String>,
    env: BTreeMap<String, String>,
    cwd: Option<PathBuf>,
    max_line: usize,
    rx: mpsc::UnboundedReceiver<Cmd>,
    status: watch::Sender<Status>,
    notes: broadcast::Sender<Bytes>,
    pending: HashMap<u64, Pending>,
    /// Commands received while no child runs (backoff); replayed in order after the spawn.
    backlog: VecDeque<Cmd>,
    /// What the server writes wrong is logged within a budget.
    warnings: super::WarnBudget,
    /// The child serves one client (`isolation = "per_client"`): any call in flight is that
    /// client's, so a server request can go to the newest one.
    owned: bool,
    /// An HTTP+SSE session instead of a child (`sse.rs`).
    sse: Option<Arc<SseTarget>>,
}

/// What the actor talks to.
enum Link {
    Child(Child),
    Sse(SseConn, Writer),
}

type Writer = mpsc::UnboundedSender<Bytes>;

impl Actor {
    async fn run(mut self) {
        let mut backoff = INITIAL_BACKOFF;
        let mut first = true;
        loop {
            if !first {
                self.status.send_modify(|s| s.restarts += 1);
            }
            first = false;
            let end = match self.open().await {
                Ok(link) => {
                    let started = Instant::now();
                    let end = match link {
                        Link::Child(child) => self.session(child).await,
                        Link::Sse(conn, out) => self.sse_session(conn, out).await,
                    };
                    if started.elapsed() >= STABLE_AFTER {
                        backoff = INITIAL_BACKOFF;
                    }
                    end
                }
                Err(msg) => self.refuse_waiting(msg),
            };
            let why = match end {
                End::Stop(ack) => {
                    if let Some(ack) = ack {
                        let _ = ack.send(());
                    }
                    return;
                }
                End::Exited(why) => why,
            };
            let restarts = self.status.borrow().restarts;
            let backoff_ms = backoff.as_millis() as u64;
            if self.sse.is_some() {
                warn!(backend = %self.name, reason = %why, restarts, backoff_ms,
                    "SSE session ended; opening a new one after backoff");
            } else {
                warn!(backend = %self.name, reason = %why, restarts, backoff_ms,
                    "stdio server is down; restarting after backoff");
            }
            if !self.wait_backoff(Instant::now() + backoff).await {
                return;
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// After a failed spawn, fails every request waiting for a child at once (the next attempt
    /// may be up to `MAX_BACKOFF` away), while still honouring a queued shutdown.
    fn refuse_waiting(&mut self, msg: String) -> End {
        while let Ok(cmd) = self.rx.try_recv() {
            self.backlog.push_back(cmd);
        }
        let mut end = End::Exited(msg.clone());
        for cmd in std::mem::take(&mut self.backlog) {
            match cmd {
                Cmd::Request { pending, .. } => {
                    pending.finish(Err(UpstreamError::Connect(msg.clone())))
                }
                Cmd::Shutdown(ack) => end = End::Stop(ack),
                Cmd::Notify(_) | Cmd::Cancel { .. } => {}
            }
        }
        end
    }

    /// Starts the link: spawns the child, or opens an SSE session (bounded by `timeout_ms`).
    async fn open(&self) -> Result<Link, String> {
        if let Some(t) = &self.sse {
            return match super::sse::connect(t).await {
                Ok((conn, out)) => Ok(Link::Sse(conn, out)),
                Err(why) => {
                    warn!(backend = %self.name, %why, "cannot open the SSE session");
                    Err(format!("cannot open the SSE session: {why}"))
                }
            };
        }
        self.spawn().map(Link::Child).map_err(|error| {
            let program = &self.program;
            warn!(backend = %self.name, %error, %program, "cannot start stdio server");
            format!("cannot start stdio server {program:?}: {error}")
        })
    }

    /// Runs one HTTP+SSE session until its stream ends, a POST fails or portico stops it;
    /// fails whatever is still in flight (the next session is a new generation).
    async fn sse_session(&mut self, mut conn: SseConn, out: Writer) -> End {
        let mut dead = std::mem::replace(&mut conn.dead, mpsc::unbounded_channel().1);
        let (generation, end) = self.begin_session(None, &out);
        info!(backend = %self.name, generation, "SSE session opened");
        let end = match end {
            Some(end) => end,
            None => loop {
                tokio::select! {
                    cmd = self.rx.recv() => match cmd {
                        None => break End::Stop(None),
                        Some(cmd) => {
                            if let Some(end) = self.command(cmd, &out, generation) {
                                break end;
                            }
                        }
                    },
                    msg = conn.next_message() => match msg {
                        Ok(Some(m)) => self.on_stdout(Line::Text(m.to_vec()), &out),
                        Ok(None) => break End::Exited("the SSE stream ended".into()),
                        Err(why) => break End::Exited(why),
                    },
                    why = dead.recv() => break End::Exited(
                        why.unwrap_or_else(|| "the SSE poster stopped".into())
                    ),
                }
            },
        };
        drop(out);
        drop(conn);
        self.status.send_modify(|s| {
            s.up = false;
            s.pid = None;
        });
        let err = UpstreamError::Closed(match &end {
            End::Exited(why) => format!("SSE session ended: {why}"),
            End::Stop(_) => "SSE backend is shutting down".into(),
        });
        for (_, p) in self.pending.drain() {
            p.finish(Err(err.clone()));
        }
        end
    }

    fn spawn(&self) -> std::io::Result<Child> {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .envs(&self.env)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        if let Some(dir) = &self.cwd {
            cmd.current_dir(dir);
        }
        cmd.spawn()
    }

    /// Sleeps until `until`, keeping commands for the next child. `false` = stop.
    async fn wait_backoff(&mut self, until: Instant) -> bool {
        loop {
            tokio::select! {
                _ = sleep_until(until) => return true,
                cmd = self.rx.recv() => match cmd {
                    None => return false,
                    Some(Cmd::Shutdown(ack)) => {
                        if let Some(ack) = ack {
                            let _ = ack.send(());
                        }
                        return false;
                    }
                    Some(Cmd::Cancel { gid, .. }) => self
                        .backlog
                        .retain(|c| !matches!(c, Cmd::Request { gid: g, .. } if *g == gid)),
                    Some(cmd) => self.backlog.push_back(cmd),
                },
            }
        }
    }

    /// Runs one child until it exits or portico stops it; fails whatever is still in flight.
    async fn session(&mut self, mut child: Child) -> End {
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            let _ = child.kill().await;
            return End::Exited("stdio pipes missing".into());
        };
        let (out, wrx) = mpsc::unbounded_channel();
        tokio::spawn(write_lines(stdin, wrx));
        tokio::spawn(log_stderr(stderr, self.name.clone()));
        let mut stdout = LineReader::new(stdout, self.max_line);
        let pid = child.id();
        let (generation, end) = self.begin_session(pid, &out);
        info!(backend = %self.name, pid, generation, "stdio server started");
        let end = match end {
            Some(end) => end,
            None => loop {
                tokio::select! {
                    cmd = self.rx.recv() => match cmd {
                        None => break End::Stop(None),
                        Some(cmd) => {
                            if let Some(end) = self.command(cmd, &out, generation) {
                                break end;
                            }
                        }
                    },
                    line = stdout.next_line() => match line {
                        Ok(Some(line)) => self.on_stdout(line, &out),
                        // Usually the child exiting; its status makes the better message.
                        Ok(None) => break match timeout(EXIT_GRACE, child.wait()).await {
                            Ok(Ok(st)) => End::Exited(format!("stdio server exited ({st})")),
                            _ => End::Exited("stdio server closed its stdout".into()),
                        },
                        Err(e) => break End::Exited(format!("reading stdout failed: {e}")),
                    },
                    status = child.wait() => {
                        // Answers written just before exiting are still in the pipe.
                        let until = Instant::now() + EXIT_DRAIN;
                        while let Ok(Ok(Some(line))) = timeout_at(until, stdout.next_line()).await {
                            self.on_stdout(line, &out);
                        }
                        break End::Exited(match status {
                            Ok(s) => format!("stdio server exited ({s})"),
                            Err(e) => format!("stdio server exited (wait failed: {e})"),
                        });
                    }
                }
            },
        };
        // Closing stdin is the polite stop for an MCP stdio server; kill it if it lingers.
        drop(out);
        if timeout(EXIT_GRACE, child.wait()).await.is_err() {
            let _ = child.kill().await;
        }
        self.status.send_modify(|s| {
            s.up = false;
            s.pid = None;
        });
        let err = UpstreamError::Closed(match &end {
            End::Exited(why) => why.clone(),
            End::Stop(_) => "stdio backend is shutting down".into(),
        });
        for (_, p) in self.pending.drain() {
            p.finish(Err(err.clone()));
        }
        end
    }

    /// A session (child or SSE connection) is up: the status says so under a new generation,
    /// and what was asked while none ran is sent. The generation, and the end a replayed
    /// command asked for.
    fn begin_session(&mut self, pid: Option<u32>, out: &Writer) -> (u64, Option<End>) {
        self.status.send_modify(|s| {
            s.up = true;
            s.generation += 1;
            s.pid = pid;
        });
        let generation = self.status.borrow().generation;
        let mut end = None;
        for cmd in std::mem::take(&mut self.backlog) {
            end = end.or(self.command(cmd, out, generation));
        }
        (generation, end)
    }

    fn command(&mut self, cmd: Cmd, out: &Writer, generation: u64) -> Option<End> {
        match cmd {
            Cmd::Request { gid, line, pending } => {
                if pending.tx.is_closed() {
                    return None; // the caller left before it was ever sent
                }
                if pending.generation.is_some_and(|g| g != generation) {
                    pending.finish(Err(UpstreamError::Restarted));
                    return None;
                }
                self.pending.insert(gid, pending);
                let _ = out.send(line);
            }
            Cmd::Notify(line) => {
                let _ = out.send(line);
            }
            Cmd::Cancel { gid, reason } => {
                if let Some(p) = self.pending.remove(&gid)
                    && p.cancellable
                {
                    debug!(backend = %self.name, gid, reason, "cancelling stdio request");
                    let params = json!({"requestId": gid, "reason": reason});
                    let method = "notifications/cancelled";
                    let msg = json!({"jsonrpc": "2.0", "method": method, "params": params});
                    let _ = out.send(line_of(serde_json::to_vec(&msg).unwrap_or_default()));
                }
            }
            Cmd::Shutdown(ack) => return Some(End::Stop(ack)),
        }
        None
    }

    fn on_stdout(&mut self, line: Line, out: &Writer) {
        let line = match line {
            Line::Text(t) => t,
            Line::TooLong(bytes) => {
                if self.warnings.allow() {
                    let max = self.max_line;
                    let name = &self.name;
                    warn!(backend = %name, bytes, max, "stdio server wrote an oversized line; skipped");
                }
                return;
            }
        };
        let msg = match serde_json::from_slice::<Incoming>(&line) {
            Ok(m) if first_byte(&line) == Some(b'{') => m,
            _ => {
                if self.warnings.allow() {
                    let line = preview(&line);
                    let name = &self.name;
                    warn!(backend = %name, %line, "stdio server wrote a non-JSON-RPC line; skipped");
                }
                return;
            }
        };
        match (msg.method.as_deref(), msg.id) {
            (Some(method), Some(id)) => self.server_request(method, id, &line, out),
            (Some(method), None) => self.notification(method, msg.params, &line),
            (None, Some(id)) if msg.result.is_some() || msg.error.is_some() => {
                self.response(id, msg.result, msg.error)
            }
            _ if self.warnings.allow() => {
                let line = preview(&line);
                warn!(backend = %self.name, %line, "stdio server wrote an invalid message; skipped")
            }
            _ => {}
        }
    }

    fn response(&mut self, id: &RawValue, result: Option<&RawValue>, error: Option<&RawValue>) {
        let Some(p) = gateway_id(id).and_then(|gid| self.pending.remove(&gid)) else {
            if self.warnings.allow() {
                warn!(backend = %self.name, id = id.get(), "reply with an unknown id dropped");
            }
            return;
        };
        let status = match (result, error) {
            (None, Some(e)) => {
                let code = serde_json::from_str::<ErrorCode>(e.get())
                    .map_or(code::INTERNAL_ERROR, |c| c.code);
                StatusCode::from_u16(status_for_code(code)).unwrap_or(StatusCode::OK)
            }
            _ => StatusCode::OK,
        };
        let body = OutResponse {
            jsonrpc: "2.0",
            id: &p.orig_id,
            result,
            error: result.is_none().then_some(error).flatten(),
        };
        let body = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
        p.finish(Ok(Event::Response(status, body)));
    }

    /// A server's request: `ping` is answered here; a request a client can be asked
    /// (`protocol::INPUT_REQUESTS`) joins the stream of the call it belongs to, where the bridge
    /// relays or parks it (`bridge::input`) and answers through [`StdioUpstream::respond`];
    /// anything else, or one no call can be found for, is refused at once rather than leave
    /// the server waiting.
    fn server_request(&mut self, method: &str, id: &RawValue, line: &[u8], out: &Writer) {
        if crate::protocol::input_capability(method).is_some()
            && let Some(call) = self.call_for_input()
            && call.tx.capacity() > 1
            && call
                .tx
                .try_send(Ok(Event::Note(Bytes::copy_from_slice(line))))
                .is_ok()
        {
            debug!(backend = %self.name, method, "server request joins its call's stream");
            return;
        }
        let reply = if method == "ping" {
            debug!(backend = %self.name, "answering server ping");
            json!({"jsonrpc": "2.0", "id": id, "result": {}})
        } else {
            warn!(backend = %self.name, method, "server-initiated request refused");
            let error = json!({"code": code::METHOD_NOT_FOUND, "message": NO_SERVER_REQUESTS});
            json!({"jsonrpc": "2.0", "id": id, "error": error})
        };
        let _ = out.send(line_of(serde_json::to_vec(&reply).unwrap_or_default()));
    }

    /// The call a server request made now belongs to: stdio says nothing about it, so only
    /// when the answer is certain — the newest client call on a child that serves one client,
    /// or the only one in flight on a shared child. portico's own handshakes never qualify.
    fn call_for_input(&self) -> Option<&Pending> {
        let mut calls = self.pending.iter().filter(|(_, p)| p.cancellable);
        if self.owned {
            return calls.max_by_key(|(gid, _)| **gid).map(|(_, p)| p);
        }
        let only = calls.next()?;
        calls.next().is_none().then_some(only.1)
    }

    /// Progress goes to the request whose gateway token it carries, with the caller's token
    /// restored; every other notification is broadcast to subscribers as the child sent it.
    fn notification(&mut self, method: &str, params: Option<&RawValue>, line: &[u8]) {
        // A log line on stdio names no request. A 2026-07-28 server emits one only for a
        // request that set `logLevel` (docs/protocol.md §1), so when exactly one such request
        // is in flight the line is its own; with several it cannot be told whose, and is
        // nobody's (never another client's).
        if method == "notifications/message" {
            let mut asking = self.pending.values().filter(|p| p.logs);
            if let Some(p) = asking.next() {
                if asking.next().is_none() {
                    p.note(Bytes::copy_from_slice(line));
                } else {
                    debug!(backend = %self.name, "a log line with several requests asking: dropped");
                }
                return;
            }
        }
        if method != "notifications/progress" {
            let _ = self.notes.send(Bytes::copy_from_slice(line));
            return;
        }
        let routed = params.and_then(|p| {
            let mut map = serde_json::from_str::<BTreeMap<String, Box<RawValue>>>(p.get()).ok()?;
            let token = serde_json::from_str::<String>(map.get("progressToken")?.get()).ok()?;
            let gid = token.strip_prefix(TOKEN_PREFIX)?.parse::<u64>().ok()?;
            let pending = self.pending.get(&gid)?;
            map.insert("progressToken".into(), pending.orig_token.clone()?);
            let msg = json!({"jsonrpc": "2.0", "method": method, "params": map});
            Some((pending, serde_json::to_vec(&msg).ok()?))
        });
        match routed {
            Some((pending, body)) => pending.note(Bytes::from(body)),
            // Normal after a cancel or a timeout: the server had not seen it yet.
            None => debug!(backend = %self.name, "progress for no in-flight request dropped"),
        }
    }
}

/// Writes queued lines to the child's stdin; ends (closing stdin) when the queue closes.
async fn write_lines(mut stdin: ChildStdin, mut rx: mpsc::UnboundedReceiver<Bytes>) {
    while let Some(line) = rx.recv().await {
        if stdin.write_all(&line).await.is_err() {
            return; // the child is gone; the actor learns that from its exit
        }
    }
}

/// Logs the child's stderr under the backend's name, at most `STDERR_LINES_PER_SEC` lines a
/// second: a chatty or crash-looping server must not flood portico's log.
async fn log_stderr(stderr: ChildStderr, name: Arc<str>) {
    let mut lines = LineReader::new(stderr, MAX_STDERR_LINE);
    let mut window = Instant::now();
    let (mut shown, mut suppressed) = (0u32, 0u64);
    loop {
        tokio::select! {
            line = lines.next_line() => {
                let Ok(Some(line)) = line else { break };
                if window.elapsed() >= Duration::from_secs(1) {
                    window = Instant::now();
                    shown = 0;
                }
                if shown >= STDERR_LINES_PER_SEC {
                    suppressed += 1;
                    continue;
                }
                shown += 1;
                match line {
                    Line::Text(t) => {
                        let line = String::from_utf8_lossy(&t);
                        info!(backend = %name, %line, "stdio server stderr");
                    }
                    Line::TooLong(bytes) => {
                        info!(backend = %name, bytes, "stdio server stderr line too long; skipped");
                    }
                }
            }
            _ = sleep_until(window + Duration::from_secs(1)), if suppressed > 0 => {
                warn!(backend = %name, suppressed, "stdio server stderr rate-limited");
                suppressed = 0;
            }
        }
    }
    if suppressed > 0 {
        warn!(backend = %name, suppressed, "stdio server stderr rate-limited");
    }
}

// === Lines and messages ===

pub(crate) enum Line {
    Text(Vec<u8>),
    /// A line longer than the limit was discarded; its length.
    TooLong(usize),
}

/// Reads `\n`-terminated lines, holding at most `max` bytes: the rest of a longer line is
/// discarded as it arrives. Cancel-safe (all state lives here; nothing is lost between awaits),
/// so it can sit in a `select!`.
pub(crate) struct LineReader<R> {
    inner: BufReader<R>,
    buf: Vec<u8>,
    max: usize,
    /// Bytes discarded so far of an oversized line.
    skipping: Option<usize>,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    pub(crate) fn new(inner: R, max: usize) -> Self {
        LineReader {
            inner: BufReader::new(inner),
            buf: Vec::new(),
            max,
            skipping: None,
        }
    }

    pub(crate) async fn next_line(&mut self) -> std::io::Result<Option<Line>> {
        loop {
            let chunk = self.inner.fill_buf().await?;
            if chunk.is_empty() {
                // End of stream: a last line without '\n' still counts.
                if let Some(n) = self.skipping.take() {
                    return Ok(Some(Line::TooLong(n)));
                }
                return Ok(
                    (!self.buf.is_empty()).then(|| Line::Text(std::mem::take(&mut self.buf)))
                );
            }
            let newline = chunk.iter().position(|b| *b == b'\n');
            let take = newline.unwrap_or(chunk.len());
            match &mut self.skipping {
                Some(n) => *n += take,
                None if self.buf.len() + take > self.max => {
                    self.skipping = Some(self.buf.len() + take);
                    self.buf = Vec::new(); // give the memory back now
                }
                None => self.buf.extend_from_slice(&chunk[..take]),
            }
            self.inner.consume(take + usize::from(newline.is_some()));
            if newline.is_some() {
                if let Some(n) = self.skipping.take() {
                    return Ok(Some(Line::TooLong(n)));
                }
                let mut line = std::mem::take(&mut self.buf);
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                if !line.is_empty() {
                    return Ok(Some(Line::Text(line)));
                }
            }
        }
    }
}

/// The parts of a caller's message portico needs; params stay raw (never re-encoded, so big
/// numbers and key order survive).
struct Outbound<'a> {
    id: Option<&'a RawValue>,
    method: Cow<'a, str>,
    params: Option<&'a RawValue>,
}

impl<'a> Outbound<'a> {
    fn parse(body: &'a [u8]) -> Result<Outbound<'a>, UpstreamError> {
        #[derive(Deserialize)]
        struct Msg<'a> {
            #[serde(borrow)]
            id: Option<&'a RawValue>,
            #[serde(borrow)]
            method: Option<Cow<'a, str>>,
            #[serde(borrow)]
            params: Option<&'a RawValue>,
        }
        let bad = || UpstreamError::Protocol("not a JSON-RPC request or notification".into());
        if first_byte(body) != Some(b'{') {
            return Err(bad());
        }
        let m: Msg = serde_json::from_slice(body).map_err(|_| bad())?;
        Ok(Outbound {
            id: m.id,
            method: m.method.ok_or_else(bad)?,
            params: m.params,
        })
    }
}

/// A message from the child.
#[derive(Deserialize)]
struct Incoming<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow)]
    params: Option<&'a RawValue>,
    #[serde(borrow)]
    result: Option<&'a RawValue>,
    #[serde(borrow)]
    error: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct ErrorCode {
    code: i64,
}

#[derive(Serialize)]
struct OutRequest<'a> {
    jsonrpc: &'static str,
    id: u64,
    method: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    params: Option<&'a RawValue>,
}

#[derive(Serialize)]
struct OutResponse<'a> {
    jsonrpc: &'static str,
    id: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a RawValue>,
}

fn request_line(gid: u64, method: &str, params: Option<&RawValue>) -> Bytes {
    let msg = OutRequest {
        jsonrpc: "2.0",
        id: gid,
        method,
        params,
    };
    line_of(serde_json::to_vec(&msg).unwrap_or_default())
}

/// Replaces `params._meta.progressToken` with the gateway token; returns the new params and the
/// caller's token. `None` when there is no token (the params are then sent untouched).
fn rewrite_token(params: &RawValue, gid: u64) -> Option<(Box<RawValue>, Box<RawValue>)> {
    if !params.get().contains("progressToken") {
        return None; // cheap skip: most requests carry no token
    }
    let mut p = serde_json::from_str::<BTreeMap<String, Box<RawValue>>>(params.get()).ok()?;
    let mut meta =
        serde_json::from_str::<BTreeMap<String, Box<RawValue>>>(p.get("_meta")?.get()).ok()?;
    let token = to_raw_value(&format!("{TOKEN_PREFIX}{gid}")).ok()?;
    let orig = meta.insert("progressToken".into(), token)?;
    p.insert("_meta".into(), to_raw_value(&meta).ok()?);
    Some((to_raw_value(&p).ok()?, orig))
}

/// One wire line. Raw bytes `\n`/`\r` can only be insignificant whitespace in valid JSON
/// (control characters are escaped inside strings), so turning them into spaces keeps a
/// pretty-printed message intact while keeping the newline framing.
fn line_of(mut msg: Vec<u8>) -> Bytes {
    for b in msg.iter_mut().filter(|b| matches!(**b, b'\n' | b'\r')) {
        *b = b' ';
    }
    msg.push(b'\n');
    Bytes::from(msg)
}

/// A gateway id as the child echoed it (we only ever send non-negative integers).
fn gateway_id(raw: &RawValue) -> Option<u64> {
    raw.get().parse().ok()
}

fn preview(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(&line[..line.len().min(200)]);
    if line.len() > 200 {
        format!("{text}…")
    } else {
        text.into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
