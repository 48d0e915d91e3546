//! The route table: config → which path serves which backend (or aggregated endpoint), and the
//! per-backend runtime state. Built once per config generation (startup and every reload go
//! through `RouteTable::build`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use crate::aggregate::Endpoint;
use http::{HeaderName, HeaderValue};

use crate::config::{BackendConfig, Config, Protocol};
use crate::demo::Demo;
use crate::upstream::{Upstream, http::HttpUpstream, stdio::StdioUpstream};

/// What a backend has been found to speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not probed yet.
    Unknown = 0,
    Modern = 1,
    Legacy = 2,
}

/// One configured backend.
pub struct Backend {
    pub name: Arc<str>,
    pub cfg: BackendConfig,
    pub upstream: Upstream,
    /// Probe verdict, shared by every request (an atomic: read on the hot path, written rarely).
    verdict: AtomicU8,
    pub timeout: Duration,
    /// Legacy-bridge state: probe lock and the upstream session.
    pub bridge: crate::bridge::BridgeState,
    /// Last health check, for `/readyz` and `portico_backend_up`.
    pub health: crate::health::Health,
    /// Breaker, retry budget, concurrency limit.
    pub resilience: crate::resilience::Resilience,
    /// `team_headers`, parsed: sent upstream (over `headers`) for callers of that team.
    pub team_headers: HashMap<String, Vec<(HeaderName, HeaderValue)>>,
    /// Status page: latency window, in-flight count, last error, tool catalogue.
    pub stats: crate::status::BackendStats,
}

impl Backend {
    pub fn verdict(&self) -> Verdict {
        match self.verdict.load(Ordering::Relaxed) {
            1 => Verdict::Modern,
            2 => Verdict::Legacy,
            _ => Verdict::Unknown,
        }
    }

    pub fn set_verdict(&self, v: Verdict) {
        self.verdict.store(v as u8, Ordering::Relaxed);
    }
}

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
    pub routes: HashMap<String, Route>,
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
        let mut routes = HashMap::new();
        let mut backends = HashMap::new();
        for cfg in &config.backends {
            let err = |message: String| BuildError {
                backend: cfg.name.clone(),
                message,
            };
            let (upstream, verdict) = if let Some(url) = &cfg.url {
                let up = HttpUpstream::new(cfg, url).map_err(err)?;
                let v = match cfg.protocol {
                    Protocol::Modern => Verdict::Modern,
                    Protocol::Legacy => Verdict::Legacy,
                    Protocol::Auto => Verdict::Unknown,
                };
                (Upstream::Http(Arc::new(up)), v)
            } else if let Some(cmd) = &cfg.command {
                let up = StdioUpstream::new(cfg, cmd.clone());
                let v = match cfg.protocol {
                    Protocol::Modern => Verdict::Modern,
                    Protocol::Legacy => Verdict::Legacy,
                    Protocol::Auto => Verdict::Unknown,
                };
                (Upstream::Stdio(Arc::new(up)), v)
            } else {
                (Upstream::Builtin(Demo), Verdict::Modern)
            };
            let mut team_headers = HashMap::new();
            for (team, headers) in &cfg.team_headers {
                let mut parsed = Vec::with_capacity(headers.len());
                for (k, v) in headers {
                    let name =
                        HeaderName::from_bytes(k.as_bytes()).map_err(|e| err(e.to_string()))?;
                    let value = HeaderValue::from_str(v).map_err(|e| err(e.to_string()))?;
                    parsed.push((name, value));
                }
                team_headers.insert(team.clone(), parsed);
            }
            let backend = Arc::new(Backend {
                name: cfg.name.as_str().into(),
                cfg: cfg.clone(),
                upstream,
                verdict: AtomicU8::new(verdict as u8),
                timeout: Duration::from_millis(cfg.timeout_ms),
                bridge: Default::default(),
                health: Default::default(),
                resilience: crate::resilience::Resilience::new(cfg),
                team_headers,
                stats: Default::default(), // status page
            });
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
