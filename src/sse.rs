//! Server-Sent Events, both ways: [`sse_event`] encodes one JSON-RPC message as an event, and
//! [`SseDecoder`] decodes upstream answers incrementally — bytes in, one `data` payload per event
//! out. Pure and bounded (an event larger than the limit is an error, not an OOM), so the
//! decoder is also a fuzz target. [`EventEnds`] only notices where events end in bytes that are
//! relayed untouched (the idle clock of a long call, README "Long calls").
//!
//! Only what MCP uses is kept: `data:` lines joined by `\n`; `event:` is kept for the caller
//! to ask about, `id:` and `retry:` as the stream's last event id and reconnection time (what
//! a client needs to resume a 2025-11-25 stream its server closed early); comment lines are
//! dropped; an event with empty data (the 2025-11-25 priming event) yields nothing, though its
//! id counts.

use bytes::{Buf, Bytes, BytesMut};

/// One SSE event carrying one JSON-RPC message.
pub fn sse_event(message: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(message.len() + 24);
    out.extend_from_slice(b"event: message\ndata: ");
    // A JSON text from serde never holds a raw newline, but an upstream's might (pretty-printed);
    // SSE needs each line prefixed.
    for (i, line) in message.split(|b| *b == b'\n').enumerate() {
        if i > 0 {
            out.extend_from_slice(b"\ndata: ");
        }
        out.extend_from_slice(line.strip_suffix(b"\r").unwrap_or(line));
    }
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// The longest event id kept: an id is sent back as a header value, so it stays small.
const MAX_EVENT_ID: usize = 1024;

/// Default ceiling for one event.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

#[derive(Debug)]
pub struct SseDecoder {
    buf: BytesMut,
    /// Bytes at the front of `buf` already searched for a line end: a long line arriving in
    /// many pieces is scanned once, not once per piece (quadratic within a multi-MiB bound).
    scanned: usize,
    data: Vec<u8>,
    has_data: bool,
    max_event: usize,
    /// The `event:` field of the event being read, and of the one last returned (the
    /// 2024-11-05 transport's `endpoint` event is told from `message` by it).
    event: Vec<u8>,
    last_event: Vec<u8>,
    /// The `id:` field last read, and the last event id of the stream: the former as of the
    /// last dispatched event (a blank line), as the SSE rules keep it. Empty: none.
    id: Vec<u8>,
    last_id: Vec<u8>,
    /// The last `retry:` the stream sent, in milliseconds.
    retry_ms: Option<u64>,
}

#[derive(Debug, PartialEq, Eq)]
pub struct EventTooLarge;

impl SseDecoder {
    pub fn new(max_event: usize) -> SseDecoder {
        SseDecoder {
            buf: BytesMut::new(),
            scanned: 0,
            data: Vec::new(),
            has_data: false,
            max_event,
            event: Vec::new(),
            last_event: Vec::new(),
            id: Vec::new(),
            last_id: Vec::new(),
            retry_ms: None,
        }
    }

    /// The id of the last event the stream dispatched (a priming event's too), which a
    /// client resuming the stream names in `Last-Event-ID`; `None` when it gave none.
    pub fn last_event_id(&self) -> Option<&[u8]> {
        (!self.last_id.is_empty()).then_some(&self.last_id[..])
    }

    /// The reconnection time the stream last asked for (`retry:`), in milliseconds.
    pub fn retry_ms(&self) -> Option<u64> {
        self.retry_ms
    }

    /// The `event:` type of the event [`SseDecoder::next_event`] last returned (empty when it
    /// named none, which means `message`).
    pub fn event_type(&self) -> &[u8] {
        &self.last_event
    }

    /// Adds bytes from the stream.
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next complete event's data, if one is buffered.
    pub fn next_event(&mut self) -> Result<Option<Bytes>, EventTooLarge> {
        loop {
            let found = self.buf[self.scanned..]
                .iter()
                .position(|b| *b == b'\n' || *b == b'\r');
            let Some(nl) = found.map(|i| i + self.scanned) else {
                if self.buf.len() + self.data.len() > self.max_event {
                    return Err(EventTooLarge);
                }
                self.scanned = self.buf.len();
                return Ok(None);
            };
            // A lone '\r' at the end of the buffer might be the first half of "\r\n".
            let mut skip = 1;
            if self.buf[nl] == b'\r' {
                if nl + 1 == self.buf.len() {
                    self.scanned = nl;
                    return Ok(None);
                }
                if self.buf[nl + 1] == b'\n' {
                    skip = 2;
                }
            }
            let line = self.buf.split_to(nl);
            self.buf.advance(skip);
            self.scanned = 0;
            if line.is_empty() {
                if self.id != self.last_id {
                    self.last_id.clone_from(&self.id);
                }
                let event = std::mem::take(&mut self.event);
                if self.has_data {
                    self.last_event = event;
                    self.has_data = false;
                    let data = std::mem::take(&mut self.data);
                    if !data.iter().all(|b| b.is_ascii_whitespace()) {
                        return Ok(Some(Bytes::from(data)));
                    }
                }
                continue;
            }
            let (field, value) = match line.iter().position(|b| *b == b':') {
                Some(0) => continue, // comment / keep-alive
                Some(i) => {
                    let v = &line[i + 1..];
                    (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
                }
                None => (&line[..], &b""[..]),
            };
            if field == b"event" {
                self.event = value.iter().take(64).copied().collect();
                continue;
            }
            if field == b"id" {
                // An id holding NUL is ignored (the SSE rules); a long one is not kept whole.
                if !value.contains(&0) && value.len() <= MAX_EVENT_ID {
                    self.id = value.to_vec();
                }
                continue;
            }
            if field == b"retry" {
                if !value.is_empty() && value.iter().all(u8::is_ascii_digit) {
                    self.retry_ms = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
                }
                continue;
            }
            if field == b"data" {
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
                if self.data.len() > self.max_event {
                    return Err(EventTooLarge);
                }
            }
        }
    }

    /// At end of stream: a final event that was not followed by a blank line.
    pub fn finish(&mut self) -> Option<Bytes> {
        if !self.buf.is_empty() {
            self.buf.extend_from_slice(b"\n\n");
            if let Ok(Some(ev)) = self.next_event() {
                return Some(ev);
            }
        }
        if self.has_data {
            self.has_data = false;
            let data = std::mem::take(&mut self.data);
            if !data.iter().all(|b| b.is_ascii_whitespace()) {
                return Some(Bytes::from(data));
            }
        }
        None
    }
}

/// Watches relayed SSE bytes for the end of events without holding them: a relay that passes
/// bytes on untouched still needs to know when a message has gone by, to restart an idle timer.
/// A message is an event with a `data` field; keep-alive comments and events of other fields
/// only (`event: ping`, `id:`, `retry:`), which carry no message, do not count — a hung tool
/// behind a chatty transport is still cut (README "Long calls"). Constant memory, over
/// arbitrary chunk boundaries.
#[derive(Debug, Clone)]
pub struct EventEnds {
    /// The next byte starts a line.
    line_start: bool,
    /// The last byte was a CR (a following LF belongs to the same line end).
    after_cr: bool,
    /// How much of `data` the current line has begun with ([`DATA_NOT`]: it is not a data line).
    matched: u8,
    /// The event being read has a `data` field.
    has_data: bool,
}

/// `EventEnds::matched` of a line that is not (or no longer could be) a `data` field.
const DATA_NOT: u8 = u8::MAX;

impl Default for EventEnds {
    fn default() -> Self {
        EventEnds {
            line_start: true,
            after_cr: false,
            matched: DATA_NOT,
            has_data: false,
        }
    }
}

impl EventEnds {
    /// Feeds the next bytes of the stream; `true` when an event with a `data` field ended in
    /// them.
    pub fn feed(&mut self, chunk: &[u8]) -> bool {
        const DATA: &[u8] = b"data";
        let mut ended = false;
        for &b in chunk {
            let after_cr = std::mem::replace(&mut self.after_cr, false);
            match b {
                b'\n' if after_cr => {}
                b'\r' | b'\n' => {
                    if self.line_start {
                        ended |= self.has_data;
                        self.has_data = false;
                    } else if usize::from(self.matched) == DATA.len() {
                        // `data` alone on its line: the field with an empty value.
                        self.has_data = true;
                    }
                    self.matched = DATA_NOT;
                    self.line_start = true;
                    self.after_cr = b == b'\r';
                }
                _ if self.line_start => {
                    self.line_start = false;
                    self.matched = if b == DATA[0] { 1 } else { DATA_NOT };
                }
                _ if self.matched == DATA_NOT => {}
                _ => {
                    let at = usize::from(self.matched);
                    self.matched = if at == DATA.len() {
                        // `data:`, or another field whose name starts with `data`.
                        self.has_data |= b == b':';
                        DATA_NOT
                    } else if b == DATA[at] {
                        self.matched + 1
                    } else {
                        DATA_NOT
                    };
                }
            }
        }
        ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Event ends are found wherever the stream is split; comment-only events do not count.
    #[test]
    fn event_ends_over_any_split() {
        let stream: &[u8] = b": keep-alive\n\nevent: message\r\ndata: {}\r\n\r\n:c\n\ndata: x\n\n";
        let count = |parts: &[&[u8]]| {
            let mut e = EventEnds::default();
            parts.iter().filter(|p| e.feed(p)).count()
        };
        assert_eq!(count(&[stream]), 1, "one chunk, two events: one true");
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(count(&bytes), 2, "byte by byte: each event seen once");
        for split in 1..stream.len() {
            let (a, b) = stream.split_at(split);
            let mut e = EventEnds::default();
            let (x, y) = (e.feed(a), e.feed(b));
            assert!(x || y, "split at {split}");
        }
        let mut e = EventEnds::default();
        assert!(!e.feed(b": only\n\n: comments\r\n\r\n"));
    }

    /// Only an event with a `data` field is a message: events of other fields alone (a
    /// transport's `event: ping`) do not restart a call's idle clock, wherever the stream splits.
    #[test]
    fn only_events_with_data_are_messages() {
        let count = |stream: &[u8]| {
            let mut whole = EventEnds::default();
            let n = usize::from(whole.feed(stream));
            let mut bytes = EventEnds::default();
            let split = stream.chunks(1).filter(|b| bytes.feed(b)).count();
            (n, split)
        };
        for (stream, messages) in [
            (&b"event: ping\n\n"[..], 0),
            (b"id: 7\r\n\r\n", 0),
            (b"retry: 1000\n\n", 0),
            (b"event: ping\nid: 1\n\n", 0),
            (b"datum: 1\n\n", 0),
            (b"dat\n\n", 0),
            (b"database: x\n\n", 0),
            (b": data: in a comment\n\n", 0),
            (b"data: {}\n\n", 1),
            (b"data:{}\r\n\r\n", 1),
            (b"data\n\n", 1),
            (b"event: message\nid: 3\ndata: {}\n\n", 1),
            (b"id: 1\rdata: x\r\r", 1),
        ] {
            let text = String::from_utf8_lossy(stream);
            assert_eq!(count(stream), (messages, messages), "{text:?}");
        }
        let mut e = EventEnds::default();
        assert!(!e.feed(b"event: ping\n\nda"));
        assert!(e.feed(b"ta: {}\n\n"), "a data field split across chunks");
    }

    fn all(input: &[&[u8]]) -> Vec<String> {
        let mut d = SseDecoder::new(1024);
        let mut out = Vec::new();
        for chunk in input {
            d.push(chunk);
            while let Some(ev) = d.next_event().unwrap() {
                out.push(String::from_utf8(ev.to_vec()).unwrap());
            }
        }
        if let Some(ev) = d.finish() {
            out.push(String::from_utf8(ev.to_vec()).unwrap());
        }
        out
    }

    /// The 2024-11-05 transport tells `endpoint` from `message` by the event type; a type
    /// without data is forgotten with its event.
    #[test]
    fn event_types_are_kept_per_event() {
        let mut d = SseDecoder::new(1024);
        d.push(
            b"event: endpoint
data: /messages?sessionId=1

event: ignored

data: {}

",
        );
        assert_eq!(d.next_event().unwrap().unwrap(), "/messages?sessionId=1");
        assert_eq!(d.event_type(), b"endpoint");
        assert_eq!(d.next_event().unwrap().unwrap(), "{}");
        assert_eq!(d.event_type(), b"", "no type: a message");
    }

    /// What a client resuming a stream needs: the id of the last event dispatched (a priming
    /// event's too, an id not yet dispatched not), and the last `retry:`.
    #[test]
    fn the_last_event_id_and_retry_are_kept() {
        let mut d = SseDecoder::new(1024);
        assert_eq!(d.last_event_id(), None);
        d.push(b"id: s1-0\ndata:\n\nretry: 250\n\n");
        assert_eq!(
            d.next_event().unwrap(),
            None,
            "a priming event is no message"
        );
        assert_eq!(d.last_event_id(), Some(&b"s1-0"[..]));
        assert_eq!(d.retry_ms(), Some(250));
        d.push(b"id: s1-1\nevent: message\ndata: {}\n\nid: s1-2\ndata: {\"x\":1}");
        assert_eq!(d.next_event().unwrap().unwrap(), "{}");
        assert_eq!(d.next_event().unwrap(), None);
        assert_eq!(
            d.last_event_id(),
            Some(&b"s1-1"[..]),
            "s1-2 is not dispatched"
        );
        d.push(b"\n\nretry: soon\nid: a\0b\n\n");
        assert_eq!(d.next_event().unwrap().unwrap(), "{\"x\":1}");
        assert_eq!(
            d.last_event_id(),
            Some(&b"s1-2"[..]),
            "an id with NUL is ignored"
        );
        assert_eq!(
            d.retry_ms(),
            Some(250),
            "a retry that is not digits is ignored"
        );
        d.push(b"id:\n\n");
        assert_eq!(d.next_event().unwrap(), None);
        assert_eq!(d.last_event_id(), None, "an empty id resets it");
    }

    #[test]
    fn decodes_events_split_anywhere() {
        let stream = b"id: 1\nevent: message\ndata: {\"a\":1}\n\n: keepalive\n\nevent: message\r\ndata: {\"b\":\r\ndata: 2}\r\n\r\nid: prime\ndata:\n\ndata: last";
        let whole = all(&[stream]);
        assert_eq!(whole, vec!["{\"a\":1}", "{\"b\":\n2}", "last"]);
        for split in 1..stream.len() {
            let (a, b) = stream.split_at(split);
            assert_eq!(all(&[a, b]), whole, "split at {split}");
        }
    }

    /// A long line arriving in small pieces is bounded, and still decodes whole when it ends
    /// within the bound (the scan position carries over between pieces).
    #[test]
    fn a_long_line_in_pieces() {
        let mut d = SseDecoder::new(64 * 1024);
        d.push(b"data: ");
        for _ in 0..1000 {
            d.push(b"0123456789");
            assert_eq!(d.next_event(), Ok(None));
        }
        d.push(b"\r");
        assert_eq!(d.next_event(), Ok(None));
        d.push(b"\n\r\n");
        assert_eq!(d.next_event().unwrap().map(|e| e.len()), Some(10_000));
        let mut d = SseDecoder::new(64 * 1024);
        d.push(b"data: ");
        let mut failed = false;
        for _ in 0..10_000 {
            d.push(b"0123456789");
            if d.next_event().is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed);
    }

    #[test]
    fn bounded() {
        let mut d = SseDecoder::new(8);
        d.push(b"data: 0123456789\n");
        assert_eq!(d.next_event(), Err(EventTooLarge));
        let mut d = SseDecoder::new(8);
        d.push(b"data: 0123456789");
        assert_eq!(d.next_event(), Err(EventTooLarge));
    }
}
