//! What portico observes of each backend and of its config generations, kept for the status
//! page (`status`): a latency window, requests in flight, the last failure, the tool catalogue
//! storage, the generation number; and the tool names the backend listed, which bound the
//! per-tool metrics' labels ([`tools`]). Data and cheap recording only — a leaf: the
//! per-backend step records into it, `status` reads it and fills the catalogue.

pub mod tools;
pub mod window;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

use crate::metrics::Metrics;

/// What the status page knows about one backend beyond its health and breaker. Lives on
/// `Backend`, so it belongs to one config generation like the rest of the backend's state.
#[derive(Default)]
pub struct BackendStats {
    pub latency: window::Window,
    pub in_flight: AtomicUsize,
    /// The last failed upstream exchange. Locked only when one fails and when the page reads.
    pub last_error: Mutex<Option<LastError>>,
    pub catalogue: Catalogue,
    /// Tool names the backend listed: the labels of its per-tool metrics.
    pub tools: tools::KnownTools,
}

/// A failed upstream exchange, as the page shows it.
#[derive(Clone, Copy, Debug)]
pub struct LastError {
    pub at: SystemTime,
    pub reason: &'static str,
}

/// Records one upstream exchange of a backend: its time into the latency window and, when it
/// failed, the reason (a closed-set word such as `backend_timeout`) as the backend's last
/// error. The one entry point for latency: the per-backend step calls it for each exchange.
pub fn record_latency(
    stats: &BackendStats,
    at: Instant,
    took: Duration,
    ok: bool,
    error_reason: Option<&'static str>,
) {
    stats.latency.record_at(window::period_of(at), took, ok);
    if !ok {
        let reason = error_reason.unwrap_or("backend_error");
        *stats.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(LastError {
            at: SystemTime::now(),
            reason,
        });
    }
}

impl BackendStats {
    /// Counts a request as in flight on this backend until the guard drops: held by the
    /// per-backend step next to the backend's admission (the span `max_concurrent` limits).
    pub fn busy(&self) -> Busy<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Busy(self)
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// The last failed exchange.
    pub fn last_error(&self) -> Option<LastError> {
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Counts a request as in flight on its backend while the guard lives.
pub struct Busy<'a>(&'a BackendStats);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

// === Config generations ===

/// Which config generation a `State` is, and when it was built.
#[derive(Clone, Debug)]
pub struct Generation {
    /// 1 for the config the gateway started with, +1 per successful reload.
    pub number: u64,
    pub built_at: SystemTime,
    pub built: Instant,
}

impl Generation {
    /// The next generation of the gateway that owns `metrics`. Counted per `Metrics` (the one
    /// object that outlives every generation of a run), so several gateways in one process
    /// (the tests) each count their own. Called once per successful `State::build`.
    pub fn next(metrics: &Arc<Metrics>) -> Generation {
        static RUNS: Mutex<Vec<(Weak<Metrics>, u64)>> = Mutex::new(Vec::new());
        let mut runs = RUNS.lock().unwrap_or_else(|p| p.into_inner());
        runs.retain(|(m, _)| m.strong_count() > 0);
        let number = match runs
            .iter_mut()
            .find(|(m, _)| std::ptr::eq(m.as_ptr(), Arc::as_ptr(metrics)))
        {
            Some((_, n)) => {
                *n += 1;
                *n
            }
            None => {
                runs.push((Arc::downgrade(metrics), 1));
                1
            }
        };
        Generation {
            number,
            built_at: SystemTime::now(),
            built: Instant::now(),
        }
    }
}

/// One tool as the page shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
}

/// What is known of one backend's tools.
#[derive(Clone, Debug, Default)]
pub struct Listing {
    /// The last complete list (kept when a later fetch fails).
    pub tools: Option<Arc<[Tool]>>,
    pub fetched_at: Option<SystemTime>,
    /// More pages or tools than the bounds allow.
    pub truncated: bool,
    /// Why the last attempt failed, and when (cleared by a success).
    pub error: Option<(SystemTime, String)>,
    /// When the last attempt started: paces refreshes.
    pub attempted: Option<Instant>,
}

/// Per-backend catalogue state (lives in `BackendStats`; `status` fetches and reads it).
#[derive(Default)]
pub struct Catalogue {
    pub fetching: AtomicBool,
    pub listing: Mutex<Listing>,
}

impl Catalogue {
    /// The listing, locked briefly (never across an await).
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Listing> {
        self.listing.lock().unwrap_or_else(|p| p.into_inner())
    }
}
