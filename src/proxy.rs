//! The request pipeline. `handle` runs every phase in a fixed order and has one exit, where
//! metrics and the access log record what happened:
//!
//! 1. route: path → backend or endpoint (`router`)
//! 2. front-end rules: method, origin, content type, accept, body limit (`frontend`)
//! 3. era: modern or initialize-era client (`frontend::era`)
//! 4. header checks; body check only when a decision depends on the body
//! 5. dispatch: one `match` on the method → pass-through, cache, bridge, or local answer
//! 6. render: relay bytes, or turn decoded messages into JSON / SSE
//! 7. exit: metrics + one log line

use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode, header};
use std::sync::Arc;
use std::time::Instant as StdInstant;
use tokio::time::Instant;

use crate::State;
use crate::aggregate;
use crate::auth::{self, Auth, Principal};
use crate::body::{Body, sse_event};
use crate::bridge;
use crate::cache::{Fetched, KeyInput};
use crate::error::GatewayError;
use crate::frontend::{self, Era, Head, ModernHead};
use crate::legacy;
use crate::protocol::{self, Envelope, Kind, LATEST_VERSION, RequestId, first_byte, header as h};
use crate::resilience;
use crate::router::{Backend, Route, Verdict};
use crate::upstream::{
    MessageStream, Outgoing, Reply, Upstream, UpstreamError, http::is_event_stream,
};
use serde_json::Value;

/// Everything known about one request, filled in as it moves through the phases and read once
/// at the exit by metrics and the access log. `Clone` so an aggregated endpoint can give each
/// concurrent part request its own copy.
#[derive(Clone)]
pub struct RequestCtx {
    start: StdInstant,
    /// Backend or endpoint name serving the request.
    pub route: Option<Arc<str>>,
    /// The backend the request went to (for a backend route, the route itself).
    pub backend: Option<Arc<str>>,
    /// The client's W3C `traceparent`, when well-formed (forwarded upstream by the allowlist).
    pub traceparent: Option<HeaderValue>,
    /// Time spent waiting for upstream answers.
    pub upstream: Option<std::time::Duration>,
    /// The MCP method (from the header or the body).
    pub method: Option<String>,
    /// The JSON-RPC id, once read.
    pub id: Option<RequestId>,
    /// The request body, kept (a cheap `Bytes` clone) so an error can echo the id lazily.
    pub body: Bytes,
    pub era: Option<Era>,
    /// Whether the body went upstream untouched.
    pub passthrough: bool,
    /// Failure reason label, if any.
    pub error: Option<&'static str>,
    /// How the shared cache answered (`hit`, `miss`, …), when it was consulted.
    pub cache: Option<&'static str>,
    pub status: u16,
    /// Who is calling, once authenticated (`None` in auth mode `none`).
    pub principal: Option<Arc<Principal>>,
}

impl RequestCtx {
    fn new() -> RequestCtx {
        RequestCtx {
            start: StdInstant::now(),
            route: None,
            backend: None,
            traceparent: None,
            upstream: None,
            method: None,
            id: None,
            body: Bytes::new(),
            era: None,
            passthrough: false,
            error: None,
            cache: None,
            status: 0,
            principal: None,
        }
    }

    pub fn elapsed(&self) -> std::time::Duration {
        self.start.elapsed()
    }

    /// Adds the time since `since` to the upstream wait.
    fn upstream_since(&mut self, since: StdInstant) {
        self.upstream = Some(self.upstream.unwrap_or_default() + since.elapsed());
    }

    fn error_id(&self) -> Option<RequestId> {
        self.id.clone().or_else(|| protocol::sniff_id(&self.body))
    }
}

/// Entry point for every HTTP request on the client listener, and for the stdio front end
/// (`stdio_front`), which turns each stdin line into an in-process request: the body type is
/// generic so both feed the same pipeline.
pub async fn handle<B>(state: Arc<State>, req: Request<B>) -> Response<Body>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<crate::body::BodyError>,
{
    let _in_flight = state.metrics.in_flight();
    let mut ctx = RequestCtx::new();
    let resp = match handle_inner(&state, &mut ctx, req).await {
        Ok(resp) => resp,
        Err(e) => {
            ctx.error = Some(e.reason());
            let id = ctx.error_id();
            e.into_response(id.as_ref())
        }
    };
    let resp = limit_sse(&state, &ctx, resp);
    ctx.status = resp.status().as_u16();
    state.observe(&ctx);
    resp
}

/// Puts an SSE response (relayed or rendered, any route) under `[server] sse_keepalive_ms`
/// and `max_stream_ms`. One header lookup for everything else.
fn limit_sse(state: &State, ctx: &RequestCtx, resp: Response<Body>) -> Response<Body> {
    let server = &state.config.server;
    if (server.sse_keepalive_ms == 0 && server.max_stream_ms == 0)
        || !is_event_stream(resp.headers())
    {
        return resp;
    }
    let last = GatewayError::StreamLimit {
        max_ms: server.max_stream_ms,
    };
    let last = sse_event(&last.to_message(ctx.error_id().as_ref()));
    resp.map(|body| {
        Body::Limited(Box::new(crate::body::SseLimits::new(
            body,
            std::time::Duration::from_millis(server.sse_keepalive_ms),
            std::time::Duration::from_millis(server.max_stream_ms),
            last,
        )))
    })
}

async fn handle_inner<B>(
    state: &State,
    ctx: &mut RequestCtx,
    req: Request<B>,
) -> Result<Response<Body>, GatewayError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<crate::body::BodyError>,
{
    let (parts, body) = req.into_parts();
    let seen = frontend::Seen::scan(&parts.headers);
    ctx.traceparent = frontend::traceparent(&seen);
    let path = parts.uri.path();
    if path == ADMIN_PURGE_PATH {
        return admin_purge(state, &parts);
    }
    if path.starts_with(auth::METADATA_PATH) {
        return protected_resource_metadata(state, &parts);
    }
    // 1. route
    let route = state
        .routes
        .routes
        .get(path)
        .ok_or_else(|| GatewayError::NoRoute {
            path: path.to_string(),
        })?;
    ctx.route = Some(route.name());
    // 1b. who is calling, and may they (before the body is read)
    ctx.principal = state.auth.authenticate(&parts.headers, path)?;
    state.auth.rate_limit(ctx.principal.as_deref())?;
    // Held until the response head is out: a slot of `max_concurrent`, and the breaker's leave.
    let _admission = match route {
        Route::Backend(backend) => {
            ctx.backend = Some(backend.name.clone());
            Auth::check_team(ctx.principal.as_deref(), &backend.cfg.allow_teams, path)?;
            Some(backend.resilience.admit(&backend.name)?)
        }
        Route::Endpoint(_) => None,
    };
    let _busy = crate::status::busy(route); // status page: requests in flight per backend
    // 2. front-end rules
    match parts.method {
        Method::POST => {}
        Method::DELETE => return legacy::delete(state, ctx, path, &parts.headers),
        _ => return Err(GatewayError::MethodNotAllowed),
    }
    frontend::check_origin(&seen, &state.config.server.allowed_origins)?;
    let body =
        frontend::read_body(body, &parts.headers, state.config.server.max_body_bytes).await?;
    ctx.body = body.clone();
    frontend::check_content(&seen)?;
    // 3. era
    let head = Head::from_seen(&seen);
    let era = frontend::era(&head, &body)?;
    ctx.era = Some(era);
    // Aggregation and the legacy era are boxed: their futures are several KB, and inline they
    // would set the size (and the cost of every move) of each request's state, pass-through
    // included.
    match (era, route) {
        (Era::Modern, Route::Backend(backend)) => {
            modern(state, ctx, backend, &parts.headers, head, body).await
        }
        (Era::Modern, Route::Endpoint(ep)) => {
            Box::pin(aggregate::serve(state, ctx, ep, &parts.headers, head, body)).await
        }
        (Era::Legacy, route) => {
            Box::pin(legacy::serve(
                state,
                ctx,
                path,
                route,
                &parts.headers,
                head,
                body,
            ))
            .await
        }
    }
}

/// Dispatch for a route: a backend's `answer`, or an aggregated endpoint's (which calls
/// `answer` once per member involved).
pub async fn dispatch(
    state: &State,
    ctx: &mut RequestCtx,
    route: &Route,
    headers: &http::HeaderMap,
    env: &Envelope,
    body: Bytes,
    deadline: Instant,
) -> Result<Reply, GatewayError> {
    match route {
        Route::Backend(b) => answer(state, ctx, b, headers, env, body, deadline).await,
        Route::Endpoint(ep) => {
            aggregate::answer(state, ctx, ep, headers, env, body, deadline).await
        }
    }
}

/// A 2026-07-28 request to one backend.
async fn modern(
    state: &State,
    ctx: &mut RequestCtx,
    backend: &Arc<Backend>,
    headers: &http::HeaderMap,
    head: Head<'_>,
    body: Bytes,
) -> Result<Response<Body>, GatewayError> {
    // 4. header checks
    let mh = frontend::check_modern_head(&head)?;
    ctx.method = mh.method.map(str::to_owned);
    // From the request's start: one clock read fewer, and the timeout counts portico's own time.
    let deadline = Instant::from_std(ctx.start) + backend.timeout;
    let verdict = bridge::ensure_verdict(backend).await?;
    if verdict == Verdict::Modern
        && let Upstream::Http(up) = &backend.upstream
        && can_pass_through(state, ctx, backend, &mh)
    {
        // Cheap checks that need no parse: one object per POST.
        match first_byte(&body) {
            Some(b'{') => {}
            Some(b'[') => return Err(GatewayError::Batch),
            _ => return Err(GatewayError::Parse("body is not a JSON object".into())),
        }
        ctx.passthrough = true;
        let team = team_headers(ctx, backend);
        let mut attempt = 0;
        let sent = StdInstant::now();
        let ex = loop {
            match up.forward(headers, team, &body, deadline).await {
                Ok(ex) => break ex,
                Err(e @ UpstreamError::Connect(_))
                    if mh.method.is_some_and(resilience::idempotent)
                        && backend.resilience.take_retry(attempt) =>
                {
                    tracing::debug!(backend = %backend.name, error = %e, "retrying");
                    attempt += 1;
                }
                Err(e) => {
                    ctx.upstream_since(sent);
                    let e = GatewayError::from_upstream(&backend.name, backend.cfg.timeout_ms, &e);
                    backend
                        .resilience
                        .record(!resilience::is_backend_failure(&e));
                    return Err(e);
                }
            }
        };
        ctx.upstream_since(sent);
        backend.resilience.record(true);
        let status = ex.response.status();
        let (parts, relay) = up.relay(ex, deadline, body.clone());
        if !matches!(status.as_u16(), 400 | 404 | 405 | 406) {
            return Ok(relay_response(parts, Body::Relay(relay)));
        }
        // A refusal. If it does not look like a modern server's, the backend has changed
        // under us (e.g. redeployed as a legacy server): re-probe and take the bridge.
        let refusal = read_small(relay).await;
        if backend.cfg.protocol != crate::config::Protocol::Auto
            || blames_the_request(&refusal)
            || bridge::classify_http(status.as_u16(), std::slice::from_ref(&refusal))
                != bridge::Classification::Legacy
        {
            return Ok(relay_response(parts, Body::full(refusal)));
        }
        bridge::reprobe(backend, "a modern request was refused in legacy fashion");
        ctx.passthrough = false;
    }
    let env = protocol::parse_envelope(&body).map_err(frontend::envelope_error)?;
    ctx.id = env.id.clone();
    if ctx.method.is_none() {
        ctx.method = Some(env.method.clone());
    }
    frontend::verify_modern(&head, &mh, &env)?;
    // Boxed for the same reason as the legacy path: the cache and bridge futures are large.
    let reply = Box::pin(answer(state, ctx, backend, headers, &env, body, deadline)).await?;
    Ok(render(reply, env.id.as_ref(), backend).await)
}

/// Whether a refusal is a JSON-RPC error about the request itself (malformed, unknown method,
/// bad params such as missing `_meta`): a modern server refusing a bad client request, not a
/// sign that the backend changed era. Without this, every malformed request passed through
/// would cost the backend a re-probe — an amplification any client could trigger. Legacy
/// servers refuse a session-less modern request differently (`-32000`, or no JSON-RPC body).
fn blames_the_request(refusal: &[u8]) -> bool {
    serde_json::from_slice::<Value>(refusal)
        .ok()
        .and_then(|v| v["error"]["code"].as_i64())
        .is_some_and(|c| {
            matches!(
                c,
                protocol::code::PARSE_ERROR
                    | protocol::code::INVALID_REQUEST
                    | protocol::code::METHOD_NOT_FOUND
                    | protocol::code::INVALID_PARAMS
            )
        })
}

/// Reads a (small) relayed body into memory; used only for refusals.
async fn read_small(relay: crate::upstream::http::RelayBody) -> Bytes {
    use http_body_util::BodyExt;
    match http_body_util::Limited::new(relay, 64 * 1024)
        .collect()
        .await
    {
        Ok(c) => c.to_bytes(),
        Err(_) => Bytes::new(),
    }
}

/// Pass-through is allowed when nothing portico does depends on the body: a backend known to
/// speak 2026-07-28 validates the headers itself.
///
/// Never passed through, because a decision then depends on the body:
/// - a cacheable method while the cache is on (the key comes from the body, and the body must
///   agree with the headers before an entry is served or stored);
/// - a caller under a tool policy (checked against the parsed body, never the headers alone).
fn can_pass_through(
    state: &State,
    ctx: &RequestCtx,
    backend: &Backend,
    mh: &ModernHead<'_>,
) -> bool {
    !mh.unknown_version
        && backend.cfg.verify_body == crate::config::VerifyBody::Auto
        && mh
            .method
            .is_some_and(|m| !(state.cache.enabled() && protocol::is_cacheable_method(m)))
        && state.auth.policy(ctx.principal.as_deref()).is_none()
}

/// The upstream credentials of the caller's team, if the backend configures any.
fn team_headers<'a>(ctx: &RequestCtx, backend: &'a Backend) -> &'a [(HeaderName, HeaderValue)] {
    ctx.principal
        .as_deref()
        .and_then(|p| p.team.as_deref())
        .and_then(|t| backend.team_headers.get(t))
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// `GET /.well-known/oauth-protected-resource[/<path>]` (RFC 9728), served without auth.
fn protected_resource_metadata(
    state: &State,
    parts: &http::request::Parts,
) -> Result<Response<Body>, GatewayError> {
    let path = parts.uri.path();
    if parts.method != Method::GET {
        return Err(GatewayError::MethodNotAllowed);
    }
    state
        .auth
        .metadata(&parts.headers, path, |p| {
            state.routes.routes.contains_key(p)
        })
        .map(|doc| json_response(StatusCode::OK, doc))
        .ok_or_else(|| GatewayError::NoRoute {
            path: path.to_string(),
        })
}

/// Step 5, dispatch: the one `match` on the method, for every request portico reads (modern
/// clients, and legacy clients after translation). Returns decoded messages for `render`.
///
/// Cacheable requests (digest §3: discover, the four lists, `resources/read`) go through the
/// shared cache, which calls back into the per-backend dispatch on a miss.
pub async fn answer(
    state: &State,
    ctx: &mut RequestCtx,
    backend: &Arc<Backend>,
    headers: &http::HeaderMap,
    env: &Envelope,
    body: Bytes,
    deadline: Instant,
) -> Result<Reply, GatewayError> {
    // Team tool policy, on the parsed body.
    let policy = state.auth.policy(ctx.principal.as_deref());
    if let Some(f) = policy
        && env.method == "tools/call"
        && !auth::tool_allowed(f, env.name.as_deref().unwrap_or(""))
    {
        return Err(GatewayError::Forbidden(format!(
            "tool {:?} is not allowed for your team",
            env.name.as_deref().unwrap_or("")
        )));
    }
    let reply = match (env.kind, env.id.as_ref()) {
        (Kind::Request, Some(id))
            if state.cache.enabled() && protocol::is_cacheable_method(&env.method) =>
        {
            cached(state, ctx, backend, headers, env, id, body, deadline).await
        }
        _ => {
            let sent = StdInstant::now();
            let reply = call_backend(ctx, backend, headers, env, body, deadline).await;
            ctx.upstream_since(sent);
            backend.resilience.record_result(&reply);
            reply
        }
    };
    // The filter runs after the cache: a public entry is shared, each team sees its own part.
    match policy {
        Some(f) if env.method == "tools/list" => Ok(auth::filter_tools_reply(reply?, f)),
        _ => reply,
    }
}

/// The per-backend call, inside `answer`'s policy and cache: legacy backends through the
/// bridge, modern ones forwarded.
async fn call_backend(
    ctx: &RequestCtx,
    backend: &Arc<Backend>,
    headers: &http::HeaderMap,
    env: &Envelope,
    body: Bytes,
    deadline: Instant,
) -> Result<Reply, GatewayError> {
    let verdict = bridge::ensure_verdict(backend).await?;
    match (env.kind, verdict) {
        // Legacy backends: translated and multiplexed over the upstream session.
        (_, Verdict::Legacy) => {
            match bridge::call(
                backend,
                &env.method,
                env.id.as_ref(),
                &body,
                headers,
                deadline,
            )
            .await?
            {
                bridge::Bridged::Answer(reply) => Ok(reply),
                // The probe had it wrong (a slow-starting modern server): re-probed, so this
                // request and every later one take the modern path.
                bridge::Bridged::Modern => {
                    forward(ctx, backend, headers, env, body, deadline).await
                }
            }
        }
        // Modern backends, on the message path.
        _ => forward(ctx, backend, headers, env, body, deadline).await,
    }
}

/// A cacheable request: served from the shared cache, or fetched (single-flight) and stored
/// when the result allows it.
#[allow(clippy::too_many_arguments)]
async fn cached(
    state: &State,
    ctx: &mut RequestCtx,
    backend: &Arc<Backend>,
    headers: &http::HeaderMap,
    env: &Envelope,
    id: &RequestId,
    body: Bytes,
    deadline: Instant,
) -> Result<Reply, GatewayError> {
    // The param that selects the result: `uri` for a read (as JSON, like the cursor), else
    // the cursor. Anything else in params does not shape a cacheable result (digest §3).
    let uri_json = match env.method.as_str() {
        "resources/read" => env
            .name
            .as_ref()
            .map(|u| Value::from(u.as_str()).to_string()),
        _ => None,
    };
    // The upstream credential portico presents: a team's own headers make a different one.
    let credential_id = ctx
        .principal
        .as_deref()
        .and_then(|p| p.team.as_deref())
        .filter(|t| backend.team_headers.contains_key(*t))
        .unwrap_or("");
    let key = KeyInput {
        backend: &backend.name,
        credential_id,
        method: &env.method,
        params: uri_json.as_deref().or(env.cursor.as_deref()),
        protocol_version: env.protocol_version.as_deref().unwrap_or(LATEST_VERSION),
        capabilities: env.client_capabilities.as_deref(),
    };
    // Private entries belong to the authenticated principal, or (auth mode none) to a digest
    // of the caller's credential.
    let partition = auth::partition(ctx.principal.as_deref(), headers);
    // Upstream time only when this request itself went upstream (a hit or a coalesced wait
    // has none), in µs: an atomic because the fetch future must stay `Send`.
    let upstream_us = std::sync::atomic::AtomicU64::new(u64::MAX);
    let shared: &RequestCtx = ctx;
    let served = state
        .cache
        .get_or_fetch(&key, &partition, id, env.is_retry, || async {
            let sent = StdInstant::now();
            let reply = call_backend(shared, backend, headers, env, body, deadline).await;
            backend.resilience.record_result(&reply);
            upstream_us.store(
                sent.elapsed().as_micros() as u64,
                std::sync::atomic::Ordering::Relaxed,
            );
            let reply = reply?;
            let status = reply.status.as_u16();
            let message = final_message(reply, &backend.name, backend.cfg.timeout_ms).await?;
            Ok::<_, GatewayError>(Fetched { status, message })
        })
        .await?;
    let us = upstream_us.into_inner();
    if us != u64::MAX {
        ctx.upstream =
            Some(ctx.upstream.unwrap_or_default() + std::time::Duration::from_micros(us));
    }
    ctx.cache = Some(served.outcome.label());
    if served.ttl_remaining_ms.is_some() {
        // Something of this backend is (or was just) in the cache: listen for its changes.
        state.watchers.ensure(backend, &state.cache);
    }
    let status = StatusCode::from_u16(served.status).unwrap_or(StatusCode::BAD_GATEWAY);
    Ok(Reply::one(status, served.body))
}

/// The JSON-RPC response of a reply, skipping notifications sent before it (a cached answer,
/// an aggregated part or portico's own discover is one message; progress about it has no one
/// to go to). `name` and `timeout_ms` describe the route, for the errors.
pub async fn final_message(
    reply: Reply,
    name: &str,
    timeout_ms: u64,
) -> Result<Bytes, GatewayError> {
    let failed = |detail: &str| GatewayError::BackendFailed {
        backend: name.to_string(),
        detail: detail.to_string(),
    };
    match reply.messages {
        MessageStream::One(m) => Ok(m),
        MessageStream::Empty => Err(failed("no answer to a request")),
        MessageStream::Many(mut stream) => {
            while let Some(item) = stream.next().await {
                let msg = item.map_err(|e| GatewayError::from_upstream(name, timeout_ms, &e))?;
                if is_response(&msg) {
                    return Ok(msg);
                }
            }
            Err(failed("the answer stream ended without a response"))
        }
    }
}

/// [`final_message`], decoded; a message that is neither a result nor an error is the
/// backend's fault.
pub async fn final_response(
    reply: Reply,
    name: &str,
    timeout_ms: u64,
) -> Result<Value, GatewayError> {
    let msg = final_message(reply, name, timeout_ms).await?;
    serde_json::from_slice::<Value>(&msg)
        .ok()
        .filter(|v| v.get("result").is_some() || v.get("error").is_some())
        .ok_or_else(|| GatewayError::BackendFailed {
            backend: name.to_string(),
            detail: "the answer holds neither a result nor an error".into(),
        })
}

/// `POST /admin/cache/purge[?backend=NAME]`: drops cached entries. Loopback callers only until
/// portico authenticates operators; the answer says what was purged.
pub const ADMIN_PURGE_PATH: &str = "/admin/cache/purge";

fn admin_purge(
    state: &State,
    parts: &http::request::Parts,
) -> Result<Response<Body>, GatewayError> {
    let peer_is_loopback = parts
        .extensions
        .get::<crate::server::PeerAddr>()
        .is_some_and(|p| p.0.ip().is_loopback());
    if !peer_is_loopback {
        return Err(GatewayError::AdminForbidden);
    }
    if parts.method != Method::POST {
        return Err(GatewayError::MethodNotAllowed);
    }
    let backend = parts.uri.query().and_then(|q| {
        q.split('&')
            .find_map(|kv| kv.strip_prefix("backend="))
            .map(str::to_owned)
    });
    let purged = match &backend {
        Some(name) => {
            if !state.routes.backends.contains_key(name.as_str()) {
                return Err(GatewayError::NoRoute {
                    path: format!("backend {name}"),
                });
            }
            state.cache.purge_backend(name);
            serde_json::json!({"purged": "backend", "backend": name})
        }
        None => {
            state.cache.purge_all_replicas();
            serde_json::json!({"purged": "all"})
        }
    };
    tracing::info!(target: "portico::admin", %purged, "cache purged");
    Ok(json_response(
        StatusCode::OK,
        Bytes::from(purged.to_string()),
    ))
}

/// Sends a modern message to a modern backend on the message path. Idempotent methods are
/// retried when the connection could not be made, within the backend's retry budget.
async fn forward(
    ctx: &RequestCtx,
    backend: &Backend,
    headers: &http::HeaderMap,
    env: &Envelope,
    body: Bytes,
    deadline: Instant,
) -> Result<Reply, GatewayError> {
    let mut extra = mirror_headers(env);
    extra.extend_from_slice(team_headers(ctx, backend));
    let mut attempt = 0;
    loop {
        let result = backend
            .upstream
            .call(Outgoing {
                body: body.clone(),
                client_headers: headers,
                extra: extra.clone(),
                deadline,
            })
            .await;
        match result {
            Err(UpstreamError::Connect(_))
                if resilience::idempotent(&env.method)
                    && backend.resilience.take_retry(attempt) =>
            {
                attempt += 1;
            }
            r => {
                return r.map_err(|e| {
                    GatewayError::from_upstream(&backend.name, backend.cfg.timeout_ms, &e)
                });
            }
        }
    }
}

/// The 2026-07-28 headers that mirror a message's body.
pub fn mirror_headers(env: &Envelope) -> Vec<(HeaderName, HeaderValue)> {
    let mut out = Vec::with_capacity(3);
    out.push((
        h::names::PROTOCOL_VERSION,
        HeaderValue::from_static(LATEST_VERSION),
    ));
    if let Ok(v) = HeaderValue::from_str(&env.method) {
        out.push((h::names::METHOD, v));
    }
    if let Some(name) = &env.name
        && let Ok(v) = HeaderValue::from_str(&protocol::encode_header_value(name))
    {
        out.push((h::names::NAME, v));
    }
    out
}

/// Builds the client response for a relayed upstream answer, copying only the headers a client
/// needs.
fn relay_response(parts: http::response::Parts, body: Body) -> Response<Body> {
    let sse = is_event_stream(&parts.headers);
    let relayed = |k: &HeaderName| *k == header::CONTENT_TYPE || *k == header::RETRY_AFTER;
    let mut headers = parts.headers;
    // The framing is the server's to state. After that the map usually holds only what is
    // relayed, and is kept rather than copied into a new one.
    headers.remove(header::CONTENT_LENGTH);
    if !headers.keys().all(relayed) {
        let mut kept = http::HeaderMap::with_capacity(2);
        for name in [header::CONTENT_TYPE, header::RETRY_AFTER] {
            if let Some(v) = headers.get(&name) {
                kept.insert(name, v.clone());
            }
        }
        headers = kept;
    }
    let mut resp = Response::new(body);
    *resp.status_mut() = parts.status;
    *resp.headers_mut() = headers;
    let out = resp.headers_mut();
    if sse {
        out.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        out.insert(
            HeaderName::from_static("x-accel-buffering"),
            HeaderValue::from_static("no"),
        );
    }
    resp
}

pub fn json_response(status: StatusCode, body: Bytes) -> Response<Body> {
    let mut resp = Response::new(Body::full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// Step 6, render: decoded messages → HTTP. A single answer goes back as JSON; when notifications
/// come first (progress), the answer becomes an SSE stream that relays each message as it
/// arrives. Dropping the stream (client gone) drops the upstream side too.
pub async fn render(reply: Reply, id: Option<&RequestId>, backend: &Backend) -> Response<Body> {
    render_as(reply, id, &backend.name, backend.cfg.timeout_ms).await
}

/// `render` for any route: `name` and `timeout_ms` only label errors that end a stream.
pub async fn render_as(
    reply: Reply,
    id: Option<&RequestId>,
    name: &str,
    timeout_ms: u64,
) -> Response<Body> {
    match reply.messages {
        MessageStream::Empty => {
            let mut resp = Response::new(Body::Empty);
            *resp.status_mut() = StatusCode::ACCEPTED;
            resp
        }
        MessageStream::One(msg) => json_response(reply.status, msg),
        MessageStream::Many(mut stream) => {
            let first = match stream.next().await {
                None => {
                    return GatewayError::BackendFailed {
                        backend: name.to_string(),
                        detail: "the answer stream ended without a response".into(),
                    }
                    .into_response(id);
                }
                Some(Err(e)) => {
                    return GatewayError::from_upstream(name, timeout_ms, &e).into_response(id);
                }
                Some(Ok(first)) => first,
            };
            if is_response(&first) {
                return json_response(reply.status, first);
            }
            let stream = futures_util::stream::once(async move { Ok(first) }).chain(stream);
            let id = id.cloned();
            let name = name.to_string();
            let events = stream.map(move |item| match item {
                Ok(msg) => sse_event(&msg),
                Err(e) => sse_event(
                    &GatewayError::from_upstream(&name, timeout_ms, &e).to_message(id.as_ref()),
                ),
            });
            let mut resp = Response::new(Body::Stream(Box::pin(events)));
            let out = resp.headers_mut();
            out.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            );
            out.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            out.insert(
                HeaderName::from_static("x-accel-buffering"),
                HeaderValue::from_static("no"),
            );
            resp
        }
    }
}

/// Whether a decoded message is a JSON-RPC response (the end of an answer) rather than a
/// notification about the request.
pub fn is_response(msg: &[u8]) -> bool {
    matches!(protocol::parse_envelope(msg), Ok(e) if e.kind == Kind::Response)
}
