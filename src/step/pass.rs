//! Step 7 without the message path: when a body may go upstream unread (or once judged) and
//! the answer be relayed as the backend wrote it, and the relay itself — with the re-probe
//! when a backend refuses the way only an initialize-era server does.

use super::*;

/// Pass-through is allowed when nothing portico does depends on the body: a backend known to
/// speak 2026-07-28 over HTTP validates the headers itself.
///
/// Never passed through, because a decision then depends on the body:
/// - `verify_body = "always"` and a caller under a tool policy (checked against the parsed
///   body, never the headers alone): read, judged, then relayed ([`can_relay`]);
/// - everything [`can_relay`] refuses.
pub fn can_pass_through(
    core: &Core,
    ctx: &RequestCtx,
    backend: &Backend,
    mh: &ModernHead<'_>,
) -> bool {
    backend.cfg.verify_body == VerifyBody::Auto
        && core.auth.policy(ctx.principal.as_deref()).is_none()
        && !core.auth.tool_limited(ctx.principal.as_deref())
        && mh
            .method
            .is_some_and(|m| can_relay(core, ctx, backend, mh, m))
}

/// Whether a 2026-07-28 client's request may have its answer passed on as the backend wrote
/// it: unread ([`can_pass_through`]), or read and judged by the caller (its headers checked
/// against its body, under `verify_body = "always"` or a tool policy; [`Message::Judged`]),
/// when that judgement is all the body decides. Never, because portico then writes or reads
/// the exchange:
/// - an unknown protocol version, a backend of another kind or era;
/// - a cacheable method while the cache is on (the key comes from the body, and the body must
///   agree with the headers before an entry is served or stored), or from a backend that
///   exchanges its callers' tokens (the answer is labelled the caller's own: `private`);
/// - `server/discover`, whose `supportedVersions` portico rewrites to its own;
/// - `subscriptions/listen`, whose notifications get the client's `subscriptionId` and whose
///   stream is counted while open;
/// - a `tools/call` portico wrote itself, which needs its `Mcp-Param-*` headers built.
///
/// (A `tools/list` under a policy is judged and then still read, since its answer is filtered:
/// the step decides that, where the filter is.)
pub fn can_relay(
    core: &Core,
    ctx: &RequestCtx,
    backend: &Backend,
    mh: &ModernHead<'_>,
    method: &str,
) -> bool {
    !mh.unknown_version
        && backend.verdict() == Verdict::Modern
        && matches!(backend.upstream, Upstream::Http(_))
        && !((core.cache.enabled() || core.auth.exchanges_for(&backend.name))
            && protocol::is_cacheable_method(method))
        && method != "server/discover"
        && method != "subscriptions/listen"
        && !(ctx.built_by_portico && method == "tools/call")
}

/// Step 7 for an unread body (or a judged one): forwarded and relayed untouched. A refusal that does not look
/// like a modern server's means the backend changed under us (e.g. redeployed as a legacy
/// server): it is re-probed and the caller takes the bridge.
pub(super) async fn pass_through(
    ctx: &mut RequestCtx,
    backend: &Arc<Backend>,
    req: &StepRequest<'_>,
    method: &str,
) -> Result<Answer, GatewayError> {
    let Upstream::Http(up) = &backend.upstream else {
        return Err(GatewayError::Internal(
            "pass-through needs an HTTP backend".into(),
        ));
    };
    ctx.passthrough = true;
    let team = credentials(ctx, backend);
    let sent = StdInstant::now();
    let exchanged = match &ctx.trace {
        None => {
            with_retry(backend, method, || {
                up.forward(req.headers, &team, &req.body, req.deadline)
            })
            .await
        }
        // Boxed: the untraced path's state stays as small as it was.
        Some(trace) => Box::pin(pass_through_traced(trace, backend, up, req, &team, method)).await,
    };
    ctx.upstream_since(sent);
    let ex = match exchanged {
        Ok(ex) => ex,
        Err(e) => {
            let e = GatewayError::from_upstream(&backend.name, backend.cfg.timeout_ms, &e);
            backend
                .resilience
                .record(!resilience::is_backend_failure(&e));
            return Err(e);
        }
    };
    backend.resilience.record(true);
    let status = ex.response.status();
    let (parts, relay) = up.relay(ex, req.deadline, req.body.clone());
    if !matches!(status.as_u16(), 400 | 404 | 405 | 406) {
        return Ok(Answer::Relayed(Box::new(relay_response(
            parts,
            Body::Relay(Box::new(relay)),
        ))));
    }
    // Boxed: a rare path, kept out of the pass-through future's state.
    let refusal = Box::pin(read_small(relay)).await;
    if backend.cfg.protocol != Protocol::Auto
        || blames_the_request(&refusal)
        || bridge::classify_http(status.as_u16(), std::slice::from_ref(&refusal))
            != bridge::Classification::Legacy
    {
        return Ok(Answer::Relayed(Box::new(relay_response(
            parts,
            Body::full(refusal),
        ))));
    }
    bridge::reprobe(backend, "a modern request was refused in legacy fashion");
    ctx.passthrough = false;
    Ok(Answer::Reprobed)
}

/// [`pass_through`]'s exchange with a span per attempt, whose `traceparent` the upstream
/// request carries in place of the client's.
async fn pass_through_traced(
    trace: &Trace,
    backend: &Backend,
    up: &crate::upstream::http::HttpUpstream,
    req: &StepRequest<'_>,
    team: &[(HeaderName, HeaderValue)],
    method: &str,
) -> Result<crate::upstream::http::Exchange, UpstreamError> {
    let mut n = 0;
    with_retry(backend, method, || {
        n += 1;
        let span = trace.attempt(&backend.name, "pass_through", n);
        let mut extra = team.to_vec();
        extra.push((TRACEPARENT, span.traceparent()));
        async move {
            let r = up
                .forward(req.headers, &extra, &req.body, req.deadline)
                .await;
            span.end(match &r {
                Ok(ex) => Ok(Some(ex.response.status().as_u16())),
                Err(e) => Err(upstream_reason(backend, e)),
            });
            r
        }
    })
    .await
}

/// The reason word an upstream failure becomes (`GatewayError::reason`), for spans.
pub(super) fn upstream_reason(backend: &Backend, e: &UpstreamError) -> &'static str {
    GatewayError::from_upstream(&backend.name, backend.cfg.timeout_ms, e).reason()
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
