//! The shared list cache: `complete` results of the six cacheable methods (digest §3), kept for
//! the server's `ttlMs` under a key that says whose data it is (`cacheScope`).
//!
//! Owns: what may be stored ([`classify`]), the key ([`cache_key`]), the moka store (per-entry
//! expiry, a byte budget), single-flight coalescing of concurrent misses, stale-if-error,
//! invalidation, and the counters ([`CacheStats`]).
//! Must not: do IO of its own (the caller hands [`Cache::get_or_fetch`] a `fetch` future), build
//! error responses (only `error.rs` does), or know metric names (it exposes numbers; `metrics.rs`
//! names them).
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
//! - An invalidation takes effect for every lookup that starts after it returns, and a fetch that
//!   was in flight when it happened is not stored.

use bytes::{Bytes, BytesMut};
use moka::Expiry;
use moka::notification::RemovalCause;
use ring::digest;
use serde::Deserialize;
use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;
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

/// Freshness and the stale-if-error window are each clamped to this. It keeps `Instant`
/// arithmetic far from overflow (which would panic) and moka's expiry well inside its limits,
/// whatever the config says; a list cached for over a year is a configuration mistake anyway.
const MAX_WINDOW: Duration = Duration::from_secs(365 * 24 * 3600);

/// Bytes charged per entry on top of its body: the 32-byte key, the `Entry` struct, and moka's
/// own per-entry bookkeeping (an estimate; it only has to keep many tiny entries from looking free).
const ENTRY_OVERHEAD_BYTES: usize = 160;

/// Canonical-JSON recursion limit. Deeper input is hashed as raw text instead (still a correct
/// key, only without key-order normalisation), so hostile nesting cannot exhaust the stack.
const CANON_MAX_DEPTH: usize = 64;

// === What may be cached ===

/// Whose data a result is, from its `cacheScope`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// No user-specific data: one entry for every caller of the backend and upstream credential.
    Public,
    /// Reusable only within the same authorization context.
    Private,
}

/// Why a response was not stored (for logs and tests; callers don't branch on it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Uncacheable {
    /// Not one of the six methods whose results carry `ttlMs`/`cacheScope`.
    Method,
    /// An MRTR retry (`inputResponses`/`requestState`): MUST NOT be cached (digest §3).
    Retry,
    /// The upstream answered with an HTTP status other than 200.
    Status,
    /// Not a JSON object with an object `result`, or `resultType`/`ttlMs`/`cacheScope` given twice.
    Malformed,
    /// A JSON-RPC error.
    Error,
    /// `resultType` other than `"complete"` (e.g. `input_required`).
    NotComplete,
    /// `ttlMs` absent, zero, negative, or not a number: stale at once (digest §3).
    NoTtl,
    /// Larger than the whole byte budget.
    TooLarge,
}

impl Uncacheable {
    /// A static label for logs.
    pub fn reason(self) -> &'static str {
        match self {
            Uncacheable::Method => "method",
            Uncacheable::Retry => "retry",
            Uncacheable::Status => "status",
            Uncacheable::Malformed => "malformed",
            Uncacheable::Error => "error",
            Uncacheable::NotComplete => "not_complete",
            Uncacheable::NoTtl => "no_ttl",
            Uncacheable::TooLarge => "too_large",
        }
    }
}

/// The verdict of [`classify`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Cacheable {
        /// Freshness in ms, already capped by `max_ttl_ms`; always > 0.
        ttl_ms: u64,
        scope: Scope,
        /// The `result` object with `ttlMs` removed, compact at the top level, member values
        /// byte for byte as received. Always starts with `{` and ends with `}`; `{}` when empty.
        result: Bytes,
    },
    NotCacheable(Uncacheable),
}

/// Decides whether a JSON-RPC response `message` (the whole `{"jsonrpc","id","result"}` text)
/// to a `method` request may be stored, for how long and for whom. Pure.
///
/// Rules (digest §3): absent `resultType` counts as `complete` (the bridge normalises legacy
/// results); `ttlMs` absent, `0`, negative or not a number means "stale at once", so nothing is
/// stored; fractional values are floored; `cacheScope` anything but `"public"` — including
/// absent, which the spec leaves open (§8 item 1) — is treated as `"private"`, the safe reading.
pub fn classify(method: &str, is_retry: bool, message: &[u8], max_ttl_ms: u64) -> Decision {
    use Decision::NotCacheable as No;
    if !is_cacheable_method(method) {
        return No(Uncacheable::Method);
    }
    if is_retry {
        return No(Uncacheable::Retry);
    }
    #[derive(Deserialize)]
    struct Response<'a> {
        #[serde(borrow)]
        result: Option<&'a RawValue>,
        #[serde(borrow)]
        error: Option<&'a RawValue>,
    }
    let Ok(text) = std::str::from_utf8(message) else {
        return No(Uncacheable::Malformed);
    };
    let Ok(response) = serde_json::from_str::<Response>(text) else {
        return No(Uncacheable::Malformed);
    };
    if response.error.is_some_and(|e| e.get() != "null") {
        return No(Uncacheable::Error);
    }
    let Some(result) = response.result else {
        return No(Uncacheable::Malformed);
    };
    let Some(Members(members)) = parse_members(result.get()) else {
        return No(Uncacheable::Malformed);
    };

    // Each of the three fields we act on must appear at most once: with duplicates, which one the
    // client honours is parser-dependent, and guessing wrong could mislabel a private result.
    let mut result_type = None;
    let mut ttl = None;
    let mut scope = None;
    for (name, value) in &members {
        let slot = match name.as_str() {
            "resultType" => &mut result_type,
            "ttlMs" => &mut ttl,
            "cacheScope" => &mut scope,
            _ => continue,
        };
        if slot.replace(*value).is_some() {
            return No(Uncacheable::Malformed);
        }
    }
    if let Some(rt) = result_type
        && json_str(rt).as_deref() != Some("complete")
    {
        return No(Uncacheable::NotComplete);
    }
    let ttl_ms = ttl.map_or(0, ttl_from_raw).min(max_ttl_ms);
    if ttl_ms == 0 {
        return No(Uncacheable::NoTtl);
    }
    let scope = match scope.and_then(json_str).as_deref() {
        Some("public") => Scope::Public,
        _ => Scope::Private,
    };

    // Rebuild the object without `ttlMs`, so a hit can append the remaining freshness instead.
    let mut out = Vec::with_capacity(result.get().len());
    out.push(b'{');
    let mut first = true;
    for (name, value) in &members {
        if name == "ttlMs" {
            continue;
        }
        if !first {
            out.push(b',');
        }
        first = false;
        let Ok(name) = serde_json::to_string(name) else {
            return No(Uncacheable::Malformed);
        };
        out.extend_from_slice(name.as_bytes());
        out.push(b':');
        out.extend_from_slice(value.get().as_bytes());
    }
    out.push(b'}');
    Decision::Cacheable {
        ttl_ms,
        scope,
        result: Bytes::from(out),
    }
}

/// `ttlMs` as whole milliseconds; 0 for anything that is not a positive finite number.
fn ttl_from_raw(raw: &RawValue) -> u64 {
    match raw.get().parse::<f64>() {
        // `as` saturates, so a huge value becomes u64::MAX and the cap applies.
        Ok(v) if v.is_finite() && v > 0.0 => v.floor() as u64,
        _ => 0,
    }
}

fn json_str(raw: &RawValue) -> Option<String> {
    serde_json::from_str(raw.get()).ok()
}

// === Whose it is: partitions and the key ===

/// The caller's authorization context, which partitions `private` entries.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Partition {
    /// No credential at all. Still a partition of its own: anonymous callers share with each
    /// other, never with credentialed ones.
    Anonymous,
    /// SHA-256 of the client's `Authorization` header value (see [`Partition::from_authorization`]).
    Credential([u8; 32]),
    /// An authenticated principal id, once portico authenticates callers itself.
    Principal(String),
}

impl Partition {
    /// The partition for a raw `Authorization` header value. Only a digest is kept, so the secret
    /// never sits in memory as a map key. The exact bytes are hashed: two spellings of one token
    /// (`Bearer` vs `bearer`) get two partitions, which costs hits but never leaks. Digest §8
    /// item 3: "a different access token requires a different cache" — the token is the
    /// conservative unit until there is a principal.
    pub fn from_authorization(value: Option<&[u8]>) -> Partition {
        match value {
            None | Some([]) => Partition::Anonymous,
            Some(v) => {
                let mut h = KeyHasher::new(b"portico/cache-partition/v1");
                h.field(v);
                Partition::Credential(h.finish())
            }
        }
    }
}

/// The request facts that shape a cacheable result. All borrowed; building one costs nothing.
#[derive(Clone, Copy, Debug)]
pub struct KeyInput<'a> {
    /// The backend (route) name.
    pub backend: &'a str,
    /// Which upstream credential portico used for this backend (empty when none).
    pub credential_id: &'a str,
    pub method: &'a str,
    /// The param that selects the result, as raw JSON: `cursor` for lists, `uri` for
    /// `resources/read`; `None` when absent.
    pub params: Option<&'a str>,
    /// The negotiated protocol revision.
    pub protocol_version: &'a str,
    /// `_meta` client capabilities as raw JSON; `None` when absent.
    pub capabilities: Option<&'a str>,
}

/// Which half of the key space a key is in.
#[derive(Clone, Copy, Debug)]
pub enum KeyScope<'a> {
    Public,
    Private(&'a Partition),
}

/// A cache key: a SHA-256 digest, so no request text or credential is ever held as a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey([u8; 32]);

/// The cache key for `input` in `scope`. Pure.
///
/// **A wrong key is a data leak.** Two requests get the same key only if serving one's answer to
/// the other is correct, so every field that can change the answer, or who may see it, is in:
/// - `backend`: two backends' `tools/list` are different lists.
/// - `credential_id`: the upstream may answer differently per credential portico presents, and a
///   `public` answer is public only *for that credential* (digest §8 item 4).
/// - `method` and `params` (`cursor` / `uri`): the spec's own key (digest §3). Each page has its
///   own entry; a different resource is a different entry.
/// - `protocol_version` and the client capabilities: they may change `tools/list` (e.g. an
///   extension the client declares); the conservative key of digest §8 item 2. `clientInfo` and
///   `progressToken` are left out: they don't shape results and would only split the cache.
/// - the scope: `public`, or `private` plus the caller's partition. Public and private keys can
///   never be equal, and private keys of two partitions can never be equal.
///
/// JSON fields are canonicalised first (object keys sorted recursively, string escapes
/// normalised, numbers and everything else kept as written), so `{"a":1,"b":2}` and
/// `{"b":2,"a":1}` share an entry. Canonicalisation may only merge texts that mean the same JSON;
/// when it cannot be sure (duplicate keys, deep nesting, invalid JSON) the raw text is hashed
/// under a different tag, which can only cost a hit.
///
/// Every field is length-prefixed, and optional fields carry a tag, so the byte stream decodes
/// uniquely: without the prefixes, backend `"ab"` + method `"c"` would hash like `"a"` + `"bc"`.
pub fn cache_key(input: &KeyInput<'_>, scope: KeyScope<'_>) -> CacheKey {
    let mut h = KeyHasher::new(b"portico/cache-key/v1");
    h.field(input.backend.as_bytes());
    h.field(input.credential_id.as_bytes());
    h.field(input.method.as_bytes());
    h.json(input.params);
    h.field(input.protocol_version.as_bytes());
    h.json(input.capabilities);
    match scope {
        KeyScope::Public => h.field(b"public"),
        KeyScope::Private(partition) => {
            h.field(b"private");
            match partition {
                Partition::Anonymous => h.field(b"anonymous"),
                Partition::Credential(digest) => {
                    h.field(b"credential");
                    h.field(digest);
                }
                Partition::Principal(id) => {
                    h.field(b"principal");
                    h.field(id.as_bytes());
                }
            }
        }
    }
    CacheKey(h.finish())
}

/// SHA-256 over a domain tag and a sequence of length-prefixed fields.
struct KeyHasher(digest::Context);

impl KeyHasher {
    fn new(domain: &[u8]) -> KeyHasher {
        let mut h = KeyHasher(digest::Context::new(&digest::SHA256));
        h.field(domain);
        h
    }

    fn field(&mut self, bytes: &[u8]) {
        self.0.update(&(bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
    }

    /// An optional JSON field: a tag saying absent / canonical / raw, then the text.
    fn json(&mut self, raw: Option<&str>) {
        let Some(raw) = raw else {
            self.field(b"absent");
            return;
        };
        let mut canon = Vec::with_capacity(raw.len());
        if canonical_json(raw, &mut canon, 0).is_some() {
            self.field(b"canonical");
            self.field(&canon);
        } else {
            self.field(b"raw");
            self.field(raw.as_bytes());
        }
    }

    fn finish(self) -> [u8; 32] {
        let mut out = [0u8; 32];
        // SHA-256 output is always 32 bytes, so this copy cannot panic.
        out.copy_from_slice(self.0.finish().as_ref());
        out
    }
}

/// Writes the canonical form of one JSON value: object members sorted by key, no insignificant
/// whitespace, strings re-escaped the one way serde_json writes them, and numbers, `true`,
/// `false`, `null` kept exactly as written (re-parsing numbers could round two different numbers
/// to one). `None` when `raw` is not valid JSON, has a duplicate key, or nests too deep.
fn canonical_json(raw: &str, out: &mut Vec<u8>, depth: usize) -> Option<()> {
    if depth > CANON_MAX_DEPTH {
        return None;
    }
    let text = raw.trim_matches([' ', '\t', '\n', '\r']);
    match text.as_bytes().first()? {
        b'{' => {
            let Members(mut members) = parse_members(text)?;
            members.sort_by(|a, b| a.0.cmp(&b.0));
            if members.windows(2).any(|w| w[0].0 == w[1].0) {
                return None;
            }
            out.push(b'{');
            for (i, (name, value)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(serde_json::to_string(name).ok()?.as_bytes());
                out.push(b':');
                canonical_json(value.get(), out, depth + 1)?;
            }
            out.push(b'}');
        }
        b'[' => {
            let items: Vec<&RawValue> = serde_json::from_str(text).ok()?;
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical_json(item.get(), out, depth + 1)?;
            }
            out.push(b']');
        }
        b'"' => {
            let s: String = serde_json::from_str(text).ok()?;
            out.extend_from_slice(serde_json::to_string(&s).ok()?.as_bytes());
        }
        _ => {
            serde_json::from_str::<IgnoredAny>(text).ok()?;
            out.extend_from_slice(text.as_bytes());
        }
    }
    Some(())
}

/// The members of one JSON object in document order, values as raw text, so rewriting one member
/// never reformats the others (no float rounding, no key reordering, duplicates visible).
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry::<String, &'de RawValue>()? {
                    members.push(member);
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(V)
    }
}

fn parse_members(json: &str) -> Option<Members<'_>> {
    serde_json::from_str(json).ok()
}

/// `message` with its top-level `id` replaced by `id`, everything else byte for byte. Returned
/// unchanged (no copy) when it already carries that id, or when it is not a JSON object — then
/// there is no id we could fix, and the caller's response checks will reject it anyway.
pub fn splice_id(message: &Bytes, id: &RequestId) -> Bytes {
    let Some(Members(members)) = std::str::from_utf8(message).ok().and_then(parse_members) else {
        return message.clone();
    };
    let mut has_id = false;
    for (name, value) in &members {
        if name == "id" {
            if value.get() == id.json() {
                return message.clone();
            }
            has_id = true;
        }
    }
    let mut out = BytesMut::with_capacity(message.len() + id.json().len());
    out.extend_from_slice(b"{");
    if !has_id {
        out.extend_from_slice(b"\"id\":");
        out.extend_from_slice(id.json().as_bytes());
        if !members.is_empty() {
            out.extend_from_slice(b",");
        }
    }
    for (i, (name, value)) in members.iter().enumerate() {
        if i > 0 {
            out.extend_from_slice(b",");
        }
        match serde_json::to_string(name) {
            Ok(name) => out.extend_from_slice(name.as_bytes()),
            Err(_) => return message.clone(),
        }
        out.extend_from_slice(b":");
        if name == "id" {
            out.extend_from_slice(id.json().as_bytes());
        } else {
            out.extend_from_slice(value.get().as_bytes());
        }
    }
    out.extend_from_slice(b"}");
    out.freeze()
}

// === Entries ===

/// One stored result.
#[derive(Debug)]
pub struct Entry {
    /// Kept for invalidation: keys are digests, so the predicates match on these instead.
    backend: Box<str>,
    method: Box<str>,
    /// The decoded `uri` of a `resources/read` entry, for [`Cache::invalidate_resource`].
    uri: Option<Box<str>>,
    /// The `result` object without `ttlMs` (see [`Decision::Cacheable`]).
    result: Bytes,
    /// Served as a hit until then (`t_received + ttlMs`, digest §3).
    fresh_until: Instant,
    /// Served only when a re-fetch fails, until then; moka drops the entry at about this time.
    stale_until: Instant,
}

impl Entry {
    fn new(input: &KeyInput<'_>, result: Bytes, ttl: Duration, stale: Duration) -> Entry {
        let now = Instant::now();
        // The clamps to MAX_WINDOW make overflow impossible; on overflow anyway, the entry is
        // simply never fresh.
        let fresh_until = now.checked_add(ttl.min(MAX_WINDOW)).unwrap_or(now);
        let stale_until = fresh_until
            .checked_add(stale.min(MAX_WINDOW))
            .unwrap_or(fresh_until);
        let uri = (input.method == "resources/read")
            .then(|| {
                input
                    .params
                    .and_then(|p| serde_json::from_str::<String>(p).ok())
            })
            .flatten()
            .map(String::into_boxed_str);
        Entry {
            backend: input.backend.into(),
            method: input.method.into(),
            uri,
            result,
            fresh_until,
            stale_until,
        }
    }

    fn is_fresh(&self, now: Instant) -> bool {
        now < self.fresh_until
    }

    fn is_stale_servable(&self, now: Instant) -> bool {
        now < self.stale_until
    }

    /// Freshness left at `now`, in whole ms, rounded up: a result served in the same
    /// millisecond it was stored keeps the server's own `ttlMs` (so a miss is byte-for-byte
    /// what the server said), and no client can hold it more than a fraction of a millisecond
    /// past the server's intent. 0 once stale.
    pub fn ttl_remaining_ms(&self, now: Instant) -> u64 {
        let left = self.fresh_until.saturating_duration_since(now);
        let ms = left.as_nanos().div_ceil(1_000_000);
        u64::try_from(ms).unwrap_or(u64::MAX)
    }

    /// The JSON-RPC response for a hit, built by splicing, with the caller's `id` and `ttlMs`
    /// rewritten to the remaining freshness:
    /// `{"jsonrpc":"2.0","id":<id>,"result":{<stored members>,"ttlMs":<remaining>}}`.
    pub fn render(&self, id: &RequestId, now: Instant) -> Bytes {
        // The stored result always ends with `}` and is exactly `{}` when it has no members
        // (see `classify`); anything else would be a bug, rendered as an empty result.
        let (open, empty) = match self.result.split_last() {
            Some((b'}', open)) => (open, open == b"{"),
            _ => (&b"{"[..], true),
        };
        let remaining = self.ttl_remaining_ms(now).to_string();
        let mut out = BytesMut::with_capacity(self.result.len() + id.json().len() + 64);
        out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
        out.extend_from_slice(id.json().as_bytes());
        out.extend_from_slice(b",\"result\":");
        out.extend_from_slice(open);
        if !empty {
            out.extend_from_slice(b",");
        }
        out.extend_from_slice(b"\"ttlMs\":");
        out.extend_from_slice(remaining.as_bytes());
        out.extend_from_slice(b"}}");
        out.freeze()
    }

    /// What the entry costs against `max_bytes`.
    fn weight(&self) -> u32 {
        let bytes = self.result.len()
            + self.backend.len()
            + self.method.len()
            + self.uri.as_ref().map_or(0, |u| u.len())
            + ENTRY_OVERHEAD_BYTES;
        u32::try_from(bytes).unwrap_or(u32::MAX)
    }
}

/// moka keeps an entry for its freshness plus the stale-if-error window, no longer.
struct EntryExpiry;

impl Expiry<CacheKey, Arc<Entry>> for EntryExpiry {
    fn expire_after_create(
        &self,
        _key: &CacheKey,
        entry: &Arc<Entry>,
        created_at: Instant,
    ) -> Option<Duration> {
        Some(entry.stale_until.saturating_duration_since(created_at))
    }

    /// A re-fetch replaces an entry: its lifetime is the new entry's, not what was left of the
    /// old one (moka's default keeps the old deadline).
    fn expire_after_update(
        &self,
        _key: &CacheKey,
        entry: &Arc<Entry>,
        updated_at: Instant,
        _left: Option<Duration>,
    ) -> Option<Duration> {
        Some(entry.stale_until.saturating_duration_since(updated_at))
    }
}

// === Counters ===

/// Counter values at one moment, for the metrics layer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Answered from a fresh entry.
    pub hits: u64,
    /// Led an upstream fetch.
    pub misses: u64,
    /// Answered by another caller's concurrent fetch (single flight).
    pub coalesced: u64,
    /// Answered from an expired entry because the re-fetch failed.
    pub stale: u64,
    /// Not eligible at all (cache disabled, retry, non-cacheable method).
    pub bypassed: u64,
    pub inserts: u64,
    /// Removed to stay within `max_bytes` (including entries refused on admission).
    pub evictions: u64,
    /// Entries and bytes held. They settle after moka's maintenance runs, so they may briefly
    /// count an entry that is already expired or invalidated.
    pub entries: u64,
    pub bytes: u64,
}

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
    store: moka::future::Cache<CacheKey, Arc<Entry>>,
    /// In-flight fetches by private key: the flight id (so a finished leader only ever removes
    /// its own flight) and a receiver waiters clone. Locked briefly, never across an await.
    flights: Mutex<HashMap<CacheKey, (u64, watch::Receiver<Slot>)>>,
    next_flight: AtomicU64,
    /// Bumped by every invalidation. A fetch that saw another value before it started is not
    /// stored, and a stale entry looked up before it is not served: both may predate the change.
    epoch: AtomicU64,
    counters: Arc<Counters>,
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
        Cache {
            enabled: cfg.enabled,
            max_ttl_ms: cfg.max_ttl_ms,
            max_bytes: cfg.max_bytes,
            stale_if_error: Duration::from_millis(cfg.stale_if_error_ms),
            store,
            flights: Mutex::new(HashMap::new()),
            next_flight: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
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
            let epoch = self.epoch.load(Ordering::SeqCst);
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
                Ok(Served::entry(&entry, id, Outcome::Miss))
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
            if let Some(entry) = self.store.get(key).await {
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
                    && self.epoch.load(Ordering::SeqCst) == epoch =>
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
        if u64::from(weight) > self.max_bytes || self.epoch.load(Ordering::SeqCst) != epoch {
            return;
        }
        // Counted before the insert, so the listener's decrement for this entry can never run first.
        self.counters.entries.fetch_add(1, Ordering::Relaxed);
        self.counters
            .bytes
            .fetch_add(i64::from(weight), Ordering::Relaxed);
        bump(&self.counters.inserts);
        self.store.insert(key, Arc::clone(entry)).await;
        // An invalidation registered while the insert ran may not cover it (moka applies a
        // predicate only to entries written before it): take the entry back out.
        if self.epoch.load(Ordering::SeqCst) != epoch {
            self.store.invalidate(&key).await;
        }
    }

    // === Invalidation ===

    /// Drops every entry of `backend` + `method`: all partitions, all cursors, public and
    /// private. For list-changed notifications, and for an invalid-cursor error (digest §3: throw
    /// every page away).
    pub fn invalidate(&self, backend: &str, method: &str) {
        let (backend, method) = (backend.to_owned(), method.to_owned());
        self.invalidate_if(move |e| *e.backend == *backend && *e.method == *method);
    }

    /// Drops the `resources/read` entries of `backend` for `uri` (a resource-updated notification).
    pub fn invalidate_resource(&self, backend: &str, uri: &str) {
        let (backend, uri) = (backend.to_owned(), uri.to_owned());
        self.invalidate_if(move |e| {
            *e.backend == *backend
                && &*e.method == "resources/read"
                && e.uri.as_deref() == Some(&*uri)
        });
    }

    /// Drops every entry of `backend` (e.g. it was reconfigured or its session was lost).
    pub fn purge_backend(&self, backend: &str) {
        let backend = backend.to_owned();
        self.invalidate_if(move |e| *e.backend == *backend);
    }

    /// Drops everything.
    pub fn purge_all(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.store.invalidate_all();
    }

    /// moka applies the predicate to every later `get` at once and removes the entries during
    /// maintenance; either way no lookup that starts after this returns can see them.
    fn invalidate_if(&self, predicate: impl Fn(&Entry) -> bool + Send + Sync + 'static) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        if let Err(error) = self
            .store
            .invalidate_entries_if(move |_key, entry| predicate(entry))
        {
            // Only possible if the builder lost `support_invalidation_closures`. Dropping too
            // much is safe; serving invalidated data is not.
            tracing::warn!(message = "cache predicate rejected; purging everything", %error);
            self.store.invalidate_all();
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
        }
    }

    /// Runs moka's pending maintenance (expiry, eviction, invalidation sweeps) now, so
    /// [`Cache::stats`] settles. Optional: moka also runs it as the cache is used.
    pub async fn run_pending_tasks(&self) {
        self.store.run_pending_tasks().await;
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
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[derive(Clone, Debug, PartialEq)]
    struct Boom;

    fn cfg(max_ttl_ms: u64, stale_if_error_ms: u64, max_bytes: u64) -> CacheConfig {
        CacheConfig {
            enabled: true,
            max_ttl_ms,
            max_bytes,
            stale_if_error_ms,
        }
    }

    fn cache() -> Cache {
        Cache::new(&cfg(60_000, 0, 1 << 20))
    }

    fn input<'a>(method: &'a str, params: Option<&'a str>) -> KeyInput<'a> {
        KeyInput {
            backend: "b1",
            credential_id: "cred",
            method,
            params,
            protocol_version: "2026-07-28",
            capabilities: Some(r#"{"roots":{},"sampling":{}}"#),
        }
    }

    fn tools(ttl: &str, scope: Option<&str>) -> Bytes {
        let scope = scope.map_or(String::new(), |s| format!(r#","cacheScope":"{s}""#));
        Bytes::from(format!(
            r#"{{"jsonrpc":"2.0","id":"upstream-9","result":{{"tools":[{{"name":"t","x":1.50}}],"ttlMs":{ttl}{scope}}}}}"#
        ))
    }

    fn id(n: u64) -> RequestId {
        RequestId::number(n)
    }

    fn json(body: &[u8]) -> serde_json::Value {
        serde_json::from_slice(body).expect("valid JSON")
    }

    fn anon() -> Partition {
        Partition::Anonymous
    }

    /// One `get_or_fetch` whose fetch counts its calls and answers `message`.
    async fn call(
        c: &Cache,
        key: &KeyInput<'_>,
        p: &Partition,
        n: u64,
        calls: &AtomicUsize,
        message: Bytes,
    ) -> Served {
        c.get_or_fetch(key, p, &id(n), false, || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Boom>(Fetched {
                status: 200,
                message,
            })
        })
        .await
        .expect("fetch succeeds")
    }

    // --- classify ---

    #[test]
    fn classify_table() {
        use Decision::NotCacheable as No;
        let m = "tools/list";
        let check = |body: &str| classify(m, false, body.as_bytes(), 60_000);
        let ok =
            r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[],"ttlMs":500,"cacheScope":"public"}}"#;
        assert_eq!(
            check(ok),
            Decision::Cacheable {
                ttl_ms: 500,
                scope: Scope::Public,
                result: Bytes::from_static(br#"{"tools":[],"cacheScope":"public"}"#),
            }
        );
        // resultType complete or absent; anything else is not stored.
        for (body, want) in [
            (
                r#"{"id":1,"result":{"resultType":"complete","ttlMs":5}}"#,
                None,
            ),
            (
                r#"{"id":1,"result":{"resultType":"input_required","inputRequests":{},"ttlMs":5}}"#,
                Some(Uncacheable::NotComplete),
            ),
            (
                r#"{"id":1,"result":{"resultType":"task","ttlMs":5}}"#,
                Some(Uncacheable::NotComplete),
            ),
            (
                r#"{"id":1,"error":{"code":-32603,"message":"x"}}"#,
                Some(Uncacheable::Error),
            ),
            (r#"{"id":1,"result":{"ttlMs":0}}"#, Some(Uncacheable::NoTtl)),
            (
                r#"{"id":1,"result":{"tools":[]}}"#,
                Some(Uncacheable::NoTtl),
            ),
            (
                r#"{"id":1,"result":{"ttlMs":-5}}"#,
                Some(Uncacheable::NoTtl),
            ),
            (
                r#"{"id":1,"result":{"ttlMs":"500"}}"#,
                Some(Uncacheable::NoTtl),
            ),
            (
                r#"{"id":1,"result":{"ttlMs":0.4}}"#,
                Some(Uncacheable::NoTtl),
            ),
            (
                r#"{"id":1,"result":{"ttlMs":5,"ttlMs":6}}"#,
                Some(Uncacheable::Malformed),
            ),
            (
                r#"{"id":1,"result":{"ttlMs":5,"cacheScope":"private","cacheScope":"public"}}"#,
                Some(Uncacheable::Malformed),
            ),
            (r#"{"id":1,"result":[1]}"#, Some(Uncacheable::Malformed)),
            (r#"{"id":1}"#, Some(Uncacheable::Malformed)),
            (
                r#"{"id":1,"result":{"ttlMs":5}"#,
                Some(Uncacheable::Malformed),
            ),
            ("\u{0}garbage", Some(Uncacheable::Malformed)),
        ] {
            match (check(body), want) {
                (Decision::Cacheable { .. }, None) => {}
                (No(got), Some(want)) => assert_eq!(got, want, "{body}"),
                (got, want) => panic!("{body}: got {got:?}, want {want:?}"),
            }
        }
        assert_eq!(
            classify("tools/call", false, ok.as_bytes(), 60_000),
            No(Uncacheable::Method)
        );
        assert_eq!(
            classify(m, true, ok.as_bytes(), 60_000),
            No(Uncacheable::Retry)
        );
    }

    #[test]
    fn classify_caps_floors_and_defaults_scope() {
        let ttl_scope = |body: &str| match classify("resources/read", false, body.as_bytes(), 1000)
        {
            Decision::Cacheable { ttl_ms, scope, .. } => (ttl_ms, scope),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            ttl_scope(r#"{"result":{"ttlMs":99999999}}"#),
            (1000, Scope::Private)
        );
        assert_eq!(
            ttl_scope(r#"{"result":{"ttlMs":1e300}}"#),
            (1000, Scope::Private)
        );
        assert_eq!(
            ttl_scope(r#"{"result":{"ttlMs":250.9,"cacheScope":"private"}}"#),
            (250, Scope::Private)
        );
        assert_eq!(
            ttl_scope(r#"{"result":{"ttlMs":5,"cacheScope":"shared"}}"#),
            (5, Scope::Private)
        );
        assert_eq!(
            ttl_scope(r#"{"result":{"ttlMs":5,"cacheScope":"public"}}"#),
            (5, Scope::Public)
        );
    }

    // --- rendering ---

    #[test]
    fn render_rewrites_remaining_ttl_and_id() {
        let Decision::Cacheable { result, .. } =
            classify("tools/list", false, &tools("1000", Some("public")), 60_000)
        else {
            panic!("cacheable")
        };
        let entry = Entry::new(
            &input("tools/list", None),
            result,
            Duration::from_millis(1000),
            Duration::ZERO,
        );
        let at = |ms| entry.fresh_until - Duration::from_millis(1000) + Duration::from_millis(ms);
        let first = json(&entry.render(&id(7), at(100)));
        let later =
            json(&entry.render(&RequestId::from_value(&"abc".into()).expect("id"), at(600)));
        let after = json(&entry.render(&id(8), at(5000)));
        assert_eq!(first["id"], 7);
        assert_eq!(later["id"], "abc");
        assert_eq!(first["jsonrpc"], "2.0");
        assert_eq!(first["result"]["ttlMs"], 900);
        assert_eq!(later["result"]["ttlMs"], 400);
        assert_eq!(after["result"]["ttlMs"], 0, "never negative");
        assert_eq!(first["result"]["cacheScope"], "public");
        assert_eq!(first["result"]["tools"][0]["name"], "t");
        // Member values are spliced byte for byte (no float reformatting).
        let body = entry.render(&id(1), at(0));
        assert!(std::str::from_utf8(&body).expect("utf8").contains("1.50"));
        assert!(body.ends_with(b",\"ttlMs\":1000}}"));
    }

    #[test]
    fn render_empty_result_is_valid_json() {
        let Decision::Cacheable { result, .. } = classify(
            "tools/list",
            false,
            br#"{"jsonrpc":"2.0","id":1,"result":{"ttlMs":50}}"#,
            60_000,
        ) else {
            panic!("cacheable")
        };
        assert_eq!(&result[..], b"{}");
        let entry = Entry::new(
            &input("tools/list", None),
            result,
            Duration::from_millis(50),
            Duration::ZERO,
        );
        let body = entry.render(&id(3), Instant::now());
        let v = json(&body);
        assert_eq!(v["id"], 3);
        assert_eq!(v["result"].as_object().map(|o| o.len()), Some(1));
        assert!(v["result"]["ttlMs"].as_u64().is_some_and(|t| t <= 50));
    }

    #[test]
    fn splice_id_replaces_only_the_id() {
        let msg =
            Bytes::from_static(br#"{"jsonrpc":"2.0","id":"up","result":{"a":1.50,"id":"inner"}}"#);
        let out = splice_id(&msg, &id(42));
        assert_eq!(
            &out[..],
            br#"{"jsonrpc":"2.0","id":42,"result":{"a":1.50,"id":"inner"}}"#
        );
        // Already right: same buffer back.
        let same = Bytes::from_static(br#"{"jsonrpc":"2.0","id":42,"result":{}}"#);
        assert_eq!(splice_id(&same, &id(42)).as_ptr(), same.as_ptr());
        // No id at all: one is added.
        assert_eq!(
            json(&splice_id(
                &Bytes::from_static(br#"{"jsonrpc":"2.0","result":{}}"#),
                &id(1)
            ))["id"],
            1
        );
        // Not JSON: left alone.
        assert_eq!(
            &splice_id(&Bytes::from_static(b"nope"), &id(1))[..],
            b"nope"
        );
    }

    // --- keys ---

    #[test]
    fn key_canonicalisation() {
        let base = input("tools/list", None);
        let k = |i: &KeyInput<'_>| cache_key(i, KeyScope::Public);
        let reordered = KeyInput {
            capabilities: Some("{ \"sampling\" : {}, \"roots\":{ } }"),
            ..base
        };
        assert_eq!(
            k(&base),
            k(&reordered),
            "key order and whitespace don't matter"
        );
        let nested_a = KeyInput {
            capabilities: Some(r#"{"x":{"b":1,"a":[{"d":2,"c":"\u0041"}]}}"#),
            ..base
        };
        let nested_b = KeyInput {
            capabilities: Some(r#"{"x":{"a":[{"c":"A","d":2}],"b":1}}"#),
            ..base
        };
        assert_eq!(k(&nested_a), k(&nested_b), "recursive, escapes normalised");
        let num_a = KeyInput {
            capabilities: Some(r#"{"n":1.0}"#),
            ..base
        };
        let num_b = KeyInput {
            capabilities: Some(r#"{"n":1}"#),
            ..base
        };
        assert_ne!(k(&num_a), k(&num_b), "numbers are kept as written");
        assert_ne!(
            k(&base),
            k(&KeyInput {
                capabilities: None,
                ..base
            })
        );
        assert_ne!(
            k(&base),
            k(&KeyInput {
                capabilities: Some("{}"),
                ..base
            })
        );

        let c1 = KeyInput {
            params: Some(r#""c1""#),
            ..base
        };
        let c2 = KeyInput {
            params: Some(r#""c2""#),
            ..base
        };
        assert_ne!(k(&c1), k(&c2), "each page has its own key");
        assert_ne!(k(&base), k(&c1));
        assert_eq!(
            k(&c1),
            k(&KeyInput {
                params: Some(r#" "\u0063\u0031" "#),
                ..base
            })
        );
        assert_ne!(
            k(&base),
            k(&KeyInput {
                protocol_version: "2025-11-25",
                ..base
            })
        );
        assert_ne!(
            k(&base),
            k(&KeyInput {
                credential_id: "other",
                ..base
            })
        );
        assert_ne!(
            k(&base),
            k(&KeyInput {
                method: "prompts/list",
                ..base
            })
        );
        // Invalid JSON still keys, distinctly.
        assert_ne!(
            k(&KeyInput {
                params: Some("{bad"),
                ..base
            }),
            k(&KeyInput {
                params: Some("{bad2"),
                ..base
            })
        );
    }

    #[test]
    fn key_length_prefixes_prevent_concatenation_collisions() {
        let base = input("tools/list", None);
        let a = KeyInput {
            backend: "ab",
            credential_id: "c",
            ..base
        };
        let b = KeyInput {
            backend: "a",
            credential_id: "bc",
            ..base
        };
        assert_ne!(
            cache_key(&a, KeyScope::Public),
            cache_key(&b, KeyScope::Public)
        );
    }

    #[test]
    fn key_scopes_and_partitions_never_collide() {
        let i = input("tools/list", None);
        let a = Partition::from_authorization(Some(b"Bearer a"));
        let b = Partition::from_authorization(Some(b"Bearer b"));
        assert_eq!(a, Partition::from_authorization(Some(b"Bearer a")));
        assert_eq!(Partition::from_authorization(None), Partition::Anonymous);
        assert_eq!(
            Partition::from_authorization(Some(b"")),
            Partition::Anonymous
        );
        let keys = [
            cache_key(&i, KeyScope::Public),
            cache_key(&i, KeyScope::Private(&a)),
            cache_key(&i, KeyScope::Private(&b)),
            cache_key(&i, KeyScope::Private(&Partition::Anonymous)),
            cache_key(&i, KeyScope::Private(&Partition::Principal("alice".into()))),
        ];
        for (x, kx) in keys.iter().enumerate() {
            for ky in &keys[x + 1..] {
                assert_ne!(kx, ky);
            }
        }
        // The secret itself never appears in a partition.
        assert!(!format!("{a:?}").contains("Bearer"));
    }

    // --- the cache ---

    #[tokio::test]
    async fn ttl_is_honoured() {
        let c = cache();
        let calls = AtomicUsize::new(0);
        let k = input("tools/list", None);
        let first = call(&c, &k, &anon(), 1, &calls, tools("200", Some("public"))).await;
        assert_eq!(first.outcome, Outcome::Miss);
        assert_eq!(
            json(&first.body)["id"],
            1,
            "the caller's id, not the upstream's"
        );
        let hit = call(&c, &k, &anon(), 2, &calls, tools("200", Some("public"))).await;
        assert_eq!(
            (hit.outcome, calls.load(Ordering::SeqCst)),
            (Outcome::Hit, 1)
        );
        assert_eq!(json(&hit.body)["id"], 2);
        let left = hit.ttl_remaining_ms.expect("ttl");
        assert!(left <= 200 && json(&hit.body)["result"]["ttlMs"] == left);
        tokio::time::sleep(Duration::from_millis(230)).await;
        let again = call(&c, &k, &anon(), 3, &calls, tools("200", Some("public"))).await;
        assert_eq!(
            (again.outcome, calls.load(Ordering::SeqCst)),
            (Outcome::Miss, 2)
        );
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.inserts), (1, 2, 2));
    }

    #[tokio::test]
    async fn remaining_ttl_decreases_on_hits() {
        let c = cache();
        let calls = AtomicUsize::new(0);
        let k = input("prompts/list", None);
        let body = Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"result":{"prompts":[],"ttlMs":1000,"cacheScope":"public"}}"#);
        let first = call(&c, &k, &anon(), 1, &calls, body.clone()).await;
        tokio::time::sleep(Duration::from_millis(60)).await;
        let second = call(&c, &k, &anon(), 2, &calls, body).await;
        let (a, b) = (
            first.ttl_remaining_ms.expect("ttl"),
            second.ttl_remaining_ms.expect("ttl"),
        );
        assert!(a <= 1000 && b + 50 <= a, "{a} then {b}");
        assert_eq!(json(&second.body)["result"]["ttlMs"], b);
    }

    #[tokio::test]
    async fn uncacheable_answers_are_never_stored() {
        let k = input("resources/read", Some(r#""file:///a""#));
        for body in [
            tools("0", Some("public")),
            tools("-5", Some("public")),
            Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"result":{"contents":[],"cacheScope":"public"}}"#),
            Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","inputRequests":{"a":{}},"ttlMs":500,"cacheScope":"public"}}"#),
            Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"no"}}"#),
        ] {
            let c = cache();
            let calls = AtomicUsize::new(0);
            for n in 0..2 {
                let s = call(&c, &k, &anon(), n, &calls, body.clone()).await;
                assert_eq!(s.outcome, Outcome::Miss);
                assert_eq!(json(&s.body)["id"], n);
                assert_eq!(s.ttl_remaining_ms, None);
            }
            assert_eq!(calls.load(Ordering::SeqCst), 2, "{body:?}");
            assert_eq!(c.stats().inserts, 0);
        }
        // Non-200 status.
        let c = cache();
        let calls = AtomicUsize::new(0);
        for n in 0..2 {
            let s = c
                .get_or_fetch(&k, &anon(), &id(n), false, || async {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Boom>(Fetched {
                        status: 500,
                        message: tools("500", Some("public")),
                    })
                })
                .await
                .expect("ok");
            assert_eq!(s.status, 500);
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn retries_bypass_and_are_not_stored() {
        let c = cache();
        let calls = AtomicUsize::new(0);
        let k = input("resources/read", Some(r#""file:///a""#));
        for n in 0..2 {
            let s = c
                .get_or_fetch(&k, &anon(), &id(n), true, || async {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Boom>(Fetched {
                        status: 200,
                        message: tools("500", Some("public")),
                    })
                })
                .await
                .expect("ok");
            assert_eq!(
                (s.outcome, json(&s.body)["id"].as_u64()),
                (Outcome::Bypass, Some(n))
            );
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert_eq!(c.stats().inserts, 0);
        assert_eq!(c.stats().bypassed, 2);
        // And a retry doesn't see an entry stored by a plain request either.
        call(&c, &k, &anon(), 9, &calls, tools("500", Some("public"))).await;
        let s = c
            .get_or_fetch(&k, &anon(), &id(10), true, || async {
                Ok::<_, Boom>(Fetched {
                    status: 200,
                    message: tools("500", Some("public")),
                })
            })
            .await
            .expect("ok");
        assert_eq!(s.outcome, Outcome::Bypass);
    }

    #[tokio::test]
    async fn disabled_cache_passes_everything_through() {
        let c = Cache::new(&CacheConfig {
            enabled: false,
            ..cfg(60_000, 0, 1 << 20)
        });
        let calls = AtomicUsize::new(0);
        let k = input("tools/list", None);
        for n in 0..3 {
            let s = call(&c, &k, &anon(), n, &calls, tools("500", Some("public"))).await;
            assert_eq!(
                (s.outcome, json(&s.body)["id"].as_u64()),
                (Outcome::Bypass, Some(n))
            );
        }
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn public_is_shared_private_is_not() {
        let c = cache();
        let calls = AtomicUsize::new(0);
        let (a, b) = (
            Partition::from_authorization(Some(b"Bearer a")),
            Partition::from_authorization(Some(b"Bearer b")),
        );
        let public = input("tools/list", None);
        call(&c, &public, &a, 1, &calls, tools("5000", Some("public"))).await;
        let s = call(&c, &public, &b, 2, &calls, tools("5000", Some("public"))).await;
        assert_eq!(s.outcome, Outcome::Hit, "public entries cross partitions");
        let s = call(
            &c,
            &public,
            &anon(),
            3,
            &calls,
            tools("5000", Some("public")),
        )
        .await;
        assert_eq!(s.outcome, Outcome::Hit);

        for scope in [Some("private"), None] {
            let c = cache();
            let calls = AtomicUsize::new(0);
            let k = input("resources/list", None);
            let body = Bytes::from(format!(
                r#"{{"jsonrpc":"2.0","id":1,"result":{{"resources":[{{"uri":"secret-of-a"}}],"ttlMs":5000{}}}}}"#,
                scope.map_or(String::new(), |s| format!(r#","cacheScope":"{s}""#))
            ));
            call(&c, &k, &a, 1, &calls, body.clone()).await;
            assert_eq!(
                call(&c, &k, &a, 2, &calls, body.clone()).await.outcome,
                Outcome::Hit
            );
            let other = Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"result":{"resources":[],"ttlMs":5000,"cacheScope":"private"}}"#);
            for p in [&b, &anon()] {
                let s = call(&c, &k, p, 3, &calls, other.clone()).await;
                assert_eq!(
                    s.outcome,
                    Outcome::Miss,
                    "{scope:?}: A's private entry served to {p:?}"
                );
                assert!(!String::from_utf8_lossy(&s.body).contains("secret-of-a"));
            }
            assert_eq!(calls.load(Ordering::SeqCst), 3);
        }
    }

    #[tokio::test]
    async fn concurrent_misses_share_one_fetch() {
        let c = Arc::new(cache());
        let calls = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for n in 0..100u64 {
            let (c, calls) = (Arc::clone(&c), Arc::clone(&calls));
            tasks.push(tokio::spawn(async move {
                let k = input("tools/list", Some(r#""page-2""#));
                c.get_or_fetch(&k, &Partition::Anonymous, &id(n), false, || async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok::<_, Boom>(Fetched {
                        status: 200,
                        message: tools("5000", Some("private")),
                    })
                })
                .await
            }));
        }
        for (n, task) in tasks.into_iter().enumerate() {
            let s = task.await.expect("task").expect("served");
            let v = json(&s.body);
            assert_eq!(v["id"], n as u64, "every caller gets its own id");
            assert_eq!(v["result"]["tools"][0]["name"], "t");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let st = c.stats();
        assert_eq!((st.misses, st.coalesced + st.hits), (1, 99));
    }

    #[tokio::test]
    async fn coalesced_waiters_share_an_uncacheable_answer() {
        let c = Arc::new(cache());
        let calls = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for n in 0..10u64 {
            let (c, calls) = (Arc::clone(&c), Arc::clone(&calls));
            tasks.push(tokio::spawn(async move {
                let k = input("resources/read", Some(r#""file:///x""#));
                c.get_or_fetch(&k, &Partition::Anonymous, &id(n), false, || async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok::<_, Boom>(Fetched {
                        status: 200,
                        message: Bytes::from_static(br#"{"jsonrpc":"2.0","id":"up","result":{"resultType":"input_required","inputRequests":{"q":{"method":"elicitation/create","params":{}}}}}"#),
                    })
                })
                .await
            }));
        }
        for (n, task) in tasks.into_iter().enumerate() {
            let v = json(&task.await.expect("task").expect("served").body);
            assert_eq!(
                (v["id"].as_u64(), v["result"]["resultType"].as_str()),
                (Some(n as u64), Some("input_required"))
            );
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(c.stats().inserts, 0);
    }

    #[tokio::test]
    async fn waiters_share_the_leaders_error() {
        let c = Arc::new(cache());
        let calls = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for n in 0..5u64 {
            let (c, calls) = (Arc::clone(&c), Arc::clone(&calls));
            tasks.push(tokio::spawn(async move {
                let k = input("tools/list", None);
                c.get_or_fetch(&k, &Partition::Anonymous, &id(n), false, || async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    Err::<Fetched, _>(Boom)
                })
                .await
            }));
        }
        for task in tasks {
            assert_eq!(task.await.expect("task").map(|s| s.outcome), Err(Boom));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_dropped_leader_does_not_strand_waiters() {
        let c = Arc::new(cache());
        let calls = Arc::new(AtomicUsize::new(0));
        let k = || input("tools/list", None);
        // The leader's fetch never finishes.
        let leader = {
            let (c, calls) = (Arc::clone(&c), Arc::clone(&calls));
            tokio::spawn(async move {
                c.get_or_fetch(&k(), &Partition::Anonymous, &id(0), false, || async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    std::future::pending::<Result<Fetched, Boom>>().await
                })
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut waiters = Vec::new();
        for n in 1..=5u64 {
            let (c, calls) = (Arc::clone(&c), Arc::clone(&calls));
            waiters.push(tokio::spawn(async move {
                c.get_or_fetch(&k(), &Partition::Anonymous, &id(n), false, || async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Ok::<_, Boom>(Fetched {
                        status: 200,
                        message: tools("5000", Some("public")),
                    })
                })
                .await
            }));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        leader.abort();
        for (n, w) in (1u64..).zip(waiters) {
            let s = tokio::time::timeout(Duration::from_secs(1), w)
                .await
                .expect("no hang")
                .expect("task")
                .expect("served");
            assert_eq!(json(&s.body)["id"], n);
        }
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "the stuck leader, then one successor"
        );
        assert!(c.lock_flights().is_empty(), "no flight left behind");
    }

    #[tokio::test]
    async fn invalidate_drops_all_cursors_and_partitions_at_once() {
        let c = cache();
        let calls = AtomicUsize::new(0);
        let (a, b) = (
            Partition::from_authorization(Some(b"Bearer a")),
            Partition::from_authorization(Some(b"Bearer b")),
        );
        let pages = [
            input("tools/list", None),
            input("tools/list", Some(r#""c1""#)),
        ];
        let prompts = input("prompts/list", None);
        for k in &pages {
            for p in [&a, &b] {
                call(&c, k, p, 1, &calls, tools("5000", Some("private"))).await;
            }
        }
        call(&c, &pages[0], &a, 1, &calls, tools("5000", Some("public"))).await; // A public one too.
        call(&c, &prompts, &a, 1, &calls, tools("5000", Some("public"))).await;
        let before = calls.load(Ordering::SeqCst);
        for k in &pages {
            assert_eq!(
                call(&c, k, &b, 2, &calls, tools("5000", Some("private")))
                    .await
                    .outcome,
                Outcome::Hit
            );
        }

        c.invalidate("b1", "tools/list");
        // No maintenance has run: moka applies the predicate on `get`.
        for k in &pages {
            for p in [&a, &b] {
                let s = call(&c, k, p, 3, &calls, tools("5000", Some("private"))).await;
                assert_eq!(s.outcome, Outcome::Miss, "invalidated at once");
            }
        }
        assert_eq!(calls.load(Ordering::SeqCst), before + 4);
        assert_eq!(
            call(&c, &prompts, &b, 4, &calls, tools("5000", Some("public")))
                .await
                .outcome,
            Outcome::Hit
        );
        // Entries stored after the invalidation are served normally.
        assert_eq!(
            call(&c, &pages[0], &a, 5, &calls, tools("5000", Some("private")))
                .await
                .outcome,
            Outcome::Hit
        );
        c.invalidate("other-backend", "prompts/list");
        assert_eq!(
            call(&c, &prompts, &b, 4, &calls, tools("5000", Some("public")))
                .await
                .outcome,
            Outcome::Hit
        );
        c.purge_backend("b1");
        assert_eq!(
            call(&c, &prompts, &b, 4, &calls, tools("5000", Some("public")))
                .await
                .outcome,
            Outcome::Miss
        );
        c.purge_all();
        assert_eq!(
            call(&c, &prompts, &b, 4, &calls, tools("5000", Some("public")))
                .await
                .outcome,
            Outcome::Miss
        );
        c.run_pending_tasks().await;
        assert_eq!(c.stats().entries, 1);
    }

    #[tokio::test]
    async fn invalidate_resource_drops_only_that_uri() {
        let c = cache();
        let calls = AtomicUsize::new(0);
        let (x, y) = (
            input("resources/read", Some(r#""file:///x""#)),
            input("resources/read", Some(r#""file:///y""#)),
        );
        let body = || {
            Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"result":{"contents":[],"ttlMs":5000,"cacheScope":"public"}}"#)
        };
        call(&c, &x, &anon(), 1, &calls, body()).await;
        call(&c, &y, &anon(), 1, &calls, body()).await;
        c.invalidate_resource("b1", "file:///x");
        assert_eq!(
            call(&c, &x, &anon(), 2, &calls, body()).await.outcome,
            Outcome::Miss
        );
        assert_eq!(
            call(&c, &y, &anon(), 2, &calls, body()).await.outcome,
            Outcome::Hit
        );
    }

    #[tokio::test]
    async fn a_fetch_in_flight_during_invalidation_is_not_stored() {
        let c = cache();
        let calls = AtomicUsize::new(0);
        let k = input("tools/list", None);
        let s = c
            .get_or_fetch(&k, &anon(), &id(1), false, || async {
                c.invalidate("b1", "tools/list"); // the list changed while we fetched it
                Ok::<_, Boom>(Fetched {
                    status: 200,
                    message: tools("5000", Some("public")),
                })
            })
            .await
            .expect("ok");
        assert_eq!(s.outcome, Outcome::Miss);
        assert_eq!(json(&s.body)["id"], 1);
        assert_eq!(
            call(&c, &k, &anon(), 2, &calls, tools("5000", Some("public")))
                .await
                .outcome,
            Outcome::Miss
        );
    }

    #[tokio::test]
    async fn stale_if_error_serves_inside_the_window_only() {
        let c = Cache::new(&cfg(60_000, 150, 1 << 20));
        let calls = AtomicUsize::new(0);
        let k = input("tools/list", None);
        call(&c, &k, &anon(), 1, &calls, tools("60", Some("public"))).await;
        async fn failing_call(c: &Cache, k: &KeyInput<'_>, n: u64) -> Result<Outcome, Boom> {
            c.get_or_fetch(k, &Partition::Anonymous, &id(n), false, || async {
                Err(Boom)
            })
            .await
            .map(|s| s.outcome)
        }
        let failing = |n| failing_call(&c, &k, n);
        // Fresh: the failing fetch is never called.
        assert_eq!(failing(2).await, Ok(Outcome::Hit));
        tokio::time::sleep(Duration::from_millis(90)).await;
        // Expired, inside the window: the old entry, with ttlMs 0.
        let s = c
            .get_or_fetch(&k, &anon(), &id(3), false, || async {
                Err::<Fetched, _>(Boom)
            })
            .await
            .expect("stale");
        assert_eq!((s.outcome, s.ttl_remaining_ms), (Outcome::Stale, Some(0)));
        let v = json(&s.body);
        assert_eq!(
            (v["id"].as_u64(), v["result"]["ttlMs"].as_u64()),
            (Some(3), Some(0))
        );
        tokio::time::sleep(Duration::from_millis(160)).await;
        // Past the window: the error.
        assert_eq!(failing(4).await, Err(Boom));
        assert_eq!(c.stats().stale, 1);
    }

    #[tokio::test]
    async fn max_bytes_evicts_and_counts() {
        let c = Cache::new(&cfg(60_000, 0, 4096));
        let calls = AtomicUsize::new(0);
        let big = format!(
            r#"{{"jsonrpc":"2.0","id":1,"result":{{"blob":"{}","ttlMs":5000,"cacheScope":"public"}}}}"#,
            "x".repeat(800)
        );
        let cursors: Vec<String> = (0..20).map(|n| format!("\"c{n}\"")).collect();
        for cursor in &cursors {
            call(
                &c,
                &input("tools/list", Some(cursor)),
                &anon(),
                1,
                &calls,
                Bytes::from(big.clone()),
            )
            .await;
        }
        c.run_pending_tasks().await;
        let s = c.stats();
        assert_eq!(s.inserts, 20);
        assert!(s.evictions > 0, "{s:?}");
        assert!(s.bytes <= 4096, "{s:?}");
        assert_eq!(s.entries, 20 - s.evictions);
        // An entry bigger than the whole budget is not stored at all.
        let huge = format!(
            r#"{{"jsonrpc":"2.0","id":1,"result":{{"blob":"{}","ttlMs":5000}}}}"#,
            "x".repeat(5000)
        );
        call(
            &c,
            &input("prompts/list", None),
            &anon(),
            1,
            &calls,
            Bytes::from(huge),
        )
        .await;
        assert_eq!(c.stats().inserts, 20);
    }

    #[tokio::test]
    async fn replacing_an_entry_keeps_the_gauges_right() {
        let c = Cache::new(&cfg(60_000, 0, 1 << 20));
        let calls = AtomicUsize::new(0);
        let k = input("tools/list", None);
        call(&c, &k, &anon(), 1, &calls, tools("30", Some("public"))).await;
        tokio::time::sleep(Duration::from_millis(40)).await;
        call(&c, &k, &anon(), 2, &calls, tools("5000", Some("public"))).await;
        c.run_pending_tasks().await;
        let s = c.stats();
        assert_eq!((s.inserts, s.entries, s.evictions), (2, 1, 0));
        assert!(s.bytes > 0);
        // The replacement's lifetime is its own, not the remainder of the old one's.
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert_eq!(
            call(&c, &k, &anon(), 3, &calls, tools("5000", Some("public")))
                .await
                .outcome,
            Outcome::Hit
        );
    }
}
