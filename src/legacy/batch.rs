//! JSON-RPC batches of 2025-03-26 clients.
//!
//! 2025-03-26 lets a client POST an array of requests, notifications and responses, and a
//! server must accept it; 2025-06-18 removed batches (docs/protocol.md §7 "Batching"), so
//! sessions of any later revision get `-32600`. portico serves each element as if it had been
//! posted alone in the session — the same checks, translation and per-backend step — all of
//! them at once, and answers with every response the elements produced:
//! - only notifications and responses: 202, as for one of them alone;
//! - else a JSON array of the responses, or, when an element's answer also carried
//!   notifications (progress, log lines, relayed server requests), an event stream of every
//!   message in the order the elements were given (2025-03-26 allows either for a batch).
//!
//! An element's answer is held until the last one is in, so each is bounded: by the session
//! route's timeout, and by [`MAX_ELEMENT_ANSWER_BYTES`]. An element that fails gets its own
//! error response; an `initialize` in a batch is refused (the revision forbids it).

use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::time::Instant;

use super::{accepted, in_session, live_session, owner_of};
use crate::body::{Body, json_response, sse_event, sse_response};
use crate::error::GatewayError;
use crate::frontend::{self, Head};
use crate::protocol::{self, Kind};
use crate::relay;
use crate::router::Route;
use crate::session::SessionData;
use crate::step::{Core, RequestCtx};
use crate::upstream::http::is_event_stream;

/// The one revision with batches.
const BATCH_VERSION: &str = "2025-03-26";
/// Messages one batch may carry.
pub const MAX_BATCH: usize = 64;
/// Bytes of one element's answer held while the others finish.
const MAX_ELEMENT_ANSWER_BYTES: usize = crate::config::DEFAULT_MAX_ANSWER_BYTES;

/// Serves the batch `body` (a JSON array) in the session the headers name.
#[allow(clippy::too_many_arguments)]
pub(super) async fn serve(
    core: &Core,
    generation: relay::Generation,
    ctx: &mut RequestCtx,
    path: &str,
    route: &Route,
    headers: &HeaderMap,
    head: Head<'_>,
    body: Bytes,
) -> Result<Response<Body>, GatewayError> {
    // Without a session there is no revision to allow it (and `initialize` is never batched).
    let Some(sid) = head.session else {
        return Err(GatewayError::Batch);
    };
    let session = live_session(core, ctx, sid, path).await?;
    if session.v != BATCH_VERSION {
        return Err(GatewayError::Batch);
    }
    let items: Vec<&RawValue> =
        serde_json::from_slice(&body).map_err(|e| GatewayError::Parse(e.to_string()))?;
    if items.is_empty() {
        return Err(GatewayError::InvalidRequest("an empty batch".into()));
    }
    if items.len() > MAX_BATCH {
        return Err(GatewayError::InvalidRequest(format!(
            "a batch of {} messages; at most {MAX_BATCH}",
            items.len()
        )));
    }
    ctx.client = Some(owner_of(sid, &session));
    ctx.method = Some("batch".into());
    let deadline = Instant::now() + route.timeout();
    let answers = futures_util::future::join_all(items.iter().map(|item| {
        let mut ctx = ctx.clone();
        // An element's answer is read here whole, never by a connection that could break:
        // nothing to hold for a resume.
        ctx.remote = false;
        let generation = generation.clone();
        let head = Head {
            version: head.version,
            session: head.session,
            ..Head::default()
        };
        let body = Bytes::copy_from_slice(item.get().as_bytes());
        let session = &session;
        async move {
            element(
                core, generation, &mut ctx, route, headers, head, body, session, deadline,
            )
            .await
        }
    }))
    .await;
    let messages: Vec<Bytes> = answers.into_iter().flatten().collect();
    if messages.is_empty() {
        return Ok(accepted());
    }
    if messages.iter().all(|m| is_response(m)) {
        let mut array = Vec::with_capacity(messages.iter().map(|m| m.len() + 1).sum::<usize>() + 1);
        array.push(b'[');
        for (i, m) in messages.iter().enumerate() {
            if i > 0 {
                array.push(b',');
            }
            array.extend_from_slice(m);
        }
        array.push(b']');
        return Ok(json_response(StatusCode::OK, Bytes::from(array)));
    }
    let events = messages
        .iter()
        .map(|m| sse_event(m))
        .collect::<Vec<_>>()
        .concat();
    Ok(sse_response(Body::full(events)))
}

/// One element, served as if posted alone: the messages its answer carried.
#[allow(clippy::too_many_arguments)]
async fn element(
    core: &Core,
    generation: relay::Generation,
    ctx: &mut RequestCtx,
    route: &Route,
    headers: &HeaderMap,
    head: Head<'_>,
    body: Bytes,
    session: &SessionData,
    deadline: Instant,
) -> Vec<Bytes> {
    let env = match protocol::parse_envelope(&body) {
        Ok(env) => env,
        Err(e) => {
            let id = protocol::sniff_id(&body);
            let msg = frontend::envelope_error(e).to_message(id.as_ref());
            return vec![with_null_id(msg)];
        }
    };
    let answers = env.kind == Kind::Request;
    let error = |e: GatewayError| match answers {
        true => vec![Bytes::from(e.to_message(env.id.as_ref()))],
        false => Vec::new(),
    };
    if env.method == "initialize" {
        return error(GatewayError::InvalidRequest(
            "initialize must not be part of a batch".into(),
        ));
    }
    ctx.id = env.id.clone();
    ctx.method = Some(env.method.clone());
    ctx.note_tool(Some(&env.method), env.name.as_deref());
    let resp = match in_session(
        core, generation, ctx, route, headers, head, &env, body, session, deadline,
    )
    .await
    {
        Ok(resp) => resp,
        Err(e) => return error(e),
    };
    let stream = is_event_stream(resp.headers());
    let read = Limited::new(resp.into_body(), MAX_ELEMENT_ANSWER_BYTES).collect();
    let bytes = match tokio::time::timeout_at(deadline, read).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) => {
            return error(GatewayError::BackendFailed {
                backend: route.name().to_string(),
                detail: format!("the answer could not be read whole: {e}"),
            });
        }
        Err(_) => {
            return error(GatewayError::BackendTimeout {
                backend: route.name().to_string(),
                timeout_ms: route.timeout().as_millis() as u64,
            });
        }
    };
    if !stream {
        let one = bytes.trim_ascii();
        return match one.is_empty() {
            true => Vec::new(),
            false => vec![Bytes::copy_from_slice(one)],
        };
    }
    let mut dec = crate::sse::SseDecoder::new(MAX_ELEMENT_ANSWER_BYTES);
    dec.push(&bytes);
    let mut out = Vec::new();
    while let Ok(Some(ev)) = dec.next_event() {
        out.push(ev);
    }
    out.extend(dec.finish());
    out
}

/// An error whose request's id could not be read, with the `"id": null` JSON-RPC 2.0 gives it
/// in a batch's answer (portico's errors leave the member out, as later MCP revisions allow).
fn with_null_id(msg: Vec<u8>) -> Bytes {
    match serde_json::from_slice::<Value>(&msg) {
        Ok(Value::Object(mut m)) if !m.contains_key("id") => {
            m.insert("id".into(), Value::Null);
            Bytes::from(Value::Object(m).to_string())
        }
        _ => Bytes::from(msg),
    }
}

/// Whether a message is a response (a `result` or an `error`, no `method`). Not
/// `protocol::is_response`: that one refuses the `"id": null` an element whose id could not be
/// read is answered with ([`with_null_id`]), which a batch's answer must still count.
fn is_response(msg: &[u8]) -> bool {
    serde_json::from_slice::<Value>(msg).is_ok_and(|v| {
        v.get("method").is_none() && (v.get("result").is_some() || v.get("error").is_some())
    })
}
