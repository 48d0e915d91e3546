//! Prometheus metrics. Only this module knows metric and label names; label values are closed
//! sets (method names portico knows, backend and endpoint names from config, fixed outcome and
//! reason words), never raw client input.
//!
//! Two kinds of metric:
//! - **events**, recorded as they happen into the long-lived registry (requests, latencies,
//!   in-flight); they survive config reloads;
//! - **state mirrors** (backend up/protocol, stdio restarts, legacy sessions, cache counters),
//!   read from the current config generation at scrape time ([`Mirrors`], filled by the layer
//!   that owns that state) and rendered by [`Metrics::render`], so they can never drift from
//!   what they mirror and a removed backend's series disappear with it.
//!
//! A leaf: the pipeline reports a finished request as a [`Record`], transports report through
//! the handles and process-wide counters here ([`BackendMetrics`], [`requests_in_flight`],
//! [`lone_connection`]); nothing here reaches up into them.
//!
//! Every metric is documented in deploy/README.md ("Metrics"); a test keeps that table in step.

use prometheus::core::Collector;
use prometheus::proto::MetricFamily;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// One finished request, as the pipeline's single exit reports it.
pub struct Record<'a> {
    /// Backend or endpoint name serving the request (`None`: refused before routing).
    pub route: Option<&'a Arc<str>>,
    /// The backend the request went to.
    pub backend: Option<&'a Arc<str>>,
    /// The MCP method, if read (labelled through `protocol::method_label` by the caller).
    pub method: &'static str,
    pub status: u16,
    /// Failure reason label, if any.
    pub error: Option<&'static str>,
    /// Arrival to response head.
    pub elapsed: Duration,
    /// Time spent waiting for upstream answers.
    pub upstream: Option<Duration>,
}

/// One backend's state at scrape time.
pub struct BackendMirror<'a> {
    pub name: &'a str,
    /// `http`, `stdio` or `builtin`.
    pub transport: &'static str,
    pub up: bool,
    /// `modern`, `legacy` or `unknown`.
    pub protocol: &'static str,
    /// Child restarts (stdio backends only).
    pub restarts: Option<u64>,
    /// Upstream initialize-era sessions open.
    pub legacy_sessions: u64,
    /// Calls parked for a client's input now, and parked calls whose hold ran out.
    pub parked_calls: u64,
    pub parked_expired: u64,
}

/// The state the mirrors render, gathered by the owner of that state (`State::mirrors`).
pub struct Mirrors<'a> {
    pub backends: Vec<BackendMirror<'a>>,
    pub cache: CacheStats,
}

/// The era labels of `portico_backend_protocol`, every one rendered per backend.
pub const PROTOCOL_LABELS: [&str; 3] = ["modern", "legacy", "unknown"];

/// Counter values at one moment, for the metrics layer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Answered from a fresh entry.
    pub hits: u64,
    /// Led an upstream fetch.
    pub misses: u64,
    /// Answered by another caller's concurrent fetch (single flight).
    pub coalesced: u64,
    /// Answered from an expired entry because the re-fetch failed.
    pub stale: u64,
    /// Not eligible at all (cache disabled, retry, non-cacheable method).
    pub bypassed: u64,
    pub inserts: u64,
    /// Removed to stay within `max_bytes` (including entries refused on admission).
    pub evictions: u64,
    /// Entries and bytes held. They settle after moka's maintenance runs, so they may briefly
    /// count an entry that is already expired or invalidated.
    pub entries: u64,
    pub bytes: u64,
    /// Shared tier (`redis_url`): local misses answered from Redis.
    pub redis_hits: u64,
    /// Shared tier: Redis answered, but had nothing usable (absent, invalidated, expired).
    pub redis_misses: u64,
    /// Shared tier: records written.
    pub redis_writes: u64,
    /// Shared tier: calls that failed or overran `redis_timeout_ms` (each one was answered
    /// without Redis).
    pub redis_errors: u64,
    /// Invalidations this replica announced to the others.
    pub redis_published: u64,
    /// Invalidations received from other replicas and applied to the local tier.
    pub redis_received: u64,
}

/// Metric handles for one backend, for the resilience layer to update as events happen.
pub struct BackendMetrics {
    pub breaker_state: IntGauge,
    pub retries: IntCounter,
    pub up: IntGauge,
}

/// Log lines the process's log writer dropped because its queue was full (the writer never
/// blocks a request; `main` installs the reader of its counter).
static LOG_DROPS: OnceLock<Box<dyn Fn() -> u64 + Send + Sync>> = OnceLock::new();

/// Installs what `portico_log_lines_dropped_total` reads (once per process).
pub fn set_log_drops(read: impl Fn() -> u64 + Send + Sync + 'static) {
    let _ = LOG_DROPS.set(Box::new(read));
}

/// Client connections open in this process, on every listener, TLS or not.
static OPEN_CONNECTIONS: AtomicUsize = AtomicUsize::new(0);

/// Whether at most one client connection is open: then no other client's request can be
/// waiting behind the current one, and the upstream path may favour its latency over batching.
pub fn lone_connection() -> bool {
    OPEN_CONNECTIONS.load(Ordering::Relaxed) <= 1
}

/// Counts one client connection for as long as it lives (the listeners hold one per socket).
pub struct OpenConnection(());

impl OpenConnection {
    #[allow(clippy::new_without_default)]
    pub fn new() -> OpenConnection {
        OPEN_CONNECTIONS.fetch_add(1, Ordering::Relaxed);
        OpenConnection(())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        OPEN_CONNECTIONS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Latency buckets in seconds, from 100 µs (a cache hit) to 30 s (a slow tool call).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
];

pub struct Metrics {
    /// Unique per instance (see [`Handles`]).
    id: u64,
    pub registry: Registry,
    requests: IntCounterVec,
    errors: IntCounterVec,
    duration: HistogramVec,
    upstream: HistogramVec,
    in_flight: IntGauge,
    sse_sessions: IntGauge,
    aggregate_omitted: IntCounterVec,
    breaker_state: IntGaugeVec,
    retries: IntCounterVec,
    backend_up: IntGaugeVec,
    reloads: IntCounterVec,
    tool_calls: IntCounterVec,
    tool_duration: HistogramVec,
    listen_streams: IntGaugeVec,
    held_streams: IntGauge,
    stream_resumes: IntCounterVec,
    connection_cap: IntGauge,
    connection_waits: IntCounter,
    token_exchanges: IntCounterVec,
}

/// Counts one open notification stream (a `subscriptions/listen` answer, or an initialize-era
/// client's GET stream) until it drops: when the client leaves, with its upstream streams.
pub struct ListenStream(IntGauge);

impl Drop for ListenStream {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Counts one initialize-era client's SSE stream held for resumption until it drops
/// (`legacy::resume`).
pub struct HeldStream(IntGauge);

impl Drop for HeldStream {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// One tool's series of the per-tool metrics, made on first use and kept by whoever bounds
/// the tool labels (`stats::tools`): a call then costs two atomic updates, with no label
/// hashing. Holds handles of one [`Metrics`] (the one its owner's generation reports to).
#[derive(Default)]
pub struct ToolSeries {
    calls: [OnceLock<IntCounter>; OUTCOMES.len()],
    duration: OnceLock<Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Label sets remembered per thread; past this the memory is cleared and refilled.
const HANDLE_CACHE: usize = 64;

thread_local! {
    /// The metric handles of recently seen label sets. `with_label_values` hashes every label
    /// and takes the vec's lock; on the request path that was a measurable share of the work.
    static HANDLES: std::cell::RefCell<Vec<Handles>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One label set's handles, for one `Metrics` (tests run several in a process).
struct Handles {
    metrics: u64,
    route: Option<Arc<str>>,
    backend: Option<Arc<str>>,
    method: &'static str,
    outcome: &'static str,
    requests: IntCounter,
    duration: Histogram,
    upstream: Option<Histogram>,
}

impl Handles {
    fn serves(&self, metrics: u64, r: &Record<'_>, outcome: &str) -> bool {
        fn same(a: &Option<Arc<str>>, b: Option<&Arc<str>>) -> bool {
            match (a, b) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
                (None, None) => true,
                _ => false,
            }
        }
        self.metrics == metrics
            && self.method == r.method
            && self.outcome == outcome
            && same(&self.route, r.route)
            && same(&self.backend, r.backend)
    }
}

/// Tells `Metrics` instances apart in the per-thread handle cache.
static METRICS_IDS: AtomicU64 = AtomicU64::new(0);

/// Decrements `portico_sse_sessions` when the session's stream is dropped.
pub struct SseSession(IntGauge);

impl Drop for SseSession {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Decrements the in-flight gauge when the request's handler returns (or is dropped).
pub struct InFlight(IntGauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
        IN_FLIGHT.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Requests in flight in this process, across config generations (the gauge above lives in
/// the registry; this is the cheap read the upstream path asks on every request).
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// How many requests this process is serving right now.
pub fn requests_in_flight() -> usize {
    IN_FLIGHT.load(Ordering::Relaxed)
}

fn counter_vec(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition")
}

fn gauge_vec(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    IntGaugeVec::new(Opts::new(name, help), labels).expect("static metric definition")
}

fn histogram_vec(name: &str, help: &str, labels: &[&str]) -> HistogramVec {
    HistogramVec::new(
        HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()),
        labels,
    )
    .expect("static metric definition")
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let requests = counter_vec(
            "portico_requests_total",
            "MCP requests handled, by endpoint, backend, method and outcome.",
            &["endpoint", "backend", "method", "outcome"],
        );
        let errors = counter_vec(
            "portico_request_errors_total",
            "Requests portico answered with an error of its own, by endpoint and reason.",
            &["endpoint", "reason"],
        );
        let duration = histogram_vec(
            "portico_request_duration_seconds",
            "Time from request arrival to response head (an initialize-era client's call \
             answered as a stream before it was done: to the call's own answer), by endpoint \
             and method.",
            &["endpoint", "method"],
        );
        let upstream = histogram_vec(
            "portico_upstream_duration_seconds",
            "Time spent waiting for a backend's answer head, by backend.",
            &["backend"],
        );
        let in_flight = IntGauge::new("portico_in_flight_requests", "Requests being handled now.")
            .expect("static metric definition");
        let sse_sessions = IntGauge::new(
            "portico_sse_sessions",
            "Client sessions open on the 2024-11-05 HTTP+SSE transport (GET <route>/sse).",
        )
        .expect("static metric definition");
        let aggregate_omitted = counter_vec(
            "portico_aggregate_member_omitted_total",
            "Members left out of an aggregated endpoint's answer (failure_mode = open), by \
             endpoint and backend.",
            &["endpoint", "backend"],
        );
        let token_exchanges = counter_vec(
            "portico_token_exchanges_total",
            "Upstream tokens for callers of backends with token_exchange, by backend and outcome \
             (exchanged at the IdP, cached, refused by the IdP, failed).",
            &["backend", "outcome"],
        );
        let build = gauge_vec(
            "portico_build_info",
            "Build information; always 1.",
            &["version"],
        );
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
                "portico_backend_probe_up",
                "Result of the last active resilience probe (backends with health_interval_ms): 1 up, 0 down.",
            ),
            &["backend"],
        )
        .expect("static metric definition");
        let reloads = IntCounterVec::new(
            Opts::new("portico_config_reloads_total", "Config reloads, by result."),
            &["result"],
        )
        .expect("static metric definition");
        let tool_calls = counter_vec(
            "portico_tool_calls_total",
            "tools/call requests per backend and tool (a name the backend listed, else \
             \"other\"), by outcome.",
            &["backend", "tool", "outcome"],
        );
        let tool_duration = histogram_vec(
            "portico_tool_call_duration_seconds",
            "tools/call time from the request's arrival until the answer head, by backend \
             and tool (a listed name, else \"other\").",
            &["backend", "tool"],
        );
        let listen_streams = gauge_vec(
            "portico_listen_streams",
            "Notification streams open for clients (subscriptions/listen, initialize-era GET \
             streams and resource subscriptions), by endpoint.",
            &["endpoint"],
        );
        let connection_cap = IntGauge::new(
            "portico_client_connections_max",
            "Client connections the listener keeps open at once (server.max_connections, or \
             half the open-file limit); past it new ones wait in the listen backlog.",
        )
        .expect("static metric definition");
        let connection_waits = IntCounter::new(
            "portico_connection_limit_waits_total",
            "Times the listener stopped accepting because server.max_connections client \
             connections were open (newcomers waited in the listen backlog).",
        )
        .expect("static metric definition");
        let held_streams = IntGauge::new(
            "portico_resumable_streams",
            "Initialize-era clients' SSE streams held so that a GET with Last-Event-ID can take \
             them up again (with or without a connection reading them).",
        )
        .expect("static metric definition");
        let stream_resumes = counter_vec(
            "portico_stream_resumes_total",
            "GETs with Last-Event-ID from initialize-era clients, by outcome (resumed; \
             forwarded: to the replica the id names; unknown: no such stream held here).",
            &["outcome"],
        );
        // Every series from the start: a rate over a series that appears late misses its first.
        for outcome in ["resumed", "forwarded", "unknown"] {
            stream_resumes.with_label_values(&[outcome]);
        }
        // Both series exist from the start, so dashboards and alerts see 0, not "no data".
        for result in ["ok", "invalid"] {
            reloads.with_label_values(&[result]);
        }
        for c in [
            Box::new(requests.clone()) as Box<dyn Collector>,
            Box::new(errors.clone()),
            Box::new(duration.clone()),
            Box::new(upstream.clone()),
            Box::new(in_flight.clone()),
            Box::new(sse_sessions.clone()),
            Box::new(aggregate_omitted.clone()),
            Box::new(build),
            Box::new(breaker_state.clone()),
            Box::new(retries.clone()),
            Box::new(backend_up.clone()),
            Box::new(reloads.clone()),
            Box::new(tool_calls.clone()),
            Box::new(tool_duration.clone()),
            Box::new(listen_streams.clone()),
            Box::new(held_streams.clone()),
            Box::new(stream_resumes.clone()),
            Box::new(connection_cap.clone()),
            Box::new(connection_waits.clone()),
            Box::new(token_exchanges.clone()),
        ] {
            registry.register(c).expect("metric registered once");
        }
        Metrics {
            id: METRICS_IDS.fetch_add(1, Ordering::Relaxed),
            registry,
            requests,
            errors,
            duration,
            upstream,
            in_flight,
            sse_sessions,
            aggregate_omitted,
            breaker_state,
            retries,
            backend_up,
            reloads,
            tool_calls,
            tool_duration,
            listen_streams,
            held_streams,
            stream_resumes,
            connection_cap,
            connection_waits,
            token_exchanges,
        }
    }

    /// One upstream token for a caller of `backend` (`[backends.token_exchange]`): `outcome`
    /// is `exchanged`, `cached`, `refused` or `failed`.
    pub fn token_exchange(&self, backend: &str, outcome: &'static str) {
        self.token_exchanges
            .with_label_values(&[backend, outcome])
            .inc();
    }

    /// The listener's cap on open client connections.
    pub fn set_connection_cap(&self, cap: usize) {
        self.connection_cap
            .set(i64::try_from(cap).unwrap_or(i64::MAX));
    }

    /// The listener stopped accepting at its cap.
    pub fn connection_limit_reached(&self) {
        self.connection_waits.inc();
    }

    /// Counts an initialize-era client's SSE stream as held (resumable) until the guard drops.
    pub fn held_stream(&self) -> HeldStream {
        self.held_streams.inc();
        HeldStream(self.held_streams.clone())
    }

    /// A `GET` with `Last-Event-ID`: `outcome` is `resumed`, or `unknown` (no such stream here).
    pub fn stream_resume(&self, outcome: &'static str) {
        self.stream_resumes.with_label_values(&[outcome]).inc();
    }

    /// Counts a notification stream of `endpoint` (a config name) as open until the guard drops.
    pub fn listen_stream(&self, endpoint: &str) -> ListenStream {
        let g = self.listen_streams.with_label_values(&[endpoint]);
        g.inc();
        ListenStream(g)
    }

    /// One `tools/call` through the per-backend step. `tool` must come from a bounded set (a
    /// name the backend listed, or `other`): the caller keeps `series` for it.
    pub fn tool_call(
        &self,
        series: &ToolSeries,
        backend: &str,
        tool: &str,
        status: u16,
        took: Duration,
    ) {
        let i = outcome_index(status);
        series.calls[i]
            .get_or_init(|| {
                self.tool_calls
                    .with_label_values(&[backend, tool, OUTCOMES[i]])
            })
            .inc();
        series
            .duration
            .get_or_init(|| self.tool_duration.with_label_values(&[backend, tool]))
            .observe(took.as_secs_f64());
    }

    /// Names this instance among others in one process (a server and its reloads share one).
    pub fn instance(&self) -> u64 {
        self.id
    }

    /// Counts an HTTP+SSE client session as open until the returned guard drops; `None` when
    /// `max` are open already. (Counted first and taken back when over: two racing opens at the
    /// limit may both be refused, never both admitted.)
    pub fn sse_session(&self, max: usize) -> Option<SseSession> {
        self.sse_sessions.inc();
        let session = SseSession(self.sse_sessions.clone());
        (usize::try_from(self.sse_sessions.get()).unwrap_or(usize::MAX) <= max).then_some(session)
    }

    /// Counts a request as in flight until the returned guard drops.
    pub fn in_flight(&self) -> InFlight {
        self.in_flight.inc();
        IN_FLIGHT.fetch_add(1, Ordering::Relaxed);
        InFlight(self.in_flight.clone())
    }

    /// An aggregated endpoint answered without one of its members (labels come from config).
    pub fn aggregate_omitted(&self, endpoint: &str, backend: &str) {
        self.aggregate_omitted
            .with_label_values(&[endpoint, backend])
            .inc();
    }

    /// The per-backend resilience metrics (label values are config backend names).
    pub fn backend(&self, name: &str) -> BackendMetrics {
        BackendMetrics {
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
    pub fn record(&self, r: &Record<'_>) {
        let endpoint = r.route.map(|s| &**s).unwrap_or("none");
        let method = r.method;
        let outcome = outcome(r.status);
        if let Some(reason) = r.error {
            self.errors.with_label_values(&[endpoint, reason]).inc();
        }
        HANDLES.with_borrow_mut(|cache| {
            let i = match cache.iter().position(|h| h.serves(self.id, r, outcome)) {
                Some(i) => i,
                None => {
                    if cache.len() >= HANDLE_CACHE {
                        cache.clear();
                    }
                    let backend = r.backend.map(|s| &**s).unwrap_or("none");
                    cache.push(Handles {
                        metrics: self.id,
                        route: r.route.cloned(),
                        backend: r.backend.cloned(),
                        method,
                        outcome,
                        requests: self
                            .requests
                            .with_label_values(&[endpoint, backend, method, outcome]),
                        duration: self.duration.with_label_values(&[endpoint, method]),
                        upstream: r.backend.map(|b| self.upstream.with_label_values(&[&**b])),
                    });
                    cache.len() - 1
                }
            };
            let h = &cache[i];
            h.requests.inc();
            h.duration.observe(r.elapsed.as_secs_f64());
            if let (Some(up), Some(t)) = (&h.upstream, r.upstream) {
                up.observe(t.as_secs_f64());
            }
        });
    }

    /// The Prometheus text exposition: every event metric, plus the state mirrors as of now.
    pub fn render(&self, mirrors: &Mirrors<'_>) -> Vec<u8> {
        let mut families = self.registry.gather();
        families.extend(state_families(mirrors));
        // The encoder refuses a family without samples (a vec with no children yet).
        families.retain(|f| !f.get_metric().is_empty());
        families.sort_by(|a, b| a.name().cmp(b.name()));
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&families, &mut out);
        out
    }
}

/// The state-mirroring metrics, built fresh from `mirrors`.
fn state_families(mirrors: &Mirrors<'_>) -> Vec<MetricFamily> {
    let up = gauge_vec(
        "portico_backend_up",
        "1 when the backend's last health check succeeded, else 0.",
        &["backend", "transport"],
    );
    let protocol = gauge_vec(
        "portico_backend_protocol",
        "The era a backend was found to speak: 1 for the current one (modern, legacy or unknown).",
        &["backend", "protocol"],
    );
    let restarts = counter_vec(
        "portico_stdio_restarts_total",
        "Restarts of a stdio backend's child process since it was first started.",
        &["backend"],
    );
    let sessions = gauge_vec(
        "portico_legacy_sessions",
        "Upstream sessions open with initialize-era backends.",
        &["backend"],
    );
    let parked = gauge_vec(
        "portico_parked_calls",
        "Calls of initialize-era backends parked for a 2026-07-28 client's answers to the \
         server's requests (elicitation, sampling, roots), each for at most input_hold_ms.",
        &["backend"],
    );
    let parked_expired = counter_vec(
        "portico_parked_expired_total",
        "Parked calls whose hold (input_hold_ms) ran out: the server's request was answered \
         with an error.",
        &["backend"],
    );
    for b in &mirrors.backends {
        let name = b.name;
        parked
            .with_label_values(&[name])
            .set(i64::try_from(b.parked_calls).unwrap_or(i64::MAX));
        parked_expired
            .with_label_values(&[name])
            .inc_by(b.parked_expired);
        up.with_label_values(&[name, b.transport])
            .set(i64::from(b.up));
        for p in PROTOCOL_LABELS {
            protocol
                .with_label_values(&[name, p])
                .set(i64::from(p == b.protocol));
        }
        if let Some(n) = b.restarts {
            restarts.with_label_values(&[name]).inc_by(n);
        }
        sessions
            .with_label_values(&[name])
            .set(i64::try_from(b.legacy_sessions).unwrap_or(i64::MAX));
    }

    let stats = mirrors.cache;
    let lookups = counter_vec(
        "portico_cache_requests_total",
        "Cacheable requests by how the cache answered: hit (local tier), shared_hit (Redis \
         tier), miss, coalesced, stale or bypass.",
        &["outcome"],
    );
    for (outcome, n) in [
        ("hit", stats.hits),
        ("shared_hit", stats.redis_hits),
        ("miss", stats.misses),
        ("coalesced", stats.coalesced),
        ("stale", stats.stale),
        ("bypass", stats.bypassed),
    ] {
        lookups.with_label_values(&[outcome]).inc_by(n);
    }
    let single = |name: &str, help: &str, v: u64, counter: bool| -> Vec<MetricFamily> {
        if counter {
            let c = prometheus::IntCounter::new(name, help).expect("static metric definition");
            c.inc_by(v);
            c.collect()
        } else {
            let g = IntGauge::new(name, help).expect("static metric definition");
            g.set(i64::try_from(v).unwrap_or(i64::MAX));
            g.collect()
        }
    };

    let mut out = Vec::new();
    out.extend(single(
        "portico_client_connections",
        "Client connections open now (every listener, TLS or not).",
        OPEN_CONNECTIONS.load(Ordering::Relaxed) as u64,
        false,
    ));
    if let Some(read) = LOG_DROPS.get() {
        out.extend(single(
            "portico_log_lines_dropped_total",
            "Log lines (access log included) dropped because the log writer's queue was full; \
             the writer never makes a request wait.",
            read(),
            true,
        ));
    }
    out.extend(up.collect());
    out.extend(protocol.collect());
    out.extend(restarts.collect());
    out.extend(sessions.collect());
    out.extend(parked.collect());
    out.extend(parked_expired.collect());
    out.extend(lookups.collect());
    let redis = counter_vec(
        "portico_cache_redis_operations_total",
        "Redis tier operations: hit, miss, write, error (timeouts included), published and \
         received invalidations. All 0 without cache.redis_url.",
        &["op"],
    );
    for (op, n) in [
        ("hit", stats.redis_hits),
        ("miss", stats.redis_misses),
        ("write", stats.redis_writes),
        ("error", stats.redis_errors),
        ("published", stats.redis_published),
        ("received", stats.redis_received),
    ] {
        redis.with_label_values(&[op]).inc_by(n);
    }
    out.extend(redis.collect());
    out.extend(single(
        "portico_cache_inserts_total",
        "Entries stored in the cache.",
        stats.inserts,
        true,
    ));
    out.extend(single(
        "portico_cache_evictions_total",
        "Entries removed (or refused) to stay within cache.max_bytes.",
        stats.evictions,
        true,
    ));
    out.extend(single(
        "portico_cache_entries",
        "Entries held in the cache.",
        stats.entries,
        false,
    ));
    out.extend(single(
        "portico_cache_bytes",
        "Bytes of cached results held (counted against cache.max_bytes).",
        stats.bytes,
        false,
    ));
    out
}

/// The `outcome` label words, by [`outcome_index`].
const OUTCOMES: [&str; 4] = ["ok", "backend_error", "client_error", "error"];

fn outcome(status: u16) -> &'static str {
    OUTCOMES[outcome_index(status)]
}

fn outcome_index(status: u16) -> usize {
    match status {
        200..=299 => 0,
        502 | 504 => 1,
        400..=499 => 2,
        _ => 3,
    }
}
