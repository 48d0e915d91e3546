//! Traces: OpenTelemetry spans exported over OTLP/HTTP (protobuf), configured by `[tracing]`
//! (README, "Traces"). A leaf: the pipeline starts a request's span here, the per-backend step
//! opens one child span per upstream attempt, and the pipeline's single exit
//! (`State::observe`) finishes the request span with what the request became.
//!
//! Why the OpenTelemetry API directly and not spans of the `tracing` crate: the `tracing`
//! subscriber is one per process, while a tracer here belongs to one config generation of one
//! gateway (a reload may change `[tracing]`, and the tests run several gateways in one
//! process). And with tracing off nothing is built at all: [`Telemetry::request`] is one
//! branch on an `Option`, and the request's context carries `None`.
//!
//! Sampling is parent-based: a client's `traceparent` decides for its request (its sampled flag
//! is followed), and traces that start here are kept at `sampling_ratio`. An unsampled request
//! still gets span ids, so the backend sees a consistent `traceparent` (flag `00`).

use http::HeaderValue;
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider, Span};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::config::TracingConfig;

/// The path OTLP/HTTP collectors serve traces on (OTLP specification, "OTLP/HTTP Request"):
/// appended to an `otlp_endpoint` that has no path of its own.
pub const OTLP_TRACES_PATH: &str = "/v1/traces";

/// The W3C trace context header.
pub const TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");

/// The instrumentation scope name of portico's spans.
const SCOPE: &str = "portico";

/// One config generation's tracer; off (and free) without `[tracing] otlp_endpoint`.
#[derive(Default)]
pub struct Telemetry {
    inner: Option<Inner>,
}

struct Inner {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl Telemetry {
    /// Tracing off: no exporter, no spans.
    pub fn off() -> Telemetry {
        Telemetry { inner: None }
    }

    /// Builds the exporter and tracer `cfg` asks for (a batch exporter on its own thread, so
    /// no request ever waits for the collector).
    pub fn new(cfg: &TracingConfig) -> Result<Telemetry, String> {
        use opentelemetry_otlp::{Protocol, WithExportConfig};
        let Some(endpoint) = cfg.otlp_endpoint.as_deref() else {
            return Ok(Telemetry::off());
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(traces_url(endpoint))
            .build()
            .map_err(|e| format!("tracing.otlp_endpoint: {e}"))?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                cfg.sampling_ratio,
            ))))
            .with_resource(
                Resource::builder_empty()
                    .with_service_name(cfg.service_name.clone())
                    .build(),
            )
            .build();
        let tracer = provider.tracer(SCOPE);
        Ok(Telemetry {
            inner: Some(Inner { provider, tracer }),
        })
    }

    pub fn enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// Starts a request's server span, continuing the client's trace when its `traceparent`
    /// is well-formed. `None` when tracing is off.
    #[inline]
    pub fn request(&self, traceparent: Option<&HeaderValue>) -> Option<Trace> {
        let inner = self.inner.as_ref()?;
        Some(Trace::start(&inner.tracer, traceparent))
    }

    /// Exports what is still queued and stops the exporter. On a blocking thread: the SDK
    /// waits for the export (bounded by its own timeouts), which must not stall the runtime
    /// — in the tests, the collector may be served by the very runtime calling this.
    pub async fn shutdown(&self) {
        if let Some(inner) = &self.inner {
            let provider = inner.provider.clone();
            let _ = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        }
    }
}

/// `otlp_endpoint` as the exporter wants it: a full traces URL.
fn traces_url(endpoint: &str) -> String {
    match endpoint.parse::<http::Uri>() {
        Ok(uri) if matches!(uri.path(), "" | "/") && uri.query().is_none() => {
            format!("{}{OTLP_TRACES_PATH}", endpoint.trim_end_matches('/'))
        }
        _ => endpoint.to_string(),
    }
}

/// The client's W3C `traceparent` as a remote parent: version, trace id, parent id and flags
/// (W3C Trace Context, "traceparent Header"). Anything that does not parse, or names the
/// all-zero ids, starts a new trace.
fn parent(traceparent: &HeaderValue) -> Option<SpanContext> {
    let v = traceparent.to_str().ok()?;
    let mut parts = v.splitn(4, '-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let lower_hex = |s: &str, n: usize| {
        s.len() == n && s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
    };
    // Version ff is invalid; a later version may append fields after the flags.
    let flags = flags.get(..2)?;
    if !lower_hex(version, 2) || version == "ff" || !lower_hex(trace, 32) || !lower_hex(span, 16) {
        return None;
    }
    if !lower_hex(flags, 2) || (version == "00" && v.len() != 55) {
        return None;
    }
    let cx = SpanContext::new(
        TraceId::from_hex(trace).ok()?,
        SpanId::from_hex(span).ok()?,
        TraceFlags::new(u8::from_str_radix(flags, 16).ok()? & TraceFlags::SAMPLED.to_u8()),
        true,
        TraceState::default(),
    );
    cx.is_valid().then_some(cx)
}

/// The `traceparent` naming `cx` as the parent (version 00).
fn header_for(cx: &SpanContext) -> HeaderValue {
    let v = format!(
        "00-{}-{}-{:02x}",
        cx.trace_id(),
        cx.span_id(),
        cx.trace_flags().to_u8()
    );
    HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// A request's trace: its server span, and what child spans need. Cloning is cheap and shares
/// the span (an aggregated endpoint's concurrent parts each hold a clone); only the pipeline's
/// exit finishes it ([`Trace::finish`]). A request dropped before its exit ends the span
/// unfinished when the last clone goes.
#[derive(Clone)]
pub struct Trace(Arc<TraceInner>);

struct TraceInner {
    tracer: SdkTracer,
    /// Holds the server span: the parent of every attempt span.
    cx: Context,
    /// Some part of the request went through the era bridge.
    bridged: AtomicBool,
}

/// What a request became, as the pipeline's exit reports it.
pub struct Finish<'a> {
    /// The method label (`protocol::method_label`; `none` before it was read).
    pub method: &'a str,
    /// Backend or endpoint name serving the request.
    pub route: Option<&'a str>,
    /// The backend the request went to last.
    pub backend: Option<&'a str>,
    /// How the cache answered, when it was consulted.
    pub cache: Option<&'a str>,
    /// The client's era: `modern` or `legacy`.
    pub client_era: Option<&'static str>,
    pub passthrough: bool,
    pub status: u16,
    /// portico's own failure reason, if any.
    pub error: Option<&'a str>,
}

impl Trace {
    fn start(tracer: &SdkTracer, traceparent: Option<&HeaderValue>) -> Trace {
        let parent_cx = match traceparent.and_then(parent) {
            Some(remote) => Context::new().with_remote_span_context(remote),
            None => Context::new(),
        };
        let span = tracer
            .span_builder("mcp")
            .with_kind(SpanKind::Server)
            .start_with_context(tracer, &parent_cx);
        Trace(Arc::new(TraceInner {
            tracer: tracer.clone(),
            cx: parent_cx.with_span(span),
            bridged: AtomicBool::new(false),
        }))
    }

    /// The request span's trace and span ids.
    pub fn span_context(&self) -> SpanContext {
        self.0.cx.span().span_context().clone()
    }

    /// Notes that the request (or a part of it) was translated for an initialize-era backend.
    pub fn bridged(&self) {
        self.0.bridged.store(true, Ordering::Relaxed);
    }

    /// Starts a client span for one upstream attempt: `kind` is `pass_through`, `message` or
    /// `bridge`; `attempt` counts from 1 within the step's retry loop.
    pub fn attempt(&self, backend: &str, kind: &'static str, attempt: u32) -> Attempt {
        let t = &self.0.tracer;
        let span = t
            .span_builder(format!("upstream {kind}"))
            .with_kind(SpanKind::Client)
            .with_attributes([
                KeyValue::new("portico.backend", backend.to_string()),
                KeyValue::new("portico.upstream", kind),
                KeyValue::new("portico.attempt", i64::from(attempt)),
            ])
            .start_with_context(t, &self.0.cx);
        Attempt(Box::new(span))
    }

    /// Ends the request span with what the request became. Called by the pipeline's single
    /// exit, once.
    pub fn finish(&self, f: &Finish<'_>) {
        let span = self.0.cx.span();
        if !span.is_recording() {
            span.end();
            return;
        }
        span.update_name(match f.route {
            Some(route) => format!("{} {route}", f.method),
            None => f.method.to_string(),
        });
        let mut attrs = vec![
            KeyValue::new("mcp.method.name", f.method.to_string()),
            KeyValue::new("http.response.status_code", i64::from(f.status)),
            KeyValue::new("portico.bridged", self.0.bridged.load(Ordering::Relaxed)),
            KeyValue::new("portico.passthrough", f.passthrough),
        ];
        let optional = [
            ("portico.route", f.route),
            ("portico.backend", f.backend),
            ("portico.cache", f.cache),
            ("portico.client_era", f.client_era),
            ("error.type", f.error),
        ];
        for (key, value) in optional {
            if let Some(v) = value {
                attrs.push(KeyValue::new(key, v.to_string()));
            }
        }
        span.set_attributes(attrs);
        // Server spans: 5xx is an error, 4xx is the client's (OpenTelemetry HTTP semantic
        // conventions, "Status").
        if f.status >= 500 {
            span.set_status(Status::error(f.error.unwrap_or("").to_string()));
        }
        span.end();
    }
}

/// One upstream attempt's span; ended by [`Attempt::end`] (or unfinished on drop).
pub struct Attempt(Box<Span>);

impl Attempt {
    /// The `traceparent` the upstream request carries: this span as the backend's parent.
    pub fn traceparent(&self) -> HeaderValue {
        header_for(self.0.span_context())
    }

    /// Ends the span: the backend's HTTP status when it answered (`None` for transports
    /// without one), or portico's reason word for the failure.
    pub fn end(mut self, outcome: Result<Option<u16>, &str>) {
        match outcome {
            Ok(status) => {
                if let Some(s) = status {
                    self.0
                        .set_attribute(KeyValue::new("http.response.status_code", i64::from(s)));
                    if s >= 500 {
                        self.0.set_status(Status::error(""));
                    }
                }
            }
            Err(reason) => {
                self.0
                    .set_attribute(KeyValue::new("error.type", reason.to_string()));
                self.0.set_status(Status::error(reason.to_string()));
            }
        }
        self.0.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn off_makes_nothing() {
        let t = Telemetry::off();
        assert!(!t.enabled());
        assert!(t.request(Some(&HeaderValue::from_static(TP))).is_none());
        let t = Telemetry::new(&TracingConfig::default()).expect("no endpoint is fine");
        assert!(!t.enabled());
    }

    #[test]
    fn traceparent_parsing() {
        let p = parent(&HeaderValue::from_static(TP)).expect("valid");
        assert_eq!(p.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(p.span_id().to_string(), "00f067aa0ba902b7");
        assert!(p.is_sampled() && p.is_remote());
        assert_eq!(header_for(&p).to_str().unwrap(), TP);
        // A later version may carry more fields; only the known four are read.
        let future = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-what";
        assert!(
            !parent(&HeaderValue::from_static(future))
                .unwrap()
                .is_sampled()
        );
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "hello",
        ] {
            assert!(parent(&HeaderValue::from_static(bad)).is_none(), "{bad}");
        }
    }

    #[test]
    fn traces_url_gets_the_signal_path_only_when_it_has_none() {
        assert_eq!(
            traces_url("http://c:4318"),
            "http://c:4318/v1/traces".to_string()
        );
        assert_eq!(traces_url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(
            traces_url("http://c:4318/otlp/v1/traces"),
            "http://c:4318/otlp/v1/traces"
        );
    }
}
