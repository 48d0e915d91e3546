//! The one response body type portico hands to hyper. An enum rather than a boxed trait object:
//! the hot paths (a relayed upstream answer, a cached JSON body) cost no allocation, and every
//! kind of body is visible in one `match`.

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use http_body::{Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::upstream::http::RelayBody;

/// Errors a body can end with; hyper only needs to know the stream broke.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// A response body.
pub enum Body {
    /// No bytes (202, 204, 405).
    Empty,
    /// One buffer known up front (JSON answers, errors, cache hits).
    Full(Option<Bytes>),
    /// An upstream answer relayed byte for byte (pass-through).
    Relay(RelayBody),
    /// Chunks produced over time (SSE that portico renders itself).
    Stream(BoxStream<'static, Bytes>),
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
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Empty => true,
            Body::Full(b) => b.is_none(),
            Body::Relay(r) => r.is_end_stream(),
            Body::Stream(_) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Empty => SizeHint::with_exact(0),
            Body::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Body::Full(None) => SizeHint::with_exact(0),
            Body::Relay(r) => r.size_hint(),
            Body::Stream(_) => SizeHint::default(),
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
