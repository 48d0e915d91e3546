//! The status page on the metrics listener: `GET /status` (HTML for people) and
//! `GET /status.json` (the same snapshot for tools), read-only.
//!
//! One [`Snapshot`] is built from the current [`State`] per request and rendered either way, so
//! the two can never disagree. Its numbers come from the same sources `/metrics` reads (health,
//! breaker, cache counters, legacy sessions), so a dashboard and this page agree too.
//!
//! What this module adds to the gateway is small and off the hot path's critical parts:
//! - [`BackendStats`] per backend: a 5-minute latency [`window`], requests in flight, the last
//!   failed upstream exchange, and the tool [`catalogue`]. Fed by three one-line hooks:
//!   [`observe`] at the pipeline's single exit (`State::observe`), [`busy`] next to the
//!   per-backend admission in `proxy`, and the catalogue's own lazy fetch.
//! - [`Generation`]: which config generation is serving and when it was built.
//!
//! Requests to an aggregated endpoint are counted under the endpoint, not per member — the
//! same scope as `portico_upstream_duration_seconds{backend}`, which also only sees requests
//! on a backend's own route.
//!
//! Files: `window` (the latency window), `catalogue` (tools and who sees them), `page` (HTML).

mod catalogue;
mod page;
pub use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::Full;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::backend::Backend;
use crate::config::{AuthMode, FailureMode};
use crate::resilience::BreakerState;
use crate::router::Route;
use crate::state::State;
use crate::stats::window;
use crate::upstream::Upstream;

pub use catalogue::Visibility;

/// The page's own refresh interval (`<meta http-equiv="refresh">`), in seconds.
pub const REFRESH_SECS: u32 = 5;

/// The status page's policy: nothing may load or run; only the inline stylesheet and data
/// URLs (the favicon) are allowed. The page needs no script, so none is permitted.
pub const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; \
                       base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

// === The snapshot ===

/// Everything the page shows, built from one `State` at one moment. Serialized as
/// `/status.json`; rendered as `/status`.
#[derive(Serialize)]
pub struct Snapshot {
    pub version: &'static str,
    pub generated_at_unix_ms: u64,
    /// Shutting down: `/readyz` answers 503.
    pub draining: bool,
    pub config: ConfigInfo,
    /// `none`, `api_keys` or `jwt`.
    pub auth_mode: &'static str,
    /// Configured team names (`[[auth.teams]]`), in config order.
    pub teams: Vec<String>,
    pub backends_up: usize,
    pub backends: Vec<BackendInfo>,
    pub endpoints: Vec<EndpointInfo>,
    pub cache: CacheInfo,
    pub sessions: SessionInfo,
}

#[derive(Serialize)]
pub struct ConfigInfo {
    pub generation: u64,
    pub built_at_unix_ms: u64,
    pub age_ms: u64,
    /// When this generation replaced another (a reload); `None` for the startup config.
    pub last_reload_unix_ms: Option<u64>,
}

#[derive(Serialize)]
pub struct BackendInfo {
    pub name: String,
    /// `modern`, `legacy` or `unknown` (as `portico_backend_protocol`).
    pub protocol: &'static str,
    /// `http`, `stdio` or `builtin`.
    pub transport: &'static str,
    pub health: HealthInfo,
    pub breaker: BreakerInfo,
    /// Requests admitted to this backend whose response head is not out yet.
    pub in_flight: usize,
    pub max_concurrent: usize,
    pub latency: LatencyInfo,
    pub last_error: Option<ErrorInfo>,
    /// Upstream initialize-era sessions open, one per client (as `portico_legacy_sessions`).
    pub legacy_sessions: u64,
    /// Calls parked for a 2026-07-28 client's answers (as `portico_parked_calls`).
    pub parked_calls: u64,
    /// stdio backends: child restarts (as `portico_stdio_restarts_total`).
    pub stdio_restarts: Option<u64>,
    pub allow_teams: Vec<String>,
    pub tools: ToolsInfo,
}

#[derive(Serialize)]
pub struct HealthInfo {
    /// `up`, `down` or `unknown` (not checked yet); `up` ⇔ `portico_backend_up` = 1.
    pub status: &'static str,
    pub checked_ms_ago: Option<u64>,
    pub error: Option<String>,
}

#[derive(Serialize)]
pub struct BreakerInfo {
    /// `closed`, `open` or `half_open`.
    pub state: &'static str,
    /// The `portico_backend_circuit_state` value: 0 closed, 1 open, 2 half-open.
    pub value: u8,
    /// `breaker_failures` (0 = no breaker).
    pub failures_to_open: u32,
}

#[derive(Serialize)]
pub struct LatencyInfo {
    pub window_s: u64,
    pub slot_s: u64,
    pub requests: u64,
    pub errors: u64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// Oldest first; the last slot is the current, still filling, one.
    pub slots: Vec<SlotInfo>,
}

#[derive(Serialize)]
pub struct SlotInfo {
    /// The slot's start, in seconds before the current slot's start.
    pub start_s_ago: u64,
    pub requests: u64,
    pub errors: u64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

#[derive(Serialize)]
pub struct ErrorInfo {
    pub at_unix_ms: u64,
    pub ms_ago: u64,
    pub reason: &'static str,
}

#[derive(Serialize)]
pub struct ToolsInfo {
    /// `listed`, `fetching`, `waiting` (backend not up or not probed yet) or `failed`.
    pub state: &'static str,
    pub fetched_at_unix_ms: Option<u64>,
    pub truncated: bool,
    pub error: Option<String>,
    pub error_at_unix_ms: Option<u64>,
    pub tools: Vec<ToolInfo>,
}

#[derive(Serialize)]
pub struct ToolInfo {
    pub name: String,
    pub description: Option<String>,
    /// Who sees it at `/mcp/<backend>`.
    pub visible: Visibility,
    /// Where aggregated endpoints expose it.
    pub endpoints: Vec<ExposedInfo>,
}

#[derive(Serialize)]
pub struct ExposedInfo {
    pub path: String,
    /// The name clients of the endpoint see; `None` when the member's tool filter hides it.
    pub name: Option<String>,
    pub visible: Visibility,
}

#[derive(Serialize)]
pub struct EndpointInfo {
    pub path: String,
    /// `open` or `closed`.
    pub failure_mode: &'static str,
    pub separator: String,
    pub members: Vec<MemberInfo>,
}

#[derive(Serialize)]
pub struct MemberInfo {
    pub backend: String,
    /// `""` = names exposed bare.
    pub prefix: String,
    pub allow: Vec<String>,
    pub deny: Vec<String>,
    pub health: &'static str,
    /// The member's `allow_teams` (applied on this endpoint too, by the per-backend step).
    pub allow_teams: Vec<String>,
}

#[derive(Serialize)]
pub struct CacheInfo {
    pub enabled: bool,
    /// As `portico_cache_entries` / `portico_cache_bytes`.
    pub entries: u64,
    pub bytes: u64,
    pub max_bytes: u64,
    /// (hit + shared_hit) / (hit + shared_hit + miss + coalesced + stale); `None` before any
    /// cacheable request. Counts are as `portico_cache_requests_total{outcome}`.
    pub hit_ratio: Option<f64>,
    pub hits: u64,
    pub shared_hits: u64,
    pub misses: u64,
    pub coalesced: u64,
    pub stale: u64,
    pub bypassed: u64,
    pub inserts: u64,
    pub evictions: u64,
    pub redis: RedisInfo,
}

#[derive(Serialize)]
pub struct RedisInfo {
    /// A Redis tier runs (`cache.redis_url`).
    pub configured: bool,
    /// As `portico_cache_redis_operations_total{op="error"}`.
    pub errors: u64,
    pub last_error: Option<String>,
    pub last_error_unix_ms: Option<u64>,
    pub hits: u64,
    pub misses: u64,
    pub writes: u64,
}

#[derive(Serialize)]
pub struct SessionInfo {
    /// Initialize-era client sessions are sealed ids with no server-side store (see
    /// `session`): portico cannot count them. Always `None`.
    pub legacy_client_sessions: Option<u64>,
    /// Upstream sessions open with initialize-era backends (sum of `portico_legacy_sessions`).
    pub upstream_legacy_sessions: u64,
    /// Calls of initialize-era backends parked for a 2026-07-28 client's answers
    /// (`portico_parked_calls`).
    pub parked_calls: u64,
    pub notes: Vec<&'static str>,
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn ms_since(t: SystemTime) -> u64 {
    SystemTime::now()
        .duration_since(t)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn ms_f(d: Duration) -> f64 {
    // Three decimals (µs): enough for the page, and stable JSON.
    (d.as_secs_f64() * 1e6).round() / 1e3
}

fn breaker_label(s: BreakerState) -> &'static str {
    match s {
        BreakerState::Closed => "closed",
        BreakerState::Open => "open",
        BreakerState::HalfOpen => "half_open",
    }
}

impl Snapshot {
    /// Builds the snapshot of `state` now. Starts background catalogue fetches that are due.
    pub fn build(state: &State, draining: bool) -> Snapshot {
        let cfg = &state.config;
        let teams_apply = cfg.auth.mode != AuthMode::None;
        let teams = &cfg.auth.teams;
        // Backends in config order: the order the operator wrote them in.
        let backends: Vec<&Arc<Backend>> = cfg
            .backends
            .iter()
            .filter_map(|c| state.routes.backends.get(&c.name))
            .collect();
        let endpoints: Vec<&crate::aggregate::Endpoint> = cfg
            .endpoints
            .iter()
            .filter_map(|e| match state.routes.routes.get(&e.path) {
                Some(Route::Endpoint(ep)) => Some(&**ep),
                _ => None,
            })
            .collect();

        let backend_infos: Vec<BackendInfo> = backends
            .iter()
            .map(|b| backend_info(b, &endpoints, teams, teams_apply))
            .collect();
        let endpoint_infos = endpoints
            .iter()
            .map(|ep| EndpointInfo {
                path: ep.path.to_string(),
                failure_mode: match ep.failure_mode {
                    FailureMode::Open => "open",
                    FailureMode::Closed => "closed",
                },
                separator: ep.separator.clone(),
                members: ep
                    .members
                    .iter()
                    .map(|m| MemberInfo {
                        backend: m.naming.backend.clone(),
                        prefix: m.naming.prefix.clone(),
                        allow: m.naming.tools.allow.clone(),
                        deny: m.naming.tools.deny.clone(),
                        health: m.backend.health.status().label(),
                        allow_teams: m.backend.cfg.allow_teams.clone(),
                    })
                    .collect(),
            })
            .collect();

        let s = state.cache.stats();
        let served = s.hits + s.redis_hits;
        let lookups = served + s.misses + s.coalesced + s.stale;
        let redis = state.cache.redis_last_error();
        let cache = CacheInfo {
            enabled: state.cache.enabled(),
            entries: s.entries,
            bytes: s.bytes,
            max_bytes: cfg.cache.max_bytes,
            hit_ratio: (lookups > 0).then(|| served as f64 / lookups as f64),
            hits: s.hits,
            shared_hits: s.redis_hits,
            misses: s.misses,
            coalesced: s.coalesced,
            stale: s.stale,
            bypassed: s.bypassed,
            inserts: s.inserts,
            evictions: s.evictions,
            redis: RedisInfo {
                configured: redis.is_some(),
                errors: s.redis_errors,
                last_error: redis.as_ref().and_then(|r| r.as_ref().map(|e| e.1.clone())),
                last_error_unix_ms: redis.and_then(|r| r.map(|e| unix_ms(e.0))),
                hits: s.redis_hits,
                misses: s.redis_misses,
                writes: s.redis_writes,
            },
        };

        let generation = &state.generation;
        Snapshot {
            version: env!("CARGO_PKG_VERSION"),
            generated_at_unix_ms: unix_ms(SystemTime::now()),
            draining,
            config: ConfigInfo {
                generation: generation.number,
                built_at_unix_ms: unix_ms(generation.built_at),
                age_ms: u64::try_from(generation.built.elapsed().as_millis()).unwrap_or(u64::MAX),
                last_reload_unix_ms: (generation.number > 1).then(|| unix_ms(generation.built_at)),
            },
            auth_mode: match cfg.auth.mode {
                AuthMode::None => "none",
                AuthMode::ApiKeys => "api_keys",
                AuthMode::Jwt => "jwt",
            },
            teams: teams.iter().map(|t| t.name.clone()).collect(),
            backends_up: backend_infos
                .iter()
                .filter(|b| b.health.status == "up")
                .count(),
            sessions: SessionInfo {
                legacy_client_sessions: None,
                upstream_legacy_sessions: backend_infos.iter().map(|b| b.legacy_sessions).sum(),
                parked_calls: backend_infos.iter().map(|b| b.parked_calls).sum(),
                notes: vec![
                    "Initialize-era client sessions are sealed, stateless ids: no server-side \
                     store, so there is nothing to count.",
                    "Parked calls: calls of initialize-era backends waiting for a 2026-07-28 \
                     client's answers (input_required), each for at most input_hold_ms.",
                ],
            },
            backends: backend_infos,
            endpoints: endpoint_infos,
            cache,
        }
    }
}

fn backend_info(
    b: &Arc<Backend>,
    endpoints: &[&crate::aggregate::Endpoint],
    teams: &[crate::config::TeamConfig],
    teams_apply: bool,
) -> BackendInfo {
    let status = b.health.status();
    let last = b.health.last();
    let breaker = b.resilience.state();
    let window = b.stats.latency.summary();
    let slots = window
        .slots
        .iter()
        .map(|s| SlotInfo {
            start_s_ago: s.age as u64 * window::SLOT_SECS,
            requests: s.requests,
            errors: s.errors,
            p50_ms: s.p50.map(ms_f),
            p99_ms: s.p99.map(ms_f),
        })
        .collect();
    let last_error = *b.stats.last_error.lock().unwrap_or_else(|p| p.into_inner());

    let (listing, phase) = b.stats.catalogue.view(b);
    let tools = listing
        .tools
        .as_deref()
        .unwrap_or(&[])
        .iter()
        .map(|t| ToolInfo {
            name: t.name.clone(),
            description: t.description.clone(),
            visible: catalogue::on_backend(teams, teams_apply, &b.cfg.allow_teams, &t.name),
            endpoints: endpoints
                .iter()
                .flat_map(|ep| {
                    ep.members
                        .iter()
                        .filter(|m| m.backend.name == b.name)
                        .map(|m| {
                            let exposed = m
                                .naming
                                .tool_allowed(&t.name)
                                .then(|| m.naming.expose(&ep.separator, &t.name));
                            ExposedInfo {
                                path: ep.path.to_string(),
                                visible: match &exposed {
                                    Some(n) => catalogue::on_endpoint(teams, teams_apply, n),
                                    None => Visibility::default(),
                                },
                                name: exposed,
                            }
                        })
                })
                .collect(),
        })
        .collect();

    BackendInfo {
        name: b.name.to_string(),
        protocol: b.verdict().label(),
        transport: b.transport().kind(),
        health: HealthInfo {
            status: status.label(),
            checked_ms_ago: last
                .as_ref()
                .map(|(ago, _)| u64::try_from(ago.as_millis()).unwrap_or(u64::MAX)),
            error: last.and_then(|(_, why)| why),
        },
        breaker: BreakerInfo {
            state: breaker_label(breaker),
            value: breaker as u8,
            failures_to_open: b.cfg.breaker_failures,
        },
        in_flight: b.stats.in_flight(),
        max_concurrent: b.cfg.max_concurrent,
        latency: LatencyInfo {
            window_s: window::SLOTS as u64 * window::SLOT_SECS,
            slot_s: window::SLOT_SECS,
            requests: window.requests,
            errors: window.errors,
            p50_ms: window.p50.map(ms_f),
            p99_ms: window.p99.map(ms_f),
            slots,
        },
        last_error: last_error.map(|e| ErrorInfo {
            at_unix_ms: unix_ms(e.at),
            ms_ago: ms_since(e.at),
            reason: e.reason,
        }),
        legacy_sessions: b.bridge.session_count() as u64,
        parked_calls: b.bridge.parked.load(std::sync::atomic::Ordering::Relaxed),
        stdio_restarts: match b.transport() {
            Upstream::Stdio(s) => Some(s.restarts()),
            _ => None,
        },
        allow_teams: b.cfg.allow_teams.clone(),
        tools: ToolsInfo {
            state: phase.label(),
            fetched_at_unix_ms: listing.fetched_at.map(unix_ms),
            truncated: listing.truncated,
            error_at_unix_ms: listing.error.as_ref().map(|e| unix_ms(e.0)),
            error: listing.error.map(|e| e.1),
            tools,
        },
    }
}

// === Serving ===

/// Answers `GET /status` and `GET /status.json` on the metrics listener (the caller has
/// already refused other methods). `path` is one of the two.
pub fn serve(state: &State, draining: bool, path: &str) -> Response<Full<Bytes>> {
    let snapshot = Snapshot::build(state, draining);
    let (body, content_type) = if path.ends_with(".json") {
        match serde_json::to_vec(&snapshot) {
            Ok(v) => (v, "application/json"),
            // Plain structs of numbers and strings: cannot fail, but never panic on a page.
            Err(e) => {
                tracing::warn!(error = %e, "status: snapshot did not serialize");
                let mut r = Response::new(Full::new(Bytes::from_static(b"status unavailable\n")));
                *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                return r;
            }
        }
    } else {
        (
            page::render(&snapshot).into_bytes(),
            "text/html; charset=utf-8",
        )
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    r
}

/// Whether `path` is served here (the metrics listener's router asks).
pub fn is_status_path(path: &str) -> bool {
    matches!(path, "/status" | "/status.json")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use crate::stats::Generation;
    use crate::stats::{BackendStats, record_latency};

    #[test]
    fn generations_count_per_metrics_instance() {
        let a = Arc::new(Metrics::new());
        let b = Arc::new(Metrics::new());
        assert_eq!(Generation::next(&a).number, 1);
        assert_eq!(Generation::next(&b).number, 1);
        assert_eq!(Generation::next(&a).number, 2);
        drop(a);
        let c = Arc::new(Metrics::new());
        assert_eq!(Generation::next(&c).number, 1, "a new run starts at 1");
        assert_eq!(Generation::next(&b).number, 2);
    }

    #[test]
    fn failures_become_the_last_error() {
        let stats = BackendStats::default();
        record_latency(
            &stats,
            std::time::Instant::now(),
            Duration::from_millis(3),
            true,
            None,
        );
        assert!(stats.last_error.lock().unwrap().is_none());
        record_latency(
            &stats,
            std::time::Instant::now(),
            Duration::from_millis(30),
            false,
            Some("backend_timeout"),
        );
        let e = stats.last_error.lock().unwrap().expect("recorded");
        assert_eq!(e.reason, "backend_timeout");
        let w = stats.latency.summary();
        assert_eq!((w.requests, w.errors), (2, 1));
    }
}
