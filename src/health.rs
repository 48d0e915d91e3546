//! Backend health: whether each backend can be reached right now, as `/readyz` and the
//! `portico_backend_up` gauge report it.
//!
//! The metrics listener runs [`check_all`] every `metrics.health_interval_ms`; readers (`/readyz`,
//! a scrape) only read the last result, so a probe from Kubernetes or Prometheus never waits on a
//! backend. A check is the cheapest contact that proves the backend answers:
//! - an `auto` backend whose era is unknown gets the real protocol probe (`bridge::ensure_verdict`),
//!   which also spares the first client request that probe;
//! - an HTTP backend gets a `server/discover` POST; any answer below 500 counts as up (a legacy
//!   server refuses it with a 4xx, which still proves it is there);
//! - a stdio backend is up while its child runs (a check starts it when it never ran);
//! - the built-in demo is always up.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use crate::protocol::{LATEST_VERSION, header as h};
use crate::router::{Backend, Verdict};
use crate::upstream::Upstream;

/// A backend's state as of its last check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Not checked yet.
    Unknown = 0,
    Up = 1,
    Down = 2,
}

impl Status {
    pub fn label(self) -> &'static str {
        match self {
            Status::Unknown => "unknown",
            Status::Up => "up",
            Status::Down => "down",
        }
    }
}

/// Per-backend health, written by the checker and read by `/readyz` and scrapes.
#[derive(Default)]
pub struct Health {
    status: AtomicU8,
    /// When the last check finished, and why it failed (if it did). Locked briefly, never across
    /// an await.
    last: Mutex<Option<(Instant, Option<String>)>>,
}

impl Health {
    pub fn status(&self) -> Status {
        match self.status.load(Ordering::Relaxed) {
            1 => Status::Up,
            2 => Status::Down,
            _ => Status::Unknown,
        }
    }

    /// Time since the last check and its failure reason.
    pub fn last(&self) -> Option<(Duration, Option<String>)> {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.as_ref().map(|(at, why)| (at.elapsed(), why.clone()))
    }

    fn set(&self, backend: &str, result: Result<(), String>) {
        let status = if result.is_ok() {
            Status::Up
        } else {
            Status::Down
        };
        let prev = self.status.swap(status as u8, Ordering::Relaxed);
        if let Err(why) = &result
            && prev != Status::Down as u8
        {
            tracing::warn!(backend, why = %why, "backend health check failed");
        }
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), result.err()));
    }
}

/// The era a verdict names, as a label.
pub fn protocol_label(v: Verdict) -> &'static str {
    match v {
        Verdict::Modern => "modern",
        Verdict::Legacy => "legacy",
        Verdict::Unknown => "unknown",
    }
}

/// Checks every backend concurrently, each bounded by `timeout`, and records the results.
pub async fn check_all<'a>(
    backends: impl Iterator<Item = &'a std::sync::Arc<Backend>>,
    timeout: Duration,
) {
    let checks = backends.map(|b| async move {
        let result = match tokio::time::timeout(timeout, check(b, timeout)).await {
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
        };
        b.health.set(&b.name, result);
    });
    futures_util::future::join_all(checks).await;
}

/// One check of one backend (see the module doc).
async fn check(b: &Backend, timeout: Duration) -> Result<(), String> {
    if b.verdict() == Verdict::Unknown {
        crate::bridge::ensure_verdict(b)
            .await
            .map_err(|e| e.to_string())?;
        // The probe was the contact; a stdio child is running now if it answered.
        if !matches!(b.upstream, Upstream::Stdio(_)) {
            return Ok(());
        }
    }
    let deadline = tokio::time::Instant::now() + timeout;
    match &b.upstream {
        Upstream::Builtin(_) => Ok(()),
        Upstream::Http(up) => {
            let extra = [
                (
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                ),
                (
                    http::header::ACCEPT,
                    HeaderValue::from_static("application/json, text/event-stream"),
                ),
                (
                    h::names::PROTOCOL_VERSION,
                    HeaderValue::from_static(LATEST_VERSION),
                ),
                (
                    h::names::METHOD,
                    HeaderValue::from_static("server/discover"),
                ),
            ];
            let req = up.request(&HeaderMap::new(), &extra, discover_body());
            let ex = up
                .exchange(req, deadline)
                .await
                .map_err(|e| e.to_string())?;
            let status = ex.response.status();
            if status.is_server_error() {
                Err(format!("answered HTTP {status}"))
            } else {
                Ok(())
            }
        }
        Upstream::Stdio(s) => {
            if !s.is_up() {
                // Never started (or restarting): any call starts it; its answer does not matter.
                let _ = s.call(discover_body(), deadline).await;
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

/// A well-formed 2026-07-28 `server/discover`: harmless to any server.
fn discover_body() -> Bytes {
    Bytes::from(
        serde_json::json!({"jsonrpc":"2.0","id":"portico-health","method":"server/discover","params":{"_meta":{
            crate::protocol::meta::PROTOCOL_VERSION: LATEST_VERSION,
            crate::protocol::meta::CLIENT_CAPABILITIES: {},
        }}})
        .to_string(),
    )
}
