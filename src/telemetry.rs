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
//! is followed), and traces that start here are kept at `sampling_ratio`. That decision is made
//! here, before the SDK is asked for anything: an unsampled request is only ids (a trace id, and
//! a span id per upstream attempt, so the backend sees a consistent `traceparent` with flag
//! `00`); no span is built, named or given attributes for it, so a low ratio costs little on the
//! requests it does not keep (README, "Traces", has the benchmark figures). The SDK's own
//! sampler is therefore parent-based over "always": it only sees requests already kept.

use http::HeaderValue;
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{
    IdGenerator, RandomIdGenerator, Sampler, SdkTracer, SdkTracerProvider, Span,
};
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
    /// `sampling_ratio`, for traces that start here.
    ratio: f64,
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
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)))
            .with_resource(
                Resource::builder_empty()
                    .with_service_name(cfg.service_name.clone())
                    .build(),
            )
            .build();
        let tracer = provider.tracer(SCOPE);
        Ok(Telemetry {
            inner: Some(Inner {
                provider,
                tracer,
                ratio: cfg.sampling_ratio,
            }),
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
        Some(Trace::start(inner, traceparent))
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

/// Whether a trace that starts here is kept at `ratio`, given a uniformly random `draw`.
fn keep(ratio: f64, draw: u64) -> bool {
    // The top 53 bits as a fraction in [0, 1): exact in an f64.
    let fraction = (draw >> 11) as f64 / (1u64 << 53) as f64;
    ratio >= 1.0 || fraction < ratio
}

/// The `traceparent` naming `cx` as the parent (version 00): 55 bytes written directly, since
/// it is built for every upstream attempt of every traced request (through `format!` and the
/// ids' `Display` it cost about as much as the rest of an unsampled request's tracing).
fn header_for(cx: &SpanContext) -> HeaderValue {
    fn hex(out: &mut Vec<u8>, bytes: &[u8]) {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        for b in bytes {
            out.push(DIGITS[usize::from(b >> 4)]);
            out.push(DIGITS[usize::from(b & 0x0f)]);
        }
    }
    let mut v = Vec::with_capacity(55);
    v.extend_from_slice(b"00-");
    hex(&mut v, &cx.trace_id().to_bytes());
    v.push(b'-');
    hex(&mut v, &cx.span_id().to_bytes());
    v.push(b'-');
    hex(&mut v, &[cx.trace_flags().to_u8()]);
    HeaderValue::from_maybe_shared(bytes::Bytes::from(v))
        .unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// A request's trace: its server span and what child spans need, or, for a request that is
/// not sampled, only its ids. Cloning is cheap and shares the span (an aggregated endpoint's
/// concurrent parts each hold a clone); only the pipeline's exit finishes it
/// ([`Trace::finish`]). A request dropped before its exit ends the span unfinished when the
/// last clone goes.
#[derive(Clone)]
pub struct Trace(Kept);

#[derive(Clone)]
enum Kept {
    Sampled(Arc<TraceInner>),
    /// Not sampled: the trace id (the client's, or a new one) and its flags.
    Quiet(TraceId, TraceFlags),
}

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
    /// The tool a `tools/call` named, as the client named it.
    pub tool: Option<&'a str>,
    /// The authenticated principal.
    pub principal: Option<&'a str>,
}

impl Trace {
    fn start(inner: &Inner, traceparent: Option<&HeaderValue>) -> Trace {
        let ids = RandomIdGenerator::default();
        let parent_cx = match traceparent.and_then(parent) {
            Some(remote) if !remote.is_sampled() => {
                return Trace(Kept::Quiet(remote.trace_id(), remote.trace_flags()));
            }
            Some(remote) => Context::new().with_remote_span_context(remote),
            None if !keep(
                inner.ratio,
                u64::from_be_bytes(ids.new_span_id().to_bytes()),
            ) =>
            {
                return Trace(Kept::Quiet(ids.new_trace_id(), TraceFlags::default()));
            }
            None => Context::new(),
        };
        let tracer = &inner.tracer;
        let span = tracer
            .span_builder("mcp")
            .with_kind(SpanKind::Server)
            .start_with_context(tracer, &parent_cx);
        Trace(Kept::Sampled(Arc::new(TraceInner {
            tracer: tracer.clone(),
            cx: parent_cx.with_span(span),
            bridged: AtomicBool::new(false),
        })))
    }

    /// Notes that the request (or a part of it) was translated for an initialize-era backend.
    pub fn bridged(&self) {
        if let Kept::Sampled(t) = &self.0 {
            t.bridged.store(true, Ordering::Relaxed);
        }
    }

    /// Starts a client span for one upstream attempt: `kind` is `pass_through`, `message` or
    /// `bridge`; `attempt` counts from 1 within the step's retry loop.
    pub fn attempt(&self, backend: &str, kind: &'static str, attempt: u32) -> Attempt {
        let t = match &self.0 {
            Kept::Sampled(t) => t,
            Kept::Quiet(trace_id, flags) => {
                return Attempt(Child::Ids(SpanContext::new(
                    *trace_id,
                    RandomIdGenerator::default().new_span_id(),
                    *flags,
                    false,
                    TraceState::default(),
                )));
            }
        };
        let (cx, t) = (&t.cx, &t.tracer);
        let span = t
            .span_builder(format!("upstream {kind}"))
            .with_kind(SpanKind::Client)
            .with_attributes([
                KeyValue::new("portico.backend", backend.to_string()),
                KeyValue::new("portico.upstream", kind),
                KeyValue::new("portico.attempt", i64::from(attempt)),
            ])
            .start_with_context(t, cx);
        Attempt(Child::Span(Box::new(span)))
    }

    /// Ends the request span with what the request became. Called by the pipeline's single
    /// exit, once.
    pub fn finish(&self, f: &Finish<'_>) {
        let Kept::Sampled(t) = &self.0 else {
            return;
        };
        let span = t.cx.span();
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
            KeyValue::new("portico.bridged", t.bridged.load(Ordering::Relaxed)),
            KeyValue::new("portico.passthrough", f.passthrough),
        ];
        let optional = [
            ("portico.route", f.route),
            ("portico.backend", f.backend),
            ("portico.cache", f.cache),
            ("portico.client_era", f.client_era),
            ("error.type", f.error),
            // OpenTelemetry's GenAI and general conventions for the tool and the caller.
            ("gen_ai.tool.name", f.tool),
            ("enduser.id", f.principal),
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
pub struct Attempt(Child);

/// A recorded attempt span, or only the ids of one that is not sampled.
enum Child {
    Span(Box<Span>),
    Ids(SpanContext),
}

impl Attempt {
    /// The `traceparent` the upstream request carries: this span as the backend's parent.
    pub fn traceparent(&self) -> HeaderValue {
        header_for(match &self.0 {
            Child::Span(span) => span.span_context(),
            Child::Ids(cx) => cx,
        })
    }

    /// Ends the span: the backend's HTTP status when it answered (`None` for transports
    /// without one), or portico's reason word for the failure.
    pub fn end(self, outcome: Result<Option<u16>, &str>) {
        let Child::Span(mut span) = self.0 else {
            return;
        };
        match outcome {
            Ok(status) => {
                if let Some(s) = status {
                    span.set_attribute(KeyValue::new("http.response.status_code", i64::from(s)));
                    if s >= 500 {
                        span.set_status(Status::error(""));
                    }
                }
            }
            Err(reason) => {
                span.set_attribute(KeyValue::new("error.type", reason.to_string()));
                span.set_status(Status::error(reason.to_string()));
            }
        }
        span.end();
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
    fn the_ratio_keeps_its_share_of_draws() {
        assert!(!keep(0.0, 0) && !keep(0.0, u64::MAX));
        assert!(keep(1.0, 0) && keep(1.0, u64::MAX));
        assert!(keep(0.5, 0) && keep(0.5, u64::MAX / 2 - 4096));
        assert!(!keep(0.5, u64::MAX / 2 + 4096) && !keep(0.5, u64::MAX));
        // Draws spread evenly (the middle of each thousandth): the share kept is the ratio.
        let kept = (0..1000u64)
            .filter(|i| keep(0.01, i * (u64::MAX / 1000) + u64::MAX / 2000))
            .count();
        assert_eq!(kept, 10);
    }

    #[test]
    fn an_unsampled_request_is_only_ids() {
        let cfg = TracingConfig {
            otlp_endpoint: Some("http://127.0.0.1:9/v1/traces".into()),
            sampling_ratio: 0.0,
            ..TracingConfig::default()
        };
        let t = Telemetry::new(&cfg).expect("exporter");
        let fields = |tp: &HeaderValue| -> Vec<String> {
            tp.to_str()
                .unwrap()
                .split('-')
                .map(str::to_string)
                .collect()
        };
        // Starting here at ratio 0, and a client's unsampled trace: no span, fresh span ids
        // in the request's trace, flag 00.
        for tp in [None, Some(TP.replace("-01", "-00"))] {
            let hv = tp.as_deref().map(HeaderValue::from_str).map(Result::unwrap);
            let trace = t.request(hv.as_ref()).expect("tracing on");
            assert!(matches!(trace.0, Kept::Quiet(..)));
            let (a, b) = (
                trace.attempt("b", "pass_through", 1),
                trace.attempt("b", "message", 2),
            );
            let (a, b) = (fields(&a.traceparent()), fields(&b.traceparent()));
            assert_eq!((a[0].as_str(), a[3].as_str()), ("00", "00"), "{a:?}");
            assert_eq!(a[1], b[1], "one trace");
            assert_ne!(a[2], b[2], "a span id per attempt");
            if tp.is_some() {
                assert_eq!(a[1], "4bf92f3577b34da6a3ce929d0e0e4736");
                assert_ne!(a[2], "00f067aa0ba902b7");
            }
        }
        // A client's sampled trace is recorded whatever the ratio.
        let trace = t.request(Some(&HeaderValue::from_static(TP))).expect("on");
        assert!(matches!(trace.0, Kept::Sampled(..)));
        let a = fields(&trace.attempt("b", "pass_through", 1).traceparent());
        assert_eq!(
            (a[1].as_str(), a[3].as_str()),
            ("4bf92f3577b34da6a3ce929d0e0e4736", "01")
        );
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
