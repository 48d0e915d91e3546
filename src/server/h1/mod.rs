//! The lean HTTP/1.1 server connection: the hot path for plain-TCP clients.
//!
//! Why not hyper's server connection: its dispatcher is a general state machine (a channel for
//! the request body, a timer per request head, flush scheduling, keep-alive bookkeeping) whose
//! cost per request was of the same order as everything portico itself does on a pass-through.
//! Streamable HTTP needs little of HTTP/1.1: a POST with a `Content-Length` body and one answer.
//! This loop reads the head with `httparse`, reads the body, runs the one pipeline
//! ([`crate::proxy::handle`]) and writes the answer — the head and a ready body in one write.
//!
//! What it does not speak it does not imitate: an h2c preface, HTTP/1.0, a chunked request body,
//! `Expect`, `Upgrade`. Such a connection is handed to hyper with every byte already read
//! ([`Outcome::Handoff`]), so the edges of HTTP keep hyper's behaviour.
//!
//! Timeouts (`[server] header_read_timeout_ms`): a request head must be complete within that
//! time of the connection turning to it, so an idle keep-alive connection is closed after it too;
//! a request body must be in within `body_read_timeout_ms` (plus time for its size at
//! `body_min_bytes_per_s`: `frontend::BodyClock`, the rule hyper's half applies too). One timer per connection, reset (a
//! store, once registered) rather than created per request.
//!
//! A client that goes away while its request runs is noticed (end of stream on the socket) and
//! the request is dropped, which cancels it upstream — as with hyper's half-close default.

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderName};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body::Body as _;
use http_body_util::Full;
use std::cell::RefCell;
use std::future::{Future, poll_fn};
use std::io;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};

use super::PeerAddr;
use crate::body::Body;
use crate::error::GatewayError;
use crate::state::State;
use crate::upstream::h1::{HeaderSpots, has_token, name_is, parse_length, push_decimal};

/// Header fields per request head (parsed on the stack); more is refused with 431.
pub(crate) const MAX_HEADERS: usize = 100;
/// Bytes asked of the socket per read.
const READ_CHUNK: usize = 8 * 1024;
/// Pipelined bytes read ahead while a request runs; past this the socket is left alone.
const READ_AHEAD: usize = 64 * 1024;
/// Answer bytes gathered before a write, when the body yields faster than we send.
const WRITE_BATCH: usize = 64 * 1024;
/// The write buffer a connection starts with (an answer's head and a small body)...
const WBUF_START: usize = 1024;
/// ...and the most it keeps between answers: one large answer does not pin up to
/// `WRITE_BATCH` and more to an idle keep-alive connection.
const WBUF_KEEP: usize = 16 * 1024;
/// How long a keep-alive connection idles before it gives its buffers back (`Conn::fill`):
/// long past a busy client's gap between requests, so the hot path never allocates anew.
const IDLE_RELEASE: Duration = Duration::from_secs(1);
/// The HTTP/2 connection preface (RFC 9113 §3.4): a prior-knowledge h2c client.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0";

/// The `[server]` limits a connection enforces.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub header_timeout: Duration,
    /// `body_read_timeout_ms` and `body_min_bytes_per_s` (see `frontend::BodyClock`).
    pub body_timeout: Duration,
    pub body_min_rate: u64,
    pub max_head: usize,
    pub max_body: usize,
}

impl Limits {
    /// How long writing `bytes` to a client may take once its socket pushes back: the body
    /// clock's rule on the write side.
    pub fn write_allowance(&self, bytes: usize) -> Duration {
        crate::frontend::body_allowance(self.body_timeout, self.body_min_rate, bytes)
    }
}

/// How a connection ended.
pub enum Outcome {
    /// Closed (by either side, a timeout, a refusal, or the drain).
    Done,
    /// Hand the socket to hyper; `Bytes` were read from it and not consumed.
    Handoff(TcpStream, Bytes),
}

/// Why reading a request stopped.
pub(crate) enum Stop {
    /// Close quietly: end of stream, an I/O error, the drain, or an idle timeout.
    Close,
    /// Something hyper should serve.
    Handoff,
    /// Answer with this status and message, then close.
    Refuse(StatusCode, &'static str),
}

/// One request head, parsed and checked.
pub(crate) struct Head {
    pub(crate) parts: http::request::Parts,
    pub(crate) content_length: u64,
    pub(crate) keep_alive: bool,
}

/// How the answer body is framed on the wire.
#[derive(Clone, Copy, PartialEq)]
enum Framing {
    None,
    Length,
    Chunked,
}

struct Conn {
    io: TcpStream,
    rbuf: BytesMut,
    wbuf: Vec<u8>,
    spots: HeaderSpots,
    timer: Pin<Box<Sleep>>,
    limits: Limits,
}

/// Serves requests on `io` until it closes, the drain (`stop`) begins, or something comes that
/// hyper should serve.
pub async fn serve(
    io: TcpStream,
    peer: SocketAddr,
    shared: &std::sync::Arc<arc_swap::ArcSwap<State>>,
    limits: Limits,
    stop: &mut watch::Receiver<bool>,
) -> Outcome {
    let mut c = Conn::new(io, limits);
    // The drain, as one future for the connection's life: polled while idle, it registers its
    // interest once instead of once per request. `draining` answers "has it begun?" in between.
    let draining = stop.clone();
    let mut stopped = pin!(stop.wait_for(|s| *s));
    loop {
        let mut head = match c.read_head(stopped.as_mut()).await {
            Ok(head) => head,
            Err(Stop::Close) => return Outcome::Done,
            Err(Stop::Handoff) => return Outcome::Handoff(c.io, c.rbuf.freeze()),
            Err(Stop::Refuse(status, why)) => {
                c.refuse(status, why).await;
                return Outcome::Done;
            }
        };
        let mut keep_alive = head.keep_alive;
        // A body over the limit is not read: the pipeline refuses it by its Content-Length
        // (413), and the connection closes since the body's bytes are still on the way.
        let body = if head.content_length > limits.max_body as u64 {
            keep_alive = false;
            // The length is left out of the map (`header_name`); the refusal reads it.
            head.parts
                .headers
                .insert(header::CONTENT_LENGTH, head.content_length.into());
            Bytes::new()
        } else {
            match c.read_body(head.content_length as usize).await {
                Ok(body) => body,
                Err(_) => return Outcome::Done,
            }
        };
        let head_only = head.parts.method == Method::HEAD;
        let mut req = Request::from_parts(head.parts, Full::new(body));
        // Only admin endpoints look at the peer; an extension allocates, so MCP paths skip it.
        if req.uri().path().starts_with("/admin/") {
            req.extensions_mut().insert(PeerAddr(peer));
        }
        // Each request sees one config generation, even across a hot reload.
        let state = shared.load_full();
        // Pinned here and run by reference: the pipeline's future is several KB, and passing
        // it by value would copy it at every hand-over.
        let resp = if crate::sse_front::claims(&state, req.uri().path()) {
            // The 2024-11-05 HTTP+SSE transport's URLs; boxed, a rare path.
            c.run(Box::pin(crate::sse_front::serve(shared.clone(), req)).as_mut())
                .await
        } else {
            let fut = pin!(crate::proxy::handle(state, req));
            c.run(fut).await
        };
        let Some(resp) = resp else {
            return Outcome::Done;
        };
        keep_alive &= !*draining.borrow();
        if !c.write_response(resp, head_only, keep_alive).await || !keep_alive {
            return Outcome::Done;
        }
    }
}

impl Conn {
    fn new(io: TcpStream, limits: Limits) -> Conn {
        Conn {
            io,
            rbuf: BytesMut::with_capacity(READ_CHUNK),
            wbuf: Vec::with_capacity(WBUF_START),
            spots: HeaderSpots::default(),
            timer: Box::pin(tokio::time::sleep(limits.header_timeout)),
            limits,
        }
    }

    /// Reads and parses the next request head.
    async fn read_head<S: Future>(&mut self, mut stop: Pin<&mut S>) -> Result<Head, Stop> {
        let mut deadline = None;
        loop {
            if !self.rbuf.is_empty() {
                if let Some(head) =
                    parse_head(&mut self.rbuf, &mut self.spots, self.limits.max_head)?
                {
                    return Ok(head);
                }
                if self.rbuf.len() > self.limits.max_head {
                    return Err(Stop::Refuse(
                        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                        "request head too large",
                    ));
                }
            }
            let deadline =
                *deadline.get_or_insert_with(|| Instant::now() + self.limits.header_timeout);
            let idle = self.rbuf.is_empty();
            match self.fill(deadline, idle.then_some(stop.as_mut())).await {
                Ok(()) => {}
                Err(Fill::Eof | Fill::Io | Fill::Stopped) => return Err(Stop::Close),
                Err(Fill::TimedOut) if idle => return Err(Stop::Close),
                Err(Fill::TimedOut) => {
                    return Err(Stop::Refuse(
                        StatusCode::REQUEST_TIMEOUT,
                        "request head not received in time",
                    ));
                }
            }
        }
    }

    /// Reads a body of `len` bytes (at most `max_body`, checked by the caller).
    /// The whole body must arrive within the body clock (`frontend::BodyClock`), the same
    /// rule hyper's half of the server applies.
    async fn read_body(&mut self, len: usize) -> Result<Bytes, Fill> {
        let mut clock = crate::frontend::BodyClock::new(
            self.limits.body_timeout,
            self.limits.body_min_rate,
            self.limits.header_timeout,
        );
        while self.rbuf.len() < len {
            self.rbuf.reserve(len - self.rbuf.len());
            let deadline = clock.deadline(self.rbuf.len());
            self.fill(deadline, None::<Pin<&mut std::future::Pending<()>>>)
                .await?;
        }
        Ok(self.rbuf.split_to(len).freeze())
    }

    /// Reads more bytes into `rbuf`, waiting until `deadline`; while idle, the drain ends the wait.
    ///
    /// Idle (between requests: `stop` given, `rbuf` empty), a connection that has waited
    /// `IDLE_RELEASE` gives its buffers back and waits on readiness alone, taking a fresh buffer
    /// when bytes come: a keep-alive connection that idles for long holds no buffer. The release
    /// is a second stage of the one timer, so a busy connection pays nothing for it.
    async fn fill<S: Future>(
        &mut self,
        deadline: Instant,
        stop: Option<Pin<&mut S>>,
    ) -> Result<(), Fill> {
        let mut release_at = match stop {
            Some(_) if self.limits.header_timeout > IDLE_RELEASE => {
                Some(deadline - (self.limits.header_timeout - IDLE_RELEASE))
            }
            _ => None,
        };
        self.rbuf.reserve(READ_CHUNK);
        // Reset only matters once the read has to wait; a registered timer moved later is a
        // store, not a trip through the timer wheel.
        self.timer.as_mut().reset(release_at.unwrap_or(deadline));
        // Once it has fired the connection closes, so it is never polled after completion.
        let mut stopped = pin!(async {
            match stop {
                Some(s) => {
                    s.await;
                }
                None => std::future::pending().await,
            }
        });
        loop {
            tokio::select! {
                biased;
                read = self.io.read_buf(&mut self.rbuf) => return match read {
                    Ok(0) => Err(Fill::Eof),
                    Ok(_) => Ok(()),
                    Err(_) => Err(Fill::Io),
                },
                _ = &mut self.timer => {
                    if release_at.take().is_none() {
                        return Err(Fill::TimedOut);
                    }
                }
                _ = &mut stopped => return Err(Fill::Stopped),
            }
            self.rbuf = BytesMut::new();
            self.wbuf = Vec::new();
            self.spots = HeaderSpots::default();
            self.timer.as_mut().reset(deadline);
            tokio::select! {
                biased;
                ready = self.io.readable() => {
                    if ready.is_err() {
                        return Err(Fill::Io);
                    }
                }
                _ = &mut self.timer => return Err(Fill::TimedOut),
                _ = &mut stopped => return Err(Fill::Stopped),
            }
            self.rbuf.reserve(READ_CHUNK);
        }
    }

    /// Runs the pipeline for one request; `None` if the client went away first.
    async fn run<F>(&mut self, mut fut: Pin<&mut F>) -> Option<Response<Body>>
    where
        F: Future<Output = Response<Body>>,
    {
        poll_fn(|cx| {
            if let Poll::Ready(resp) = fut.as_mut().poll(cx) {
                return Poll::Ready(Some(resp));
            }
            if self.peer_left(cx) {
                return Poll::Ready(None);
            }
            Poll::Pending
        })
        .await
    }

    /// Whether the client closed its end (or the socket broke). Bytes it sends meanwhile (a
    /// pipelined request) are kept for the next head. Costs no syscall unless the reactor saw
    /// the socket readable.
    fn peer_left(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            if self.rbuf.len() >= READ_AHEAD {
                return false;
            }
            match self.io.poll_read_ready(cx) {
                Poll::Pending => return false,
                Poll::Ready(Err(_)) => return true,
                Poll::Ready(Ok(())) => {}
            }
            self.rbuf.reserve(READ_CHUNK);
            match self.io.try_read_buf(&mut self.rbuf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return true,
            }
        }
    }

    /// Writes one answer; `false` if the connection cannot carry another.
    async fn write_response(&mut self, resp: Response<Body>, head_only: bool, keep: bool) -> bool {
        let (parts, body) = resp.into_parts();
        let status = parts.status;
        let bodiless = status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED;
        let wbuf = &mut self.wbuf;
        wbuf.clear();
        // Given back while the connection idled (`fill`): taken again at its usual size.
        wbuf.reserve(WBUF_START);
        status_line(wbuf, status);
        let mut framing = Framing::Chunked;
        for (name, value) in &parts.headers {
            if name == header::TRANSFER_ENCODING || name == header::CONNECTION {
                continue;
            }
            if name == header::CONTENT_LENGTH {
                framing = Framing::Length;
            }
            put_header(wbuf, name.as_str().as_bytes(), value.as_bytes());
        }
        date_header(wbuf);
        if !keep {
            wbuf.extend_from_slice(b"connection: close\r\n");
        }
        if bodiless {
            framing = Framing::None;
        } else if framing != Framing::Length {
            match body.size_hint().exact() {
                Some(n) => {
                    framing = Framing::Length;
                    wbuf.extend_from_slice(b"content-length: ");
                    push_decimal(wbuf, n);
                    wbuf.extend_from_slice(b"\r\n");
                }
                None => wbuf.extend_from_slice(b"transfer-encoding: chunked\r\n"),
            }
        }
        wbuf.extend_from_slice(b"\r\n");
        let written = if head_only || framing == Framing::None {
            self.write_out().await
        } else {
            self.write_body(body, framing == Framing::Chunked).await
        };
        // A large answer grew the write buffer: not kept for the connection's idle life.
        if self.wbuf.capacity() > WBUF_KEEP {
            self.wbuf = Vec::with_capacity(WBUF_START);
        }
        written
    }

    /// Writes all of `wbuf`. The socket almost always takes it at once (one `send`, as a plain
    /// write would make). When it pushes back — a client reading slowly, or not at all (a zero
    /// window) — the rest must go within the body clock's rule on this half too:
    /// `body_read_timeout_ms` plus a second per `body_min_bytes_per_s` bytes left, else the
    /// connection is closed. A client that stops reading would otherwise hold the connection,
    /// its task and the backend's answer for good. `false`: not written, close.
    async fn write_out(&mut self) -> bool {
        let mut done = 0;
        while done < self.wbuf.len() {
            match self.io.try_write(&self.wbuf[done..]) {
                Ok(0) => return false,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => return false,
            }
        }
        if done == self.wbuf.len() {
            return true;
        }
        let bound = self.limits.write_allowance(self.wbuf.len() - done);
        let rest = &self.wbuf[done..];
        matches!(
            tokio::time::timeout(bound, self.io.write_all(rest)).await,
            Ok(Ok(()))
        )
    }

    /// Relays body frames as they come: what is ready goes out in one write (the head included),
    /// and whatever is gathered is sent as soon as the body makes us wait (SSE events go out
    /// when produced).
    async fn write_body(&mut self, body: Body, chunked: bool) -> bool {
        let mut body = pin!(body);
        loop {
            let step = poll_fn(|cx| {
                match body.as_mut().poll_frame(cx) {
                    Poll::Ready(frame) => return Poll::Ready(Step::Frame(frame)),
                    Poll::Pending if !self.wbuf.is_empty() => return Poll::Ready(Step::Flush),
                    Poll::Pending => {}
                }
                if self.peer_left(cx) {
                    return Poll::Ready(Step::PeerLeft);
                }
                // Waiting on the body (an event stream between its events, for minutes maybe):
                // an empty read buffer is given back meanwhile; the next read takes one.
                if self.rbuf.is_empty() && self.rbuf.capacity() > 0 {
                    self.rbuf = BytesMut::new();
                }
                Poll::Pending
            })
            .await;
            match step {
                Step::Flush => {
                    if !self.write_out().await {
                        return false;
                    }
                    self.wbuf.clear();
                }
                Step::Frame(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else {
                        continue; // trailers: not relayed
                    };
                    if data.is_empty() {
                        continue;
                    }
                    if chunked {
                        let mut hex = [0u8; 16];
                        self.wbuf.extend_from_slice(hex_len(data.len(), &mut hex));
                        self.wbuf.extend_from_slice(b"\r\n");
                        self.wbuf.extend_from_slice(&data);
                        self.wbuf.extend_from_slice(b"\r\n");
                    } else {
                        self.wbuf.extend_from_slice(&data);
                    }
                    if self.wbuf.len() >= WRITE_BATCH {
                        if !self.write_out().await {
                            return false;
                        }
                        self.wbuf.clear();
                    }
                }
                Step::Frame(None) => {
                    if chunked {
                        self.wbuf.extend_from_slice(b"0\r\n\r\n");
                    }
                    return self.write_out().await;
                }
                // A body that broke mid-way cannot be finished: closing tells the client.
                Step::Frame(Some(Err(_))) | Step::PeerLeft => {
                    let _ = self.write_out().await;
                    return false;
                }
            }
        }
    }

    /// Refuses a request portico could not read as HTTP: a JSON-RPC error naming the problem.
    async fn refuse(&mut self, status: StatusCode, why: &str) {
        let body = GatewayError::InvalidRequest(why.to_string()).to_message(None);
        let wbuf = &mut self.wbuf;
        wbuf.clear();
        // Given back while the connection idled (`fill`): taken again at its usual size.
        wbuf.reserve(WBUF_START);
        status_line(wbuf, status);
        wbuf.extend_from_slice(b"content-type: application/json\r\nconnection: close\r\n");
        date_header(wbuf);
        wbuf.extend_from_slice(b"content-length: ");
        push_decimal(wbuf, body.len() as u64);
        wbuf.extend_from_slice(b"\r\n\r\n");
        wbuf.extend_from_slice(&body);
        let _ =
            tokio::time::timeout(self.limits.header_timeout, self.io.write_all(&self.wbuf)).await;
    }
}

/// Parses a complete head at the front of `rbuf`, if there is one, taking it off the buffer.
/// (A free function, so `crate::fuzz` and the smoke tests can drive it without a socket.)
pub(crate) fn parse_head(
    rbuf: &mut BytesMut,
    spots: &mut HeaderSpots,
    max_head: usize,
) -> Result<Option<Head>, Stop> {
    if rbuf.len() >= 3 && H2_PREFACE.starts_with(&rbuf[..rbuf.len().min(14)]) {
        return Err(Stop::Handoff);
    }
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(rbuf, &mut slots) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::Version) => return Err(Stop::Handoff),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(Stop::Refuse(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "too many header fields",
            ));
        }
        Err(_) => {
            return Err(Stop::Refuse(
                StatusCode::BAD_REQUEST,
                "malformed HTTP request head",
            ));
        }
    };
    if len > max_head {
        return Err(Stop::Refuse(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "request head too large",
        ));
    }
    if req.version != Some(1) {
        return Err(Stop::Handoff);
    }
    // Where the path lies in the buffer (the headers' places go to `spots`), so the head
    // can be frozen once and the path and every value shared from it without copies.
    let base = rbuf.as_ptr() as usize;
    let at = |s: &[u8]| (s.as_ptr() as usize - base, s.len());
    let (Some(method), Some(path)) = (req.method, req.path) else {
        return Err(Stop::Refuse(
            StatusCode::BAD_REQUEST,
            "malformed HTTP request head",
        ));
    };
    let method = Method::from_bytes(method.as_bytes())
        .map_err(|_| Stop::Refuse(StatusCode::BAD_REQUEST, "malformed HTTP request method"))?;
    let path = at(path.as_bytes());
    spots.record(rbuf, req.headers);
    let mut content_length = None;
    let mut keep_alive = true;
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        if name_is(name, b"content-length") {
            let n = parse_length(h.value).ok_or(Stop::Refuse(
                StatusCode::BAD_REQUEST,
                "invalid Content-Length",
            ))?;
            if content_length.is_some_and(|c| c != n) {
                return Err(Stop::Refuse(
                    StatusCode::BAD_REQUEST,
                    "conflicting Content-Length headers",
                ));
            }
            content_length = Some(n);
        } else if name_is(name, b"transfer-encoding")
            || name_is(name, b"expect")
            || name_is(name, b"upgrade")
        {
            return Err(Stop::Handoff);
        } else if name_is(name, b"connection") && has_token(h.value, b"close") {
            keep_alive = false;
        }
    }
    // RFC 9112 §3.2: a request target has no fragment, and `http::Uri` would drop one silently
    // ("/mcp#x" routed as "/mcp"): refused, so the route is the bytes the client sent.
    if rbuf[path.0..path.0 + path.1].contains(&b'#') {
        return Err(Stop::Refuse(
            StatusCode::BAD_REQUEST,
            "malformed request target",
        ));
    }
    let raw = rbuf.split_to(len).freeze();
    let headers = spots.map(&raw, header_name).ok_or(Stop::Refuse(
        StatusCode::BAD_REQUEST,
        "malformed header field",
    ))?;
    let uri = Uri::from_maybe_shared(raw.slice(path.0..path.0 + path.1))
        .map_err(|_| Stop::Refuse(StatusCode::BAD_REQUEST, "malformed request target"))?;
    let (mut parts, ()) = Request::new(()).into_parts();
    parts.method = method;
    parts.uri = uri;
    parts.version = Version::HTTP_11;
    parts.headers = headers;
    Ok(Some(Head {
        parts,
        content_length: content_length.unwrap_or(0),
        keep_alive,
    }))
}

enum Fill {
    Eof,
    Io,
    TimedOut,
    Stopped,
}

enum Step {
    Frame(Option<Result<http_body::Frame<Bytes>, crate::error::BodyError>>),
    Flush,
    PeerLeft,
}

/// Request headers left out of the map (see `header_name`).
pub(crate) const LEFT_OUT: [&str; 5] = [
    "host",
    "user-agent",
    "connection",
    "accept-encoding",
    "content-length",
];

/// A header name; the MCP names every request carries come from static strings, since a
/// name `http` does not know costs an allocation when parsed.
fn header_name(raw: &[u8]) -> Result<Option<HeaderName>, ()> {
    use crate::protocol::header::{self as h, names};
    if raw.len() >= 8 && name_is(&raw[..4], b"mcp-") {
        let is = |n: &str| name_is(raw, n.as_bytes());
        let known = if is(h::PROTOCOL_VERSION) {
            Some(names::PROTOCOL_VERSION)
        } else if is(h::METHOD) {
            Some(names::METHOD)
        } else if is(h::NAME) {
            Some(names::NAME)
        } else if is(h::SESSION_ID) {
            Some(names::SESSION_ID)
        } else {
            None
        };
        if known.is_some() {
            return Ok(known);
        }
    }
    // The names every client sends, found by length first: cheaper than the general parser,
    // which lowercases into a scratch buffer before it looks a name up. `Host`, `User-Agent`,
    // `Connection`, `Accept-Encoding` and `Content-Length` are left out of the map: nothing
    // reads them past this parser (which judged `Connection` and took the length above), and
    // none is forwarded (`frontend::forwardable`), so each would cost an insert, a hash and a
    // drop per request for nothing. (A length over the limit is put back by `serve`, for the
    // pipeline's 413.)
    let is = |n: &[u8]| name_is(raw, n);
    let known = match raw.len() {
        4 if is(b"host") => return Ok(None),
        6 if is(b"accept") => Some(header::ACCEPT),
        10 if is(b"user-agent") || is(b"connection") => return Ok(None),
        12 if is(b"content-type") => Some(header::CONTENT_TYPE),
        13 if is(b"authorization") => Some(header::AUTHORIZATION),
        14 if is(b"content-length") => return Ok(None),
        15 if is(b"accept-encoding") => return Ok(None),
        _ => None,
    };
    match known {
        Some(name) => Ok(Some(name)),
        None => HeaderName::from_bytes(raw).map(Some).map_err(|_| ()),
    }
}

fn status_line(out: &mut Vec<u8>, status: StatusCode) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("Unknown").as_bytes());
    out.extend_from_slice(b"\r\n");
}

fn put_header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// The `Date` header, formatted once per second per thread.
fn date_header(out: &mut Vec<u8>) {
    thread_local! {
        static DATE: RefCell<(u64, String)> = const { RefCell::new((0, String::new())) };
    }
    let now = SystemTime::now();
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    DATE.with_borrow_mut(|(at, text)| {
        if *at != secs || text.is_empty() {
            *at = secs;
            *text = httpdate::fmt_http_date(now);
        }
        put_header(out, b"date", text.as_bytes());
    });
}

fn hex_len(mut n: usize, buf: &mut [u8; 16]) -> &[u8] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = DIGITS[n & 15];
        n >>= 4;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// A socket with bytes already read from it put back in front: how a connection is handed to
/// hyper without losing what the lean loop read.
pub struct Rewind {
    pre: Bytes,
    io: TcpStream,
}

impl Rewind {
    pub fn new(pre: Bytes, io: TcpStream) -> Rewind {
        Rewind { pre, io }
    }
}

impl AsyncRead for Rewind {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.pre.is_empty() {
            let n = self.pre.len().min(buf.remaining());
            buf.put_slice(&self.pre[..n]);
            self.pre.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
