//! The legacy bridge: makes initialize-era backends (2025-03-26 … 2025-11-25) look like
//! 2026-07-28 servers.
//!
//! - **Probe, don't guess** (docs/protocol.md §5): the first request to an `auto` backend sends
//!   `server/discover`; `classify_http` / `classify_stdio` read the answer. The verdict is kept
//!   per backend and re-probed when a later answer contradicts it. In particular a stdio
//!   server that starts slower than `probe_timeout_ms` is probed as legacy although it may be
//!   modern; its refusal of the bridge's `initialize` (`initialize_refusal_is_modern`) re-probes
//!   it, and the request that found out is served on the modern path (`Bridged::Modern`). The
//!   probe clock is not moved to "child ready" instead: the child is spawned by the probe
//!   itself (so the clock already starts at spawn), and a modern server writes nothing before
//!   its answer, so there is no earlier readiness signal to wait for.
//! - **An upstream session per client** (`owner`, `session`): never shared across
//!   authorization contexts or legacy-client sessions, opened with the client's own
//!   capabilities and clientInfo, pooled per backend (`max_upstream_sessions`, LRU) and closed
//!   when idle. Requests of one owner share its session, so JSON-RPC ids and progress tokens
//!   are still rewritten to gateway-unique ones (legacy ids must be unique within a session;
//!   clients all start at 1). A lost session (HTTP 404 to a request carrying the session id,
//!   not answering it) is re-initialized and the request retried once; no error code or
//!   message text ever causes a resend ([`session_lost`]).
//! - **stdio**: the session is the child process — one per owner under `isolation =
//!   "per_client"`, one for all under `"shared"`. Every bridged call is pinned to the child
//!   generation the session was initialized on; a call that meets a restarted child is refused
//!   by the transport before it is written (`UpstreamError::Restarted`), so portico
//!   re-initializes and retries it once. Server-initiated requests never reach the bridge there:
//!   the stdio transport answers them itself (`ping` → `{}`, the rest → `-32601`, logged).
//! - **2024-11-05 HTTP+SSE** (`transport = "sse"`, or found by the probe's fallback): the
//!   transport is the stdio actor over an SSE link (`Backend::transport`), one event stream per
//!   owner, so everything said of per-client stdio children holds; a stream that ends is a
//!   restart (new generation, re-initialized, the request resent only if it was never written).
//! - **Translation both ways**: reserved 2026 `_meta` keys are stripped going up; results coming
//!   back get `resultType`, `ttlMs`/`cacheScope` (from config, default private), serverInfo, and
//!   `-32002` becomes `-32602`.
//! - **Cancellation**: a legacy server does not treat a closed stream as cancellation, so when
//!   the client goes away (or cancels: the step drops the call) portico sends
//!   `notifications/cancelled` with the *upstream* request id, in the client's own session. A
//!   client's own `notifications/cancelled` is never forwarded: its id is in the client's id
//!   space, which the session never saw.
//! - **Server-initiated requests** during a call (sampling, elicitation, roots; `input`): a
//!   request arrives on the stream of one call ([`translate`]'s `Mapping`: the client's id),
//!   inside one owner's session (`Owner`, held by the call's `CancelGuard` slot), so the client
//!   that owns the call is always known. An initialize-era client gets it relayed; a 2026-07-28
//!   client gets `input_required` and the call is parked until its retry or `input_hold_ms`
//!   (docs/protocol.md §8 item 15). `ping` is answered. On stdio the transport answers them
//!   itself (see above).
//!
//! Files: `probe` (era classification, the probe), `owner` (whose session a request uses),
//! `session` (the per-owner sessions and their handshake), `translate` (message translation
//! and cancellation), `input` (server requests during a call); this file holds the request
//! entry points ([`call`], `discover`, `send_raw`).

mod input;
mod listen;
mod owner;
mod probe;
mod session;
mod translate;

pub use input::forget as forget_input;
pub use input::{FORWARDED, forwarded_headers, replica_peer};
pub use input::{InputSide, answer as answer_input, capability_for, expect as expect_input};
pub use listen::{LISTEN_LIFETIME, set_client_level, to_client};
pub use owner::{Group, Owner, digest};

pub use probe::{
    Classification, classify_http, classify_stdio, ensure_verdict, initialize_refusal_is_modern,
    reprobe,
};
pub use session::{close, close_owner, open, session, stream_request};

use session::{forget_session, on_session_error, on_shared_child, session_or_modern, stdio_of};
use translate::{CancelGuard, Mapping, scope_str, to_legacy, translate};
pub use translate::{fuzz_both_ways as fuzz_translate, upward_agrees};

use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::time::Instant;

use crate::backend::{Backend, LegacySession};
use crate::error::GatewayError;
use crate::protocol::{Envelope, RequestId, SUPPORTED_VERSIONS, header as h, meta};
use crate::upstream::stdio::CallOptions;
use crate::upstream::{AnswerCheck, MessageStream, Reply, Upstream, UpstreamError};

/// Headers every message portico originates carries, with room for `more` (sized up front: a
/// bridged call adds the version, the session, trace context and the team's, and growing the
/// list cost a reallocation on every call, callgrind).
fn base_headers(more: usize) -> Vec<(HeaderName, HeaderValue)> {
    let mut headers = Vec::with_capacity(2 + more);
    headers.extend(crate::protocol::header::post_headers());
    headers
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
                let done = crate::protocol::is_response(&m);
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

/// What the bridge did with a request.
pub enum Bridged {
    /// Translated and answered.
    Answer(Reply),
    /// The backend turned out to be a 2026-07-28 server (re-probed): nothing was sent for this
    /// request; the caller serves it on the modern path.
    Modern,
}

// === Requests ===

/// Answers `server/discover` for a legacy backend from its `InitializeResult`.
async fn discover(
    b: &Arc<Backend>,
    owner: &Owner,
    id: &RequestId,
    team: &[(HeaderName, HeaderValue)],
    deadline: Instant,
) -> Result<Bridged, GatewayError> {
    let s = match session_or_modern(b, owner, team, deadline).await {
        Ok((_, s)) => s,
        Err(e) => return on_session_error(b, e).await,
    };
    listen::learn_channel(b, &s).await;
    let mut result = json!({
        "resultType": "complete",
        "supportedVersions": SUPPORTED_VERSIONS,
        "capabilities": delivered(b, &s),
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

/// The legacy server's capabilities as far as portico delivers them to a 2026-07-28 client
/// (issue #20 item 4): list changes, resource subscriptions and completions are bridged
/// (`listen`) — list changes and resource updates only where the session has a channel for
/// them (`listen::has_channel`: not from an HTTP server that refused the GET stream); `logging` only where log lines can be told apart per client — not on a stdio
/// child shared by every client, whose unasked lines are everybody's (docs/protocol.md §8 item
/// 17); the in-core experimental `tasks` of 2025-11-25 is not the 2026 tasks extension and is
/// not bridged.
fn delivered(b: &Backend, s: &LegacySession) -> serde_json::Value {
    let mut caps = s.init.get("capabilities").cloned().unwrap_or(json!({}));
    if let Some(c) = caps.as_object_mut() {
        c.remove("tasks");
        if on_shared_child(b, s.child.as_ref()) {
            c.remove("logging");
        }
        if !listen::has_channel(b) {
            for (kind, unasked) in [
                ("tools", "listChanged"),
                ("prompts", "listChanged"),
                ("resources", "listChanged"),
                ("resources", "subscribe"),
            ] {
                if let Some(k) = c.get_mut(kind).and_then(Value::as_object_mut) {
                    k.remove(unasked);
                }
            }
        }
    }
    caps
}

/// Whether the backend said that the upstream session `s` has ended, so the request was not
/// handled and may be resent after a new `initialize` (docs/protocol.md §5). Only one signal
/// counts: HTTP 404 to a request that carried the session's `Mcp-Session-Id`, and the answer is
/// not a response to that request (the SDKs answer an unknown session with `id: null`; a server
/// that answered *our* id handled the request in the session, e.g. a `-32601` mapped to 404).
/// Never an error code or the words of an error message: a request that reached the server is
/// never sent twice. Over stdio the session ends only with the child (`UpstreamError::Restarted`).
fn session_lost(
    b: &Backend,
    s: &LegacySession,
    upstream_id: u64,
    status: StatusCode,
    messages: &MessageStream,
) -> bool {
    if !matches!(b.transport(), Upstream::Http(_))
        || s.id.is_none()
        || status != StatusCode::NOT_FOUND
    {
        return false;
    }
    let answers_us = |m: &Bytes| {
        serde_json::from_slice::<serde_json::Value>(m)
            .is_ok_and(|v| v.get("id") == Some(&json!(upstream_id)))
    };
    match messages {
        MessageStream::One(m) => !answers_us(m),
        // A streamed answer is never a session refusal.
        MessageStream::Many(_) => false,
        MessageStream::Empty => true,
    }
}

/// Sends one 2026 request to a legacy backend, in `owner`'s upstream session, and returns
/// the translated answer, or `Bridged::Modern` when the backend's `initialize` showed it is
/// not legacy after all.
///
/// `env` is `body` read (`protocol::parse_envelope`): its method and id, and where the
/// members the translation rewrites lie.
pub async fn call(
    b: &Arc<Backend>,
    owner: &Owner,
    env: &Envelope,
    body: &Bytes,
    client_headers: &HeaderMap,
    team: &[(HeaderName, HeaderValue)],
    deadline: Instant,
) -> Result<Bridged, GatewayError> {
    let (method, client_id) = (env.method.as_str(), env.id.as_ref());
    if method == "server/discover"
        && let Some(id) = client_id
    {
        return Box::pin(discover(b, owner, id, team, deadline)).await;
    }
    if method == "notifications/cancelled" {
        // Its requestId is in the client's id space; the step cancels the client's own call
        // by dropping it, which sends the upstream id (`CancelGuard`).
        return Ok(Bridged::Answer(Reply::accepted()));
    }
    if method == "subscriptions/listen"
        && let Some(id) = client_id
    {
        return Box::pin(listen::listen(b, owner, id, body, team, deadline)).await;
    }
    if let Some(id) = client_id
        && input::is_retry(method, body)
    {
        // A 2026-07-28 client answering the questions of a call portico parked. Boxed, like
        // the other rare paths above: inline, their states set the size of every call's future.
        let resumed = input::resume(b, owner.input.as_ref(), owner.scope, method, id, body);
        return match Box::pin(resumed).await? {
            Ok(reply) => Ok(Bridged::Answer(reply)),
            Err(input::Elsewhere(replica)) => Box::pin(input::forward(
                b,
                &replica,
                method,
                body,
                client_headers,
                deadline,
            ))
            .await
            .map(Bridged::Answer),
        };
    }
    // The request's own `logLevel` (docs/protocol.md §1): the session is set to log at least
    // that much, and the call's stream carries its lines at or above it.
    let upward = translate::Upward::read(body, env.spans.as_ref());
    let log_level = match &upward {
        Some(up) => up.log_level,
        None => translate::log_level(body),
    };
    for attempt in 0..2 {
        let (slot, s) = match session_or_modern(b, owner, team, deadline).await {
            Ok(held) => held,
            Err(e) => return on_session_error(b, e).await,
        };
        if let Some(level) = log_level {
            Box::pin(listen::set_level(b, &s, level, false)).await;
        }
        let upstream_id = b.bridge.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (up_body, token) = match &upward {
            Some(up) => up.write(upstream_id),
            None => to_legacy(body, upstream_id)?,
        };
        let Some(client_id) = client_id else {
            // A notification: pass it on.
            send_raw(b, &s, up_body, client_headers, team, deadline, How::OWN)
                .await
                .map_err(|e| upstream_err(b, &e))?;
            return Ok(Bridged::Answer(Reply::accepted()));
        };
        let mapping = Mapping {
            client_id: client_id.clone(),
            upstream_id,
            token,
            method: method.to_string(),
            ttl_ms: b.cfg.default_ttl_ms,
            scope: scope_str(b.cfg.default_cache_scope),
            server_info: s.server_info.clone(),
            log_level,
        };
        // Armed from here: if this future or the answer stream is dropped before the answer,
        // the server hears `notifications/cancelled`. Over stdio the transport does that itself
        // (with the id it wrote on the pipe), so the guard stays disarmed there.
        let mut guard = CancelGuard {
            backend: b.clone(),
            session: s.clone(),
            upstream_id,
            armed: !matches!(b.transport(), Upstream::Stdio(_)),
            _slot: slot.clone(),
        };
        // A JSON answer is checked where it is translated, in the same reading (below).
        let how = How {
            check: AnswerCheck::Caller,
            logs: log_level.is_some(),
        };
        let reply = match send_raw(b, &s, up_body, client_headers, team, deadline, how).await {
            Ok(reply) => reply,
            // The stdio child restarted before the request was written: the new child has not
            // been through `initialize`. Nothing reached the server, so a retry is safe.
            Err(UpstreamError::Restarted) if attempt == 0 => {
                guard.armed = false;
                tracing::info!(backend = %b.name, "stdio server restarted; re-initializing");
                forget_session(&slot, &s);
                continue;
            }
            Err(e) => return Err(upstream_err(b, &e)),
        };
        if attempt == 0 && session_lost(b, &s, upstream_id, reply.status, &reply.messages) {
            guard.armed = false;
            tracing::info!(backend = %b.name, "legacy session lost; re-initializing");
            forget_session(&slot, &s);
            continue;
        }
        // Built only for an answer that streams (`translate`): most calls answer in one message.
        let io = || input::FlowIo {
            // A read goes through the cache, which reads answers whole: nothing can be relayed
            // mid-stream there (a parked read answers `input_required` as a whole answer).
            side: owner
                .input
                .clone()
                .filter(|s| method != "resources/read" || !matches!(s, InputSide::Relay)),
            owner: owner.key,
            scope: owner.scope,
            caps: owner.capabilities_text().into(),
            hold: std::time::Duration::from_millis(b.cfg.input_hold_ms),
            deadline,
            team: team.to_vec(),
            method: method.to_string(),
            body: body.clone(),
        };
        if let (true, MessageStream::One(msg)) = (reply.status.is_success(), &reply.messages) {
            guard.armed = false;
            let out = translate::legacy_answer(msg, &mapping)
                .map_err(|what| upstream_err(b, &UpstreamError::Protocol(what)))?;
            return Ok(Bridged::Answer(translate::answered(
                reply.status,
                out,
                &mapping,
                b,
            )));
        }
        return Ok(Bridged::Answer(translate(reply, mapping, guard, io)));
    }
    Err(GatewayError::BackendFailed {
        backend: b.name.to_string(),
        detail: "legacy session could not be re-established".into(),
    })
}

/// How [`send_raw`] sends a message.
#[derive(Clone, Copy)]
struct How {
    /// Who checks a single JSON answer.
    check: AnswerCheck,
    /// The client asked for log lines (`logLevel`, stripped going up): a stdio child, which
    /// cannot see that in the line, is told (on a child of the owner's own only).
    logs: bool,
}

impl How {
    /// portico's own messages, and a client's notifications and answers.
    const OWN: How = How {
        check: AnswerCheck::Upstream,
        logs: false,
    };
}

/// Sends an already-translated message within the session, with the caller's team
/// credentials (`team_headers`) over HTTP. Over stdio a request is pinned to the child
/// generation the session was initialized on (`UpstreamError::Restarted` otherwise).
async fn send_raw(
    b: &Backend,
    s: &LegacySession,
    body: Bytes,
    client_headers: &HeaderMap,
    team: &[(HeaderName, HeaderValue)],
    deadline: Instant,
    how: How,
) -> Result<Reply, UpstreamError> {
    match b.transport() {
        Upstream::Http(up) => {
            let mut extra = base_headers(2 + TRACE_CONTEXT.len() + team.len());
            extra.push((h::names::PROTOCOL_VERSION, s.version.clone()));
            if let Some(sid) = &s.id {
                extra.push((h::names::SESSION_ID, sid.clone()));
            }
            // Only trace context travels with bridged requests; the 2026 mirror headers would
            // contradict the legacy session.
            // Names, not strings: a lookup by string parses the name first (callgrind: ~300
            // instructions each, on every bridged request).
            const TRACE_CONTEXT: [HeaderName; 3] = [
                crate::telemetry::TRACEPARENT,
                HeaderName::from_static("tracestate"),
                HeaderName::from_static("baggage"),
            ];
            for name in &TRACE_CONTEXT {
                if let Some(v) = client_headers.get(name) {
                    extra.push((name.clone(), v.clone()));
                }
            }
            extra.extend_from_slice(team);
            up.post(&HeaderMap::new(), &extra, body, deadline, how.check)
                .await
        }
        Upstream::Stdio(_) => {
            let Some(st) = stdio_of(b, s.child.as_ref()) else {
                return Err(UpstreamError::Protocol("no stdio child".into()));
            };
            // A client's answer to the server's own request (bridge::input).
            if crate::protocol::is_response(&body) {
                st.respond(body, deadline).await?;
                return Ok(Reply::accepted());
            }
            if crate::protocol::sniff_id(&body).is_none() {
                st.notify(body, deadline).await?;
                return Ok(Reply::accepted());
            }
            let opts = CallOptions {
                cancel_on_drop: true,
                generation: Some(s.generation),
                logs: how.logs && !on_shared_child(b, s.child.as_ref()),
            };
            st.call_with(body, deadline, opts).await
        }
        Upstream::Builtin(_) => Err(UpstreamError::Protocol(
            "built-in servers are modern".into(),
        )),
    }
}
