//! How an answer is framed and read: the few answer headers portico keeps, Content-Length /
//! chunked / until-close framing decoded as bytes arrive, and the [`H1Body`] that relays it
//! and hands its connection back to the pool when it ended cleanly.

use super::*;

/// The answer headers anyone reads past the framing: the media type and `Retry-After` (the
/// relay), and a legacy session id (the bridge). The rest (`Date`, `Server`, …) would cost a
/// map insert per request for nothing.
pub(super) fn answer_header(raw: &[u8]) -> Result<Option<HeaderName>, ()> {
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
pub(super) fn framing(
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
pub(super) fn line_end(buf: &[u8]) -> Result<Option<usize>, H1Error> {
    let window = &buf[..buf.len().min(MAX_LINE_BYTES)];
    match window.iter().position(|&b| b == b'\n') {
        Some(lf) if lf > 0 && window[lf - 1] == b'\r' => Ok(Some(lf)),
        Some(_) => Err(H1Error::Chunked),
        None if buf.len() >= MAX_LINE_BYTES => Err(H1Error::Chunked),
        None => Ok(None),
    }
}

/// A field octet (RFC 9110 §5.5): anything but a control, HTAB aside. A bare CR is not one.
pub(super) fn field_octet(b: u8) -> bool {
    b == b'\t' || (b >= b' ' && b != 0x7f)
}

/// The size on a chunk-size line (without its CRLF): 1 to 15 hex digits, then optional SP or
/// HTAB (not in RFC 9112's grammar, but hyper and httparse read it), then nothing or `;` and
/// extensions, which are ignored but must be field octets.
pub(super) fn chunk_size(line: &[u8]) -> Result<u64, H1Error> {
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
pub(super) fn field_line(line: &[u8]) -> bool {
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    let name = line.iter().take_while(|&&b| tchar(b)).count();
    name > 0 && line.get(name) == Some(&b':') && line[name + 1..].iter().all(|&b| field_octet(b))
}

/// The body of an answer read by the lean client, relayed frame by frame as it arrives.
pub struct H1Body {
    /// `None` once the body is over and the connection is gone (back to the pool or dropped).
    pub(super) conn: Option<Box<Conn>>,
    pub(super) framing: Framing,
    /// Whether the connection may serve another request once this answer has ended.
    pub(super) keep_alive: bool,
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
    pub(super) fn settle(&mut self) -> Result<(), H1Error> {
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

    /// The capacity of the read buffer the body's connection holds (tests: a waiting stream
    /// holds none).
    #[cfg(test)]
    pub(super) fn read_buffer(&self) -> Option<usize> {
        self.conn.as_ref().map(|c| c.rbuf.capacity())
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
            if conn.rbuf.is_empty() && conn.poll_idle(cx) {
                conn.ack_before_wait();
                return Poll::Pending;
            }
            match conn.poll_deadline(cx, |c, cx| c.poll_fill(cx)) {
                Poll::Pending => {
                    conn.ack_before_wait();
                    return Poll::Pending;
                }
                Poll::Ready(None) => return self.fail(Box::new(crate::upstream::http::TimedOut)),
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
