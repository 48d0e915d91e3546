//! `subscriptions/listen` on an aggregated endpoint (docs/protocol.md §8 item 13: unspecified, so this is
//! portico's reading).
//!
//! portico opens one upstream stream per member that can deliver change notifications, merges
//! them, and gives the client one stream:
//! 1. `notifications/subscriptions/acknowledged` first, acknowledging the list-changed flags the
//!    client asked for. `resourceSubscriptions` is not acknowledged (URIs would have to be split
//!    between members; the discover answer does not advertise `resources.subscribe` either).
//! 2. `notifications/{tools,prompts,resources}/list_changed`, only the kinds the client opted
//!    in to, with `subscriptionId` rewritten to the client's listen id. Repeats of one kind
//!    within `debounce_ms` of the first (from one member or several) are folded into one.
//! 3. When every upstream stream has ended, a `SubscriptionsListenResult` and the end. When
//!    the client goes away the response body is dropped, and with it every upstream stream.
//!
//! Where the notifications come from, by member kind:
//! - modern HTTP (and the built-in): a `subscriptions/listen` request through the per-backend step,
//!   whose answer stream carries them;
//! - stdio (either era): the child's notification broadcast (`StdioUpstream::subscribe`); a
//!   modern child also gets the listen request, so it knows to send them;
//! - legacy HTTP: the standalone GET stream of portico's upstream session. The cache watcher
//!   (`invalidation`) owns that stream — servers may allow only one per session — and
//!   publishes its messages (`BridgeState::subscribe`); only `list_changed` is relayed, which
//!   says nothing about other clients' activity (log lines and the rest are not).

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use http::{HeaderMap, StatusCode};
use serde_json::{Map, Value, json};
use std::time::Duration;
use tokio::time::{Instant, sleep_until};

use super::{Req, part_headers};
use crate::backend::Verdict;
use crate::bridge;
use crate::error::GatewayError;
use crate::protocol::{self, meta};
use crate::step;
use crate::upstream::{MessageStream, Reply, Upstream, UpstreamError, http::async_stream};

/// How long an upstream listen stream may stay open: long-lived by design, but not unbounded.
const LISTEN_LIFETIME: Duration = Duration::from_secs(24 * 60 * 60);

/// The filter flags portico relays, and the notification each one opts in to.
const KINDS: [(&str, &str); 3] = [
    ("toolsListChanged", "notifications/tools/list_changed"),
    ("promptsListChanged", "notifications/prompts/list_changed"),
    (
        "resourcesListChanged",
        "notifications/resources/list_changed",
    ),
];

pub(super) async fn listen(req: &Req<'_>) -> Result<Reply, GatewayError> {
    let ep = req.ep.clone();
    let id = req.id();
    let filter = &req.client["params"]["notifications"];
    let mut agreed = Map::new();
    let mut wanted: Vec<&'static str> = Vec::new();
    for (flag, method) in KINDS {
        if filter[flag].as_bool() == Some(true) {
            agreed.insert(flag.into(), json!(true));
            wanted.push(method);
        }
    }
    let agreed = Value::Object(agreed);
    let mut sources = Vec::new();
    for i in 0..ep.members.len() {
        // A member the caller's team may not use is not listened to for it.
        if step::may_use(&req.ctx, &ep.members[i].backend).is_err() {
            continue;
        }
        match open(req, i, &agreed).await {
            Ok(Some(s)) => sources.push(s),
            Ok(None) => {
                tracing::debug!(endpoint = %ep.path, backend = %ep.namings[i].backend,
                    "member cannot deliver change notifications; not listened to")
            }
            Err(error) => {
                tracing::warn!(endpoint = %ep.path, backend = %ep.namings[i].backend, %error,
                    "could not open the member's listen stream");
                req.core
                    .metrics
                    .aggregate_omitted(&ep.path, &ep.namings[i].backend);
            }
        }
    }
    let sub = id.clone();
    let note = move |method: &str| json!({"jsonrpc":"2.0","method":method,"params":{"_meta":{meta::SUBSCRIPTION_ID: sub}}});
    let ack = json!({"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged",
        "params":{"notifications":agreed,"_meta":{meta::SUBSCRIPTION_ID: id}}});
    let done = json!({"jsonrpc":"2.0","id":id,"result":{"resultType":"complete",
        "_meta":{meta::SUBSCRIPTION_ID: id}}});
    let debounce = ep.debounce;
    let stream = async_stream(move |tx| async move {
        let send = |v: Value| {
            let tx = tx.clone();
            async move {
                tx.send(Ok::<Bytes, UpstreamError>(Bytes::from(v.to_string())))
                    .await
                    .is_ok()
            }
        };
        if !send(ack).await {
            return;
        }
        let mut merged = futures_util::stream::select_all(sources);
        // Kinds seen and waiting for their window to close, with when it closes.
        let mut pending: Vec<(&'static str, Instant)> = Vec::new();
        loop {
            let due = pending.iter().map(|p| p.1).min();
            tokio::select! {
                item = merged.next() => match item {
                    Some(method) => {
                        if wanted.contains(&method) && !pending.iter().any(|p| p.0 == method) {
                            pending.push((method, Instant::now() + debounce));
                        }
                    }
                    None => {
                        for (method, _) in pending.drain(..) {
                            if !send(note(method)).await {
                                return;
                            }
                        }
                        let _ = send(done).await;
                        return;
                    }
                },
                _ = sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                    let now = Instant::now();
                    let (ready, later): (Vec<_>, Vec<_>) = pending.into_iter().partition(|p| p.1 <= now);
                    pending = later;
                    for (method, _) in ready {
                        if !send(note(method)).await {
                            return;
                        }
                    }
                }
            }
        }
    });
    Ok(Reply {
        status: StatusCode::OK,
        headers: HeaderMap::new(),
        messages: MessageStream::Many(stream.boxed()),
    })
}

/// Opens one member's notification source: a stream of list-changed method names, ending when
/// the member ends its stream. `None` when the member has no way to deliver them.
async fn open(
    req: &Req<'_>,
    member: usize,
    agreed: &Value,
) -> Result<Option<BoxStream<'static, &'static str>>, GatewayError> {
    let b = &req.ep.members[member].backend;
    let verdict = bridge::ensure_verdict(b).await?;
    // A legacy stdio backend's per-client children, and every session of an HTTP+SSE backend
    // (one per client), announce their changes through the bridge (`bridge::session`); the
    // fact that a list changed is all that is taken from them.
    let sessions = match b.transport() {
        Upstream::Stdio(_) if verdict == Verdict::Legacy => Some(b.bridge.subscribe()),
        _ => None,
    };
    let broadcast = match b.transport() {
        Upstream::Stdio(s) => Some(s.subscribe()),
        Upstream::Http(_) if verdict == Verdict::Legacy => {
            // Subscribe first, then make sure the GET stream is (being) opened.
            let rx = b.bridge.subscribe();
            req.core.watchers.ensure(b, &req.core.cache);
            Some(rx)
        }
        _ => None,
    };
    let mut listened: Option<BoxStream<'static, &'static str>> = None;
    if verdict == Verdict::Modern {
        let mut params = Map::new();
        params.insert("notifications".into(), agreed.clone());
        let body = req.part_body("subscriptions/listen", params);
        let deadline = Instant::now() + LISTEN_LIFETIME;
        if let Upstream::Stdio(s) = b.transport() {
            // On stdio the acknowledgement and the notifications are not tied to the request
            // (they arrive through the broadcast), so the call would not return before the
            // stream ends: it is driven inside the stream instead, and only keeps the child's
            // subscription open. Not cacheable; admission was checked when the stream opened.
            let s = s.clone();
            let hold = futures_util::stream::once(async move {
                if let Ok(Reply {
                    messages: MessageStream::Many(mut m),
                    ..
                }) = s.call(body, deadline).await
                {
                    while m.next().await.is_some() {}
                }
            })
            .filter_map(|()| std::future::ready(None::<&'static str>));
            listened = Some(hold.boxed());
        } else {
            let env = protocol::parse_envelope(&body).map_err(crate::frontend::envelope_error)?;
            let headers = part_headers(req.headers);
            let mut ctx = req.ctx.clone();
            let exposure = req.ep.exposure(member);
            let reply = step::call(
                req.core, &mut ctx, b, exposure, &headers, &env, body, deadline,
            )
            .await?;
            if reply.status.is_client_error() || reply.status.is_server_error() {
                return Err(GatewayError::BackendFailed {
                    backend: b.name.to_string(),
                    detail: format!("subscriptions/listen answered HTTP {}", reply.status),
                });
            }
            let messages = match reply.messages {
                MessageStream::Many(s) => s,
                MessageStream::One(m) => futures_util::stream::iter(vec![Ok(m)]).boxed(),
                MessageStream::Empty => futures_util::stream::empty().boxed(),
            };
            // The stream ends with the member's result (or an error, or its end).
            let s = messages
                .take_while(|m| {
                    let end = match m {
                        Ok(m) => protocol::sniff_id(m).is_some(),
                        Err(_) => true,
                    };
                    std::future::ready(!end)
                })
                .filter_map(|m| std::future::ready(m.ok().and_then(|m| list_changed(&m))));
            listened = Some(s.boxed());
        }
    }
    match (broadcast, listened) {
        (Some(rx), listened) => {
            let mut notes = changes_of(rx);
            if let Some(more) = sessions {
                notes = futures_util::stream::select(notes, changes_of(more)).boxed();
            }
            // Keep the modern child's listen request open alongside; its answer stream carries
            // nothing on stdio (notifications come through the broadcast).
            let s = match listened {
                Some(l) => futures_util::stream::select(notes.boxed(), l).boxed(),
                None => notes.boxed(),
            };
            Ok(Some(s))
        }
        (None, Some(l)) => Ok(Some(l)),
        (None, None) => Ok(None),
    }
}

/// The list-changed notifications among a broadcast's messages.
fn changes_of(
    rx: tokio::sync::broadcast::Receiver<bytes::Bytes>,
) -> BoxStream<'static, &'static str> {
    futures_util::stream::unfold(rx, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(m) => return Some((m, rx)),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
    .filter_map(|m| std::future::ready(list_changed(&m)))
    .boxed()
}

/// The list-changed method a message is, if it is one.
fn list_changed(msg: &[u8]) -> Option<&'static str> {
    let env = protocol::parse_envelope(msg).ok()?;
    KINDS
        .iter()
        .find(|(_, m)| *m == env.method)
        .map(|(_, m)| *m)
}
