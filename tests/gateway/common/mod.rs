//! Test harness: start portico in-process on 127.0.0.1:0 from a TOML string, talk to it over
//! real HTTP, and build 2026-07-28 requests without repeating the envelope everywhere.

#![allow(dead_code)]

pub mod mock;

use bytes::Bytes;
use http::{HeaderMap, Request};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::oneshot;

pub const LATEST: &str = "2026-07-28";

/// A portico instance running inside the test process.
pub struct Gateway {
    pub addr: SocketAddr,
    /// The metrics listener's address, when the config has `[metrics]`.
    pub metrics_addr: Option<SocketAddr>,
    /// The admin listener's address, when the config has `[admin]`.
    pub admin_addr: Option<SocketAddr>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Gateway {
    pub async fn start(toml: &str) -> Gateway {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        Gateway::start_on(toml, listener).await
    }

    /// Starts on a listener bound beforehand (when the config must name the address).
    pub async fn start_on(toml: &str, listener: tokio::net::TcpListener) -> Gateway {
        let config = portico::config::validate(portico::config::parse(toml).expect("parse"))
            .expect("valid config");
        let addr = listener.local_addr().unwrap();
        // `[metrics]` gets its own port 0 listener, whatever `listen` says.
        let metrics = match &config.metrics {
            Some(_) => Some(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap()),
            None => None,
        };
        let metrics_addr = metrics.as_ref().map(|l| l.local_addr().unwrap());
        // `[admin]` likewise.
        let admin = match &config.admin {
            Some(_) => Some(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap()),
            None => None,
        };
        let admin_addr = admin.as_ref().map(|l| l.local_addr().unwrap());
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let bound = portico::Bound { metrics, admin };
            portico::run_with_listeners(config, listener, bound, async {
                let _ = rx.await;
            })
            .await
            .expect("gateway runs");
        });
        Gateway {
            addr,
            metrics_addr,
            admin_addr,
            stop: Some(tx),
            task: Some(task),
        }
    }

    /// Starts from the config file at `path` and reloads it when it changes, as `main` runs
    /// the gateway (`portico::run_with_reload`).
    pub async fn start_reloading(path: &std::path::Path) -> Gateway {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let path = path.to_path_buf();
        let task = tokio::spawn(async move {
            portico::run_with_reload(&path, listener, async {
                let _ = rx.await;
            })
            .await
            .expect("gateway runs");
        });
        Gateway {
            addr,
            metrics_addr: None,
            admin_addr: None,
            stop: Some(tx),
            task: Some(task),
        }
    }

    /// Starts the drain without waiting for it ([`Gateway::stopped`] waits).
    pub fn begin_stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }

    /// Stops (if not asked already) and tells whether the gateway ended within 15 s.
    pub async fn stopped(mut self) -> bool {
        self.begin_stop();
        match self.task.take() {
            Some(t) => matches!(
                tokio::time::timeout(Duration::from_secs(15), t).await,
                Ok(Ok(()))
            ),
            None => true,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// A URL on the metrics listener (`/metrics`, `/healthz`, `/readyz`).
    pub fn metrics_url(&self, path: &str) -> String {
        let addr = self
            .metrics_addr
            .expect("the config has a [metrics] section");
        format!("http://{addr}{path}")
    }

    /// A URL on the admin listener (`/admin/cache/purge`, `/status`).
    pub fn admin_url(&self, path: &str) -> String {
        let addr = self.admin_addr.expect("the config has an [admin] section");
        format!("http://{addr}{path}")
    }

    /// Stops accepting and waits for the drain to finish.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(15), t).await;
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// A response read to its end.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    /// The JSON-RPC error code of a JSON answer.
    pub fn code(&self) -> i64 {
        self.json()["error"]["code"]
            .as_i64()
            .unwrap_or_else(|| panic!("no error code in {:?}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn is_sse(&self) -> bool {
        self.header("content-type")
            .is_some_and(|c| c.starts_with("text/event-stream"))
    }

    /// Every JSON-RPC message of the answer, whether it came as JSON or SSE.
    pub fn messages(&self) -> Vec<Value> {
        if !self.is_sse() {
            return vec![self.json()];
        }
        let mut dec = portico::sse::SseDecoder::new(1 << 24);
        dec.push(&self.body);
        let mut out = Vec::new();
        while let Ok(Some(ev)) = dec.next_event() {
            out.push(serde_json::from_slice(&ev).expect("SSE data is JSON"));
        }
        if let Some(ev) = dec.finish() {
            out.push(serde_json::from_slice(&ev).expect("SSE data is JSON"));
        }
        out
    }

    /// The final JSON-RPC response (the last message).
    pub fn result(&self) -> Value {
        let msgs = self.messages();
        msgs.last().cloned().expect("at least one message")
    }
}

pub fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A client that speaks HTTP/2 only (h2c by prior knowledge on `http://` URLs).
pub fn h2_client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

/// A 2026-07-28 POST to `url` with the headers of [`modern_headers`], for a hyper client.
pub fn modern_request(
    url: &str,
    method: &str,
    name: Option<&str>,
    body: String,
) -> http::Request<Full<Bytes>> {
    let mut req = http::Request::builder().method("POST").uri(url);
    for (k, v) in modern_headers(method, name) {
        req = req.header(k, v);
    }
    req.body(Full::new(Bytes::from(body)))
        .expect("a valid request")
}

/// A raw POST/GET/… with exactly the given headers.
pub async fn send(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Resp {
    let resp = send_stream(method, url, headers, body).await;
    let (parts, body) = resp.into_parts();
    let body = tokio::time::timeout(Duration::from_secs(30), body.collect())
        .await
        .expect("body within 30 s")
        .expect("body")
        .to_bytes();
    Resp {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body,
    }
}

/// Like `send`, but returns as soon as the response head arrives.
pub async fn send_stream(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> http::Response<Incoming> {
    let mut req = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(body.into())).unwrap();
    tokio::time::timeout(Duration::from_secs(30), client().request(req))
        .await
        .expect("response within 30 s")
        .expect("request sent")
}

/// The standard headers of a 2026-07-28 POST.
pub fn modern_headers<'a>(method: &'a str, name: Option<&'a str>) -> Vec<(&'a str, &'a str)> {
    let mut h = vec![
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("mcp-protocol-version", LATEST),
        ("mcp-method", method),
    ];
    if let Some(n) = name {
        h.push(("mcp-name", n));
    }
    h
}

/// A 2026-07-28 request body with the required `_meta`.
pub fn modern_body(id: Value, method: &str, mut params: Value) -> String {
    if params.is_null() {
        params = json!({});
    }
    let meta = params
        .as_object_mut()
        .expect("params object")
        .entry("_meta")
        .or_insert(json!({}));
    meta["io.modelcontextprotocol/protocolVersion"] = json!(LATEST);
    meta["io.modelcontextprotocol/clientCapabilities"] = json!({});
    json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}).to_string()
}

/// Name header value a method mirrors, from its params.
pub fn name_of(method: &str, params: &Value) -> Option<String> {
    match method {
        "tools/call" | "prompts/get" => params["name"].as_str().map(String::from),
        "resources/read" => params["uri"].as_str().map(String::from),
        _ => None,
    }
}

/// A well-formed 2026-07-28 request.
pub async fn mcp(url: &str, id: Value, method: &str, params: Value) -> Resp {
    mcp_with(url, id, method, params, &[]).await
}

/// A well-formed 2026-07-28 request with extra headers.
pub async fn mcp_with(
    url: &str,
    id: Value,
    method: &str,
    params: Value,
    extra: &[(&str, &str)],
) -> Resp {
    let name = name_of(method, &params);
    let mut h = modern_headers(method, name.as_deref());
    h.extend_from_slice(extra);
    send("POST", url, &h, modern_body(id, method, params)).await
}

/// `portico_cache_requests_total{outcome}` on a gateway's metrics listener (0 when absent).
pub async fn cache_outcome(gw: &Gateway, outcome: &str) -> f64 {
    let r = send("GET", &gw.metrics_url("/metrics"), &[], "").await;
    let line = format!("portico_cache_requests_total{{outcome=\"{outcome}\"}} ");
    String::from_utf8_lossy(&r.body)
        .lines()
        .find_map(|l| l.strip_prefix(&line).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

/// Writes `contents` (a key, a token) to a file of its own and returns its path. Tests run
/// concurrently: a shared file that one test rewrites could be read empty by another's config.
pub fn secret_file(tag: &str, contents: &str) -> std::path::PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("portico-{tag}-{}-{n}", std::process::id());
    let path = std::env::temp_dir().join(name);
    std::fs::write(&path, contents).unwrap();
    path
}
