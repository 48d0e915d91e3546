//! Telling a backend's era (docs/protocol.md §5): the `server/discover` probe and how its answer, or a
//! refusal of the bridge's `initialize`, is classified. Pure classifiers plus the one probe
//! per backend ([`ensure_verdict`]). Never keyed on one error code.

use bytes::Bytes;
use http::HeaderMap;
use serde_json::Value;
use tokio::time::Instant;

use super::{collect, upstream_err};
use crate::backend::{Backend, Verdict};
use crate::error::GatewayError;
use crate::protocol::{LATEST_VERSION, LEGACY_VERSIONS, code};
use crate::protocol::{discover_probe, discover_probe_headers};
use crate::upstream::http::HttpUpstream;
use crate::upstream::sse::SseTarget;
use crate::upstream::stdio::StdioUpstream;
use crate::upstream::{Upstream, UpstreamError};
use std::sync::Arc;

/// What a probe answer says about the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Classification {
    Modern,
    Legacy,
    /// The answer says nothing about the era (the backend is failing); decide later.
    Undecided(String),
}

/// Error codes only a 2026-07-28 server sends.
pub(super) fn is_modern_error(code: i64) -> bool {
    (code::UNSUPPORTED_VERSION..=code::HEADER_MISMATCH).contains(&code)
}

/// The first JSON-RPC response among decoded messages.
pub(super) fn response_of(messages: &[Bytes]) -> Option<Value> {
    messages
        .iter()
        .filter_map(|m| serde_json::from_slice::<Value>(m).ok())
        .find(|v| v.get("result").is_some() || v.get("error").is_some())
}

/// Classifies the answer to an HTTP `server/discover` probe (docs/protocol.md §5). Never keyed on one
/// error code: deployed legacy servers answer 400 `-32000`, 400 `-32600`, 404 with no body, 405
/// with HTML, or (stateless) a legacy-shaped answer.
pub fn classify_http(status: u16, messages: &[Bytes]) -> Classification {
    let resp = response_of(messages);
    if let Some(r) = &resp {
        if r["result"]["supportedVersions"].is_array() {
            return Classification::Modern;
        }
        if let Some(c) = r["error"]["code"].as_i64()
            && is_modern_error(c)
        {
            return Classification::Modern;
        }
    }
    match status {
        500..=599 => Classification::Undecided(format!("HTTP {status}")),
        400..=499 => Classification::Legacy,
        200..=299 if resp.is_some() => Classification::Legacy,
        _ => Classification::Undecided(format!("HTTP {status} without a JSON-RPC answer")),
    }
}

/// Classifies the answer to a stdio probe: `None` = no answer before the timeout.
pub fn classify_stdio(answer: Option<&[Bytes]>) -> Classification {
    let Some(messages) = answer else {
        return Classification::Legacy;
    };
    match response_of(messages) {
        Some(r) if r["result"]["supportedVersions"].is_array() => Classification::Modern,
        Some(r) if r["error"]["code"].as_i64().is_some_and(is_modern_error) => {
            Classification::Modern
        }
        Some(_) => Classification::Legacy,
        None => Classification::Legacy,
    }
}

/// Whether an error answer to the bridge's `initialize` shows a 2026-07-28 server, i.e. the
/// probe verdict "legacy" was wrong (typically a modern stdio server that started more slowly
/// than `probe_timeout_ms`). Evidence, per docs/protocol.md §5: a modern error code (`-32020..-32022`);
/// a version list (`data.supported`) naming a revision newer than the initialize era (a
/// modern-only server SHOULD list its versions in any error to `initialize`); or "method not
/// found": every initialize-era server implements `initialize`, so only a server that dropped
/// it (the 2026 Python SDK path answers it `-32601`) says so. A legacy server refusing our
/// revision lists only legacy ones, and is not taken for modern.
pub fn initialize_refusal_is_modern(error: &Value) -> bool {
    let c = error["code"].as_i64();
    if c.is_some_and(is_modern_error) || c == Some(code::METHOD_NOT_FOUND) {
        return true;
    }
    let newest_legacy = LEGACY_VERSIONS[0];
    ["supported", "supportedVersions"].iter().any(|k| {
        error["data"][k].as_array().is_some_and(|vs| {
            vs.iter()
                .filter_map(Value::as_str)
                .any(|v| v == LATEST_VERSION || v > newest_legacy)
        })
    })
}

/// Makes sure the backend's era is known, probing it if needed.
pub async fn ensure_verdict(b: &Backend) -> Result<Verdict, GatewayError> {
    let v = b.verdict();
    if v != Verdict::Unknown {
        return Ok(v);
    }
    // Boxed: the probe is a large future that runs once per backend; inline, it would enlarge
    // the state of every request that merely reads the verdict.
    Box::pin(probe(b)).await
}

/// How long a failed probe answers for the backend: the requests that waited behind it (and any
/// that arrive meanwhile) get its error at once. Without it, k requests queued on an unreachable
/// `auto` backend waited k probes of `timeout_ms` each, before admission or the breaker.
pub const PROBE_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

async fn probe(b: &Backend) -> Result<Verdict, GatewayError> {
    let _one = b.bridge.probe_lock.lock().await;
    let v = b.verdict();
    if v != Verdict::Unknown {
        return Ok(v);
    }
    let failed = &b.bridge.probe_failed;
    let last = failed.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if let Some((at, error)) = last
        && at.elapsed() < PROBE_RETRY_AFTER
    {
        return Err(error);
    }
    let found = probe_locked(b).await;
    *failed.lock().unwrap_or_else(|e| e.into_inner()) =
        found.as_ref().err().map(|e| (Instant::now(), e.clone()));
    found
}

/// The probe itself, under the backend's probe lock, its verdict still unknown.
async fn probe_locked(b: &Backend) -> Result<Verdict, GatewayError> {
    if !matches!(b.transport(), Upstream::Http(_)) && matches!(b.upstream, Upstream::Http(_)) {
        // The URL was found to serve HTTP+SSE before: that transport is initialize-era only.
        b.set_verdict(Verdict::Legacy);
        return Ok(Verdict::Legacy);
    }
    let class = match &b.upstream {
        Upstream::Http(up) => {
            let req = up.request(
                &HeaderMap::new(),
                &discover_probe_headers(),
                discover_probe("portico-probe"),
            );
            let reply = up
                .call(req, Instant::now() + b.timeout)
                .await
                .map_err(|e| upstream_err(b, &e))?;
            let status = reply.status.as_u16();
            let messages = collect(reply).await.unwrap_or_default();
            let class = classify_http(status, &messages);
            if class == Classification::Legacy && matches!(status, 400 | 404 | 405) {
                sse_fallback(b, up).await;
            }
            class
        }
        Upstream::Stdio(s) => {
            let probe_deadline =
                Instant::now() + std::time::Duration::from_millis(b.cfg.probe_timeout_ms);
            // `request`, not `call`: a silent legacy server must not receive
            // `notifications/cancelled` for the probe before its `initialize`.
            match s
                .request(discover_probe("portico-probe"), probe_deadline)
                .await
            {
                Ok(reply) => match collect(reply).await {
                    Ok(messages) => classify_stdio(Some(&messages)),
                    Err(UpstreamError::Timeout) => classify_stdio(None),
                    Err(e) => Classification::Undecided(e.to_string()),
                },
                Err(UpstreamError::Timeout) => classify_stdio(None),
                Err(e) => return Err(upstream_err(b, &e)),
            }
        }
        Upstream::Builtin(_) => Classification::Modern,
    };
    let verdict = match class {
        Classification::Modern => Verdict::Modern,
        Classification::Legacy => Verdict::Legacy,
        Classification::Undecided(why) => {
            return Err(GatewayError::BackendFailed {
                backend: b.name.to_string(),
                detail: format!("protocol probe inconclusive ({why})"),
            });
        }
    };
    tracing::info!(backend = %b.name, verdict = ?verdict, "backend protocol probed");
    b.set_verdict(verdict);
    Ok(verdict)
}

/// How long the fallback waits for the `endpoint` event (at most `probe_timeout_ms`): an
/// HTTP+SSE server sends it as the stream opens; a Streamable HTTP server that holds a GET open
/// without a word must not hold up the first request longer.
const SSE_PROBE_WAIT: std::time::Duration = std::time::Duration::from_millis(1000);

/// A Streamable HTTP probe refused with 400/404/405 may mean the URL serves the 2024-11-05
/// HTTP+SSE transport (docs/protocol.md §5): a GET with `Accept: text/event-stream` that
/// opens a stream whose first event is `endpoint` says so, and from then on the backend's
/// sessions are SSE sessions (`Backend::transport`). The probe's own stream is closed at once.
async fn sse_fallback(b: &Backend, up: &Arc<HttpUpstream>) {
    let Some(url) = b.cfg.url.as_deref() else {
        return;
    };
    let Ok(target) = SseTarget::new(up.clone(), url) else {
        return;
    };
    let wait = std::time::Duration::from_millis(b.cfg.probe_timeout_ms).min(SSE_PROBE_WAIT);
    match crate::upstream::sse::connect_within(&target, wait).await {
        Ok((conn, poster)) => {
            drop((conn, poster));
            tracing::info!(backend = %b.name, "the URL serves the 2024-11-05 HTTP+SSE transport; bridging it");
            b.found_sse(StdioUpstream::new_sse(&b.cfg, Arc::new(target)));
        }
        Err(why) => {
            tracing::debug!(backend = %b.name, %why, "no HTTP+SSE transport at the URL either")
        }
    }
}

/// Forgets the verdict (and any session) so the next request probes again: called when an
/// answer contradicts what the backend was thought to speak.
pub fn reprobe(b: &Backend, why: &str) {
    if b.cfg.protocol == crate::config::Protocol::Auto {
        tracing::warn!(backend = %b.name, why, "backend answer contradicts its protocol verdict; re-probing");
        b.set_verdict(Verdict::Unknown);
        // The sessions belonged to the old verdict; per-client children go with them.
        for slot in b.bridge.pool.drain() {
            if let Some(child) = slot.value.child.clone() {
                tokio::spawn(async move { child.shutdown().await });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msgs(s: &[&str]) -> Vec<Bytes> {
        s.iter().map(|m| Bytes::from(m.to_string())).collect()
    }

    /// Every answer shape docs/protocol.md §5 lists, and what it means.
    #[test]
    fn probe_classification_table() {
        use Classification::*;
        let cases: &[(u16, &[&str], Classification, &str)] = &[
            (
                200,
                &[
                    r#"{"jsonrpc":"2.0","id":"p","result":{"resultType":"complete","supportedVersions":["2026-07-28"],"capabilities":{},"ttlMs":0,"cacheScope":"private"}}"#,
                ],
                Modern,
                "discover result",
            ),
            (
                400,
                &[
                    r#"{"jsonrpc":"2.0","id":"p","error":{"code":-32022,"message":"Unsupported protocol version","data":{"supported":["2027-01-01"]}}}"#,
                ],
                Modern,
                "-32022 from a newer modern server",
            ),
            (
                400,
                &[
                    r#"{"jsonrpc":"2.0","id":"p","error":{"code":-32020,"message":"header mismatch"}}"#,
                ],
                Modern,
                "-32020",
            ),
            (
                400,
                &[
                    r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"Bad Request: Unsupported protocol version: 2026-07-28 (supported versions: 2025-11-25)"}}"#,
                ],
                Legacy,
                "TS SDK 400 -32000",
            ),
            (
                400,
                &[
                    r#"{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: No valid session ID provided"},"id":null}"#,
                ],
                Legacy,
                "TS SDK stateful, no session",
            ),
            (
                400,
                &[
                    r#"{"jsonrpc":"2.0","id":"p","error":{"code":-32600,"message":"Bad Request: Missing session ID"}}"#,
                ],
                Legacy,
                "Python SDK legacy transport",
            ),
            (
                400,
                &[
                    r#"{"jsonrpc":"2.0","id":"p","error":{"code":-32602,"message":"Invalid request parameters"}}"#,
                ],
                Legacy,
                "-32602 (Python SDK pre-initialize)",
            ),
            (404, &[], Legacy, "404 empty"),
            (
                405,
                &["<html>Method Not Allowed</html>"],
                Legacy,
                "405 HTML",
            ),
            (406, &[], Legacy, "406"),
            (
                200,
                &[
                    r#"{"jsonrpc":"2.0","id":"p","error":{"code":-32601,"message":"Method not found"}}"#,
                ],
                Legacy,
                "stateless legacy: -32601",
            ),
            (
                200,
                &[r#"{"jsonrpc":"2.0","id":"p","result":{}}"#],
                Legacy,
                "stateless legacy result without supportedVersions",
            ),
            (
                500,
                &[],
                Undecided("HTTP 500".into()),
                "server error says nothing",
            ),
            (
                502,
                &["bad gateway"],
                Undecided("HTTP 502".into()),
                "proxy error says nothing",
            ),
        ];
        for (status, body, want, what) in cases {
            assert_eq!(&classify_http(*status, &msgs(body)), want, "{what}");
        }
        // stdio: silence or any non-modern error is legacy.
        assert_eq!(classify_stdio(None), Legacy, "no answer before the timeout");
        assert_eq!(
            classify_stdio(Some(&msgs(&[
                r#"{"jsonrpc":"2.0","id":"p","error":{"code":-32601,"message":"Method not found"}}"#
            ]))),
            Legacy,
            "TS SDK over stdio"
        );
        assert_eq!(
            classify_stdio(Some(&msgs(&[
                r#"{"jsonrpc":"2.0","id":"p","error":{"code":-32602,"message":"Invalid request parameters"}}"#
            ]))),
            Legacy,
            "Python SDK over stdio before initialize"
        );
        assert_eq!(
            classify_stdio(Some(&msgs(&[
                r#"{"jsonrpc":"2.0","id":"p","result":{"supportedVersions":["2026-07-28"],"capabilities":{}}}"#
            ]))),
            Modern
        );
        assert_eq!(
            classify_stdio(Some(&msgs(&[
                r#"{"jsonrpc":"2.0","id":"p","error":{"code":-32022,"message":"x"}}"#
            ]))),
            Modern
        );
    }

    /// What an error answer to `initialize` says: only a modern server's refusal flips the
    /// verdict; a legacy server refusing our revision does not.
    #[test]
    fn initialize_refusals() {
        let cases = [
            (json!({"code":-32601,"message":"Method not found"}), true),
            (
                json!({"code":-32022,"message":"Unsupported protocol version"}),
                true,
            ),
            (json!({"code":-32020,"message":"Header mismatch"}), true),
            (
                json!({"code":-32602,"message":"Unsupported protocol version",
                    "data":{"supported":["2026-07-28"],"requested":"2025-11-25"}}),
                true,
            ),
            (
                json!({"code":-32000,"message":"x","data":{"supportedVersions":["2027-01-01"]}}),
                true,
            ),
            (
                json!({"code":-32602,"message":"Unsupported protocol version",
                    "data":{"supported":["2025-06-18","2025-03-26"],"requested":"2025-11-25"}}),
                false,
            ),
            (json!({"code":-32603,"message":"Internal error"}), false),
            (
                json!({"code":-32000,"message":"Server not initialized"}),
                false,
            ),
            (json!({"message":"no code"}), false),
        ];
        for (error, modern) in cases {
            assert_eq!(initialize_refusal_is_modern(&error), modern, "{error}");
        }
    }
}
