//! Interop for aggregated endpoints: one endpoint over the Python SDK server (HTTP, 2026-07-28),
//! the TypeScript SDK server (HTTP, initialize era, bridged) and the Python SDK server over stdio,
//! used by a raw 2026-07-28 client and by both official SDK clients.

use super::*;
use crate::common::*;
use serde_json::json;
use std::time::Duration;

/// The stdio member gets a long probe timeout: a cold Python start on a loaded machine can take
/// longer than the default, and a probe that times out calls the server legacy.
fn config(py: &str, ts: &str) -> String {
    let stdio: Vec<String> = py_stdio_command()
        .iter()
        .map(|a| format!("{a:?}"))
        .collect();
    format!(
        "[log]\naccess = false\n\
         [[backends]]\nname = \"py\"\nurl = \"{py}\"\ntimeout_ms = 10000\n\
         [[backends]]\nname = \"ts\"\nurl = \"{ts}\"\ntimeout_ms = 10000\n\
         [[backends]]\nname = \"st\"\ncommand = [{}]\ntimeout_ms = 10000\n\
         probe_timeout_ms = 20000\n\
         [[endpoints]]\npath = \"/mcp\"\nbackends = [\"py\", \"ts\", \"st\"]\n\
         [[endpoints]]\npath = \"/strict\"\nbackends = [\"py\", \"ts\", \"st\"]\nfailure_mode = \"closed\"\n\
         [[endpoints]]\npath = \"/bare\"\nbackends = [{{name = \"py\", prefix = \"\"}}, \"ts\", \"st\"]\n",
        stdio.join(", ")
    )
}

fn tool_names(r: &Resp) -> Vec<String> {
    r.json()["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools: {:?}", r.body))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn one_endpoint_over_python_typescript_and_stdio_servers() {
    let py = py_server(&[]).await;
    let mut ts = ts_server(&[]).await;
    let gw = Gateway::start(&config(&py.url(), &ts.url())).await;
    let url = gw.url("/mcp");

    // One merged list: every member's tools, prefixed, in config order; each member asked once.
    let r = mcp(&url, json!(1), "tools/list", json!({})).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let names = tool_names(&r);
    for prefix in ["py", "ts", "st"] {
        for tool in [
            "echo", "add", "progress", "slow", "add_tool", "touch", "log", "whoami",
        ] {
            let want = format!("{prefix}__{tool}");
            assert!(names.contains(&want), "{want} missing from {names:?}");
        }
    }
    let first_ts = names.iter().position(|n| n.starts_with("ts__")).unwrap();
    let last_py = names.iter().rposition(|n| n.starts_with("py__")).unwrap();
    let first_st = names.iter().position(|n| n.starts_with("st__")).unwrap();
    assert!(
        last_py < first_ts && first_ts < first_st,
        "config order: {names:?}"
    );
    assert!(r.json()["result"].get("nextCursor").is_none());
    assert_eq!(
        (py.count("tools/list").await, ts.count("tools/list").await),
        (1, 1)
    );

    // One call per member, prefix stripped on the way.
    for (name, args, want) in [
        ("py__echo", json!({"text":"from py"}), "from py"),
        ("ts__add", json!({"a":2,"b":3}), "5"),
        ("st__echo", json!({"text":"from stdio"}), "from stdio"),
    ] {
        let r = mcp(
            &url,
            json!(name),
            "tools/call",
            json!({"name": name, "arguments": args}),
        )
        .await;
        assert_eq!(r.status, 200, "{name}: {:?}", r.body);
        let res = r.result()["result"].clone();
        assert_eq!(res["content"][0]["text"], want, "{name}: {res}");
        assert_eq!(res["resultType"], "complete");
    }
    assert_eq!(py.count("tools/call").await, 1);
    assert_eq!(ts.count("tools/call").await, 1);

    // The official SDK clients run their whole scenario against an endpoint (Python SDK modern,
    // TypeScript SDK legacy). On /bare the Python server's names are bare, so the scenario's
    // unprefixed prompt and resource resolve to it.
    let bare = gw.url("/bare");
    let via_py = py_client(&["--modern", "--url", &bare]).await;
    assert_eq!(via_py["echo"], "hi");
    assert_eq!(via_py["prompt"], "Hello, Ada!");
    assert_eq!(via_py["resource"], "hello from python");
    assert_eq!(via_py["server_name"], "portico");
    let via_ts = ts_client(&["--url", &bare, "--tool-prefix", "ts__"]).await;
    assert_eq!(via_ts["add"], "5");
    let tools = via_ts["tools"].as_array().unwrap();
    assert!(tools.contains(&json!("st__echo")) && tools.contains(&json!("ts__echo")));

    // A listening client of the endpoint hears the Python server's list_changed once.
    let resp = send_stream(
        "POST",
        &url,
        &modern_headers("subscriptions/listen", None),
        modern_body(
            json!("L"),
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
        json!({"name":"py__add_tool","arguments":{"name":"fresh"}}),
    )
    .await;
    assert_eq!(r.result()["result"]["content"][0]["text"], "added fresh");
    let notes = crate::aggregate::read_for(&mut body, &mut dec, Duration::from_millis(1500)).await;
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert_eq!(notes[0]["method"], "notifications/tools/list_changed");
    assert_eq!(
        notes[0]["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        "L"
    );
    drop(body);
    let r = mcp(&url, json!(9), "tools/list", json!({})).await;
    assert!(tool_names(&r).contains(&"py__fresh".to_string()));

    // One member down: open leaves it out, closed fails the list naming it.
    ts.child.kill().await.expect("stop the TypeScript server");
    let r = mcp(&url, json!(2), "tools/list", json!({})).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let names = tool_names(&r);
    assert!(names.iter().any(|n| n.starts_with("py__")));
    assert!(names.iter().any(|n| n.starts_with("st__")));
    assert!(!names.iter().any(|n| n.starts_with("ts__")), "{names:?}");
    let r = mcp(&gw.url("/strict"), json!(3), "tools/list", json!({})).await;
    assert!(r.status >= 500, "{:?}", r.body);
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("backend ts"), "{msg}");
    gw.stop().await;
}

/// The TypeScript SDK server (legacy HTTP) announces `tools/list_changed` on its session's GET
/// stream; a 2026-07-28 client listening on the aggregated endpoint hears it, once, under its
/// own subscription id.
#[tokio::test]
async fn list_changed_from_the_typescript_server_reaches_an_aggregated_listener() {
    use http_body_util::BodyExt;
    let ts = ts_server(&[]).await;
    let gw = Gateway::start(&format!(
        "[log]\naccess = false\n\
         [[backends]]\nname = \"ts\"\nurl = \"{}\"\ntimeout_ms = 10000\n\
         [[endpoints]]\npath = \"/mcp\"\nbackends = [\"ts\"]\ndebounce_ms = 100\n",
        ts.url()
    ))
    .await;
    let url = gw.url("/mcp");
    let resp = send_stream(
        "POST",
        &url,
        &modern_headers("subscriptions/listen", None),
        modern_body(
            json!("L9"),
            "subscriptions/listen",
            json!({"notifications":{"toolsListChanged":true}}),
        ),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut dec = portico::sse::SseDecoder::new(1 << 20);
    // Wait (bounded) until portico holds the session's GET stream open.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while ts.stats().await["http"]["GET"].as_u64().unwrap_or(0) == 0 {
        assert!(std::time::Instant::now() < deadline, "no GET stream opened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = mcp_with(
        &url,
        json!(1),
        "tools/call",
        json!({"name": "ts__add_tool", "arguments": {"name": "fresh"}}),
        &[("mcp-name", "ts__add_tool")],
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let mut events = Vec::new();
    let end = tokio::time::Instant::now() + Duration::from_secs(3);
    while let Ok(Some(frame)) = tokio::time::timeout_at(end, body.frame()).await {
        if let Ok(data) = frame.unwrap().into_data() {
            dec.push(&data);
            while let Ok(Some(ev)) = dec.next_event() {
                events.push(serde_json::from_slice::<serde_json::Value>(&ev).unwrap());
            }
        }
        if events
            .iter()
            .any(|e| e["method"] == "notifications/tools/list_changed")
        {
            break;
        }
    }
    let changed: Vec<_> = events
        .iter()
        .filter(|e| e["method"] == "notifications/tools/list_changed")
        .collect();
    assert_eq!(changed.len(), 1, "{events:?}");
    assert_eq!(
        changed[0]["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        "L9"
    );
    let r = mcp(&url, json!(2), "tools/list", json!({})).await;
    assert!(tool_names(&r).contains(&"ts__fresh".to_string()));
    drop(body);
    gw.stop().await;
}

#[tokio::test]
async fn small_pages_walk_every_member_exactly_once() {
    // Real multi-page members: the Python SDK server over HTTP in pages of 2 and over stdio in
    // pages of 4 (py_server.py --page-size), the TypeScript SDK server in one page.
    let py = py_server(&["--page-size", "2"]).await;
    let ts = ts_server(&[]).await;
    let mut stdio = py_stdio_command();
    stdio.extend(["--page-size".to_string(), "4".to_string()]);
    let stdio: Vec<String> = stdio.iter().map(|a| format!("{a:?}")).collect();
    let gw = Gateway::start(&format!(
        "[log]\naccess = false\n\
         [[backends]]\nname = \"py\"\nurl = \"{}\"\ntimeout_ms = 10000\n\
         [[backends]]\nname = \"ts\"\nurl = \"{}\"\ntimeout_ms = 10000\n\
         [[backends]]\nname = \"st\"\ncommand = [{}]\ntimeout_ms = 10000\nprobe_timeout_ms = 20000\n\
         [[endpoints]]\npath = \"/mcp\"\nbackends = [\"py\", \"ts\", \"st\"]\n",
        py.url(),
        ts.url(),
        stdio.join(", ")
    ))
    .await;
    let url = gw.url("/mcp");
    let mut names: Vec<String> = Vec::new();
    let mut cursor: Option<serde_json::Value> = None;
    let mut pages = 0;
    loop {
        let params = match &cursor {
            Some(c) => json!({ "cursor": c }),
            None => json!({}),
        };
        let r = mcp(&url, json!(pages), "tools/list", params).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        names.extend(tool_names(&r));
        pages += 1;
        assert!(pages <= 10, "the walk does not end");
        match r.json()["result"].get("nextCursor") {
            Some(c) => cursor = Some(c.clone()),
            None => break,
        }
    }
    // py: 4 pages of 2; st: 2 pages of 4 (8 tools); ts: one page. Portico's pages follow the
    // longest member: 4 pages.
    assert_eq!(pages, 4, "{names:?}");
    let mut sorted = names.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), names.len(), "no tool twice: {names:?}");
    for prefix in ["py", "ts", "st"] {
        for tool in ["echo", "add", "progress", "slow", "add_tool", "whoami"] {
            let want = format!("{prefix}__{tool}");
            assert!(names.contains(&want), "{want} missing from {names:?}");
        }
    }
    assert_eq!(names.len(), 24);
    // Each upstream page was fetched exactly once.
    assert_eq!(py.count("tools/list").await, 4);
    assert_eq!(ts.count("tools/list").await, 1);
}
