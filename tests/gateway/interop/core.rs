//! Interop for the core path: the Python SDK server (2026-07-28) behind portico, in its SSE and
//! JSON response modes, and the Python SDK client in front.

use super::*;
use crate::common::*;
use serde_json::json;

fn gateway_config(url: &str) -> String {
    format!("[log]\naccess = false\n[[backends]]\nname = \"py\"\nurl = \"{url}\"\n")
}

/// The final JSON-RPC message of an answer and how many progress notifications preceded it.
fn outcome(r: &Resp) -> (Value, usize) {
    let msgs = r.messages();
    let progress = msgs
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .count();
    let mut last = msgs.last().cloned().expect("a message");
    last.as_object_mut().map(|o| o.remove("id"));
    (last, progress)
}

#[tokio::test]
async fn python_sdk_server_gives_the_same_results_through_portico() {
    for mode in [&[][..], &["--json-response"][..]] {
        let server = py_server(mode).await;
        let gw = Gateway::start(&gateway_config(&server.url())).await;
        let calls = [
            ("server/discover", json!({})),
            ("tools/list", json!({})),
            (
                "tools/call",
                json!({"name":"echo","arguments":{"text":"hi"}}),
            ),
            (
                "tools/call",
                json!({"name":"progress","arguments":{"steps":3},"_meta":{"progressToken":"p1"}}),
            ),
            ("resources/read", json!({"uri":"demo://greeting"})),
            (
                "prompts/get",
                json!({"name":"greet","arguments":{"name":"Ada"}}),
            ),
        ];
        for (i, (method, params)) in calls.iter().enumerate() {
            let direct = mcp(&server.url(), json!(i), method, params.clone()).await;
            let via = mcp(&gw.url("/mcp/py"), json!(i), method, params.clone()).await;
            assert_eq!(
                direct.status, 200,
                "{mode:?} {method} direct: {:?}",
                direct.body
            );
            assert_eq!(via.status, direct.status, "{mode:?} {method}");
            assert_eq!(via.result()["id"], json!(i), "{mode:?} {method}: id echoed");
            let (mut via_out, mut direct_out) = (outcome(&via), outcome(&direct));
            if *method == "server/discover" {
                // portico's URL serves what portico serves (as its -32022 says), both eras.
                assert_eq!(
                    via_out.0["result"]["supportedVersions"],
                    json!(portico::protocol::SUPPORTED_VERSIONS)
                );
                for o in [&mut via_out, &mut direct_out] {
                    o.0["result"]
                        .as_object_mut()
                        .map(|r| r.remove("supportedVersions"));
                }
            }
            // A list may be served from portico's cache, which gives the freshness left (at
            // most the server's, less on a busy machine); the rest must be identical.
            let ttl = |o: &mut (Value, usize)| {
                o.0["result"]
                    .as_object_mut()
                    .and_then(|r| r.remove("ttlMs"))
                    .and_then(|t| t.as_u64())
            };
            let (via_ttl, direct_ttl) = (ttl(&mut via_out), ttl(&mut direct_out));
            if let (Some(v), Some(d)) = (via_ttl, direct_ttl) {
                assert!(
                    v <= d && v + 5_000 >= d,
                    "{mode:?} {method}: ttlMs {v} vs {d}"
                );
            } else {
                assert_eq!(via_ttl, direct_ttl, "{mode:?} {method}: ttlMs");
            }
            assert_eq!(via_out, direct_out, "{mode:?} {method}");
            assert_eq!(via.result()["result"]["resultType"], "complete");
        }
        // Progress is relayed in SSE mode (the SDK drops it in JSON mode, directly too).
        let via = mcp(
            &gw.url("/mcp/py"),
            json!(9),
            "tools/call",
            calls[3].1.clone(),
        )
        .await;
        let expected = if mode.is_empty() { 3 } else { 0 };
        assert_eq!(outcome(&via).1, expected, "{mode:?}");
    }
}

#[tokio::test]
async fn python_sdk_client_works_through_portico() {
    for mode in [&[][..], &["--json-response"][..]] {
        let server = py_server(mode).await;
        let gw = Gateway::start(&gateway_config(&server.url())).await;
        let direct = py_client(&["--modern", "--url", &server.url()]).await;
        let via = py_client(&["--modern", "--url", &gw.url("/mcp/py")]).await;
        assert_eq!(via["era"], "modern");
        assert_eq!(scenario(&via), scenario(&direct), "{mode:?}");
        assert_eq!(via["echo"], "hi");
        assert_eq!(via["add"], "5");
        assert_eq!(via["resource"], "hello from python");
        assert_eq!(via["prompt"], "Hello, Ada!");
        if mode.is_empty() {
            assert_eq!(via["progress_events"], 3);
        }
    }
}
