//! A 2026-07-28 server's `input_required` answer, for an initialize-era client (docs/protocol.md
//! §10): such a client cannot read `inputRequests`, but it can answer server requests. So
//! each input request becomes a real server request on the call's SSE stream (with an id
//! portico mints, `bridge::expect_input`); the client POSTs its answers in its session
//! (`legacy` routes them with `bridge::answer_input`); portico retries the call with
//! `inputResponses` and the server's `requestState` untouched, through the same dispatch as
//! the first attempt, and streams what comes back — asking again if the server does, at most
//! [`MAX_ROUNDS`] times.
//!
//! The client must have declared each capability an input request needs (`elicitation`,
//! `sampling`, `roots`): otherwise it gets an error naming the capability and is asked
//! nothing. Every wait is bounded by the call's deadline.
//!
//! The work continues after the response head is sent (the answers arrive on other POSTs), so
//! it runs in a task that holds the config generation ([`Generation`]) and a copy of the
//! request's context.

use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, StatusCode};
use serde_json::{Map, Value, json};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::bridge;
use crate::error::GatewayError;
use crate::frontend;
use crate::pool::OwnerKey;
use crate::protocol::{self, RequestId};
use crate::router::{Route, dispatch};
use crate::step::{Core, RequestCtx};
use crate::upstream::{MessageStream, Reply};

/// Rounds of questions one call may take before portico gives up on it.
pub const MAX_ROUNDS: usize = 16;

/// A config generation that outlives the request (the `State` the request started with).
pub type Generation = Arc<dyn std::ops::Deref<Target = Core> + Send + Sync>;

/// Turns one 2026 message into what the client's revision expects (`legacy::legacy_message`).
pub type Shape = fn(&[u8], &str) -> Bytes;

/// What a retry needs: the request as first dispatched, and whose answers to wait for.
pub struct Call {
    pub generation: Generation,
    pub ctx: RequestCtx,
    pub route: Route,
    pub headers: HeaderMap,
    /// The request in 2026 form (as dispatched the first time).
    pub body: Bytes,
    /// The client's own id, restored on every message it gets.
    pub id: RequestId,
    pub method: String,
    /// What the client declared at `initialize`.
    pub caps: Value,
    /// The client's session (`bridge::Owner::key`): only its answers count.
    pub owner: OwnerKey,
    pub deadline: Instant,
    pub shape: Shape,
}

/// Whether a message is an `input_required` result.
fn input_required(msg: &[u8]) -> Option<Value> {
    static INPUT_REQUIRED: crate::protocol::Needle =
        crate::protocol::Needle::new(|| memchr::memmem::Finder::new(b"\"input_required\""));
    if !INPUT_REQUIRED.is_in(msg) {
        return None;
    }
    let v: Value = serde_json::from_slice(msg).ok()?;
    (v["result"]["resultType"] == "input_required").then_some(v)
}

/// The answer to an initialize-era client's call that may need input: unchanged unless its
/// final message is `input_required`, which is then answered by asking the client.
pub fn answer(reply: Reply, call: Call) -> Reply {
    if !matches!(
        call.method.as_str(),
        "tools/call" | "prompts/get" | "resources/read"
    ) {
        return shaped(reply, call.shape, call.method);
    }
    match reply.messages {
        MessageStream::One(msg) => match input_required(&msg) {
            None => shaped(Reply::one(reply.status, msg), call.shape, call.method),
            Some(first) => Reply {
                status: StatusCode::OK,
                headers: HeaderMap::new(),
                messages: MessageStream::Many(spawn(call, first)),
            },
        },
        MessageStream::Many(stream) => {
            let shape = call.shape;
            let method = call.method.clone();
            let mut call = Some(call);
            let out = stream.flat_map(move |item| match item {
                Ok(msg) => {
                    if let Some(first) = input_required(&msg)
                        && let Some(call) = call.take()
                    {
                        return spawn(call, first);
                    }
                    let out = shape(&msg, &method);
                    futures_util::stream::once(async move { Ok(out) }).boxed()
                }
                Err(e) => futures_util::stream::once(async move { Err(e) }).boxed(),
            });
            Reply {
                status: reply.status,
                headers: HeaderMap::new(),
                messages: MessageStream::Many(out.boxed()),
            }
        }
        MessageStream::Empty => shaped(reply, call.shape, call.method),
    }
}

fn shaped(reply: Reply, shape: Shape, method: String) -> Reply {
    Reply {
        headers: HeaderMap::new(),
        ..reply.map_messages(move |m| shape(&m, &method))
    }
}

type Out = Result<Bytes, crate::upstream::UpstreamError>;

/// Starts the rounds of questions; the client's stream reads what they send.
fn spawn(call: Call, first: Value) -> futures_util::stream::BoxStream<'static, Out> {
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        let id = call.id.clone();
        if let Err(e) = rounds(call, first, &tx).await {
            let _ = tx.send(Bytes::from(e.to_message(Some(&id)))).await;
        }
    });
    futures_util::stream::unfold(rx, |mut rx| async move {
        let msg = rx.recv().await?;
        Some((Ok(msg), rx))
    })
    .boxed()
}

/// With the client's id in place of the retry's.
fn with_id(mut v: Value, id: &RequestId) -> Bytes {
    if v.get("id").is_some() {
        v["id"] = id.to_value();
    }
    Bytes::from(v.to_string())
}

async fn rounds(
    mut call: Call,
    first: Value,
    tx: &mpsc::Sender<Bytes>,
) -> Result<(), GatewayError> {
    let mut answer = first;
    for round in 1..=MAX_ROUNDS {
        let result = &answer["result"];
        if result["resultType"] != "input_required" {
            let out = (call.shape)(&with_id(answer, &call.id), &call.method);
            let _ = tx.send(out).await;
            return Ok(());
        }
        let requests = result
            .get("inputRequests")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        for (key, req) in &requests {
            let method = req["method"].as_str().unwrap_or_default();
            let Some(cap) = bridge::capability_for(method) else {
                return Err(GatewayError::BackendFailed {
                    backend: call.route.name().to_string(),
                    detail: format!("input request {key:?} has an unknown method {method:?}"),
                });
            };
            if call.caps.get(cap).is_none_or(|c| !c.is_object()) {
                return Err(GatewayError::MissingCapability {
                    method: method.to_string(),
                    capability: cap,
                });
            }
        }
        // Ask everything at once; the client answers in any order.
        let mut waits = Vec::new();
        for (key, req) in requests {
            let (pid, rx) = bridge::expect_input(call.owner);
            let msg = json!({"jsonrpc":"2.0","id":pid,"method":req["method"],
                "params":req.get("params").cloned().unwrap_or(json!({}))});
            if tx.send(Bytes::from(msg.to_string())).await.is_err() {
                bridge::forget_input(&pid);
                return Ok(()); // the client went away
            }
            waits.push((key, pid, rx));
        }
        let mut responses = Map::new();
        for (key, pid, rx) in waits {
            match tokio::time::timeout_at(call.deadline, rx).await {
                Ok(Ok(client)) => {
                    if let Some(r) = client.get("result") {
                        responses.insert(key, r.clone());
                    } else {
                        let why = client["error"]["message"].as_str().unwrap_or("no result");
                        return Err(GatewayError::InvalidRequest(format!(
                            "the client refused the server's {key:?} request: {why}"
                        )));
                    }
                }
                _ => {
                    bridge::forget_input(&pid);
                    return Err(GatewayError::BackendTimeout {
                        backend: call.route.name().to_string(),
                        timeout_ms: call.route.timeout().as_millis() as u64,
                    });
                }
            }
        }
        let retry = retry_body(&call.body, &answer, responses, &call.id, round)?;
        let env = protocol::parse_envelope(&retry).map_err(frontend::envelope_error)?;
        let core: &Core = &call.generation;
        let reply = dispatch(
            core,
            &mut call.ctx,
            &call.route,
            &call.headers,
            &env,
            retry,
            call.deadline,
        )
        .await?;
        answer = match reply.messages {
            MessageStream::One(m) => {
                serde_json::from_slice(&m).map_err(|e| GatewayError::Parse(e.to_string()))?
            }
            MessageStream::Empty => {
                return Err(GatewayError::BackendFailed {
                    backend: call.route.name().to_string(),
                    detail: "no answer to a retry".into(),
                });
            }
            MessageStream::Many(mut s) => {
                let mut last = None;
                while let Some(item) = s.next().await {
                    let msg = item.map_err(|e| {
                        GatewayError::from_upstream(
                            &call.route.name(),
                            call.route.timeout().as_millis() as u64,
                            &e,
                        )
                    })?;
                    if protocol::is_response(&msg) {
                        last = serde_json::from_slice(&msg).ok();
                        break;
                    }
                    // Progress and other notifications of the retry reach the client as they come.
                    let _ = tx.send((call.shape)(&msg, &call.method)).await;
                }
                last.ok_or_else(|| GatewayError::BackendFailed {
                    backend: call.route.name().to_string(),
                    detail: "the answer stream ended without a response".into(),
                })?
            }
        };
    }
    Err(GatewayError::BackendFailed {
        backend: call.route.name().to_string(),
        detail: format!("the server asked for input more than {MAX_ROUNDS} times"),
    })
}

/// The retry: the same request with a new id, the client's `inputResponses`, and the
/// server's `requestState` byte for byte (docs/protocol.md §10).
fn retry_body(
    body: &[u8],
    answer: &Value,
    responses: Map<String, Value>,
    id: &RequestId,
    round: usize,
) -> Result<Bytes, GatewayError> {
    let mut v: Value =
        serde_json::from_slice(body).map_err(|e| GatewayError::Parse(e.to_string()))?;
    v["id"] = json!(format!(
        "{}-portico-retry-{round}",
        id.json().trim_matches('"')
    ));
    let params = v
        .get_mut("params")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| GatewayError::InvalidRequest("params must be an object".into()))?;
    params.insert("inputResponses".into(), Value::Object(responses));
    params.remove("requestState");
    if let Some(state) = answer["result"].get("requestState") {
        params.insert("requestState".into(), state.clone());
    }
    Ok(Bytes::from(v.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_carry_the_answers_and_the_state_untouched() {
        let id = RequestId::from_value(&json!(7)).unwrap();
        let answer = json!({"result":{"resultType":"input_required","requestState":"s t\u{00e9}"}});
        let mut r = Map::new();
        r.insert("k".into(), json!({"action":"accept"}));
        let out = retry_body(
            br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t","requestState":"old"}}"#,
            &answer,
            r,
            &id,
            1,
        )
        .unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["id"], "7-portico-retry-1");
        assert_eq!(v["params"]["requestState"], "s t\u{00e9}");
        assert_eq!(v["params"]["inputResponses"]["k"]["action"], "accept");
        assert_eq!(v["params"]["name"], "t");
        assert!(input_required(br#"{"id":1,"result":{"resultType":"input_required"}}"#).is_some());
        assert!(input_required(br#"{"id":1,"result":{"resultType":"complete"}}"#).is_none());
    }
}
