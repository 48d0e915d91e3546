//! Observability (issue 7): the metrics listener (`/metrics`, `/healthz`, `/readyz`) scraped
//! after real traffic through portico to real backends (the HTTP mock, a legacy mock, a stdio
//! child and the built-in demo); JSON access log lines carry the client's `traceparent`, which
//! also reaches the backend. What ships beside the binary (alert rules, dashboard, Kubernetes
//! manifests) is checked in `deploy`.

use crate::common::mock::MockMcp;
use crate::common::*;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};

pub(crate) const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const STDIO_MOCK: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/gateway/fixtures/stdio_mock.py"
);
const CAROL: &str = "observe-carol-key-0123456789";
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

// === Scrape parsing ===

/// One sample line of the text format.
#[derive(Debug)]
pub(crate) struct Sample {
    pub(crate) name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

fn parse_scrape(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("sample has a value");
            let (name, labels) = match series.split_once('{') {
                None => (series.to_string(), BTreeMap::new()),
                Some((name, rest)) => {
                    let body = rest.strip_suffix('}').expect("closing brace");
                    let labels = body
                        .split("\",")
                        .filter(|p| !p.is_empty())
                        .map(|p| {
                            let (k, v) = p.split_once("=\"").expect("label k=\"v\"");
                            (k.to_string(), v.trim_end_matches('"').to_string())
                        })
                        .collect();
                    (name.to_string(), labels)
                }
            };
            Sample {
                name,
                labels,
                value: value.parse().expect("numeric value"),
            }
        })
        .collect()
}

/// Sum of the samples called `name` whose labels include `labels`.
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .sum()
}

fn has(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> bool {
    samples.iter().any(|s| {
        s.name == name
            && labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
    })
}

pub(crate) async fn scrape_text(gw: &Gateway) -> String {
    let r = send("GET", &gw.metrics_url("/metrics"), &[], "").await;
    assert_eq!(r.status, 200);
    assert!(
        r.header("content-type")
            .is_some_and(|c| c.starts_with("text/plain; version=0.0.4")),
        "{:?}",
        r.header("content-type")
    );
    String::from_utf8(r.body.to_vec()).expect("UTF-8 exposition")
}

pub(crate) async fn scrape(gw: &Gateway) -> Vec<Sample> {
    parse_scrape(&scrape_text(gw).await)
}

/// Scrapes until `cond` holds (state that settles asynchronously: health checks, restarts).
async fn scrape_until(gw: &Gateway, what: &str, cond: impl Fn(&[Sample]) -> bool) -> Vec<Sample> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let s = scrape(gw).await;
        if cond(&s) {
            return s;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// === Setup ===

/// A port nothing listens on.
async fn dead_port() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap().port()
}

/// Every kind of backend: modern HTTP (`m`), legacy HTTP (`old`), stdio (`s`), the built-in demo,
/// and an unreachable one (`dead`).
pub(crate) async fn full_setup() -> (
    crate::common::mock::MockHandle,
    crate::common::mock::MockHandle,
    Gateway,
) {
    let mock = MockMcp::modern().start().await;
    let legacy = MockMcp::legacy().start().await;
    let dead = dead_port().await;
    let toml = format!(
        r#"
[log]
access = false

[metrics]
health_interval_ms = 200
health_timeout_ms = 2000

[[backends]]
name = "m"
url = "{m}"

[[backends]]
name = "old"
url = "{old}"

[[backends]]
name = "s"
command = ["python3", "{stdio}", "--modern"]

[[backends]]
name = "demo"
builtin = "demo"

[[backends]]
name = "dead"
url = "http://127.0.0.1:{dead}/mcp"
protocol = "modern"
timeout_ms = 2000
"#,
        m = mock.url(),
        old = legacy.url(),
        stdio = STDIO_MOCK,
    );
    let gw = Gateway::start(&toml).await;
    (mock, legacy, gw)
}

async fn echo(gw: &Gateway, path: &str, text: &str) -> Resp {
    mcp(
        &gw.url(path),
        json!(1),
        "tools/call",
        json!({"name":"echo","arguments":{"text":text}}),
    )
    .await
}

// === Tests ===

#[tokio::test]
async fn counters_follow_real_traffic() {
    let (mock, legacy, gw) = full_setup().await;
    for i in 0..5 {
        let r = mcp(&gw.url("/mcp/m"), json!(i), "tools/list", json!({})).await;
        assert_eq!(r.status, 200);
    }
    for _ in 0..3 {
        assert_eq!(echo(&gw, "/mcp/demo", "hi").await.status, 200);
    }
    assert_eq!(echo(&gw, "/mcp/s", "hi").await.status, 200);
    let r = mcp(&gw.url("/mcp/old"), json!(1), "tools/list", json!({})).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    // A client error: the wrong content type.
    let mut h = modern_headers("tools/list", None);
    h[0] = ("content-type", "text/plain");
    let body = modern_body(json!(9), "tools/list", json!({}));
    assert_eq!(send("POST", &gw.url("/mcp/m"), &h, body).await.status, 415);
    // Two backend errors: nothing listens behind `dead`.
    for _ in 0..2 {
        let r = mcp(&gw.url("/mcp/dead"), json!(1), "tools/list", json!({})).await;
        assert_eq!(r.status, 502);
    }
    // The mock's list is cacheable (ttlMs 60 s): one miss, then four hits.
    assert_eq!(mock.count("tools/list"), 1);
    assert_eq!(legacy.count("tools/list"), 1);

    let s = scrape_until(&gw, "health checks of every backend", |s| {
        value(s, "portico_backend_up", &[("backend", "m")]) == 1.0
            && value(s, "portico_backend_up", &[("backend", "s")]) == 1.0
            && value(s, "portico_backend_up", &[("backend", "old")]) == 1.0
    })
    .await;
    let req = |backend: &str, method: &str, outcome: &str| {
        value(
            &s,
            "portico_requests_total",
            &[
                ("endpoint", backend),
                ("backend", backend),
                ("method", method),
                ("outcome", outcome),
            ],
        )
    };
    assert_eq!(req("m", "tools/list", "ok"), 5.0);
    // Refused before the method was read: counted, with method "none".
    assert_eq!(req("m", "none", "client_error"), 1.0);
    assert_eq!(req("demo", "tools/call", "ok"), 3.0);
    assert_eq!(req("s", "tools/call", "ok"), 1.0);
    assert_eq!(req("old", "tools/list", "ok"), 1.0);
    assert_eq!(req("dead", "tools/list", "backend_error"), 2.0);
    assert_eq!(
        value(
            &s,
            "portico_request_errors_total",
            &[("endpoint", "m"), ("reason", "unsupported_media_type")]
        ),
        1.0
    );
    assert_eq!(
        value(&s, "portico_request_errors_total", &[("endpoint", "dead")]),
        2.0
    );
    // Latency: every request is timed; upstream time only for requests that reached a backend.
    assert_eq!(
        value(
            &s,
            "portico_request_duration_seconds_count",
            &[("endpoint", "m")]
        ),
        6.0
    );
    // Cache hits never wait on a backend: `m` went upstream once for its five lists.
    for (backend, n) in [("m", 1.0), ("demo", 3.0), ("s", 1.0), ("old", 1.0)] {
        assert_eq!(
            value(
                &s,
                "portico_upstream_duration_seconds_count",
                &[("backend", backend)]
            ),
            n,
            "{backend}"
        );
        assert_eq!(
            value(
                &s,
                "portico_upstream_duration_seconds_bucket",
                &[("backend", backend), ("le", "+Inf")]
            ),
            n
        );
    }
    assert_eq!(value(&s, "portico_in_flight_requests", &[]), 0.0);
    // The cache counters moved as the traffic implies: m's list 1 miss + 4 hits; old's list
    // is a miss too (the bridge's default ttlMs 0 means it is not stored).
    assert_eq!(
        value(&s, "portico_cache_requests_total", &[("outcome", "hit")]),
        4.0
    );
    assert!(value(&s, "portico_cache_requests_total", &[("outcome", "miss")]) >= 2.0);
    assert!(value(&s, "portico_cache_inserts_total", &[]) >= 1.0);
    assert!(value(&s, "portico_cache_entries", &[]) >= 1.0);
    // State mirrors.
    assert_eq!(value(&s, "portico_backend_up", &[("backend", "dead")]), 0.0);
    assert_eq!(
        value(
            &s,
            "portico_backend_up",
            &[("backend", "demo"), ("transport", "builtin")]
        ),
        1.0
    );
    for (backend, protocol) in [
        ("m", "modern"),
        ("old", "legacy"),
        ("s", "modern"),
        ("demo", "modern"),
    ] {
        assert_eq!(
            value(
                &s,
                "portico_backend_protocol",
                &[("backend", backend), ("protocol", protocol)]
            ),
            1.0,
            "{backend} is {protocol}"
        );
        assert_eq!(
            value(&s, "portico_backend_protocol", &[("backend", backend)]),
            1.0,
            "exactly one protocol per backend"
        );
    }
    assert_eq!(
        value(&s, "portico_legacy_sessions", &[("backend", "old")]),
        1.0
    );
    assert_eq!(
        value(&s, "portico_legacy_sessions", &[("backend", "m")]),
        0.0
    );
    assert_eq!(
        value(&s, "portico_stdio_restarts_total", &[("backend", "s")]),
        0.0
    );
    assert!(!has(
        &s,
        "portico_stdio_restarts_total",
        &[("backend", "m")]
    ));
    assert_eq!(
        value(
            &s,
            "portico_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        1.0
    );
    // Label values are closed sets: nothing the client sent shows up.
    assert!(
        s.iter().all(|x| x.labels.values().all(|v| v != "hi")),
        "client input in a label"
    );

    // A crashing stdio child is restarted, and the scrape says so.
    let r = mcp(
        &gw.url("/mcp/s"),
        json!(2),
        "tools/call",
        json!({"name":"crash","arguments":{}}),
    )
    .await;
    assert_eq!(r.status, 502, "{:?}", r.body);
    scrape_until(&gw, "a stdio restart", |s| {
        value(s, "portico_stdio_restarts_total", &[("backend", "s")]) >= 1.0
    })
    .await;
    gw.stop().await;
}

#[tokio::test]
async fn unknown_methods_and_paths_do_not_become_labels() {
    let mock = MockMcp::modern().start().await;
    let gw = Gateway::start(&format!(
        "[metrics]\n[log]\naccess = false\n[[backends]]\nname = \"m\"\nurl = \"{}\"\nprotocol = \"modern\"\n",
        mock.url()
    ))
    .await;
    let r = mcp(
        &gw.url("/mcp/m"),
        json!(1),
        "x/made-up-by-client",
        json!({}),
    )
    .await;
    assert!(r.status < 500);
    let r = send("POST", &gw.url("/mcp/nowhere-secret"), &[], "{}").await;
    assert_eq!(r.status, 404);
    let text = scrape_text(&gw).await;
    assert!(!text.contains("made-up-by-client"), "{text}");
    assert!(!text.contains("nowhere-secret"), "{text}");
    let s = parse_scrape(&text);
    assert_eq!(
        value(
            &s,
            "portico_requests_total",
            &[("endpoint", "m"), ("method", "other")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &s,
            "portico_requests_total",
            &[("endpoint", "none"), ("outcome", "client_error")]
        ),
        1.0
    );
}

/// Per-tool metrics: a call is labelled with its tool's name only once the backend has listed
/// that name (a parsed `tools/list`: here a cache miss, and one through the bridge); before
/// that, and for names never listed, the label is `other`.
#[tokio::test]
async fn tool_calls_are_labelled_only_by_names_the_backend_listed() {
    let modern = MockMcp::modern().start().await;
    let legacy = MockMcp::legacy().start().await;
    let gw = Gateway::start(&format!(
        "[metrics]\nready_min_backends = 0\n[log]\naccess = false\n\
         [[backends]]\nname = \"m\"\nurl = \"{}\"\nprotocol = \"modern\"\n\
         [[backends]]\nname = \"l\"\nurl = \"{}\"\nprotocol = \"legacy\"\n",
        modern.url(),
        legacy.url()
    ))
    .await;
    let call = |path: &'static str, id: i64, tool: &'static str| {
        let url = gw.url(path);
        async move {
            let args = json!({"name": tool, "arguments": {"text": "hi", "a": 1, "b": 2}});
            let r = mcp(&url, json!(id), "tools/call", args).await;
            assert_eq!(r.status, 200, "{tool}: {:?}", r.body);
        }
    };
    // Not listed yet: `other`.
    call("/mcp/m", 1, "echo").await;
    for (path, id) in [("/mcp/m", 2), ("/mcp/l", 3)] {
        let r = mcp(&gw.url(path), json!(id), "tools/list", json!({})).await;
        assert_eq!(r.status, 200);
    }
    // Passed through unread (the name comes from Mcp-Name), and bridged.
    call("/mcp/m", 4, "echo").await;
    call("/mcp/l", 5, "add").await;
    // Never listed: the client's made-up name stays out of the labels.
    call("/mcp/m", 6, "made-up-tool-name").await;
    let text = scrape_text(&gw).await;
    assert!(!text.contains("made-up-tool-name"), "{text}");
    let s = parse_scrape(&text);
    let calls = |backend: &str, tool: &str| {
        value(
            &s,
            "portico_tool_calls_total",
            &[("backend", backend), ("tool", tool), ("outcome", "ok")],
        )
    };
    assert_eq!(calls("m", "echo"), 1.0, "{text}");
    assert_eq!(calls("m", "other"), 2.0, "{text}");
    assert_eq!(calls("l", "add"), 1.0, "{text}");
    assert_eq!(calls("l", "other"), 0.0, "{text}");
    assert_eq!(
        value(
            &s,
            "portico_tool_call_duration_seconds_count",
            &[("backend", "m"), ("tool", "echo")]
        ),
        1.0
    );
    gw.stop().await;
}

#[tokio::test]
async fn in_flight_gauge_counts_requests_being_handled() {
    let mock = MockMcp::modern()
        .list_delay(Duration::from_millis(800))
        .start()
        .await;
    let gw = Gateway::start(&format!(
        "[metrics]\n[log]\naccess = false\n[[backends]]\nname = \"m\"\nurl = \"{}\"\nprotocol = \"modern\"\n",
        mock.url()
    ))
    .await;
    let url = gw.url("/mcp/m");
    let slow = tokio::spawn(async move {
        let a = mcp(&url, json!(1), "tools/list", json!({}));
        let b = mcp(&url, json!(2), "tools/list", json!({}));
        let (a, b) = tokio::join!(a, b);
        (a.status, b.status)
    });
    scrape_until(&gw, "two requests in flight", |s| {
        value(s, "portico_in_flight_requests", &[]) == 2.0
    })
    .await;
    assert_eq!(slow.await.unwrap(), (200, 200));
    let s = scrape(&gw).await;
    assert_eq!(value(&s, "portico_in_flight_requests", &[]), 0.0);
}

#[tokio::test]
async fn cache_counters_are_read_from_the_cache_at_scrape_time() {
    use portico::cache::{Fetched, KeyInput, Partition};
    let config = portico::config::validate(
        portico::config::parse("[[backends]]\nname = \"demo\"\nbuiltin = \"demo\"\n").unwrap(),
    )
    .unwrap();
    let state = portico::State::build(config, Arc::new(portico::metrics::Metrics::new())).unwrap();
    let key = KeyInput {
        backend: "demo",
        credential_id: "",
        method: "tools/list",
        params: None,
        protocol_version: LATEST,
        capabilities: None,
        client_info: None,
        covers: &[],
    };
    let message = bytes::Bytes::from_static(
        br#"{"jsonrpc":"2.0","id":"u","result":{"resultType":"complete","tools":[],"ttlMs":60000,"cacheScope":"public"}}"#,
    );
    for n in 0..4 {
        let served = state
            .cache
            .get_or_fetch(
                &key,
                &Partition::Anonymous,
                &portico::protocol::RequestId::number(n),
                false,
                || async {
                    Ok::<_, ()>(Fetched {
                        status: 200,
                        message: message.clone(),
                    })
                },
            )
            .await
            .unwrap();
        assert_eq!(served.status, 200);
    }
    state.cache.run_pending_tasks().await;
    let s = parse_scrape(&String::from_utf8(state.metrics.render(&state.mirrors())).unwrap());
    let c = |outcome: &str| value(&s, "portico_cache_requests_total", &[("outcome", outcome)]);
    assert_eq!((c("miss"), c("hit"), c("stale")), (1.0, 3.0, 0.0));
    assert_eq!(value(&s, "portico_cache_inserts_total", &[]), 1.0);
    assert_eq!(value(&s, "portico_cache_entries", &[]), 1.0);
    assert!(value(&s, "portico_cache_bytes", &[]) > 0.0);
    assert_eq!(value(&s, "portico_cache_evictions_total", &[]), 0.0);
}

/// `/readyz` body for a gateway, once every backend has been checked.
async fn readyz_settled(gw: &Gateway) -> (u16, Value) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let r = send("GET", &gw.metrics_url("/readyz"), &[], "").await;
        let v = r.json();
        let checked = v["backends"]
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b["status"] != "unknown");
        if checked {
            return (r.status, v);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "backends never checked: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn healthz_and_readyz() {
    let mock = MockMcp::modern().start().await;
    let gw = Gateway::start(&format!(
        "[metrics]\nhealth_interval_ms = 200\n[log]\naccess = false\n\
         [[backends]]\nname = \"m\"\nurl = \"{}\"\n",
        mock.url()
    ))
    .await;
    let r = send("GET", &gw.metrics_url("/healthz"), &[], "").await;
    assert_eq!((r.status, &r.body[..]), (200, &b"ok\n"[..]));
    let (status, v) = readyz_settled(&gw).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["ready"], true);
    assert_eq!(v["backends_up"], 1);
    let b = &v["backends"][0];
    assert_eq!(
        (&b["name"], &b["transport"], &b["protocol"], &b["status"]),
        (&json!("m"), &json!("http"), &json!("modern"), &json!("up")),
        "{v}"
    );
    assert!(b["checked_ms_ago"].is_u64() && b["error"].is_null(), "{v}");
    // The health check probed the era before any client request.
    assert!(mock.count("server/discover") >= 1);
    let r = send("GET", &gw.metrics_url("/nothing"), &[], "").await;
    assert_eq!(r.status, 404);
    let r = send("POST", &gw.metrics_url("/metrics"), &[], "").await;
    assert_eq!(r.status, 405);
    // The client listener does not serve them.
    let r = send("GET", &gw.url("/metrics"), &[], "").await;
    assert_eq!(r.status, 404);
}

#[tokio::test]
async fn readyz_is_503_when_the_only_backend_is_unreachable() {
    let dead = dead_port().await;
    let gw = Gateway::start(&format!(
        "[metrics]\nhealth_interval_ms = 200\nhealth_timeout_ms = 1000\n[log]\naccess = false\n\
         [[backends]]\nname = \"gone\"\nurl = \"http://127.0.0.1:{dead}/mcp\"\n"
    ))
    .await;
    let r = send("GET", &gw.metrics_url("/healthz"), &[], "").await;
    assert_eq!(r.status, 200, "alive even when not ready");
    let (status, v) = readyz_settled(&gw).await;
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["ready"], false);
    let b = &v["backends"][0];
    assert_eq!(
        (&b["status"], &b["protocol"]),
        (&json!("down"), &json!("unknown"))
    );
    assert!(b["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
    let s = scrape(&gw).await;
    assert_eq!(value(&s, "portico_backend_up", &[("backend", "gone")]), 0.0);
    assert_eq!(
        value(
            &s,
            "portico_backend_protocol",
            &[("backend", "gone"), ("protocol", "unknown")]
        ),
        1.0
    );
}

#[tokio::test]
async fn no_metrics_section_no_listener() {
    let gw = Gateway::start("[[backends]]\nname = \"demo\"\nbuiltin = \"demo\"\n").await;
    assert!(gw.metrics_addr.is_none());
}

pub(crate) fn temp_file(name: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "portico-observe-{}-{}-{name}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::write(&path, text).unwrap();
    path
}

// === Logs and traces ===

/// Reads JSON log lines until one satisfies `pick`.
async fn log_line(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStderr>>,
    what: &str,
    pick: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let line = tokio::time::timeout_at(deadline, lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("no log line for {what} within 15 s"))
            .unwrap()
            .unwrap_or_else(|| panic!("portico exited before logging {what}"));
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("log line is not JSON ({e}): {line}"));
        if pick(&v) {
            return v;
        }
    }
}

#[tokio::test]
async fn json_access_log_carries_traceparent_which_reaches_the_backend() {
    let mock = MockMcp::modern().start().await;
    let key = secret_file("observe-carol", CAROL);
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[log]\nformat = \"json\"\nlevel = \"info\"\n\
         [metrics]\nlisten = \"127.0.0.1:0\"\n\
         [auth]\nmode = \"api_keys\"\n[[auth.api_keys]]\nkey_file = \"{1}\"\nprincipal = \"carol\"\nteam = \"green\"\n\
         [[backends]]\nname = \"m\"\nurl = \"{0}\"\nprotocol = \"modern\"\n\
         [[backends]]\nname = \"v\"\nurl = \"{0}\"\nprotocol = \"modern\"\nverify_body = \"always\"\n",
        mock.url(),
        key.display(),
    );
    let bearer = format!("Bearer {CAROL}");
    let file = temp_file("json-log.toml", &toml);
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_portico"))
        .arg("--config")
        .arg(&file)
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let listening = log_line(&mut lines, "the client listener", |v| {
        v["message"] == "portico listening"
    })
    .await;
    let metrics = log_line(&mut lines, "the metrics listener", |v| {
        v["message"] == "metrics listening"
    })
    .await;
    let base = format!("http://{}", listening["addr"].as_str().unwrap());
    let metrics = format!("http://{}", metrics["addr"].as_str().unwrap());

    let r = mcp_with(
        &format!("{base}/mcp/m"),
        json!(1),
        "tools/list",
        json!({}),
        &[
            ("traceparent", TRACEPARENT),
            ("tracestate", "vendor=1"),
            ("authorization", &bearer),
        ],
    )
    .await;
    assert_eq!(r.status, 200);
    let access = log_line(&mut lines, "the access log line", |v| {
        v["target"] == "portico::access"
    })
    .await;
    assert_eq!(access["traceparent"], TRACEPARENT, "{access}");
    assert_eq!(access["backend"], "m", "{access}");
    assert_eq!(access["method"], "tools/list", "{access}");
    assert_eq!(access["status"], 200, "{access}");
    assert!(access["duration_us"].is_u64(), "{access}");
    // Who called, and (for a call) which tool.
    assert_eq!(access["principal"], "carol", "{access}");
    assert_eq!(access["team"], "green", "{access}");
    assert_eq!(access["tool"], "-", "{access}");
    let seen = mock.seen();
    let req = seen
        .iter()
        .find(|s| s.body["method"] == "tools/list")
        .expect("the backend got the request");
    assert_eq!(
        req.headers.get("traceparent").and_then(|v| v.to_str().ok()),
        Some(TRACEPARENT)
    );
    assert_eq!(
        req.headers.get("tracestate").and_then(|v| v.to_str().ok()),
        Some("vendor=1")
    );

    // A malformed traceparent is not logged as one.
    mcp_with(
        &format!("{base}/mcp/m"),
        json!(2),
        "tools/list",
        json!({}),
        &[("traceparent", "hello\"world"), ("authorization", &bearer)],
    )
    .await;
    let access = log_line(&mut lines, "the second access log line", |v| {
        v["target"] == "portico::access"
    })
    .await;
    assert_eq!(access["traceparent"], "", "{access}");

    // A call is logged with its tool. Relayed unread, a call is logged with its header's name,
    // which the backend checks against the body: here it refuses the mismatch itself.
    let call_on = |backend: &'static str, name: &'static str, header: &'static str| {
        let (url, bearer) = (format!("{base}/mcp/{backend}"), bearer.clone());
        async move {
            let mut h = modern_headers("tools/call", Some(header));
            h.push(("authorization", &bearer));
            let body = modern_body(
                json!(3),
                "tools/call",
                json!({"name": name, "arguments": {"text": "x"}}),
            );
            send("POST", &url, &h, body).await
        }
    };
    let call = |name: &'static str, header: &'static str| call_on("m", name, header);
    assert_eq!(call("echo", "echo").await.status, 200);
    let access = log_line(&mut lines, "the call's access line", |v| {
        v["target"] == "portico::access"
    })
    .await;
    assert_eq!(access["tool"], "echo", "{access}");
    assert_eq!(access["principal"], "carol", "{access}");
    assert_eq!(call("add", "echo").await.status, 400);
    let access = log_line(&mut lines, "the forged call's access line", |v| {
        v["target"] == "portico::access"
    })
    .await;
    assert_eq!(access["tool"], "echo", "{access}");
    assert_eq!(access["passthrough"], true, "{access}");
    assert_eq!(access["status"], 400, "{access}");
    // Read and judged by portico, the body's name is logged: what the call would have called.
    assert_eq!(call_on("v", "add", "echo").await.status, 400);
    let access = log_line(&mut lines, "the judged forged call's access line", |v| {
        v["target"] == "portico::access"
    })
    .await;
    assert_eq!(access["tool"], "add", "{access}");
    assert_eq!(access["error"], "header_mismatch", "{access}");

    // The binary binds the metrics listener from the config, and counts the log lines its
    // writer had to drop (none here).
    let r = send("GET", &format!("{metrics}/healthz"), &[], "").await;
    assert_eq!(r.status, 200);
    let r = send("GET", &format!("{metrics}/metrics"), &[], "").await;
    let exposition = String::from_utf8_lossy(&r.body).to_string();
    assert!(
        exposition
            .lines()
            .any(|l| l == "portico_log_lines_dropped_total 0"),
        "{exposition}"
    );
    let _ = child.kill().await;
    let _ = std::fs::remove_file(&file);
}

/// Every metric family `/metrics` can export is documented, with its labels, in
/// `deploy/README.md` and in the README's metrics table, and nothing documented is missing from
/// the exposition.
#[test]
fn every_exported_metric_is_documented() {
    use portico::metrics::{BackendMirror, Metrics, Mirrors, Record};
    use std::sync::Arc;
    let m = Metrics::new();
    // One sample in every family (a vec without children is not exported).
    let name: Arc<str> = "b".into();
    m.record(&Record {
        route: Some(&name),
        backend: Some(&name),
        method: "tools/list",
        status: 502,
        error: Some("backend_failed"),
        elapsed: std::time::Duration::from_millis(1),
        upstream: Some(std::time::Duration::from_millis(1)),
    });
    m.aggregate_omitted("/mcp", "b");
    m.token_exchange("b", "exchanged");
    portico::stats::tools::KnownTools::default().record(
        &m,
        "b",
        "t",
        200,
        std::time::Duration::from_millis(1),
    );
    let handles = m.backend("b");
    handles.retries.inc();
    m.reload(true);
    let _listen = m.listen_stream("b");
    let _guard = m.in_flight();
    // Exported once the binary's log writer is installed (`src/main.rs`).
    portico::metrics::set_log_drops(|| 0);
    let text = String::from_utf8(m.render(&Mirrors {
        backends: vec![BackendMirror {
            name: "b",
            transport: "stdio",
            up: true,
            protocol: "modern",
            restarts: Some(1),
            legacy_sessions: 1,
            parked_calls: 1,
            parked_expired: 1,
        }],
        cache: Default::default(),
    }))
    .unwrap();
    let exported: std::collections::BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect();
    assert!(exported.len() >= 20, "{exported:?}");
    // Each family's label names, from its samples (a histogram's `le` is the format's own).
    let mut labels: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (name, rest) = line.split_once('{').unwrap_or((line, ""));
        let name = name.split_whitespace().next().unwrap_or(name);
        let family = ["", "_bucket", "_sum", "_count"]
            .iter()
            .filter_map(|suffix| name.strip_suffix(suffix))
            .find(|f| exported.contains(*f))
            .unwrap_or_else(|| panic!("a sample of no family: {line}"));
        let names = labels.entry(family.to_string()).or_default();
        if let Some((inside, _)) = rest.split_once('}') {
            names.extend(
                inside
                    .split(',')
                    .filter_map(|pair| pair.split_once('=').map(|(n, _)| n.to_string()))
                    .filter(|n| n != "le"),
            );
        }
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for doc in ["deploy/README.md", "README.md"] {
        let text = std::fs::read_to_string(root.join(doc)).unwrap();
        // | `portico_x` | type | `label`, `label` | meaning |
        let documented: BTreeMap<String, BTreeSet<String>> = text
            .lines()
            .filter(|l| l.starts_with("| `portico_"))
            .map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                let name = cells[1].trim_matches('`').to_string();
                let names = cells[3]
                    .split(',')
                    .map(|n| n.trim().trim_matches('`').to_string())
                    .filter(|n| !n.is_empty())
                    .collect();
                (name, names)
            })
            .collect();
        let exported_names: BTreeSet<String> = labels.keys().cloned().collect();
        let documented_names: BTreeSet<String> = documented.keys().cloned().collect();
        let undocumented: Vec<_> = exported_names.difference(&documented_names).collect();
        let stale: Vec<_> = documented_names.difference(&exported_names).collect();
        assert!(
            undocumented.is_empty() && stale.is_empty(),
            "{doc}: exported but not documented {undocumented:?}; documented but not exported {stale:?}"
        );
        for (name, names) in &labels {
            assert_eq!(
                &documented[name], names,
                "{doc}: the labels of {name} (documented, then exported)"
            );
        }
    }
}
