//! The metrics listener (`[metrics] listen`): a second, plain-HTTP listener for operators and
//! orchestrators, kept apart from the client listener so scrapes and probes never compete with
//! MCP traffic or pass through its rules (origin checks, MCP headers).
//!
//! - `GET /metrics`: Prometheus text format (`Metrics::render` over the current state).
//! - `GET /healthz`: liveness: 200 `ok` while the process serves.
//! - `GET /readyz`: readiness: a JSON body with each backend's transport, protocol verdict and
//!   last health check; 200 when at least `metrics.ready_min_backends` backends are up and the
//!   gateway is not draining, else 503.
//! - `GET /status`, `GET /status.json`: the status page (`status`), for people and tools.
//!
//! It also runs the backend health checker (`health::check_all`) every
//! `metrics.health_interval_ms`, on the current config generation.

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use serde_json::json;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::backend::Status;
use crate::config::{DEFAULT_HEALTH_INTERVAL_MS, DEFAULT_HEALTH_TIMEOUT_MS, MetricsConfig};
use crate::health;
use crate::state::State;

/// How long open scrape connections may take to finish once the gateway has stopped.
const CLOSE_GRACE: Duration = Duration::from_secs(1);
/// How often the health checker looks for a new config generation.
const RELOAD_POLL: Duration = Duration::from_millis(250);
/// A scrape must deliver its request head within this time.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Handle on the running metrics listener and health checker.
pub struct Admin {
    draining: Arc<AtomicBool>,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Which operator listener a connection came in on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// `[metrics]`: `/metrics`, `/healthz`, `/readyz`, for scrapers and orchestrators.
    Metrics,
    /// `[admin]`: cache purge and the status page, for people (bearer token when configured).
    Admin,
}

impl Admin {
    /// Starts serving the metrics and/or admin listener, and checking backends.
    pub fn spawn(
        shared: Arc<ArcSwap<State>>,
        metrics: Option<TcpListener>,
        admin: Option<TcpListener>,
    ) -> Admin {
        let draining = Arc::new(AtomicBool::new(false));
        let (stop, stopped) = watch::channel(false);
        let mut tasks = Vec::new();
        for (listener, role) in [(metrics, Role::Metrics), (admin, Role::Admin)] {
            let Some(listener) = listener else { continue };
            if let Ok(addr) = listener.local_addr() {
                match role {
                    Role::Metrics => tracing::info!(%addr, "metrics listening"),
                    Role::Admin => tracing::info!(%addr, "admin listening"),
                }
            }
            tasks.push(tokio::spawn(serve(
                shared.clone(),
                listener,
                role,
                draining.clone(),
                stopped.clone(),
            )));
        }
        tasks.push(tokio::spawn(check_loop(shared, stopped)));
        Admin {
            draining,
            stop,
            tasks,
        }
    }

    /// From now on `/readyz` answers 503 (the gateway is shutting down).
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// Stops the listener and the checker and waits for them.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

fn settings(state: &State) -> (Duration, Duration) {
    let m = state.config.metrics.as_ref();
    (
        Duration::from_millis(m.map_or(DEFAULT_HEALTH_INTERVAL_MS, |m| m.health_interval_ms)),
        Duration::from_millis(m.map_or(DEFAULT_HEALTH_TIMEOUT_MS, |m| m.health_timeout_ms)),
    )
}

/// Checks every backend now, then every interval, until stopped. A reload builds new backends
/// with no health yet, so a new generation is checked at once rather than a whole interval later
/// (readiness would read "unknown" until then).
async fn check_loop(shared: Arc<ArcSwap<State>>, mut stopped: watch::Receiver<bool>) {
    loop {
        let state = shared.load_full();
        let (interval, timeout) = settings(&state);
        tokio::select! {
            _ = health::check_all(state.routes.backends.values(), timeout) => {}
            _ = stopped.changed() => return,
        }
        // Compared by address only: holding the old generation would keep its backends alive.
        let checked = Arc::as_ptr(&state) as usize;
        drop(state);
        let next = tokio::time::Instant::now() + interval;
        loop {
            let wake = next.min(tokio::time::Instant::now() + RELOAD_POLL);
            tokio::select! {
                _ = tokio::time::sleep_until(wake) => {}
                _ = stopped.changed() => return,
            }
            if wake >= next || Arc::as_ptr(&shared.load()) as usize != checked {
                break;
            }
        }
    }
}

async fn serve(
    shared: Arc<ArcSwap<State>>,
    listener: TcpListener,
    role: Role,
    draining: Arc<AtomicBool>,
    mut stopped: watch::Receiver<bool>,
) {
    let graceful = GracefulShutdown::new();
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(error) => {
                    tracing::warn!(%error, "metrics accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stopped.changed() => break,
        };
        let shared = shared.clone();
        let draining = draining.clone();
        let service = service_fn(move |req| {
            let state = shared.load_full();
            let draining = draining.load(Ordering::Relaxed);
            async move {
                Ok::<_, Infallible>(match role {
                    Role::Metrics => route(&state, draining, &req),
                    Role::Admin => admin_route(&state, draining, &req),
                })
            }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .serve_connection(TokioIo::new(tcp), service);
        let watched = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = watched.await;
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(CLOSE_GRACE, graceful.shutdown()).await;
}

fn route(state: &State, draining: bool, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    match req.uri().path() {
        "/metrics" => {
            let mut r = Response::new(Full::new(Bytes::from(
                state.metrics.render(&state.mirrors()),
            )));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            r
        }
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" => readyz(state, draining),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /healthz or /readyz\n",
        ),
    }
}

/// `POST /admin/cache/purge[?backend=NAME]` drops cached entries (all replicas through Redis
/// when configured); `GET /status`, `/status.json` show the status page. With a token
/// configured, every request must carry it (`Authorization: Bearer …`), else 401.
fn admin_route(state: &State, draining: bool, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if let Some(want) = state.config.admin.as_ref().and_then(|a| a.token.as_deref()) {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !same_secret(given, want) {
            let mut r = text(StatusCode::UNAUTHORIZED, "admin token required\n");
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"portico-admin\""),
            );
            return r;
        }
    }
    let path = req.uri().path();
    match path {
        PURGE_PATH if req.method() == Method::POST => purge(state, req.uri().query()),
        PURGE_PATH => method_not_allowed("POST"),
        p if crate::status::is_status_path(p) => {
            if req.method() == Method::GET || req.method() == Method::HEAD {
                crate::status::serve(state, draining, p)
            } else {
                method_not_allowed("GET, HEAD")
            }
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try POST /admin/cache/purge, /status or /status.json\n",
        ),
    }
}

/// Where the cache purge is served (on the admin listener only).
pub const PURGE_PATH: &str = "/admin/cache/purge";

fn purge(state: &State, query: Option<&str>) -> Response<Full<Bytes>> {
    let backend = query.and_then(|q| {
        q.split('&')
            .find_map(|kv| kv.strip_prefix("backend="))
            .map(str::to_owned)
    });
    let purged = match &backend {
        Some(name) => {
            if !state.routes.backends.contains_key(name.as_str()) {
                return json(
                    StatusCode::NOT_FOUND,
                    json!({"error": "no such backend", "backend": name}),
                );
            }
            state.cache.purge_backend(name);
            json!({"purged": "backend", "backend": name})
        }
        None => {
            state.cache.purge_all_replicas();
            json!({"purged": "all"})
        }
    };
    tracing::info!(target: "portico::admin", %purged, "cache purged");
    json(StatusCode::OK, purged)
}

fn json(status: StatusCode, v: serde_json::Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(v.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn method_not_allowed(allow: &'static str) -> Response<Full<Bytes>> {
    let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    r
}

/// Compares two secrets in time independent of where they differ (digests of both).
fn same_secret(given: &str, want: &str) -> bool {
    let d = |s: &str| ring::digest::digest(&ring::digest::SHA256, s.as_bytes());
    let (a, b) = (d(given), d(want));
    a.as_ref()
        .iter()
        .zip(b.as_ref())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// The readiness verdict and its evidence.
fn readyz(state: &State, draining: bool) -> Response<Full<Bytes>> {
    let min = state
        .config
        .metrics
        .as_ref()
        .map_or(MetricsConfig::default().ready_min_backends, |m| {
            m.ready_min_backends
        });
    let mut names: Vec<&String> = state.routes.backends.keys().collect();
    names.sort();
    let mut up = 0;
    let backends: Vec<_> = names
        .into_iter()
        .filter_map(|n| state.routes.backends.get(n))
        .map(|b| {
            let status = b.health.status();
            up += usize::from(status == Status::Up);
            let last = b.health.last();
            json!({
                "name": &*b.name,
                "transport": b.transport().kind(),
                "protocol": b.verdict().label(),
                "status": status.label(),
                "checked_ms_ago": last.as_ref().map(|(ago, _)| ago.as_millis() as u64),
                "error": last.and_then(|(_, why)| why),
            })
        })
        .collect();
    let ready = !draining && up >= min;
    let body = json!({
        "ready": ready,
        "draining": draining,
        "backends_up": up,
        "ready_min_backends": min,
        "backends": backends,
    });
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}
