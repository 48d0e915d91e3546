//! Initialize-era backends behind portico (the bridge) and initialize-era clients in front of it
//! (sealed sessions), against the in-repo mock.

use crate::common::mock::{LegacyRejects, MockMcp};
use crate::common::*;
use serde_json::{Value, json};
use std::time::Duration;

fn backend(url: &str, extra: &str) -> String {
    format!(
        "[log]\naccess = false\n[[backends]]\nname = \"old\"\nurl = \"{url}\"\ntimeout_ms = 3000\n{extra}\n"
    )
}

/// Checks the 2026 shape of the standard calls through a bridged backend.
async fn check_modern_view(gw: &Gateway, path: &str) {
    let r = mcp(&gw.url(path), json!("d"), "server/discover", json!({})).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let d = r.json()["result"].clone();
    assert_eq!(d["resultType"], "complete");
    assert!(
        d["supportedVersions"]
            .as_array()
            .unwrap()
            .contains(&json!(LATEST))
    );
    assert_eq!(d["instructions"], "legacy instructions");
    assert_eq!(
        d["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "legacy-mock"
    );
    assert_eq!(d["cacheScope"], "private", "the safe default");
    assert_eq!(d["ttlMs"], 0);
    let r = mcp(&gw.url(path), json!(1), "tools/list", json!({})).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let v = r.json();
    assert_eq!(v["id"], 1);
    assert_eq!(v["result"]["resultType"], "complete");
    assert_eq!(v["result"]["cacheScope"], "private");
    assert_eq!(v["result"]["ttlMs"], 0);
    assert!(
        v["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "echo")
    );
    let r = mcp(
        &gw.url(path),
        json!(2),
        "tools/call",
        json!({"name":"echo","arguments":{"text":"hey"}}),
    )
    .await;
    assert_eq!(r.result()["result"]["content"][0]["text"], "hey");
    assert_eq!(r.result()["result"]["resultType"], "complete");
    assert_eq!(r.result()["id"], 2);
    let r = mcp(
        &gw.url(path),
        json!(3),
        "resources/read",
        json!({"uri":"mock://r"}),
    )
    .await;
    assert_eq!(r.result()["result"]["contents"][0]["text"], "mock resource");
    assert_eq!(r.result()["result"]["cacheScope"], "private");
    let r = mcp(
        &gw.url(path),
        json!(4),
        "resources/read",
        json!({"uri":"mock://missing"}),
    )
    .await;
    assert_eq!(
        r.result()["error"]["code"],
        -32602,
        "legacy -32002 becomes -32602"
    );
    let r = mcp(
        &gw.url(path),
        json!(5),
        "prompts/get",
        json!({"name":"greet","arguments":{"name":"Ada"}}),
    )
    .await;
    assert_eq!(
        r.result()["result"]["messages"][0]["content"]["text"],
        "Hello, Ada!"
    );
}

#[tokio::test]
async fn every_legacy_refusal_shape_is_bridged() {
    for rejects in [
        LegacyRejects::TsUnsupportedVersion,
        LegacyRejects::PyMissingSession,
        LegacyRejects::Empty404,
        LegacyRejects::Html405,
    ] {
        for sse in [false, true] {
            let mut m = MockMcp::legacy().rejects(rejects);
            if sse {
                m = m.sse();
            }
            let mock = m.start().await;
            let gw = Gateway::start(&backend(&mock.url(), "")).await;
            check_modern_view(&gw, "/mcp/old").await;
            assert_eq!(mock.count("server/discover"), 1, "{rejects:?}: probed once");
            assert_eq!(
                mock.count("initialize"),
                1,
                "{rejects:?}: one upstream session"
            );
        }
    }
}

#[tokio::test]
async fn stateless_legacy_servers_are_bridged() {
    for sse in [false, true] {
        let mut m = MockMcp::legacy()
            .stateless()
            .rejects(LegacyRejects::AnswerLegacy);
        if sse {
            m = m.sse();
        }
        let mock = m.start().await;
        let gw = Gateway::start(&backend(&mock.url(), "")).await;
        check_modern_view(&gw, "/mcp/old").await;
    }
}

#[tokio::test]
async fn configured_defaults_and_forced_protocol() {
    let mock = MockMcp::legacy().start().await;
    let gw = Gateway::start(&backend(
        &mock.url(),
        "protocol = \"legacy\"\ndefault_ttl_ms = 30000\ndefault_cache_scope = \"public\"",
    ))
    .await;
    let r = mcp(&gw.url("/mcp/old"), json!(1), "tools/list", json!({})).await;
    assert_eq!(r.json()["result"]["ttlMs"], 30000);
    assert_eq!(r.json()["result"]["cacheScope"], "public");
    assert_eq!(
        mock.count("server/discover"),
        0,
        "protocol = legacy skips the probe"
    );
}

#[tokio::test]
async fn progress_is_relayed_with_the_clients_token() {
    let mock = MockMcp::legacy().sse().start().await;
    let gw = Gateway::start(&backend(&mock.url(), "")).await;
    let r = mcp(
        &gw.url("/mcp/old"),
        json!(7),
        "tools/call",
        json!({"name":"progress","arguments":{"steps":3,"delay_ms":30},"_meta":{"progressToken":"mine"}}),
    )
    .await;
    let msgs = r.messages();
    assert_eq!(msgs.len(), 4, "{msgs:?}");
    for m in &msgs[..3] {
        assert_eq!(m["params"]["progressToken"], "mine");
    }
    assert_eq!(msgs[3]["id"], 7);
    assert_eq!(msgs[3]["result"]["content"][0]["text"], "done 3");
    // Upstream saw a gateway token and id, not the client's, and no 2026 _meta keys.
    let up = mock
        .seen()
        .into_iter()
        .find(|s| s.body["params"]["name"] == "progress")
        .unwrap();
    assert_ne!(up.body["params"]["_meta"]["progressToken"], "mine");
    assert_ne!(up.body["id"], 7);
    assert!(
        up.body["params"]["_meta"]
            .get("io.modelcontextprotocol/protocolVersion")
            .is_none()
    );
    assert!(up.headers.get("mcp-session-id").is_some());
    assert_eq!(up.headers["mcp-protocol-version"], "2025-11-25");
}

#[tokio::test]
async fn concurrent_clients_with_the_same_id_share_one_session() {
    let mock = MockMcp::legacy().sse().start().await;
    let gw = Gateway::start(&backend(&mock.url(), "")).await;
    let mut tasks = Vec::new();
    for i in 0..20 {
        let url = gw.url("/mcp/old");
        tasks.push(tokio::spawn(async move {
            let r = mcp(
                &url,
                json!(1),
                "tools/call",
                json!({"name":"echo","arguments":{"text":format!("c{i}")}}),
            )
            .await;
            assert_eq!(r.result()["id"], 1);
            assert_eq!(r.result()["result"]["content"][0]["text"], format!("c{i}"));
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(mock.count("initialize"), 1);
    let ids: std::collections::HashSet<String> = mock
        .seen()
        .iter()
        .filter(|s| s.body["method"] == "tools/call")
        .map(|s| s.body["id"].to_string())
        .collect();
    assert_eq!(ids.len(), 20, "upstream ids are unique within the session");
}

#[tokio::test]
async fn a_lost_session_is_reinitialized_and_the_request_retried() {
    let mock = MockMcp::legacy().start().await;
    let gw = Gateway::start(&backend(&mock.url(), "")).await;
    let r = mcp(&gw.url("/mcp/old"), json!(1), "tools/list", json!({})).await;
    assert_eq!(r.status, 200);
    mock.drop_sessions();
    let r = mcp(&gw.url("/mcp/old"), json!(2), "tools/list", json!({})).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["id"], 2);
    assert_eq!(mock.count("initialize"), 2);
}

#[tokio::test]
async fn a_restarted_server_is_picked_up() {
    let mock = MockMcp::legacy().start().await;
    let addr = mock.addr;
    let gw = Gateway::start(&backend(&mock.url(), "")).await;
    assert_eq!(
        mcp(&gw.url("/mcp/old"), json!(1), "tools/list", json!({}))
            .await
            .status,
        200
    );
    drop(mock);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let mock = MockMcp::legacy().start_on(listener).await;
    let r = mcp(&gw.url("/mcp/old"), json!(2), "tools/list", json!({})).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        mock.count("initialize"),
        1,
        "a fresh session on the new server"
    );
}

#[tokio::test]
async fn a_backend_that_turns_legacy_is_reprobed() {
    let mock = MockMcp::modern().start().await;
    let addr = mock.addr;
    let gw = Gateway::start(&backend(&mock.url(), "")).await;
    let r = mcp(&gw.url("/mcp/old"), json!(1), "tools/list", json!({})).await;
    assert_eq!(r.json()["result"]["cacheScope"], "public", "modern answer");
    drop(mock);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let mock = MockMcp::legacy().start_on(listener).await;
    let r = mcp(
        &gw.url("/mcp/old"),
        json!(2),
        "tools/call",
        json!({"name":"echo","arguments":{"text":"x"}}),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.result()["result"]["content"][0]["text"], "x");
    assert_eq!(mock.count("initialize"), 1);
}

#[tokio::test]
async fn client_disconnect_sends_cancelled_upstream() {
    for sse in [false, true] {
        let mut m = MockMcp::legacy();
        if sse {
            m = m.sse();
        }
        let mock = m.start().await;
        let gw = Gateway::start(&backend(&mock.url(), "")).await;
        let url = gw.url("/mcp/old");
        let call = tokio::spawn(async move {
            mcp(
                &url,
                json!(1),
                "tools/call",
                json!({"name":"slow","arguments":{"ms":3000}}),
            )
            .await
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        call.abort();
        let mut notes = Vec::new();
        for _ in 0..60 {
            notes = mock.state.cancel_notes.lock().unwrap().clone();
            if !notes.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            !notes.is_empty(),
            "no notifications/cancelled within 3 s (sse={sse})"
        );
        let upstream_id = mock
            .seen()
            .iter()
            .find(|s| s.body["params"]["name"] == "slow")
            .map(|s| s.body["id"].clone())
            .unwrap();
        assert_eq!(notes[0]["params"]["requestId"], upstream_id, "sse={sse}");
    }
}

#[tokio::test]
async fn server_initiated_requests_get_an_error_not_silence() {
    let mock = MockMcp::legacy().sse().start().await;
    let gw = Gateway::start(&backend(&mock.url(), "")).await;
    let r = mcp(
        &gw.url("/mcp/old"),
        json!(1),
        "tools/call",
        json!({"name":"ask","arguments":{}}),
    )
    .await;
    let text = r.result()["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        text.starts_with("answer:") && text.contains("-32601"),
        "{text}"
    );
    // The elicitation request itself never reached the client.
    assert!(r.messages().iter().all(|m| m.get("method").is_none()));
}

#[tokio::test]
async fn the_upstream_session_is_deleted_on_shutdown() {
    let mock = MockMcp::legacy().start().await;
    let gw = Gateway::start(&backend(&mock.url(), "")).await;
    assert_eq!(
        mcp(&gw.url("/mcp/old"), json!(1), "tools/list", json!({}))
            .await
            .status,
        200
    );
    assert_eq!(mock.session_count(), 1);
    gw.stop().await;
    assert_eq!(
        mock.state
            .deletes
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!(mock.session_count(), 0);
}

// === Legacy clients ===

/// An initialize-era client, by hand.
pub(crate) struct OldClient {
    pub(crate) url: String,
    pub(crate) sid: String,
    pub(crate) version: String,
}

fn legacy_headers<'a>(sid: Option<&'a str>, version: Option<&'a str>) -> Vec<(&'a str, &'a str)> {
    let mut h = vec![
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
    ];
    if let Some(s) = sid {
        h.push(("mcp-session-id", s));
    }
    if let Some(v) = version {
        h.push(("mcp-protocol-version", v));
    }
    h
}

impl OldClient {
    pub(crate) async fn connect(url: &str, version: &str) -> (OldClient, Value) {
        let body = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
            "protocolVersion":version,"capabilities":{"roots":{}},"clientInfo":{"name":"old","version":"1"}}});
        let r = send("POST", url, &legacy_headers(None, None), body.to_string()).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        let sid = r.header("mcp-session-id").expect("session id").to_string();
        let init = r.result()["result"].clone();
        let version = init["protocolVersion"].as_str().unwrap().to_string();
        let c = OldClient {
            url: url.to_string(),
            sid,
            version,
        };
        let note = json!({"jsonrpc":"2.0","method":"notifications/initialized"});
        let r = send(
            "POST",
            url,
            &legacy_headers(Some(&c.sid), Some(&c.version)),
            note.to_string(),
        )
        .await;
        assert_eq!(r.status, 202);
        (c, init)
    }

    pub(crate) async fn call(&self, id: Value, method: &str, params: Value) -> Resp {
        let body = json!({"jsonrpc":"2.0","id":id,"method":method,"params":params});
        send(
            "POST",
            &self.url,
            &legacy_headers(Some(&self.sid), Some(&self.version)),
            body.to_string(),
        )
        .await
    }
}

async fn check_legacy_client(url: &str) {
    let (c, init) = OldClient::connect(url, "2025-06-18").await;
    assert_eq!(init["protocolVersion"], "2025-06-18");
    assert!(init["capabilities"]["tools"].is_object());
    assert!(init["serverInfo"]["name"].is_string());
    let r = c.call(json!(1), "ping", json!({})).await;
    assert_eq!(r.json(), json!({"jsonrpc":"2.0","id":1,"result":{}}));
    let r = c.call(json!(2), "tools/list", json!({})).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let list = r.result()["result"].clone();
    assert!(
        list["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "echo")
    );
    assert!(
        list.get("resultType").is_none()
            && list.get("ttlMs").is_none()
            && list.get("cacheScope").is_none()
    );
    let r = c
        .call(
            json!(3),
            "tools/call",
            json!({"name":"echo","arguments":{"text":"yo"}}),
        )
        .await;
    assert_eq!(r.result()["result"]["content"][0]["text"], "yo");
    assert_eq!(r.result()["id"], 3);
    let r = c
        .call(json!(4), "tools/call", json!({"name":"progress","arguments":{"steps":2,"delay_ms":20},"_meta":{"progressToken":"t"}}))
        .await;
    let msgs = r.messages();
    assert_eq!(
        msgs.iter()
            .filter(|m| m["method"] == "notifications/progress")
            .count(),
        2,
        "{msgs:?}"
    );
    assert!(
        msgs.iter()
            .filter(|m| m["method"] == "notifications/progress")
            .all(|m| m["params"]["progressToken"] == "t")
    );
    assert_eq!(msgs.last().unwrap()["id"], 4);
}

#[tokio::test]
async fn legacy_clients_are_served_against_every_kind_of_backend() {
    let modern = MockMcp::modern().sse().start().await;
    let old = MockMcp::legacy().sse().start().await;
    let gw = Gateway::start(&format!(
        "[log]\naccess = false\n[[backends]]\nname = \"new\"\nurl = \"{}\"\n[[backends]]\nname = \"old\"\nurl = \"{}\"\n[[backends]]\nname = \"demo\"\nbuiltin = \"demo\"\n",
        modern.url(),
        old.url()
    ))
    .await;
    for path in ["/mcp/new", "/mcp/old", "/mcp/demo"] {
        check_legacy_client(&gw.url(path)).await;
    }
    // A modern backend received 2026-07-28 requests carrying the client's declared capabilities.
    let call = modern
        .seen()
        .into_iter()
        .find(|s| s.body["method"] == "tools/call")
        .unwrap();
    assert_eq!(call.headers["mcp-protocol-version"], LATEST);
    assert_eq!(
        call.body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"],
        json!({"roots":{}})
    );
    assert_eq!(
        call.body["params"]["_meta"]["io.modelcontextprotocol/clientInfo"]["name"],
        "old"
    );
    assert!(
        call.headers.get("mcp-session-id").is_none(),
        "our session id stays with us"
    );
}

/// 2025-03-26 requires servers to accept JSON-RPC batches; later revisions removed them. In a
/// 2025-03-26 session (whose client sends no `MCP-Protocol-Version`) each element is served as
/// if posted alone, against either era of backend: the responses come back as a JSON array in
/// order, as an event stream when an element's answer carried notifications (progress), 202
/// when nothing answers; a bad element or a batched `initialize` gets its own error. Any other
/// session's batch is refused with -32600.
#[tokio::test]
async fn a_2025_03_26_client_can_send_batches() {
    for mock in [MockMcp::modern(), MockMcp::legacy()] {
        let mock = mock.start().await;
        let gw = Gateway::start(&backend(&mock.url(), "")).await;
        let url = gw.url("/mcp/old");
        let (c, _) = OldClient::connect(&url, "2025-03-26").await;
        assert_eq!(c.version, "2025-03-26");
        let batch = |v: Value| {
            let url = url.clone();
            let sid = c.sid.clone();
            async move {
                send(
                    "POST",
                    &url,
                    &legacy_headers(Some(&sid), None),
                    v.to_string(),
                )
                .await
            }
        };
        let r = batch(json!([
            {"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"a"}}},
            {"jsonrpc":"2.0","method":"notifications/roots/list_changed"},
            {"jsonrpc":"2.0","id":"two","method":"tools/list","params":{}},
            {"jsonrpc":"2.0","id":3,"method":"initialize","params":{}},
            7
        ]))
        .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        let all = r.json();
        let all = all.as_array().expect("a JSON array");
        assert_eq!(all.len(), 4, "{all:?}");
        assert_eq!(all[0]["id"], 1);
        assert_eq!(all[0]["result"]["content"][0]["text"], "a");
        assert_eq!(all[1]["id"], "two");
        assert!(all[1]["result"]["tools"].is_array(), "{all:?}");
        assert!(all[1]["result"].get("resultType").is_none(), "legacy shape");
        assert_eq!(all[2]["id"], 3);
        assert_eq!(all[2]["error"]["code"], -32600, "{all:?}");
        assert_eq!(all[3]["id"], Value::Null);
        assert_eq!(all[3]["error"]["code"], -32600, "{all:?}");
        // Progress travels with the response, as an event stream.
        let r = batch(json!([
            {"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"progress",
                "arguments":{"steps":2,"delay_ms":10},"_meta":{"progressToken":"p"}}},
            {"jsonrpc":"2.0","id":5,"method":"ping"}
        ]))
        .await;
        let msgs = r.messages();
        assert!(r.is_sse(), "{msgs:?}");
        let progress: Vec<_> = msgs
            .iter()
            .filter(|m| m["method"] == "notifications/progress")
            .collect();
        assert_eq!(progress.len(), 2, "{msgs:?}");
        assert!(progress.iter().all(|m| m["params"]["progressToken"] == "p"));
        let ids: Vec<_> = msgs.iter().filter_map(|m| m.get("id")).collect();
        assert_eq!(ids, [&json!(4), &json!(5)], "{msgs:?}");
        // Only notifications: nothing to answer.
        let r = batch(json!([{"jsonrpc":"2.0","method":"notifications/roots/list_changed"}])).await;
        assert_eq!(r.status, 202, "{:?}", r.body);
        let r = batch(json!([])).await;
        assert_eq!(r.code(), -32600);
        // A later revision's session: refused.
        let (later, _) = OldClient::connect(&url, "2025-06-18").await;
        let r = send(
            "POST",
            &url,
            &legacy_headers(Some(&later.sid), Some(&later.version)),
            json!([{"jsonrpc":"2.0","id":1,"method":"ping"}]).to_string(),
        )
        .await;
        assert_eq!(r.status, 400, "{:?}", r.body);
        assert_eq!(r.code(), -32600);
        gw.stop().await;
    }
}

#[tokio::test]
async fn legacy_clients_get_legacy_error_codes() {
    let modern = MockMcp::modern().start().await;
    let gw = Gateway::start(&format!(
        "[[backends]]\nname = \"new\"\nurl = \"{}\"\n",
        modern.url()
    ))
    .await;
    let (c, _) = OldClient::connect(&gw.url("/mcp/new"), "2025-11-25").await;
    let r = c
        .call(json!(9), "resources/read", json!({"uri":"mock://missing"}))
        .await;
    assert_eq!(r.result()["error"]["code"], -32002);
}

#[tokio::test]
async fn version_negotiation() {
    let gw = Gateway::start("[[backends]]\nname = \"demo\"\nbuiltin = \"demo\"\n").await;
    for (asked, got) in [
        ("2025-11-25", "2025-11-25"),
        ("2025-06-18", "2025-06-18"),
        ("2025-03-26", "2025-03-26"),
        ("2024-11-05", "2025-11-25"),
    ] {
        let (_, init) = OldClient::connect(&gw.url("/mcp/demo"), asked).await;
        assert_eq!(init["protocolVersion"], got);
    }
}

#[tokio::test]
async fn bad_sessions_get_404_and_requests_before_initialize_get_400() {
    let gw = Gateway::start("[sessions]\nkey = \"k1\"\nttl_ms = 300\n[[backends]]\nname = \"demo\"\nbuiltin = \"demo\"\n[[backends]]\nname = \"demo2\"\nbuiltin = \"demo\"\n").await;
    let url = gw.url("/mcp/demo");
    let list = json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}).to_string();
    // Before initialize.
    let r = send(
        "POST",
        &url,
        &legacy_headers(None, Some("2025-06-18")),
        list.clone(),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.code(), -32000);
    assert_eq!(r.json()["id"], 1);
    let (c, _) = OldClient::connect(&url, "2025-06-18").await;
    assert_eq!(c.call(json!(1), "tools/list", json!({})).await.status, 200);
    // Tampered.
    let mut t = c.sid.clone().into_bytes();
    let i = t.len() - 5;
    t[i] = if t[i] == b'x' { b'y' } else { b'x' };
    let tampered = String::from_utf8(t).unwrap();
    let r = send(
        "POST",
        &url,
        &legacy_headers(Some(&tampered), Some("2025-06-18")),
        list.clone(),
    )
    .await;
    assert_eq!(r.status, 404);
    // Made up.
    let r = send(
        "POST",
        &url,
        &legacy_headers(Some("not-a-session"), Some("2025-06-18")),
        list.clone(),
    )
    .await;
    assert_eq!(r.status, 404);
    // Another endpoint's session.
    let r = send(
        "POST",
        &gw.url("/mcp/demo2"),
        &legacy_headers(Some(&c.sid), Some("2025-06-18")),
        list.clone(),
    )
    .await;
    assert_eq!(r.status, 404);
    // Another deployment's key.
    let other = Gateway::start(
        "[sessions]\nkey = \"k2\"\n[[backends]]\nname = \"demo\"\nbuiltin = \"demo\"\n",
    )
    .await;
    let r = send(
        "POST",
        &other.url("/mcp/demo"),
        &legacy_headers(Some(&c.sid), Some("2025-06-18")),
        list.clone(),
    )
    .await;
    assert_eq!(r.status, 404);
    // Expired.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let r = send(
        "POST",
        &url,
        &legacy_headers(Some(&c.sid), Some("2025-06-18")),
        list.clone(),
    )
    .await;
    assert_eq!(r.status, 404);
    assert_eq!(r.code(), -32001);
}

#[tokio::test]
async fn sessions_move_between_replicas_sharing_a_key() {
    let cfg = "[sessions]\nkey = \"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\"\n[[backends]]\nname = \"demo\"\nbuiltin = \"demo\"\n";
    let a = Gateway::start(cfg).await;
    let b = Gateway::start(cfg).await;
    let (c, _) = OldClient::connect(&a.url("/mcp/demo"), "2025-11-25").await;
    let on_b = OldClient {
        url: b.url("/mcp/demo"),
        sid: c.sid.clone(),
        version: c.version.clone(),
    };
    let r = on_b
        .call(
            json!(5),
            "tools/call",
            json!({"name":"add","arguments":{"a":2,"b":40}}),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.result()["result"]["content"][0]["text"], "42");
}

#[tokio::test]
async fn delete_and_get_on_legacy_sessions() {
    let gw = Gateway::start("[[backends]]\nname = \"demo\"\nbuiltin = \"demo\"\n").await;
    let url = gw.url("/mcp/demo");
    let (c, _) = OldClient::connect(&url, "2025-11-25").await;
    let r = send("GET", &url, &[("accept", "text/event-stream")], "").await;
    assert_eq!(r.status, 405, "no GET stream without a session");
    // With one: the session's notification stream (tests/gateway/listen.rs).
    let r = send_stream(
        "GET",
        &url,
        &[
            ("mcp-session-id", c.sid.as_str()),
            ("accept", "text/event-stream"),
        ],
        "",
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    drop(r);
    let r = send("DELETE", &url, &[("mcp-session-id", c.sid.as_str())], "").await;
    assert_eq!(r.status, 200);
    let r = send("DELETE", &url, &[("mcp-session-id", "bogus")], "").await;
    assert_eq!(r.status, 404);
}
