//! `subscriptions/listen` through `/mcp/<name>` to every kind of backend (issue #20 item 1):
//! modern HTTP, initialize-era HTTP (from the session's GET stream, `resourceSubscriptions` as
//! upstream `resources/subscribe`), and both eras over stdio. Each stream is acknowledged,
//! carries the client's `subscriptionId`, outlives `timeout_ms` with keep-alive comments, and
//! ends upstream too when the client leaves (`portico_listen_streams` back to 0).

use crate::common::mock::{LegacyRejects, MockMcp};
use crate::common::*;
use crate::legacy::OldClient;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use std::time::Duration;
use tokio::time::Instant;

const STDIO_MOCK: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/gateway/fixtures/stdio_mock.py"
);

/// One backend `b` (given as its TOML lines) with a short `timeout_ms`, frequent keep-alives,
/// metrics on and the cache off (the cache's own change streams would be listeners too). A
/// legacy client's dropped GET stream is held for a resume only 200 ms (`resume_ms`), after
/// which its upstream listen closes.
pub(crate) fn config(backend: &str) -> String {
    format!(
        "[server]\nsse_keepalive_ms = 150\n[metrics]\n[log]\naccess = false\n[cache]\nenabled = false\n\
         [sessions]\nresume_ms = 200\n\
         [[backends]]\nname = \"b\"\ntimeout_ms = 600\n{backend}\n"
    )
}

pub(crate) fn http_backend(url: &str) -> String {
    format!("url = \"{url}\"\n")
}

pub(crate) fn stdio_backend(args: &[&str]) -> String {
    let mut cmd = vec!["python3".to_string(), STDIO_MOCK.to_string()];
    cmd.extend(args.iter().map(|a| a.to_string()));
    format!("command = {}\n", serde_json::to_string(&cmd).unwrap())
}

/// The value of `portico_listen_streams` for `endpoint` (0 when the series is absent).
pub(crate) async fn open_listens(gw: &Gateway, endpoint: &str) -> i64 {
    let r = send("GET", &gw.metrics_url("/metrics"), &[], "").await;
    let text = String::from_utf8_lossy(&r.body).to_string();
    let prefix = format!("portico_listen_streams{{endpoint=\"{endpoint}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as i64)
}

/// Polls `cond` every 20 ms for up to 10 s.
pub(crate) async fn until<F: std::future::Future<Output = bool>>(
    what: &str,
    mut cond: impl FnMut() -> F,
) {
    let end = Instant::now() + Duration::from_secs(10);
    while !cond().await {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An open listen stream as the client reads it.
pub(crate) struct Listen {
    pub body: hyper::body::Incoming,
    dec: portico::sse::SseDecoder,
    /// Raw bytes seen so far (keep-alive comments included).
    pub raw: Vec<u8>,
}

impl Listen {
    pub async fn open(url: &str, id: Value, filter: Value) -> (u16, Listen) {
        let resp = send_stream(
            "POST",
            url,
            &modern_headers("subscriptions/listen", None),
            modern_body(
                id,
                "subscriptions/listen",
                json!({ "notifications": filter }),
            ),
        )
        .await;
        let status = resp.status().as_u16();
        (
            status,
            Listen {
                body: resp.into_body(),
                dec: portico::sse::SseDecoder::new(1 << 20),
                raw: Vec::new(),
            },
        )
    }

    /// Messages arriving within `ms`.
    pub async fn read(&mut self, ms: u64) -> Vec<Value> {
        let end = Instant::now() + Duration::from_millis(ms);
        let mut out = Vec::new();
        while let Ok(Some(frame)) = tokio::time::timeout_at(end, self.body.frame()).await {
            let Ok(frame) = frame else { break };
            if let Ok(data) = frame.into_data() {
                self.raw.extend_from_slice(&data);
                self.dec.push(&data);
                while let Ok(Some(ev)) = self.dec.next_event() {
                    out.push(serde_json::from_slice(&ev).unwrap());
                }
            }
        }
        out
    }

    /// Reads until a message with `method` arrives (up to 5 s); every message read.
    pub async fn read_until(&mut self, method: &str) -> Vec<Value> {
        let end = Instant::now() + Duration::from_secs(5);
        let mut out = Vec::new();
        while Instant::now() < end {
            let got = self.read(100).await;
            let done = got.iter().any(|m| m["method"] == method);
            out.extend(got);
            if done {
                break;
            }
        }
        out
    }
}

fn sid(m: &Value) -> &Value {
    &m["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"]
}

fn count(msgs: &[Value], method: &str) -> usize {
    msgs.iter().filter(|m| m["method"] == method).count()
}

/// The acknowledgement comes first, with the client's id; the stream then outlives
/// `timeout_ms` (600 ms) with keep-alive comments and no error.
async fn acknowledged_and_held_open(l: &mut Listen, id: Value) -> Value {
    let first = l
        .read_until("notifications/subscriptions/acknowledged")
        .await;
    assert_eq!(
        first[0]["method"], "notifications/subscriptions/acknowledged",
        "{first:?}"
    );
    assert_eq!(*sid(&first[0]), id, "{first:?}");
    let quiet = l.read(1500).await;
    assert!(
        quiet.is_empty(),
        "nothing but keep-alives past timeout_ms: {quiet:?}"
    );
    let raw = String::from_utf8_lossy(&l.raw);
    assert!(raw.contains(": keep-alive"), "no keep-alive comment: {raw}");
    first[0].clone()
}

#[tokio::test]
async fn modern_http_listen_is_held_open_and_closed_with_the_client() {
    let m = MockMcp::modern().list_changed().start().await;
    let gw = Gateway::start(&config(&http_backend(&m.url()))).await;
    let url = gw.url("/mcp/b");
    let filter = json!({"toolsListChanged": true, "resourceSubscriptions": ["mock://r"]});
    let (status, mut l) = Listen::open(&url, json!("L1"), filter).await;
    assert_eq!(status, 200);
    acknowledged_and_held_open(&mut l, json!("L1")).await;
    assert_eq!(open_listens(&gw, "b").await, 1);
    assert_eq!(m.listen_streams(), 1);
    // The mock tags its notifications with "?": portico gives them the client's id.
    m.add_tool("late");
    let notes = l.read_until("notifications/tools/list_changed").await;
    assert_eq!(
        count(&notes, "notifications/tools/list_changed"),
        1,
        "{notes:?}"
    );
    assert_eq!(sid(&notes[0]), "L1");
    m.update_resource("mock://r");
    m.update_resource("mock://other");
    let notes = l.read_until("notifications/resources/updated").await;
    assert_eq!(
        count(&notes, "notifications/resources/updated"),
        1,
        "{notes:?}"
    );
    assert_eq!(notes[0]["params"]["uri"], "mock://r");
    assert_eq!(sid(&notes[0]), "L1");
    assert!(l.read(300).await.is_empty(), "one of each");
    drop(l);
    until("the upstream listen to close", || async {
        m.listen_streams() == 0
    })
    .await;
    until("the gauge back to 0", || async {
        open_listens(&gw, "b").await == 0
    })
    .await;
    gw.stop().await;
}

#[tokio::test]
async fn legacy_http_listen_uses_the_session_stream_and_subscribes_upstream() {
    let m = MockMcp::legacy()
        .list_changed()
        .subscribe_and_log()
        .start()
        .await;
    let gw = Gateway::start(&config(&http_backend(&m.url()))).await;
    let url = gw.url("/mcp/b");
    let filter = json!({"toolsListChanged": true, "promptsListChanged": true,
        "resourceSubscriptions": ["mock://r"]});
    let (status, mut l) = Listen::open(&url, json!(7), filter).await;
    assert_eq!(status, 200);
    let ack = acknowledged_and_held_open(&mut l, json!(7)).await;
    // Only what the server can deliver: its prompts have no `listChanged`.
    assert_eq!(
        ack["params"]["notifications"],
        json!({"toolsListChanged": true, "resourceSubscriptions": ["mock://r"]})
    );
    // Acknowledged once portico had the session's GET stream and the upstream subscription.
    assert_eq!(m.get_streams(), 1);
    assert_eq!(m.count("resources/subscribe"), 1);
    assert_eq!(open_listens(&gw, "b").await, 1);
    m.add_tool("late");
    let notes = l.read_until("notifications/tools/list_changed").await;
    assert_eq!(
        count(&notes, "notifications/tools/list_changed"),
        1,
        "{notes:?}"
    );
    assert_eq!(sid(&notes[0]), 7);
    m.update_resource("mock://r");
    let notes = l.read_until("notifications/resources/updated").await;
    assert_eq!(
        count(&notes, "notifications/resources/updated"),
        1,
        "{notes:?}"
    );
    assert_eq!(notes[0]["params"]["uri"], "mock://r");
    assert_eq!(sid(&notes[0]), 7);
    assert!(l.read(300).await.is_empty(), "one of each");
    drop(l);
    until("the session's GET stream to close", || async {
        m.get_streams() == 0
    })
    .await;
    until("resources/unsubscribe upstream", || async {
        m.count("resources/unsubscribe") == 1
    })
    .await;
    until("the gauge back to 0", || async {
        open_listens(&gw, "b").await == 0
    })
    .await;
    gw.stop().await;
}

/// A legacy HTTP server whose GET stream is refused with 405 — stateless, or with sessions —
/// cannot deliver list changes or resource updates: a listen is acknowledged with nothing
/// agreed and ends at once (it failed before), and from then on neither `server/discover` nor
/// a legacy client's `initialize` advertises them.
#[tokio::test]
async fn a_server_without_a_get_stream_is_not_promised_what_it_would_carry() {
    for stateless in [true, false] {
        let m = MockMcp::legacy().list_changed().subscribe_and_log();
        let m = if stateless {
            m.stateless().rejects(LegacyRejects::AnswerLegacy)
        } else {
            m.no_get_stream()
        };
        let m = m.start().await;
        let gw = Gateway::start(&config(&http_backend(&m.url()))).await;
        let url = gw.url("/mcp/b");
        let filter = json!({"toolsListChanged": true, "resourceSubscriptions": ["mock://r"]});
        let (status, mut l) = Listen::open(&url, json!("L"), filter).await;
        assert_eq!(status, 200, "stateless {stateless}");
        // `read` returns at the stream's end, or after 3 s on a stream held open.
        let msgs = l.read(3000).await;
        assert_eq!(msgs.len(), 2, "stateless {stateless}: {msgs:?}");
        assert_eq!(
            msgs[0]["method"],
            "notifications/subscriptions/acknowledged"
        );
        assert_eq!(msgs[0]["params"]["notifications"], json!({}), "{msgs:?}");
        assert_eq!(msgs[1]["id"], "L");
        assert_eq!(msgs[1]["result"]["resultType"], "complete", "{msgs:?}");
        assert_eq!(m.count("resources/subscribe"), 0, "nothing would carry it");
        let d = discover(&url).await;
        let caps = &d["capabilities"];
        assert_eq!(caps["tools"], json!({}), "stateless {stateless}: {d}");
        assert_eq!(caps["resources"], json!({}), "stateless {stateless}: {d}");
        let (_, init) = OldClient::connect(&url, "2025-11-25").await;
        assert_eq!(init["capabilities"], d["capabilities"], "{init}");
        gw.stop().await;
    }
}

/// The same server asked before anything has tried its GET stream: the first `server/discover`
/// (and a legacy client's first `initialize`) already leaves out what nothing would carry,
/// while a server that does serve the stream keeps them advertised.
#[tokio::test]
async fn the_first_discover_already_knows_whether_a_get_stream_exists() {
    for (stateless, get_stream) in [(true, false), (false, false), (false, true)] {
        let m = MockMcp::legacy().list_changed().subscribe_and_log();
        let m = match (stateless, get_stream) {
            (true, _) => m.stateless().rejects(LegacyRejects::AnswerLegacy),
            (false, false) => m.no_get_stream(),
            (false, true) => m,
        };
        let m = m.start().await;
        let gw = Gateway::start(&config(&http_backend(&m.url()))).await;
        let url = gw.url("/mcp/b");
        let d = discover(&url).await;
        let caps = &d["capabilities"];
        let what = format!("stateless {stateless}, GET stream {get_stream}: {d}");
        if get_stream {
            assert_eq!(caps["tools"]["listChanged"], true, "{what}");
            assert_eq!(caps["resources"]["subscribe"], true, "{what}");
            // Asking did not leave a stream open upstream.
            until("the asking GET closed", || async { m.get_streams() == 0 }).await;
        } else {
            assert_eq!(caps["tools"], json!({}), "{what}");
            assert_eq!(caps["resources"], json!({}), "{what}");
        }
        let gw2 = Gateway::start(&config(&http_backend(&m.url()))).await;
        let (_, init) = OldClient::connect(&gw2.url("/mcp/b"), "2025-11-25").await;
        assert_eq!(init["capabilities"], d["capabilities"], "{what}: {init}");
        gw2.stop().await;
        gw.stop().await;
    }
    // A server whose answer says neither (400 here) is asked once, not on every discover, and
    // keeps what it advertises.
    let m = MockMcp::legacy().list_changed().start().await;
    m.refuse_gets(u64::MAX, 400);
    let gw = Gateway::start(&config(&http_backend(&m.url()))).await;
    let url = gw.url("/mcp/b");
    for _ in 0..3 {
        let d = discover(&url).await;
        assert_eq!(d["capabilities"]["tools"]["listChanged"], true, "{d}");
    }
    assert_eq!(m.session_gets(), 1);
    gw.stop().await;
}

/// Many clients discovering at once (a gateway's start) ask the server about its GET stream
/// once between them: the discovers that come while the question is out wait for its answer.
#[tokio::test]
async fn concurrent_discovers_ask_about_the_get_stream_once() {
    const CLIENTS: usize = 8;
    let m = MockMcp::legacy().list_changed().start().await;
    let gw = Gateway::start(&config(&http_backend(&m.url()))).await;
    let url = gw.url("/mcp/b");
    m.hold_gets(true);
    let discovers: Vec<_> = (0..CLIENTS)
        .map(|_| tokio::spawn(discover_owned(url.clone())))
        .collect();
    until("the question reached the server", || async {
        m.session_gets() >= 1
    })
    .await;
    // Discovers that did not wait for the answer would each have asked by now (the question's
    // deadline here is timeout_ms, 600 ms: let go well before it).
    tokio::time::sleep(Duration::from_millis(200)).await;
    m.hold_gets(false);
    for d in discovers {
        let d = d.await.unwrap();
        assert_eq!(d["capabilities"]["tools"]["listChanged"], true, "{d}");
    }
    assert_eq!(m.session_gets(), 1);
    gw.stop().await;
}

/// A server that allows one GET stream per session answers 409 while it still holds the one
/// portico has just let go of (the discover's question, a listener that left): the listen is
/// served once the server has let go too, not failed with 502.
#[tokio::test]
async fn a_get_refused_409_for_a_moment_is_asked_again() {
    let m = MockMcp::legacy().list_changed().start().await;
    let gw = Gateway::start(&config(&http_backend(&m.url()))).await;
    m.refuse_gets(3, 409);
    drop(hears_tool_changes(&gw.url("/mcp/b"), &m, "l").await);
    gw.stop().await;
}

/// Over stdio, both eras: the child's notifications (modern: tagged with the id portico gave
/// the listen request) reach the client with its own id; leaving cancels the child's listen.
#[tokio::test]
async fn stdio_listen_both_eras() {
    for args in [&["--modern"][..], &["--legacy"][..]] {
        let gw = Gateway::start(&config(&stdio_backend(args))).await;
        let url = gw.url("/mcp/b");
        let (status, mut l) =
            Listen::open(&url, json!("S1"), json!({"toolsListChanged": true})).await;
        assert_eq!(status, 200, "{args:?}");
        let ack = acknowledged_and_held_open(&mut l, json!("S1")).await;
        assert_eq!(
            ack["params"]["notifications"],
            json!({"toolsListChanged": true}),
            "{args:?}"
        );
        assert_eq!(open_listens(&gw, "b").await, 1);
        let r = mcp(
            &url,
            json!(1),
            "tools/call",
            json!({"name":"list_changed","arguments":{}}),
        )
        .await;
        assert_eq!(
            r.result()["result"]["content"][0]["text"],
            "sent",
            "{args:?}"
        );
        let notes = l.read_until("notifications/tools/list_changed").await;
        assert_eq!(
            count(&notes, "notifications/tools/list_changed"),
            1,
            "{args:?} {notes:?}"
        );
        assert_eq!(sid(&notes[0]), "S1");
        assert!(l.read(300).await.is_empty(), "{args:?}: one only");
        drop(l);
        until("the gauge back to 0", || async {
            open_listens(&gw, "b").await == 0
        })
        .await;
        if args == ["--modern"] {
            // The child heard the cancel of its listen request.
            until("the child's listen to end", || async {
                let r = mcp(
                    &url,
                    json!(2),
                    "tools/call",
                    json!({"name":"listeners","arguments":{}}),
                )
                .await;
                r.result()["result"]["structuredContent"]["listeners"] == 0
            })
            .await;
        }
        gw.stop().await;
    }
}

/// A legacy client's GET stream (`mcp-session-id`), as an open `Listen`.
pub(crate) async fn get_stream(url: &str, sid: &str) -> Listen {
    let resp = send_stream(
        "GET",
        url,
        &[("mcp-session-id", sid), ("accept", "text/event-stream")],
        "",
    )
    .await;
    assert_eq!(resp.status(), 200);
    Listen {
        body: resp.into_body(),
        dec: portico::sse::SseDecoder::new(1 << 20),
        raw: Vec::new(),
    }
}

/// Item 2 against an initialize-era HTTP backend: a legacy client's GET stream carries
/// list changes and the updates of its own subscriptions; `logging/setLevel` is per client, and
/// so are the log lines (on its requests' streams and its GET stream); `ping` stays local.
#[tokio::test]
async fn legacy_clients_get_notifications_subscriptions_and_their_own_logs() {
    let m = MockMcp::legacy()
        .list_changed()
        .subscribe_and_log()
        .start()
        .await;
    let gw = Gateway::start(&config(&http_backend(&m.url()))).await;
    let url = gw.url("/mcp/b");
    let (a, init) = OldClient::connect(&url, "2025-11-25").await;
    assert_eq!(init["capabilities"]["resources"]["subscribe"], true);
    assert!(init["capabilities"]["logging"].is_object());
    assert!(init["capabilities"]["tools"]["listChanged"] == true);
    let (b, _) = OldClient::connect(&url, "2025-06-18").await;
    let mut a_get = get_stream(&url, &a.sid).await;
    let mut b_get = get_stream(&url, &b.sid).await;
    until("both GET streams upstream", || async {
        m.get_streams() == 2
    })
    .await;
    assert_eq!(open_listens(&gw, "b").await, 2);
    // ping: answered by portico.
    let r = a.call(json!(1), "ping", json!({})).await;
    assert_eq!(r.json()["result"], json!({}));
    assert_eq!(m.count("ping"), 0);
    // subscribe: upstream, in a's own session.
    let r = a
        .call(json!(2), "resources/subscribe", json!({"uri":"mock://r"}))
        .await;
    assert_eq!(r.json()["result"], json!({}), "{:?}", r.body);
    assert_eq!(m.count("resources/subscribe"), 1);
    m.update_resource("mock://r");
    let notes = a_get.read_until("notifications/resources/updated").await;
    assert_eq!(
        count(&notes, "notifications/resources/updated"),
        1,
        "{notes:?}"
    );
    assert_eq!(notes[0]["params"]["uri"], "mock://r");
    assert!(
        sid(&notes[0]).is_null(),
        "no subscriptionId for a legacy client"
    );
    // list_changed: on both.
    m.add_tool("late");
    for (name, s) in [("a", &mut a_get), ("b", &mut b_get)] {
        let notes = s.read_until("notifications/tools/list_changed").await;
        assert_eq!(
            count(&notes, "notifications/tools/list_changed"),
            1,
            "{name}: {notes:?}"
        );
        assert_eq!(
            count(&notes, "notifications/resources/updated"),
            0,
            "{name}: b subscribed to nothing, a got its update already: {notes:?}"
        );
    }
    // Log levels, per client.
    let r = a
        .call(json!(3), "logging/setLevel", json!({"level":"warning"}))
        .await;
    assert_eq!(r.json()["result"], json!({}));
    let r = b
        .call(json!(3), "logging/setLevel", json!({"level":"debug"}))
        .await;
    assert_eq!(r.json()["result"], json!({}));
    let mut levels: Vec<String> = m.state.levels.lock().unwrap().values().cloned().collect();
    levels.sort();
    assert_eq!(levels, ["debug", "warning"], "each in its own session");
    let lines = |r: &Resp| -> Vec<String> {
        r.messages()
            .iter()
            .filter(|m| m["method"] == "notifications/message")
            .map(|m| m["params"]["data"].as_str().unwrap_or("").to_string())
            .collect()
    };
    let ra = a
        .call(
            json!(4),
            "tools/call",
            json!({"name":"log","arguments":{"tag":"A"}}),
        )
        .await;
    let rb = b
        .call(
            json!(4),
            "tools/call",
            json!({"name":"log","arguments":{"tag":"B"}}),
        )
        .await;
    assert_eq!(lines(&ra), ["A:warning", "A:error"], "{:?}", ra.body);
    assert_eq!(
        lines(&rb),
        ["B:debug", "B:info", "B:warning", "B:error"],
        "{:?}",
        rb.body
    );
    assert_eq!(ra.result()["result"]["content"][0]["text"], "logged");
    // Session-wide log lines on the GET streams: each client's level.
    m.log_to_sessions("info", "chatter");
    let notes = b_get.read_until("notifications/message").await;
    assert_eq!(count(&notes, "notifications/message"), 1, "{notes:?}");
    assert!(
        a_get.read(300).await.is_empty(),
        "a asked for warning and above"
    );
    // unsubscribe: upstream too; later updates reach nobody.
    let r = a
        .call(json!(5), "resources/unsubscribe", json!({"uri":"mock://r"}))
        .await;
    assert_eq!(r.json()["result"], json!({}));
    until("resources/unsubscribe upstream", || async {
        m.count("resources/unsubscribe") == 1
    })
    .await;
    m.update_resource("mock://r");
    assert!(a_get.read(300).await.is_empty());
    drop(a_get);
    drop(b_get);
    until("the GET streams upstream to close", || async {
        m.get_streams() == 0
    })
    .await;
    until("the gauge back to 0", || async {
        open_listens(&gw, "b").await == 0
    })
    .await;
    gw.stop().await;
}

/// A legacy client's GET stream outlives the upstream listen behind it: when the backend ends
/// it (a restart), portico opens it again in the client's name, tells the client each agreed
/// list may have changed meanwhile, and relays the backend's changes again — on the same
/// stream, without the client reconnecting (which an SDK gives up after a few tries). A
/// server that offers nothing to hear leaves the stream open and quiet.
#[tokio::test]
async fn a_legacy_clients_get_stream_is_renewed_when_the_listen_behind_it_ends() {
    let m = MockMcp::modern().list_changed().start().await;
    let gw = Gateway::start(&config(&http_backend(&m.url()))).await;
    let url = gw.url("/mcp/b");
    let (a, _) = OldClient::connect(&url, "2025-11-25").await;
    let mut get = get_stream(&url, &a.sid).await;
    until("the upstream listen", || async { m.listen_streams() == 1 }).await;
    m.end_listens();
    until("the upstream listen again", || async {
        m.listen_streams() == 1
    })
    .await;
    let notes = get.read_until("notifications/resources/list_changed").await;
    for kind in ["tools", "prompts", "resources"] {
        let method = format!("notifications/{kind}/list_changed");
        assert_eq!(count(&notes, &method), 1, "caught up: {notes:?}");
    }
    m.add_tool("late");
    let notes = get.read_until("notifications/tools/list_changed").await;
    assert_eq!(
        count(&notes, "notifications/tools/list_changed"),
        1,
        "{notes:?}"
    );
    assert_eq!(open_listens(&gw, "b").await, 1);
    drop(get);
    until(
        "the renewed listen closed with the client's stream",
        || async { m.listen_streams() == 0 },
    )
    .await;
    gw.stop().await;

    let m = MockMcp::legacy()
        .list_changed()
        .no_get_stream()
        .start()
        .await;
    let gw = Gateway::start(&config(&http_backend(&m.url()))).await;
    let url = gw.url("/mcp/b");
    let (a, _) = OldClient::connect(&url, "2025-11-25").await;
    let mut get = get_stream(&url, &a.sid).await;
    let t = Instant::now();
    let heard = get.read(1500).await;
    assert!(heard.is_empty(), "{heard:?}");
    assert!(t.elapsed() >= Duration::from_millis(1400), "held open");
    gw.stop().await;
}

/// `resources/subscribe` from a legacy client against a 2026-07-28 backend: a listen with
/// `resourceSubscriptions` held for the client until it unsubscribes.
#[tokio::test]
async fn legacy_client_subscribes_on_a_modern_backend() {
    let m = MockMcp::modern().subscribe_and_log().start().await;
    let gw = Gateway::start(&config(&http_backend(&m.url()))).await;
    let url = gw.url("/mcp/b");
    let (a, init) = OldClient::connect(&url, "2025-11-25").await;
    assert_eq!(init["capabilities"]["resources"]["subscribe"], true);
    let mut a_get = get_stream(&url, &a.sid).await;
    let r = a
        .call(json!(1), "resources/subscribe", json!({"uri":"mock://r"}))
        .await;
    assert_eq!(r.json()["result"], json!({}), "{:?}", r.body);
    // The GET stream's own listen and the subscription's.
    assert_eq!(m.listen_streams(), 2);
    assert_eq!(open_listens(&gw, "b").await, 2);
    m.update_resource("mock://r");
    let notes = a_get.read_until("notifications/resources/updated").await;
    assert_eq!(
        count(&notes, "notifications/resources/updated"),
        1,
        "{notes:?}"
    );
    let r = a
        .call(json!(2), "resources/unsubscribe", json!({"uri":"mock://r"}))
        .await;
    assert_eq!(r.json()["result"], json!({}));
    until("the subscription's listen to close", || async {
        m.listen_streams() == 1
    })
    .await;
    drop(a_get);
    until("every listen closed", || async { m.listen_streams() == 0 }).await;
    until("the gauge back to 0", || async {
        open_listens(&gw, "b").await == 0
    })
    .await;
    gw.stop().await;
}

/// A legacy client's subscription outlives the upstream listen behind it: when the backend
/// restarts, portico subscribes again in the client's name (a new upstream session on an
/// initialize-era backend), and the client — whose GET stream ended with its own listen, so it
/// reconnects — hears the resource's updates again; an unsubscribe then ends the renewed
/// listen. Without the renewal the subscription would go silent with nothing telling the
/// client.
#[tokio::test]
async fn a_legacy_clients_subscription_is_renewed_when_the_backend_restarts() {
    for legacy in [false, true] {
        let m = if legacy {
            MockMcp::legacy().subscribe_and_log()
        } else {
            MockMcp::modern().subscribe_and_log()
        }
        .start()
        .await;
        // What carries a subscription upstream: a listen (2026-07-28) or the session's GET
        // stream after `resources/subscribe` (initialize era).
        let carriers = |m: &crate::common::mock::MockHandle| {
            if legacy {
                m.get_streams()
            } else {
                m.listen_streams()
            }
        };
        let gw = Gateway::start(&config(&http_backend(&m.url()))).await;
        let url = gw.url("/mcp/b");
        let (a, _) = OldClient::connect(&url, "2025-11-25").await;
        let r = a
            .call(json!(1), "resources/subscribe", json!({"uri":"mock://r"}))
            .await;
        assert_eq!(r.json()["result"], json!({}), "{legacy}: {:?}", r.body);
        assert_eq!(m.count("resources/subscribe"), u64::from(legacy));
        until("the subscription upstream", || async { carriers(&m) == 1 }).await;
        m.restart();
        // Initialize era: the session's GET stream is opened before `resources/subscribe` is
        // sent again (so no update falls between them); wait for both.
        until("the subscription renewed upstream", || async {
            carriers(&m) == 1 && m.count("resources/subscribe") == 2 * u64::from(legacy)
        })
        .await;
        let mut get = get_stream(&url, &a.sid).await;
        until("the GET stream's listen too", || async {
            open_listens(&gw, "b").await == 2
        })
        .await;
        m.update_resource("mock://r");
        let notes = get.read_until("notifications/resources/updated").await;
        let updates: Vec<&Value> = notes
            .iter()
            .filter(|n| n["method"] == "notifications/resources/updated")
            .collect();
        assert!(!updates.is_empty(), "{legacy}: {notes:?}");
        assert!(
            updates.iter().all(|n| n["params"]["uri"] == "mock://r"),
            "{legacy}: {notes:?}"
        );
        let r = a
            .call(json!(2), "resources/unsubscribe", json!({"uri":"mock://r"}))
            .await;
        assert_eq!(r.json()["result"], json!({}));
        until("the renewed listen closed", || async {
            open_listens(&gw, "b").await == 1
        })
        .await;
        drop(get);
        gw.stop().await;
    }
}

/// A 2026-07-28 client's listen on an initialize-era backend that restarted (and forgot the
/// upstream session portico holds for the client): the session's GET stream answers 404, and
/// the listen is served in a new session rather than refused until some other request
/// happens to re-initialize it.
#[tokio::test]
async fn a_listen_after_a_legacy_backend_restart_opens_a_new_session() {
    let m = MockMcp::legacy().list_changed().start().await;
    let gw = Gateway::start(&config(&http_backend(&m.url()))).await;
    let url = gw.url("/mcp/b");
    let filter = json!({"toolsListChanged": true});
    let (status, mut first) = Listen::open(&url, json!("l1"), filter.clone()).await;
    assert_eq!(status, 200);
    let ack = first
        .read_until("notifications/subscriptions/acknowledged")
        .await;
    assert_eq!(ack[0]["params"]["notifications"], filter, "{ack:?}");
    assert_eq!(m.count("initialize"), 1);
    m.restart();
    let ended = first.read(3000).await;
    assert!(
        ended
            .iter()
            .any(|m| m["id"] == "l1" && m.get("result").is_some()),
        "the listen ends with its session's stream: {ended:?}"
    );
    let second = hears_tool_changes(&url, &m, "l2").await;
    assert_eq!(m.count("initialize"), 2, "a new upstream session");
    drop(second);
    gw.stop().await;
}

/// A tools-list-changed listen (`id`) on an initialize-era backend `m` behind `url`: opened,
/// acknowledged with what it asked for, on one GET stream upstream, and hearing a change.
async fn hears_tool_changes(url: &str, m: &crate::common::mock::MockHandle, id: &str) -> Listen {
    let filter = json!({"toolsListChanged": true});
    let (status, mut l) = Listen::open(url, json!(id), filter.clone()).await;
    assert_eq!(status, 200);
    let ack = l
        .read_until("notifications/subscriptions/acknowledged")
        .await;
    assert_eq!(ack[0]["params"]["notifications"], filter, "{ack:?}");
    until("its GET stream", || async { m.get_streams() == 1 }).await;
    m.add_tool(&format!("late-{id}"));
    let notes = l.read_until("notifications/tools/list_changed").await;
    assert_eq!(count(&notes, "notifications/tools/list_changed"), 1);
    l
}

/// The result of a `server/discover` at `url`.
async fn discover_owned(url: String) -> Value {
    discover(&url).await
}

async fn discover(url: &str) -> Value {
    mcp(url, json!(0), "server/discover", json!({}))
        .await
        .json()["result"]
        .clone()
}

/// The `data` of the log lines in an answer.
fn log_lines(r: &Resp) -> Vec<String> {
    r.messages()
        .iter()
        .filter(|m| m["method"] == "notifications/message")
        .map(|m| m["params"]["data"].as_str().unwrap_or("").to_string())
        .collect()
}

async fn call_log(url: &str, id: u64, tag: &str, level: Option<&str>) -> Resp {
    let mut params = json!({"name":"log","arguments":{"tag":tag}});
    if let Some(l) = level {
        params["_meta"] = json!({"io.modelcontextprotocol/logLevel": l});
    }
    mcp(url, json!(id), "tools/call", params).await
}

/// Item 3: a 2026-07-28 request's `logLevel` against an initialize-era backend — its log lines
/// on the call's stream at or above that level, none without one (even when the shared
/// upstream session was set lower by another request).
#[tokio::test]
async fn a_modern_requests_log_level_is_honoured_by_a_legacy_backend() {
    let m = MockMcp::legacy().subscribe_and_log().start().await;
    let gw = Gateway::start(&config(&http_backend(&m.url()))).await;
    let url = gw.url("/mcp/b");
    let r = call_log(&url, 1, "W", Some("warning")).await;
    assert_eq!(log_lines(&r), ["W:warning", "W:error"], "{:?}", r.body);
    assert_eq!(r.result()["result"]["content"][0]["text"], "logged");
    let r = call_log(&url, 2, "D", Some("debug")).await;
    assert_eq!(log_lines(&r), ["D:debug", "D:info", "D:warning", "D:error"]);
    // The session now logs at debug; a request asking for errors gets errors only.
    let r = call_log(&url, 3, "E", Some("error")).await;
    assert_eq!(log_lines(&r), ["E:error"]);
    let r = call_log(&url, 4, "N", None).await;
    assert!(log_lines(&r).is_empty(), "{:?}", r.body);
    assert_eq!(r.result()["result"]["content"][0]["text"], "logged");
    gw.stop().await;
}

/// Item 4: every capability `server/discover` (and a legacy client's `initialize`) advertises
/// through portico is exercised and delivers; nothing else is advertised.
#[tokio::test]
async fn every_advertised_capability_is_delivered() {
    let m = MockMcp::legacy()
        .list_changed()
        .subscribe_and_log()
        .start()
        .await;
    let gw = Gateway::start(&config(&http_backend(&m.url()))).await;
    let url = gw.url("/mcp/b");
    let d = discover(&url).await;
    let caps = d["capabilities"].as_object().unwrap().clone();
    assert!(
        caps.get("tasks").is_none(),
        "not bridged, so not advertised: {d}"
    );
    let (_, init) = OldClient::connect(&url, "2025-11-25").await;
    assert_eq!(
        init["capabilities"], d["capabilities"],
        "legacy clients are promised the same"
    );
    let mut walked = Vec::new();
    for (name, cap) in &caps {
        match name.as_str() {
            "tools" => {
                if cap["listChanged"] == true {
                    let (_, mut l) =
                        Listen::open(&url, json!("t"), json!({"toolsListChanged": true})).await;
                    l.read_until("notifications/subscriptions/acknowledged")
                        .await;
                    m.add_tool("walked");
                    let n = l.read_until("notifications/tools/list_changed").await;
                    assert_eq!(count(&n, "notifications/tools/list_changed"), 1);
                    walked.push("tools.listChanged");
                }
                let r = mcp(&url, json!(1), "tools/list", json!({})).await;
                assert!(r.json()["result"]["tools"].is_array());
                walked.push("tools");
            }
            "resources" => {
                if cap["subscribe"] == true {
                    let (_, mut l) = Listen::open(
                        &url,
                        json!("r"),
                        json!({"resourceSubscriptions": ["mock://r"]}),
                    )
                    .await;
                    let ack = l
                        .read_until("notifications/subscriptions/acknowledged")
                        .await;
                    assert_eq!(
                        ack[0]["params"]["notifications"]["resourceSubscriptions"],
                        json!(["mock://r"])
                    );
                    m.update_resource("mock://r");
                    let n = l.read_until("notifications/resources/updated").await;
                    assert_eq!(count(&n, "notifications/resources/updated"), 1);
                    walked.push("resources.subscribe");
                }
                let r = mcp(&url, json!(2), "resources/read", json!({"uri":"mock://r"})).await;
                assert_eq!(r.result()["result"]["contents"][0]["text"], "mock resource");
                walked.push("resources");
            }
            "prompts" => {
                let r = mcp(&url, json!(3), "prompts/list", json!({})).await;
                assert!(r.json()["result"]["prompts"].is_array());
                walked.push("prompts");
            }
            "logging" => {
                let r = call_log(&url, 4, "L", Some("error")).await;
                assert_eq!(log_lines(&r), ["L:error"]);
                walked.push("logging");
            }
            other => panic!("advertised but not walked: {other}"),
        }
    }
    walked.sort();
    assert_eq!(
        walked,
        [
            "logging",
            "prompts",
            "resources",
            "resources.subscribe",
            "tools",
            "tools.listChanged"
        ]
    );
    gw.stop().await;
}

/// An aggregated endpoint: acknowledged once the members have, `resourceSubscriptions` routed
/// to the member that serves the URI (here the initialize-era one, listed first), its
/// `resources/updated` relayed with the client's id, and the stream counted until it ends.
#[tokio::test]
async fn aggregated_listen_routes_resource_subscriptions_by_uri() {
    let l = MockMcp::legacy()
        .list_changed()
        .subscribe_and_log()
        .start()
        .await;
    let m = MockMcp::modern().list_changed().start().await;
    let gw = Gateway::start(&format!(
        "[server]\nsse_keepalive_ms = 150\n[metrics]\n[log]\naccess = false\n[cache]\nenabled = false\n\
         [[backends]]\nname = \"l\"\nurl = \"{}\"\ntimeout_ms = 3000\n\
         [[backends]]\nname = \"m\"\nurl = \"{}\"\ntimeout_ms = 3000\n\
         [[endpoints]]\npath = \"/mcp\"\nbackends = ['l', 'm']\ndebounce_ms = 50\n",
        l.url(),
        m.url()
    ))
    .await;
    let url = gw.url("/mcp");
    let filter =
        json!({"toolsListChanged": true, "resourceSubscriptions": ["mock://r", "nowhere://x"]});
    let (status, mut s) = Listen::open(&url, json!("A1"), filter).await;
    assert_eq!(status, 200);
    let first = s
        .read_until("notifications/subscriptions/acknowledged")
        .await;
    assert_eq!(
        first[0]["params"]["notifications"],
        json!({"toolsListChanged": true, "resourceSubscriptions": ["mock://r"]}),
        "{first:?}"
    );
    // Acknowledged after the members: the legacy one subscribed upstream already.
    assert_eq!(l.count("resources/subscribe"), 1);
    assert_eq!(m.listen_streams(), 1);
    assert_eq!(open_listens(&gw, "/mcp").await, 1);
    l.update_resource("mock://r");
    let notes = s.read_until("notifications/resources/updated").await;
    assert_eq!(
        count(&notes, "notifications/resources/updated"),
        1,
        "{notes:?}"
    );
    assert_eq!(notes[0]["params"]["uri"], "mock://r");
    assert_eq!(sid(&notes[0]), "A1");
    m.add_tool("late");
    let notes = s.read_until("notifications/tools/list_changed").await;
    assert_eq!(
        count(&notes, "notifications/tools/list_changed"),
        1,
        "{notes:?}"
    );
    drop(s);
    until("the members' streams to close", || async {
        m.listen_streams() == 0 && l.get_streams() == 0
    })
    .await;
    until("the gauge back to 0", || async {
        open_listens(&gw, "/mcp").await == 0
    })
    .await;
    gw.stop().await;
}

/// An aggregated listen ends when one member's listen that agreed something ends (a restarting
/// backend), with the client's result, rather than stay open with that member's part deaf and
/// nothing to tell the client; its other members' listens close with it, and a new listen
/// hears the restarted member again.
#[tokio::test]
async fn an_aggregated_listen_ends_when_a_members_listen_ends() {
    let a = MockMcp::modern().list_changed().start().await;
    let b = MockMcp::modern().list_changed().start().await;
    let gw = Gateway::start(&format!(
        "[log]\naccess = false\n[cache]\nenabled = false\n\
         [[backends]]\nname = \"a\"\nurl = \"{}\"\n\
         [[backends]]\nname = \"b\"\nurl = \"{}\"\n\
         [[endpoints]]\npath = \"/mcp\"\nbackends = ['a', 'b']\ndebounce_ms = 20\n",
        a.url(),
        b.url()
    ))
    .await;
    let url = gw.url("/mcp");
    let filter = json!({"toolsListChanged": true});
    let (status, mut s) = Listen::open(&url, json!("A1"), filter.clone()).await;
    assert_eq!(status, 200);
    s.read_until("notifications/subscriptions/acknowledged")
        .await;
    assert_eq!((a.listen_streams(), b.listen_streams()), (1, 1));
    b.end_listens();
    let t = Instant::now();
    let rest = s.read(4000).await;
    assert!(
        rest.iter()
            .any(|m| m["id"] == "A1" && m["result"]["resultType"] == "complete"),
        "the client's listen ends with its result: {rest:?}"
    );
    assert!(t.elapsed() < Duration::from_secs(3), "at once");
    until("the other member's listen closed", || async {
        a.listen_streams() == 0
    })
    .await;
    let (status, mut s) = Listen::open(&url, json!("A2"), filter).await;
    assert_eq!(status, 200);
    s.read_until("notifications/subscriptions/acknowledged")
        .await;
    b.add_tool("late");
    let notes = s.read_until("notifications/tools/list_changed").await;
    assert_eq!(
        count(&notes, "notifications/tools/list_changed"),
        1,
        "{notes:?}"
    );
    drop(s);
    gw.stop().await;
}
