//! A fixed-size latency window: one backend's upstream times over the last five minutes, as
//! thirty 10-second slots, each a histogram with quarter-octave buckets (8 µs … ~4.5 min).
//!
//! Why this shape: the status page wants p50/p99 *now* and a small chart of the last minutes,
//! and the request path must pay almost nothing for it. Recording is a clock read, a bucket
//! index from the value's bit length, and one or two relaxed atomic adds — no lock, no
//! allocation. Memory is fixed (~12 KB per backend) however much traffic there is. Quantiles
//! come out within one bucket (±12 %), which is what a status page needs; Prometheus keeps the
//! exact-bucket history for anything finer.
//!
//! A slot is recycled in place when its 10-second period comes round again (tagged with the
//! period it holds). A sample recorded in the instant another thread is zeroing the slot may be
//! lost; that is the price of staying lock-free and is invisible at this resolution.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Seconds per slot.
pub const SLOT_SECS: u64 = 10;
/// Slots kept: `SLOTS * SLOT_SECS` = the window (5 minutes).
pub const SLOTS: usize = 30;
/// The first bucket's octave: values below 2^3 µs = 8 µs all land in bucket 0.
const MIN_OCTAVE: u32 = 3;
/// Quarter-octave buckets over 25 octaves: 8 µs to 2^28 µs (~4.5 min); longer waits land in
/// the last bucket (portico's own timeouts end far earlier).
pub const BUCKETS: usize = 25 * 4;

/// One 10-second slot.
struct Slot {
    /// The period this slot holds, plus one (0 = never used).
    tag: AtomicU64,
    counts: [AtomicU32; BUCKETS],
    errors: AtomicU32,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            tag: AtomicU64::new(0),
            counts: std::array::from_fn(|_| AtomicU32::new(0)),
            errors: AtomicU32::new(0),
        }
    }
}

/// The latency window of one backend.
pub struct Window {
    slots: Box<[Slot]>,
}

impl Default for Window {
    fn default() -> Self {
        Window {
            slots: (0..SLOTS).map(|_| Slot::new()).collect(),
        }
    }
}

/// What one slot held when it was read.
#[derive(Clone, Debug, PartialEq)]
pub struct SlotSummary {
    /// How many slots before the current one (0 = the current, still filling, slot).
    pub age: usize,
    pub requests: u64,
    pub errors: u64,
    pub p50: Option<Duration>,
    pub p99: Option<Duration>,
}

/// The whole window when it was read.
#[derive(Clone, Debug, PartialEq)]
pub struct WindowSummary {
    /// Oldest first; always `SLOTS` entries (empty slots have no quantiles).
    pub slots: Vec<SlotSummary>,
    pub requests: u64,
    pub errors: u64,
    pub p50: Option<Duration>,
    pub p99: Option<Duration>,
}

/// The 10-second period `now` falls in, counted from a process-wide origin (monotonic).
pub fn period_now() -> u64 {
    period_of(Instant::now())
}

/// The 10-second period `at` falls in (a caller that has just read the clock passes its
/// reading: one read a request fewer).
pub fn period_of(at: Instant) -> u64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    let origin = *ORIGIN.get_or_init(Instant::now);
    at.saturating_duration_since(origin).as_secs() / SLOT_SECS
}

/// The bucket of a value in µs: its octave (bit length) and the next two bits below the top one.
fn bucket_of(us: u64) -> usize {
    let us = us.max(1);
    let octave = 63 - us.leading_zeros();
    if octave < MIN_OCTAVE {
        return 0;
    }
    let quarter = ((us >> (octave - 2)) & 3) as usize;
    ((octave - MIN_OCTAVE) as usize * 4 + quarter).min(BUCKETS - 1)
}

/// The lower bound of bucket `i` in µs (bucket 0 also holds everything below it).
fn bucket_floor(i: usize) -> f64 {
    let octave = MIN_OCTAVE as usize + i / 4;
    ((4 + i % 4) as f64) * 2f64.powi(octave as i32 - 2)
}

/// The quantile `q` of a histogram, interpolated linearly inside the bucket it falls in.
fn quantile(counts: &[u64; BUCKETS], total: u64, q: f64) -> Option<Duration> {
    if total == 0 {
        return None;
    }
    // The 1-based rank of the sample that is the quantile.
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut below = 0u64;
    for (i, &c) in counts.iter().enumerate() {
        if c == 0 {
            continue;
        }
        if below + c >= rank {
            let (lo, hi) = if i == 0 {
                (0.0, bucket_floor(1))
            } else {
                (bucket_floor(i), bucket_floor(i + 1))
            };
            let within = (rank - below) as f64 / c as f64;
            let us = lo + within * (hi - lo);
            return Some(Duration::from_nanos((us * 1000.0) as u64));
        }
        below += c;
    }
    None
}

impl Window {
    /// Records one upstream time in `period` (`period_of` the moment it ended).
    pub fn record_at(&self, period: u64, took: Duration, ok: bool) {
        let slot = &self.slots[(period % SLOTS as u64) as usize];
        let tag = period + 1;
        let held = slot.tag.load(Ordering::Acquire);
        if held != tag {
            if held > tag {
                // A thread stalled across a whole window: its sample is older than the slot.
                return;
            }
            if slot
                .tag
                .compare_exchange(held, tag, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                for c in &slot.counts {
                    c.store(0, Ordering::Relaxed);
                }
                slot.errors.store(0, Ordering::Relaxed);
            }
        }
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        slot.counts[bucket_of(us)].fetch_add(1, Ordering::Relaxed);
        if !ok {
            slot.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The window as of now.
    pub fn summary(&self) -> WindowSummary {
        self.summary_at(period_now())
    }

    /// The window as of `period`: the slots of periods `period - SLOTS + 1 ..= period`.
    pub fn summary_at(&self, period: u64) -> WindowSummary {
        let mut all = [0u64; BUCKETS];
        let mut out = WindowSummary {
            slots: Vec::with_capacity(SLOTS),
            requests: 0,
            errors: 0,
            p50: None,
            p99: None,
        };
        for age in (0..SLOTS).rev() {
            let mut summary = SlotSummary {
                age,
                requests: 0,
                errors: 0,
                p50: None,
                p99: None,
            };
            if let Some(p) = period.checked_sub(age as u64) {
                let slot = &self.slots[(p % SLOTS as u64) as usize];
                if slot.tag.load(Ordering::Acquire) == p + 1 {
                    let mut counts = [0u64; BUCKETS];
                    for (n, c) in counts.iter_mut().zip(&slot.counts) {
                        *n = u64::from(c.load(Ordering::Relaxed));
                    }
                    let total: u64 = counts.iter().sum();
                    summary.requests = total;
                    summary.errors = u64::from(slot.errors.load(Ordering::Relaxed)).min(total);
                    summary.p50 = quantile(&counts, total, 0.50);
                    summary.p99 = quantile(&counts, total, 0.99);
                    for (a, n) in all.iter_mut().zip(counts) {
                        *a += n;
                    }
                }
            }
            out.requests += summary.requests;
            out.errors += summary.errors;
            out.slots.push(summary);
        }
        out.p50 = quantile(&all, out.requests, 0.50);
        out.p99 = quantile(&all, out.requests, 0.99);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: f64) -> Duration {
        Duration::from_secs_f64(v / 1000.0)
    }

    fn close(d: Option<Duration>, want_ms: f64) -> bool {
        let got = d.expect("a quantile").as_secs_f64() * 1000.0;
        (got - want_ms).abs() <= want_ms * 0.13
    }

    #[test]
    fn buckets_are_monotonic_and_contain_their_values() {
        let mut last = 0;
        for us in [
            1u64, 7, 8, 9, 10, 11, 12, 15, 16, 100, 1000, 123_456, 10_000_000,
        ] {
            let b = bucket_of(us);
            assert!(b >= last, "bucket of {us} went down");
            last = b;
            if us >= 8 {
                assert!(bucket_floor(b) <= us as f64 && (us as f64) < bucket_floor(b + 1));
            }
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_within_a_bucket() {
        let w = Window::default();
        for i in 0..98 {
            w.record_at(5, ms(1.0 + (i % 3) as f64 * 0.01), true);
        }
        w.record_at(5, ms(200.0), false);
        w.record_at(5, ms(200.0), false);
        let s = w.summary_at(5);
        assert_eq!((s.requests, s.errors), (100, 2));
        assert!(close(s.p50, 1.0), "{:?}", s.p50);
        assert!(close(s.p99, 200.0), "{:?}", s.p99);
        assert_eq!(s.slots.len(), SLOTS);
        assert_eq!(s.slots[SLOTS - 1].requests, 100, "newest slot last");
    }

    #[test]
    fn old_slots_leave_the_window_and_are_recycled() {
        let w = Window::default();
        w.record_at(0, ms(5.0), true);
        w.record_at(1, ms(5.0), true);
        assert_eq!(w.summary_at(1).requests, 2);
        // Period 30 reuses period 0's slot: the old sample is gone, the new one counts.
        w.record_at(SLOTS as u64, ms(50.0), true);
        let s = w.summary_at(SLOTS as u64);
        assert_eq!(s.requests, 2, "period 1 and period 30");
        // Far later, nothing is left.
        assert_eq!(w.summary_at(10_000).requests, 0);
        assert_eq!(w.summary_at(10_000).p50, None);
        // A sample from before the slot's current period is dropped, not mixed in.
        w.record_at(0, ms(5.0), true);
        assert_eq!(w.summary_at(SLOTS as u64).requests, 2);
    }
}
