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
        RequestId::of(Raw::from(raw))
    }

    /// [`RequestId::from_raw`] for a member's value read by [`parse_members`]. An integer must
    /// fit 64 bits (signed or not), as [`RequestId::from_value`] requires: a longer one could
    /// not be echoed exactly by a message built with serde_json (it would come back as a float,
    /// or `null`), so it is refused as an invalid id rather than answered under another.
    pub fn of(raw: Raw<'_>) -> Option<RequestId> {
        let text = raw.get();
        let valid = match text.as_bytes().first() {
            Some(b'"') => true,
            Some(b'-' | b'0'..=b'9') => text.parse::<i64>().is_ok() || text.parse::<u64>().is_ok(),
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
pub struct Key<'a>(Cow<'a, str>);

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

/// One JSON value's text, known to be valid JSON: what serde's `&RawValue` is, but also made by
/// [`parse_members`]'s scanner (a `&RawValue` can only come out of serde, which would read the
/// text again). Only this module makes one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Raw<'a>(&'a str);

impl<'a> Raw<'a> {
    /// The value's JSON text.
    pub fn get(&self) -> &'a str {
        self.0
    }

    /// Where the value lies in `text`, the text it was read from (byte offsets); `None` when it
    /// was read from another.
    pub fn span_in(&self, text: &str) -> Option<std::ops::Range<usize>> {
        let start = (self.0.as_ptr() as usize).checked_sub(text.as_ptr() as usize)?;
        let end = start + self.0.len();
        (end <= text.len()).then_some(start..end)
    }
}

impl<'a> From<&'a RawValue> for Raw<'a> {
    fn from(v: &'a RawValue) -> Raw<'a> {
        Raw(v.get())
    }
}

/// An object's members, in order, each value as its raw text: rewriting one member of an object
/// never reformats the others (no float rounding, no key reordering, duplicates visible).
#[derive(Debug)]
pub struct Members<'a>(pub Vec<(Key<'a>, Raw<'a>)>);

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
    fn read<A: MapAccess<'de>>(mut map: A) -> Result<Members<'de>, A::Error> {
        let mut members = Vec::with_capacity(map.size_hint().unwrap_or(4).min(64));
        while let Some((key, value)) = map.next_entry::<Key<'de>, &'de RawValue>()? {
            members.push((key, Raw::from(value)));
        }
        Ok(Members(members))
    }
}

/// `json`'s members when it is an object; `None` for anything else or invalid JSON.
///
/// Our own scanner, not serde: every bridged message and every checked (`verify_body`) body is
/// taken apart here level by level, and serde's `&RawValue` capture costs ~40 instructions a
/// byte through its visitor machinery (callgrind, bridged `tools/call`; README "Crates, and what
/// portico writes itself" has the figures). It accepts exactly what serde_json accepts (checked
/// against it in the tests and the fuzz harness): RFC 8259 with serde's leniency kept — a
/// `\u` escape inside a value is not checked for surrogate pairs, a member name's is; nesting
/// is not limited inside a value (serde skips values without recursion either); names are
/// unescaped as serde unescapes them.
pub fn parse_members(json: &str) -> Option<Members<'_>> {
    let mut members = Vec::with_capacity(8);
    scan_members(json, |key, at| {
        let read = at.skip()?;
        members.push((key, read.raw()));
        Some(read)
    })?;
    Some(Members(members))
}

/// A member's value where [`scan_members`] met it, for its visitor to read: skipped, or (an
/// object) read member by member in place.
pub struct At<'a> {
    json: &'a str,
    start: usize,
}

/// A value read through its [`At`]: its text, and where the scan goes on.
#[derive(Clone, Copy)]
pub struct Read<'a> {
    raw: Raw<'a>,
    end: usize,
}

impl<'a> Read<'a> {
    /// The value's JSON text.
    pub fn raw(&self) -> Raw<'a> {
        self.raw
    }

    /// The byte offset just past the value, in the text the scan was given.
    pub fn end(&self) -> usize {
        self.end
    }
}

impl<'a> At<'a> {
    /// The byte offset of the value, in the text the scan was given.
    pub fn start(&self) -> usize {
        self.start
    }

    /// Whether the value is an object (its first byte; whether it is valid is for the reading).
    pub fn is_object(&self) -> bool {
        self.json.as_bytes().get(self.start) == Some(&b'{')
    }

    /// Whether the value is an array (its first byte, as [`At::is_object`]).
    pub fn is_array(&self) -> bool {
        self.json.as_bytes().get(self.start) == Some(&b'[')
    }

    /// The value read whole, unlooked-at; `None` when it is not valid JSON.
    pub fn skip(self) -> Option<Read<'a>> {
        let end = skip_value(self.json.as_bytes(), self.start)?;
        Some(Read {
            raw: Raw(self.json.get(self.start..end)?),
            end,
        })
    }

    /// The value read as an object, each member handed to `visit` as [`scan_members`] hands
    /// them; `None` when it is not a valid object.
    pub fn members(
        self,
        visit: impl FnMut(Key<'a>, At<'a>) -> Option<Read<'a>>,
    ) -> Option<Read<'a>> {
        let end = scan_object(self.json, self.start, visit)?;
        Some(Read {
            raw: Raw(self.json.get(self.start..end)?),
            end,
        })
    }

    /// The value read as an object, its members kept as raw text ([`parse_members`] in place);
    /// `None` when it is not a valid object.
    pub fn member_texts(self) -> Option<(Read<'a>, Members<'a>)> {
        let mut fields = Vec::with_capacity(8);
        let read = self.members(|name, at| {
            let read = at.skip()?;
            fields.push((name, read.raw()));
            Some(read)
        })?;
        Some((read, Members(fields)))
    }

    /// The value read as an array, each element's place handed to `visit` (which must read it,
    /// as [`scan_members`]' visitor reads a member's value); `None` when it is not a valid array.
    pub fn elements(self, mut visit: impl FnMut(At<'a>) -> Option<Read<'a>>) -> Option<Read<'a>> {
        let (json, b) = (self.json, self.json.as_bytes());
        if b.get(self.start) != Some(&b'[') {
            return None;
        }
        let mut i = skip_ws(b, self.start + 1);
        if b.get(i) != Some(&b']') {
            loop {
                i = skip_ws(b, visit(At { json, start: i })?.end);
                match b.get(i) {
                    Some(b',') => i = skip_ws(b, i + 1),
                    Some(b']') => break,
                    _ => return None,
                }
            }
        }
        let end = i + 1;
        Some(Read {
            raw: Raw(json.get(self.start..end)?),
            end,
        })
    }
}

/// Reads the object that is all of `json` (whitespace around it allowed), member by member, in
/// one pass: `visit` gets each name and the place of its value, and must read the value there
/// (returning the [`Read`] of that same `At`) — skip it, or descend into an object in place, so
/// that a nested level the caller wants is not scanned once as a value and again as an object.
/// `None` for anything that is not a valid object (the grammar of [`parse_members`]) or when
/// `visit` gives up.
pub fn scan_members<'a>(
    json: &'a str,
    visit: impl FnMut(Key<'a>, At<'a>) -> Option<Read<'a>>,
) -> Option<()> {
    let b = json.as_bytes();
    let end = scan_object(json, skip_ws(b, 0), visit)?;
    (skip_ws(b, end) == b.len()).then_some(())
}

/// The end of the object at `i` (its `{`), each member handed to `visit`.
fn scan_object<'a>(
    json: &'a str,
    mut i: usize,
    mut visit: impl FnMut(Key<'a>, At<'a>) -> Option<Read<'a>>,
) -> Option<usize> {
    let b = json.as_bytes();
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(b, i + 1);
    if b.get(i) == Some(&b'}') {
        return Some(i + 1);
    }
    loop {
        if b.get(i) != Some(&b'"') {
            return None;
        }
        let (end, escaped) = skip_string(b, i)?;
        let key = key_text(json, i, end, escaped)?;
        i = skip_ws(b, end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        let start = skip_ws(b, i + 1);
        i = skip_ws(b, visit(key, At { json, start })?.end);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b'}') => return Some(i + 1),
            _ => return None,
        }
    }
}

/// Whether [`parse_members`] reads `text` as serde_json reads it (the same members, or both
/// refusing); panics on a disagreement, naming the text. The unit tests' and the fuzz
/// harness's check of the scanner. Returns whether the text was read.
pub fn agrees_with_serde(text: &str) -> bool {
    let split = |m: Members| {
        m.0.into_iter()
            .map(|(k, v)| (k.0.into_owned(), v.get().to_owned()))
            .collect::<Vec<_>>()
    };
    let ours = parse_members(text).map(split);
    let serde = serde_json::from_str::<Members>(text).ok().map(split);
    assert_eq!(
        ours, serde,
        "parse_members and serde_json disagree on {text:?}"
    );
    ours.is_some()
}

/// JSON's four whitespace bytes.
#[inline(always)]
fn skip_ws(b: &[u8], mut i: usize) -> usize {
    // Compact JSON has none: one comparison when the next byte is past the space.
    while let Some(&c) = b.get(i) {
        if c > b' ' || !matches!(c, b' ' | b'\n' | b'\t' | b'\r') {
            break;
        }
        i += 1;
    }
    i
}

/// A member name (the string at `start..end`, quotes included), unescaped.
fn key_text(json: &str, start: usize, end: usize, escaped: bool) -> Option<Key<'_>> {
    let quoted = json.get(start..end)?;
    if !escaped {
        return quoted
            .get(1..quoted.len() - 1)
            .map(|k| Key(Cow::Borrowed(k)));
    }
    // Rare: serde unescapes it, so names compare exactly as they did (and a lone surrogate in
    // a name is refused as serde refuses it).
    serde_json::from_str::<String>(quoted)
        .ok()
        .map(|k| Key(Cow::Owned(k)))
}

/// The end of the string whose opening quote is at `i` (no control characters, valid escapes),
/// and whether it holds an escape. (`b` is a `str`'s bytes, so the text is valid UTF-8 already.)
#[inline(always)]
fn skip_string(b: &[u8], mut i: usize) -> Option<(usize, bool)> {
    const ONES: u64 = u64::from_le_bytes([1; 8]);
    const HIGH: u64 = u64::from_le_bytes([0x80; 8]);
    /// The high bit of each byte of `x` below `n` (n ≤ 128), exact up to the first such byte
    /// ("Bit Twiddling Hacks", hasless): its lowest set bit marks the first one.
    const fn less(x: u64, n: u8) -> u64 {
        x.wrapping_sub(ONES * n as u64) & !x & HIGH
    }
    let mut escaped = false;
    i += 1;
    loop {
        // Eight bytes at a time up to a quote, a backslash or a control character: member names
        // and the protocol's long `_meta` keys are where a scan spends its time.
        while let Some(chunk) = b.get(i..i + 8) {
            let mut word = [0; 8];
            word.copy_from_slice(chunk);
            let x = u64::from_le_bytes(word);
            let special = less(x ^ (ONES * u64::from(b'"')), 1)
                | less(x ^ (ONES * u64::from(b'\\')), 1)
                | less(x, 0x20);
            if special != 0 {
                i += (special.trailing_zeros() / 8) as usize;
                break;
            }
            i += 8;
        }
        match *b.get(i)? {
            b'"' => return Some((i + 1, escaped)),
            b'\\' => {
                escaped = true;
                match *b.get(i + 1)? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => i += 2,
                    b'u' if b.get(i + 2..i + 6)?.iter().all(u8::is_ascii_hexdigit) => i += 6,
                    _ => return None,
                }
            }
            c if c < 0x20 => return None,
            _ => i += 1,
        }
    }
}

/// The end of the number at `i`: `-? (0 | [1-9][0-9]*) (.[0-9]+)? ([eE][+-]?[0-9]+)?`.
fn skip_number(b: &[u8], mut i: usize) -> Option<usize> {
    let digits = |mut i: usize| {
        let from = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        (i > from).then_some(i)
    };
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    i = match b.get(i)? {
        b'0' => i + 1,
        b'1'..=b'9' => digits(i)?,
        _ => return None,
    };
    if b.get(i) == Some(&b'.') {
        i = digits(i + 1)?;
    }
    if let Some(b'e' | b'E') = b.get(i) {
        i += 1;
        if let Some(b'+' | b'-') = b.get(i) {
            i += 1;
        }
        i = digits(i)?;
    }
    // A leading zero stands alone (`01` is two tokens, which the caller then refuses).
    Some(i)
}

/// The containers a value being skipped is inside, below the innermost (which the skip keeps
/// in hand): their opening bytes, the first few inline (a message's values rarely nest deeper),
/// the rest on the heap.
struct Open {
    inline: [u8; 16],
    depth: usize,
    spill: Vec<u8>,
}

impl Open {
    fn push(&mut self, c: u8) {
        match self.inline.get_mut(self.depth) {
            Some(slot) => *slot = c,
            None => self.spill.push(c),
        }
        self.depth += 1;
    }
    /// The container below the one closed (`0`: none, the skipped value is done).
    fn pop(&mut self) -> u8 {
        let Some(top) = self.depth.checked_sub(1) else {
            return 0;
        };
        self.depth = top;
        match self.inline.get(top) {
            Some(&c) => c,
            None => self.spill.pop().unwrap_or(0),
        }
    }
}

/// The end of the JSON value at `i` (no leading whitespace). Containers are tracked on a stack of
/// their opening bytes, so depth costs memory, not recursion.
fn skip_value(b: &[u8], mut i: usize) -> Option<usize> {
    let mut open = Open {
        inline: [0; 16],
        depth: 0,
        spill: Vec::new(),
    };
    // The innermost container's opening byte, `0` outside any.
    let mut inner = 0u8;
    loop {
        // A value.
        i = match *b.get(i)? {
            b'"' => skip_string(b, i)?.0,
            b'-' | b'0'..=b'9' => skip_number(b, i)?,
            b't' => literal(b, i, b"true")?,
            b'f' => literal(b, i, b"false")?,
            b'n' => literal(b, i, b"null")?,
            c @ (b'{' | b'[') => {
                let j = skip_ws(b, i + 1);
                // `{` + 2 is `}`, `[` + 2 is `]`.
                if b.get(j) == Some(&(c + 2)) {
                    j + 1
                } else {
                    if inner != 0 {
                        open.push(inner);
                    }
                    inner = c;
                    i = if c == b'{' { member_name(b, j)? } else { j };
                    continue;
                }
            }
            _ => return None,
        };
        // After a value: the end of the outermost one, or `,` / the container's close.
        loop {
            if inner == 0 {
                return Some(i);
            }
            i = skip_ws(b, i);
            match *b.get(i)? {
                b',' => {
                    i = skip_ws(b, i + 1);
                    if inner == b'{' {
                        i = member_name(b, i)?;
                    }
                    break;
                }
                c if c == inner + 2 => {
                    inner = open.pop();
                    i += 1;
                }
                _ => return None,
            }
        }
    }
}

/// Past a member's name and its `:` at `i`: where its value starts. (Inlined: a skip calls it
/// for every member, and the call's own cost was a sixth of it.)
#[inline(always)]
fn member_name(b: &[u8], i: usize) -> Option<usize> {
    if b.get(i) != Some(&b'"') {
        return None;
    }
    let i = skip_ws(b, skip_string(b, i)?.0);
    (b.get(i) == Some(&b':')).then(|| skip_ws(b, i + 1))
}

/// The end of the literal `word` at `i`.
fn literal(b: &[u8], i: usize, word: &[u8]) -> Option<usize> {
    b.get(i..)?.starts_with(word).then_some(i + word.len())
}

/// A member name as JSON, as it was written when it held no escape: a name is borrowed only
/// then (by the scanner, and by serde, which borrows only unescaped strings), and the scanner
/// has checked such text holds no quote, backslash or control character. Escaped names are
/// written by [`write_str`].
pub fn write_key(out: &mut Vec<u8>, key: &Key<'_>) {
    match &key.0 {
        Cow::Borrowed(name) => {
            out.reserve(name.len() + 2);
            out.push(b'"');
            out.extend_from_slice(name.as_bytes());
            out.push(b'"');
        }
        Cow::Owned(name) => write_str(out, name),
    }
}

/// `text` with the value at `at` (a span of it, e.g. [`Raw::span_in`]) replaced by the JSON
/// string `s`, appended to `out`: a rewritten member costs no reading of the rest. `false`, and
/// nothing written, when `at` is not within `text`.
#[inline]
pub fn write_replaced(out: &mut Vec<u8>, text: &[u8], at: std::ops::Range<usize>, s: &str) -> bool {
    let (Some(before), Some(after)) = (text.get(..at.start), text.get(at.end..)) else {
        return false;
    };
    out.extend_from_slice(before);
    write_str(out, s);
    out.extend_from_slice(after);
    true
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
    fn members_are_read_as_serde_reads_them() {
        let valid = [
            r#"{}"#,
            " {\n\t\r} \n",
            r#"{"a":1}"#,
            r#"{"a":1,"a":2}"#,
            r#"{ "a" : -0 , "b":0.5,"c":-12.25e+10,"d":1E3,"e":1e-0 }"#,
            r#"{"s":"","t":"\"\\\/\b\f\n\r\t\u00E9\uD800","u":"é ✓"}"#,
            r#"{"n\u0061me":"x","\u00e9":1,"q\"":2}"#,
            r#"{"a":[],"b":[ ],"c":{ },"d":[1,[2,[3,{"e":[{}]}]]],"f":[true,false,null]}"#,
            r#"{"":""}"#,
        ];
        for text in valid {
            assert!(agrees_with_serde(text), "{text} must be read");
        }
        let invalid = [
            "",
            "[]",
            "1",
            r#""s""#,
            "{",
            "}",
            "{,}",
            r#"{"a"}"#,
            r#"{"a":}"#,
            r#"{"a":1,}"#,
            r#"{"a":1 "b":2}"#,
            r#"{a:1}"#,
            r#"{"a":01}"#,
            r#"{"a":-}"#,
            r#"{"a":1.}"#,
            r#"{"a":.5}"#,
            r#"{"a":1e}"#,
            r#"{"a":1e+}"#,
            r#"{"a":+1}"#,
            r#"{"a":tru}"#,
            r#"{"a":nulll}"#,
            r#"{"a":[1,]}"#,
            r#"{"a":[1 2]}"#,
            r#"{"a":{"b"}}"#,
            r#"{"a":{"b":1,}}"#,
            r#"{"a":[}"#,
            r#"{"a":{]}"#,
            r#"{"a":"\x"}"#,
            r#"{"a":"\u12"}"#,
            r#"{"a":"\u12G4"}"#,
            "{\"a\":\"tab\there\"}",
            "{\"a\":\"nl\n\"}",
            r#"{"\uD800":1}"#,
            r#"{"a":1}x"#,
            r#"{"a":1}{}"#,
            "{\"a\":1}\u{a0}",
            r#"{"a":"unterminated}"#,
        ];
        for text in invalid {
            assert!(!agrees_with_serde(text), "{text} must be refused");
        }
        // Depth: serde skips a value without recursion, and so does the scanner.
        for depth in [15, 16, 17, 200, 5000] {
            let text = format!(r#"{{"a":{}1{}}}"#, "[".repeat(depth), "]".repeat(depth));
            assert!(agrees_with_serde(&text), "depth {depth}");
            let text = format!(r#"{{"a":{}1{}}}"#, "[".repeat(depth), "]".repeat(depth - 1));
            assert!(!agrees_with_serde(&text), "unbalanced at depth {depth}");
            // Objects and arrays interleaved, past the inline stack and back: each close must
            // match its own opener, with or without whitespace between the tokens.
            for (open, close, swapped) in
                [(r#"[{"b":"#, "}]", "]}"), ("[ { \"b\" :\n", " }\t] ", "]}")]
            {
                let (open, close) = (open.repeat(depth), close.repeat(depth));
                let text = format!(r#"{{"a":{open}1{close},"c":[]}}"#);
                assert!(agrees_with_serde(&text), "interleaved at depth {depth}");
                let text = format!(r#"{{"a":{open}1{}}}"#, swapped.repeat(depth));
                assert!(!agrees_with_serde(&text), "swapped closes at depth {depth}");
            }
        }
    }

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
        // Written back: a borrowed name as it was, an unescaped one escaped as serde escapes.
        let Members(m) = parse_members(r#"{"a/b":1,"q\"\u0001\u00e9":2}"#).unwrap();
        let mut out = Vec::new();
        for (k, _) in &m {
            write_key(&mut out, k);
        }
        assert_eq!(std::str::from_utf8(&out).unwrap(), r#""a/b""q\"\u0001é""#);
    }
}
