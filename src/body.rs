//! The one response body type portico hands to hyper. An enum rather than a boxed trait object:
//! the hot paths (a relayed upstream answer, a cached JSON body) cost no allocation, and every
//! kind of body is visible in one `match`. It sits with the transports (a relayed answer is an
//! upstream's body), above the leaves that describe errors and SSE; the rendering of an
//! upstream `Reply` (JSON, or SSE when notifications come first) lives here too, so every
//! front end turns answers into responses the same way.

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use http_body::{Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

pub use crate::error::BodyError;
use crate::error::GatewayError;
use crate::jsonrpc::RequestId;
use crate::protocol;
pub use crate::sse::sse_event;
use crate::upstream::http::{RelayBody, is_event_stream};
use crate::upstream::{MessageStream, Reply};
use http::{HeaderName, HeaderValue, Response, StatusCode, header};

/// A response body.
// `Relay` is the large variant and also the hot one (every pass-through answer); boxing it
// would cost an allocation per request to save a few bytes on the rarer kinds.
#[allow(clippy::large_enum_variant)]
pub enum Body {
    /// No bytes (202, 204, 405).
    Empty,
    /// One buffer known up front (JSON answers, errors, cache hits).
    Full(Option<Bytes>),
    /// An upstream answer relayed byte for byte (pass-through). Boxed: the relay's state is
    /// ~200 bytes, and inline it would be copied with every move of every response.
    Relay(Box<RelayBody>),
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

impl GatewayError {
    /// The error as a response (status, headers and body from [`GatewayError::into_http`]).
    pub fn into_response(self, id: Option<&RequestId>) -> Response<Body> {
        self.into_http(id).map(Body::full)
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
            Body::Relay(r) => Pin::new(&mut **r).poll_frame(cx),
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

// === Rendering: replies and relayed answers as responses ===

/// Builds the client response for a relayed upstream answer, copying only the headers a client
/// needs.
pub fn relay_response(parts: http::response::Parts, body: Body) -> Response<Body> {
    let sse = is_event_stream(&parts.headers);
    let relayed = |k: &HeaderName| *k == header::CONTENT_TYPE || *k == header::RETRY_AFTER;
    let mut headers = parts.headers;
    // The framing is the server's to state. After that the map usually holds only what is
    // relayed, and is kept rather than copied into a new one.
    headers.remove(header::CONTENT_LENGTH);
    if !headers.keys().all(relayed) {
        let mut kept = http::HeaderMap::with_capacity(2);
        for name in [header::CONTENT_TYPE, header::RETRY_AFTER] {
            if let Some(v) = headers.get(&name) {
                kept.insert(name, v.clone());
            }
        }
        headers = kept;
    }
    let mut resp = Response::new(body);
    *resp.status_mut() = parts.status;
    *resp.headers_mut() = headers;
    if sse {
        unbuffered(resp.headers_mut());
    }
    resp
}

/// What keeps an SSE stream flowing through caches and buffering proxies in between (nginx
/// reads `X-Accel-Buffering`).
fn unbuffered(out: &mut http::HeaderMap) {
    out.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    out.insert(
        HeaderName::from_static("x-accel-buffering"),
        HeaderValue::from_static("no"),
    );
}

/// A `200` SSE response over `body` (a stream of events).
pub fn sse_response(body: Body) -> Response<Body> {
    let mut resp = Response::new(body);
    let out = resp.headers_mut();
    out.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    unbuffered(out);
    resp
}

pub fn json_response(status: StatusCode, body: Bytes) -> Response<Body> {
    let mut resp = Response::new(Body::full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// Renders a reply (the pipeline's render phase): decoded messages → HTTP. A single answer goes back as JSON; when notifications
/// come first (progress), the answer becomes an SSE stream that relays each message as it
/// arrives. Dropping the stream (client gone) drops the upstream side too.
/// `name` and `timeout_ms` only label errors that end a stream.
pub async fn render(
    reply: Reply,
    id: Option<&RequestId>,
    name: &str,
    timeout_ms: u64,
) -> Response<Body> {
    match reply.messages {
        MessageStream::Empty => {
            let mut resp = Response::new(Body::Empty);
            *resp.status_mut() = StatusCode::ACCEPTED;
            resp
        }
        MessageStream::One(msg) => json_response(reply.status, msg),
        MessageStream::Many(mut stream) => {
            let first = match stream.next().await {
                None => {
                    return GatewayError::BackendFailed {
                        backend: name.to_string(),
                        detail: "the answer stream ended without a response".into(),
                    }
                    .into_response(id);
                }
                Some(Err(e)) => {
                    return GatewayError::from_upstream(name, timeout_ms, &e).into_response(id);
                }
                Some(Ok(first)) => first,
            };
            if protocol::is_response(&first) {
                return json_response(reply.status, first);
            }
            let stream = futures_util::stream::once(async move { Ok(first) }).chain(stream);
            let id = id.cloned();
            let name = name.to_string();
            let events = stream.map(move |item| match item {
                Ok(msg) => sse_event(&msg),
                Err(e) => sse_event(
                    &GatewayError::from_upstream(&name, timeout_ms, &e).to_message(id.as_ref()),
                ),
            });
            sse_response(Body::Stream(Box::pin(events)))
        }
    }
}

/// Marks (as a response extension) an SSE answer its client will resume after the connection
/// ends (`legacy::resume`, a 2025-11-25 session that got the priming event): `[server]
/// max_stream_ms` then ends the *connection* with a `retry` hint ([`RECONNECT`]), not the
/// stream with an error — the client reconnects with `Last-Event-ID` and loses nothing
/// (docs/protocol.md §7, SEP-1699).
#[derive(Debug, Clone, Copy)]
pub struct Resumable;

/// What ends a resumable stream's connection at `max_stream_ms`: the client waits this long
/// (ms) before it reconnects; both SDKs wait a second when the server names nothing.
pub const RECONNECT: &[u8] = b"retry: 100\n\n";

/// The comment line sent on an idle SSE stream; clients ignore comments (docs/protocol.md §4).
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
