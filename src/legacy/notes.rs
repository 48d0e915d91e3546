//! What an initialize-era client hears unasked: its GET stream, its resource subscriptions and
//! its log level (issue #20 item 2; docs/protocol.md §7 "Other legacy-only features", §8 item
//! 17).
//!
//! Everything is made of 2026-07-28 `subscriptions/listen` requests portico sends *as the
//! client* (its `bridge::Owner`, so in its own upstream sessions) through the same dispatch and
//! per-backend step as any request — whatever era the backend speaks:
//! - **GET** with the session id: one listen opted in to every list-changed kind, with
//!   `logLevel` `debug` (the client's own `logging/setLevel` filters, read per line), merged with
//!   the client's channel (`step::clients`). The stream carries the notifications without
//!   `subscriptionId` (legacy clients know none); it ends when the client leaves, and the
//!   upstream listen with it, or when the session ends. When the upstream ends that listen
//!   having agreed to tell something (a restarting backend), portico opens it again and tells
//!   the client each agreed list may have changed meanwhile ([`Changes`]).
//!
//! A listen held for the client is opened again outside any request ([`Renewal`]: its
//! identity, headers and session; after 0.25 s, the pause doubling to 30 s while that fails),
//! for as long as the session and its config generation live and its credentials still
//! authenticate.
//! - **`resources/subscribe`**: one listen with `resourceSubscriptions: [uri]`, answered once
//!   the upstream acknowledged the URI (an initialize-era backend: after its own
//!   `resources/subscribe` in the client's session). A task relays its
//!   `notifications/resources/updated` to the client's channel, and opens the listen again
//!   when the upstream ends it (a restarting backend), then tells the client the resource may
//!   have changed meanwhile; `resources/unsubscribe` (or the session's end) drops it, which
//!   closes the upstream listen and unsubscribes upstream.
//! - **`logging/setLevel`**: the level is kept for the client and set in its own upstream
//!   sessions on initialize-era backends; its requests then carry it as `logLevel`, so the log
//!   lines a backend emits during them reach this client alone, on the request's stream.

use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, Response};
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::ops::Deref;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::{SessionData, backends, modernize, result};
use crate::backend::Verdict;
use crate::body::{Body, sse_event, sse_response};
use crate::bridge::{self, Owner};
use crate::error::GatewayError;
use crate::metrics::ListenStream;
use crate::protocol::{self, RequestId, log_rank, meta};
use crate::relay;
use crate::resilience::Reconnect;
use crate::router::{Route, dispatch};
use crate::step::clients::{Client, Feed, MAX_SUBSCRIPTIONS};
use crate::step::{Core, RequestCtx};
use crate::upstream::{MessageStream, UpstreamError};

/// The listen request behind a GET stream or a subscription, in the client's terms.
fn listen_body(
    id: &str,
    filter: Value,
    log: bool,
    session: &SessionData,
) -> Result<Bytes, GatewayError> {
    let mut params = json!({ "notifications": filter });
    if log {
        params["_meta"] = json!({ meta::LOG_LEVEL: "debug" });
    }
    let v = json!({"jsonrpc":"2.0","id":id,"method":"subscriptions/listen","params":params});
    modernize(v.to_string().as_bytes(), session)
}

/// Sends a listen request for the client through the route; its message stream.
async fn open_listen(
    core: &Core,
    ctx: &mut RequestCtx,
    route: &Route,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<futures_util::stream::BoxStream<'static, Result<Bytes, UpstreamError>>, GatewayError> {
    let env = protocol::parse_envelope(&body).map_err(crate::frontend::envelope_error)?;
    let deadline = Instant::now() + bridge::LISTEN_LIFETIME;
    let reply = dispatch(core, ctx, route, headers, &env, body, deadline).await?;
    Ok(match reply.messages {
        MessageStream::Many(m) => m,
        MessageStream::One(m) => futures_util::stream::iter([Ok(m)]).boxed(),
        MessageStream::Empty => futures_util::stream::empty().boxed(),
    })
}

/// A notification as a legacy client gets it: without `subscriptionId`.
fn plain(msg: &[u8]) -> Option<(String, Value)> {
    let mut v: Value = serde_json::from_slice(msg).ok()?;
    if v.get("id").is_some() {
        return None;
    }
    let method = v.get("method")?.as_str()?.to_string();
    if let Some(m) = v
        .get_mut("params")
        .and_then(|p| p.get_mut("_meta"))
        .and_then(Value::as_object_mut)
    {
        m.remove(meta::SUBSCRIPTION_ID);
        if m.is_empty()
            && let Some(p) = v["params"].as_object_mut()
        {
            p.remove("_meta");
        }
    }
    Some((method, v))
}

/// `GET` with a live session id: the client's notification stream.
#[allow(clippy::too_many_arguments)]
pub(super) async fn get_stream(
    core: &Core,
    generation: &relay::Generation,
    ctx: &mut RequestCtx,
    route: &Route,
    headers: &HeaderMap,
    owner: &Arc<Owner>,
    session: &SessionData,
    revocation: [u8; 32],
) -> Result<Response<Body>, GatewayError> {
    let client =
        core.clients
            .get(&owner.key, session.exp)
            .ok_or_else(|| GatewayError::Overloaded {
                backend: route.name().to_string(),
            })?;
    let mine = client.tx.subscribe();
    let renewal = Renewal::new(
        generation,
        ctx,
        route,
        headers,
        session,
        revocation,
        Want::Changes,
    );
    let feed = match renewal.open(core, ctx).await {
        Ok(f) => Some(f),
        Err(error) => {
            // Opened again after a pause; the client's own subscriptions reach it meanwhile.
            tracing::info!(route = %route.name(), %error, "no change notifications for a legacy client's GET stream yet");
            None
        }
    };
    let open = core.metrics.listen_stream(&route.name());
    let changes = Changes {
        feed,
        renewal,
        client,
        agreed: Vec::new(),
        renewed: false,
        idle: false,
        queue: VecDeque::new(),
    }
    .stream();
    let mine = futures_util::stream::unfold(mine, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(m) => return Some((m, rx)),
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    let events = futures_util::stream::select(changes.boxed(), mine.map(Some).boxed())
        // `None`: the session or its generation ended, and the stream with it.
        .take_while(|m| std::future::ready(m.is_some()))
        .filter_map(move |m| {
            let _open = &open;
            std::future::ready(m.map(|m| sse_event(&m)))
        });
    Ok(sse_response(Body::Stream(Box::pin(events))))
}

/// The list changes and log lines of a legacy client's GET stream: its upstream listen, opened
/// again whenever it ends having agreed something (a restarting backend) — the client would
/// otherwise hold a stream nothing reaches, or depend on reconnecting (which an SDK gives up
/// after a few tries) — followed by a `list_changed` of each kind agreed, as the lists may
/// have changed meanwhile. A listen that agreed nothing is not opened again: the stream stays
/// open for the client's subscriptions.
struct Changes {
    feed: Option<Listen>,
    renewal: Renewal,
    client: Arc<Client>,
    /// The `list_changed` methods the current listen agreed to (its acknowledgement's kinds).
    agreed: Vec<&'static str>,
    /// The current listen replaced one that ended: its acknowledgement is followed by the
    /// catch-up notifications.
    renewed: bool,
    /// Nothing to renew: only the client's subscriptions are heard.
    idle: bool,
    queue: VecDeque<Bytes>,
}

/// The list-change kinds a listen filter names, and the notification of each.
const CHANGE_KINDS: [(&str, &str); 3] = [
    ("toolsListChanged", "notifications/tools/list_changed"),
    ("promptsListChanged", "notifications/prompts/list_changed"),
    (
        "resourcesListChanged",
        "notifications/resources/list_changed",
    ),
];

impl Changes {
    /// Messages for the client; `None` once the session or its generation ended.
    fn stream(self) -> impl futures_util::Stream<Item = Option<Bytes>> + Send + 'static {
        futures_util::stream::unfold(Some(self), |st| async move {
            let mut st = st?;
            loop {
                if let Some(m) = st.queue.pop_front() {
                    return Some((Some(m), Some(st)));
                }
                if st.idle {
                    std::future::pending::<()>().await;
                }
                if let Some(feed) = st.feed.as_mut() {
                    match feed.next().await {
                        Some(Ok(m)) => {
                            if let Some(out) = st.message(&m) {
                                return Some((Some(out), Some(st)));
                            }
                        }
                        Some(Err(_)) | None => st.ended(),
                    }
                    continue;
                }
                match st.renewal.reopen().await {
                    Reopened::Listen(feed) => {
                        st.feed = Some(feed);
                        st.renewed = true;
                    }
                    Reopened::Refused => st.idle = true,
                    Reopened::Gone => return Some((None, None)),
                }
            }
        })
    }

    /// The current listen ended: renewed (after a pause) if it agreed something.
    fn ended(&mut self) {
        self.feed = None;
        if self.agreed.is_empty() {
            self.idle = true;
            return;
        }
        self.agreed.clear();
    }

    /// One upstream message as the client gets it, if it gets it.
    fn message(&mut self, m: &[u8]) -> Option<Bytes> {
        let (method, v) = plain(m)?;
        match method.as_str() {
            "notifications/subscriptions/acknowledged" => {
                let kinds = &v["params"]["notifications"];
                self.agreed = CHANGE_KINDS
                    .iter()
                    .filter(|(flag, _)| kinds[*flag] == json!(true))
                    .map(|(_, method)| *method)
                    .collect();
                if std::mem::take(&mut self.renewed) {
                    for method in &self.agreed {
                        let note = json!({"jsonrpc":"2.0","method":method});
                        self.queue.push_back(Bytes::from(note.to_string()));
                    }
                }
                None
            }
            "notifications/message" => {
                let min = self.client.level.load(Ordering::Relaxed);
                let rank = v["params"]["level"].as_str().and_then(log_rank);
                rank.filter(|r| min != 0 && *r + 1 >= min)
                    .map(|_| Bytes::from(v.to_string()))
            }
            _ => Some(Bytes::from(v.to_string())),
        }
    }
}

/// `resources/subscribe` / `resources/unsubscribe` (`subscribe` false) of `uri`.
#[allow(clippy::too_many_arguments)]
pub(super) async fn subscribe(
    core: &Core,
    generation: &relay::Generation,
    ctx: &mut RequestCtx,
    route: &Route,
    headers: &HeaderMap,
    owner: &Arc<Owner>,
    session: &SessionData,
    revocation: [u8; 32],
    id: &RequestId,
    params: &Value,
    subscribe: bool,
) -> Result<Response<Body>, GatewayError> {
    let uri = params["uri"]
        .as_str()
        .ok_or_else(|| GatewayError::InvalidParams("params.uri must be a string".into()))?;
    if !subscribe {
        if let Some(c) = core.clients.peek(&owner.key) {
            c.subscriptions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(uri);
        }
        return Ok(result(id, json!({})));
    }
    let client =
        core.clients
            .get(&owner.key, session.exp)
            .ok_or_else(|| GatewayError::Overloaded {
                backend: route.name().to_string(),
            })?;
    {
        let subs = client
            .subscriptions
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if subs.contains_key(uri) {
            return Ok(result(id, json!({})));
        }
        if subs.len() >= MAX_SUBSCRIPTIONS {
            return Err(GatewayError::InvalidParams(format!(
                "at most {MAX_SUBSCRIPTIONS} resource subscriptions per session"
            )));
        }
    }
    let renewal = Renewal::new(
        generation,
        ctx,
        route,
        headers,
        session,
        revocation,
        Want::Resource(uri.to_string()),
    );
    let feed = renewal.open(core, ctx).await?;
    let open = core.metrics.listen_stream(&route.name());
    // Inserted before the task can end, so an upstream that ends at once leaves no entry.
    let mut subs = client
        .subscriptions
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let task = tokio::spawn(relay_subscription(feed, open, client.clone(), renewal));
    subs.insert(uri.to_string(), Feed(task.abort_handle()));
    drop(subs);
    Ok(result(id, json!({})))
}

/// A listen's message stream, as `open_listen` gives it.
type Listen = futures_util::stream::BoxStream<'static, Result<Bytes, UpstreamError>>;

/// Opens the upstream listen of a subscription to `uri` and waits (within the route's timeout)
/// for the upstream to acknowledge the URI (an initialize-era backend: after its own
/// `resources/subscribe` in the client's session). `MethodNotFound` when the backend does not
/// offer updates of `uri`.
async fn open_subscription(
    core: &Core,
    ctx: &mut RequestCtx,
    route: &Route,
    headers: &HeaderMap,
    session: &SessionData,
    uri: &str,
) -> Result<Listen, GatewayError> {
    let body = listen_body(
        "portico-subscribe",
        json!({ "resourceSubscriptions": [uri] }),
        false,
        session,
    )?;
    let mut feed = open_listen(core, ctx, route, headers, body).await?;
    let first = tokio::time::timeout(route.timeout(), feed.next())
        .await
        .map_err(|_| GatewayError::BackendTimeout {
            backend: route.name().to_string(),
            timeout_ms: route.timeout().as_millis() as u64,
        })?;
    let first: Value = match first {
        Some(Ok(m)) => serde_json::from_slice(&m).unwrap_or_default(),
        Some(Err(e)) => {
            return Err(GatewayError::from_upstream(
                &route.name(),
                route.timeout().as_millis() as u64,
                &e,
            ));
        }
        None => Value::Null,
    };
    let accepted = first["method"] == "notifications/subscriptions/acknowledged"
        && first["params"]["notifications"]["resourceSubscriptions"]
            .as_array()
            .is_some_and(|a| a.iter().any(|u| u == uri));
    if !accepted {
        return Err(GatewayError::MethodNotFound(format!(
            "resources/subscribe: {} does not offer updates of {uri}",
            route.name()
        )));
    }
    Ok(feed)
}

/// The first pause before a listen held for a legacy client is opened again ([`Reconnect`]).
const RENEW_FIRST_PAUSE: Duration = Duration::from_millis(250);
/// The longest pause between two reopenings.
const RENEW_MAX_PAUSE: Duration = Duration::from_secs(30);

/// What a listen held for a legacy client needs to be opened again, outside any request: a
/// restarting backend ends it, and the client — which holds its GET stream and its
/// subscriptions until it leaves, unsubscribes or its session ends — would otherwise hear
/// nothing more, unaware.
struct Renewal {
    /// The config generation the client's entry belongs to (a reload starts the clients anew,
    /// so a listen held for one does not outlive its generation).
    generation: Weak<dyn Deref<Target = Core> + Send + Sync>,
    /// The opening request's context: the client's owner (its own upstream sessions) and
    /// identity, through the same per-backend step.
    ctx: RequestCtx,
    route: Route,
    headers: HeaderMap,
    session: SessionData,
    /// The session's name in the revocation set: a session ended on another replica stops
    /// renewing.
    revocation: [u8; 32],
    want: Want,
    reconnect: Reconnect,
}

/// What a listen held for a legacy client is for.
enum Want {
    /// Its GET stream: list changes of every kind, and log lines.
    Changes,
    /// A `resources/subscribe` of this URI.
    Resource(String),
}

/// How reopening a listen went.
enum Reopened {
    Listen(Listen),
    /// The backend no longer offers it.
    Refused,
    /// The session or its config generation ended.
    Gone,
}

impl Renewal {
    /// `ctx` as it will be for every reopening: this request's identity and headers, without
    /// its span (the request is over by then).
    fn new(
        generation: &relay::Generation,
        ctx: &RequestCtx,
        route: &Route,
        headers: &HeaderMap,
        session: &SessionData,
        revocation: [u8; 32],
        want: Want,
    ) -> Renewal {
        let mut background = ctx.clone();
        background.trace = None;
        Renewal {
            generation: Arc::downgrade(generation),
            ctx: background,
            route: route.clone(),
            headers: headers.clone(),
            session: session.clone(),
            revocation,
            want,
            reconnect: Reconnect::new(RENEW_FIRST_PAUSE, RENEW_MAX_PAUSE),
        }
    }

    /// Opens the listen through the route (a subscription: once acknowledged).
    async fn open(&self, core: &Core, ctx: &mut RequestCtx) -> Result<Listen, GatewayError> {
        match &self.want {
            Want::Changes => {
                let filter = json!({"toolsListChanged":true,"promptsListChanged":true,
                    "resourcesListChanged":true});
                let body = listen_body("portico-get-stream", filter, true, &self.session)?;
                open_listen(core, ctx, &self.route, &self.headers, body).await
            }
            Want::Resource(uri) => {
                open_subscription(core, ctx, &self.route, &self.headers, &self.session, uri).await
            }
        }
    }

    /// Opens the listen again after a pause ([`Reconnect`]), retrying while the session and
    /// its generation live.
    async fn reopen(&mut self) -> Reopened {
        loop {
            self.reconnect.wait().await;
            let Some(core) = self.generation.upgrade() else {
                return Reopened::Gone;
            };
            if self.session.exp <= crate::pool::unix_ms()
                || core.sessions.is_revoked(&self.revocation)
                || core.cache.session_revoked(&self.revocation).await
            {
                return Reopened::Gone;
            }
            let mut ctx = self.ctx.clone();
            ctx.start = std::time::Instant::now();
            // The credentials the client opened it with are checked again, as each of its
            // requests' are: a token that expired (or a key no longer accepted) ends it.
            if core.auth.enabled() {
                match core
                    .auth
                    .authenticate(&self.headers, &self.session.path)
                    .await
                {
                    Ok(principal) => ctx.principal = principal,
                    Err(error) => {
                        tracing::info!(route = %self.route.name(), %error, "a legacy client's listen not renewed: its credentials no longer hold");
                        return Reopened::Gone;
                    }
                }
            }
            match self.open(&core, &mut ctx).await {
                Ok(feed) => {
                    self.reconnect.opened();
                    return Reopened::Listen(feed);
                }
                Err(GatewayError::MethodNotFound(why)) => {
                    tracing::info!(route = %self.route.name(), %why, "a legacy client's listen not renewed");
                    return Reopened::Refused;
                }
                Err(error) => {
                    tracing::debug!(route = %self.route.name(), %error, "a legacy client's listen not renewed yet");
                }
            }
        }
    }
}

/// Relays a subscription's `notifications/resources/updated` to the client's channel, renewing
/// its upstream listen whenever it ends; the entry goes when the subscription cannot be
/// renewed (an unsubscribe or the session's end aborts the task instead).
async fn relay_subscription(
    mut feed: Listen,
    mut open: ListenStream,
    client: Arc<Client>,
    mut renewal: Renewal,
) {
    let Want::Resource(uri) = &renewal.want else {
        return;
    };
    let uri = uri.clone();
    loop {
        while let Some(Ok(m)) = feed.next().await {
            if let Some((method, v)) = plain(&m)
                && method == "notifications/resources/updated"
            {
                let _ = client.tx.send(Bytes::from(v.to_string()));
            }
        }
        drop(open);
        let Reopened::Listen(renewed) = renewal.reopen().await else {
            break;
        };
        let Some(core) = renewal.generation.upgrade() else {
            break;
        };
        (feed, open) = (renewed, core.metrics.listen_stream(&renewal.route.name()));
        // Nothing listened in between: the resource may have changed, so the client re-reads.
        let note = json!({"jsonrpc":"2.0","method":"notifications/resources/updated",
            "params":{"uri": uri}});
        let _ = client.tx.send(Bytes::from(note.to_string()));
    }
    // Not renewed: the subscription is gone, so a new `resources/subscribe` opens a new one.
    client
        .subscriptions
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&uri);
}

/// `logging/setLevel`: kept for the client, and set in its upstream sessions on
/// initialize-era backends.
pub(super) async fn set_level(
    core: &Core,
    route: &Route,
    owner: &Arc<Owner>,
    session: &SessionData,
    id: &RequestId,
    params: &Value,
) -> Result<Response<Body>, GatewayError> {
    let rank = params["level"]
        .as_str()
        .and_then(log_rank)
        .ok_or_else(|| GatewayError::InvalidParams("params.level is not a LoggingLevel".into()))?;
    let client =
        core.clients
            .get(&owner.key, session.exp)
            .ok_or_else(|| GatewayError::Overloaded {
                backend: route.name().to_string(),
            })?;
    client.level.store(rank + 1, Ordering::Relaxed);
    for b in backends(route) {
        if b.verdict() == Verdict::Legacy {
            bridge::set_client_level(&b, owner, rank).await;
        }
    }
    Ok(result(id, json!({})))
}

/// The client's log level as a request's `_meta` `logLevel`, if it set one.
pub(super) fn log_level(core: &Core, owner: &Owner) -> Option<&'static str> {
    let level = core.clients.peek(&owner.key)?.level.load(Ordering::Relaxed);
    protocol::LOG_LEVELS
        .get(usize::from(level.checked_sub(1)?))
        .copied()
}
