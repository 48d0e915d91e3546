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
//!   upstream listen with it — and when that listen ends having agreed to tell something, so
//!   that the client reconnects to a fresh one rather than hold a stream nothing reaches.
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
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
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
pub(super) async fn get_stream(
    core: &Core,
    ctx: &mut RequestCtx,
    route: &Route,
    headers: &HeaderMap,
    owner: &Arc<Owner>,
    session: &SessionData,
) -> Result<Response<Body>, GatewayError> {
    let client =
        core.clients
            .get(&owner.key, session.exp)
            .ok_or_else(|| GatewayError::Overloaded {
                backend: route.name().to_string(),
            })?;
    let mine = client.tx.subscribe();
    let filter =
        json!({"toolsListChanged":true,"promptsListChanged":true,"resourcesListChanged":true});
    let body = listen_body("portico-get-stream", filter, true, session)?;
    let feed = match open_listen(core, ctx, route, headers, body).await {
        Ok(f) => f,
        Err(error) => {
            // The client's own subscriptions still reach it.
            tracing::info!(route = %route.name(), %error, "no change notifications for a legacy client's GET stream");
            futures_util::stream::pending().boxed()
        }
    };
    let open = core.metrics.listen_stream(&route.name());
    // Whether the upstream agreed to tell anything: then the end of its listen ends the
    // client's stream, and the client's reconnection (both SDKs reconnect a GET stream that
    // ends) opens a new one; a listen that agreed nothing ends at once, and ending the
    // client's stream with it would only make the client reconnect in a loop.
    let heard = Arc::new(AtomicBool::new(false));
    let agreed = heard.clone();
    let feed = feed.filter_map(move |m| {
        let out = match m {
            Ok(m) => match plain(&m) {
                Some((method, v)) => match method.as_str() {
                    "notifications/subscriptions/acknowledged" => {
                        let any = v["params"]["notifications"]
                            .as_object()
                            .is_some_and(|n| !n.is_empty());
                        agreed.store(any, Ordering::Relaxed);
                        None
                    }
                    "notifications/message" => {
                        let min = client.level.load(Ordering::Relaxed);
                        let rank = v["params"]["level"].as_str().and_then(log_rank);
                        rank.filter(|r| min != 0 && *r + 1 >= min)
                            .map(|_| Bytes::from(v.to_string()))
                    }
                    _ => Some(Bytes::from(v.to_string())),
                },
                None => None,
            },
            Err(_) => None,
        };
        std::future::ready(out.map(Merged::Message))
    });
    let feed = feed.chain(futures_util::stream::once(async { Merged::Ended }));
    let mine = futures_util::stream::unfold(mine, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(m) => return Some((m, rx)),
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    let events = futures_util::stream::select(feed.boxed(), mine.map(Merged::Message).boxed())
        .take_while(move |item| {
            std::future::ready(!matches!(item, Merged::Ended) || !heard.load(Ordering::Relaxed))
        })
        .filter_map(move |item| {
            let _open = &open;
            std::future::ready(match item {
                Merged::Message(m) => Some(sse_event(&m)),
                Merged::Ended => None,
            })
        });
    Ok(sse_response(Body::Stream(Box::pin(events))))
}

/// What a legacy client's GET stream merges: messages, and the end of the upstream listen.
enum Merged {
    Message(Bytes),
    Ended,
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
    let feed = open_subscription(core, ctx, route, headers, session, uri).await?;
    let open = core.metrics.listen_stream(&route.name());
    // What renews the subscription when its upstream listen ends: this request's identity and
    // headers, without its span (the request is over by then).
    let mut background = ctx.clone();
    background.trace = None;
    let renewal = Renewal {
        generation: Arc::downgrade(generation),
        ctx: background,
        route: route.clone(),
        headers: headers.clone(),
        session: session.clone(),
        revocation,
        uri: uri.to_string(),
    };
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

/// The first pause before a subscription whose upstream listen ended is renewed; it doubles
/// while renewing fails (or the renewed listen ends again within [`RENEW_MAX_PAUSE`]).
const RENEW_FIRST_PAUSE: Duration = Duration::from_millis(250);
/// The longest pause between two renewals of one subscription.
const RENEW_MAX_PAUSE: Duration = Duration::from_secs(30);

/// What a subscription needs to open its upstream listen again, outside any request: a
/// restarting backend ends the listen, and the client — which holds
/// its subscription until it unsubscribes or its session ends — would otherwise hear nothing
/// more of the resource, unaware.
struct Renewal {
    /// The config generation the client's entry belongs to (a reload starts the clients anew,
    /// so a subscription does not outlive its generation).
    generation: Weak<dyn Deref<Target = Core> + Send + Sync>,
    /// The subscribing request's context: the client's owner (its own upstream sessions) and
    /// identity, through the same per-backend step.
    ctx: RequestCtx,
    route: Route,
    headers: HeaderMap,
    session: SessionData,
    /// The session's name in the revocation set: a session ended on another replica stops
    /// renewing.
    revocation: [u8; 32],
    uri: String,
}

impl Renewal {
    /// Opens the listen again after a pause, retrying with a doubling pause while the session
    /// lives; `None` when the session or its generation ended, or the backend no longer offers
    /// updates of the URI.
    async fn reopen(&self, pause: &mut Duration) -> Option<(Listen, ListenStream)> {
        loop {
            tokio::time::sleep(*pause).await;
            *pause = (*pause * 2).min(RENEW_MAX_PAUSE);
            let core = self.generation.upgrade()?;
            if self.session.exp <= crate::pool::unix_ms()
                || core.sessions.is_revoked(&self.revocation)
                || core.cache.session_revoked(&self.revocation).await
            {
                return None;
            }
            let mut ctx = self.ctx.clone();
            ctx.start = std::time::Instant::now();
            let opened = open_subscription(
                &core,
                &mut ctx,
                &self.route,
                &self.headers,
                &self.session,
                &self.uri,
            )
            .await;
            match opened {
                Ok(feed) => return Some((feed, core.metrics.listen_stream(&self.route.name()))),
                Err(GatewayError::MethodNotFound(why)) => {
                    tracing::info!(route = %self.route.name(), %why, "a legacy client's subscription ended: not renewed");
                    return None;
                }
                Err(error) => {
                    tracing::debug!(route = %self.route.name(), %error, "a legacy client's subscription not renewed yet");
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
    renewal: Renewal,
) {
    let mut pause = RENEW_FIRST_PAUSE;
    loop {
        let since = Instant::now();
        while let Some(Ok(m)) = feed.next().await {
            if let Some((method, v)) = plain(&m)
                && method == "notifications/resources/updated"
            {
                let _ = client.tx.send(Bytes::from(v.to_string()));
            }
        }
        drop(open);
        // A listen that lived long was a healthy one: renew it at once; one that keeps ending
        // quickly is renewed ever more slowly.
        if since.elapsed() > RENEW_MAX_PAUSE {
            pause = RENEW_FIRST_PAUSE;
        }
        let Some((renewed, gauge)) = renewal.reopen(&mut pause).await else {
            break;
        };
        (feed, open) = (renewed, gauge);
        // Nothing listened in between: the resource may have changed, so the client re-reads.
        let note = json!({"jsonrpc":"2.0","method":"notifications/resources/updated",
            "params":{"uri": renewal.uri}});
        let _ = client.tx.send(Bytes::from(note.to_string()));
    }
    // Not renewed: the subscription is gone, so a new `resources/subscribe` opens a new one.
    client
        .subscriptions
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&renewal.uri);
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
