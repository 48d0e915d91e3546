//! The shared cache against the official SDK servers: a tool added at runtime and announced
//! with `list_changed` shows up through portico at once, long before the list's `ttlMs` —
//! through portico's own `subscriptions/listen` (Python SDK, 2026-07-28) and through the legacy
//! session's GET stream (TypeScript SDK v1, bridged).

use super::*;
use crate::common::*;
use serde_json::json;

fn tool_names(r: &Resp) -> Vec<String> {
    r.json()["result"]["tools"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|t| t["name"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Lists, lists again (a hit), adds a tool through portico, then polls the list until the tool
/// appears (bounded: the list's ttl is 10 minutes, so only the notification can explain it).
async fn added_tool_appears(gw: &Gateway, path: &str, server: &Server, tool: &str) {
    let url = gw.url(path);
    let r = mcp(&url, json!(1), "tools/list", json!({})).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert!(!tool_names(&r).contains(&tool.to_string()));
    let before = server.count("tools/list").await;
    let r = mcp(&url, json!(2), "tools/list", json!({})).await;
    assert_eq!(r.json()["id"], 2);
    assert_eq!(
        server.count("tools/list").await,
        before,
        "the second list is a cache hit"
    );
    // Give portico's watcher a moment to open its stream before the change happens.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let r = mcp(
        &url,
        json!(3),
        "tools/call",
        json!({"name":"add_tool","arguments":{"name": tool}}),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let started = std::time::Instant::now();
    loop {
        let r = mcp(&url, json!(4), "tools/list", json!({})).await;
        if tool_names(&r).contains(&tool.to_string()) {
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{tool} did not appear through portico within 5 s (ttl is 10 min)"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(server.count("tools/list").await > before);
}

#[tokio::test]
async fn python_sdk_list_changed_invalidates_through_listen() {
    let server = py_server(&["--ttl-ms", "600000", "--cache-scope", "public"]).await;
    let gw = Gateway::start(&format!(
        "[log]\naccess = false\n[[backends]]\nname = \"py\"\nurl = \"{}\"\n",
        server.url()
    ))
    .await;
    added_tool_appears(&gw, "/mcp/py", &server, "late_tool").await;
    assert!(
        server.count("subscriptions/listen").await >= 1,
        "portico listened"
    );
}

#[tokio::test]
async fn typescript_sdk_list_changed_invalidates_through_the_legacy_get_stream() {
    let server = ts_server(&[]).await;
    let gw = Gateway::start(&format!(
        "[log]\naccess = false\n[[backends]]\nname = \"ts\"\nurl = \"{}\"\ndefault_ttl_ms = 600000\ndefault_cache_scope = \"public\"\n",
        server.url()
    ))
    .await;
    added_tool_appears(&gw, "/mcp/ts", &server, "late_ts_tool").await;
}
