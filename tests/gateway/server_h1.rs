//! The lean HTTP/1.1 server connection (`src/server/h1/`), seen from a raw TCP client:
//! pipelining, keep-alive, the hand-offs to hyper (HTTP/1.0, chunked bodies, `Expect`), the
//! refusals it writes itself (400, 408, 431), its timeouts, HEAD, the drain and a client that
//! goes away. Every test speaks bytes over a real socket to a real gateway, since the framing
//! on the wire is what is under test.

use serde_json::{Value, json};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::common::mock::MockMcp;
use crate::common::{Gateway, modern_body, modern_headers, name_of};

/// How long any single read may wait before the test fails.
const READ_WITHIN: Duration = Duration::from_secs(5);

fn demo(server: &str) -> String {
    format!(
        "[log]\naccess = false\n[server]\n{server}\n[[backends]]\nname = \"demo\"\nbuiltin = \"demo\"\n"
    )
}

fn mock_config(url: &str, server: &str) -> String {
    format!(
        "[log]\naccess = false\n[server]\n{server}\n[[backends]]\nname = \"m\"\nurl = \"{url}\"\nprotocol = \"modern\"\n"
    )
}

/// A complete 2026-07-28 POST as raw bytes; `extra` is header lines, each ending in CRLF.
fn post_to(path: &str, id: u64, method: &str, params: Value, extra: &str) -> Vec<u8> {
    let name = name_of(method, &params);
    let body = modern_body(json!(id), method, params);
    let mut head = format!("POST {path} HTTP/1.1\r\nhost: portico\r\n");
    for (k, v) in modern_headers(method, name.as_deref()) {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!("content-length: {}\r\n{extra}\r\n", body.len()));
    let mut out = head.into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

/// `tools/call echo` on the demo backend.
fn echo(id: u64, text: &str, extra: &str) -> Vec<u8> {
    post_to(
        "/mcp/demo",
        id,
        "tools/call",
        json!({"name": "echo", "arguments": {"text": text}}),
        extra,
    )
}

/// One response as it came off the wire.
#[derive(Debug)]
struct Raw {
    version: String,
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Raw {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn count(&self, name: &str) -> usize {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .count()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    fn closes(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }

    /// The echoed text of a successful `tools/call echo`.
    fn echoed(&self) -> String {
        self.json()["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("no echo in {:?}", self.json()))
            .to_string()
    }
}

/// A raw client connection with its own read buffer (bytes past one response are kept for the
/// next, as pipelining needs).
struct Conn {
    tcp: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    async fn open(addr: SocketAddr) -> Conn {
        Conn {
            tcp: TcpStream::connect(addr).await.expect("connect"),
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.tcp.write_all(bytes).await.expect("write");
    }

    /// One read into the buffer; 0 at end of stream. Fails the test after `READ_WITHIN`.
    async fn fill(&mut self) -> usize {
        let mut chunk = [0u8; 16 * 1024];
        let n = tokio::time::timeout(READ_WITHIN, self.tcp.read(&mut chunk))
            .await
            .expect("the server answered in time")
            .expect("read");
        self.buf.extend_from_slice(&chunk[..n]);
        n
    }

    /// Reads until `pat` is in the buffer; returns where it ends.
    async fn until(&mut self, pat: &[u8]) -> usize {
        loop {
            if let Some(i) = self.buf.windows(pat.len()).position(|w| w == pat) {
                return i + pat.len();
            }
            assert!(
                self.fill().await > 0,
                "connection closed before {:?}; got {:?}",
                String::from_utf8_lossy(pat),
                String::from_utf8_lossy(&self.buf)
            );
        }
    }

    /// Reads and removes one response head.
    async fn head(&mut self) -> Raw {
        let end = self.until(b"\r\n\r\n").await;
        let text = String::from_utf8(self.buf.drain(..end).collect()).expect("ASCII head");
        let mut lines = text.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or_default().to_string();
        let status = parts
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
        let headers = lines
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (k, v) = l
                    .split_once(':')
                    .unwrap_or_else(|| panic!("bad header line {l:?}"));
                (k.trim().to_ascii_lowercase(), v.trim().to_string())
            })
            .collect();
        Raw {
            version,
            status,
            headers,
            body: Vec::new(),
        }
    }

    /// Reads and removes one whole response, framed as its head says.
    async fn response(&mut self) -> Raw {
        let mut r = self.head().await;
        if r.status < 200 || r.status == 204 || r.status == 304 {
            return r;
        }
        if r.header("transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
        {
            r.body = self.chunked().await;
        } else if let Some(len) = r.header("content-length") {
            let len: usize = len.parse().expect("numeric content-length");
            while self.buf.len() < len {
                assert!(self.fill().await > 0, "body cut short");
            }
            r.body = self.buf.drain(..len).collect();
        } else {
            // Delimited by the close.
            while self.fill().await > 0 {}
            r.body = std::mem::take(&mut self.buf);
        }
        r
    }

    async fn chunked(&mut self) -> Vec<u8> {
        let mut body = Vec::new();
        loop {
            let end = self.until(b"\r\n").await;
            let line = String::from_utf8(self.buf.drain(..end).collect()).expect("size line");
            let hex = line.trim_end().split(';').next().unwrap_or_default();
            let size = usize::from_str_radix(hex.trim(), 16)
                .unwrap_or_else(|_| panic!("bad chunk size {line:?}"));
            while self.buf.len() < size + 2 {
                assert!(self.fill().await > 0, "chunk cut short");
            }
            body.extend(self.buf.drain(..size));
            let crlf: Vec<u8> = self.buf.drain(..2).collect();
            assert_eq!(crlf, b"\r\n", "chunk not followed by CRLF");
            if size == 0 {
                return body;
            }
        }
    }

    /// Waits for the server to close the connection; `None` if it is still open after `within`.
    /// Returns the time it took and any bytes that came first.
    async fn closed_within(&mut self, within: Duration) -> Option<(Duration, Vec<u8>)> {
        let start = Instant::now();
        let mut chunk = [0u8; 4096];
        let mut got = std::mem::take(&mut self.buf);
        let done = tokio::time::timeout(within, async {
            loop {
                match self.tcp.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => got.extend_from_slice(&chunk[..n]),
                }
            }
        })
        .await;
        done.ok().map(|()| (start.elapsed(), got))
    }
}

/// A refusal the lean loop writes itself: the status, a JSON-RPC error without an id, and a
/// close.
async fn assert_refused(c: &mut Conn, status: u16, what: &str) {
    let r = c.response().await;
    assert_eq!(r.status, status, "{what}: {r:?}");
    assert!(r.closes(), "{what}: no connection: close in {r:?}");
    assert_eq!(r.header("content-type"), Some("application/json"), "{what}");
    let body = r.json();
    assert_eq!(body["jsonrpc"], "2.0", "{what}");
    assert_eq!(body["error"]["code"], -32600, "{what}: {body}");
    assert!(
        body.get("id").is_none(),
        "{what}: the id must be absent: {body}"
    );
    let closed = c.closed_within(Duration::from_secs(2)).await;
    let (_, extra) = closed.unwrap_or_else(|| panic!("{what}: the connection stayed open"));
    assert!(extra.is_empty(), "{what}: bytes after the refusal");
}

#[tokio::test]
async fn pipelined_requests_in_one_write_are_answered_in_order() {
    let gw = Gateway::start(&demo("")).await;
    let mut c = Conn::open(gw.addr).await;
    let mut both = echo(1, "first", "");
    both.extend_from_slice(&echo(2, "second", ""));
    c.send(&both).await;
    for (id, text) in [(1, "first"), (2, "second")] {
        let r = c.response().await;
        assert_eq!(r.version, "HTTP/1.1");
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.count("content-length"), 1, "{r:?}");
        assert_eq!(r.header("transfer-encoding"), None);
        assert_eq!(
            r.header("content-length").unwrap(),
            r.body.len().to_string()
        );
        assert!(!r.closes());
        assert_eq!(r.json()["id"], id);
        assert_eq!(r.echoed(), text);
    }
    // Nothing else came: the connection waits for a third request.
    assert!(c.buf.is_empty());
    gw.stop().await;
}

#[tokio::test]
async fn keep_alive_serves_sequential_requests_and_connection_close_ends_it() {
    let gw = Gateway::start(&demo("")).await;
    let mut c = Conn::open(gw.addr).await;
    for id in 1..=3 {
        c.send(&echo(id, &format!("n{id}"), "")).await;
        let r = c.response().await;
        assert_eq!(r.status, 200, "{r:?}");
        assert!(!r.closes(), "request {id} closed the connection");
        assert_eq!(r.json()["id"], id);
        assert_eq!(r.echoed(), format!("n{id}"));
    }
    c.send(&echo(4, "last", "connection: close\r\n")).await;
    let r = c.response().await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["id"], 4);
    assert!(r.closes(), "the answer must say it closes: {r:?}");
    let closed = c.closed_within(Duration::from_secs(2)).await;
    let (_, extra) = closed.expect("the server closed after `connection: close`");
    assert!(extra.is_empty());
    gw.stop().await;
}

#[tokio::test]
async fn an_http_1_0_request_is_answered_after_the_hand_off() {
    let gw = Gateway::start(&demo("")).await;
    let mut c = Conn::open(gw.addr).await;
    let req = String::from_utf8(echo(7, "old", "")).unwrap();
    c.send(req.replacen("HTTP/1.1", "HTTP/1.0", 1).as_bytes())
        .await;
    let r = c.response().await;
    assert!(r.version.starts_with("HTTP/1."), "{r:?}");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["id"], 7);
    assert_eq!(r.echoed(), "old");
    // HTTP/1.0 without keep-alive: one request per connection.
    assert!(
        c.closed_within(Duration::from_secs(2)).await.is_some(),
        "an HTTP/1.0 connection stayed open"
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_chunked_request_body_is_answered_after_the_hand_off() {
    let gw = Gateway::start(&demo("")).await;
    let mut c = Conn::open(gw.addr).await;
    let body = modern_body(
        json!(5),
        "tools/call",
        json!({"name": "echo", "arguments": {"text": "in pieces"}}),
    );
    let mut req = String::from("POST /mcp/demo HTTP/1.1\r\nhost: portico\r\n");
    for (k, v) in modern_headers("tools/call", Some("echo")) {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("transfer-encoding: chunked\r\n\r\n");
    let (a, b) = body.split_at(body.len() / 2);
    for part in [a, b] {
        req.push_str(&format!("{:x}\r\n{part}\r\n", part.len()));
    }
    req.push_str("0\r\n\r\n");
    c.send(req.as_bytes()).await;
    let r = c.response().await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["id"], 5);
    assert_eq!(r.echoed(), "in pieces");
    // hyper keeps the connection: a second request on it is served too.
    c.send(&echo(6, "after", "")).await;
    let r = c.response().await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["id"], 6);
    gw.stop().await;
}

#[tokio::test]
async fn expect_100_continue_gets_100_then_the_answer() {
    let gw = Gateway::start(&demo("")).await;
    let mut c = Conn::open(gw.addr).await;
    let req = echo(8, "expected", "expect: 100-continue\r\n");
    let split = req.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    // The head alone: the body is sent only once the server asks for it.
    c.send(&req[..split]).await;
    let cont = c.head().await;
    assert_eq!(cont.status, 100, "{cont:?}");
    assert!(
        c.buf.is_empty(),
        "nothing after 100 Continue before the body"
    );
    c.send(&req[split..]).await;
    let r = c.response().await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["id"], 8);
    assert_eq!(r.echoed(), "expected");
    gw.stop().await;
}

#[tokio::test]
async fn a_malformed_head_is_refused_with_400() {
    let gw = Gateway::start(&demo("")).await;
    let body = modern_body(json!(1), "tools/list", json!({}));
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", b"GARBAGE\r\n\r\n".to_vec()),
        (
            "header line without a colon",
            b"POST /mcp/demo HTTP/1.1\r\nhost portico\r\n\r\n".to_vec(),
        ),
        (
            "space in a header name",
            b"POST /mcp/demo HTTP/1.1\r\nhost: portico\r\nbad name: x\r\n\r\n".to_vec(),
        ),
        (
            "conflicting content-length",
            format!(
                "POST /mcp/demo HTTP/1.1\r\nhost: portico\r\ncontent-length: {}\r\ncontent-length: {}\r\n\r\n{body}",
                body.len(),
                body.len() + 1
            )
            .into_bytes(),
        ),
        (
            "non-numeric content-length",
            b"POST /mcp/demo HTTP/1.1\r\nhost: portico\r\ncontent-length: 12abc\r\n\r\n".to_vec(),
        ),
        (
            "negative content-length",
            b"POST /mcp/demo HTTP/1.1\r\nhost: portico\r\ncontent-length: -1\r\n\r\n".to_vec(),
        ),
    ];
    for (what, bytes) in cases {
        let mut c = Conn::open(gw.addr).await;
        c.send(&bytes).await;
        assert_refused(&mut c, 400, what).await;
    }
    // Repeated but equal lengths are one length: served.
    let mut c = Conn::open(gw.addr).await;
    let req = String::from_utf8(post_to("/mcp/demo", 2, "tools/list", json!({}), "")).unwrap();
    let cl = format!("content-length: {}\r\n", body.len());
    c.send(req.replacen(&cl, &format!("{cl}{cl}"), 1).as_bytes())
        .await;
    let r = c.response().await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["id"], 2);
    gw.stop().await;
}

#[tokio::test]
async fn a_head_over_the_limits_is_refused_with_431() {
    let gw = Gateway::start(&demo("max_header_bytes = 2048")).await;
    // A complete head past max_header_bytes.
    let mut c = Conn::open(gw.addr).await;
    let big = format!("x-big: {}\r\n", "a".repeat(3000));
    c.send(&echo(1, "big", &big)).await;
    assert_refused(&mut c, 431, "head over max_header_bytes").await;
    // An unterminated head that keeps growing past the limit.
    let mut c = Conn::open(gw.addr).await;
    let endless = format!(
        "POST /mcp/demo HTTP/1.1\r\nhost: portico\r\nx-big: {}",
        "a".repeat(4000)
    );
    c.send(endless.as_bytes()).await;
    assert_refused(&mut c, 431, "unterminated head over max_header_bytes").await;
    // 101 header fields, well under the byte limit.
    let mut c = Conn::open(gw.addr).await;
    let mut head = String::from("POST /mcp/demo HTTP/1.1\r\n");
    for i in 0..101 {
        head.push_str(&format!("x-{i}: v\r\n"));
    }
    head.push_str("\r\n");
    assert!(head.len() < 2048);
    c.send(head.as_bytes()).await;
    assert_refused(&mut c, 431, "101 header fields").await;
    // 100 fields is still fine.
    let mut c = Conn::open(gw.addr).await;
    let mut extra = String::new();
    // echo() sends 7 fields (host, content-type, accept, three MCP headers, content-length).
    for i in 0..(100 - 7) {
        extra.push_str(&format!("x-{i}: v\r\n"));
    }
    c.send(&echo(3, "many", &extra)).await;
    let r = c.response().await;
    assert_eq!(r.status, 200, "100 header fields: {r:?}");
    gw.stop().await;
}

#[tokio::test]
async fn a_partial_head_gets_408_after_the_header_timeout() {
    let gw = Gateway::start(&demo("header_read_timeout_ms = 300")).await;
    let mut c = Conn::open(gw.addr).await;
    let start = Instant::now();
    c.send(b"POST /mcp/demo HTTP/1.1\r\nhost: portico\r\n")
        .await;
    assert_refused(&mut c, 408, "partial head").await;
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(3),
        "{took:?}"
    );
    gw.stop().await;
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_header_timeout() {
    let gw = Gateway::start(&demo("header_read_timeout_ms = 300")).await;
    let mut c = Conn::open(gw.addr).await;
    c.send(&echo(1, "once", "")).await;
    let r = c.response().await;
    assert_eq!(r.status, 200);
    assert!(!r.closes());
    let (took, extra) = c
        .closed_within(Duration::from_secs(2))
        .await
        .expect("the idle connection was closed within 2 s");
    assert!(
        took >= Duration::from_millis(250),
        "closed too early: {took:?}"
    );
    assert!(
        extra.is_empty(),
        "an idle close is silent: {:?}",
        String::from_utf8_lossy(&extra)
    );
    // A connection that never sends a byte is closed the same way.
    let mut c = Conn::open(gw.addr).await;
    let (_, extra) = c
        .closed_within(Duration::from_secs(2))
        .await
        .expect("the silent connection was closed within 2 s");
    assert!(extra.is_empty());
    gw.stop().await;
}

#[tokio::test]
async fn a_stalled_body_closes_the_connection() {
    let mock = MockMcp::modern().start().await;
    let gw = Gateway::start(&mock_config(&mock.url(), "header_read_timeout_ms = 300")).await;
    let mut c = Conn::open(gw.addr).await;
    let req = post_to(
        "/mcp/m",
        1,
        "tools/call",
        json!({"name": "echo", "arguments": {"text": "x".repeat(100)}}),
        "",
    );
    let split = req.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    // The head and 10 bytes of the body, then nothing.
    c.send(&req[..split + 10]).await;
    let (took, extra) = c
        .closed_within(Duration::from_secs(2))
        .await
        .expect("the stalled body's connection was closed within 2 s");
    assert!(
        took >= Duration::from_millis(250),
        "closed too early: {took:?}"
    );
    assert!(extra.is_empty(), "{:?}", String::from_utf8_lossy(&extra));
    assert_eq!(
        mock.count("tools/call"),
        0,
        "a half body reached the backend"
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_body_over_max_body_bytes_gets_413_and_a_close() {
    let gw = Gateway::start(&demo("max_body_bytes = 1024")).await;
    let mut c = Conn::open(gw.addr).await;
    c.send(&echo(1, &"x".repeat(2048), "")).await;
    let r = c.response().await;
    assert_eq!(r.status, 413, "{r:?}");
    assert!(r.closes(), "{r:?}");
    assert!(
        c.closed_within(Duration::from_secs(2)).await.is_some(),
        "the connection stayed open after 413"
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_head_request_gets_a_head_without_body() {
    let gw = Gateway::start(&demo("")).await;
    let mut c = Conn::open(gw.addr).await;
    // HEAD then a POST in one write: the bytes right after the first head must be the second
    // answer's status line.
    let mut both = b"HEAD /mcp/demo HTTP/1.1\r\nhost: portico\r\n\r\n".to_vec();
    both.extend_from_slice(&echo(2, "after head", ""));
    c.send(&both).await;
    let h = c.head().await;
    assert_eq!(h.status, 405, "{h:?}");
    assert!(!h.closes());
    // Give a stray body time to arrive if the server wrongly sent one.
    while c.buf.len() < 9 {
        assert!(c.fill().await > 0, "closed after HEAD");
    }
    assert!(
        c.buf.starts_with(b"HTTP/1.1 "),
        "bytes after the HEAD answer's head: {:?}",
        String::from_utf8_lossy(&c.buf)
    );
    let r = c.response().await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["id"], 2);
    // HEAD with `connection: close`: the head, then the close and nothing else.
    let mut c = Conn::open(gw.addr).await;
    c.send(b"HEAD /mcp/demo HTTP/1.1\r\nhost: portico\r\nconnection: close\r\n\r\n")
        .await;
    let h = c.head().await;
    assert_eq!(h.status, 405);
    assert!(h.closes());
    let (_, extra) = c
        .closed_within(Duration::from_secs(2))
        .await
        .expect("closed after the HEAD answer");
    assert!(
        extra.is_empty(),
        "a HEAD answer carried a body: {:?}",
        String::from_utf8_lossy(&extra)
    );
    gw.stop().await;
}

#[tokio::test]
async fn answers_of_known_size_get_content_length_and_streams_get_chunked() {
    let gw = Gateway::start(&demo("")).await;
    let mut c = Conn::open(gw.addr).await;
    c.send(&echo(1, "sized", "")).await;
    let r = c.response().await;
    assert_eq!(r.header("content-length"), Some(&*r.body.len().to_string()));
    assert_eq!(r.header("transfer-encoding"), None);
    // Progress with a token: an SSE stream, chunked, on the same connection.
    c.send(&post_to(
        "/mcp/demo",
        2,
        "tools/call",
        json!({"name": "progress", "arguments": {"steps": 3, "delay_ms": 20},
               "_meta": {"progressToken": "t"}}),
        "",
    ))
    .await;
    let r = c.response().await;
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        r.header("content-type")
            .is_some_and(|v| v.starts_with("text/event-stream")),
        "{r:?}"
    );
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    assert_eq!(r.header("content-length"), None);
    let text = String::from_utf8(r.body).unwrap();
    let events: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| serde_json::from_str(d.trim()).expect("JSON event"))
        .collect();
    assert_eq!(events.len(), 4, "{text}");
    assert_eq!(events[3]["id"], 2);
    // And the connection carries on after the stream's last chunk.
    c.send(&echo(3, "after stream", "")).await;
    let r = c.response().await;
    assert_eq!(r.json()["id"], 3);
    gw.stop().await;
}

#[tokio::test]
async fn the_drain_closes_idle_connections_promptly() {
    let gw = Gateway::start(&demo(
        "drain_timeout_ms = 10000\nheader_read_timeout_ms = 30000",
    ))
    .await;
    let mut c = Conn::open(gw.addr).await;
    c.send(&echo(1, "before the drain", "")).await;
    assert_eq!(c.response().await.status, 200);
    let stopping = tokio::spawn(gw.stop());
    let (took, extra) = c
        .closed_within(Duration::from_secs(2))
        .await
        .expect("the idle connection was closed by the drain within 2 s");
    assert!(extra.is_empty());
    assert!(took < Duration::from_secs(2));
    // With nothing in flight the drain ends at once, not at drain_timeout_ms.
    tokio::time::timeout(Duration::from_secs(2), stopping)
        .await
        .expect("the drain finished promptly")
        .unwrap();
}

#[tokio::test]
async fn the_drain_lets_an_in_flight_request_finish_then_closes() {
    let mock = MockMcp::modern().start().await;
    let gw = Gateway::start(&mock_config(
        &mock.url(),
        "drain_timeout_ms = 10000\nheader_read_timeout_ms = 30000",
    ))
    .await;
    let mut c = Conn::open(gw.addr).await;
    c.send(&post_to(
        "/mcp/m",
        9,
        "tools/call",
        json!({"name": "slow", "arguments": {"ms": 600}}),
        "",
    ))
    .await;
    wait_for_call(&mock).await;
    let stopping = tokio::spawn(gw.stop());
    let r = c.response().await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["id"], 9);
    assert_eq!(
        r.json()["result"]["content"][0]["text"],
        "slept 600",
        "{r:?}"
    );
    assert!(
        r.closes(),
        "an answer during the drain says it closes: {r:?}"
    );
    assert!(
        c.closed_within(Duration::from_secs(2)).await.is_some(),
        "the connection stayed open after its last answer"
    );
    tokio::time::timeout(Duration::from_secs(3), stopping)
        .await
        .expect("the drain finished once the request was done")
        .unwrap();
}

#[tokio::test]
async fn a_client_that_leaves_mid_request_cancels_it_upstream() {
    // A JSON (not SSE) backend: the gateway is still waiting for the answer's head, so only
    // the lean loop's watch on the client socket can notice the client left.
    let mock = MockMcp::modern().start().await;
    let gw = Gateway::start(&mock_config(&mock.url(), "")).await;
    let mut c = Conn::open(gw.addr).await;
    c.send(&post_to(
        "/mcp/m",
        1,
        "tools/call",
        json!({"name": "slow", "arguments": {"ms": 5000}}),
        "",
    ))
    .await;
    wait_for_call(&mock).await;
    drop(c);
    assert!(
        mock.wait_cancelled(Duration::from_secs(3)).await,
        "the backend never saw the request dropped"
    );
    gw.stop().await;
}

/// Waits (bounded) until the mock has received a `tools/call`.
async fn wait_for_call(mock: &crate::common::mock::MockHandle) {
    tokio::time::timeout(READ_WITHIN, async {
        while mock.count("tools/call") == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the request reached the backend");
}

/// A keep-alive connection idle past a second gives back its buffers (README, "Scale") and
/// behaves as before: served again when its next request comes (with buffers taken anew),
/// closed silently once the header timeout has passed since it went idle, closed by the drain.
/// Virtual time: the idle seconds cost nothing.
#[tokio::test(start_paused = true)]
async fn a_connection_idle_past_a_second_is_served_again_or_closed_on_time() {
    let gw = Gateway::start(&demo(
        "header_read_timeout_ms = 5000\ndrain_timeout_ms = 10000",
    ))
    .await;
    let mut c = Conn::open(gw.addr).await;
    c.send(&echo(1, "first", "")).await;
    assert_eq!(c.response().await.status, 200);
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.send(&echo(2, "after idling", "")).await;
    let r = c.response().await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["id"], 2);
    assert!(!r.closes());
    let (took, extra) = c
        .closed_within(Duration::from_secs(8))
        .await
        .expect("the idle connection was closed at the header timeout");
    assert!(
        took >= Duration::from_millis(4900) && took <= Duration::from_millis(5100),
        "closed {took:?} after going idle, not at the header timeout (5 s)"
    );
    assert!(extra.is_empty(), "an idle close is silent");
    let mut d = Conn::open(gw.addr).await;
    d.send(&echo(3, "before the drain", "")).await;
    assert_eq!(d.response().await.status, 200);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stopping = tokio::spawn(gw.stop());
    let (took, extra) = d
        .closed_within(Duration::from_secs(2))
        .await
        .expect("the idle connection was closed by the drain");
    assert!(extra.is_empty());
    assert!(took < Duration::from_secs(1), "the drain took {took:?}");
    tokio::time::timeout(Duration::from_secs(2), stopping)
        .await
        .expect("the drain finished promptly")
        .unwrap();
}
