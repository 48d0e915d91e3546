//! The lean HTTP/1.1 upstream client (issue 9) against a raw-socket backend whose wire behaviour
//! the tests control: idle connections the backend closes, `connection: close`, and chunked
//! answers split across writes with extensions and trailers.

use crate::common::*;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How the raw backend answers.
#[derive(Clone, Copy)]
enum Mode {
    /// Keep-alive JSON answer, then close the connection 50 ms after answering.
    CloseWhenIdle,
    /// JSON answer with `connection: close`, then close.
    ConnectionClose,
    /// Chunked SSE answer, written in pieces that split chunk-size lines and data.
    ChunkedPieces,
    /// [`odd_json`] with a Content-Length, written a few bytes at a time.
    OddJson,
    /// [`odd_sse`], chunked into 1-to-13-byte chunks, written a few bytes at a time.
    OddSse,
}

/// A JSON answer no serializer of portico's would produce: odd spacing, escapes, key order,
/// duplicate-looking keys inside strings, non-ASCII, a trailing newline.
fn odd_json(id: &Value) -> Vec<u8> {
    format!(
        "{{ \"result\" :{{\"content\":[ {{\"text\":\"caf\\u00e9 \u{1F600} \\\"q\\\" \\n\",\"type\":\"text\"}}],\n\t\"resultType\":\"complete\" }},\"id\": {id} ,\"jsonrpc\":\"2.0\"}}\n"
    )
    .into_bytes()
}

/// An SSE answer with what SSE allows and portico must not touch: CRLF line ends, comments,
/// `id:`/`retry:` fields, a notification split over two `data:` lines, then the response.
fn odd_sse(id: &Value) -> Vec<u8> {
    format!(
        ": hello\r\nretry: 5000\r\n\r\nid: 1\r\nevent: message\r\ndata: {{\"jsonrpc\":\"2.0\",\r\ndata: \"method\":\"notifications/progress\",\"params\":{{\"progressToken\":1,\"progress\":1}}}}\r\n\r\n\
         : mid\n\nevent: message\ndata: {{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{\"resultType\":\"complete\",\"content\":[]}}}}\n\n"
    )
    .into_bytes()
}

/// Writes `bytes` in pieces of a few bytes each, so every boundary is crossed somewhere.
async fn dribble(tcp: &mut TcpStream, bytes: &[u8]) {
    for piece in bytes.chunks(5) {
        if tcp.write_all(piece).await.is_err() {
            return;
        }
        let _ = tcp.flush().await;
        tokio::task::yield_now().await;
    }
}

struct RawBackend {
    url: String,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RawBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn raw_backend(mode: Mode) -> RawBackend {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(tcp, mode));
        }
    });
    RawBackend {
        url,
        accepted,
        task,
    }
}

/// Reads one request (head + Content-Length body); `None` at end of stream.
pub(crate) async fn read_request(tcp: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if buf.len() >= end + 4 + len {
                let body = buf[end + 4..end + 4 + len].to_vec();
                buf.drain(..end + 4 + len);
                return Some(body);
            }
        }
        let mut chunk = [0u8; 4096];
        match tcp.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

async fn serve(mut tcp: TcpStream, mode: Mode) {
    let mut buf = Vec::new();
    while let Some(body) = read_request(&mut tcp, &mut buf).await {
        let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let answer = json!({
            "jsonrpc": "2.0",
            "id": req["id"],
            "result": {"resultType": "complete", "content": [{"type": "text", "text": "raw ok"}]},
        })
        .to_string();
        match mode {
            Mode::CloseWhenIdle | Mode::ConnectionClose => {
                let close = matches!(mode, Mode::ConnectionClose);
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{}\r\n",
                    answer.len(),
                    if close { "connection: close\r\n" } else { "" }
                );
                let _ = tcp.write_all(format!("{head}{answer}").as_bytes()).await;
                if !close {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                return;
            }
            Mode::OddJson => {
                let body = odd_json(&req["id"]);
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                );
                dribble(&mut tcp, &[head.into_bytes(), body].concat()).await;
            }
            Mode::OddSse => {
                let body = odd_sse(&req["id"]);
                let mut wire = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
                let mut at = 0;
                let mut size = 1;
                while at < body.len() {
                    let end = (at + size).min(body.len());
                    wire.extend_from_slice(format!("{:x}\r\n", end - at).as_bytes());
                    wire.extend_from_slice(&body[at..end]);
                    wire.extend_from_slice(b"\r\n");
                    at = end;
                    size = size % 13 + 1;
                }
                wire.extend_from_slice(b"0\r\n\r\n");
                dribble(&mut tcp, &wire).await;
            }
            Mode::ChunkedPieces => {
                let event = format!("event: message\ndata: {answer}\n\n");
                let (a, b) = event.split_at(event.len() / 2);
                let wire = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n\
                     {:x};ext=1\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\nx-trailer: yes\r\n\r\n",
                    a.len(),
                    b.len()
                );
                // Pieces that end inside a chunk-size line, inside data and inside the trailer.
                let bytes = wire.as_bytes();
                let cuts = [bytes.len() / 3, bytes.len() / 3 + 2, bytes.len() - 5];
                let mut at = 0;
                for cut in cuts.into_iter().chain([bytes.len()]) {
                    let _ = tcp.write_all(&bytes[at..cut]).await;
                    let _ = tcp.flush().await;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    at = cut;
                }
            }
        }
    }
}

fn config(url: &str) -> String {
    format!(
        r#"
[log]
access = false

[[backends]]
name = "raw"
url = "{url}"
protocol = "modern"
"#
    )
}

async fn call(gw: &Gateway, id: i64) -> Resp {
    mcp(
        &gw.url("/mcp/raw"),
        json!(id),
        "tools/call",
        json!({"name": "t", "arguments": {}}),
    )
    .await
}

/// A pooled connection the backend closed while idle is noticed before a request is written to
/// it: the next request goes out on a fresh connection and succeeds (no 502).
#[tokio::test]
async fn an_idle_connection_closed_by_the_backend_is_not_reused() {
    let backend = raw_backend(Mode::CloseWhenIdle).await;
    let gw = Gateway::start(&config(&backend.url)).await;
    for id in 1..=3 {
        let r = call(&gw, id).await;
        assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.result()["id"], id);
        // Let the backend close the idle connection (after 50 ms).
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(backend.accepted.load(Ordering::SeqCst) >= 3);
    gw.stop().await;
}

/// `connection: close` is honoured: the connection is not pooled.
#[tokio::test]
async fn connection_close_answers_are_not_pooled() {
    let backend = raw_backend(Mode::ConnectionClose).await;
    let gw = Gateway::start(&config(&backend.url)).await;
    for id in 1..=3 {
        let r = call(&gw, id).await;
        assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.result()["id"], id);
    }
    assert!(backend.accepted.load(Ordering::SeqCst) >= 3);
    gw.stop().await;
}

/// A chunked SSE answer arriving in pieces (split chunk-size lines, extensions, trailers) is
/// relayed whole, and the connection is reused afterwards.
#[tokio::test]
async fn chunked_answers_in_pieces_are_relayed_and_the_connection_reused() {
    let backend = raw_backend(Mode::ChunkedPieces).await;
    let gw = Gateway::start(&config(&backend.url)).await;
    for id in 1..=3 {
        let r = call(&gw, id).await;
        assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
        assert!(r.is_sse());
        let msgs = r.messages();
        assert_eq!(msgs.len(), 1, "{msgs:?}");
        assert_eq!(msgs[0]["id"], id);
        assert_eq!(msgs[0]["result"]["content"][0]["text"], "raw ok");
    }
    assert_eq!(
        backend.accepted.load(Ordering::SeqCst),
        1,
        "one pooled connection"
    );
    gw.stop().await;
}

/// Pass-through is byte for byte: a JSON answer and an SSE answer that portico would never
/// write itself, arriving in small pieces (SSE in tiny chunks), reach the client exactly as the
/// backend wrote them.
#[tokio::test]
async fn pass_through_relays_answers_byte_for_byte() {
    for (mode, expected, sse) in [
        (Mode::OddJson, odd_json as fn(&Value) -> Vec<u8>, false),
        (Mode::OddSse, odd_sse, true),
    ] {
        let backend = raw_backend(mode).await;
        let gw = Gateway::start(&config(&backend.url)).await;
        for id in 1..=2 {
            let r = call(&gw, id).await;
            assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
            assert_eq!(r.is_sse(), sse);
            assert_eq!(
                r.body.as_ref(),
                expected(&json!(id)).as_slice(),
                "{}",
                String::from_utf8_lossy(&r.body)
            );
        }
        gw.stop().await;
    }
}
