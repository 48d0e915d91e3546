//! An in-repo MCP backend for hermetic tests: a real HTTP server on 127.0.0.1:0 that speaks
//! 2026-07-28 (validating headers the way the spec says a server must) or the initialize era
//! (sessions, no `resultType`), answers in JSON or SSE, records every request it receives, and
//! can be told to misbehave.
//!
//! Builder style: `MockMcp::modern().sse().start().await`.

#![allow(dead_code)]

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use portico::body::{Body, sse_event};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, mpsc, oneshot, watch};

mod answer;
mod legacy;

use answer::{answer, sse_resp};
use legacy::legacy;

const LATEST: &str = "2026-07-28";

/// How a legacy mock answers a 2026-07-28 request (the probe), per the shapes in docs/protocol.md §5.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LegacyRejects {
    /// TypeScript SDK: 400 `-32000 "Bad Request: Unsupported protocol version: …"`.
    TsUnsupportedVersion,
    /// Python SDK legacy transport: 400 `-32600 "Bad Request: Missing session ID"`.
    PyMissingSession,
    /// A 404 with an empty body.
    Empty404,
    /// A 405 with an HTML body.
    Html405,
    /// Stateless legacy server: answers the request in legacy form (`-32601` for discover).
    AnswerLegacy,
}

#[derive(Clone, Debug)]
struct Opts {
    legacy: bool,
    sse: bool,
    stateless: bool,
    rejects: LegacyRejects,
    ttl_ms: Option<u64>,
    cache_scope: Option<&'static str>,
    list_delay: Duration,
    list_changed: bool,
    /// Tools per `tools/list` page (`None` = all on one page).
    page_size: Option<usize>,
    /// Lists `regional`, whose arguments carry `x-mcp-header`, and (modern) refuses a call
    /// whose `Mcp-Param-*` headers do not mirror them with `-32020`, as a strict server must.
    header_tools: bool,
    /// Advertise `resources.subscribe` (legacy: `resources/subscribe` works) and `logging`
    /// (legacy: `logging/setLevel` works, the `log` tool logs); legacy also advertises the
    /// in-core `tasks` of 2025-11-25 (not served).
    subscribe_and_log: bool,
    /// Legacy: `instructions` name the capabilities the `initialize` declared, so that each
    /// client's upstream session is answered differently.
    instructions_per_client: bool,
    /// Advertise an `experimental` capability (`mock/extra`; not served).
    experimental: bool,
    /// Legacy: sessions, but a GET (the standalone stream) is answered 405.
    no_get_stream: bool,
}

/// Builder for a mock backend.
pub struct MockMcp {
    opts: Opts,
}

/// What the mock saw of one request.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: Method,
    pub headers: HeaderMap,
    pub body: Value,
    /// The body as it arrived.
    pub raw: Bytes,
}

/// Shared state of a running mock.
pub struct MockState {
    opts: Mutex<Opts>,
    pub seen: Mutex<Vec<Seen>>,
    counts: Mutex<HashMap<String, u64>>,
    sessions: Mutex<HashSet<String>>,
    next_session: AtomicU64,
    /// Requests whose answer stream was dropped before it finished (the client went away).
    pub cancelled: Mutex<Vec<Value>>,
    pub cancelled_notify: Notify,
    /// `notifications/cancelled` messages received (legacy cancellation).
    pub cancel_notes: Mutex<Vec<Value>>,
    /// Answers to server-initiated requests, by id.
    waiting: Mutex<HashMap<String, oneshot::Sender<Value>>>,
    /// When set, every request is refused with a connection close (a dying server).
    pub down: AtomicBool,
    /// Extra tools added at runtime (by `add_tool`).
    extra_tools: Mutex<Vec<String>>,
    /// Open `subscriptions/listen` streams, with the resource URIs each subscribed to.
    listeners: Mutex<Vec<(Vec<String>, mpsc::Sender<Bytes>)>>,
    /// Legacy: open standalone GET SSE streams (where session-wide notifications go), by session.
    get_streams: Mutex<Vec<(String, mpsc::Sender<Bytes>)>>,
    /// Legacy: how many more GETs of a session's stream to refuse, and with which status
    /// (`refuse_gets`).
    pub get_refusals: Mutex<(u64, u16)>,
    /// Legacy: whether GETs of a session's stream are answered now (`hold_gets`): while
    /// `false`, they wait.
    pub gets_open: watch::Sender<bool>,
    /// Legacy `resumable`: the answer streams closed early, by the id of their last event.
    pub resumable: Mutex<HashMap<String, Resumable>>,
    /// Legacy: the `Last-Event-ID`s GETs named, in order.
    pub resumed_from: Mutex<Vec<String>>,
    /// Legacy: resource URIs subscribed (`resources/subscribe`), by session.
    pub subscribed: Mutex<HashMap<String, HashSet<String>>>,
    /// Legacy: the level `logging/setLevel` set, by session.
    pub levels: Mutex<HashMap<String, String>>,
    pub deletes: AtomicU64,
    /// Legacy: the session ids DELETE ended, in order.
    pub deleted: Mutex<Vec<String>>,
    /// Legacy: the `initialize` params of each session (stateless: under "").
    pub inits: Mutex<HashMap<String, Value>>,
    /// Legacy: what the `store` tool kept, per session.
    stored: Mutex<HashMap<String, String>>,
    /// Legacy: `tools/call` requests carrying `arguments.tag`, by (session, request id).
    tags: Mutex<HashMap<(String, String), String>>,
    /// Legacy: the tags of the requests `notifications/cancelled` named (in their session).
    pub cancelled_tags: Mutex<Vec<String>>,
    /// Legacy `ask`: when each server request was sent.
    pub asked: Mutex<Vec<tokio::time::Instant>>,
    /// Legacy `ask`: the client's answers (result or error, with the server's own id), with
    /// when they arrived.
    pub answers: Mutex<Vec<(tokio::time::Instant, Value)>>,
    pub answered: Notify,
}

/// A `resumable` call's answer stream, closed before its response: what a resumption
/// (a GET naming its last event) gets next.
pub struct Resumable {
    /// The request's id, for the response.
    pub id: Value,
    /// Resumptions still to close early (each with one log line) before the response.
    pub left: u64,
    /// The next event's number within the stream.
    pub next: u64,
}

/// A running mock.
pub struct MockHandle {
    pub addr: SocketAddr,
    pub state: Arc<MockState>,
    stop: Option<oneshot::Sender<()>>,
}

impl Drop for MockHandle {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

impl MockMcp {
    pub fn modern() -> MockMcp {
        MockMcp {
            opts: Opts {
                legacy: false,
                sse: false,
                stateless: false,
                rejects: LegacyRejects::TsUnsupportedVersion,
                ttl_ms: Some(60_000),
                cache_scope: Some("public"),
                list_delay: Duration::ZERO,
                list_changed: false,
                page_size: None,
                header_tools: false,
                subscribe_and_log: false,
                instructions_per_client: false,
                experimental: false,
                no_get_stream: false,
            },
        }
    }

    pub fn legacy() -> MockMcp {
        let mut m = MockMcp::modern();
        m.opts.legacy = true;
        m
    }

    /// Answer requests as SSE streams instead of JSON.
    pub fn sse(mut self) -> Self {
        self.opts.sse = true;
        self
    }

    /// Adds the `regional` tool (`x-mcp-header` arguments) and checks its headers.
    pub fn header_tools(mut self) -> Self {
        self.opts.header_tools = true;
        self
    }

    /// Legacy only: no sessions.
    pub fn stateless(mut self) -> Self {
        self.opts.stateless = true;
        self
    }

    pub fn rejects(mut self, r: LegacyRejects) -> Self {
        self.opts.rejects = r;
        self
    }

    /// `ttlMs` on list results (`None` leaves the field out).
    pub fn ttl_ms(mut self, ttl: Option<u64>) -> Self {
        self.opts.ttl_ms = ttl;
        self
    }

    /// `cacheScope` on list results (`None` leaves the field out).
    pub fn cache_scope(mut self, scope: Option<&'static str>) -> Self {
        self.opts.cache_scope = scope;
        self
    }

    /// Delay before answering list requests.
    pub fn list_delay(mut self, d: Duration) -> Self {
        self.opts.list_delay = d;
        self
    }

    /// Paginate `tools/list`: `n` tools per page, `nextCursor` = the next offset.
    pub fn page_size(mut self, n: usize) -> Self {
        self.opts.page_size = Some(n);
        self
    }

    /// Advertise `tools.listChanged`.
    pub fn list_changed(mut self) -> Self {
        self.opts.list_changed = true;
        self
    }

    /// Advertise `resources.subscribe` and `logging`, and serve them (see `Opts`).
    pub fn subscribe_and_log(mut self) -> Self {
        self.opts.subscribe_and_log = true;
        self
    }

    /// Legacy: refuse the standalone GET stream with 405 (see `Opts`).
    pub fn no_get_stream(mut self) -> Self {
        self.opts.no_get_stream = true;
        self
    }

    /// Advertise an `experimental` capability (see `Opts`).
    pub fn experimental(mut self) -> Self {
        self.opts.experimental = true;
        self
    }

    /// Legacy: answer each `initialize` with `instructions` that name the capabilities it
    /// declared (see `Opts`).
    pub fn instructions_per_client(mut self) -> Self {
        self.opts.instructions_per_client = true;
        self
    }

    pub async fn start(self) -> MockHandle {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::start_on(self, listener).await
    }

    /// Starts on a given listener (to restart a mock on the same port).
    pub async fn start_on(self, listener: tokio::net::TcpListener) -> MockHandle {
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(MockState {
            opts: Mutex::new(self.opts),
            seen: Mutex::new(Vec::new()),
            counts: Mutex::new(HashMap::new()),
            sessions: Mutex::new(HashSet::new()),
            next_session: AtomicU64::new(1),
            cancelled: Mutex::new(Vec::new()),
            cancelled_notify: Notify::new(),
            cancel_notes: Mutex::new(Vec::new()),
            waiting: Mutex::new(HashMap::new()),
            down: AtomicBool::new(false),
            extra_tools: Mutex::new(Vec::new()),
            listeners: Mutex::new(Vec::new()),
            subscribed: Mutex::new(HashMap::new()),
            levels: Mutex::new(HashMap::new()),
            get_streams: Mutex::new(Vec::new()),
            get_refusals: Mutex::new((0, 0)),
            gets_open: watch::channel(true).0,
            resumable: Mutex::new(HashMap::new()),
            resumed_from: Mutex::new(Vec::new()),
            deletes: AtomicU64::new(0),
            deleted: Mutex::new(Vec::new()),
            inits: Mutex::new(HashMap::new()),
            stored: Mutex::new(HashMap::new()),
            tags: Mutex::new(HashMap::new()),
            cancelled_tags: Mutex::new(Vec::new()),
            asked: Mutex::new(Vec::new()),
            answers: Mutex::new(Vec::new()),
            answered: Notify::new(),
        });
        let (stop_tx, mut stop_rx) = oneshot::channel::<()>();
        let st = state.clone();
        tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let (tcp, _) = tokio::select! {
                    a = listener.accept() => match a { Ok(x) => x, Err(_) => continue },
                    _ = &mut stop_rx => break,
                };
                let st = st.clone();
                conns.spawn(async move {
                    let svc = service_fn(move |req| {
                        let st = st.clone();
                        async move { Ok::<_, Infallible>(handle(st, req).await) }
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
            // Stopping the mock closes every connection, like a killed process.
            conns.abort_all();
        });
        MockHandle {
            addr,
            state,
            stop: Some(stop_tx),
        }
    }
}

impl MockHandle {
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// How many requests with this JSON-RPC method reached the mock.
    pub fn count(&self, method: &str) -> u64 {
        *self.state.counts.lock().unwrap().get(method).unwrap_or(&0)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    /// Answers the next `n` GETs of a session's stream with `status` — 409 Conflict as a
    /// server that allows one stream per session does while it still holds the one its client
    /// has just let go of.
    pub fn refuse_gets(&self, n: u64, status: u16) {
        *self.state.get_refusals.lock().unwrap() = (n, status);
    }

    /// Holds (`false`) or lets go of (`true`) the answers to GETs of a session's stream: a
    /// question asked while they are held stays open until let go.
    pub fn hold_gets(&self, held: bool) {
        self.state.gets_open.send_replace(!held);
    }

    /// The `Last-Event-ID`s that GETs named, in order.
    pub fn resumed_from(&self) -> Vec<String> {
        self.state.resumed_from.lock().unwrap().clone()
    }

    /// How many GETs of a session's stream (with its `Mcp-Session-Id`) the mock was sent.
    pub fn session_gets(&self) -> usize {
        let seen = self.state.seen.lock().unwrap();
        seen.iter()
            .filter(|s| s.method == Method::GET && s.headers.contains_key("mcp-session-id"))
            .count()
    }

    /// Forget every legacy session (as a restarted server would).
    pub fn drop_sessions(&self) {
        self.state.sessions.lock().unwrap().clear();
    }

    pub fn set_ttl(&self, ttl: Option<u64>) {
        self.state.opts.lock().unwrap().ttl_ms = ttl;
    }

    pub fn set_scope(&self, scope: Option<&'static str>) {
        self.state.opts.lock().unwrap().cache_scope = scope;
    }

    /// Adds a tool and announces `list_changed` on every open listen stream / legacy stream.
    pub fn add_tool(&self, name: &str) {
        add_tool(&self.state, name);
    }

    /// Legacy: how many standalone GET streams are open.
    pub fn get_streams(&self) -> usize {
        let mut gs = self.state.get_streams.lock().unwrap();
        gs.retain(|(_, tx)| !tx.is_closed());
        gs.len()
    }

    /// How many `subscriptions/listen` streams are open.
    pub fn listen_streams(&self) -> usize {
        let mut ls = self.state.listeners.lock().unwrap();
        ls.retain(|(_, tx)| !tx.is_closed());
        ls.len()
    }

    /// How many open `subscriptions/listen` streams subscribe to resources.
    pub fn resource_listens(&self) -> usize {
        let mut ls = self.state.listeners.lock().unwrap();
        ls.retain(|(_, tx)| !tx.is_closed());
        ls.iter().filter(|(uris, _)| !uris.is_empty()).count()
    }

    /// Ends every open `subscriptions/listen` stream (as a restarting server would).
    pub fn end_listens(&self) {
        self.state.listeners.lock().unwrap().clear();
    }

    /// Restarts, as far as a client can tell: every listen stream and legacy GET stream ends,
    /// and the legacy sessions and their subscriptions are forgotten.
    pub fn restart(&self) {
        self.end_listens();
        self.state.get_streams.lock().unwrap().clear();
        self.state.subscribed.lock().unwrap().clear();
        self.drop_sessions();
    }

    /// Announces `notifications/resources/updated` for `uri` to whoever subscribed to it: listen
    /// streams that named it, legacy sessions' GET streams after `resources/subscribe`.
    pub fn update_resource(&self, uri: &str) {
        let note = json!({"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":uri}});
        let mut ls = self.state.listeners.lock().unwrap();
        ls.retain(|(uris, tx)| {
            if !uris.iter().any(|u| u == uri) {
                return !tx.is_closed();
            }
            let mut n = note.clone();
            n["params"]["_meta"] = json!({"io.modelcontextprotocol/subscriptionId": "?"});
            tx.try_send(sse_event(n.to_string().as_bytes())).is_ok()
        });
        let subscribed = self.state.subscribed.lock().unwrap().clone();
        let mut gs = self.state.get_streams.lock().unwrap();
        gs.retain(|(session, tx)| {
            if !subscribed.get(session).is_some_and(|s| s.contains(uri)) {
                return !tx.is_closed();
            }
            tx.try_send(sse_event(note.to_string().as_bytes())).is_ok()
        });
    }

    /// Legacy: sends a log line at `level` on every session's GET stream (unasked, session-wide),
    /// honouring each session's `logging/setLevel`.
    pub fn log_to_sessions(&self, level: &str, data: &str) {
        let levels = self.state.levels.lock().unwrap().clone();
        let note = json!({"jsonrpc":"2.0","method":"notifications/message","params":{"level":level,"data":data}});
        let mut gs = self.state.get_streams.lock().unwrap();
        gs.retain(|(session, tx)| {
            if !at_least(level, levels.get(session).map(String::as_str)) {
                return !tx.is_closed();
            }
            tx.try_send(sse_event(note.to_string().as_bytes())).is_ok()
        });
    }

    pub fn session_count(&self) -> usize {
        self.state.sessions.lock().unwrap().len()
    }

    /// Waits (bounded) until the legacy `ask` tool has received `n` answers; returns them.
    pub async fn wait_answers(
        &self,
        n: usize,
        within: Duration,
    ) -> Vec<(tokio::time::Instant, Value)> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let notified = self.state.answered.notified();
            {
                let a = self.state.answers.lock().unwrap();
                if a.len() >= n {
                    return a.clone();
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.state.answers.lock().unwrap().clone();
            }
        }
    }

    /// Waits until some request's answer stream was dropped early.
    pub async fn wait_cancelled(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if !self.state.cancelled.lock().unwrap().is_empty()
                || !self.state.cancel_notes.lock().unwrap().is_empty()
            {
                return true;
            }
            if tokio::time::timeout_at(deadline, self.state.cancelled_notify.notified())
                .await
                .is_err()
            {
                return !self.state.cancelled.lock().unwrap().is_empty()
                    || !self.state.cancel_notes.lock().unwrap().is_empty();
            }
        }
    }
}

fn add_tool(state: &MockState, name: &str) {
    state.extra_tools.lock().unwrap().push(name.to_string());
    let note = json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed","params":{}});
    let mut ls = state.listeners.lock().unwrap();
    ls.retain(|(_, tx)| {
        let mut n = note.clone();
        n["params"]["_meta"] = json!({"io.modelcontextprotocol/subscriptionId": "?"});
        tx.try_send(sse_event(n.to_string().as_bytes())).is_ok()
    });
    // Legacy: session-wide notifications go to the session's GET stream, without `_meta`.
    let mut gs = state.get_streams.lock().unwrap();
    gs.retain(|(_, tx)| tx.try_send(sse_event(note.to_string().as_bytes())).is_ok());
}

/// Log levels, least severe first.
const LEVELS: [&str; 8] = [
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
];

/// Whether a line at `level` passes a session level `min` (none set: everything passes).
fn at_least(level: &str, min: Option<&str>) -> bool {
    let rank = |l: &str| LEVELS.iter().position(|x| *x == l).unwrap_or(0);
    min.is_none_or(|m| rank(level) >= rank(m))
}

/// The server capabilities a mock advertises (both eras).
fn caps(opts: &Opts) -> Value {
    let mut c = json!({"tools":{"listChanged":opts.list_changed},"resources":{},"prompts":{}});
    if opts.subscribe_and_log {
        c["resources"]["subscribe"] = json!(true);
        c["logging"] = json!({});
    }
    if opts.experimental {
        c["experimental"] = json!({"mock/extra": {}});
    }
    c
}

fn json_resp(status: StatusCode, v: &Value) -> Response<Body> {
    let mut r = Response::new(Body::full(v.to_string()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    r
}

fn empty(status: StatusCode) -> Response<Body> {
    let mut r = Response::new(Body::Empty);
    *r.status_mut() = status;
    r
}

fn err(id: &Value, code: i64, msg: &str) -> Value {
    let mut v = json!({"jsonrpc":"2.0","error":{"code":code,"message":msg}});
    if !id.is_null() {
        v["id"] = id.clone();
    }
    v
}

/// Marks a request cancelled if dropped before `done()`.
struct CancelGuard {
    state: Arc<MockState>,
    req: Value,
    done: bool,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.done {
            self.state.cancelled.lock().unwrap().push(self.req.clone());
            self.state.cancelled_notify.notify_waiters();
        }
    }
}

async fn handle(state: Arc<MockState>, req: Request<Incoming>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let bytes = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let parsed = serde_json::from_slice::<Value>(&bytes);
    let body: Value = parsed.as_ref().cloned().unwrap_or(Value::Null);
    state.seen.lock().unwrap().push(Seen {
        method: parts.method.clone(),
        headers: parts.headers.clone(),
        body: body.clone(),
        raw: bytes.clone(),
    });
    if let Some(m) = body.get("method").and_then(Value::as_str) {
        *state
            .counts
            .lock()
            .unwrap()
            .entry(m.to_string())
            .or_default() += 1;
    }
    let opts = state.opts.lock().unwrap().clone();
    if parsed.is_err() && parts.method == Method::POST {
        return json_resp(
            StatusCode::BAD_REQUEST,
            &err(&Value::Null, -32700, "Parse error"),
        );
    }
    if parts.uri.path() == "/stats" {
        return json_resp(StatusCode::OK, &json!(*state.counts.lock().unwrap()));
    }
    if opts.legacy {
        legacy(state, opts, parts, body).await
    } else {
        modern(state, opts, parts, body).await
    }
}

async fn modern(
    state: Arc<MockState>,
    opts: Opts,
    parts: http::request::Parts,
    body: Value,
) -> Response<Body> {
    if parts.method != Method::POST {
        return empty(StatusCode::METHOD_NOT_ALLOWED);
    }
    let h = |n: &str| header(&parts.headers, n);
    let id = body.get("id").cloned().unwrap_or(Value::Null);
    if body.is_array() {
        return json_resp(StatusCode::BAD_REQUEST, &err(&Value::Null, -32600, "batch"));
    }
    let Some(method) = body.get("method").and_then(Value::as_str) else {
        return json_resp(StatusCode::BAD_REQUEST, &err(&id, -32600, "no method"));
    };
    if body.get("id").is_none() {
        return empty(StatusCode::ACCEPTED);
    }
    // The spec's server-side header checks.
    if h("mcp-method").as_deref() != Some(method) {
        return json_resp(
            StatusCode::BAD_REQUEST,
            &err(&id, -32020, "Mcp-Method mismatch"),
        );
    }
    let name_field = match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        _ => None,
    };
    if let Some(f) = name_field {
        let want = body["params"][f].as_str();
        let got = h("mcp-name").and_then(|v| {
            portico::protocol::decode_header_value(v.as_bytes()).map(|c| c.into_owned())
        });
        let got = got.as_deref();
        if want != got {
            return json_resp(
                StatusCode::BAD_REQUEST,
                &err(&id, -32020, "Mcp-Name mismatch"),
            );
        }
    }
    if method == "tools/call"
        && let Some(why) = param_mismatch(&state, &body["params"], &parts.headers)
    {
        return json_resp(StatusCode::BAD_REQUEST, &err(&id, -32020, &why));
    }
    let meta = &body["params"]["_meta"];
    let pv = meta["io.modelcontextprotocol/protocolVersion"].as_str();
    if pv.is_none()
        || meta
            .get("io.modelcontextprotocol/clientCapabilities")
            .is_none()
    {
        return json_resp(StatusCode::BAD_REQUEST, &err(&id, -32602, "missing _meta"));
    }
    if pv != Some(LATEST) || h("mcp-protocol-version").as_deref() != Some(LATEST) {
        return json_resp(
            StatusCode::BAD_REQUEST,
            &json!({"jsonrpc":"2.0","id":id,"error":{"code":-32022,"message":"Unsupported protocol version","data":{"supported":[LATEST],"requested":pv}}}),
        );
    }
    answer(state, &opts, method, &body, &parts.headers, true).await
}

/// The legacy session a request belongs to ("" without one).
/// Header `n` as text, when present and visible ASCII.
fn header(headers: &HeaderMap, n: &str) -> Option<String> {
    headers
        .get(n)
        .and_then(|v| v.to_str().ok())
        .map(String::from)
}

fn session_of(headers: &HeaderMap) -> String {
    headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

fn cache_fields(opts: &Opts, mut v: Value) -> Value {
    if let Some(t) = opts.ttl_ms {
        v["ttlMs"] = json!(t);
    }
    if let Some(s) = opts.cache_scope {
        v["cacheScope"] = json!(s);
    }
    v
}

/// The `regional` tool: `region` (string), `priority` (integer) and `urgent` (boolean) are
/// mirrored in `Mcp-Param-Region`, `-Priority`, `-Urgent`; `note` is not.
fn regional_tool() -> Value {
    json!({"name":"regional","inputSchema":{"type":"object","properties":{
        "region":{"type":"string","x-mcp-header":"Region"},
        "priority":{"type":"integer","x-mcp-header":"Priority"},
        "urgent":{"type":"boolean","x-mcp-header":"Urgent"},
        "note":{"type":"string"}}}})
}

/// What a strict 2026-07-28 server checks of a `tools/call` of a tool with `x-mcp-header`
/// arguments: each present argument has its header, with the same value (decoded), and no
/// header without its argument. `Some(why)` when it must refuse with `-32020`.
fn param_mismatch(state: &MockState, params: &Value, headers: &HeaderMap) -> Option<String> {
    if !state.opts.lock().unwrap().header_tools || params["name"] != "regional" {
        return None;
    }
    for (arg, header) in [
        ("region", "Region"),
        ("priority", "Priority"),
        ("urgent", "Urgent"),
    ] {
        let want = match &params["arguments"][arg] {
            Value::Null => None,
            Value::String(s) => Some(s.clone()),
            v @ (Value::Number(_) | Value::Bool(_)) => Some(v.to_string()),
            _ => return Some(format!("{arg}: bad type")),
        };
        let got = headers
            .get(format!("mcp-param-{header}"))
            .map(|v| portico::protocol::decode_header_value(v.as_bytes()).map(|c| c.into_owned()));
        let got = match got {
            None => None,
            Some(Some(v)) => Some(v),
            Some(None) => return Some(format!("Mcp-Param-{header} is not a valid value")),
        };
        if want != got {
            return Some(format!(
                "Mcp-Param-{header} header {got:?} does not match argument {want:?}"
            ));
        }
    }
    None
}

/// Whether a client's capabilities include one that lets a server ask it things.
fn can_be_asked(caps: &Value) -> bool {
    ["sampling", "elicitation", "roots"]
        .iter()
        .any(|c| caps.get(c).is_some_and(Value::is_object))
}

/// The tool list a client with `caps` gets: `sampler` only for clients that can be asked
/// (as servers that sample or elicit mid-call list such tools).
fn tools_for(state: &MockState, caps: &Value) -> Value {
    let mut t = tools(state);
    if can_be_asked(caps)
        && let Some(a) = t.as_array_mut()
    {
        a.push(json!({"name":"sampler","inputSchema":{"type":"object"}}));
    }
    t
}

fn tools(state: &MockState) -> Value {
    let mut tools = vec![
        json!({"name":"echo","inputSchema":{"type":"object","properties":{"text":{"type":"string"}}}}),
        json!({"name":"add","inputSchema":{"type":"object"}}),
        json!({"name":"progress","inputSchema":{"type":"object"}}),
        json!({"name":"slow","inputSchema":{"type":"object"}}),
        json!({"name":"whoami","inputSchema":{"type":"object"}}),
        json!({"name":"ask","inputSchema":{"type":"object"}}),
    ];
    if state.opts.lock().unwrap().header_tools {
        tools.push(regional_tool());
    }
    for t in state.extra_tools.lock().unwrap().iter() {
        tools.push(json!({"name": t, "inputSchema":{"type":"object"}}));
    }
    Value::Array(tools)
}
