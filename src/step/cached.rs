//! Step 6: a cacheable request served from the shared cache, or fetched once (single-flight)
//! through the rest of the step and stored when its result allows.

use super::*;

/// A cacheable request: served from the shared cache, or fetched (single-flight) and stored
/// when the result allows it.
pub(super) async fn cached(
    core: &Core,
    ctx: &mut RequestCtx,
    backend: &Arc<Backend>,
    req: &StepRequest<'_>,
    env: &Envelope,
    id: &RequestId,
) -> Result<Reply, GatewayError> {
    // The param that selects the result: `uri` for a read (as JSON, like the cursor), else
    // the cursor. Anything else in params does not shape a cacheable result (docs/protocol.md §3).
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
        client_info: env.client_info.as_deref(),
        covers: &[],
    };
    // Private entries belong to the authenticated principal, or (auth mode none) to a digest
    // of the caller's credential.
    let partition = auth::partition(ctx.principal.as_deref(), req.headers);
    // Upstream time only when this request itself went upstream (a hit or a coalesced wait
    // has none), in µs: an atomic because the fetch future must stay `Send`.
    let upstream_us = std::sync::atomic::AtomicU64::new(u64::MAX);
    let shared: &RequestCtx = ctx;
    let keyed = cache_keyed(env, req.headers);
    let req = &StepRequest {
        body: req.body.clone(),
        check: AnswerCheck::Upstream,
        ..*req
    };
    let served = core
        .cache
        .get_or_fetch(&key, &partition, id, env.is_retry || !keyed, || async {
            let sent = StdInstant::now();
            let reply = call_backend(shared, None, backend, req, env, &[]).await;
            backend.resilience.record_result(&reply);
            upstream_us.store(
                sent.elapsed().as_micros() as u64,
                std::sync::atomic::Ordering::Relaxed,
            );
            let reply = reply?;
            let status = reply.status.as_u16();
            let message = reply
                .final_message(&backend.name, backend.cfg.timeout_ms)
                .await?;
            if env.cursor.is_some() && is_error(&message) {
                // The backend refused a cursor (the list moved on): the pages cached after it
                // belong to a list that no longer exists.
                core.cache.invalidate(&backend.name, &env.method);
            }
            Ok::<_, GatewayError>(Fetched { status, message })
        })
        .await?;
    let us = upstream_us.into_inner();
    if us != u64::MAX {
        ctx.add_upstream(std::time::Duration::from_micros(us), StdInstant::now());
    }
    ctx.cache = Some(served.outcome.label());
    // The names a backend lists bound its per-tool metrics: learnt from each answer that is
    // new to this replica (a local hit was learnt when it was stored; coalesced and stale
    // answers were learnt by the fetch that made them).
    if env.method == "tools/list" && matches!(served.outcome, Outcome::Miss | Outcome::SharedHit) {
        backend.learn_tools_list(&served.body);
    }
    if served.ttl_remaining_ms.is_some() {
        // Something of this backend is (or was just) in the cache: listen for its changes.
        core.watchers.ensure(backend, &core.cache);
    }
    let status = http::StatusCode::from_u16(served.status).unwrap_or(http::StatusCode::BAD_GATEWAY);
    Ok(Reply::one(status, served.body))
}

/// Whether everything that can shape a cacheable request's answer is in its cache key; if not,
/// the request goes around the cache: a param beyond the selector, a `_meta` member the key
/// does not cover, or an `Mcp-Param-*` header (arguments mirrored; a cacheable method has none).
pub fn cache_keyed(env: &Envelope, headers: &HeaderMap) -> bool {
    !env.params_beyond_selector
        && !env.meta_beyond_keyed
        && !headers
            .keys()
            .any(|k| k.as_str().starts_with(h::PARAM_PREFIX))
}

/// Whether a JSON-RPC response is an error.
fn is_error(message: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Shape<'a> {
        #[serde(borrow)]
        error: Option<&'a serde_json::value::RawValue>,
    }
    serde_json::from_slice::<Shape>(message).is_ok_and(|m| m.error.is_some())
}
