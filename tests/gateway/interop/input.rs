//! Interop for server-to-client requests across the eras (issue #19 items 3 and 4), with the
//! official SDKs on both sides of portico. The servers' `ask` tool elicits a name and then samples
//! the client mid-call; `roots` lists the client's roots (`--input-tools`). The clients answer
//! with callbacks / handlers (`--scenario input`).
//!
//! - TypeScript SDK 1.x server (initialize era) ← Python SDK client on 2026-07-28: the server's
//!   requests park the call and reach the client as `input_required`; its retries complete it.
//! - TypeScript SDK 1.x server ← TypeScript SDK 1.x client: relayed on the call's stream.
//! - Python SDK server on 2026-07-28 (`Resolve` with `Elicit`/`Sample`/`ListRoots`) ←
//!   TypeScript SDK 1.x client: `input_required` becomes real requests; portico retries.

use super::*;
use crate::common::*;

fn one_backend(name: &str, url: &str) -> String {
    format!("[log]\naccess = false\n[[backends]]\nname = \"{name}\"\nurl = \"{url}\"\n")
}

/// What the `--scenario input` clients report when every server request reached them.
pub(super) fn check(v: &Value) {
    assert_eq!(v["ask"], "name=octocat; sampled=Paris", "{v}");
    assert_eq!(v["roots"], "file:///work", "{v}");
    assert_eq!(
        v["asked"],
        serde_json::json!({"elicitation": 1, "sampling": 1, "roots": 1}),
        "each callback once: {v}"
    );
}

#[tokio::test]
async fn typescript_server_asks_a_python_2026_client_through_input_required() {
    let server = ts_server(&["--input-tools"]).await;
    let gw = Gateway::start(&one_backend("ts", &server.url())).await;
    let url = gw.url("/mcp/ts");
    let v = py_client(&["--modern", "--scenario", "input", "--url", &url]).await;
    // A 2026-07-28 client has no back channel: its callbacks ran only for `inputRequests`.
    assert_eq!(v["era"], "modern", "{v}");
    check(&v);
    // Each tool was called once upstream: the retries resumed the parked calls.
    assert_eq!(server.count("tools/call").await, 2);
}

#[tokio::test]
async fn typescript_server_asks_a_typescript_client_through_relayed_requests() {
    let server = ts_server(&["--input-tools"]).await;
    let gw = Gateway::start(&one_backend("ts", &server.url())).await;
    let url = gw.url("/mcp/ts");
    let v = ts_client(&["--scenario", "input", "--url", &url]).await;
    assert_eq!(v["era"], "legacy", "{v}");
    check(&v);
    assert_eq!(server.count("tools/call").await, 2);
}

#[tokio::test]
async fn python_2026_server_asks_a_typescript_client_through_real_requests() {
    let server = py_server(&["--input-tools"]).await;
    let gw = Gateway::start(&one_backend("py", &server.url())).await;
    let url = gw.url("/mcp/py");
    let v = ts_client(&["--scenario", "input", "--url", &url]).await;
    check(&v);
    // The server is on 2026-07-28 (a legacy-era session would ask on the call's stream, one
    // call per tool): each tool was called, answered `input_required`, and was retried by
    // portico with the answers.
    assert!(
        server.count("tools/call").await >= 4,
        "{}",
        server.stats().await
    );
}
