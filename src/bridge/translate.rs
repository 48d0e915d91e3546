//! Translation between the eras, both ways: a 2026 request goes up with a session-unique id
//! and progress token and without the reserved 2026 `_meta` keys; what comes back gets its
//! id and token restored, `resultType`, `ttlMs`/`cacheScope` (from config), serverInfo, and
//! `-32002` → `-32602`. Server-initiated requests are answered upstream (`ping`, unknown
//! methods) or handed to `input` (elicitation, sampling, roots). A [`CancelGuard`] sends
//! `notifications/cancelled` when the client goes away first.

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use serde_json::{Map, Value, json};
use std::sync::Arc;
use tokio::time::Instant;

use super::input::{Flow, FlowIo};
use super::send_raw;
use crate::backend::Backend;
use crate::backend::LegacySession;
use crate::config::CacheScope;
use crate::error::GatewayError;
use crate::protocol::{RequestId, code, is_cacheable_method, meta, status_for_code};
use crate::upstream::{MessageStream, Reply};

pub(super) fn scope_str(s: CacheScope) -> &'static str {
    match s {
        CacheScope::Public => "public",
        CacheScope::Private => "private",
    }
}

/// How one request was rewritten on its way up, to undo it on the way back.
#[derive(Clone)]
pub(super) struct Mapping {
    pub(super) client_id: RequestId,
    pub(super) upstream_id: u64,
    /// (upstream token, client token)
    pub(super) token: Option<(Value, Value)>,
    pub(super) method: String,
    pub(super) ttl_ms: u64,
    pub(super) scope: &'static str,
    pub(super) server_info: Option<Value>,
    /// The request's `logLevel` rank: its `notifications/message` at or above it are relayed.
    pub(super) log_level: Option<u8>,
}

/// The rank of a 2026 request's `_meta` `logLevel`, if it set a valid one.
pub(super) fn log_level(body: &[u8]) -> Option<u8> {
    static LOG_LEVEL: crate::protocol::Needle =
        crate::protocol::Needle::new(|| memchr::memmem::Finder::new(b"logLevel"));
    if !LOG_LEVEL.is_in(body) {
        return None; // cheap skip: most requests carry none
    }
    let v: Value = serde_json::from_slice(body).ok()?;
    crate::protocol::log_rank(v["params"]["_meta"][meta::LOG_LEVEL].as_str()?)
}

/// 2026 request → legacy request: new id, new progress token, reserved `_meta` keys removed.
pub(super) fn to_legacy(
    body: &[u8],
    upstream_id: u64,
) -> Result<(Bytes, Option<(Value, Value)>), GatewayError> {
    let mut v: Value =
        serde_json::from_slice(body).map_err(|e| GatewayError::Parse(e.to_string()))?;
    let obj = v
        .as_object_mut()
        .ok_or_else(|| GatewayError::InvalidRequest("not an object".into()))?;
    if obj.contains_key("id") {
        obj.insert("id".into(), json!(upstream_id));
    }
    let mut token = None;
    if let Some(Value::Object(params)) = obj.get_mut("params")
        && let Some(Value::Object(m)) = params.get_mut("_meta")
    {
        for k in [
            meta::PROTOCOL_VERSION,
            meta::CLIENT_CAPABILITIES,
            meta::CLIENT_INFO,
            meta::LOG_LEVEL,
        ] {
            m.remove(k);
        }
        if let Some(t) = m.get("progressToken").cloned()
            && !t.is_null()
        {
            let up = json!(format!("portico-{upstream_id}"));
            m.insert("progressToken".into(), up.clone());
            token = Some((up, t));
        }
        if m.is_empty() {
            params.remove("_meta");
        }
    }
    Ok((Bytes::from(v.to_string()), token))
}

/// What to do with one message from the legacy server.
pub(super) enum Translated {
    /// Send to the client.
    Forward(Bytes),
    /// The server asked something; answer it upstream.
    Answer(Bytes),
    /// Not for this client (log lines, session-wide notifications).
    Drop,
}

/// Legacy message → what the 2026 client gets.
pub(super) fn from_legacy(msg: &[u8], m: &Mapping) -> Translated {
    let Ok(mut v) = serde_json::from_slice::<Value>(msg) else {
        return Translated::Drop;
    };
    let has_id = v.get("id").is_some_and(|i| !i.is_null());
    let method = v.get("method").and_then(Value::as_str).map(String::from);
    match (method, has_id) {
        // A server-initiated request.
        (Some(method), true) => {
            let id = v["id"].clone();
            let answer = if method == "ping" {
                Bytes::from(json!({"jsonrpc":"2.0","id":id,"result":{}}).to_string())
            } else {
                tracing::warn!(
                    method,
                    "legacy server sent a request a 2026-07-28 client cannot receive; refusing it"
                );
                let refusal = GatewayError::MethodNotFound(format!(
                    "{method} is not available: the client is behind portico (2026-07-28)"
                ));
                Bytes::from(refusal.to_message(RequestId::from_value(&id).as_ref()))
            };
            Translated::Answer(answer)
        }
        (Some(method), false) => {
            if method == "notifications/progress" {
                if let (Some((up, client)), Some(p)) = (&m.token, v.get_mut("params"))
                    && p.get("progressToken") == Some(up)
                {
                    p["progressToken"] = client.clone();
                    return Translated::Forward(Bytes::from(v.to_string()));
                }
                return Translated::Drop;
            }
            // A log line on this call's own stream is this call's: relayed when the request
            // asked for that level. Session-wide notifications (list changes, resource updates)
            // come on the session's own channel and reach listeners, never a call's stream.
            if method == "notifications/message"
                && let Some(min) = m.log_level
                && v["params"]["level"]
                    .as_str()
                    .and_then(crate::protocol::log_rank)
                    .is_some_and(|l| l >= min)
            {
                return Translated::Forward(Bytes::copy_from_slice(msg));
            }
            Translated::Drop
        }
        (None, true) => {
            if v["id"] != json!(m.upstream_id) {
                return Translated::Drop;
            }
            let obj = match v.as_object_mut() {
                Some(o) => o,
                None => return Translated::Drop,
            };
            obj.insert("id".into(), m.client_id.to_value());
            if let Some(Value::Object(result)) = obj.get_mut("result") {
                modernize_result(result, m);
            } else if let Some(Value::Object(err)) = obj.get_mut("error")
                && err.get("code").and_then(Value::as_i64) == Some(code::LEGACY_RESOURCE_NOT_FOUND)
            {
                err.insert("code".into(), json!(code::INVALID_PARAMS));
            }
            Translated::Forward(Bytes::from(v.to_string()))
        }
        (None, false) => Translated::Drop,
    }
}

pub(super) fn modernize_result(result: &mut Map<String, Value>, m: &Mapping) {
    result
        .entry("resultType")
        .or_insert_with(|| json!("complete"));
    if is_cacheable_method(&m.method) {
        result.entry("ttlMs").or_insert_with(|| json!(m.ttl_ms));
        result.entry("cacheScope").or_insert_with(|| json!(m.scope));
    }
    if let Some(info) = &m.server_info {
        let meta_obj = result.entry("_meta").or_insert_with(|| json!({}));
        if let Some(o) = meta_obj.as_object_mut() {
            o.entry(meta::SERVER_INFO).or_insert_with(|| info.clone());
        }
    }
}

/// Applies `from_legacy` to every message of the answer; the server's requests are answered,
/// relayed or park the call (`input::Flow`).
pub(super) fn translate(reply: Reply, m: Mapping, mut guard: CancelGuard, io: FlowIo) -> Reply {
    let status = reply.status;
    match reply.messages {
        MessageStream::Empty => {
            guard.armed = false;
            Reply {
                status,
                headers: HeaderMap::new(),
                messages: MessageStream::Empty,
            }
        }
        MessageStream::One(msg) => {
            guard.armed = false;
            match from_legacy(&msg, &m) {
                Translated::Forward(out) => {
                    let status = error_status(&out).unwrap_or(status);
                    Reply::one(status, out)
                }
                _ => Reply::one(
                    StatusCode::BAD_GATEWAY,
                    GatewayError::BackendFailed {
                        backend: guard.backend.name.to_string(),
                        detail: "answer did not match the request".into(),
                    }
                    .to_message(Some(&m.client_id)),
                ),
            }
        }
        MessageStream::Many(stream) => Reply {
            status,
            headers: HeaderMap::new(),
            messages: MessageStream::Many(
                Flow {
                    inner: stream,
                    m,
                    guard,
                    io,
                }
                .into_stream(),
            ),
        },
    }
}

/// The HTTP status a translated error answer should carry.
pub(super) fn error_status(msg: &[u8]) -> Option<StatusCode> {
    let v: Value = serde_json::from_slice(msg).ok()?;
    let c = v.get("error")?.get("code")?.as_i64()?;
    StatusCode::from_u16(status_for_code(c)).ok()
}

/// Sends `notifications/cancelled` upstream when dropped while armed.
pub(super) struct CancelGuard {
    pub(super) backend: Arc<Backend>,
    pub(super) session: Arc<LegacySession>,
    pub(super) upstream_id: u64,
    pub(super) armed: bool,
    /// Holds the owner's pool slot while the answer streams (not reaped or evicted meanwhile).
    pub(super) _slot: super::session::Held,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let backend = self.backend.clone();
        let session = self.session.clone();
        let note = json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{
            "requestId": self.upstream_id, "reason": "the client went away"}});
        rt.spawn(async move {
            let deadline = Instant::now() + std::time::Duration::from_secs(5);
            let body = Bytes::from(note.to_string());
            if let Err(error) = send_raw(&backend, &session, body, &HeaderMap::new(), &[], deadline).await {
                tracing::debug!(backend = %backend.name, %error, "could not send notifications/cancelled");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::RequestId;

    #[test]
    fn requests_go_up_in_legacy_shape() {
        let body = br#"{"jsonrpc":"2.0","id":"c1","method":"tools/call","params":{"name":"t","arguments":{},"_meta":{
            "io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},
            "io.modelcontextprotocol/clientInfo":{"name":"x"},"progressToken":7,"custom":1}}}"#;
        let (up, token) = to_legacy(body, 42).unwrap();
        let v: Value = serde_json::from_slice(&up).unwrap();
        assert_eq!(v["id"], 42);
        assert_eq!(
            v["params"]["_meta"],
            json!({"progressToken":"portico-42","custom":1})
        );
        assert_eq!(token, Some((json!("portico-42"), json!(7))));
        let (up, token) = to_legacy(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#, 3).unwrap();
        let v: Value = serde_json::from_slice(&up).unwrap();
        assert!(v["params"].get("_meta").is_none(), "empty _meta removed");
        assert!(token.is_none());
    }

    #[test]
    fn results_come_back_in_modern_shape() {
        let m = Mapping {
            client_id: RequestId::from_value(&json!("c1")).unwrap(),
            upstream_id: 42,
            token: Some((json!("portico-42"), json!(7))),
            method: "tools/list".into(),
            ttl_ms: 5000,
            scope: "private",
            server_info: Some(json!({"name":"legacy"})),
            log_level: crate::protocol::log_rank("info"),
        };
        let Translated::Forward(out) =
            from_legacy(br#"{"jsonrpc":"2.0","id":42,"result":{"tools":[]}}"#, &m)
        else {
            panic!("forwarded")
        };
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["id"], "c1");
        assert_eq!(v["result"]["resultType"], "complete");
        assert_eq!(v["result"]["ttlMs"], 5000);
        assert_eq!(v["result"]["cacheScope"], "private");
        assert_eq!(v["result"]["_meta"][meta::SERVER_INFO]["name"], "legacy");
        let Translated::Forward(out) = from_legacy(
            br#"{"jsonrpc":"2.0","id":42,"error":{"code":-32002,"message":"Resource not found"}}"#,
            &m,
        ) else {
            panic!()
        };
        assert_eq!(
            serde_json::from_slice::<Value>(&out).unwrap()["error"]["code"],
            -32602
        );
        let Translated::Forward(out) = from_legacy(br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"portico-42","progress":1}}"#, &m) else {
            panic!()
        };
        assert_eq!(
            serde_json::from_slice::<Value>(&out).unwrap()["params"]["progressToken"],
            7
        );
        assert!(matches!(
            from_legacy(
                br#"{"jsonrpc":"2.0","id":"s1","method":"sampling/createMessage","params":{}}"#,
                &m
            ),
            Translated::Answer(_)
        ));
        assert!(
            matches!(
                from_legacy(br#"{"jsonrpc":"2.0","id":99,"result":{}}"#, &m),
                Translated::Drop
            ),
            "someone else's answer"
        );
        assert!(matches!(
            from_legacy(
                br#"{"jsonrpc":"2.0","method":"notifications/message","params":{}}"#,
                &m
            ),
            Translated::Drop
        ));
        assert!(matches!(
            from_legacy(
                br#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"debug","data":"x"}}"#,
                &m
            ),
            Translated::Drop
        ));
        assert!(matches!(
            from_legacy(
                br#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"error","data":"x"}}"#,
                &m
            ),
            Translated::Forward(_)
        ));
    }
}
