//! The shared tier: a Redis every replica talks to, behind each replica's local (moka) tier.
//! It holds cached results, so a list fetched by one replica is a hit on the others, and it
//! carries invalidations, so a change seen by one replica reaches all of them.
//!
//! Owns: the Redis key layout, the record format, invalidation generations, the pub/sub channel
//! (publishing and the subscriber task), and the degrade rules.
//! Must not: decide what is cacheable or build keys from request text (the caller hands it
//! [`CacheKey`] digests, so no request text or credential ever reaches Redis), or fail a request:
//! every call has a short deadline and any failure reads as "Redis has nothing".
//! Called by: [`super::Cache`] only.
//!
//! Layout, under `<prefix>:v1:` (`redis_prefix`, default `portico`):
//! - `e:<hex key>`: one record (see [`Record`]), `SET … PX <fresh + stale window left>`.
//! - `g:all`, `g:b:<backend>`, `g:m:<backend>:<method>`, `g:u:<hex digest of backend, uri>`:
//!   invalidation generations, plain integers bumped with `INCR`.
//! - channel `invalidate`: one JSON message per invalidation, for the other replicas' local tiers.
//! - `s:revoked:<hex digest>`: a legacy-client session ended by `DELETE` on some replica,
//!   `PX` until the session's own expiry (`legacy`); read on every request of such a session.
//!
//! Invalidation is O(1): a record stores the generations its request depended on (all, its
//! backend, its backend + method, for `resources/read` its URI, and for an aggregated
//! endpoint's merged answer each member's backend and backend + method) as they were read *before*
//! the fetch; a lookup reads the record and the current generations in one `MULTI` and treats any
//! difference as a miss. Invalidating is one `INCR` — no `SCAN`, no tag sets — and a fetch that
//! raced an invalidation anywhere is stored dead on arrival.
//!
//! A generation key that does not exist is created with a random value (`SET NX`) before it is
//! read or bumped, never from 0. So when one vanishes — expiry ([`GEN_MARGIN`] past the longest
//! record life, refreshed by every bump) or Redis evicting it under `maxmemory` — its next life
//! starts at a value no old record carries, and those records become misses instead of
//! coming back to life.

use ::redis::aio::ConnectionManager;
use ::redis::{Client, RedisError};
use bytes::Bytes;
use futures_util::StreamExt;
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::watch;

use super::entry::{Entry, MAX_WINDOW};
use super::key::{CacheKey, KeyHasher, KeyInput};
use super::{Counters, Invalidation, Local, Scope, bump};
use crate::config::CacheConfig;

/// Record format version; a change gets a new key prefix (`v2`), so old and new replicas
/// never read each other's records during a rolling update.
const FORMAT: &str = "v1";
/// First byte of every record.
const MAGIC: u8 = 0xC1;
/// After a failed or timed-out call, Redis is skipped for this long, so an unreachable Redis
/// costs one timeout per second instead of one per request. The connection manager reconnects
/// in the background meanwhile (and [`DataConn`] replaces a connection that went silent).
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// Opening a connection (TCP + TLS + AUTH) may take longer than one call's budget; it runs in
/// the background and requests don't wait for it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the subscription is asked whether it is alive (a `PING` on its connection, to be
/// answered within `CONNECT_TIMEOUT`): a connection that died without a word (a partition, a
/// Redis host gone) would otherwise leave this replica deaf to invalidations while it lasted.
const SUBSCRIPTION_CHECK_EVERY: Duration = Duration::from_secs(5);
/// Subscriber reconnect backoff.
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Generation keys outlive the longest record by this much (clock and config slack).
const GEN_MARGIN: Duration = Duration::from_secs(3600);

/// The generations one record depends on, in key order (see [`gen_keys`]).
pub(super) type Gens = Vec<i64>;

/// What a Redis lookup found.
#[derive(Default)]
pub(super) struct Found {
    /// The current generations, when Redis answered; `None` means "don't write either".
    pub gens: Option<Gens>,
    pub fresh: Option<(Scope, Arc<Entry>)>,
    /// Expired but inside the writer's stale-if-error window.
    pub stale: Option<Arc<Entry>>,
}

/// Timed-out calls in a row after which the data connection is replaced (see [`DataConn`]).
const SILENT_CALLS_BEFORE_RENEWAL: u32 = 2;

/// The data connection. The connection manager reconnects when its connection fails, but not
/// when it merely stops answering (a partition, a Redis host gone without a word: every call
/// times out, and would for as long as the socket stays open). So after
/// [`SILENT_CALLS_BEFORE_RENEWAL`] timed-out calls in a row the manager is replaced by a new
/// one, which connects afresh — at most once per [`RETRY_AFTER`], however many calls in
/// flight time out together; calls already holding the old one finish or time out on it.
struct DataConn {
    client: Client,
    cfg: ::redis::aio::ConnectionManagerConfig,
    /// The manager, and when it was made.
    current: std::sync::Mutex<(ConnectionManager, Instant)>,
    silent: AtomicU32,
}

impl DataConn {
    fn new(
        client: Client,
        cfg: ::redis::aio::ConnectionManagerConfig,
    ) -> Result<DataConn, RedisError> {
        let current = ConnectionManager::new_lazy_with_config(client.clone(), cfg.clone())?;
        Ok(DataConn {
            client,
            cfg,
            current: std::sync::Mutex::new((current, Instant::now())),
            silent: AtomicU32::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (ConnectionManager, Instant)> {
        self.current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn get(&self) -> ConnectionManager {
        self.lock().0.clone()
    }

    fn answered(&self) {
        self.silent.store(0, Ordering::Relaxed);
    }

    fn timed_out(&self) {
        if self.silent.fetch_add(1, Ordering::Relaxed) + 1 < SILENT_CALLS_BEFORE_RENEWAL {
            return;
        }
        let mut current = self.lock();
        if current.1.elapsed() < RETRY_AFTER {
            return; // renewed a moment ago: these timed out on the old one
        }
        self.silent.store(0, Ordering::Relaxed);
        match ConnectionManager::new_lazy_with_config(self.client.clone(), self.cfg.clone()) {
            Ok(fresh) => {
                *current = (fresh, Instant::now());
                tracing::warn!("redis stopped answering on its connection; connecting afresh");
            }
            Err(error) => tracing::warn!(%error, "redis: cannot open a new connection"),
        }
    }
}

/// The Redis tier of one cache.
pub(super) struct Shared {
    data: Arc<DataConn>,
    /// `<prefix>:v1:`
    ns: String,
    channel: String,
    /// Random per process: our own messages come back to us on the channel and are skipped.
    instance: String,
    timeout: Duration,
    /// How long any record can live, from config: sets the generation keys' expiry.
    gen_ttl_ms: u64,
    /// Skip Redis until then (see [`RETRY_AFTER`]); `None` while healthy.
    down_until: std::sync::Mutex<Option<Instant>>,
    /// Invalidations not yet counted by Redis (`INCR` in flight or being retried). While any
    /// are, lookups skip Redis: a record read now might be one they are about to kill.
    pending: Arc<AtomicU64>,
    counters: Arc<Counters>,
    /// Dropped with the cache: the subscriber stops.
    alive: watch::Sender<()>,
}

/// One message on the invalidation channel.
#[derive(Serialize, Deserialize)]
struct Message {
    from: String,
    #[serde(flatten)]
    what: Invalidation,
}

impl Shared {
    /// Connects lazily (a Redis that is down at start only costs hits) and starts the
    /// subscriber. `url` was checked by `config::validate`.
    pub fn start(
        cfg: &CacheConfig,
        url: &str,
        local: Weak<Local>,
        counters: Arc<Counters>,
    ) -> Result<Shared, RedisError> {
        let client = Client::open(url)?;
        let manager_cfg = ::redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(RETRY_AFTER);
        let data = Arc::new(DataConn::new(client.clone(), manager_cfg)?);
        let ns = format!("{}:{FORMAT}:", cfg.redis_prefix);
        let window = Duration::from_millis(cfg.max_ttl_ms).min(MAX_WINDOW)
            + Duration::from_millis(cfg.stale_if_error_ms).min(MAX_WINDOW);
        let shared = Shared {
            data,
            channel: format!("{ns}invalidate"),
            ns,
            instance: random_id(),
            timeout: Duration::from_millis(cfg.redis_timeout_ms),
            gen_ttl_ms: u64::try_from((window + GEN_MARGIN).as_millis()).unwrap_or(u64::MAX),
            down_until: std::sync::Mutex::new(None),
            pending: Arc::new(AtomicU64::new(0)),
            counters,
            alive: watch::channel(()).0,
        };
        // Open the data connection now, in the background, so the first request finds it.
        let mut warm = shared.data.get();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(
                CONNECT_TIMEOUT,
                ::redis::cmd("PING").query_async::<()>(&mut warm),
            )
            .await;
        });
        tokio::spawn(subscribe(
            client,
            shared.channel.clone(),
            shared.instance.clone(),
            local,
            Arc::clone(&shared.counters),
            shared.alive.subscribe(),
        ));
        Ok(shared)
    }

    /// Looks `public` and `private` up, with the current generations, in one round trip.
    pub async fn lookup(
        &self,
        input: &KeyInput<'_>,
        public: &CacheKey,
        private: &CacheKey,
    ) -> Found {
        if self.pending.load(Ordering::SeqCst) > 0 {
            return Found::default();
        }
        let gens = gen_keys(&self.ns, input);
        let (pub_key, priv_key) = (self.entry_key(public), self.entry_key(private));
        let mut pipe = ::redis::pipe();
        pipe.atomic();
        let seed = random_generation();
        for key in &gens {
            self.init_generation(&mut pipe, key, seed);
        }
        pipe.cmd("MGET")
            .arg(&pub_key)
            .arg(&priv_key)
            .arg(&gens)
            .cmd("PTTL")
            .arg(&pub_key)
            .cmd("PTTL")
            .arg(&priv_key);
        let mut conn = self.data.get();
        type Reply = (Vec<Option<Vec<u8>>>, i64, i64);
        let Some((values, pub_ttl, priv_ttl)) =
            self.call(pipe.query_async::<Reply>(&mut conn)).await
        else {
            return Found::default();
        };
        let Some((records, current)) = values.split_first_chunk::<2>() else {
            return Found::default();
        };
        // Every generation exists (created above, in the same transaction); a missing or odd
        // one means something else wrote there: trust nothing.
        let Some(current) = current
            .iter()
            .map(|v| v.as_deref().and_then(parse_int))
            .collect::<Option<Gens>>()
        else {
            return Found::default();
        };
        let now = Instant::now();
        let mut found = Found::default();
        for (bytes, pttl, scope) in [
            (&records[0], pub_ttl, Scope::Public),
            (&records[1], priv_ttl, Scope::Private),
        ] {
            let Some(record) = bytes.as_deref().and_then(Record::decode) else {
                continue;
            };
            // A record under the other half's key, or from before an invalidation, is a miss.
            if record.scope != scope || record.gens != current || pttl <= 0 {
                continue;
            }
            let left = Duration::from_millis(pttl.unsigned_abs());
            let stale = Duration::from_millis(record.stale_ms);
            let fresh = left.saturating_sub(stale);
            let entry = Arc::new(Entry::new(
                input,
                Bytes::copy_from_slice(record.result),
                fresh,
                left.min(stale),
            ));
            if entry.is_fresh(now) {
                found.fresh = Some((scope, entry));
                break;
            }
            if found.stale.is_none() {
                found.stale = Some(entry);
            }
        }
        if found.fresh.is_some() {
            bump(&self.counters.redis_hits);
        } else {
            bump(&self.counters.redis_misses);
        }
        found.gens = Some(current);
        found
    }

    /// Writes `entry` under `key` for what is left of its life, tagged with the generations
    /// read before its fetch.
    pub async fn store(&self, key: &CacheKey, scope: Scope, gens: &Gens, entry: &Entry) {
        let now = Instant::now();
        let left = entry.stale_until.saturating_duration_since(now);
        let px = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
        if px == 0 {
            return;
        }
        let stale_ms = u64::try_from(
            entry
                .stale_until
                .saturating_duration_since(entry.fresh_until.max(now))
                .as_millis(),
        )
        .unwrap_or(u64::MAX);
        let record = Record {
            scope,
            stale_ms,
            gens: gens.clone(),
            result: &entry.result,
        }
        .encode();
        let mut cmd = ::redis::cmd("SET");
        cmd.arg(self.entry_key(key)).arg(record).arg("PX").arg(px);
        let mut conn = self.data.get();
        if self.call(cmd.query_async::<()>(&mut conn)).await.is_some() {
            bump(&self.counters.redis_writes);
        }
    }

    /// Tells Redis and the other replicas: `INCR` the generation (so no replica reads a record
    /// from before it), then `PUBLISH` (so their local tiers drop theirs). Runs in the
    /// background; retried until it lands or until every record it could concern has expired.
    pub fn announce(&self, what: Invalidation) {
        let gen_key = match &what {
            Invalidation::All => format!("{}g:all", self.ns),
            Invalidation::Backend { backend } => format!("{}g:b:{backend}", self.ns),
            Invalidation::Method { backend, method } => {
                format!("{}g:m:{backend}:{method}", self.ns)
            }
            Invalidation::Resource { backend, uri } => uri_gen_key(&self.ns, backend, uri),
        };
        let message = Message {
            from: self.instance.clone(),
            what,
        };
        let Ok(message) = serde_json::to_string(&message) else {
            return;
        };
        let mut pipe = ::redis::pipe();
        pipe.atomic();
        self.init_generation(&mut pipe, &gen_key, random_generation());
        pipe.cmd("INCR")
            .arg(&gen_key)
            .ignore()
            .cmd("PEXPIRE")
            .arg(&gen_key)
            .arg(self.gen_ttl_ms)
            .ignore()
            .cmd("PUBLISH")
            .arg(&self.channel)
            .arg(message)
            .ignore();
        let data = Arc::clone(&self.data);
        let pending = Arc::clone(&self.pending);
        let counters = Arc::clone(&self.counters);
        let timeout = self.timeout;
        // Not tied to this cache's life: a reload drops the cache, but the other replicas must
        // still hear about the change.
        let give_up = Instant::now() + Duration::from_millis(self.gen_ttl_ms);
        pending.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(async move {
            let mut backoff = MIN_BACKOFF;
            loop {
                // The current connection at each attempt: a silent one is replaced meanwhile.
                let mut conn = data.get();
                match tokio::time::timeout(timeout, pipe.query_async::<()>(&mut conn)).await {
                    Ok(Ok(())) => {
                        data.answered();
                        bump(&counters.redis_published);
                        break;
                    }
                    Ok(Err(e)) if !e.is_timeout() => bump(&counters.redis_errors),
                    _ => {
                        data.timed_out();
                        bump(&counters.redis_errors);
                    }
                }
                if Instant::now() >= give_up {
                    break;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            pending.fetch_sub(1, Ordering::SeqCst);
        });
    }

    /// Creates the generation `key` with `seed` unless it exists (see the module doc).
    fn init_generation(&self, pipe: &mut ::redis::Pipeline, key: &str, seed: i64) {
        pipe.cmd("SET")
            .arg(key)
            .arg(seed)
            .arg("NX")
            .arg("PX")
            .arg(self.gen_ttl_ms)
            .ignore();
    }

    /// Records a revoked legacy-client session (`digest` names it) until `ttl_ms` from now
    /// (its expiry: after that the id is refused anyway). Whether Redis took it.
    pub async fn revoke_session(&self, digest: &[u8; 32], ttl_ms: u64) -> bool {
        if ttl_ms == 0 {
            return true;
        }
        let mut cmd = ::redis::cmd("SET");
        cmd.arg(self.revoked_key(digest))
            .arg(1)
            .arg("PX")
            .arg(ttl_ms);
        let mut conn = self.data.get();
        self.call(cmd.query_async::<()>(&mut conn)).await.is_some()
    }

    /// Whether another replica revoked the session `digest` names; `None` when Redis did not
    /// answer.
    pub async fn session_revoked(&self, digest: &[u8; 32]) -> Option<bool> {
        let mut cmd = ::redis::cmd("EXISTS");
        cmd.arg(self.revoked_key(digest));
        let mut conn = self.data.get();
        self.call(cmd.query_async::<i64>(&mut conn))
            .await
            .map(|n| n > 0)
    }

    fn revoked_key(&self, digest: &[u8; 32]) -> String {
        format!("{}s:revoked:{}", self.ns, hex::encode(digest))
    }

    fn entry_key(&self, key: &CacheKey) -> String {
        format!("{}e:{}", self.ns, hex::encode(key.as_bytes()))
    }

    /// Runs one Redis call within the budget. `None` on error, timeout, or while Redis is
    /// marked down; failures are counted and logged once per outage.
    async fn call<T>(&self, call: impl Future<Output = Result<T, RedisError>>) -> Option<T> {
        {
            let down = self.lock_down();
            if down.is_some_and(|until| Instant::now() < until) {
                return None;
            }
        }
        let error = match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(value)) => {
                self.data.answered();
                if self.lock_down().take().is_some() {
                    tracing::info!("redis reachable again; shared cache tier back in use");
                }
                return Some(value);
            }
            Ok(Err(e)) => {
                if e.is_timeout() {
                    // The manager's own response timeout: silence all the same.
                    self.data.timed_out();
                }
                format!("{:?}: {e}", e.kind())
            }
            Err(_) => {
                self.data.timed_out();
                format!("no answer within {} ms", self.timeout.as_millis())
            }
        };
        bump(&self.counters.redis_errors);
        self.counters.redis_failed(&error); // status page
        let was_up = self
            .lock_down()
            .replace(Instant::now() + RETRY_AFTER)
            .is_none();
        if was_up {
            tracing::warn!(%error, "redis unavailable; serving from the local tier and backends");
        }
        None
    }

    fn lock_down(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.down_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Keeps one subscription to the channel and applies other replicas' invalidations to `local`.
/// Reconnects with backoff; after any gap (including a Redis that was down at start), the local
/// tier is purged, because invalidations may have been published while nobody listened.
async fn subscribe(
    client: Client,
    channel: String,
    instance: String,
    local: Weak<Local>,
    counters: Arc<Counters>,
    mut alive: watch::Receiver<()>,
) {
    let mut backoff = MIN_BACKOFF;
    let mut gap = false;
    loop {
        let attempt = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            Ok::<_, RedisError>(pubsub)
        };
        let subscribed = tokio::select! {
            r = tokio::time::timeout(CONNECT_TIMEOUT, attempt) => r.ok().and_then(Result::ok),
            _ = alive.changed() => return,
        };
        if let Some(pubsub) = subscribed {
            let Some(l) = local.upgrade() else { return };
            if gap {
                l.purge();
                tracing::info!("invalidation channel resubscribed; local tier purged");
            }
            drop(l);
            backoff = MIN_BACKOFF;
            let (mut sink, mut messages) = pubsub.split();
            let first_check = tokio::time::Instant::now() + SUBSCRIPTION_CHECK_EVERY;
            let mut check = tokio::time::interval_at(first_check, SUBSCRIPTION_CHECK_EVERY);
            loop {
                let msg = tokio::select! {
                    m = messages.next() => m,
                    _ = check.tick() => {
                        let ping = sink.ping::<::redis::Value>();
                        if matches!(tokio::time::timeout(CONNECT_TIMEOUT, ping).await, Ok(Ok(_))) {
                            continue;
                        }
                        tracing::warn!(timeout_ms = CONNECT_TIMEOUT.as_millis() as u64,
                            "the invalidation channel did not answer a ping; subscribing again");
                        break;
                    }
                    _ = alive.changed() => return,
                };
                let Some(msg) = msg else { break };
                let Ok(message) = serde_json::from_slice::<Message>(msg.get_payload_bytes()) else {
                    continue;
                };
                if message.from == instance {
                    continue;
                }
                let Some(l) = local.upgrade() else { return };
                l.apply(&message.what);
                bump(&counters.redis_received);
            }
            tracing::debug!("invalidation channel lost");
        }
        gap = true;
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = alive.changed() => return,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// The generation keys a request's record depends on, in a fixed order.
fn gen_keys(ns: &str, input: &KeyInput<'_>) -> Vec<String> {
    let mut keys = vec![
        format!("{ns}g:all"),
        format!("{ns}g:b:{}", input.backend),
        format!("{ns}g:m:{}:{}", input.backend, input.method),
    ];
    if let Some(uri) = super::entry::read_uri(input) {
        keys.push(uri_gen_key(ns, input.backend, &uri));
    }
    // A merged answer (aggregated endpoint) also dies with any member's change.
    for member in input.covers {
        keys.push(format!("{ns}g:b:{member}"));
        keys.push(format!("{ns}g:m:{member}:{}", input.method));
    }
    keys
}

/// URIs are client- and server-chosen text: hashed, so the key is short and well-formed.
fn uri_gen_key(ns: &str, backend: &str, uri: &str) -> String {
    let mut h = KeyHasher::new(b"portico/cache-uri-generation/v1");
    h.field(backend.as_bytes());
    h.field(uri.as_bytes());
    format!("{ns}g:u:{}", hex::encode(h.finish()))
}

/// A record as stored in Redis: `MAGIC, scope (0 public / 1 private), generation count (u8),
/// stale window ms (u64 LE), generations (i64 LE each), result bytes`. The backend, method and
/// URI are not stored: the key digest covers them and the reader knows them from its request.
struct Record<'a> {
    scope: Scope,
    /// The stale-if-error window that follows freshness (what remains of it at write time).
    stale_ms: u64,
    gens: Gens,
    result: &'a [u8],
}

impl<'a> Record<'a> {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(11 + 8 * self.gens.len() + self.result.len());
        out.push(MAGIC);
        out.push(match self.scope {
            Scope::Public => 0,
            Scope::Private => 1,
        });
        // At most four generations (see `gen_keys`).
        out.push(u8::try_from(self.gens.len()).unwrap_or(u8::MAX));
        out.extend_from_slice(&self.stale_ms.to_le_bytes());
        for g in &self.gens {
            out.extend_from_slice(&g.to_le_bytes());
        }
        out.extend_from_slice(self.result);
        out
    }

    /// `None` for anything malformed (another writer, a format change): a miss, never an error.
    fn decode(bytes: &'a [u8]) -> Option<Record<'a>> {
        let (&[magic, scope, n], rest) = bytes.split_first_chunk::<3>()?;
        if magic != MAGIC {
            return None;
        }
        let scope = match scope {
            0 => Scope::Public,
            1 => Scope::Private,
            _ => return None,
        };
        let (stale, mut rest) = rest.split_first_chunk::<8>()?;
        let mut gens = Vec::with_capacity(usize::from(n));
        for _ in 0..n {
            let (g, tail) = rest.split_first_chunk::<8>()?;
            gens.push(i64::from_le_bytes(*g));
            rest = tail;
        }
        // The result is a JSON object (see `classify`); anything else was not written by us.
        if rest.first() != Some(&b'{') || rest.last() != Some(&b'}') {
            return None;
        }
        Some(Record {
            scope,
            stale_ms: u64::from_le_bytes(*stale),
            gens,
            result: rest,
        })
    }
}

fn parse_int(bytes: &[u8]) -> Option<i64> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// A fresh generation's first value: random, and below 2^62 so `INCR` can never overflow.
fn random_generation() -> i64 {
    let mut bytes = [0u8; 8];
    if SystemRandom::new().fill(&mut bytes).is_err() {
        // Without randomness, the clock still differs from any earlier life of the key.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        bytes = (nanos as u64).to_le_bytes();
    }
    i64::try_from(u64::from_le_bytes(bytes) >> 2).unwrap_or(1)
}

fn random_id() -> String {
    let mut bytes = [0u8; 16];
    // A failed RNG only weakens self-message filtering (we'd apply our own invalidation twice,
    // which is harmless), so fall back to the clock.
    if SystemRandom::new().fill(&mut bytes).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        bytes = nanos.to_le_bytes();
    }
    hex::encode(bytes)
}

/// `redis` is reached through the `Shared` type only, so the tests below cover the pure parts.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_and_rejects_garbage() {
        let r = Record {
            scope: Scope::Private,
            stale_ms: 1234,
            gens: vec![0, 7, -1],
            result: br#"{"tools":[]}"#,
        };
        let bytes = r.encode();
        let back = Record::decode(&bytes).expect("decodes");
        assert_eq!(back.scope, Scope::Private);
        assert_eq!(back.stale_ms, 1234);
        assert_eq!(back.gens, vec![0, 7, -1]);
        assert_eq!(back.result, br#"{"tools":[]}"#);
        assert!(Record::decode(b"").is_none());
        assert!(Record::decode(&bytes[..bytes.len() - 1]).is_none());
        assert!(Record::decode(&bytes[..12]).is_none());
        let mut wrong = bytes.clone();
        wrong[0] = 0;
        assert!(Record::decode(&wrong).is_none());
    }

    #[test]
    fn generation_keys_name_what_they_cover() {
        let input = KeyInput {
            backend: "b1",
            credential_id: "",
            method: "resources/read",
            params: Some(r#""file:///a b""#),
            protocol_version: "2026-07-28",
            capabilities: None,
            client_info: None,
            covers: &[],
        };
        let keys = gen_keys("p:v1:", &input);
        assert_eq!(
            keys[..3],
            ["p:v1:g:all", "p:v1:g:b:b1", "p:v1:g:m:b1:resources/read"]
        );
        assert_eq!(keys[3], uri_gen_key("p:v1:", "b1", "file:///a b"));
        assert!(keys[3].starts_with("p:v1:g:u:") && !keys[3].contains(' '));
        let list = KeyInput {
            method: "tools/list",
            params: None,
            ..input
        };
        assert_eq!(gen_keys("p:v1:", &list).len(), 3);
        let merged = KeyInput {
            backend: "/mcp#1",
            covers: &["b1".into(), "b2".into()],
            ..list
        };
        assert_eq!(
            gen_keys("p:v1:", &merged)[3..],
            [
                "p:v1:g:b:b1",
                "p:v1:g:m:b1:tools/list",
                "p:v1:g:b:b2",
                "p:v1:g:m:b2:tools/list"
            ]
        );
    }

    #[test]
    fn messages_round_trip() {
        let m = Message {
            from: "x".into(),
            what: Invalidation::Method {
                backend: "b".into(),
                method: "tools/list".into(),
            },
        };
        let text = serde_json::to_string(&m).expect("json");
        assert_eq!(
            text,
            r#"{"from":"x","op":"method","backend":"b","method":"tools/list"}"#
        );
        let back: Message = serde_json::from_str(&text).expect("parses");
        assert_eq!(back.what, m.what);
        let all: Message = serde_json::from_str(r#"{"from":"y","op":"all"}"#).expect("parses");
        assert_eq!(all.what, Invalidation::All);
    }
}
