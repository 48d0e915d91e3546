//! JSON text surgery shared by the cache: an object's members as raw text (so rewriting one
//! member never reformats the others), and re-addressing a response to the caller's id.

use bytes::{Bytes, BytesMut};

pub(super) use crate::jsonrpc::{Members, parse_members};
use crate::protocol::RequestId;

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
