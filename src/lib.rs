//! portico: an MCP gateway. Clients reach one Streamable HTTP address; portico routes each
//! JSON-RPC message to the right backend, bridges protocol revisions, caches list results and
//! exports Prometheus metrics.
//!
//! The crate is built in layers, each importing only from itself and below (README "Layers";
//! `tests/gateway/layers.rs` enforces it):
//! - L0 leaves: [`config`], [`error`], [`jsonrpc`], [`logsink`], [`metrics`], [`policy`],
//!   [`sse`], [`telemetry`];
//! - L1 vocabulary: [`protocol`], [`frontend`], [`session`];
//! - L2 transports and stores: [`upstream`], [`body`], [`backend`], [`resilience`], [`cache`];
//! - L3 translation: [`bridge`], [`merge`], [`health`], [`invalidation`];
//! - L4 pipeline: [`auth`], [`step`] (the per-backend step), [`aggregate`], [`legacy`],
//!   [`router`], [`state`], [`proxy`] (the request pipeline);
//! - L5 faces: [`server`], [`stdio_front`], [`admin`], [`reload`], and this crate root.
//!
//! Read a request's way in four files: `server/h1/mod.rs` → `proxy.rs` → `step/mod.rs` →
//! `upstream/h1/mod.rs`.

#![forbid(unsafe_code)]

pub mod admin;
pub mod aggregate;
pub mod auth;
pub mod backend;
pub mod body;
pub mod bridge;
pub mod cache;
pub mod config;
pub mod error;
pub mod frontend;
#[doc(hidden)]
pub mod fuzz;
pub mod health;
pub mod invalidation;
pub mod jsonrpc;
pub mod legacy;
pub mod logsink;
pub mod merge;
pub mod metrics;
pub mod param_headers;
pub mod policy;
pub mod pool;
pub mod protocol;
pub mod proxy;
pub mod relay;
pub mod reload;
pub mod resilience;
pub mod router;
pub mod server;
pub mod session;
pub mod sse;
pub mod sse_front;
pub mod state;
pub mod stats;
pub mod status;
pub mod stdio_front;
pub mod step;
pub mod telemetry;
pub mod upstream;

use arc_swap::ArcSwap;
use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;

use config::Config;
use metrics::Metrics;
pub use state::{StartError, State};

/// Listeners the caller has already bound (the tests bind port 0); `None` = bind the configured
/// address when the config has that section.
#[derive(Default)]
pub struct Bound {
    pub metrics: Option<TcpListener>,
    pub admin: Option<TcpListener>,
}

/// Runs the gateway on `listener` until `shutdown` resolves, then drains and returns. The
/// metrics and admin listeners, when configured, are bound from `metrics.listen` and
/// `admin.listen`.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    run_inner(config, None, listener, Bound::default(), shutdown).await
}

/// [`run`], with the metrics listener already bound by the caller (`None`: bind
/// `metrics.listen`; ignored without `[metrics]`).
pub async fn run_with(
    config: Config,
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    let bound = Bound {
        metrics: metrics_listener,
        admin: None,
    };
    run_inner(config, None, listener, bound, shutdown).await
}

/// [`run`], with any operator listeners already bound by the caller. The tests call this.
pub async fn run_with_listeners(
    config: Config,
    listener: TcpListener,
    bound: Bound,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    run_inner(config, None, listener, bound, shutdown).await
}

/// Like [`run`], loading the config from `path` and reloading it on SIGHUP or when the file
/// changes (see [`reload`]). `main` calls this.
pub async fn run_with_reload(
    path: &std::path::Path,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    let config = config::load(path).map_err(|e| StartError::Config(e.to_string()))?;
    run_inner(
        config,
        Some(path.to_path_buf()),
        listener,
        Bound::default(),
        shutdown,
    )
    .await
}

/// Binds `addr` for the listener named `what`, unless the caller bound one.
async fn bind(
    given: Option<TcpListener>,
    addr: Option<&str>,
    what: &'static str,
) -> Result<Option<TcpListener>, StartError> {
    match (addr, given) {
        (None, _) => Ok(None),
        (Some(_), Some(l)) => Ok(Some(l)),
        (Some(a), None) => {
            TcpListener::bind(a)
                .await
                .map(Some)
                .map_err(|source| StartError::Bind {
                    what,
                    addr: a.to_string(),
                    source,
                })
        }
    }
}

async fn run_inner(
    config: Config,
    path: Option<std::path::PathBuf>,
    listener: TcpListener,
    bound: Bound,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    let metrics = Arc::new(Metrics::new());
    let tls = server::tls_acceptor(&config.server).map_err(StartError::Tls)?;
    let metrics_listener = bind(
        bound.metrics,
        config.metrics.as_ref().map(|m| m.listen.as_str()),
        "metrics.listen",
    )
    .await?;
    let admin_listener = bind(
        bound.admin,
        config.admin.as_ref().map(|a| a.listen.as_str()),
        "admin.listen",
    )
    .await?;
    let state = State::build(config, metrics)?;
    let shared = Arc::new(ArcSwap::from_pointee(state));
    let admin = (metrics_listener.is_some() || admin_listener.is_some())
        .then(|| admin::Admin::spawn(shared.clone(), metrics_listener, admin_listener));
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
