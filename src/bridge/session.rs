//! The upstream legacy session of a backend: `initialize` + `notifications/initialized` once,
//! shared by every bridged request, re-made when it is lost or the stdio child restarted, and
//! `DELETE`d on shutdown. An `initialize` refused the way only a 2026-07-28 server refuses it
//! re-probes the backend ([`flip_to_modern`]).

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::time::Instant;

use super::probe::{ensure_verdict, initialize_refusal_is_modern, response_of};
use super::{Bridged, base_headers, collect, upstream_err};
use crate::backend::LegacySession;
use crate::backend::{Backend, Verdict};
use crate::error::GatewayError;
use crate::protocol::portico_info;
use crate::protocol::{LEGACY_VERSIONS, header as h};
use crate::upstream::stdio::{CallOptions, StdioUpstream};
use crate::upstream::{Reply, Upstream, UpstreamError};

/// Why no legacy session could be had.
pub(super) enum SessionError {
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

pub(super) async fn session_or_modern(
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
pub(super) async fn flip_to_modern(b: &Backend, why: &str) -> Result<Verdict, GatewayError> {
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

/// Turns a failed session into the caller's answer: `Bridged::Modern` when the re-probe
/// confirmed a modern server, an error otherwise.
pub(super) async fn on_session_error(
    b: &Backend,
    e: SessionError,
) -> Result<Bridged, GatewayError> {
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

pub(super) fn initialize_body(id: &str) -> Bytes {
    Bytes::from(
        json!({"jsonrpc":"2.0","id":id,"method":"initialize","params":{
            "protocolVersion": LEGACY_VERSIONS[0],
            "capabilities": {},
            "clientInfo": portico_info(),
        }})
        .to_string(),
    )
}

pub(super) const INITIALIZED: &[u8] = br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

/// Sends `initialize` to one stdio child generation and returns the answer with that generation:
/// the session is bound to the child it was made with. Pinned so the generation recorded is the
/// child that really answered; a child that died in between is retried on its successor once.
/// Never cancelled (the spec forbids cancelling `initialize`).
pub(super) async fn initialize_stdio(
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
pub(super) async fn initialize(
    b: &Backend,
    deadline: Instant,
) -> Result<LegacySession, SessionError> {
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
            extra.push((h::names::PROTOCOL_VERSION, version.clone()));
            if let Some(sid) = &session_id {
                extra.push((h::names::SESSION_ID, sid.clone()));
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
                (h::names::SESSION_ID, sid.clone()),
                (h::names::PROTOCOL_VERSION, s.version.clone()),
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

/// Drops the backend's session if it is still `s` (a concurrent request may have replaced it).
pub(super) fn forget_session(b: &Backend, s: &Arc<LegacySession>) {
    let current = b.bridge.session.load_full();
    if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, s)) {
        b.bridge.session.store(None);
    }
}
