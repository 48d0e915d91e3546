//! `hyper_backend`: a second benchmark backend, written the way a plain hyper 1.x server is
//! usually written — unlike `bench_backend`, which tunes its sockets and precomputes its answers.
//!
//! One current-thread tokio runtime, `TcpListener::accept`, `http1::Builder::new()` with its
//! defaults and `service_fn` per connection; no `TCP_NODELAY`, no connection options. Every POST
//! is read whole; its JSON-RPC id is taken with serde (`RawValue`, the rest skipped) and the
//! answer, chosen by the body's `method`, is a small fixed JSON body with that id: `tools/call`
//! (the 2026-07-28 result, 109 bytes for id 1), `tools/list` (one tool), anything else `{}`.
//! hyper adds `content-length` and `date`; the handler sets `content-type`.
//!
//! ```text
//! cargo run --release --example hyper_backend -- [--port N]
//! ```
//! Prints `LISTENING <port>` on stdout once accepting. `GET /stats` returns request counts per
//! method (`{"tools/call":N,...}`), which `benches/run.sh` reads to check that a probe reached it.

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::convert::Infallible;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

const CALL_RESULT: &str =
    r#"{"content":[{"type":"text","text":"hello"}],"isError":false,"resultType":"complete"}"#;
const LIST_RESULT: &str = r#"{"tools":[{"name":"echo","description":"Echo the text back","inputSchema":{"type":"object","properties":{"text":{"type":"string"}}}}],"resultType":"complete"}"#;

#[derive(Deserialize)]
struct Msg<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    method: Option<&'a str>,
}

#[derive(Default)]
struct Counts {
    call: AtomicU64,
    list: AtomicU64,
    other: AtomicU64,
}

fn reply(status: StatusCode, ctype: &'static str, body: Vec<u8>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, ctype)
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_default()
}

async fn handle(counts: &Counts, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() == Method::GET && req.uri().path() == "/stats" {
        let s = format!(
            r#"{{"tools/call":{},"tools/list":{},"other":{}}}"#,
            counts.call.load(Ordering::Relaxed),
            counts.list.load(Ordering::Relaxed),
            counts.other.load(Ordering::Relaxed)
        );
        return reply(StatusCode::OK, "application/json", s.into_bytes());
    }
    if req.method() != Method::POST {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", Vec::new());
    }
    let Ok(body) = req.into_body().collect().await.map(|c| c.to_bytes()) else {
        return reply(StatusCode::BAD_REQUEST, "text/plain", Vec::new());
    };
    let Ok(msg) = serde_json::from_slice::<Msg<'_>>(&body) else {
        let e = br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}"#;
        return reply(StatusCode::BAD_REQUEST, "application/json", e.to_vec());
    };
    let Some(id) = msg.id else {
        return reply(StatusCode::ACCEPTED, "text/plain", Vec::new());
    };
    let result = match msg.method {
        Some("tools/call") => {
            counts.call.fetch_add(1, Ordering::Relaxed);
            CALL_RESULT
        }
        Some("tools/list") => {
            counts.list.fetch_add(1, Ordering::Relaxed);
            LIST_RESULT
        }
        _ => {
            counts.other.fetch_add(1, Ordering::Relaxed);
            "{}"
        }
    };
    let mut out = Vec::with_capacity(40 + result.len());
    out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    out.extend_from_slice(id.get().as_bytes());
    out.extend_from_slice(br#","result":"#);
    out.extend_from_slice(result.as_bytes());
    out.push(b'}');
    reply(StatusCode::OK, "application/json", out)
}

fn main() {
    let mut port = 0u16;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next().and_then(|v| v.parse().ok())) {
            ("--port", Some(p)) => port = p,
            _ => {
                eprintln!("usage: hyper_backend [--port N]");
                std::process::exit(2)
            }
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap_or_else(|e| {
                eprintln!("hyper_backend: cannot bind 127.0.0.1:{port}: {e}");
                std::process::exit(1)
            });
        let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
        eprintln!("hyper_backend: port {port}");
        let _ = writeln!(std::io::stdout().lock(), "LISTENING {port}");
        let _ = std::io::stdout().flush();
        let counts = Arc::new(Counts::default());
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let counts = counts.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| {
                    let counts = counts.clone();
                    async move { Ok::<_, Infallible>(handle(&counts, req).await) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
}
