//! Reliability: hot reload and drain under load lose no request; a backend killed mid-load
//! gives every client an error within its timeout, opens the breaker, and the breaker closes
//! once the backend is back. SSE limits: idle streams get keep-alive comments, and a stream
//! that runs past `max_stream_ms` ends with an error for its request.

use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::common::mcp;
use crate::common::mock::MockMcp;

fn backend(name: &str, url: &str) -> String {
    format!("[[backends]]\nname = \"{name}\"\nurl = \"{url}\"\nprotocol = \"modern\"\n")
}

/// Runs `workers` loops of `tools/list` until `stop`; returns (sent, answered 200, other).
fn load(
    url: String,
    workers: usize,
    stop: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<(u64, u64, Vec<u16>)>> {
    (0..workers)
        .map(|w| {
            let url = url.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let (mut sent, mut ok, mut other) = (0, 0, Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    sent += 1;
                    let r = mcp(
                        &url,
                        json!(w * 100_000 + sent as usize),
                        "tools/list",
                        json!({}),
                    )
                    .await;
                    if r.status == 200 {
                        ok += 1;
                    } else {
                        other.push(r.status);
                    }
                }
                (sent, ok, other)
            })
        })
        .collect()
}

#[tokio::test]
async fn hot_reload_then_drain_under_load_loses_no_request() {
    let mock = MockMcp::modern().start().await;
    let dir = std::env::temp_dir().join(format!("portico-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("portico.toml");
    let base = format!(
        "[server]\ndrain_timeout_ms = 10000\n{}",
        backend("a", &mock.url())
    );
    std::fs::write(&path, &base).unwrap();

    let mut gw = crate::common::Gateway::start_reloading(&path).await;
    let addr = gw.addr;
    let url = |p: &str| format!("http://{addr}{p}");

    let stop = Arc::new(AtomicBool::new(false));
    let workers = load(url("/mcp/a"), 4, stop.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;

    // An invalid file is refused; the old config keeps serving.
    std::fs::write(&path, format!("{base}[[backends]]\nname = \"b\"\n")).unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        mcp(&url("/mcp/a"), json!(1), "tools/list", json!({}))
            .await
            .status,
        200
    );
    assert_eq!(
        mcp(&url("/mcp/b"), json!(1), "tools/list", json!({}))
            .await
            .status,
        404
    );

    // A valid change is picked up (backend b appears) while the load runs.
    std::fs::write(&path, format!("{base}{}", backend("b", &mock.url()))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if mcp(&url("/mcp/b"), json!(1), "tools/list", json!({}))
            .await
            .status
            == 200
        {
            break;
        }
        assert!(Instant::now() < deadline, "reload not picked up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut sent, mut ok) = (0, 0);
    for w in workers {
        let (s, o, other) = w.await.unwrap();
        assert!(other.is_empty(), "non-200 answers during reload: {other:?}");
        sent += s;
        ok += o;
    }
    assert_eq!(sent, ok);
    assert!(sent > 20, "the load ran ({sent} requests)");

    // Drain: slow calls in flight when shutdown starts all finish.
    let calls_before = mock.count("tools/call");
    let slow: Vec<_> = (0..8)
        .map(|i| {
            let u = url("/mcp/b");
            tokio::spawn(async move {
                mcp(
                    &u,
                    json!(i),
                    "tools/call",
                    json!({"name": "slow", "arguments": {"ms": 700}}),
                )
                .await
                .status
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while mock.count("tools/call") < calls_before + 8 {
        assert!(Instant::now() < deadline, "slow calls did not start");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    gw.begin_stop();
    let mut drained = 0;
    for s in slow {
        assert_eq!(s.await.unwrap(), 200);
        drained += 1;
    }
    assert_eq!(drained, 8);
    assert!(gw.stopped().await, "the gateway stops after the drain");
    eprintln!("reload+drain: {sent} requests under load, {drained} drained, 0 lost");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_killed_backend_fails_fast_opens_the_breaker_and_it_closes_again() {
    let mock = MockMcp::modern().ttl_ms(None).start().await;
    let mock_addr = mock.addr;
    let gw = crate::common::Gateway::start(&format!(
        "{}timeout_ms = 2000\nbreaker_failures = 3\nbreaker_open_ms = 300\n",
        backend("m", &mock.url())
    ))
    .await;
    let url = gw.url("/mcp/m");
    assert_eq!(
        mcp(&url, json!(1), "tools/list", json!({})).await.status,
        200
    );

    // Clients under load; each records how long every answer took.
    let stop = Arc::new(AtomicBool::new(false));
    let slowest = Arc::new(AtomicU64::new(0));
    let statuses = Arc::new(std::sync::Mutex::new(Vec::<u16>::new()));
    let clients: Vec<_> = (0..4)
        .map(|i| {
            let (url, stop, slowest, statuses) =
                (url.clone(), stop.clone(), slowest.clone(), statuses.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let t = Instant::now();
                    let r = tokio::time::timeout(
                        Duration::from_secs(5),
                        mcp(&url, json!(i * 10_000 + n), "tools/list", json!({})),
                    )
                    .await
                    .expect("no client hangs");
                    slowest.fetch_max(t.elapsed().as_millis() as u64, Ordering::Relaxed);
                    statuses.lock().unwrap().push(r.status);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(mock); // killed: listener closed, connections aborted
    tokio::time::sleep(Duration::from_millis(500)).await;
    // While the backend is down every answer is an error; with the breaker open, a fast 503.
    let open = mcp(&url, json!(9), "tools/list", json!({})).await;
    assert_eq!(open.status, 503, "{:?}", open.body);
    assert!(
        open.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("circuit breaker")
    );

    // The backend comes back on the same port: after the open period one probe goes through
    // and the breaker closes.
    let listener = tokio::net::TcpListener::bind(mock_addr).await.unwrap();
    let mock = MockMcp::modern().ttl_ms(None).start_on(listener).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if mcp(&url, json!(10), "tools/list", json!({})).await.status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "breaker never closed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let statuses = statuses.lock().unwrap().clone();
    assert!(
        statuses.iter().all(|s| matches!(s, 200 | 502 | 503 | 504)),
        "{statuses:?}"
    );
    assert!(statuses.contains(&503), "the breaker opened under load");
    assert!(
        slowest.load(Ordering::Relaxed) < 2500,
        "every client got its answer within the backend timeout"
    );
    assert!(mock.count("tools/list") >= 1);
    gw.stop().await;
}

// === SSE limits ===

/// Everything a streamed response sends within `within` (or until it ends), as text, and
/// whether it ended.
async fn read_raw(resp: http::Response<hyper::body::Incoming>, within: Duration) -> (String, bool) {
    use http_body_util::BodyExt;
    let mut body = resp.into_body();
    let end = tokio::time::Instant::now() + within;
    let mut out = Vec::new();
    loop {
        match tokio::time::timeout_at(end, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    out.extend_from_slice(&data);
                }
            }
            Ok(_) => return (String::from_utf8_lossy(&out).into_owned(), true),
            Err(_) => return (String::from_utf8_lossy(&out).into_owned(), false),
        }
    }
}

async fn listen(url: &str) -> http::Response<hyper::body::Incoming> {
    use crate::common::{modern_body, modern_headers, send_stream};
    let resp = send_stream(
        "POST",
        url,
        &modern_headers("subscriptions/listen", None),
        modern_body(
            json!("L1"),
            "subscriptions/listen",
            json!({"notifications":{"toolsListChanged":true}}),
        ),
    )
    .await;
    assert_eq!(resp.status(), 200);
    resp
}

/// A quiet relayed listen stream gets `: keep-alive` comments at the configured idle
/// interval; with the interval at 0 it gets none.
#[tokio::test]
async fn idle_sse_streams_get_keep_alive_comments() {
    let mock = MockMcp::modern().list_changed().start().await;
    for (keepalive, want) in [(100, true), (0, false)] {
        let gw = crate::common::Gateway::start(&format!(
            "[server]\nsse_keepalive_ms = {keepalive}\n{}",
            backend("m", &mock.url())
        ))
        .await;
        let (text, ended) =
            read_raw(listen(&gw.url("/mcp/m")).await, Duration::from_millis(550)).await;
        assert!(!ended, "a listen stream stays open: {text}");
        assert!(
            text.contains("notifications/subscriptions/acknowledged"),
            "{text}"
        );
        let beats = text.matches(": keep-alive\n\n").count();
        if want {
            assert!(
                (2..=6).contains(&beats),
                "{beats} keep-alives in 550 ms: {text:?}"
            );
        } else {
            assert_eq!(beats, 0, "{text:?}");
        }
        gw.stop().await;
    }
}

/// `max_stream_ms` ends a long stream with a JSON-RPC error for its request id.
#[tokio::test]
async fn a_stream_past_max_stream_ms_ends_with_an_error_event() {
    let mock = MockMcp::modern().list_changed().start().await;
    let gw = crate::common::Gateway::start(&format!(
        "[server]\nmax_stream_ms = 300\n{}",
        backend("m", &mock.url())
    ))
    .await;
    let started = Instant::now();
    let (text, ended) = read_raw(listen(&gw.url("/mcp/m")).await, Duration::from_secs(5)).await;
    assert!(ended, "the stream was ended: {text}");
    assert!(started.elapsed() < Duration::from_secs(3));
    let mut dec = portico::sse::SseDecoder::new(1 << 20);
    dec.push(text.as_bytes());
    let mut events = Vec::new();
    while let Ok(Some(ev)) = dec.next_event() {
        events.push(serde_json::from_slice::<serde_json::Value>(&ev).unwrap());
    }
    let last = events.last().expect("events");
    assert_eq!(last["id"], "L1", "{events:?}");
    assert_eq!(last["error"]["code"], -32603, "{last}");
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_stream_ms"),
        "{last}"
    );
    gw.stop().await;
}
