//! The upstream legacy sessions of a backend, one per owner (`owner`): `initialize` (with the
//! owner's capabilities and clientInfo) + `notifications/initialized` on first use, re-made
//! when lost or the stdio child restarted, `DELETE`d (or their own child stopped) when evicted
//! at `max_upstream_sessions`, idle for `upstream_idle_ms`, ended by their client, or at
//! shutdown. An `initialize` refused the way only a 2026-07-28 server refuses it
//! re-probes the backend ([`flip_to_modern`]).

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, StatusCode};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::time::Instant;

use super::owner::{Group, Owner};
use super::probe::{ensure_verdict, initialize_refusal_is_modern, response_of};
use super::{Bridged, base_headers, collect, upstream_err};
use crate::backend::{Backend, LegacySession, SessionSlot, Verdict};
use crate::error::GatewayError;
use crate::pool::{self, OwnerKey, Refused, Slot};
use crate::protocol::header as h;
use crate::upstream::http::HttpUpstream;
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

/// The slot key of portico's own session, and of every owner on a `shared` stdio child.
const OWN: OwnerKey = [0; 32];

/// The `GET` that opens session `s`'s standalone SSE stream (where an initialize-era server
/// says what it says unasked), with the session's headers. Shared by a listen request's stream
/// (`listen`) and the cache's watcher (`invalidation`).
pub fn stream_request(up: &HttpUpstream, s: &LegacySession) -> Request<Bytes> {
    let mut extra = vec![(h::names::PROTOCOL_VERSION, s.version.clone())];
    if let Some(id) = &s.id {
        extra.push((h::names::SESSION_ID, id.clone()));
    }
    up.get_events(&extra)
}

/// `owner`'s upstream legacy session on `b`, initialized on first use (and again when lost or
/// the stdio child restarted). For callers that cannot switch paths: a server that turns out
/// modern is re-probed and the call fails; the next request takes the modern path.
pub async fn session(
    b: &Arc<Backend>,
    owner: &Owner,
    deadline: Instant,
) -> Result<Arc<LegacySession>, GatewayError> {
    match session_or_modern(b, owner, &[], deadline).await {
        Ok((_, s)) => Ok(s),
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

/// Opens `owner`'s session now (an initialize-era client's `initialize`) and returns its
/// upstream `Mcp-Session-Id` and revision, for sealing into the client's session id; `None`
/// when there is nothing another replica could use (stdio, a stateless server).
pub async fn open(
    b: &Arc<Backend>,
    owner: &Owner,
    deadline: Instant,
) -> Result<Option<(String, String)>, GatewayError> {
    if !matches!(b.transport(), Upstream::Http(_)) {
        return Ok(None);
    }
    let s = session(b, owner, deadline).await?;
    let id = s.id.as_ref().and_then(|v| v.to_str().ok());
    let version = s.version.to_str().ok();
    Ok(id.zip(version).map(|(i, v)| (i.to_string(), v.to_string())))
}

/// The slot an owner's requests use on `b`: its own, or for portico's traffic and on a
/// `shared` stdio child the one slot everybody shares.
fn slot_key(b: &Backend, owner: &Owner) -> OwnerKey {
    let shared_child = matches!(b.transport(), Upstream::Stdio(_))
        && b.cfg.isolation() == crate::config::Isolation::Shared;
    if owner.portico || shared_child {
        OWN
    } else {
        owner.key
    }
}

/// A fresh slot: per-client stdio backends get a child of their own (started on first use).
fn new_slot(b: &Arc<Backend>, key: &OwnerKey, owner: &Owner, team: &[Team]) -> SessionSlot {
    let child = match b.transport() {
        // A per-client child, or an HTTP+SSE backend's session of this owner alone.
        Upstream::Stdio(s) if *key != OWN => s.owned_sibling(&b.cfg, team).map(|child| {
            let child = Arc::new(child);
            forward_notes(b, &child);
            child
        }),
        _ => None,
    };
    let adopt = match (b.transport(), owner.sealed_for(&b.name)) {
        (Upstream::Http(_), Some((id, v))) => HeaderValue::from_str(id)
            .ok()
            .zip(HeaderValue::from_str(v).ok()),
        _ => None,
    };
    SessionSlot {
        session: Default::default(),
        init_lock: Default::default(),
        child,
        adopt: std::sync::Mutex::new(adopt),
        // portico's own session is nobody's: no caller's credentials on it.
        credentials: if *key == OWN {
            Vec::new()
        } else {
            team.to_vec()
        },
    }
}

/// A per-client child's unsolicited messages (list changes) reach the cache watcher and
/// aggregated listeners like the backend's own child's.
fn forward_notes(b: &Backend, child: &StdioUpstream) {
    let mut rx = child.subscribe();
    let tx = b.bridge.notes.clone();
    tokio::spawn(async move {
        loop {
            match rx.recv().await {
                Ok(m) => {
                    let _ = tx.send(m);
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    });
}

/// The stdio transport a slot's requests go to (`None` for HTTP).
pub(super) fn stdio_of<'a>(
    b: &'a Backend,
    child: Option<&'a Arc<StdioUpstream>>,
) -> Option<&'a StdioUpstream> {
    match (child, b.transport()) {
        (Some(c), _) => Some(c),
        (None, Upstream::Stdio(s)) => Some(s),
        _ => None,
    }
}

/// Whether a session with `child` lives on the stdio child every client of `b` shares: its
/// log lines are nobody's, so no client's level is set there and none is delivered
/// (docs/protocol.md §8 item 17).
pub(super) fn on_shared_child(b: &Backend, child: Option<&Arc<StdioUpstream>>) -> bool {
    child.is_none() && matches!(b.transport(), Upstream::Stdio(_))
}

pub(super) type Held = Arc<Slot<SessionSlot>>;

/// A team header (`team_headers`): the owner's team is part of its key, so a session made
/// with them serves only callers of that team.
pub(super) type Team = (http::HeaderName, HeaderValue);

/// The owner's upstream session on `b`, if one is open (nothing is opened).
pub(super) fn existing(b: &Backend, owner: &Owner) -> Option<Arc<LegacySession>> {
    b.bridge
        .pool
        .get(&slot_key(b, owner))?
        .value
        .session
        .load_full()
}

pub(super) async fn session_or_modern(
    b: &Arc<Backend>,
    owner: &Owner,
    team: &[Team],
    deadline: Instant,
) -> Result<(Held, Arc<LegacySession>), SessionError> {
    let key = slot_key(b, owner);
    let group = owner.group.filter(|_| key != OWN).map(|g| match g {
        Group::Context(key) => pool::Group {
            key,
            quota: b.cfg.max_upstream_sessions_per_context,
        },
        Group::Principal(key) => pool::Group {
            key,
            quota: b.cfg.max_upstream_sessions_per_principal,
        },
    });
    let (slot, evicted) = match b.bridge.pool.get_or_insert_with(
        key,
        group,
        owner.expires_ms,
        || new_slot(b, &key, owner, team),
    ) {
        Ok(taken) => taken,
        Err(refused) => {
            match refused {
                Refused::Cap => {
                    tracing::warn!(backend = %b.name, "max_upstream_sessions reached and a request holds every upstream session; refused")
                }
                Refused::Quota => {
                    tracing::warn!(backend = %b.name, "max_upstream_sessions_per_context (or _per_principal) reached and a request holds every upstream session of the client's context (or principal); refused")
                }
            }
            return Err(SessionError::Failed(GatewayError::Overloaded {
                backend: b.name.to_string(),
            }));
        }
    };
    if key == OWN {
        slot.pin();
    }
    for old in evicted {
        tracing::info!(backend = %b.name, "max_upstream_sessions (or the client context's or principal's quota) reached: closing the least recently used upstream session");
        tokio::spawn(close_slot(b.clone(), old));
    }
    start_reaper(b);
    let generation =
        |slot: &Held| stdio_of(b, slot.value.child.as_ref()).map_or(0, StdioUpstream::generation);
    if let Some(s) = slot.value.session.load_full()
        && s.generation == generation(&slot)
    {
        return Ok((slot, s));
    }
    let _one = slot.value.init_lock.lock().await;
    if let Some(s) = slot.value.session.load_full()
        && s.generation == generation(&slot)
    {
        return Ok((slot.clone(), s));
    }
    // A request that queued behind an `initialize` which found the server modern must not
    // send another one (nor undo the new verdict).
    if b.verdict() != Verdict::Legacy {
        return Err(SessionError::Modern(
            "the backend was re-probed while this request waited".into(),
        ));
    }
    let adopted = slot
        .value
        .adopt
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    let s = match adopted {
        // Opened by another replica for this client: its state lives upstream, so use it
        // (if the server lost it, the 404 re-initializes below like any lost session).
        Some((id, version)) => LegacySession {
            id: Some(id),
            version,
            init: Default::default(),
            server_info: None,
            generation: 0,
            child: None,
            log_level: Default::default(),
            stream: Default::default(),
            subscribed: Default::default(),
        },
        None => {
            let own = if key == OWN {
                Owner::portico()
            } else {
                owner.clone()
            };
            // The caller's upstream credentials open its own session as they go on its
            // requests (a server that authenticates every request refuses an `initialize`
            // without them); portico's own session is nobody's.
            let team = if key == OWN { &[][..] } else { team };
            // Boxed: the handshake is rare, and inline its state would set the size (and the
            // cost of every move) of each bridged call's future.
            Box::pin(initialize(
                b,
                slot.value.child.as_ref(),
                &own,
                team,
                deadline,
            ))
            .await?
        }
    };
    let s = Arc::new(s);
    slot.value.session.store(Some(s.clone()));
    Ok((slot.clone(), s))
}

/// Closes what idles in the pool, every so often, while the backend lives.
fn start_reaper(b: &Arc<Backend>) {
    if b.bridge.reaper.swap(true, Ordering::Relaxed) {
        return;
    }
    let weak = Arc::downgrade(b);
    let period = (b.bridge.pool.idle() / 2).clamp(
        std::time::Duration::from_millis(10),
        std::time::Duration::from_secs(30),
    );
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(period).await;
            let Some(b) = weak.upgrade() else { return };
            for slot in b.bridge.pool.reap() {
                tracing::debug!(backend = %b.name, "closing an idle upstream session");
                close_slot(b.clone(), slot).await;
            }
        }
    });
}

/// Ends one slot: `DELETE` of its HTTP session, or its own stdio child stopped.
pub(super) async fn close_slot(b: Arc<Backend>, slot: Held) {
    if let Some(s) = slot.value.session.swap(None) {
        delete_upstream(&b, s.id.as_ref(), &s.version, &slot.value.credentials).await;
    }
    if let Some(child) = &slot.value.child {
        child.shutdown().await;
    }
}

/// `DELETE`s an HTTP upstream session (bounded: 2 s).
async fn delete_upstream(
    b: &Backend,
    id: Option<&HeaderValue>,
    version: &HeaderValue,
    credentials: &[Team],
) {
    let (Upstream::Http(up), Some(sid)) = (b.transport(), id) else {
        return;
    };
    let mut extra = vec![
        (h::names::SESSION_ID, sid.clone()),
        (h::names::PROTOCOL_VERSION, version.clone()),
    ];
    extra.extend_from_slice(credentials);
    let mut req = up.request(&HeaderMap::new(), &extra, Bytes::new());
    *req.method_mut() = http::Method::DELETE;
    let deadline = Instant::now() + std::time::Duration::from_secs(2);
    if let Ok(ex) = up.exchange(req, deadline).await {
        tracing::info!(backend = %b.name, status = %ex.response.status(), "legacy session closed");
    }
}

/// Ends `owner`'s upstream session on `b` (its client ended its own session): the one this
/// replica holds, and the one sealed in the client's id if another replica opened it — that
/// one with `credentials`, the owner's upstream credentials as its client's `DELETE` has them
/// (the replica that opened it kept its own).
pub async fn close_owner(b: &Arc<Backend>, owner: &Owner, credentials: &[Team]) {
    let key = slot_key(b, owner);
    let mut closed = None;
    if key != OWN
        && let Some(slot) = b.bridge.pool.remove(&key)
    {
        closed = slot.value.session.load_full().and_then(|s| s.id.clone());
        close_slot(b.clone(), slot).await;
    }
    if let Some((id, v)) = owner.sealed_for(&b.name)
        && let (Ok(id), Ok(v)) = (HeaderValue::from_str(id), HeaderValue::from_str(v))
        && closed.as_ref() != Some(&id)
    {
        delete_upstream(b, Some(&id), &v, credentials).await;
    }
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
            for slot in b.bridge.pool.drain() {
                if let Some(child) = &slot.value.child {
                    child.shutdown().await;
                }
            }
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

/// The upstream `initialize`: the owner's revision, capabilities and clientInfo
/// (docs/protocol.md §7: capabilities hold for the whole session).
pub(super) fn initialize_body(id: &str, owner: &Owner) -> Bytes {
    Bytes::from(
        json!({"jsonrpc":"2.0","id":id,"method":"initialize","params":{
            "protocolVersion": owner.version,
            "capabilities": owner.capabilities(),
            "clientInfo": owner.client_info(),
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
    owner: &Owner,
    deadline: Instant,
) -> Result<(Reply, u64), UpstreamError> {
    let mut again = true;
    loop {
        let generation = s.generation();
        let opts = CallOptions {
            cancel_on_drop: false,
            generation: Some(generation),
            logs: false,
        };
        match s
            .call_with(initialize_body(id, owner), deadline, opts)
            .await
        {
            Err(UpstreamError::Restarted) if again => again = false,
            r => return r.map(|reply| (reply, generation)),
        }
    }
}

/// Runs the legacy handshake: `initialize` (newest revision first; the server echoes it or
/// counter-offers its own), then `notifications/initialized`.
pub(super) async fn initialize(
    b: &Backend,
    child: Option<&Arc<StdioUpstream>>,
    owner: &Owner,
    team: &[Team],
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
    let stdio = stdio_of(b, child);
    let (messages, session_id, generation, status) = match (b.transport(), stdio) {
        (Upstream::Http(up), _) => {
            let mut extra = base_headers(team.len());
            extra.extend_from_slice(team);
            let req = up.request(&HeaderMap::new(), &extra, initialize_body(&id, owner));
            let reply = up
                .call(req, deadline)
                .await
                .map_err(|e| upstream_err(b, &e))?;
            let sid = reply.headers.get(h::SESSION_ID).cloned();
            let status = reply.status;
            let messages = collect(reply).await.map_err(|e| upstream_err(b, &e))?;
            (messages, sid, 0, status)
        }
        (_, Some(s)) => {
            let (reply, generation) = initialize_stdio(s, &id, owner, deadline)
                .await
                .map_err(|e| upstream_err(b, &e))?;
            let messages = collect(reply).await.map_err(|e| upstream_err(b, &e))?;
            (messages, None, generation, StatusCode::OK)
        }
        _ => return Err(fail("built-in servers are modern".into())),
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
    match (b.transport(), stdio) {
        (Upstream::Http(up), _) => {
            let mut extra = base_headers(2 + team.len());
            extra.push((h::names::PROTOCOL_VERSION, version.clone()));
            if let Some(sid) = &session_id {
                extra.push((h::names::SESSION_ID, sid.clone()));
            }
            extra.extend_from_slice(team);
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
        (_, Some(s)) => {
            s.notify(Bytes::from_static(INITIALIZED), deadline)
                .await
                .map_err(|e| upstream_err(b, &e))?;
        }
        _ => {}
    }
    tracing::info!(
        backend = %b.name,
        version = ?version,
        session = session_id.is_some(),
        "legacy session initialized"
    );
    let shared = b.bridge.shared_init(init);
    Ok(LegacySession {
        id: session_id,
        version,
        init: shared.init,
        server_info: shared.server_info,
        generation,
        child: child.cloned(),
        log_level: Default::default(),
        stream: Default::default(),
        subscribed: Default::default(),
    })
}

/// Ends every upstream session of `b` (`DELETE`, children stopped), on shutdown.
pub async fn close(b: &Arc<Backend>) {
    let slots = b.bridge.pool.drain();
    futures_util::future::join_all(slots.into_iter().map(|s| close_slot(b.clone(), s))).await;
}

/// Drops the slot's session if it is still `s` (a concurrent request may have replaced it).
pub(super) fn forget_session(slot: &Held, s: &Arc<LegacySession>) {
    let current = slot.value.session.load_full();
    if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, s)) {
        slot.value.session.store(None);
    }
}
