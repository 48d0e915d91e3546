//! The built-in demo backend (`builtin = "demo"`): a small in-process 2026-07-28 server, so the
//! quick start works with nothing else running, and a hermetic fixture for tests.
//!
//! Tools: `echo`, `add`, `progress` (reports progress before answering). One resource
//! (`demo://readme`), one prompt (`greet`). It answers on the message path like any backend.

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use serde_json::{Value, json};
use std::time::Duration;

use super::{MessageStream, Reply, UpstreamError};
use crate::protocol::{LATEST_VERSION, RequestId, code, error_body, meta, status_for_code};

/// How long the demo's lists stay fresh.
pub const DEMO_TTL_MS: u64 = 60_000;
/// Pause between two progress notifications of the `progress` tool.
pub const DEFAULT_PROGRESS_DELAY_MS: u64 = 100;

#[derive(Clone, Default)]
pub struct Demo;

fn server_info() -> Value {
    json!({ "name": "portico-demo", "version": env!("CARGO_PKG_VERSION") })
}

fn result(id: &RequestId, mut body: Value) -> Bytes {
    body["resultType"] = json!("complete");
    body["_meta"] = json!({ meta::SERVER_INFO: server_info() });
    Bytes::from(
        serde_json::to_vec(&json!({ "jsonrpc": "2.0", "id": id.to_value(), "result": body }))
            .unwrap_or_default(),
    )
}

fn error(id: Option<&RequestId>, c: i64, message: &str, data: Option<Value>) -> Reply {
    Reply::one(
        StatusCode::from_u16(status_for_code(c)).unwrap_or(StatusCode::OK),
        error_body(id, c, message, data.as_ref()),
    )
}

fn text(s: impl Into<String>) -> Value {
    json!({ "content": [{ "type": "text", "text": s.into() }], "isError": false })
}

impl Demo {
    /// Answers one JSON-RPC message.
    pub fn call(&self, body: &[u8]) -> Reply {
        let Ok(msg) = serde_json::from_slice::<Value>(body) else {
            return error(None, code::PARSE_ERROR, "Parse error", None);
        };
        let id = msg.get("id").and_then(RequestId::from_value);
        let method = msg.get("method").and_then(Value::as_str).unwrap_or("");
        let Some(id) = id else {
            // Notifications: nothing to do, accepted.
            return Reply {
                status: StatusCode::ACCEPTED,
                headers: HeaderMap::new(),
                messages: MessageStream::Empty,
            };
        };
        let params = msg.get("params").cloned().unwrap_or(json!({}));
        let m = params.get("_meta");
        if m.and_then(|m| m.get(meta::PROTOCOL_VERSION)).is_none()
            || m.and_then(|m| m.get(meta::CLIENT_CAPABILITIES)).is_none()
        {
            return error(
                Some(&id),
                code::INVALID_PARAMS,
                "params._meta must carry protocolVersion and clientCapabilities",
                None,
            );
        }
        let ok = |v: Value| Reply::one(StatusCode::OK, result(&id, v));
        let cache = |mut v: Value| {
            v["ttlMs"] = json!(DEMO_TTL_MS);
            v["cacheScope"] = json!("public");
            v
        };
        match method {
            "server/discover" => ok(cache(json!({
                "supportedVersions": [LATEST_VERSION],
                "capabilities": { "tools": { "listChanged": false }, "resources": {}, "prompts": {} },
                "instructions": "portico's built-in demo server: try the echo, add and progress tools.",
            }))),
            "tools/list" => ok(cache(json!({ "tools": [
                { "name": "echo", "description": "Returns its text argument.",
                  "inputSchema": { "type": "object", "properties": { "text": { "type": "string" } }, "required": ["text"] } },
                { "name": "add", "description": "Adds two integers.",
                  "inputSchema": { "type": "object", "properties": { "a": { "type": "integer" }, "b": { "type": "integer" } }, "required": ["a", "b"] } },
                { "name": "progress", "description": "Counts to `steps`, reporting progress on the way.",
                  "inputSchema": { "type": "object", "properties": { "steps": { "type": "integer" }, "delay_ms": { "type": "integer" } } } },
            ] }))),
            "tools/call" => {
                let name = params.get("name").and_then(Value::as_str).unwrap_or("");
                let args = params.get("arguments").cloned().unwrap_or(json!({}));
                match name {
                    "echo" => ok(text(args.get("text").and_then(Value::as_str).unwrap_or(""))),
                    "add" => {
                        let a = args.get("a").and_then(Value::as_i64).unwrap_or(0);
                        let b = args.get("b").and_then(Value::as_i64).unwrap_or(0);
                        ok(text(a.saturating_add(b).to_string()))
                    }
                    "progress" => {
                        let steps = args
                            .get("steps")
                            .and_then(Value::as_u64)
                            .unwrap_or(3)
                            .min(100);
                        let delay = args
                            .get("delay_ms")
                            .and_then(Value::as_u64)
                            .unwrap_or(DEFAULT_PROGRESS_DELAY_MS)
                            .min(10_000);
                        let token = m.and_then(|m| m.get("progressToken")).cloned();
                        progress_reply(id, steps, delay, token)
                    }
                    _ => error(
                        Some(&id),
                        code::INVALID_PARAMS,
                        &format!("Unknown tool: {name}"),
                        None,
                    ),
                }
            }
            "resources/list" => ok(cache(json!({ "resources": [
                { "uri": "demo://readme", "name": "readme", "mimeType": "text/plain" }
            ] }))),
            "resources/templates/list" => ok(cache(json!({ "resourceTemplates": [] }))),
            "resources/read" => {
                let uri = params.get("uri").and_then(Value::as_str).unwrap_or("");
                if uri == "demo://readme" {
                    ok(cache(
                        json!({ "contents": [{ "uri": uri, "mimeType": "text/plain",
                        "text": "This is portico's demo backend." }] }),
                    ))
                } else {
                    error(
                        Some(&id),
                        code::INVALID_PARAMS,
                        "Resource not found",
                        Some(json!({ "uri": uri })),
                    )
                }
            }
            "prompts/list" => ok(cache(json!({ "prompts": [
                { "name": "greet", "description": "A greeting.", "arguments": [{ "name": "name", "required": true }] }
            ] }))),
            "prompts/get" => {
                let who = params
                    .pointer("/arguments/name")
                    .and_then(Value::as_str)
                    .unwrap_or("there");
                ok(
                    json!({ "messages": [{ "role": "user", "content": { "type": "text", "text": format!("Hello, {who}!") } }] }),
                )
            }
            _ => error(
                Some(&id),
                code::METHOD_NOT_FOUND,
                &format!("Method not found: {method}"),
                None,
            ),
        }
    }
}

fn progress_reply(id: RequestId, steps: u64, delay_ms: u64, token: Option<Value>) -> Reply {
    let stream = crate::upstream::http::async_stream(move |tx| async move {
        for i in 1..=steps {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            if let Some(t) = &token {
                let n = json!({ "jsonrpc": "2.0", "method": "notifications/progress",
                    "params": { "progressToken": t, "progress": i, "total": steps,
                                "message": format!("step {i} of {steps}") } });
                let bytes = Bytes::from(serde_json::to_vec(&n).unwrap_or_default());
                if tx.send(Ok::<Bytes, UpstreamError>(bytes)).await.is_err() {
                    return;
                }
            }
        }
        let _ = tx
            .send(Ok(result(&id, text(format!("done {steps}")))))
            .await;
    });
    Reply {
        status: StatusCode::OK,
        headers: HeaderMap::new(),
        messages: MessageStream::Many(Box::pin(stream)),
    }
}
