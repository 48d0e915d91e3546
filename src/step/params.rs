//! `Mcp-Param-*` headers for the `tools/call`s portico writes itself (docs/protocol.md §4,
//! `param_headers`): found in the backend's tool annotations as portico holds them, and when
//! a tool is not there, in a `tools/list` fetched for the caller through the cache.

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use serde_json::Value;
use std::future::Future;
use std::sync::Arc;
use tokio::time::Instant;

use super::{Core, Message, RequestCtx, StepRequest};
use crate::backend::{Backend, Verdict};
use crate::bridge;
use crate::frontend::Era;
use crate::protocol::{self, Envelope, header as h};
use crate::upstream::{AnswerCheck, Upstream};

/// Tool lists read to find one tool's annotations ([`param_headers`]); past this, no headers.
const MAX_TOOL_PAGES: usize = 16;
/// The shortest time between two `tools/list` fetches of one backend for [`param_headers`]
/// (calls of a tool the backend does not list must not each cost a list).
const TOOL_FETCH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// The `Mcp-Param-*` headers of a `tools/call` to a 2026-07-28 HTTP backend (docs/protocol.md
/// §4) that portico wrote itself — for an initialize-era client, an aggregated endpoint's
/// member (the body was rewritten), `portico stdio` — built from the tool's `x-mcp-header`
/// annotations as portico holds them; a tool portico has not seen listed is looked up in a
/// `tools/list` fetched for this caller, through the cache (so usually a hit on the caller's
/// own list). Empty for anything else: a 2026-07-28 client's own request carries the headers
/// it built, forwarded as sent (and `forward` adds only missing ones).
pub(super) async fn param_headers(
    core: &Core,
    ctx: &RequestCtx,
    backend: &Arc<Backend>,
    req: &StepRequest<'_>,
    env: &Envelope,
) -> Vec<(HeaderName, HeaderValue)> {
    let portico_writes =
        ctx.era == Some(Era::Legacy) || ctx.built_by_portico || !req.exposure.is_direct();
    // A 2026-07-28 client that sent `Mcp-Param-*` headers (through an aggregated endpoint)
    // built them from the list it was given: they go as sent, and nothing is looked up.
    let client_built = req
        .headers
        .keys()
        .any(|k| k.as_str().starts_with(h::PARAM_PREFIX));
    if env.method != "tools/call"
        || !portico_writes
        || client_built
        || !matches!(backend.upstream, Upstream::Http(_))
    {
        return Vec::new();
    }
    let Some(tool) = env.name.as_deref() else {
        return Vec::new();
    };
    if !matches!(bridge::ensure_verdict(backend).await, Ok(Verdict::Modern)) {
        return Vec::new();
    }
    let specs = match backend.tool_params.get(tool) {
        Some(specs) => specs,
        None => {
            fetch_tools(core, ctx, backend, req, tool).await;
            match backend.tool_params.get(tool) {
                Some(specs) => specs,
                None => return Vec::new(),
            }
        }
    };
    if specs.is_empty() {
        return Vec::new();
    }
    let Ok(v) = serde_json::from_slice::<Value>(&req.body) else {
        return Vec::new();
    };
    crate::param_headers::build(&specs, &v["params"]["arguments"])
}

/// Reads the backend's `tools/list` (page by page, until `tool` is found) as this caller —
/// same credential, same `_meta`, so the same cache entries as the caller's own list — and
/// learns its annotations. One fetch at a time per backend, at most one per
/// [`TOOL_FETCH_INTERVAL`]; failures teach nothing and leave the call without headers.
///
/// A boxed trait object, not an `async fn`: it calls [`super::answer`], which called it, and the
/// compiler proves `Send` for such a cycle only across a named type.
fn fetch_tools<'a>(
    core: &'a Core,
    ctx: &'a RequestCtx,
    backend: &'a Arc<Backend>,
    req: &'a StepRequest<'a>,
    tool: &'a str,
) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
    Box::pin(async move {
        let Ok(mut last) =
            tokio::time::timeout_at(req.deadline, backend.tool_params.fetching()).await
        else {
            return;
        };
        if backend.tool_params.get(tool).is_some()
            || last.is_some_and(|t| t.elapsed() < TOOL_FETCH_INTERVAL)
        {
            return;
        }
        *last = Some(Instant::now());
        let meta = serde_json::from_slice::<Value>(&req.body)
            .ok()
            .and_then(|mut v| v["params"]["_meta"].as_object_mut().map(std::mem::take))
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, _)| {
                [
                    protocol::meta::PROTOCOL_VERSION,
                    protocol::meta::CLIENT_CAPABILITIES,
                    protocol::meta::CLIENT_INFO,
                ]
                .contains(&k.as_str())
            })
            .collect::<serde_json::Map<String, Value>>();
        let mut headers = req.headers.clone();
        headers.remove(h::NAME);
        headers.remove(h::METHOD);
        let params: Vec<HeaderName> = headers
            .keys()
            .filter(|k| k.as_str().starts_with(h::PARAM_PREFIX))
            .cloned()
            .collect();
        for k in params {
            headers.remove(k);
        }
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_TOOL_PAGES {
            let mut params = serde_json::json!({ "_meta": meta });
            if let Some(c) = &cursor {
                params["cursor"] = Value::from(c.as_str());
            }
            let body = serde_json::json!({"jsonrpc":"2.0","id":"portico-tools","method":"tools/list","params":params});
            let body = Bytes::from(body.to_string());
            let Ok(list) = protocol::parse_envelope(&body) else {
                return;
            };
            let sub = StepRequest {
                headers: &headers,
                message: Message::Parsed(&list),
                body: body.clone(),
                exposure: req.exposure,
                deadline: req.deadline,
                check: AnswerCheck::Upstream,
            };
            // Its own context: the call's access-log line keeps the call's cache outcome.
            let mut sub_ctx = ctx.clone();
            let Ok(reply) = super::answer(core, &mut sub_ctx, backend, &sub, &list).await else {
                return;
            };
            let Ok(msg) = reply
                .final_message(&backend.name, backend.cfg.timeout_ms)
                .await
            else {
                return;
            };
            backend.tool_params.learn_list(&msg);
            if backend.tool_params.get(tool).is_some() {
                return;
            }
            let next = serde_json::from_slice::<Value>(&msg)
                .ok()
                .and_then(|v| v["result"]["nextCursor"].as_str().map(String::from));
            match next {
                Some(c) => cursor = Some(c),
                None => return,
            }
        }
    })
}

/// Whether a JSON-RPC response is a `-32020` (a header the server found missing or wrong).
pub(super) fn is_header_mismatch(message: &[u8]) -> bool {
    // Nearly every answer is no such error: parse only those that could be.
    static MISMATCH: protocol::Needle =
        protocol::Needle::new(|| memchr::memmem::Finder::new(b"-32020"));
    MISMATCH.is_in(message)
        && serde_json::from_slice::<Value>(message)
            .ok()
            .and_then(|v| v["error"]["code"].as_i64())
            == Some(protocol::code::HEADER_MISMATCH)
}
