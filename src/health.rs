//! Backend health: one system that finds out whether each backend answers right now, feeding
//! `/readyz`, the `portico_backend_up` gauge and (for backends with `health_interval_ms`) the
//! circuit breaker. Every check is [`check`]; two schedules run it:
//! - the admin listener's checker ([`check_all`], every `metrics.health_interval_ms`) records
//!   into each backend's `Health`, which readers (`/readyz`, a scrape) only read, so a probe
//!   from Kubernetes or Prometheus never waits on a backend;
//! - the active probe of a backend with `health_interval_ms` ([`spawn_probe`]) records into the
//!   same `Health` and into the breaker, so a dead backend is taken out before clients find it.
//!
//! A check is the cheapest contact that proves the backend answers:
//! - an `auto` backend whose era is unknown gets the real protocol probe (`bridge::ensure_verdict`),
//!   which also spares the first client request that probe;
//! - an HTTP backend gets portico's `server/discover` (`protocol::discover_probe`); any answer
//!   below 500 counts as up (a legacy server refuses it with a 4xx, which still proves it is
//!   there);
//! - a stdio backend is up while its child runs (a check starts it when it never ran);
//! - the built-in demo is always up.

use http::HeaderMap;
use http_body_util::BodyExt;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::backend::{Backend, Verdict};
use crate::protocol::{discover_probe, discover_probe_headers};
use crate::upstream::Upstream;

/// How long one active probe may take (at most the backend's own timeout).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Checks every backend concurrently, each bounded by `timeout`, and records the results.
pub async fn check_all<'a>(backends: impl Iterator<Item = &'a Arc<Backend>>, timeout: Duration) {
    let checks = backends.map(|b| async move {
        let result = bounded_check(b, timeout).await;
        b.health.set(&b.name, result);
    });
    futures_util::future::join_all(checks).await;
}

/// [`check`] within `timeout`.
async fn bounded_check(b: &Backend, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, check(b, timeout)).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
    }
}

/// One check of one backend (see the module doc).
pub async fn check(b: &Backend, timeout: Duration) -> Result<(), String> {
    if b.verdict() == Verdict::Unknown {
        crate::bridge::ensure_verdict(b)
            .await
            .map_err(|e| e.to_string())?;
        // The probe was the contact; a stdio child is running now if it answered.
        if !matches!(b.transport(), Upstream::Stdio(_)) {
            return Ok(());
        }
    }
    let deadline = tokio::time::Instant::now() + timeout;
    match b.transport() {
        Upstream::Builtin(_) => Ok(()),
        Upstream::Http(up) => {
            let req = up.request(
                &HeaderMap::new(),
                &discover_probe_headers(),
                discover_probe("portico-health"),
            );
            let ex = up
                .exchange(req, deadline)
                .await
                .map_err(|e| e.to_string())?;
            let status = ex.response.status();
            // Read the answer so the connection goes back to the pool.
            let (_, body) = up.relay(ex, deadline, bytes::Bytes::new());
            let _ = body.collect().await;
            if status.is_server_error() {
                Err(format!("answered HTTP {status}"))
            } else {
                Ok(())
            }
        }
        Upstream::Stdio(s) => {
            if !s.is_up() {
                // Never started (or restarting): any call starts it; its answer does not matter.
                let _ = s.call(discover_probe("portico-health"), deadline).await;
            }
            if s.is_up() {
                Ok(())
            } else {
                Err(format!(
                    "child process not running ({} restarts)",
                    s.restarts()
                ))
            }
        }
    }
}

/// Starts the active probe of an HTTP backend with `health_interval_ms`: [`check`] on that
/// interval, recorded into its health and its breaker (a failed check counts as a failure, a
/// passed one closes an open breaker). Holds only a weak reference, so the task ends with its
/// config generation.
pub fn spawn_probe(backend: &Arc<Backend>) {
    let every = backend.cfg.health_interval_ms;
    if every == 0 || !matches!(backend.upstream, Upstream::Http(_)) {
        return;
    }
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let weak: Weak<Backend> = Arc::downgrade(backend);
    let every = Duration::from_millis(every);
    rt.spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            let Some(b) = weak.upgrade() else { return };
            let result = bounded_check(&b, PROBE_TIMEOUT.min(b.timeout)).await;
            let ok = result.is_ok();
            b.health.set(&b.name, result);
            b.resilience.set_up(ok);
            b.resilience.record(ok);
        }
    });
}
