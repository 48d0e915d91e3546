//! stdio backends (issue: one child process per backend, multiplexed). These tests drive
//! `StdioUpstream` directly against a real child, `fixtures/stdio_mock.py`, so they check the
//! pipe itself: id and token rewriting, cancellation, crashes and restarts, hostile output.
//! Every call carries a deadline and every test shuts its child down, so nothing hangs or lingers.

use bytes::Bytes;
use futures_util::StreamExt;
use portico::upstream::stdio::{CallOptions, StdioUpstream};
use portico::upstream::{MessageStream, Reply, UpstreamError};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

const MOCK: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/gateway/fixtures/stdio_mock.py"
);

/// A backend running the mock with `args`, built from TOML the way portico builds it.
fn backend(args: &[&str]) -> StdioUpstream {
    let mut cmd = vec!["python3".to_string(), MOCK.to_string()];
    cmd.extend(args.iter().map(|a| a.to_string()));
    backend_cmd(&cmd)
}

fn backend_cmd(cmd: &[String]) -> StdioUpstream {
    backend_cmd_with(cmd, "")
}

/// `backend_cmd` with extra backend keys (`timeout_ms = 300`).
fn backend_cmd_with(cmd: &[String], extra: &str) -> StdioUpstream {
    let toml = format!(
        "[[backends]]\nname = \"s\"\ncommand = {}\nmax_line_bytes = 65536\n{extra}\n",
        serde_json::to_string(cmd).unwrap()
    );
    let cfg = portico::config::validate(portico::config::parse(&toml).unwrap()).unwrap();
    let b = &cfg.backends[0];
    StdioUpstream::new(b, b.command.clone().unwrap())
}

fn within(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms)
}

fn msg(v: Value) -> Bytes {
    Bytes::from(serde_json::to_vec(&v).unwrap())
}

fn tool(id: Value, name: &str, args: Value) -> Bytes {
    msg(json!({"jsonrpc":"2.0","id":id,"method":"tools/call",
            "params":{"name":name,"arguments":args}}))
}

fn tool_with_token(id: Value, name: &str, args: Value, token: Value) -> Bytes {
    msg(json!({"jsonrpc":"2.0","id":id,"method":"tools/call",
        "params":{"name":name,"arguments":args,"_meta":{"progressToken":token}}}))
}

/// Every message of an answer, in order.
async fn collect(reply: Reply) -> Result<Vec<Value>, UpstreamError> {
    let parse = |b: &Bytes| serde_json::from_slice::<Value>(b).unwrap();
    match reply.messages {
        MessageStream::Empty => Ok(Vec::new()),
        MessageStream::One(b) => Ok(vec![parse(&b)]),
        MessageStream::Many(mut s) => {
            let mut out = Vec::new();
            while let Some(item) = s.next().await {
                out.push(parse(&item?));
            }
            Ok(out)
        }
    }
}

/// Calls a tool and returns the final response.
async fn call_tool(up: &StdioUpstream, name: &str, args: Value) -> Result<Value, UpstreamError> {
    let reply = up
        .call(tool(json!("t"), name, args), within(10_000))
        .await?;
    let mut msgs = collect(reply).await?;
    Ok(msgs.pop().expect("a response"))
}

/// What the mock saw in `notifications/cancelled`.
async fn cancelled(up: &StdioUpstream) -> Vec<Value> {
    let r = call_tool(up, "cancelled_ids", json!({})).await.unwrap();
    r["result"]["structuredContent"]["cancelled"]
        .as_array()
        .unwrap()
        .clone()
}

/// Starts the child with a real call; returns the pid the child reports.
async fn start(up: &StdioUpstream) -> u32 {
    let r = call_tool(up, "pid", json!({})).await.unwrap();
    let pid = r["result"]["structuredContent"]["pid"].as_u64().unwrap() as u32;
    assert_eq!(up.pid(), Some(pid));
    pid
}

fn process_alive(pid: u32) -> bool {
    std::process::Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_calls_with_one_client_id_get_their_own_answers() {
    let up = Arc::new(backend(&["--modern"]));
    let calls = (0..50).map(|i| {
        let up = up.clone();
        tokio::spawn(async move {
            let text = format!("t{i}");
            let body = tool(json!("same"), "echo", json!({ "text": text }));
            let reply = up.call(body, within(10_000)).await.unwrap();
            (text, collect(reply).await.unwrap())
        })
    });
    let mut seen = HashSet::new();
    for call in futures_util::future::join_all(calls).await {
        let (text, msgs) = call.unwrap();
        assert_eq!(msgs.len(), 1, "{msgs:?}");
        assert_eq!(msgs[0]["id"], "same", "the caller's id is restored");
        let sc = &msgs[0]["result"]["structuredContent"];
        assert_eq!(sc["text"], text.as_str(), "each caller gets its own answer");
        assert!(sc["seenId"].is_u64(), "the child saw a gateway id: {sc}");
        seen.insert(sc["seenId"].to_string());
    }
    assert_eq!(seen.len(), 50, "gateway ids are unique on the pipe");
    up.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn progress_reaches_only_its_caller_with_the_original_token() {
    let up = Arc::new(backend(&["--modern"]));
    let calls = [3u64, 4, 5].map(|steps| {
        let up = up.clone();
        tokio::spawn(async move {
            let args = json!({"steps": steps, "delay_ms": 30});
            let body = tool_with_token(json!(7), "progress", args, json!("tok"));
            let reply = up.call(body, within(10_000)).await.unwrap();
            assert_eq!(reply.status, 200);
            (steps, collect(reply).await.unwrap())
        })
    });
    for call in futures_util::future::join_all(calls).await {
        let (steps, msgs) = call.unwrap();
        let (last, notes) = msgs.split_last().unwrap();
        assert_eq!(notes.len() as u64, steps, "{msgs:?}");
        for (i, n) in notes.iter().enumerate() {
            assert_eq!(n["method"], "notifications/progress");
            assert_eq!(
                n["params"]["progressToken"], "tok",
                "original token restored"
            );
            assert_eq!(
                n["params"]["total"], steps,
                "another caller's progress leaked in"
            );
            assert_eq!(n["params"]["progress"], i as u64 + 1);
        }
        assert_eq!(last["id"], 7);
        let token = last["result"]["structuredContent"]["seenToken"]
            .as_str()
            .unwrap();
        assert!(
            token.starts_with("portico-"),
            "child saw a gateway token: {token}"
        );
    }
    up.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_exit_fails_in_flight_calls_at_once_and_a_later_call_restarts_it() {
    let up = Arc::new(backend(&["--modern"]));
    let pid = start(&up).await;
    let generation = up.generation();
    assert!(up.is_up());
    let slow = {
        let up = up.clone();
        tokio::spawn(async move {
            let reply = up
                .call(
                    tool(json!(1), "slow", json!({"ms": 20_000})),
                    within(30_000),
                )
                .await;
            (reply.map(|_| ()), Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let crashed_at = Instant::now();
    let crash = up
        .call(tool(json!(2), "crash", json!({})), within(5_000))
        .await;
    assert!(
        matches!(crash, Err(UpstreamError::Closed(_))),
        "{:?}",
        crash.err()
    );
    let (slow, failed_at) = tokio::time::timeout(Duration::from_secs(2), slow)
        .await
        .expect("the in-flight call does not hang")
        .unwrap();
    match slow {
        Err(UpstreamError::Closed(why)) => assert!(why.contains("exited"), "{why}"),
        other => panic!("expected Closed, got {other:?}"),
    }
    assert!(failed_at - crashed_at < Duration::from_secs(1));

    // Pinned to the dead child: refused rather than sent to an un-handshaken new one.
    let pinned = CallOptions {
        generation: Some(generation),
        ..CallOptions::default()
    };
    let r = up
        .call_with(
            tool(json!(3), "echo", json!({"text":"x"})),
            within(5_000),
            pinned,
        )
        .await;
    assert!(matches!(r, Err(UpstreamError::Restarted)), "{:?}", r.err());

    let again = call_tool(&up, "pid", json!({})).await.expect("restarted");
    let pid2 = again["result"]["structuredContent"]["pid"]
        .as_u64()
        .unwrap() as u32;
    assert_ne!(pid, pid2, "a new child");
    assert!(up.generation() > generation);
    assert!(up.restarts() >= 1);
    up.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_child_fails_in_flight_calls_within_a_second() {
    let up = Arc::new(backend(&["--modern"]));
    let pid = start(&up).await;
    let generation = up.generation();
    let slow = {
        let up = up.clone();
        tokio::spawn(async move {
            up.call(
                tool(json!(1), "slow", json!({"ms": 20_000})),
                within(30_000),
            )
            .await
            .map(|_| ())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let status = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let r = tokio::time::timeout(Duration::from_secs(1), slow)
        .await
        .expect("error within 1 s")
        .unwrap();
    assert!(matches!(r, Err(UpstreamError::Closed(_))), "{r:?}");
    let echo = call_tool(&up, "echo", json!({"text":"back"}))
        .await
        .unwrap();
    assert_eq!(echo["result"]["content"][0]["text"], "back");
    assert_eq!(up.generation(), generation + 1);
    up.shutdown().await;
}

#[tokio::test]
async fn dropped_answers_are_cancelled_upstream_with_the_rewritten_id() {
    let up = backend(&["--modern"]);
    // A stream dropped after its first progress message.
    let body = tool_with_token(
        json!("a"),
        "progress",
        json!({"steps": 100, "delay_ms": 50}),
        json!(1),
    );
    let reply = up.call(body, within(10_000)).await.unwrap();
    let MessageStream::Many(mut stream) = reply.messages else {
        panic!("progress comes first, so a stream")
    };
    assert!(stream.next().await.unwrap().is_ok());
    drop(stream);
    // A call dropped before anything arrived (the client went away).
    let slow = up.call(
        tool(json!("b"), "slow", json!({"ms": 10_000})),
        within(10_000),
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(300), slow)
            .await
            .is_err()
    );
    // Never cancelled: `request` (what initialize uses).
    let slow = up.request(
        tool(json!("c"), "slow", json!({"ms": 1_000})),
        within(10_000),
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(200), slow)
            .await
            .is_err()
    );

    let seen = cancelled(&up).await;
    assert_eq!(seen.len(), 2, "{seen:?}");
    for c in &seen {
        assert!(c["id"].is_u64(), "the gateway id, not the client's: {c}");
        assert_eq!(c["reason"], "the client went away");
    }
    up.shutdown().await;
}

#[tokio::test]
async fn deadline_gives_timeout_and_cancels_the_request() {
    let up = backend(&["--modern"]);
    start(&up).await;
    let started = Instant::now();
    let r = up
        .call(tool(json!("d"), "slow", json!({"ms": 10_000})), within(300))
        .await;
    assert!(matches!(r, Err(UpstreamError::Timeout)), "{:?}", r.err());
    assert!(started.elapsed() < Duration::from_secs(1));
    let seen = cancelled(&up).await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen.iter().all(|c| c["reason"] == "the deadline passed"));
    up.shutdown().await;
}

/// Mid-stream, the deadline is an idle limit of `timeout_ms` from the last message: progress
/// keeps a call alive past its first deadline; silence after a message ends the stream with
/// Timeout, and the request is cancelled.
#[tokio::test]
async fn mid_stream_the_deadline_moves_with_each_message() {
    let cmd = ["python3", MOCK, "--modern"].map(String::from);
    let up = backend_cmd_with(&cmd, "timeout_ms = 300");
    start(&up).await;
    let started = Instant::now();
    let body = tool_with_token(
        json!("p"),
        "progress",
        json!({"steps": 8, "delay_ms": 100}),
        json!("t"),
    );
    let reply = up.call(body, within(300)).await.unwrap();
    let msgs = collect(reply).await.expect("progress kept the call alive");
    assert_eq!(
        msgs.last().unwrap()["result"]["content"][0]["text"],
        "done 8"
    );
    assert!(started.elapsed() >= Duration::from_millis(800));
    // One progress, then 2 s of silence: cut 300 ms after the message.
    let started = Instant::now();
    let body = tool_with_token(
        json!("e"),
        "progress",
        json!({"steps": 2, "delay_ms": 2000}),
        json!("t"),
    );
    let reply = up.call(body, within(300)).await.unwrap();
    assert!(matches!(collect(reply).await, Err(UpstreamError::Timeout)));
    assert!(started.elapsed() < Duration::from_millis(1500));
    let seen = cancelled(&up).await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0]["reason"], "the deadline passed");
    up.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_oversized_lines_are_skipped() {
    let up = Arc::new(backend(&["--modern", "--garbage"]));
    let calls = (0..5).map(|i| {
        let up = up.clone();
        tokio::spawn(async move {
            let r = call_tool(&up, "echo", json!({ "text": format!("g{i}") })).await;
            (i, r.unwrap())
        })
    });
    for call in futures_util::future::join_all(calls).await {
        let (i, r) = call.unwrap();
        assert_eq!(r["result"]["content"][0]["text"], format!("g{i}"), "{r}");
    }
    assert!(up.is_up(), "bad output is never fatal");
    assert_eq!(up.restarts(), 0);
    up.shutdown().await;
}

#[tokio::test]
async fn legacy_server_requests_are_answered_and_errors_map_to_statuses() {
    let up = backend(&["--legacy"]);
    let init = msg(
        json!({"jsonrpc":"2.0","id":"i","method":"initialize","params":{
        "protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}),
    );
    let reply = up.request(init, within(10_000)).await.unwrap();
    let init = collect(reply).await.unwrap();
    assert_eq!(init[0]["result"]["protocolVersion"], "2025-11-25");
    up.notify(
        msg(json!({"jsonrpc":"2.0","method":"notifications/initialized"})),
        within(2_000),
    )
    .await
    .unwrap();

    let ping = call_tool(&up, "ping_me", json!({})).await.unwrap();
    let answer = &ping["result"]["structuredContent"]["answer"];
    assert_eq!(
        *answer,
        json!({"jsonrpc":"2.0","id":"srv-1","result":{}}),
        "{ping}"
    );

    // A request a client can be asked joins the stream of the call it came during, with the
    // server's own id; the answer written back with `respond` reaches the server.
    let reply = up
        .call(tool(json!("t"), "ask", json!({})), within(10_000))
        .await
        .unwrap();
    let MessageStream::Many(mut msgs) = reply.messages else {
        panic!("the request starts a stream")
    };
    let next = async |m: &mut futures_util::stream::BoxStream<
        'static,
        Result<Bytes, UpstreamError>,
    >|
           -> Value {
        let b: Bytes = tokio::time::timeout(Duration::from_secs(10), m.next())
            .await
            .expect("in time")
            .expect("a message")
            .expect("no error");
        serde_json::from_slice(&b).unwrap()
    };
    let asked = next(&mut msgs).await;
    assert_eq!(asked["method"], "elicitation/create", "{asked}");
    assert_eq!(asked["id"], "srv-2", "{asked}");
    let answer = json!({"jsonrpc":"2.0","id":"srv-2","result":{"action":"decline"}});
    up.respond(msg(answer.clone()), within(2_000))
        .await
        .unwrap();
    let done = next(&mut msgs).await;
    assert_eq!(done["id"], "t", "{done}");
    assert_eq!(
        done["result"]["structuredContent"]["answer"], answer,
        "{done}"
    );

    // During portico's own requests (never cancellable: no client behind them) nobody can be
    // asked: refused at once, so the server never waits.
    let reply = up
        .request(tool(json!("o"), "ask", json!({})), within(10_000))
        .await
        .unwrap();
    let ask = collect(reply).await.unwrap().pop().unwrap();
    let answer = &ask["result"]["structuredContent"]["answer"];
    assert_eq!(answer["id"], "srv-3");
    assert_eq!(answer["error"]["code"], -32601, "{ask}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cannot relay it to a client")
    );

    // -32601 mirrors to 404, as a modern HTTP server would answer.
    let discover = msg(json!({"jsonrpc":"2.0","id":5,"method":"server/discover","params":{}}));
    let reply = up.call(discover, within(5_000)).await.unwrap();
    assert_eq!(reply.status, 404);
    let msgs = collect(reply).await.unwrap();
    assert_eq!(msgs[0]["id"], 5);
    assert_eq!(msgs[0]["error"]["code"], -32601);
    up.shutdown().await;
}

#[tokio::test]
async fn notifications_are_accepted_and_server_notifications_broadcast() {
    let up = backend(&["--modern"]);
    let mut notes = up.subscribe();
    let reply = up
        .call(
            msg(json!({"jsonrpc":"2.0","method":"notifications/x"})),
            within(1_000),
        )
        .await
        .unwrap();
    assert_eq!(reply.status, 202);
    assert!(matches!(reply.messages, MessageStream::Empty));
    call_tool(&up, "list_changed", json!({})).await.unwrap();
    let note = tokio::time::timeout(Duration::from_secs(2), notes.recv())
        .await
        .unwrap()
        .unwrap();
    let note: Value = serde_json::from_slice(&note).unwrap();
    assert_eq!(note["method"], "notifications/tools/list_changed");
    up.shutdown().await;
}

#[tokio::test]
async fn starts_lazily_and_leaves_no_process_behind() {
    let up = backend(&["--modern"]);
    assert!(!up.is_up() && up.pid().is_none(), "new() spawns nothing");
    assert_eq!(up.generation(), 1, "the first child will be generation 1");
    let pid = start(&up).await;
    assert_eq!(up.generation(), 1);
    assert!(process_alive(pid));
    up.shutdown().await;
    assert!(!up.is_up());
    assert!(
        !process_alive(pid),
        "shutdown waits for the child to be gone"
    );
    let r = up
        .call(tool(json!(1), "echo", json!({})), within(1_000))
        .await;
    assert!(matches!(r, Err(UpstreamError::Closed(_))));

    // Dropping the backend (a config reload) also stops its child.
    let up = backend(&["--modern"]);
    let pid = start(&up).await;
    drop(up);
    let gone = async {
        while process_alive(pid) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(3), gone)
        .await
        .expect("child stopped after drop");
}

#[tokio::test]
async fn a_command_that_cannot_start_is_a_connect_error() {
    let up = backend_cmd(&["/nonexistent/portico-no-such-server".to_string()]);
    let started = Instant::now();
    let r = up
        .call(tool(json!(1), "echo", json!({})), within(5_000))
        .await;
    assert!(matches!(r, Err(UpstreamError::Connect(_))), "{:?}", r.err());
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "refused at once, not after a backoff"
    );
    assert!(!up.is_up());
    up.shutdown().await;
}

/// Log lines captured from the current thread (the test runtime is single-threaded, so the
/// actor and its stderr task log here too).
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn stderr_is_logged_with_a_rate_limit() {
    let logs = Capture::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let up = backend(&["--modern", "--stderr-spam"]);
    let r = call_tool(&up, "echo", json!({"text":"quiet"}))
        .await
        .unwrap();
    assert_eq!(r["result"]["content"][0]["text"], "quiet");
    // The suppressed count is reported when the one-second window closes.
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    up.shutdown().await;

    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let shown = text
        .lines()
        .filter(|l| l.contains("stdio server stderr") && l.contains("spam line"))
        .count();
    assert!(shown > 0 && shown <= 40, "{shown} stderr lines logged");
    assert!(
        text.lines()
            .any(|l| l.contains("suppressed") && l.contains("backend=s")),
        "{text}"
    );
}

// === Through the gateway: the legacy bridge over stdio ===

mod bridged {
    use super::MOCK;
    use crate::common::{Gateway, Resp, mcp};
    use serde_json::{Value, json};
    use std::time::Duration;

    /// A gateway with one stdio backend running the mock with `args`.
    async fn gateway(args: &[&str], extra: &str) -> Gateway {
        let mut cmd = vec!["python3".to_string(), MOCK.to_string()];
        cmd.extend(args.iter().map(|a| a.to_string()));
        Gateway::start(&format!(
            "[log]\naccess = false\n[[backends]]\nname = \"s\"\ncommand = {}\n{extra}",
            serde_json::to_string(&cmd).unwrap()
        ))
        .await
    }

    async fn call(url: &str, id: Value, name: &str, args: Value) -> Resp {
        mcp(
            url,
            id,
            "tools/call",
            json!({"name": name, "arguments": args}),
        )
        .await
    }

    #[tokio::test]
    async fn a_silent_stdio_server_is_probed_as_legacy_and_bridged() {
        let gw = gateway(
            &["--legacy", "--silent-discover"],
            "probe_timeout_ms = 300\n",
        )
        .await;
        let url = gw.url("/mcp/s");
        let r = call(&url, json!(1), "echo", json!({"text": "hi"})).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        let res = &r.json()["result"];
        assert_eq!(res["content"][0]["text"], "hi");
        assert_eq!(res["resultType"], "complete", "translated to 2026-07-28");
        assert!(
            res["structuredContent"]["seenId"].is_u64(),
            "the server saw a gateway id, not the client's: {res}"
        );
        let d = mcp(&url, json!(2), "server/discover", json!({}))
            .await
            .json();
        let d = &d["result"];
        assert_eq!(
            d["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
            "stdio-mock"
        );
        assert_eq!(
            d["cacheScope"], "private",
            "the safe default for a legacy server"
        );
        let l = mcp(&url, json!(3), "tools/list", json!({})).await.json();
        assert_eq!(l["result"]["ttlMs"], 0);
        assert_eq!(l["result"]["cacheScope"], "private");
        // The probe was never cancelled: a server that has not been initialized hears nothing
        // but `initialize` after it.
        let c = call(&url, json!(4), "cancelled_ids", json!({}))
            .await
            .json();
        assert_eq!(c["result"]["structuredContent"]["cancelled"], json!([]));
        gw.stop().await;
    }

    /// A 2026-07-28 server that starts more slowly than `probe_timeout_ms` is probed as
    /// legacy; the bridge's `initialize` is then refused the way only a modern server refuses
    /// it, so portico re-probes and serves that very first request on the modern path.
    #[tokio::test]
    async fn a_slow_starting_modern_stdio_server_serves_the_first_request() {
        for first in ["tools/call", "server/discover"] {
            let gw = gateway(
                &["--modern", "--slow-start", "700"],
                "probe_timeout_ms = 150
",
            )
            .await;
            let url = gw.url("/mcp/s");
            let r = if first == "tools/call" {
                call(&url, json!(1), "echo", json!({"text": "hi"})).await
            } else {
                mcp(&url, json!(1), "server/discover", json!({})).await
            };
            assert_eq!(
                r.status,
                200,
                "{first}: {:?}",
                String::from_utf8_lossy(&r.body)
            );
            let res = &r.json()["result"];
            if first == "tools/call" {
                assert_eq!(res["content"][0]["text"], "hi");
            } else {
                // The server's 60 s, less any time it spent in the cache (hits carry the
                // remaining freshness); the bridge's default would be 0.
                let ttl = res["ttlMs"].as_u64().unwrap_or(0);
                assert!(
                    (55_000..=60_000).contains(&ttl),
                    "the server's own discover result, not the bridge's: {res}"
                );
            }
            // The modern path: the server's own cache hints, not the bridge's defaults.
            let l = mcp(&url, json!(2), "tools/list", json!({})).await.json();
            // 60 s less any time the list spent in the cache (a hit carries what remains).
            let ttl = l["result"]["ttlMs"].as_u64().unwrap_or(0);
            assert!((55_000..=60_000).contains(&ttl), "{l}");
            assert_eq!(l["result"]["cacheScope"], "public", "{l}");
            gw.stop().await;
        }
    }

    #[tokio::test]
    async fn server_requests_of_a_legacy_stdio_server_are_answered() {
        let gw = gateway(&["--legacy"], "").await;
        let url = gw.url("/mcp/s");
        let r = call(&url, json!(1), "ping_me", json!({})).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        let answer = &r.json()["result"]["structuredContent"]["answer"];
        assert_eq!(answer["result"], json!({}), "ping answered: {answer}");
        let r = call(&url, json!(2), "ask", json!({})).await;
        let answer = &r.json()["result"]["structuredContent"]["answer"];
        assert_eq!(
            answer["error"]["code"], -32601,
            "elicitation refused: {answer}"
        );
        gw.stop().await;
    }

    /// A request that got the session while the old child was still (apparently) up, but is
    /// written only after the restart, must not reach the fresh, un-initialized child: it is
    /// refused as `Restarted`, the bridge re-initializes and retries it once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_legacy_stdio_session_follows_the_child_across_restarts() {
        let gw = gateway(&["--legacy"], "").await;
        let url = gw.url("/mcp/s");
        let r = call(&url, json!(1), "pid", json!({})).await;
        let pid = r.json()["result"]["structuredContent"]["pid"].clone();
        assert!(pid.is_u64(), "{:?}", r.body);
        // The child closes stdout and takes 1.5 s to exit; requests sent meanwhile are queued
        // for the child generation that is about to die. The margins are wide because on a busy
        // machine the Python child can take a few hundred ms to reach `slow_exit`.
        let dying = {
            let url = url.clone();
            tokio::spawn(
                async move { call(&url, json!(2), "slow_exit", json!({"ms": 1500})).await },
            )
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        let r = call(&url, json!(3), "echo", json!({"text": "after"})).await;
        assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
        let res = &r.json()["result"];
        assert_eq!(res["content"][0]["text"], "after");
        let r = call(&url, json!(4), "pid", json!({})).await;
        assert_ne!(
            r.json()["result"]["structuredContent"]["pid"],
            pid,
            "a new child"
        );
        let dying = dying.await.unwrap();
        assert_eq!(dying.status, 502, "{:?}", dying.body);
        gw.stop().await;
    }
}

/// A child that never reads its stdin: what portico has not written to it is bounded
/// (`upstream::MAX_UNWRITTEN_BYTES`, 16 MiB). Past it a request is refused at once
/// (`Overloaded`, a 503) instead of being queued behind the others for good; those queued
/// time out as ever. Before, every request's line stayed queued while the child lived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_stops_reading_stdin_gets_no_more_than_the_bound_queued() {
    let up = Arc::new(backend_cmd_with(
        &["sleep".to_string(), "30".to_string()],
        "timeout_ms = 500\nmax_call_ms = 500\n",
    ));
    let filler = "x".repeat(1024 * 1024);
    let bodies: Vec<_> = (0..24)
        .map(|i| tool(json!(i), "echo", json!({ "text": filler })))
        .collect();
    let started = Instant::now();
    let calls = bodies.into_iter().map(|body| {
        let up = up.clone();
        async move { up.call(body, within(500)).await.err() }
    });
    let errors = futures_util::future::join_all(calls).await;
    let overloaded = errors
        .iter()
        .filter(|e| matches!(e, Some(UpstreamError::Overloaded)))
        .count();
    let timed_out = errors
        .iter()
        .filter(|e| matches!(e, Some(UpstreamError::Timeout)))
        .count();
    assert_eq!(overloaded + timed_out, 24, "{errors:?}");
    // Fifteen lines of just over 1 MiB fit in 16 MiB (one of them half written into the pipe
    // still counts); the other nine are refused.
    assert_eq!(overloaded, 9, "{errors:?}");
    // Each within its 500 ms deadline, none queued until the child goes (30 s); the margin is
    // for a busy machine.
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "{took:?}");
    // Still not reading: a new request that does not fit is refused without waiting.
    let late = tool(json!("late"), "echo", json!({ "text": filler }));
    let t = Instant::now();
    let r = up.call(late, within(2_000)).await;
    assert!(matches!(r, Err(UpstreamError::Overloaded)), "{:?}", r.err());
    // Well before its 2 s deadline.
    assert!(
        t.elapsed() < Duration::from_millis(1_500),
        "{:?}",
        t.elapsed()
    );
    // Nor is a client's notification, or its answer to a server's request, accepted and then
    // dropped: each is refused like a request.
    let note = json!({"jsonrpc": "2.0", "method": "notifications/progress",
        "params": {"progressToken": 1, "progress": 1, "message": filler}});
    let r = up.call(Bytes::from(note.to_string()), within(2_000)).await;
    assert!(matches!(r, Err(UpstreamError::Overloaded)), "{:?}", r.err());
    let answer = json!({"jsonrpc": "2.0", "id": 7, "result": {"filler": filler}});
    let r = up
        .respond(Bytes::from(answer.to_string()), within(2_000))
        .await;
    assert!(matches!(r, Err(UpstreamError::Overloaded)), "{r:?}");
    // A small one still fits beside what is queued.
    let small = json!({"jsonrpc": "2.0", "id": 8, "result": {}});
    let r = up
        .respond(Bytes::from(small.to_string()), within(2_000))
        .await;
    assert!(r.is_ok(), "{r:?}");
    tokio::time::timeout(Duration::from_secs(5), up.shutdown())
        .await
        .expect("the child is stopped even with its stdin full");
}

/// A child's log line names no request: it goes to the one in flight whose `_meta` asked for
/// logs, never to one whose arguments merely contain the key's name (on a child shared by
/// clients, that would claim another client's lines).
#[tokio::test]
async fn a_log_line_goes_only_to_a_request_whose_meta_asked_for_it() {
    let up = backend(&[]);
    let claim = tool(
        json!("bob"),
        "slow",
        json!({"ms": 1500, "tag": "io.modelcontextprotocol/logLevel"}),
    );
    let alice = tool(json!("alice"), "log", json!({"text": "alice-secret"}));
    // Polled in order, so bob's call is in flight before alice's is written.
    let (bob, alice) = tokio::join!(
        async { collect(up.call(claim, within(5_000)).await?).await },
        async { collect(up.call(alice, within(5_000)).await?).await },
    );
    let (bob, alice) = (bob.unwrap(), alice.unwrap());
    assert_eq!(bob.last().unwrap()["result"]["content"][0]["text"], "slept");
    assert!(
        !bob.iter().any(|m| m.to_string().contains("alice-secret")),
        "{bob:?}"
    );
    assert_eq!(alice.len(), 1, "alice did not ask for logs: {alice:?}");
    let asks = msg(json!({"jsonrpc":"2.0","id":"carol","method":"tools/call",
        "params":{"name":"log","arguments":{"text":"carol-line"},
            "_meta":{"io.modelcontextprotocol/logLevel":"info"}}}));
    let carol = collect(up.call(asks, within(5_000)).await.unwrap())
        .await
        .unwrap();
    assert!(
        carol
            .iter()
            .any(|m| m["method"] == "notifications/message" && m["params"]["data"] == "carol-line"),
        "{carol:?}"
    );
    up.shutdown().await;
}
