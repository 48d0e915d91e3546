//! The per-backend step: the one function through which every request reaches a backend —
//! `/mcp/<name>`, a member of an aggregated endpoint, a legacy-client session, `portico stdio`,
//! and the cache's re-fetch (which runs inside it). Nothing else calls a transport on a
//! client's behalf.
//!
//! [`step`] applies, in this order (README "The per-backend step"):
//! 1. `allow_teams` of the backend (403);
//! 2. the caller's rate limit, charged once per client request however many backends it
//!    reaches (429);
//! 3. the team tool policy, on the names the client sees ([`Exposure`]: prefixed on an
//!    aggregated endpoint) — a `tools/call` it denies is refused (403), a `tools/list` is
//!    filtered — then the `[[auth.tool_limits]]` buckets of the called tool (429);
//! 4. `max_concurrent` (503 + `Retry-After`), held until the backend's answer head is in;
//! 5. the circuit breaker (503 while open), then, for a backend with `token_exchange`, the
//!    caller's token exchanged for one for the backend (403 refused, 502 failed; RFC 8693);
//! 6. the shared cache, for cacheable requests (not for such a backend: its answers are the
//!    caller's own);
//! 7. forward (modern backends, pass-through or message path) or bridge (initialize-era
//!    backends), with the one retry loop ([`with_retry`]).
//!
//! It also owns the per-request context ([`RequestCtx`]) and what a request needs of the
//! config generation besides the routes ([`Core`]).

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response};
use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant as StdInstant;
use tokio::time::Instant;

use crate::auth::{self, Auth, Principal};
use crate::backend::{Backend, Verdict};
use crate::body::{Body, relay_response};
use crate::bridge;
use crate::cache::{Cache, Fetched, KeyInput, Outcome, Partition};
use crate::config::{Config, Protocol, ToolFilter, VerifyBody};
use crate::error::GatewayError;
use crate::frontend::{Era, ModernHead};
use crate::invalidation::Watchers;
use crate::metrics::Metrics;
use crate::protocol::{self, Envelope, Kind, LATEST_VERSION, RequestId, header as h};
use crate::resilience;
use crate::session::Sessions;
use crate::telemetry::{TRACEPARENT, Trace};
use crate::upstream::{AnswerCheck, MessageStream, Outgoing, Reply, Upstream, UpstreamError};
use serde_json::Value;

/// The per-backend step (see the module doc for its fixed order). A `tools/call` is also
/// counted in the backend's per-tool metrics, whatever the step decided (`stats::tools`).
pub async fn step(
    core: &Core,
    ctx: &mut RequestCtx,
    backend: &Arc<Backend>,
    req: &StepRequest<'_>,
) -> Result<Answer, GatewayError> {
    let tool = called_tool(req.message);
    // One async frame for steps 1 to 7 (admission is synchronous): every frame between the
    // listener and the transport is polled again at each wake-up of the request.
    let admitted = match admit(core, ctx, backend, req) {
        // The caller's own upstream token, where the backend wants one (rare: boxed).
        Ok(guards) if core.auth.exchanges_for(&backend.name) => {
            Box::pin(exchange_token(core, ctx, backend, req))
                .await
                .map(|()| guards)
        }
        admitted => admitted,
    };
    let answer = match admitted {
        Err(e) => Err(e),
        // Held until the answer head is in (4., 5.).
        Ok((policy, _admission, _busy)) => {
            let before = ctx.upstream;
            // 6. cache, 7. forward or bridge
            let answer = match req.message {
                Message::Unread { method, .. } => pass_through(ctx, backend, req, method).await,
                // A policy filters a list's answer: that one is read, judged or not.
                Message::Judged(env) if policy.is_none() || env.method != "tools/list" => {
                    pass_through(ctx, backend, req, &env.method).await
                }
                Message::Parsed(env) | Message::Judged(env) => {
                    // Boxed: the cache and bridge futures are large, and inline they would set
                    // the size (and the cost of every move) of the pass-through path's state too.
                    Box::pin(answer(core, ctx, backend, req, env))
                        .await
                        .map(|reply| match policy {
                            Some(f) if env.method == "tools/list" => {
                                filter_tools_reply(reply, f, req.exposure)
                            }
                            _ if env.method == "server/discover" => portico_versions(reply),
                            // Fetched with the caller's own token: the caller's own view.
                            _ if protocol::is_cacheable_method(&env.method)
                                && core.auth.exchanges_for(&backend.name) =>
                            {
                                // The caller's own view (`policy::private_scope`).
                                reply.map_messages(crate::policy::private_scope)
                            }
                            _ => reply,
                        })
                        .map(|r| Answer::Reply(Box::new(r)))
                }
            };
            record_exchange(backend, ctx, before, &answer);
            answer
        }
    };
    if let Some(tool) = tool {
        let status = match &answer {
            Ok(Answer::Relayed(r)) => Some(r.status()),
            Ok(Answer::Reply(r)) => Some(r.status),
            Err(e) => Some(e.status()),
            // Not answered yet: the caller takes the step again, through the bridge.
            Ok(Answer::Reprobed) => None,
        };
        if let Some(status) = status {
            // Timed from the request's start to the answer head (no clock read of its own).
            let took = ctx.age_at_answer();
            let tools = &backend.stats.tools;
            tools.record(&core.metrics, &backend.name, tool, status.as_u16(), took);
        }
    }
    answer
}

/// The caller's upstream credentials on `backend` outside a request to it (a legacy client's
/// `DELETE` closing its upstream sessions): its team's headers and, where the backend
/// exchanges tokens, the token exchanged for it — or none when the exchange fails (closing is
/// best effort).
pub async fn credentials_outside(
    core: &Core,
    ctx: &RequestCtx,
    backend: &Backend,
    headers: &HeaderMap,
) -> Vec<(HeaderName, HeaderValue)> {
    let mut token = None;
    if core.auth.exchanges_for(&backend.name) {
        let exchanged = core.auth.exchanged(&core.metrics, &backend.name, headers);
        let timeout = std::time::Duration::from_millis(backend.cfg.timeout_ms);
        if let Ok(Ok(found)) = tokio::time::timeout(timeout, exchanged).await {
            token = found;
        }
    }
    with_token(team_credentials(ctx, backend), token.as_ref()).into_owned()
}

/// `[backends.token_exchange]`: the caller's token exchanged for one for `backend`, kept in
/// the context for the request about to go out ([`credentials`]).
async fn exchange_token(
    core: &Core,
    ctx: &mut RequestCtx,
    backend: &Backend,
    req: &StepRequest<'_>,
) -> Result<(), GatewayError> {
    let exchange = core
        .auth
        .exchanged(&core.metrics, &backend.name, req.headers);
    // Within the request's deadline too, when that is sooner than the exchange's own bound.
    let authorization = tokio::time::timeout_at(req.deadline, exchange)
        .await
        .map_err(|_| GatewayError::TokenExchange {
            backend: backend.name.to_string(),
            detail: "the identity provider did not answer within the request's deadline".into(),
            refused: false,
        })??;
    ctx.exchanged = authorization.map(|a| Box::new((backend.name.clone(), a)));
    Ok(())
}

/// The tool a `tools/call` names: the body's name, or for an unread body the `Mcp-Name`
/// header (which a modern backend checks against the body itself; README, "Why header
/// routing is safe"). Only a label: `stats::tools` keeps it to names the backend listed.
fn called_tool(message: Message<'_>) -> Option<&str> {
    match message {
        Message::Parsed(env) | Message::Judged(env) if env.method == "tools/call" => {
            Some(env.name.as_deref().unwrap_or(""))
        }
        Message::Unread {
            method: "tools/call",
            name,
        } => Some(name.unwrap_or("")),
        _ => None,
    }
}

/// Steps 1 to 5: the team's tool policy for step 6/7 (a `tools/list` is filtered by it), and
/// the guards that hold the backend's concurrency slot and in-flight count.
fn admit<'c>(
    core: &'c Core,
    ctx: &mut RequestCtx,
    backend: &'c Backend,
    req: &StepRequest<'_>,
) -> Result<
    (
        Option<&'c ToolFilter>,
        resilience::Admission,
        crate::stats::Busy<'c>,
    ),
    GatewayError,
> {
    if ctx
        .backend
        .as_ref()
        .is_none_or(|b| !Arc::ptr_eq(b, &backend.name))
    {
        ctx.backend = Some(backend.name.clone());
    }
    // 1. allow_teams
    may_use(ctx, backend)?;
    // 2. rate limit
    charge(core, ctx)?;
    // 3. team tool policy and tool rate limits, on the client's names
    let principal = ctx.principal.as_deref();
    let policy = core.auth.policy(principal);
    let limited = core.auth.tool_limited(principal);
    if policy.is_some() || limited {
        match req.message {
            Message::Unread { .. } => {
                // `can_pass_through` never lets this happen; refuse rather than forward a body
                // nobody judged.
                return Err(GatewayError::Internal(
                    "a request under a tool policy or tool limit must be read".into(),
                ));
            }
            Message::Parsed(env) | Message::Judged(env) if env.method == "tools/call" => {
                // A name that is not a string is no name a glob can vouch for; another reader
                // might still turn it into one (`7` → `"7"`).
                let Some(name) = env.name.as_deref() else {
                    return Err(GatewayError::InvalidParams(
                        "params.name must be a string".into(),
                    ));
                };
                let exposed = req.exposure.name(name);
                if policy.is_some_and(|f| !f.allows(&exposed)) {
                    return Err(GatewayError::Forbidden(format!(
                        "tool {exposed:?} is not allowed for your team"
                    )));
                }
                // Once per client request: a call the step takes again (re-probed) is one call.
                if limited && !ctx.tool_charged {
                    ctx.tool_charged = true;
                    core.auth.charge_tool(principal, &exposed)?;
                }
            }
            Message::Parsed(_) | Message::Judged(_) => {}
        }
    }
    // 4. max_concurrent, 5. circuit breaker
    let admission = backend.resilience.admit(&backend.name)?;
    Ok((policy, admission, backend.stats.busy()))
}

/// Records into the backend's status-page statistics an exchange that reached it (it added
/// upstream time; a cache hit or a refusal by portico has none): the backend's faults, as the
/// breaker counts them, and 5xx answers are failures.
fn record_exchange(
    backend: &Backend,
    ctx: &RequestCtx,
    before: Option<std::time::Duration>,
    answer: &Result<Answer, GatewayError>,
) {
    let after = ctx.upstream;
    let (Some(took), Some(at)) = (
        after.map(|a| a.saturating_sub(before.unwrap_or_default())),
        ctx.answered,
    ) else {
        return;
    };
    if after == before {
        return;
    }
    let failure = match answer {
        Ok(Answer::Relayed(r)) if r.status().is_server_error() => Some("backend_5xx"),
        Ok(Answer::Reply(r)) if r.status.is_server_error() => Some("backend_5xx"),
        Ok(_) => None,
        Err(e) if resilience::is_backend_failure(e) => Some(e.reason()),
        Err(_) => None,
    };
    crate::stats::record_latency(&backend.stats, at, took, failure.is_none(), failure);
}

/// [`step`] for a parsed message, when the caller wants decoded messages; the upstream checks
/// the answer. (A plain function returning the future, not an `async fn` around it: no second
/// state machine on the message path.)
#[allow(clippy::too_many_arguments)]
pub fn call<'a>(
    core: &'a Core,
    ctx: &'a mut RequestCtx,
    backend: &'a Arc<Backend>,
    exposure: Exposure<'a>,
    headers: &'a HeaderMap,
    env: &'a Envelope,
    body: Bytes,
    deadline: Instant,
) -> impl Future<Output = Result<Reply, GatewayError>> + 'a {
    call_checked(
        core,
        ctx,
        backend,
        exposure,
        headers,
        env,
        body,
        deadline,
        AnswerCheck::Upstream,
    )
}

/// [`call`] with the answer checked by whom `check` says (`AnswerCheck::Caller`: an
/// aggregated list's parts, read whole by the merge).
#[allow(clippy::too_many_arguments)]
pub async fn call_checked(
    core: &Core,
    ctx: &mut RequestCtx,
    backend: &Arc<Backend>,
    exposure: Exposure<'_>,
    headers: &HeaderMap,
    env: &Envelope,
    body: Bytes,
    deadline: Instant,
    check: AnswerCheck,
) -> Result<Reply, GatewayError> {
    let req = StepRequest {
        headers,
        message: Message::Parsed(env),
        body,
        exposure,
        deadline,
        check,
    };
    match step(core, ctx, backend, &req).await? {
        Answer::Reply(r) => Ok(*r),
        // Only unread bodies are relayed or re-probed.
        Answer::Relayed(_) | Answer::Reprobed => Err(GatewayError::Internal(
            "a parsed message came back unparsed".into(),
        )),
    }
}

/// Step 1: whether the caller's team may use `backend` at all (`allow_teams`). Aggregated
/// lists leave out the members this refuses.
pub fn may_use(ctx: &RequestCtx, backend: &Backend) -> Result<(), GatewayError> {
    if backend.cfg.allow_teams.is_empty() {
        return Ok(());
    }
    Auth::check_team(
        ctx.principal.as_deref(),
        &backend.cfg.allow_teams,
        &format!("/mcp/{}", backend.name),
    )
}

/// Step 2: charges the caller's rate limit once per client request.
pub fn charge(core: &Core, ctx: &mut RequestCtx) -> Result<(), GatewayError> {
    if !ctx.rate_charged {
        ctx.rate_charged = true;
        core.auth.rate_limit(ctx.principal.as_deref())?;
    }
    Ok(())
}

/// Steps 6 and 7 for a parsed message: the cache for cacheable requests (docs/protocol.md §3: discover,
/// the four lists, `resources/read`), else the backend.
async fn answer(
    core: &Core,
    ctx: &mut RequestCtx,
    backend: &Arc<Backend>,
    req: &StepRequest<'_>,
    env: &Envelope,
) -> Result<Reply, GatewayError> {
    match (env.kind, env.id.as_ref()) {
        (Kind::Request, Some(id))
            if core.cache.enabled()
                && protocol::is_cacheable_method(&env.method)
                && !core.auth.exchanges_for(&backend.name) =>
        {
            // Boxed: the cache's future is the largest here (~5.9 KB), and inline it would be
            // copied with every other request's (`-Zprint-type-sizes`).
            Box::pin(cached(core, ctx, backend, req, env, id)).await
        }
        _ => {
            let params = params::param_headers(core, ctx, backend, req, env).await;
            let sent = StdInstant::now();
            // An initialize-era client cancels by `notifications/cancelled` on another POST,
            // whatever the backend: its calls are registered even where the upstream is its
            // own (a 2026-07-28 backend, which a cancel reaches as its stream closing).
            let reply = if shared_upstream(backend) || ctx.client.is_some() {
                cancellable(core, ctx, backend, req, env, &params).await
            } else {
                call_backend(ctx, None, backend, req, env, &params).await
            };
            ctx.upstream_since(sent);
            if req.check == AnswerCheck::Upstream {
                backend.resilience.record_result(&reply);
            }
            if let Ok(Reply {
                messages: MessageStream::One(answer),
                ..
            }) = &reply
            {
                match env.method.as_str() {
                    "tools/list" => backend.learn_tools_list(answer),
                    // The server refused the headers: what portico knows of the tool's schema
                    // is stale; the next call looks it up afresh.
                    "tools/call" if params::is_header_mismatch(answer) => {
                        if let Some(tool) = env.name.as_deref() {
                            backend.tool_params.forget(tool);
                        }
                    }
                    _ => {}
                }
            }
            reply
        }
    }
}

/// Step 7 on a shared upstream, or for an initialize-era client: a request is registered under
/// its client's scope for the time it is in flight, so the client's `notifications/cancelled`
/// drops it (and the transport tells the server, with the id the server saw, or a 2026-07-28
/// server sees the request's stream close); a cancel is looked up there and never forwarded.
async fn cancellable(
    core: &Core,
    ctx: &RequestCtx,
    backend: &Arc<Backend>,
    req: &StepRequest<'_>,
    env: &Envelope,
    params: &[(HeaderName, HeaderValue)],
) -> Result<Reply, GatewayError> {
    let owner = with_input_side(core, owner_of(ctx, req.headers, env));
    match (env.kind, &env.id) {
        (Kind::Request, Some(id)) => {
            let (registration, mut cancelled) = core.calls.register(owner.scope, id.clone());
            let call = call_backend(ctx, Some(&owner), backend, req, env, params);
            tokio::select! {
                reply = call => {
                    reply.map(|r| until_cancelled(r, registration, cancelled))
                }
                _ = &mut cancelled => Err(GatewayError::Cancelled),
            }
        }
        (Kind::Notification, _) if env.method == "notifications/cancelled" => {
            if let Some(id) = cancelled_id(&req.body) {
                let n = core.calls.cancel(owner.scope, &id);
                tracing::debug!(backend = %backend.name, id = id.json(), found = n, "client cancelled a request");
            }
            Ok(Reply::accepted())
        }
        _ => call_backend(ctx, Some(&owner), backend, req, env, params).await,
    }
}

/// Step 7 on the message path: initialize-era backends through the bridge (in the owner's
/// upstream session: `owner_of` when not given), modern ones forwarded (with `params`, the
/// `Mcp-Param-*` headers portico built, where missing).
async fn call_backend(
    ctx: &RequestCtx,
    owner: Option<&Arc<bridge::Owner>>,
    backend: &Arc<Backend>,
    req: &StepRequest<'_>,
    env: &Envelope,
    params: &[(HeaderName, HeaderValue)],
) -> Result<Reply, GatewayError> {
    let verdict = bridge::ensure_verdict(backend).await?;
    if verdict == Verdict::Legacy {
        let team = credentials(ctx, backend);
        let owner = match owner {
            Some(o) => o.clone(),
            None => owner_of(ctx, req.headers, env),
        };
        let bridged = match &ctx.trace {
            None => {
                bridge::call(
                    backend,
                    &owner,
                    env,
                    &req.body,
                    req.headers,
                    &team,
                    req.deadline,
                )
                .await
            }
            Some(trace) => Box::pin(bridge_traced(trace, backend, &owner, req, env, &team)).await,
        };
        match bridged? {
            bridge::Bridged::Answer(reply) => return Ok(reply),
            // The probe had it wrong (a slow-starting modern server): re-probed, so this
            // request and every later one take the modern path.
            bridge::Bridged::Modern => {}
        }
    }
    forward(ctx, backend, req, env, params).await
}

/// The bridge, as one span (its session handshake is portico's own traffic); the translated
/// request carries the span's `traceparent`.
async fn bridge_traced(
    trace: &Trace,
    backend: &Arc<Backend>,
    owner: &bridge::Owner,
    req: &StepRequest<'_>,
    env: &Envelope,
    team: &[(HeaderName, HeaderValue)],
) -> Result<bridge::Bridged, GatewayError> {
    let span = trace.attempt(&backend.name, "bridge", 1);
    let mut extra = team.to_vec();
    extra.push((TRACEPARENT, span.traceparent()));
    let r = bridge::call(
        backend,
        owner,
        env,
        &req.body,
        req.headers,
        &extra,
        req.deadline,
    )
    .await;
    // A backend found modern after all was not bridged: the caller forwards instead.
    if !matches!(r, Ok(bridge::Bridged::Modern)) {
        trace.bridged();
    }
    span.end(match &r {
        Ok(bridge::Bridged::Answer(reply)) => Ok(Some(reply.status.as_u16())),
        Ok(bridge::Bridged::Modern) => Ok(None),
        Err(e) => Err(e.reason()),
    });
    r
}

/// Sends a modern message to a modern backend on the message path.
async fn forward(
    ctx: &RequestCtx,
    backend: &Backend,
    req: &StepRequest<'_>,
    env: &Envelope,
    params: &[(HeaderName, HeaderValue)],
) -> Result<Reply, GatewayError> {
    let mut extra = mirror_headers(env);
    extra.extend(
        params
            .iter()
            .filter(|(name, _)| !req.headers.contains_key(name))
            .cloned(),
    );
    extra.extend_from_slice(&credentials(ctx, backend));
    let sent = match &ctx.trace {
        None => {
            with_retry(backend, &env.method, || {
                backend.upstream.call(Outgoing {
                    body: req.body.clone(),
                    client_headers: req.headers,
                    extra: extra.clone(),
                    deadline: req.deadline,
                    check: req.check,
                })
            })
            .await
        }
        Some(trace) => Box::pin(forward_traced(trace, backend, req, env, &extra)).await,
    };
    sent.map_err(|e| GatewayError::from_upstream(&backend.name, backend.cfg.timeout_ms, &e))
}

/// [`forward`] with a span per attempt, whose `traceparent` the upstream request carries.
async fn forward_traced(
    trace: &Trace,
    backend: &Backend,
    req: &StepRequest<'_>,
    env: &Envelope,
    extra: &[(HeaderName, HeaderValue)],
) -> Result<Reply, UpstreamError> {
    let mut n = 0;
    with_retry(backend, &env.method, || {
        n += 1;
        let span = trace.attempt(&backend.name, "message", n);
        let mut extra = extra.to_vec();
        extra.push((TRACEPARENT, span.traceparent()));
        let call = backend.upstream.call(Outgoing {
            body: req.body.clone(),
            client_headers: req.headers,
            extra,
            deadline: req.deadline,
            check: req.check,
        });
        async move {
            let r = call.await;
            span.end(match &r {
                Ok(reply) => Ok(Some(reply.status.as_u16())),
                Err(e) => Err(upstream_reason(backend, e)),
            });
            r
        }
    })
    .await
}

/// The one retry loop: an idempotent method whose connection could not be made is sent again,
/// within the backend's `retries` and retry budget. Nothing that reached the backend is resent.
pub async fn with_retry<T, F, Fut>(
    backend: &Backend,
    method: &str,
    mut send: F,
) -> Result<T, UpstreamError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, UpstreamError>>,
{
    let mut attempt = 0;
    loop {
        match send().await {
            Err(e @ UpstreamError::Connect(_))
                if protocol::is_idempotent(method) && backend.resilience.take_retry(attempt) =>
            {
                tracing::debug!(backend = %backend.name, error = %e, "retrying");
                attempt += 1;
            }
            r => return r,
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
    // A method portico knows has a static name: no copy of it per request.
    let method = match protocol::method_info(&env.method) {
        Some(m) => Ok(HeaderValue::from_static(m.name)),
        None => HeaderValue::from_str(&env.method),
    };
    if let Ok(v) = method {
        out.push((h::names::METHOD, v));
    }
    if let Some(name) = &env.name
        && let Ok(v) = HeaderValue::from_str(&protocol::encode_header_value(name))
    {
        out.push((h::names::NAME, v));
    }
    out
}

/// The upstream credentials of the caller: its team's, if the backend configures any, and
/// the token exchanged for it (`[backends.token_exchange]`), which wins over them.
fn credentials<'a>(ctx: &RequestCtx, backend: &'a Backend) -> Cow<'a, [(HeaderName, HeaderValue)]> {
    let exchanged = ctx
        .exchanged
        .as_deref()
        .filter(|(name, _)| **name == *backend.name)
        .map(|(_, authorization)| authorization);
    with_token(team_credentials(ctx, backend), exchanged)
}

/// The caller's team's `team_headers` on `backend`, if it configures any.
fn team_credentials<'a>(ctx: &RequestCtx, backend: &'a Backend) -> &'a [(HeaderName, HeaderValue)] {
    ctx.principal
        .as_deref()
        .and_then(|p| p.team.as_deref())
        .and_then(|t| backend.team_headers.get(t))
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// `team` with an exchanged token's `Authorization` after it (so it wins), if there is one.
fn with_token<'a>(
    team: &'a [(HeaderName, HeaderValue)],
    token: Option<&HeaderValue>,
) -> Cow<'a, [(HeaderName, HeaderValue)]> {
    match token {
        Some(authorization) => {
            let mut out = team.to_vec();
            out.push((http::header::AUTHORIZATION, authorization.clone()));
            Cow::Owned(out)
        }
        None => Cow::Borrowed(team),
    }
}

/// Step 3 on the way back: removes the tools the team policy hides from a `tools/list`
/// answer, judged by the names the client sees, and labels the answer `private` (it is this
/// team's view, whatever the backend said). Only the final response is touched; notifications
/// about the request go through as they are.
fn filter_tools_reply(reply: Reply, filter: &ToolFilter, exposure: Exposure<'_>) -> Reply {
    let filter = filter.clone();
    let (prefix, separator) = (exposure.prefix.to_string(), exposure.separator.to_string());
    let keep = move |name: &str| filter.allows(&Exposure::member(&prefix, &separator).name(name));
    reply.map_messages(move |b| crate::policy::filter_tools(b, &keep))
}

/// Whose upstream session a request uses, and whose calls its cancel may reach: the legacy
/// client's own session, or the authorization context (principal or credential digest, and
/// team) with the declared capabilities (`bridge::owner`).
pub fn owner_of(ctx: &RequestCtx, headers: &HeaderMap, env: &Envelope) -> Arc<bridge::Owner> {
    if let Some(o) = &ctx.client {
        return o.clone();
    }
    let principal = ctx.principal.as_deref();
    let mut context = match auth::partition(principal, headers) {
        Partition::Anonymous => b"anonymous".to_vec(),
        Partition::Credential(d) => [b"credential:".as_slice(), &d].concat(),
        Partition::Principal(p) => [b"principal:".as_slice(), p.as_bytes()].concat(),
    };
    if let Some(team) = principal.and_then(|p| p.team.as_deref()) {
        context.extend_from_slice(b"\0team:");
        context.extend_from_slice(team.as_bytes());
    }
    Arc::new(bridge::Owner::client(
        &context,
        env.client_capabilities.as_deref(),
        env.client_info.as_deref(),
    ))
}

/// A 2026-07-28 client receives a legacy server's requests during a call as
/// `input_required`, its call parked under a `requestState` sealed with the `[sessions]` key
/// (`bridge::input`); an initialize-era client's owner already says how it receives them.
fn with_input_side(core: &Core, mut owner: Arc<bridge::Owner>) -> Arc<bridge::Owner> {
    if owner.input.is_none() && !owner.portico {
        Arc::make_mut(&mut owner).input = Some(bridge::InputSide::Park {
            states: core.sessions.states.clone(),
            replica: core.config.sessions.advertise_url.as_deref().map(Arc::from),
        });
    }
    owner
}

/// Whether requests to `backend` travel on a shared upstream whose ids portico rewrites (a
/// legacy session, a stdio child): where a client's cancel must be mapped to its own call.
fn shared_upstream(backend: &Backend) -> bool {
    match backend.transport() {
        Upstream::Stdio(_) => true,
        Upstream::Http(_) => backend.verdict() != Verdict::Modern,
        Upstream::Builtin(_) => false,
    }
}

/// A client's `notifications/cancelled`: the `requestId` it names, in its own id space.
fn cancelled_id(body: &[u8]) -> Option<RequestId> {
    let v: Value = serde_json::from_slice(body).ok()?;
    RequestId::from_value(v.get("params")?.get("requestId")?)
}

/// Ends a reply's stream when its client cancels the call; the registration leaves with it.
fn until_cancelled(
    reply: Reply,
    registration: calls::Registration,
    cancelled: tokio::sync::oneshot::Receiver<()>,
) -> Reply {
    use futures_util::StreamExt;
    match reply.messages {
        MessageStream::Many(s) => Reply {
            messages: MessageStream::Many(
                s.take_until(cancelled)
                    .map(move |m| {
                        let _held = &registration;
                        m
                    })
                    .boxed(),
            ),
            ..reply
        },
        _ => reply,
    }
}

/// `server/discover` through portico advertises the versions portico serves on every URL —
/// the ones `-32022` lists (`frontend`): 2026-07-28 for stateless requests, the
/// initialize-era ones through `initialize` (docs/protocol.md §5; digest §8 item 18).
fn portico_versions(reply: Reply) -> Reply {
    // Streamed (an SSE answer): the response among the messages, as it passes.
    reply.map_messages(with_portico_versions)
}

/// One message with portico's `supportedVersions` if it is a result (anything else as is).
fn with_portico_versions(msg: Bytes) -> Bytes {
    let Ok(mut v) = serde_json::from_slice::<Value>(&msg) else {
        return msg;
    };
    let Some(result) = v.get_mut("result").and_then(Value::as_object_mut) else {
        return msg;
    };
    let supported = serde_json::json!(protocol::SUPPORTED_VERSIONS);
    if result.get("supportedVersions") == Some(&supported) {
        return msg;
    }
    result.insert("supportedVersions".into(), supported);
    Bytes::from(v.to_string())
}

mod cached;
pub mod calls;
pub mod clients;
mod context;
mod params;
mod pass;

pub use cached::cache_keyed;
use cached::cached;
pub use context::{Answer, Core, Exposure, FinishLater, Message, RequestCtx, StepRequest};
pub use pass::{can_pass_through, can_relay};
use pass::{pass_through, upstream_reason};

#[cfg(test)]
mod tests;
