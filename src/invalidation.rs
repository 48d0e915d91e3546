//! Keeps the shared cache honest: per backend, one long-lived watcher that hears the backend's
//! change notifications and drops the matching cache entries at once (issue "shared list cache",
//! item 5; docs/protocol.md §3 and §8 item 7).
//!
//! Where the notifications come from depends on what the backend speaks:
//! - 2026-07-28 over HTTP or stdio: portico's own `subscriptions/listen` request, opted in to
//!   every list-changed kind; the backend streams `notifications/*/list_changed` on it.
//! - initialize era over HTTP: the standalone `GET` SSE stream of portico's upstream session
//!   (its messages are also published to the bridge's subscribers: aggregated listen streams).
//! - initialize era over stdio: the child's unsolicited messages (`StdioUpstream::subscribe`).
//!
//! A watcher starts lazily, the first time a result of that backend is actually stored — a
//! backend nobody caches needs no stream — and lives as long as the config generation that
//! started it (`Watchers` drops with `State`; a reload builds a fresh cache anyway). A broken
//! stream is reopened with exponential backoff, and because notifications may have been missed
//! while it was down, every entry of that backend is dropped when it comes back.
//!
//! Must not: build client responses, or hold a strong reference that keeps an old `State` alive
//! (watchers hold the backend and the cache, never the `State`).

use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, HeaderValue};
use serde_json::Value;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::{Backend, GetStream, Verdict};
use crate::bridge;
use crate::cache::Cache;
use crate::protocol::{LATEST_VERSION, header as h};
use crate::upstream::{MessageStream, Upstream};

/// First reconnect delay; doubles per failure up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A stream that stayed up this long resets the backoff.
const HEALTHY_AFTER: Duration = Duration::from_secs(10);
/// Listen/GET streams are reopened at least this often, so a silently dead connection (no
/// FIN, e.g. a vanished NAT entry) cannot blind the cache for longer.
const STREAM_LIFETIME: Duration = Duration::from_secs(15 * 60);
/// How long to wait for a verdict before trying again (the backend may be down at first use).
const VERDICT_RETRY: Duration = Duration::from_secs(1);

/// The body of portico's own listen request: every list-changed kind, no resource URIs (those
/// are per client; `resources/read` entries fall back to their TTL).
const LISTEN_BODY: &str = r#"{"jsonrpc":"2.0","id":"portico-cache-listen","method":"subscriptions/listen","params":{"notifications":{"toolsListChanged":true,"promptsListChanged":true,"resourcesListChanged":true},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#;

/// The watchers of one config generation.
pub struct Watchers {
    started: Mutex<HashSet<Arc<str>>>,
    /// Dropped with the `State`: every watcher sees its receiver close and ends.
    alive: watch::Sender<()>,
}

impl Default for Watchers {
    fn default() -> Self {
        Watchers {
            started: Mutex::new(HashSet::new()),
            alive: watch::channel(()).0,
        }
    }
}

impl Watchers {
    /// Starts the watcher of `backend` unless it runs already. Cheap when it does.
    pub fn ensure(&self, backend: &Arc<Backend>, cache: &Arc<Cache>) {
        if matches!(backend.upstream, Upstream::Builtin(_)) {
            return; // the demo's lists never change
        }
        {
            let mut started = match self.started.lock() {
                Ok(g) => g,
                Err(poisoned) => poisoned.into_inner(),
            };
            if !started.insert(backend.name.clone()) {
                return;
            }
        }
        let mut alive = self.alive.subscribe();
        let (backend, cache) = (backend.clone(), cache.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = run(&backend, &cache) => {}
                _ = alive.changed() => {}
            }
            tracing::debug!(backend = %backend.name, "cache watcher stopped");
        });
    }

    /// Stops every watcher now (shutdown), instead of when the `State` drops.
    pub fn stop(&self) {
        self.alive.send_modify(|_| {});
    }
}

/// What one stream attempt ended with.
enum Ended {
    /// The stream ran and closed (or failed after opening).
    Closed,
    /// Could not open it.
    Failed(String),
    /// The backend cannot tell us about changes: stop watching; TTLs alone apply.
    Unsupported(String),
}

async fn run(backend: &Arc<Backend>, cache: &Arc<Cache>) {
    let mut backoff = MIN_BACKOFF;
    let mut first = true;
    loop {
        let verdict = match bridge::ensure_verdict(backend).await {
            Ok(v) => v,
            Err(_) => {
                tokio::time::sleep(VERDICT_RETRY).await;
                continue;
            }
        };
        let opened = Instant::now();
        let ended = match (verdict, backend.transport()) {
            (Verdict::Legacy, Upstream::Stdio(s)) => stdio_notifications(backend, cache, s).await,
            (Verdict::Legacy, Upstream::Http(_)) => legacy_get(backend, cache, first).await,
            (_, Upstream::Builtin(_)) => return,
            _ => listen(backend, cache, first).await,
        };
        first = false;
        match ended {
            Ended::Unsupported(why) => {
                tracing::info!(backend = %backend.name, %why,
                    "no change notifications from this backend; cached lists expire by ttlMs only");
                return;
            }
            Ended::Failed(why) => {
                tracing::debug!(backend = %backend.name, %why, "cache watcher stream failed");
            }
            Ended::Closed => {}
        }
        if opened.elapsed() >= HEALTHY_AFTER {
            backoff = MIN_BACKOFF;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Applies one server message to the cache. Returns whether it was a change notification.
pub fn apply(cache: &Cache, backend: &str, message: &[u8]) -> bool {
    let Ok(v) = serde_json::from_slice::<Value>(message) else {
        return false;
    };
    let Some(method) = v.get("method").and_then(Value::as_str) else {
        return false;
    };
    match method {
        "notifications/tools/list_changed" => cache.invalidate(backend, "tools/list"),
        "notifications/prompts/list_changed" => cache.invalidate(backend, "prompts/list"),
        "notifications/resources/list_changed" => {
            cache.invalidate(backend, "resources/list");
            cache.invalidate(backend, "resources/templates/list");
        }
        "notifications/resources/updated" => {
            match v.pointer("/params/uri").and_then(Value::as_str) {
                Some(uri) => cache.invalidate_resource(backend, uri),
                None => cache.invalidate(backend, "resources/read"),
            }
        }
        _ => return false,
    }
    tracing::debug!(
        backend,
        method,
        "cache entries dropped on change notification"
    );
    true
}

/// Drains one stream of server messages into the cache until it ends; with `publish`, also
/// hands each message to the bridge's subscribers (a legacy session's GET stream).
async fn drain(
    backend: &Backend,
    cache: &Cache,
    mut messages: futures_util::stream::BoxStream<
        'static,
        Result<Bytes, crate::upstream::UpstreamError>,
    >,
    publish: bool,
) -> Ended {
    while let Some(item) = messages.next().await {
        match item {
            Ok(msg) => {
                apply(cache, &backend.name, &msg);
                if publish {
                    backend.bridge.publish(&msg);
                }
            }
            Err(e) => return Ended::Failed(e.to_string()),
        }
    }
    Ended::Closed
}

/// 2026-07-28 backends: portico's own `subscriptions/listen`.
async fn listen(backend: &Arc<Backend>, cache: &Arc<Cache>, first: bool) -> Ended {
    let deadline = Instant::now() + STREAM_LIFETIME;
    let body = Bytes::from_static(LISTEN_BODY.as_bytes());
    let reply = match backend.transport() {
        Upstream::Http(up) => {
            let [content_type, accept] = h::post_headers();
            let extra = [
                (
                    h::names::PROTOCOL_VERSION,
                    HeaderValue::from_static(LATEST_VERSION),
                ),
                (
                    h::names::METHOD,
                    HeaderValue::from_static("subscriptions/listen"),
                ),
                content_type,
                accept,
            ];
            let req = up.request(&HeaderMap::new(), &extra, body);
            up.call(req, deadline).await
        }
        Upstream::Stdio(s) => s.request(body, deadline).await,
        Upstream::Builtin(_) => return Ended::Unsupported("built-in".into()),
    };
    let reply = match reply {
        Ok(r) => r,
        Err(e) => return Ended::Failed(e.to_string()),
    };
    match reply.messages {
        MessageStream::Many(stream) => {
            if !first {
                // Reconnected: whatever changed while we were deaf is unknown.
                cache.purge_backend(&backend.name);
            }
            drain(backend, cache, stream, false).await
        }
        MessageStream::One(msg) => {
            // A single JSON answer: an error (listen unsupported) or an immediate close.
            if serde_json::from_slice::<Value>(&msg)
                .ok()
                .is_some_and(|v| v.get("error").is_some())
            {
                Ended::Unsupported(format!(
                    "subscriptions/listen refused: {}",
                    String::from_utf8_lossy(&msg[..msg.len().min(200)])
                ))
            } else {
                Ended::Closed
            }
        }
        MessageStream::Empty => Ended::Unsupported(format!(
            "subscriptions/listen answered HTTP {} with no body",
            reply.status
        )),
    }
}

/// Initialize-era HTTP backends: the session's standalone GET stream.
async fn legacy_get(backend: &Arc<Backend>, cache: &Arc<Cache>, first: bool) -> Ended {
    let Upstream::Http(up) = backend.transport() else {
        return Ended::Unsupported("not HTTP".into());
    };
    let deadline = Instant::now() + STREAM_LIFETIME;
    // portico's own session: the watcher is nobody's client.
    let own = bridge::Owner::portico();
    let session = match bridge::session(backend, &own, Instant::now() + backend.timeout).await {
        Ok(s) => s,
        Err(e) => return Ended::Failed(e.to_string()),
    };
    let req = bridge::stream_request(up, &session);
    let reply = match up.call(req, deadline).await {
        Ok(r) => r,
        Err(e) => return Ended::Failed(e.to_string()),
    };
    backend
        .bridge
        .learn_get_stream(GetStream::said(reply.status));
    match reply.messages {
        MessageStream::Many(stream) if reply.status.is_success() => {
            if !first {
                cache.purge_backend(&backend.name);
            }
            drain(backend, cache, stream, true).await
        }
        _ if reply.status == http::StatusCode::METHOD_NOT_ALLOWED => {
            // Learned for the bridge too (above): nothing advertises what this stream would carry.
            Ended::Unsupported("the legacy server offers no GET stream (405)".into())
        }
        _ => Ended::Failed(format!("GET stream answered HTTP {}", reply.status)),
    }
}

/// Initialize-era stdio backends: every unsolicited message of the child.
async fn stdio_notifications(
    backend: &Arc<Backend>,
    cache: &Arc<Cache>,
    s: &Arc<crate::upstream::stdio::StdioUpstream>,
) -> Ended {
    let mut rx = s.subscribe();
    // Per-client children (`isolation = "per_client"`) announce their changes through the
    // bridge; any of them may mean the backend's lists changed.
    let mut children = backend.bridge.subscribe();
    loop {
        let next = tokio::select! {
            m = rx.recv() => m,
            m = children.recv() => m,
        };
        match next {
            Ok(msg) => {
                apply(cache, &backend.name, &msg);
            }
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                // Missed some: anything may have changed.
                cache.purge_backend(&backend.name);
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return Ended::Closed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_body_is_valid_json_with_the_filter() {
        let v: Value = serde_json::from_str(LISTEN_BODY).expect("json");
        assert_eq!(v["method"], "subscriptions/listen");
        assert_eq!(v["params"]["notifications"]["toolsListChanged"], true);
        assert_eq!(
            v["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"],
            LATEST_VERSION
        );
    }
}
