//! A lean in-task HTTP/1.1 client for plain `http://` backends: the pass-through hot path.
//!
//! Why not hyper's client connection: it runs each connection in its own task, so every request
//! crosses an mpsc channel and a oneshot and costs extra task polls and wake-ups. Here the
//! request's own task does the I/O: the head and body go out in one write, the answer head is
//! parsed with `httparse`, and the body is relayed frame by frame (Content-Length, chunked —
//! SSE answers are chunked — or until close) as it arrives.
//!
//! A connection goes back to the pool only when its answer ended cleanly and the backend did not
//! ask to close it; dropping a body early drops the connection, which is how a backend learns
//! that a request was cancelled. A pooled connection is checked for a close by the backend
//! before reuse, and a request is never retried once written.
//!
//! Each connection keeps one deadline timer for its whole life: resetting a registered tokio
//! timer to a later instant is a lock-free store, where a fresh timer per exchange costs a
//! registration and a removal in the timer wheel.

use bytes::{Buf, Bytes, BytesMut};
use crossbeam_queue::ArrayQueue;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Version};
use http_body::{Frame, SizeHint};
use std::future::{Future, poll_fn};
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use super::UpstreamError;
use crate::error::BodyError;

/// Largest answer head we accept.
pub(crate) const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Headers per answer head (parsed on the stack).
pub(crate) const MAX_HEADERS: usize = 64;
/// Longest chunk-size or trailer line, its CRLF included.
pub(crate) const MAX_LINE_BYTES: usize = 4 * 1024;
/// Bytes taken by the read that does not wait for the reactor (the usual answer fits).
const SPECULATIVE_READ: usize = 4 * 1024;
/// Bytes asked of the socket per read.
const READ_CHUNK: usize = 16 * 1024;

/// Where each header's name and value lie in a head being parsed: recorded while the parser
/// borrows the read buffer, so that once the head is frozen every value shares its bytes
/// instead of being copied. Kept by a connection, so parsing neither allocates nor initialises
/// a large array. (The server side, `server::h1`, parses request heads the same way.)
#[derive(Default)]
pub struct HeaderSpots(Vec<(usize, usize, usize, usize)>);

impl HeaderSpots {
    /// Records the positions of `headers`, which the parser took from `buf`.
    pub fn record(&mut self, buf: &[u8], headers: &[httparse::Header<'_>]) {
        let base = buf.as_ptr() as usize;
        self.0.clear();
        for h in headers {
            let n = h.name.as_ptr() as usize - base;
            let v = h.value.as_ptr() as usize - base;
            self.0.push((n, n + h.name.len(), v, v + h.value.len()));
        }
    }

    /// The recorded headers as a map over `head` (the frozen bytes `buf` held). `name` names a
    /// header, `Ok(None)` leaving it out; `None` if a name or value is not valid HTTP.
    pub fn map(
        &self,
        head: &Bytes,
        name: impl Fn(&[u8]) -> Result<Option<HeaderName>, ()>,
    ) -> Option<HeaderMap> {
        let mut map = HeaderMap::with_capacity(self.0.len());
        for &(n0, n1, v0, v1) in &self.0 {
            let Some(name) = name(&head[n0..n1]).ok()? else {
                continue;
            };
            let value = HeaderValue::from_maybe_shared(head.slice(v0..v1)).ok()?;
            map.append(name, value);
        }
        Some(map)
    }
}

/// Whether header name `raw` is `lower`, ignoring case, eight bytes at a time. `raw` must be a
/// name the parser accepted (an HTTP token) and `lower` spelled in `[a-z0-9-]`: over those
/// alphabets setting bit 0x20 maps each byte of `raw` onto `lower`'s exactly when they match
/// case-insensitively (the only other bytes it would map there, controls such as CR, are not
/// token characters).
#[inline]
pub fn name_is(raw: &[u8], lower: &[u8]) -> bool {
    debug_assert!(
        lower
            .iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
    );
    if raw.len() != lower.len() {
        return false;
    }
    fn word(s: &[u8]) -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(s);
        u64::from_ne_bytes(w)
    }
    let (a, b) = (raw.chunks_exact(8), lower.chunks_exact(8));
    let (ra, rb) = (a.remainder(), b.remainder());
    a.zip(b)
        .all(|(x, y)| word(x) | 0x2020_2020_2020_2020 == word(y))
        && ra.iter().zip(rb).all(|(x, y)| x | 0x20 == *y)
}

/// One pooled connection: the socket, what has been read but not consumed, and the deadline timer.
/// Boxed for its whole life, so checkout, the answer body and release move a pointer, not the
/// connection.
pub struct Conn {
    io: TcpStream,
    rbuf: BytesMut,
    wbuf: Vec<u8>,
    spots: HeaderSpots,
    sleep: Pin<Box<Sleep>>,
    /// Landing space of `read_now`, allocated on first use.
    scratch: Vec<u8>,
    /// Bytes of the current answer arrived since the last wait (`ack_before_wait`).
    got_data: bool,
}

/// Idle connections of one backend.
pub struct Pool {
    idle: ArrayQueue<Box<Conn>>,
}

/// Why the answer failed, as a body error (the relay turns `TimedOut` into its timeout message).
#[derive(Debug, thiserror::Error)]
pub enum H1Error {
    #[error("connection closed before the answer ended")]
    Eof,
    #[error("malformed chunked encoding")]
    Chunked,
    #[error("{0}")]
    Io(#[from] io::Error),
}

impl Pool {
    pub fn new(max_idle: usize) -> Pool {
        Pool {
            idle: ArrayQueue::new(max_idle.max(1)),
        }
    }

    /// A live idle connection, if any. A connection the backend closed (or wrote to unasked)
    /// while idle is dropped here, before a request is written to it.
    fn checkout(&self) -> Option<Box<Conn>> {
        while let Some(mut c) = self.idle.pop() {
            if c.rbuf.is_empty() && c.is_alive() {
                return Some(c);
            }
        }
        None
    }

    fn release(&self, conn: Box<Conn>) {
        // A full queue drops the connection: we keep at most max_idle_connections.
        let _ = self.idle.push(conn);
    }
}

impl Conn {
    async fn connect(addr: &str, deadline: Instant) -> Result<Box<Conn>, UpstreamError> {
        let io = match tokio::time::timeout_at(deadline, TcpStream::connect(addr)).await {
            Ok(Ok(io)) => io,
            Ok(Err(e)) => return Err(UpstreamError::Connect(e.to_string())),
            Err(_) => return Err(UpstreamError::Timeout),
        };
        let _ = io.set_nodelay(true);
        Ok(Box::new(Conn {
            io,
            rbuf: BytesMut::with_capacity(READ_CHUNK),
            wbuf: Vec::with_capacity(1024),
            spots: HeaderSpots::default(),
            sleep: Box::pin(tokio::time::sleep_until(deadline)),
            scratch: Vec::new(),
            got_data: false,
        }))
    }

    /// Whether the backend has neither closed this idle connection nor sent anything on it.
    /// `try_read` asks the socket only when the reactor has seen it readable, so the usual case
    /// costs nothing (or clears a stale readiness, saving a read later).
    fn is_alive(&mut self) -> bool {
        let mut probe = [0u8; 1];
        match self.io.try_read(&mut probe) {
            Err(e) => e.kind() == io::ErrorKind::WouldBlock,
            Ok(_) => false,
        }
    }

    /// Reads what the backend has already answered straight from the socket, without waiting
    /// for the reactor to report it. A backend on the same CPU often answers while our write is
    /// still in the kernel; a request that is alone then skips a trip through the scheduler
    /// and an `epoll_wait` on the latency path. Nothing there, or an error or end of stream,
    /// is left to the ordinary read that follows.
    fn read_now(&mut self) {
        use std::io::Read;
        // Safe reads need initialised memory: zeroed once per connection, not per request.
        if self.scratch.is_empty() {
            self.scratch = vec![0; SPECULATIVE_READ];
        }
        if let Ok(n @ 1..) = (&*socket2::SockRef::from(&self.io)).read(&mut self.scratch) {
            self.rbuf.extend_from_slice(&self.scratch[..n]);
            self.got_data = true;
        }
    }

    /// Before waiting for the rest of an answer that has begun to arrive, acknowledges what
    /// came at once. A backend that writes an answer in pieces without `TCP_NODELAY` (uvicorn
    /// under the Python SDK writes the head, then the body) holds each later piece until the
    /// earlier one is acknowledged, and on a kept-alive connection Linux delays that ACK by up
    /// to 40 ms: every call then took ~44 ms however fast the server was (benches/README.md,
    /// the `-py-call` targets). `TCP_QUICKACK` sends the pending ACK now. One `setsockopt`, and
    /// only when an answer is split: a backend that writes it whole never gets here.
    fn ack_before_wait(&mut self) {
        if std::mem::take(&mut self.got_data) {
            let _ = socket2::SockRef::from(&self.io).set_tcp_quickack(true);
        }
    }

    /// Reads more bytes into `rbuf`; `Ok(0)` is end of stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.rbuf.capacity() - self.rbuf.len() < 1024 {
            self.rbuf.reserve(READ_CHUNK);
        }
        // Through `AsyncRead` rather than `try_read_buf`: tokio clears the socket's readiness
        // after a short read, so the idle check at the next checkout costs no syscall.
        let read = tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.rbuf);
        if let Poll::Ready(Ok(1..)) = read {
            self.got_data = true;
        }
        read
    }

    /// Polls `f` until it is ready or the deadline passes.
    fn poll_deadline<T>(
        &mut self,
        cx: &mut Context<'_>,
        f: impl FnOnce(&mut Self, &mut Context<'_>) -> Poll<T>,
    ) -> Poll<Option<T>> {
        match f(self, cx) {
            Poll::Ready(t) => Poll::Ready(Some(t)),
            Poll::Pending => match self.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

/// Sends one request on a pooled (or new) connection and reads the answer head; the body
/// streams afterwards from the returned `H1Body`. `encode` writes the whole request (head and
/// body) into the connection's write buffer.
pub async fn exchange(
    pool: &Pool,
    addr: &str,
    deadline: Instant,
    encode: impl FnOnce(&mut Vec<u8>),
) -> Result<Response<H1Body>, UpstreamError> {
    let mut conn = match pool.checkout() {
        Some(c) => c,
        None => Conn::connect(addr, deadline).await?,
    };
    conn.sleep.as_mut().reset(deadline);
    conn.wbuf.clear();
    conn.got_data = false;
    encode(&mut conn.wbuf);
    // Written at once, not after yielding so that the other ready requests' writes reach the
    // backend as one burst: on this Linux scheduler (EEVDF) a backend sharing the CPU preempts
    // the gateway at each write that wakes it anyway, so the yield bought no batching, only a
    // task poll per request and more context switches (traced, README "Benchmark": 0.27 against
    // 0.21 per request at 64 connections, nginx 0.21).
    let alone = crate::metrics::requests_in_flight() <= 1;
    let mut written = 0;
    match poll_fn(|cx| conn.poll_deadline(cx, |c, cx| c.poll_write_all(cx, &mut written))).await {
        None => return Err(UpstreamError::Timeout),
        Some(Err(e)) => return Err(UpstreamError::Closed(format!("write failed: {e}"))),
        Some(Ok(())) => {}
    }
    if conn.wbuf.capacity() > MAX_HEAD_BYTES {
        // A large request body should not pin its buffer for the connection's life.
        conn.wbuf = Vec::with_capacity(1024);
    }
    // Only for a lone client: with others connected, answering this request at once would
    // leave the next one alone too, and the backend would be woken once per request instead
    // of once per batch (measured: 3x the context switches at 16 connections).
    if alone && crate::metrics::lone_connection() {
        conn.read_now();
    }
    let mut interim = 0;
    let head =
        match poll_fn(|cx| conn.poll_deadline(cx, |c, cx| c.poll_head(cx, &mut interim))).await {
            None => return Err(UpstreamError::Timeout),
            Some(r) => r?,
        };
    let mut body = H1Body {
        conn: Some(conn),
        framing: head.framing,
        keep_alive: head.keep_alive,
    };
    // Framing that arrived with the head and is already broken (a chunk size of `ZZZZ`) is
    // the backend's fault before anything was relayed: the caller answers 502 instead of
    // sending a 200 head it would have to break off (README "Security model", upstream
    // answers). This reads no more bytes than the head did.
    if let Err(e) = body.settle() {
        return Err(UpstreamError::Protocol(e.to_string()));
    }
    let mut resp = Response::new(body);
    *resp.status_mut() = head.status;
    *resp.version_mut() = head.version;
    *resp.headers_mut() = head.headers;
    Ok(resp)
}

/// Serializes a request, head and body, into one buffer (written with one write).
pub fn encode(req: &Request<Bytes>, out: &mut Vec<u8>) {
    let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
    encode_start(out, req.method(), target, req.body().len());
    for (name, value) in req.headers() {
        encode_header(out, name, value);
    }
    encode_end(out, req.method(), req.body());
}

/// The request line; then `encode_header` per header and `encode_end`.
pub fn encode_start(out: &mut Vec<u8>, method: &http::Method, target: &str, body_len: usize) {
    out.reserve(256 + body_len);
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
}

pub fn encode_header(out: &mut Vec<u8>, name: &HeaderName, value: &HeaderValue) {
    // Framing is ours to state; nothing configured or forwarded may contradict it.
    if name == header::CONTENT_LENGTH
        || name == header::TRANSFER_ENCODING
        || name == header::CONNECTION
    {
        return;
    }
    out.extend_from_slice(name.as_str().as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// The framing header, the blank line and the body.
pub fn encode_end(out: &mut Vec<u8>, method: &http::Method, body: &[u8]) {
    if !body.is_empty()
        || method == http::Method::POST
        || method == http::Method::PUT
        || method == http::Method::PATCH
    {
        out.extend_from_slice(b"content-length: ");
        push_decimal(out, body.len() as u64);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
}

/// Appends `n` in decimal (cheaper than `core::fmt` on this path). Shared with `server::h1`.
pub fn push_decimal(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// A Content-Length value: ASCII digits only, at most 19 of them (so it cannot overflow).
/// Shared with `server::h1`.
pub fn parse_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 19 {
        return None;
    }
    v.iter().try_fold(0u64, |n, &b| {
        b.is_ascii_digit().then(|| n * 10 + u64::from(b - b'0'))
    })
}

/// A parsed answer head.
pub(crate) struct Head {
    pub(crate) status: StatusCode,
    pub(crate) version: Version,
    pub(crate) headers: HeaderMap,
    pub(crate) framing: Framing,
    pub(crate) keep_alive: bool,
}

impl Conn {
    fn poll_write_all(
        &mut self,
        cx: &mut Context<'_>,
        written: &mut usize,
    ) -> Poll<io::Result<()>> {
        while *written < self.wbuf.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.wbuf[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        Poll::Ready(Ok(()))
    }

    /// `interim` counts the bytes of interim (1xx) answers skipped so far: a backend that
    /// sends them without end would otherwise keep this loop busy, and a busy loop never lets
    /// the deadline timer be polled.
    fn poll_head(
        &mut self,
        cx: &mut Context<'_>,
        interim: &mut usize,
    ) -> Poll<Result<Head, UpstreamError>> {
        loop {
            if !self.rbuf.is_empty() {
                match parse_head(&mut self.rbuf, &mut self.spots, interim)? {
                    Some(head) => return Poll::Ready(Ok(head)),
                    None if self.rbuf.len() > MAX_HEAD_BYTES => {
                        return Poll::Ready(Err(UpstreamError::Protocol(
                            "answer head too large".into(),
                        )));
                    }
                    None => {}
                }
            }
            let filled = match self.poll_fill(cx) {
                Poll::Ready(r) => r,
                Poll::Pending => {
                    self.ack_before_wait();
                    return Poll::Pending;
                }
            };
            match filled {
                Ok(0) => {
                    return Poll::Ready(Err(UpstreamError::Closed(
                        "connection closed before an answer".into(),
                    )));
                }
                Ok(_) => {}
                Err(e) => return Poll::Ready(Err(UpstreamError::Closed(e.to_string()))),
            }
        }
    }
}

/// Parses one answer head off the front of `buf`, skipping interim (1xx) answers (at most
/// `MAX_HEAD_BYTES` of them in all, counted in `interim`). `None`: more bytes are needed.
pub(crate) fn parse_head(
    buf: &mut BytesMut,
    spots: &mut HeaderSpots,
    interim: &mut usize,
) -> Result<Option<Head>, UpstreamError> {
    loop {
        let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut []);
        let len = match httparse::ParserConfig::default()
            .parse_response_with_uninit_headers(&mut resp, buf, &mut slots)
        {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(UpstreamError::Protocol(format!("bad answer head: {e}"))),
        };
        // Whatever the reads' sizes: a head that came whole in one large read is held to the
        // limit too, not only one still incomplete (`poll_head`).
        if len > MAX_HEAD_BYTES {
            return Err(UpstreamError::Protocol("answer head too large".into()));
        }
        let code = resp.code.unwrap_or(0);
        // RFC 9110 §15 defines 100–599; `http::StatusCode` accepts up to 999, and relaying a
        // 999 would hand the client a status no client can interpret.
        if !(100..=599).contains(&code) {
            return Err(UpstreamError::Protocol(format!("bad status {code}")));
        }
        let version = if resp.version == Some(0) {
            Version::HTTP_10
        } else {
            Version::HTTP_11
        };
        if (100..200).contains(&code) {
            if code == 101 {
                return Err(UpstreamError::Protocol("unexpected protocol switch".into()));
            }
            *interim += len;
            if *interim > MAX_HEAD_BYTES {
                return Err(UpstreamError::Protocol("too many interim answers".into()));
            }
            buf.advance(len);
            continue;
        }
        let status = StatusCode::from_u16(code)
            .map_err(|_| UpstreamError::Protocol(format!("bad status {code}")))?;
        // The framing is read from the parsed head itself; the map keeps only what the relay
        // and the bridge read, so a usual answer costs one map insert.
        let (framing, framed_by_close, close) = framing(status, resp.headers)?;
        let keep_alive = !framed_by_close && !close && version == Version::HTTP_11;
        spots.record(buf, resp.headers);
        let head = buf.split_to(len).freeze();
        let map = spots
            .map(&head, answer_header)
            .ok_or_else(|| UpstreamError::Protocol("bad header field in answer".into()))?;
        return Ok(Some(Head {
            status,
            version,
            headers: map,
            framing,
            keep_alive,
        }));
    }
}

/// The answer headers anyone reads past the framing: the media type and `Retry-After` (the
/// relay), and a legacy session id (the bridge). The rest (`Date`, `Server`, …) would cost a
/// map insert per request for nothing.
fn answer_header(raw: &[u8]) -> Result<Option<HeaderName>, ()> {
    let is = |n: &[u8]| name_is(raw, n);
    // By length first: most names are turned away without looking at a byte.
    Ok(match raw.len() {
        11 if is(b"retry-after") => Some(header::RETRY_AFTER),
        12 if is(b"content-type") => Some(header::CONTENT_TYPE),
        14 if is(b"mcp-session-id") => Some(crate::protocol::header::names::SESSION_ID),
        _ => None,
    })
}

/// How the answer body is delimited (RFC 9112 §6.3); whether only a close ends it (or a
/// transfer coding and a length disagree), which rules out reusing the connection; and whether
/// the backend said `Connection: close`.
fn framing(
    status: StatusCode,
    headers: &[httparse::Header<'_>],
) -> Result<(Framing, bool, bool), UpstreamError> {
    let (mut te_last, mut has_te, mut has_length, mut close) = (None, false, false, false);
    let mut length: Option<u64> = None;
    // A bad length only matters when the length is what frames the body.
    let mut bad_length: Option<&'static str> = None;
    for h in headers {
        let name = h.name.as_bytes();
        match name.len() {
            17 if name_is(name, b"transfer-encoding") => {
                has_te = true;
                // The final coding is the list's last element, over all field lines; empty
                // elements do not count (RFC 9110 §5.6.1): `chunked,` ends in chunked.
                if let Some(last) = h
                    .value
                    .rsplit(|&b| b == b',')
                    .map(<[u8]>::trim_ascii)
                    .find(|t| !t.is_empty())
                {
                    te_last = Some(last);
                }
            }
            14 if name_is(name, b"content-length") => {
                has_length = true;
                for part in h.value.split(|&b| b == b',') {
                    match (parse_length(part.trim_ascii()), length) {
                        (None, _) => bad_length = bad_length.or(Some("bad content-length")),
                        (Some(n), Some(l)) if l != n => {
                            bad_length = bad_length.or(Some("conflicting content-length"));
                        }
                        (Some(n), _) => length = Some(n),
                    }
                }
            }
            10 if name_is(name, b"connection") => {
                close |= has_token(h.value, b"close");
            }
            _ => {}
        }
    }
    if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        return Ok((Framing::Length(0), false, close));
    }
    if has_te {
        let chunked_last = te_last.is_some_and(|t| t.eq_ignore_ascii_case(b"chunked"));
        return Ok(if chunked_last {
            (Framing::Chunked(Chunk::Size), has_length, close)
        } else {
            (Framing::Close, true, close)
        });
    }
    if let Some(why) = bad_length {
        return Err(UpstreamError::Protocol(why.into()));
    }
    Ok(match length {
        Some(n) => (Framing::Length(n), false, close),
        None => (Framing::Close, true, close),
    })
}

/// Whether a comma-separated header value holds `token` (ASCII case-insensitive). Shared with
/// `server::h1`.
pub fn has_token(value: &[u8], token: &[u8]) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
}

/// Where the body decoder stands.
pub(crate) enum Framing {
    /// This many body bytes are still to come.
    Length(u64),
    Chunked(Chunk),
    /// Everything until the backend closes.
    Close,
    /// The body has ended cleanly.
    Done,
    /// The framing was found broken while settling; the next poll reports it. Sticky: the
    /// bytes after a bad chunk-size line must never be read as the next chunk (which would
    /// skip the bad one and relay the rest as if nothing happened).
    Broken,
    /// The body broke (or timed out); the connection is gone.
    Failed,
}

/// Position inside a chunked body.
#[derive(Clone, Copy)]
pub(crate) enum Chunk {
    /// Before a chunk-size line.
    Size,
    /// Inside a chunk's data, this many bytes left.
    Data(u64),
    /// After a chunk's data, before its CRLF.
    DataEnd,
    /// After the last chunk: trailer lines until an empty one; the bytes of those read so far
    /// (bounded like a head, so endless trailers end in an error, not a busy loop).
    Trailer(usize),
}

/// One decoding step over buffered bytes.
pub(crate) enum Step {
    Data(Bytes),
    NeedMore,
    Done,
}

impl Framing {
    /// Decodes from `buf` without I/O, up to the next data, the end, or the need for more bytes.
    /// With `data: false` it stops before any data (answering `NeedMore`) and only consumes
    /// framing.
    pub(crate) fn step(&mut self, buf: &mut BytesMut, data: bool) -> Result<Step, H1Error> {
        let r = self.step_inner(buf, data);
        if r.is_err() {
            *self = Framing::Broken;
        }
        r
    }

    fn step_inner(&mut self, buf: &mut BytesMut, data: bool) -> Result<Step, H1Error> {
        match self {
            Framing::Done | Framing::Failed => Ok(Step::Done),
            Framing::Broken => Err(H1Error::Chunked),
            Framing::Length(0) => {
                *self = Framing::Done;
                Ok(Step::Done)
            }
            Framing::Length(left) => {
                if buf.is_empty() || !data {
                    return Ok(Step::NeedMore);
                }
                let take = (*left).min(buf.len() as u64) as usize;
                *left -= take as u64;
                if *left == 0 {
                    *self = Framing::Done;
                }
                Ok(Step::Data(buf.split_to(take).freeze()))
            }
            Framing::Close => Ok(if buf.is_empty() || !data {
                Step::NeedMore
            } else {
                Step::Data(buf.split().freeze())
            }),
            Framing::Chunked(state) => loop {
                match *state {
                    Chunk::Size => {
                        let Some(lf) = line_end(buf)? else {
                            return Ok(Step::NeedMore);
                        };
                        let size = chunk_size(&buf[..lf - 1])?;
                        buf.advance(lf + 1);
                        *state = if size == 0 {
                            Chunk::Trailer(0)
                        } else {
                            Chunk::Data(size)
                        };
                    }
                    Chunk::Data(left) => {
                        if buf.is_empty() || !data {
                            return Ok(Step::NeedMore);
                        }
                        let take = left.min(buf.len() as u64) as usize;
                        *state = if left == take as u64 {
                            Chunk::DataEnd
                        } else {
                            Chunk::Data(left - take as u64)
                        };
                        return Ok(Step::Data(buf.split_to(take).freeze()));
                    }
                    // The data's CRLF: a bare LF is refused, as in every line of the body.
                    Chunk::DataEnd => match &buf[..buf.len().min(2)] {
                        b"\r\n" => {
                            buf.advance(2);
                            *state = Chunk::Size;
                        }
                        b"" | b"\r" => return Ok(Step::NeedMore),
                        _ => return Err(H1Error::Chunked),
                    },
                    Chunk::Trailer(seen) => {
                        let Some(lf) = line_end(buf)? else {
                            return Ok(Step::NeedMore);
                        };
                        if lf == 1 {
                            buf.advance(2);
                            *self = Framing::Done;
                            return Ok(Step::Done);
                        }
                        if !field_line(&buf[..lf - 1]) {
                            return Err(H1Error::Chunked);
                        }
                        // Endless trailers end in an error within a head's worth of bytes.
                        let seen = seen + lf + 1;
                        if seen > MAX_HEAD_BYTES {
                            return Err(H1Error::Chunked);
                        }
                        buf.advance(lf + 1);
                        *state = Chunk::Trailer(seen);
                    }
                }
            },
        }
    }
}

/// Where the first line of a chunked body's framing ends: the index of its LF, once it is in
/// `buf`. Every such line ends in CRLF (RFC 9112 §7.1: a bare LF, which §2.2 tolerates only in
/// the start line and header fields, is where parsers disagree on a line's end) and, CRLF
/// included, fits in `MAX_LINE_BYTES` — however the bytes arrived.
fn line_end(buf: &[u8]) -> Result<Option<usize>, H1Error> {
    let window = &buf[..buf.len().min(MAX_LINE_BYTES)];
    match window.iter().position(|&b| b == b'\n') {
        Some(lf) if lf > 0 && window[lf - 1] == b'\r' => Ok(Some(lf)),
        Some(_) => Err(H1Error::Chunked),
        None if buf.len() >= MAX_LINE_BYTES => Err(H1Error::Chunked),
        None => Ok(None),
    }
}

/// A field octet (RFC 9110 §5.5): anything but a control, HTAB aside. A bare CR is not one.
fn field_octet(b: u8) -> bool {
    b == b'\t' || (b >= b' ' && b != 0x7f)
}

/// The size on a chunk-size line (without its CRLF): 1 to 15 hex digits, then optional SP or
/// HTAB (not in RFC 9112's grammar, but hyper and httparse read it), then nothing or `;` and
/// extensions, which are ignored but must be field octets.
fn chunk_size(line: &[u8]) -> Result<u64, H1Error> {
    let mut n = 0u64;
    let mut digits = 0;
    for &b in line {
        let Some(v) = (b as char).to_digit(16) else {
            break;
        };
        n = n * 16 + u64::from(v);
        digits += 1;
        if digits > 15 {
            return Err(H1Error::Chunked);
        }
    }
    if digits == 0 {
        return Err(H1Error::Chunked);
    }
    let rest = &line[digits..];
    let blank = rest
        .iter()
        .take_while(|&&b| b == b' ' || b == b'\t')
        .count();
    match rest[blank..].split_first() {
        None => Ok(n),
        Some((b';', ext)) if ext.iter().all(|&b| field_octet(b)) => Ok(n),
        Some(_) => Err(H1Error::Chunked),
    }
}

/// A trailer field line (without its CRLF): a token, a colon, field octets.
fn field_line(line: &[u8]) -> bool {
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    let name = line.iter().take_while(|&&b| tchar(b)).count();
    name > 0 && line.get(name) == Some(&b':') && line[name + 1..].iter().all(|&b| field_octet(b))
}

/// The body of an answer read by the lean client, relayed frame by frame as it arrives.
pub struct H1Body {
    /// `None` once the body is over and the connection is gone (back to the pool or dropped).
    conn: Option<Box<Conn>>,
    framing: Framing,
    /// Whether the connection may serve another request once this answer has ended.
    keep_alive: bool,
}

impl H1Body {
    /// A body that is over, holding no connection (what a relay keeps once it has failed).
    pub fn ended() -> H1Body {
        H1Body {
            conn: None,
            framing: Framing::Failed,
            keep_alive: false,
        }
    }

    /// Advances over framing bytes already buffered (a chunk's CRLF, the last chunk, trailers)
    /// so the end of the body is seen with its last data, without waiting for another poll.
    /// A framing error found here is returned for `exchange`; after data it is left to surface
    /// at the next poll (the framing stays where it failed, so that poll fails the same way).
    fn settle(&mut self) -> Result<(), H1Error> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(());
        };
        self.framing.step(&mut conn.rbuf, false).map(|_| ())
    }

    /// Moves the deadline the rest of this answer is read under (a streamed answer's idle
    /// clock, `upstream::CallClock`); resetting the connection's one timer costs no allocation.
    pub fn set_deadline(&mut self, at: Instant) {
        if let Some(conn) = self.conn.as_mut() {
            conn.sleep.as_mut().reset(at);
        }
    }

    pub fn is_end_stream(&self) -> bool {
        matches!(self.framing, Framing::Done | Framing::Failed)
    }

    pub fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Length(n) => SizeHint::with_exact(n),
            Framing::Done | Framing::Failed => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }

    /// The connection, if the body ended cleanly and it can serve another request.
    pub fn take_reusable(&mut self) -> Option<Box<Conn>> {
        if !matches!(self.framing, Framing::Done) || !self.keep_alive {
            return None;
        }
        self.conn.take().filter(|c| c.rbuf.is_empty())
    }

    fn fail(&mut self, e: BodyError) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.framing = Framing::Failed;
        self.conn = None;
        Poll::Ready(Some(Err(e)))
    }

    pub fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        loop {
            let Some(conn) = self.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match self.framing.step(&mut conn.rbuf, true) {
                Ok(Step::Data(bytes)) => {
                    let _ = self.settle();
                    return Poll::Ready(Some(Ok(Frame::data(bytes))));
                }
                Ok(Step::Done) => return Poll::Ready(None),
                Ok(Step::NeedMore) => {}
                Err(e) => return self.fail(Box::new(e)),
            }
            match conn.poll_deadline(cx, |c, cx| c.poll_fill(cx)) {
                Poll::Pending => {
                    conn.ack_before_wait();
                    return Poll::Pending;
                }
                Poll::Ready(None) => return self.fail(Box::new(super::http::TimedOut)),
                Poll::Ready(Some(Ok(0))) => {
                    if matches!(self.framing, Framing::Close) {
                        self.framing = Framing::Done;
                        self.keep_alive = false;
                        return Poll::Ready(None);
                    }
                    return self.fail(Box::new(H1Error::Eof));
                }
                Poll::Ready(Some(Ok(_))) => {}
                Poll::Ready(Some(Err(e))) => return self.fail(Box::new(H1Error::Io(e))),
            }
        }
    }
}

/// Hands a finished body's connection back to `pool` if it can be reused.
pub fn recycle(pool: &Pool, body: &mut H1Body) {
    if let Some(conn) = body.take_reusable() {
        pool.release(conn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `wire` (head included) fed in pieces of `step` bytes, stepping the body as
    /// `H1Body` does (`settle` after the head and after each data frame, its errors left to the
    /// next step); returns the head and the body bytes, or the first error.
    fn decode(wire: &[u8], step: usize) -> Result<(Head, Vec<u8>, bool), String> {
        let mut buf = BytesMut::new();
        let mut rest = wire;
        let mut head = None;
        let mut body = Vec::new();
        loop {
            if head.is_none() {
                head = parse_head(&mut buf, &mut HeaderSpots::default(), &mut 0)
                    .map_err(|e| e.to_string())?;
            }
            if let Some(h) = head.as_mut() {
                loop {
                    match h.framing.step(&mut buf, true).map_err(|e| e.to_string())? {
                        Step::Data(b) => {
                            body.extend_from_slice(&b);
                            let _ = h.framing.step(&mut buf, false);
                        }
                        Step::Done => return Ok((head.unwrap(), body, buf.is_empty())),
                        Step::NeedMore => break,
                    }
                }
            }
            if rest.is_empty() {
                return Err("incomplete".into());
            }
            let n = step.min(rest.len());
            buf.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
        }
    }

    #[test]
    fn content_length_body_in_any_split() {
        let wire = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"a\":12345}";
        for step in [1, 2, 7, 100] {
            let (h, body, clean) = decode(wire, step).unwrap();
            assert_eq!(h.status, StatusCode::OK);
            assert!(h.keep_alive);
            assert_eq!(h.headers["content-type"], "application/json");
            assert_eq!(body, b"{\"a\":12345}");
            assert!(clean);
        }
    }

    #[test]
    fn chunked_body_with_extensions_and_trailers_in_any_split() {
        let wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\ncontent-type: text/event-stream\r\n\r\n\
            5;ext=1\r\nhello\r\nB\r\n, world!!!!\r\n0\r\nx-trailer: 1\r\n\r\n";
        for step in [1, 3, 8, 1000] {
            let (h, body, clean) = decode(wire, step).unwrap();
            assert!(matches!(h.framing, Framing::Done));
            assert_eq!(body, b"hello, world!!!!");
            assert!(clean);
        }
    }

    #[test]
    fn interim_answers_are_skipped() {
        let wire =
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n";
        let (h, body, _) = decode(wire, 5).unwrap();
        assert_eq!(h.status, StatusCode::ACCEPTED);
        assert!(body.is_empty());
    }

    #[test]
    fn close_delimited_and_connection_close_answers_are_not_reused() {
        let mut buf = BytesMut::from(
            &b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: Close\r\n\r\n"[..],
        );
        assert!(
            !parse_head(&mut buf, &mut HeaderSpots::default(), &mut 0)
                .unwrap()
                .unwrap()
                .keep_alive
        );
        let mut buf = BytesMut::from(&b"HTTP/1.1 200 OK\r\n\r\n"[..]);
        let h = parse_head(&mut buf, &mut HeaderSpots::default(), &mut 0)
            .unwrap()
            .unwrap();
        assert!(matches!(h.framing, Framing::Close) && !h.keep_alive);
        let mut buf = BytesMut::from(&b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n"[..]);
        assert!(
            !parse_head(&mut buf, &mut HeaderSpots::default(), &mut 0)
                .unwrap()
                .unwrap()
                .keep_alive
        );
    }

    #[test]
    fn framing_is_read_from_the_head_and_kept_out_of_the_map() {
        let head = |wire: &[u8]| {
            let mut buf = BytesMut::from(wire);
            parse_head(&mut buf, &mut HeaderSpots::default(), &mut 0)
        };
        // Both a coding and a length: chunked wins, and the connection is not reused.
        let h = head(b"HTTP/1.1 200 OK\r\ncontent-length: x\r\ntransfer-encoding: chunked\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(matches!(h.framing, Framing::Chunked(_)) && !h.keep_alive);
        // A coding that does not end in chunked: read to close.
        let h = head(b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(matches!(h.framing, Framing::Close) && !h.keep_alive);
        // 204 has no body whatever its headers say.
        let h = head(b"HTTP/1.1 204 No Content\r\ncontent-length: junk\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(matches!(h.framing, Framing::Length(0)) && h.keep_alive);
        // Only what the relay and bridge read reaches the map.
        let h = head(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nDate: x\r\nContent-Type: a/b\r\nMcp-Session-Id: s\r\nConnection: keep-alive\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        assert!(matches!(h.framing, Framing::Length(2)) && h.keep_alive);
        let names: Vec<_> = h.headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["content-type", "mcp-session-id"]);
    }

    /// A backend thread on blocking sockets (so it answers while the test's task is running):
    /// reads one request head and answers it with `pieces`, pausing 20 ms after each.
    fn thread_backend(pieces: Vec<Vec<u8>>) -> (String, std::thread::JoinHandle<()>) {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let t = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0);
                req.extend_from_slice(&buf[..n]);
            }
            for p in pieces {
                s.write_all(&p).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        });
        (addr, t)
    }

    /// `read_now` takes bytes the backend already sent without waiting for the reactor, and
    /// returns at once (without blocking or failing) when there is nothing.
    #[tokio::test]
    async fn read_now_takes_what_is_already_there() {
        let wire = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello".to_vec();
        let (addr, backend) = thread_backend(vec![wire.clone()]);
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        let mut conn = Conn::connect(&addr, deadline).await.unwrap();
        conn.read_now();
        assert!(conn.rbuf.is_empty(), "nothing was sent yet");
        conn.wbuf = b"GET / HTTP/1.1\r\n\r\n".to_vec();
        let mut written = 0;
        poll_fn(|cx| conn.poll_write_all(cx, &mut written))
            .await
            .unwrap();
        for _ in 0..500 {
            conn.read_now();
            if conn.rbuf.len() == wire.len() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert_eq!(&conn.rbuf[..], &wire[..]);
        backend.join().unwrap();
    }

    /// A whole exchange where the speculative read may catch only part of the answer: a head
    /// split across writes and a body larger than the speculative read. The answer arrives
    /// whole and in order.
    #[tokio::test]
    async fn an_answer_split_across_the_speculative_read_arrives_whole() {
        let body: Vec<u8> = (0..10_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: a/b\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        let (first, rest) = head.as_bytes().split_at(20);
        let mut tail = rest.to_vec();
        tail.extend_from_slice(&body);
        let (addr, backend) = thread_backend(vec![first.to_vec(), tail]);
        let pool = Pool::new(4);
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        let resp = exchange(&pool, &addr, deadline, |out| {
            out.extend_from_slice(b"POST /mcp HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}")
        })
        .await
        .unwrap();
        assert_eq!(resp.headers()["content-type"], "a/b");
        let mut b = resp.into_body();
        let mut got = Vec::new();
        while let Some(frame) = poll_fn(|cx| b.poll_frame(cx)).await {
            got.extend_from_slice(&frame.unwrap().into_data().unwrap());
        }
        assert_eq!(got, body);
        backend.join().unwrap();
    }

    #[test]
    fn name_is_matches_tokens_ignoring_case_only() {
        for (raw, lower, want) in [
            (&b"Content-Length"[..], &b"content-length"[..], true),
            (b"CONTENT-LENGTH", b"content-length", true),
            (b"content-lengtH", b"content-length", true),
            (b"content-lengths", b"content-length", false),
            (b"content_length", b"content-length", false),
            (b"Mcp-Protocol-Version", b"mcp-protocol-version", true),
            (b"Mcp-Protocol-Versiom", b"mcp-protocol-version", false),
            (b"Xcp-Protocol-Version", b"mcp-protocol-version", false),
            (b"HOST", b"host", true),
            (b"hosT", b"hose", false),
            (b"", b"", true),
        ] {
            assert_eq!(
                name_is(raw, lower),
                want,
                "{}",
                String::from_utf8_lossy(raw)
            );
        }
    }

    #[test]
    fn malformed_framing_is_an_error() {
        for wire in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nabX\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nfffffffffffffffff\r\n",
        ] {
            assert!(
                decode(wire, 4).is_err(),
                "{}",
                String::from_utf8_lossy(wire)
            );
        }
    }

    /// Statuses outside 100–599 are not HTTP answers (`http::StatusCode` would take 999).
    #[test]
    fn statuses_outside_100_to_599_are_refused() {
        for wire in [
            &b"HTTP/1.1 999 Whatever\r\ncontent-length: 0\r\n\r\n"[..],
            b"HTTP/1.1 600 Nope\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 099 Nope\r\ncontent-length: 0\r\n\r\n",
        ] {
            let mut buf = BytesMut::from(wire);
            assert!(
                parse_head(&mut buf, &mut HeaderSpots::default(), &mut 0).is_err(),
                "{}",
                String::from_utf8_lossy(wire)
            );
        }
        let mut buf = BytesMut::from(&b"HTTP/1.1 599 Edge\r\ncontent-length: 0\r\n\r\n"[..]);
        let h = parse_head(&mut buf, &mut HeaderSpots::default(), &mut 0);
        assert_eq!(h.unwrap().unwrap().status.as_u16(), 599);
    }

    /// Endless interim answers and endless trailers end in an error within a head's worth of
    /// bytes, instead of keeping the reader busy (and the deadline timer unpolled) forever.
    #[test]
    fn interim_answers_and_trailers_are_bounded() {
        let mut interim = 0;
        let mut result = Ok(None);
        for _ in 0..10_000 {
            let mut buf = BytesMut::from(&b"HTTP/1.1 102 Processing\r\n\r\n"[..]);
            result = parse_head(&mut buf, &mut HeaderSpots::default(), &mut interim);
            if result.is_err() {
                break;
            }
        }
        assert!(result.is_err() && interim <= MAX_HEAD_BYTES + 64);

        let mut framing = Framing::Chunked(Chunk::Size);
        let mut buf = BytesMut::from(&b"0\r\n"[..]);
        let mut failed = false;
        for _ in 0..10_000 {
            buf.extend_from_slice(b"x-trailer: 0123456789\r\n");
            match framing.step(&mut buf, true) {
                Ok(Step::NeedMore) => {}
                Ok(_) => panic!("trailers never ended"),
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        assert!(failed);
    }

    /// A bad chunk-size line found while settling (after a chunk's data) stays an error: the
    /// line after it is never taken for the next chunk, so the bad chunk is not skipped.
    #[test]
    fn a_bad_chunk_size_is_never_skipped() {
        let mut framing = Framing::Chunked(Chunk::Size);
        let mut buf = BytesMut::from(&b"5\r\nhello\r\nZZZZ\r\n3\r\nabc\r\n0\r\n\r\n"[..]);
        assert!(matches!(framing.step(&mut buf, true), Ok(Step::Data(d)) if &d[..] == b"hello"));
        assert!(framing.step(&mut buf, false).is_err(), "settling finds it");
        for _ in 0..3 {
            assert!(
                framing.step(&mut buf, true).is_err(),
                "and every later step reports it"
            );
        }
    }

    /// Framing that arrives broken with the head fails the exchange itself, so the caller can
    /// answer 502 before any head goes to the client.
    #[tokio::test]
    async fn broken_framing_with_the_head_fails_the_exchange() {
        for wire in [
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nZZZZ\r\n"[..],
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nfffffffffffffffff\r\n",
            b"HTTP/1.1 999 Odd\r\ncontent-length: 2\r\n\r\n{}",
        ] {
            let (addr, backend) = thread_backend(vec![wire.to_vec()]);
            let pool = Pool::new(4);
            let deadline = Instant::now() + std::time::Duration::from_secs(5);
            let r = exchange(&pool, &addr, deadline, |out| {
                out.extend_from_slice(b"POST /mcp HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}")
            })
            .await;
            assert!(
                matches!(r, Err(UpstreamError::Protocol(_))),
                "{}",
                String::from_utf8_lossy(wire)
            );
            backend.join().unwrap();
        }
    }

    #[test]
    fn request_is_one_buffer_with_our_framing() {
        let mut req = Request::new(Bytes::from_static(b"{}"));
        *req.method_mut() = http::Method::POST;
        *req.uri_mut() = "/mcp?x=1".parse().unwrap();
        let h = req.headers_mut();
        h.insert(header::HOST, HeaderValue::from_static("b:1"));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("99"));
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        let mut out = Vec::new();
        encode(&req, &mut out);
        assert_eq!(
            out,
            b"POST /mcp?x=1 HTTP/1.1\r\nhost: b:1\r\ncontent-length: 2\r\n\r\n{}"
        );
    }
}
