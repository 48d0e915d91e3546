//! Resumable SSE streams for initialize-era clients (`src/legacy/resume.rs`; docs/protocol.md
//! §7 "Resumability"): a request's answer stream and the session's GET stream carry event
//! ids, outlive a dropped connection for `[sessions] resume_ms`, and a `GET` with
//! `Last-Event-ID` in the same session takes them up after that event. Hermetic: a real
//! gateway on loopback, the in-repo mock behind it, the client's connection dropped by
//! dropping the response.

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::{Value, json};
use std::time::Duration;

use crate::common::mock::{MockHandle, MockMcp};
use crate::common::*;
use crate::legacy::OldClient;
use crate::listen::until;

fn config(url: &str, extra: &str) -> String {
    format!(
        "[metrics]\n[log]\naccess = false\n[sessions]\nkey = \"resume-test-key\"\n{extra}\n\
         [[backends]]\nname = \"b\"\nurl = \"{url}\"\n"
    )
}

/// One SSE event as sent: its id and data (empty for the priming event).
#[derive(Debug)]
struct Event {
    id: Option<String>,
    data: String,
    retry: Option<u64>,
}

impl Event {
    fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or(Value::Null)
    }

    /// The sequence number of portico's id (`<kind><token>-<seq>[.<replica tag>]`).
    fn seq(&self) -> u64 {
        let id = self.id.as_deref().expect("an id");
        let id = id.split('.').next().unwrap();
        id.rsplit('-').next().unwrap().parse().expect("a number")
    }
}

/// Reads whole events off a response body (comments skipped).
struct Events {
    body: Incoming,
    buf: Vec<u8>,
}

impl Events {
    fn new(resp: http::Response<Incoming>) -> Events {
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.headers()["content-type"],
            "text/event-stream",
            "an SSE answer"
        );
        Events {
            body: resp.into_body(),
            buf: Vec::new(),
        }
    }

    /// The next event (bounded: 10 s); `None` when the stream ended.
    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let raw: Vec<u8> = self.buf.drain(..end + 2).collect();
                let text = String::from_utf8(raw).expect("UTF-8");
                let (mut id, mut data, mut retry, mut any) = (None, Vec::new(), None, false);
                for line in text.lines() {
                    if let Some(v) = line.strip_prefix("id: ") {
                        id = Some(v.to_string());
                        any = true;
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data.push(v.to_string());
                        any = true;
                    } else if let Some(v) = line.strip_prefix("retry: ") {
                        retry = v.parse().ok();
                        any = true;
                    } else if line.starts_with("event:") {
                        any = true;
                    }
                }
                if any {
                    return Some(Event {
                        id,
                        data: data.join("\n"),
                        retry,
                    });
                }
                continue;
            }
            let frame = tokio::time::timeout(Duration::from_secs(10), self.body.frame())
                .await
                .expect("an event within 10 s");
            match frame {
                Some(Ok(f)) => {
                    if let Ok(d) = f.into_data() {
                        self.buf.extend_from_slice(&d);
                    }
                }
                _ => return None,
            }
        }
    }

    /// Events up to and including the response (a message with an `id` and a result or error).
    async fn until_response(&mut self) -> Vec<Event> {
        let mut out = Vec::new();
        while let Some(e) = self.next().await {
            let v = e.json();
            let done =
                v.get("id").is_some() && (v.get("result").is_some() || v.get("error").is_some());
            out.push(e);
            if done {
                return out;
            }
        }
        panic!("the stream ended before the response: {out:?}");
    }
}

fn post_headers(c: &OldClient) -> Vec<(&str, &str)> {
    vec![
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("mcp-session-id", &c.sid),
        ("mcp-protocol-version", &c.version),
    ]
}

/// A `tools/call` of the mock's `progress` tool, its answer stream open.
async fn progress_call(c: &OldClient, id: u64, steps: u64, delay_ms: u64) -> Events {
    let body = json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
        "name":"progress","arguments":{"steps":steps,"delay_ms":delay_ms},
        "_meta":{"progressToken":"t"}}});
    Events::new(send_stream("POST", &c.url, &post_headers(c), body.to_string()).await)
}

/// The rest of call 5 (4 progress steps) resumed after its first progress: the events up to
/// the response, ids continuing after the one named, the stream ending there, and the call
/// made once upstream.
async fn rest_of_the_call(mut again: Events, mock: &MockHandle) -> Vec<Event> {
    let rest = again.until_response().await;
    let seqs: Vec<u64> = rest.iter().map(Event::seq).collect();
    assert_eq!(seqs, [2, 3, 4, 5], "ids continue after the one named");
    let answer = rest.last().unwrap().json();
    assert_eq!(answer["id"], 5);
    assert_eq!(answer["result"]["content"][0]["text"], "done 4", "{answer}");
    assert!(
        again.next().await.is_none(),
        "the stream ends after its answer"
    );
    assert_eq!(
        mock.count("tools/call"),
        1,
        "the call reached the server once"
    );
    rest
}

async fn resume_get(c: &OldClient, last: &str) -> http::Response<Incoming> {
    send_stream(
        "GET",
        &c.url,
        &[
            ("mcp-session-id", &c.sid),
            ("mcp-protocol-version", &c.version),
            ("accept", "text/event-stream"),
            ("last-event-id", last),
        ],
        Bytes::new(),
    )
    .await
}

async fn scrape(gw: &Gateway) -> String {
    let r = send("GET", &gw.metrics_url("/metrics"), &[], "").await;
    String::from_utf8_lossy(&r.body).to_string()
}

/// A 2025-11-25 client's call: the priming event first, then each message with the next id.
/// The connection drops after the first progress: the call goes on upstream (disconnecting is
/// not cancelling), and the client's GET with the last id it saw gets the rest — the other
/// progress notifications and the response, none twice. Another session cannot take it.
#[tokio::test]
async fn an_answer_stream_outlives_its_connection_and_is_resumed() {
    let mock = MockMcp::modern().sse().start().await;
    let gw = Gateway::start(&config(&mock.url(), "")).await;
    let url = gw.url("/mcp/b");
    let (c, _) = OldClient::connect(&url, "2025-11-25").await;
    let (other, _) = OldClient::connect(&url, "2025-11-25").await;

    let mut stream = progress_call(&c, 5, 4, 150).await;
    let priming = stream.next().await.expect("the priming event");
    assert!(priming.data.is_empty(), "{priming:?}");
    assert_eq!(priming.seq(), 0);
    let first = stream.next().await.expect("the first progress");
    assert_eq!(first.json()["method"], "notifications/progress");
    assert_eq!(first.json()["params"]["progress"], 1);
    assert_eq!(first.seq(), 1);
    let last = first.id.clone().unwrap();
    drop(stream);
    assert!(
        !mock.wait_cancelled(Duration::from_millis(400)).await,
        "a dropped connection cancelled the call"
    );

    // Another session naming the same event gets no stream of this one's.
    let r = resume_get(&other, &last).await;
    assert_eq!(r.status(), 400);
    let body = r.into_body().collect().await.unwrap().to_bytes();
    let err: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(err["error"]["code"], -32000, "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cannot be resumed"),
        "{err}"
    );

    let rest = rest_of_the_call(Events::new(resume_get(&c, &last).await), &mock).await;
    let progress: Vec<Value> = rest
        .iter()
        .filter(|e| e.json()["method"] == "notifications/progress")
        .map(|e| e.json()["params"]["progress"].clone())
        .collect();
    assert_eq!(progress, [json!(2), json!(3), json!(4)], "{rest:?}");

    let s = scrape(&gw).await;
    assert!(
        s.contains("portico_stream_resumes_total{outcome=\"resumed\"} 1"),
        "{s}"
    );
    assert!(
        s.contains("portico_stream_resumes_total{outcome=\"unknown\"} 1"),
        "{s}"
    );
    gw.stop().await;
}

/// Two replicas with one `[sessions] key`, each naming itself in `advertise_url`: a stream's
/// ids name the replica holding it, so a resume that lands on the other replica is forwarded
/// there once and the rest of the stream comes back through it — none of it twice, the call
/// made once. A resume already forwarded is not forwarded again (the holder would have
/// answered it); with the holder gone, an answer's resume is a 502 naming it, never a hang,
/// and a GET stream's opens anew.
#[tokio::test]
async fn a_resume_on_another_replica_is_forwarded_to_the_one_holding_the_stream() {
    let mock = MockMcp::modern().sse().start().await;
    let (l1, l2) = (
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
    );
    let (a1, a2) = (l1.local_addr().unwrap(), l2.local_addr().unwrap());
    let replica =
        |me: std::net::SocketAddr| config(&mock.url(), &format!("advertise_url = \"http://{me}\""));
    let one = Gateway::start_on(&replica(a1), l1).await;
    let two = Gateway::start_on(&replica(a2), l2).await;
    let (c, _) = OldClient::connect(&one.url("/mcp/b"), "2025-11-25").await;
    let on_two = OldClient {
        url: two.url("/mcp/b"),
        sid: c.sid.clone(),
        version: c.version.clone(),
    };

    let mut stream = progress_call(&c, 5, 4, 150).await;
    let priming = stream.next().await.expect("the priming event");
    let first = stream.next().await.expect("the first progress");
    assert_eq!(first.seq(), 1);
    let last = first.id.clone().unwrap();
    assert!(last.contains('.'), "the id names its replica: {last}");
    drop(stream);

    // Marked as forwarded once already: the other replica does not hold it, and says so.
    let mut h = vec![
        ("mcp-session-id", c.sid.as_str()),
        ("mcp-protocol-version", c.version.as_str()),
        ("accept", "text/event-stream"),
        ("last-event-id", last.as_str()),
    ];
    h.push(("portico-forwarded", "1"));
    let r = send("GET", &on_two.url, &h, "").await;
    assert_eq!((r.status, r.code()), (400, -32000), "{:?}", r.body);

    let rest = rest_of_the_call(Events::new(resume_get(&on_two, &last).await), &mock).await;
    assert!(
        rest.iter().all(|e| e
            .id
            .as_deref()
            .unwrap()
            .ends_with(&last[last.find('.').unwrap()..])),
        "the holder's ids, relayed as written: {rest:?}"
    );
    assert!(
        scrape(&two)
            .await
            .contains("portico_stream_resumes_total{outcome=\"forwarded\"} 1")
    );
    assert!(
        scrape(&one)
            .await
            .contains("portico_stream_resumes_total{outcome=\"resumed\"} 1")
    );

    // The holder gone: an answer's resume fails at once, naming it; a GET stream opens here.
    let mut stream = progress_call(&c, 6, 100, 100).await;
    stream.next().await.expect("the priming event");
    let last = stream.next().await.expect("a progress").id.unwrap();
    drop(stream);
    let mut get = Events::new(
        send_stream(
            "GET",
            &c.url,
            &[("mcp-session-id", &c.sid), ("accept", "text/event-stream")],
            Bytes::new(),
        )
        .await,
    );
    let get_last = get
        .next()
        .await
        .expect("the GET stream's priming event")
        .id
        .unwrap();
    drop(get);
    one.stop().await;
    let r = tokio::time::timeout(Duration::from_secs(10), resume_get(&on_two, &last))
        .await
        .expect("answered within 10 s");
    assert_eq!(r.status(), 502);
    let body = r.into_body().collect().await.unwrap().to_bytes();
    let msg = String::from_utf8_lossy(&body).to_string();
    assert!(msg.contains(&format!("http://{a1}")), "{msg}");
    let mut fresh = Events::new(resume_get(&on_two, &get_last).await);
    let primed = fresh
        .next()
        .await
        .expect("a fresh GET stream's priming event");
    assert_eq!(primed.seq(), 0, "a new stream: {primed:?}");
    assert_ne!(primed.id, Some(get_last));
    drop(fresh);
    drop(priming);
    two.stop().await;
}

/// Nobody back within `resume_ms`: the stream is dropped, which cancels the call upstream, and
/// a late resume is refused with a message that says why. A `Last-Event-ID` that is no id of
/// portico's is ignored (the session's GET stream opens as usual). An older revision gets ids
/// but no priming event; with `resume_ms = 0`, neither.
#[tokio::test]
async fn a_stream_nobody_resumes_is_dropped_and_a_late_resume_refused() {
    let mock = MockMcp::modern().sse().start().await;
    let gw = Gateway::start(&config(&mock.url(), "resume_ms = 300")).await;
    let url = gw.url("/mcp/b");
    let (c, _) = OldClient::connect(&url, "2025-06-18").await;
    let mut stream = progress_call(&c, 1, 100, 100).await;
    let first = stream.next().await.unwrap();
    assert_eq!(
        first.json()["method"],
        "notifications/progress",
        "no priming event before 2025-11-25"
    );
    let last = first.id.clone().expect("an id");
    drop(stream);
    assert!(
        mock.wait_cancelled(Duration::from_secs(5)).await,
        "the call was never cancelled upstream"
    );
    let r = resume_get(&c, &last).await;
    assert_eq!(r.status(), 400);

    let r = resume_get(&c, "not-one-of-portico's").await;
    assert_eq!(r.status(), 200, "an unknown id opens the GET stream");
    drop(r);
    gw.stop().await;

    let gw = Gateway::start(&config(&mock.url(), "resume_ms = 0")).await;
    let (c, _) = OldClient::connect(&gw.url("/mcp/b"), "2025-11-25").await;
    let mut stream = progress_call(&c, 2, 2, 50).await;
    let events = stream.until_response().await;
    assert!(
        events.iter().all(|e| e.id.is_none() && !e.data.is_empty()),
        "{events:?}"
    );
    gw.stop().await;
}

/// The session's GET stream too: what its upstream listen hears while the client reconnects
/// is kept and replayed after the last id it saw; once nobody is back within `resume_ms`,
/// the upstream listen closes.
#[tokio::test]
async fn a_get_stream_keeps_what_it_hears_while_its_client_reconnects() {
    let m = MockMcp::legacy().list_changed().start().await;
    let gw = Gateway::start(&config(&m.url(), "resume_ms = 2000")).await;
    let url = gw.url("/mcp/b");
    let (c, _) = OldClient::connect(&url, "2025-11-25").await;
    let get = send_stream(
        "GET",
        &url,
        &[("mcp-session-id", &c.sid), ("accept", "text/event-stream")],
        Bytes::new(),
    )
    .await;
    let mut get = Events::new(get);
    let priming = get.next().await.expect("the priming event");
    assert!(priming.data.is_empty());
    let last = priming.id.clone().unwrap();
    assert!(last.starts_with('g'), "{last}");
    until("the GET stream's listen upstream", || async {
        m.get_streams() == 1
    })
    .await;
    drop(get);
    // Heard while no connection reads the stream.
    m.add_tool("late");
    let mut again = Events::new(resume_get(&c, &last).await);
    let note = again.next().await.expect("the note heard meanwhile");
    assert_eq!(
        note.json()["method"],
        "notifications/tools/list_changed",
        "{note:?}"
    );
    assert_eq!(note.seq(), 1);
    assert_eq!(m.get_streams(), 1, "the same upstream stream all along");
    drop(again);
    until("the held GET stream's listen to close", || async {
        m.get_streams() == 0
    })
    .await;
    gw.stop().await;
}

/// `[server] max_stream_ms` (a load balancer's limit on a response's duration) ends a
/// 2025-11-25 client's connection, not its stream: a `retry` hint and the end, no error; the
/// client resumes on a new connection, each again cut at the limit, until the response (SEP-1699
/// polling). An older revision, which does not resume a stream that sent no id before the
/// cut, still gets the error event for its request.
#[tokio::test]
async fn max_stream_ms_ends_a_resumable_streams_connection_not_its_call() {
    let mock = MockMcp::modern().sse().start().await;
    let gw = Gateway::start(
        &config(&mock.url(), "")
            .replace("[metrics]\n", "[metrics]\n[server]\nmax_stream_ms = 300\n"),
    )
    .await;
    let url = gw.url("/mcp/b");
    let (c, _) = OldClient::connect(&url, "2025-11-25").await;
    let mut stream = progress_call(&c, 9, 6, 150).await;
    let mut progress = Vec::new();
    let mut connections = 1;
    let mut last: Option<String> = None;
    let answer = loop {
        match stream.next().await {
            Some(e) if e.retry.is_some() => {
                assert_eq!(e.retry, Some(100), "{e:?}");
                assert!(
                    stream.next().await.is_none(),
                    "the connection ends after the hint"
                );
                connections += 1;
                assert!(connections < 20, "no progress");
                let from = last.clone().expect("an event before the cut");
                stream = Events::new(resume_get(&c, &from).await);
            }
            Some(e) => {
                if e.id.is_some() {
                    last = e.id.clone();
                }
                let v = e.json();
                if v["method"] == "notifications/progress" {
                    progress.push(v["params"]["progress"].as_u64().unwrap());
                } else if v.get("id").is_some() {
                    break v;
                }
            }
            None => panic!("a connection ended without the hint"),
        }
    };
    assert_eq!(answer["id"], 9);
    assert_eq!(answer["result"]["content"][0]["text"], "done 6", "{answer}");
    assert_eq!(progress, [1, 2, 3, 4, 5, 6], "each once, in order");
    assert!(connections >= 2, "the limit never cut a connection");
    assert_eq!(mock.count("tools/call"), 1);

    let (old, _) = OldClient::connect(&url, "2025-06-18").await;
    let mut stream = progress_call(&old, 10, 6, 150).await;
    let events = stream.until_response().await;
    let end = events.last().unwrap().json();
    assert_eq!(end["id"], 10);
    assert!(
        end["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("max_stream_ms"),
        "{end}"
    );
    gw.stop().await;
}

/// A call that is still running after a second is answered as a stream from then on, even
/// when the server will answer JSON: its client gets the priming event (an id) at once, so a
/// connection lost while the server works — an idle timeout in between — loses nothing. A
/// quick call is still answered as JSON.
#[tokio::test]
async fn a_slow_call_is_answered_as_a_resumable_stream() {
    let mock = MockMcp::modern().start().await;
    let gw = Gateway::start(&config(&mock.url(), "")).await;
    let url = gw.url("/mcp/b");
    let (c, _) = OldClient::connect(&url, "2025-11-25").await;
    let r = c
        .call(
            json!(1),
            "tools/call",
            json!({"name":"echo","arguments":{"text":"hi"}}),
        )
        .await;
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.json()["id"], 1);

    let body = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{
        "name":"slow","arguments":{"ms":2500}}});
    let started = std::time::Instant::now();
    let resp = send_stream("POST", &c.url, &post_headers(&c), body.to_string()).await;
    assert!(
        started.elapsed() < Duration::from_millis(2000),
        "the head waited for the answer"
    );
    let mut stream = Events::new(resp);
    let priming = stream.next().await.expect("the priming event");
    assert!(priming.data.is_empty(), "{priming:?}");
    drop(stream);
    assert!(
        !mock.wait_cancelled(Duration::from_millis(300)).await,
        "a dropped connection cancelled the call"
    );
    let mut again = Events::new(resume_get(&c, priming.id.as_deref().unwrap()).await);
    let rest = again.until_response().await;
    let answer = rest.last().unwrap().json();
    assert_eq!(answer["id"], 2, "{rest:?}");
    assert!(answer["result"]["content"].is_array(), "{answer}");
    assert_eq!(rest.last().unwrap().seq(), 1);
    assert_eq!(
        mock.count("tools/call"),
        2,
        "each call reached the server once"
    );
    // Recorded when the call was done, with its own duration (2.5 s), not at the head (1 s).
    let series = |s: &str, name: &str| -> Option<u64> {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
    };
    let count = "portico_request_duration_seconds_count{endpoint=\"b\",method=\"tools/call\"}";
    until("the slow call to be recorded", || async {
        series(&scrape(&gw).await, count) == Some(2)
    })
    .await;
    let under =
        "portico_request_duration_seconds_bucket{endpoint=\"b\",method=\"tools/call\",le=\"2.5\"}";
    assert_eq!(
        series(&scrape(&gw).await, under),
        Some(1),
        "only the quick call took under 2.5 s"
    );
    gw.stop().await;
}
