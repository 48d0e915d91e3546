//! Legacy-client sessions that any replica can serve.
//!
//! An initialize-era client gets an `Mcp-Session-Id` that *is* its session: the negotiated
//! revision, its declared capabilities and clientInfo, the endpoint it belongs to, and an
//! expiry, sealed with ChaCha20-Poly1305 under `[sessions] key`. No server-side store, so any
//! portico process with the same key serves any session, and a restart loses nothing.
//!
//! The key is used directly (32 bytes given as base64 or hex) or, for a passphrase, derived once
//! at startup with SHA-256 — never per request: unlike gateways that run PBKDF2 on every new
//! session, opening a session costs one AEAD decryption (~1 µs).
//!
//! A tampered, expired or foreign id fails to open, and the client gets 404 so it starts over
//! with `initialize`, as the spec says. So does a revoked one: `DELETE` ends a session by
//! recording its nonce (here, and in Redis for the other replicas) until the id expires.

use base64::Engine;
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::config::SessionsConfig;

/// Binds ciphertexts to this purpose and format version.
const AAD: &[u8] = b"portico-session-v1";
/// Prefix that marks a portico session id (and its format version).
const PREFIX: &str = "p1.";

/// What a session id carries.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SessionData {
    /// Negotiated initialize-era revision.
    pub v: String,
    /// The client's declared capabilities (sent as `_meta` clientCapabilities upstream).
    pub caps: Value,
    /// The client's clientInfo.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub info: Option<Value>,
    /// The endpoint path the session was opened on.
    pub path: String,
    /// The authenticated principal that opened it (`[auth]`); `None` for an anonymous caller.
    /// Only the same principal may use the session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pr: Option<String>,
    /// Expiry, milliseconds since the Unix epoch.
    pub exp: u64,
    /// A random nonce naming this session (base64): its upstream sessions and its revocation
    /// are keyed by it. Empty in ids minted before it existed (then the id itself names it).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub n: String,
    /// Upstream sessions opened for this session at its `initialize`, so any replica can
    /// continue them: `(backend, upstream Mcp-Session-Id, negotiated revision)`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub up: Vec<(String, String, String)>,
}

impl SessionData {
    /// The bytes naming this session (its nonce; for an older id without one, the id).
    pub fn name<'a>(&'a self, id: &'a str) -> &'a [u8] {
        if self.n.is_empty() {
            id.as_bytes()
        } else {
            self.n.as_bytes()
        }
    }
}

pub struct Sessions {
    key: LessSafeKey,
    /// Signs aggregated-list cursors (`aggregate::cursor`); derived from the same key material,
    /// so cursors too survive restarts and move between replicas when a key is configured.
    pub cursor_key: ring::hmac::Key,
    rng: SystemRandom,
    pub ttl: Duration,
    /// Seals the `requestState` of calls parked for a client's input (`bridge::input`).
    pub states: std::sync::Arc<Sealer>,
    /// Seals the ids of HTTP+SSE client sessions with the replica holding their stream
    /// (`sse_front`), so a POST that lands elsewhere is forwarded there.
    pub links: Sealer,
    /// This replica's address (`[sessions] advertise_url`) sealed once, for the event ids of
    /// the streams it holds for a `Last-Event-ID` (`legacy::resume`): a resume that lands on
    /// another replica is forwarded here. `None` without an `advertise_url`.
    pub stream_tag: Option<std::sync::Arc<str>>,
    /// Opens those tags (its own purpose, so no other sealed value passes for one).
    streams: Sealer,
    /// Sessions ended by `DELETE` on this replica (digest → expiry, Unix ms); the Redis tier
    /// tells the other replicas (`legacy::delete`).
    revoked: std::sync::Mutex<std::collections::HashMap<[u8; 32], u64>>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Turns the configured key text into 32 key bytes.
fn key_bytes(text: &str) -> [u8; 32] {
    let t = text.trim();
    for decoded in [
        base64::engine::general_purpose::STANDARD.decode(t).ok(),
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(t)
            .ok(),
        hex::decode(t).ok(),
    ]
    .into_iter()
    .flatten()
    {
        if let Ok(k) = <[u8; 32]>::try_from(decoded.as_slice()) {
            return k;
        }
    }
    // A passphrase: stretch it once, here, at startup.
    let d = ring::digest::digest(&ring::digest::SHA256, t.as_bytes());
    let mut k = [0u8; 32];
    k.copy_from_slice(d.as_ref());
    k
}

impl Sessions {
    /// Builds the sealer from config; without a key, a random one (sessions then survive
    /// neither a restart nor a second replica — logged as a warning).
    pub fn new(cfg: &SessionsConfig) -> Sessions {
        let rng = SystemRandom::new();
        let bytes = match &cfg.key {
            Some(k) => key_bytes(k),
            None => {
                tracing::warn!(
                    "no [sessions] key configured: generated a random one; legacy-client sessions \
                     will not survive a restart or move between replicas"
                );
                let mut k = [0u8; 32];
                if rng.fill(&mut k).is_err() {
                    // The OS RNG is unavailable; fall back to a time-derived key rather than
                    // refusing to start (sessions stay tamper-evident, just predictable-keyed).
                    let d = ring::digest::digest(&ring::digest::SHA256, &now_ms().to_le_bytes());
                    k.copy_from_slice(d.as_ref());
                }
                k
            }
        };
        // A separate key per purpose: HMAC(key material, label).
        let cursor_key = ring::hmac::Key::new(
            ring::hmac::HMAC_SHA256,
            ring::hmac::sign(
                &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &bytes),
                b"portico-cursor-v1",
            )
            .as_ref(),
        );
        let key = LessSafeKey::new(
            UnboundKey::new(&CHACHA20_POLY1305, &bytes).expect("32-byte key for ChaCha20-Poly1305"),
        );
        let states = std::sync::Arc::new(Sealer::new(&bytes, b"portico-request-state-v1"));
        let links = Sealer::new(&bytes, b"portico-sse-session-v1");
        let streams = Sealer::new(&bytes, b"portico-stream-replica-v1");
        let stream_tag = cfg
            .advertise_url
            .as_deref()
            .map(|me| std::sync::Arc::from(streams.seal(me.as_bytes())));
        Sessions {
            key,
            cursor_key,
            states,
            links,
            stream_tag,
            streams,
            rng,
            ttl: Duration::from_millis(cfg.ttl_ms),
            revoked: Default::default(),
        }
    }

    /// The replica a stream's tag names (its `advertise_url`), when the tag opens under this
    /// deployment's key and names another replica than this one.
    pub fn stream_elsewhere(&self, tag: &str, me: Option<&str>) -> Option<String> {
        let url = String::from_utf8(self.streams.open(tag)?).ok()?;
        (me != Some(url.as_str())).then_some(url)
    }

    /// Seals session data into an id (visible ASCII, as the spec requires).
    pub fn mint(&self, data: &SessionData) -> String {
        let sealed = seal(
            &self.key,
            &self.rng,
            AAD,
            serde_json::to_vec(data).unwrap_or_default(),
        );
        if sealed.is_empty() {
            return sealed;
        }
        format!("{PREFIX}{sealed}")
    }

    /// New session data for a client that just initialized on `path` (anonymous; set `pr` for
    /// an authenticated caller).
    pub fn data(&self, version: &str, caps: Value, info: Option<Value>, path: &str) -> SessionData {
        let nonce = random::<16>(&self.rng);
        SessionData {
            v: version.to_string(),
            caps,
            info,
            path: path.to_string(),
            pr: None,
            exp: now_ms().saturating_add(self.ttl.as_millis() as u64),
            n: base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(nonce),
            up: Vec::new(),
        }
    }

    /// Records that the session `digest` names was ended, until its expiry `exp` (Unix ms).
    pub fn revoke(&self, digest: [u8; 32], exp: u64) {
        let now = now_ms();
        let mut r = self.revoked.lock().unwrap_or_else(|e| e.into_inner());
        // Expired ones are refused by `open` anyway: forget them as new ones come.
        r.retain(|_, e| *e > now);
        r.insert(digest, exp);
    }

    /// Whether this replica saw the session `digest` names end.
    pub fn is_revoked(&self, digest: &[u8; 32]) -> bool {
        let r = self.revoked.lock().unwrap_or_else(|e| e.into_inner());
        r.get(digest).is_some_and(|e| *e > now_ms())
    }

    /// Opens an id presented by `principal` (`None`: anonymous): `None` when it was tampered
    /// with, sealed under another key, expired, minted for another endpoint, or opened by
    /// another principal — a session id is a bearer token, so a leaked one must not let
    /// someone else (or an anonymous caller) act within it.
    pub fn open(&self, id: &str, path: &str, principal: Option<&str>) -> Option<SessionData> {
        self.open_at(id, path, principal, now_ms())
    }

    pub fn open_at(
        &self,
        id: &str,
        path: &str,
        principal: Option<&str>,
        now: u64,
    ) -> Option<SessionData> {
        let plain = open(&self.key, AAD, id.strip_prefix(PREFIX)?)?;
        let data: SessionData = serde_json::from_slice(&plain).ok()?;
        (data.exp > now && data.path == path && data.pr.as_deref() == principal).then_some(data)
    }
}

/// AEAD (ChaCha20-Poly1305) under a key derived from the `[sessions]` key for one purpose:
/// what it seals opens only with the same key material and purpose, untampered.
pub struct Sealer {
    key: LessSafeKey,
    rng: SystemRandom,
}

impl Sealer {
    fn new(material: &[u8; 32], purpose: &[u8]) -> Sealer {
        let derived = ring::hmac::sign(
            &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, material),
            purpose,
        );
        let key = LessSafeKey::new(
            UnboundKey::new(&CHACHA20_POLY1305, derived.as_ref())
                .expect("32-byte key for ChaCha20-Poly1305"),
        );
        Sealer {
            key,
            rng: SystemRandom::new(),
        }
    }

    /// Random bytes (a name nobody can guess).
    pub fn random<const N: usize>(&self) -> [u8; N] {
        random(&self.rng)
    }

    /// `plain` sealed, as URL-safe base64.
    pub fn seal(&self, plain: &[u8]) -> String {
        seal(&self.key, &self.rng, &[], plain.to_vec())
    }

    /// What `seal` sealed; `None` when tampered with, truncated or sealed under another key.
    pub fn open(&self, sealed: &str) -> Option<Vec<u8>> {
        open(&self.key, &[], sealed)
    }
}

/// Random bytes from `rng`; should the system's source fail, the clock's (a nonce must still
/// differ from the last one, and it does while time moves).
fn random<const N: usize>(rng: &SystemRandom) -> [u8; N] {
    let mut out = [0u8; N];
    if rng.fill(&mut out).is_err() {
        let t = now_ms().to_le_bytes();
        let n = t.len().min(N);
        out[..n].copy_from_slice(&t[..n]);
    }
    out
}

/// `buf` sealed under `key` with `aad` and a fresh nonce, as URL-safe base64 of the nonce
/// followed by the ciphertext and tag; empty if sealing failed. Session ids and the
/// [`Sealer`]s (request states) write this one layout.
fn seal(key: &LessSafeKey, rng: &SystemRandom, aad: &'static [u8], mut buf: Vec<u8>) -> String {
    let nonce = random::<NONCE_LEN>(rng);
    if key
        .seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad),
            &mut buf,
        )
        .is_err()
    {
        return String::new();
    }
    let mut out = Vec::with_capacity(NONCE_LEN + buf.len());
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&buf);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(out)
}

/// What [`seal`] sealed under `key` and `aad`; `None` when tampered with, truncated, not base64
/// or sealed under another key or purpose.
fn open(key: &LessSafeKey, aad: &'static [u8], text: &str) -> Option<Vec<u8>> {
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(text)
        .ok()?;
    if raw.len() < NONCE_LEN {
        return None;
    }
    let (nonce, sealed) = raw.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
    let mut sealed = sealed.to_vec();
    let plain = key.open_in_place(nonce, Aad::from(aad), &mut sealed).ok()?;
    Some(plain.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sessions(key: &str) -> Sessions {
        Sessions::new(&SessionsConfig {
            key: Some(key.into()),
            ttl_ms: 60_000,
            ..SessionsConfig::default()
        })
    }

    /// A stream's tag names its replica to the others (same key), never to itself, and
    /// nothing else opens as one: another deployment's tag, a tampered one, another sealed value.
    #[test]
    fn a_stream_tag_names_its_replica_to_the_others_only() {
        let replica = |key: &str, me: &str| {
            Sessions::new(&SessionsConfig {
                key: Some(key.into()),
                advertise_url: Some(me.into()),
                ..SessionsConfig::default()
            })
        };
        let (one, two) = (
            replica("k", "http://10.0.0.1:8787"),
            replica("k", "http://10.0.0.2:8787"),
        );
        let tag = one.stream_tag.clone().expect("a tag with advertise_url");
        let me = Some("http://10.0.0.1:8787");
        assert_eq!(one.stream_elsewhere(&tag, me), None, "its own");
        assert_eq!(
            two.stream_elsewhere(&tag, Some("http://10.0.0.2:8787"))
                .as_deref(),
            me
        );
        let foreign = replica("other key", "http://10.0.0.1:8787");
        assert_eq!(foreign.stream_elsewhere(&tag, None), None);
        let mut bad = tag.to_string();
        bad.replace_range(..1, if bad.starts_with('A') { "B" } else { "A" });
        assert_eq!(two.stream_elsewhere(&bad, None), None, "tampered");
        let link = one.links.seal(b"http://10.0.0.9:8787");
        assert_eq!(
            two.stream_elsewhere(&link, None),
            None,
            "another purpose's seal"
        );
        assert!(
            sessions("k").stream_tag.is_none(),
            "no advertise_url, no tag"
        );
    }

    #[test]
    fn round_trip_and_rejections() {
        let s = sessions("correct horse battery staple");
        let d = s.data(
            "2025-06-18",
            json!({"roots":{}}),
            Some(json!({"name":"c"})),
            "/mcp/a",
        );
        let id = s.mint(&d);
        assert!(
            id.bytes().all(|b| (0x21..=0x7e).contains(&b)),
            "visible ASCII"
        );
        assert_eq!(s.open(&id, "/mcp/a", None), Some(d.clone()));
        // Another replica with the same key.
        assert_eq!(
            sessions("correct horse battery staple").open(&id, "/mcp/a", None),
            Some(d.clone())
        );
        // Foreign key, other endpoint, expiry, tampering, garbage.
        assert_eq!(sessions("other").open(&id, "/mcp/a", None), None);
        assert_eq!(s.open(&id, "/mcp/b", None), None);
        assert_eq!(s.open_at(&id, "/mcp/a", None, d.exp + 1), None);
        let mut bytes = id.clone().into_bytes();
        let i = bytes.len() / 2;
        bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
        assert_eq!(
            s.open(&String::from_utf8(bytes).unwrap(), "/mcp/a", None),
            None
        );
        for junk in ["", "p1.", "p1.!!", "x", "p1.AAAA"] {
            assert_eq!(s.open(junk, "/mcp/a", None), None, "{junk:?}");
        }
    }

    #[test]
    fn a_session_belongs_to_its_principal() {
        let s = sessions("k");
        let mut d = s.data("2025-11-25", json!({}), None, "/mcp/a");
        d.pr = Some("alice".into());
        let id = s.mint(&d);
        assert_eq!(s.open(&id, "/mcp/a", Some("alice")), Some(d));
        assert_eq!(s.open(&id, "/mcp/a", Some("bob")), None);
        assert_eq!(s.open(&id, "/mcp/a", None), None, "anonymous");
        let anon = s.mint(&s.data("2025-11-25", json!({}), None, "/mcp/a"));
        assert!(s.open(&anon, "/mcp/a", None).is_some());
        assert_eq!(s.open(&anon, "/mcp/a", Some("alice")), None);
    }

    #[test]
    fn sealed_states_open_only_untampered_under_the_same_key() {
        let a = sessions("k");
        let sealed = a.states.seal(b"hello");
        assert_eq!(a.states.open(&sealed).as_deref(), Some(&b"hello"[..]));
        assert_eq!(
            sessions("k").states.open(&sealed).as_deref(),
            Some(&b"hello"[..])
        );
        assert_eq!(sessions("other").states.open(&sealed), None);
        let mut t = sealed.clone().into_bytes();
        let i = t.len() - 3;
        t[i] = if t[i] == b'A' { b'B' } else { b'A' };
        assert_eq!(a.states.open(&String::from_utf8(t).unwrap()), None);
        // A session id is not a state, nor the reverse.
        let id = a.mint(&a.data("2025-11-25", json!({}), None, "/p"));
        assert_eq!(a.states.open(id.strip_prefix(PREFIX).unwrap()), None);
    }

    #[test]
    fn keys_from_base64_hex_or_passphrase() {
        let b64 = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
        let hexed: String = [7u8; 32].iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(key_bytes(&b64), [7u8; 32]);
        assert_eq!(key_bytes(&hexed), [7u8; 32]);
        assert_ne!(key_bytes("passphrase"), [0u8; 32]);
        let a = sessions(&b64);
        let id = a.mint(&a.data("2025-11-25", json!({}), None, "/p"));
        assert!(sessions(&hexed).open(&id, "/p", None).is_some());
    }
}
