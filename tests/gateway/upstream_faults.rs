//! Strict upstream framing (README "Security model", upstream answers): every broken answer
//! from a backend is the backend's fault — a 502 with a JSON-RPC error naming it while no head
//! has gone to the client, and a stream that visibly breaks (an error event, or an aborted
//! body) once one has. Never a 200 that looks complete. The backend is a raw socket that
//! writes exactly the bytes each test names.

use crate::common::*;
use crate::upstream_h1::read_request;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

/// How the backend breaks its answer.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    /// A chunked answer whose first chunk size is `ZZZZ`.
    ChunkSizeZzzz,
    /// A chunk size too large for 64 bits.
    ChunkSizeOverflow,
    /// A valid chunk (half of a JSON response), a `ZZZZ` chunk-size line, then the other half
    /// as a valid chunk and the last chunk: skipping the bad line would yield a clean answer.
    ChunkSizeZzzzBetween,
    /// `content-length: 100`, 40 bytes, close.
    TruncatedLength,
    /// 200 `application/json` whose body is HTML.
    InvalidJson,
    /// 200 with a Content-Length that matches a JSON text cut short.
    TruncatedJson,
    /// 200 with a JSON notification where the response should be.
    NotAResponse,
    /// 200 with a response whose result is broken deep inside (a trailing comma in an item):
    /// only a reading of the whole answer finds it.
    InvalidInsideResult,
    /// 200 with a response that has two results.
    TwoResults,
    /// 200 with an empty body to a request.
    Empty200,
    /// An SSE answer that ends cleanly without any event.
    SseEmpty,
    /// An SSE answer with a progress notification, then a clean end: no response.
    SseNoResponse,
    /// An SSE event whose data is JSON cut short.
    SseTruncatedEvent,
    /// An SSE event larger than `max_answer_bytes` (64 KiB in [`config`]).
    SseHugeEvent,
    /// A JSON response larger than `max_answer_bytes`.
    HugeJson,
    /// Status 999.
    Status999,
    /// `102 Processing` interim answers, as fast as the socket takes them, forever.
    InterimFlood,
    /// A chunked JSON answer that sends one byte every 50 ms, forever.
    Trickle,
    /// SSE: a complete notification event, then the connection closes mid-body.
    SseBreaksBetweenEvents,
    /// SSE: half an event, then the connection closes mid-body.
    SseBreaksMidEvent,
    /// Sessions open and calls are answered, but a long-lived stream (a `subscriptions/listen`
    /// POST, a session's GET stream) gets no answer at all, not even a head.
    SilentStreams,
}

/// The longest a backend here keeps a connection open or keeps writing.
const BACKEND_BOUND: Duration = Duration::from_secs(10);

struct Backend {
    url: String,
    /// Requests read, on every connection.
    requests: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn backend(fault: Fault) -> Backend {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let requests = Arc::new(AtomicUsize::new(0));
    let counter = requests.clone();
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let serve = serve(tcp, fault, counter.clone());
            tokio::spawn(tokio::time::timeout(BACKEND_BOUND, serve));
        }
    });
    Backend {
        url,
        requests,
        task,
    }
}

fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

const JSON_HEAD: &str = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n";
const SSE_HEAD: &str =
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";

fn with_length(body: &[u8]) -> Vec<u8> {
    let mut out = format!("{JSON_HEAD}content-length: {}\r\n\r\n", body.len()).into_bytes();
    out.extend_from_slice(body);
    out
}

async fn serve(mut tcp: TcpStream, fault: Fault, requests: Arc<AtomicUsize>) {
    let mut buf = Vec::new();
    while let Some(body) = read_request(&mut tcp, &mut buf).await {
        requests.fetch_add(1, Ordering::SeqCst);
        let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let id = &req["id"];
        let stream = body.is_empty() || req["method"] == "subscriptions/listen";
        if fault == Fault::SilentStreams && stream {
            tokio::time::sleep(BACKEND_BOUND).await;
            return;
        }
        // An initialize-era session (backend `old`) opens cleanly; what follows is broken.
        let opening = match req["method"].as_str() {
            Some("initialize") => Some(with_length(
                json!({"jsonrpc": "2.0", "id": id, "result": {
                    "protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                    "serverInfo": {"name": "faulty", "version": "1"}}})
                .to_string()
                .as_bytes(),
            )),
            Some("notifications/initialized") => {
                Some(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n".to_vec())
            }
            _ => None,
        };
        if let Some(wire) = opening {
            if tcp.write_all(&wire).await.is_err() {
                return;
            }
            continue;
        }
        let response = json!({"jsonrpc": "2.0", "id": id, "result": {
            "resultType": "complete", "content": [], "tools": [], "ttlMs": 0}})
        .to_string();
        let progress = r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}"#;
        let chunked = format!("{JSON_HEAD}transfer-encoding: chunked\r\n\r\n").into_bytes();
        let wire: Vec<u8> = match fault {
            Fault::ChunkSizeZzzz => [chunked, b"ZZZZ\r\n{}\r\n0\r\n\r\n".to_vec()].concat(),
            Fault::ChunkSizeOverflow => {
                [chunked, b"fffffffffffffffff\r\n{}\r\n0\r\n\r\n".to_vec()].concat()
            }
            Fault::ChunkSizeZzzzBetween => {
                let (a, b) = response.as_bytes().split_at(response.len() / 2);
                [
                    chunked,
                    chunk(a),
                    b"ZZZZ\r\n".to_vec(),
                    chunk(b),
                    b"0\r\n\r\n".to_vec(),
                ]
                .concat()
            }
            Fault::TruncatedLength => {
                let mut w = format!("{JSON_HEAD}content-length: 100\r\n\r\n").into_bytes();
                w.extend_from_slice(&response.as_bytes()[..40]);
                let _ = tcp.write_all(&w).await;
                return; // closes
            }
            Fault::InvalidJson => with_length(b"<html><body>oops</body></html>"),
            Fault::TruncatedJson => with_length(&response.as_bytes()[..response.len() - 7]),
            Fault::NotAResponse => with_length(progress.as_bytes()),
            Fault::InvalidInsideResult => with_length(
                format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"tools":[{{"name":"t",}}]}}}}"#)
                    .as_bytes(),
            ),
            Fault::TwoResults => with_length(
                format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"tools":[]}},"result":{{}}}}"#)
                    .as_bytes(),
            ),
            Fault::Empty200 => with_length(b""),
            Fault::SseEmpty => [SSE_HEAD.as_bytes(), b"0\r\n\r\n"].concat(),
            Fault::SseNoResponse => [
                SSE_HEAD.as_bytes().to_vec(),
                chunk(format!("event: message\ndata: {progress}\n\n").as_bytes()),
                b"0\r\n\r\n".to_vec(),
            ]
            .concat(),
            Fault::SseTruncatedEvent => [
                SSE_HEAD.as_bytes().to_vec(),
                chunk(format!("data: {}\n\n", &response[..response.len() - 7]).as_bytes()),
                b"0\r\n\r\n".to_vec(),
            ]
            .concat(),
            Fault::SseHugeEvent => {
                let big = json!({"jsonrpc": "2.0", "id": id,
                    "result": {"content": [{"type": "text", "text": "x".repeat(200_000)}]}});
                [
                    SSE_HEAD.as_bytes().to_vec(),
                    chunk(format!("data: {big}\n\n").as_bytes()),
                    b"0\r\n\r\n".to_vec(),
                ]
                .concat()
            }
            Fault::HugeJson => {
                let big = json!({"jsonrpc": "2.0", "id": id,
                    "result": {"content": [{"type": "text", "text": "x".repeat(200_000)}]}});
                with_length(big.to_string().as_bytes())
            }
            Fault::Status999 => {
                let mut w = b"HTTP/1.1 999 Whatever\r\ncontent-type: application/json\r\n".to_vec();
                w.extend_from_slice(
                    format!("content-length: {}\r\n\r\n", response.len()).as_bytes(),
                );
                w.extend_from_slice(response.as_bytes());
                w
            }
            Fault::InterimFlood => {
                let flood = b"HTTP/1.1 102 Processing\r\n\r\n".repeat(1000);
                while tcp.write_all(&flood).await.is_ok() {}
                return;
            }
            Fault::SilentStreams => with_length(response.as_bytes()),
            Fault::Trickle => {
                if tcp.write_all(&chunked).await.is_err() {
                    return;
                }
                while tcp.write_all(b"1\r\n \r\n").await.is_ok() {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                return;
            }
            Fault::SseBreaksBetweenEvents | Fault::SseBreaksMidEvent => {
                let event = format!("event: message\ndata: {progress}\n\n");
                let part = if fault == Fault::SseBreaksMidEvent {
                    &event[..event.len() / 2]
                } else {
                    &event[..]
                };
                let w = [SSE_HEAD.as_bytes(), &chunk(part.as_bytes())].concat();
                let _ = tcp.write_all(&w).await;
                return; // closes without the last chunk
            }
        };
        if tcp.write_all(&wire).await.is_err() {
            return;
        }
    }
}

/// `raw`: the message path — a `tools/list` through the cache (on by default), a `tools/call`
/// through the aggregated endpoint `/agg` (portico writes the member's body, and reads and
/// holds its answer); `pass`: pass-through; `judged`: `verify_body = "always"`, every body read
/// and checked against its headers, then forwarded as judged and its answer relayed; `old`: the
/// same server bridged as an initialize-era one.
fn config(url: &str) -> String {
    format!(
        r#"
[log]
access = false

[[backends]]
name = "raw"
url = "{url}"
protocol = "modern"
timeout_ms = 3000
max_answer_bytes = 65536

[[backends]]
name = "pass"
url = "{url}"
protocol = "modern"
timeout_ms = 1500

[[backends]]
name = "judged"
url = "{url}"
protocol = "modern"
verify_body = "always"
timeout_ms = 1500

[[backends]]
name = "old"
url = "{url}"
protocol = "legacy"
timeout_ms = 3000

[[endpoints]]
path = "/agg"
backends = ["raw"]
"#
    )
}

async fn call(gw: &Gateway, backend: &str, method: &str) -> Resp {
    let params = match method {
        "tools/call" => json!({"name": "t", "arguments": {}}),
        _ => json!({}),
    };
    mcp(
        &gw.url(&format!("/mcp/{backend}")),
        json!(1),
        method,
        params,
    )
    .await
}

/// `method` to `raw` on the message path (see [`config`]).
async fn call_message_path(gw: &Gateway, method: &str) -> Resp {
    match method {
        "tools/call" => {
            let params = json!({"name": "raw__t", "arguments": {}});
            mcp(&gw.url("/agg"), json!(1), method, params).await
        }
        _ => call(gw, "raw", method).await,
    }
}

/// A 502 whose JSON-RPC error (with the request's id) names `backend` and says `why`.
fn assert_502(r: &Resp, backend: &str, why: &str, case: &str) {
    let body = String::from_utf8_lossy(&r.body);
    assert_eq!(r.status, 502, "{case}: {body}");
    let v = r.json();
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.starts_with(&format!("backend {backend} ")) && msg.contains(why),
        "{case}: {msg}"
    );
    assert_eq!(v["error"]["code"], -32603, "{case}");
    assert_eq!(v["id"], 1, "{case}");
}

/// Every framing fault on the message path (a body portico reads and holds: a checked
/// `tools/call`, a cacheable `tools/list`) is a 502 naming the backend, and says what broke.
#[tokio::test]
async fn broken_answers_on_the_message_path_are_502_naming_the_backend() {
    for (fault, why) in [
        (Fault::ChunkSizeZzzz, "chunked"),
        (Fault::ChunkSizeOverflow, "chunked"),
        (Fault::ChunkSizeZzzzBetween, "chunked"),
        (Fault::TruncatedLength, "closed before the answer ended"),
        (Fault::InvalidJson, "not valid JSON"),
        (Fault::TruncatedJson, "truncated JSON"),
        (Fault::NotAResponse, "not a JSON-RPC response"),
        (Fault::InvalidInsideResult, "not valid JSON"),
        (Fault::TwoResults, "not a JSON-RPC message"),
        (Fault::Empty200, "empty"),
        (Fault::SseEmpty, "without a response"),
        (Fault::SseTruncatedEvent, "SSE event is truncated JSON"),
        (Fault::SseHugeEvent, "max_answer_bytes (65536 bytes)"),
        (Fault::HugeJson, "max_answer_bytes (65536 bytes)"),
        (Fault::Status999, "bad status 999"),
        (Fault::InterimFlood, "interim"),
    ] {
        let backend = backend(fault).await;
        let gw = Gateway::start(&config(&backend.url)).await;
        for method in ["tools/call", "tools/list"] {
            let started = Instant::now();
            let r = call_message_path(&gw, method).await;
            assert_502(&r, "raw", why, &format!("{fault:?}, {method}"));
            // Found from the bytes, not by waiting for the deadline (3 s).
            assert!(
                started.elapsed() < Duration::from_millis(2500),
                "{fault:?}, {method}: took {:?}",
                started.elapsed()
            );
        }
        gw.stop().await;
    }
}

/// A team tool policy judges a `tools/call` on its parsed name; an allowed call then goes on as
/// the bytes judged and its answer is relayed, while a `tools/list` under the policy is still
/// read (its answer is filtered) — so the same broken answer is relayed to the one and a 502
/// for the other.
#[tokio::test]
async fn a_call_a_policy_allowed_is_relayed_and_its_list_is_read() {
    const KEY: &str = "policy-relay-key-0123456789";
    let backend = backend(Fault::InvalidJson).await;
    let gw = Gateway::start(&format!(
        r#"
[log]
access = false

# Off, so that only the policy keeps a `tools/list` on the message path.
[cache]
enabled = false

[auth]
mode = "api_keys"
[[auth.api_keys]]
key_file = "{key}"
principal = "ann"
team = "ops"
[[auth.teams]]
name = "ops"
tools = {{ allow = ["t"] }}

[[backends]]
name = "pass"
url = "{url}"
protocol = "modern"
timeout_ms = 1500
"#,
        key = secret_file("policy-relay", KEY).display(),
        url = backend.url
    ))
    .await;
    let auth = format!("Bearer {KEY}");
    let url = gw.url("/mcp/pass");
    let with = |name: &str| json!({"name": name, "arguments": {}});
    let h = [("authorization", auth.as_str())];
    let r = mcp_with(&url, json!(1), "tools/call", with("t"), &h).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body, b"<html><body>oops</body></html>".as_slice());
    let asked = backend.requests.load(Ordering::SeqCst);
    let r = mcp_with(&url, json!(2), "tools/call", with("secret"), &h).await;
    assert_eq!(r.status, 403, "{:?}", r.body);
    assert_eq!(
        backend.requests.load(Ordering::SeqCst),
        asked,
        "a denied call goes nowhere"
    );
    let r = mcp_with(&url, json!(1), "tools/list", json!({}), &h).await;
    assert_502(&r, "pass", "not valid JSON", "a list under a policy");
    gw.stop().await;
}

/// A bridged call's JSON answer is checked in the reading that translates it
/// (`AnswerCheck::Caller`), with the upstream's words: every broken answer is still a 502
/// naming the backend, never a 200 carrying it.
#[tokio::test]
async fn broken_bridged_answers_are_502_naming_the_backend() {
    for (fault, why) in [
        (Fault::InvalidJson, "not valid JSON"),
        (Fault::TruncatedJson, "truncated JSON"),
        (Fault::NotAResponse, "not a JSON-RPC response"),
        (Fault::InvalidInsideResult, "not valid JSON"),
        (Fault::TwoResults, "not a JSON-RPC message"),
        (Fault::Empty200, "empty"),
        (Fault::ChunkSizeZzzz, "chunked"),
    ] {
        let backend = backend(fault).await;
        let gw = Gateway::start(&config(&backend.url)).await;
        let r = call(&gw, "old", "tools/call").await;
        assert_502(&r, "old", why, &format!("{fault:?}, bridged"));
        gw.stop().await;
    }
}

/// With the cache off an aggregated list reads each member's answer once, whole
/// (`AnswerCheck::Caller`), instead of the upstream checking it first: whatever the upstream
/// would have refused is still the member's failure — a 502 naming it (`failure_mode =
/// "closed"`), the member left out (`"open"`) — and counts on its breaker, which opens after
/// `breaker_failures` and keeps the member from being asked. With the cache on (the upstream
/// checks each answer before the cache keeps it) the same holds, in the upstream's words.
#[tokio::test]
async fn broken_list_answers_of_an_aggregate_member_are_its_failure() {
    let aggregate = |url: &str, mode: &str, cache: bool| {
        format!(
            r#"
[log]
access = false

[cache]
enabled = {cache}

[[backends]]
name = "raw"
url = "{url}"
protocol = "modern"
timeout_ms = 3000
breaker_failures = 3
breaker_open_ms = 60000

[[backends]]
name = "demo"
builtin = "demo"

[[endpoints]]
path = "/mcp"
backends = ["raw", "demo"]
failure_mode = "{mode}"
"#
        )
    };
    for (fault, why) in [
        (Fault::InvalidJson, "not a valid JSON-RPC response"),
        (Fault::TruncatedJson, "not a valid JSON-RPC response"),
        (Fault::NotAResponse, "not a valid JSON-RPC response"),
        (Fault::InvalidInsideResult, "not a valid JSON-RPC response"),
        (Fault::TwoResults, "not a valid JSON-RPC response"),
        (Fault::Empty200, "empty"),
        (Fault::ChunkSizeZzzz, "chunked"),
    ] {
        for cache in [false, true] {
            let case = format!("{fault:?}, cache {cache}");
            let why = if cache { "" } else { why };
            let backend = backend(fault).await;
            let closed = Gateway::start(&aggregate(&backend.url, "closed", cache)).await;
            let r = mcp(&closed.url("/mcp"), json!(1), "tools/list", json!({})).await;
            assert_502(&r, "raw", why, &format!("{case}, closed"));
            closed.stop().await;

            let open = Gateway::start(&aggregate(&backend.url, "open", cache)).await;
            let asked = backend.requests.load(Ordering::SeqCst);
            for n in 0..5 {
                let r = mcp(&open.url("/mcp"), json!(n), "tools/list", json!({})).await;
                assert_eq!(r.status, 200, "{case}, open: {:?}", r.body);
                let tools = r.json()["result"]["tools"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                assert!(!tools.is_empty(), "{case}: the demo member's tools");
                assert!(
                    tools
                        .iter()
                        .all(|t| !t["name"].as_str().unwrap().starts_with("raw")),
                    "{case}: {tools:?}"
                );
                assert_eq!(r.json()["result"]["ttlMs"], 0, "{case}: a partial list");
            }
            assert_eq!(
                backend.requests.load(Ordering::SeqCst) - asked,
                3,
                "{case}: the breaker opens after 3 failures and the member is not asked again"
            );
            open.stop().await;
        }
    }
}

/// An SSE answer that ends without its response: a 502 when the client has had nothing yet
/// (a cacheable list waits for the response); after a streamed notification the head is out,
/// so the stream ends with a JSON-RPC error event naming the backend, never silently.
#[tokio::test]
async fn an_sse_answer_without_its_response_is_an_error() {
    let backend = backend(Fault::SseNoResponse).await;
    let gw = Gateway::start(&config(&backend.url)).await;
    let r = call_message_path(&gw, "tools/list").await;
    assert_502(&r, "raw", "without a response", "tools/list");
    let r = call_message_path(&gw, "tools/call").await;
    assert_eq!(r.status, 200);
    assert!(r.is_sse());
    let msgs = r.messages();
    assert_eq!(msgs.len(), 2, "{msgs:?}");
    assert_eq!(msgs[0]["method"], "notifications/progress");
    assert_eq!(msgs[1]["id"], 1);
    let msg = msgs[1]["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.starts_with("backend raw ") && msg.contains("without a response"),
        "{msg}"
    );
    gw.stop().await;
}

/// On pass-through (and for a judged body, relayed the same way) the answer head goes to the
/// client once its status and the framing that came with it are checked: a bad status or a bad
/// first chunk size is still a 502.
#[tokio::test]
async fn pass_through_refuses_a_bad_status_or_first_chunk_with_502() {
    for (fault, why) in [
        (Fault::Status999, "bad status 999"),
        (Fault::ChunkSizeZzzz, "chunked"),
        (Fault::ChunkSizeOverflow, "chunked"),
        (Fault::InterimFlood, "interim"),
    ] {
        let backend = backend(fault).await;
        let gw = Gateway::start(&config(&backend.url)).await;
        for name in ["pass", "judged"] {
            let r = call(&gw, name, "tools/call").await;
            assert_502(&r, name, why, &format!("{fault:?}, {name}"));
        }
        gw.stop().await;
    }
}

/// `verify_body = "always"` judges the request, not the answer: once the body has been read
/// and checked against its headers, the bytes judged go to the backend and its answer comes
/// back as a pass-through's does, as the backend wrote it — where the message path, which
/// reads and holds the answer, refuses the same bytes.
#[tokio::test]
async fn a_judged_request_has_its_answer_relayed() {
    let backend = backend(Fault::InvalidJson).await;
    let gw = Gateway::start(&config(&backend.url)).await;
    let r = call(&gw, "judged", "tools/call").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body, b"<html><body>oops</body></html>".as_slice());
    let r = call_message_path(&gw, "tools/call").await;
    assert_502(&r, "raw", "not valid JSON", "the message path");
    // Still judged first: a header the body contradicts never reaches the backend.
    let asked = backend.requests.load(Ordering::SeqCst);
    let body = modern_body(
        json!(2),
        "tools/call",
        json!({"name": "t", "arguments": {}}),
    );
    let r = send(
        "POST",
        &gw.url("/mcp/judged"),
        &modern_headers("tools/call", Some("other")),
        body,
    )
    .await;
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(backend.requests.load(Ordering::SeqCst), asked);
    gw.stop().await;
}

/// Reads a relayed body to its end: `Ok` with the bytes for a clean end, `Err` for a body
/// that broke off (what a client must see when a relayed answer is cut).
async fn read_relayed(gw: &Gateway, name: &str) -> (u16, Result<Vec<u8>, String>, Duration) {
    let started = Instant::now();
    let body = modern_body(
        json!(1),
        "tools/call",
        json!({"name": "t", "arguments": {}}),
    );
    let resp = send_stream(
        "POST",
        &gw.url(&format!("/mcp/{name}")),
        &modern_headers("tools/call", Some("t")),
        body,
    )
    .await;
    let status = resp.status().as_u16();
    let got = tokio::time::timeout(Duration::from_secs(8), resp.into_body().collect())
        .await
        .expect("the relayed body ends within 8 s")
        .map(|c| c.to_bytes().to_vec())
        .map_err(|e| e.to_string());
    (status, got, started.elapsed())
}

/// Once the head is out, a relayed answer that breaks is seen to break: a JSON body cut short
/// (Content-Length not reached, a bad chunk size after data) ends in an error at the client,
/// never a clean end.
#[tokio::test]
async fn a_relayed_answer_that_breaks_after_its_head_is_aborted() {
    for fault in [Fault::TruncatedLength, Fault::ChunkSizeZzzzBetween] {
        let backend = backend(fault).await;
        let gw = Gateway::start(&config(&backend.url)).await;
        for name in ["pass", "judged"] {
            let (status, got, _) = read_relayed(&gw, name).await;
            assert_eq!(status, 200, "{fault:?}, {name}");
            assert!(got.is_err(), "{fault:?}, {name}: a clean end: {got:?}");
        }
        gw.stop().await;
    }
}

/// A relayed SSE stream that breaks between events ends with a JSON-RPC error event naming
/// the backend; one that breaks mid-event is aborted, since an event appended to half an event
/// would merge into it.
#[tokio::test]
async fn a_relayed_sse_stream_that_breaks_ends_with_an_error_event_or_an_abort() {
    let between = backend(Fault::SseBreaksBetweenEvents).await;
    let gw = Gateway::start(&config(&between.url)).await;
    let (status, got, _) = read_relayed(&gw, "pass").await;
    assert_eq!(status, 200);
    let text = String::from_utf8(got.expect("a clean end after the error event")).unwrap();
    let events: Vec<Value> = text
        .split("\n\n")
        .filter_map(|ev| ev.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|d| serde_json::from_str(d).expect("every event is whole JSON"))
        .collect();
    assert_eq!(events.len(), 2, "{text}");
    assert_eq!(events[1]["id"], 1);
    let msg = events[1]["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.starts_with("backend pass "), "{msg}");
    gw.stop().await;

    let mid = backend(Fault::SseBreaksMidEvent).await;
    let gw = Gateway::start(&config(&mid.url)).await;
    let (status, got, _) = read_relayed(&gw, "pass").await;
    assert_eq!(status, 200);
    assert!(got.is_err(), "a clean end: {got:?}");
    gw.stop().await;
}

/// A body that trickles past the deadline is cut at `timeout_ms` (1500 ms).
#[tokio::test]
async fn a_trickling_relay_is_cut_at_the_deadline() {
    let backend = backend(Fault::Trickle).await;
    let gw = Gateway::start(&config(&backend.url)).await;
    let (status, got, took) = read_relayed(&gw, "pass").await;
    assert_eq!(status, 200);
    assert!(got.is_err(), "a clean end: {got:?}");
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_millis(3000),
        "cut after {took:?}"
    );
    gw.stop().await;
}

/// Requests that queue behind the probe of an `auto` backend that never answers fail with that
/// probe: each does not probe again in its turn (k requests once waited k × `timeout_ms`, before
/// admission or the breaker). Counted as the connections the black hole accepts.
#[tokio::test]
async fn requests_queued_behind_a_failed_probe_fail_with_it() {
    let hole = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = hole.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    let keeper = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = hole.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            held.push(tcp); // read nothing, answer nothing
        }
    });
    let gw = Gateway::start(&format!(
        "[log]\naccess = false\n[[backends]]\nname = \"b\"\nurl = \"http://{addr}/mcp\"\n\
         timeout_ms = 300\nretries = 0\n"
    ))
    .await;
    let before = accepted.load(Ordering::SeqCst);
    let calls = (0..5).map(|i| {
        let url = gw.url("/mcp/b");
        async move {
            mcp(&url, json!(i), "tools/call", json!({"name": "echo"}))
                .await
                .status
        }
    });
    let statuses = futures_util::future::join_all(calls).await;
    assert!(statuses.iter().all(|s| *s >= 500), "{statuses:?}");
    let probes = accepted.load(Ordering::SeqCst) - before;
    assert!(probes <= 1, "{probes} probes for 5 queued requests");
    gw.stop().await;
    keeper.abort();
}

/// A long-lived stream's answer may run for hours, but its head is due within `timeout_ms`
/// like any other: a backend that never answers a `subscriptions/listen` (passed through, or
/// bridged to an initialize-era session's GET stream) is a 504 after `timeout_ms`, and a legacy
/// client's GET stream opens without the change notifications it cannot have. Each waited up
/// to the stream's 24-hour lifetime before, holding the request's admission slot.
#[tokio::test]
async fn a_stream_whose_head_never_comes_fails_after_timeout_ms() {
    let backend = backend(Fault::SilentStreams).await;
    let gw = Gateway::start(&format!(
        "[log]\naccess = false\n\
         [[backends]]\nname = \"new\"\nurl = \"{url}\"\nprotocol = \"modern\"\ntimeout_ms = 400\n\
         [[backends]]\nname = \"old\"\nurl = \"{url}\"\nprotocol = \"legacy\"\ntimeout_ms = 400\n",
        url = backend.url
    ))
    .await;
    let filter = json!({"notifications": {"toolsListChanged": true}});
    for name in ["new", "old"] {
        let url = gw.url(&format!("/mcp/{name}"));
        let started = Instant::now();
        let r = tokio::time::timeout(
            Duration::from_secs(5),
            mcp(&url, json!(7), "subscriptions/listen", filter.clone()),
        )
        .await
        .unwrap_or_else(|_| panic!("{name}: no answer to a listen within 5 s"));
        let took = started.elapsed();
        assert_eq!(r.status, 504, "{name}: {:?}", r.body);
        assert_eq!(r.json()["id"], 7, "{name}");
        assert!(took >= Duration::from_millis(350), "{name}: {took:?}");
    }
    // A legacy client's GET stream on the bridged backend: opened without change notifications.
    let url = gw.url("/mcp/old");
    let (c, _) = crate::legacy::OldClient::connect(&url, "2025-06-18").await;
    let headers = [
        ("mcp-session-id", c.sid.as_str()),
        ("accept", "text/event-stream"),
    ];
    let opened = tokio::time::timeout(
        Duration::from_secs(5),
        send_stream("GET", &url, &headers, ""),
    )
    .await
    .expect("the GET stream's head within 5 s");
    assert_eq!(opened.status(), 200);
    assert_eq!(opened.headers()["content-type"], "text/event-stream");
    drop(opened);
    gw.stop().await;
}
