//! `subscriptions/listen` against initialize-era backends, and the log levels of their
//! sessions.
//!
//! An initialize-era server says what it says unasked on its session's own channel: the
//! standalone GET stream over HTTP, the child's stdout over stdio. A listen request of an owner
//! (`owner`) is answered from *that owner's* session, so nothing another client caused reaches
//! it (docs/protocol.md §8 item 17):
//! 1. the session is opened (or reused), then its channel: the GET stream is shared by every
//!    listener of the session ([`SessionStream`]: servers may allow one) and closed when the
//!    last one leaves; a GET answered 404 (a restarted server forgot the session) is asked
//!    again once in a new session; a stdio child's messages are subscribed to;
//! 2. each `resourceSubscriptions` URI is subscribed upstream (`resources/subscribe`) when the
//!    server advertises `resources.subscribe`, counted per session so two listeners of one URI
//!    share it, and unsubscribed when the last one leaves;
//! 3. only then is the acknowledgement built — with the list-changed kinds the server
//!    advertises and the URIs it accepted — and sent first;
//! 4. `notifications/*/list_changed` of acknowledged kinds and `notifications/resources/updated`
//!    of accepted URIs follow, with `subscriptionId` = the listen request's id; with a
//!    `logLevel` in the request (portico's own listen for an initialize-era client's GET
//!    stream) the session's `notifications/message` at or above it too — never from a
//!    `shared` stdio child, whose log lines are everybody's;
//! 5. when the channel ends, a `SubscriptionsListenResult`. Dropping the stream drops the
//!    subscriptions and the session stream with it.

use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, StatusCode};
use serde_json::{Map, Value, json};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::owner::Owner;
use super::session::{
    Held, forget_session, on_session_error, on_shared_child, session_or_modern, stdio_of,
    stream_request,
};
use super::{Bridged, collect, send_raw, upstream_err};
use crate::backend::{Backend, GetStream, LegacySession, SessionStream};
use crate::error::GatewayError;
use crate::metrics::ListenStream;
use crate::protocol::{LOG_LEVELS, RequestId, log_rank, meta};
use crate::upstream::http::{HttpUpstream, async_stream};
use crate::upstream::{MessageStream, Reply, Upstream, UpstreamError};

/// How long an upstream session stream may stay open: long-lived by design, not unbounded.
pub const LISTEN_LIFETIME: Duration = Duration::from_secs(24 * 60 * 60);
/// Resource URIs one listen request may subscribe to.
const MAX_URIS: usize = 256;
/// A session's GET answered 409 — a server that allows one stream per session, still holding
/// the one portico let go of a moment ago (the last listener's, or [`learn_channel`]'s
/// question) — is asked again this many times, after `CONFLICT_PAUSE`, then twice that, and
/// so on (0.75 s in all); then the 409 fails the listen as any other status does.
const CONFLICT_RETRIES: u32 = 4;
const CONFLICT_PAUSE: Duration = Duration::from_millis(50);

/// Bound of one `resources/subscribe`, `unsubscribe` or `logging/setLevel` exchange.
const SMALL_EXCHANGE: Duration = Duration::from_secs(10);

/// The filter flags, the capability that must advertise `listChanged`, and the notification.
const KINDS: [(&str, &str, &str); 3] = [
    (
        "toolsListChanged",
        "tools",
        "notifications/tools/list_changed",
    ),
    (
        "promptsListChanged",
        "prompts",
        "notifications/prompts/list_changed",
    ),
    (
        "resourcesListChanged",
        "resources",
        "notifications/resources/list_changed",
    ),
];

/// Serves one `subscriptions/listen` request (id `id`, 2026-07-28 body) in `owner`'s session.
pub(super) async fn listen(
    b: &Arc<Backend>,
    owner: &Owner,
    id: &RequestId,
    body: &[u8],
    team: &[super::session::Team],
    deadline: Instant,
) -> Result<Bridged, GatewayError> {
    // `deadline` bounds the stream (long-lived); opening the session is a request like any.
    let open_by = deadline.min(Instant::now() + b.timeout);
    let req: Value =
        serde_json::from_slice(body).map_err(|e| GatewayError::Parse(e.to_string()))?;
    // 1. the session, and its own channel. The transport, not the configured URL's: a URL the
    // probe found to serve HTTP+SSE has its sessions, and their messages, on the SSE link.
    let mut renewed = false;
    let (slot, s, rx, stream) = loop {
        let (slot, s) = match session_or_modern(b, owner, team, open_by).await {
            Ok(held) => held,
            Err(e) => return on_session_error(b, e).await,
        };
        if !has_channel(b) {
            return Ok(nothing_to_hear(id));
        }
        match b.transport() {
            Upstream::Http(up) => match session_stream(b, up, &s).await? {
                Channel::Open(st) => break (slot, s, st.subscribe(), Some(st)),
                Channel::None => return Ok(nothing_to_hear(id)),
                // A server that restarted forgot the session: a GET has no effect, so it is
                // asked again in a new one, as a lost session's request is (`session_lost`).
                Channel::Lost if !renewed => {
                    tracing::info!(backend = %b.name, "legacy session lost; re-initializing");
                    forget_session(&slot, &s);
                    renewed = true;
                }
                Channel::Lost => {
                    return Err(GatewayError::BackendFailed {
                        backend: b.name.to_string(),
                        detail: "the session's GET stream answered HTTP 404 in a new session"
                            .into(),
                    });
                }
            },
            _ => match stdio_of(b, slot.value.child.as_ref()).map(|c| c.subscribe()) {
                Some(rx) => break (slot, s, rx, None),
                None => {
                    return Err(GatewayError::BackendFailed {
                        backend: b.name.to_string(),
                        detail: "no channel for notifications".into(),
                    });
                }
            },
        }
    };
    let filter = &req["params"]["notifications"];
    let caps = &s.init["capabilities"];
    let mut agreed = Map::new();
    let mut kinds = Vec::new();
    for (flag, cap, method) in KINDS {
        if filter[flag] == json!(true) && caps[cap]["listChanged"] == json!(true) {
            agreed.insert(flag.into(), json!(true));
            kinds.push(method);
        }
    }
    let shared_child = on_shared_child(b, slot.value.child.as_ref());
    let logs = req["params"]["_meta"][meta::LOG_LEVEL]
        .as_str()
        .and_then(log_rank)
        .filter(|_| !shared_child && caps.get("logging").is_some());
    if let Some(level) = logs {
        set_level(b, &s, level, false).await;
    }
    // 2. resource subscriptions
    let mut subs = Subscribed {
        backend: b.clone(),
        _slot: slot.clone(),
        session: s.clone(),
        uris: Vec::new(),
    };
    if caps["resources"]["subscribe"] == json!(true)
        && let Some(uris) = filter["resourceSubscriptions"].as_array()
    {
        for uri in uris.iter().filter_map(Value::as_str).take(MAX_URIS) {
            if !subs.uris.iter().any(|u| u == uri) && subscribe(b, &s, uri).await {
                subs.uris.push(uri.to_string());
            }
        }
    }
    if !subs.uris.is_empty() {
        agreed.insert("resourceSubscriptions".into(), json!(subs.uris));
    }
    // 3. the acknowledgement, now that portico has the stream
    let sid = id.to_value();
    let (ack, done) = ack_and_end(agreed, &sid);
    let messages = async_stream(move |tx| async move {
        // Held for the stream's life: the session stream and the subscriptions.
        let _held = (stream, subs);
        let send = |m: Bytes| {
            let tx = tx.clone();
            async move { tx.send(Ok::<Bytes, UpstreamError>(m)).await.is_ok() }
        };
        if !send(Bytes::from(ack.to_string())).await {
            return;
        }
        let mut rx = rx;
        let uris = _held.1.uris.clone();
        loop {
            let msg = match rx.recv().await {
                Ok(m) => m,
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::debug!(missed = n, "a listen stream fell behind its session");
                    continue;
                }
                Err(broadcast::error::RecvError::Closed) => break,
            };
            if let Some(note) = relayed(&msg, &kinds, &uris, logs, &sid)
                && !send(note).await
            {
                return;
            }
        }
        let _ = send(Bytes::from(done.to_string())).await;
    });
    Ok(Bridged::Answer(Reply {
        status: StatusCode::OK,
        headers: HeaderMap::new(),
        messages: MessageStream::Many(messages.boxed()),
    }))
}

/// Whether `b`'s sessions have a channel for what the server says unasked. Over HTTP that is
/// the session's GET stream, which a server that answered it 405 does not offer
/// (`BridgeState::get_stream`; stateless servers usually answer so). A stateless server is
/// not ruled out before that: one that keeps a single transport can serve a GET stream
/// without sessions. [`learn_channel`] asks before a `server/discover` is answered.
pub(super) fn has_channel(b: &Backend) -> bool {
    !matches!(b.transport(), Upstream::Http(_)) || b.bridge.get_stream() != GetStream::Refused
}

/// Asks an HTTP server, once it is known to nobody, whether its sessions have a GET stream:
/// a GET in `s`, let go of as soon as it is answered. Called before `server/discover` is
/// answered (a legacy client's `initialize` is answered from it too), so that the first
/// advertisement does not promise list changes or resource updates that no stream would
/// carry (advertised = delivered). Bounded like portico's other exchanges in a session; a
/// question that did not reach the server (a connection error, a timeout) is asked again by
/// the next discover, an answer that says neither (any other status) is not.
pub(super) async fn learn_channel(b: &Backend, s: &LegacySession) {
    let Upstream::Http(up) = b.transport() else {
        return;
    };
    if b.bridge.get_stream() != GetStream::Unknown {
        return;
    }
    // One question at a time: a discover that comes while it is asked (many clients at
    // startup) waits for that answer, bounded by its deadline, and asks nothing itself; if the
    // question did not reach the server, the next discover asks again.
    let Ok(_asking) = b.bridge.asking_get_stream.try_lock() else {
        drop(b.bridge.asking_get_stream.lock().await);
        return;
    };
    // A stream held open in the session says it all (and a second GET might be refused).
    if s.stream.lock().await.upgrade().is_some() {
        b.bridge.learn_get_stream(GetStream::Offered);
        return;
    }
    let deadline = Instant::now() + SMALL_EXCHANGE.min(b.timeout);
    let said = match up.call(stream_request(up, s), deadline).await {
        // Dropping the reply closes the stream (and its connection) at once.
        Ok(reply) => GetStream::said(reply.status),
        Err(e) => {
            tracing::debug!(backend = %b.name, error = %upstream_err(b, &e), "asking for the GET stream failed");
            GetStream::Unknown
        }
    };
    tracing::debug!(backend = %b.name, ?said, "the server's GET stream");
    b.bridge.learn_get_stream(said);
}

/// The acknowledgement of what was agreed, and the result that ends the listen.
fn ack_and_end(agreed: Map<String, Value>, sid: &Value) -> (Value, Value) {
    let ack = json!({"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged",
        "params":{"notifications":agreed,"_meta":{meta::SUBSCRIPTION_ID: sid}}});
    let done = json!({"jsonrpc":"2.0","id":sid,"result":{"resultType":"complete",
        "_meta":{meta::SUBSCRIPTION_ID: sid}}});
    (ack, done)
}

/// A listen on a session with no channel: nothing can be delivered, so nothing is agreed, and
/// the listen ends at once rather than holding a stream that will stay silent.
fn nothing_to_hear(id: &RequestId) -> Bridged {
    let (ack, done) = ack_and_end(Map::new(), &id.to_value());
    let messages = [ack, done].map(|m| Ok(Bytes::from(m.to_string())));
    Bridged::Answer(Reply {
        status: StatusCode::OK,
        headers: HeaderMap::new(),
        messages: MessageStream::Many(futures_util::stream::iter(messages).boxed()),
    })
}

/// A listen answer (any backend kind) as the client gets it: every notification carries the
/// client's listen id as its `subscriptionId` (docs/protocol.md §1: an upstream saw another id,
/// or one of portico's), and `open` counts the stream until the client leaves — dropping the
/// stream drops the upstream side with it.
pub fn to_client(reply: Reply, id: &RequestId, open: ListenStream) -> Reply {
    let messages = match reply.messages {
        MessageStream::Many(m) => {
            let sid = id.to_value();
            m.map(move |item| {
                let _open = &open;
                item.map(|msg| with_subscription(msg, &sid))
            })
            .boxed()
        }
        other => {
            return Reply {
                messages: other,
                ..reply
            };
        }
    };
    Reply {
        status: reply.status,
        headers: reply.headers,
        messages: MessageStream::Many(messages),
    }
}

/// A notification with `subscriptionId` = `sid`; anything else unchanged.
fn with_subscription(msg: Bytes, sid: &Value) -> Bytes {
    let Ok(mut v) = serde_json::from_slice::<Value>(&msg) else {
        return msg;
    };
    if v.get("id").is_some() || v.get("method").is_none() {
        return msg;
    }
    if v["params"]["_meta"][meta::SUBSCRIPTION_ID] == *sid {
        return msg;
    }
    match set_subscription(&mut v, sid) {
        Some(()) => Bytes::from(v.to_string()),
        None => msg,
    }
}

/// Sets `params._meta.subscriptionId`, making `params` and `_meta` objects where needed.
fn set_subscription(v: &mut Value, sid: &Value) -> Option<()> {
    let params = v
        .as_object_mut()?
        .entry("params")
        .or_insert_with(|| json!({}));
    if !params.is_object() {
        *params = json!({});
    }
    let m = params
        .as_object_mut()?
        .entry("_meta")
        .or_insert_with(|| json!({}));
    if !m.is_object() {
        *m = json!({});
    }
    m[meta::SUBSCRIPTION_ID] = sid.clone();
    Some(())
}

/// A session message as the listener gets it (`subscriptionId` added), if it is one it asked
/// for.
fn relayed(
    msg: &[u8],
    kinds: &[&str],
    uris: &[String],
    logs: Option<u8>,
    sid: &Value,
) -> Option<Bytes> {
    let mut v: Value = serde_json::from_slice(msg).ok()?;
    if v.get("id").is_some() {
        return None;
    }
    let method = v.get("method")?.as_str()?;
    let wanted = match method {
        "notifications/resources/updated" => v["params"]["uri"]
            .as_str()
            .is_some_and(|u| uris.iter().any(|w| w == u)),
        "notifications/message" => logs.is_some_and(|min| {
            v["params"]["level"]
                .as_str()
                .and_then(log_rank)
                .is_some_and(|l| l >= min)
        }),
        m => kinds.contains(&m),
    };
    if !wanted {
        return None;
    }
    set_subscription(&mut v, sid)?;
    Some(Bytes::from(v.to_string()))
}

/// The session's GET stream, opened when nobody holds it; `None` when the server answered
/// 405, offering none (learned for the backend: see [`has_channel`]).
async fn session_stream(
    b: &Arc<Backend>,
    up: &Arc<HttpUpstream>,
    s: &LegacySession,
) -> Result<Channel, GatewayError> {
    let mut held = s.stream.lock().await;
    if let Some(st) = held.upgrade() {
        return Ok(Channel::Open(st));
    }
    let mut conflicts = 0;
    let reply = loop {
        let reply = up
            .call(stream_request(up, s), Instant::now() + LISTEN_LIFETIME)
            .await
            .map_err(|e| upstream_err(b, &e))?;
        if reply.status != StatusCode::CONFLICT || conflicts == CONFLICT_RETRIES {
            break reply;
        }
        // The server still holds the stream portico let go of a moment ago.
        tokio::time::sleep(CONFLICT_PAUSE * (1 << conflicts)).await;
        conflicts += 1;
    };
    b.bridge.learn_get_stream(GetStream::said(reply.status));
    let mut messages = match reply.messages {
        MessageStream::Many(m) if reply.status.is_success() => m,
        _ if reply.status == StatusCode::METHOD_NOT_ALLOWED => return Ok(Channel::None),
        _ if reply.status == StatusCode::NOT_FOUND && s.id.is_some() => return Ok(Channel::Lost),
        _ => {
            return Err(GatewayError::BackendFailed {
                backend: b.name.to_string(),
                detail: format!(
                    "the session's GET stream (where the server sends notifications) answered HTTP {}",
                    reply.status
                ),
            });
        }
    };
    let (tx, rx) = broadcast::channel(crate::backend::NOTES_QUEUE);
    let name = b.name.clone();
    let task = tokio::spawn(async move {
        while let Some(item) = messages.next().await {
            match item {
                Ok(m) => {
                    let _ = tx.send(m);
                }
                Err(error) => {
                    tracing::debug!(backend = %name, %error, "a session GET stream broke");
                    return;
                }
            }
        }
    });
    let st = Arc::new(SessionStream {
        rx: std::sync::Mutex::new(rx),
        task: task.abort_handle(),
    });
    *held = Arc::downgrade(&st);
    Ok(Channel::Open(st))
}

/// A session's GET stream, or why there is none.
enum Channel {
    Open(Arc<SessionStream>),
    /// The server offers none (405).
    None,
    /// The server does not know the session (404 to its id): it restarted or dropped it.
    Lost,
}

/// One request portico makes in the session for itself; whether it succeeded.
async fn exchange(b: &Backend, s: &LegacySession, method: &str, params: Value) -> bool {
    let id = b.bridge.next_id.fetch_add(1, Ordering::Relaxed) + 1;
    let body = json!({"jsonrpc":"2.0","id":id,"method":method,"params":params});
    let deadline = Instant::now() + SMALL_EXCHANGE.min(b.timeout);
    let sent = send_raw(
        b,
        s,
        Bytes::from(body.to_string()),
        &HeaderMap::new(),
        &[],
        deadline,
        super::How::OWN,
    )
    .await;
    let answered = match sent {
        Ok(reply) => collect(reply).await.unwrap_or_default(),
        Err(e) => {
            tracing::debug!(backend = %b.name, method, error = %upstream_err(b, &e), "session exchange failed");
            return false;
        }
    };
    answered.iter().any(|m| {
        serde_json::from_slice::<Value>(m)
            .ok()
            .is_some_and(|v| v["id"] == json!(id) && v.get("result").is_some())
    })
}

/// Subscribes `uri` in the session unless a listener there already did.
async fn subscribe(b: &Backend, s: &LegacySession, uri: &str) -> bool {
    let first = {
        let subs = s.subscribed.lock().unwrap_or_else(|p| p.into_inner());
        subs.get(uri).is_none_or(|n| *n == 0)
    };
    if first && !exchange(b, s, "resources/subscribe", json!({"uri": uri})).await {
        return false;
    }
    let mut subs = s.subscribed.lock().unwrap_or_else(|p| p.into_inner());
    *subs.entry(uri.to_string()).or_default() += 1;
    true
}

/// A listener's resource subscriptions: given back when it leaves.
struct Subscribed {
    backend: Arc<Backend>,
    /// Held while the listener is: a slot in use is never evicted (`pool`).
    _slot: Held,
    session: Arc<LegacySession>,
    uris: Vec<String>,
}

impl Drop for Subscribed {
    fn drop(&mut self) {
        let mut last = Vec::new();
        {
            let mut subs = self
                .session
                .subscribed
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            for uri in self.uris.drain(..) {
                if let Some(n) = subs.get_mut(&uri) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        subs.remove(&uri);
                        last.push(uri);
                    }
                }
            }
        }
        if last.is_empty() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (b, s) = (self.backend.clone(), self.session.clone());
        rt.spawn(async move {
            for uri in last {
                exchange(&b, &s, "resources/unsubscribe", json!({"uri": uri})).await;
            }
        });
    }
}

/// Sets the session's log level to `level` (a rank in [`LOG_LEVELS`]) when the server
/// advertises `logging`: `exact` for a client's own `logging/setLevel`; otherwise only lowered,
/// since requests sharing the session may want more detail than this one (each gets only the
/// lines at or above its own level: the caller filters).
pub(super) async fn set_level(b: &Backend, s: &LegacySession, level: u8, exact: bool) {
    // On a shared child one client's level would be every client's, for lines none receives.
    if s.init["capabilities"].get("logging").is_none() || on_shared_child(b, s.child.as_ref()) {
        return;
    }
    let now = s.log_level.load(Ordering::Relaxed);
    let wanted = level + 1;
    if now == wanted || (!exact && now != 0 && now < wanted) {
        return;
    }
    let name = LOG_LEVELS[usize::from(level).min(LOG_LEVELS.len() - 1)];
    if exchange(b, s, "logging/setLevel", json!({"level": name})).await {
        s.log_level.store(wanted, Ordering::Relaxed);
    }
}

/// An initialize-era client's `logging/setLevel`: set in its own upstream session on `b` if
/// that is open. One is not opened for it: the session is opened with the caller's team
/// headers, which only a request carries, and every later request of the client carries its
/// level anyway (`translate::log_level`).
pub async fn set_client_level(b: &Arc<Backend>, owner: &Owner, level: u8) {
    if let Some(s) = super::session::existing(b, owner) {
        set_level(b, &s, level, true).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_was_asked_for_is_relayed() {
        let sid = json!("L1");
        let kinds = ["notifications/tools/list_changed"];
        let uris = vec!["demo://a".to_string()];
        let tools = br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#;
        let v: Value =
            serde_json::from_slice(&relayed(tools, &kinds, &uris, None, &sid).unwrap()).unwrap();
        assert_eq!(v["params"]["_meta"][meta::SUBSCRIPTION_ID], "L1");
        let prompts = br#"{"jsonrpc":"2.0","method":"notifications/prompts/list_changed"}"#;
        assert!(relayed(prompts, &kinds, &uris, None, &sid).is_none());
        let a = br#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"demo://a"}}"#;
        let b = br#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"demo://b"}}"#;
        assert!(relayed(a, &kinds, &uris, None, &sid).is_some());
        assert!(relayed(b, &kinds, &uris, None, &sid).is_none());
        let info =
            br#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"x"}}"#;
        assert!(
            relayed(info, &kinds, &uris, None, &sid).is_none(),
            "no level: no logs"
        );
        assert!(relayed(info, &kinds, &uris, log_rank("info"), &sid).is_some());
        assert!(relayed(info, &kinds, &uris, log_rank("warning"), &sid).is_none());
        let request = br#"{"jsonrpc":"2.0","id":1,"method":"notifications/tools/list_changed"}"#;
        assert!(relayed(request, &kinds, &uris, None, &sid).is_none());
    }
}
