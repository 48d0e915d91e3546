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

mod framing;

pub(crate) use framing::{Framing, Step};
pub use framing::{H1Body, has_token, recycle};
use framing::{answer_header, framing};

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

    /// Whether an answer's body, with nothing buffered, has to wait for the socket: then the
    /// read buffer is given back until it turns readable (`poll_fill` takes one again), so that
    /// a stream between its events — a listen stream can idle for minutes — holds no 16 KiB
    /// for nothing (README, "Scale"). The task is woken by readiness or the deadline; a
    /// deadline already passed is left to `poll_fill`'s caller to report.
    pub(super) fn poll_idle(&mut self, cx: &mut Context<'_>) -> bool {
        if self.io.poll_read_ready(cx).is_ready() || self.sleep.as_mut().poll(cx).is_ready() {
            return false;
        }
        if self.rbuf.capacity() > 0 {
            self.rbuf = BytesMut::new();
        }
        true
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
/// body) into the connection's write buffer. Connecting, writing and the answer's head are due
/// by `head_by`; the body by `deadline` (later only for a long-lived stream).
pub async fn exchange(
    pool: &Pool,
    addr: &str,
    head_by: Instant,
    deadline: Instant,
    encode: impl FnOnce(&mut Vec<u8>),
) -> Result<Response<H1Body>, UpstreamError> {
    let mut conn = match pool.checkout() {
        Some(c) => c,
        None => Conn::connect(addr, head_by).await?,
    };
    conn.sleep.as_mut().reset(head_by);
    conn.wbuf.clear();
    conn.got_data = false;
    encode(&mut conn.wbuf);
    // Written at once, not after yielding so that the other ready requests' writes reach the
    // backend as one burst: on this Linux scheduler (EEVDF) a backend sharing the CPU preempts
    // the gateway at each write that wakes it anyway, so the yield bought no batching, only a
    // task poll per request and more context switches (traced: 0.27 against 0.23 per request at
    // 64 connections, nginx 0.21; docs/benchmarks/history.md, the run of 2026-12-05 late morning).
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
    if deadline > head_by {
        conn.sleep.as_mut().reset(deadline);
    }
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

#[cfg(test)]
mod tests;
