//! Prometheus metrics. Only this module knows metric and label names; label values are closed
//! sets (method names portico knows, backend names from config, fixed outcome words), never raw
//! client input.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

use crate::proxy::RequestCtx;

/// Latency buckets in seconds, from 100 µs (a cache hit) to 30 s (a slow tool call).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
];

pub struct Metrics {
    pub registry: Registry,
    requests: IntCounterVec,
    duration: HistogramVec,
    pub in_flight: IntGauge,
    breaker_state: IntGaugeVec,
    retries: IntCounterVec,
    backend_up: IntGaugeVec,
    reloads: IntCounterVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "portico_requests_total",
                "MCP requests handled, by endpoint, method and outcome.",
            ),
            &["endpoint", "method", "outcome"],
        )
        .expect("static metric definition");
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "portico_request_duration_seconds",
                "Time from request arrival to response head, by endpoint and method.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["endpoint", "method"],
        )
        .expect("static metric definition");
        let in_flight = IntGauge::new("portico_in_flight_requests", "Requests being handled now.")
            .expect("static metric definition");
        let build = IntGaugeVec::new(
            Opts::new("portico_build_info", "Build information; always 1."),
            &["version"],
        )
        .expect("static metric definition");
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        let breaker_state = IntGaugeVec::new(
            Opts::new(
                "portico_backend_circuit_state",
                "Circuit breaker per backend: 0 closed, 1 open, 2 half-open.",
            ),
            &["backend"],
        )
        .expect("static metric definition");
        let retries = IntCounterVec::new(
            Opts::new(
                "portico_backend_retries_total",
                "Retries of idempotent requests after a connect failure.",
            ),
            &["backend"],
        )
        .expect("static metric definition");
        let backend_up = IntGaugeVec::new(
            Opts::new(
                "portico_backend_up",
                "Result of the last active health probe: 1 up, 0 down.",
            ),
            &["backend"],
        )
        .expect("static metric definition");
        let reloads = IntCounterVec::new(
            Opts::new("portico_config_reloads_total", "Config reloads, by result."),
            &["result"],
        )
        .expect("static metric definition");
        for c in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(duration.clone()),
            Box::new(in_flight.clone()),
            Box::new(build),
            Box::new(breaker_state.clone()),
            Box::new(retries.clone()),
            Box::new(backend_up.clone()),
            Box::new(reloads.clone()),
        ] {
            registry.register(c).expect("metric registered once");
        }
        Metrics {
            registry,
            requests,
            duration,
            in_flight,
            breaker_state,
            retries,
            backend_up,
            reloads,
        }
    }

    /// The per-backend resilience metrics (label values are config backend names).
    pub fn backend(&self, name: &str) -> crate::resilience::BackendMetrics {
        crate::resilience::BackendMetrics {
            breaker_state: self.breaker_state.with_label_values(&[name]),
            retries: self.retries.with_label_values(&[name]),
            up: self.backend_up.with_label_values(&[name]),
        }
    }

    /// Counts a reload attempt (`ok` or `invalid`).
    pub fn reload(&self, ok: bool) {
        self.reloads
            .with_label_values(&[if ok { "ok" } else { "invalid" }])
            .inc();
    }

    /// The single exit of the request pipeline reports here.
    pub fn record(&self, ctx: &RequestCtx) {
        let endpoint = ctx.route.as_deref().unwrap_or("none");
        let method = ctx
            .method
            .as_deref()
            .map(crate::protocol::method_label)
            .unwrap_or("none");
        let outcome = outcome(ctx);
        self.requests
            .with_label_values(&[endpoint, method, outcome])
            .inc();
        self.duration
            .with_label_values(&[endpoint, method])
            .observe(ctx.elapsed().as_secs_f64());
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}

fn outcome(ctx: &RequestCtx) -> &'static str {
    match ctx.status {
        200..=299 => "ok",
        502 | 504 => "backend_error",
        400..=499 => "client_error",
        _ => "error",
    }
}
