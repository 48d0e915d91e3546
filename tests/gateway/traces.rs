//! Traces (`[tracing]`, README "Traces"): an in-test OTLP/HTTP collector on 127.0.0.1 receives
//! portico's spans as protobuf. The request span continues the client's `traceparent`, carries
//! the request's attributes, and has one child span per upstream attempt, whose id is the one
//! the backend (the mock, which records request headers) sees in its own `traceparent`.
//! Sampling follows the client's flag and `sampling_ratio`; unsampled requests still hand the
//! backend a consistent `traceparent`.

use crate::common::mock::MockMcp;
use crate::common::*;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};

/// `Span.kind` values of the OTLP protocol (`SPAN_KIND_SERVER`, `SPAN_KIND_CLIENT`).
const SERVER: i32 = 2;
const CLIENT: i32 = 3;

/// An exported span with its resource's `service.name`.
#[derive(Clone, Debug)]
struct Got {
    service: String,
    span: Span,
}

/// A minimal OTLP/HTTP trace receiver: every POST body is an `ExportTraceServiceRequest`.
struct Collector {
    addr: std::net::SocketAddr,
    got: Arc<Mutex<Vec<Got>>>,
    paths: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Collector {
    async fn start() -> Collector {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let got: Arc<Mutex<Vec<Got>>> = Arc::default();
        let paths: Arc<Mutex<Vec<String>>> = Arc::default();
        let (g, p) = (got.clone(), paths.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (g, p) = (g.clone(), p.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let (g, p) = (g.clone(), p.clone());
                        async move { Ok::<_, hyper::Error>(receive(req, &g, &p).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Collector {
            addr,
            got,
            paths,
            task,
        }
    }

    fn spans(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }
}

async fn receive(
    req: Request<Incoming>,
    got: &Mutex<Vec<Got>>,
    paths: &Mutex<Vec<String>>,
) -> Response<Full<Bytes>> {
    paths.lock().unwrap().push(req.uri().path().to_string());
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let export = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf export");
    for rs in export.resource_spans {
        let service = rs
            .resource
            .as_ref()
            .and_then(|r| attr(&r.attributes, "service.name"))
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for span in ss.spans {
                got.lock().unwrap().push(Got {
                    service: service.clone(),
                    span,
                });
            }
        }
    }
    Response::builder()
        .header("content-type", "application/x-protobuf")
        .body(Full::new(Bytes::from(
            ExportTraceServiceResponse::default().encode_to_vec(),
        )))
        .unwrap()
}

/// An attribute as JSON (strings, bools and integers are all these spans use).
fn attr(attrs: &[KeyValue], key: &str) -> Option<Value> {
    let kv = attrs.iter().find(|kv| kv.key == key)?;
    match kv.value.as_ref()?.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(json!(s)),
        any_value::Value::BoolValue(b) => Some(json!(b)),
        any_value::Value::IntValue(i) => Some(json!(i)),
        other => Some(json!(format!("{other:?}"))),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The server span of the trace `trace_id` whose parent is `parent` (the client's span).
fn request_span<'a>(spans: &'a [Got], trace_id: &str, parent: &str) -> &'a Got {
    let found: Vec<&Got> = spans
        .iter()
        .filter(|g| hex(&g.span.trace_id) == trace_id && hex(&g.span.parent_span_id) == parent)
        .collect();
    assert_eq!(found.len(), 1, "one request span in {trace_id}: {spans:#?}");
    assert_eq!(found[0].span.kind, SERVER, "{:?}", found[0].span);
    found[0]
}

/// The spans whose parent is `span`.
fn children<'a>(spans: &'a [Got], span: &Span) -> Vec<&'a Got> {
    spans
        .iter()
        .filter(|g| g.span.trace_id == span.trace_id && g.span.parent_span_id == span.span_id)
        .collect()
}

fn check_attrs(span: &Span, want: &[(&str, Value)]) {
    for (key, value) in want {
        assert_eq!(
            attr(&span.attributes, key).as_ref(),
            Some(value),
            "{key} of {:?}: {:?}",
            span.name,
            span.attributes
        );
    }
}

/// The `traceparent` a backend saw on the request whose body has `method`, by trace id.
fn seen_traceparent(
    mock: &crate::common::mock::MockHandle,
    method: &str,
    trace_id: &str,
) -> String {
    let found: Vec<String> = mock
        .seen()
        .iter()
        .filter(|s| s.body["method"] == method)
        .filter_map(|s| {
            s.headers
                .get("traceparent")?
                .to_str()
                .ok()
                .map(String::from)
        })
        .filter(|tp| tp.split('-').nth(1) == Some(trace_id))
        .collect();
    assert_eq!(found.len(), 1, "{method} in trace {trace_id}: {found:?}");
    found[0].clone()
}

fn traceparent(trace_id: &str, span_id: &str, flags: &str) -> String {
    format!("00-{trace_id}-{span_id}-{flags}")
}

#[tokio::test]
async fn request_spans_continue_the_client_trace_and_the_backend_sees_portico_s_child_span() {
    let collector = Collector::start().await;
    let modern = MockMcp::modern().start().await;
    let legacy = MockMcp::legacy().start().await;
    let gw = Gateway::start(&format!(
        r#"
[tracing]
otlp_endpoint = "http://{}"
service_name = "portico-under-test"

[[backends]]
name = "m"
url = "{}"
protocol = "modern"

[[backends]]
name = "l"
url = "{}"
protocol = "legacy"
"#,
        collector.addr,
        modern.url(),
        legacy.url()
    ))
    .await;

    // Three client traces: a cached list (message path), a passed-through call, a bridged call.
    let list_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let call_trace = "5bf92f3577b34da6a3ce929d0e0e4737";
    let bridge_trace = "6bf92f3577b34da6a3ce929d0e0e4738";
    let client_span = "00f067aa0ba902b7";
    let r = mcp_with(
        &gw.url("/mcp/m"),
        json!(1),
        "tools/list",
        json!({}),
        &[("traceparent", &traceparent(list_trace, client_span, "01"))],
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let r = mcp_with(
        &gw.url("/mcp/m"),
        json!(2),
        "tools/call",
        json!({"name":"echo","arguments":{"text":"hi"}}),
        &[("traceparent", &traceparent(call_trace, client_span, "01"))],
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let r = mcp_with(
        &gw.url("/mcp/l"),
        json!(3),
        "tools/call",
        json!({"name":"echo","arguments":{"text":"hi"}}),
        &[("traceparent", &traceparent(bridge_trace, client_span, "01"))],
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    // No client trace: a new one. A cache hit this time, so no upstream attempt.
    let r = mcp(&gw.url("/mcp/m"), json!(4), "tools/list", json!({})).await;
    assert_eq!(r.status, 200);
    // Stopping the gateway exports what is queued.
    gw.stop().await;
    let spans = collector.spans();
    assert!(
        collector
            .paths
            .lock()
            .unwrap()
            .iter()
            .all(|p| p == "/v1/traces"),
        "an endpoint without a path gets /v1/traces"
    );
    assert!(
        spans.iter().all(|g| g.service == "portico-under-test"),
        "{spans:#?}"
    );

    // 1. tools/list: a cache miss on the message path.
    let root = request_span(&spans, list_trace, client_span);
    assert_eq!(root.span.name, "tools/list m");
    check_attrs(
        &root.span,
        &[
            ("mcp.method.name", json!("tools/list")),
            ("portico.route", json!("m")),
            ("portico.backend", json!("m")),
            ("portico.cache", json!("miss")),
            ("portico.client_era", json!("modern")),
            ("portico.bridged", json!(false)),
            ("portico.passthrough", json!(false)),
            ("http.response.status_code", json!(200)),
        ],
    );
    assert!(attr(&root.span.attributes, "error.type").is_none());
    // Not a call, and nobody authenticated: no tool, no caller.
    assert!(attr(&root.span.attributes, "gen_ai.tool.name").is_none());
    assert!(attr(&root.span.attributes, "enduser.id").is_none());
    let kids = children(&spans, &root.span);
    assert_eq!(kids.len(), 1, "{kids:#?}");
    assert_eq!(kids[0].span.kind, CLIENT);
    check_attrs(
        &kids[0].span,
        &[
            ("portico.upstream", json!("message")),
            ("portico.backend", json!("m")),
            ("portico.attempt", json!(1)),
            ("http.response.status_code", json!(200)),
        ],
    );
    // The backend's parent is portico's attempt span, in the client's trace.
    let child_id = hex(&kids[0].span.span_id);
    assert_ne!(child_id, client_span);
    assert_eq!(
        seen_traceparent(&modern, "tools/list", list_trace),
        traceparent(list_trace, &child_id, "01")
    );

    // 2. tools/call, passed through unread.
    let root = request_span(&spans, call_trace, client_span);
    check_attrs(
        &root.span,
        &[
            ("mcp.method.name", json!("tools/call")),
            ("gen_ai.tool.name", json!("echo")),
            ("portico.route", json!("m")),
            ("portico.passthrough", json!(true)),
            ("portico.bridged", json!(false)),
            ("http.response.status_code", json!(200)),
        ],
    );
    assert!(attr(&root.span.attributes, "portico.cache").is_none());
    let kids = children(&spans, &root.span);
    assert_eq!(kids.len(), 1, "{kids:#?}");
    check_attrs(
        &kids[0].span,
        &[("portico.upstream", json!("pass_through"))],
    );
    assert_eq!(
        seen_traceparent(&modern, "tools/call", call_trace),
        traceparent(call_trace, &hex(&kids[0].span.span_id), "01")
    );

    // 3. tools/call to an initialize-era backend: through the bridge.
    let root = request_span(&spans, bridge_trace, client_span);
    check_attrs(
        &root.span,
        &[
            ("portico.route", json!("l")),
            ("gen_ai.tool.name", json!("echo")),
            ("portico.bridged", json!(true)),
            ("portico.client_era", json!("modern")),
            ("http.response.status_code", json!(200)),
        ],
    );
    let kids = children(&spans, &root.span);
    assert_eq!(kids.len(), 1, "{kids:#?}");
    check_attrs(&kids[0].span, &[("portico.upstream", json!("bridge"))]);
    assert_eq!(
        seen_traceparent(&legacy, "tools/call", bridge_trace),
        traceparent(bridge_trace, &hex(&kids[0].span.span_id), "01")
    );

    // 4. No client trace: a root span of its own, served from the cache.
    let hits: Vec<&Got> = spans
        .iter()
        .filter(|g| g.span.parent_span_id.is_empty())
        .collect();
    assert_eq!(hits.len(), 1, "{hits:#?}");
    check_attrs(&hits[0].span, &[("portico.cache", json!("hit"))]);
    assert!(children(&spans, &hits[0].span).is_empty());
    assert_eq!(spans.len(), 4 + 3, "four requests, three upstream attempts");
}

#[tokio::test]
async fn sampling_follows_the_client_and_unsampled_requests_still_propagate() {
    let collector = Collector::start().await;
    let modern = MockMcp::modern().start().await;
    let gw = Gateway::start(&format!(
        r#"
[tracing]
otlp_endpoint = "http://{}/v1/traces"
sampling_ratio = 0.0

[[backends]]
name = "m"
url = "{}"
protocol = "modern"
"#,
        collector.addr,
        modern.url()
    ))
    .await;
    let sampled = "7bf92f3577b34da6a3ce929d0e0e4739";
    let unsampled = "8bf92f3577b34da6a3ce929d0e0e473a";
    let client_span = "00f067aa0ba902b7";
    for (id, tp) in [
        (1, Some(traceparent(sampled, client_span, "01"))),
        (2, Some(traceparent(unsampled, client_span, "00"))),
        // Starts here: kept at sampling_ratio 0.0, i.e. never.
        (3, None),
    ] {
        let extra: Vec<(&str, &str)> = tp.iter().map(|t| ("traceparent", t.as_str())).collect();
        let r = mcp_with(
            &gw.url("/mcp/m"),
            json!(id),
            "tools/call",
            json!({"name":"echo","arguments":{"text":"hi"}}),
            &extra,
        )
        .await;
        assert_eq!(r.status, 200);
    }
    gw.stop().await;
    let spans = collector.spans();
    assert_eq!(
        spans.len(),
        2,
        "the sampled request and its attempt: {spans:#?}"
    );
    let root = request_span(&spans, sampled, client_span);
    assert_eq!(children(&spans, &root.span).len(), 1);
    // Not recorded, yet the backend is handed a span of portico's in the client's trace.
    let tp = seen_traceparent(&modern, "tools/call", unsampled);
    let parts: Vec<&str> = tp.split('-').collect();
    assert_eq!(parts.len(), 4, "{tp}");
    assert_ne!(parts[2], client_span, "{tp}");
    assert_eq!(parts[3], "00", "{tp}");
    // The request that started here also carries one (a new trace).
    let calls: Vec<_> = modern
        .seen()
        .into_iter()
        .filter(|s| s.body["method"] == "tools/call")
        .collect();
    assert_eq!(calls.len(), 3);
    assert!(calls.iter().all(|s| s.headers.contains_key("traceparent")));
}
