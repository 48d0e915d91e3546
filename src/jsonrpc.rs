//! JSON-RPC 2.0 as MCP uses it: request ids, error codes, the error message builder, and an
//! object's members as raw text (for rewriting one member without reformatting the rest). A leaf:
//! the error type (`error`) and the MCP vocabulary (`protocol`, which re-exports these) both
//! build on it, so it imports nothing of portico's.

use serde::Deserialize;
use serde::de::{MapAccess, Visitor};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;

/// JSON-RPC and MCP error codes.
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;
    /// Legacy (2025) resource-not-found; modern servers use `INVALID_PARAMS` with `data.uri`.
    pub const LEGACY_RESOURCE_NOT_FOUND: i64 = -32002;
    pub const HEADER_MISMATCH: i64 = -32020;
    pub const MISSING_CAPABILITY: i64 = -32021;
    pub const UNSUPPORTED_VERSION: i64 = -32022;
    /// Implementation-defined server error; what the SDKs use for transport-level refusals.
    pub const SERVER_ERROR: i64 = -32000;
    /// Legacy "session not found" (TypeScript SDK).
    pub const SESSION_NOT_FOUND: i64 = -32001;
    /// The answer to a request its client cancelled. MCP defines no code (a cancelled request
    /// gets no answer on stdio; the client ignores one): this is LSP's, outside the ranges
    /// JSON-RPC and MCP reserve.
    pub const REQUEST_CANCELLED: i64 = -32800;
}

// === JSON-RPC request ids ===

/// A JSON-RPC request id: a string or an integer (MCP forbids `null`). Kept as the exact JSON
/// text so an error or a spliced cache hit echoes it byte for byte.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RequestId(Box<str>);

impl RequestId {
    /// Validates raw JSON as an MCP id: a string, or an integer number.
    pub fn from_raw(raw: &RawValue) -> Option<RequestId> {
        let text = raw.get();
        let valid = match text.as_bytes().first() {
            Some(b'"') => true,
            Some(b'-' | b'0'..=b'9') => !text.contains(['.', 'e', 'E']),
            _ => false,
        };
        valid.then(|| RequestId(text.into()))
    }

    /// An id portico mints itself (for upstream requests it originates).
    pub fn number(n: u64) -> RequestId {
        RequestId(n.to_string().into())
    }

    /// The id as JSON text.
    pub fn json(&self) -> &str {
        &self.0
    }

    /// The id as a JSON value (for building messages with serde_json).
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::from_str(&self.0).unwrap_or(serde_json::Value::Null)
    }

    /// The id from a JSON value, when it is a valid MCP id.
    pub fn from_value(v: &serde_json::Value) -> Option<RequestId> {
        match v {
            serde_json::Value::String(_) => Some(RequestId(v.to_string().into())),
            serde_json::Value::Number(n) if n.is_i64() || n.is_u64() => {
                Some(RequestId(n.to_string().into()))
            }
            _ => None,
        }
    }
}

// === Building messages ===

/// Serialises a JSON-RPC error response. `id` is echoed when known (it may be left out only when
/// the request id could not be read).
pub fn error_body(
    id: Option<&RequestId>,
    code: i64,
    message: &str,
    data: Option<&serde_json::Value>,
) -> Vec<u8> {
    let mut err = serde_json::json!({ "code": code, "message": message });
    if let Some(d) = data {
        err["data"] = d.clone();
    }
    let mut msg = serde_json::json!({ "jsonrpc": "2.0", "error": err });
    if let Some(id) = id {
        msg["id"] = id.to_value();
    }
    serde_json::to_vec(&msg).unwrap_or_default()
}

// === JSON text surgery ===

/// An object's member name, borrowed from the text unless it holds an escape. (serde's own
/// `Cow<str>` always copies: callgrind counted ~5 k instructions of a bridged `tools/call` in
/// allocating names.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key<'a>(pub Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

impl Key<'_> {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl serde::Serialize for Key<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl std::ops::Deref for Key<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for Key<'_> {
    fn eq(&self, other: &str) -> bool {
        *self.0 == *other
    }
}

impl PartialEq<&str> for Key<'_> {
    fn eq(&self, other: &&str) -> bool {
        *self.0 == **other
    }
}

/// An object's members, in order, each value as its raw text: rewriting one member of an object
/// never reformats the others (no float rounding, no key reordering, duplicates visible).
#[derive(Debug)]
pub struct Members<'a>(pub Vec<(Key<'a>, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Members<'de>, A::Error> {
                Members::read(map)
            }
        }
        d.deserialize_map(V)
    }
}

impl<'de> Members<'de> {
    /// The members of the object `map` is at (for a visitor that reads objects as members).
    pub fn read<A: MapAccess<'de>>(mut map: A) -> Result<Members<'de>, A::Error> {
        let mut members = Vec::with_capacity(map.size_hint().unwrap_or(4).min(64));
        while let Some(member) = map.next_entry::<Key<'de>, &'de RawValue>()? {
            members.push(member);
        }
        Ok(Members(members))
    }
}

/// `json`'s members when it is an object; `None` for anything else or invalid JSON.
pub fn parse_members(json: &str) -> Option<Members<'_>> {
    serde_json::from_str(json).ok()
}

/// A JSON string, escaped as serde_json escapes, written straight into `out`.
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    // Most strings written here are member names that need no escape: copied as they are
    // (serde's writer costs ~70 instructions a name; callgrind, bridged `tools/call`).
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
        return;
    }
    // Writing a `str` into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_written_as_serde_writes_them() {
        for s in [
            "name",
            "",
            "é ü",
            "a\"b",
            "back\\slash",
            "nl\n",
            "\u{1}",
            "\u{7f}",
            "tab\t",
        ] {
            let mut out = Vec::new();
            write_str(&mut out, s);
            assert_eq!(out, serde_json::to_vec(s).unwrap(), "{s:?}");
        }
    }

    #[test]
    fn member_names_are_borrowed_unless_escaped() {
        let Members(m) = parse_members(r#"{"plain":1,"esc\u0061ped":2}"#).unwrap();
        assert!(matches!(m[0].0.0, Cow::Borrowed("plain")));
        assert!(matches!(&m[1].0.0, Cow::Owned(k) if k == "escaped"));
        assert_eq!(m[1].0, "escaped");
    }
}
