//! How portico carries one call to a backend of either era (issue 20, items 5–8): long calls
//! timed from the backend's last message and bounded by `max_call_ms`; each request reaching a
//! legacy backend exactly once, whatever its error says; methods 2026-07-28 removed never
//! forwarded; `Mcp-Param-*` headers built when portico writes the 2026-07-28 request itself.
//! Every route kind: pass-through, aggregated, bridged HTTP, bridged and modern stdio.

use crate::common::mock::MockMcp;
use crate::common::*;
use futures_util::future::join_all;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

pub const STDIO_MOCK: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/gateway/fixtures/stdio_mock.py"
);

/// A `[[backends]]` table for the stdio mock (`--legacy` or `--modern`).
pub fn stdio_backend(name: &str, mode: &str, extra: &str) -> String {
    let protocol = if mode == "--legacy" {
        "legacy"
    } else {
        "modern"
    };
    format!(
        "[[backends]]\nname = \"{name}\"\ncommand = [\"python3\", \"{STDIO_MOCK}\", \"{mode}\"]\n\
         protocol = \"{protocol}\"\n{extra}\n"
    )
}

/// A `[[backends]]` table for an HTTP backend.
pub fn http_backend(name: &str, url: &str, protocol: &str, extra: &str) -> String {
    format!(
        "[[backends]]\nname = \"{name}\"\nurl = \"{url}\"\nprotocol = \"{protocol}\"\n{extra}\n"
    )
}

/// `tools/call` of the mocks' `progress` tool with a progress token: one notification every
/// `delay_ms`, `steps` of them, then the result.
fn progress_call(steps: u64, delay_ms: u64) -> Value {
    json!({"name":"progress","arguments":{"steps":steps,"delay_ms":delay_ms},
           "_meta":{"progressToken":"tok"}})
}

/// The messages of an answer (JSON or SSE).
fn messages(r: &Resp) -> Vec<Value> {
    if r.is_sse() {
        r.messages()
    } else {
        vec![r.json()]
    }
}

/// Routes of every kind to a backend that answers `progress` and `slow`: a modern HTTP backend
/// passed through and behind an aggregated endpoint, a legacy HTTP backend (bridged), and the
/// stdio mock in both eras.
struct Routes {
    gw: Gateway,
    _modern: crate::common::mock::MockHandle,
    _legacy: crate::common::mock::MockHandle,
}

const ROUTES: [&str; 5] = ["/mcp/m", "/mcp/agg", "/mcp/l", "/mcp/sl", "/mcp/sm"];

async fn routes(extra: &str) -> Routes {
    let modern = MockMcp::modern().start().await;
    let legacy = MockMcp::legacy().start().await;
    let gw = Gateway::start(&format!(
        "[log]\naccess = false\n{}{}{}{}[[endpoints]]\npath = \"/mcp/agg\"\nbackends = [{{ name = \"m\", prefix = \"\" }}]\n",
        http_backend("m", &modern.url(), "modern", extra),
        http_backend("l", &legacy.url(), "legacy", extra),
        stdio_backend("sl", "--legacy", extra),
        stdio_backend("sm", "--modern", extra),
    ))
    .await;
    let r = Routes {
        gw,
        _modern: modern,
        _legacy: legacy,
    };
    r.warm().await;
    r
}

impl Routes {
    /// One `tools/list` answered on every route before a test times anything: the stdio
    /// children (one per client under `per_client` isolation) and the bridged sessions are
    /// opened here, so a slow start on a busy machine is not counted against `timeout_ms` or
    /// `max_call_ms`. Bounded: a route that never answers fails the test.
    async fn warm(&self) {
        for path in ROUTES {
            let url = self.gw.url(path);
            let mut ok = false;
            for _ in 0..20 {
                let r = mcp(&url, json!(0), "tools/list", json!({})).await;
                if r.status == 200
                    && messages(&r)
                        .last()
                        .is_some_and(|m| m.get("result").is_some())
                {
                    ok = true;
                    break;
                }
            }
            assert!(ok, "{path}: never answered tools/list");
        }
    }
}

/// A call that runs 9× `timeout_ms` while reporting progress every `timeout_ms / 2` completes
/// on every route kind: the timeout counts from the backend's last message, not the request.
#[tokio::test]
async fn progress_keeps_a_long_call_alive_on_every_route() {
    let r = routes("timeout_ms = 400\n").await;
    let calls = ROUTES.iter().map(|path| {
        let url = r.gw.url(path);
        async move {
            let started = Instant::now();
            let resp = mcp(&url, json!(1), "tools/call", progress_call(18, 200)).await;
            (path, started.elapsed(), resp)
        }
    });
    for (path, took, resp) in join_all(calls).await {
        assert_eq!(resp.status, 200, "{path}: {:?}", resp.body);
        let msgs = messages(&resp);
        let last = msgs.last().expect("a response");
        assert_eq!(
            last["result"]["content"][0]["text"], "done 18",
            "{path}: {last}"
        );
        let progress = msgs
            .iter()
            .filter(|m| m["method"] == "notifications/progress")
            .count();
        assert_eq!(progress, 18, "{path}: every progress notification relayed");
        assert!(took >= Duration::from_millis(3600), "{path}: {took:?}");
    }
    r.gw.stop().await;
}

/// A silent call ends with a JSON-RPC error at `timeout_ms` (within a tolerance), whether the
/// backend says nothing at all or only sends SSE keep-alive comments, which are not messages.
#[tokio::test]
async fn a_silent_call_ends_at_timeout_ms() {
    let r = routes("timeout_ms = 400\n").await;
    // The same modern mock answering in SSE: `slow` then sends `: keepalive` every 20 ms.
    let chatty = MockMcp::modern().sse().start().await;
    let gw2 = Gateway::start(&format!(
        "[log]\naccess = false\n{}",
        http_backend("k", &chatty.url(), "modern", "timeout_ms = 400\n")
    ))
    .await;
    let mut urls: Vec<String> = ROUTES.iter().map(|p| r.gw.url(p)).collect();
    urls.push(gw2.url("/mcp/k"));
    let calls = urls.iter().map(|url| async move {
        let started = Instant::now();
        let args = json!({"name":"slow","arguments":{"ms":3000}});
        let resp = mcp(url, json!(7), "tools/call", args).await;
        (url, started.elapsed(), resp)
    });
    for (url, took, resp) in join_all(calls).await {
        let msgs = messages(&resp);
        let last = msgs.last().expect("an answer");
        assert!(last.get("error").is_some(), "{url}: {last}");
        assert!(last.get("result").is_none(), "{url}: {last}");
        assert_eq!(last["id"], 7, "{url}: {last}");
        assert!(
            took >= Duration::from_millis(390) && took < Duration::from_millis(1400),
            "{url}: cut after {took:?}, want ~400 ms"
        );
        if !resp.is_sse() {
            assert_eq!(resp.status, 504, "{url}: {:?}", resp.body);
        }
    }
    r.gw.stop().await;
    gw2.stop().await;
}

/// `max_call_ms` bounds a call however often it reports progress: cut with a JSON-RPC error
/// event once it has run that long.
#[tokio::test]
async fn max_call_ms_cuts_a_call_that_keeps_reporting() {
    let r = routes("timeout_ms = 400\nmax_call_ms = 1200\n").await;
    let calls = ROUTES.iter().map(|path| {
        let url = r.gw.url(path);
        async move {
            let started = Instant::now();
            let resp = mcp(&url, json!(2), "tools/call", progress_call(30, 150)).await;
            (path, started.elapsed(), resp)
        }
    });
    for (path, took, resp) in join_all(calls).await {
        let msgs = messages(&resp);
        let last = msgs.last().expect("an answer");
        assert!(last.get("error").is_some(), "{path}: {last}");
        assert_eq!(last["id"], 2, "{path}: {last}");
        assert!(
            msgs.iter().any(|m| m["method"] == "notifications/progress"),
            "{path}: progress went through before the cut"
        );
        assert!(
            took >= Duration::from_millis(1150) && took < Duration::from_millis(2200),
            "{path}: cut after {took:?}, want ~1200 ms"
        );
    }
    r.gw.stop().await;
}

#[test]
fn max_call_ms_is_validated() {
    let bad = portico::config::validate(
        portico::config::parse(
            "[[backends]]\nname = \"d\"\nbuiltin = \"demo\"\ntimeout_ms = 1000\nmax_call_ms = 500\n",
        )
        .unwrap(),
    )
    .unwrap_err();
    assert!(bad.to_string().contains("max_call_ms"), "{bad}");
}

/// The stdio mock's request counts (its `counts` tool), through `url`.
async fn stdio_counts(url: &str) -> Value {
    let r = mcp(
        url,
        json!("counts"),
        "tools/call",
        json!({"name":"counts","arguments":{}}),
    )
    .await;
    r.json()["result"]["structuredContent"]["counts"].clone()
}

/// Each request reaches a legacy backend exactly once, whatever its answer says: `-32601`
/// (which HTTP servers send with 404, and stdio answers are mirrored to) or an error whose
/// words mention a session never make portico re-initialize and resend — on its own URL and
/// through an aggregated endpoint. The one real signal, a 404 refusing the session, still
/// re-initializes and resends once.
#[tokio::test]
async fn legacy_backends_receive_each_request_once() {
    let legacy = MockMcp::legacy().start().await;
    let gw = Gateway::start(&format!(
        "[log]\naccess = false\n{}{}[[endpoints]]\npath = \"/mcp/agg\"\n\
         backends = [{{ name = \"l\", prefix = \"h\" }}, {{ name = \"sl\", prefix = \"s\" }}]\n",
        http_backend("l", &legacy.url(), "legacy", ""),
        stdio_backend("sl", "--legacy", ""),
    ))
    .await;
    let complete =
        json!({"ref":{"type":"ref/prompt","name":"greet"},"argument":{"name":"n","value":"v"}});
    let session_error = json!({"name":"session_error","arguments":{}});
    for path in ["/mcp/l", "/mcp/sl"] {
        let url = gw.url(path);
        let r = mcp(&url, json!(1), "completion/complete", complete.clone()).await;
        assert_eq!(r.code(), -32601, "{path}: {:?}", r.body);
        let r = mcp(&url, json!(2), "tools/call", session_error.clone()).await;
        let message = r.json()["error"]["message"]
            .as_str()
            .unwrap_or("")
            .to_string();
        assert!(message.contains("session"), "{path}: {:?}", r.body);
        let r = mcp(&url, json!(3), "prompts/list", json!({})).await;
        assert_eq!(r.status, if path == "/mcp/l" { 200 } else { 404 }, "{path}");
    }
    // Aggregated: the stdio member answers prompts/list -32601 (it has none).
    let r = mcp(&gw.url("/mcp/agg"), json!(4), "prompts/list", json!({})).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(legacy.count("completion/complete"), 1);
    assert_eq!(legacy.count("tools/call"), 1);
    assert_eq!(legacy.count("prompts/list"), 2);
    assert_eq!(legacy.count("initialize"), 1, "one session, never re-made");
    let counts = stdio_counts(&gw.url("/mcp/sl")).await;
    assert_eq!(counts["completion/complete"], 1, "{counts}");
    assert_eq!(counts["tools/call:session_error"], 1, "{counts}");
    assert_eq!(counts["prompts/list"], 2, "{counts}");
    assert_eq!(counts["initialize"], 1, "{counts}");
    // The backend forgot the session: its 404 (no answer to the request) is the signal.
    legacy.drop_sessions();
    let r = mcp(
        &gw.url("/mcp/l"),
        json!(5),
        "tools/call",
        json!({"name":"echo","arguments":{"text":"again"}}),
    )
    .await;
    assert_eq!(
        r.json()["result"]["content"][0]["text"],
        "again",
        "{:?}",
        r.body
    );
    assert_eq!(legacy.count("initialize"), 2, "re-initialized once");
    assert_eq!(
        legacy.count("tools/call"),
        3,
        "the refused attempt and the resend"
    );
    gw.stop().await;
}

/// Methods 2026-07-28 removed, as a 2026-07-28 client would send them.
const REMOVED: [&str; 6] = [
    "ping",
    "initialize",
    "notifications/initialized",
    "logging/setLevel",
    "resources/subscribe",
    "resources/unsubscribe",
];

/// A 2026-07-28 POST of `method` (a notification when it is one) with a stray session id.
async fn removed(url: &str, method: &str) -> Resp {
    let mut body: Value = serde_json::from_str(&modern_body(
        json!(1),
        method,
        json!({"uri": "x://y", "level": "info"}),
    ))
    .unwrap();
    if method.starts_with("notifications/") {
        body.as_object_mut().unwrap().remove("id");
    }
    let mut h = modern_headers(method, None);
    h.push(("mcp-session-id", "stray"));
    send("POST", url, &h, body.to_string()).await
}

/// From a 2026-07-28 client, every removed method is answered 404 `-32601` by portico on every
/// URL kind — HTTP and stdio backends of both eras, aggregated endpoints over each — and the
/// backends' own counters show none of them arrived. A stray `Mcp-Session-Id` on a 2026-07-28
/// request is ignored everywhere (`portico stdio`: `stdio_front::removed_methods_are_refused`).
#[tokio::test]
async fn removed_methods_never_reach_any_backend() {
    let modern = MockMcp::modern().start().await;
    let legacy = MockMcp::legacy().start().await;
    let gw = Gateway::start(&format!(
        "[log]\naccess = false\n{}{}{}{}\
         [[endpoints]]\npath = \"/mcp/http\"\nbackends = [\"m\", \"l\"]\n\
         [[endpoints]]\npath = \"/mcp/stdio\"\nbackends = [\"sm\", \"sl\"]\n",
        http_backend("m", &modern.url(), "modern", ""),
        http_backend("l", &legacy.url(), "legacy", ""),
        stdio_backend("sl", "--legacy", ""),
        stdio_backend("sm", "--modern", ""),
    ))
    .await;
    let paths = [
        "/mcp/m",
        "/mcp/l",
        "/mcp/sm",
        "/mcp/sl",
        "/mcp/http",
        "/mcp/stdio",
    ];
    for path in paths {
        for method in REMOVED {
            let r = removed(&gw.url(path), method).await;
            assert_eq!(r.status, 404, "{path} {method}: {:?}", r.body);
            assert_eq!(r.code(), -32601, "{path} {method}");
        }
        // The stray session id changes nothing for a method that exists.
        let mut h = modern_headers("tools/list", None);
        h.push(("mcp-session-id", "stray"));
        let body = modern_body(json!(2), "tools/list", json!({}));
        let r = send("POST", &gw.url(path), &h, body).await;
        assert_eq!(r.status, 200, "{path}: {:?}", r.body);
        assert!(r.json()["result"]["tools"].is_array(), "{path}");
    }
    for method in REMOVED {
        assert_eq!(modern.count(method), 0, "{method} reached the modern mock");
        // The legacy mock's session was made by portico's bridge for tools/list; nothing of
        // the client's removed methods went with it.
        let bridge_own = u64::from(method == "initialize" || method == "notifications/initialized");
        assert_eq!(
            legacy.count(method),
            bridge_own,
            "{method} reached the legacy mock"
        );
    }
    for (path, bridged) in [("/mcp/sm", false), ("/mcp/sl", true)] {
        let counts = stdio_counts(&gw.url(path)).await;
        for method in REMOVED {
            let bridge_own =
                bridged && (method == "initialize" || method == "notifications/initialized");
            let want = if bridge_own { json!(1) } else { Value::Null };
            assert_eq!(counts[method], want, "{path} {method}: {counts}");
        }
    }
    gw.stop().await;
}

/// A call of the strict mock's `regional` tool: a non-ASCII string (base64 form), an integer,
/// a boolean, and an argument without annotation.
fn regional() -> Value {
    json!({"name":"regional","arguments":{"region":"Zürich","priority":3,"urgent":true,"note":"n"}})
}

/// The `Mcp-Param-*` headers the mock saw on its `tools/call`s.
fn seen_params(mock: &crate::common::mock::MockHandle) -> Vec<Vec<(String, String)>> {
    mock.seen()
        .into_iter()
        .filter(|s| s.body["method"] == "tools/call")
        .map(|s| {
            let mut h: Vec<(String, String)> = s
                .headers
                .iter()
                .filter(|(k, _)| k.as_str().starts_with("mcp-param-"))
                .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_string()))
                .collect();
            h.sort();
            h
        })
        .collect()
}

/// When portico writes the 2026-07-28 `tools/call` itself — for an initialize-era client, for
/// an aggregated endpoint's member — it adds the `Mcp-Param-*` headers the tool's
/// `inputSchema` asks for (`x-mcp-header`; base64 form for non-ASCII), from the tool list it
/// holds, fetching it when absent; a strict server that answers `-32020` without them serves
/// the call. (`portico stdio`: `stdio_front::a_strict_backend_gets_its_param_headers`.)
#[tokio::test]
async fn param_headers_are_built_for_calls_portico_writes() {
    let strict = MockMcp::modern().header_tools().start().await;
    let gw = Gateway::start(&format!(
        "[log]\naccess = false\n{}[[endpoints]]\npath = \"/mcp/agg\"\nbackends = [{{ name = \"x\", prefix = \"x\" }}]\n",
        http_backend("x", &strict.url(), "modern", ""),
    ))
    .await;
    let want = vec![
        ("mcp-param-priority".to_string(), "3".to_string()),
        (
            "mcp-param-region".to_string(),
            "=?base64?WsO8cmljaA==?=".to_string(),
        ),
        ("mcp-param-urgent".to_string(), "true".to_string()),
    ];
    // The strict mock refuses a call without them (a modern client that did not build them).
    let r = mcp(&gw.url("/mcp/x"), json!(1), "tools/call", regional()).await;
    assert_eq!(r.code(), -32020, "{:?}", r.body);
    assert_eq!(strict.count("tools/list"), 0);
    // An initialize-era client: portico fetches the list (nothing held yet) and builds them.
    let (old, _) = crate::legacy::OldClient::connect(&gw.url("/mcp/x"), "2025-06-18").await;
    let r = old.call(json!(2), "tools/call", regional()).await;
    assert_eq!(
        r.result()["result"]["content"][0]["text"],
        "Zürich 3 true",
        "{:?}",
        r.body
    );
    assert_eq!(strict.count("tools/list"), 1, "fetched once, when absent");
    let r = old.call(json!(3), "tools/call", regional()).await;
    assert_eq!(r.result()["result"]["content"][0]["text"], "Zürich 3 true");
    // Through an aggregated endpoint, for a legacy and a 2026-07-28 client alike.
    let (old_agg, _) = crate::legacy::OldClient::connect(&gw.url("/mcp/agg"), "2025-11-25").await;
    let mut call = regional();
    call["name"] = json!("x__regional");
    let r = old_agg.call(json!(4), "tools/call", call.clone()).await;
    assert_eq!(
        r.result()["result"]["content"][0]["text"],
        "Zürich 3 true",
        "{:?}",
        r.body
    );
    let r = mcp(&gw.url("/mcp/agg"), json!(5), "tools/call", call.clone()).await;
    assert_eq!(
        r.result()["result"]["content"][0]["text"],
        "Zürich 3 true",
        "{:?}",
        r.body
    );
    // A 2026-07-28 client that built its own headers (from the aggregated list): as sent.
    let mut h = modern_headers("tools/call", Some("x__regional"));
    h.extend([
        ("mcp-param-region", "=?base64?WsO8cmljaA==?="),
        ("mcp-param-priority", "3"),
        ("mcp-param-urgent", "true"),
    ]);
    let r = send(
        "POST",
        &gw.url("/mcp/agg"),
        &h,
        modern_body(json!(7), "tools/call", call),
    )
    .await;
    assert_eq!(
        r.result()["result"]["content"][0]["text"],
        "Zürich 3 true",
        "{:?}",
        r.body
    );
    assert_eq!(
        strict.count("tools/list"),
        1,
        "the annotations are held, not re-fetched"
    );
    let seen = seen_params(&strict);
    assert_eq!(seen.len(), 6);
    assert!(seen[0].is_empty(), "the client's own call went as sent");
    for headers in &seen[1..] {
        assert_eq!(*headers, want);
    }
    // A 2026-07-28 client's own headers are forwarded as it sent them.
    let mut h = modern_headers("tools/call", Some("regional"));
    h.extend([
        ("mcp-param-region", "=?base64?WsO8cmljaA==?="),
        ("mcp-param-priority", "3"),
        ("mcp-param-urgent", "true"),
    ]);
    let body = modern_body(json!(6), "tools/call", regional());
    let r = send("POST", &gw.url("/mcp/x"), &h, body).await;
    assert_eq!(
        r.result()["result"]["content"][0]["text"],
        "Zürich 3 true",
        "{:?}",
        r.body
    );
    gw.stop().await;
}

/// A 2025-11-25 server may close a call's answer stream after a priming event (an id, no
/// data) and have its client resume it with a GET naming the last event, after the pause it
/// asked for (`retry:`). portico resumes it as a client must — for clients of both eras, as
/// often as the server closes early — and a refused resumption fails the call, naming why.
#[tokio::test]
async fn an_answer_stream_closed_early_is_resumed() {
    let m = MockMcp::legacy().start().await;
    let gw = Gateway::start(&format!(
        // No cache: its change watcher's GET must not take the refusal meant for a resumption.
        "[log]\naccess = false\n[cache]\nenabled = false\n{}",
        http_backend("l", &m.url(), "legacy", "timeout_ms = 5000")
    ))
    .await;
    let url = gw.url("/mcp/l");
    let call = json!({"name":"resumable","arguments":{"hops":3,"retry":100}});
    let started = Instant::now();
    let r = mcp(&url, json!(1), "tools/call", call.clone()).await;
    assert_eq!(
        r.result()["result"]["content"][0]["text"],
        "resumed",
        "{:?}",
        String::from_utf8_lossy(&r.body)
    );
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "each resumption waits for retry: {:?}",
        started.elapsed()
    );
    // Each GET named the last event of the stream before it, the priming event first.
    let from = m.resumed_from();
    assert_eq!(from.len(), 3, "{from:?}");
    for (i, id) in from.iter().enumerate() {
        assert!(id.ends_with(&format!("/{i}")), "{from:?}");
    }
    let (old, _) = crate::legacy::OldClient::connect(&url, "2025-11-25").await;
    let r = old.call(json!(7), "tools/call", call).await;
    assert_eq!(
        r.result()["result"]["content"][0]["text"],
        "resumed",
        "{:?}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(m.resumed_from().len(), 6);
    // The connection breaks in the middle of an event instead: resumed from the last whole
    // event (the priming one), and the half event never reaches the client.
    let broken = json!({"name":"resumable","arguments":{"break":true}});
    let r = mcp(&url, json!(3), "tools/call", broken).await;
    assert_eq!(
        r.result()["result"]["content"][0]["text"],
        "resumed",
        "{:?}",
        String::from_utf8_lossy(&r.body)
    );
    let from = m.resumed_from();
    assert_eq!(from.len(), 7, "{from:?}");
    // The upstream ids are the bridge's own; the priming event is each stream's `/0`.
    assert!(from[6].ends_with("/0"), "{from:?}");
    m.refuse_gets(1, 405);
    let r = mcp(
        &url,
        json!(2),
        "tools/call",
        json!({"name":"resumable","arguments":{}}),
    )
    .await;
    let message = r.result()["error"]["message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        message.contains("could not be resumed") && message.contains("405"),
        "{:?}",
        String::from_utf8_lossy(&r.body)
    );
    gw.stop().await;
}
