//! The legacy bridge: makes initialize-era backends (2025-03-26 … 2025-11-25) look like
//! 2026-07-28 servers.
//!
//! - **Probe, don't guess** (digest §5): the first request to an `auto` backend sends
//!   `server/discover`; `classify_http` / `classify_stdio` read the answer. The verdict is kept
//!   per backend and re-probed when a later answer contradicts it. In particular a stdio
//!   server that starts slower than `probe_timeout_ms` is probed as legacy although it may be
//!   modern; its refusal of the bridge's `initialize` (`initialize_refusal_is_modern`) re-probes
//!   it, and the request that found out is served on the modern path (`Bridged::Modern`). The
//!   probe clock is not moved to "child ready" instead: the child is spawned by the probe
//!   itself (so the clock already starts at spawn), and a modern server writes nothing before
//!   its answer, so there is no earlier readiness signal to wait for.
//! - **One upstream session per backend**: portico runs `initialize` once, keeps the session id,
//!   and multiplexes every client request over it, rewriting JSON-RPC ids and progress tokens so
//!   requests from different clients never collide inside the session (legacy ids must be unique
//!   within a session; clients all start at 1). A lost session (404) is re-initialized and the
//!   request retried once.
//! - **stdio**: the session is the child process. Every bridged call is pinned to the child
//!   generation the session was initialized on; a call that meets a restarted child is refused
//!   by the transport before it is written (`UpstreamError::Restarted`), so portico
//!   re-initializes and retries it once. Server-initiated requests never reach the bridge there:
//!   the stdio transport answers them itself (`ping` → `{}`, the rest → `-32601`, logged).
//! - **Translation both ways**: reserved 2026 `_meta` keys are stripped going up; results coming
//!   back get `resultType`, `ttlMs`/`cacheScope` (from config, default private), serverInfo, and
//!   `-32002` becomes `-32602`.
//! - **Cancellation**: a legacy server does not treat a closed stream as cancellation, so when
//!   the client goes away portico sends `notifications/cancelled` with the upstream request id.
//! - Server-initiated requests a 2026-07-28 client cannot receive (sampling, elicitation, roots)
//!   are answered with an error so the server never hangs; `ping` is answered.

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde_json::{Map, Value, json};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use tokio::time::Instant;

use crate::config::CacheScope;
use crate::error::GatewayError;
use crate::protocol::{
    LATEST_VERSION, LEGACY_VERSIONS, RequestId, SUPPORTED_VERSIONS, code, header as h,
    is_cacheable_method, meta, status_for_code,
};
use crate::router::{Backend, Verdict};
use crate::upstream::stdio::{CallOptions, StdioUpstream};
use crate::upstream::{MessageStream, Reply, Upstream, UpstreamError};

/// Per-backend bridge state.
#[derive(Default)]
pub struct BridgeState {
    /// One probe at a time per backend.
    probe_lock: tokio::sync::Mutex<()>,
    /// The upstream legacy session, once initialized.
    session: ArcSwapOption<LegacySession>,
    /// One `initialize` at a time per backend.
    init_lock: tokio::sync::Mutex<()>,
    /// Gateway-unique request ids and progress tokens within the upstream session.
    next_id: AtomicU64,
}

impl BridgeState {
    /// Whether an upstream legacy session is open (for the metrics gauge).
    pub fn has_session(&self) -> bool {
        self.session.load().is_some()
    }
}

/// An initialized upstream session.
pub struct LegacySession {
    /// `Mcp-Session-Id`, when the server issued one (stateless servers don't).
    pub id: Option<HeaderValue>,
    /// The negotiated revision, sent as `MCP-Protocol-Version` on every later request.
    pub version: HeaderValue,
    /// The server's `InitializeResult` (capabilities, serverInfo, instructions).
    pub init: Value,
    /// stdio child generation the session belongs to (0 for HTTP).
    pub generation: u64,
}

/// What a probe answer says about the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Classification {
    Modern,
    Legacy,
    /// The answer says nothing about the era (the backend is failing); decide later.
    Undecided(String),
}

/// Error codes only a 2026-07-28 server sends.
fn is_modern_error(code: i64) -> bool {
    (code::UNSUPPORTED_VERSION..=code::HEADER_MISMATCH).contains(&code)
}

/// The first JSON-RPC response among decoded messages.
fn response_of(messages: &[Bytes]) -> Option<Value> {
    messages
        .iter()
        .filter_map(|m| serde_json::from_slice::<Value>(m).ok())
        .find(|v| v.get("result").is_some() || v.get("error").is_some())
}

/// Classifies the answer to an HTTP `server/discover` probe (digest §5). Never keyed on one
/// error code: deployed legacy servers answer 400 `-32000`, 400 `-32600`, 404 with no body, 405
/// with HTML, or (stateless) a legacy-shaped answer.
pub fn classify_http(status: u16, messages: &[Bytes]) -> Classification {
    let resp = response_of(messages);
    if let Some(r) = &resp {
        if r["result"]["supportedVersions"].is_array() {
            return Classification::Modern;
        }
        if let Some(c) = r["error"]["code"].as_i64()
            && is_modern_error(c)
        {
            return Classification::Modern;
        }
    }
    match status {
        500..=599 => Classification::Undecided(format!("HTTP {status}")),
        400..=499 => Classification::Legacy,
        200..=299 if resp.is_some() => Classification::Legacy,
        _ => Classification::Undecided(format!("HTTP {status} without a JSON-RPC answer")),
    }
}

/// Classifies the answer to a stdio probe: `None` = no answer before the timeout.
pub fn classify_stdio(answer: Option<&[Bytes]>) -> Classification {
    let Some(messages) = answer else {
        return Classification::Legacy;
    };
    match response_of(messages) {
        Some(r) if r["result"]["supportedVersions"].is_array() => Classification::Modern,
        Some(r) if r["error"]["code"].as_i64().is_some_and(is_modern_error) => {
            Classification::Modern
        }
        Some(_) => Classification::Legacy,
        None => Classification::Legacy,
    }
}

/// Whether an error answer to the bridge's `initialize` shows a 2026-07-28 server, i.e. the
/// probe verdict "legacy" was wrong (typically a modern stdio server that started more slowly
/// than `probe_timeout_ms`). Evidence, per digest §5: a modern error code (`-32020..-32022`);
/// a version list (`data.supported`) naming a revision newer than the initialize era (a
/// modern-only server SHOULD list its versions in any error to `initialize`); or "method not
/// found": every initialize-era server implements `initialize`, so only a server that dropped
/// it (the 2026 Python SDK path answers it `-32601`) says so. A legacy server refusing our
/// revision lists only legacy ones, and is not taken for modern.
pub fn initialize_refusal_is_modern(error: &Value) -> bool {
    let c = error["code"].as_i64();
    if c.is_some_and(is_modern_error) || c == Some(code::METHOD_NOT_FOUND) {
        return true;
    }
    let newest_legacy = LEGACY_VERSIONS[0];
    ["supported", "supportedVersions"].iter().any(|k| {
        error["data"][k].as_array().is_some_and(|vs| {
            vs.iter()
                .filter_map(Value::as_str)
                .any(|v| v == LATEST_VERSION || v > newest_legacy)
        })
    })
}

/// The probe request portico sends.
fn probe_body() -> Bytes {
    Bytes::from(
        json!({"jsonrpc":"2.0","id":"portico-probe","method":"server/discover","params":{"_meta":{
            meta::PROTOCOL_VERSION: LATEST_VERSION,
            meta::CLIENT_CAPABILITIES: {},
            meta::CLIENT_INFO: portico_info(),
        }}})
        .to_string(),
    )
}

fn portico_info() -> Value {
    json!({"name": "portico", "version": env!("CARGO_PKG_VERSION")})
}

fn hv(s: &'static str) -> HeaderValue {
    HeaderValue::from_static(s)
}

/// Headers every message portico originates carries.
fn base_headers() -> Vec<(HeaderName, HeaderValue)> {
    vec![
        (http::header::CONTENT_TYPE, hv("application/json")),
        (
            http::header::ACCEPT,
            hv("application/json, text/event-stream"),
        ),
    ]
}

/// Collects every message of a reply (bounded by the deadline the upstream enforces).
async fn collect(reply: Reply) -> Result<Vec<Bytes>, UpstreamError> {
    match reply.messages {
        MessageStream::Empty => Ok(Vec::new()),
        MessageStream::One(m) => Ok(vec![m]),
        MessageStream::Many(mut s) => {
            let mut out = Vec::new();
            while let Some(m) = s.next().await {
                let m = m?;
                let done = crate::proxy::is_response(&m);
                out.push(m);
                if done {
                    break;
                }
            }
            Ok(out)
        }
    }
}

fn upstream_err(b: &Backend, e: &UpstreamError) -> GatewayError {
    GatewayError::from_upstream(&b.name, b.cfg.timeout_ms, e)
}

/// Makes sure the backend's era is known, probing it if needed.
pub async fn ensure_verdict(b: &Backend) -> Result<Verdict, GatewayError> {
    let v = b.verdict();
    if v != Verdict::Unknown {
        return Ok(v);
    }
    let _one = b.bridge.probe_lock.lock().await;
    let v = b.verdict();
    if v != Verdict::Unknown {
        return Ok(v);
    }
    let class = match &b.upstream {
        Upstream::Http(up) => {
            let mut extra = base_headers();
            extra.push((
                HeaderName::from_static(h::PROTOCOL_VERSION),
                hv(LATEST_VERSION),
            ));
            extra.push((HeaderName::from_static(h::METHOD), hv("server/discover")));
            let req = up.request(&HeaderMap::new(), &extra, probe_body());
            let reply = up
                .call(req, Instant::now() + b.timeout)
                .await
                .map_err(|e| upstream_err(b, &e))?;
            let status = reply.status.as_u16();
            let messages = collect(reply).await.unwrap_or_default();
            classify_http(status, &messages)
        }
        Upstream::Stdio(s) => {
            let probe_deadline =
                Instant::now() + std::time::Duration::from_millis(b.cfg.probe_timeout_ms);
            // `request`, not `call`: a silent legacy server must not receive
            // `notifications/cancelled` for the probe before its `initialize`.
            match s.request(probe_body(), probe_deadline).await {
                Ok(reply) => match collect(reply).await {
                    Ok(messages) => classify_stdio(Some(&messages)),
                    Err(UpstreamError::Timeout) => classify_stdio(None),
                    Err(e) => Classification::Undecided(e.to_string()),
                },
                Err(UpstreamError::Timeout) => classify_stdio(None),
                Err(e) => return Err(upstream_err(b, &e)),
            }
        }
        Upstream::Builtin(_) => Classification::Modern,
    };
    let verdict = match class {
        Classification::Modern => Verdict::Modern,
        Classification::Legacy => Verdict::Legacy,
        Classification::Undecided(why) => {
            return Err(GatewayError::BackendFailed {
                backend: b.name.to_string(),
                detail: format!("protocol probe inconclusive ({why})"),
            });
        }
    };
    tracing::info!(backend = %b.name, verdict = ?verdict, "backend protocol probed");
    b.set_verdict(verdict);
    Ok(verdict)
}

/// Forgets the verdict (and any session) so the next request probes again: called when an
/// answer contradicts what the backend was thought to speak.
pub fn reprobe(b: &Backend, why: &str) {
    if b.cfg.protocol == crate::config::Protocol::Auto {
        tracing::warn!(backend = %b.name, why, "backend answer contradicts its protocol verdict; re-probing");
        b.set_verdict(Verdict::Unknown);
        b.bridge.session.store(None);
    }
}

/// Why no legacy session could be had.
enum SessionError {
    /// `initialize` was refused the way only a 2026-07-28 server refuses it: the verdict
    /// "legacy" was wrong (see [`initialize_refusal_is_modern`]).
    Modern(String),
    Failed(GatewayError),
}

impl From<GatewayError> for SessionError {
    fn from(e: GatewayError) -> Self {
        SessionError::Failed(e)
    }
}

/// The backend's upstream legacy session, initialized on first use (and again when the stdio
/// child restarted). For callers that cannot switch paths: a server that turns out modern is
/// re-probed and the call fails; the next request takes the modern path.
pub async fn session(b: &Backend, deadline: Instant) -> Result<Arc<LegacySession>, GatewayError> {
    match session_or_modern(b, deadline).await {
        Ok(s) => Ok(s),
        Err(SessionError::Failed(e)) => Err(e),
        Err(SessionError::Modern(why)) => {
            let _ = flip_to_modern(b, &why).await;
            Err(GatewayError::BackendFailed {
                backend: b.name.to_string(),
                detail: format!("not an initialize-era server: {why}"),
            })
        }
    }
}

async fn session_or_modern(
    b: &Backend,
    deadline: Instant,
) -> Result<Arc<LegacySession>, SessionError> {
    let generation = match &b.upstream {
        Upstream::Stdio(s) => s.generation(),
        _ => 0,
    };
    if let Some(s) = b.bridge.session.load_full()
        && s.generation == generation
    {
        return Ok(s);
    }
    let _one = b.bridge.init_lock.lock().await;
    if let Some(s) = b.bridge.session.load_full()
        && s.generation == generation
    {
        return Ok(s);
    }
    // A request that queued behind an `initialize` which found the server modern must not
    // send another one (nor undo the new verdict).
    if b.verdict() != Verdict::Legacy {
        return Err(SessionError::Modern(
            "the backend was re-probed while this request waited".into(),
        ));
    }
    let s = Arc::new(initialize(b, deadline).await?);
    b.bridge.session.store(Some(s.clone()));
    Ok(s)
}

/// The bridge found a backend it believed legacy to be modern: re-probe it (an `auto` backend
/// only; a configured `protocol = "legacy"` is obeyed) and return the new verdict. The probe
/// is repeated rather than the verdict flipped blindly, so a legacy server with a broken
/// `initialize` stays legacy and its error is reported.
async fn flip_to_modern(b: &Backend, why: &str) -> Result<Verdict, GatewayError> {
    if b.cfg.protocol != crate::config::Protocol::Auto {
        return Ok(b.verdict());
    }
    {
        // Under the probe lock, so concurrent discoverers re-probe once, not once each.
        let _one = b.bridge.probe_lock.lock().await;
        if b.verdict() == Verdict::Legacy {
            tracing::warn!(backend = %b.name, why, "initialize refused by a 2026-07-28 server; re-probing");
            b.set_verdict(Verdict::Unknown);
            b.bridge.session.store(None);
        }
    }
    ensure_verdict(b).await
}

/// What the bridge did with a request.
pub enum Bridged {
    /// Translated and answered.
    Answer(Reply),
    /// The backend turned out to be a 2026-07-28 server (re-probed): nothing was sent for this
    /// request; the caller serves it on the modern path.
    Modern,
}

/// Turns a failed session into the caller's answer: `Bridged::Modern` when the re-probe
/// confirmed a modern server, an error otherwise.
async fn on_session_error(b: &Backend, e: SessionError) -> Result<Bridged, GatewayError> {
    let why = match e {
        SessionError::Failed(e) => return Err(e),
        SessionError::Modern(why) => why,
    };
    match flip_to_modern(b, &why).await? {
        Verdict::Modern => Ok(Bridged::Modern),
        _ => Err(GatewayError::BackendFailed {
            backend: b.name.to_string(),
            detail: format!("initialize refused ({why}) but the server probes as legacy"),
        }),
    }
}

fn initialize_body(id: &str) -> Bytes {
    Bytes::from(
        json!({"jsonrpc":"2.0","id":id,"method":"initialize","params":{
            "protocolVersion": LEGACY_VERSIONS[0],
            "capabilities": {},
            "clientInfo": portico_info(),
        }})
        .to_string(),
    )
}

const INITIALIZED: &[u8] = br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

/// Sends `initialize` to one stdio child generation and returns the answer with that generation:
/// the session is bound to the child it was made with. Pinned so the generation recorded is the
/// child that really answered; a child that died in between is retried on its successor once.
/// Never cancelled (the spec forbids cancelling `initialize`).
async fn initialize_stdio(
    s: &StdioUpstream,
    id: &str,
    deadline: Instant,
) -> Result<(Reply, u64), UpstreamError> {
    let mut again = true;
    loop {
        let generation = s.generation();
        let opts = CallOptions {
            cancel_on_drop: false,
            generation: Some(generation),
        };
        match s.call_with(initialize_body(id), deadline, opts).await {
            Err(UpstreamError::Restarted) if again => again = false,
            r => return r.map(|reply| (reply, generation)),
        }
    }
}

/// Runs the legacy handshake: `initialize` (newest revision first; the server echoes it or
/// counter-offers its own), then `notifications/initialized`.
async fn initialize(b: &Backend, deadline: Instant) -> Result<LegacySession, SessionError> {
    let n = b.bridge.next_id.fetch_add(1, Ordering::Relaxed);
    let id = format!("portico-init-{n}");
    let fail = |detail: String| {
        SessionError::Failed(GatewayError::BackendFailed {
            backend: b.name.to_string(),
            detail,
        })
    };
    let (messages, session_id, generation, status) = match &b.upstream {
        Upstream::Http(up) => {
            let req = up.request(&HeaderMap::new(), &base_headers(), initialize_body(&id));
            let reply = up
                .call(req, deadline)
                .await
                .map_err(|e| upstream_err(b, &e))?;
            let sid = reply.headers.get(h::SESSION_ID).cloned();
            let status = reply.status;
            let messages = collect(reply).await.map_err(|e| upstream_err(b, &e))?;
            (messages, sid, 0, status)
        }
        Upstream::Stdio(s) => {
            let (reply, generation) = initialize_stdio(s, &id, deadline)
                .await
                .map_err(|e| upstream_err(b, &e))?;
            let messages = collect(reply).await.map_err(|e| upstream_err(b, &e))?;
            (messages, None, generation, StatusCode::OK)
        }
        Upstream::Builtin(_) => return Err(fail("built-in servers are modern".into())),
    };
    // The answer is read before the status: a modern server's refusal (HTTP 400/404 with a
    // JSON-RPC body) is what tells it apart.
    let resp = response_of(&messages);
    if let Some(e) = resp.as_ref().and_then(|r| r.get("error"))
        && initialize_refusal_is_modern(e)
    {
        return Err(SessionError::Modern(format!(
            "initialize answered {} {}",
            e["code"], e["message"]
        )));
    }
    if !status.is_success() {
        return Err(fail(format!("initialize answered HTTP {status}")));
    }
    let resp = resp.ok_or_else(|| fail("no answer to initialize".into()))?;
    if let Some(e) = resp.get("error") {
        return Err(fail(format!("initialize failed: {}", e["message"])));
    }
    let init = resp["result"].clone();
    let version = init["protocolVersion"].as_str().unwrap_or("");
    if !crate::protocol::is_legacy_version(version) {
        return Err(fail(format!(
            "server offered unsupported revision {version:?}"
        )));
    }
    let version = HeaderValue::from_str(version).map_err(|_| fail("bad protocolVersion".into()))?;
    // notifications/initialized: the server must see it before anything else.
    match &b.upstream {
        Upstream::Http(up) => {
            let mut extra = base_headers();
            extra.push((
                HeaderName::from_static(h::PROTOCOL_VERSION),
                version.clone(),
            ));
            if let Some(sid) = &session_id {
                extra.push((HeaderName::from_static(h::SESSION_ID), sid.clone()));
            }
            let req = up.request(&HeaderMap::new(), &extra, Bytes::from_static(INITIALIZED));
            let reply = up
                .call(req, deadline)
                .await
                .map_err(|e| upstream_err(b, &e))?;
            if !reply.status.is_success() {
                return Err(fail(format!(
                    "notifications/initialized answered HTTP {}",
                    reply.status
                )));
            }
        }
        Upstream::Stdio(s) => {
            s.notify(Bytes::from_static(INITIALIZED))
                .await
                .map_err(|e| upstream_err(b, &e))?;
        }
        Upstream::Builtin(_) => {}
    }
    tracing::info!(
        backend = %b.name,
        version = ?version,
        session = session_id.is_some(),
        "legacy session initialized"
    );
    Ok(LegacySession {
        id: session_id,
        version,
        init,
        generation,
    })
}

/// Ends the upstream session (`DELETE`), on shutdown.
pub async fn close(b: &Backend) {
    let Some(s) = b.bridge.session.swap(None) else {
        return;
    };
    if let (Upstream::Http(up), Some(sid)) = (&b.upstream, &s.id) {
        let mut req = up.request(
            &HeaderMap::new(),
            &[
                (HeaderName::from_static(h::SESSION_ID), sid.clone()),
                (
                    HeaderName::from_static(h::PROTOCOL_VERSION),
                    s.version.clone(),
                ),
            ],
            Bytes::new(),
        );
        *req.method_mut() = http::Method::DELETE;
        let deadline = Instant::now() + std::time::Duration::from_secs(2);
        if let Ok(ex) = up.exchange(req, deadline).await {
            tracing::info!(backend = %b.name, status = %ex.response.status(), "legacy session closed");
        }
    }
}

// === Requests ===

/// Answers `server/discover` for a legacy backend from its `InitializeResult`.
async fn discover(b: &Backend, id: &RequestId, deadline: Instant) -> Result<Bridged, GatewayError> {
    let s = match session_or_modern(b, deadline).await {
        Ok(s) => s,
        Err(e) => return on_session_error(b, e).await,
    };
    let mut result = json!({
        "resultType": "complete",
        "supportedVersions": SUPPORTED_VERSIONS,
        "capabilities": s.init.get("capabilities").cloned().unwrap_or(json!({})),
        "ttlMs": b.cfg.default_ttl_ms,
        "cacheScope": scope_str(b.cfg.default_cache_scope),
    });
    if let Some(i) = s.init.get("instructions") {
        result["instructions"] = i.clone();
    }
    if let Some(info) = s.init.get("serverInfo") {
        result["_meta"] = json!({ meta::SERVER_INFO: info });
    }
    let msg = json!({"jsonrpc":"2.0","id":id.to_value(),"result":result});
    Ok(Bridged::Answer(Reply::one(StatusCode::OK, msg.to_string())))
}

fn scope_str(s: CacheScope) -> &'static str {
    match s {
        CacheScope::Public => "public",
        CacheScope::Private => "private",
    }
}

/// How one request was rewritten on its way up, to undo it on the way back.
#[derive(Clone)]
struct Mapping {
    client_id: RequestId,
    upstream_id: u64,
    /// (upstream token, client token)
    token: Option<(Value, Value)>,
    method: String,
    ttl_ms: u64,
    scope: &'static str,
    server_info: Option<Value>,
}

/// 2026 request → legacy request: new id, new progress token, reserved `_meta` keys removed.
fn to_legacy(
    body: &[u8],
    upstream_id: u64,
) -> Result<(Bytes, Option<(Value, Value)>), GatewayError> {
    let mut v: Value =
        serde_json::from_slice(body).map_err(|e| GatewayError::Parse(e.to_string()))?;
    let obj = v
        .as_object_mut()
        .ok_or_else(|| GatewayError::InvalidRequest("not an object".into()))?;
    if obj.contains_key("id") {
        obj.insert("id".into(), json!(upstream_id));
    }
    let mut token = None;
    if let Some(Value::Object(params)) = obj.get_mut("params")
        && let Some(Value::Object(m)) = params.get_mut("_meta")
    {
        for k in [
            meta::PROTOCOL_VERSION,
            meta::CLIENT_CAPABILITIES,
            meta::CLIENT_INFO,
            meta::LOG_LEVEL,
        ] {
            m.remove(k);
        }
        if let Some(t) = m.get("progressToken").cloned()
            && !t.is_null()
        {
            let up = json!(format!("portico-{upstream_id}"));
            m.insert("progressToken".into(), up.clone());
            token = Some((up, t));
        }
        if m.is_empty() {
            params.remove("_meta");
        }
    }
    Ok((Bytes::from(v.to_string()), token))
}

/// What to do with one message from the legacy server.
enum Translated {
    /// Send to the client.
    Forward(Bytes),
    /// The server asked something; answer it upstream.
    Answer(Bytes),
    /// Not for this client (log lines, session-wide notifications).
    Drop,
}

/// Legacy message → what the 2026 client gets.
fn from_legacy(msg: &[u8], m: &Mapping) -> Translated {
    let Ok(mut v) = serde_json::from_slice::<Value>(msg) else {
        return Translated::Drop;
    };
    let has_id = v.get("id").is_some_and(|i| !i.is_null());
    let method = v.get("method").and_then(Value::as_str).map(String::from);
    match (method, has_id) {
        // A server-initiated request.
        (Some(method), true) => {
            let id = v["id"].clone();
            let answer = if method == "ping" {
                json!({"jsonrpc":"2.0","id":id,"result":{}})
            } else {
                tracing::warn!(
                    method,
                    "legacy server sent a request a 2026-07-28 client cannot receive; refusing it"
                );
                json!({"jsonrpc":"2.0","id":id,"error":{"code":code::METHOD_NOT_FOUND,
                    "message":format!("{method} is not available: the client is behind portico (2026-07-28)")}})
            };
            Translated::Answer(Bytes::from(answer.to_string()))
        }
        (Some(method), false) => {
            if method == "notifications/progress" {
                if let (Some((up, client)), Some(p)) = (&m.token, v.get_mut("params"))
                    && p.get("progressToken") == Some(up)
                {
                    p["progressToken"] = client.clone();
                    return Translated::Forward(Bytes::from(v.to_string()));
                }
                return Translated::Drop;
            }
            // Log lines and list-changed notifications are session-wide in legacy; relaying them
            // to one client would leak other clients' activity (digest §8 item 17).
            Translated::Drop
        }
        (None, true) => {
            if v["id"] != json!(m.upstream_id) {
                return Translated::Drop;
            }
            let obj = match v.as_object_mut() {
                Some(o) => o,
                None => return Translated::Drop,
            };
            obj.insert("id".into(), m.client_id.to_value());
            if let Some(Value::Object(result)) = obj.get_mut("result") {
                modernize_result(result, m);
            } else if let Some(Value::Object(err)) = obj.get_mut("error")
                && err.get("code").and_then(Value::as_i64) == Some(code::LEGACY_RESOURCE_NOT_FOUND)
            {
                err.insert("code".into(), json!(code::INVALID_PARAMS));
            }
            Translated::Forward(Bytes::from(v.to_string()))
        }
        (None, false) => Translated::Drop,
    }
}

fn modernize_result(result: &mut Map<String, Value>, m: &Mapping) {
    result
        .entry("resultType")
        .or_insert_with(|| json!("complete"));
    if is_cacheable_method(&m.method) {
        result.entry("ttlMs").or_insert_with(|| json!(m.ttl_ms));
        result.entry("cacheScope").or_insert_with(|| json!(m.scope));
    }
    if let Some(info) = &m.server_info {
        let meta_obj = result.entry("_meta").or_insert_with(|| json!({}));
        if let Some(o) = meta_obj.as_object_mut() {
            o.entry(meta::SERVER_INFO).or_insert_with(|| info.clone());
        }
    }
}

/// Whether an HTTP answer means the upstream session is gone.
fn session_lost(status: StatusCode, messages: &MessageStream) -> bool {
    if status == StatusCode::NOT_FOUND {
        return true;
    }
    if status == StatusCode::BAD_REQUEST
        && let MessageStream::One(m) = messages
    {
        let text = String::from_utf8_lossy(m).to_ascii_lowercase();
        return text.contains("session") || text.contains("not initialized");
    }
    false
}

/// Sends one 2026 request to a legacy backend and returns the translated answer, or
/// `Bridged::Modern` when the backend's `initialize` showed it is not legacy after all.
pub async fn call(
    b: &Arc<Backend>,
    method: &str,
    client_id: Option<&RequestId>,
    body: &Bytes,
    client_headers: &HeaderMap,
    deadline: Instant,
) -> Result<Bridged, GatewayError> {
    if method == "server/discover"
        && let Some(id) = client_id
    {
        return discover(b, id, deadline).await;
    }
    if method == "subscriptions/listen" {
        return Err(GatewayError::MethodNotFound(
            "subscriptions/listen is not bridged to initialize-era backends".into(),
        ));
    }
    for attempt in 0..2 {
        let s = match session_or_modern(b, deadline).await {
            Ok(s) => s,
            Err(e) => return on_session_error(b, e).await,
        };
        let upstream_id = b.bridge.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (up_body, token) = to_legacy(body, upstream_id)?;
        let Some(client_id) = client_id else {
            // A notification: pass it on.
            send_raw(b, &s, up_body, client_headers, deadline)
                .await
                .map_err(|e| upstream_err(b, &e))?;
            return Ok(Bridged::Answer(Reply {
                status: StatusCode::ACCEPTED,
                headers: HeaderMap::new(),
                messages: MessageStream::Empty,
            }));
        };
        let mapping = Mapping {
            client_id: client_id.clone(),
            upstream_id,
            token,
            method: method.to_string(),
            ttl_ms: b.cfg.default_ttl_ms,
            scope: scope_str(b.cfg.default_cache_scope),
            server_info: s.init.get("serverInfo").cloned(),
        };
        // Armed from here: if this future or the answer stream is dropped before the answer,
        // the server hears `notifications/cancelled`. Over stdio the transport does that itself
        // (with the id it wrote on the pipe), so the guard stays disarmed there.
        let mut guard = CancelGuard {
            backend: b.clone(),
            session: s.clone(),
            upstream_id,
            armed: !matches!(b.upstream, Upstream::Stdio(_)),
        };
        let reply = match send_raw(b, &s, up_body, client_headers, deadline).await {
            Ok(reply) => reply,
            // The stdio child restarted before the request was written: the new child has not
            // been through `initialize`. Nothing reached the server, so a retry is safe.
            Err(UpstreamError::Restarted) if attempt == 0 => {
                guard.armed = false;
                tracing::info!(backend = %b.name, "stdio server restarted; re-initializing");
                forget_session(b, &s);
                continue;
            }
            Err(e) => return Err(upstream_err(b, &e)),
        };
        if session_lost(reply.status, &reply.messages) && attempt == 0 {
            guard.armed = false;
            tracing::info!(backend = %b.name, "legacy session lost; re-initializing");
            forget_session(b, &s);
            continue;
        }
        return Ok(Bridged::Answer(translate(reply, mapping, guard)));
    }
    Err(GatewayError::BackendFailed {
        backend: b.name.to_string(),
        detail: "legacy session could not be re-established".into(),
    })
}

/// Drops the backend's session if it is still `s` (a concurrent request may have replaced it).
fn forget_session(b: &Backend, s: &Arc<LegacySession>) {
    let current = b.bridge.session.load_full();
    if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, s)) {
        b.bridge.session.store(None);
    }
}

/// Sends an already-translated message within the session. Over stdio a request is pinned to
/// the child generation the session was initialized on (`UpstreamError::Restarted` otherwise).
async fn send_raw(
    b: &Backend,
    s: &LegacySession,
    body: Bytes,
    client_headers: &HeaderMap,
    deadline: Instant,
) -> Result<Reply, UpstreamError> {
    match &b.upstream {
        Upstream::Http(up) => {
            let mut extra = base_headers();
            extra.push((
                HeaderName::from_static(h::PROTOCOL_VERSION),
                s.version.clone(),
            ));
            if let Some(sid) = &s.id {
                extra.push((HeaderName::from_static(h::SESSION_ID), sid.clone()));
            }
            // Only trace context travels with bridged requests; the 2026 mirror headers would
            // contradict the legacy session.
            for name in ["traceparent", "tracestate", "baggage"] {
                if let Some(v) = client_headers.get(name) {
                    extra.push((HeaderName::from_static(name), v.clone()));
                }
            }
            let req = up.request(&HeaderMap::new(), &extra, body);
            up.call(req, deadline).await
        }
        Upstream::Stdio(st) => {
            if crate::protocol::sniff_id(&body).is_none() {
                st.notify(body).await?;
                return Ok(Reply {
                    status: StatusCode::ACCEPTED,
                    headers: HeaderMap::new(),
                    messages: MessageStream::Empty,
                });
            }
            let opts = CallOptions {
                cancel_on_drop: true,
                generation: Some(s.generation),
            };
            st.call_with(body, deadline, opts).await
        }
        Upstream::Builtin(_) => Err(UpstreamError::Protocol(
            "built-in servers are modern".into(),
        )),
    }
}

/// Applies `from_legacy` to every message of the answer; answers server requests upstream.
fn translate(reply: Reply, m: Mapping, mut guard: CancelGuard) -> Reply {
    let status = reply.status;
    match reply.messages {
        MessageStream::Empty => {
            guard.armed = false;
            Reply {
                status,
                headers: HeaderMap::new(),
                messages: MessageStream::Empty,
            }
        }
        MessageStream::One(msg) => {
            guard.armed = false;
            match from_legacy(&msg, &m) {
                Translated::Forward(out) => {
                    let status = error_status(&out).unwrap_or(status);
                    Reply::one(status, out)
                }
                _ => Reply::one(
                    StatusCode::BAD_GATEWAY,
                    GatewayError::BackendFailed {
                        backend: guard.backend.name.to_string(),
                        detail: "answer did not match the request".into(),
                    }
                    .to_message(Some(&m.client_id)),
                ),
            }
        }
        MessageStream::Many(stream) => {
            let backend = guard.backend.clone();
            let session = guard.session.clone();
            let out = stream.filter_map(move |item| {
                let m = m.clone();
                let backend = backend.clone();
                let session = session.clone();
                async move {
                    match item {
                        Err(e) => Some(Err(e)),
                        Ok(msg) => match from_legacy(&msg, &m) {
                            Translated::Forward(out) => Some(Ok(out)),
                            Translated::Answer(answer) => {
                                tokio::spawn(async move {
                                    let deadline = Instant::now() + backend.timeout;
                                    let _ = send_raw(
                                        &backend,
                                        &session,
                                        answer,
                                        &HeaderMap::new(),
                                        deadline,
                                    )
                                    .await;
                                });
                                None
                            }
                            Translated::Drop => None,
                        },
                    }
                }
            });
            Reply {
                status,
                headers: HeaderMap::new(),
                messages: MessageStream::Many(Box::pin(Guarded {
                    inner: Box::pin(out),
                    guard,
                })),
            }
        }
    }
}

/// The HTTP status a translated error answer should carry.
fn error_status(msg: &[u8]) -> Option<StatusCode> {
    let v: Value = serde_json::from_slice(msg).ok()?;
    let c = v.get("error")?.get("code")?.as_i64()?;
    StatusCode::from_u16(status_for_code(c)).ok()
}

/// Sends `notifications/cancelled` upstream when dropped while armed.
struct CancelGuard {
    backend: Arc<Backend>,
    session: Arc<LegacySession>,
    upstream_id: u64,
    armed: bool,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let backend = self.backend.clone();
        let session = self.session.clone();
        let note = json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{
            "requestId": self.upstream_id, "reason": "the client went away"}});
        rt.spawn(async move {
            let deadline = Instant::now() + std::time::Duration::from_secs(5);
            let body = Bytes::from(note.to_string());
            if let Err(error) = send_raw(&backend, &session, body, &HeaderMap::new(), deadline).await {
                tracing::debug!(backend = %backend.name, %error, "could not send notifications/cancelled");
            }
        });
    }
}

/// A message stream that disarms its guard once the response has passed through.
struct Guarded {
    inner: Pin<Box<dyn Stream<Item = Result<Bytes, UpstreamError>> + Send>>,
    guard: CancelGuard,
}

impl Stream for Guarded {
    type Item = Result<Bytes, UpstreamError>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let item = self.inner.as_mut().poll_next(cx);
        match &item {
            Poll::Ready(Some(Ok(msg))) if crate::proxy::is_response(msg) => {
                self.guard.armed = false
            }
            Poll::Ready(None) => self.guard.armed = false,
            _ => {}
        }
        item
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(s: &[&str]) -> Vec<Bytes> {
        s.iter().map(|m| Bytes::from(m.to_string())).collect()
    }

    /// Every answer shape digest §5 lists, and what it means.
    #[test]
    fn probe_classification_table() {
        use Classification::*;
        let cases: &[(u16, &[&str], Classification, &str)] = &[
            (
                200,
                &[
                    r#"{"jsonrpc":"2.0","id":"p","result":{"resultType":"complete","supportedVersions":["2026-07-28"],"capabilities":{},"ttlMs":0,"cacheScope":"private"}}"#,
                ],
                Modern,
                "discover result",
            ),
            (
                400,
                &[
                    r#"{"jsonrpc":"2.0","id":"p","error":{"code":-32022,"message":"Unsupported protocol version","data":{"supported":["2027-01-01"]}}}"#,
                ],
                Modern,
                "-32022 from a newer modern server",
            ),
            (
                400,
                &[
                    r#"{"jsonrpc":"2.0","id":"p","error":{"code":-32020,"message":"header mismatch"}}"#,
                ],
                Modern,
                "-32020",
            ),
            (
                400,
                &[
                    r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"Bad Request: Unsupported protocol version: 2026-07-28 (supported versions: 2025-11-25)"}}"#,
                ],
                Legacy,
                "TS SDK 400 -32000",
            ),
            (
                400,
                &[
                    r#"{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: No valid session ID provided"},"id":null}"#,
                ],
                Legacy,
                "TS SDK stateful, no session",
            ),
            (
                400,
                &[
                    r#"{"jsonrpc":"2.0","id":"p","error":{"code":-32600,"message":"Bad Request: Missing session ID"}}"#,
                ],
                Legacy,
                "Python SDK legacy transport",
            ),
            (
                400,
                &[
                    r#"{"jsonrpc":"2.0","id":"p","error":{"code":-32602,"message":"Invalid request parameters"}}"#,
                ],
                Legacy,
                "-32602 (Python SDK pre-initialize)",
            ),
            (404, &[], Legacy, "404 empty"),
            (
                405,
                &["<html>Method Not Allowed</html>"],
                Legacy,
                "405 HTML",
            ),
            (406, &[], Legacy, "406"),
            (
                200,
                &[
                    r#"{"jsonrpc":"2.0","id":"p","error":{"code":-32601,"message":"Method not found"}}"#,
                ],
                Legacy,
                "stateless legacy: -32601",
            ),
            (
                200,
                &[r#"{"jsonrpc":"2.0","id":"p","result":{}}"#],
                Legacy,
                "stateless legacy result without supportedVersions",
            ),
            (
                500,
                &[],
                Undecided("HTTP 500".into()),
                "server error says nothing",
            ),
            (
                502,
                &["bad gateway"],
                Undecided("HTTP 502".into()),
                "proxy error says nothing",
            ),
        ];
        for (status, body, want, what) in cases {
            assert_eq!(&classify_http(*status, &msgs(body)), want, "{what}");
        }
        // stdio: silence or any non-modern error is legacy.
        assert_eq!(classify_stdio(None), Legacy, "no answer before the timeout");
        assert_eq!(
            classify_stdio(Some(&msgs(&[
                r#"{"jsonrpc":"2.0","id":"p","error":{"code":-32601,"message":"Method not found"}}"#
            ]))),
            Legacy,
            "TS SDK over stdio"
        );
        assert_eq!(
            classify_stdio(Some(&msgs(&[
                r#"{"jsonrpc":"2.0","id":"p","error":{"code":-32602,"message":"Invalid request parameters"}}"#
            ]))),
            Legacy,
            "Python SDK over stdio before initialize"
        );
        assert_eq!(
            classify_stdio(Some(&msgs(&[
                r#"{"jsonrpc":"2.0","id":"p","result":{"supportedVersions":["2026-07-28"],"capabilities":{}}}"#
            ]))),
            Modern
        );
        assert_eq!(
            classify_stdio(Some(&msgs(&[
                r#"{"jsonrpc":"2.0","id":"p","error":{"code":-32022,"message":"x"}}"#
            ]))),
            Modern
        );
    }

    /// What an error answer to `initialize` says: only a modern server's refusal flips the
    /// verdict; a legacy server refusing our revision does not.
    #[test]
    fn initialize_refusals() {
        let cases = [
            (json!({"code":-32601,"message":"Method not found"}), true),
            (
                json!({"code":-32022,"message":"Unsupported protocol version"}),
                true,
            ),
            (json!({"code":-32020,"message":"Header mismatch"}), true),
            (
                json!({"code":-32602,"message":"Unsupported protocol version",
                    "data":{"supported":["2026-07-28"],"requested":"2025-11-25"}}),
                true,
            ),
            (
                json!({"code":-32000,"message":"x","data":{"supportedVersions":["2027-01-01"]}}),
                true,
            ),
            (
                json!({"code":-32602,"message":"Unsupported protocol version",
                    "data":{"supported":["2025-06-18","2025-03-26"],"requested":"2025-11-25"}}),
                false,
            ),
            (json!({"code":-32603,"message":"Internal error"}), false),
            (
                json!({"code":-32000,"message":"Server not initialized"}),
                false,
            ),
            (json!({"message":"no code"}), false),
        ];
        for (error, modern) in cases {
            assert_eq!(initialize_refusal_is_modern(&error), modern, "{error}");
        }
    }

    #[test]
    fn requests_go_up_in_legacy_shape() {
        let body = br#"{"jsonrpc":"2.0","id":"c1","method":"tools/call","params":{"name":"t","arguments":{},"_meta":{
            "io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},
            "io.modelcontextprotocol/clientInfo":{"name":"x"},"progressToken":7,"custom":1}}}"#;
        let (up, token) = to_legacy(body, 42).unwrap();
        let v: Value = serde_json::from_slice(&up).unwrap();
        assert_eq!(v["id"], 42);
        assert_eq!(
            v["params"]["_meta"],
            json!({"progressToken":"portico-42","custom":1})
        );
        assert_eq!(token, Some((json!("portico-42"), json!(7))));
        let (up, token) = to_legacy(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#, 3).unwrap();
        let v: Value = serde_json::from_slice(&up).unwrap();
        assert!(v["params"].get("_meta").is_none(), "empty _meta removed");
        assert!(token.is_none());
    }

    #[test]
    fn results_come_back_in_modern_shape() {
        let m = Mapping {
            client_id: RequestId::from_value(&json!("c1")).unwrap(),
            upstream_id: 42,
            token: Some((json!("portico-42"), json!(7))),
            method: "tools/list".into(),
            ttl_ms: 5000,
            scope: "private",
            server_info: Some(json!({"name":"legacy"})),
        };
        let Translated::Forward(out) =
            from_legacy(br#"{"jsonrpc":"2.0","id":42,"result":{"tools":[]}}"#, &m)
        else {
            panic!("forwarded")
        };
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["id"], "c1");
        assert_eq!(v["result"]["resultType"], "complete");
        assert_eq!(v["result"]["ttlMs"], 5000);
        assert_eq!(v["result"]["cacheScope"], "private");
        assert_eq!(v["result"]["_meta"][meta::SERVER_INFO]["name"], "legacy");
        let Translated::Forward(out) = from_legacy(
            br#"{"jsonrpc":"2.0","id":42,"error":{"code":-32002,"message":"Resource not found"}}"#,
            &m,
        ) else {
            panic!()
        };
        assert_eq!(
            serde_json::from_slice::<Value>(&out).unwrap()["error"]["code"],
            -32602
        );
        let Translated::Forward(out) = from_legacy(br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"portico-42","progress":1}}"#, &m) else {
            panic!()
        };
        assert_eq!(
            serde_json::from_slice::<Value>(&out).unwrap()["params"]["progressToken"],
            7
        );
        assert!(matches!(
            from_legacy(
                br#"{"jsonrpc":"2.0","id":"s1","method":"sampling/createMessage","params":{}}"#,
                &m
            ),
            Translated::Answer(_)
        ));
        assert!(
            matches!(
                from_legacy(br#"{"jsonrpc":"2.0","id":99,"result":{}}"#, &m),
                Translated::Drop
            ),
            "someone else's answer"
        );
        assert!(matches!(
            from_legacy(
                br#"{"jsonrpc":"2.0","method":"notifications/message","params":{}}"#,
                &m
            ),
            Translated::Drop
        ));
    }
}
