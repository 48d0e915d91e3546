//! The shared list cache: `complete` results of the six cacheable methods (docs/protocol.md §3), kept for
//! the server's `ttlMs` under a key that says whose data it is (`cacheScope`).
//!
//! Two tiers: an in-process moka store in front, and optionally Redis (`[cache]
//! redis_url`) shared by every replica; a local miss asks Redis (inside the single-flight leader)
//! before the backend. Files: `classify` (what may be stored), `key` (partitions, the key),
//! `entry` (one stored result), `json` (text surgery), `redis` (the shared tier), `tests`.
//!
//! Owns: the moka store (per-entry expiry, a byte budget), single-flight coalescing of
//! concurrent misses, stale-if-error, invalidation (local at once, then Redis and the other
//! replicas), and the counters ([`CacheStats`]).
//! Must not: reach backends itself (the caller hands [`Cache::get_or_fetch`] a `fetch` future),
//! build error responses (only `error.rs` does), or know metric names (it exposes numbers;
//! `metrics.rs` names them). Redis is the only IO it does, always under `redis_timeout_ms`.
//! Called by: `proxy`, for requests whose method is cacheable; and by whatever learns that a
//! backend's lists changed, through [`Cache::invalidate`] and friends.
//!
//! Invariants:
//! - Nothing is stored unless the backend said `resultType: "complete"` (or nothing, for results
//!   the bridge normalised), HTTP 200, no JSON-RPC error, `ttlMs > 0`, and the request was not an
//!   MRTR retry.
//! - A `private` (or unlabelled) result is stored only under a key that contains the caller's
//!   authorization partition, so it can never be served across authorization contexts.
//! - Every body handed out carries the caller's own JSON-RPC id, and a cached body carries the
//!   *remaining* freshness as `ttlMs`, so no client holds data longer than the server intended.
//! - An invalidation takes effect for every lookup on this replica that starts after it returns,
//!   and a fetch that was in flight when it happened is not stored (locally or in Redis). Other
//!   replicas follow when its Redis `INCR` lands (their Redis reads) and its message arrives
//!   (their local tiers): milliseconds, or after a Redis outage, a local purge on resubscribe.

mod classify;
mod entry;
mod json;
mod key;
mod redis;

pub use classify::{Decision, Scope, Uncacheable, classify};
pub use entry::Entry;
pub use json::splice_id;
pub use key::{CacheKey, KeyInput, KeyScope, Partition, cache_key};

use bytes::Bytes;
use moka::notification::RemovalCause;
use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::watch;

use crate::config::CacheConfig;
use crate::protocol::{RequestId, is_cacheable_method};
use entry::EntryExpiry;

// === Counters ===

pub use crate::metrics::CacheStats;

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    coalesced: AtomicU64,
    stale: AtomicU64,
    bypassed: AtomicU64,
    inserts: AtomicU64,
    evictions: AtomicU64,
    /// Signed: the eviction listener subtracts, and must never wrap to a huge value.
    entries: AtomicI64,
    bytes: AtomicI64,
    redis_hits: AtomicU64,
    redis_misses: AtomicU64,
    redis_writes: AtomicU64,
    redis_errors: AtomicU64,
    redis_published: AtomicU64,
    redis_received: AtomicU64,
    /// Status page: the last Redis failure (when, why).
    redis_last_error: Mutex<Option<(std::time::SystemTime, String)>>,
}

impl Counters {
    /// Status page: remembers the last Redis failure.
    fn redis_failed(&self, why: &str) {
        let mut last = self
            .redis_last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        *last = Some((std::time::SystemTime::now(), why.to_string()));
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

// === The cache ===

/// What a fetch brought back: the upstream's HTTP status and its JSON-RPC response message
/// (one message, not SSE framing), which carries the *upstream* request's id.
#[derive(Clone, Debug)]
pub struct Fetched {
    pub status: u16,
    pub message: Bytes,
}

/// How a request was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Hit,
    /// A local miss answered from the shared (Redis) tier.
    SharedHit,
    /// This caller's fetch (stored or not).
    Miss,
    /// Another caller's concurrent fetch.
    Coalesced,
    /// An expired entry, because the re-fetch failed.
    Stale,
    /// The cache was not consulted.
    Bypass,
}

impl Outcome {
    /// A static label for metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Hit => "hit",
            Outcome::SharedHit => "shared_hit",
            Outcome::Miss => "miss",
            Outcome::Coalesced => "coalesced",
            Outcome::Stale => "stale",
            Outcome::Bypass => "bypass",
        }
    }
}

/// The answer to send to one caller.
#[derive(Clone, Debug)]
pub struct Served {
    pub status: u16,
    /// A complete JSON-RPC response carrying the caller's own id.
    pub body: Bytes,
    pub outcome: Outcome,
    /// The `ttlMs` written into `body` when it came from a cacheable result.
    pub ttl_remaining_ms: Option<u64>,
}

impl Served {
    fn entry(entry: &Entry, id: &RequestId, outcome: Outcome) -> Served {
        let now = Instant::now();
        Served {
            status: 200,
            body: entry.render(id, now),
            outcome,
            ttl_remaining_ms: Some(entry.ttl_remaining_ms(now)),
        }
    }

    fn passed(status: u16, message: &Bytes, id: &RequestId, outcome: Outcome) -> Served {
        Served {
            status,
            body: splice_id(message, id),
            outcome,
            ttl_remaining_ms: None,
        }
    }
}

/// What a fetch leader hands its waiters.
enum Published {
    /// A cacheable result (stored, unless an invalidation raced it).
    Entry(Arc<Entry>),
    /// Not cacheable: the same response, to be re-addressed to each waiter.
    Passed { status: u16, message: Bytes },
    /// The fetch failed: the caller's error type, boxed because the flight map is shared by
    /// calls with any `E` (in practice one type; a mismatch is treated like a vanished leader).
    Failed(Box<dyn Any + Send + Sync>),
}

/// The watch slot of one flight: `None` until the leader publishes.
type Slot = Option<Arc<Published>>;

/// The shared list cache. Cheap to share behind an `Arc`; every method takes `&self`.
pub struct Cache {
    enabled: bool,
    max_ttl_ms: u64,
    max_bytes: u64,
    stale_if_error: Duration,
    /// Whether entries are kept in this process (`[cache] local`); with `false`, only Redis.
    keep_local: bool,
    /// The in-process tier; shared with the Redis subscriber, which applies other replicas'
    /// invalidations to it.
    local: Arc<Local>,
    /// The Redis tier, when `redis_url` is set.
    shared: Option<redis::Shared>,
    /// In-flight fetches by private key: the flight id (so a finished leader only ever removes
    /// its own flight) and a receiver waiters clone. Locked briefly, never across an await.
    flights: Mutex<HashMap<CacheKey, (u64, watch::Receiver<Slot>)>>,
    next_flight: AtomicU64,
    counters: Arc<Counters>,
}

/// The in-process tier.
struct Local {
    store: moka::future::Cache<CacheKey, Arc<Entry>>,
    /// Bumped by every invalidation. A fetch that saw another value before it started is not
    /// stored, and a stale entry looked up before it is not served: both may predate the change.
    epoch: AtomicU64,
}

/// What an invalidation covers. Also the payload of the shared tier's invalidation channel.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
enum Invalidation {
    /// Every entry of `backend` + `method`: all partitions, all cursors, and the merged
    /// answers built from them.
    Method { backend: String, method: String },
    /// The `resources/read` entries of `backend` for `uri`.
    Resource { backend: String, uri: String },
    /// Every entry of `backend`, and the merged answers built from them.
    Backend { backend: String },
    /// Everything.
    All,
}

impl Invalidation {
    fn matches(&self, e: &Entry) -> bool {
        match self {
            Invalidation::Method { backend, method } => {
                e.depends_on(backend) && *e.method == **method
            }
            Invalidation::Resource { backend, uri } => {
                *e.backend == **backend
                    && &*e.method == "resources/read"
                    && e.uri.as_deref() == Some(uri.as_str())
            }
            Invalidation::Backend { backend } => e.depends_on(backend),
            Invalidation::All => true,
        }
    }
}

impl Local {
    /// Drops what `what` covers. moka applies the predicate to every later `get` at once and
    /// removes the entries during maintenance; either way no lookup that starts after this
    /// returns can see them.
    fn apply(&self, what: &Invalidation) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        if *what == Invalidation::All {
            self.store.invalidate_all();
            return;
        }
        let what = what.clone();
        if let Err(error) = self
            .store
            .invalidate_entries_if(move |_key, entry| what.matches(entry))
        {
            // Only possible if the builder lost `support_invalidation_closures`. Dropping too
            // much is safe; serving invalidated data is not.
            tracing::warn!(message = "cache predicate rejected; purging everything", %error);
            self.store.invalidate_all();
        }
    }

    fn purge(&self) {
        self.apply(&Invalidation::All);
    }
}

impl fmt::Debug for Cache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache")
            .field("enabled", &self.enabled)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

enum Role<'c> {
    Lead(Flight<'c>),
    Wait(watch::Receiver<Slot>),
}

/// A leader's registration in the flight map. Dropping it without [`Flight::finish`] (the
/// leader's future was dropped) unregisters the flight and closes the channel, which wakes the
/// waiters so one of them can lead instead.
struct Flight<'c> {
    cache: &'c Cache,
    key: CacheKey,
    id: u64,
    tx: watch::Sender<Slot>,
}

impl Flight<'_> {
    /// Unregisters first, then publishes: a request arriving after this point starts a new
    /// fetch instead of receiving an answer to a request it was not concurrent with.
    fn finish(self, outcome: Published) {
        self.unregister();
        self.tx.send_replace(Some(Arc::new(outcome)));
    }

    fn unregister(&self) {
        let mut flights = self.cache.lock_flights();
        if flights.get(&self.key).is_some_and(|(id, _)| *id == self.id) {
            flights.remove(&self.key);
        }
    }
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        // Idempotent after `finish`: the id no longer matches (or the slot is empty).
        self.unregister();
    }
}

/// What one look at the store found.
struct Found {
    fresh: Option<Arc<Entry>>,
    /// An expired entry still inside the stale-if-error window.
    stale: Option<Arc<Entry>>,
}

impl Cache {
    /// Builds the cache from config. With `enabled = false` every call is a pass-through.
    pub fn new(cfg: &CacheConfig) -> Cache {
        let counters = Arc::new(Counters::default());
        let listener_counters = Arc::clone(&counters);
        let store = moka::future::Cache::builder()
            .max_capacity(cfg.max_bytes)
            .weigher(|_key: &CacheKey, entry: &Arc<Entry>| entry.weight())
            .expire_after(EntryExpiry)
            .support_invalidation_closures()
            .eviction_listener(move |_key, entry: Arc<Entry>, cause| {
                // Called for every removal, including the old value of a replaced entry, so
                // `entries`/`bytes` mirror the inserts below exactly. Must not panic (moka would
                // stop calling it).
                let c = &listener_counters;
                c.entries.fetch_sub(1, Ordering::Relaxed);
                c.bytes
                    .fetch_sub(i64::from(entry.weight()), Ordering::Relaxed);
                if cause == RemovalCause::Size {
                    bump(&c.evictions);
                }
            })
            .build();
        let local = Arc::new(Local {
            store,
            epoch: AtomicU64::new(0),
        });
        let shared = match (&cfg.redis_url, cfg.enabled) {
            (Some(url), true) => {
                match redis::Shared::start(cfg, url, Arc::downgrade(&local), Arc::clone(&counters))
                {
                    Ok(shared) => Some(shared),
                    Err(error) => {
                        // `config::validate` opened this URL already; only a client bug lands here.
                        tracing::warn!(kind = ?error.kind(), "redis tier disabled: bad redis_url");
                        None
                    }
                }
            }
            _ => None,
        };
        Cache {
            enabled: cfg.enabled,
            max_ttl_ms: cfg.max_ttl_ms,
            max_bytes: cfg.max_bytes,
            stale_if_error: Duration::from_millis(cfg.stale_if_error_ms),
            keep_local: cfg.local || shared.is_none(),
            local,
            shared,
            flights: Mutex::new(HashMap::new()),
            next_flight: AtomicU64::new(0),
            counters,
        }
    }

    /// Whether the cache is on at all.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Answers one request: from a fresh entry if there is one, else by running `fetch`
    /// (single-flighted), storing the result when [`classify`] allows, and, when the fetch
    /// fails, from an expired entry still inside the stale-if-error window.
    ///
    /// - Lookups try the public key, then the caller's private key: the scope is only known
    ///   after a fetch, so a request can't know in advance where its answer lives.
    /// - Concurrent misses with the same private key (same request, same authorization context)
    ///   share one `fetch`; the others wait for it and get the same outcome — including an
    ///   uncacheable answer or an error, since they were identical requests in flight at the
    ///   same moment. Coalescing never crosses authorization contexts.
    /// - Every body returned carries `id`, whatever id the upstream response had.
    /// - Retries (`is_retry`), non-cacheable methods and a disabled cache skip all of this: one
    ///   `fetch`, its answer re-addressed to `id`, [`Outcome::Bypass`]. Retries are never
    ///   coalesced either: their `inputResponses` are not part of the key.
    ///
    /// Cancel-safe: dropping a waiter affects no one; dropping the leader wakes the waiters and
    /// one of them fetches instead.
    pub async fn get_or_fetch<F, Fut, E>(
        &self,
        key: &KeyInput<'_>,
        partition: &Partition,
        id: &RequestId,
        is_retry: bool,
        fetch: F,
    ) -> Result<Served, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Fetched, E>>,
        E: Clone + Send + Sync + 'static,
    {
        if !self.enabled || is_retry || !is_cacheable_method(key.method) {
            bump(&self.counters.bypassed);
            let fetched = fetch().await?;
            return Ok(Served::passed(
                fetched.status,
                &fetched.message,
                id,
                Outcome::Bypass,
            ));
        }
        let public = cache_key(key, KeyScope::Public);
        let private = cache_key(key, KeyScope::Private(partition));

        let (flight, stale, epoch) = loop {
            let epoch = self.local.epoch.load(Ordering::SeqCst);
            let found = self.lookup(&public, &private).await;
            if let Some(entry) = found.fresh {
                bump(&self.counters.hits);
                return Ok(Served::entry(&entry, id, Outcome::Hit));
            }
            match self.join_or_lead(private) {
                Role::Wait(rx) => {
                    let served = wait(rx)
                        .await
                        .and_then(|p| self.serve_published(&p, id, found.stale, epoch));
                    match served {
                        Some(served) => {
                            bump(&self.counters.coalesced);
                            return served;
                        }
                        // The leader was dropped before it finished: look again, maybe lead.
                        None => continue,
                    }
                }
                Role::Lead(flight) => {
                    // A leader that finished between our lookup and our registration has
                    // stored its answer by now; don't fetch it a second time.
                    let found = self.lookup(&public, &private).await;
                    if let Some(entry) = found.fresh {
                        bump(&self.counters.hits);
                        flight.finish(Published::Entry(Arc::clone(&entry)));
                        return Ok(Served::entry(&entry, id, Outcome::Hit));
                    }
                    break (flight, found.stale, epoch);
                }
            }
        };

        // The shared tier, inside the flight: one Redis lookup per key per replica, however many
        // callers wait. Its generations are what a write after the fetch will be tagged with.
        let mut stale = stale;
        let mut gens = None;
        if let Some(shared) = &self.shared {
            let found = shared.lookup(key, &public, &private).await;
            // An invalidation while Redis answered may postdate the record: don't trust it.
            if self.local.epoch.load(Ordering::SeqCst) == epoch {
                if let Some((scope, entry)) = found.fresh {
                    let local_key = match scope {
                        Scope::Public => public,
                        Scope::Private => private,
                    };
                    self.store_entry(local_key, &entry, epoch).await;
                    flight.finish(Published::Entry(Arc::clone(&entry)));
                    return Ok(Served::entry(&entry, id, Outcome::SharedHit));
                }
                stale = stale.or(found.stale);
                gens = found.gens;
            }
        }

        bump(&self.counters.misses);
        let fetched = match fetch().await {
            Ok(fetched) => fetched,
            Err(error) => {
                flight.finish(Published::Failed(Box::new(error.clone())));
                return self.stale_or(error, stale, id, epoch);
            }
        };
        let decision = if fetched.status == 200 {
            classify(key.method, false, &fetched.message, self.max_ttl_ms)
        } else {
            Decision::NotCacheable(Uncacheable::Status)
        };
        match decision {
            Decision::Cacheable {
                ttl_ms,
                scope,
                result,
            } => {
                let entry = Arc::new(Entry::new(
                    key,
                    result,
                    Duration::from_millis(ttl_ms),
                    self.stale_if_error,
                ));
                let store_key = match scope {
                    Scope::Public => public,
                    Scope::Private => private,
                };
                self.store_entry(store_key, &entry, epoch).await;
                flight.finish(Published::Entry(Arc::clone(&entry)));
                let served = Served::entry(&entry, id, Outcome::Miss);
                if let (Some(shared), Some(gens)) = (&self.shared, gens)
                    && u64::from(entry.weight()) <= self.max_bytes
                    && self.local.epoch.load(Ordering::SeqCst) == epoch
                {
                    // After the waiters are answered; bounded by `redis_timeout_ms`. Awaited
                    // (not spawned) so a replica's next request already finds the record.
                    shared.store(&store_key, scope, &gens, &entry).await;
                }
                Ok(served)
            }
            Decision::NotCacheable(_) => {
                let served = Served::passed(fetched.status, &fetched.message, id, Outcome::Miss);
                flight.finish(Published::Passed {
                    status: fetched.status,
                    message: fetched.message,
                });
                Ok(served)
            }
        }
    }

    async fn lookup(&self, public: &CacheKey, private: &CacheKey) -> Found {
        let now = Instant::now();
        let mut stale = None;
        for key in [public, private] {
            if let Some(entry) = self.local.store.get(key).await {
                if entry.is_fresh(now) {
                    return Found {
                        fresh: Some(entry),
                        stale: None,
                    };
                }
                if stale.is_none() && entry.is_stale_servable(now) {
                    stale = Some(entry);
                }
            }
        }
        Found { fresh: None, stale }
    }

    fn lock_flights(&self) -> MutexGuard<'_, HashMap<CacheKey, (u64, watch::Receiver<Slot>)>> {
        // Nothing panics while the lock is held, but a poisoned map is still a valid map.
        self.flights
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn join_or_lead(&self, key: CacheKey) -> Role<'_> {
        let mut flights = self.lock_flights();
        if let Some((_, rx)) = flights.get(&key) {
            return Role::Wait(rx.clone());
        }
        let (tx, rx) = watch::channel(None);
        let id = self.next_flight.fetch_add(1, Ordering::Relaxed);
        flights.insert(key, (id, rx));
        Role::Lead(Flight {
            cache: self,
            key,
            id,
            tx,
        })
    }

    /// A waiter's answer from its leader's outcome. `None` only if the leader failed with a
    /// different error type than this caller's (never, with one error type per gateway): then
    /// the caller behaves as if the leader had vanished and looks again.
    fn serve_published<E: Clone + 'static>(
        &self,
        published: &Published,
        id: &RequestId,
        stale: Option<Arc<Entry>>,
        epoch: u64,
    ) -> Option<Result<Served, E>> {
        Some(match published {
            Published::Entry(entry) => Ok(Served::entry(entry, id, Outcome::Coalesced)),
            Published::Passed { status, message } => {
                Ok(Served::passed(*status, message, id, Outcome::Coalesced))
            }
            Published::Failed(error) => {
                let error = error.downcast_ref::<E>()?.clone();
                self.stale_or(error, stale, id, epoch)
            }
        })
    }

    /// After a failed fetch: the stale entry if it is still inside its window and no
    /// invalidation happened since it was looked up; else the error.
    fn stale_or<E>(
        &self,
        error: E,
        stale: Option<Arc<Entry>>,
        id: &RequestId,
        epoch: u64,
    ) -> Result<Served, E> {
        match stale {
            Some(entry)
                if entry.is_stale_servable(Instant::now())
                    && self.local.epoch.load(Ordering::SeqCst) == epoch =>
            {
                Ok(self.serve_stale(&entry, id))
            }
            _ => Err(error),
        }
    }

    fn serve_stale(&self, entry: &Entry, id: &RequestId) -> Served {
        bump(&self.counters.stale);
        // `render` writes `ttlMs: 0` for an expired entry: the client must not keep it.
        Served::entry(entry, id, Outcome::Stale)
    }

    async fn store_entry(&self, key: CacheKey, entry: &Arc<Entry>, epoch: u64) {
        let weight = entry.weight();
        if !self.keep_local
            || u64::from(weight) > self.max_bytes
            || self.local.epoch.load(Ordering::SeqCst) != epoch
        {
            return;
        }
        // Counted before the insert, so the listener's decrement for this entry can never run first.
        self.counters.entries.fetch_add(1, Ordering::Relaxed);
        self.counters
            .bytes
            .fetch_add(i64::from(weight), Ordering::Relaxed);
        bump(&self.counters.inserts);
        self.local.store.insert(key, Arc::clone(entry)).await;
        // An invalidation registered while the insert ran may not cover it (moka applies a
        // predicate only to entries written before it): take the entry back out.
        if self.local.epoch.load(Ordering::SeqCst) != epoch {
            self.local.store.invalidate(&key).await;
        }
    }

    // === Invalidation ===

    /// Drops every entry of `backend` + `method`: all partitions, all cursors, public and
    /// private, on every replica. For list-changed notifications, and for an invalid-cursor
    /// error (docs/protocol.md §3: throw every page away).
    pub fn invalidate(&self, backend: &str, method: &str) {
        self.everywhere(Invalidation::Method {
            backend: backend.to_owned(),
            method: method.to_owned(),
        });
    }

    /// Drops the `resources/read` entries of `backend` for `uri` (a resource-updated
    /// notification), on every replica.
    pub fn invalidate_resource(&self, backend: &str, uri: &str) {
        self.everywhere(Invalidation::Resource {
            backend: backend.to_owned(),
            uri: uri.to_owned(),
        });
    }

    /// Drops every entry of `backend` on every replica (e.g. its change stream was broken, so
    /// changes may have been missed, or an operator asked).
    pub fn purge_backend(&self, backend: &str) {
        self.everywhere(Invalidation::Backend {
            backend: backend.to_owned(),
        });
    }

    /// Drops everything *in this replica* only: a config reload here says nothing about the
    /// data the other replicas (or Redis) hold.
    pub fn purge_all(&self) {
        self.local.purge();
    }

    /// Drops everything on every replica and in Redis (an operator's purge).
    pub fn purge_all_replicas(&self) {
        self.everywhere(Invalidation::All);
    }

    /// Tells the other replicas (through Redis, when configured) that the legacy-client session
    /// `digest` names has ended, until `ttl_ms` from now. Whether it reached them.
    pub async fn revoke_session(&self, digest: &[u8; 32], ttl_ms: u64) -> bool {
        match &self.shared {
            Some(shared) => shared.revoke_session(digest, ttl_ms).await,
            None => false,
        }
    }

    /// Whether another replica ended the legacy-client session `digest` names (always `false`
    /// without Redis, or when Redis does not answer within `redis_timeout_ms`).
    pub async fn session_revoked(&self, digest: &[u8; 32]) -> bool {
        match &self.shared {
            Some(shared) => shared.session_revoked(digest).await.unwrap_or(false),
            None => false,
        }
    }

    /// Whether revocations reach other replicas (a Redis tier is configured).
    pub fn shares_revocations(&self) -> bool {
        self.shared.is_some()
    }

    /// Applies `what` here at once, then (in the background) to Redis and the other replicas.
    fn everywhere(&self, what: Invalidation) {
        self.local.apply(&what);
        if let Some(shared) = &self.shared {
            shared.announce(what);
        }
    }

    /// The counters, for the metrics layer.
    pub fn stats(&self) -> CacheStats {
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let gauge = |a: &AtomicI64| u64::try_from(a.load(Ordering::Relaxed)).unwrap_or(0);
        CacheStats {
            hits: load(&c.hits),
            misses: load(&c.misses),
            coalesced: load(&c.coalesced),
            stale: load(&c.stale),
            bypassed: load(&c.bypassed),
            inserts: load(&c.inserts),
            evictions: load(&c.evictions),
            entries: gauge(&c.entries),
            bytes: gauge(&c.bytes),
            redis_hits: load(&c.redis_hits),
            redis_misses: load(&c.redis_misses),
            redis_writes: load(&c.redis_writes),
            redis_errors: load(&c.redis_errors),
            redis_published: load(&c.redis_published),
            redis_received: load(&c.redis_received),
        }
    }

    /// Status page: `None` without a Redis tier; else its last failure (when, why), if any.
    pub fn redis_last_error(&self) -> Option<Option<(std::time::SystemTime, String)>> {
        let last = || self.counters.redis_last_error.lock().ok()?.clone();
        self.shared.as_ref().map(|_| last())
    }

    /// Runs moka's pending maintenance (expiry, eviction, invalidation sweeps) now, so
    /// [`Cache::stats`] settles. Optional: moka also runs it as the cache is used.
    pub async fn run_pending_tasks(&self) {
        self.local.store.run_pending_tasks().await;
    }
}

/// Waits for the leader's outcome; `None` when the leader went away without one.
async fn wait(mut rx: watch::Receiver<Slot>) -> Option<Arc<Published>> {
    // `wait_for` looks at the current value before checking for a closed channel, so an
    // outcome published just before the leader's sender dropped is still seen.
    let slot = rx.wait_for(Option::is_some).await.ok()?;
    slot.clone()
}

#[cfg(test)]
mod tests;
