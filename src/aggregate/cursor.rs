//! portico's own pagination cursor for merged lists.
//!
//! A merged page is built from one upstream page per member that still has pages left, so the
//! cursor records, for each such member, its index and the upstream cursor that comes next.
//! Clients must treat cursors as opaque, but they are client-held input that steers upstream
//! requests, so they are signed: HMAC-SHA256 over the endpoint path, the member list and the
//! payload, with the key from `Sessions::cursor_key`. A cursor edited by hand, minted for another
//! endpoint or list method, or made before the endpoint's members changed fails to open and the
//! client gets `-32602` (the spec's answer to an invalid cursor).
//!
//! Format: `pc1.<base64url payload>.<base64url tag>`, payload `{"m":method,"p":[[i,cursor],…]}`.

use base64::Engine;
use ring::hmac;
use serde::{Deserialize, Serialize};

const PREFIX: &str = "pc1.";
/// Upper bound on a cursor we are willing to decode (a signed cursor is never near it).
const MAX_CURSOR_BYTES: usize = 64 * 1024;

/// What comes next: `(member index, upstream cursor)` for every member with pages left.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    #[serde(rename = "m")]
    pub method: String,
    #[serde(rename = "p")]
    pub parts: Vec<(usize, String)>,
}

fn tag_input(scope: &[u8], payload: &[u8]) -> Vec<u8> {
    // Length-prefixed, so (scope, payload) pairs cannot be re-split into another valid pair.
    let mut v = Vec::with_capacity(16 + scope.len() + payload.len());
    v.extend_from_slice(&(scope.len() as u64).to_le_bytes());
    v.extend_from_slice(scope);
    v.extend_from_slice(payload);
    v
}

/// Signs `pending` for an endpoint; `scope` binds it (endpoint path and member names).
pub fn seal(key: &hmac::Key, scope: &[u8], pending: &Pending) -> String {
    let payload = serde_json::to_vec(pending).unwrap_or_default();
    let tag = hmac::sign(key, &tag_input(scope, &payload));
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    format!(
        "{PREFIX}{}.{}",
        b64.encode(&payload),
        b64.encode(tag.as_ref())
    )
}

/// Opens a cursor; `None` when it is malformed, forged, or belongs to another endpoint/method.
pub fn open(key: &hmac::Key, scope: &[u8], method: &str, cursor: &str) -> Option<Pending> {
    if cursor.len() > MAX_CURSOR_BYTES {
        return None;
    }
    let (payload, tag) = cursor.strip_prefix(PREFIX)?.split_once('.')?;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let payload = b64.decode(payload).ok()?;
    let tag = b64.decode(tag).ok()?;
    hmac::verify(key, &tag_input(scope, &payload), &tag).ok()?;
    let pending: Pending = serde_json::from_slice(&payload).ok()?;
    (pending.method == method).then_some(pending)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_tampering() {
        let key = hmac::Key::new(hmac::HMAC_SHA256, b"k");
        let p = Pending {
            method: "tools/list".into(),
            parts: vec![(0, "a".into()), (2, "x\"y".into())],
        };
        let c = seal(&key, b"/mcp", &p);
        assert_eq!(open(&key, b"/mcp", "tools/list", &c), Some(p.clone()));
        assert_eq!(open(&key, b"/other", "tools/list", &c), None);
        assert_eq!(open(&key, b"/mcp", "prompts/list", &c), None);
        let other = hmac::Key::new(hmac::HMAC_SHA256, b"k2");
        assert_eq!(open(&other, b"/mcp", "tools/list", &c), None);
        // Flip one character of the payload.
        let mut bytes = c.clone().into_bytes();
        bytes[6] = if bytes[6] == b'A' { b'B' } else { b'A' };
        let tampered = String::from_utf8(bytes).unwrap();
        assert_eq!(open(&key, b"/mcp", "tools/list", &tampered), None);
        for junk in ["", "pc1.", "pc1.a.b", "abc", "pc1..", "\u{e9}"] {
            assert_eq!(open(&key, b"/mcp", "tools/list", junk), None, "{junk:?}");
        }
    }
}
