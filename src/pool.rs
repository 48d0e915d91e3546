//! A keyed pool of per-client upstream resources: the upstream sessions (or stdio children) an
//! initialize-era backend keeps for its clients, one per owner key.
//!
//! Why a pool: an upstream legacy session carries state (whatever the server keeps per session,
//! and the capabilities declared at `initialize`), so it must never be shared between clients
//! (docs/protocol.md §8 item 14; README "Session isolation"). Opening one per request would cost
//! a handshake each time, so sessions are kept by owner — the authorization context and the
//! client's declared capabilities, or a legacy client's own session — and bounded two ways:
//! - **a cap** (`max_upstream_sessions`): inserting beyond it evicts the least recently used
//!   slot no request holds; when every slot is held, the new owner is refused rather than a
//!   request in flight cut off;
//! - **a quota per group**: a 2026-07-28 client's owner key includes the capabilities it
//!   declares, which it may vary at will, and an authenticated principal may open any number
//!   of initialize-era client sessions; so slots are grouped — by authorization context
//!   (`max_upstream_sessions_per_context`), by principal (`max_upstream_sessions_per_principal`)
//!   — and a group at its quota makes room among its own slots: one client cannot push
//!   everybody else's idle sessions, and the server state kept in them, out at the cap;
//! - **idle reaping** (`upstream_idle_ms`, and a legacy client's session expiry): [`Pool::reap`]
//!   returns what has been unused too long.
//!
//! Data only: what a slot holds and how it is closed is the caller's (`bridge`); evicted and
//! reaped slots are handed back so the caller closes them outside the lock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Names an owner: a SHA-256 digest over what makes two requests "the same client".
pub type OwnerKey = [u8; 32];

/// One pooled resource and when it was last used.
pub struct Slot<T> {
    pub key: OwnerKey,
    /// The group whose quota the slot counts against (`None`: none).
    group: Option<OwnerKey>,
    pub value: T,
    /// Milliseconds since the pool's epoch.
    last_used: AtomicU64,
    /// Unix milliseconds after which the slot's owner is gone (a legacy client's session
    /// expiry); `u64::MAX` for none.
    expires_ms: u64,
    /// Never reaped for idleness, and evicted only when nothing else can be (portico's own
    /// session, which its long-lived change stream uses without holding the slot).
    pinned: std::sync::atomic::AtomicBool,
}

impl<T> Slot<T> {
    /// Keeps the slot through idleness (see `pinned`).
    pub fn pin(&self) {
        self.pinned.store(true, Ordering::Relaxed);
    }

    fn pinned(&self) -> bool {
        self.pinned.load(Ordering::Relaxed)
    }

    /// Unix milliseconds after which the owner is gone (`u64::MAX`: never).
    pub fn expires_ms(&self) -> u64 {
        self.expires_ms
    }
}

type Slots<T> = HashMap<OwnerKey, Arc<Slot<T>>, foldhash::fast::RandomState>;

/// A slot got or made, and the slots evicted to make room for it (for the caller to close).
pub type Taken<T> = (Arc<Slot<T>>, Vec<Arc<Slot<T>>>);

/// Why no slot was made: every slot that would have to go is held by a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The pool is at its cap.
    Cap,
    /// The owner's group is at its quota.
    Quota,
}

/// The group a new slot counts against, and how many slots the group may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    pub key: OwnerKey,
    pub quota: usize,
}

/// The pool of one backend.
pub struct Pool<T> {
    /// foldhash: the keys are SHA-256 digests (`bridge::owner`), which nobody can choose to
    /// collide, and SipHash cost more than the rest of a lookup on every bridged request.
    slots: Mutex<Slots<T>>,
    cap: usize,
    idle: Duration,
    epoch: Instant,
}

/// Unix time in milliseconds.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl<T> Pool<T> {
    pub fn new(cap: usize, idle: Duration) -> Pool<T> {
        Pool {
            slots: Mutex::new(Slots::default()),
            cap: cap.max(1),
            idle,
            epoch: Instant::now(),
        }
    }

    /// How long a slot may stay unused.
    pub fn idle(&self) -> Duration {
        self.idle
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots<T>> {
        // Never held across anything that can panic; recover from poison anyway.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// The slot of `key`, made by `make` when there is none, marked used. Also returns the
    /// slots evicted to stay within `group`'s quota and the cap, for the caller to close.
    /// Refused when a request holds every slot that would have to go — closing one would cut
    /// that request off, so the newcomer is the one refused. A new slot's group is counted by
    /// a walk over the slots: only a new owner pays it, never a request that finds its slot.
    pub fn get_or_insert_with(
        &self,
        key: OwnerKey,
        group: Option<Group>,
        expires_ms: u64,
        make: impl FnOnce() -> T,
    ) -> Result<Taken<T>, Refused> {
        let now = self.now();
        let mut slots = self.lock();
        if let Some(s) = slots.get(&key) {
            s.last_used.store(now, Ordering::Relaxed);
            return Ok((s.clone(), Vec::new()));
        }
        // The least recently used slot no request holds among those `of` accepts, a pinned
        // one only when no other is free.
        let lru = |slots: &Slots<T>, of: &dyn Fn(&Slot<T>) -> bool| {
            let free = |pinned_ok: bool| {
                slots
                    .values()
                    .filter(|s| Arc::strong_count(s) == 1 && (pinned_ok || !s.pinned()) && of(s))
                    .min_by_key(|s| s.last_used.load(Ordering::Relaxed))
                    .map(|s| s.key)
            };
            free(false).or_else(|| free(true))
        };
        let mut evicted = Vec::new();
        if let Some(g) = group {
            let mine = |s: &Slot<T>| s.group == Some(g.key);
            while slots.values().filter(|s| mine(s)).count() >= g.quota.max(1) {
                let victim = lru(&slots, &mine).ok_or(Refused::Quota)?;
                evicted.extend(slots.remove(&victim));
            }
        }
        while slots.len() >= self.cap {
            let victim = lru(&slots, &|_| true).ok_or(Refused::Cap)?;
            evicted.extend(slots.remove(&victim));
        }
        let slot = Arc::new(Slot {
            key,
            group: group.map(|g| g.key),
            value: make(),
            last_used: AtomicU64::new(now),
            expires_ms,
            pinned: Default::default(),
        });
        slots.insert(key, slot.clone());
        Ok((slot, evicted))
    }

    /// The slot of `key`, if any (not marked used).
    pub fn get(&self, key: &OwnerKey) -> Option<Arc<Slot<T>>> {
        self.lock().get(key).cloned()
    }

    /// Marks a slot used now.
    pub fn touch(&self, slot: &Slot<T>) {
        slot.last_used.store(self.now(), Ordering::Relaxed);
    }

    /// Takes `key`'s slot out of the pool.
    pub fn remove(&self, key: &OwnerKey) -> Option<Arc<Slot<T>>> {
        self.lock().remove(key)
    }

    /// Takes out the slots unused for longer than the idle time, or whose owner expired,
    /// except those a request holds right now.
    pub fn reap(&self) -> Vec<Arc<Slot<T>>> {
        let now = self.now();
        let idle = self.idle.as_millis() as u64;
        let unix = unix_ms();
        let mut slots = self.lock();
        let stale: Vec<OwnerKey> = slots
            .values()
            .filter(|s| Arc::strong_count(s) == 1 && !s.pinned())
            .filter(|s| {
                now.saturating_sub(s.last_used.load(Ordering::Relaxed)) >= idle
                    || s.expires_ms <= unix
            })
            .map(|s| s.key)
            .collect();
        stale.iter().filter_map(|k| slots.remove(k)).collect()
    }

    /// Takes every slot out (shutdown).
    pub fn drain(&self) -> Vec<Arc<Slot<T>>> {
        self.lock().drain().map(|(_, s)| s).collect()
    }

    /// Slots held now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> OwnerKey {
        [n; 32]
    }

    #[test]
    fn the_least_recently_used_idle_slot_is_evicted_at_the_cap() {
        let pool = Pool::new(2, Duration::from_secs(60));
        let (a, _) = pool
            .get_or_insert_with(key(1), None, u64::MAX, || "a")
            .unwrap();
        std::thread::sleep(Duration::from_millis(3));
        let (b, _) = pool
            .get_or_insert_with(key(2), None, u64::MAX, || "b")
            .unwrap();
        drop(b);
        std::thread::sleep(Duration::from_millis(3));
        // `a` is older but held by a request: `b` goes.
        let (c, evicted) = pool
            .get_or_insert_with(key(3), None, u64::MAX, || "c")
            .unwrap();
        assert_eq!(evicted.iter().map(|s| s.value).collect::<Vec<_>>(), ["b"]);
        drop(evicted);
        // Both held now: a newcomer is refused, and nobody is evicted.
        assert!(
            pool.get_or_insert_with(key(9), None, u64::MAX, || "x")
                .err()
                == Some(Refused::Cap)
        );
        assert_eq!(pool.len(), 2);
        drop((a, c));
        let (_d, evicted) = pool
            .get_or_insert_with(key(4), None, u64::MAX, || "d")
            .unwrap();
        assert_eq!(evicted.len(), 1);
        assert_eq!(pool.len(), 2);
        // The same key again is the same slot.
        let (d2, evicted) = pool
            .get_or_insert_with(key(4), None, u64::MAX, || "other")
            .unwrap();
        assert!(evicted.is_empty());
        assert_eq!(d2.value, "d");
    }

    #[test]
    fn a_group_at_its_quota_makes_room_among_its_own_slots() {
        let pool = Pool::new(4, Duration::from_secs(60));
        let group = |n| {
            Some(Group {
                key: key(n),
                quota: 2,
            })
        };
        let (alice, bob) = (group(100), group(200));
        drop(pool.get_or_insert_with(key(1), bob, u64::MAX, || "bob"));
        std::thread::sleep(Duration::from_millis(3));
        drop(pool.get_or_insert_with(key(2), None, u64::MAX, || "legacy"));
        std::thread::sleep(Duration::from_millis(3));
        // Alice varies her key: past her quota of 2, her own oldest slot goes — never Bob's
        // or the legacy client's, older though they are.
        let mut gone = Vec::new();
        for n in 10..16 {
            let (_, evicted) = pool
                .get_or_insert_with(key(n), alice, u64::MAX, || "alice")
                .unwrap();
            gone.extend(evicted.iter().map(|s| s.value));
            std::thread::sleep(Duration::from_millis(3));
        }
        assert_eq!(gone, ["alice"; 4]);
        assert_eq!(pool.len(), 4);
        assert!(pool.get(&key(1)).is_some() && pool.get(&key(2)).is_some());
        // Both of hers held by requests: the newcomer is refused, not anyone else evicted.
        let held = (pool.get(&key(14)), pool.get(&key(15)));
        let r = pool.get_or_insert_with(key(16), alice, u64::MAX, || "alice");
        assert_eq!(r.err(), Some(Refused::Quota));
        assert_eq!(pool.len(), 4);
        drop(held);
    }

    #[test]
    fn idle_and_expired_slots_are_reaped_unless_held() {
        let pool = Pool::new(8, Duration::from_millis(5));
        let (held, _) = pool
            .get_or_insert_with(key(1), None, u64::MAX, || 1)
            .unwrap();
        drop(pool.get_or_insert_with(key(2), None, u64::MAX, || 2));
        drop(pool.get_or_insert_with(key(3), None, 0, || 3)); // already expired
        assert_eq!(pool.reap().iter().map(|s| s.value).collect::<Vec<_>>(), [3]);
        std::thread::sleep(Duration::from_millis(10));
        let reaped: Vec<_> = pool.reap().iter().map(|s| s.value).collect();
        assert_eq!(reaped, [2]);
        assert_eq!(pool.len(), 1);
        drop(held);
        assert_eq!(pool.reap().len(), 1);
        assert!(pool.is_empty());
    }
}
