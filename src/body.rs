//! The one response body type portico hands to hyper. An enum rather than a boxed trait object:
//! the hot paths (a relayed upstream answer, a cached JSON body) cost no allocation, and every
//! kind of body is visible in one `match`.

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use http_body::{Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

use crate::upstream::http::RelayBody;

/// Errors a body can end with; hyper only needs to know the stream broke.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// A response body.
// `Relay` is the large variant and also the hot one (every pass-through answer); boxing it
// would cost an allocation per request to save a few bytes on the rarer kinds.
#[allow(clippy::large_enum_variant)]
pub enum Body {
    /// No bytes (202, 204, 405).
    Empty,
    /// One buffer known up front (JSON answers, errors, cache hits).
    Full(Option<Bytes>),
    /// An upstream answer relayed byte for byte (pass-through).
    Relay(RelayBody),
    /// Chunks produced over time (SSE that portico renders itself).
    Stream(BoxStream<'static, Bytes>),
    /// An SSE body under `[server]` keep-alive and duration limits ([`SseLimits`]).
    Limited(Box<SseLimits>),
}

impl Body {
    pub fn full(bytes: impl Into<Bytes>) -> Body {
        Body::Full(Some(bytes.into()))
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            Body::Empty => Poll::Ready(None),
            Body::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Body::Relay(r) => Pin::new(r).poll_frame(cx),
            Body::Stream(s) => s.poll_next_unpin(cx).map(|c| c.map(|b| Ok(Frame::data(b)))),
            Body::Limited(l) => l.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Empty => true,
            Body::Full(b) => b.is_none(),
            Body::Relay(r) => r.is_end_stream(),
            Body::Stream(_) => false,
            Body::Limited(l) => l.done,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Empty => SizeHint::with_exact(0),
            Body::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Body::Full(None) => SizeHint::with_exact(0),
            Body::Relay(r) => r.size_hint(),
            Body::Stream(_) | Body::Limited(_) => SizeHint::default(),
        }
    }
}

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

/// The comment line sent on an idle SSE stream; clients ignore comments (digest §4).
const KEEPALIVE: &[u8] = b": keep-alive\n\n";

/// Wraps an SSE response body: a `: keep-alive` comment whenever it has been idle for
/// `keepalive`, and an end after `max` with a last event (the JSON-RPC error for the request).
/// Only SSE responses are wrapped, so JSON answers carry no timer at all.
///
/// A relayed upstream stream arrives in arbitrary chunks, so comments and the final event are
/// inserted only at an event boundary (after a blank line); a stream cut mid-event by the
/// duration limit just ends, since finishing the event would hand the client broken JSON.
pub struct SseLimits {
    inner: Body,
    keepalive: Option<(Duration, Pin<Box<Sleep>>)>,
    end: Option<(Pin<Box<Sleep>>, Bytes)>,
    /// The bytes sent so far end an event (or nothing was sent).
    at_boundary: bool,
    done: bool,
}

impl SseLimits {
    /// `keepalive` / `max` of zero turn that limit off; `last` is the event sent at `max`.
    pub fn new(inner: Body, keepalive: Duration, max: Duration, last: Bytes) -> SseLimits {
        let now = Instant::now();
        SseLimits {
            inner,
            keepalive: (!keepalive.is_zero()).then(|| {
                (
                    keepalive,
                    Box::pin(tokio::time::sleep_until(now + keepalive)),
                )
            }),
            end: (!max.is_zero()).then(|| (Box::pin(tokio::time::sleep_until(now + max)), last)),
            at_boundary: true,
            done: false,
        }
    }

    fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        if let Some((timer, _)) = &mut self.end
            && timer.as_mut().poll(cx).is_ready()
        {
            self.done = true;
            let last = self.end.take().map(|(_, last)| last);
            // Dropping the inner body now cancels the upstream side.
            self.inner = Body::Empty;
            return Poll::Ready(match last {
                Some(last) if self.at_boundary => Some(Ok(Frame::data(last))),
                _ => None,
            });
        }
        match http_body::Body::poll_frame(Pin::new(&mut self.inner), cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref()
                    && !data.is_empty()
                {
                    self.at_boundary = data.ends_with(b"\n\n") || data.ends_with(b"\r\n\r\n");
                    if let Some((every, timer)) = &mut self.keepalive {
                        timer.as_mut().reset(Instant::now() + *every);
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Pending => {
                if let Some((every, timer)) = &mut self.keepalive
                    && timer.as_mut().poll(cx).is_ready()
                {
                    timer.as_mut().reset(Instant::now() + *every);
                    // Registers the new deadline with the waker.
                    let _ = timer.as_mut().poll(cx);
                    if self.at_boundary {
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(KEEPALIVE)))));
                    }
                }
                Poll::Pending
            }
        }
    }
}
