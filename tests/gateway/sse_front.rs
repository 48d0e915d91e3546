//! The 2024-11-05 HTTP+SSE transport in front (`sse_front`), on the wire: the stream's
//! `endpoint` event, messages POSTed and answered on the stream, every refusal with its status
//! and JSON-RPC code, a session bound to the principal that opened it, the session limit, the
//! session forgotten when its stream closes, and a route of its own winning over the
//! transport's URL. (The official SDKs' HTTP+SSE clients: `interop::sse_front`.)

use crate::common::*;
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use std::time::Duration;
use tokio::time::Instant;

const ALICE: &str = "sse-alice-key-0123456789";
const BOB: &str = "sse-bob-key-0123456789";

/// A client's open HTTP+SSE stream.
struct Stream {
    status: u16,
    headers: http::HeaderMap,
    body: hyper::body::Incoming,
    dec: portico::sse::SseDecoder,
    /// The `endpoint` event's data: where to POST.
    endpoint: String,
}

impl Stream {
    async fn open(url: &str, headers: &[(&str, &str)]) -> Stream {
        let mut h = vec![("accept", "text/event-stream")];
        h.extend_from_slice(headers);
        let resp = send_stream("GET", url, &h, Bytes::new()).await;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let mut s = Stream {
            status,
            headers,
            body: resp.into_body(),
            dec: portico::sse::SseDecoder::new(1 << 20),
            endpoint: String::new(),
        };
        if status == 200 {
            let (kind, data) = s.event().await.expect("a first event");
            assert_eq!(kind, "endpoint", "the first event names the POST URL");
            s.endpoint = data;
        }
        s
    }

    /// The next event's type and data (within 5 s).
    async fn event(&mut self) -> Option<(String, String)> {
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            if let Ok(Some(ev)) = self.dec.next_event() {
                let kind = String::from_utf8_lossy(self.dec.event_type()).into_owned();
                return Some((kind, String::from_utf8_lossy(&ev).into_owned()));
            }
            let frame = tokio::time::timeout_at(end, self.body.frame())
                .await
                .ok()??
                .ok()?;
            if let Ok(data) = frame.into_data() {
                self.dec.push(&data);
            }
        }
    }

    /// The next `message` event, parsed.
    async fn message(&mut self) -> Value {
        let (kind, data) = self.event().await.expect("a message within 5 s");
        assert_eq!(kind, "message", "{data}");
        serde_json::from_str(&data).expect("one JSON-RPC message per event")
    }
}

/// POSTs `body` to the session's URL on `gw`.
async fn post(gw: &Gateway, endpoint: &str, body: &str, headers: &[(&str, &str)]) -> Resp {
    let mut h = vec![("content-type", "application/json")];
    h.extend_from_slice(headers);
    send("POST", &gw.url(endpoint), &h, body.to_string()).await
}

fn initialize(id: u64) -> String {
    json!({"jsonrpc":"2.0","id":id,"method":"initialize","params":{
        "protocolVersion":"2025-06-18","capabilities":{},
        "clientInfo":{"name":"sse-test","version":"1"}}})
    .to_string()
}

async fn gauge(gw: &Gateway) -> String {
    let m = send("GET", &gw.metrics_url("/metrics"), &[], "").await;
    String::from_utf8_lossy(&m.body)
        .lines()
        .find(|l| l.starts_with("portico_sse_sessions "))
        .unwrap_or("")
        .to_string()
}

const DEMO: &str =
    "[log]\naccess = false\n[metrics]\n[[backends]]\nname = \"demo\"\nbuiltin = \"demo\"\n";

#[tokio::test]
async fn a_session_is_served_on_its_stream_and_forgotten_when_the_stream_closes() {
    let gw = Gateway::start(DEMO).await;
    let mut s = Stream::open(&gw.url("/mcp/demo/sse"), &[]).await;
    assert_eq!(s.status, 200);
    assert_eq!(s.headers["content-type"], "text/event-stream");
    let id = s
        .endpoint
        .strip_prefix("/mcp/demo/messages?sessionId=")
        .unwrap_or_else(|| panic!("endpoint {:?}", s.endpoint))
        .to_string();
    assert_eq!(id.len(), 32, "128 random bits: {id}");
    assert_eq!(gauge(&gw).await, "portico_sse_sessions 1");

    // Each message is accepted with 202; what it is owed comes on the stream.
    let ep = s.endpoint.clone();
    assert_eq!(post(&gw, &ep, &initialize(1), &[]).await.status, 202);
    let init = s.message().await;
    assert_eq!(init["id"], 1, "{init}");
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18", "{init}");
    assert_eq!(init["result"]["serverInfo"]["name"], "portico-demo");
    let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    assert_eq!(post(&gw, &ep, note, &[]).await.status, 202);
    let call = json!({"jsonrpc":"2.0","id":"c","method":"tools/call",
        "params":{"name":"echo","arguments":{"text":"over sse"}}});
    assert_eq!(post(&gw, &ep, &call.to_string(), &[]).await.status, 202);
    let answer = s.message().await;
    assert_eq!(
        answer["id"], "c",
        "the notification got no answer: {answer}"
    );
    assert_eq!(answer["result"]["content"][0]["text"], "over sse");
    // In the session's era: an unknown method is a JSON-RPC error on the stream.
    let unknown = r#"{"jsonrpc":"2.0","id":3,"method":"no/such"}"#;
    assert_eq!(post(&gw, &ep, unknown, &[]).await.status, 202);
    let err = s.message().await;
    assert_eq!(
        (err["id"].clone(), err["error"]["code"].clone()),
        (json!(3), json!(-32601))
    );

    // Refusals, each with its status and JSON-RPC code.
    let bad = post(&gw, &ep, "not json", &[]).await;
    assert_eq!((bad.status, bad.code()), (400, -32700), "{:?}", bad.body);
    let plain = send(
        "POST",
        &gw.url(&ep),
        &[("content-type", "text/plain")],
        note.to_string(),
    )
    .await;
    assert_eq!(plain.status, 415);
    let no_id = post(&gw, "/mcp/demo/messages", note, &[]).await;
    assert_eq!(no_id.status, 400, "{:?}", no_id.body);
    let unknown_id = post(&gw, "/mcp/demo/messages?sessionId=0123", note, &[]).await;
    assert_eq!((unknown_id.status, unknown_id.code()), (404, -32001));
    // The session belongs to its route.
    let other_route = post(
        &gw,
        &format!("/mcp/nope/messages?sessionId={id}"),
        note,
        &[],
    )
    .await;
    assert_eq!(other_route.status, 404);
    let get_messages = send("GET", &gw.url(&ep), &[], "").await;
    assert_eq!(get_messages.status, 405);
    assert_eq!(get_messages.header("allow"), Some("POST"));
    let post_sse = post(&gw, "/mcp/demo/sse", note, &[]).await;
    assert_eq!(post_sse.status, 405);
    assert_eq!(post_sse.header("allow"), Some("GET"));

    // The client goes: its id takes no more messages, and the gauge falls back.
    drop(s);
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let r = post(&gw, &ep, note, &[]).await;
        if r.status == 404 {
            break;
        }
        assert!(Instant::now() < end, "the session outlived its stream");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(gauge(&gw).await, "portico_sse_sessions 0");
    gw.stop().await;
}

fn with_auth(extra: &str) -> String {
    let a = secret_file("sse-alice", &format!("{ALICE}\n"));
    let b = secret_file("sse-bob", &format!("{BOB}\n"));
    format!(
        "[server]\nmax_sse_sessions = 1\n{extra}\n[log]\naccess = false\n[auth]\nmode = \"api_keys\"\n\
         [[auth.api_keys]]\nkey_file = {a:?}\nprincipal = \"alice\"\n\
         [[auth.api_keys]]\nkey_file = {b:?}\nprincipal = \"bob\"\n\
         [[backends]]\nname = \"demo\"\nbuiltin = \"demo\"\n"
    )
}

/// Opens a stream as `auth` once a closed session's place is free again (refused with
/// `refused` until then; within 5 s).
async fn open_once_freed(url: &str, auth: &str, refused: u16) {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let again = Stream::open(url, &[("authorization", auth)]).await;
        if again.status == 200 {
            return;
        }
        assert_eq!(again.status, refused);
        assert!(Instant::now() < end, "the closed session still counts");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_session_is_its_openers_and_sessions_are_bounded() {
    let gw = Gateway::start(&with_auth("")).await;
    let url = gw.url("/mcp/demo/sse");
    let alice = format!("Bearer {ALICE}");
    let bob = format!("Bearer {BOB}");
    // Opening needs what any request needs.
    let anon = Stream::open(&url, &[]).await;
    assert_eq!(anon.status, 401);
    assert!(anon.headers.contains_key("www-authenticate"));
    let foreign = Stream::open(
        &url,
        &[("authorization", &alice), ("origin", "http://evil.example")],
    )
    .await;
    assert_eq!(foreign.status, 403);

    let mut s = Stream::open(&url, &[("authorization", &alice)]).await;
    assert_eq!(s.status, 200);
    let ep = s.endpoint.clone();
    // Another principal, or none, cannot post into alice's session.
    let as_bob = post(&gw, &ep, &initialize(1), &[("authorization", &bob)]).await;
    assert_eq!(as_bob.status, 403, "{:?}", as_bob.body);
    assert!(String::from_utf8_lossy(&as_bob.body).contains("another principal"));
    let as_nobody = post(&gw, &ep, &initialize(1), &[]).await;
    assert_eq!(as_nobody.status, 401);
    let as_alice = post(&gw, &ep, &initialize(7), &[("authorization", &alice)]).await;
    assert_eq!(as_alice.status, 202);
    let init = s.message().await;
    assert_eq!(
        init["id"], 7,
        "only alice's message reached the session: {init}"
    );

    // `max_sse_sessions = 1`: a second stream waits for the first to go.
    let second = Stream::open(&url, &[("authorization", &alice)]).await;
    assert_eq!(second.status, 503);
    assert!(second.headers.contains_key("retry-after"));
    drop(s);
    open_once_freed(&url, &alice, 503).await;
    gw.stop().await;

    // 0 turns the transport off: the URL is no route.
    let off =
        Gateway::start(&with_auth("max_sse_sessions = 0").replace("max_sse_sessions = 1\n", ""))
            .await;
    let gone = Stream::open(&off.url("/mcp/demo/sse"), &[("authorization", &alice)]).await;
    assert_eq!(gone.status, 404);
    off.stop().await;
}

/// `max_sse_sessions_per_principal`: one principal holding its share gets 429 for another
/// session (with `Retry-After`), while another principal still opens one; a closed session
/// gives the share back.
#[tokio::test]
async fn one_principal_cannot_take_every_sse_session() {
    let gw = Gateway::start(
        &with_auth("max_sse_sessions_per_principal = 1")
            .replace("max_sse_sessions = 1\n", "max_sse_sessions = 4\n"),
    )
    .await;
    let url = gw.url("/mcp/demo/sse");
    let (alice, bob) = (format!("Bearer {ALICE}"), format!("Bearer {BOB}"));
    let first = Stream::open(&url, &[("authorization", &alice)]).await;
    assert_eq!(first.status, 200);
    let second = Stream::open(&url, &[("authorization", &alice)]).await;
    assert_eq!(second.status, 429);
    assert!(second.headers.contains_key("retry-after"));
    let body = tokio::time::timeout(Duration::from_secs(5), second.body.collect())
        .await
        .expect("the refusal's body within 5 s")
        .unwrap()
        .to_bytes();
    let refusal: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(refusal["error"]["code"], -32600, "{refusal}");
    assert!(
        refusal["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_sse_sessions_per_principal")),
        "{refusal}"
    );
    let theirs = Stream::open(&url, &[("authorization", &bob)]).await;
    assert_eq!(theirs.status, 200, "another principal is not held back");
    drop(first);
    open_once_freed(&url, &alice, 429).await;
    drop(theirs);
    gw.stop().await;
}

/// A backend named `sse` keeps its route: `/mcp/sse` is it, not the transport of an endpoint
/// at `/mcp`.
#[tokio::test]
async fn a_route_of_its_own_wins_over_the_transport() {
    let gw = Gateway::start(
        "[log]\naccess = false\n[[backends]]\nname = \"sse\"\nbuiltin = \"demo\"\n\
         [[backends]]\nname = \"demo\"\nbuiltin = \"demo\"\n\
         [[endpoints]]\npath = \"/mcp\"\nbackends = [\"demo\"]\n",
    )
    .await;
    // The backend's own route: a 2026-07-28 call is answered there.
    let r = mcp(
        &gw.url("/mcp/sse"),
        json!(1),
        "tools/call",
        json!({"name": "echo", "arguments": {"text": "route"}}),
    )
    .await;
    assert_eq!(r.result()["result"]["content"][0]["text"], "route", "{r:?}");
    // A GET there is the route's (an initialize-era stream needs a session), not a new
    // HTTP+SSE session.
    let s = Stream::open(&gw.url("/mcp/sse"), &[]).await;
    assert_ne!(s.status, 200);
    // The backend's own transport URL still works.
    let ok = Stream::open(&gw.url("/mcp/demo/sse"), &[]).await;
    assert_eq!(ok.status, 200);
    assert!(ok.endpoint.starts_with("/mcp/demo/messages?sessionId="));
    gw.stop().await;
}

/// A session outlives a reload, and each message is served by the config in force when it
/// arrives, as an HTTP client's next request would be — not by the retired generation.
#[tokio::test]
async fn a_session_outlives_a_reload_and_follows_the_new_config() {
    let mock = crate::common::mock::MockMcp::modern().start().await;
    let dir = std::env::temp_dir().join(format!("portico-sse-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("portico.toml");
    // A fixed session key: a sealed session id opens in every generation.
    let head = "[server]\ndrain_timeout_ms = 300\n[log]\naccess = false\n[cache]\nenabled = false\n\
                [sessions]\nkey = \"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\"\n";
    std::fs::write(
        &path,
        format!("{head}[[backends]]\nname = \"a\"\nbuiltin = \"demo\"\n"),
    )
    .unwrap();
    let gw = Gateway::start_reloading(&path).await;
    let base = format!("http://{}", gw.addr);
    let mut s = Stream::open(&format!("{base}/mcp/a/sse"), &[]).await;
    assert_eq!(s.status, 200);
    let ep = format!("{base}{}", s.endpoint);
    let post = |body: String| {
        let ep = ep.clone();
        async move {
            send("POST", &ep, &[("content-type", "application/json")], body)
                .await
                .status
        }
    };
    let list = |id: u64| json!({"jsonrpc":"2.0","id":id,"method":"tools/list"}).to_string();
    let names = |m: &Value| -> Vec<String> {
        m["result"]["tools"]
            .as_array()
            .map(|t| {
                t.iter()
                    .filter_map(|t| t["name"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(post(initialize(1)).await, 202);
    assert_eq!(s.message().await["id"], 1);
    assert_eq!(post(list(2)).await, 202);
    let before = s.message().await;
    assert!(!names(&before).contains(&"slow".to_string()), "{before}");

    // Backend `a` becomes another server.
    std::fs::write(
        &path,
        format!(
            "{head}[[backends]]\nname = \"a\"\nurl = \"{}\"\nprotocol = \"modern\"\n",
            mock.url()
        ),
    )
    .unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    let mut id = 3;
    loop {
        assert_eq!(post(list(id)).await, 202, "the session lives on");
        let m = s.message().await;
        assert_eq!(m["id"], id, "{m}");
        if names(&m).contains(&"slow".to_string()) {
            break;
        }
        assert!(
            Instant::now() < end,
            "the session never saw the new config: {m}"
        );
        id += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Past the old generation's retirement (its drain time), the session still answers.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let call = json!({"jsonrpc":"2.0","id":"after","method":"tools/call",
        "params":{"name":"echo","arguments":{"text":"still here"}}});
    assert_eq!(post(call.to_string()).await, 202);
    let m = s.message().await;
    assert_eq!(m["id"], "after", "{m}");
    assert!(m.get("result").is_some(), "{m}");
    drop(s);
    gw.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Behind several replicas with `[sessions] advertise_url`: the session id names the replica
/// holding the stream, and a POST that lands on another one is forwarded there once — the
/// answer still comes on the stream. A forwarded POST is never forwarded again, and an id that
/// was tampered with names nobody.
#[tokio::test]
async fn a_post_that_lands_on_another_replica_is_forwarded_to_the_stream() {
    let (la, lb) = (
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
    );
    let cfg = |me: std::net::SocketAddr| {
        format!(
            "[log]\naccess = false\n[sessions]\n\
             key = \"fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210\"\n\
             advertise_url = \"http://{me}\"\n[[backends]]\nname = \"demo\"\nbuiltin = \"demo\"\n"
        )
    };
    let a = Gateway::start_on(&cfg(la.local_addr().unwrap()), la).await;
    let b = Gateway::start_on(&cfg(lb.local_addr().unwrap()), lb).await;
    let mut s = Stream::open(&a.url("/mcp/demo/sse"), &[]).await;
    assert_eq!(s.status, 200);
    let ep = s.endpoint.clone();
    let id = ep
        .strip_prefix("/mcp/demo/messages?sessionId=")
        .unwrap()
        .to_string();
    assert!(
        id.len() > 32,
        "the id is sealed with the replica's address: {id}"
    );

    // Every message through the other replica; every answer on the stream at `a`.
    assert_eq!(post(&b, &ep, &initialize(1), &[]).await.status, 202);
    assert_eq!(s.message().await["id"], 1);
    let call = json!({"jsonrpc":"2.0","id":2,"method":"tools/call",
        "params":{"name":"echo","arguments":{"text":"via b"}}});
    assert_eq!(post(&b, &ep, &call.to_string(), &[]).await.status, 202);
    let m = s.message().await;
    assert_eq!(m["result"]["content"][0]["text"], "via b", "{m}");
    // The owner's refusals come back as it gave them.
    let bad = post(&b, &ep, "not json", &[]).await;
    assert_eq!((bad.status, bad.code()), (400, -32700), "{:?}", bad.body);

    let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    let marked = post(&b, &ep, note, &[("portico-forwarded", "1")]).await;
    assert_eq!(
        marked.status, 404,
        "a forwarded POST is not forwarded again"
    );
    let mut tampered = id.clone().into_bytes();
    tampered[20] = if tampered[20] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    let forged = post(
        &b,
        &format!("/mcp/demo/messages?sessionId={tampered}"),
        note,
        &[],
    )
    .await;
    assert_eq!(forged.status, 404);

    // The stream goes: the owner says so, through the other replica too.
    drop(s);
    let end = Instant::now() + Duration::from_secs(5);
    while post(&b, &ep, note, &[]).await.status != 404 {
        assert!(Instant::now() < end, "the session outlived its stream");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.stop().await;
    b.stop().await;
}
