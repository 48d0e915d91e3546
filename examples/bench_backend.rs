//! `bench_backend`: a deliberately fast MCP backend for `benches/run.sh`.
//!
//! One hyper 1 HTTP/1.1 server on 127.0.0.1, answering `POST /mcp` (any path, in fact) with
//! precomputed JSON: `server/discover`, a ~2 KB `tools/list` (`resultType: "complete"`,
//! `ttlMs: 60000`, `cacheScope: "public"`), a small `tools/call` whose text echoes the request id,
//! and `ping`. The JSON-RPC id is echoed byte for byte (serde with `RawValue`; the rest of the
//! body is skimmed, not built into a tree). It does the cheap header checks the 2026-07-28 spec
//! asks of a server (`Mcp-Method`, `Mcp-Name`, `MCP-Protocol-Version`, `_meta`), so a proxy that
//! mangles a request is caught rather than measured.
//!
//! `--legacy` turns it into an initialize-era server shaped like the TypeScript SDK v1: it
//! answers `initialize` with an `Mcp-Session-Id`, wants that header afterwards, answers without
//! `resultType`/cache hints, and refuses a 2026-07-28 request with 400
//! `-32000 "Bad Request: Unsupported protocol version: …"` (what portico's probe sees).
//!
//! `--listen-every-ms N` (2026-07-28 mode) answers `subscriptions/listen` with an SSE stream:
//! the acknowledgement (the client's filter, agreed in full), then one
//! `notifications/tools/list_changed` every N ms, both tagged with the request's id as
//! `subscriptionId`, until the client leaves (`benches/scale.sh`, open listen streams).
//!
//! ```text
//! cargo run --release --example bench_backend -- [--port N] [--workers N] [--legacy] [--sse]
//!                                                  [--listen-every-ms N] [--name NAME]
//! ```
//! `--port 0` (the default; env `BENCH_BACKEND_PORT`) binds a free port. Once accepting, it prints
//! exactly `LISTENING <port>` on stdout. `--workers 1` (default; env `BENCH_BACKEND_WORKERS`) runs a
//! current-thread runtime; more runs a multi-thread one. `GET /stats` returns request counts
//! (`{"tools/list":N,...}`) so the harness can tell a cache hit from a pass-through.

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Either, Full, StreamBody};
use hyper::body::Frame;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::convert::Infallible;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const LATEST: &str = "2026-07-28";
const LEGACY_VERSIONS: [&str; 3] = ["2025-11-25", "2025-06-18", "2025-03-26"];
const TTL_MS: u64 = 60_000;

struct Opts {
    port: u16,
    workers: usize,
    legacy: bool,
    sse: bool,
    listen_every_ms: u64,
    name: String,
}

fn usage() -> ! {
    eprintln!(
        "usage: bench_backend [--port N] [--workers N] [--legacy] [--sse] [--name NAME]\n\
         \x20      [--listen-every-ms N]\n\
         env: BENCH_BACKEND_PORT, BENCH_BACKEND_WORKERS"
    );
    std::process::exit(2)
}

fn parse_args() -> Opts {
    let env_num = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let mut o = Opts {
        port: env_num("BENCH_BACKEND_PORT").unwrap_or(0) as u16,
        workers: env_num("BENCH_BACKEND_WORKERS").unwrap_or(1) as usize,
        legacy: false,
        sse: false,
        listen_every_ms: 0,
        name: "bench-backend".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = |flag: &str| {
            it.next().unwrap_or_else(|| {
                eprintln!("bench_backend: {flag} needs a value");
                usage()
            })
        };
        match a.as_str() {
            "--port" => o.port = val("--port").parse().unwrap_or_else(|_| usage()),
            "--workers" => o.workers = val("--workers").parse().unwrap_or_else(|_| usage()),
            "--name" => o.name = val("--name"),
            "--listen-every-ms" => {
                o.listen_every_ms = val("--listen-every-ms")
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .unwrap_or_else(|| usage())
            }
            "--legacy" => o.legacy = true,
            "--sse" => o.sse = true,
            _ => usage(),
        }
    }
    o
}

/// The parts of a JSON-RPC message the backend looks at. Everything else is skipped by serde
/// without being materialised.
#[derive(Deserialize)]
struct Msg<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    params: Option<Params<'a>>,
}

#[derive(Deserialize)]
struct Params<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(rename = "protocolVersion", borrow, default)]
    protocol_version: Option<Cow<'a, str>>,
    #[serde(rename = "_meta", borrow, default)]
    meta: Option<Meta<'a>>,
    /// The filter of a `subscriptions/listen`.
    #[serde(borrow, default)]
    notifications: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Meta<'a> {
    #[serde(rename = "io.modelcontextprotocol/protocolVersion", borrow, default)]
    protocol_version: Option<Cow<'a, str>>,
    #[serde(rename = "io.modelcontextprotocol/clientCapabilities", borrow, default)]
    client_capabilities: Option<&'a RawValue>,
}

/// Precomputed result bodies (the JSON inside `"result":`).
struct Fixed {
    tools_list: Vec<u8>,
    discover: Vec<u8>,
    ping: Vec<u8>,
    initialize_tail: String,
}

#[derive(Default)]
struct Counts {
    discover: AtomicU64,
    tools_list: AtomicU64,
    tools_call: AtomicU64,
    initialize: AtomicU64,
    ping: AtomicU64,
    notifications: AtomicU64,
    listen: AtomicU64,
    other: AtomicU64,
    rejected: AtomicU64,
}

struct State {
    legacy: bool,
    sse: bool,
    /// `subscriptions/listen` streams send a notification this often; `None` = no listen.
    listen_every: Option<Duration>,
    fixed: Fixed,
    counts: Counts,
    /// Session ids are `<prefix><n>`; any id with this process's prefix is accepted, so sessions
    /// cost no lookup and a restarted backend answers 404 to old ones.
    session_prefix: String,
    next_session: AtomicU64,
}

fn tool(
    name: &str,
    description: &str,
    props: serde_json::Value,
    required: &[&str],
) -> serde_json::Value {
    json!({
        "name": name,
        "description": description,
        "inputSchema": { "type": "object", "properties": props, "required": required },
    })
}

fn fixed(legacy: bool, server_name: &str) -> Fixed {
    let tools = json!([
        tool(
            "echo",
            "Returns its text argument unchanged. Useful to check that a round trip works end to end.",
            json!({ "text": { "type": "string", "description": "The text to return." } }),
            &["text"]
        ),
        tool(
            "add",
            "Adds two integers and returns the sum as text.",
            json!({ "a": { "type": "integer", "description": "First addend." },
                     "b": { "type": "integer", "description": "Second addend." } }),
            &["a", "b"]
        ),
        tool(
            "search_documents",
            "Full-text search over the indexed document collection; returns the best matching passages with their source.",
            json!({ "query": { "type": "string", "description": "What to look for." },
                     "limit": { "type": "integer", "minimum": 1, "maximum": 50, "description": "Maximum number of passages." },
                     "collection": { "type": "string", "enum": ["docs", "issues", "code"] } }),
            &["query"]
        ),
        tool(
            "get_weather",
            "Current conditions and a short forecast for a city.",
            json!({ "city": { "type": "string" },
                     "units": { "type": "string", "enum": ["metric", "imperial"], "default": "metric" } }),
            &["city"]
        ),
        tool(
            "create_ticket",
            "Opens a ticket in the tracker and returns its id and URL.",
            json!({ "title": { "type": "string", "maxLength": 200 },
                     "body": { "type": "string" },
                     "labels": { "type": "array", "items": { "type": "string" } },
                     "priority": { "type": "string", "enum": ["low", "normal", "high", "urgent"] } }),
            &["title"]
        ),
        tool(
            "run_query",
            "Runs a read-only SQL query against the analytics replica and returns at most 100 rows as JSON.",
            json!({ "sql": { "type": "string", "description": "A single SELECT statement." },
                     "timeout_ms": { "type": "integer", "default": 5000 } }),
            &["sql"]
        ),
    ]);
    let server_info = json!({ "name": server_name, "version": env!("CARGO_PKG_VERSION") });
    let mut list = json!({ "tools": tools });
    let mut discover = json!({
        "supportedVersions": [LATEST],
        "capabilities": { "tools": { "listChanged": false } },
        "instructions": "portico benchmark backend",
    });
    let mut ping = json!({});
    if !legacy {
        for v in [&mut list, &mut discover] {
            v["resultType"] = json!("complete");
            v["ttlMs"] = json!(TTL_MS);
            v["cacheScope"] = json!("public");
            v["_meta"] = json!({ "io.modelcontextprotocol/serverInfo": server_info });
        }
        ping["resultType"] = json!("complete");
    }
    let initialize_tail = serde_json::to_string(&json!({
        "capabilities": { "tools": { "listChanged": false } },
        "serverInfo": server_info,
        "instructions": "portico benchmark backend (legacy mode)",
    }))
    .unwrap();
    Fixed {
        tools_list: serde_json::to_vec(&list).unwrap(),
        discover: serde_json::to_vec(&discover).unwrap(),
        ping: serde_json::to_vec(&ping).unwrap(),
        // `{"protocolVersion":"…",` is prepended per request.
        initialize_tail: initialize_tail[1..].to_string(),
    }
}

fn main() {
    let opts = parse_args();
    let state = Arc::new(State {
        legacy: opts.legacy,
        sse: opts.sse,
        listen_every: (opts.listen_every_ms > 0)
            .then(|| Duration::from_millis(opts.listen_every_ms)),
        fixed: fixed(opts.legacy, &opts.name),
        counts: Counts::default(),
        session_prefix: format!("bench-{:x}-", std::process::id() as u64 ^ now_nanos()),
        next_session: AtomicU64::new(1),
    });
    let rt = if opts.workers <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(opts.workers)
            .enable_all()
            .build()
    }
    .expect("tokio runtime");
    rt.block_on(serve(state, opts));
}

fn now_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

async fn serve(state: Arc<State>, opts: Opts) {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", opts.port))
        .await
        .unwrap_or_else(|e| {
            eprintln!("bench_backend: cannot bind 127.0.0.1:{}: {e}", opts.port);
            std::process::exit(1)
        });
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    eprintln!(
        "bench_backend: {} mode{}{}, {} worker(s), tools/list result {} bytes, port {port}",
        if opts.legacy { "legacy" } else { "2026-07-28" },
        if opts.sse { " (SSE answers)" } else { "" },
        match state.listen_every {
            Some(d) if !opts.legacy =>
                format!(", listen streams notify every {} ms", d.as_millis()),
            _ => String::new(),
        },
        opts.workers.max(1),
        state.fixed.tools_list.len()
    );
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "LISTENING {port}");
        let _ = out.flush();
    }
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(x) => x,
            Err(_) => continue,
        };
        let _ = tcp.set_nodelay(true);
        let st = state.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let st = st.clone();
                async move { Ok::<_, Infallible>(handle(&st, req).await) }
            });
            let _ = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}

/// A listen stream's body: SSE events until the client leaves.
type Events = StreamBody<BoxStream<'static, Result<Frame<Bytes>, Infallible>>>;
type Resp = Response<Either<Full<Bytes>, Events>>;

fn resp(status: StatusCode, content_type: &'static str, body: Bytes) -> Resp {
    let mut r = Response::new(Either::Left(Full::new(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn empty(status: StatusCode) -> Resp {
    resp(status, "text/plain", Bytes::new())
}

/// `{"jsonrpc":"2.0","id":<id>,"result":<result>}`
fn envelope(id: &str, key: &str, inner: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(40 + id.len() + inner.len());
    v.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    v.extend_from_slice(id.as_bytes());
    v.extend_from_slice(b",\"");
    v.extend_from_slice(key.as_bytes());
    v.extend_from_slice(b"\":");
    v.extend_from_slice(inner);
    v.push(b'}');
    v
}

fn error_inner(code: i64, message: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({ "code": code, "message": message })).unwrap()
}

impl State {
    /// Serialises one answer as JSON, or as a one-event SSE stream with `--sse`.
    fn answer(&self, status: StatusCode, msg: Vec<u8>) -> Resp {
        if self.sse {
            let mut v = Vec::with_capacity(msg.len() + 24);
            v.extend_from_slice(b"event: message\ndata: ");
            v.extend_from_slice(&msg);
            v.extend_from_slice(b"\n\n");
            resp(status, "text/event-stream", Bytes::from(v))
        } else {
            resp(status, "application/json", Bytes::from(msg))
        }
    }

    fn result(&self, id: &str, inner: &[u8]) -> Resp {
        self.answer(StatusCode::OK, envelope(id, "result", inner))
    }

    /// Errors are always plain JSON (as the SDKs send transport-level refusals).
    fn error(&self, status: StatusCode, id: Option<&str>, code: i64, message: &str) -> Resp {
        self.counts.rejected.fetch_add(1, Ordering::Relaxed);
        let msg = envelope(id.unwrap_or("null"), "error", &error_inner(code, message));
        resp(status, "application/json", Bytes::from(msg))
    }

    fn stats(&self) -> Resp {
        let c = &self.counts;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let body = json!({
            "server/discover": n(&c.discover),
            "tools/list": n(&c.tools_list),
            "tools/call": n(&c.tools_call),
            "initialize": n(&c.initialize),
            "ping": n(&c.ping),
            "subscriptions/listen": n(&c.listen),
            "notifications": n(&c.notifications),
            "other": n(&c.other),
            "rejected": n(&c.rejected),
        });
        resp(
            StatusCode::OK,
            "application/json",
            Bytes::from(body.to_string()),
        )
    }
}

fn header_str<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The small `tools/call` result: one text item naming the tool and echoing the request id.
fn call_result(id: &str, tool: &str, modern: bool) -> Vec<u8> {
    let text = serde_json::to_string(&format!("{tool} ok, request {id}")).unwrap();
    let mut v = Vec::with_capacity(text.len() + 80);
    v.extend_from_slice(b"{\"content\":[{\"type\":\"text\",\"text\":");
    v.extend_from_slice(text.as_bytes());
    v.extend_from_slice(b"}],\"isError\":false");
    if modern {
        v.extend_from_slice(b",\"resultType\":\"complete\"");
    }
    v.push(b'}');
    v
}

async fn handle(state: &State, req: Request<Incoming>) -> Resp {
    let (parts, body) = req.into_parts();
    if parts.method == Method::GET && parts.uri.path() == "/stats" {
        return state.stats();
    }
    if parts.method == Method::POST && parts.uri.path() == "/v1/traces" {
        // The benchmark's span sink (targets portico-trace*): an OTLP/HTTP export is accepted
        // and dropped; an empty 200 is a valid export response.
        let _ = body.collect().await;
        return empty(StatusCode::OK);
    }
    if state.legacy && parts.method == Method::DELETE {
        return empty(StatusCode::OK);
    }
    if parts.method != Method::POST {
        return empty(StatusCode::METHOD_NOT_ALLOWED);
    }
    let bytes = match body.collect().await {
        Ok(c) => c.to_bytes(),
        Err(_) => return empty(StatusCode::BAD_REQUEST),
    };
    let msg: Msg = match serde_json::from_slice(&bytes) {
        Ok(m) => m,
        Err(_) => return state.error(StatusCode::BAD_REQUEST, None, -32700, "Parse error"),
    };
    if state.legacy {
        legacy(state, &parts.headers, msg)
    } else {
        modern(state, &parts.headers, msg)
    }
}

fn modern(state: &State, headers: &HeaderMap, msg: Msg) -> Resp {
    let id = msg.id.map(RawValue::get);
    let Some(method) = msg.method.as_deref() else {
        return state.error(
            StatusCode::BAD_REQUEST,
            id,
            -32600,
            "Invalid Request: no method",
        );
    };
    let Some(id) = id else {
        state.counts.notifications.fetch_add(1, Ordering::Relaxed);
        return empty(StatusCode::ACCEPTED);
    };
    // The server-side header checks of 2026-07-28.
    if header_str(headers, "mcp-method") != Some(method) {
        return state.error(
            StatusCode::BAD_REQUEST,
            Some(id),
            -32020,
            "Mcp-Method header does not match the body",
        );
    }
    let params = msg.params.as_ref();
    let meta = params.and_then(|p| p.meta.as_ref());
    let pv = meta.and_then(|m| m.protocol_version.as_deref());
    if pv.is_none() || meta.and_then(|m| m.client_capabilities).is_none() {
        return state.error(
            StatusCode::BAD_REQUEST,
            Some(id),
            -32602,
            "params._meta must carry protocolVersion and clientCapabilities",
        );
    }
    if pv != Some(LATEST) || header_str(headers, "mcp-protocol-version") != Some(LATEST) {
        return state.error(
            StatusCode::BAD_REQUEST,
            Some(id),
            -32022,
            "Unsupported protocol version",
        );
    }
    let c = &state.counts;
    match method {
        "tools/call" => {
            let name = params.and_then(|p| p.name.as_deref()).unwrap_or("");
            // Bench tool names are plain ASCII, so the header carries them verbatim.
            if header_str(headers, "mcp-name") != Some(name) {
                return state.error(
                    StatusCode::BAD_REQUEST,
                    Some(id),
                    -32020,
                    "Mcp-Name header does not match the body",
                );
            }
            c.tools_call.fetch_add(1, Ordering::Relaxed);
            state.result(id, &call_result(id, name, true))
        }
        "tools/list" => {
            c.tools_list.fetch_add(1, Ordering::Relaxed);
            state.result(id, &state.fixed.tools_list)
        }
        "server/discover" => {
            c.discover.fetch_add(1, Ordering::Relaxed);
            state.result(id, &state.fixed.discover)
        }
        "ping" => {
            c.ping.fetch_add(1, Ordering::Relaxed);
            state.result(id, &state.fixed.ping)
        }
        "subscriptions/listen" if state.listen_every.is_some() => {
            c.listen.fetch_add(1, Ordering::Relaxed);
            let filter = params
                .and_then(|p| p.notifications)
                .map_or("{}", RawValue::get);
            listen(id, filter, state.listen_every.unwrap_or_default())
        }
        _ => {
            c.other.fetch_add(1, Ordering::Relaxed);
            state.error(
                StatusCode::NOT_FOUND,
                Some(id),
                -32601,
                &format!("Method not found: {method}"),
            )
        }
    }
}

/// `subscriptions/listen`: the acknowledgement, then a `tools/list_changed` every `every`.
fn listen(id: &str, filter: &str, every: Duration) -> Resp {
    let event = |method: &str, extra: &str| {
        Bytes::from(format!(
            "event: message\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"{method}\",\"params\":{{{extra}\"_meta\":{{\"io.modelcontextprotocol/subscriptionId\":{id}}}}}}}\n\n"
        ))
    };
    let ack = event(
        "notifications/subscriptions/acknowledged",
        &format!("\"notifications\":{filter},"),
    );
    let note = event("notifications/tools/list_changed", "");
    let start = tokio::time::Instant::now() + every;
    let ticks =
        futures_util::stream::unfold(tokio::time::interval_at(start, every), move |mut iv| {
            let note = note.clone();
            async move {
                iv.tick().await;
                Some((note, iv))
            }
        });
    let events = futures_util::stream::once(async move { ack })
        .chain(ticks)
        .map(|b| Ok(Frame::data(b)))
        .boxed();
    let mut r = Response::new(Either::Right(StreamBody::new(events)));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// Initialize-era behaviour, shaped like the TypeScript SDK v1 (stateful, JSON answers).
fn legacy(state: &State, headers: &HeaderMap, msg: Msg) -> Resp {
    let id = msg.id.map(RawValue::get);
    let method = msg.method.as_deref().unwrap_or("");
    let version = header_str(headers, "mcp-protocol-version");
    if version == Some(LATEST) && method != "initialize" {
        return state.error(
            StatusCode::BAD_REQUEST,
            None,
            -32000,
            "Bad Request: Unsupported protocol version: 2026-07-28 (supported versions: 2025-11-25, 2025-06-18, 2025-03-26)",
        );
    }
    let c = &state.counts;
    if method == "initialize" {
        let Some(id) = id else {
            return state.error(StatusCode::BAD_REQUEST, None, -32600, "Invalid Request");
        };
        c.initialize.fetch_add(1, Ordering::Relaxed);
        let asked = msg
            .params
            .as_ref()
            .and_then(|p| p.protocol_version.as_deref())
            .unwrap_or("2025-03-26");
        let chosen = if LEGACY_VERSIONS.contains(&asked) {
            asked
        } else {
            LEGACY_VERSIONS[0]
        };
        let inner = format!(
            "{{\"protocolVersion\":\"{chosen}\",{}",
            state.fixed.initialize_tail
        );
        let mut r = state.result(id, inner.as_bytes());
        let sid = format!(
            "{}{}",
            state.session_prefix,
            state.next_session.fetch_add(1, Ordering::Relaxed)
        );
        if let Ok(v) = HeaderValue::from_str(&sid) {
            r.headers_mut().insert("mcp-session-id", v);
        }
        return r;
    }
    match header_str(headers, "mcp-session-id") {
        None => {
            return state.error(
                StatusCode::BAD_REQUEST,
                None,
                -32000,
                "Bad Request: Mcp-Session-Id header is required",
            );
        }
        Some(s) if !s.starts_with(&state.session_prefix) => {
            return state.error(StatusCode::NOT_FOUND, None, -32001, "Session not found");
        }
        _ => {}
    }
    if let Some(v) = version
        && !LEGACY_VERSIONS.contains(&v)
    {
        return state.error(
            StatusCode::BAD_REQUEST,
            None,
            -32000,
            &format!(
                "Bad Request: Unsupported protocol version: {v} (supported versions: {})",
                LEGACY_VERSIONS.join(", ")
            ),
        );
    }
    let Some(id) = id else {
        c.notifications.fetch_add(1, Ordering::Relaxed);
        return empty(StatusCode::ACCEPTED);
    };
    match method {
        "tools/call" => {
            c.tools_call.fetch_add(1, Ordering::Relaxed);
            let name = msg
                .params
                .as_ref()
                .and_then(|p| p.name.as_deref())
                .unwrap_or("");
            state.result(id, &call_result(id, name, false))
        }
        "tools/list" => {
            c.tools_list.fetch_add(1, Ordering::Relaxed);
            state.result(id, &state.fixed.tools_list)
        }
        "ping" => {
            c.ping.fetch_add(1, Ordering::Relaxed);
            state.result(id, &state.fixed.ping)
        }
        _ => {
            c.other.fetch_add(1, Ordering::Relaxed);
            // Legacy SDKs answer unknown methods with HTTP 200 and a JSON-RPC error.
            state.error(
                StatusCode::OK,
                Some(id),
                -32601,
                &format!("Method not found: {method}"),
            )
        }
    }
}
