//! Keeping a failing backend from taking clients down with it: a per-backend circuit breaker,
//! a retry budget for idempotent methods and a concurrency limit; and the pause before a
//! stream a backend ended is reopened ([`Reconnect`]). (The active probe that feeds the breaker
//! is part of the one health system, `health`.)
//!
//! Owns: the breaker state machine (closed → open after `breaker_failures` consecutive failures
//! → after `breaker_open_ms` one probe request (half-open) → closed on success, open again on
//! failure), the retry token budget, the per-backend semaphore.
//! Must not: build error responses (it returns `GatewayError`s) or know metric names (it holds
//! gauges `metrics.rs` made).
//! Called by: the per-backend step (`step`) around every upstream exchange; `health` reports
//! its probes here.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
// tokio's clock, so tests can pause and advance it instead of sleeping.
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::config::BackendConfig;
use crate::error::GatewayError;
use crate::metrics::BackendMetrics;

/// Retry budget in tenths of a retry: each success earns one tenth, each retry spends ten, up
/// to `RETRY_BUDGET_MAX`. Retries can so never more than ~10 % amplify load once the first ten
/// are used up.
const RETRY_BUDGET_MAX: u64 = 100;

/// What the breaker gauge reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed = 0,
    Open = 1,
    HalfOpen = 2,
}

struct Inner {
    opened_at: Option<Instant>,
    /// When the current half-open probe started; a new probe may start once it is as old as
    /// the open period (the first one's client may have gone away without an outcome).
    probe_at: Option<Instant>,
}

/// Per-backend resilience state.
pub struct Resilience {
    threshold: u32,
    open_for: Duration,
    retries: u32,
    failures: AtomicU32,
    /// Fast path: nothing to lock while the breaker is closed.
    open: AtomicBool,
    inner: Mutex<Inner>,
    budget: AtomicU64,
    limiter: Option<Arc<Semaphore>>,
    metrics: OnceLock<BackendMetrics>,
}

/// A request admitted to the backend; dropping it frees the concurrency slot.
pub struct Admission {
    _permit: Option<OwnedSemaphorePermit>,
}

impl Resilience {
    pub fn new(cfg: &BackendConfig) -> Resilience {
        Resilience {
            threshold: cfg.breaker_failures,
            open_for: Duration::from_millis(cfg.breaker_open_ms),
            retries: cfg.retries,
            failures: AtomicU32::new(0),
            open: AtomicBool::new(false),
            inner: Mutex::new(Inner {
                opened_at: None,
                probe_at: None,
            }),
            budget: AtomicU64::new(RETRY_BUDGET_MAX),
            limiter: (cfg.max_concurrent > 0).then(|| Arc::new(Semaphore::new(cfg.max_concurrent))),
            metrics: OnceLock::new(),
        }
    }

    pub fn attach(&self, m: BackendMetrics) {
        m.breaker_state.set(self.state() as i64);
        m.up.set(1);
        let _ = self.metrics.set(m);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn state(&self) -> BreakerState {
        if !self.open.load(Ordering::Acquire) {
            return BreakerState::Closed;
        }
        match self.lock().probe_at {
            Some(_) => BreakerState::HalfOpen,
            None => BreakerState::Open,
        }
    }

    fn publish(&self) {
        if let Some(m) = self.metrics.get() {
            m.breaker_state.set(self.state() as i64);
        }
    }

    /// Admits a request: a concurrency slot (503 when none is free) and the breaker's leave
    /// (fast 503 while open; one probe at a time once the open period is over).
    pub fn admit(&self, backend: &str) -> Result<Admission, GatewayError> {
        let permit = match &self.limiter {
            None => None,
            Some(s) => {
                Some(
                    s.clone()
                        .try_acquire_owned()
                        .map_err(|_| GatewayError::Overloaded {
                            backend: backend.to_string(),
                        })?,
                )
            }
        };
        if self.threshold > 0 && self.open.load(Ordering::Acquire) {
            let now = Instant::now();
            let mut inner = self.lock();
            let cooled = inner
                .opened_at
                .is_none_or(|t| now.duration_since(t) >= self.open_for);
            let probe_free = inner
                .probe_at
                .is_none_or(|t| now.duration_since(t) >= self.open_for);
            if !(cooled && probe_free) {
                return Err(GatewayError::CircuitOpen {
                    backend: backend.to_string(),
                });
            }
            inner.probe_at = Some(now);
            drop(inner);
            self.publish();
        }
        Ok(Admission { _permit: permit })
    }

    /// Records the outcome of an exchange. Only backend faults count as failures.
    pub fn record(&self, ok: bool) {
        if self.threshold == 0 {
            return;
        }
        if ok {
            self.failures.store(0, Ordering::Relaxed);
            let _ = self
                .budget
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                    (b < RETRY_BUDGET_MAX).then_some(b + 1)
                });
            if self.open.load(Ordering::Acquire) {
                let mut inner = self.lock();
                inner.opened_at = None;
                inner.probe_at = None;
                self.open.store(false, Ordering::Release);
                drop(inner);
                tracing::info!("circuit breaker closed");
                self.publish();
            }
            return;
        }
        let n = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        let was_open = self.open.load(Ordering::Acquire);
        if n >= self.threshold || was_open {
            let mut inner = self.lock();
            inner.opened_at = Some(Instant::now());
            inner.probe_at = None;
            self.open.store(true, Ordering::Release);
            drop(inner);
            if !was_open {
                tracing::warn!(failures = n, "circuit breaker opened");
            }
            self.publish();
        }
    }

    /// Records the outcome of a finished request by its error, if any.
    pub fn record_result<T>(&self, r: &Result<T, GatewayError>) {
        match r {
            Ok(_) => self.record(true),
            Err(e) if is_backend_failure(e) => self.record(false),
            Err(_) => {}
        }
    }

    /// Whether one more attempt may be spent (and spends it).
    pub fn take_retry(&self, attempt: u32) -> bool {
        if attempt >= self.retries {
            return false;
        }
        let ok = self
            .budget
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(10))
            .is_ok();
        if ok && let Some(m) = self.metrics.get() {
            m.retries.inc();
        }
        ok
    }

    /// Mirrors the last active probe into `portico_backend_probe_up`.
    pub fn set_up(&self, up: bool) {
        if let Some(m) = self.metrics.get() {
            m.up.set(i64::from(up));
        }
    }
}

/// The failures that say the backend is unwell (not the client, not portico).
pub fn is_backend_failure(e: &GatewayError) -> bool {
    matches!(
        e,
        GatewayError::BackendUnreachable { .. }
            | GatewayError::BackendTimeout { .. }
            | GatewayError::BackendFailed { .. }
    )
}

/// The pause before reopening a stream a backend ended (a legacy client's listens, `portico
/// stdio`'s GET stream): `first`, doubled after every wait up to `max` — so a stream that keeps
/// ending right after it opens is reopened ever more slowly, as is one that cannot be reopened
/// — and back to `first` once a stream lasted `max`.
pub struct Reconnect {
    first: Duration,
    max: Duration,
    pause: Duration,
    /// When the stream was last opened, while it is (`None` once reopening began).
    opened: Option<Instant>,
}

impl Reconnect {
    /// For a stream opened now.
    pub fn new(first: Duration, max: Duration) -> Reconnect {
        Reconnect {
            first,
            max,
            pause: first,
            opened: Some(Instant::now()),
        }
    }

    /// Waits before the next attempt to reopen.
    pub async fn wait(&mut self) {
        if self.opened.take().is_some_and(|t| t.elapsed() >= self.max) {
            self.pause = self.first;
        }
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(self.max);
    }

    /// The stream is open again.
    pub fn opened(&mut self) {
        self.opened = Some(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(failures: u32, open_ms: u64) -> BackendConfig {
        let c: crate::config::Config = crate::config::parse(&format!(
            "[[backends]]\nname='a'\nbuiltin='demo'\nbreaker_failures={failures}\nbreaker_open_ms={open_ms}\nmax_concurrent=1\n"
        ))
        .unwrap();
        c.backends[0].clone()
    }

    #[tokio::test(start_paused = true)]
    async fn breaker_opens_fails_fast_probes_and_closes() {
        let r = Resilience::new(&cfg(2, 50));
        r.record(false);
        assert_eq!(r.state(), BreakerState::Closed);
        r.record(false);
        assert_eq!(r.state(), BreakerState::Open);
        assert!(matches!(
            r.admit("a"),
            Err(GatewayError::CircuitOpen { .. })
        ));
        tokio::time::advance(Duration::from_millis(60)).await;
        let probe = r.admit("a").expect("one probe after the open period");
        assert_eq!(r.state(), BreakerState::HalfOpen);
        drop(probe);
        assert!(r.admit("a").is_err(), "only one probe at a time");
        r.record(false);
        assert_eq!(r.state(), BreakerState::Open, "a failed probe reopens");
        tokio::time::advance(Duration::from_millis(60)).await;
        drop(r.admit("a").unwrap());
        r.record(true);
        assert_eq!(r.state(), BreakerState::Closed);
        assert!(r.admit("a").is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn reconnect_pauses_double_and_start_over_after_a_long_stream() {
        let (first, max) = (Duration::from_millis(250), Duration::from_secs(2));
        let mut r = Reconnect::new(first, max);
        let mut waited = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            r.wait().await;
            waited.push(t.elapsed().as_millis());
        }
        assert_eq!(
            waited,
            [250, 500, 1000, 2000, 2000],
            "doubling while reopening fails"
        );
        // Reopened, and ended at once: the pause goes on growing (already at its bound).
        r.opened();
        let t = Instant::now();
        r.wait().await;
        assert_eq!(t.elapsed(), max);
        // Reopened, and it lasted `max`: the first pause again.
        r.opened();
        tokio::time::sleep(max).await;
        let t = Instant::now();
        r.wait().await;
        assert_eq!(t.elapsed(), first);
    }

    #[test]
    fn concurrency_limit_and_retry_budget() {
        let r = Resilience::new(&cfg(0, 50));
        let held = r.admit("a").unwrap();
        assert!(matches!(r.admit("a"), Err(GatewayError::Overloaded { .. })));
        drop(held);
        assert!(r.admit("a").is_ok());
        // retries = 1 by default: one retry per request, and the budget runs out.
        assert!(!r.take_retry(1));
        let spent = (0..20).filter(|_| r.take_retry(0)).count();
        assert_eq!(spent, 10, "the budget allows ten retries without successes");
    }
}
