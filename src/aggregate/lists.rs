//! The four lists of an aggregated endpoint: one merged page per request — fanned out to the
//! members through the per-backend step, each member's answer read in one pass
//! (`merge::read_list_answer`), merged as text (`merge::merge_list`), paged with portico's own
//! signed cursor — and, with the cache on, the whole merged page cached as one entry.

use bytes::Bytes;
use http::StatusCode;
use serde_json::{Map, Value, json};

use super::{
    MAX_WALK_PAGES, Req, cursor, error_failure, fan_out, left_out, neither, server_meta, to_json,
};
use crate::auth;
use crate::cache::{Fetched, KeyInput};
use crate::error::GatewayError;
use crate::jsonrpc::write_str;
use crate::merge::{self, ListAnswer, ListKind};
use crate::protocol;
use crate::resilience::BreakerState;
use crate::step::{self, RequestCtx};
use crate::upstream::{AnswerCheck, Reply};

/// One merged list page: the first (no cursor) or the one a cursor points at. With the cache
/// on, the whole merged answer is cached as bytes and a hit is spliced with the caller's id like
/// a single backend's (issue #23 item 1), under a key that holds everything that shapes it:
/// - the endpoint (its path and a digest of its config, `Endpoint::cache_name`) and the
///   members it covers (`KeyInput::covers`), so any member's `list_changed`, refused cursor or
///   purge drops it with the member's own entries, here and on the other replicas;
/// - the caller's team (as the credential), since which members a team may use and the team's
///   tool policy shape the page; and the client's cursor, revision, capabilities, clientInfo;
/// - the scope: `private` (with the caller's authorization partition) when any part was
///   private or filtered by a team policy, else `public`.
///
/// A page that left a member out has `ttlMs: 0` and is never stored; nor is anything while a
/// member's breaker is open (the page must then be built without it, as a single backend's
/// cache hit would be refused).
pub(super) async fn list(
    req: &Req<'_>,
    ctx: &mut RequestCtx,
    kind: ListKind,
) -> Result<Reply, GatewayError> {
    let core = req.core;
    let env = req.env;
    let (true, Some(id)) = (core.cache.enabled(), env.id.as_ref()) else {
        return Ok(Reply::one(StatusCode::OK, merged_page(req, kind).await?));
    };
    let team = ctx
        .principal
        .as_deref()
        .and_then(|p| p.team.as_deref())
        .unwrap_or("");
    let key = KeyInput {
        backend: &req.ep.cache_name,
        credential_id: team,
        method: kind.method(),
        params: env.cursor.as_deref(),
        protocol_version: env
            .protocol_version
            .as_deref()
            .unwrap_or(protocol::LATEST_VERSION),
        capabilities: env.client_capabilities.as_deref(),
        client_info: env.client_info.as_deref(),
        covers: &req.ep.member_names,
    };
    let partition = auth::partition(ctx.principal.as_deref(), req.headers);
    // As for one backend (`step`): anything that could shape the answer outside the key, or a
    // member the breaker keeps out, goes around the cache.
    let bypass = env.is_retry
        || !step::cache_keyed(env, req.headers)
        || req
            .ep
            .members
            .iter()
            .any(|m| m.backend.resilience.state() == BreakerState::Open);
    let served = core
        .cache
        .get_or_fetch(&key, &partition, id, bypass, || async {
            let message = Bytes::from(merged_page(req, kind).await?);
            Ok::<_, GatewayError>(Fetched {
                status: 200,
                message,
            })
        })
        .await?;
    ctx.cache = Some(served.outcome.label());
    let status = StatusCode::from_u16(served.status).unwrap_or(StatusCode::BAD_GATEWAY);
    Ok(Reply::one(status, served.body))
}

/// Fetches, merges and writes one page as a JSON-RPC response (text, no tree).
async fn merged_page(req: &Req<'_>, kind: ListKind) -> Result<Vec<u8>, GatewayError> {
    let ep = req.ep;
    let targets = match &req.env.cursor {
        None => None,
        Some(raw) => {
            let invalid = || GatewayError::InvalidParams("invalid cursor".into());
            let text: String = serde_json::from_str(raw).map_err(|_| invalid())?;
            let key = &req.core.sessions.cursor_key;
            let pending = cursor::open(key, &ep.cursor_scope, kind.method(), &text)
                .filter(|p| p.parts.iter().all(|(i, _)| *i < ep.members.len()))
                .ok_or_else(invalid)?;
            Some(pending.parts)
        }
    };
    let (merged, degraded) = page(req, kind, targets).await?;
    let mut out = Vec::with_capacity(merged.items.len() + 256);
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.extend_from_slice(req.id_json().as_bytes());
    out.extend_from_slice(b",\"result\":{\"resultType\":\"complete\",");
    write_str(&mut out, kind.field());
    out.push(b':');
    out.extend_from_slice(&merged.items);
    // A page missing a member should not be held on to: the member may be back in a moment.
    let ttl = if degraded { 0 } else { merged.ttl_ms };
    out.extend_from_slice(format!(",\"ttlMs\":{ttl},\"cacheScope\":").as_bytes());
    out.extend_from_slice(if merged.private {
        b"\"private\""
    } else {
        b"\"public\""
    });
    if !merged.next.is_empty() {
        let pending = cursor::Pending {
            method: kind.method().into(),
            parts: merged.next,
        };
        let sealed = cursor::seal(&req.core.sessions.cursor_key, &ep.cursor_scope, &pending);
        out.extend_from_slice(b",\"nextCursor\":");
        write_str(&mut out, &sealed);
    }
    out.extend_from_slice(b",\"_meta\":");
    out.extend_from_slice(&to_json(&server_meta()));
    out.extend_from_slice(b"}}");
    Ok(out)
}

/// Fetches and merges one page. `targets`: `None` = every member's first page, else the
/// members and upstream cursors a cursor named.
async fn page(
    req: &Req<'_>,
    kind: ListKind,
    targets: Option<Vec<(usize, String)>>,
) -> Result<(merge::Merged, bool), GatewayError> {
    let ep = req.ep;
    let first = targets.is_none();
    let targets: Vec<(usize, Map<String, Value>)> = match targets {
        None => (0..ep.members.len()).map(|i| (i, Map::new())).collect(),
        Some(t) => t
            .into_iter()
            .map(|(i, c)| {
                let mut p = Map::new();
                p.insert("cursor".into(), json!(c));
                (i, p)
            })
            .collect(),
    };
    let method = kind.method();
    // Each answer is read whole once, by `read_list_answer`, not first by the upstream too —
    // unless the cache is on: each member's answer then goes through the cache, which stores
    // (and serves others) only what the upstream checked, and the step records the breaker.
    let check = if req.core.cache.enabled() {
        AnswerCheck::Upstream
    } else {
        AnswerCheck::Caller
    };
    let answers = fan_out(req, method, targets, check).await;
    let mut parts = Vec::with_capacity(answers.len());
    let mut degraded = false;
    for (i, answer) in &answers {
        let backend = &ep.namings[*i].backend;
        let failure = match answer {
            Ok(message) => {
                let read = merge::read_list_answer(kind, *i, message);
                if check == AnswerCheck::Caller {
                    let breaker = &ep.members[*i].backend.resilience;
                    breaker.record(!matches!(read, ListAnswer::Neither));
                }
                match read {
                    ListAnswer::Page(page) => {
                        parts.push(page);
                        continue;
                    }
                    ListAnswer::Error(e) => match error_failure(backend, method, &e) {
                        None => continue,
                        Some(f) => f,
                    },
                    ListAnswer::Neither => neither(backend),
                }
            }
            Err(e) => e.clone(),
        };
        left_out(req, *i, method, failure, &mut degraded)?;
    }
    let merged = merge::merge_list(kind, &ep.namings, &ep.separator, &parts).map_err(|c| {
        GatewayError::NameCollision {
            name: c.name,
            first: c.first,
            second: c.second,
        }
    })?;
    if merged.shadowed > 0 {
        tracing::debug!(endpoint = %ep.path, shadowed = merged.shadowed,
            "URIs listed by more than one member are routed to the first");
    }
    ep.learn(kind, first, &merged.owners)?;
    Ok((merged, degraded))
}

/// Walks a whole list (every page) to refresh the index; used when a call names something the
/// index does not know yet. Each page has its members' own timeouts, and the walk as a whole
/// the request's `deadline` (the endpoint's `timeout_ms`): a member that pages slowly must not
/// hold the request for `MAX_WALK_PAGES` × its timeout.
pub(super) async fn walk(
    req: &Req<'_>,
    kind: ListKind,
    deadline: tokio::time::Instant,
) -> Result<(), GatewayError> {
    let pages = async {
        let mut targets = None;
        for _ in 0..MAX_WALK_PAGES {
            let (merged, _) = page(req, kind, targets).await?;
            if merged.next.is_empty() {
                return Ok(());
            }
            targets = Some(merged.next);
        }
        Ok(())
    };
    tokio::time::timeout_at(deadline, pages)
        .await
        .map_err(|_| GatewayError::BackendTimeout {
            backend: req.ep.path.to_string(),
            timeout_ms: req.ep.timeout.as_millis() as u64,
        })?
}
