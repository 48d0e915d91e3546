//! Bounded upstream answers (README "Security model", Limits): answers portico holds are capped
//! by `max_answer_bytes`, relayed answers are streamed without being held, and `timeout_ms`
//! cuts a body the backend keeps sending at full speed.
//!
//! A binary of its own, because it measures the resident memory of the process: portico runs
//! in-process, and the tests of the `gateway` binary would share (and disturb) the figure. The
//! tests here take one lock, so one runs at a time. The backend is a raw socket on 127.0.0.1
//! that streams forever from one static buffer until the gateway drops the connection or the
//! test stops it; a watchdog stops it early when the process passes `WATCHDOG_KB`, so a
//! gateway that holds what it reads fails the test instead of exhausting the machine. Nothing
//! in the tests holds a body: message-path answers are small errors, relayed bodies are counted
//! and dropped frame by frame.

#[path = "gateway/common/mod.rs"]
mod common;

use common::*;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// What the tests promise about portico's memory.
const LIMIT_KB: u64 = 100 * 1024;
/// Where the watchdog stops the backend: past the limit, well short of hurting the machine.
const WATCHDOG_KB: u64 = 400 * 1024;
/// The longest any backend here streams, whatever the gateway does.
const BACKEND_BOUND: Duration = Duration::from_secs(20);

/// By when a relay with `timeout_ms = 1500` must have been cut (from the request's start).
const CUT_BY: Duration = Duration::from_millis(2500);

/// One test at a time: they measure the same process.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `key` of `/proc/self/status`, in kB.
fn status_kb(key: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{key} in /proc/self/status"))
}

/// Samples the process's resident memory until dropped (and resets the kernel's peak, so
/// `VmHWM` covers this test alone where the kernel allows it); stops `backend` when the
/// memory passes the watchdog.
struct Rss {
    before_kb: u64,
    peak_kb: Arc<AtomicUsize>,
    done: Arc<AtomicBool>,
    hwm_reset: bool,
    sampler: Option<std::thread::JoinHandle<()>>,
}

impl Rss {
    fn watch(backend: &Backend) -> Rss {
        let hwm_reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
        let before_kb = status_kb("VmRSS");
        let peak_kb = Arc::new(AtomicUsize::new(before_kb as usize));
        let done = Arc::new(AtomicBool::new(false));
        let (peak, stop, quit) = (peak_kb.clone(), backend.stop.clone(), done.clone());
        let sampler = std::thread::spawn(move || {
            while !quit.load(Ordering::SeqCst) {
                let now = status_kb("VmRSS");
                peak.fetch_max(now as usize, Ordering::SeqCst);
                if now > WATCHDOG_KB {
                    stop.store(true, Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        Rss {
            before_kb,
            peak_kb,
            done,
            hwm_reset,
            sampler: Some(sampler),
        }
    }

    /// Stops sampling; asserts the peak stayed under [`LIMIT_KB`] and prints the figures.
    fn check(mut self, what: &str) {
        self.done.store(true, Ordering::SeqCst);
        if let Some(s) = self.sampler.take() {
            s.join().expect("sampler");
        }
        let sampled = self.peak_kb.load(Ordering::SeqCst) as u64;
        let peak = if self.hwm_reset {
            sampled.max(status_kb("VmHWM"))
        } else {
            sampled
        };
        let after = status_kb("VmRSS");
        eprintln!(
            "rss {what}: before {} KiB, peak {} KiB, after {} KiB (VmHWM reset: {})",
            self.before_kb, peak, after, self.hwm_reset
        );
        assert!(
            peak < LIMIT_KB,
            "{what}: the process reached {peak} KiB (before: {} KiB)",
            self.before_kb
        );
    }
}

impl Drop for Rss {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
    }
}

/// What the backend answers.
#[derive(Clone, Copy, PartialEq)]
enum Endless {
    /// `content-length: 1073741824` (1 GiB) and JSON-ish bytes until stopped.
    GibLength,
    /// A chunked JSON answer that never ends (a `tools/list` is answered at once).
    Chunked,
    /// A chunked SSE answer: progress notifications, one after another, and never a response
    /// (a `tools/list` is answered at once).
    Notifications,
    /// An initialize-era server: `initialize` and `notifications/initialized` answered, then
    /// an endless chunked answer to anything else.
    Legacy,
}

/// Counts of what the backend saw.
#[derive(Default)]
struct Seen {
    accepted: AtomicUsize,
    /// Connections on which a write failed: the gateway closed them while answers streamed.
    dropped_by_peer: AtomicUsize,
}

struct Backend {
    url: String,
    stop: Arc<AtomicBool>,
    seen: Arc<Seen>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Starts the backend on its own threads (blocking sockets), so it streams whatever the
/// gateway's runtime is doing.
fn backend(mode: Endless) -> Backend {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Seen::default());
    let (stop2, seen2) = (stop.clone(), seen.clone());
    std::thread::spawn(move || {
        let started = Instant::now();
        while !stop2.load(Ordering::SeqCst) && started.elapsed() < BACKEND_BOUND {
            match listener.accept() {
                Ok((tcp, _)) => {
                    seen2.accepted.fetch_add(1, Ordering::SeqCst);
                    let (stop, seen) = (stop2.clone(), seen2.clone());
                    std::thread::spawn(move || serve(tcp, mode, &stop, &seen, started));
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(_) => return,
            }
        }
    });
    Backend { url, stop, seen }
}

fn stopped(stop: &AtomicBool, started: Instant) -> bool {
    stop.load(Ordering::SeqCst) || started.elapsed() >= BACKEND_BOUND
}

/// Reads one request (head + Content-Length body) as JSON; `None` when the connection ends
/// or the backend stops.
fn read_request(
    tcp: &mut TcpStream,
    buf: &mut Vec<u8>,
    stop: &AtomicBool,
    started: Instant,
) -> Option<Value> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap_or(0));
            if buf.len() >= end + 4 + len {
                let body: Vec<u8> = buf.drain(..end + 4 + len).skip(end + 4).collect();
                return Some(serde_json::from_slice(&body).unwrap_or(Value::Null));
            }
        }
        let mut chunk = [0u8; 4096];
        match tcp.read(&mut chunk) {
            Ok(0) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if stopped(stop, started) {
                    return None;
                }
            }
            Err(_) => return None,
        }
    }
}

/// ~64 KiB of the endless part of an answer, already framed.
fn piece(mode: Endless) -> Vec<u8> {
    let unit: &[u8] = match mode {
        Endless::Notifications => {
            b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":1,\"progress\":1}}\n\n"
        }
        _ => b"{\"name\":\"aaaaaaaaaaaaaaaa\",\"inputSchema\":{\"type\":\"object\"}},",
    };
    let mut data = Vec::with_capacity(64 * 1024 + unit.len());
    while data.len() < 64 * 1024 {
        data.extend_from_slice(unit);
    }
    if mode == Endless::GibLength {
        return data;
    }
    let mut framed = format!("{:x}\r\n", data.len()).into_bytes();
    framed.extend_from_slice(&data);
    framed.extend_from_slice(b"\r\n");
    framed
}

fn serve(mut tcp: TcpStream, mode: Endless, stop: &AtomicBool, seen: &Seen, started: Instant) {
    let _ = tcp.set_read_timeout(Some(Duration::from_millis(50)));
    let _ = tcp.set_write_timeout(Some(Duration::from_millis(200)));
    let mut buf = Vec::new();
    while let Some(req) = read_request(&mut tcp, &mut buf, stop, started) {
        let method = req["method"].as_str().unwrap_or("");
        if mode == Endless::Legacy && method == "initialize" {
            let body = json!({"jsonrpc": "2.0", "id": req["id"], "result": {
                "protocolVersion": req["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "endless", "version": "1"}}})
            .to_string();
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nmcp-session-id: s1\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            if tcp.write_all(format!("{head}{body}").as_bytes()).is_err() {
                return;
            }
            continue;
        }
        // The list portico looks a tool up in, to build the `Mcp-Param-*` headers of a call
        // it writes (an endpoint's member): answered at once, so the call is what is endless.
        if matches!(mode, Endless::Chunked | Endless::Notifications) && method == "tools/list" {
            let body = json!({"jsonrpc": "2.0", "id": req["id"], "result": {
                "tools": [{"name": "t", "inputSchema": {"type": "object"}}],
                "resultType": "complete", "ttlMs": 60000, "cacheScope": "public"}})
            .to_string();
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            if tcp.write_all(format!("{head}{body}").as_bytes()).is_err() {
                return;
            }
            continue;
        }
        if req["id"].is_null() {
            if tcp
                .write_all(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")
                .is_err()
            {
                return;
            }
            continue;
        }
        let head: &[u8] = match mode {
            Endless::GibLength => {
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1073741824\r\n\r\n"
            }
            Endless::Notifications => {
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            }
            Endless::Chunked | Endless::Legacy => {
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
            }
        };
        let opening = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{},\"result\":{{\"tools\":[",
            req["id"]
        );
        let mut first = head.to_vec();
        if mode != Endless::Notifications {
            if mode != Endless::GibLength {
                first.extend_from_slice(format!("{:x}\r\n", opening.len()).as_bytes());
            }
            first.extend_from_slice(opening.as_bytes());
            if mode != Endless::GibLength {
                first.extend_from_slice(b"\r\n");
            }
        }
        if tcp.write_all(&first).is_err() {
            seen.dropped_by_peer.fetch_add(1, Ordering::SeqCst);
            return;
        }
        let piece = piece(mode);
        loop {
            if stopped(stop, started) {
                return;
            }
            match tcp.write_all(&piece) {
                Ok(()) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => {
                    seen.dropped_by_peer.fetch_add(1, Ordering::SeqCst);
                    return;
                }
            }
        }
    }
}

fn config(url: &str) -> String {
    format!(
        r#"
[log]
access = false

# The message path: a tools/call through the endpoint /held (portico writes the member's
# body and reads its answer), a tools/list through the cache. A long timeout, so the bound is
# what ends these answers, not the deadline.
[[backends]]
name = "held"
url = "{url}"
protocol = "modern"
timeout_ms = 60000

# The same, bridged to an initialize-era server.
[[backends]]
name = "old"
url = "{url}"
protocol = "legacy"
timeout_ms = 60000

# Pass-through, and the message path with a short deadline: the deadline ends these.
[[backends]]
name = "relayed"
url = "{url}"
protocol = "modern"
timeout_ms = 1500

# On an SSE answer timeout_ms is an idle limit that each notification restarts: max_call_ms
# is what ends an endless stream of them.
[[backends]]
name = "streamed"
url = "{url}"
protocol = "modern"
timeout_ms = 1500
max_call_ms = 1500

[[endpoints]]
path = "/held"
backends = ["held"]

[[endpoints]]
path = "/streamed"
backends = ["streamed"]
"#
    )
}

/// Waits (bounded) until `cond` holds.
async fn eventually(what: &str, cond: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < until, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A 502 whose JSON-RPC error names `backend` and says why.
fn assert_502(r: &Resp, backend: &str, why: &str) {
    assert_eq!(r.status, 502, "{}", String::from_utf8_lossy(&r.body));
    let msg = r.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        msg.contains(&format!("backend {backend} ")) && msg.contains(why),
        "{msg}"
    );
    assert_eq!(r.code(), -32603);
}

/// A message-path answer held by portico: a 1 GiB answer (cacheable `tools/list`) and an
/// endless one (a `tools/call` through an aggregated endpoint) end in 502 naming the backend once they pass
/// `max_answer_bytes`; memory stays bounded; the connection is closed, not pooled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_answers_past_the_bound_are_502_and_memory_stays_bounded() {
    let _one = ONE_AT_A_TIME.lock().await;
    for (mode, method) in [
        (Endless::GibLength, "tools/list"),
        (Endless::Chunked, "tools/call"),
    ] {
        let backend = backend(mode);
        let gw = Gateway::start(&config(&backend.url)).await;
        let rss = Rss::watch(&backend);
        let (path, params) = if method == "tools/call" {
            ("/held", json!({"name": "held__t", "arguments": {}}))
        } else {
            ("/mcp/held", json!({}))
        };
        let r = mcp(&gw.url(path), json!(1), method, params.clone()).await;
        rss.check(&format!("{method}, {}", describe(mode)));
        assert_502(&r, "held", "max_answer_bytes");
        // The connection was dropped mid-answer (the backend's write failed), so the next
        // request needs a new one.
        eventually("the gateway closed the connection", || {
            backend.seen.dropped_by_peer.load(Ordering::SeqCst) >= 1
        })
        .await;
        let r = mcp(&gw.url(path), json!(2), method, params).await;
        assert_502(&r, "held", "max_answer_bytes");
        // ... and that one was dropped mid-answer too. (A `tools/call` to an endpoint's member
        // also asks for the member's tool list, which may have a connection of its own.)
        eventually("the gateway closed the second connection", || {
            backend.seen.dropped_by_peer.load(Ordering::SeqCst) >= 2
        })
        .await;
        gw.stop().await;
    }
}

fn describe(mode: Endless) -> &'static str {
    match mode {
        Endless::GibLength => "1 GiB content-length",
        Endless::Chunked => "endless chunked",
        Endless::Notifications => "endless SSE notifications",
        Endless::Legacy => "endless, bridged",
    }
}

/// A bridged answer (initialize-era backend) is held too, and bounded the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bridged_answers_past_the_bound_are_502() {
    let _one = ONE_AT_A_TIME.lock().await;
    let backend = backend(Endless::Legacy);
    let gw = Gateway::start(&config(&backend.url)).await;
    let rss = Rss::watch(&backend);
    let r = mcp(
        &gw.url("/mcp/old"),
        json!(1),
        "tools/call",
        json!({"name": "t", "arguments": {}}),
    )
    .await;
    rss.check(describe(Endless::Legacy));
    assert_502(&r, "old", "max_answer_bytes");
    gw.stop().await;
}

/// Pass-through holds nothing and is cut at `timeout_ms` even though the backend never makes
/// it wait: the client gets the head and streamed bytes, then the body breaks off (a relayed
/// JSON answer cannot carry an error once its head is out, README "Security model").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_relay_is_cut_at_the_deadline_and_holds_nothing() {
    let _one = ONE_AT_A_TIME.lock().await;
    let backend = backend(Endless::Chunked);
    let gw = Gateway::start(&config(&backend.url)).await;
    let rss = Rss::watch(&backend);
    let started = Instant::now();
    let body = modern_body(
        json!(1),
        "tools/call",
        json!({"name": "t", "arguments": {}}),
    );
    let resp = send_stream(
        "POST",
        &gw.url("/mcp/relayed"),
        &modern_headers("tools/call", Some("t")),
        body,
    )
    .await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut relayed = 0u64;
    let ended = loop {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the relay was not cut ({relayed} bytes relayed in {:?})",
            started.elapsed()
        );
        match body.frame().await {
            Some(Ok(f)) => relayed += f.data_ref().map_or(0, |d| d.len() as u64),
            Some(Err(_)) => break "an error",
            None => break "a clean end",
        }
    };
    let took = started.elapsed();
    drop(body);
    eprintln!("relayed {relayed} bytes, then {ended} after {took:?}");
    assert_eq!(ended, "an error", "a cut relay must not look complete");
    assert!(relayed > 0);
    assert!(
        took >= Duration::from_millis(1400) && took < CUT_BY,
        "cut after {took:?}, timeout_ms = 1500"
    );
    rss.check("pass-through, endless chunked");
    gw.stop().await;
}

/// The message path streams notifications to the client as they come (held one at a time)
/// and is cut at `max_call_ms` (each notification restarts the `timeout_ms` idle clock): an
/// SSE answer that never sends its response ends with a JSON-RPC error event naming the
/// backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_notifications_are_cut_at_the_deadline() {
    let _one = ONE_AT_A_TIME.lock().await;
    let backend = backend(Endless::Notifications);
    let gw = Gateway::start(&config(&backend.url)).await;
    let rss = Rss::watch(&backend);
    let started = Instant::now();
    let body = modern_body(
        json!(7),
        "tools/call",
        json!({"name": "streamed__t", "arguments": {}}),
    );
    let resp = send_stream(
        "POST",
        &gw.url("/streamed"),
        &modern_headers("tools/call", Some("streamed__t")),
        body,
    )
    .await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    // Keeps only the tail of the stream: the last event is what matters.
    let mut tail: Vec<u8> = Vec::new();
    let mut relayed = 0u64;
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the stream was not cut ({relayed} bytes in {:?})",
            started.elapsed()
        );
        match body.frame().await {
            Some(Ok(f)) => {
                if let Some(d) = f.data_ref() {
                    relayed += d.len() as u64;
                    tail.extend_from_slice(d);
                    if tail.len() > 64 * 1024 {
                        tail.drain(..tail.len() - 4096);
                    }
                }
            }
            Some(Err(e)) => panic!("the stream broke instead of ending with an error: {e}"),
            None => break,
        }
    }
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&tail);
    let last = text
        .trim_end()
        .rsplit("\n\n")
        .next()
        .and_then(|ev| ev.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|d| serde_json::from_str::<Value>(d).expect("the last event is JSON"))
        .expect("a last event");
    assert_eq!(last["id"], 7, "{last}");
    let msg = last["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("backend streamed ") && msg.contains("1500 ms"),
        "{msg}"
    );
    assert!(relayed > 0);
    assert!(
        took >= Duration::from_millis(1400) && took < CUT_BY,
        "cut after {took:?}, timeout_ms = 1500"
    );
    rss.check("message path, endless SSE notifications");
    gw.stop().await;
}
