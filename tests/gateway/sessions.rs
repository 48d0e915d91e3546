//! Upstream sessions belong to one client (README "Session isolation"): per authorization
//! context and declared capabilities for 2026-07-28 clients, per session for initialize-era
//! clients, over HTTP and stdio; opened with the client's capabilities and clientInfo; capped
//! and reaped; cancellations reach only their own client's call; `DELETE` ends a legacy-client
//! session on every replica; `-32022` lists what `server/discover` advertises.

use crate::common::mock::MockMcp;
use crate::common::*;
use crate::redis::RedisServer;
use serde_json::{Value, json};
use std::time::Duration;

const MOCK: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/gateway/fixtures/stdio_mock.py"
);
pub(crate) const ALICE: &str = "alice-key-0123456789abcdef";
pub(crate) const BOB: &str = "bob-key-0123456789abcdef00";
pub(crate) const ASKABLE: &str = r#"{"sampling":{},"elicitation":{},"roots":{"listChanged":true}}"#;

/// `[auth]` with two principals (no teams).
pub(crate) fn auth() -> String {
    let a = crate::common::secret_file("sessions-alice", ALICE);
    let b = crate::common::secret_file("sessions-bob", BOB);
    format!(
        "[auth]\nmode = \"api_keys\"\n[[auth.api_keys]]\nkey_file = \"{}\"\nprincipal = \"alice\"\n\
         [[auth.api_keys]]\nkey_file = \"{}\"\nprincipal = \"bob\"\n",
        a.display(),
        b.display()
    )
}

fn http_backend(url: &str, extra: &str) -> String {
    format!("[[backends]]\nname = \"b\"\nurl = \"{url}\"\ntimeout_ms = 10000\n{extra}\n")
}

pub(crate) fn stdio_backend(args: &[&str], extra: &str) -> String {
    let mut cmd = vec!["python3".to_string(), MOCK.to_string()];
    cmd.extend(args.iter().map(|a| a.to_string()));
    format!(
        "[[backends]]\nname = \"b\"\ncommand = {}\ntimeout_ms = 10000\n{extra}\n",
        serde_json::to_string(&cmd).unwrap()
    )
}

/// A 2026-07-28 request with the caller's key and declared capabilities.
pub(crate) async fn modern(
    url: &str,
    key: Option<&str>,
    id: Value,
    method: &str,
    params: Value,
    caps: &str,
) -> Resp {
    let name = name_of(method, &params);
    let mut h = modern_headers(method, name.as_deref());
    let auth = key.map(|k| format!("Bearer {k}"));
    if let Some(a) = &auth {
        h.push(("authorization", a.as_str()));
    }
    let mut body: Value = serde_json::from_str(&modern_body(id, method, params)).unwrap();
    body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] =
        serde_json::from_str(caps).unwrap();
    send("POST", url, &h, body.to_string()).await
}

/// portico with `[auth]` before the HTTP backend `b` at `url`, its access log off.
async fn gateway_with_auth(url: &str) -> Gateway {
    Gateway::start(&format!(
        "[log]\naccess = false\n{}{}",
        auth(),
        http_backend(url, "")
    ))
    .await
}

async fn tool(url: &str, key: Option<&str>, id: Value, name: &str, args: Value) -> Resp {
    modern(
        url,
        key,
        id,
        "tools/call",
        json!({"name": name, "arguments": args}),
        "{}",
    )
    .await
}

pub(crate) fn text(r: &Resp) -> String {
    let v = r.result();
    v["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text in {v}"))
        .to_string()
}

fn names(r: &Resp) -> Vec<String> {
    let mut n: Vec<String> = r.result()["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools in {:?}", r.body))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    n.sort();
    n
}

/// An initialize-era client, by hand.
pub(crate) struct Old {
    pub(crate) url: String,
    pub(crate) sid: String,
    pub(crate) key: Option<String>,
}

impl Old {
    pub(crate) fn headers(&self) -> Vec<(String, String)> {
        let mut h = vec![
            ("content-type".into(), "application/json".into()),
            (
                "accept".into(),
                "application/json, text/event-stream".into(),
            ),
            ("mcp-protocol-version".into(), "2025-06-18".into()),
        ];
        if !self.sid.is_empty() {
            h.push(("mcp-session-id".into(), self.sid.clone()));
        }
        if let Some(k) = &self.key {
            h.push(("authorization".into(), format!("Bearer {k}")));
        }
        h
    }

    pub(crate) async fn post(&self, body: Value) -> Resp {
        let h = self.headers();
        let h: Vec<(&str, &str)> = h.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        send("POST", &self.url, &h, body.to_string()).await
    }

    pub(crate) async fn connect(url: &str, key: Option<&str>, caps: &str) -> Old {
        let mut c = Old {
            url: url.to_string(),
            sid: String::new(),
            key: key.map(String::from),
        };
        let caps: Value = serde_json::from_str(caps).unwrap();
        let r = c
            .post(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
                "protocolVersion":"2025-06-18","capabilities":caps,"clientInfo":{"name":"old-client","version":"7"}}}))
            .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        c.sid = r.header("mcp-session-id").expect("session id").to_string();
        let r = c
            .post(json!({"jsonrpc":"2.0","method":"notifications/initialized"}))
            .await;
        assert_eq!(r.status, 202);
        c
    }

    pub(crate) async fn call(&self, id: Value, method: &str, params: Value) -> Resp {
        self.post(json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}))
            .await
    }

    pub(crate) async fn tool(&self, id: Value, name: &str, args: Value) -> Resp {
        self.call(id, "tools/call", json!({"name": name, "arguments": args}))
            .await
    }
}

/// Waits (bounded) until `check` holds.
pub(crate) async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..100 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: not within 5 s");
}

/// Two principals, and two legacy sessions of one principal, store and read per-session state
/// on the backend: nothing crosses.
async fn nothing_crosses(url: &str) {
    let (a, b) = (Some(ALICE), Some(BOB));
    assert_eq!(
        text(&tool(url, a, json!(1), "store", json!({"value":"alice"})).await),
        "stored"
    );
    assert_eq!(
        text(&tool(url, b, json!(1), "recall", json!({})).await),
        "none",
        "bob sees nothing of alice's"
    );
    assert_eq!(
        text(&tool(url, b, json!(2), "store", json!({"value":"bob"})).await),
        "stored"
    );
    assert_eq!(
        text(&tool(url, a, json!(2), "recall", json!({})).await),
        "alice"
    );
    assert_eq!(
        text(&tool(url, b, json!(3), "recall", json!({})).await),
        "bob"
    );
    let l1 = Old::connect(url, a, "{}").await;
    let l2 = Old::connect(url, a, "{}").await;
    assert_eq!(
        text(&l1.tool(json!(1), "store", json!({"value":"l1"})).await),
        "stored"
    );
    assert_eq!(
        text(&l2.tool(json!(1), "recall", json!({})).await),
        "none",
        "a second session of alice's"
    );
    assert_eq!(text(&l1.tool(json!(2), "recall", json!({})).await), "l1");
    assert_eq!(
        text(&tool(url, a, json!(3), "recall", json!({})).await),
        "alice",
        "alice's 2026 context"
    );
}

#[tokio::test]
async fn nothing_crosses_between_clients_over_http() {
    let mock = MockMcp::legacy().start().await;
    let gw = gateway_with_auth(&mock.url()).await;
    nothing_crosses(&gw.url("/mcp/b")).await;
    // Each of the four clients had its own upstream session.
    assert_eq!(mock.count("initialize"), 4);
}

/// Each upstream session keeps the `InitializeResult` its own `initialize` was answered with,
/// though sessions answered alike share one copy of it (`BridgeState::shared_init`): clients the
/// server answers differently each see their own instructions, whichever came first.
#[tokio::test]
async fn each_session_keeps_its_own_initialize_result() {
    let mock = MockMcp::legacy().instructions_per_client().start().await;
    let gw = gateway_with_auth(&mock.url()).await;
    let url = gw.url("/mcp/b");
    let instructions = |key: &'static str, caps: &'static str| {
        let url = url.clone();
        async move {
            let r = modern(
                &url,
                Some(key),
                json!("d"),
                "server/discover",
                json!({}),
                caps,
            )
            .await;
            r.result()["result"]["instructions"]
                .as_str()
                .unwrap_or_else(|| panic!("no instructions in {:?}", r.body))
                .to_string()
        }
    };
    let plain = "legacy instructions for []";
    let sampling = "legacy instructions for [sampling]";
    assert_eq!(instructions(ALICE, "{}").await, plain);
    assert_eq!(instructions(BOB, r#"{"sampling":{}}"#).await, sampling);
    assert_eq!(instructions(BOB, "{}").await, plain, "bob's plain session");
    assert_eq!(instructions(ALICE, "{}").await, plain, "alice's, again");
    assert_eq!(instructions(BOB, r#"{"sampling":{}}"#).await, sampling);
    assert_eq!(instructions(ALICE, r#"{"sampling":{}}"#).await, sampling);
    // One upstream session per owner (key and declared capabilities), none re-made.
    assert_eq!(mock.count("initialize"), 4);
}

#[tokio::test]
async fn nothing_crosses_between_clients_over_stdio() {
    let gw = Gateway::start(&format!(
        "[log]\naccess = false\n{}{}",
        auth(),
        stdio_backend(&["--legacy"], "")
    ))
    .await;
    nothing_crosses(&gw.url("/mcp/b")).await;
}

/// The backend lists `sampler` only to clients that declared sampling/elicitation/roots: what
/// it lists directly and through portico agree, for either kind of client.
#[tokio::test]
async fn a_capability_dependent_tool_list_is_the_same_through_portico() {
    let mock = MockMcp::legacy().start().await;
    // Directly, as an initialize-era client of the mock.
    let direct = |caps: &'static str| {
        let url = mock.url();
        async move {
            let h = [
                ("content-type", "application/json"),
                ("accept", "application/json, text/event-stream"),
            ];
            let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
                "protocolVersion":"2025-06-18","capabilities":serde_json::from_str::<Value>(caps).unwrap(),
                "clientInfo":{"name":"direct","version":"1"}}});
            let r = send("POST", &url, &h, init.to_string()).await;
            let sid = r.header("mcp-session-id").unwrap().to_string();
            let mut h = h.to_vec();
            h.push(("mcp-session-id", &sid));
            h.push(("mcp-protocol-version", "2025-06-18"));
            let r = send(
                "POST",
                &url,
                &h,
                json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}).to_string(),
            )
            .await;
            names(&r)
        }
    };
    let (full, none) = (direct(ASKABLE).await, direct("{}").await);
    assert!(full.contains(&"sampler".to_string()) && !none.contains(&"sampler".to_string()));
    let gw = Gateway::start(&format!(
        "[log]\naccess = false\n{}",
        http_backend(&mock.url(), "")
    ))
    .await;
    let url = gw.url("/mcp/b");
    for (caps, want) in [(ASKABLE, &full), ("{}", &none)] {
        let r = modern(&url, None, json!(1), "tools/list", json!({}), caps).await;
        assert_eq!(&names(&r), want, "2026-07-28 client declaring {caps}");
        let old = Old::connect(&url, None, caps).await;
        assert_eq!(
            &names(&old.call(json!(1), "tools/list", json!({})).await),
            want,
            "legacy client declaring {caps}"
        );
    }
    // The upstream initialize carried the client's own declaration.
    let inits = mock.state.inits.lock().unwrap().clone();
    assert!(
        inits
            .values()
            .any(|p| p["clientInfo"]["name"] == "old-client"
                && p["capabilities"] == serde_json::from_str::<Value>(ASKABLE).unwrap()
                && p["protocolVersion"] == "2025-06-18"),
        "{inits:?}"
    );
    // Over stdio, against the same server run directly.
    let gw = Gateway::start(&format!(
        "[log]\naccess = false\n{}",
        stdio_backend(&["--legacy"], "")
    ))
    .await;
    let url = gw.url("/mcp/b");
    for caps in [ASKABLE, "{}"] {
        let up = portico::upstream::stdio::StdioUpstream::new(
            &portico::config::validate(
                portico::config::parse(&stdio_backend(&["--legacy"], "")).unwrap(),
            )
            .unwrap()
            .backends[0],
            vec!["python3".into(), MOCK.into(), "--legacy".into()],
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
            "protocolVersion":"2025-06-18","capabilities":serde_json::from_str::<Value>(caps).unwrap(),"clientInfo":{"name":"d","version":"1"}}});
        up.request(init.to_string().into(), deadline).await.unwrap();
        let list = up
            .call(
                json!({"jsonrpc":"2.0","id":1,"method":"tools/list"})
                    .to_string()
                    .into(),
                deadline,
            )
            .await
            .unwrap();
        let portico::upstream::MessageStream::One(list) = list.messages else {
            panic!("one answer")
        };
        let mut want: Vec<String> =
            serde_json::from_slice::<Value>(&list).unwrap()["result"]["tools"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["name"].as_str().unwrap().to_string())
                .collect();
        want.sort();
        up.shutdown().await;
        let r = modern(&url, None, json!(1), "tools/list", json!({}), caps).await;
        assert_eq!(names(&r), want, "stdio, 2026-07-28 client declaring {caps}");
        let old = Old::connect(&url, None, caps).await;
        assert_eq!(
            names(&old.call(json!(1), "tools/list", json!({})).await),
            want,
            "stdio, legacy client declaring {caps}"
        );
    }
}

/// Two clients with the same request id in flight in one pooled HTTP session: a closed stream
/// cancels only its own call (with the upstream id the server saw).
#[tokio::test]
async fn a_closed_stream_cancels_only_its_own_call_in_a_pooled_session() {
    let mock = MockMcp::legacy().start().await;
    let gw = Gateway::start(&format!(
        "[log]\naccess = false\n{}",
        http_backend(&mock.url(), "")
    ))
    .await;
    let url = gw.url("/mcp/b");
    let a = tokio::spawn({
        let url = url.clone();
        async move { tool(&url, None, json!(1), "slow", json!({"ms":4000,"tag":"A"})).await }
    });
    let b = tokio::spawn({
        let url = url.clone();
        async move { tool(&url, None, json!(1), "slow", json!({"ms":1200,"tag":"B"})).await }
    });
    eventually("both calls upstream", || mock.count("tools/call") == 2).await;
    a.abort();
    let st = mock.state.clone();
    eventually("A cancelled upstream", || {
        !st.cancelled_tags.lock().unwrap().is_empty()
    })
    .await;
    let b = tokio::time::timeout(Duration::from_secs(5), b)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(text(&b), "slept 1200");
    assert_eq!(*mock.state.cancelled_tags.lock().unwrap(), ["A"]);
    assert_eq!(
        mock.count("initialize"),
        1,
        "one pooled session for one context"
    );
}

/// A client's `notifications/cancelled` names its own id: portico cancels that client's call
/// only, with the id the server saw — for legacy-client sessions and for 2026-07-28 clients of
/// two principals.
#[tokio::test]
async fn a_clients_cancel_reaches_only_its_own_call_over_http() {
    let mock = MockMcp::legacy().start().await;
    let gw = gateway_with_auth(&mock.url()).await;
    let url = gw.url("/mcp/b");
    // Two legacy sessions, both with id 7 in flight.
    let l1 = std::sync::Arc::new(Old::connect(&url, Some(ALICE), "{}").await);
    let l2 = std::sync::Arc::new(Old::connect(&url, Some(ALICE), "{}").await);
    let c1 = tokio::spawn({
        let l1 = l1.clone();
        async move {
            l1.tool(json!(7), "slow", json!({"ms":4000,"tag":"L1"}))
                .await
        }
    });
    let c2 = tokio::spawn({
        let l2 = l2.clone();
        async move {
            l2.tool(json!(7), "slow", json!({"ms":1200,"tag":"L2"}))
                .await
        }
    });
    eventually("both calls upstream", || mock.count("tools/call") == 2).await;
    let r = l1
        .post(json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"user"}}))
        .await;
    assert_eq!(r.status, 202);
    let st = mock.state.clone();
    eventually("L1 cancelled upstream", || {
        !st.cancelled_tags.lock().unwrap().is_empty()
    })
    .await;
    let c1 = tokio::time::timeout(Duration::from_secs(3), c1)
        .await
        .expect("the cancelled call ends")
        .unwrap();
    assert_eq!(c1.status, 200);
    let c2 = tokio::time::timeout(Duration::from_secs(5), c2)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(text(&c2), "slept 1200");
    assert_eq!(*mock.state.cancelled_tags.lock().unwrap(), ["L1"]);
    // Two principals (2026-07-28), both with id 9 in flight; alice cancels hers.
    mock.state.cancelled_tags.lock().unwrap().clear();
    let a = tokio::spawn({
        let url = url.clone();
        async move {
            tool(
                &url,
                Some(ALICE),
                json!(9),
                "slow",
                json!({"ms":4000,"tag":"alice"}),
            )
            .await
        }
    });
    let b = tokio::spawn({
        let url = url.clone();
        async move {
            tool(
                &url,
                Some(BOB),
                json!(9),
                "slow",
                json!({"ms":1200,"tag":"bob"}),
            )
            .await
        }
    });
    eventually("both calls upstream", || mock.count("tools/call") == 4).await;
    let mut h = modern_headers("notifications/cancelled", None);
    let auth = format!("Bearer {ALICE}");
    h.push(("authorization", &auth));
    let note = json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":9,
        "_meta":{"io.modelcontextprotocol/protocolVersion":LATEST,"io.modelcontextprotocol/clientCapabilities":{}}}});
    assert_eq!(send("POST", &url, &h, note.to_string()).await.status, 202);
    let st = mock.state.clone();
    eventually("alice's call cancelled", || {
        !st.cancelled_tags.lock().unwrap().is_empty()
    })
    .await;
    let _ = tokio::time::timeout(Duration::from_secs(3), a)
        .await
        .expect("the cancelled call ends");
    let b = tokio::time::timeout(Duration::from_secs(5), b)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(text(&b), "slept 1200");
    assert_eq!(*mock.state.cancelled_tags.lock().unwrap(), ["alice"]);
}

/// An initialize-era client's `notifications/cancelled` for a call to a 2026-07-28 backend: the
/// call's upstream stream is closed (cancellation in that revision), the client's call ends,
/// and another session's call with the same id runs on — not left running upstream because
/// the upstream is not a shared one.
#[tokio::test]
async fn a_legacy_clients_cancel_reaches_a_modern_backend() {
    let mock = MockMcp::modern().start().await;
    let gw = gateway_with_auth(&mock.url()).await;
    let url = gw.url("/mcp/b");
    let l1 = std::sync::Arc::new(Old::connect(&url, Some(ALICE), "{}").await);
    let l2 = std::sync::Arc::new(Old::connect(&url, Some(ALICE), "{}").await);
    let c1 = tokio::spawn({
        let l1 = l1.clone();
        async move { l1.tool(json!(7), "slow", json!({"ms":5000})).await }
    });
    let c2 = tokio::spawn({
        let l2 = l2.clone();
        async move { l2.tool(json!(7), "slow", json!({"ms":1200})).await }
    });
    eventually("both calls upstream", || mock.count("tools/call") == 2).await;
    let r = l1
        .post(json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"user"}}))
        .await;
    assert_eq!(r.status, 202);
    assert!(
        mock.wait_cancelled(Duration::from_secs(3)).await,
        "the backend never saw the call's stream close"
    );
    tokio::time::timeout(Duration::from_secs(3), c1)
        .await
        .expect("the cancelled call ends")
        .unwrap();
    let c2 = tokio::time::timeout(Duration::from_secs(5), c2)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(text(&c2), "slept 1200");
    gw.stop().await;
}

/// One shared stdio child, two principals with the same id in flight: each cancel reaches its
/// own call only (the child records which).
#[tokio::test]
async fn a_clients_cancel_reaches_only_its_own_call_on_a_shared_stdio_child() {
    for mode in ["--legacy", "--modern"] {
        let gw = Gateway::start(&format!(
            "[log]\naccess = false\n{}{}",
            auth(),
            stdio_backend(&[mode], "isolation = \"shared\"")
        ))
        .await;
        let url = gw.url("/mcp/b");
        let spawn = |key: &'static str, tag: &'static str, ms: u64| {
            let url = url.clone();
            tokio::spawn(async move {
                tool(
                    &url,
                    Some(key),
                    json!(5),
                    "slow",
                    json!({"ms":ms,"tag":tag}),
                )
                .await
            })
        };
        // Both principals' sessions are opened first (the child started, each initialized), so
        // the calls below are on the pipe well within the pause even on a loaded machine; a
        // cancel sent before its call was written would have nothing to cancel.
        for key in [ALICE, BOB] {
            let r = tool(&url, Some(key), json!(4), "cancelled_ids", json!({})).await;
            assert!(r.result()["result"].is_object(), "{mode}: {:?}", r.body);
        }
        let a = spawn(ALICE, "alice", 5000);
        let b = spawn(BOB, "bob", 1500);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut h = modern_headers("notifications/cancelled", None);
        let auth = format!("Bearer {BOB}");
        h.push(("authorization", &auth));
        let note = json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5,
            "_meta":{"io.modelcontextprotocol/protocolVersion":LATEST,"io.modelcontextprotocol/clientCapabilities":{}}}});
        assert_eq!(send("POST", &url, &h, note.to_string()).await.status, 202);
        let _ = tokio::time::timeout(Duration::from_secs(3), b)
            .await
            .expect("bob's call ends");
        let r = tool(&url, Some(ALICE), json!(6), "cancelled_ids", json!({})).await;
        let tags: Vec<Value> = r.result()["result"]["structuredContent"]["cancelled"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["tag"].clone())
            .filter(|t| !t.is_null())
            .collect();
        assert_eq!(tags, [json!("bob")], "{mode}");
        let a = tokio::time::timeout(Duration::from_secs(8), a)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(text(&a), "slept", "{mode}: alice's call completes");
    }
}

/// `max_upstream_sessions`: a new client beyond the cap closes the least recently used session
/// (`DELETE` upstream); `upstream_idle_ms`: an idle one is closed.
#[tokio::test]
async fn upstream_sessions_are_capped_and_reaped_when_idle() {
    let mock = MockMcp::legacy().start().await;
    let gw = Gateway::start(&format!(
        "[log]\naccess = false\n{}",
        http_backend(
            &mock.url(),
            "max_upstream_sessions = 2\nupstream_idle_ms = 1500"
        )
    ))
    .await;
    let url = gw.url("/mcp/b");
    let caps = ["{}", r#"{"roots":{}}"#, r#"{"sampling":{}}"#];
    for (i, c) in caps[..2].iter().enumerate() {
        let r = modern(
            &url,
            None,
            json!(i),
            "tools/call",
            json!({"name":"echo","arguments":{"text":"x"}}),
            c,
        )
        .await;
        assert_eq!(text(&r), "x");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The first is used again: the second is now the least recently used.
    modern(
        &url,
        None,
        json!(5),
        "tools/call",
        json!({"name":"echo","arguments":{"text":"x"}}),
        caps[0],
    )
    .await;
    assert!(mock.state.deleted.lock().unwrap().is_empty());
    modern(
        &url,
        None,
        json!(6),
        "tools/call",
        json!({"name":"echo","arguments":{"text":"x"}}),
        caps[2],
    )
    .await;
    let st = mock.state.clone();
    eventually("the LRU session deleted", || {
        !st.deleted.lock().unwrap().is_empty()
    })
    .await;
    assert_eq!(*mock.state.deleted.lock().unwrap(), ["sess-2"]);
    // Idle: all the others go within the idle time (plus the reaper's period).
    let st = mock.state.clone();
    eventually("idle sessions deleted", || {
        st.deleted.lock().unwrap().len() == 3
    })
    .await;
    assert_eq!(mock.session_count(), 0);
}

/// `max_upstream_sessions_per_context`: a 2026-07-28 client that varies the capabilities it
/// declares gets a session per variant, but past its context's quota its own least recently
/// used goes — an initialize-era client's idle session, and the state the server keeps in it,
/// survive however many variants it sends.
#[tokio::test]
async fn one_client_varying_its_capabilities_cannot_push_out_others_sessions() {
    let mock = MockMcp::legacy().start().await;
    let gw = Gateway::start(&format!(
        "[log]\naccess = false\n{}",
        http_backend(
            &mock.url(),
            "max_upstream_sessions = 4\nmax_upstream_sessions_per_context = 2"
        )
    ))
    .await;
    let url = gw.url("/mcp/b");
    let old = Old::connect(&url, None, "{}").await;
    assert_eq!(
        text(&old.tool(json!(1), "store", json!({"value":"kept"})).await),
        "stored"
    );
    for n in 0..10 {
        let caps = format!(r#"{{"experimental":{{"variant{n}":{{}}}}}}"#);
        let r = modern(
            &url,
            None,
            json!(n),
            "tools/call",
            json!({"name":"echo","arguments":{"text":"x"}}),
            &caps,
        )
        .await;
        assert_eq!(text(&r), "x", "variant {n}");
    }
    let st = mock.state.clone();
    eventually("the variants' own sessions deleted", || {
        st.deleted.lock().unwrap().len() == 8
    })
    .await;
    assert_eq!(
        text(&old.tool(json!(2), "recall", json!({})).await),
        "kept",
        "the legacy client's session and its state are intact"
    );
    assert_eq!(
        mock.session_count(),
        3,
        "the legacy client's and two variants"
    );
}

/// `max_upstream_sessions_per_principal`: a principal that opens session after session
/// (each `initialize` is a new client session, with an upstream session of its own) makes
/// room among its own past its quota — another principal's idle session, and the state the
/// server keeps in it, survive.
#[tokio::test]
async fn one_principal_opening_sessions_cannot_push_out_anothers() {
    let mock = MockMcp::legacy().start().await;
    let gw = Gateway::start(&format!(
        "[log]\naccess = false\n{}{}",
        auth(),
        http_backend(
            &mock.url(),
            "max_upstream_sessions = 4\nmax_upstream_sessions_per_principal = 2"
        )
    ))
    .await;
    let url = gw.url("/mcp/b");
    let bob = Old::connect(&url, Some(BOB), "{}").await;
    assert_eq!(
        text(&bob.tool(json!(1), "store", json!({"value":"kept"})).await),
        "stored"
    );
    for n in 0..10 {
        let alice = Old::connect(&url, Some(ALICE), "{}").await;
        let r = alice.tool(json!(n), "echo", json!({"text":"x"})).await;
        assert_eq!(text(&r), "x", "session {n}");
    }
    let st = mock.state.clone();
    eventually("alice's own sessions deleted", || {
        st.deleted.lock().unwrap().len() == 8
    })
    .await;
    assert!(
        !st.deleted.lock().unwrap().contains(&"sess-1".to_string()),
        "bob's upstream session stays open"
    );
    assert_eq!(
        text(&bob.tool(json!(2), "recall", json!({})).await),
        "kept",
        "bob's session and its state are intact"
    );
    assert_eq!(mock.session_count(), 3, "bob's and alice's two");
    assert_eq!(
        mock.count("initialize"),
        11,
        "bob's session was never re-made"
    );
}

/// Two replicas with one `[sessions] key` and one Redis: a legacy client's upstream session
/// follows it to the other replica; `DELETE` on one ends it on both (404), and closes it
/// upstream. Within a live session an unknown method is 200 + -32601.
#[tokio::test]
async fn delete_ends_a_legacy_session_on_every_replica() {
    let redis = RedisServer::start().await;
    let mock = MockMcp::legacy().start().await;
    let cfg = format!(
        "[log]\naccess = false\n[sessions]\nkey = \"shared-replica-key\"\n[cache]\nredis_url = \"{}\"\nredis_timeout_ms = 1000\n{}",
        redis.url(),
        http_backend(&mock.url(), "")
    );
    let a = Gateway::start(&cfg).await;
    let b = Gateway::start(&cfg).await;
    let on_a = Old::connect(&a.url("/mcp/b"), None, "{}").await;
    let on_b = Old {
        url: b.url("/mcp/b"),
        sid: on_a.sid.clone(),
        key: None,
    };
    assert_eq!(
        text(&on_a.tool(json!(1), "store", json!({"value":"kept"})).await),
        "stored"
    );
    assert_eq!(
        text(&on_b.tool(json!(2), "recall", json!({})).await),
        "kept",
        "the upstream session followed the client"
    );
    assert_eq!(mock.count("initialize"), 1);
    let r = on_b.call(json!(3), "no/such/method", json!({})).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.code(), -32601);
    let del = |c: &Old| {
        let (url, sid) = (c.url.clone(), c.sid.clone());
        async move { send("DELETE", &url, &[("mcp-session-id", sid.as_str())], "").await }
    };
    assert_eq!(del(&on_a).await.status, 200);
    assert_eq!(
        *mock.state.deleted.lock().unwrap(),
        ["sess-1"],
        "closed upstream"
    );
    for c in [&on_a, &on_b] {
        let r = c.call(json!(4), "tools/list", json!({})).await;
        assert_eq!(r.status, 404, "{}: {:?}", c.url, r.body);
        assert_eq!(del(c).await.status, 404);
    }
}

/// A legacy client's `DELETE` landing on a replica that did not open its upstream session
/// (sealed in its id) closes it upstream with the owner's credentials — its team's
/// `team_headers` — as the opening replica would (a server that authenticates every request
/// would refuse a bare `DELETE`, and keep the session).
#[tokio::test]
async fn a_delete_on_another_replica_closes_the_upstream_session_with_its_credentials() {
    let mock = MockMcp::legacy().start().await;
    let cfg = format!(
        "[log]\naccess = false\n[sessions]\nkey = \"shared-replica-key\"\n{}{}",
        auth().replace(
            "principal = \"alice\"\n",
            "principal = \"alice\"\nteam = \"blue\"\n"
        ),
        http_backend(
            &mock.url(),
            "protocol = \"legacy\"\nteam_headers = { blue = { Authorization = \"Bearer upstream-blue\" } }"
        )
    );
    let a = Gateway::start(&cfg).await;
    let b = Gateway::start(&cfg).await;
    let on_a = Old::connect(&a.url("/mcp/b"), Some(ALICE), "{}").await;
    assert_eq!(
        text(&on_a.tool(json!(1), "echo", json!({"text":"x"})).await),
        "x"
    );
    let bearer = format!("Bearer {ALICE}");
    let r = send(
        "DELETE",
        &b.url("/mcp/b"),
        &[
            ("mcp-session-id", on_a.sid.as_str()),
            ("authorization", &bearer),
        ],
        "",
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let deletes: Vec<_> = mock
        .seen()
        .into_iter()
        .filter(|s| s.method == http::Method::DELETE)
        .collect();
    assert_eq!(
        deletes.len(),
        1,
        "closed upstream by the replica that got the DELETE"
    );
    assert_eq!(deletes[0].headers["authorization"], "Bearer upstream-blue");
    assert_eq!(*mock.state.deleted.lock().unwrap(), ["sess-1"]);
    a.stop().await;
    b.stop().await;
}

/// Every URL's `-32022` lists exactly the versions its `server/discover` advertises.
#[tokio::test]
async fn unsupported_version_lists_what_discover_advertises() {
    let modern_mock = MockMcp::modern().start().await;
    let legacy_mock = MockMcp::legacy().start().await;
    let gw = Gateway::start(&format!(
        "[log]\naccess = false\n[[backends]]\nname = \"new\"\nurl = \"{}\"\n[[backends]]\nname = \"old\"\nurl = \"{}\"\n\
         [[backends]]\nname = \"demo\"\nbuiltin = \"demo\"\n[[backends]]\nname = \"s\"\ncommand = [\"python3\", \"{MOCK}\"]\n\
         [[endpoints]]\npath = \"/mcp\"\nbackends = [\"new\", {{ name = \"old\", prefix = \"o\" }}]\n",
        modern_mock.url(),
        legacy_mock.url()
    ))
    .await;
    for path in ["/mcp/new", "/mcp/old", "/mcp/demo", "/mcp/s", "/mcp"] {
        let url = gw.url(path);
        let d = mcp(&url, json!(1), "server/discover", json!({})).await;
        let advertised = d.result()["result"]["supportedVersions"].clone();
        assert!(advertised.is_array(), "{path}: {:?}", d.body);
        let body = json!({"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"_meta":{
            "io.modelcontextprotocol/protocolVersion":"2099-01-01","io.modelcontextprotocol/clientCapabilities":{}}}});
        let mut h = modern_headers("tools/list", None);
        h[2] = ("mcp-protocol-version", "2099-01-01");
        let r = send("POST", &url, &h, body.to_string()).await;
        assert_eq!(r.code(), -32022, "{path}");
        assert_eq!(r.json()["error"]["data"]["supported"], advertised, "{path}");
    }
}

/// A modern backend that answers `server/discover` as an event stream (the cache off, so it is
/// relayed as it comes) is advertised with portico's versions too, the ones `-32022` lists.
#[tokio::test]
async fn a_streamed_discover_also_lists_portico_versions() {
    let m = MockMcp::modern().sse().start().await;
    let gw = Gateway::start(&format!(
        "[log]\naccess = false\n[cache]\nenabled = false\n[[backends]]\nname = \"new\"\nurl = \"{}\"\n",
        m.url()
    ))
    .await;
    let d = mcp(&gw.url("/mcp/new"), json!(1), "server/discover", json!({})).await;
    assert_eq!(
        d.result()["result"]["supportedVersions"],
        json!(portico::protocol::SUPPORTED_VERSIONS),
        "{:?}",
        d.body
    );
}

/// stdio `per_client`: each client's child is capped and reaped like an HTTP session (the
/// evicted or idle child exits).
#[tokio::test]
async fn per_client_stdio_children_are_capped_and_reaped() {
    let gw = Gateway::start(&format!(
        "[log]\naccess = false\n{}{}",
        auth(),
        stdio_backend(
            &["--legacy"],
            "max_upstream_sessions = 1\nupstream_idle_ms = 1000"
        )
    ))
    .await;
    let url = gw.url("/mcp/b");
    let pid = |key: &'static str| {
        let url = url.clone();
        async move {
            let r = tool(&url, Some(key), json!(1), "pid", json!({})).await;
            r.result()["result"]["structuredContent"]["pid"]
                .as_u64()
                .unwrap_or_else(|| panic!("pid in {:?}", r.body))
        }
    };
    let alive = |pid: u64| std::path::Path::new(&format!("/proc/{pid}")).exists();
    let alice = pid(ALICE).await;
    let bob = pid(BOB).await;
    assert_ne!(alice, bob, "a child each");
    eventually("alice's child closed at the cap", || !alive(alice)).await;
    assert!(alive(bob));
    eventually("bob's idle child closed", || !alive(bob)).await;
}

/// At the cap with every upstream session in use, a new client is refused (503) rather than
/// another client's call in flight cut off by closing its session (here: its child).
#[tokio::test]
async fn at_the_cap_a_session_in_use_is_not_closed_for_a_newcomer() {
    let gw = Gateway::start(&format!(
        "[log]\naccess = false\n{}{}",
        auth(),
        stdio_backend(&["--legacy"], "max_upstream_sessions = 1")
    ))
    .await;
    let url = gw.url("/mcp/b");
    let slow = tool(&url, Some(ALICE), json!(1), "slow", json!({"ms": 1500}));
    let newcomer = async {
        // Once alice's call holds her child (bounded: her call takes 1.5 s).
        tokio::time::sleep(Duration::from_millis(500)).await;
        tool(&url, Some(BOB), json!(2), "echo", json!({"text": "bob"})).await
    };
    let (alice, bob) = tokio::join!(slow, newcomer);
    assert_eq!(text(&alice), "slept", "{:?}", alice.body);
    assert_eq!(bob.status, 503, "{:?}", bob.body);
    // Once alice's call is over, her idle child gives way to bob's.
    let bob = tool(&url, Some(BOB), json!(3), "echo", json!({"text": "bob"})).await;
    assert_eq!(text(&bob), "bob");
}
