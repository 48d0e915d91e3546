//! The lean server's request-head parser and connection rules, on raw bytes.

use super::*;

#[test]
fn lengths_parse_strictly() {
    assert_eq!(parse_length(b"0"), Some(0));
    assert_eq!(parse_length(b"1234"), Some(1234));
    assert_eq!(parse_length(b""), None);
    assert_eq!(parse_length(b"+1"), None);
    assert_eq!(parse_length(b"1 2"), None);
    assert_eq!(parse_length(b"99999999999999999999"), None);
}

#[test]
fn connection_tokens() {
    assert!(has_token(b"close", b"close"));
    assert!(has_token(b"keep-alive, Close", b"close"));
    assert!(!has_token(b"closed", b"close"));
}

/// A seeded fuzz smoke of the head parser: mutated and truncated requests never panic, and
/// a head that parses was taken off the buffer exactly (the rest stays for the body).
#[test]
fn the_head_parser_survives_mangled_input() {
    const GOOD: &[u8] = b"POST /mcp/demo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
        Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n\
        Mcp-Method: tools/call\r\nMcp-Name: echo\r\nContent-Length: 2\r\n\r\n{}";
    const NOISE: &[u8] = b"\r\n: \t\x00\x7f\xffPRI *HTTP/2.0-,;=?%0123456789chunked";
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut spots = HeaderSpots::default();
    let (mut complete, mut refused) = (0, 0);
    for _ in 0..20_000 {
        let mut input = GOOD.to_vec();
        for _ in 0..(next() % 6) {
            let at = (next() as usize) % (input.len() + 1);
            match next() % 4 {
                0 if at < input.len() => input[at] = NOISE[(next() as usize) % NOISE.len()],
                1 => input.insert(at, NOISE[(next() as usize) % NOISE.len()]),
                2 if at < input.len() => {
                    input.remove(at);
                }
                _ => input.truncate(at),
            }
        }
        let mut buf = BytesMut::from(&input[..]);
        match parse_head(&mut buf, &mut spots, 1024) {
            Ok(Some(head)) => {
                complete += 1;
                let rest = buf.len();
                assert!(rest <= input.len());
                assert_eq!(&buf[..], &input[input.len() - rest..]);
                assert!(head.parts.headers.len() <= MAX_HEADERS);
            }
            Ok(None) | Err(Stop::Handoff) | Err(Stop::Close) => {}
            Err(Stop::Refuse(status, _)) => {
                refused += 1;
                assert!(status.is_client_error());
            }
        }
    }
    // The mutations must exercise both outcomes, or the test proves nothing.
    assert!(
        complete > 1_000 && refused > 100,
        "{complete} complete, {refused} refused"
    );
}

/// Found by `fuzz::server_h1` against httparse: `http::Uri` drops a fragment silently, so
/// `/mcp#x` was routed as `/mcp`. RFC 9112 §3.2 has no fragment in a request target: 400.
#[test]
fn a_fragment_in_the_target_is_refused() {
    for target in ["/mcp#x", "/mcp?a=1#", "/#/mcp", "http://gw:1/mcp#x"] {
        let wire = format!("POST {target} HTTP/1.1\r\ncontent-length: 0\r\n\r\n");
        let mut buf = BytesMut::from(wire.as_bytes());
        match parse_head(&mut buf, &mut HeaderSpots::default(), 1024) {
            Err(Stop::Refuse(status, why)) => {
                assert_eq!(status, StatusCode::BAD_REQUEST);
                assert_eq!(why, "malformed request target");
            }
            _ => panic!("{target} was not refused"),
        }
    }
    let mut buf = BytesMut::from(&b"POST /mcp?a=1 HTTP/1.1\r\n\r\n"[..]);
    let head = parse_head(&mut buf, &mut HeaderSpots::default(), 1024);
    assert!(matches!(head, Ok(Some(h)) if h.parts.uri == "/mcp?a=1"));
}

#[test]
fn numbers_format() {
    let decimal = |n| {
        let mut out = Vec::new();
        push_decimal(&mut out, n);
        out
    };
    assert_eq!(decimal(0), b"0");
    assert_eq!(decimal(u64::MAX), b"18446744073709551615");
    assert_eq!(hex_len(0, &mut [0; 16]), b"0");
    assert_eq!(hex_len(0x1a2f, &mut [0; 16]), b"1a2f");
}

/// A client and the server side of its connection, every limit `timeout`.
async fn connected(timeout: Duration) -> (tokio::net::TcpStream, Conn) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (io, _) = listener.accept().await.unwrap();
    let limits = Limits {
        header_timeout: timeout,
        body_timeout: timeout,
        body_min_rate: 0,
        max_head: 8192,
        max_body: 1 << 20,
    };
    (client, Conn::new(io, limits))
}

/// A connection streaming an answer that has to wait (an event stream between events) holds no
/// read buffer meanwhile, and one large answer does not leave its write buffer behind (README,
/// "Scale").
#[tokio::test]
async fn a_connection_holds_no_buffer_it_does_not_need() {
    use futures_util::StreamExt;
    use tokio::io::AsyncReadExt;
    let timeout = Duration::from_secs(5);
    let (mut client, mut c) = connected(timeout).await;
    // One event, then nothing yet.
    let events = futures_util::stream::iter([Bytes::from_static(b"data: one\n\n")])
        .chain(futures_util::stream::pending());
    {
        let mut write = pin!(c.write_body(Body::Stream(Box::pin(events)), true));
        let waiting = poll_fn(|cx| Poll::Ready(write.as_mut().poll(cx).is_pending())).await;
        assert!(waiting, "the stream waits for its next event");
    }
    assert_eq!(
        c.rbuf.capacity(),
        0,
        "no read buffer while the stream waits"
    );
    let mut got = vec![0u8; 64];
    let n = tokio::time::timeout(timeout, client.read(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        &got[..n],
        b"b\r\ndata: one\n\n\r\n",
        "the event went out first"
    );
    // A large answer, read whole by the client meanwhile.
    let large = Bytes::from(vec![b'x'; 300 * 1024]);
    let reader = tokio::spawn(async move {
        let mut all = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        while all.len() < 300 * 1024 {
            let n = client.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed early");
            all.extend_from_slice(&buf[..n]);
        }
        all.len()
    });
    let resp = http::Response::new(Body::full(large));
    assert!(c.write_response(resp, false, true).await);
    let read = tokio::time::timeout(timeout, reader)
        .await
        .unwrap()
        .unwrap();
    assert!(read > 300 * 1024, "head and body");
    assert!(
        c.wbuf.capacity() <= WBUF_KEEP,
        "write buffer kept: {}",
        c.wbuf.capacity()
    );
}

/// A keep-alive connection that idles past `IDLE_RELEASE` gives back its read and write
/// buffers, then serves its next request as usual, taking them again (README, "Scale").
#[tokio::test(start_paused = true)]
async fn an_idle_keep_alive_connection_gives_its_buffers_back() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let timeout = Duration::from_secs(10);
    let (mut client, mut c) = connected(timeout).await;
    let mut never = pin!(std::future::pending::<()>());
    // Waiting for a request, a little less than the release time: the buffers stay.
    tokio::select! {
        _ = c.read_head(never.as_mut()) => panic!("no request was sent"),
        _ = tokio::time::sleep(IDLE_RELEASE / 2) => {}
    }
    assert_eq!(
        c.rbuf.capacity(),
        READ_CHUNK,
        "a short wait keeps the buffer"
    );
    assert_eq!(c.wbuf.capacity(), WBUF_START);
    // Past it: nothing held, and the connection is still open.
    tokio::select! {
        _ = c.read_head(never.as_mut()) => panic!("no request was sent"),
        _ = tokio::time::sleep(IDLE_RELEASE * 2) => {}
    }
    assert_eq!(c.rbuf.capacity(), 0, "no read buffer after a long idle");
    assert_eq!(c.wbuf.capacity(), 0, "no write buffer after a long idle");
    // The next request is read and answered as ever.
    client
        .write_all(b"POST /mcp HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
        .await
        .unwrap();
    let head = tokio::select! {
        head = c.read_head(never.as_mut()) => head.ok().expect("a request head"),
        _ = tokio::time::sleep(timeout / 2) => panic!("the request was not read"),
    };
    assert_eq!(head.parts.uri.path(), "/mcp");
    assert_eq!(head.content_length, 2);
    assert!(
        c.rbuf.capacity() > 0,
        "a buffer taken again for the request"
    );
    let resp = http::Response::new(Body::full(Bytes::from_static(b"{}")));
    assert!(c.write_response(resp, false, true).await);
    let mut got = vec![0u8; 512];
    let n = client.read(&mut got).await.unwrap();
    let answer = String::from_utf8_lossy(&got[..n]);
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(answer.ends_with("\r\n\r\n{}"), "{answer}");
}
