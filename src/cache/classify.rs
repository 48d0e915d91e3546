//! What may be cached: [`classify`] reads an upstream response and decides whether it is a
//! `complete`, positive-`ttlMs` result, for how long and for whom (`cacheScope`). Pure.

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::json::{Members, parse_members};
use crate::protocol::is_cacheable_method;

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
    /// An MRTR retry (`inputResponses`/`requestState`): MUST NOT be cached (docs/protocol.md §3).
    Retry,
    /// The upstream answered with an HTTP status other than 200.
    Status,
    /// Not a JSON object with an object `result`, or `resultType`/`ttlMs`/`cacheScope` given twice.
    Malformed,
    /// A JSON-RPC error.
    Error,
    /// `resultType` other than `"complete"` (e.g. `input_required`).
    NotComplete,
    /// `ttlMs` absent, zero, negative, or not a number: stale at once (docs/protocol.md §3).
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
/// Rules (docs/protocol.md §3): absent `resultType` counts as `complete` (the bridge normalises legacy
/// results); `ttlMs` absent, `0`, negative or not a number means "stale at once", so nothing is
/// stored; fractional values are floored; `cacheScope` anything but `"public"` — including
/// absent, which the spec leaves open (docs/protocol.md §8 item 1) — is treated as `"private"`, the safe reading.
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
fn ttl_from_raw(raw: crate::jsonrpc::Raw<'_>) -> u64 {
    match raw.get().parse::<f64>() {
        // `as` saturates, so a huge value becomes u64::MAX and the cap applies.
        Ok(v) if v.is_finite() && v > 0.0 => v.floor() as u64,
        _ => 0,
    }
}

fn json_str(raw: crate::jsonrpc::Raw<'_>) -> Option<String> {
    serde_json::from_str(raw.get()).ok()
}
