//! Aggregated endpoints (`[[endpoints]]`) against the in-repo mock: merged and prefixed lists,
//! parallel fan-out, signed cursors, routed calls, tool policy, failure modes, legacy clients,
//! and merged change notifications.

use crate::common::mock::{MockHandle, MockMcp};
use crate::common::*;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// Backends `a`, `b`, `c` at the given URLs, plus an endpoint at `/mcp` built from `members`
/// (a TOML array body) and `extra` endpoint keys.
fn config(urls: &[&str], members: &str, extra: &str) -> String {
    let mut s = String::from("[log]\naccess = false\n");
    for (name, url) in ["a", "b", "c"].iter().zip(urls) {
        s.push_str(&format!(
            "[[backends]]\nname = \"{name}\"\nurl = \"{url}\"\ntimeout_ms = 3000\n"
        ));
    }
    s.push_str(&format!(
        "[[endpoints]]\npath = \"/mcp\"\nbackends = [{members}]\n{extra}\n"
    ));
    s
}

fn names(v: &Value, field: &str) -> Vec<String> {
    v["result"][field]
        .as_array()
        .unwrap_or_else(|| panic!("no {field} in {v}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

fn tool_calls(m: &MockHandle) -> Vec<Value> {
    m.seen()
        .into_iter()
        .filter(|s| s.body["method"] == "tools/call")
        .map(|s| {
            json!({"name": s.body["params"]["name"], "header": s.headers.get("mcp-name").map(|v| v.to_str().unwrap().to_string())})
        })
        .collect()
}

/// A port nothing listens on.
fn dead_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/mcp", l.local_addr().unwrap());
    drop(l);
    url
}

#[tokio::test]
async fn lists_are_merged_prefixed_and_in_config_order() {
    let a = MockMcp::modern().ttl_ms(Some(5000)).start().await;
    let b = MockMcp::modern().sse().ttl_ms(Some(700)).start().await;
    let c = MockMcp::legacy().start().await;
    let gw = Gateway::start(&config(
        &[&a.url(), &b.url(), &c.url()],
        "'a', {name = 'b', prefix = 'bee'}, {name = 'c', prefix = ''}",
        "",
    ))
    .await;
    let url = gw.url("/mcp");
    let r = mcp(&url, json!(1), "tools/list", json!({})).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let v = r.json();
    let got = names(&v, "tools");
    let base = ["echo", "add", "progress", "slow", "whoami", "ask"];
    let mut want: Vec<String> = base.iter().map(|n| format!("a__{n}")).collect();
    want.extend(base.iter().map(|n| format!("bee__{n}")));
    want.extend(base.iter().map(|n| n.to_string()));
    assert_eq!(got, want);
    assert_eq!(v["id"], 1);
    assert_eq!(v["result"]["resultType"], "complete");
    // The legacy member's results carry ttlMs 0 and private scope (bridge defaults).
    assert_eq!(v["result"]["ttlMs"], 0);
    assert_eq!(v["result"]["cacheScope"], "private");
    assert!(v["result"].get("nextCursor").is_none());
    // Without the legacy member: min of the parts, public when every part is.
    let gw2 = Gateway::start(&config(&[&a.url(), &b.url()], "'a', 'b'", "")).await;
    let v = mcp(&gw2.url("/mcp"), json!(2), "tools/list", json!({}))
        .await
        .json();
    assert_eq!(v["result"]["ttlMs"], 700);
    assert_eq!(v["result"]["cacheScope"], "public");
    let prompts = mcp(&url, json!(3), "prompts/list", json!({})).await.json();
    assert_eq!(
        names(&prompts, "prompts"),
        ["a__greet", "bee__greet", "greet"]
    );
    // Resources keep their URIs; a URI listed by several members is listed once.
    let res = mcp(&url, json!(4), "resources/list", json!({}))
        .await
        .json();
    assert_eq!(
        res["result"]["resources"],
        json!([{"uri":"mock://r","name":"r"}])
    );
    // Each member received its own well-formed 2026-07-28 request, with the client's _meta.
    let seen = a
        .seen()
        .into_iter()
        .find(|s| s.body["method"] == "tools/list")
        .unwrap();
    assert_eq!(seen.headers["mcp-method"], "tools/list");
    assert_eq!(
        seen.body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"],
        LATEST
    );
    gw.stop().await;
    gw2.stop().await;
}

#[tokio::test]
async fn calls_go_to_the_owner_with_the_prefix_stripped() {
    let a = MockMcp::modern().start().await;
    let b = MockMcp::modern().sse().start().await;
    let c = MockMcp::legacy().start().await;
    let gw = Gateway::start(&config(
        &[&a.url(), &b.url(), &c.url()],
        "'a', 'b', {name = 'c', prefix = ''}",
        "",
    ))
    .await;
    let url = gw.url("/mcp");
    for (name, text) in [("a__echo", "to a"), ("b__echo", "to b"), ("echo", "to c")] {
        let r = mcp(
            &url,
            json!(name),
            "tools/call",
            json!({"name": name, "arguments": {"text": text}}),
        )
        .await;
        assert_eq!(r.status, 200, "{name}: {:?}", r.body);
        assert_eq!(r.result()["result"]["content"][0]["text"], text);
        assert_eq!(r.result()["id"], json!(name));
    }
    assert_eq!(
        tool_calls(&a),
        [json!({"name":"echo","header":"echo"})],
        "prefix stripped in body and header"
    );
    assert_eq!(tool_calls(&b), [json!({"name":"echo","header":"echo"})]);
    assert_eq!(c.count("tools/call"), 1);
    let r = mcp(
        &url,
        json!(5),
        "prompts/get",
        json!({"name":"b__greet","arguments":{"name":"Ada"}}),
    )
    .await;
    assert_eq!(
        r.result()["result"]["messages"][0]["content"]["text"],
        "Hello, Ada!"
    );
    assert_eq!(b.count("prompts/get"), 1);
    assert_eq!(a.count("prompts/get"), 0);
    // resources/read by URI: learnt from resources/list (here without listing first).
    let r = mcp(&url, json!(6), "resources/read", json!({"uri":"mock://r"})).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["result"]["contents"][0]["text"], "mock resource");
    assert_eq!(a.count("resources/read"), 1, "the first member listing it");
    let r = mcp(
        &url,
        json!(7),
        "resources/read",
        json!({"uri":"mock://nope"}),
    )
    .await;
    assert_eq!(r.code(), -32602);
    assert_eq!(r.json()["error"]["data"]["uri"], "mock://nope");
    // Unknown names, and a header that disagrees with the body: refused, nothing forwarded.
    let r = mcp(&url, json!(8), "tools/call", json!({"name":"zz__echo"})).await;
    assert_eq!(r.code(), -32602);
    let h = modern_headers("tools/call", Some("b__echo"));
    let r = send(
        "POST",
        &url,
        &h,
        modern_body(
            json!(9),
            "tools/call",
            json!({"name":"a__echo","arguments":{"text":"x"}}),
        ),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.code(), -32020);
    assert_eq!(a.count("tools/call") + b.count("tools/call"), 2);
    // The member gets the client's bytes with only the name replaced: numbers, member order,
    // escapes and whitespace as the client wrote them.
    let body = concat!(
        r#"{ "params" : { "arguments" : {"n": 1.50, "s": "\u00e9\"q\""} , "name" : "a__echo", "#,
        r#""_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "#,
        r#""io.modelcontextprotocol/clientCapabilities": {}} }, "method" : "tools/call", "id" : 10, "jsonrpc" : "2.0" }"#
    );
    let r = send(
        "POST",
        &url,
        &modern_headers("tools/call", Some("a__echo")),
        body,
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let seen = a.seen();
    let last = seen
        .iter()
        .rev()
        .find(|s| s.body["method"] == "tools/call")
        .unwrap();
    assert_eq!(
        std::str::from_utf8(&last.raw).unwrap(),
        body.replace(r#""a__echo""#, r#""echo""#)
    );
    gw.stop().await;
}

#[tokio::test]
async fn lists_fan_out_in_parallel() {
    let d = Duration::from_millis(200);
    let a = MockMcp::modern().list_delay(d).start().await;
    let b = MockMcp::modern().list_delay(d).start().await;
    let c = MockMcp::modern().list_delay(d).start().await;
    let gw = Gateway::start(&config(
        &[&a.url(), &b.url(), &c.url()],
        "'a', 'b', 'c'",
        "",
    ))
    .await;
    // Probe once so the timing below measures the lists alone.
    let _ = mcp(&gw.url("/mcp"), json!(0), "server/discover", json!({})).await;
    let t = Instant::now();
    let r = mcp(&gw.url("/mcp"), json!(1), "tools/list", json!({})).await;
    let took = t.elapsed();
    assert_eq!(names(&r.json(), "tools").len(), 18);
    assert!(
        took < Duration::from_millis(500),
        "three 200 ms lists took {took:?}: not parallel"
    );
    gw.stop().await;
}

#[tokio::test]
async fn pagination_walks_every_member_once_and_cursors_are_signed() {
    let a = MockMcp::modern().page_size(2).start().await;
    let b = MockMcp::modern().page_size(4).start().await;
    let c = MockMcp::legacy().page_size(5).start().await;
    let gw = Gateway::start(&config(
        &[&a.url(), &b.url(), &c.url()],
        "'a', 'b', 'c'",
        "",
    ))
    .await;
    let url = gw.url("/mcp");
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    let mut cursors = Vec::new();
    let mut pages = 0;
    loop {
        let params = match &cursor {
            None => json!({}),
            Some(c) => json!({"cursor": c}),
        };
        let v = mcp(&url, json!(pages), "tools/list", params).await.json();
        all.extend(names(&v, "tools"));
        pages += 1;
        assert!(pages < 10, "runaway pagination");
        match v["result"]["nextCursor"].as_str() {
            Some(c) => {
                cursor = Some(c.to_string());
                cursors.push(c.to_string());
            }
            None => break,
        }
    }
    // a: 3 pages of 2, b: 2 pages of 4, c: 2 pages of 5 → 3 merged pages.
    assert_eq!(pages, 3);
    assert_eq!(all.len(), 18);
    let mut unique = all.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 18, "no tool twice: {all:?}");
    assert_eq!(
        (
            a.count("tools/list"),
            b.count("tools/list"),
            c.count("tools/list")
        ),
        (3, 2, 2),
        "every upstream page fetched exactly once"
    );
    // Tampering with a cursor (one character, or a cursor for another list) → -32602.
    let good = cursors[0].clone();
    let mut bytes = good.clone().into_bytes();
    let i = 8;
    bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
    let bad = String::from_utf8(bytes).unwrap();
    for c in [bad.as_str(), "garbage", "pc1.e30.AAAA"] {
        let r = mcp(&url, json!("t"), "tools/list", json!({"cursor": c})).await;
        assert_eq!(r.status, 400, "{c}");
        assert_eq!(r.code(), -32602, "{c}");
    }
    let r = mcp(&url, json!("p"), "prompts/list", json!({"cursor": good})).await;
    assert_eq!(r.code(), -32602, "a tools cursor does not open prompts");
    gw.stop().await;
}

#[tokio::test]
async fn denied_tools_are_hidden_and_refused() {
    let a = MockMcp::modern().start().await;
    let b = MockMcp::modern().start().await;
    let gw = Gateway::start(&config(
        &[&a.url(), &b.url()],
        "{name = 'a', tools = {deny = ['add', 'slo*']}}, {name = 'b', tools = {allow = ['echo']}}",
        "",
    ))
    .await;
    let url = gw.url("/mcp");
    let v = mcp(&url, json!(1), "tools/list", json!({})).await.json();
    assert_eq!(
        names(&v, "tools"),
        ["a__echo", "a__progress", "a__whoami", "a__ask", "b__echo"]
    );
    for name in ["a__add", "a__slow", "b__add"] {
        let r = mcp(&url, json!(2), "tools/call", json!({"name": name})).await;
        assert_eq!(r.code(), -32602, "{name}");
    }
    assert_eq!(a.count("tools/call") + b.count("tools/call"), 0);
    let r = mcp(
        &url,
        json!(3),
        "tools/call",
        json!({"name":"b__echo","arguments":{"text":"ok"}}),
    )
    .await;
    assert_eq!(r.result()["result"]["content"][0]["text"], "ok");
    gw.stop().await;
}

#[tokio::test]
async fn a_bare_name_collision_names_both_backends() {
    let a = MockMcp::modern().start().await;
    let b = MockMcp::modern().start().await;
    let gw = Gateway::start(&config(
        &[&a.url(), &b.url()],
        "{name = 'a', prefix = ''}, {name = 'b', prefix = ''}",
        "",
    ))
    .await;
    let r = mcp(&gw.url("/mcp"), json!(1), "tools/list", json!({})).await;
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        msg.contains("\"a\"") && msg.contains("\"b\"") && msg.contains("echo"),
        "{msg}"
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_failing_member_is_left_out_or_fails_the_list() {
    let a = MockMcp::modern().start().await;
    let c = MockMcp::modern().start().await;
    let dead = dead_url();
    let urls = [a.url(), dead, c.url()];
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let open = Gateway::start(&config(&urls, "'a', 'b', 'c'", "")).await;
    let r = mcp(&open.url("/mcp"), json!(1), "tools/list", json!({})).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let got = names(&r.json(), "tools");
    assert_eq!(got.len(), 12);
    assert!(got.iter().all(|n| !n.starts_with("b__")));
    assert_eq!(
        r.json()["result"]["ttlMs"],
        0,
        "a partial list is not to be kept"
    );
    let d = mcp(&open.url("/mcp"), json!(2), "server/discover", json!({})).await;
    assert_eq!(d.status, 200);
    let closed = Gateway::start(&config(&urls, "'a', 'b', 'c'", "failure_mode = 'closed'")).await;
    let r = mcp(&closed.url("/mcp"), json!(1), "tools/list", json!({})).await;
    assert_eq!(r.status, 502, "{:?}", r.body);
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("backend b "), "{msg}");
    assert_eq!(r.json()["id"], 1);
    open.stop().await;
    closed.stop().await;
}

#[tokio::test]
async fn discover_describes_the_endpoint() {
    let a = MockMcp::modern()
        .list_changed()
        .experimental()
        .start()
        .await;
    let c = MockMcp::legacy().start().await;
    let gw = Gateway::start(&config(&[&a.url(), &c.url()], "'a', 'b'", "")).await;
    let r = mcp(&gw.url("/mcp"), json!("d"), "server/discover", json!({})).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let d = r.json()["result"].clone();
    assert_eq!(d["resultType"], "complete");
    assert!(
        d["supportedVersions"]
            .as_array()
            .unwrap()
            .contains(&json!(LATEST))
    );
    assert_eq!(d["capabilities"]["tools"]["listChanged"], true);
    assert!(d["capabilities"]["prompts"].is_object());
    // A member's experimental methods are not routed by the endpoint, so not advertised there
    // (they are on the member's own URL).
    assert!(d["capabilities"].get("experimental").is_none(), "{d}");
    let own = mcp(&gw.url("/mcp/a"), json!("o"), "server/discover", json!({})).await;
    assert!(
        own.json()["result"]["capabilities"]["experimental"]["mock/extra"].is_object(),
        "{:?}",
        own.body
    );
    let text = d["instructions"].as_str().unwrap();
    assert!(
        text.contains("[a] mock instructions") && text.contains("[b] legacy instructions"),
        "{text}"
    );
    assert_eq!(
        d["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "portico"
    );
    assert_eq!(d["cacheScope"], "private");
    gw.stop().await;
}

#[tokio::test]
async fn legacy_clients_are_served_on_an_endpoint() {
    let a = MockMcp::modern().start().await;
    let c = MockMcp::legacy().start().await;
    let gw = Gateway::start(&config(&[&a.url(), &c.url()], "'a', 'b'", "")).await;
    let url = gw.url("/mcp");
    let h = [
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
    ];
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
        "protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"old","version":"1"}}});
    let r = send("POST", &url, &h, init.to_string()).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["result"]["serverInfo"]["name"], "portico");
    let sid = r.header("mcp-session-id").unwrap().to_string();
    let mut h2 = h.to_vec();
    h2.push(("mcp-session-id", &sid));
    h2.push(("mcp-protocol-version", "2025-06-18"));
    let list = json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}});
    let r = send("POST", &url, &h2, list.to_string()).await;
    let v = r.result();
    assert!(v["result"].get("resultType").is_none(), "legacy shape: {v}");
    assert!(names(&v, "tools").contains(&"b__echo".to_string()));
    let call = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"a__echo","arguments":{"text":"old"}}});
    let r = send("POST", &url, &h2, call.to_string()).await;
    assert_eq!(r.result()["result"]["content"][0]["text"], "old");
    gw.stop().await;
}

/// Reads SSE messages off a streaming response for `within`.
pub(crate) async fn read_for(
    body: &mut hyper::body::Incoming,
    dec: &mut portico::sse::SseDecoder,
    within: Duration,
) -> Vec<Value> {
    use http_body_util::BodyExt;
    let end = tokio::time::Instant::now() + within;
    let mut out = Vec::new();
    while let Ok(Some(frame)) = tokio::time::timeout_at(end, body.frame()).await {
        if let Ok(data) = frame.unwrap().into_data() {
            dec.push(&data);
            while let Ok(Some(ev)) = dec.next_event() {
                out.push(serde_json::from_slice(&ev).unwrap());
            }
        }
    }
    out
}

#[tokio::test]
async fn list_changed_reaches_a_listener_once() {
    let a = MockMcp::modern().list_changed().start().await;
    let b = MockMcp::modern().sse().list_changed().start().await;
    let c = MockMcp::legacy().start().await;
    let gw = Gateway::start(&config(
        &[&a.url(), &b.url(), &c.url()],
        "'a', 'b', 'c'",
        "debounce_ms = 150",
    ))
    .await;
    let params =
        json!({"notifications":{"toolsListChanged":true,"resourceSubscriptions":["x://y"]}});
    let resp = send_stream(
        "POST",
        &gw.url("/mcp"),
        &modern_headers("subscriptions/listen", None),
        modern_body(json!("L1"), "subscriptions/listen", params),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut dec = portico::sse::SseDecoder::new(1 << 20);
    let first = read_for(&mut body, &mut dec, Duration::from_millis(300)).await;
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(
        first[0]["method"],
        "notifications/subscriptions/acknowledged"
    );
    assert_eq!(
        first[0]["params"]["notifications"],
        json!({"toolsListChanged": true}),
        "only what portico relays is acknowledged"
    );
    assert_eq!(
        first[0]["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        "L1"
    );
    // One listen per member for this client (portico's own cache watchers aside: finding
    // which member serves `x://y` lists the resources, which the cache keeps and watches).
    let clients_listens = |m: &MockHandle| {
        m.state
            .seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.body["method"] == "subscriptions/listen" && s.body["id"] == "L1")
            .count()
    };
    assert_eq!((clients_listens(&a), clients_listens(&b)), (1, 1));
    // Two members change (one of them twice) within the window: one notification.
    a.add_tool("new_a");
    b.add_tool("new_b");
    a.add_tool("newer_a");
    let notes = read_for(&mut body, &mut dec, Duration::from_millis(600)).await;
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert_eq!(notes[0]["method"], "notifications/tools/list_changed");
    assert_eq!(
        notes[0]["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        "L1"
    );
    // A later change is a new notification.
    b.add_tool("later");
    let notes = read_for(&mut body, &mut dec, Duration::from_millis(500)).await;
    assert_eq!(notes.len(), 1, "{notes:?}");
    // The new tools show up in the merged list.
    let v = mcp(&gw.url("/mcp"), json!(1), "tools/list", json!({}))
        .await
        .json();
    let got = names(&v, "tools");
    assert!(got.contains(&"a__newer_a".to_string()) && got.contains(&"b__later".to_string()));
    drop(body);
    gw.stop().await;
}

/// Advertised = delivered: a listen on an endpoint is acknowledged for the kinds some member
/// acknowledged, not for every kind the client asked (a member that cannot tell its prompts
/// changed does not agree to tell it).
#[tokio::test]
async fn a_listen_is_acknowledged_only_for_what_a_member_delivers() {
    let a = MockMcp::legacy().start().await;
    let c = MockMcp::legacy().list_changed().start().await;
    let gw = Gateway::start(&config(&[&a.url(), &dead_url(), &c.url()], "'a', 'c'", "")).await;
    let params = json!({"notifications":{"toolsListChanged":true,"promptsListChanged":true}});
    let (body, _, ack) = listen_on(&gw, "L8", params).await;
    assert_eq!(
        ack["params"]["notifications"],
        json!({"toolsListChanged": true}),
        "{ack}"
    );
    drop(body);
    gw.stop().await;
}

/// Opens a listen on the endpoint `/mcp`: its stream, the stream's decoder, and the
/// acknowledgement, which must come first.
async fn listen_on(
    gw: &Gateway,
    id: &str,
    params: Value,
) -> (hyper::body::Incoming, portico::sse::SseDecoder, Value) {
    let resp = send_stream(
        "POST",
        &gw.url("/mcp"),
        &modern_headers("subscriptions/listen", None),
        modern_body(json!(id), "subscriptions/listen", params),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut dec = portico::sse::SseDecoder::new(1 << 20);
    let first = read_for(&mut body, &mut dec, Duration::from_millis(300)).await;
    assert_eq!(
        first[0]["method"], "notifications/subscriptions/acknowledged",
        "{first:?}"
    );
    (body, dec, first[0].clone())
}

/// A legacy HTTP member's `list_changed` arrives on its upstream session's GET stream; it
/// reaches the aggregated listener (subscription id rewritten, debounced) like the others.
#[tokio::test]
async fn list_changed_from_a_legacy_member_reaches_a_listener() {
    let a = MockMcp::modern().start().await;
    let c = MockMcp::legacy().list_changed().start().await;
    let gw = Gateway::start(&config(
        &[&a.url(), &dead_url(), &c.url()],
        "'a', 'c'",
        "debounce_ms = 150",
    ))
    .await;
    let params = json!({"notifications":{"toolsListChanged":true}});
    let (mut body, mut dec, _) = listen_on(&gw, "L7", params).await;
    // The GET stream is opened by portico in the background; wait for it (bounded).
    let opened = Instant::now();
    while c.get_streams() == 0 {
        assert!(
            opened.elapsed() < Duration::from_secs(5),
            "portico never opened the legacy session's GET stream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.add_tool("new_c");
    c.add_tool("newer_c");
    let notes = read_for(&mut body, &mut dec, Duration::from_millis(600)).await;
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert_eq!(notes[0]["method"], "notifications/tools/list_changed");
    assert_eq!(
        notes[0]["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        "L7"
    );
    assert_eq!(c.get_streams(), 1, "one GET stream per upstream session");
    let v = mcp(&gw.url("/mcp"), json!(1), "tools/list", json!({}))
        .await
        .json();
    assert!(
        names(&v, "tools").contains(&"c__newer_c".to_string()),
        "{v}"
    );
    drop(body);
    gw.stop().await;
}

/// The merged page without what differs between two answers of one entry (`id`, `ttlMs`).
fn page_facts(v: &Value) -> Value {
    let mut r = v["result"].clone();
    r.as_object_mut().unwrap().remove("ttlMs");
    r
}

/// Issue #23 item 1: a merged list is cached as one answer — a repeat is one cache hit with no
/// member asked, spliced with the caller's id — and it is dropped as soon as any member's list
/// changes, while the other members' own entries stay cached.
#[tokio::test]
async fn merged_lists_are_cached_whole_and_dropped_with_any_member() {
    let start = || {
        MockMcp::modern()
            .ttl_ms(Some(600_000))
            .cache_scope(Some("public"))
            .list_changed()
            .start()
    };
    let (a, b, c) = (start().await, start().await, start().await);
    let gw = Gateway::start(&format!(
        "[metrics]\n{}",
        config(&[&a.url(), &b.url(), &c.url()], "'a', 'b', 'c'", "")
    ))
    .await;
    let url = gw.url("/mcp");
    let first = mcp(&url, json!(1), "tools/list", json!({})).await.json();
    assert_eq!(first["result"]["cacheScope"], "public");
    assert_eq!(names(&first, "tools").len(), 18);
    let counts = || [&a, &b, &c].map(|m| m.count("tools/list"));
    assert_eq!(counts(), [1, 1, 1]);
    let hits = cache_outcome(&gw, "hit").await;
    let second = mcp(&url, json!("two"), "tools/list", json!({}))
        .await
        .json();
    assert_eq!(second["id"], "two");
    assert_eq!(page_facts(&second), page_facts(&first));
    let ttl = second["result"]["ttlMs"].as_u64().unwrap();
    assert!(ttl > 0 && ttl <= 600_000, "the remaining freshness: {ttl}");
    assert_eq!(counts(), [1, 1, 1], "no member asked");
    assert_eq!(
        cache_outcome(&gw, "hit").await - hits,
        1.0,
        "one hit for the whole page, not one per member"
    );
    // b's list changes: the merged page goes with b's entry; a's and c's entries stay.
    let deadline = Instant::now() + Duration::from_secs(5);
    while b.count("subscriptions/listen") == 0 {
        assert!(Instant::now() < deadline, "no cache watcher on b");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await; // the watcher has read the ack
    b.add_tool("fresh");
    let deadline = Instant::now() + Duration::from_secs(5);
    let fresh = loop {
        let v = mcp(&url, json!(3), "tools/list", json!({})).await.json();
        if names(&v, "tools").contains(&"b__fresh".to_string()) {
            break v;
        }
        assert!(Instant::now() < deadline, "the change never showed: {v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(names(&fresh, "tools").len(), 19);
    assert_eq!(counts(), [1, 2, 1], "only the changed member asked again");
    gw.stop().await;
}

/// A call naming a tool the index does not know re-walks the bare members' lists, page by
/// page, within the request's deadline (the endpoint's `timeout_ms`) as a whole: a member that
/// pages slowly (six pages of 250 ms here, each within its 600 ms timeout) makes it a 504 at
/// the deadline. Without the bound the walk ran on to its end (up to 64 pages × the timeout).
#[tokio::test]
async fn a_slow_walk_for_an_unknown_name_ends_at_the_deadline() {
    let a = MockMcp::modern()
        .page_size(1)
        .list_delay(Duration::from_millis(250))
        .start()
        .await;
    let b = MockMcp::modern().start().await;
    let gw = Gateway::start(&format!(
        "[log]\naccess = false\n\
         [[backends]]\nname = \"a\"\nurl = \"{}\"\ntimeout_ms = 600\n\
         [[backends]]\nname = \"b\"\nurl = \"{}\"\ntimeout_ms = 600\n\
         [[endpoints]]\npath = \"/mcp\"\nbackends = [{{name = 'a', prefix = ''}}, 'b']\n",
        a.url(),
        b.url()
    ))
    .await;
    let started = Instant::now();
    let r = mcp(
        &gw.url("/mcp"),
        json!(3),
        "tools/call",
        json!({"name": "nosuch", "arguments": {}}),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(r.status, 504, "{:?}", r.body);
    assert_eq!(r.json()["id"], 3);
    assert!(
        took >= Duration::from_millis(550) && took < Duration::from_millis(1400),
        "{took:?}"
    );
    assert!(
        a.count("tools/list") < 6,
        "the walk stopped at the deadline"
    );
    gw.stop().await;
}
