//! The request pipeline. `handle` runs every phase in a fixed order and has one exit, where
//! metrics and the access log record what happened:
//!
//! 1. route: path → backend or endpoint (`router`); authenticate (before the body is read)
//! 2. front-end rules: method, origin, content type, accept, body limit (`frontend`)
//! 3. era: modern or initialize-era client (`frontend::era`)
//! 4. header checks; body check only when a decision depends on the body
//! 5. the per-backend step (`step`), once per backend the request reaches: admission, policy,
//!    cache, forward or bridge — directly, through an aggregated endpoint (`aggregate`) or
//!    after translating an initialize-era client's request (`legacy`)
//! 6. render: relay bytes, or turn decoded messages into JSON / SSE (`body::render`)
//! 7. exit: metrics + one log line (`State::observe`)

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use std::sync::Arc;
use tokio::time::Instant;

use crate::aggregate;
use crate::auth;
use crate::backend::Backend;
use crate::body::{Body, json_response, render, sse_event};
use crate::bridge;
use crate::error::GatewayError;
use crate::frontend::{self, Era, Head};
use crate::legacy;
use crate::protocol::{self, first_byte};
use crate::router::Route;
use crate::state::State;
use crate::step::{self, Answer, Exposure, Message, RequestCtx, StepRequest};
use crate::upstream::AnswerCheck;
use crate::upstream::http::is_event_stream;

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
    match resp
        .extensions()
        .get::<step::FinishLater>()
        .and_then(|f| f.take())
    {
        // The answer outlives this handler: recorded when it is done (`FinishLater`).
        Some(done) => {
            let state = state.clone();
            tokio::spawn(async move { state.observe(&done.await.unwrap_or(ctx)) });
        }
        None => state.observe(&ctx),
    }
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
    let last = if resp.extensions().get::<crate::body::Resumable>().is_some() {
        // The client takes the stream up again on another connection (SEP-1699).
        Bytes::from_static(crate::body::RECONNECT)
    } else {
        let last = GatewayError::StreamLimit {
            max_ms: server.max_stream_ms,
        };
        sse_event(&last.to_message(ctx.error_id().as_ref()))
    };
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
    state: &Arc<State>,
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
    // The request's span starts here and ends at the single exit (`State::observe`).
    ctx.trace = state.telemetry.request(ctx.traceparent.as_ref());
    ctx.audited = ctx.trace.is_some() || state.logs_access();
    let path = parts.uri.path();
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
    if let Route::Backend(b) = route {
        ctx.backend = Some(b.name.clone());
    }
    // 1b. who is calling (before the body is read); what they may do is the per-backend
    // step's to decide, once the body is in.
    if state.auth.enabled() {
        ctx.principal = state.auth.authenticate(&parts.headers, path).await?;
    }
    // 2. front-end rules
    match parts.method {
        Method::POST => {}
        Method::DELETE => {
            frontend::check_origin(&seen, &state.config.server.allowed_origins)?;
            return Box::pin(legacy::delete(state, ctx, path, route, &parts.headers)).await;
        }
        // An initialize-era client's notification stream (405 without a session id).
        Method::GET => {
            frontend::check_origin(&seen, &state.config.server.allowed_origins)?;
            ctx.era = Some(frontend::Era::Legacy);
            ctx.remote = parts.extensions.get::<frontend::InProcess>().is_none();
            return Box::pin(legacy::get(
                state,
                state.clone(),
                ctx,
                path,
                route,
                &parts.headers,
            ))
            .await;
        }
        _ => return Err(GatewayError::MethodNotAllowed),
    }
    frontend::check_origin(&seen, &state.config.server.allowed_origins)?;
    let clock = frontend::BodyClock::start(&state.config.server);
    let body = frontend::read_body(
        body,
        &parts.headers,
        state.config.server.max_body_bytes,
        clock,
    )
    .await?;
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
            ctx.built_by_portico = parts.extensions.get::<frontend::BuiltByPortico>().is_some();
            modern(state, ctx, backend, &parts.headers, head, body).await
        }
        (Era::Modern, Route::Endpoint(ep)) => {
            Box::pin(aggregate::serve(state, ctx, ep, &parts.headers, head, body)).await
        }
        (Era::Legacy, route) => {
            ctx.remote = parts.extensions.get::<frontend::InProcess>().is_none();
            Box::pin(legacy::serve(
                state,
                state.clone(),
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

/// A 2026-07-28 request to one backend: passed through unread when nothing portico decides
/// depends on the body, else parsed, checked against the headers and sent as a message — both
/// through the per-backend step.
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
    ctx.note_tool(mh.method, mh.name);
    // From the request's start: one clock read fewer, and the timeout counts portico's own time.
    // A listen stream is long-lived by design: held open past `timeout_ms` (keep-alive
    // comments meanwhile, `[server] sse_keepalive_ms`), bounded by `LISTEN_LIFETIME`.
    let listen = mh.method == Some("subscriptions/listen");
    let deadline = if listen {
        Instant::now() + bridge::LISTEN_LIFETIME
    } else {
        Instant::from_std(ctx.start) + backend.timeout
    };
    bridge::ensure_verdict(backend).await?;
    // Unread when nothing portico decides depends on the body; else read and judged here, and
    // when the judgement is all the body decides (`verify_body = "always"`, a policy), the
    // bytes judged go on as a pass-through's do and the answer is relayed (`step::can_relay`).
    let unread = mh
        .method
        .filter(|_| step::can_pass_through(state, ctx, backend, &mh));
    let env = match unread {
        // Cheap checks that need no parse: one object per POST.
        Some(_) => match first_byte(&body) {
            Some(b'{') => None,
            Some(b'[') => return Err(GatewayError::Batch),
            _ => return Err(GatewayError::Parse("body is not a JSON object".into())),
        },
        None => Some(judge(ctx, &head, &mh, &body)?),
    };
    let message = match (unread, &env) {
        (Some(method), _) => Some(Message::Unread {
            method,
            name: mh.name,
        }),
        (None, Some(e)) if step::can_relay(state, ctx, backend, &mh, &e.method) => {
            Some(Message::Judged(e))
        }
        _ => None,
    };
    if let Some(message) = message {
        let req = StepRequest {
            headers,
            message,
            body: body.clone(),
            exposure: Exposure::DIRECT,
            deadline,
            check: AnswerCheck::Upstream,
        };
        match step::step(state, ctx, backend, &req).await? {
            Answer::Relayed(resp) => return Ok(*resp),
            // The backend turned out initialize-era: served below, through the bridge.
            Answer::Reprobed => {}
            Answer::Reply(reply) => {
                let id = env.as_ref().and_then(|e| e.id.as_ref());
                return Ok(render(*reply, id, &backend.name, backend.cfg.timeout_ms).await);
            }
        }
    }
    let env = match env {
        Some(env) => env,
        None => judge(ctx, &head, &mh, &body)?,
    };
    // Boxed: the cache and bridge futures are large (see `step::step`).
    let reply = Box::pin(step::call(
        state,
        ctx,
        backend,
        Exposure::DIRECT,
        headers,
        &env,
        body,
        deadline,
    ))
    .await?;
    let reply = match (&env.id, listen) {
        (Some(id), true) => {
            bridge::to_client(reply, id, state.metrics.listen_stream(&backend.name))
        }
        _ => reply,
    };
    Ok(render(
        reply,
        env.id.as_ref(),
        &backend.name,
        backend.cfg.timeout_ms,
    )
    .await)
}

/// A 2026-07-28 body read and checked against its headers, its id and method noted.
fn judge(
    ctx: &mut RequestCtx,
    head: &Head<'_>,
    mh: &frontend::ModernHead<'_>,
    body: &[u8],
) -> Result<protocol::Envelope, GatewayError> {
    let env = protocol::parse_envelope(body).map_err(frontend::envelope_error)?;
    ctx.id = env.id.clone();
    if ctx.method.is_none() {
        ctx.method = Some(env.method.clone());
    }
    ctx.note_body_tool(Some(&env.method), env.name.as_deref());
    frontend::verify_modern(head, mh, &env)?;
    Ok(env)
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
        .metadata(path, |p| state.routes.routes.contains_key(p))
        .map(|doc| json_response(StatusCode::OK, doc))
        .ok_or_else(|| GatewayError::NoRoute {
            path: path.to_string(),
        })
}
