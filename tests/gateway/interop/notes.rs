//! The TypeScript SDK v1 client (initialize era) through portico to each official SDK server
//! (issue #20 item 2): `resources/subscribe` → the update on its GET stream; `logging/setLevel`
//! and a tool that logs → each of two clients sees its own lines at its own level, and none of
//! the other's. And a 2026-07-28 client's `logLevel` against the TypeScript (legacy) server
//! (item 3).

use super::*;
use crate::common::*;
use serde_json::json;

fn gateway_config(backend: &str) -> String {
    format!(
        "[log]\naccess = false\n[cache]\nenabled = false\n[[backends]]\nname = \"b\"\n\
         timeout_ms = 10000\nprobe_timeout_ms = 10000\n{backend}\n"
    )
}

fn stdio(command: &[String]) -> String {
    format!("command = {}\n", serde_json::to_string(command).unwrap())
}

fn url_backend(url: &str) -> String {
    format!("url = \"{url}\"\n")
}

/// Two TS clients (A at warning, B at debug) through `/mcp/b`, at once or one after the other,
/// over Streamable HTTP or (`sse`) the 2024-11-05 HTTP+SSE transport at `/mcp/b/sse`; their
/// reports.
async fn two_clients(gw: &Gateway, at_once: bool, sse: bool) -> (Value, Value) {
    let url = gw.url(if sse { "/mcp/b/sse" } else { "/mcp/b" });
    let transport = if sse { "--sse" } else { "--legacy" };
    let args = |level: &'static str, tag: &'static str| {
        [
            transport,
            "--url",
            &url,
            "--scenario",
            "notes",
            "--level",
            level,
            "--tag",
            tag,
        ]
        .map(String::from)
    };
    let (a_args, b_args) = (args("warning", "A"), args("debug", "B"));
    let a_refs: Vec<&str> = a_args.iter().map(String::as_str).collect();
    let b_refs: Vec<&str> = b_args.iter().map(String::as_str).collect();
    let a = ts_client(&a_refs);
    let b = ts_client(&b_refs);
    if at_once {
        tokio::join!(a, b)
    } else {
        let a = a.await;
        (a, b.await)
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Subscriptions and per-client log lines, for a backend that can deliver both.
async fn subscribe_and_log(backend: &str, what: &str, at_once: bool) {
    subscribe_and_log_via(backend, what, at_once, false).await
}

async fn subscribe_and_log_via(backend: &str, what: &str, at_once: bool, sse: bool) {
    let gw = Gateway::start(&gateway_config(backend)).await;
    let (a, b) = two_clients(&gw, at_once, sse).await;
    for (name, r) in [("A", &a), ("B", &b)] {
        assert_eq!(
            strings(&r["updated"]),
            ["demo://greeting"],
            "{what} {name}: {r}"
        );
    }
    assert_eq!(strings(&a["logs"]), ["A:warning", "A:error"], "{what}: {a}");
    assert_eq!(
        strings(&b["logs"]),
        ["B:debug", "B:info", "B:warning", "B:error"],
        "{what}: {b}"
    );
    gw.stop().await;
}

#[tokio::test]
async fn typescript_client_to_the_typescript_server_over_http() {
    let ts = ts_server(&[]).await;
    subscribe_and_log(&url_backend(&ts.url()), "typescript http", true).await;
    assert!(
        ts.count("logging/setLevel").await >= 2,
        "in each client's session"
    );
}

/// The same clients over the 2024-11-05 HTTP+SSE transport in front (`sse_front`): what their
/// sessions' GET streams carry reaches each client's one stream.
#[tokio::test]
async fn typescript_http_sse_clients_to_the_typescript_server() {
    let ts = ts_server(&[]).await;
    subscribe_and_log_via(&url_backend(&ts.url()), "typescript, sse front", true, true).await;
}

#[tokio::test]
async fn typescript_client_to_the_python_server_over_http() {
    let py = py_server(&[]).await;
    subscribe_and_log(&url_backend(&py.url()), "python http", true).await;
}

#[tokio::test]
async fn typescript_client_to_the_python_server_over_stdio() {
    // One after the other: a stdio log line names no request, so it is relayed only while one
    // request that asked for logs is in flight on the shared child (`upstream::stdio`).
    subscribe_and_log(&stdio(&py_stdio_command()), "python stdio", false).await;
}

/// The TypeScript stdio server is initialize-era: each legacy client gets its own child, so
/// its log lines are its own.
#[tokio::test]
async fn typescript_client_to_the_typescript_server_over_stdio() {
    subscribe_and_log(&stdio(&ts_stdio_command()), "typescript stdio", true).await;
}

/// Item 3: a 2026-07-28 request with `logLevel` to the TypeScript SDK (legacy) server gets its
/// log lines on the call's stream, filtered by level; without one, none.
#[tokio::test]
async fn a_modern_clients_log_level_reaches_the_typescript_server() {
    let ts = ts_server(&[]).await;
    modern_log_levels(&url_backend(&ts.url())).await;
}

/// The same with the TypeScript server as a stdio child of the client's own (the default
/// isolation): the bridge strips `logLevel` going up, so the transport is told the call asked.
#[tokio::test]
async fn a_modern_clients_log_level_reaches_the_typescript_stdio_server() {
    modern_log_levels(&stdio(&ts_stdio_command())).await;
}

/// The same over a URL the probe finds to serve HTTP+SSE (no `transport` configured): the GET
/// stream and the subscriptions go over the client's SSE session, not to the URL.
#[tokio::test]
async fn typescript_client_to_a_typescript_sse_server_found_by_the_probe() {
    let ts = ts_server(&["--transport", "sse"]).await;
    let backend = format!("url = \"http://127.0.0.1:{}/sse\"\n", ts.port);
    subscribe_and_log(&backend, "typescript sse, probed", true).await;
}

/// A 2026-07-28 client's calls to the `log` tool with `logLevel` warning, debug and none.
async fn modern_log_levels(backend: &str) {
    let gw = Gateway::start(&gateway_config(backend)).await;
    let url = gw.url("/mcp/b");
    let call = |id: u64, level: Option<&'static str>| {
        let url = url.clone();
        async move {
            let mut params = json!({"name":"log","arguments":{"tag":"M"}});
            if let Some(l) = level {
                params["_meta"] = json!({"io.modelcontextprotocol/logLevel": l});
            }
            let r = mcp(&url, json!(id), "tools/call", params).await;
            assert_eq!(
                r.result()["result"]["content"][0]["text"],
                "logged",
                "{:?}",
                r.body
            );
            r.messages()
                .iter()
                .filter(|m| m["method"] == "notifications/message")
                .map(|m| m["params"]["data"].as_str().unwrap_or("").to_string())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(call(1, Some("warning")).await, ["M:warning", "M:error"]);
    assert_eq!(
        call(2, Some("debug")).await,
        ["M:debug", "M:info", "M:warning", "M:error"]
    );
    assert!(call(3, None).await.is_empty());
    gw.stop().await;
}

/// The TypeScript SDK's 2024-11-05 HTTP+SSE server (issue #20 item 9): each legacy client has
/// an SSE session of its own upstream, whose notifications and log lines reach that client's
/// GET stream alone.
#[tokio::test]
async fn typescript_client_to_the_typescript_server_over_sse() {
    let ts = ts_server(&["--transport", "sse"]).await;
    let backend = format!(
        "url = \"http://127.0.0.1:{}/sse\"\ntransport = \"sse\"\n",
        ts.port
    );
    subscribe_and_log(&backend, "typescript sse", true).await;
}
