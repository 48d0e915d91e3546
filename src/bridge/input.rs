//! Server-to-client requests of an initialize-era backend during a call: `elicitation/create`,
//! `sampling/createMessage`, `roots/list` (docs/protocol.md §10). They arrive on the call's
//! own SSE stream, inside the calling client's own upstream session, so the client they are
//! for is always the one that made the call. What happens to them depends on that client
//! ([`InputSide`]):
//!
//! - **an initialize-era client** ([`InputSide::Relay`]): relayed on the call's stream with an
//!   id portico mints (`portico-input-<n>`, so ids never collide across clients); the client
//!   POSTs its answer in the same session, [`answer`] routes it to the waiting server request
//!   with the server's own id. No answer within `input_hold_ms` → the server gets an error.
//! - **a 2026-07-28 client** ([`InputSide::Park`]): the call is *parked* — its upstream stream,
//!   session slot and cancel guard held here — and the client gets `resultType:
//!   "input_required"` with the request in `inputRequests` and a sealed `requestState`
//!   ([`State`]: the parked call, the caller's authorization context, the request it answers,
//!   the expiry, the replica). The retry ([`resume`]) delivers `inputResponses` to the server
//!   and reads on. A parked call is answered with an error and dropped (the server hears
//!   `notifications/cancelled`) when its hold ends, by a timer armed when it parks: nothing
//!   outlives `input_hold_ms` (`portico_parked_calls`).
//! - portico's own traffic, and an initialize-era client's `resources/read` (read whole through
//!   the cache: nothing can be relayed mid-stream) (no side): refused — the server never waits.
//!
//! The client must have declared the capability the request needs (`elicitation`, `sampling`,
//! `roots`); otherwise the server's request is answered with `-32601` naming it and the call
//! goes on. A parked call's hold is also bounded by the call's own deadline (`timeout_ms`): the
//! upstream stream it holds ends there.

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::send_raw;
use super::translate::{CancelGuard, Mapping, Translated, from_legacy, modernize_result};
use crate::backend::{Backend, LegacySession};
use crate::error::GatewayError;
use crate::pool::OwnerKey;
use crate::protocol::{RequestId, code, is_response};
use crate::session::Sealer;
use crate::upstream::{MessageStream, Reply, UpstreamError};

/// The capability a server request needs, when it is one a client can be asked.
pub fn capability_for(method: &str) -> Option<&'static str> {
    crate::protocol::input_capability(method)
}

/// How a client receives a legacy server's requests during its calls.
#[derive(Clone)]
pub enum InputSide {
    /// An initialize-era client: relayed on the call's SSE stream.
    Relay,
    /// A 2026-07-28 client: the call parks and answers `input_required`.
    Park {
        /// Seals `requestState` (the `[sessions]` key).
        states: Arc<Sealer>,
        /// This replica's `[sessions] advertise_url`, sealed into the state.
        replica: Option<Arc<str>>,
    },
}

impl std::fmt::Debug for InputSide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InputSide::Relay => f.write_str("Relay"),
            InputSide::Park { replica, .. } => write!(f, "Park({replica:?})"),
        }
    }
}

// === Relayed requests: an initialize-era client's answers ===

struct Waiter {
    owner: OwnerKey,
    tx: oneshot::Sender<Value>,
}

/// Requests relayed to initialize-era clients and not answered yet, by portico's id. Process
/// wide: the answer may come after a config reload.
static WAITERS: LazyLock<Mutex<HashMap<String, Waiter>>> = LazyLock::new(Default::default);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn waiters() -> std::sync::MutexGuard<'static, HashMap<String, Waiter>> {
    WAITERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Registers a request about to be relayed to the client `owner`: portico's id for it and
/// where the client's answer arrives. The caller bounds the wait and calls [`forget`] after.
pub fn expect(owner: OwnerKey) -> (String, oneshot::Receiver<Value>) {
    let id = format!("portico-input-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed));
    let (tx, rx) = oneshot::channel();
    waiters().insert(id.clone(), Waiter { owner, tx });
    (id, rx)
}

/// Drops a waiter that is no longer waited for.
pub fn forget(id: &str) {
    waiters().remove(id);
}

/// Routes an initialize-era client's answer (a JSON-RPC response it POSTed) to the request
/// portico relayed under `id`. `false` when nothing of this client waits under that id.
pub fn answer(owner: OwnerKey, id: &RequestId, msg: Value) -> bool {
    let Value::String(key) = id.to_value() else {
        return false;
    };
    let mut w = waiters();
    match w.get(&key) {
        Some(waiter) if waiter.owner == owner => {}
        _ => return false,
    }
    w.remove(&key)
        .is_some_and(|waiter| waiter.tx.send(msg).is_ok())
}

/// The answer a server gets for its request `id`, from a client's response message: its
/// `result` or `error`, else an internal error.
fn response_to_server(id: &Value, client: &Value) -> Bytes {
    let body = if let Some(r) = client.get("result") {
        json!({"jsonrpc":"2.0","id":id,"result":r})
    } else if let Some(e) = client.get("error").filter(|e| e.is_object()) {
        json!({"jsonrpc":"2.0","id":id,"error":e})
    } else {
        return error_to_server(
            id,
            code::INTERNAL_ERROR,
            "the client's answer held no result",
        );
    };
    Bytes::from(body.to_string())
}

/// A JSON-RPC error answer to the server's request `id`.
fn error_to_server(id: &Value, code: i64, message: &str) -> Bytes {
    Bytes::from(
        json!({"jsonrpc":"2.0","id":id,"error":{"code":code,"message":message}}).to_string(),
    )
}

// === The call's stream ===

/// What a call's stream needs to handle the server's requests.
pub(super) struct FlowIo {
    pub(super) side: Option<InputSide>,
    pub(super) owner: OwnerKey,
    /// The caller's authorization context (who may retry a parked call).
    pub(super) scope: OwnerKey,
    /// What the client declared (JSON text; read only when the server asks something).
    pub(super) caps: Box<str>,
    pub(super) hold: Duration,
    /// The call's deadline: the upstream stream ends there.
    pub(super) deadline: Instant,
    pub(super) team: Vec<(HeaderName, HeaderValue)>,
    /// The request a `requestState` answers: its method, and its body for the name (tool,
    /// prompt or URI), read only when the call parks.
    pub(super) method: String,
    pub(super) body: Bytes,
}

/// One call's upstream stream being read: translated messages go to the client, server
/// requests are relayed, parked or refused.
pub(super) struct Flow {
    pub(super) inner: BoxStream<'static, Result<Bytes, UpstreamError>>,
    pub(super) m: Mapping,
    pub(super) guard: CancelGuard,
    pub(super) io: FlowIo,
}

/// Writes `body` (an answer to one of the server's requests, or a notification) into the
/// session, bounded by the backend's `timeout_ms`. A failure is only logged: the server's
/// request then runs into its own timeout, and nobody else is waiting on the write.
async fn to_server(
    backend: &Backend,
    session: &LegacySession,
    body: Bytes,
    team: &[(HeaderName, HeaderValue)],
    what: &str,
) {
    let deadline = Instant::now() + backend.timeout;
    if let Err(error) = send_raw(
        backend,
        session,
        body,
        &HeaderMap::new(),
        team,
        deadline,
        super::How::OWN,
    )
    .await
    {
        tracing::info!(backend = %backend.name, %error, "could not deliver {what} to the server");
    }
}

/// A server request seen on the stream.
struct ServerRequest {
    id: Value,
    method: String,
    params: Value,
}

fn server_request(msg: &[u8]) -> Option<ServerRequest> {
    // Most messages of a call's stream are its response (and progress): skip parsing those
    // that cannot be a request (`from_legacy` parses each message once anyway).
    static METHOD: crate::protocol::Needle =
        crate::protocol::Needle::new(|| memchr::memmem::Finder::new(b"\"method\""));
    if !METHOD.is_in(msg) {
        return None;
    }
    let v: Value = serde_json::from_slice(msg).ok()?;
    let method = v.get("method")?.as_str()?.to_string();
    let id = v.get("id").filter(|i| !i.is_null())?.clone();
    capability_for(&method)?;
    Some(ServerRequest {
        id,
        method,
        params: v.get("params").cloned().unwrap_or(json!({})),
    })
}

enum Next {
    Continue,
    Yield(Bytes),
    Park(ServerRequest),
}

impl Flow {
    /// The client's view of the rest of the call.
    pub(super) fn into_stream(self) -> BoxStream<'static, Result<Bytes, UpstreamError>> {
        futures_util::stream::unfold(Some(self), |st| async move { st?.step().await }).boxed()
    }

    async fn step(mut self) -> Option<(Result<Bytes, UpstreamError>, Option<Flow>)> {
        loop {
            let msg = match self.inner.next().await {
                None => {
                    self.guard.armed = false;
                    return None;
                }
                Some(Err(e)) => return Some((Err(e), None)),
                Some(Ok(msg)) => msg,
            };
            if let Some(req) = server_request(&msg) {
                match self.on_request(req) {
                    Next::Continue => continue,
                    Next::Yield(out) => return Some((Ok(out), Some(self))),
                    Next::Park(req) => return Some((Ok(park(self, vec![req])), None)),
                }
            }
            match from_legacy(&msg, &self.m) {
                Translated::Forward(out) => {
                    if is_response(&out) {
                        self.guard.armed = false;
                        return Some((Ok(out), None));
                    }
                    return Some((Ok(out), Some(self)));
                }
                Translated::Answer(answer) => self.send_up(answer),
                Translated::Drop => {}
            }
        }
    }

    fn on_request(&mut self, req: ServerRequest) -> Next {
        let Some(side) = self.io.side.clone() else {
            tracing::warn!(
                method = req.method,
                "legacy server asked something during a request that cannot relay it; refused"
            );
            // portico's own traffic, or a legacy client's `resources/read` (read whole
            // through the cache, so nothing can be relayed mid-stream).
            let msg = format!(
                "{} cannot be answered during this request (portico's own, or a read through \
                 its cache)",
                req.method
            );
            self.send_up(error_to_server(&req.id, code::METHOD_NOT_FOUND, &msg));
            return Next::Continue;
        };
        let cap = capability_for(&req.method).unwrap_or_default();
        let caps: Value = serde_json::from_str(&self.io.caps).unwrap_or_default();
        if caps.get(cap).is_none_or(|c| !c.is_object()) {
            tracing::info!(
                method = req.method,
                cap,
                "server request refused: the client did not declare the capability"
            );
            let msg = format!(
                "{} is not available: the client did not declare the `{cap}` capability",
                req.method
            );
            self.send_up(error_to_server(&req.id, code::METHOD_NOT_FOUND, &msg));
            return Next::Continue;
        }
        match side {
            InputSide::Park { .. } => Next::Park(req),
            InputSide::Relay => {
                let (pid, rx) = expect(self.io.owner);
                let relayed =
                    json!({"jsonrpc":"2.0","id":pid,"method":req.method,"params":req.params});
                let backend = self.guard.backend.clone();
                let session = self.guard.session.clone();
                let team = self.io.team.clone();
                let hold = self.io.hold;
                tokio::spawn(async move {
                    let answer = match tokio::time::timeout(hold, rx).await {
                        Ok(Ok(client)) => response_to_server(&req.id, &client),
                        _ => {
                            forget(&pid);
                            tracing::info!(backend = %backend.name, method = req.method, "the client did not answer a relayed request in time");
                            let msg = format!(
                                "the client did not answer {} within input_hold_ms ({} ms)",
                                req.method,
                                hold.as_millis()
                            );
                            error_to_server(&req.id, code::INTERNAL_ERROR, &msg)
                        }
                    };
                    to_server(&backend, &session, answer, &team, "an answer").await;
                });
                Next::Yield(Bytes::from(relayed.to_string()))
            }
        }
    }

    /// Sends a message to the server in the call's session, without waiting.
    fn send_up(&self, body: Bytes) {
        let backend = self.guard.backend.clone();
        let session = self.guard.session.clone();
        let team = self.io.team.clone();
        tokio::spawn(async move {
            to_server(&backend, &session, body, &team, "a message").await;
        });
    }
}

// === Parked calls: a 2026-07-28 client's input ===

/// What `requestState` seals.
#[derive(Serialize, Deserialize)]
struct State {
    /// The parked call (random, base64).
    p: String,
    /// Backend.
    b: String,
    /// The caller's authorization context (hex digest).
    s: String,
    /// Expiry, Unix ms.
    x: u64,
    /// The replica holding the call (`advertise_url`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    r: Option<String>,
    /// The request it answers: method and name.
    m: String,
    n: String,
}

struct Parked {
    flow: Flow,
    /// Unanswered: (key in `inputRequests`, the server's id, `{method, params}`).
    waiting: Vec<(String, Value, Value)>,
    _count: ParkedCount,
}

/// Counts one parked call on its backend for as long as it lives (`portico_parked_calls`).
struct ParkedCount(Arc<Backend>);

impl ParkedCount {
    fn new(b: &Arc<Backend>) -> ParkedCount {
        b.bridge.parked.fetch_add(1, Ordering::Relaxed);
        ParkedCount(b.clone())
    }
}

impl Drop for ParkedCount {
    fn drop(&mut self) {
        self.0.bridge.parked.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Parked {
    /// The hold ended (or the call is dropped): the server's questions get an error, then
    /// the call is dropped (its guard cancels it upstream).
    async fn expire(self) {
        let b = self.flow.guard.backend.clone();
        let s = self.flow.guard.session.clone();
        let msg = format!(
            "the client did not answer within input_hold_ms ({} ms)",
            b.cfg.input_hold_ms
        );
        for (_, id, _) in &self.waiting {
            let body = error_to_server(id, code::INTERNAL_ERROR, &msg);
            to_server(
                &b,
                &s,
                body,
                &self.flow.io.team,
                "the expiry of its request",
            )
            .await;
        }
    }
}

static PARKED: LazyLock<Mutex<HashMap<String, Parked>>> = LazyLock::new(Default::default);
static NEXT_KEY: AtomicU64 = AtomicU64::new(1);

fn parked() -> std::sync::MutexGuard<'static, HashMap<String, Parked>> {
    PARKED.lock().unwrap_or_else(|e| e.into_inner())
}

fn now_ms() -> u64 {
    crate::pool::unix_ms()
}

fn hex(k: &OwnerKey) -> String {
    k.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parks `flow` with the server's requests `reqs` and returns the client's `input_required`
/// answer. The hold timer starts here.
fn park(flow: Flow, reqs: Vec<ServerRequest>) -> Bytes {
    let waiting = reqs
        .into_iter()
        .map(|r| {
            let n = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
            let short = r.method.split('/').next().unwrap_or("input");
            let key = format!("{short}-{n}");
            (key, r.id, json!({"method": r.method, "params": r.params}))
        })
        .collect();
    park_waiting(flow, waiting)
}

fn park_waiting(flow: Flow, waiting: Vec<(String, Value, Value)>) -> Bytes {
    let Some(InputSide::Park { states, replica }) = flow.io.side.clone() else {
        return Bytes::new();
    };
    let remaining = flow.io.deadline.saturating_duration_since(Instant::now());
    let hold = flow.io.hold.min(remaining);
    let expires_ms = now_ms().saturating_add(hold.as_millis() as u64);
    let pid = base64_id(&states.random::<16>());
    let state = State {
        p: pid.clone(),
        b: flow.guard.backend.name.to_string(),
        s: hex(&flow.io.scope),
        x: expires_ms,
        r: replica.as_deref().map(String::from),
        m: flow.io.method.clone(),
        n: request_name(&flow.io.method, &flow.io.body),
    };
    let sealed = states.seal(&serde_json::to_vec(&state).unwrap_or_default());
    let mut requests = Map::new();
    for (key, _, req) in &waiting {
        requests.insert(key.clone(), req.clone());
    }
    let mut result = Map::new();
    result.insert("resultType".into(), json!("input_required"));
    result.insert("inputRequests".into(), Value::Object(requests));
    result.insert("requestState".into(), json!(sealed));
    modernize_result(&mut result, &flow.m);
    let out = json!({"jsonrpc":"2.0","id":flow.m.client_id.to_value(),"result":result});
    tracing::debug!(backend = %flow.guard.backend.name, n = waiting.len(), "call parked for the client's input");
    let count = ParkedCount::new(&flow.guard.backend);
    parked().insert(
        pid.clone(),
        Parked {
            flow,
            waiting,
            _count: count,
        },
    );
    tokio::spawn(async move {
        tokio::time::sleep(hold).await;
        let gone = parked().remove(&pid);
        if let Some(p) = gone {
            let b = &p.flow.guard.backend;
            b.bridge.parked_expired.fetch_add(1, Ordering::Relaxed);
            tracing::info!(backend = %p.flow.guard.backend.name, "a parked call's hold ended; the server gets an error");
            p.expire().await;
        }
    });
    Bytes::from(out.to_string())
}

fn base64_id(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Whether a request is a retry of a call portico parked: it carries `requestState` (a
/// legacy server never issues one, so on a bridged call every `requestState` is portico's).
pub(super) fn is_retry(method: &str, body: &[u8]) -> bool {
    static REQUEST_STATE: crate::protocol::Needle =
        crate::protocol::Needle::new(|| memchr::memmem::Finder::new(b"\"requestState\""));
    if !matches!(method, "tools/call" | "prompts/get" | "resources/read")
        || !REQUEST_STATE.is_in(body)
    {
        return false;
    }
    serde_json::from_slice::<Value>(body)
        .ok()
        .is_some_and(|v| v["params"].get("requestState").is_some())
}

/// The name a `requestState` is bound to: the tool, prompt or resource of the request.
pub(super) fn request_name(method: &str, body: &[u8]) -> String {
    let v: Value = serde_json::from_slice(body).unwrap_or_default();
    let field = if method == "resources/read" {
        "uri"
    } else {
        "name"
    };
    v["params"][field].as_str().unwrap_or_default().to_string()
}

fn refuse(why: impl Into<String>) -> GatewayError {
    GatewayError::InvalidParams(why.into())
}

/// Where a retry must go instead, when another replica holds its call.
pub struct Elsewhere(pub String);

/// Marks a retry one replica forwarded to another: it is never forwarded again.
pub const FORWARDED: &str = "portico-forwarded";

/// The headers of a request forwarded to another replica: [`FORWARDED`], then the client's
/// own `copy` headers it has (its credential, session, …) — the other replica authenticates
/// it again. A parked call's retry, an HTTP+SSE message, a stream's resume.
pub fn forwarded_headers(
    client: &HeaderMap,
    copy: &[HeaderName],
) -> Vec<(HeaderName, HeaderValue)> {
    let mut out = vec![(
        HeaderName::from_static(FORWARDED),
        HeaderValue::from_static("1"),
    )];
    for name in copy {
        if let Some(v) = client.get(name) {
            out.push((name.clone(), v.clone()));
        }
    }
    out
}

/// A client for another replica at `url` (its `advertise_url` and a path), with the default
/// backend settings (timeouts, webpki roots).
pub fn replica_peer(url: &str) -> Result<crate::upstream::http::HttpUpstream, String> {
    let cfg: crate::config::BackendConfig =
        serde_json::from_value(serde_json::json!({"name": "replica", "url": url}))
            .map_err(|e| e.to_string())?;
    crate::upstream::http::HttpUpstream::new(&cfg, url)
}

/// Forwards a retry to the replica holding its call (`[sessions] advertise_url`, sealed in the
/// state, so only this deployment names where it goes) at that replica's `/mcp/<backend>`, with
/// the client's own credential — the owner authenticates it again and checks the state against
/// it — and returns that replica's answer as it comes. A retry that was already forwarded once
/// is refused instead (replicas that disagree on their names would otherwise loop).
pub(super) async fn forward(
    b: &Arc<Backend>,
    replica: &str,
    method: &str,
    body: &Bytes,
    client_headers: &HeaderMap,
    deadline: Instant,
) -> Result<Reply, GatewayError> {
    let elsewhere = |why: &str| {
        refuse(format!(
            "requestState names a call parked on another portico replica ({replica}); {why}"
        ))
    };
    if client_headers.contains_key(FORWARDED) {
        return Err(elsewhere(
            "this retry was already forwarded once: the replicas' advertise_url must name \
             themselves",
        ));
    }
    let url = format!("{}/mcp/{}", replica.trim_end_matches('/'), b.name);
    let mut cfg = b.cfg.clone();
    cfg.headers.clear();
    cfg.url = Some(url.clone());
    cfg.max_idle_connections = 1;
    let peer = crate::upstream::http::HttpUpstream::new(&cfg, &url)
        .map_err(|e| elsewhere(&format!("it cannot be reached ({e})")))?;
    let mut extra = forwarded_headers(client_headers, &[http::header::AUTHORIZATION]);
    // The body's own name (on an aggregated endpoint the client's header carries the prefix).
    let name = crate::protocol::encode_header_value(&request_name(method, body));
    if let Ok(v) = HeaderValue::from_str(&name) {
        extra.push((HeaderName::from_static("mcp-name"), v));
    }
    tracing::debug!(backend = %b.name, replica, "retry forwarded to the replica holding its call");
    let req = peer.request(client_headers, &extra, body.clone());
    Arc::new(peer)
        .call(req, deadline)
        .await
        .map_err(|e| GatewayError::BackendFailed {
            backend: b.name.to_string(),
            detail: format!("forwarding a retry to the replica holding its call ({replica}): {e}"),
        })
}

/// A 2026-07-28 client's retry of a parked call: checks its `requestState`, delivers its
/// `inputResponses` to the server and reads the call on (it may ask again). `Ok(Err(_))`
/// when the call is parked on another replica, reachable at the URL it names ([`forward`]).
#[allow(clippy::too_many_arguments)]
pub(super) async fn resume(
    b: &Arc<Backend>,
    side: Option<&InputSide>,
    scope: OwnerKey,
    method: &str,
    client_id: &RequestId,
    body: &[u8],
) -> Result<Result<Reply, Elsewhere>, GatewayError> {
    let Some(InputSide::Park { states, replica }) = side else {
        return Err(refuse(
            "requestState is only accepted from 2026-07-28 clients retrying a call",
        ));
    };
    let v: Value = serde_json::from_slice(body).map_err(|e| GatewayError::Parse(e.to_string()))?;
    let params = &v["params"];
    let Some(sealed) = params["requestState"].as_str() else {
        return Err(refuse("requestState must be a string"));
    };
    let state: State = states
        .open(sealed)
        .and_then(|p| serde_json::from_slice(&p).ok())
        .ok_or_else(|| {
            refuse(
                "requestState is not valid: it was altered, or not issued by this portico \
                 deployment; call again without it",
            )
        })?;
    if state.b != *b.name || state.m != method || state.n != request_name(method, body) {
        return Err(refuse(
            "requestState belongs to another request: retry with the same method and name",
        ));
    }
    if state.s != hex(&scope) {
        return Err(refuse(
            "requestState was issued to another caller: only the client that made the call may \
             answer its questions",
        ));
    }
    if state.x <= now_ms() {
        return Err(refuse(format!(
            "requestState expired: the server's questions are held for input_hold_ms ({} ms); \
             call again without requestState",
            b.cfg.input_hold_ms
        )));
    }
    if let Some(owner) = &state.r
        && replica.as_deref() != Some(owner.as_str())
    {
        return Ok(Err(Elsewhere(owner.clone())));
    }
    let Some(mut p) = parked().remove(&state.p) else {
        return Err(refuse(
            "requestState names a call that is no longer held here (answered already, expired, \
             or its replica restarted); call again without requestState",
        ));
    };
    let responses = params.get("inputResponses").and_then(Value::as_object);
    let mut still = Vec::new();
    let backend = p.flow.guard.backend.clone();
    let session = p.flow.guard.session.clone();
    for (key, id, req) in std::mem::take(&mut p.waiting) {
        match responses.and_then(|r| r.get(&key)) {
            Some(resp) => {
                let answer =
                    Bytes::from(json!({"jsonrpc":"2.0","id":id,"result":resp}).to_string());
                to_server(
                    &backend,
                    &session,
                    answer,
                    &p.flow.io.team,
                    "an input response",
                )
                .await;
            }
            None => still.push((key, id, req)),
        }
    }
    let mut flow = p.flow;
    flow.m.client_id = client_id.clone();
    if let (Some((_, client)), Some(t)) = (
        flow.m.token.as_mut(),
        params["_meta"]
            .get("progressToken")
            .filter(|t| !t.is_null()),
    ) {
        *client = t.clone();
    }
    if !still.is_empty() {
        // Some questions unanswered: ask them again (docs/protocol.md §10).
        return Ok(Ok(Reply::one(StatusCode::OK, park_waiting(flow, still))));
    }
    Ok(Ok(Reply {
        status: StatusCode::OK,
        headers: HeaderMap::new(),
        messages: MessageStream::Many(flow.into_stream()),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_client_requests_of_the_three_kinds_are_input() {
        assert_eq!(capability_for("elicitation/create"), Some("elicitation"));
        assert_eq!(capability_for("sampling/createMessage"), Some("sampling"));
        assert_eq!(capability_for("roots/list"), Some("roots"));
        assert_eq!(capability_for("ping"), None);
        assert!(server_request(br#"{"jsonrpc":"2.0","id":3,"method":"roots/list"}"#).is_some());
        assert!(server_request(br#"{"jsonrpc":"2.0","method":"roots/list"}"#).is_none());
        assert!(server_request(br#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#).is_none());
    }

    #[test]
    fn answers_reach_only_their_own_client() {
        let (id, mut rx) = expect([1; 32]);
        let rid = RequestId::from_value(&json!(id)).unwrap();
        assert!(
            !answer([2; 32], &rid, json!({"result":{}})),
            "another client"
        );
        assert!(answer([1; 32], &rid, json!({"result":{"roots":[]}})));
        assert_eq!(rx.try_recv().unwrap()["result"]["roots"], json!([]));
        assert!(
            !answer([1; 32], &rid, json!({"result":{}})),
            "answered once"
        );
        let out = response_to_server(&json!(7), &json!({"id":"x","result":{"a":1}}));
        assert_eq!(
            serde_json::from_slice::<Value>(&out).unwrap(),
            json!({"jsonrpc":"2.0","id":7,"result":{"a":1}})
        );
    }
}
