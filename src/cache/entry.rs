//! One stored result ([`Entry`]): the result bytes, what it belongs to (for invalidation),
//! and its freshness and stale-if-error deadlines; rendering a hit; moka's per-entry expiry.

use bytes::{Bytes, BytesMut};
use moka::Expiry;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::key::{CacheKey, KeyInput};
use crate::protocol::RequestId;

/// Freshness and the stale-if-error window are each clamped to this. It keeps `Instant`
/// arithmetic far from overflow (which would panic) and moka's expiry well inside its limits,
/// whatever the config says; a list cached for over a year is a configuration mistake anyway.
pub(super) const MAX_WINDOW: Duration = Duration::from_secs(365 * 24 * 3600);

/// Bytes charged per entry on top of its body: the 32-byte key, the `Entry` struct, and moka's
/// own per-entry bookkeeping (an estimate; it only has to keep many tiny entries from looking free).
const ENTRY_OVERHEAD_BYTES: usize = 160;

/// The decoded `uri` of a `resources/read` request (its params are the URI as a JSON string).
pub(super) fn read_uri(input: &KeyInput<'_>) -> Option<String> {
    if input.method != "resources/read" {
        return None;
    }
    input
        .params
        .and_then(|p| serde_json::from_str::<String>(p).ok())
}

/// One stored result.
#[derive(Debug)]
pub struct Entry {
    /// Kept for invalidation: keys are digests, so the predicates match on these instead.
    pub(super) backend: Box<str>,
    pub(super) method: Box<str>,
    /// The decoded `uri` of a `resources/read` entry, for [`Cache::invalidate_resource`].
    pub(super) uri: Option<Box<str>>,
    /// A merged answer's member backends ([`KeyInput::covers`]): invalidating any of them
    /// drops it too.
    pub(super) covers: Box<[Box<str>]>,
    /// The `result` object without `ttlMs` (see [`Decision::Cacheable`]).
    pub(super) result: Bytes,
    /// Served as a hit until then (`t_received + ttlMs`, docs/protocol.md §3).
    pub(super) fresh_until: Instant,
    /// Served only when a re-fetch fails, until then; moka drops the entry at about this time.
    pub(super) stale_until: Instant,
}

impl Entry {
    pub(super) fn new(
        input: &KeyInput<'_>,
        result: Bytes,
        ttl: Duration,
        stale: Duration,
    ) -> Entry {
        let now = Instant::now();
        // The clamps to MAX_WINDOW make overflow impossible; on overflow anyway, the entry is
        // simply never fresh.
        let fresh_until = now.checked_add(ttl.min(MAX_WINDOW)).unwrap_or(now);
        let stale_until = fresh_until
            .checked_add(stale.min(MAX_WINDOW))
            .unwrap_or(fresh_until);
        let uri = read_uri(input).map(String::into_boxed_str);
        Entry {
            backend: input.backend.into(),
            method: input.method.into(),
            uri,
            covers: input.covers.iter().map(|m| m.as_str().into()).collect(),
            result,
            fresh_until,
            stale_until,
        }
    }

    /// Whether invalidating `backend` concerns this entry: its own, or one it was merged from.
    pub(super) fn depends_on(&self, backend: &str) -> bool {
        *self.backend == *backend || self.covers.iter().any(|m| **m == *backend)
    }

    pub(super) fn is_fresh(&self, now: Instant) -> bool {
        now < self.fresh_until
    }

    pub(super) fn is_stale_servable(&self, now: Instant) -> bool {
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
    pub(super) fn weight(&self) -> u32 {
        let bytes = self.result.len()
            + self.backend.len()
            + self.method.len()
            + self.uri.as_ref().map_or(0, |u| u.len())
            + self.covers.iter().map(|m| m.len()).sum::<usize>()
            + ENTRY_OVERHEAD_BYTES;
        u32::try_from(bytes).unwrap_or(u32::MAX)
    }
}

/// moka keeps an entry for its freshness plus the stale-if-error window, no longer.
pub(super) struct EntryExpiry;

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
