//! The core request path (issue: spec-correct Streamable HTTP in front of modern servers).

use crate::common::mock::MockMcp;
use crate::common::*;
use serde_json::json;
use std::time::{Duration, Instant};

fn config(url: &str, extra: &str) -> String {
    format!(
        r#"
[log]
access = false

[[backends]]
name = "m"
url = "{url}"
protocol = "modern"
{extra}

[[backends]]
name = "v"
url = "{url}"
protocol = "modern"
verify_body = "always"
{extra}

[[backends]]
name = "demo"
builtin = "demo"
"#
    )
}

async fn setup() -> (crate::common::mock::MockHandle, Gateway) {
    let mock = MockMcp::modern().start().await;
    let gw = Gateway::start(&config(&mock.url(), "")).await;
    (mock, gw)
}

#[tokio::test]
async fn modern_requests_pass_through_and_answer() {
    let (mock, gw) = setup().await;
    for path in ["/mcp/m", "/mcp/v", "/mcp/demo"] {
        let r = mcp(&gw.url(path), json!(1), "tools/list", json!({})).await;
        assert_eq!(r.status, 200, "{path}: {:?}", r.body);
        let v = r.json();
        assert_eq!(v["id"], 1);
        assert_eq!(v["result"]["resultType"], "complete");
        assert!(
            v["result"]["tools"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t["name"] == "echo")
        );
        let r = mcp(
            &gw.url(path),
            json!("c"),
            "tools/call",
            json!({"name":"echo","arguments":{"text":"hi"}}),
        )
        .await;
        assert_eq!(r.status, 200);
        assert_eq!(r.json()["result"]["content"][0]["text"], "hi", "{path}");
        assert_eq!(r.json()["id"], "c");
    }
    assert_eq!(mock.count("tools/list"), 2);
}

#[tokio::test]
async fn only_post_is_allowed() {
    let (_mock, gw) = setup().await;
    for path in ["/mcp/m", "/mcp/demo"] {
        for method in ["GET", "DELETE", "PUT"] {
            let r = send(
                method,
                &gw.url(path),
                &[("accept", "text/event-stream")],
                "",
            )
            .await;
            assert_eq!(r.status, 405, "{method} {path}");
            assert_eq!(r.header("allow"), Some("POST"));
        }
    }
}

#[tokio::test]
async fn accept_must_admit_json_and_sse() {
    let (mock, gw) = setup().await;
    let body = modern_body(json!(5), "tools/list", json!({}));
    for accept in ["application/json", "text/event-stream", "text/html"] {
        let mut h = modern_headers("tools/list", None);
        h[1] = ("accept", accept);
        let r = send("POST", &gw.url("/mcp/m"), &h, body.clone()).await;
        assert_eq!(r.status, 406, "{accept}");
        assert_eq!(r.code(), -32600);
        assert_eq!(r.json()["id"], 5, "errors echo the id when it can be read");
    }
    assert_eq!(mock.count("tools/list"), 0);
}

#[tokio::test]
async fn content_type_must_be_json() {
    let (_mock, gw) = setup().await;
    let mut h = modern_headers("tools/list", None);
    h[0] = ("content-type", "text/plain");
    let r = send(
        "POST",
        &gw.url("/mcp/m"),
        &h,
        modern_body(json!(1), "tools/list", json!({})),
    )
    .await;
    assert_eq!(r.status, 415);
    assert_eq!(r.code(), -32600);
}

#[tokio::test]
async fn batches_are_refused_with_an_error_never_silence() {
    let (mock, gw) = setup().await;
    let one = modern_body(json!(1), "tools/list", json!({}));
    let batch = format!("[{one},{one}]");
    for path in ["/mcp/m", "/mcp/v", "/mcp/demo"] {
        let r = send(
            "POST",
            &gw.url(path),
            &modern_headers("tools/list", None),
            batch.clone(),
        )
        .await;
        assert_eq!(r.status, 400, "{path}");
        assert_eq!(r.code(), -32600, "{path}");
        assert!(
            r.json()["error"]["message"]
                .as_str()
                .unwrap()
                .contains("batch")
        );
    }
    assert_eq!(mock.count("tools/list"), 0);
}

#[tokio::test]
async fn malformed_json_is_a_parse_error() {
    let (mock, gw) = setup().await;
    for path in ["/mcp/m", "/mcp/v", "/mcp/demo"] {
        for body in ["{\"jsonrpc\":\"2.0\",", "not json", ""] {
            let r = send(
                "POST",
                &gw.url(path),
                &modern_headers("tools/list", None),
                body,
            )
            .await;
            assert_eq!(r.status, 400, "{path} {body:?}");
            assert_eq!(r.code(), -32700, "{path} {body:?}");
            assert!(r.json().get("id").is_none(), "no id could be read");
        }
    }
    assert_eq!(mock.count("tools/list"), 0);
}

#[tokio::test]
async fn required_headers_are_enforced() {
    let (mock, gw) = setup().await;
    let body = modern_body(
        json!(9),
        "tools/call",
        json!({"name":"echo","arguments":{}}),
    );
    for path in ["/mcp/m", "/mcp/v", "/mcp/demo"] {
        // No MCP-Protocol-Version.
        let h: Vec<_> = modern_headers("tools/call", Some("echo"))
            .into_iter()
            .filter(|(k, _)| *k != "mcp-protocol-version")
            .collect();
        let r = send("POST", &gw.url(path), &h, body.clone()).await;
        assert_eq!((r.status, r.code()), (400, -32020), "{path}: no version");
        assert_eq!(r.json()["id"], 9);
        // No Mcp-Method.
        let h: Vec<_> = modern_headers("tools/call", Some("echo"))
            .into_iter()
            .filter(|(k, _)| *k != "mcp-method")
            .collect();
        let r = send("POST", &gw.url(path), &h, body.clone()).await;
        assert_eq!((r.status, r.code()), (400, -32020), "{path}: no method");
        assert_eq!(r.json()["id"], 9);
        // No Mcp-Name on tools/call.
        let r = send(
            "POST",
            &gw.url(path),
            &modern_headers("tools/call", None),
            body.clone(),
        )
        .await;
        assert_eq!((r.status, r.code()), (400, -32020), "{path}: no name");
        // Mcp-Name with bad encoding.
        let r = send(
            "POST",
            &gw.url(path),
            &modern_headers("tools/call", Some("=?base64?!!?=")),
            body.clone(),
        )
        .await;
        assert_eq!(
            (r.status, r.code()),
            (400, -32020),
            "{path}: bad name encoding"
        );
    }
    assert_eq!(mock.count("tools/call"), 0);
}

#[tokio::test]
async fn headers_must_match_the_body_when_it_is_read() {
    let (mock, gw) = setup().await;
    // Mcp-Name says echo, the body calls whoami: refused before anything is forwarded.
    let body = modern_body(
        json!(3),
        "tools/call",
        json!({"name":"whoami","arguments":{}}),
    );
    for path in ["/mcp/v", "/mcp/demo"] {
        let r = send(
            "POST",
            &gw.url(path),
            &modern_headers("tools/call", Some("echo")),
            body.clone(),
        )
        .await;
        assert_eq!((r.status, r.code()), (400, -32020), "{path}");
        assert_eq!(r.json()["id"], 3);
        // Method header disagreeing with the body.
        let r = send(
            "POST",
            &gw.url(path),
            &modern_headers("tools/list", None),
            body.clone(),
        )
        .await;
        assert_eq!((r.status, r.code()), (400, -32020), "{path}");
        // Version header disagreeing with _meta.
        let mut h = modern_headers("tools/call", Some("whoami"));
        h[2] = ("mcp-protocol-version", "2099-01-01");
        let r = send("POST", &gw.url(path), &h, body.clone()).await;
        assert_eq!((r.status, r.code()), (400, -32020), "{path}");
    }
    assert_eq!(mock.count("tools/call"), 0, "nothing reached the backend");
    // On the pass-through route the modern backend does the same check itself.
    let r = send(
        "POST",
        &gw.url("/mcp/m"),
        &modern_headers("tools/call", Some("echo")),
        body,
    )
    .await;
    assert_eq!((r.status, r.code()), (400, -32020));
}

#[tokio::test]
async fn missing_meta_is_invalid_params() {
    let (mock, gw) = setup().await;
    for (meta, what) in [
        (json!({}), "both"),
        (
            json!({"io.modelcontextprotocol/protocolVersion": LATEST}),
            "capabilities",
        ),
        (
            json!({"io.modelcontextprotocol/clientCapabilities": {}}),
            "version",
        ),
    ] {
        let body = json!({"jsonrpc":"2.0","id":4,"method":"tools/list","params":{"_meta":meta}})
            .to_string();
        for path in ["/mcp/v", "/mcp/demo", "/mcp/m"] {
            let r = send(
                "POST",
                &gw.url(path),
                &modern_headers("tools/list", None),
                body.clone(),
            )
            .await;
            assert_eq!((r.status, r.code()), (400, -32602), "{path} missing {what}");
            assert_eq!(r.json()["id"], 4);
        }
    }
    let body = json!({"jsonrpc":"2.0","id":4,"method":"tools/list"}).to_string();
    let r = send(
        "POST",
        &gw.url("/mcp/v"),
        &modern_headers("tools/list", None),
        body,
    )
    .await;
    assert_eq!((r.status, r.code()), (400, -32602), "no params at all");
    // `tools/list` is cacheable, so portico reads and checks it on every route (the cache key
    // comes from the body): no malformed list request reached a backend.
    assert_eq!(mock.count("tools/list"), 0);
}

#[tokio::test]
async fn unsupported_version_names_what_is_supported() {
    let (_mock, gw) = setup().await;
    let body = json!({"jsonrpc":"2.0","id":8,"method":"tools/list","params":{"_meta":{
        "io.modelcontextprotocol/protocolVersion":"2099-01-01","io.modelcontextprotocol/clientCapabilities":{}}}})
    .to_string();
    let mut h = modern_headers("tools/list", None);
    h[2] = ("mcp-protocol-version", "2099-01-01");
    for path in ["/mcp/m", "/mcp/demo"] {
        let r = send("POST", &gw.url(path), &h, body.clone()).await;
        assert_eq!((r.status, r.code()), (400, -32022), "{path}");
        let v = r.json();
        assert_eq!(v["error"]["data"]["requested"], "2099-01-01");
        assert!(
            v["error"]["data"]["supported"]
                .as_array()
                .unwrap()
                .contains(&json!(LATEST))
        );
    }
}

#[tokio::test]
async fn notifications_are_accepted_with_202() {
    let (_mock, gw) = setup().await;
    let body = json!({"jsonrpc":"2.0","method":"notifications/something","params":{}}).to_string();
    for path in ["/mcp/m", "/mcp/v", "/mcp/demo"] {
        let r = send(
            "POST",
            &gw.url(path),
            &modern_headers("notifications/something", None),
            body.clone(),
        )
        .await;
        assert_eq!(r.status, 202, "{path}");
        assert!(r.body.is_empty());
    }
}

#[tokio::test]
async fn foreign_origins_are_forbidden() {
    let (mock, gw) = setup().await;
    let body = modern_body(json!(1), "tools/list", json!({}));
    let mut h = modern_headers("tools/list", None);
    h.push(("origin", "https://evil.example"));
    let r = send("POST", &gw.url("/mcp/m"), &h, body.clone()).await;
    assert_eq!(r.status, 403);
    h.pop();
    h.push(("origin", "http://localhost:6274"));
    let r = send("POST", &gw.url("/mcp/m"), &h, body.clone()).await;
    assert_eq!(r.status, 200, "loopback origins are allowed by default");
    assert_eq!(mock.count("tools/list"), 1);
    // Every method that reaches a session, not POST alone: a foreign page neither opens a
    // legacy stream nor ends a session (the refusal comes before the session id is read).
    for method in ["GET", "DELETE"] {
        let h = [
            ("origin", "https://evil.example"),
            ("mcp-session-id", "any"),
        ];
        let r = send(method, &gw.url("/mcp/m"), &h, "").await;
        assert_eq!(r.status, 403, "{method}: {:?}", r.body);
        let h = [
            ("origin", "http://localhost:6274"),
            ("mcp-session-id", "any"),
        ];
        let r = send(method, &gw.url("/mcp/m"), &h, "").await;
        assert_ne!(r.status, 403, "{method} from a loopback origin");
    }
    // A configured allow list replaces the default.
    let gw2 = Gateway::start(&format!(
        "[server]\nallowed_origins = [\"https://app.example\"]\n{}",
        config(&mock.url(), "")
    ))
    .await;
    let r = send("POST", &gw2.url("/mcp/m"), &h, body.clone()).await;
    assert_eq!(r.status, 403);
    h.pop();
    h.push(("origin", "https://app.example"));
    let r = send("POST", &gw2.url("/mcp/m"), &h, body).await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn oversized_bodies_get_413_with_a_jsonrpc_error() {
    let mock = MockMcp::modern().start().await;
    let gw = Gateway::start(&format!(
        "[server]\nmax_body_bytes = 1024\n{}",
        config(&mock.url(), "")
    ))
    .await;
    let big = modern_body(
        json!(1),
        "tools/call",
        json!({"name":"echo","arguments":{"text":"x".repeat(2000)}}),
    );
    let r = send(
        "POST",
        &gw.url("/mcp/m"),
        &modern_headers("tools/call", Some("echo")),
        big.clone(),
    )
    .await;
    assert_eq!(r.status, 413);
    assert_eq!(r.code(), -32600);
    // Default limit is 4 MiB: the same body passes on a default gateway.
    let gw2 = Gateway::start(&config(&mock.url(), "")).await;
    let r = send(
        "POST",
        &gw2.url("/mcp/m"),
        &modern_headers("tools/call", Some("echo")),
        big,
    )
    .await;
    assert_eq!(r.status, 200);
    let r = send(
        "POST",
        &gw2.url("/mcp/m"),
        &modern_headers("tools/call", Some("echo")),
        vec![b' '; 4 * 1024 * 1024 + 1],
    )
    .await;
    assert_eq!(r.status, 413);
}

#[tokio::test]
async fn oversized_chunked_bodies_get_413() {
    use http_body_util::StreamBody;
    use hyper::body::Frame;
    let mock = MockMcp::modern().start().await;
    let gw = Gateway::start(&format!(
        "[server]\nmax_body_bytes = 1024\n{}",
        config(&mock.url(), "")
    ))
    .await;
    // No Content-Length: the limit is enforced while reading.
    let chunks: Vec<Result<Frame<bytes::Bytes>, std::convert::Infallible>> = (0..10)
        .map(|_| Ok(Frame::data(bytes::Bytes::from(vec![b' '; 500]))))
        .collect();
    let body = StreamBody::new(futures_util::stream::iter(chunks));
    let mut req = http::Request::builder()
        .method("POST")
        .uri(gw.url("/mcp/m"));
    for (k, v) in modern_headers("tools/list", None) {
        req = req.header(k, v);
    }
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let resp = client.request(req.body(body).unwrap()).await.unwrap();
    assert_eq!(resp.status(), 413);
}

#[tokio::test]
async fn unknown_backend_is_404_with_jsonrpc_error() {
    let (_mock, gw) = setup().await;
    let r = mcp(&gw.url("/mcp/nope"), json!(1), "tools/list", json!({})).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.code(), -32600);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/mcp/nope")
    );
    let r = mcp(&gw.url("/elsewhere"), json!(1), "tools/list", json!({})).await;
    assert_eq!(r.status, 404);
}

/// Reads SSE messages off a streaming response as they arrive, with arrival times.
async fn read_events(
    resp: http::Response<hyper::body::Incoming>,
    limit: usize,
) -> Vec<(Instant, serde_json::Value)> {
    use http_body_util::BodyExt;
    let mut body = resp.into_body();
    let mut dec = portico::sse::SseDecoder::new(1 << 20);
    let mut out = Vec::new();
    while out.len() < limit {
        let Some(frame) = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("frame in time")
        else {
            break;
        };
        if let Ok(data) = frame.unwrap().into_data() {
            dec.push(&data);
            while let Ok(Some(ev)) = dec.next_event() {
                out.push((Instant::now(), serde_json::from_slice(&ev).unwrap()));
            }
        }
    }
    out
}

#[tokio::test]
async fn progress_arrives_before_the_result() {
    let mock = MockMcp::modern().sse().start().await;
    let gw = Gateway::start(&config(&mock.url(), "")).await;
    for path in ["/mcp/m", "/mcp/v", "/mcp/demo"] {
        let params = json!({"name":"progress","arguments":{"steps":3,"delay_ms":150},"_meta":{"progressToken":"tok"}});
        let h = modern_headers("tools/call", Some("progress"));
        let resp = send_stream(
            "POST",
            &gw.url(path),
            &h,
            modern_body(json!(11), "tools/call", params),
        )
        .await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        assert_eq!(resp.headers()["x-accel-buffering"], "no");
        let events = read_events(resp, 10).await;
        assert_eq!(events.len(), 4, "{path}: 3 progress + result");
        for (i, (_, e)) in events[..3].iter().enumerate() {
            assert_eq!(e["method"], "notifications/progress", "{path}");
            assert_eq!(e["params"]["progress"], i as u64 + 1);
            assert_eq!(e["params"]["progressToken"], "tok");
        }
        assert_eq!(events[3].1["id"], 11);
        assert!(
            events[3].1["result"]["content"][0]["text"]
                .as_str()
                .unwrap()
                .contains("3")
        );
        // Relayed as they happen, not buffered: the first progress came well before the result.
        let gap = events[3].0 - events[0].0;
        assert!(
            gap >= Duration::from_millis(200),
            "{path}: progress was buffered ({gap:?})"
        );
    }
}

#[tokio::test]
async fn client_disconnect_closes_the_upstream_stream() {
    // Pass-through (m) and body-checked message path (v, demo's sibling path).
    for path in ["/mcp/m", "/mcp/v"] {
        let mock = MockMcp::modern().sse().start().await;
        let gw = Gateway::start(&config(&mock.url(), "")).await;
        let params = json!({"name":"progress","arguments":{"steps":200,"delay_ms":30},"_meta":{"progressToken":1}});
        let resp = send_stream(
            "POST",
            &gw.url(path),
            &modern_headers("tools/call", Some("progress")),
            modern_body(json!(1), "tools/call", params),
        )
        .await;
        let first = read_events(resp, 1).await; // reads one event, then drops the stream
        assert_eq!(first.len(), 1);
        assert!(
            mock.wait_cancelled(Duration::from_secs(3)).await,
            "backend never saw its stream close ({path})"
        );
    }
}

#[tokio::test]
async fn unreachable_backend_is_502_naming_it() {
    // A port nothing listens on.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}/mcp", l.local_addr().unwrap());
    drop(l);
    let gw = Gateway::start(&format!(
        "[log]\naccess=false\n[[backends]]\nname = \"gone\"\nurl = \"{dead}\"\nprotocol = \"modern\"\ntimeout_ms = 2000\n"
    ))
    .await;
    let start = Instant::now();
    let r = mcp(&gw.url("/mcp/gone"), json!(1), "tools/list", json!({})).await;
    assert!(start.elapsed() < Duration::from_secs(2));
    assert_eq!(r.status, 502);
    assert_eq!(r.json()["id"], 1);
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("gone"), "{msg}");
    assert!(
        !msg.contains("127.0.0.1") && !msg.to_lowercase().contains("refused"),
        "no internals: {msg}"
    );
}

#[tokio::test]
async fn slow_backend_is_504_within_the_timeout() {
    let mock = MockMcp::modern().start().await;
    let gw = Gateway::start(&config(&mock.url(), "timeout_ms = 300")).await;
    let start = Instant::now();
    let r = mcp(
        &gw.url("/mcp/m"),
        json!(2),
        "tools/call",
        json!({"name":"slow","arguments":{"ms":5000}}),
    )
    .await;
    let took = start.elapsed();
    assert_eq!(r.status, 504);
    assert_eq!(r.json()["id"], 2);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("m "),
        "names the backend"
    );
    assert!(
        took >= Duration::from_millis(290) && took < Duration::from_millis(1500),
        "{took:?}"
    );
    // An SSE answer that stalls past the deadline ends with an in-stream error for the id.
    let mock = MockMcp::modern().sse().start().await;
    let gw = Gateway::start(&config(&mock.url(), "timeout_ms = 300")).await;
    let start = Instant::now();
    let r = mcp(
        &gw.url("/mcp/m"),
        json!(3),
        "tools/call",
        json!({"name":"slow","arguments":{"ms":5000}}),
    )
    .await;
    assert!(start.elapsed() < Duration::from_millis(1500));
    assert_eq!(r.status, 200);
    let last = r.result();
    assert_eq!(last["id"], 3);
    assert_eq!(last["error"]["code"], -32603);
}

#[tokio::test]
async fn client_credentials_never_reach_the_backend() {
    let mock = MockMcp::modern().start().await;
    let gw = Gateway::start(&config(
        &mock.url(),
        "headers = { \"X-Upstream-Key\" = \"k-${CARGO_PKG_NAME}\" }",
    ))
    .await;
    for path in ["/mcp/m", "/mcp/v"] {
        let extra = [
            ("authorization", "Bearer client-secret"),
            ("cookie", "session=abc"),
            ("connection", "keep-alive, x-hop"),
            ("x-hop", "1"),
            ("proxy-authorization", "Basic xyz"),
            (
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
            ("mcp-param-region", "eu"),
        ];
        let r = mcp_with(
            &gw.url(path),
            json!(1),
            "tools/call",
            json!({"name":"whoami","arguments":{}}),
            &extra,
        )
        .await;
        assert_eq!(r.status, 200);
        assert_eq!(r.json()["result"]["content"][0]["text"], "none", "{path}");
    }
    for seen in mock.seen() {
        let h = &seen.headers;
        assert!(h.get("authorization").is_none());
        assert!(h.get("cookie").is_none());
        assert!(h.get("x-hop").is_none());
        assert!(h.get("proxy-authorization").is_none());
        assert_eq!(
            h["traceparent"],
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        );
        assert_eq!(h["mcp-param-region"], "eu");
        assert_eq!(
            h["x-upstream-key"], "k-portico",
            "static header, env expanded (cargo sets CARGO_PKG_NAME)"
        );
        assert_eq!(h["mcp-method"], "tools/call");
    }
}

#[tokio::test]
async fn http2_clients_are_served() {
    let (_mock, gw) = setup().await;
    let body = modern_body(json!(1), "tools/list", json!({}));
    let req = modern_request(&gw.url("/mcp/m"), "tools/list", None, body);
    let resp = h2_client().request(req).await.unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn a_refused_bad_request_does_not_make_portico_reprobe() {
    // An `auto` backend found modern: a client request it refuses as malformed (no `_meta`) is
    // relayed as is, and costs the backend no re-probe (no amplification by bad clients).
    let mock = MockMcp::modern().start().await;
    let gw = Gateway::start(&format!(
        "[log]\naccess = false\n[[backends]]\nname = \"a\"\nurl = \"{}\"\n",
        mock.url()
    ))
    .await;
    let url = gw.url("/mcp/a");
    let ok = mcp(
        &url,
        json!(1),
        "tools/call",
        json!({"name":"echo","arguments":{"text":"x"}}),
    )
    .await;
    assert_eq!(ok.status, 200);
    let probes = mock.count("server/discover");
    assert_eq!(probes, 1);
    for id in 2..6 {
        let body =
            json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}})
                .to_string();
        let r = send(
            "POST",
            &url,
            &modern_headers("tools/call", Some("echo")),
            body,
        )
        .await;
        assert_eq!(r.status, 400, "{:?}", r.body);
        assert_eq!(r.code(), -32602);
        assert_eq!(r.json()["id"], id);
    }
    assert_eq!(mock.count("server/discover"), probes, "no re-probe");
}
