//! The wire targets: the lean HTTP/1.1 server and client, each checked against `httparse`
//! and an RFC 9112 reference written here for the purpose — a disagreement is a panic.

use bytes::{Bytes, BytesMut};
use http::{HeaderName, HeaderValue, StatusCode, Version};

use crate::server::h1::{self as server, Stop};
use crate::upstream::UpstreamError;
use crate::upstream::h1::{self as client, Framing, H1Error, HeaderSpots, Step};

/// `[server] max_header_bytes` while fuzzing: small, so inputs reach the limit.
pub const SERVER_MAX_HEAD: usize = 1024;
/// `[server] max_body_bytes` while fuzzing.
pub const SERVER_MAX_BODY: u64 = 256;

/// Client bytes to start from: one or more requests on one connection.
pub const SERVER_H1_SEEDS: &[&[u8]] = &[
    b"POST /mcp/demo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 2\r\n\r\n{}",
    b"GET /mcp HTTP/1.1\r\nHost: x\r\n\r\nPOST /mcp?x=1 HTTP/1.1\r\ncontent-length: 5\r\nConnection: keep-alive, Close\r\n\r\nhello",
    b"POST /mcp HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\nMcp-Method: tools/call\r\nMcp-Name: echo\r\nMCP-Protocol-Version: 2026-07-28\r\n\r\nabcDELETE /mcp HTTP/1.1\r\nmcp-session-id: s\r\n\r\n",
    b"POST /mcp HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n",
    b"POST http://gw.example:8787/mcp?a=b HTTP/1.1\r\nExpect: 100-continue\r\ncontent-length: 1\r\n\r\nx",
    b"OPTIONS * HTTP/1.1\r\nUpgrade: h2c\r\n\r\n",
    b"GET /mcp HTTP/1.0\r\n\r\n",
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    b"DELETE /mcp/a HTTP/1.1\nHost: x\nX-Empty:\nAuthorization: Bearer a.b.c\n\n",
    b"POST /mcp HTTP/1.1\r\nContent-Length: 300\r\n\r\n",
];

/// Backend bytes to start from: one answer each (interim answers first, trailers, leftovers).
pub const UPSTREAM_H1_SEEDS: &[&[u8]] = &[
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"a\":12345}",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\ncontent-type: text/event-stream\r\n\r\n5;ext=1\r\nhello\r\nB\r\n, world!!!!\r\n0\r\nx-trailer: 1\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n",
    b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Type: text/plain\r\n\r\nto the close",
    b"HTTP/1.1 204 No Content\r\nContent-Length: 7\r\nMcp-Session-Id: abc\r\n\r\n",
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 3\r\nContent-Length: 5, 5\r\nConnection: close\r\n\r\nbusy!",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\n\r\n3 ; a=\"b\"\r\nabc\r\n000\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\nraw bytes",
    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\nTransfer-Encoding: chunked\nContent-Type: text/event-stream\n\n1\r\na\r\n0\r\n\r\n",
    b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
];

/// What the lean server made of the next request in its buffer.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Decision {
    /// More bytes are needed.
    Incomplete,
    /// Hyper serves the connection from here, every byte read so far included.
    Handoff,
    /// Refused with this status, then closed.
    Refuse(u16),
    /// A head of this many bytes.
    Accept(usize),
}

/// Input: the bytes a client sends on one connection (requests may be pipelined).
///
/// For each request the lean server reads off its buffer:
/// - differential: what `server::h1::parse_head` decides (accept, refuse, hand off to hyper,
///   wait) is what `reference_request` decides from `httparse`'s own parse and RFC 9112, and an
///   accepted head has httparse's method, target, version and header list, its Content-Length
///   and its keep-alive;
/// - framing: the body is the Content-Length bytes after the head (over the limit: not read, the
///   connection closes), and the next request starts right after it;
/// - segmentation: the first request's fate does not depend on how its bytes were split into
///   reads.
///
/// Returns what became of the connection, for the smoke test's tally; panics on a disagreement.
pub fn server_h1(wire: &[u8]) -> &'static str {
    let whole = server_first(wire, &[]);
    for sizes in segmentations(wire) {
        let split = server_first(wire, &sizes);
        // A first read of 3 to 13 bytes that may begin the HTTP/2 preface goes to hyper, which
        // serves an HTTP/1 request all the same; a refusal may name another cause first (431
        // for the bytes so far) when the whole head is refused anyway.
        let same = split == whole
            || matches!((&whole, &split), (Decision::Refuse(_), Decision::Refuse(_)))
            || (split == Decision::Handoff && wire.starts_with(b"PRI"));
        assert!(
            same,
            "server: read in pieces of {sizes:?} the first request is {split:?}, read whole \
             {whole:?}: {:?}",
            Bytes::copy_from_slice(wire)
        );
    }
    let mut spots = HeaderSpots::default();
    let mut rest = wire;
    loop {
        let mut buf = BytesMut::from(rest);
        let got = server::parse_head(&mut buf, &mut spots, SERVER_MAX_HEAD);
        check_request(rest, &got, &buf, &reference_request(rest));
        match got {
            Ok(Some(head)) => {
                // Each request takes at least its request line off the buffer: the loop ends.
                rest = &rest[rest.len() - buf.len()..];
                if head.content_length > SERVER_MAX_BODY {
                    return "body over the limit: 413, closed";
                }
                let Some(after) = rest.get(head.content_length as usize..) else {
                    return "body incomplete";
                };
                rest = after;
                if !head.keep_alive {
                    return "served, closed (Connection: close)";
                }
                if rest.is_empty() {
                    return "served";
                }
            }
            Ok(None) if rest.len() > SERVER_MAX_HEAD => return "request head too large",
            Ok(None) => return "head incomplete",
            Err(Stop::Handoff) => return "handed to hyper",
            Err(Stop::Refuse(_, why)) => return why,
            Err(Stop::Close) => panic!("parse_head closed the connection"),
        }
    }
}

/// The lean server's `read_head` over `wire` arriving in reads of `sizes` (cycled; none: one
/// read): its first decision.
pub(super) fn server_first(wire: &[u8], sizes: &[usize]) -> Decision {
    let mut spots = HeaderSpots::default();
    let mut buf = BytesMut::new();
    let mut fed = 0;
    for piece in reads(wire, sizes) {
        buf.extend_from_slice(piece);
        fed += piece.len();
        match server::parse_head(&mut buf, &mut spots, SERVER_MAX_HEAD) {
            Ok(Some(_)) => return Decision::Accept(fed - buf.len()),
            Ok(None) if buf.len() > SERVER_MAX_HEAD => return Decision::Refuse(431),
            Ok(None) => {}
            Err(Stop::Handoff) => return Decision::Handoff,
            Err(Stop::Refuse(status, _)) => return Decision::Refuse(status.as_u16()),
            Err(Stop::Close) => panic!("parse_head closed the connection"),
        }
    }
    Decision::Incomplete
}

/// The reference's verdict on one request head.
#[derive(Debug)]
pub(super) enum RefRequest {
    Incomplete,
    Handoff,
    Refuse(u16),
    /// Something for hyper and something to refuse: which is met first depends on the order of
    /// the fields, and either is right (RFC 9112 §6.3 lets a server refuse a request with a
    /// transfer coding and a bad length).
    HandoffOrRefuse400,
    Accept(RefHead),
}

#[derive(Debug)]
pub(super) struct RefHead {
    len: usize,
    method: String,
    target: String,
    headers: Vec<(String, Vec<u8>)>,
    content_length: u64,
    keep_alive: bool,
}

/// SP / HTAB trimmed off both ends (OWS, RFC 9110 §5.6.3).
pub(super) fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// A Content-Length element: 1*DIGIT, at most 19 digits (portico's bound: no overflow).
pub(super) fn ref_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// The elements of a comma-separated list over all field lines named `name` (OWS trimmed,
/// empty ones kept).
pub(super) fn list_elements<'a>(
    headers: &'a [httparse::Header<'a>],
    name: &'a str,
) -> impl Iterator<Item = &'a [u8]> + 'a {
    headers
        .iter()
        .filter(move |h| h.name.eq_ignore_ascii_case(name))
        .flat_map(|h| h.value.split(|&b| b == b','))
        .map(trim_ows)
}

/// The reference for one request head at the front of `b`, from `httparse`'s own parse (its
/// standard API, not the uninitialised-slots one portico calls), RFC 9112 and what the lean
/// server leaves to hyper — written from those rules, not from `server::h1`.
pub(super) fn reference_request(b: &[u8]) -> RefRequest {
    // A client that may be starting the HTTP/2 preface (prior-knowledge h2c) is hyper's.
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let n = b.len().min(14);
    if n >= 3 && b[..n] == PREFACE[..n] {
        return RefRequest::Handoff;
    }
    let mut slots = vec![httparse::EMPTY_HEADER; server::MAX_HEADERS];
    let mut req = httparse::Request::new(&mut slots);
    let len = match req.parse(b) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return RefRequest::Incomplete,
        // HTTP/1.0, HTTP/2.0 …: hyper's.
        Err(httparse::Error::Version) => return RefRequest::Handoff,
        Err(httparse::Error::TooManyHeaders) => return RefRequest::Refuse(431),
        Err(_) => return RefRequest::Refuse(400),
    };
    if len > SERVER_MAX_HEAD {
        return RefRequest::Refuse(431);
    }
    if req.version != Some(1) {
        return RefRequest::Handoff;
    }
    let method = req.method.expect("a complete request has a method");
    let target = req.path.expect("a complete request has a target");
    let headers = &*req.headers;
    let has = |name: &str| headers.iter().any(|h| h.name.eq_ignore_ascii_case(name));
    // What the lean server does not speak: a transfer coding (a chunked request body), Expect,
    // Upgrade.
    let hyper = has("transfer-encoding") || has("expect") || has("upgrade");
    // RFC 9112 §6.3: a Content-Length that is not a decimal number, or field lines that differ,
    // leave the framing invalid: 400. (A comma list is not taken apart on this side: stricter
    // than the RFC's leave to read a list of one repeated value as that value.)
    let mut length = Ok(None);
    for h in headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("content-length"))
    {
        length = match (length, ref_length(h.value)) {
            (Ok(None), Some(n)) => Ok(Some(n)),
            (Ok(Some(l)), Some(n)) if l == n => Ok(Some(l)),
            _ => Err(()),
        };
    }
    // What `http` represents faithfully: a method token, a request target (RFC 9112 §3.2 has no
    // fragment in it, and `http::Uri` would drop one silently), names and values.
    let representable = http::Method::from_bytes(method.as_bytes()).is_ok()
        && !target.contains('#')
        && http::Uri::try_from(target).is_ok()
        && headers.iter().all(|h| {
            HeaderName::from_bytes(h.name.as_bytes()).is_ok()
                && HeaderValue::from_bytes(h.value).is_ok()
        });
    let content_length = match (hyper, length, representable) {
        (true, Ok(_), true) => return RefRequest::Handoff,
        (true, _, _) => return RefRequest::HandoffOrRefuse400,
        (false, Ok(n), true) => n.unwrap_or(0),
        (false, _, _) => return RefRequest::Refuse(400),
    };
    let keep_alive =
        !list_elements(headers, "connection").any(|t| t.eq_ignore_ascii_case(b"close"));
    RefRequest::Accept(RefHead {
        len,
        method: method.to_owned(),
        target: target.to_owned(),
        headers: headers
            .iter()
            .map(|h| (h.name.to_owned(), h.value.to_vec()))
            .collect(),
        content_length,
        keep_alive,
    })
}

/// Panics unless portico's decision on the head at the front of `input` is the reference's.
/// `rest` is what `parse_head` left in the buffer.
pub(super) fn check_request(
    input: &[u8],
    got: &Result<Option<server::Head>, Stop>,
    rest: &[u8],
    want: &RefRequest,
) {
    let show = || Bytes::copy_from_slice(input);
    let head = match (got, want) {
        (Ok(None), RefRequest::Incomplete)
        | (Err(Stop::Handoff), RefRequest::Handoff | RefRequest::HandoffOrRefuse400) => return,
        (Err(Stop::Refuse(status, _)), RefRequest::Refuse(w)) if status.as_u16() == *w => return,
        (Err(Stop::Refuse(status, _)), RefRequest::HandoffOrRefuse400)
            if *status == StatusCode::BAD_REQUEST =>
        {
            return;
        }
        (Ok(Some(head)), RefRequest::Accept(r)) => (head, r),
        _ => {
            let got = match got {
                Ok(None) => "incomplete".to_string(),
                Ok(Some(_)) => "accepted".to_string(),
                Err(Stop::Handoff) => "handoff".to_string(),
                Err(Stop::Refuse(status, why)) => format!("{status} {why}"),
                Err(Stop::Close) => "close".to_string(),
            };
            panic!(
                "server head: portico says {got}, the reference {want:?}: {:?}",
                show()
            );
        }
    };
    let (head, r) = head;
    assert_eq!(
        rest,
        &input[r.len..],
        "server head: not taken off exactly: {:?}",
        show()
    );
    let parts = &head.parts;
    assert_eq!(parts.method.as_str(), r.method, "method: {:?}", show());
    assert_eq!(parts.version, Version::HTTP_11, "version: {:?}", show());
    // The target: byte for byte, except that an absolute-form target's scheme is lowercased and
    // an empty path is "/".
    let uri = &parts.uri;
    let same_target = match (uri.scheme_str(), uri.authority()) {
        (Some(scheme), Some(authority)) => {
            let prefix = format!("{scheme}://{authority}");
            let pq = uri.path_and_query().map_or("", |p| p.as_str());
            r.target.len() >= prefix.len()
                && r.target[..prefix.len()].eq_ignore_ascii_case(&prefix)
                && (r.target[prefix.len()..] == *pq
                    || (!r.target[prefix.len()..].starts_with('/')
                        && pq.strip_prefix('/') == Some(&r.target[prefix.len()..])))
        }
        _ => uri.to_string() == r.target,
    };
    assert!(
        same_target,
        "target {:?} became {uri:?}: {:?}",
        r.target,
        show()
    );
    // The map holds every header but those nothing past the parser reads (`LEFT_OUT`).
    let kept: Vec<_> = r
        .headers
        .iter()
        .filter(|(n, _)| !server::LEFT_OUT.iter().any(|l| n.eq_ignore_ascii_case(l)))
        .cloned()
        .collect();
    assert_eq!(
        parts.headers.len(),
        kept.len(),
        "header count: {:?}",
        show()
    );
    for (name, _) in &kept {
        let want: Vec<&[u8]> = r
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
            .collect();
        let got: Vec<&[u8]> = parts
            .headers
            .get_all(name.as_str())
            .iter()
            .map(HeaderValue::as_bytes)
            .collect();
        assert_eq!(got, want, "header {name}: {:?}", show());
    }
    assert_eq!(
        head.content_length,
        r.content_length,
        "Content-Length: {:?}",
        show()
    );
    assert_eq!(head.keep_alive, r.keep_alive, "keep-alive: {:?}", show());
}

/// `wire` as a sequence of reads: pieces of the sizes in `sizes` (cycled; none: one read).
pub(super) fn reads<'a>(wire: &'a [u8], sizes: &'a [usize]) -> impl Iterator<Item = &'a [u8]> + 'a {
    let mut at = 0;
    let mut i = 0;
    std::iter::from_fn(move || {
        if at >= wire.len() {
            return None;
        }
        let n = sizes
            .get(i % sizes.len().max(1))
            .copied()
            .unwrap_or(usize::MAX);
        i += 1;
        let piece = &wire[at..at.saturating_add(n.max(1)).min(wire.len())];
        at += piece.len();
        Some(piece)
    })
}

/// The read sizes each input is also decoded with, besides one read of everything: a cut at a
/// point the input picks, small uneven reads, and (for short inputs) one byte at a time.
pub(super) fn segmentations(wire: &[u8]) -> Vec<Vec<usize>> {
    let hash = wire.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let cut = (hash % (wire.len() as u64 + 1)) as usize;
    let mut out = vec![vec![cut.max(1), usize::MAX], vec![3, 1, 4, 1, 5, 9, 2, 6]];
    if wire.len() <= 256 {
        out.push(vec![1]);
    }
    out
}

/// What the lean client made of an answer.
#[derive(Debug, PartialEq)]
pub(super) struct Answer {
    status: u16,
    http10: bool,
    /// How the body was delimited: `length`, `chunked`, `close`.
    framing: &'static str,
    /// The header fields kept for the relay and the bridge, by name (stable).
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    /// Whether the connection would go back to the pool.
    reusable: bool,
}

/// Where an answer broke.
#[derive(Debug, PartialEq, Clone, Copy)]
pub(super) enum Broke {
    /// The stream ended before a complete head.
    NoHead,
    /// The head was refused: malformed, too large, a bad status, a protocol switch, bad length
    /// fields.
    Head,
    /// The chunked framing was malformed.
    Chunked,
    /// The stream ended inside the body.
    Eof,
}

/// Input: the bytes a backend answers with on one connection.
///
/// - differential: what the lean client (`upstream::h1::parse_head`, then the body decoder
///   stepped as `H1Body` steps it) makes of the bytes — status, version, kept header fields,
///   framing, body, whether the connection goes back to the pool, or where it broke — is what
///   `reference_answer` makes of them from `httparse` and RFC 9112; every chunk-size line and
///   trailer section it accepts, `httparse` reads to the same size and length;
/// - segmentation: the outcome does not depend on how the bytes were split into reads.
///
/// Returns the outcome, for the smoke test's tally; panics on a disagreement.
pub fn upstream_h1(wire: &[u8]) -> &'static str {
    let whole = client_answer(wire, &[]);
    let want = reference_answer(wire);
    let agree = match (&whole, &want) {
        (Ok(got), Ok(want)) => got == want,
        (Err((got, _)), Err(want)) => got == want,
        _ => false,
    };
    assert!(
        agree,
        "client: portico {whole:?}, the reference {want:?}: {:?}",
        Bytes::copy_from_slice(wire)
    );
    for sizes in segmentations(wire) {
        let split = client_answer(wire, &sizes);
        assert!(
            split == whole,
            "client: read in pieces of {sizes:?} {split:?}, read whole {whole:?}: {:?}",
            Bytes::copy_from_slice(wire)
        );
    }
    match whole {
        Ok(a) => match (a.framing, a.reusable) {
            ("length", true) => "length, reused",
            ("length", false) => "length, closed",
            ("chunked", true) => "chunked, reused",
            ("chunked", false) => "chunked, closed",
            _ => "to the close",
        },
        Err((_, why)) => why,
    }
}

/// The lean client's reading of `wire` arriving in reads of `sizes` (cycled; none: one read):
/// `Conn::poll_head`, then the body as `H1Body` steps it (`settle` after the head and after each
/// data frame, its errors left for the next step).
pub(super) fn client_answer(wire: &[u8], sizes: &[usize]) -> Result<Answer, (Broke, &'static str)> {
    let mut pieces = reads(wire, sizes);
    let mut buf = BytesMut::new();
    let mut spots = HeaderSpots::default();
    let head = loop {
        if !buf.is_empty() {
            match client::parse_head(&mut buf, &mut spots, &mut 0) {
                Ok(Some(head)) => break head,
                Ok(None) if buf.len() > client::MAX_HEAD_BYTES => {
                    return Err((Broke::Head, "answer head too large"));
                }
                Ok(None) => {}
                Err(e) => return Err((Broke::Head, head_why(&e))),
            }
        }
        match pieces.next() {
            Some(piece) => buf.extend_from_slice(piece),
            None => return Err((Broke::NoHead, "closed before an answer")),
        }
    };
    let framing_name = match head.framing {
        Framing::Length(_) => "length",
        Framing::Chunked(_) => "chunked",
        Framing::Close => "close",
        Framing::Done | Framing::Failed | Framing::Broken => {
            panic!("a new answer's body is already over")
        }
    };
    let (mut framing, mut keep_alive) = (head.framing, head.keep_alive);
    let _ = framing.step(&mut buf, false);
    let mut body = Vec::new();
    loop {
        match framing.step(&mut buf, true) {
            Ok(Step::Data(data)) => {
                assert!(!data.is_empty(), "an empty data frame");
                body.extend_from_slice(&data);
                let _ = framing.step(&mut buf, false);
                continue;
            }
            Ok(Step::Done) => break,
            Ok(Step::NeedMore) => {}
            Err(H1Error::Chunked) => return Err((Broke::Chunked, "malformed chunked encoding")),
            Err(e) => panic!("a decoding step without I/O failed: {e}"),
        }
        match pieces.next() {
            Some(piece) => buf.extend_from_slice(piece),
            None if matches!(framing, Framing::Close) => {
                framing = Framing::Done;
                keep_alive = false;
                break;
            }
            None => return Err((Broke::Eof, "closed inside the body")),
        }
    }
    let mut headers: Vec<(String, Vec<u8>)> = head
        .headers
        .iter()
        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect();
    headers.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Answer {
        status: head.status.as_u16(),
        http10: head.version == Version::HTTP_10,
        framing: framing_name,
        headers,
        body,
        // Bytes after the answer keep the connection out of the pool: those already read
        // (`take_reusable`), and those that come later (the pool's idle check).
        reusable: matches!(framing, Framing::Done)
            && keep_alive
            && buf.is_empty()
            && pieces.next().is_none(),
    })
}

/// Why `parse_head` refused an answer head, as a fixed string.
pub(super) fn head_why(e: &UpstreamError) -> &'static str {
    let UpstreamError::Protocol(message) = e else {
        panic!("parse_head failed with {e}");
    };
    [
        "bad answer head",
        "answer head too large",
        "unexpected protocol switch",
        "bad status",
        "bad content-length",
        "conflicting content-length",
        "bad header field in answer",
    ]
    .into_iter()
    .find(|why| message.starts_with(why))
    .unwrap_or("answer head refused")
}

/// A field line (RFC 9110 §5.1, RFC 9112 §5): a token, a colon, then field octets (no CTL but
/// HTAB).
pub(super) fn ref_field_line(line: &[u8]) -> bool {
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    let name = line.iter().take_while(|&&b| tchar(b)).count();
    name > 0
        && line.get(name) == Some(&b':')
        && line[name + 1..]
            .iter()
            .all(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

/// The next line of a chunked body, without its CRLF: it must end in CRLF (RFC 9112 §7.1; §2.2
/// allows a bare LF only in the start line and header fields) and, CRLF included, be at most
/// `MAX_LINE_BYTES` long.
pub(super) fn ref_line(rest: &[u8]) -> Result<&[u8], Broke> {
    match rest.iter().position(|&b| b == b'\n') {
        Some(i) if i + 1 > client::MAX_LINE_BYTES => Err(Broke::Chunked),
        Some(i) if i >= 1 && rest[i - 1] == b'\r' => Ok(&rest[..i - 1]),
        Some(_) => Err(Broke::Chunked),
        None if rest.len() >= client::MAX_LINE_BYTES => Err(Broke::Chunked),
        None => Err(Broke::Eof),
    }
}

/// A chunk-size line (RFC 9112 §7.1): 1 to 15 hex digits (portico's bound), then SP/HTAB
/// (which RFC 9112 does not allow there, but hyper and httparse read), then nothing, or `;` and
/// extensions, whose octets must be field octets but are otherwise ignored.
pub(super) fn ref_chunk_size(line: &[u8]) -> Option<u64> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if !(1..=15).contains(&digits) {
        return None;
    }
    let size = u64::from_str_radix(std::str::from_utf8(&line[..digits]).ok()?, 16).ok()?;
    let mut tail = &line[digits..];
    while let [b' ' | b'\t', t @ ..] = tail {
        tail = t;
    }
    match tail {
        [] => Some(size),
        [b';', ext @ ..] if ext.iter().all(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f)) => {
            Some(size)
        }
        _ => None,
    }
}

/// A chunked body at the front of `rest` (RFC 9112 §7.1): the data and what follows the body.
/// Each chunk-size line and the trailer section are checked against `httparse`'s reading.
pub(super) fn ref_chunked(mut rest: &[u8]) -> Result<(Vec<u8>, &[u8]), Broke> {
    let mut body = Vec::new();
    loop {
        let line = ref_line(rest)?;
        let size = ref_chunk_size(line).ok_or(Broke::Chunked)?;
        assert_eq!(
            httparse::parse_chunk_size(rest),
            Ok(httparse::Status::Complete((line.len() + 2, size))),
            "httparse reads the chunk-size line {:?} otherwise",
            Bytes::copy_from_slice(line)
        );
        rest = &rest[line.len() + 2..];
        if size == 0 {
            break;
        }
        let n = usize::try_from(size).unwrap_or(usize::MAX);
        let Some(data) = rest.get(..n) else {
            return Err(Broke::Eof);
        };
        body.extend_from_slice(data);
        rest = match &rest[n..] {
            [b'\r', b'\n', tail @ ..] => tail,
            [] | [b'\r'] => return Err(Broke::Eof),
            _ => return Err(Broke::Chunked),
        };
    }
    let trailers = rest;
    loop {
        let line = ref_line(rest)?;
        rest = &rest[line.len() + 2..];
        if line.is_empty() {
            break;
        }
        if !ref_field_line(line) {
            return Err(Broke::Chunked);
        }
    }
    let section = trailers.len() - rest.len();
    let mut slots = vec![httparse::EMPTY_HEADER; section / 3 + 1];
    assert!(
        matches!(
            httparse::parse_headers(trailers, &mut slots),
            Ok(httparse::Status::Complete((n, _))) if n == section
        ),
        "httparse reads the trailer section {:?} otherwise",
        Bytes::copy_from_slice(&trailers[..section])
    );
    Ok((body, rest))
}

/// The reference reading of one answer on a connection: `httparse`'s parse of each head
/// (interim 1xx answers skipped; 101 refused: portico never asks to switch), RFC 9112 §6.3 for
/// the body's length, §7.1 for chunked — written from those rules, not from `upstream::h1`.
pub(super) fn reference_answer(wire: &[u8]) -> Result<Answer, Broke> {
    let mut at = 0;
    loop {
        let b = &wire[at..];
        let mut slots = vec![httparse::EMPTY_HEADER; client::MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut slots);
        let len = match resp.parse(b) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if b.len() > client::MAX_HEAD_BYTES => {
                return Err(Broke::Head);
            }
            Ok(httparse::Status::Partial) => return Err(Broke::NoHead),
            Err(_) => return Err(Broke::Head),
        };
        if len > client::MAX_HEAD_BYTES {
            return Err(Broke::Head);
        }
        let code = resp.code.expect("a complete answer has a status");
        if code == 101 {
            return Err(Broke::Head);
        }
        if (100..200).contains(&code) {
            at += len;
            continue;
        }
        // RFC 9110 §15: a status is 100–599; anything else is no HTTP answer.
        if StatusCode::from_u16(code).is_err() || !(100..600).contains(&code) {
            return Err(Broke::Head);
        }
        let headers = &*resp.headers;
        let mut kept: Vec<(String, Vec<u8>)> = headers
            .iter()
            .filter(|h| {
                ["content-type", "retry-after", "mcp-session-id"]
                    .iter()
                    .any(|k| h.name.eq_ignore_ascii_case(k))
            })
            .map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec()))
            .collect();
        kept.sort_by(|a, b| a.0.cmp(&b.0));
        if kept
            .iter()
            .any(|(_, v)| HeaderValue::from_bytes(v).is_err())
        {
            return Err(Broke::Head);
        }
        let has = |name: &str| headers.iter().any(|h| h.name.eq_ignore_ascii_case(name));
        let (has_te, has_length) = (has("transfer-encoding"), has("content-length"));
        // RFC 9112 §6.3, for an answer to a request that is not HEAD or CONNECT:
        // ¶1 204 and 304 have no body; ¶4 a transfer coding overrides a length, chunked as the
        // final coding (the last element of the list, empty elements aside: RFC 9110 §5.6.1)
        // frames the body, any other is read to the close, and with a length as well the
        // connection is not reused; ¶5 a bad length is unrecoverable, a list of one repeated
        // value is that value (an empty element is refused, as hyper does); ¶8 no framing:
        // read to the close.
        enum F {
            Length(u64),
            Chunked,
            Close,
        }
        let (framing, faulty) = if code == 204 || code == 304 {
            (F::Length(0), false)
        } else if has_te {
            let last = list_elements(headers, "transfer-encoding")
                .filter(|e| !e.is_empty())
                .last();
            if last.is_some_and(|c| c.eq_ignore_ascii_case(b"chunked")) {
                (F::Chunked, has_length)
            } else {
                (F::Close, true)
            }
        } else if has_length {
            let mut length = None;
            for e in list_elements(headers, "content-length") {
                match (ref_length(e), length) {
                    (None, _) => return Err(Broke::Head),
                    (Some(n), Some(l)) if n != l => return Err(Broke::Head),
                    (Some(n), _) => length = Some(n),
                }
            }
            (
                F::Length(length.expect("a field line has an element")),
                false,
            )
        } else {
            (F::Close, true)
        };
        let close = list_elements(headers, "connection").any(|t| t.eq_ignore_ascii_case(b"close"));
        let http10 = resp.version == Some(0);
        let rest = &wire[at + len..];
        let (name, body, after) = match framing {
            F::Length(n) => {
                let n = usize::try_from(n).unwrap_or(usize::MAX);
                let body = rest.get(..n).ok_or(Broke::Eof)?;
                ("length", body.to_vec(), &rest[n..])
            }
            F::Chunked => {
                let (body, after) = ref_chunked(rest)?;
                ("chunked", body, after)
            }
            F::Close => ("close", rest.to_vec(), &rest[rest.len()..]),
        };
        return Ok(Answer {
            status: code,
            http10,
            framing: name,
            headers: kept,
            body,
            reusable: !faulty && !close && !http10 && after.is_empty(),
        });
    }
}
