//! Server-to-client requests across the eras (issue #19 items 3 and 4; README "Input requests"):
//! an initialize-era backend's `elicitation/create`, `sampling/createMessage` and `roots/list`
//! during a call are relayed to an initialize-era client with portico's ids and its answers
//! routed back with the server's ids, or park the call for a 2026-07-28 client as
//! `input_required` with a sealed `requestState`; expired, foreign and tampered states are
//! refused and the parked server request gets an error when the hold ends
//! (`portico_parked_calls` back to 0). A 2026-07-28 backend's `input_required` reaches an
//! initialize-era client as real requests, and the call is retried with the answers and the
//! server's `requestState` byte for byte.

use crate::common::mock::{MockHandle, MockMcp};
use crate::common::*;
use crate::sessions::{ALICE, ASKABLE, BOB, Old, auth, modern, text};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use portico::sse::SseDecoder;
use serde_json::{Value, json};
use std::time::Duration;
use tokio::time::Instant;

const METHODS: [&str; 3] = ["elicitation/create", "sampling/createMessage", "roots/list"];

/// What a client answers to each kind of request.
fn answer_for(method: &str) -> Value {
    match method {
        "sampling/createMessage" => {
            json!({"role":"assistant","content":{"type":"text","text":"Paris"},"model":"m","stopReason":"endTurn"})
        }
        "roots/list" => json!({"roots":[{"uri":"file:///work","name":"work"}]}),
        _ => json!({"action":"accept","content":{"name":"octocat"}}),
    }
}

fn config(url: &str, extra: &str, hold_ms: u64) -> String {
    format!(
        "[metrics]\n{extra}\n[[backends]]\nname = \"b\"\nurl = \"{url}\"\ntimeout_ms = 10000\n\
         input_hold_ms = {hold_ms}\n"
    )
}

async fn parked_gauge(gw: &Gateway) -> f64 {
    let r = send("GET", &gw.metrics_url("/metrics"), &[], "").await;
    let text = String::from_utf8_lossy(&r.body).to_string();
    text.lines()
        .find_map(|l| l.strip_prefix("portico_parked_calls{backend=\"b\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no portico_parked_calls in\n{text}"))
}

/// Waits (bounded) for the gauge to read `n`.
async fn gauge_reaches(gw: &Gateway, n: f64) {
    for _ in 0..100 {
        if parked_gauge(gw).await == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("portico_parked_calls never reached {n}");
}

/// The SSE events of a response, read as they come.
struct Events {
    body: Incoming,
    dec: SseDecoder,
}

impl Events {
    async fn open(old: &Old, body: Value) -> Events {
        let h = old.headers();
        let h: Vec<(&str, &str)> = h.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        let resp = send_stream("POST", &old.url, &h, body.to_string()).await;
        assert_eq!(resp.status(), 200);
        let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ct.starts_with("text/event-stream"), "{ct}");
        Events {
            body: resp.into_body(),
            dec: SseDecoder::new(1 << 20),
        }
    }

    /// The next message (bounded wait); `None` at the end of the stream.
    async fn next(&mut self) -> Option<Value> {
        loop {
            if let Ok(Some(ev)) = self.dec.next_event() {
                return Some(serde_json::from_slice(&ev).expect("JSON event"));
            }
            let frame = tokio::time::timeout(Duration::from_secs(10), self.body.frame())
                .await
                .expect("an event within 10 s");
            match frame {
                Some(Ok(f)) => {
                    if let Some(d) = f.data_ref() {
                        self.dec.push(d);
                    }
                }
                _ => return None,
            }
        }
    }
}

async fn legacy_mock() -> MockHandle {
    MockMcp::legacy().sse().start().await
}

/// Item 3, legacy client: each kind of server request reaches the client on the call's stream
/// under portico's id; the client's answer reaches the server under the server's own id (the
/// mock only accepts an answer under the id it sent), and the call completes. Another session
/// answering under the same portico id reaches nothing.
#[tokio::test]
async fn a_legacy_backends_requests_are_relayed_to_a_legacy_client() {
    let mock = legacy_mock().await;
    let gw = Gateway::start(&config(&mock.url(), "", 5000)).await;
    let url = gw.url("/mcp/b");
    let client = Old::connect(&url, None, ASKABLE).await;
    let stranger = Old::connect(&url, None, ASKABLE).await;
    for (n, method) in METHODS.iter().enumerate() {
        let mut events = Events::open(
            &client,
            json!({"jsonrpc":"2.0","id":n + 1,"method":"tools/call",
                "params":{"name":"ask","arguments":{"method":method}}}),
        )
        .await;
        let req = events.next().await.expect("the server's request");
        assert_eq!(req["method"], *method, "{req}");
        let pid = req["id"].as_str().expect("string id").to_string();
        assert!(pid.starts_with("portico-input-"), "portico's id: {req}");
        if n == 0 {
            // Someone else's session cannot answer it.
            let r = stranger
                .post(json!({"jsonrpc":"2.0","id":pid,"result":answer_for(method)}))
                .await;
            assert_eq!(r.status, 202);
        }
        let r = client
            .post(json!({"jsonrpc":"2.0","id":pid,"result":answer_for(method)}))
            .await;
        assert_eq!(r.status, 202, "{:?}", r.body);
        let last = events.next().await.expect("the result");
        assert_eq!(last["id"], json!(n + 1), "{last}");
        let text = last["result"]["content"][0]["text"].as_str().unwrap();
        let got: Value = serde_json::from_str(text.strip_prefix("answer: ").unwrap()).unwrap();
        assert!(got["id"].as_str().unwrap().starts_with("srv-"), "{got}");
        assert_eq!(got["result"], answer_for(method), "{got}");
        assert!(last["result"].get("resultType").is_none(), "legacy shape");
    }
    let answers = mock.wait_answers(3, Duration::from_secs(5)).await;
    assert_eq!(answers.len(), 3, "one answer each, none from the stranger");
    gw.stop().await;
}

/// Item 3 on a legacy stdio backend (a child per client, `isolation = "per_client"`): the
/// server's request during a call reaches a legacy client on the call's stream under portico's
/// id, and a 2026-07-28 client as `input_required`; both answers reach the server under its
/// own id and the calls complete.
#[tokio::test]
async fn a_legacy_stdio_backends_requests_reach_both_eras_of_client() {
    let backend = crate::sessions::stdio_backend(&["--legacy"], "input_hold_ms = 5000\n");
    let gw = Gateway::start(&format!("[metrics]\n{backend}")).await;
    let url = gw.url("/mcp/b");
    let client = Old::connect(&url, None, ASKABLE).await;
    for (n, method) in METHODS.iter().enumerate() {
        let mut events = Events::open(
            &client,
            json!({"jsonrpc":"2.0","id":n + 1,"method":"tools/call",
                "params":{"name":"ask","arguments":{"method":method}}}),
        )
        .await;
        let req = events.next().await.expect("the server's request");
        assert_eq!(req["method"], *method, "{req}");
        let pid = req["id"].as_str().expect("string id").to_string();
        assert!(pid.starts_with("portico-input-"), "portico's id: {req}");
        let r = client
            .post(json!({"jsonrpc":"2.0","id":pid,"result":answer_for(method)}))
            .await;
        assert_eq!(r.status, 202, "{:?}", r.body);
        let last = events.next().await.expect("the result");
        assert_eq!(last["id"], json!(n + 1), "{last}");
        let got = &last["result"]["structuredContent"]["answer"];
        assert!(got["id"].as_str().unwrap().starts_with("srv-"), "{last}");
        assert_eq!(got["result"], answer_for(method), "{last}");
    }
    for method in METHODS {
        let args = json!({"method": method});
        let call = json!({"name":"ask","arguments":args});
        let r = modern(&url, None, json!(1), "tools/call", call, ASKABLE).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        let res = r.result();
        let result = &res["result"];
        assert_eq!(result["resultType"], "input_required", "{res}");
        let (key, req) = result["inputRequests"]
            .as_object()
            .and_then(|m| m.iter().next())
            .expect("one input request");
        assert_eq!(req["method"], method, "{req}");
        let state = result["requestState"].as_str().unwrap();
        let retry = json!({"name":"ask","arguments":args,
            "inputResponses":{key.clone(): answer_for(method)},"requestState":state});
        let r = modern(&url, None, json!(2), "tools/call", retry, ASKABLE).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        let res = r.result();
        assert_eq!(res["result"]["resultType"], "complete", "{res}");
        let got = &res["result"]["structuredContent"]["answer"];
        assert!(got["id"].as_str().unwrap().starts_with("srv-"), "{res}");
        assert_eq!(got["result"], answer_for(method), "{res}");
    }
    gauge_reaches(&gw, 0.0).await;
    gw.stop().await;
}

/// A legacy client that never answers a relayed request: the server gets an error when
/// `input_hold_ms` runs out, and the call completes.
#[tokio::test]
async fn an_unanswered_relayed_request_gets_the_server_an_error_at_the_hold() {
    let mock = legacy_mock().await;
    let hold = 400;
    let gw = Gateway::start(&config(&mock.url(), "", hold)).await;
    let client = Old::connect(&gw.url("/mcp/b"), None, ASKABLE).await;
    let mut events = Events::open(
        &client,
        json!({"jsonrpc":"2.0","id":1,"method":"tools/call",
            "params":{"name":"ask","arguments":{"method":"roots/list"}}}),
    )
    .await;
    let req = events.next().await.expect("the server's request");
    let relayed_at = Instant::now();
    assert_eq!(req["method"], "roots/list");
    let answers = mock.wait_answers(1, Duration::from_secs(5)).await;
    let (at, answer) = answers.first().expect("the server heard back").clone();
    let waited = at.duration_since(relayed_at);
    assert!(
        waited <= Duration::from_millis(hold + 500),
        "after {waited:?}"
    );
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
    assert!(
        answer["id"].as_str().unwrap().starts_with("srv-"),
        "{answer}"
    );
    let last = events.next().await.expect("the result");
    assert_eq!(last["id"], 1, "{last}");
    gw.stop().await;
}

/// A legacy client that did not declare the capability is not asked: the server gets
/// `-32601` naming the capability and the call goes on.
#[tokio::test]
async fn a_legacy_client_without_the_capability_is_not_asked() {
    let mock = legacy_mock().await;
    let gw = Gateway::start(&config(&mock.url(), "", 5000)).await;
    let client = Old::connect(&gw.url("/mcp/b"), None, r#"{"sampling":{}}"#).await;
    let r = client
        .tool(json!(1), "ask", json!({"method":"roots/list"}))
        .await;
    assert!(r.messages().iter().all(|m| m.get("method").is_none()));
    let t = text(&r);
    assert!(
        t.contains("-32601") && t.contains("`roots` capability"),
        "{t}"
    );
    gw.stop().await;
}

/// Item 3, 2026-07-28 client: the call answers `input_required` (the server's request in
/// `inputRequests`, a sealed `requestState`), the retry delivers the response under the
/// server's id and the call completes; a server that asks again gets another round.
#[tokio::test]
async fn a_2026_client_completes_a_legacy_call_through_input_required() {
    let mock = legacy_mock().await;
    let gw = Gateway::start(&config(&mock.url(), "", 5000)).await;
    let url = gw.url("/mcp/b");
    for method in METHODS {
        let args = json!({"method": method, "times": 2});
        let r = modern(
            &url,
            None,
            json!(1),
            "tools/call",
            json!({"name":"ask","arguments":args}),
            ASKABLE,
        )
        .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        let mut res = r.result();
        assert_eq!(res["id"], 1);
        gauge_reaches(&gw, 1.0).await;
        let mut states = Vec::new();
        for round in 0..2 {
            let result = &res["result"];
            assert_eq!(result["resultType"], "input_required", "{res}");
            let reqs = result["inputRequests"].as_object().unwrap();
            assert_eq!(reqs.len(), 1, "{res}");
            let (key, req) = reqs.iter().next().unwrap();
            assert_eq!(req["method"], method, "{req}");
            assert!(req.get("id").is_none() && req.get("jsonrpc").is_none());
            let state = result["requestState"].as_str().unwrap().to_string();
            assert!(!state.contains("srv-"), "sealed, not readable");
            states.push(state.clone());
            let r = modern(
                &url,
                None,
                json!(10 + round),
                "tools/call",
                json!({"name":"ask","arguments":args,
                    "inputResponses":{key.clone(): answer_for(method)},"requestState":state}),
                ASKABLE,
            )
            .await;
            assert_eq!(r.status, 200, "{:?}", r.body);
            res = r.result();
            assert_eq!(res["id"], json!(10 + round), "the retry's own id: {res}");
        }
        assert_ne!(states[0], states[1]);
        assert_eq!(res["result"]["resultType"], "complete", "{res}");
        let t = text(&r_of(res));
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 2, "{t}");
        for l in lines {
            let got: Value = serde_json::from_str(l.strip_prefix("answer: ").unwrap()).unwrap();
            assert!(got["id"].as_str().unwrap().starts_with("srv-"), "{got}");
            assert_eq!(got["result"], answer_for(method), "{got}");
        }
        gauge_reaches(&gw, 0.0).await;
    }
    gw.stop().await;
}

/// A `Resp` around one JSON message (for `text`).
fn r_of(v: Value) -> Resp {
    Resp {
        status: 200,
        headers: Default::default(),
        body: v.to_string().into(),
    }
}

/// Tampered, foreign-principal and expired `requestState`s get clear `-32602` errors; the
/// parked server request gets an error when the hold ends, and the gauge returns to 0.
#[tokio::test]
async fn tampered_foreign_and_expired_states_are_refused_and_the_server_hears_in_time() {
    let mock = legacy_mock().await;
    let hold = 600;
    let gw = Gateway::start(&config(&mock.url(), &auth(), hold)).await;
    let url = gw.url("/mcp/b");
    let call = json!({"name":"ask","arguments":{}});
    let r = modern(
        &url,
        Some(ALICE),
        json!(1),
        "tools/call",
        call.clone(),
        ASKABLE,
    )
    .await;
    let parked_at = Instant::now();
    let result = r.result()["result"].clone();
    assert_eq!(result["resultType"], "input_required", "{result}");
    let key = result["inputRequests"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    let state = result["requestState"].as_str().unwrap().to_string();
    gauge_reaches(&gw, 1.0).await;
    let retry = |state: String| {
        json!({"name":"ask","arguments":{},
            "inputResponses":{key.clone(): answer_for("elicitation/create")},"requestState":state})
    };

    // Tampered: one character changed.
    let mut t = state.clone().into_bytes();
    let i = t.len() / 2;
    t[i] = if t[i] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(t).unwrap();
    let r = modern(
        &url,
        Some(ALICE),
        json!(2),
        "tools/call",
        retry(tampered),
        ASKABLE,
    )
    .await;
    assert_eq!((r.status, r.code()), (400, -32602), "{:?}", r.body);
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("requestState is not valid"), "{msg}");

    // Another principal.
    let r = modern(
        &url,
        Some(BOB),
        json!(3),
        "tools/call",
        retry(state.clone()),
        ASKABLE,
    )
    .await;
    assert_eq!((r.status, r.code()), (400, -32602), "{:?}", r.body);
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("issued to another caller"), "{msg}");

    // Nobody answers: the server's request gets an error when the hold ends.
    let answers = mock.wait_answers(1, Duration::from_secs(5)).await;
    let (at, answer) = answers.first().expect("the server heard back").clone();
    let waited = at.duration_since(parked_at);
    assert!(
        waited <= Duration::from_millis(hold + 500),
        "error after {waited:?} (hold {hold} ms)"
    );
    assert!(
        answer["id"].as_str().unwrap().starts_with("srv-"),
        "{answer}"
    );
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("input_hold_ms"),
        "{answer}"
    );
    gauge_reaches(&gw, 0.0).await;
    let scrape = send("GET", &gw.metrics_url("/metrics"), &[], "").await;
    let scrape = String::from_utf8_lossy(&scrape.body).to_string();
    assert!(
        scrape.contains("portico_parked_expired_total{backend=\"b\"} 1"),
        "{scrape}"
    );

    // Expired.
    let r = modern(
        &url,
        Some(ALICE),
        json!(4),
        "tools/call",
        retry(state),
        ASKABLE,
    )
    .await;
    assert_eq!((r.status, r.code()), (400, -32602), "{:?}", r.body);
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("requestState expired"), "{msg}");
    gw.stop().await;
}

/// A parked call that is answered by its own principal after a foreign attempt still
/// completes (a refused retry does not consume the call).
#[tokio::test]
async fn a_refused_retry_leaves_the_call_parked_for_its_owner() {
    let mock = legacy_mock().await;
    let gw = Gateway::start(&config(&mock.url(), &auth(), 5000)).await;
    let url = gw.url("/mcp/b");
    let r = modern(
        &url,
        Some(ALICE),
        json!(1),
        "tools/call",
        json!({"name":"ask","arguments":{}}),
        ASKABLE,
    )
    .await;
    let result = r.result()["result"].clone();
    let state = result["requestState"].as_str().unwrap().to_string();
    let key = result["inputRequests"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    let retry = json!({"name":"ask","arguments":{},
        "inputResponses":{key: answer_for("elicitation/create")},"requestState":state});
    let r = modern(
        &url,
        Some(BOB),
        json!(2),
        "tools/call",
        retry.clone(),
        ASKABLE,
    )
    .await;
    assert_eq!(r.code(), -32602);
    let r = modern(&url, Some(ALICE), json!(3), "tools/call", retry, ASKABLE).await;
    let res = r.result();
    assert_eq!(res["result"]["resultType"], "complete", "{res}");
    assert!(text(&r).contains("octocat"));
    gauge_reaches(&gw, 0.0).await;
    gw.stop().await;
}

/// Item 4: a 2026-07-28 backend's `input_required` reaches an initialize-era client as real
/// requests on the call's stream (every kind, two rounds); portico retries with the answers
/// and the server's `requestState` byte for byte, under a new id, and streams the result.
#[tokio::test]
async fn a_2026_backends_input_required_reaches_a_legacy_client_as_requests() {
    let mock = MockMcp::modern().start().await;
    let gw = Gateway::start(&config(&mock.url(), "", 5000)).await;
    let client = Old::connect(&gw.url("/mcp/b"), None, ASKABLE).await;
    let args = json!({"methods": METHODS, "rounds": 2});
    let mut events = Events::open(
        &client,
        json!({"jsonrpc":"2.0","id":"c-1","method":"tools/call",
            "params":{"name":"mrtr","arguments":args}}),
    )
    .await;
    for _round in 0..2 {
        let mut asked = Vec::new();
        for _ in 0..3 {
            let req = events.next().await.expect("a request");
            let pid = req["id"].as_str().expect("id").to_string();
            assert!(pid.starts_with("portico-input-"), "{req}");
            asked.push(req["method"].as_str().unwrap().to_string());
            let r = client
                .post(json!({"jsonrpc":"2.0","id":pid,"result":answer_for(req["method"].as_str().unwrap())}))
                .await;
            assert_eq!(r.status, 202);
        }
        asked.sort();
        let mut want: Vec<String> = METHODS.iter().map(|m| m.to_string()).collect();
        want.sort();
        assert_eq!(asked, want);
    }
    let last = events.next().await.expect("the result");
    assert_eq!(last["id"], "c-1", "{last}");
    assert!(
        last["result"].get("resultType").is_none(),
        "legacy shape: {last}"
    );
    let t = last["result"]["content"][0]["text"].as_str().unwrap();
    let got: Value = serde_json::from_str(t.strip_prefix("got: ").unwrap()).unwrap();
    assert_eq!(got["q0"], answer_for(METHODS[0]));
    assert_eq!(got["q1"], answer_for(METHODS[1]));
    assert_eq!(got["q2"], answer_for(METHODS[2]));
    // The retries: new ids, the server's state untouched.
    let calls: Vec<Value> = mock
        .seen()
        .into_iter()
        .filter(|s| s.body["params"]["name"] == "mrtr")
        .map(|s| s.body)
        .collect();
    assert_eq!(calls.len(), 3, "first call and two retries");
    assert!(calls[0]["params"].get("requestState").is_none());
    assert_eq!(calls[1]["params"]["requestState"], "mrtr-state-1 \u{e9}+/=");
    assert_eq!(calls[2]["params"]["requestState"], "mrtr-state-2 \u{e9}+/=");
    let ids: std::collections::HashSet<String> =
        calls.iter().map(|c| c["id"].to_string()).collect();
    assert_eq!(ids.len(), 3, "every retry has its own id: {ids:?}");
    gw.stop().await;
}

/// Item 4: a legacy client that did not declare the capability gets an error naming it.
#[tokio::test]
async fn a_legacy_client_without_the_capability_gets_an_error_naming_it() {
    let mock = MockMcp::modern().start().await;
    let gw = Gateway::start(&config(&mock.url(), "", 5000)).await;
    let client = Old::connect(&gw.url("/mcp/b"), None, r#"{"roots":{}}"#).await;
    let r = client
        .tool(
            json!(1),
            "mrtr",
            json!({"methods":["sampling/createMessage"]}),
        )
        .await;
    let last = r.result();
    let msg = last["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{last}"));
    assert!(msg.contains("`sampling` capability"), "{msg}");
    // The 2026 table's code for it, naming what is missing (docs/protocol.md).
    assert_eq!(last["error"]["code"], -32021, "{last}");
    assert_eq!(
        last["error"]["data"]["requiredCapabilities"],
        json!({"sampling": {}}),
        "{last}"
    );
    assert!(r.messages().iter().all(|m| m.get("method").is_none()));
    gw.stop().await;
}

/// Two replicas with one `[sessions] key`, each naming itself in `advertise_url`: a retry
/// that lands on the replica not holding the call is forwarded to the one that does and
/// completes there (its principal authenticated again by the owner); a retry that was already
/// forwarded once, or comes from another principal, is refused.
#[tokio::test]
async fn a_retry_on_another_replica_is_forwarded_to_the_owner() {
    let mock = legacy_mock().await;
    let (l1, l2) = (
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
    );
    let (a1, a2) = (l1.local_addr().unwrap(), l2.local_addr().unwrap());
    let replica = |addr: std::net::SocketAddr| {
        format!(
            "[sessions]\nkey = \"one key for both replicas\"\nadvertise_url = \"http://{addr}\"\n{}",
            auth()
        )
    };
    let one = Gateway::start_on(&config(&mock.url(), &replica(a1), 5000), l1).await;
    let two = Gateway::start_on(&config(&mock.url(), &replica(a2), 5000), l2).await;
    let mut parked = Vec::new();
    for id in [1, 2] {
        let call = json!({"name":"ask","arguments":{}});
        let r = modern(
            &one.url("/mcp/b"),
            Some(ALICE),
            json!(id),
            "tools/call",
            call,
            ASKABLE,
        )
        .await;
        let result = r.result()["result"].clone();
        assert_eq!(result["resultType"], "input_required", "{result}");
        let (key, _) = result["inputRequests"]
            .as_object()
            .unwrap()
            .iter()
            .next()
            .unwrap();
        parked.push(json!({"name":"ask","arguments":{},
            "inputResponses":{key.clone(): answer_for("elicitation/create")},
            "requestState": result["requestState"]}));
    }
    gauge_reaches(&one, 2.0).await;

    // Already forwarded once (as a replica would mark it): refused, naming the owner.
    let name = format!("http://{a1}");
    let mut h = modern_headers("tools/call", Some("ask"));
    h.push(("portico-forwarded", "1"));
    let bearer = format!("Bearer {ALICE}");
    h.push(("authorization", &bearer));
    let mut body: Value =
        serde_json::from_str(&modern_body(json!(3), "tools/call", parked[0].clone())).unwrap();
    body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] =
        serde_json::from_str(ASKABLE).unwrap();
    let r = send("POST", &two.url("/mcp/b"), &h, body.to_string()).await;
    assert_eq!((r.status, r.code()), (400, -32602), "{:?}", r.body);
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        msg.contains(&name) && msg.contains("forwarded once"),
        "{msg}"
    );

    // Another principal on the other replica: refused there, nothing forwarded.
    let r = modern(
        &two.url("/mcp/b"),
        Some(BOB),
        json!(6),
        "tools/call",
        parked[0].clone(),
        ASKABLE,
    )
    .await;
    assert_eq!(r.code(), -32602, "{:?}", r.body);
    // On the other replica, by its principal (the credential travels with the retry):
    // forwarded to the owner, completes.
    let r = modern(
        &two.url("/mcp/b"),
        Some(ALICE),
        json!(4),
        "tools/call",
        parked[0].clone(),
        ASKABLE,
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let res = r.result();
    assert_eq!(res["id"], 4, "{res}");
    assert_eq!(res["result"]["resultType"], "complete", "{res}");
    assert!(text(&r).contains("octocat"));
    // On the owner itself: completes.
    let r = modern(
        &one.url("/mcp/b"),
        Some(ALICE),
        json!(5),
        "tools/call",
        parked[1].clone(),
        ASKABLE,
    )
    .await;
    assert_eq!(
        r.result()["result"]["resultType"],
        "complete",
        "{:?}",
        r.body
    );
    gauge_reaches(&one, 0.0).await;
    one.stop().await;
    two.stop().await;
}
