//! Streamable HTTP upstreams against in-test servers: answers checked, relayed and refused.

use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[test]
fn answers_are_shaped_as_serde_shapes_them() {
    for msg in [
        r#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
        r#"{"jsonrpc":"2.0","id":1,"error":{"code":1}}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":null}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":null,"error":{}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":null,"result":1}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"x","result":1}"#,
        r#"{"res\u0075lt":1}"#,
        r#"{"result":1,"result":2}"#,
        r#"{"method":null,"method":null,"result":1}"#,
        r#"{"error":1,"x":{"error":2}}"#,
        r#"{}"#,
        r#"[]"#,
        r#""answer""#,
        r#"{"result":1"#,
        r#"{"result":1,}"#,
        r#"{"result":tru}"#,
        "",
        "\u{ff}",
    ] {
        assert_eq!(
            shape(msg.as_bytes()),
            shape_by_serde(msg.as_bytes()),
            "{msg}"
        );
    }
    assert_eq!(shape(br#"{"id":1,"result":{}}"#), Ok(true));
    assert_eq!(
        shape(br#"{"result":1,"result":2}"#),
        Err("is not a JSON-RPC message")
    );
}

fn upstream(url: &str) -> Arc<HttpUpstream> {
    let cfg: crate::config::Config = crate::config::parse(&format!(
        "[[backends]]\nname = 'b'\nurl = '{url}'\nheaders = {{ X-Api-Key = 'static', Mcp-Method = 'static' }}\n"
    ))
    .expect("config");
    Arc::new(HttpUpstream::new(&cfg.backends[0], url).expect("upstream"))
}

/// A client's headers: credentials and hop-by-hop ones that must never go upstream, and
/// the allowlisted ones that must.
fn client_headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in [
        ("authorization", "Bearer client-secret"),
        ("cookie", "sid=1"),
        ("x-forwarded-for", "10.0.0.1"),
        ("host", "evil.example"),
        ("content-type", "application/json"),
        ("mcp-method", "tools/call"),
        ("mcp-param-region", "eu"),
        (
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ),
    ] {
        h.insert(HeaderName::from_static(k), HeaderValue::from_static(v));
    }
    h
}

fn extra() -> Vec<(HeaderName, HeaderValue)> {
    vec![
        (
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer team"),
        ),
        (
            HeaderName::from_static("mcp-method"),
            HeaderValue::from_static("extra"),
        ),
    ]
}

/// What both request builders must produce, by header name.
fn check(get: impl Fn(&str) -> Vec<String>, host: &str) {
    assert_eq!(get("host"), [host]);
    assert_eq!(
        get("authorization"),
        ["Bearer team"],
        "never the client's token"
    );
    assert!(get("cookie").is_empty() && get("x-forwarded-for").is_empty());
    assert_eq!(
        get("mcp-method"),
        ["extra"],
        "extra over static over the client's"
    );
    assert_eq!(get("x-api-key"), ["static"]);
    assert_eq!(get("mcp-param-region"), ["eu"]);
    assert_eq!(get("content-type"), ["application/json"]);
    assert_eq!(get("traceparent").len(), 1);
}

#[test]
fn the_request_carries_allowlisted_client_headers_only() {
    let up = upstream("http://127.0.0.1:9/mcp");
    let req = up.request(&client_headers(), &extra(), Bytes::from_static(b"{}"));
    assert_eq!(req.uri().path(), "/mcp");
    let get = |n: &str| {
        req.headers()
            .get_all(n)
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    check(get, "127.0.0.1:9");
}

/// The lean client writes the same head as `request` builds, straight from the client's
/// headers, and relays the answer.
#[tokio::test]
async fn the_lean_client_writes_the_same_head_and_relays_the_answer() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = tcp.read(&mut chunk).await.unwrap();
            assert!(n > 0, "request head");
            buf.extend_from_slice(&chunk[..n]);
        }
        let answer = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}";
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            answer.len()
        );
        tcp.write_all(head.as_bytes()).await.unwrap();
        tcp.write_all(answer).await.unwrap();
        buf
    });
    let up = upstream(&format!("http://{addr}/mcp"));
    let deadline = Instant::now() + Duration::from_secs(5);
    let body = Bytes::from_static(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\"}");
    let ex = up
        .forward(&client_headers(), &extra(), &body, deadline)
        .await
        .expect("exchange");
    assert_eq!(ex.response.status(), 200);
    let (_, relay) = up.relay(ex, deadline, Bytes::new());
    use http_body_util::BodyExt;
    let got = relay.collect().await.expect("body").to_bytes();
    assert_eq!(&got[..], b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}");
    let wire = tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("served")
        .unwrap();
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut parsed = httparse::Request::new(&mut headers);
    let head_len = match parsed.parse(&wire).expect("valid HTTP/1.1 head") {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => panic!("partial head"),
    };
    assert_eq!(parsed.method, Some("POST"));
    assert_eq!(parsed.path, Some("/mcp"));
    let get = |n: &str| {
        parsed
            .headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case(n))
            .map(|h| String::from_utf8_lossy(h.value).to_string())
            .collect::<Vec<_>>()
    };
    check(get, &addr.to_string());
    assert_eq!(get("content-length"), [body.len().to_string()]);
    assert_eq!(&wire[head_len..], &body[..]);
}
