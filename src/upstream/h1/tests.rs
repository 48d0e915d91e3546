//! The HTTP/1.1 client, wire bytes in: answers fed in pieces, framing, reuse and refusals.

use super::framing::Chunk;
use super::*;

/// Decodes `wire` (head included) fed in pieces of `step` bytes, stepping the body as
/// `H1Body` does (`settle` after the head and after each data frame, its errors left to the
/// next step); returns the head and the body bytes, or the first error.
fn decode(wire: &[u8], step: usize) -> Result<(Head, Vec<u8>, bool), String> {
    let mut buf = BytesMut::new();
    let mut rest = wire;
    let mut head = None;
    let mut body = Vec::new();
    loop {
        if head.is_none() {
            head = parse_head(&mut buf, &mut HeaderSpots::default(), &mut 0)
                .map_err(|e| e.to_string())?;
        }
        if let Some(h) = head.as_mut() {
            loop {
                match h.framing.step(&mut buf, true).map_err(|e| e.to_string())? {
                    Step::Data(b) => {
                        body.extend_from_slice(&b);
                        let _ = h.framing.step(&mut buf, false);
                    }
                    Step::Done => return Ok((head.unwrap(), body, buf.is_empty())),
                    Step::NeedMore => break,
                }
            }
        }
        if rest.is_empty() {
            return Err("incomplete".into());
        }
        let n = step.min(rest.len());
        buf.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
    }
}

#[test]
fn content_length_body_in_any_split() {
    let wire = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"a\":12345}";
    for step in [1, 2, 7, 100] {
        let (h, body, clean) = decode(wire, step).unwrap();
        assert_eq!(h.status, StatusCode::OK);
        assert!(h.keep_alive);
        assert_eq!(h.headers["content-type"], "application/json");
        assert_eq!(body, b"{\"a\":12345}");
        assert!(clean);
    }
}

#[test]
fn chunked_body_with_extensions_and_trailers_in_any_split() {
    let wire =
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\ncontent-type: text/event-stream\r\n\r\n\
        5;ext=1\r\nhello\r\nB\r\n, world!!!!\r\n0\r\nx-trailer: 1\r\n\r\n";
    for step in [1, 3, 8, 1000] {
        let (h, body, clean) = decode(wire, step).unwrap();
        assert!(matches!(h.framing, Framing::Done));
        assert_eq!(body, b"hello, world!!!!");
        assert!(clean);
    }
}

#[test]
fn interim_answers_are_skipped() {
    let wire = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n";
    let (h, body, _) = decode(wire, 5).unwrap();
    assert_eq!(h.status, StatusCode::ACCEPTED);
    assert!(body.is_empty());
}

#[test]
fn close_delimited_and_connection_close_answers_are_not_reused() {
    let mut buf =
        BytesMut::from(&b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: Close\r\n\r\n"[..]);
    assert!(
        !parse_head(&mut buf, &mut HeaderSpots::default(), &mut 0)
            .unwrap()
            .unwrap()
            .keep_alive
    );
    let mut buf = BytesMut::from(&b"HTTP/1.1 200 OK\r\n\r\n"[..]);
    let h = parse_head(&mut buf, &mut HeaderSpots::default(), &mut 0)
        .unwrap()
        .unwrap();
    assert!(matches!(h.framing, Framing::Close) && !h.keep_alive);
    let mut buf = BytesMut::from(&b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n"[..]);
    assert!(
        !parse_head(&mut buf, &mut HeaderSpots::default(), &mut 0)
            .unwrap()
            .unwrap()
            .keep_alive
    );
}

#[test]
fn framing_is_read_from_the_head_and_kept_out_of_the_map() {
    let head = |wire: &[u8]| {
        let mut buf = BytesMut::from(wire);
        parse_head(&mut buf, &mut HeaderSpots::default(), &mut 0)
    };
    // Both a coding and a length: chunked wins, and the connection is not reused.
    let h = head(b"HTTP/1.1 200 OK\r\ncontent-length: x\r\ntransfer-encoding: chunked\r\n\r\n")
        .unwrap()
        .unwrap();
    assert!(matches!(h.framing, Framing::Chunked(_)) && !h.keep_alive);
    // A coding that does not end in chunked: read to close.
    let h = head(b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n")
        .unwrap()
        .unwrap();
    assert!(matches!(h.framing, Framing::Close) && !h.keep_alive);
    // 204 has no body whatever its headers say.
    let h = head(b"HTTP/1.1 204 No Content\r\ncontent-length: junk\r\n\r\n")
        .unwrap()
        .unwrap();
    assert!(matches!(h.framing, Framing::Length(0)) && h.keep_alive);
    // Only what the relay and bridge read reaches the map.
    let h = head(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nDate: x\r\nContent-Type: a/b\r\nMcp-Session-Id: s\r\nConnection: keep-alive\r\n\r\n",
    )
    .unwrap()
    .unwrap();
    assert!(matches!(h.framing, Framing::Length(2)) && h.keep_alive);
    let names: Vec<_> = h.headers.keys().map(|k| k.as_str()).collect();
    assert_eq!(names, ["content-type", "mcp-session-id"]);
}

/// Accepts one connection on `listener` and reads a request head from it (blocking).
fn accept_request(listener: &std::net::TcpListener) -> std::net::TcpStream {
    use std::io::Read;
    let (mut s, _) = listener.accept().unwrap();
    let mut req = Vec::new();
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0);
        req.extend_from_slice(&buf[..n]);
    }
    s
}

/// A small POST to `addr` through a fresh pool, answered within five seconds.
async fn post_to(addr: &str) -> Result<Response<H1Body>, UpstreamError> {
    let deadline = Instant::now() + std::time::Duration::from_secs(5);
    exchange(&Pool::new(4), addr, deadline, deadline, |out| {
        out.extend_from_slice(b"POST /mcp HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}")
    })
    .await
}

/// A backend thread on blocking sockets (so it answers while the test's task is running):
/// reads one request head and answers it with `pieces`, pausing 20 ms after each.
fn thread_backend(pieces: Vec<Vec<u8>>) -> (String, std::thread::JoinHandle<()>) {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let t = std::thread::spawn(move || {
        let mut s = accept_request(&listener);
        for p in pieces {
            s.write_all(&p).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    });
    (addr, t)
}

/// `read_now` takes bytes the backend already sent without waiting for the reactor, and
/// returns at once (without blocking or failing) when there is nothing.
#[tokio::test]
async fn read_now_takes_what_is_already_there() {
    let wire = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello".to_vec();
    let (addr, backend) = thread_backend(vec![wire.clone()]);
    let deadline = Instant::now() + std::time::Duration::from_secs(5);
    let mut conn = Conn::connect(&addr, deadline).await.unwrap();
    conn.read_now();
    assert!(conn.rbuf.is_empty(), "nothing was sent yet");
    conn.wbuf = b"GET / HTTP/1.1\r\n\r\n".to_vec();
    let mut written = 0;
    poll_fn(|cx| conn.poll_write_all(cx, &mut written))
        .await
        .unwrap();
    for _ in 0..500 {
        conn.read_now();
        if conn.rbuf.len() == wire.len() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    assert_eq!(&conn.rbuf[..], &wire[..]);
    backend.join().unwrap();
}

/// A whole exchange where the speculative read may catch only part of the answer: a head
/// split across writes and a body larger than the speculative read. The answer arrives
/// whole and in order.
#[tokio::test]
async fn an_answer_split_across_the_speculative_read_arrives_whole() {
    let body: Vec<u8> = (0..10_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: a/b\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let (first, rest) = head.as_bytes().split_at(20);
    let mut tail = rest.to_vec();
    tail.extend_from_slice(&body);
    let (addr, backend) = thread_backend(vec![first.to_vec(), tail]);
    let resp = post_to(&addr).await.unwrap();
    assert_eq!(resp.headers()["content-type"], "a/b");
    let mut b = resp.into_body();
    let mut got = Vec::new();
    while let Some(frame) = poll_fn(|cx| b.poll_frame(cx)).await {
        got.extend_from_slice(&frame.unwrap().into_data().unwrap());
    }
    assert_eq!(got, body);
    backend.join().unwrap();
}

/// A streamed answer that has to wait for its next piece (an event stream between events)
/// holds no read buffer meanwhile (README, "Scale"), and reads the rest whole when it comes.
#[tokio::test]
async fn a_waiting_stream_holds_no_read_buffer() {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let backend = std::thread::spawn(move || {
        let mut s = accept_request(&listener);
        s.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\nb\r\ndata: one\n\n\r\n").unwrap();
        // Bounded: the test sends `go` at once after its check (or drops it, failing).
        let _ = wait.recv_timeout(std::time::Duration::from_secs(5));
        s.write_all(b"b\r\ndata: two\n\n\r\n0\r\n\r\n").unwrap();
    });
    let resp = post_to(&addr).await.unwrap();
    let mut b = resp.into_body();
    let first = poll_fn(|cx| b.poll_frame(cx)).await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "data: one\n\n");
    let waiting = poll_fn(|cx| Poll::Ready(b.poll_frame(cx).is_pending())).await;
    assert!(waiting, "the next event is not sent yet");
    assert_eq!(b.read_buffer(), Some(0), "no read buffer while waiting");
    go.send(()).unwrap();
    let mut rest = Vec::new();
    while let Some(frame) = poll_fn(|cx| b.poll_frame(cx)).await {
        rest.extend_from_slice(&frame.unwrap().into_data().unwrap());
    }
    assert_eq!(rest, b"data: two\n\n");
    backend.join().unwrap();
}

#[test]
fn name_is_matches_tokens_ignoring_case_only() {
    for (raw, lower, want) in [
        (&b"Content-Length"[..], &b"content-length"[..], true),
        (b"CONTENT-LENGTH", b"content-length", true),
        (b"content-lengtH", b"content-length", true),
        (b"content-lengths", b"content-length", false),
        (b"content_length", b"content-length", false),
        (b"Mcp-Protocol-Version", b"mcp-protocol-version", true),
        (b"Mcp-Protocol-Versiom", b"mcp-protocol-version", false),
        (b"Xcp-Protocol-Version", b"mcp-protocol-version", false),
        (b"HOST", b"host", true),
        (b"hosT", b"hose", false),
        (b"", b"", true),
    ] {
        assert_eq!(
            name_is(raw, lower),
            want,
            "{}",
            String::from_utf8_lossy(raw)
        );
    }
}

#[test]
fn malformed_framing_is_an_error() {
    for wire in [
        &b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n"[..],
        b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nabX\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nfffffffffffffffff\r\n",
    ] {
        assert!(
            decode(wire, 4).is_err(),
            "{}",
            String::from_utf8_lossy(wire)
        );
    }
}

/// Statuses outside 100–599 are not HTTP answers (`http::StatusCode` would take 999).
#[test]
fn statuses_outside_100_to_599_are_refused() {
    for wire in [
        &b"HTTP/1.1 999 Whatever\r\ncontent-length: 0\r\n\r\n"[..],
        b"HTTP/1.1 600 Nope\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 099 Nope\r\ncontent-length: 0\r\n\r\n",
    ] {
        let mut buf = BytesMut::from(wire);
        assert!(
            parse_head(&mut buf, &mut HeaderSpots::default(), &mut 0).is_err(),
            "{}",
            String::from_utf8_lossy(wire)
        );
    }
    let mut buf = BytesMut::from(&b"HTTP/1.1 599 Edge\r\ncontent-length: 0\r\n\r\n"[..]);
    let h = parse_head(&mut buf, &mut HeaderSpots::default(), &mut 0);
    assert_eq!(h.unwrap().unwrap().status.as_u16(), 599);
}

/// Endless interim answers and endless trailers end in an error within a head's worth of
/// bytes, instead of keeping the reader busy (and the deadline timer unpolled) forever.
#[test]
fn interim_answers_and_trailers_are_bounded() {
    let mut interim = 0;
    let mut result = Ok(None);
    for _ in 0..10_000 {
        let mut buf = BytesMut::from(&b"HTTP/1.1 102 Processing\r\n\r\n"[..]);
        result = parse_head(&mut buf, &mut HeaderSpots::default(), &mut interim);
        if result.is_err() {
            break;
        }
    }
    assert!(result.is_err() && interim <= MAX_HEAD_BYTES + 64);

    let mut framing = Framing::Chunked(Chunk::Size);
    let mut buf = BytesMut::from(&b"0\r\n"[..]);
    let mut failed = false;
    for _ in 0..10_000 {
        buf.extend_from_slice(b"x-trailer: 0123456789\r\n");
        match framing.step(&mut buf, true) {
            Ok(Step::NeedMore) => {}
            Ok(_) => panic!("trailers never ended"),
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    assert!(failed);
}

/// A bad chunk-size line found while settling (after a chunk's data) stays an error: the
/// line after it is never taken for the next chunk, so the bad chunk is not skipped.
#[test]
fn a_bad_chunk_size_is_never_skipped() {
    let mut framing = Framing::Chunked(Chunk::Size);
    let mut buf = BytesMut::from(&b"5\r\nhello\r\nZZZZ\r\n3\r\nabc\r\n0\r\n\r\n"[..]);
    assert!(matches!(framing.step(&mut buf, true), Ok(Step::Data(d)) if &d[..] == b"hello"));
    assert!(framing.step(&mut buf, false).is_err(), "settling finds it");
    for _ in 0..3 {
        assert!(
            framing.step(&mut buf, true).is_err(),
            "and every later step reports it"
        );
    }
}

/// Framing that arrives broken with the head fails the exchange itself, so the caller can
/// answer 502 before any head goes to the client.
#[tokio::test]
async fn broken_framing_with_the_head_fails_the_exchange() {
    for wire in [
        &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nZZZZ\r\n"[..],
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nfffffffffffffffff\r\n",
        b"HTTP/1.1 999 Odd\r\ncontent-length: 2\r\n\r\n{}",
    ] {
        let (addr, backend) = thread_backend(vec![wire.to_vec()]);
        let r = post_to(&addr).await;
        assert!(
            matches!(r, Err(UpstreamError::Protocol(_))),
            "{}",
            String::from_utf8_lossy(wire)
        );
        backend.join().unwrap();
    }
}

#[test]
fn request_is_one_buffer_with_our_framing() {
    let mut req = Request::new(Bytes::from_static(b"{}"));
    *req.method_mut() = http::Method::POST;
    *req.uri_mut() = "/mcp?x=1".parse().unwrap();
    let h = req.headers_mut();
    h.insert(header::HOST, HeaderValue::from_static("b:1"));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("99"));
    h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    let mut out = Vec::new();
    encode(&req, &mut out);
    assert_eq!(
        out,
        b"POST /mcp?x=1 HTTP/1.1\r\nhost: b:1\r\ncontent-length: 2\r\n\r\n{}"
    );
}
