//! Interop for the bridges: the TypeScript SDK v1 server (initialize era only) behind portico
//! for 2026-07-28 clients, and initialize-era clients (TypeScript SDK v1, Python SDK forced to
//! the legacy handshake) in front of portico for both kinds of backend.

use super::*;
use crate::common::*;
use serde_json::json;

fn one_backend(name: &str, url: &str) -> String {
    format!("[log]\naccess = false\n[[backends]]\nname = \"{name}\"\nurl = \"{url}\"\n")
}

/// Raw 2026-07-28 checks: every result has resultType; lists and reads have ttlMs/cacheScope.
pub(super) async fn check_shapes(url: &str, resource: &str) {
    for (method, params, cacheable) in [
        ("server/discover", json!({}), true),
        ("tools/list", json!({}), true),
        ("prompts/list", json!({}), true),
        ("resources/list", json!({}), true),
        ("resources/read", json!({"uri": resource}), true),
        (
            "tools/call",
            json!({"name":"echo","arguments":{"text":"x"}}),
            false,
        ),
        (
            "prompts/get",
            json!({"name":"greet","arguments":{"name":"Ada"}}),
            false,
        ),
    ] {
        let r = mcp(url, json!(method), method, params).await;
        assert_eq!(r.status, 200, "{method}: {:?}", r.body);
        let res = r.result()["result"].clone();
        assert_eq!(res["resultType"], "complete", "{method}: {res}");
        if cacheable {
            assert!(res["ttlMs"].is_u64(), "{method}: {res}");
            assert!(
                res["cacheScope"] == "private" || res["cacheScope"] == "public",
                "{method}: {res}"
            );
        }
        assert_eq!(r.result()["id"], json!(method));
    }
}

#[tokio::test]
async fn typescript_sdk_http_server_is_bridged_for_modern_clients() {
    for mode in [
        &[][..],
        &["--json"],
        &["--stateless"],
        &["--stateless", "--json"],
    ] {
        let server = ts_server(mode).await;
        let gw = Gateway::start(&one_backend("ts", &server.url())).await;
        let url = gw.url("/mcp/ts");
        check_shapes(&url, "demo://greeting").await;
        let via = py_client(&["--modern", "--url", &url]).await;
        assert_eq!(via["era"], "modern", "{mode:?}");
        assert_eq!(via["echo"], "hi");
        assert_eq!(via["add"], "5");
        assert_eq!(via["progress_result"], "done 3");
        assert_eq!(via["resource"], "hello from typescript");
        assert_eq!(via["prompt"], "Hello, Ada!");
        let json_mode = mode.contains(&"--json");
        assert_eq!(
            via["progress_events"],
            if json_mode { 0 } else { 3 },
            "{mode:?}"
        );
    }
}

#[tokio::test]
async fn a_restarted_typescript_server_is_picked_up() {
    let server = ts_server(&[]).await;
    let port = server.port.to_string();
    let gw = Gateway::start(&one_backend("ts", &server.url())).await;
    let url = gw.url("/mcp/ts");
    let r = mcp(
        &url,
        json!(1),
        "tools/call",
        json!({"name":"echo","arguments":{"text":"before"}}),
    )
    .await;
    assert_eq!(r.result()["result"]["content"][0]["text"], "before");
    drop(server); // kills the process: its sessions are gone
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let _server = ts_server(&["--port", &port]).await;
    let r = mcp(
        &url,
        json!(2),
        "tools/call",
        json!({"name":"echo","arguments":{"text":"after"}}),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.result()["result"]["content"][0]["text"], "after");
}

#[tokio::test]
async fn typescript_sdk_client_works_through_portico() {
    let py = py_server(&[]).await;
    let ts = ts_server(&[]).await;
    let gw = Gateway::start(&format!(
        "[log]\naccess = false\n[[backends]]\nname = \"py\"\nurl = \"{}\"\n[[backends]]\nname = \"ts\"\nurl = \"{}\"\n",
        py.url(),
        ts.url()
    ))
    .await;
    for (path, direct, who) in [
        ("/mcp/py", py.url(), "python"),
        ("/mcp/ts", ts.url(), "typescript"),
    ] {
        let direct = ts_client(&["--url", &direct]).await;
        let via = ts_client(&["--url", &gw.url(path)]).await;
        assert_eq!(scenario(&via), scenario(&direct), "{path}");
        assert_eq!(via["resource"], format!("hello from {who}"));
        assert_eq!(via["progress_events"], 3, "{path}");
        assert_eq!(via["echo"], "hi");
        assert_eq!(via["prompt"], "Hello, Ada!");
    }
}

#[tokio::test]
async fn python_sdk_client_forced_legacy_works_through_portico() {
    let py = py_server(&[]).await;
    let ts = ts_server(&[]).await;
    let gw = Gateway::start(&format!(
        "[log]\naccess = false\n[[backends]]\nname = \"py\"\nurl = \"{}\"\n[[backends]]\nname = \"ts\"\nurl = \"{}\"\n",
        py.url(),
        ts.url()
    ))
    .await;
    for (path, who) in [("/mcp/py", "python"), ("/mcp/ts", "typescript")] {
        let via = py_client(&["--legacy", "--url", &gw.url(path)]).await;
        assert_eq!(via["era"], "legacy", "{path}");
        assert_eq!(via["resource"], format!("hello from {who}"));
        assert_eq!(via["progress_events"], 3, "{path}");
        assert_eq!(via["add"], "5");
        assert_eq!(via["prompt"], "Hello, Ada!");
    }
}
