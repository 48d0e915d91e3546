//! The 2024-11-05 HTTP+SSE transport in front (`GET <route>/sse`, `POST <route>/messages`),
//! with the official SDKs' own HTTP+SSE clients: the Python SDK's `sse_client` and the
//! TypeScript SDK 1.x `SSEClientTransport`, against an initialize-era server (TypeScript SDK)
//! and a 2026-07-28 one (Python SDK) behind portico — the same scenario their Streamable HTTP
//! clients run, and the server's requests during a call (elicitation, sampling, roots)
//! relayed on the stream and answered by POST.

use super::*;
use crate::common::*;

fn config(backends: &[(&str, &str)]) -> String {
    let mut out = String::from("[log]\naccess = false\n");
    for (name, url) in backends {
        out.push_str(&format!(
            "[[backends]]\nname = \"{name}\"\nurl = \"{url}\"\n"
        ));
    }
    out
}

/// `all_progress`: whether the client must have seen all three progress notifications. The
/// TypeScript SDK 1.x may miss the last one over HTTP+SSE: its `Protocol` runs notification
/// handlers in a microtask but handles a response at once (dropping the request's progress
/// handler), and its `SSEClientTransport` (the `eventsource` package) dispatches every event of
/// one read synchronously — so a progress notification that arrives in the same read as the
/// response is dropped by the client, in the order portico sent them. (Its Streamable HTTP
/// transport awaits between events, so `interop::legacy` counts three there.)
fn check_basic(v: &Value, resource: &str, all_progress: bool) {
    assert_eq!(v["era"], "legacy", "{v}");
    assert_eq!(v["echo"], "hi", "{v}");
    assert_eq!(v["add"], "5", "{v}");
    assert_eq!(v["progress_result"], "done 3", "{v}");
    let seen = v["progress_events"].as_u64().unwrap_or(0);
    if all_progress {
        assert_eq!(seen, 3, "{v}");
    } else {
        assert!((2..=3).contains(&seen), "{v}");
    }
    assert_eq!(v["resource"], resource, "{v}");
    assert_eq!(v["prompt"], "Hello, Ada!", "{v}");
}

#[tokio::test]
async fn sdk_http_sse_clients_reach_servers_of_both_eras() {
    let ts = ts_server(&[]).await;
    let py = py_server(&[]).await;
    let gw = Gateway::start(&config(&[("ts", &ts.url()), ("py", &py.url())])).await;
    for (route, resource) in [
        ("/mcp/ts/sse", "hello from typescript"),
        ("/mcp/py/sse", "hello from python"),
    ] {
        let url = gw.url(route);
        let v = py_client(&["--sse", "--url", &url]).await;
        check_basic(&v, resource, true);
        let v = ts_client(&["--sse", "--url", &url]).await;
        check_basic(&v, resource, false);
    }
    gw.stop().await;
}

#[tokio::test]
async fn server_requests_reach_http_sse_clients_and_their_answers_come_back() {
    let ts = ts_server(&["--input-tools"]).await;
    let py = py_server(&["--input-tools"]).await;
    let gw = Gateway::start(&config(&[("ts", &ts.url()), ("py", &py.url())])).await;
    for route in ["/mcp/ts/sse", "/mcp/py/sse"] {
        let url = gw.url(route);
        for v in [
            py_client(&["--sse", "--scenario", "input", "--url", &url]).await,
            ts_client(&["--sse", "--scenario", "input", "--url", &url]).await,
        ] {
            assert_eq!(v["era"], "legacy", "{route}: {v}");
            super::input::check(&v);
        }
    }
    gw.stop().await;
}
