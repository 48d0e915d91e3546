//! `subscriptions/listen` through `/mcp/<name>` to the official SDK servers (issue #20 item 1):
//! the Python SDK's 2026-07-28 server over HTTP and stdio (forwarded), the TypeScript SDK v1
//! server over HTTP (stateful) and stdio (bridged: the session's GET stream, the child's
//! output, `resources/subscribe` upstream). A tool added upstream → one `list_changed`; a
//! subscribed resource updated → one `resources/updated`; the stream outlives `timeout_ms` with
//! keep-alives and ends with the client (`portico_listen_streams` back to 0).

use super::*;
use crate::common::*;
use crate::listen::{Listen, config, http_backend, open_listens, until};
use serde_json::json;

fn stdio(command: &[String]) -> String {
    format!(
        "command = {}\nprobe_timeout_ms = 10000\n",
        serde_json::to_string(command).unwrap()
    )
}

fn count(msgs: &[Value], method: &str) -> usize {
    msgs.iter().filter(|m| m["method"] == method).count()
}

async fn call(url: &str, id: u64, tool: &str, args: Value) -> Resp {
    let r = mcp(
        url,
        json!(id),
        "tools/call",
        json!({"name": tool, "arguments": args}),
    )
    .await;
    assert_eq!(r.status, 200, "{tool}: {:?}", r.body);
    assert!(r.result()["result"].is_object(), "{tool}: {:?}", r.body);
    r
}

/// The must-show walk on one backend route (`b`), whose resource is `uri`.
async fn walk(backend: &str, uri: &str, what: &str) {
    let gw = Gateway::start(&config(backend)).await;
    let url = gw.url("/mcp/b");
    // The server started and its session opened before the listen: a stdio child (node,
    // Python) can take longer than the short `timeout_ms` to start on a loaded machine, and the
    // listen is what this test is about.
    until("the backend to answer tools/list", || async {
        mcp(&url, json!(0), "tools/list", json!({})).await.status == 200
    })
    .await;
    let filter = json!({"toolsListChanged": true, "resourceSubscriptions": [uri]});
    let (status, mut l) = Listen::open(&url, json!("I1"), filter).await;
    assert_eq!(status, 200, "{what}");
    let first = l
        .read_until("notifications/subscriptions/acknowledged")
        .await;
    assert_eq!(
        first[0]["method"], "notifications/subscriptions/acknowledged",
        "{what}: {first:?}"
    );
    let ack = &first[0]["params"]["notifications"];
    assert_eq!(ack["toolsListChanged"], true, "{what}: {ack}");
    assert_eq!(ack["resourceSubscriptions"], json!([uri]), "{what}: {ack}");
    assert_eq!(
        first[0]["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        "I1"
    );
    // Past timeout_ms (600 ms): still open, keep-alive comments only.
    let quiet = l.read(1500).await;
    assert!(quiet.is_empty(), "{what}: {quiet:?}");
    assert!(
        String::from_utf8_lossy(&l.raw).contains(": keep-alive"),
        "{what}: no keep-alive"
    );
    assert_eq!(open_listens(&gw, "b").await, 1);
    call(&url, 1, "add_tool", json!({"name": "added_upstream"})).await;
    let notes = l.read_until("notifications/tools/list_changed").await;
    let notes = [notes, l.read(300).await].concat();
    assert_eq!(
        count(&notes, "notifications/tools/list_changed"),
        1,
        "{what}: {notes:?}"
    );
    call(&url, 2, "touch", json!({"uri": uri})).await;
    let notes = l.read_until("notifications/resources/updated").await;
    let notes = [notes, l.read(300).await].concat();
    assert_eq!(
        count(&notes, "notifications/resources/updated"),
        1,
        "{what}: {notes:?}"
    );
    for n in &notes {
        assert_eq!(
            n["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "I1",
            "{what}: {n}"
        );
    }
    drop(l);
    until("the gauge back to 0", || async {
        open_listens(&gw, "b").await == 0
    })
    .await;
    gw.stop().await;
}

#[tokio::test]
async fn listen_to_the_python_sdk_server_over_http() {
    let py = py_server(&[]).await;
    walk(&http_backend(&py.url()), "demo://greeting", "python http").await;
}

#[tokio::test]
async fn listen_to_the_python_sdk_server_over_stdio() {
    walk(
        &stdio(&py_stdio_command()),
        "demo://greeting",
        "python stdio",
    )
    .await;
}

#[tokio::test]
async fn listen_to_the_typescript_sdk_server_over_http() {
    let ts = ts_server(&[]).await;
    walk(
        &http_backend(&ts.url()),
        "demo://greeting",
        "typescript http",
    )
    .await;
    // The bridge subscribed in the session, and unsubscribed when the client left.
    assert_eq!(ts.count("resources/subscribe").await, 1);
    until("resources/unsubscribe upstream", || async {
        ts.count("resources/unsubscribe").await == 1
    })
    .await;
}

#[tokio::test]
async fn listen_to_the_typescript_sdk_server_over_stdio() {
    walk(
        &stdio(&ts_stdio_command()),
        "demo://greeting",
        "typescript stdio",
    )
    .await;
}
