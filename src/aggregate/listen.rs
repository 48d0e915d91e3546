//! `subscriptions/listen` on an aggregated endpoint (docs/protocol.md §8 item 13: unspecified, so this is
//! portico's reading).
//!
//! portico opens one upstream listen per member the caller may use — a `subscriptions/listen`
//! request through the per-backend step, made as the client, so each backend kind serves it
//! the way a single-backend URL does (forwarded to 2026-07-28 backends over HTTP or stdio;
//! bridged from the client's own session on initialize-era ones, `bridge::listen`) — merges
//! them, and gives the client one stream:
//! 1. `notifications/subscriptions/acknowledged` first, once every member acknowledged (or
//!    failed, and was left out): the list-changed flags the client asked for, and the
//!    `resourceSubscriptions` URIs a member accepted. Each URI goes only to the member that
//!    serves it (the endpoint's URI index, filled from the members' resource lists).
//! 2. `notifications/{tools,prompts,resources}/list_changed`, only the kinds the client opted
//!    in to, with `subscriptionId` rewritten to the client's listen id. Repeats of one kind
//!    within `debounce_ms` of the first (from one member or several) are folded into one.
//!    `notifications/resources/updated` of an accepted URI is relayed at once.
//! 3. When a member's stream that agreed something ends (a restarting backend: its part of
//!    the stream would go deaf unseen), or every upstream stream has ended, a
//!    `SubscriptionsListenResult` and the end; the client listens again. When
//!    the client goes away the response body is dropped, and with it every upstream stream
//!    (`portico_listen_streams` counts the stream meanwhile).

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use http::{HeaderMap, StatusCode};
use serde_json::{Map, Value, json};
use tokio::time::{Instant, sleep_until};

use super::{Req, part_headers, resource_owner};
use crate::bridge;
use crate::error::GatewayError;
use crate::protocol::{self, meta};
use crate::step;
use crate::upstream::{MessageStream, Reply, UpstreamError, http::async_stream};

/// Resource URIs one listen request may subscribe to.
const MAX_URIS: usize = 256;

/// The filter flags portico relays, and the notification each one opts in to.
const KINDS: [(&str, &str); 3] = [
    ("toolsListChanged", "notifications/tools/list_changed"),
    ("promptsListChanged", "notifications/prompts/list_changed"),
    (
        "resourcesListChanged",
        "notifications/resources/list_changed",
    ),
];

/// What a member's stream says that the client may hear.
enum Item {
    ListChanged(&'static str),
    /// A resource update, by URI.
    Updated(String),
    /// The member ended a listen that had agreed to tell something (a restart): what it
    /// agreed would no longer reach the client.
    Ended,
}

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
    let kinds = Value::Object(agreed.clone());
    // Each URI to the member that serves it.
    let mut uris: Vec<Vec<String>> = vec![Vec::new(); ep.members.len()];
    if let Some(asked) = filter["resourceSubscriptions"].as_array() {
        // Finding the owners (a walk of the lists for a URI the index does not know) is part
        // of opening the stream: within the endpoint's timeout, however many URIs are asked.
        let by = Instant::now() + ep.timeout;
        for uri in asked.iter().filter_map(Value::as_str).take(MAX_URIS) {
            if let Ok(Some(i)) = resource_owner(req, uri, by).await
                && !uris[i].iter().any(|u| u == uri)
            {
                uris[i].push(uri.to_string());
            }
        }
    }
    let mut sources = Vec::new();
    let mut accepted: Vec<String> = Vec::new();
    // A kind is acknowledged to the client when a member acknowledged it (advertised =
    // delivered): a member that cannot tell its list changed does not agree to tell it.
    let mut delivered: Vec<&str> = Vec::new();
    for (i, member_uris) in uris.iter().enumerate() {
        // A member the caller's team may not use is not listened to for it.
        if step::may_use(&req.ctx, &ep.members[i].backend).is_err() {
            continue;
        }
        match open(req, i, &kinds, member_uris).await {
            Ok((acked, flags, s)) => {
                accepted.extend(acked);
                delivered.extend(flags);
                sources.push(s);
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
    agreed.retain(|flag, _| delivered.contains(&flag.as_str()));
    if !accepted.is_empty() {
        agreed.insert("resourceSubscriptions".into(), json!(accepted));
    }
    let sub = id.clone();
    let note = move |method: &str, uri: Option<&str>| {
        let mut params = json!({"_meta":{meta::SUBSCRIPTION_ID: sub}});
        if let Some(u) = uri {
            params["uri"] = json!(u);
        }
        json!({"jsonrpc":"2.0","method":method,"params":params})
    };
    let ack = json!({"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged",
        "params":{"notifications":agreed,"_meta":{meta::SUBSCRIPTION_ID: id}}});
    let done = json!({"jsonrpc":"2.0","id":id,"result":{"resultType":"complete",
        "_meta":{meta::SUBSCRIPTION_ID: id}}});
    let debounce = ep.debounce;
    let open_stream = req.core.metrics.listen_stream(&ep.path);
    let stream = async_stream(move |tx| async move {
        let _open = open_stream;
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
                    Some(Item::ListChanged(method)) => {
                        if wanted.contains(&method) && !pending.iter().any(|p| p.0 == method) {
                            pending.push((method, Instant::now() + debounce));
                        }
                    }
                    Some(Item::Updated(uri)) => {
                        if !send(note("notifications/resources/updated", Some(&uri))).await {
                            return;
                        }
                    }
                    // The client's listen ends with any member's that agreed something, so
                    // the client listens again rather than hold a stream part of which is
                    // deaf; it ends, too, once every member's has ended.
                    Some(Item::Ended) | None => {
                        for (method, _) in pending.drain(..) {
                            if !send(note(method, None)).await {
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
                        if !send(note(method, None)).await {
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

/// Opens one member's listen (`kinds` plus the member's `uris`) through the per-backend step
/// and waits for its acknowledgement (within the member's `timeout_ms`): the URIs it accepted,
/// the list-changed flags it acknowledged, and the stream of what follows, ending when the
/// member ends its stream.
async fn open(
    req: &Req<'_>,
    member: usize,
    kinds: &Value,
    uris: &[String],
) -> Result<(Vec<String>, Vec<&'static str>, BoxStream<'static, Item>), GatewayError> {
    let b = &req.ep.members[member].backend;
    let mut filter = kinds.clone();
    if !uris.is_empty() {
        filter["resourceSubscriptions"] = json!(uris);
    }
    let mut params = Map::new();
    params.insert("notifications".into(), filter);
    let (body, env) = req.judged_part("subscriptions/listen", &params)?;
    let headers = part_headers(req.headers);
    let mut ctx = req.ctx.clone();
    let exposure = req.ep.exposure(member);
    let deadline = Instant::now() + bridge::LISTEN_LIFETIME;
    let reply = step::call(
        req.core, &mut ctx, b, exposure, &headers, &env, body, deadline,
    )
    .await?;
    let failed = |detail: String| GatewayError::BackendFailed {
        backend: b.name.to_string(),
        detail,
    };
    if reply.status.is_client_error() || reply.status.is_server_error() {
        return Err(failed(format!(
            "subscriptions/listen answered HTTP {}",
            reply.status
        )));
    }
    let mut messages = match reply.messages {
        MessageStream::Many(s) => s,
        MessageStream::One(m) => {
            return Err(failed(format!(
                "subscriptions/listen answered without a stream: {}",
                String::from_utf8_lossy(&m)
            )));
        }
        MessageStream::Empty => return Err(failed("subscriptions/listen: no answer".into())),
    };
    let first = tokio::time::timeout(b.timeout, messages.next())
        .await
        .map_err(|_| GatewayError::BackendTimeout {
            backend: b.name.to_string(),
            timeout_ms: b.cfg.timeout_ms,
        })?;
    let ack: Value = match first {
        Some(Ok(m)) => serde_json::from_slice(&m).unwrap_or_default(),
        Some(Err(e)) => return Err(GatewayError::from_upstream(&b.name, b.cfg.timeout_ms, &e)),
        None => Value::Null,
    };
    if ack["method"] != "notifications/subscriptions/acknowledged" {
        return Err(failed(format!(
            "subscriptions/listen was not acknowledged: {ack}"
        )));
    }
    let accepted: Vec<String> = ack["params"]["notifications"]["resourceSubscriptions"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .filter(|u| uris.iter().any(|w| w == u))
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    let flags: Vec<&'static str> = KINDS
        .iter()
        .map(|(flag, _)| *flag)
        .filter(|flag| ack["params"]["notifications"][*flag] == json!(true))
        .collect();
    let mine = accepted.clone();
    let agreed_something = !accepted.is_empty() || !flags.is_empty();
    // The stream ends with the member's result (or an error, or its end).
    let s = messages
        .take_while(|m| {
            let end = match m {
                Ok(m) => protocol::sniff_id(m).is_some(),
                Err(_) => true,
            };
            std::future::ready(!end)
        })
        .filter_map(move |m| std::future::ready(m.ok().and_then(|m| item(&m, &mine))))
        .chain(futures_util::stream::iter(
            agreed_something.then_some(Item::Ended),
        ));
    Ok((accepted, flags, s.boxed()))
}

/// What a member's message is to the client, if anything.
fn item(msg: &[u8], uris: &[String]) -> Option<Item> {
    let env = protocol::parse_envelope(msg).ok()?;
    if env.method == "notifications/resources/updated" {
        let v: Value = serde_json::from_slice(msg).ok()?;
        let uri = v["params"]["uri"].as_str()?;
        return uris
            .iter()
            .any(|u| u == uri)
            .then(|| Item::Updated(uri.to_string()));
    }
    KINDS
        .iter()
        .find(|(_, m)| *m == env.method)
        .map(|(_, m)| Item::ListChanged(m))
}
