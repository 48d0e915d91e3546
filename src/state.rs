//! One config generation: everything a request needs, built from one validated config and
//! swapped atomically on reload (`reload`); a request keeps the generation it started with.
//! [`State`] is the route table over a [`Core`] (what the per-backend step consults), and the
//! pipeline's single exit ([`State::observe`]).

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::frontend::Era;
use crate::metrics::{BackendMirror, Metrics, Mirrors, Record};
use crate::router::{BuildError, RouteTable};
use crate::step::{Core, RequestCtx};
use crate::upstream::Upstream;
use crate::{auth, bridge, cache, health, invalidation, protocol, session, stats, telemetry};

/// Everything a request needs, built from one config generation. Immutable; a reload builds a
/// new one through the same [`State::build`] and swaps it in.
pub struct State {
    pub core: Core,
    pub routes: RouteTable,
    /// Which config generation this is and when it was built (the status page).
    pub generation: stats::Generation,
    /// This generation's tracer (`[tracing]`); off without an OTLP endpoint.
    pub telemetry: telemetry::Telemetry,
}

impl Deref for State {
    type Target = Core;
    fn deref(&self) -> &Core {
        &self.core
    }
}

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error("{0}")]
    Tls(String),
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        what: &'static str,
        addr: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Auth(String),
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Tracing(String),
}

impl State {
    pub fn build(config: Config, metrics: Arc<Metrics>) -> Result<State, StartError> {
        let routes = RouteTable::build(&config)?;
        let sessions = session::Sessions::new(&config.sessions);
        let cache = Arc::new(cache::Cache::new(&config.cache));
        let scheme = if config.server.tls_cert.is_some() {
            "https"
        } else {
            "http"
        };
        let auth = auth::Auth::build(&config.auth, format!("{scheme}://{}", config.server.listen))
            .and_then(|a| a.with_exchanges(&config.backends))
            .map_err(StartError::Auth)?;
        let telemetry = telemetry::Telemetry::new(&config.tracing).map_err(StartError::Tracing)?;
        // Background tasks hold weak references: they end with this generation.
        auth.spawn_refresh();
        for b in routes.backends.values() {
            b.resilience.attach(metrics.backend(&b.name));
            health::spawn_probe(b);
        }
        // After every fallible step: a refused reload does not count as a generation.
        let generation = stats::Generation::next(&metrics);
        Ok(State {
            core: Core {
                config,
                sessions,
                metrics,
                cache,
                watchers: invalidation::Watchers::default(),
                auth,
                calls: Default::default(),
                clients: Default::default(),
            },
            routes,
            generation,
            telemetry,
        })
    }

    /// Ends upstream legacy sessions (`DELETE`) and stops stdio children; exports the spans
    /// still queued.
    pub async fn shutdown(&self) {
        self.watchers.stop();
        for b in self.routes.backends.values() {
            bridge::close(b).await;
            if let Upstream::Stdio(s) = &b.upstream {
                s.shutdown().await;
            }
            if let Upstream::Stdio(s) = b.transport() {
                s.shutdown().await;
            }
        }
        self.telemetry.shutdown().await;
    }

    /// The pipeline's single exit: metrics, the access log line and the end of the request's
    /// span.
    pub fn observe(&self, ctx: &RequestCtx) {
        let method = ctx
            .method
            .as_deref()
            .map(protocol::method_label)
            .unwrap_or("none");
        if let Some(trace) = &ctx.trace {
            trace.finish(&telemetry::Finish {
                method,
                route: ctx.route.as_deref(),
                backend: ctx.backend.as_deref(),
                cache: ctx.cache,
                client_era: ctx.era.map(|e| match e {
                    Era::Modern => "modern",
                    Era::Legacy => "legacy",
                }),
                passthrough: ctx.passthrough,
                status: ctx.status,
                error: ctx.error,
                tool: ctx.tool.as_deref(),
                principal: ctx.principal.as_deref().map(|p| p.id.as_str()),
            });
        }
        let elapsed = ctx.elapsed();
        self.metrics.record(&Record {
            route: ctx.route.as_ref(),
            backend: ctx.backend.as_ref(),
            method,
            status: ctx.status,
            error: ctx.error,
            elapsed,
            upstream: ctx.upstream,
        });
        if self.logs_access() {
            self.access_line(ctx, method, elapsed);
        }
    }

    /// Whether each request gets an access log line.
    pub fn logs_access(&self) -> bool {
        self.config.log.access && crate::logsink::access_enabled()
    }

    /// The access log line: straight into the log buffer (`logsink`), or through `tracing`
    /// when no buffer is installed (portico embedded as a library).
    fn access_line(&self, ctx: &RequestCtx, method: &'static str, elapsed: Duration) {
        let method = if ctx.method.is_some() { method } else { "-" };
        let line = crate::logsink::Access {
            method,
            backend: ctx.route.as_deref().unwrap_or("-"),
            tool: ctx.tool.as_deref().unwrap_or("-"),
            principal: ctx.principal.as_deref().map_or("-", |p| p.id.as_str()),
            team: ctx
                .principal
                .as_deref()
                .and_then(|p| p.team.as_deref())
                .unwrap_or("-"),
            status: ctx.status,
            duration_us: elapsed.as_micros() as u64,
            passthrough: ctx.passthrough,
            cache: ctx.cache.unwrap_or("-"),
            error: ctx.error.unwrap_or(""),
            traceparent: ctx
                .traceparent
                .as_ref()
                .and_then(|v| v.to_str().ok())
                .unwrap_or(""),
        };
        if !crate::logsink::access(&line) {
            tracing::info!(
                target: "portico::access",
                method = line.method,
                backend = line.backend,
                tool = line.tool,
                principal = line.principal,
                team = line.team,
                status = line.status,
                duration_us = line.duration_us,
                passthrough = line.passthrough,
                cache = line.cache,
                error = line.error,
                traceparent = line.traceparent,
            );
        }
    }

    /// What the state-mirroring metrics show now (`/metrics`).
    pub fn mirrors(&self) -> Mirrors<'_> {
        Mirrors {
            backends: self
                .routes
                .backends
                .values()
                .map(|b| BackendMirror {
                    name: &b.name,
                    transport: b.transport().kind(),
                    up: b.health.status() == crate::backend::Status::Up,
                    protocol: b.verdict().label(),
                    restarts: match b.transport() {
                        Upstream::Stdio(s) => Some(s.restarts()),
                        _ => None,
                    },
                    legacy_sessions: b.bridge.session_count() as u64,
                    parked_calls: b.bridge.parked.load(std::sync::atomic::Ordering::Relaxed),
                    parked_expired: b
                        .bridge
                        .parked_expired
                        .load(std::sync::atomic::Ordering::Relaxed),
                })
                .collect(),
            cache: self.cache.stats(),
        }
    }
}
