//! portico: an MCP gateway. Clients reach one Streamable HTTP address; portico routes each
//! JSON-RPC message to the right backend, bridges protocol revisions, caches list results and
//! exports Prometheus metrics.
//!
//! Crate map (read in this order):
//! - [`config`]: TOML → validated `Config` (load → parse → validate).
//! - [`server`]: listener, TLS, hyper, graceful shutdown.
//! - [`proxy`]: the request pipeline — every phase in order, one exit.
//! - [`frontend`]: client-facing Streamable HTTP rules, header-first.
//! - [`bridge`]: initialize-era *backends* made to look modern (probe, sessions, translation).
//! - [`cache`]: the shared list cache (`ttlMs`/`cacheScope`); [`invalidation`] keeps it honest
//!   with each backend's change notifications.
//! - [`legacy`]: initialize-era *clients* served on the same endpoints; [`session`] seals their
//!   session ids.
//! - [`protocol`]: MCP/JSON-RPC vocabulary and the cheap envelope parser (pure).
//! - [`router`]: path → backend or endpoint, per-backend state.
//! - [`aggregate`]: `[[endpoints]]` — several backends served as one MCP server.
//! - [`upstream`]: how backends are reached (HTTP pool, stdio child, built-in).
//! - [`demo`]: the built-in demo backend.
//! - [`auth`]: who is calling (API keys, JWT), team policy, rate limits, resource metadata.
//! - [`resilience`]: circuit breaker, retry budget, concurrency limit, health probe.
//! - [`reload`]: hot reload on SIGHUP and config-file change.
//! - [`error`]: `GatewayError`, the only builder of error responses.
//! - [`metrics`]: Prometheus registry; the only place metric names live.
//! - [`stdio_front`]: `portico stdio`, the same pipeline for clients that speak stdio.
//! - [`admin`]: the metrics listener (`/metrics`, `/healthz`, `/readyz`); [`health`] checks
//!   backends for it.
//! - [`body`], [`sse`]: response body type; SSE decoding.

#![forbid(unsafe_code)]

pub mod admin;
pub mod aggregate;
pub mod auth;
pub mod body;
pub mod bridge;
pub mod cache;
pub mod config;
pub mod demo;
pub mod error;
pub mod frontend;
#[doc(hidden)]
pub mod fuzz;
pub mod health;
pub mod invalidation;
pub mod legacy;
pub mod metrics;
pub mod protocol;
pub mod proxy;
pub mod reload;
pub mod resilience;
pub mod router;
pub mod server;
pub mod session;
pub mod sse;
pub mod status; // status page (/status, /status.json)
pub mod stdio_front;
pub mod upstream;

use arc_swap::ArcSwap;
use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;

use config::Config;
use metrics::Metrics;
use router::RouteTable;

/// Everything a request needs, built from one config generation. Immutable; a reload builds a
/// new one through the same `State::build` and swaps it in.
pub struct State {
    pub config: Config,
    pub routes: RouteTable,
    /// Seals and opens legacy-client session ids.
    pub sessions: session::Sessions,
    /// Outlives config generations, so counters survive reloads.
    pub metrics: Arc<Metrics>,
    /// The shared list cache of this generation (a reload starts empty: the config that
    /// shaped the entries may have changed).
    pub cache: Arc<cache::Cache>,
    /// Change-notification streams that keep `cache` honest.
    pub watchers: invalidation::Watchers,
    /// Authentication, team policy and rate limits.
    pub auth: auth::Auth,
    /// Status page: which config generation this is and when it was built.
    pub generation: status::Generation,
}

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Build(#[from] router::BuildError),
    #[error("{0}")]
    Tls(String),
    #[error("cannot listen on {addr} (metrics.listen): {source}")]
    MetricsBind {
        addr: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Auth(String),
    #[error("{0}")]
    Config(String),
}

impl State {
    pub fn build(config: Config, metrics: Arc<Metrics>) -> Result<State, StartError> {
        let routes = RouteTable::build(&config)?;
        let sessions = session::Sessions::new(&config.sessions);
        let cache = Arc::new(cache::Cache::new(&config.cache));
        let auth = auth::Auth::build(&config.auth).map_err(StartError::Auth)?;
        // Background tasks hold weak references: they end with this generation.
        auth.spawn_refresh();
        for b in routes.backends.values() {
            b.resilience.attach(metrics.backend(&b.name));
            resilience::spawn_probe(b);
        }
        let generation = status::Generation::next(&metrics); // status page: after every fallible step
        Ok(State {
            config,
            routes,
            sessions,
            metrics,
            cache,
            watchers: invalidation::Watchers::default(),
            auth,
            generation, // status page
        })
    }

    /// Ends upstream legacy sessions (`DELETE`) and stops stdio children.
    pub async fn shutdown(&self) {
        self.watchers.stop();
        for b in self.routes.backends.values() {
            bridge::close(b).await;
            if let upstream::Upstream::Stdio(s) = &b.upstream {
                s.shutdown().await;
            }
        }
    }

    /// The pipeline's single exit: metrics and the access log line.
    pub fn observe(&self, ctx: &proxy::RequestCtx) {
        self.metrics.record(ctx);
        status::observe(self, ctx); // status page: per-backend latency window, last error
        if self.config.log.access {
            tracing::info!(
                target: "portico::access",
                method = ctx.method.as_deref().map(protocol::method_label).unwrap_or("-"),
                backend = ctx.route.as_deref().unwrap_or("-"),
                status = ctx.status,
                duration_us = ctx.elapsed().as_micros() as u64,
                passthrough = ctx.passthrough,
                cache = ctx.cache.unwrap_or("-"),
                error = ctx.error.unwrap_or(""),
                traceparent = ctx.traceparent.as_ref().and_then(|v| v.to_str().ok()).unwrap_or(""),
            );
        }
    }
}

/// Runs the gateway on `listener` until `shutdown` resolves, then drains and returns. The
/// metrics listener, when `[metrics]` is configured, is bound from `metrics.listen`.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    run_inner(config, None, listener, None, shutdown).await
}

/// [`run`], with the metrics listener already bound by the caller (`None`: bind
/// `metrics.listen`; ignored without `[metrics]`). The tests call this.
pub async fn run_with(
    config: Config,
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    run_inner(config, None, listener, metrics_listener, shutdown).await
}

/// Like [`run`], loading the config from `path` and reloading it on SIGHUP or when the file
/// changes (see [`reload`]). `main` calls this.
pub async fn run_with_reload(
    path: &std::path::Path,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    let config = config::load(path).map_err(|e| StartError::Config(e.to_string()))?;
    run_inner(config, Some(path.to_path_buf()), listener, None, shutdown).await
}

async fn run_inner(
    config: Config,
    path: Option<std::path::PathBuf>,
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    let metrics = Arc::new(Metrics::new());
    let tls = server::tls_acceptor(&config.server).map_err(StartError::Tls)?;
    let admin_listener =
        match (&config.metrics, metrics_listener) {
            (None, _) => None,
            (Some(_), Some(l)) => Some(l),
            (Some(m), None) => Some(TcpListener::bind(&m.listen).await.map_err(|source| {
                StartError::MetricsBind {
                    addr: m.listen.clone(),
                    source,
                }
            })?),
        };
    let state = State::build(config, metrics)?;
    let shared = Arc::new(ArcSwap::from_pointee(state));
    let admin = admin_listener.map(|l| admin::Admin::spawn(shared.clone(), l));
    let watcher = path.map(|p| tokio::spawn(reload::watch(p, shared.clone())));
    // Readiness turns false as soon as shutdown begins, so load balancers stop sending new
    // requests while in-flight ones drain; /metrics keeps answering until the drain is over.
    let draining = async {
        shutdown.await;
        if let Some(a) = &admin {
            a.set_draining();
        }
    };
    server::serve(shared.clone(), listener, tls, draining).await;
    if let Some(w) = watcher {
        w.abort();
    }
    if let Some(a) = admin {
        a.stop().await;
    }
    shared.load().shutdown().await;
    Ok(())
}
