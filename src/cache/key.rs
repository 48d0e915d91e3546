//! Whose it is: authorization partitions and the cache key, a SHA-256 digest of every request
//! fact that can change the answer or who may see it. Pure: no IO, no clock.

use ring::digest;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

use super::json::{Members, parse_members};

/// Canonical-JSON recursion limit. Deeper input is hashed as raw text instead (still a correct
/// key, only without key-order normalisation), so hostile nesting cannot exhaust the stack.
const CANON_MAX_DEPTH: usize = 64;

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
    /// (`Bearer` vs `bearer`) get two partitions, which costs hits but never leaks. docs/protocol.md §8
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
    /// `_meta` clientInfo as raw JSON; `None` when absent (a server may answer per client).
    pub client_info: Option<&'a str>,
    /// For an aggregated endpoint's merged answer (`aggregate`): the member backends it was
    /// built from, so a change to any of them drops it. Empty for one backend's answer.
    pub covers: &'a [String],
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

impl CacheKey {
    /// The digest (for the shared tier's key names).
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

/// The cache key for `input` in `scope`. Pure.
///
/// **A wrong key is a data leak.** Two requests get the same key only if serving one's answer to
/// the other is correct, so every field that can change the answer, or who may see it, is in:
/// - `backend`: two backends' `tools/list` are different lists.
/// - `credential_id`: the upstream may answer differently per credential portico presents, and a
///   `public` answer is public only *for that credential* (docs/protocol.md §8 item 4).
/// - `method` and `params` (`cursor` / `uri`): the spec's own key (docs/protocol.md §3). Each page has its
///   own entry; a different resource is a different entry.
/// - `covers`: a merged answer is another answer than any one member's.
/// - `protocol_version`, the client capabilities and `clientInfo`: they may change `tools/list`
///   (e.g. an extension the client declares, a server that answers per client); the
///   conservative key of docs/protocol.md §8 item 2. `progressToken` and `logLevel` are left out:
///   they never shape a result. A request with any other param or `_meta` member is not cached
///   at all (`step`), so nothing that could shape an answer is outside the key.
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
    h.json(input.client_info);
    // Only when there are any, so the keys of single-backend answers stay what they were
    // (records in Redis survive an upgrade); the tag cannot be read as a scope tag.
    if !input.covers.is_empty() {
        h.field(b"covers");
        h.field(&(input.covers.len() as u64).to_le_bytes());
        for member in input.covers {
            h.field(member.as_bytes());
        }
    }
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
pub(super) struct KeyHasher(digest::Context);

impl KeyHasher {
    pub(super) fn new(domain: &[u8]) -> KeyHasher {
        let mut h = KeyHasher(digest::Context::new(&digest::SHA256));
        h.field(domain);
        h
    }

    pub(super) fn field(&mut self, bytes: &[u8]) {
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

    pub(super) fn finish(self) -> [u8; 32] {
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
