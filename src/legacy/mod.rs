//! Initialize-era clients (2025-03-26 … 2025-11-25) on the same endpoints as 2026-07-28 ones.
//!
//! portico answers `initialize` itself: it negotiates the revision the client asks for (or
//! counter-offers 2025-11-25), describes the backend from its `server/discover` (through the
//! cache like any discover), and mints a sealed session id (`session`). Every later request is
//! translated into 2026-07-28 form — `_meta` filled from the session — and goes through the
//! same dispatch as a modern request, whatever the backend speaks; the answer is translated
//! back into the shape the client's revision expects.
//!
//! Each session has its own upstream sessions on initialize-era backends (`bridge::Owner`):
//! opened at `initialize` with the client's capabilities and clientInfo, sealed into its id
//! (HTTP) so another replica continues them, closed on `DELETE` or when idle/expired.
//! `DELETE` revokes the session on every replica (through Redis when configured); a revoked or
//! expired id → 404, while an unknown method in a live session → 200 with `-32601`.
//! `notifications/cancelled` cancels the client's own call (`step::calls`).
//!
//! Server requests reach a legacy client on its call's SSE stream: a legacy backend's
//! (`bridge::input`, relayed with portico's ids) and a 2026-07-28 backend's `input_required`
//! (`relay`, asked as real requests, the call retried with the answers); the client's answer
//! POSTs are routed back by id. What they hear unasked — the GET stream, `resources/subscribe`,
//! `logging/setLevel` — is [`notes`]; `ping` is answered here. Their SSE streams carry event
//! ids and outlive a dropped connection for a `GET` with `Last-Event-ID` ([`resume`]).

mod batch;
mod notes;
mod resume;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use serde_json::{Value, json};
use tokio::time::Instant;

use std::sync::Arc;

use crate::backend::Backend;
use crate::body::{Body, json_response, render, sse_response};
use crate::bridge;
use crate::error::GatewayError;
use crate::frontend::{self, Head};
use crate::protocol::{
    self, Kind, LATEST_VERSION, LEGACY_VERSIONS, RequestId, code, header as h, meta,
};
use crate::relay;
use crate::router::{Route, dispatch};
use crate::session::SessionData;
use crate::step::{Core, RequestCtx};

/// Serves one POST from an initialize-era client.
#[allow(clippy::too_many_arguments)]
pub async fn serve(
    core: &Core,
    generation: relay::Generation,
    ctx: &mut RequestCtx,
    path: &str,
    route: &Route,
    headers: &HeaderMap,
    head: Head<'_>,
    body: Bytes,
) -> Result<Response<Body>, GatewayError> {
    if protocol::first_byte(&body) == Some(b'[') {
        return batch::serve(core, generation, ctx, path, route, headers, head, body).await;
    }
    let env = protocol::parse_envelope(&body).map_err(frontend::envelope_error)?;
    ctx.id = env.id.clone();
    ctx.method = Some(env.method.clone());
    ctx.note_tool(Some(&env.method), env.name.as_deref());
    let deadline = Instant::now() + route.timeout();
    if env.kind == Kind::Request && env.method == "initialize" {
        return initialize(
            core,
            ctx,
            path,
            route,
            headers,
            &body,
            env.id.as_ref(),
            deadline,
        )
        .await;
    }
    let Some(sid) = &head.session else {
        return Err(GatewayError::BadRequest(
            "Mcp-Session-Id header is required: start the session with initialize".into(),
        ));
    };
    let session = live_session(core, ctx, sid, path).await?;
    ctx.client = Some(owner_of(sid, &session));
    // From here the session is live: the only 404 its client may see is the session's end,
    // which the SDKs read as "start over" — so an unknown method is 200 + -32601.
    match in_session(
        core, generation, ctx, route, headers, head, &env, body, &session, deadline,
    )
    .await
    {
        Ok(mut resp) => {
            if resp.status() == StatusCode::NOT_FOUND {
                *resp.status_mut() = StatusCode::OK;
            }
            Ok(resp)
        }
        Err(e) if e.status() == StatusCode::NOT_FOUND => {
            ctx.error = Some(e.reason());
            let body = e.to_message(env.id.as_ref());
            Ok(json_response(StatusCode::OK, Bytes::from(body)))
        }
        Err(e) => Err(e),
    }
}

/// `GET` with a session id: the client's notification stream ([`notes`]); without one, 405
/// (the spec allows a server to offer no stream).
pub async fn get(
    core: &Core,
    generation: relay::Generation,
    ctx: &mut RequestCtx,
    path: &str,
    route: &Route,
    headers: &HeaderMap,
) -> Result<Response<Body>, GatewayError> {
    let head = Head::read(headers);
    let Some(sid) = head.session else {
        return Err(GatewayError::MethodNotAllowed);
    };
    let accept = headers.get(http::header::ACCEPT).map(|v| v.as_bytes());
    if !accept.is_some_and(|a| a.windows(17).any(|w| w == b"text/event-stream")) {
        return Err(GatewayError::NotAcceptable);
    }
    let session = live_session(core, ctx, sid, path).await?;
    let owner = owner_of(sid, &session);
    ctx.client = Some(owner.clone());
    ctx.method = Some("GET stream".into());
    if let Some(last) = headers.get(h::LAST_EVENT_ID)
        && core.config.sessions.resume_ms > 0
        && ctx.remote
        && let Some(last) = resume::EventId::parse(last.as_bytes())
    {
        // Held by another replica (the id names it, sealed): taken there, once.
        if let Some(replica) = last
            .replica
            .as_deref()
            .filter(|_| !headers.contains_key(bridge::FORWARDED))
            .and_then(|tag| {
                core.sessions
                    .stream_elsewhere(tag, core.config.sessions.advertise_url.as_deref())
            })
        {
            match forward_resume(core, route, path, headers, &replica).await {
                Ok(mut resp) => {
                    core.metrics.stream_resume("forwarded");
                    if resp.status() == StatusCode::OK && resume::primed(&session) {
                        resp.extensions_mut().insert(crate::body::Resumable);
                    }
                    return Ok(resp);
                }
                Err(e) if last.kind == resume::Kind::Answer => return Err(e),
                // The GET stream is opened anew here: what it carried meanwhile is lost.
                Err(e) => tracing::warn!(
                    replica,
                    error = %e,
                    "a GET stream's resume could not reach the replica holding it; opened anew"
                ),
            }
        }
        match resume::resume(&core.metrics, &owner.key, &last) {
            resume::Resumed::Stream(events) => {
                let mut resp = sse_response(Body::Stream(events));
                if resume::primed(&session) {
                    resp.extensions_mut().insert(crate::body::Resumable);
                }
                return Ok(resp);
            }
            resume::Resumed::Unknown if last.kind == resume::Kind::Answer => {
                return Err(GatewayError::BadRequest(format!(
                    "the answer stream of event {last} cannot be resumed: it ended over \
                     sessions.resume_ms ago, or is held by another replica; re-issue the request"
                )));
            }
            // The GET stream is opened anew: what it carried meanwhile is lost.
            resume::Resumed::Unknown => {}
        }
    }
    let revocation = revocation_key(sid, &session);
    let resp = notes::get_stream(
        core,
        &generation,
        ctx,
        route,
        headers,
        &owner,
        &session,
        revocation,
    )
    .await?;
    Ok(resume::resumable(
        core,
        ctx,
        &session,
        resume::Kind::Get,
        resp,
    ))
}

/// Takes a `GET` with `Last-Event-ID` to the replica holding its stream (the id names it:
/// `[sessions] advertise_url`, sealed), once (marked [`bridge::FORWARDED`]), with the client's
/// own credential and session — the holder authenticates it again and checks that the stream
/// is that session's — and relays its answer as it comes: the stream from after that event,
/// or the holder's refusal. The relay ends when the holder sends nothing for longer than the
/// route's timeout or two keep-alive intervals, whichever is longer (the client resumes again:
/// the stream is still held there), and within a day in all.
async fn forward_resume(
    core: &Core,
    route: &Route,
    path: &str,
    headers: &HeaderMap,
    replica: &str,
) -> Result<Response<Body>, GatewayError> {
    use http_body_util::BodyExt;
    let url = format!("{}{path}", replica.trim_end_matches('/'));
    let unreachable = |why: String| GatewayError::BackendFailed {
        backend: replica.to_string(),
        detail: format!("resuming a stream held by another replica: {why}"),
    };
    let peer = bridge::replica_peer(&url).map_err(unreachable)?;
    let extra = bridge::forwarded_headers(
        headers,
        &[
            http::header::AUTHORIZATION,
            h::names::SESSION_ID,
            h::names::PROTOCOL_VERSION,
            http::HeaderName::from_static(h::LAST_EVENT_ID),
        ],
    );
    let keepalive = std::time::Duration::from_millis(core.config.server.sse_keepalive_ms);
    let idle = route.timeout().max(keepalive * 2);
    let deadline = Instant::now() + FORWARDED_STREAM_MAX;
    let req = peer.get_events(&extra);
    let ex = peer
        .exchange(req, deadline)
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    tracing::debug!(
        replica,
        "resume forwarded to the replica holding its stream"
    );
    let (parts, mut body) = ex.response.into_parts();
    let events = crate::upstream::http::async_stream(move |tx| async move {
        while let Ok(Some(Ok(frame))) = tokio::time::timeout(idle, body.frame()).await {
            if let Ok(data) = frame.into_data()
                && tx.send(data).await.is_err()
            {
                return;
            }
        }
    });
    let body = Body::Stream(Box::pin(events));
    let mut resp = if crate::upstream::http::is_event_stream(&parts.headers) {
        sse_response(body)
    } else {
        let mut resp = Response::new(body);
        if let Some(ct) = parts.headers.get(http::header::CONTENT_TYPE) {
            resp.headers_mut()
                .insert(http::header::CONTENT_TYPE, ct.clone());
        }
        resp
    };
    *resp.status_mut() = parts.status;
    Ok(resp)
}

/// The longest a resume forwarded to another replica is relayed (then the client resumes it
/// again, through this replica or another).
const FORWARDED_STREAM_MAX: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// The session `sid` names, when it opens for this caller on this endpoint and has not been
/// ended (`DELETE`, on any replica: the revocation set, shared through Redis).
async fn live_session(
    core: &Core,
    ctx: &RequestCtx,
    sid: &str,
    path: &str,
) -> Result<SessionData, GatewayError> {
    let session = core
        .sessions
        .open(sid, path, principal_id(ctx))
        .ok_or(GatewayError::SessionNotFound)?;
    let revocation = revocation_key(sid, &session);
    if core.sessions.is_revoked(&revocation) {
        return Err(GatewayError::SessionNotFound);
    }
    if core.cache.session_revoked(&revocation).await {
        core.sessions.revoke(revocation, session.exp);
        return Err(GatewayError::SessionNotFound);
    }
    Ok(session)
}

/// What names a session in the revocation set (never the id itself, which is a bearer token).
fn revocation_key(sid: &str, session: &SessionData) -> [u8; 32] {
    bridge::digest(b"portico/revoked-session", &[session.name(sid)])
}

/// The upstream-session owner of a legacy client's session: the session itself, with what
/// its client declared at `initialize` and the upstream sessions sealed into its id.
fn owner_of(sid: &str, session: &SessionData) -> Arc<bridge::Owner> {
    let mut owner = bridge::Owner::legacy_client(
        session.name(sid),
        session.pr.as_deref(),
        &session.v,
        &session.caps,
        session.info.as_ref(),
        session.exp,
    );
    owner.sealed = session.up.clone();
    // The server's requests during its calls reach it on the call's stream.
    owner.input = Some(bridge::InputSide::Relay);
    Arc::new(owner)
}

/// A request or notification within a live session.
#[allow(clippy::too_many_arguments)]
async fn in_session(
    core: &Core,
    generation: relay::Generation,
    ctx: &mut RequestCtx,
    route: &Route,
    headers: &HeaderMap,
    head: Head<'_>,
    env: &protocol::Envelope,
    body: Bytes,
    session: &SessionData,
    deadline: Instant,
) -> Result<Response<Body>, GatewayError> {
    if let Some(v) = &head.version
        && *v != session.v
    {
        return Err(GatewayError::BadRequest(format!(
            "Unsupported protocol version: {v} (this session negotiated {})",
            session.v
        )));
    }
    if env.kind == Kind::Response {
        // The client's answer to a server request portico relayed during one of its calls.
        if let (Some(id), Some(owner)) = (&env.id, &ctx.client) {
            let msg = serde_json::from_slice::<Value>(&body).unwrap_or_default();
            if !bridge::answer_input(owner.key, id, msg) {
                tracing::debug!(
                    id = id.json(),
                    "an answer to no request waiting in this session"
                );
            }
        }
        return Ok(accepted());
    }
    let Some(id) = env.id.clone() else {
        if env.method == "notifications/cancelled"
            && let Some(owner) = &ctx.client
        {
            // The client's own call (by its own id), wherever it went: dropping it tells the
            // server with the id the server saw (`step::calls`).
            if let Some(target) = serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|v| RequestId::from_value(&v["params"]["requestId"]))
            {
                let n = core.calls.cancel(owner.scope, &target);
                tracing::debug!(
                    id = target.json(),
                    found = n,
                    "legacy client cancelled a request"
                );
            }
        }
        // notifications/initialized, cancelled, roots/list_changed: accepted.
        return Ok(accepted());
    };
    let owner = ctx.client.clone().unwrap_or_else(|| owner_of("", session));
    match env.method.as_str() {
        "ping" => return Ok(result(&id, json!({}))),
        "logging/setLevel" | "resources/subscribe" | "resources/unsubscribe" => {
            let v: Value =
                serde_json::from_slice(&body).map_err(|e| GatewayError::Parse(e.to_string()))?;
            let params = &v["params"];
            return match env.method.as_str() {
                "logging/setLevel" => {
                    notes::set_level(core, route, &owner, session, &id, params).await
                }
                m => {
                    let on = m == "resources/subscribe";
                    let revocation = revocation_key(head.session.unwrap_or_default(), session);
                    notes::subscribe(
                        core,
                        &generation,
                        ctx,
                        route,
                        headers,
                        &owner,
                        session,
                        revocation,
                        &id,
                        params,
                        on,
                    )
                    .await
                }
            };
        }
        "subscriptions/listen" => {
            return Err(GatewayError::MethodNotFound(env.method.clone()));
        }
        _ => {}
    }
    let mut modern_body = modernize(&body, session)?;
    // The client's `logging/setLevel`, as this request's own `logLevel`: the backend's log
    // lines during it come back on its stream, to this client only.
    if let Some(level) = notes::log_level(core, &owner) {
        modern_body = with_log_level(&modern_body, level);
    }
    let modern_env = protocol::parse_envelope(&modern_body).map_err(frontend::envelope_error)?;
    let work = Work {
        generation,
        ctx: ctx.clone(),
        route: route.clone(),
        headers: headers.clone(),
        env: modern_env,
        body: modern_body,
        id: id.clone(),
        method: env.method.clone(),
        caps: session.caps.clone(),
        deadline,
    }
    .run();
    resume::answer(core, ctx, session, &id, work).await
}

/// One initialize-era client's call, owned so that it can outlive the request's handler.
struct Work {
    generation: relay::Generation,
    ctx: RequestCtx,
    route: Route,
    headers: HeaderMap,
    /// The request in 2026-07-28 form, and its envelope.
    env: protocol::Envelope,
    body: Bytes,
    /// The client's own id, and its method.
    id: RequestId,
    method: String,
    caps: Value,
    deadline: Instant,
}

impl Work {
    /// The call through the same dispatch as any request, and its answer as the client's
    /// revision expects it; with the request's context as the call left it.
    async fn run(self) -> (RequestCtx, Result<Response<Body>, GatewayError>) {
        let Work {
            generation,
            mut ctx,
            route,
            headers,
            env,
            body,
            id,
            method,
            caps,
            deadline,
        } = self;
        let core: &Core = &generation;
        let reply = dispatch(
            core,
            &mut ctx,
            &route,
            &headers,
            &env,
            body.clone(),
            deadline,
        )
        .await;
        let reply = match reply {
            Ok(reply) => reply,
            Err(e) => return (ctx, Err(e)),
        };
        let timeout_ms = route.timeout().as_millis() as u64;
        let name = route.name();
        // `input_required` from a 2026-07-28 server becomes server requests to this client.
        let call = relay::Call {
            generation: generation.clone(),
            ctx: ctx.clone(),
            route,
            headers,
            body,
            owner: ctx.client.as_ref().map(|o| o.key).unwrap_or_default(),
            id: id.clone(),
            method,
            caps,
            deadline,
            shape: legacy_message,
        };
        let resp = render(relay::answer(reply, call), Some(&id), &name, timeout_ms).await;
        (ctx, Ok(resp))
    }
}

/// The backends a route reaches (one, or an endpoint's members).
fn backends(route: &Route) -> Vec<Arc<Backend>> {
    match route {
        Route::Backend(b) => vec![b.clone()],
        Route::Endpoint(ep) => ep.members.iter().map(|m| m.backend.clone()).collect(),
    }
}

/// `DELETE` with a session id ends the session on every replica: it is revoked (here, and
/// through Redis when configured, until its expiry) and its upstream sessions are closed. A
/// revoked or unknown id → 404.
pub async fn delete(
    core: &Core,
    ctx: &RequestCtx,
    path: &str,
    route: &Route,
    headers: &HeaderMap,
) -> Result<Response<Body>, GatewayError> {
    let head = Head::read(headers);
    let Some(sid) = head.session else {
        return Err(GatewayError::MethodNotAllowed);
    };
    let session = live_session(core, ctx, sid, path).await?;
    let revocation = revocation_key(sid, &session);
    core.sessions.revoke(revocation, session.exp);
    let ttl_ms = session.exp.saturating_sub(crate::pool::unix_ms());
    if core.cache.shares_revocations() && !core.cache.revoke_session(&revocation, ttl_ms).await {
        tracing::warn!(
            "a legacy-client session ended here could not be recorded in redis; other replicas \
             accept it until it expires"
        );
    }
    let owner = owner_of(sid, &session);
    // Its subscriptions end with it (their upstream streams close).
    core.clients.remove(&owner.key);
    futures_util::future::join_all(backends(route).iter().map(|b| {
        let owner = &owner;
        async move {
            let credentials = crate::step::credentials_outside(core, ctx, b, headers).await;
            bridge::close_owner(b, owner, &credentials).await;
        }
    }))
    .await;
    let mut resp = Response::new(Body::Empty);
    *resp.status_mut() = StatusCode::OK;
    Ok(resp)
}

/// The authenticated caller a session is bound to (`None`: anonymous).
fn principal_id(ctx: &RequestCtx) -> Option<&str> {
    ctx.principal.as_deref().map(|p| p.id.as_str())
}

fn accepted() -> Response<Body> {
    let mut resp = Response::new(Body::Empty);
    *resp.status_mut() = StatusCode::ACCEPTED;
    resp
}

fn result(id: &RequestId, result: Value) -> Response<Body> {
    json_response(
        StatusCode::OK,
        Bytes::from(json!({"jsonrpc":"2.0","id":id.to_value(),"result":result}).to_string()),
    )
}

/// Picks the revision: the client's when portico speaks it, else the newest legacy one.
pub fn negotiate(asked: Option<&str>) -> &'static str {
    LEGACY_VERSIONS
        .iter()
        .find(|v| Some(**v) == asked)
        .copied()
        .unwrap_or(LEGACY_VERSIONS[0])
}

#[allow(clippy::too_many_arguments)]
async fn initialize(
    core: &Core,
    ctx: &mut RequestCtx,
    path: &str,
    route: &Route,
    headers: &HeaderMap,
    body: &[u8],
    id: Option<&RequestId>,
    deadline: Instant,
) -> Result<Response<Body>, GatewayError> {
    let id = id.ok_or_else(|| GatewayError::InvalidRequest("initialize needs an id".into()))?;
    let v: Value = serde_json::from_slice(body).map_err(|e| GatewayError::Parse(e.to_string()))?;
    let params = &v["params"];
    let version = negotiate(params["protocolVersion"].as_str());
    let caps = match &params["capabilities"] {
        Value::Object(_) => params["capabilities"].clone(),
        _ => json!({}),
    };
    let info = params.get("clientInfo").filter(|i| i.is_object()).cloned();
    let mut session = core.sessions.data(version, caps, info, path);
    session.pr = principal_id(ctx).map(String::from);
    // The client's own upstream sessions start now, with what it declared: the discover below
    // runs in them, and the ones another replica could continue are sealed into its id.
    let owner = owner_of("", &session);
    ctx.client = Some(owner.clone());
    // Describe the backend from its discover result (cached like any other discover).
    let discover = modernize(
        br#"{"jsonrpc":"2.0","id":"portico-initialize","method":"server/discover","params":{}}"#,
        &session,
    )?;
    let env = protocol::parse_envelope(&discover).map_err(frontend::envelope_error)?;
    let reply = dispatch(core, ctx, route, headers, &env, discover, deadline).await?;
    let found = reply
        .final_response(&route.name(), route.timeout().as_millis() as u64)
        .await?;
    if let Some(err) = found.get("error") {
        return Err(GatewayError::BackendFailed {
            backend: route.name().to_string(),
            detail: format!("server/discover failed: {}", err["message"]),
        });
    }
    let d = &found["result"];
    // What the discover advertises is what portico delivers on this URL (`notes` serves the
    // GET stream, subscriptions and log levels).
    let capabilities = d.get("capabilities").cloned().unwrap_or(json!({}));
    let server_info = d["_meta"][meta::SERVER_INFO].clone();
    let server_info = if server_info.is_object() {
        server_info
    } else {
        json!({"name": route.name().as_ref(), "version": "unknown"})
    };
    let mut init = json!({
        "protocolVersion": version,
        "capabilities": capabilities,
        "serverInfo": server_info,
    });
    if let Some(i) = d.get("instructions") {
        init["instructions"] = i.clone();
    }
    for b in backends(route) {
        if b.verdict() != crate::backend::Verdict::Legacy {
            continue;
        }
        // Opening the session reaches the backend, so it is admitted as the per-backend step
        // admits a request: not for a team the backend refuses (its calls would be refused
        // anyway), not past its concurrency limit or an open breaker. A member left out opens
        // its session on first use, through the step.
        if crate::step::may_use(ctx, &b).is_err() {
            continue;
        }
        let Ok(_admission) = b.resilience.admit(&b.name) else {
            continue;
        };
        let opened = bridge::open(&b, &owner, deadline).await;
        b.resilience.record_result(&opened);
        match opened {
            Ok(Some((id, v))) => session.up.push((b.name.to_string(), id, v)),
            Ok(None) => {}
            // Not fatal: the session opens on first use (on whichever replica that is).
            Err(e) => {
                tracing::info!(backend = %b.name, error = %e, "upstream session not opened at initialize")
            }
        }
    }
    let sid = core.sessions.mint(&session);
    let mut resp = result(id, init);
    if let Ok(v) = HeaderValue::from_str(&sid) {
        resp.headers_mut().insert(h::names::SESSION_ID, v);
    }
    Ok(resp)
}

/// `body` (a modernized request) with `_meta` `logLevel` = `level`.
fn with_log_level(body: &Bytes, level: &str) -> Bytes {
    let Ok(mut v) = serde_json::from_slice::<Value>(body) else {
        return body.clone();
    };
    if let Some(m) = v
        .get_mut("params")
        .and_then(|p| p.get_mut("_meta"))
        .and_then(Value::as_object_mut)
    {
        m.insert(meta::LOG_LEVEL.into(), json!(level));
        return Bytes::from(v.to_string());
    }
    body.clone()
}

/// Legacy request → 2026-07-28 request: the session supplies `_meta`'s required keys.
fn modernize(body: &[u8], s: &SessionData) -> Result<Bytes, GatewayError> {
    let mut v: Value =
        serde_json::from_slice(body).map_err(|e| GatewayError::Parse(e.to_string()))?;
    let obj = v
        .as_object_mut()
        .ok_or_else(|| GatewayError::InvalidRequest("not an object".into()))?;
    let params = obj.entry("params").or_insert_with(|| json!({}));
    if !params.is_object() {
        *params = json!({});
    }
    let m = params
        .as_object_mut()
        .map(|p| p.entry("_meta").or_insert_with(|| json!({})));
    if let Some(m) = m {
        if !m.is_object() {
            *m = json!({});
        }
        m[meta::PROTOCOL_VERSION] = json!(LATEST_VERSION);
        m[meta::CLIENT_CAPABILITIES] = s.caps.clone();
        if let Some(info) = &s.info {
            m[meta::CLIENT_INFO] = info.clone();
        }
    }
    Ok(Bytes::from(v.to_string()))
}

/// Translates one message: 2026-only result fields go; `input_required` (which a legacy client
/// cannot act on) becomes an error; resource-not-found returns to `-32002`.
pub fn legacy_message(msg: &[u8], method: &str) -> Bytes {
    let Ok(mut v) = serde_json::from_slice::<Value>(msg) else {
        return Bytes::copy_from_slice(msg);
    };
    let mut changed = false;
    if let Some(result) = v.get_mut("result").and_then(Value::as_object_mut) {
        if result.get("resultType").and_then(Value::as_str) == Some("input_required") {
            let id = v.get("id").and_then(RequestId::from_value);
            return Bytes::from(
                GatewayError::InvalidRequest(
                    "the server needs more input (input_required), which initialize-era clients \
                     cannot provide through portico; use a 2026-07-28 client"
                        .into(),
                )
                .to_message(id.as_ref()),
            );
        }
        for k in ["resultType", "ttlMs", "cacheScope"] {
            changed |= result.remove(k).is_some();
        }
    } else if let Some(err) = v.get_mut("error").and_then(Value::as_object_mut)
        && method == "resources/read"
        && err.get("code").and_then(Value::as_i64) == Some(code::INVALID_PARAMS)
        && err.get("data").and_then(|d| d.get("uri")).is_some()
    {
        err.insert("code".into(), json!(code::LEGACY_RESOURCE_NOT_FOUND));
        changed = true;
    }
    if changed {
        Bytes::from(v.to_string())
    } else {
        Bytes::copy_from_slice(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation() {
        assert_eq!(negotiate(Some("2025-06-18")), "2025-06-18");
        assert_eq!(negotiate(Some("2025-03-26")), "2025-03-26");
        assert_eq!(negotiate(Some("2024-11-05")), "2025-11-25");
        assert_eq!(negotiate(Some("2099-01-01")), "2025-11-25");
        assert_eq!(negotiate(None), "2025-11-25");
    }

    #[test]
    fn answers_take_the_legacy_shape() {
        let out = legacy_message(
            br#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete","ttlMs":5,"cacheScope":"public","tools":[]}}"#,
            "tools/list",
        );
        assert_eq!(
            serde_json::from_slice::<Value>(&out).unwrap(),
            json!({"jsonrpc":"2.0","id":1,"result":{"tools":[]}})
        );
        let out = legacy_message(
            br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"Resource not found","data":{"uri":"x://y"}}}"#,
            "resources/read",
        );
        assert_eq!(
            serde_json::from_slice::<Value>(&out).unwrap()["error"]["code"],
            -32002
        );
        let out = legacy_message(
            br#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","inputRequests":{}}}"#,
            "tools/call",
        );
        assert_eq!(
            serde_json::from_slice::<Value>(&out).unwrap()["error"]["code"],
            -32600
        );
    }
}
