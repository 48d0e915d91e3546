//! The route table: config → which path serves which backend (or aggregated endpoint), and the
//! dispatch of a parsed request to a route ([`dispatch`]: a backend's per-backend step, or an
//! endpoint's fan-out). Built once per config generation (startup and every reload go through
//! `RouteTable::build`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use tokio::time::Instant;

use crate::aggregate::{self, Endpoint};
use crate::backend::Backend;
use crate::config::Config;
use crate::error::GatewayError;
use crate::protocol::Envelope;
use crate::step::{self, Core, Exposure, RequestCtx};
use crate::upstream::Reply;

/// What a path serves.
#[derive(Clone)]
pub enum Route {
    Backend(Arc<Backend>),
    /// Several backends as one MCP server (`aggregate`).
    Endpoint(Arc<Endpoint>),
}

impl Route {
    /// The backend name, or the endpoint path: the metrics label and the name in errors.
    pub fn name(&self) -> Arc<str> {
        match self {
            Route::Backend(b) => b.name.clone(),
            Route::Endpoint(e) => e.path.clone(),
        }
    }

    /// Deadline budget of one request on this route (an endpoint: its slowest member's).
    pub fn timeout(&self) -> Duration {
        match self {
            Route::Backend(b) => b.timeout,
            Route::Endpoint(e) => e.timeout,
        }
    }
}

/// Path → route, plus every backend by name.
pub struct RouteTable {
    /// Looked up once per request by the path the client sent: a seeded fast hash instead of
    /// SipHash (~200 instructions a request). Flooding is no concern here: the keys are the
    /// config's paths and a lookup inserts nothing.
    pub routes: HashMap<String, Route, foldhash::fast::RandomState>,
    pub backends: HashMap<String, Arc<Backend>>,
}

/// Why state could not be built from a (valid) config.
#[derive(Debug, thiserror::Error)]
#[error("backend {backend}: {message}")]
pub struct BuildError {
    pub backend: String,
    pub message: String,
}

impl RouteTable {
    pub fn build(config: &Config) -> Result<RouteTable, BuildError> {
        let mut routes = HashMap::default();
        let mut backends = HashMap::new();
        for cfg in &config.backends {
            let backend = Arc::new(Backend::build(cfg).map_err(|message| BuildError {
                backend: cfg.name.clone(),
                message,
            })?);
            routes.insert(
                format!("/mcp/{}", cfg.name),
                Route::Backend(backend.clone()),
            );
            backends.insert(cfg.name.clone(), backend);
        }
        for cfg in &config.endpoints {
            let ep = Endpoint::build(cfg, &backends).map_err(|message| BuildError {
                backend: cfg.path.clone(),
                message,
            })?;
            routes.insert(cfg.path.clone(), Route::Endpoint(Arc::new(ep)));
        }
        Ok(RouteTable { routes, backends })
    }
}

/// A parsed request to a route: a backend's per-backend step, or an aggregated endpoint's
/// dispatch (which takes the same step once per member involved).
pub async fn dispatch(
    core: &Core,
    ctx: &mut RequestCtx,
    route: &Route,
    headers: &HeaderMap,
    env: &Envelope,
    body: Bytes,
    deadline: Instant,
) -> Result<Reply, GatewayError> {
    match route {
        Route::Backend(b) => {
            step::call(core, ctx, b, Exposure::DIRECT, headers, env, body, deadline).await
        }
        Route::Endpoint(ep) => {
            Box::pin(aggregate::answer(
                core, ctx, ep, headers, env, body, deadline,
            ))
            .await
        }
    }
}
