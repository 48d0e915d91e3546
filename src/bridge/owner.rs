//! Who an upstream legacy session belongs to ([`Owner`]), and what its `initialize` declares.
//!
//! An initialize-era server keeps state per session and fixes the client's capabilities at
//! `initialize`, so the bridge gives each owner its own upstream session (README "Session
//! isolation"):
//! - a **2026-07-28 client**: its authorization context (principal, else a digest of its
//!   credential, else anonymous) and team, plus its declared capabilities — requests that agree
//!   on all of them share a pooled session, since nothing else tells two such clients apart;
//! - an **initialize-era client**: its own portico session, whatever else it shares;
//! - **portico itself** (health checks, cache watchers, the status page's catalogue): a
//!   context of its own, declaring no capabilities.
//!
//! `scope` is coarser than `key`: the client whose `notifications/cancelled` may reach a
//! request (the context without the capabilities, or the legacy session).

use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use crate::pool::OwnerKey;
use crate::protocol::{LEGACY_VERSIONS, portico_info};

/// What an upstream session is opened for.
#[derive(Clone, Debug)]
pub struct Owner {
    /// The pool key: one upstream session per key.
    pub key: OwnerKey,
    /// The cancellation scope: the client (context or legacy session) the requests are of.
    pub scope: OwnerKey,
    /// The group whose quota of pooled sessions this owner's counts against: a 2026-07-28
    /// client's authorization context, since it chooses the capabilities in its key; an
    /// authenticated principal's, for its initialize-era client sessions, since it opens as
    /// many as it likes. `None` for portico and an anonymous legacy client (nothing tells two
    /// anonymous callers apart).
    pub group: Option<Group>,
    /// The revision asked for in `initialize` (a legacy client's negotiated one; else the
    /// newest the bridge speaks).
    pub version: &'static str,
    /// The client's declared capabilities as JSON text, sent in `initialize` (parsed only
    /// then: building an owner is on every bridged request).
    capabilities: Box<str>,
    /// The client's clientInfo as JSON text (portico's when it declared none).
    client_info: Option<Box<str>>,
    /// Unix milliseconds after which the owner is gone (a legacy client's session expiry);
    /// `u64::MAX` for none.
    pub expires_ms: u64,
    /// Upstream sessions another replica opened for this owner and sealed into a legacy
    /// client's session id: `(backend, Mcp-Session-Id, negotiated revision)`.
    pub sealed: Vec<(String, String, String)>,
    /// portico's own traffic.
    pub portico: bool,
    /// How the client receives the server's requests during its calls (`input`); `None`
    /// for portico's own traffic, which refuses them.
    pub input: Option<super::input::InputSide>,
}

/// Which of a backend's quotas an owner's upstream sessions count against, and the group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    /// A 2026-07-28 client's authorization context (`max_upstream_sessions_per_context`).
    Context(OwnerKey),
    /// An authenticated principal's initialize-era client sessions
    /// (`max_upstream_sessions_per_principal`).
    Principal(OwnerKey),
}

/// A SHA-256 over length-prefixed fields under a purpose label.
pub fn digest(label: &[u8], fields: &[&[u8]]) -> OwnerKey {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(&(label.len() as u64).to_le_bytes());
    ctx.update(label);
    for f in fields {
        ctx.update(&(f.len() as u64).to_le_bytes());
        ctx.update(f);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// How many 2026-07-28 clients' keys [`client_keys`] remembers before it starts afresh.
const MAX_REMEMBERED_KEYS: usize = 4096;

type KeyMemo = HashMap<Box<[u8]>, (OwnerKey, OwnerKey), foldhash::fast::RandomState>;

/// Remembered `(scope, key)` of 2026-07-28 clients, by their exact context and capabilities.
static CLIENT_KEYS: LazyLock<Mutex<KeyMemo>> = LazyLock::new(Default::default);

/// A 2026-07-28 client's `(scope, key)`: two SHA-256 digests, remembered, since every bridged
/// request builds its owner and the digests cost more than the rest of the request's
/// translation (callgrind: ~5.5k instructions of ~128k). The memo is looked up by the exact
/// bytes (length-prefixed context, then the capabilities), so it never gives one context
/// another's key; it is bounded, and starts afresh when full.
fn client_keys(context: &[u8], caps: &str) -> (OwnerKey, OwnerKey) {
    let mut id = Vec::with_capacity(8 + context.len() + caps.len());
    id.extend_from_slice(&(context.len() as u64).to_le_bytes());
    id.extend_from_slice(context);
    id.extend_from_slice(caps.as_bytes());
    let memo = || CLIENT_KEYS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(keys) = memo().get(id.as_slice()) {
        return *keys;
    }
    let scope = digest(b"portico/owner/context", &[context]);
    let key = digest(b"portico/owner/client", &[context, caps.as_bytes()]);
    let mut m = memo();
    if m.len() >= MAX_REMEMBERED_KEYS {
        m.clear();
    }
    m.insert(id.into_boxed_slice(), (scope, key));
    (scope, key)
}

impl Owner {
    /// portico's own context: no client, no capabilities.
    pub fn portico() -> Owner {
        let key = digest(b"portico/owner/portico", &[]);
        Owner {
            key,
            scope: key,
            group: None,
            version: LEGACY_VERSIONS[0],
            capabilities: "{}".into(),
            client_info: None,
            expires_ms: u64::MAX,
            sealed: Vec::new(),
            portico: true,
            input: None,
        }
    }

    /// A 2026-07-28 client: `context` names its authorization context (and team), the raw
    /// `_meta` capabilities and clientInfo are what it declared.
    pub fn client(context: &[u8], capabilities: Option<&str>, client_info: Option<&str>) -> Owner {
        let caps_raw = capabilities.unwrap_or("{}");
        let (scope, key) = client_keys(context, caps_raw);
        Owner {
            key,
            scope,
            group: Some(Group::Context(scope)),
            version: LEGACY_VERSIONS[0],
            capabilities: caps_raw.into(),
            client_info: client_info.map(Into::into),
            expires_ms: u64::MAX,
            sealed: Vec::new(),
            portico: false,
            input: None,
        }
    }

    /// An initialize-era client's session: `session` names it (its sealed nonce), `principal`
    /// is who opened it (when portico authenticated one), the rest is what it said in its own
    /// `initialize`.
    pub fn legacy_client(
        session: &[u8],
        principal: Option<&str>,
        version: &str,
        capabilities: &Value,
        client_info: Option<&Value>,
        expires_ms: u64,
    ) -> Owner {
        let key = digest(b"portico/owner/legacy-session", &[session]);
        Owner {
            key,
            scope: key,
            group: principal
                .map(|p| Group::Principal(digest(b"portico/owner/principal", &[p.as_bytes()]))),
            version: LEGACY_VERSIONS
                .iter()
                .find(|v| **v == version)
                .copied()
                .unwrap_or(LEGACY_VERSIONS[0]),
            capabilities: capabilities.to_string().into(),
            client_info: client_info.map(|i| i.to_string().into()),
            expires_ms,
            sealed: Vec::new(),
            portico: false,
            input: None,
        }
    }

    /// The capabilities the upstream `initialize` declares (`{}` unless the client declared an
    /// object).
    pub fn capabilities(&self) -> Value {
        serde_json::from_str::<Value>(&self.capabilities)
            .ok()
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}))
    }

    /// What the client declared, as it sent it.
    pub fn capabilities_text(&self) -> &str {
        &self.capabilities
    }

    /// The clientInfo the upstream `initialize` carries (portico's unless the client declared
    /// an object).
    pub fn client_info(&self) -> Value {
        self.client_info
            .as_deref()
            .and_then(|i| serde_json::from_str::<Value>(i).ok())
            .filter(Value::is_object)
            .unwrap_or_else(portico_info)
    }

    /// The upstream session another replica opened on `backend` for this owner, if any.
    pub fn sealed_for(&self, backend: &str) -> Option<(&str, &str)> {
        self.sealed
            .iter()
            .find(|(b, _, _)| b == backend)
            .map(|(_, id, v)| (id.as_str(), v.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_separate_contexts_capabilities_and_sessions() {
        let a = Owner::client(b"p:alice", Some("{}"), None);
        let a_sampling = Owner::client(b"p:alice", Some(r#"{"sampling":{}}"#), None);
        let b = Owner::client(b"p:bob", Some("{}"), None);
        assert_ne!(a.key, a_sampling.key, "capabilities shape the session");
        assert_eq!(a.scope, a_sampling.scope, "but not who may cancel");
        assert_ne!(a.key, b.key);
        assert_ne!(a.scope, b.scope);
        assert_eq!(a_sampling.capabilities(), json!({"sampling":{}}));
        assert_eq!(a.client_info(), portico_info());
        let s1 = Owner::legacy_client(b"n1", None, "2025-06-18", &json!({}), None, 1);
        let s2 = Owner::legacy_client(b"n2", None, "2099-01-01", &json!(null), None, 1);
        assert_ne!(s1.key, s2.key);
        assert_eq!(s1.version, "2025-06-18");
        assert_eq!(s2.version, LEGACY_VERSIONS[0]);
        assert_eq!(s2.capabilities(), json!({}));
        assert_ne!(Owner::portico().key, a.key);
        // One principal's legacy sessions count against one group, its own.
        let group =
            |n: &[u8], p| Owner::legacy_client(n, p, "2025-06-18", &json!({}), None, 1).group;
        assert_eq!(group(b"n1", Some("alice")), group(b"n2", Some("alice")));
        assert_ne!(group(b"n1", Some("alice")), group(b"n1", Some("bob")));
        assert!(matches!(
            group(b"n1", Some("alice")),
            Some(Group::Principal(_))
        ));
        assert_eq!(s1.group, None, "anonymous sessions: the cap alone");
    }

    #[test]
    fn remembered_keys_are_the_digests_and_never_mix_contexts() {
        for _ in 0..2 {
            // The second round is served from the memo.
            let (scope, key) = client_keys(b"p:carol", r#"{"roots":{}}"#);
            assert_eq!(scope, digest(b"portico/owner/context", &[b"p:carol"]));
            let fresh = digest(b"portico/owner/client", &[b"p:carol", br#"{"roots":{}}"#]);
            assert_eq!(key, fresh);
        }
        // Where the context ends is part of the memo's key: moving bytes across it is
        // another client.
        let (s1, k1) = client_keys(b"p:ab", "c{}");
        let (s2, k2) = client_keys(b"p:abc", "{}");
        assert_ne!(s1, s2);
        assert_ne!(k1, k2);
    }
}
