//! 2024-11-05 HTTP+SSE backends (README "Configuration reference", `transport = "sse"`): the
//! TypeScript SDK v1 `SSEServerTransport` server (`ts_server.mjs --transport sse`) behind
//! portico, for a 2026-07-28 client and an initialize-era client; one upstream SSE session per
//! client; a stream that ends mid-call.

use super::*;
use crate::common::*;
use serde_json::json;
use std::time::{Duration, Instant};

fn sse_backend(server: &Server, extra: &str) -> String {
    format!(
        "[log]\naccess = false\n[[backends]]\nname = \"ts\"\nurl = \"http://127.0.0.1:{}/sse\"\ntransport = \"sse\"\ntimeout_ms = 10000\n{extra}",
        server.port
    )
}

async fn sse_sessions(server: &Server) -> (u64, u64) {
    let s = server.stats().await;
    (
        s["sse"]["opened"].as_u64().unwrap_or(0),
        s["sse"]["open"].as_u64().unwrap_or(0),
    )
}

/// A 2026-07-28 client: discover, the lists, calls, a call with progress relayed.
#[tokio::test]
async fn typescript_sse_server_serves_a_modern_client() {
    let server = ts_server(&["--transport", "sse"]).await;
    let gw = Gateway::start(&sse_backend(&server, "")).await;
    let url = gw.url("/mcp/ts");
    super::legacy::check_shapes(&url, "demo://greeting").await;
    let r = mcp(&url, json!("d"), "server/discover", json!({})).await;
    let d = r.result()["result"].clone();
    assert_eq!(
        d["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "portico-interop-typescript",
        "{d}"
    );
    assert!(d["capabilities"]["tools"].is_object(), "{d}");
    // Progress, raw: the notifications arrive on the call's stream with the client's token.
    let r = mcp(
        &url,
        json!(7),
        "tools/call",
        json!({"name":"progress","arguments":{"steps":3},"_meta":{"progressToken":"tok"}}),
    )
    .await;
    let msgs = r.messages();
    let progress: Vec<_> = msgs
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .collect();
    assert_eq!(progress.len(), 3, "{msgs:?}");
    assert!(
        progress
            .iter()
            .all(|p| p["params"]["progressToken"] == "tok")
    );
    assert_eq!(r.result()["result"]["content"][0]["text"], "done 3");
    assert_eq!(r.result()["id"], 7);
    // The official Python SDK client in the 2026-07-28 era.
    let via = py_client(&["--modern", "--url", &url]).await;
    assert_eq!(via["era"], "modern");
    assert_eq!(via["echo"], "hi");
    assert_eq!(via["add"], "5");
    assert_eq!(via["progress_result"], "done 3");
    assert_eq!(via["progress_events"], 3);
    assert_eq!(via["resource"], "hello from typescript");
    assert_eq!(via["prompt"], "Hello, Ada!");
    let (opened, _) = sse_sessions(&server).await;
    assert!(opened >= 1, "the server saw SSE sessions: {opened}");
}

/// An initialize-era client (the TypeScript SDK v1 client): the same scenario, and each client
/// gets its own upstream SSE session.
#[tokio::test]
async fn typescript_sse_server_serves_legacy_clients_one_session_each() {
    let server = ts_server(&["--transport", "sse"]).await;
    let gw = Gateway::start(&sse_backend(&server, "")).await;
    let url = gw.url("/mcp/ts");
    let (before, _) = sse_sessions(&server).await;
    for _ in 0..2 {
        let via = ts_client(&["--url", &url]).await;
        assert_eq!(via["echo"], "hi");
        assert_eq!(via["add"], "5");
        assert_eq!(via["progress_result"], "done 3");
        assert_eq!(via["progress_events"], 3);
        assert_eq!(via["resource"], "hello from typescript");
        assert_eq!(via["prompt"], "Hello, Ada!");
        assert!(
            via["tools"]
                .as_array()
                .is_some_and(|t| t.contains(&json!("hangup"))),
            "{via}"
        );
    }
    let (after, _) = sse_sessions(&server).await;
    assert_eq!(after - before, 2, "one upstream SSE session per client");
}

/// Two 2026-07-28 clients with different credentials never share an upstream session.
#[tokio::test]
async fn two_modern_clients_get_two_sse_sessions() {
    let server = ts_server(&["--transport", "sse"]).await;
    let dir = std::env::temp_dir().join(format!("portico-sse-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (a, b) = (dir.join("alice"), dir.join("bob"));
    std::fs::write(&a, "k-alice-0123456789abcdef").unwrap();
    std::fs::write(&b, "k-bob-0123456789abcdef00").unwrap();
    let auth = format!(
        "[auth]\nmode = \"api_keys\"\npublic_url = \"https://gw.example\"\n[[auth.api_keys]]\nkey_file = \"{}\"\nprincipal = \"alice\"\n[[auth.api_keys]]\nkey_file = \"{}\"\nprincipal = \"bob\"\n",
        a.display(),
        b.display()
    );
    let gw = Gateway::start(&format!("{auth}{}", sse_backend(&server, ""))).await;
    let url = gw.url("/mcp/ts");
    for key in [
        "k-alice-0123456789abcdef",
        "k-bob-0123456789abcdef00",
        "k-alice-0123456789abcdef",
    ] {
        let bearer = format!("Bearer {key}");
        let r = mcp_with(
            &url,
            json!(1),
            "tools/call",
            json!({"name":"echo","arguments":{"text":key}}),
            &[("authorization", &bearer)],
        )
        .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert_eq!(r.result()["result"]["content"][0]["text"], key);
    }
    let (opened, open) = sse_sessions(&server).await;
    assert_eq!((opened, open), (2, 2), "alice's and bob's sessions");
}

/// The stream ends mid-call: the call ends with a JSON-RPC error at once (not at timeout_ms),
/// and the next call works on a new session.
#[tokio::test]
async fn a_stream_that_ends_mid_call_fails_the_call_and_the_next_call_reconnects() {
    let server = ts_server(&["--transport", "sse"]).await;
    let gw = Gateway::start(&sse_backend(&server, "")).await;
    let url = gw.url("/mcp/ts");
    let r = mcp(
        &url,
        json!(1),
        "tools/call",
        json!({"name":"echo","arguments":{"text":"a"}}),
    )
    .await;
    assert_eq!(r.result()["result"]["content"][0]["text"], "a");
    let (opened, _) = sse_sessions(&server).await;
    let started = Instant::now();
    let r = mcp(
        &url,
        json!(2),
        "tools/call",
        json!({"name":"hangup","arguments":{}}),
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "no wait for timeout_ms: {:?}",
        started.elapsed()
    );
    let err = r.result();
    assert_eq!(err["id"], 2, "{err}");
    assert!(err["error"]["code"].is_i64(), "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("SSE"),
        "{err}"
    );
    let r = mcp(
        &url,
        json!(3),
        "tools/call",
        json!({"name":"echo","arguments":{"text":"b"}}),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.result()["result"]["content"][0]["text"], "b");
    let (now, _) = sse_sessions(&server).await;
    assert!(now > opened, "a new session: {opened} → {now}");
}

/// `transport = "sse"` is checked: it needs a url and cannot be modern.
#[test]
fn sse_transport_is_validated() {
    let check = |t: &str| portico::config::parse(t).and_then(portico::config::validate);
    let ok = check(
        "[[backends]]\nname = \"a\"\nurl = \"http://127.0.0.1:1/sse\"\ntransport = \"sse\"\n",
    )
    .expect("valid");
    assert_eq!(ok.backends[0].protocol, portico::config::Protocol::Legacy);
    for bad in [
        "[[backends]]\nname = \"a\"\ncommand = [\"x\"]\ntransport = \"sse\"\n",
        "[[backends]]\nname = \"a\"\nurl = \"http://127.0.0.1:1/sse\"\ntransport = \"sse\"\nprotocol = \"modern\"\n",
        "[[backends]]\nname = \"a\"\nurl = \"http://127.0.0.1:1/sse\"\ntransport = \"websocket\"\n",
    ] {
        let e = check(bad).expect_err(bad);
        assert!(e.to_string().contains("transport"), "{bad}: {e}");
    }
}

/// No `transport` configured (`protocol = "auto"`): the Streamable HTTP probe is refused (404),
/// the fallback GET finds the `endpoint` event, and the backend is bridged over HTTP+SSE.
#[tokio::test]
async fn the_probe_falls_back_to_http_sse() {
    let server = ts_server(&["--transport", "sse"]).await;
    let gw = Gateway::start(&format!(
        "[metrics]\n[log]\naccess = false\n[[backends]]\nname = \"ts\"\nurl = \"http://127.0.0.1:{}/sse\"\ntimeout_ms = 10000\n",
        server.port
    ))
    .await;
    let url = gw.url("/mcp/ts");
    let r = mcp(
        &url,
        json!(1),
        "tools/call",
        json!({"name":"echo","arguments":{"text":"found"}}),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.result()["result"]["content"][0]["text"], "found");
    // Readiness names the transport found, not the URL's scheme.
    let ready = send("GET", &gw.metrics_url("/readyz"), &[], "")
        .await
        .json();
    assert_eq!(ready["backends"][0]["transport"], "sse", "{ready}");
    let (opened, _) = sse_sessions(&server).await;
    assert!(
        opened >= 2,
        "the probe's stream and the client's session: {opened}"
    );
    let via = ts_client(&["--url", &url]).await;
    assert_eq!(via["progress_events"], 3);
    assert_eq!(via["add"], "5");
}

/// Notifications: a `tools/list_changed` the server sends on a client's SSE session reaches a
/// 2026-07-28 client listening on an aggregated endpoint, once, under its subscription id.
#[tokio::test]
async fn list_changed_on_an_sse_session_reaches_a_modern_listener() {
    let server = ts_server(&["--transport", "sse"]).await;
    let gw = Gateway::start(&format!(
        "{}[[endpoints]]\npath = \"/mcp\"\nbackends = [\"ts\"]\ndebounce_ms = 100\n",
        sse_backend(&server, "")
    ))
    .await;
    let url = gw.url("/mcp");
    let resp = send_stream(
        "POST",
        &url,
        &modern_headers("subscriptions/listen", None),
        modern_body(
            json!("L5"),
            "subscriptions/listen",
            json!({"notifications":{"toolsListChanged":true}}),
        ),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut dec = portico::sse::SseDecoder::new(1 << 20);
    let ack = crate::aggregate::read_for(&mut body, &mut dec, Duration::from_millis(500)).await;
    assert_eq!(ack.len(), 1, "{ack:?}");
    assert_eq!(ack[0]["method"], "notifications/subscriptions/acknowledged");
    let r = mcp(
        &url,
        json!("t"),
        "tools/call",
        json!({"name":"ts__add_tool","arguments":{"name":"fresh"}}),
    )
    .await;
    assert_eq!(r.result()["result"]["content"][0]["text"], "added fresh");
    let notes = crate::aggregate::read_for(&mut body, &mut dec, Duration::from_millis(1500)).await;
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert_eq!(notes[0]["method"], "notifications/tools/list_changed");
    assert_eq!(
        notes[0]["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        "L5"
    );
    drop(body);
    let r = mcp(&url, json!(9), "tools/list", json!({})).await;
    let names: Vec<_> = r.result()["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str().map(String::from))
        .collect();
    assert!(names.contains(&"ts__fresh".to_string()), "{names:?}");
}

/// The server's own requests on an SSE session (elicitation, sampling, roots during a call)
/// reach the client that made the call: relayed to a TypeScript SDK v1 client, and asked of a
/// 2026-07-28 Python SDK client through `input_required`.
#[tokio::test]
async fn server_requests_on_an_sse_session_reach_the_calling_client() {
    let server = ts_server(&["--transport", "sse", "--input-tools"]).await;
    let gw = Gateway::start(&sse_backend(&server, "")).await;
    let url = gw.url("/mcp/ts");
    for v in [
        ts_client(&["--scenario", "input", "--url", &url]).await,
        py_client(&["--modern", "--scenario", "input", "--url", &url]).await,
    ] {
        assert_eq!(v["ask"], "name=octocat; sampled=Paris", "{v}");
        assert_eq!(v["roots"], "file:///work", "{v}");
    }
}

/// A team's `team_headers` go on its SSE session's GET and POSTs (the server sees them in the
/// request that carried the call); another team's session does not get them.
#[tokio::test]
async fn team_headers_reach_the_teams_own_sse_session() {
    let server = ts_server(&["--transport", "sse"]).await;
    let dir = std::env::temp_dir().join(format!("portico-sse-team-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (a, b) = (dir.join("blue"), dir.join("red"));
    std::fs::write(&a, "k-blue-0123456789abcdef").unwrap();
    std::fs::write(&b, "k-red-0123456789abcdef00").unwrap();
    let config = format!(
        "[auth]\nmode = \"api_keys\"\npublic_url = \"https://gw.example\"\n\
         [[auth.api_keys]]\nkey_file = \"{}\"\nprincipal = \"bea\"\nteam = \"blue\"\n\
         [[auth.api_keys]]\nkey_file = \"{}\"\nprincipal = \"rob\"\nteam = \"red\"\n{}",
        a.display(),
        b.display(),
        sse_backend(
            &server,
            "team_headers = { blue = { Authorization = \"Bearer blue-upstream\" } }\n"
        )
    );
    let gw = Gateway::start(&config).await;
    let url = gw.url("/mcp/ts");
    for (key, want) in [
        ("k-blue-0123456789abcdef", "Bearer blue-upstream"),
        ("k-red-0123456789abcdef00", "none"),
    ] {
        let bearer = format!("Bearer {key}");
        let r = mcp_with(
            &url,
            json!(1),
            "tools/call",
            json!({"name":"whoami","arguments":{}}),
            &[("authorization", &bearer)],
        )
        .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert_eq!(r.result()["result"]["content"][0]["text"], want, "{key}");
    }
}
