//! JSON text surgery shared by the cache: an object's members as raw text (so rewriting one
//! member never reformats the others), and re-addressing a response to the caller's id.

use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde::de::{MapAccess, Visitor};
use serde_json::value::RawValue;
use std::fmt;

use crate::protocol::RequestId;

/// never reformats the others (no float rounding, no key reordering, duplicates visible).
pub(super) struct Members<'a>(pub(super) Vec<(String, &'a RawValue)>);

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

pub(super) fn parse_members(json: &str) -> Option<Members<'_>> {
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
