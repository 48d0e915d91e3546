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
//! - [`legacy`]: initialize-era *clients* served on the same endpoints; [`session`] seals their
//!   session ids.
//! - [`protocol`]: MCP/JSON-RPC vocabulary and the cheap envelope parser (pure).
//! - [`router`]: path → backend, per-backend state.
//! - [`upstream`]: how backends are reached (HTTP pool, stdio child, built-in).
//! - [`demo`]: the built-in demo backend.
//! - [`auth`]: who is calling (API keys, JWT), team policy, rate limits, resource metadata.
//! - [`resilience`]: circuit breaker, retry budget, concurrency limit, health probe.
//! - [`reload`]: hot reload on SIGHUP and config-file change.
//! - [`error`]: `GatewayError`, the only builder of error responses.
//! - [`metrics`]: Prometheus registry; the only place metric names live.
//! - [`body`], [`sse`]: response body type; SSE decoding.

#![forbid(unsafe_code)]

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
    /// Authentication, team policy and rate limits.
    pub auth: auth::Auth,
}

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Build(#[from] router::BuildError),
    #[error("{0}")]
    Tls(String),
    #[error("{0}")]
    Auth(String),
    #[error("{0}")]
    Config(String),
}

impl State {
    pub fn build(config: Config, metrics: Arc<Metrics>) -> Result<State, StartError> {
        let routes = RouteTable::build(&config)?;
        let sessions = session::Sessions::new(&config.sessions);
        let auth = auth::Auth::build(&config.auth).map_err(StartError::Auth)?;
        // Background tasks hold weak references: they end with this generation.
        auth.spawn_refresh();
        for b in routes.backends.values() {
            b.resilience.attach(metrics.backend(&b.name));
            resilience::spawn_probe(b);
        }
        Ok(State {
            config,
            routes,
            sessions,
            metrics,
            auth,
        })
    }

    /// Ends upstream legacy sessions (`DELETE`) and stops stdio children.
    pub async fn shutdown(&self) {
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
        if self.config.log.access {
            tracing::info!(
                target: "portico::access",
                method = ctx.method.as_deref().map(protocol::method_label).unwrap_or("-"),
                backend = ctx.route.as_deref().unwrap_or("-"),
                status = ctx.status,
                duration_us = ctx.elapsed().as_micros() as u64,
                passthrough = ctx.passthrough,
                error = ctx.error.unwrap_or(""),
            );
        }
    }
}

/// Runs the gateway on `listener` until `shutdown` resolves, then drains and returns.
/// `main` and the tests both call this.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    run_inner(config, None, listener, shutdown).await
}

/// Like [`run`], loading the config from `path` and reloading it on SIGHUP or when the file
/// changes (see [`reload`]).
pub async fn run_with_reload(
    path: &std::path::Path,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    let config = config::load(path).map_err(|e| StartError::Config(e.to_string()))?;
    run_inner(config, Some(path.to_path_buf()), listener, shutdown).await
}

async fn run_inner(
    config: Config,
    path: Option<std::path::PathBuf>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    let metrics = Arc::new(Metrics::new());
    let tls = server::tls_acceptor(&config.server).map_err(StartError::Tls)?;
    let state = State::build(config, metrics)?;
    let shared = Arc::new(ArcSwap::from_pointee(state));
    let watcher = path.map(|p| tokio::spawn(reload::watch(p, shared.clone())));
    server::serve(shared.clone(), listener, tls, shutdown).await;
    if let Some(w) = watcher {
        w.abort();
    }
    shared.load().shutdown().await;
    Ok(())
}
